//! `if_idle`, the Pod protocol's "the first run wins": a turn starts only
//! if none is in progress, decided under the run's lock, so of many
//! callers racing on an idle run exactly one starts a turn and the others
//! are refused with `TurnInProgress`, whatever the interleaving.

use std::sync::Arc;

use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Address, RunId};
use spool_runtime::{Accepted, ErrorKind, MessageRequest, Runtime, RuntimeError};
use spool_wire::run::TurnPolicy;
use tokio::sync::Barrier;

use crate::support::{Held, PATIENCE, settle};

fn if_idle(text: &str) -> MessageRequest {
    MessageRequest {
        text: text.into(),
        policy: Some(TurnPolicy::IfIdle),
        ..MessageRequest::default()
    }
}

async fn idle_run(runtime: &Runtime) -> RunId {
    runtime
        .ensure(&Address::new("pod", "reviewer"))
        .await
        .unwrap()
        .run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_twenty_concurrent_if_idle_callers_exactly_one_starts_a_turn() {
    let (held, gate) = Held::new();
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(held)
        .build();
    let run = idle_run(&runtime).await;
    let barrier = Arc::new(Barrier::new(20));
    let mut callers = Vec::new();
    for n in 0..20 {
        let (runtime, run, barrier) = (runtime.clone(), run.clone(), Arc::clone(&barrier));
        callers.push(tokio::spawn(async move {
            barrier.wait().await;
            runtime.send(&run, if_idle(&format!("caller {n}"))).await
        }));
    }
    let mut started = Vec::new();
    let mut refused = 0;
    for caller in callers {
        match tokio::time::timeout(PATIENCE, caller)
            .await
            .unwrap()
            .unwrap()
        {
            Ok(Accepted::Started { turn, .. }) => started.push(turn),
            Ok(other) => panic!("if_idle never steers or queues: {other:?}"),
            Err(error @ RuntimeError::TurnInProgress { .. }) => {
                assert_eq!(error.kind(), ErrorKind::TurnInProgress);
                refused += 1;
            }
            Err(other) => panic!("refused for another reason: {other}"),
        }
    }
    assert_eq!(started.len(), 1, "exactly one caller starts a turn");
    assert_eq!(refused, 19);
    gate.open();
    let view = settle(&runtime, &run, &started[0]).await;
    assert_eq!(view.status, Status::Completed);
    // Idle again: the next first caller wins again.
    let accepted = runtime.send(&run, if_idle("after")).await.unwrap();
    assert!(matches!(accepted, Accepted::Started { .. }), "{accepted:?}");
}

#[tokio::test]
async fn if_idle_on_a_waiting_run_is_refused_as_a_turn_in_progress() {
    let script =
        r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}"#;
    let runtime = crate::support::scripted(script);
    let run = idle_run(&runtime).await;
    let Accepted::Started { turn, .. } = runtime.send(&run, if_idle("start")).await.unwrap() else {
        panic!("an idle run starts a turn");
    };
    let view = settle(&runtime, &run, &turn).await;
    assert!(matches!(view.status, Status::Waiting(_)), "{view:?}");
    let refused = runtime.send(&run, if_idle("again")).await.unwrap_err();
    assert!(
        matches!(&refused, RuntimeError::TurnInProgress { turn: t, .. } if t == &turn),
        "{refused}"
    );
}
