//! Many runs at once over one SQLite journal.

use std::sync::Arc;

use spool_journal::fold::Status;
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Journal, Seq};
use spool_runtime::{Accepted, Runtime, StartRequest};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_runs_driven_at_once_over_one_sqlite_journal_all_finish_with_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let journal: Arc<dyn Journal> =
        Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let mut started = Vec::new();
    for i in 0..200 {
        let runtime = runtime.clone();
        started.push(tokio::spawn(async move {
            runtime
                .start(StartRequest {
                    text: format!("run number {i}"),
                    ..StartRequest::default()
                })
                .await
                .unwrap()
        }));
    }
    let mut runs = Vec::new();
    for task in started {
        let Accepted::Started { run, turn } = task.await.unwrap() else {
            panic!("each start begins a turn")
        };
        runs.push((run, turn));
    }
    for (i, (run, turn)) in runs.iter().enumerate() {
        let view = settle(&runtime, run, turn).await;
        assert_eq!(view.status, Status::Completed);
        assert_eq!(
            view.response.as_deref(),
            Some(format!("echo: run number {i}").as_str())
        );
        let log = journal.read(run, Seq(0)).await.unwrap();
        let kinds: Vec<&str> = log.iter().map(|e| e.event.kind()).collect();
        assert_eq!(
            kinds,
            [
                "run_created",
                "turn_started",
                "model_call_requested",
                "model_call_completed",
                "turn_completed"
            ]
        );
    }
    assert_eq!(journal.runs().await.unwrap().len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_the_moment_a_turn_starts_is_never_lost() {
    // Each model call would take a minute: only the cancel ends a turn in
    // time. Sent right behind the start, the cancel races the driver's
    // first look at the run; two hundred runs give the race its chances.
    let script = r#"{"text": "never finished", "delay_ms": 60000}"#;
    // SQLite's reads leave the driver the window a real server has.
    let dir = tempfile::tempdir().unwrap();
    let journal: Arc<dyn Journal> =
        Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    let runtime = Runtime::builder(journal)
        .engine(Arc::new(
            spool_runtime::engines::ScriptedEngine::from_jsonl(script).unwrap(),
        ))
        .build();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let runtime = runtime.clone();
        tasks.push(tokio::spawn(async move {
            let Accepted::Started { run, turn } = runtime
                .start(StartRequest {
                    text: format!("job {i}"),
                    ..StartRequest::default()
                })
                .await
                .unwrap()
            else {
                panic!("each start begins a turn")
            };
            runtime.cancel(&run, None).await.unwrap();
            (run, turn)
        }));
    }
    for task in tasks {
        let (run, turn) = task.await.unwrap();
        let view = settle(&runtime, &run, &turn).await;
        assert_eq!(view.status, Status::Cancelled, "run {run}");
    }
}
