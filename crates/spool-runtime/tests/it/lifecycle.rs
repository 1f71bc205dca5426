//! `Runtime::shutdown`: every task the runtime started stops, nothing is
//! left holding the journal, and what was in progress resumes on the next
//! start as after a crash.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use spool_journal::event::Effect;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Journal, RunId};
use spool_runtime::{Accepted, StartRequest, Tools};
use spool_wire::run::SuspendKind;

use crate::support::{Gated, PATIENCE, runtime_with, settle};

fn gated_tools(
    started: &Arc<AtomicUsize>,
    entered: &Arc<tokio::sync::Notify>,
    gate: &Arc<tokio::sync::Notify>,
) -> Tools {
    let mut tools = Tools::builtin();
    tools
        .add(Arc::new(Gated {
            effect: Effect::Read,
            started: Arc::clone(started),
            entered: Arc::clone(entered),
            gate: Arc::clone(gate),
        }))
        .unwrap();
    tools
}

async fn start(runtime: &spool_runtime::Runtime) -> (RunId, spool_journal::TurnId) {
    let Accepted::Started { run, turn } = runtime
        .start(StartRequest {
            text: "go".into(),
            ..StartRequest::default()
        })
        .await
        .unwrap()
    else {
        panic!("a fresh run starts a turn")
    };
    (run, turn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_a_turn_mid_tool_call_and_the_next_start_resumes_it() {
    let journal = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "all done"}"#;
    let (started, entered, gate) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let runtime = runtime_with(
        Arc::clone(&journal) as Arc<dyn Journal>,
        script,
        gated_tools(&started, &entered, &gate),
    );
    let (run, turn) = start(&runtime).await;
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the tool call begins");
    tokio::time::timeout(PATIENCE, runtime.shutdown())
        .await
        .expect("shutdown ends every task in time");
    drop(runtime);
    assert_eq!(
        Arc::strong_count(&journal),
        1,
        "no task of the stopped runtime still holds the journal"
    );
    // The next start finds the turn where it stopped: the read runs again.
    let runtime = runtime_with(
        Arc::clone(&journal) as Arc<dyn Journal>,
        script,
        gated_tools(&started, &entered, &gate),
    );
    runtime.recover().await.unwrap();
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the interrupted read runs again");
    gate.notify_one();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("all done"));
    assert_eq!(started.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_a_sleeps_timer_and_a_stopped_runtime_starts_no_driver() {
    let journal = Arc::new(MemoryJournal::new());
    let script =
        r#"{"tool_calls": [{"id": "s1", "name": "sleep", "arguments": {"seconds": 3600}}]}"#;
    let runtime = runtime_with(
        Arc::clone(&journal) as Arc<dyn Journal>,
        script,
        Tools::builtin(),
    );
    let (run, turn) = start(&runtime).await;
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Sleep));
    tokio::time::timeout(PATIENCE, runtime.shutdown())
        .await
        .expect("shutdown ends the sleep's timer in time");
    // A command after the stop is recorded; its turn waits for the next
    // start instead of a driver of this runtime.
    let (other, _) = start(&runtime).await;
    assert_eq!(runtime.get(&other).await.unwrap().status, Status::Running);
    drop(runtime);
    assert_eq!(
        Arc::strong_count(&journal),
        1,
        "no timer or driver of the stopped runtime holds the journal"
    );
}
