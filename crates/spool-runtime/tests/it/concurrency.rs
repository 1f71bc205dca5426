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
