//! Ownership over JSON-RPC: under `RunAccess::Owner` every method answers
//! another principal's run as one that does not exist, and listings leave
//! it out, as the HTTP channel does (the runtime's one check).
//! Also what a subscription may name: its channels, the seed's `vx:*`
//! names among them.

use std::sync::Arc;

use serde_json::{Value, json};
use spool_journal::Principal;
use spool_journal::store::memory::MemoryJournal;
use spool_rpc::Dispatcher;
use spool_runtime::{RunAccess, Runtime};

use crate::PATIENCE;

pub(crate) fn token(id: &str, admin: bool) -> Principal {
    let mut principal = Principal {
        authenticator: "token".into(),
        kind: "token".into(),
        id: id.into(),
        ..Principal::default()
    };
    if admin {
        principal.attributes.insert("admin".into(), "true".into());
    }
    principal
}

/// One request from a connection of `who`; its result or error object.
pub(crate) async fn call(
    dispatcher: &Dispatcher,
    who: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, Value> {
    let (connection, _outgoing) = dispatcher.connect(Some(who.clone()));
    let answer = tokio::time::timeout(PATIENCE, connection.request(method, params))
        .await
        .expect("an answer in time");
    connection.close().await;
    answer.map_err(|error| serde_json::to_value(error).unwrap())
}

/// A dispatcher under owner access, and a run alice made through it.
async fn alices_run() -> (Dispatcher, String) {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let dispatcher = Dispatcher::new(runtime).with_run_access(RunAccess::Owner);
    let started = call(
        &dispatcher,
        &token("alice", false),
        "submit.run",
        json!({"text": "mine", "address": "alice-home"}),
    )
    .await
    .unwrap();
    (dispatcher, started["run_id"].as_str().unwrap().to_owned())
}

fn not_found(answer: Result<Value, Value>, method: &str) {
    let error = answer.expect_err(method);
    assert_eq!(error["code"], -32002, "{method}: {error}");
    assert_eq!(error["data"]["code"], "run_not_found", "{method}: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principals_run_is_not_found_by_every_method_that_names_a_run() {
    let (dispatcher, run) = alices_run().await;
    let bob = token("bob", false);
    let by_run = json!({"run_id": run});
    for method in ["run.get", "state.snapshot", "subscribe"] {
        not_found(
            call(&dispatcher, &bob, method, by_run.clone()).await,
            method,
        );
    }
    not_found(
        call(
            &dispatcher,
            &bob,
            "submit.run",
            json!({"text": "yours now", "run_id": run}),
        )
        .await,
        "submit.run {run_id}",
    );
    not_found(
        call(
            &dispatcher,
            &bob,
            "run.respond",
            json!({"run_id": run, "responses": [{"text": "x"}]}),
        )
        .await,
        "run.respond",
    );
    // Through its address too: the address is not found, and not taken.
    not_found(
        call(
            &dispatcher,
            &bob,
            "submit.run",
            json!({"text": "hi", "address": "alice-home"}),
        )
        .await,
        "submit.run {address}",
    );
    // Cancel answers as for an unknown run: a harmless no-op.
    let cancelled = call(&dispatcher, &bob, "run.cancel", by_run.clone())
        .await
        .unwrap();
    assert_eq!(cancelled["status"], "not_active", "{cancelled}");
    // And the run did not move: alice's only turn, completed.
    let alice = token("alice", false);
    let view = call(&dispatcher, &alice, "run.get", by_run.clone())
        .await
        .unwrap();
    assert_eq!(view["state"], "completed", "{view}");
    assert_eq!(view["response"], "echo: mine", "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creator_and_an_administrator_reach_the_run_and_listings_hold_only_what_the_caller_may_see()
 {
    let (dispatcher, run) = alices_run().await;
    let by_run = json!({"run_id": run});
    for who in [token("alice", false), token("root", true)] {
        for method in ["run.get", "state.snapshot", "subscribe"] {
            let answer = call(&dispatcher, &who, method, by_run.clone()).await;
            assert!(answer.is_ok(), "{} {method}: {answer:?}", who.id);
        }
    }
    let ids = |listed: Value| -> Vec<String> {
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let bob = token("bob", false);
    let bobs = call(&dispatcher, &bob, "submit.run", json!({"text": "bob's"}))
        .await
        .unwrap();
    let bobs = bobs["run_id"].as_str().unwrap().to_owned();
    let listed = |who: Principal| {
        let dispatcher = dispatcher.clone();
        async move {
            ids(call(&dispatcher, &who, "run.list", json!({}))
                .await
                .unwrap())
        }
    };
    assert_eq!(listed(token("alice", false)).await, vec![run.clone()]);
    assert_eq!(listed(bob).await, vec![bobs.clone()]);
    let all = listed(token("root", true)).await;
    assert!(all.contains(&run) && all.contains(&bobs), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_over_their_limits_are_invalid_params_naming_the_code() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let dispatcher = Dispatcher::new(runtime);
    let who = token("alice", false);
    for (params, code) in [
        (
            json!({"text": "x", "address": "a".repeat(513)}),
            "address_too_long",
        ),
        (
            json!({"text": "x", "title": "t".repeat(1025)}),
            "title_too_long",
        ),
        (
            json!({"text": "x", "operation_id": "o".repeat(257)}),
            "operation_id_too_long",
        ),
    ] {
        let error = call(&dispatcher, &who, "submit.run", params)
            .await
            .unwrap_err();
        assert_eq!(error["code"], -32602, "{error}");
        assert_eq!(error["data"]["code"], code, "{error}");
    }
    let listed = call(&dispatcher, &who, "run.list", json!({}))
        .await
        .unwrap();
    assert_eq!(listed["runs"], json!([]), "nothing was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channels_list_over_its_limit_is_invalid_params() {
    let (dispatcher, run) = alices_run().await;
    let channels: Vec<&str> =
        std::iter::repeat_n("spool:events", spool_rpc::MAX_CHANNELS + 1).collect();
    let error = call(
        &dispatcher,
        &token("alice", false),
        "subscribe",
        json!({"run_id": run, "channels": channels}),
    )
    .await
    .unwrap_err();
    assert_eq!(error["code"], -32602, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_vx_channel_names_subscribe_as_spools_own() {
    let (dispatcher, run) = alices_run().await;
    let subscribed = call(
        &dispatcher,
        &token("alice", false),
        "subscribe",
        json!({"run_id": run, "channels": ["vx:events", "vx:state"]}),
    )
    .await
    .unwrap();
    assert_eq!(
        subscribed["channels"],
        json!(["spool:events", "spool:state"]),
        "{subscribed}"
    );
    let unknown = call(
        &dispatcher,
        &token("alice", false),
        "subscribe",
        json!({"run_id": run, "channels": ["vx:nothing"]}),
    )
    .await
    .unwrap_err();
    assert_eq!(unknown["code"], -32602, "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_id_sent_again_with_another_text_answers_the_saved_run_without_a_turn() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let dispatcher = Dispatcher::new(runtime.clone());
    let alice = token("alice", false);
    let first = call(
        &dispatcher,
        &alice,
        "submit.run",
        json!({"text": "deploy", "operation_id": "op-1"}),
    )
    .await
    .unwrap();
    // The HTTP seed's rule, on every surface: a retry's changed text does
    // not change the admitted operation.
    let again = call(
        &dispatcher,
        &alice,
        "submit.run",
        json!({"text": "something else", "operation_id": "op-1"}),
    )
    .await
    .unwrap();
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(again["response"], "echo: deploy");
    assert_eq!(
        again["cursor"], first["cursor"],
        "no other turn was recorded"
    );
    assert_eq!(runtime.list().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fork_copies_a_run_for_its_owner_and_not_for_another_principal() {
    let (dispatcher, run) = alices_run().await;
    let (alice, bob) = (token("alice", false), token("bob", false));
    let view = call(&dispatcher, &alice, "run.get", json!({"run_id": run}))
        .await
        .unwrap();
    let turn = view["turn_id"].as_str().unwrap();
    let params = json!({"run_id": run, "after": turn, "title": "Alice's fork"});
    not_found(
        call(&dispatcher, &bob, "run.fork", params.clone()).await,
        "run.fork",
    );
    let fork = call(&dispatcher, &alice, "run.fork", params).await.unwrap();
    assert_eq!(fork["state"], "completed", "{fork}");
    assert_eq!(fork["response"], "echo: mine", "{fork}");
    let id = fork["run_id"].as_str().unwrap();
    assert_ne!(id, run);
    // The fork is alice's: bob does not reach it either.
    let by_fork = json!({"run_id": id});
    assert!(
        call(&dispatcher, &alice, "run.get", by_fork.clone())
            .await
            .is_ok()
    );
    not_found(
        call(&dispatcher, &bob, "run.get", by_fork).await,
        "the fork",
    );
    for params in [
        json!({"run_id": run}),
        json!({"run_id": run, "after": turn, "before": turn}),
        json!({"run_id": run, "after": turn, "beyond": 1}),
    ] {
        let refused = call(&dispatcher, &alice, "run.fork", params.clone())
            .await
            .expect_err("refused");
        assert_eq!(refused["code"], -32602, "{params}: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_delete_deletes_a_run_for_its_owner_only_and_then_it_answers_run_deleted() {
    let (dispatcher, run) = alices_run().await;
    let (alice, bob) = (token("alice", false), token("bob", false));
    let params = json!({"run_id": run});
    not_found(
        call(&dispatcher, &bob, "run.delete", params.clone()).await,
        "run.delete",
    );
    let tombstone = call(&dispatcher, &alice, "run.delete", params.clone())
        .await
        .unwrap();
    assert_eq!(tombstone["run_id"], json!(run), "{tombstone}");
    assert_eq!(tombstone["by"], json!("alice"), "{tombstone}");
    for method in ["run.get", "run.delete"] {
        let refused = call(&dispatcher, &alice, method, params.clone())
            .await
            .unwrap_err();
        assert_eq!(
            refused["data"]["code"], "run_deleted",
            "{method}: {refused}"
        );
    }
}
