//! Deleting runs and retention: a deleted run leaves a tombstone that
//! every later request meets, nothing of a live run is touched, and the
//! sweep deletes what is past its time by the caller's clock.

use std::sync::Arc;
use std::time::Duration;

use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Journal, RunId};
use spool_runtime::retention::Retention;
use spool_runtime::{DeleteRequest, ErrorKind, Tools};
use spool_wire::run::SuspendKind;

use crate::support::*;

fn by(who: &str) -> DeleteRequest {
    DeleteRequest {
        by: who.into(),
        ..DeleteRequest::default()
    }
}

/// Both stores a runtime is tested on.
fn stores() -> Vec<(&'static str, Arc<dyn Journal>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    vec![
        ("memory", Arc::new(MemoryJournal::new()), None),
        ("sqlite", Arc::new(sqlite), Some(dir)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_run_answers_run_deleted_everywhere_and_its_stream_ends() {
    for (store, journal, _dir) in stores() {
        let runtime = runtime_with(journal, r#"{"text": "done"}"#, Tools::builtin());
        let (run, turn) = begin(&runtime, "hello").await;
        settle(&runtime, &run, &turn).await;
        let mut stream = runtime.subscribe(&run, None).await.unwrap();
        let tombstone = runtime.delete(&run, by("alice")).await.unwrap();
        assert_eq!(
            (tombstone.by.as_str(), tombstone.run_id.clone()),
            ("alice", run.clone()),
            "{store}"
        );
        for (what, error) in [
            ("get", runtime.get(&run).await.err()),
            ("snapshot", runtime.snapshot(&run).await.err()),
            ("cancel", runtime.cancel(&run, None).await.err()),
            (
                "send",
                runtime
                    .send(
                        &run,
                        spool_runtime::MessageRequest {
                            text: "again".into(),
                            ..Default::default()
                        },
                    )
                    .await
                    .err(),
            ),
        ] {
            assert_eq!(
                error.map(|e| e.kind()),
                Some(ErrorKind::RunDeleted),
                "{store}: {what} of a deleted run says it was deleted"
            );
        }
        let ended =
            tokio::time::timeout(PATIENCE, async { while stream.next().await.is_some() {} }).await;
        assert!(ended.is_ok(), "{store}: a deleted run's stream ends");
        assert_eq!(
            runtime.delete(&run, by("bob")).await.unwrap(),
            tombstone,
            "{store}: deleting again answers the first tombstone"
        );
        assert!(
            !runtime
                .list()
                .await
                .unwrap()
                .iter()
                .any(|r| r.run_id == run),
            "{store}: the listing no longer holds it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_an_answer_is_refused_without_force_and_cancelled_then_deleted_with_it() {
    let script = r#"{"tool_calls": [{"id": "q1", "name": "ask_human", "arguments": {"prompt": "Which colour?"}}]}"#;
    let runtime = runtime_with(Arc::new(MemoryJournal::new()), script, Tools::builtin());
    let (run, _) = begin(&runtime, "ask me").await;
    until(&runtime, &run, |view| {
        view.status == Status::Waiting(SuspendKind::Question)
    })
    .await;
    let refused = runtime.delete(&run, by("alice")).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        ErrorKind::RunActive,
        "a parked turn is a turn in progress"
    );
    assert!(
        runtime.get(&run).await.is_ok(),
        "the refused deletion removed nothing"
    );
    let forced = DeleteRequest {
        force: true,
        ..by("alice")
    };
    let tombstone = tokio::time::timeout(PATIENCE, runtime.delete(&run, forced))
        .await
        .expect("the forced deletion ends once the cancelled turn did")
        .unwrap();
    assert!(tombstone.events > 0);
    assert_eq!(
        runtime.get(&run).await.unwrap_err().kind(),
        ErrorKind::RunDeleted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_runs_while_others_append_touches_nothing_of_the_live_ones() {
    for (store, journal, _dir) in stores() {
        let script = r#"{"text": "one"}
{"text": "two"}
{"text": "three"}"#;
        let runtime = runtime_with(Arc::clone(&journal), script, Tools::builtin());
        let mut ended = Vec::new();
        for i in 0..20 {
            let (run, turn) = begin(&runtime, &format!("old {i}")).await;
            settle(&runtime, &run, &turn).await;
            ended.push(run);
        }
        // Twenty live runs take three turns each while the twenty ended
        // ones are deleted.
        let live: Vec<tokio::task::JoinHandle<(RunId, usize)>> = (0..20)
            .map(|i| {
                let runtime = runtime.clone();
                tokio::spawn(async move {
                    let (run, turn) = begin(&runtime, &format!("live {i}")).await;
                    settle(&runtime, &run, &turn).await;
                    for text in ["more", "again"] {
                        next_turn(&runtime, &run, text).await;
                    }
                    let events = journal_len(&runtime, &run).await;
                    (run, events)
                })
            })
            .collect();
        for run in &ended {
            runtime.delete(run, by("operator")).await.unwrap();
        }
        for task in live {
            let (run, events) = task.await.unwrap();
            let view = runtime.get(&run).await.unwrap();
            assert_eq!(
                view.status,
                Status::Completed,
                "{store}: a live run finished its turns"
            );
            assert_eq!(view.response.as_deref(), Some("three"), "{store}");
            assert_eq!(
                journal
                    .read(&run, spool_journal::Seq(0))
                    .await
                    .unwrap()
                    .len(),
                events,
                "{store}: a live run's log is whole and verifies"
            );
        }
        for run in &ended {
            assert!(
                journal
                    .read(run, spool_journal::Seq(0))
                    .await
                    .unwrap()
                    .is_empty(),
                "{store}"
            );
        }
    }
}

async fn journal_len(runtime: &spool_runtime::Runtime, run: &RunId) -> usize {
    runtime
        .journal(run, None, usize::MAX)
        .await
        .unwrap()
        .0
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_the_runs_past_their_time_by_the_callers_clock() {
    for (store, journal, _dir) in stores() {
        let script = r#"{"text": "done"}"#;
        let runtime = runtime_with(Arc::clone(&journal), script, Tools::builtin());
        let (done, turn) = begin(&runtime, "finish").await;
        settle(&runtime, &done, &turn).await;
        let failing = runtime_with(
            Arc::clone(&journal),
            r#"{"error": "boom"}"#,
            Tools::builtin(),
        );
        let (failed, turn) = begin(&failing, "fail").await;
        settle(&failing, &failed, &turn).await;
        assert_eq!(failing.get(&failed).await.unwrap().status, Status::Failed);
        let ask =
            r#"{"tool_calls": [{"id": "q1", "name": "ask_human", "arguments": {"prompt": "?"}}]}"#;
        let asking = runtime_with(Arc::clone(&journal), ask, Tools::builtin());
        let (waiting, _) = begin(&asking, "wait").await;
        until(&asking, &waiting, |view| {
            view.status.is_active() && view.status != Status::Running
        })
        .await;
        let (cancelled, _) = begin(&asking, "stop").await;
        until(&asking, &cancelled, |view| {
            view.status.is_active() && view.status != Status::Running
        })
        .await;
        asking.cancel(&cancelled, None).await.unwrap();
        until(&asking, &cancelled, |view| view.status == Status::Cancelled).await;

        let retention = Retention {
            completed: Some(Duration::from_secs(30 * 86_400)),
            cancelled: Some(Duration::from_secs(60)),
            ..Retention::default()
        };
        let now = time::OffsetDateTime::now_utc();
        let swept = runtime.sweep(&retention, now, 100).await.unwrap();
        assert_eq!(swept.deleted, 0, "{store}: nothing is past its time yet");

        let later = now + Duration::from_secs(120);
        let swept = runtime.sweep(&retention, later, 100).await.unwrap();
        assert_eq!(
            swept.deleted, 1,
            "{store}: two minutes on, the cancelled run goes"
        );
        let tombstone = journal
            .tombstone(&cancelled)
            .await
            .unwrap()
            .expect("a tombstone");
        assert_eq!(
            (tombstone.by.as_str(), tombstone.reason.as_deref()),
            ("retention", Some("retention: cancelled 1m")),
            "{store}: the tombstone names the rule"
        );

        let month = now + Duration::from_secs(31 * 86_400);
        let swept = runtime.sweep(&retention, month, 100).await.unwrap();
        assert_eq!(
            swept.deleted, 1,
            "{store}: a month on, the completed run goes"
        );
        assert_eq!(
            runtime.get(&done).await.unwrap_err().kind(),
            ErrorKind::RunDeleted
        );
        assert!(
            failing.get(&failed).await.is_ok(),
            "{store}: failed runs have no retention here"
        );
        assert!(
            asking.get(&waiting).await.is_ok(),
            "{store}: a waiting run is never swept"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_latest_deletes_an_addresss_older_retired_runs_and_keeps_its_current_one() {
    for (store, journal, _dir) in stores() {
        let runtime = runtime_with(
            Arc::clone(&journal),
            r#"{"text": "done"}"#,
            Tools::builtin(),
        );
        let through = |name: &str| spool_runtime::StartRequest {
            text: "hi".into(),
            address: Some(spool_journal::Address::new("http", name)),
            ..spool_runtime::StartRequest::default()
        };
        // Four runs in turn at address `a` (each reset frees it for the
        // next), one at `b` retired with no successor.
        let mut at_a = Vec::new();
        for n in 0..4 {
            let spool_runtime::Accepted::Started { run, turn } =
                runtime.start(through("a")).await.unwrap()
            else {
                panic!("a free address starts a run");
            };
            settle(&runtime, &run, &turn).await;
            if n < 3 {
                runtime.reset(&run, None).await.unwrap();
            }
            at_a.push(run);
        }
        let spool_runtime::Accepted::Started { run: at_b, turn } =
            runtime.start(through("b")).await.unwrap()
        else {
            panic!("a free address starts a run");
        };
        settle(&runtime, &at_b, &turn).await;
        runtime.reset(&at_b, None).await.unwrap();

        let retention = Retention {
            keep_latest: Some(2),
            ..Retention::default()
        };
        let now = time::OffsetDateTime::now_utc();
        let swept = runtime.sweep(&retention, now, 100).await.unwrap();
        assert_eq!(swept.deleted, 2, "{store}: the two oldest runs of `a` go");
        for run in &at_a[..2] {
            let tombstone = journal.tombstone(run).await.unwrap().expect("deleted");
            assert_eq!(
                tombstone.reason.as_deref(),
                Some("retention: keep_latest 2 of http:a"),
                "{store}"
            );
        }
        for run in [&at_a[2], &at_a[3], &at_b] {
            assert!(
                runtime.get(run).await.is_ok(),
                "{store}: the current run of `a`, the newest it replaced, and `b`'s only run stay"
            );
        }
        let again = runtime.sweep(&retention, now, 100).await.unwrap();
        assert_eq!(again.deleted, 0, "{store}: nothing more is past the count");
    }
}
