//! The `delegate` tool between instances in one process, each a runtime
//! with its bus server on loopback and all found through one registry:
//! a delegation's answer, the depth carried from hop to hop, and the
//! instance budget under concurrent delegations.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use spool_bus::budget::{Ledger, Limits};
use spool_bus::client::{Options, Route, talk};
use spool_bus::config::BusSection;
use spool_bus::tool::Delegate;
use spool_bus::{BusServer, Settings, registry};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, RunId};
use spool_runtime::agent::{Budgets, Pricing};
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::hub::StreamItem;
use spool_runtime::{Accepted, Runtime, RuntimeBuilder, StartRequest, Tools};
use spool_wire::bus::ErrorCode;
use tokio::sync::watch;

use crate::{PATIENCE, SECRET, serve};

/// One instance: its runtime, serving the bus and registered.
struct Instance {
    runtime: Runtime,
    _stop: watch::Sender<bool>,
}

/// `name`'s `[bus]`: its peers, the depth limit, the shared registry.
fn section(name: &str, peers: &[&str], max_depth: u64, registry: &Path) -> BusSection {
    BusSection {
        peers: peers.iter().map(|p| (*p).to_owned()).collect(),
        max_depth,
        registry: Some(registry.to_owned()),
        delegate: true,
        attempts: 1,
        ..BusSection::new(name)
    }
}

async fn start(
    section: &BusSection,
    builder: RuntimeBuilder,
    budget: Option<Arc<Ledger>>,
) -> Instance {
    let mut tools = Tools::builtin();
    tools.add(Arc::new(Delegate::new(section))).unwrap();
    let runtime = builder.tools(tools).build();
    let server = BusServer::new(
        runtime.clone(),
        Settings {
            instance: section.instance.clone(),
            peers: section.peers.clone(),
            max_depth: section.max_depth,
            secret: SECRET.into(),
            budget,
        },
    );
    let (addr, stop) = serve(&server).await;
    let port = addr.rsplit(':').next().unwrap().parse().unwrap();
    registry::register(&section.registry_path(), &section.instance, port, SECRET).unwrap();
    Instance {
        runtime,
        _stop: stop,
    }
}

fn scripted(script: &str) -> RuntimeBuilder {
    Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
}

/// Starts a run and waits for its first turn's end.
async fn ask(runtime: &Runtime, text: &str) -> (RunId, spool_runtime::RunView) {
    let Accepted::Started { run, turn } = runtime
        .start(StartRequest {
            text: text.into(),
            ..StartRequest::default()
        })
        .await
        .unwrap()
    else {
        panic!("a fresh run");
    };
    let view = tokio::time::timeout(PATIENCE, runtime.wait_for(&run, &turn))
        .await
        .expect("the turn ends in time")
        .unwrap();
    (run, view)
}

/// The outputs of a run's completed tool calls, in order.
async fn tool_outputs(runtime: &Runtime, run: &RunId) -> Vec<Value> {
    let last = runtime.get(run).await.unwrap().cursor.unwrap();
    let mut items = runtime.subscribe(run, None).await.unwrap();
    let mut outputs = Vec::new();
    while let Some(item) = items.next().await {
        if let StreamItem::Event(envelope) = item {
            if let Event::ToolCallCompleted(done) = &envelope.event {
                outputs.push(Value::clone(&done.output));
            }
            if envelope.seq >= last {
                break;
            }
        }
    }
    outputs
}

/// A call to `delegate` on the script's first line, then an answer.
fn delegating_to(instance: &str, answer: &str) -> String {
    format!(
        "{}\n{}",
        json!({"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"instance": instance, "prompt": "check the plan"}}]}),
        json!({"text": answer})
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delegate_tool_hands_a_prompt_to_another_instance_and_its_answer_is_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("bus-registry.json");
    let worker = start(
        &section("worker", &["reviewer"], 3, &registry),
        Runtime::builder(Arc::new(MemoryJournal::new())),
        None,
    )
    .await;
    let reviewer = start(
        &section("reviewer", &["worker"], 3, &registry),
        scripted(&delegating_to("worker", "reviewed")),
        None,
    )
    .await;
    let (run, view) = ask(&reviewer.runtime, "review it").await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("reviewed"));
    assert_eq!(
        tool_outputs(&reviewer.runtime, &run).await,
        vec![json!("echo: check the plan")]
    );
    // The worker ran it as a run of its own, one hop deep, made by the
    // reviewer.
    let runs = worker.runtime.list().await.unwrap();
    assert_eq!(runs.len(), 1);
    let owner = worker
        .runtime
        .owner(&runs[0].run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (owner.authenticator.as_str(), owner.id.as_str()),
        ("bus", "reviewer")
    );
    assert_eq!(owner.attributes.get("depth").map(String::as_str), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_loop_stops_at_the_maximum_depth_on_the_hop_that_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("bus-registry.json");
    // Each instance's every run delegates to the other: reviewer → worker
    // (1) → reviewer (2) → worker would be 3, the maximum.
    let reviewer = start(
        &section("reviewer", &["worker"], 3, &registry),
        scripted(&delegating_to("worker", "reviewer done")),
        None,
    )
    .await;
    let worker = start(
        &section("worker", &["reviewer"], 3, &registry),
        scripted(&delegating_to("reviewer", "worker done")),
        None,
    )
    .await;
    let (run, view) = ask(&reviewer.runtime, "start the loop").await;
    assert_eq!(view.response.as_deref(), Some("reviewer done"));
    assert_eq!(
        tool_outputs(&reviewer.runtime, &run).await,
        vec![json!("worker done")]
    );
    assert_eq!(worker.runtime.list().await.unwrap().len(), 1);
    let reviewer_runs = reviewer.runtime.list().await.unwrap();
    assert_eq!(reviewer_runs.len(), 2, "the loop came back once");
    let second = reviewer_runs
        .iter()
        .map(|summary| summary.run_id.clone())
        .find(|id| *id != run)
        .unwrap();
    let owner = reviewer.runtime.owner(&second).await.unwrap().unwrap();
    assert_eq!(owner.attributes.get("depth").map(String::as_str), Some("2"));
    // Its own delegation, three hops deep, was refused before it was sent.
    let outputs = tool_outputs(&reviewer.runtime, &second).await;
    assert_eq!(outputs.len(), 1);
    let failure = outputs[0][spool_wire::sentinel::ERROR_KEY]["message"]
        .as_str()
        .unwrap();
    assert!(
        failure.starts_with("bus error max_depth_exceeded (not retryable)"),
        "{failure}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_not_a_peer_is_a_recorded_failure_naming_the_code() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("bus-registry.json");
    let reviewer = start(
        &section("reviewer", &["worker"], 3, &registry),
        scripted(&delegating_to("stranger", "gave up")),
        None,
    )
    .await;
    let (run, view) = ask(&reviewer.runtime, "go").await;
    assert_eq!(view.response.as_deref(), Some("gave up"));
    let outputs = tool_outputs(&reviewer.runtime, &run).await;
    let failure = outputs[0][spool_wire::sentinel::ERROR_KEY]["message"]
        .as_str()
        .unwrap();
    assert!(
        failure.starts_with("bus error peer_not_allowed (not retryable) from instance stranger"),
        "{failure}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_delegations_never_spend_past_the_instance_budget() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("bus-registry.json");
    // A turn may cost 0.10 USD and costs exactly that; the instance may
    // spend 0.25 USD: two turns fit, a third would pass it.
    let pricing = Pricing {
        input_per_million: 1.0,
        output_per_million: 1.0,
    };
    let limits = Limits {
        cap_micro_usd: 250_000,
        turn_micro_usd: 100_000,
        pricing,
    };
    let ledger = Ledger::new(limits);
    let script = json!({"text": "done", "usage": {"input_tokens": 100_000, "output_tokens": 0}, "delay_ms": 5});
    let worker_section = section("worker", &["reviewer"], 3, &registry);
    let _worker = start(
        &worker_section,
        scripted(&script.to_string())
            .budgets(Budgets {
                cost_usd: Some(0.10),
                ..Budgets::default()
            })
            .pricing(pricing),
        Some(Arc::clone(&ledger)),
    )
    .await;
    let route = Route::Registry {
        path: registry.clone(),
        instance: "worker".into(),
    };
    let options = Options {
        attempts: 1,
        ..Options::default()
    };
    let delegations: Vec<_> = (0..6)
        .map(|_| {
            let route = route.clone();
            let options = options.clone();
            tokio::spawn(async move { talk("reviewer", &route, "work", 1, None, &options).await })
        })
        .collect();
    let mut succeeded = 0;
    for delegation in delegations {
        let answer = tokio::time::timeout(PATIENCE, delegation)
            .await
            .expect("every delegation answers in time")
            .unwrap();
        if answer.success {
            succeeded += 1;
        } else {
            assert_eq!(
                answer.code(),
                Some(ErrorCode::BudgetExhausted),
                "{answer:?}"
            );
        }
    }
    assert_eq!(succeeded, 2, "two turns fit in the budget, and no more");
    assert_eq!(
        ledger.totals(),
        (200_000, 0),
        "spent what they cost; nothing held"
    );
}
