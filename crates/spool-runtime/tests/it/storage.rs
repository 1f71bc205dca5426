//! A journal that cannot write (a full disk): every waiter is answered,
//! nothing is half-recorded, and runs go on by themselves once it writes.

use std::sync::Arc;

use spool_journal::fold::Status;
use spool_journal::{Journal, RunId, TurnId};
use spool_runtime::{ErrorKind, JournalHealth, MessageRequest, Runtime};

use crate::support::{Held, Instrumented, PATIENCE, begin, settle};

fn held_runtime(journal: &Arc<Instrumented>) -> (Runtime, crate::support::Gate) {
    let (engine, gate) = Held::new();
    let runtime = Runtime::builder(Arc::clone(journal) as Arc<dyn Journal>)
        .engine(engine)
        .build();
    (runtime, gate)
}

async fn until_health(runtime: &Runtime, writable: bool) -> JournalHealth {
    let mut health = runtime.watch_journal_health();
    tokio::time::timeout(PATIENCE, health.wait_for(|h| h.is_writable() == writable))
        .await
        .expect("the journal's health changes in time")
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_journal_fills_up_answers_its_waiter_at_once_and_completes_once_it_writes_again()
 {
    let journal = Arc::new(Instrumented::default());
    let (runtime, gate) = held_runtime(&journal);
    let (run, turn) = begin(&runtime, "hello").await;
    gate.entered().await;
    journal.inner.set_full(true);
    gate.open();

    // The model's answer cannot be recorded: the waiter hears so at once,
    // not after a timeout, and the run is still running, not failed.
    let waited = tokio::time::timeout(PATIENCE, runtime.wait_for(&run, &turn))
        .await
        .expect("a waiter is answered while the journal cannot write");
    assert_eq!(waited.unwrap_err().kind(), ErrorKind::Storage);
    let JournalHealth::Unavailable {
        reason,
        stalled_runs,
    } = until_health(&runtime, false).await
    else {
        unreachable!()
    };
    assert!(reason.contains("disk is full"), "{reason}");
    assert_eq!(stalled_runs, 1);

    // A command meanwhile is refused the same way, recording nothing.
    let sent = runtime
        .send(
            &run,
            MessageRequest {
                text: "more".into(),
                ..MessageRequest::default()
            },
        )
        .await;
    assert_eq!(sent.unwrap_err().kind(), ErrorKind::Storage);
    assert_eq!(runtime.get(&run).await.unwrap().status, Status::Running);

    journal.inner.set_full(false);
    until_health(&runtime, true).await;
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("echo: hello"));
    let log = journal_kinds(&journal, &run).await;
    assert_eq!(
        log.iter().filter(|k| **k == "turn_completed").count(),
        1,
        "{log:?}"
    );
    assert!(
        !log.contains(&"turn_failed"),
        "a full disk fails no turn: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_recovered_onto_a_full_journal_wait_for_it_and_then_complete() {
    let journal = Arc::new(Instrumented::default());
    let (runs, _first) = tokio::task::block_in_place(|| start_and_crash(&journal, 5));

    // A restart on a disk still full: the runs are resumed, stall, and
    // the runtime says the journal cannot write.
    journal.inner.set_full(true);
    let (second, gate) = held_runtime(&journal);
    gate.open();
    assert_eq!(second.recover().await.unwrap().resumed, 5);
    until_health(&second, false).await;
    for (run, turn) in &runs {
        let waited = tokio::time::timeout(PATIENCE, second.wait_for(run, turn))
            .await
            .expect("a waiter is answered while the journal cannot write");
        assert_eq!(waited.unwrap_err().kind(), ErrorKind::Storage);
    }
    assert!(journal.inner.refused_writes() >= 5);

    journal.inner.set_full(false);
    until_health(&second, true).await;
    for (run, turn) in &runs {
        let view = settle(&second, run, turn).await;
        assert_eq!(view.status, Status::Completed, "{run}");
    }
    assert!(second.journal_health().is_writable());
}

/// Starts `n` runs on a runtime of its own, each in its model call, and
/// stops that runtime dead: a crash mid-turn. The dead runtime's gate is
/// given back, to be held closed for the rest of the test: dropped, it
/// would end the held calls as cancelled, and a task of the dead runtime
/// not yet torn down could record that.
fn start_and_crash(
    journal: &Arc<Instrumented>,
    n: usize,
) -> (Vec<(RunId, TurnId)>, crate::support::Gate) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (runs, gate) = tokio.block_on(async {
        let (runtime, gate) = held_runtime(journal);
        let mut runs = Vec::new();
        for n in 0..n {
            runs.push(begin(&runtime, &format!("hello {n}")).await);
            gate.entered().await;
        }
        (runs, gate)
    });
    tokio.shutdown_background();
    (runs, gate)
}

/// The kinds of the run's recorded events, read past the runtime.
async fn journal_kinds(journal: &Instrumented, run: &RunId) -> Vec<&'static str> {
    journal
        .inner
        .read(run, spool_journal::Seq(0))
        .await
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect()
}

// Paused time: the runtime's clock jumps ahead whenever every task waits,
// so a minute of probing passes without the test waiting a minute.
#[tokio::test(start_paused = true)]
async fn runs_that_stall_again_right_after_resuming_are_resumed_less_and_less_often() {
    let journal = Arc::new(Instrumented::default());
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>).build();
    let (run, turn) = begin(&runtime, "hello").await;
    // Room for the probe's one-row commit, not for the turn's events.
    journal.inner.set_nearly_full(true);
    let waited = tokio::time::timeout(PATIENCE, runtime.wait_for(&run, &turn))
        .await
        .expect("a waiter is answered while the journal cannot write");
    assert_eq!(waited.unwrap_err().kind(), ErrorKind::Storage);
    let before = journal.inner.refused_writes();
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    let resumes = journal.inner.refused_writes() - before;
    // Every 100 ms would be about 600; backing off from 5 s to 60 s, a
    // handful.
    assert!(
        (1..=8).contains(&resumes),
        "{resumes} resumes in a minute of a nearly full disk"
    );
    journal.inner.set_nearly_full(false);
    // The next resume, at most RESUME_MAX away, finds room.
    tokio::time::timeout(std::time::Duration::from_secs(180), async {
        let mut stream = runtime.subscribe(&run, None).await.unwrap();
        while runtime.get(&run).await.unwrap().status != Status::Completed {
            stream.next().await.expect("the run's stream stays open");
        }
    })
    .await
    .expect("the run completes once the disk has room");
    let view = runtime.get(&run).await.unwrap();
    assert_eq!(view.status, Status::Completed);
}
