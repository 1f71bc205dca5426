//! `POST /runs/{id}/fork`: a new run holding another's history through a
//! turn's end or up to its start, linked in both journals, that then goes
//! on by itself.

use serde_json::{Value, json};

use crate::client::*;

fn script() -> &'static str {
    r#"{"text": "Asking first.", "tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy?"}}]}
{"text": "Deployed."}
{"text": "Second answer."}
{"text": "Third answer."}"#
}

async fn kinds(server: &Server, run: &str) -> Vec<Value> {
    server
        .get(&format!("/spool/v1/runs/{run}/events?limit=1000"))
        .await
        .json()["events"]
        .as_array()
        .unwrap()
        .clone()
}

async fn messages(server: &Server, run: &str) -> Vec<Value> {
    server
        .get(&format!("/spool/v1/runs/{run}/snapshot"))
        .await
        .json()["messages"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_holds_the_history_through_its_turn_runs_nothing_again_and_goes_on_alone() {
    let server = Server::start(scripted_runtime(script())).await;
    let first = server
        .post(
            "/spool/v1/runs",
            r#"{"text": "deploy", "title": "Deploys"}"#,
        )
        .await
        .json();
    let run = first["run_id"].as_str().unwrap().to_owned();
    let turn1 = first["turn_id"].as_str().unwrap().to_owned();
    // A turn that has not ended cannot be forked after.
    let early = server
        .post(
            &format!("/spool/v1/runs/{run}/fork"),
            &format!(r#"{{"after": "{turn1}"}}"#),
        )
        .await;
    assert_eq!(
        (early.status, early.json()["code"].clone()),
        (409, json!("run_active"))
    );
    let done = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            r#"{"responses": [{"approved": true}]}"#,
        )
        .await
        .json();
    assert_eq!(done["response"], "Deployed.");
    let second = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "again"}"#)
        .await
        .json();
    assert_eq!(second["response"], "Second answer.");
    let turn2 = second["turn_id"].as_str().unwrap().to_owned();
    let through_turn1 = messages(&server, &run).await[..4].to_vec();

    let forked = server
        .post(
            &format!("/spool/v1/runs/{run}/fork"),
            &format!(r#"{{"after": "{turn1}"}}"#),
        )
        .await;
    assert_eq!(forked.status, 201);
    let fork = forked.json();
    let id = fork["run_id"].as_str().unwrap().to_owned();
    assert_ne!(id, run);
    assert_eq!(fork["state"], "completed");
    assert_eq!(fork["response"], "Deployed.");
    assert_eq!(
        messages(&server, &id).await,
        through_turn1,
        "the first turn, and only it"
    );
    let events = kinds(&server, &id).await;
    assert_eq!(events[1]["kind"], "forked_from");
    assert_eq!(events[1]["data"]["run"], run.as_str());
    assert_eq!(events[1]["data"]["turn_id"], turn1.as_str());
    assert_eq!(events[1]["data"]["cut"], "after");
    let calls = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_requested" || e["kind"] == "tool_call_completed")
        .count();
    assert_eq!(
        calls, 2,
        "the tool call is copied as recorded, not made again"
    );
    let listed = server
        .get(&format!("/spool/v1/runs/{id}/summary"))
        .await
        .json();
    assert_eq!(listed["title"], "Deploys", "the source's title by default");
    assert_eq!(listed["turns"], 1);
    assert_eq!(
        listed["forked_from"],
        json!({"run_id": run, "turn_id": turn1, "cut": "after"})
    );
    // The source says so, and is otherwise as it was.
    let source = kinds(&server, &run).await;
    let last = source.last().unwrap();
    assert_eq!(last["kind"], "forked_into");
    assert_eq!(last["data"]["run"], id.as_str());

    // The fork goes on by itself: its next model call is its third, as
    // in the source, and the source does not move.
    let next = server
        .post(
            &format!("/spool/v1/runs/{id}"),
            r#"{"text": "in the fork"}"#,
        )
        .await
        .json();
    assert_eq!(next["state"], "completed");
    assert_eq!(next["response"], "Second answer.");
    assert_eq!(
        messages(&server, &run).await.len(),
        6,
        "the source is untouched"
    );

    // Before a turn: its message can be sent again, or another.
    let before = server
        .post(
            &format!("/spool/v1/runs/{run}/fork"),
            &format!(r#"{{"before": "{turn2}", "title": "Try again"}}"#),
        )
        .await
        .json();
    let again = before["run_id"].as_str().unwrap();
    assert_eq!(messages(&server, again).await, through_turn1);
    assert_eq!(
        server
            .get(&format!("/spool/v1/runs/{again}/summary"))
            .await
            .json()["title"],
        "Try again"
    );
    let empty = server
        .post(
            &format!("/spool/v1/runs/{run}/fork"),
            &format!(r#"{{"before": "{turn1}"}}"#),
        )
        .await
        .json();
    assert_eq!(
        empty["state"], "pending",
        "before the first turn: nothing yet"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_names_one_turn_of_a_run_that_exists_and_an_unknown_turn_is_turn_not_found() {
    let server = Server::start(echo_runtime()).await;
    let started = server
        .post("/spool/v1/runs", r#"{"text": "hi"}"#)
        .await
        .json();
    let run = started["run_id"].as_str().unwrap();
    let turn = started["turn_id"].as_str().unwrap();
    let unknown_turn = server
        .post(
            &format!("/spool/v1/runs/{run}/fork"),
            r#"{"after": "turn_none"}"#,
        )
        .await;
    assert_eq!(
        (unknown_turn.status, unknown_turn.json()["code"].clone()),
        (409, json!("turn_not_found"))
    );
    for body in [
        "{}".to_owned(),
        format!(r#"{{"after": "{turn}", "before": "{turn}"}}"#),
        r#"{"after": "not a turn"}"#.to_owned(),
    ] {
        let reply = server
            .post(&format!("/spool/v1/runs/{run}/fork"), &body)
            .await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (400, json!("bad_request")),
            "{body}"
        );
    }
    let unknown = server
        .post(
            "/spool/v1/runs/run-404/fork",
            &format!(r#"{{"after": "{turn}"}}"#),
        )
        .await;
    assert_eq!(unknown.status, 404);
    server.stop().await;
}
