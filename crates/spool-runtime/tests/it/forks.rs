//! Forks: a new run holding another's history, with nothing of the
//! source run again, that then goes on by itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use spool_journal::event::{Answer, Effect, ForkCut};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, Seq};
use spool_runtime::ForkRequest;
use spool_wire::run::SuspendKind;

use crate::support::*;

/// Forks `run` at `turn`, for nobody in particular.
async fn fork_at(
    runtime: &spool_runtime::Runtime,
    run: &spool_journal::RunId,
    turn: spool_journal::TurnId,
    cut: ForkCut,
    title: Option<String>,
) -> spool_runtime::RunView {
    let request = ForkRequest {
        turn,
        cut,
        title,
        principal: None,
    };
    runtime.fork(run, request).await.unwrap()
}

/// A write, a question, a sleep and an answer in one turn; then one more
/// answer for whichever run asks next.
const SCRIPT: &str = r#"{"tool_calls": [{"id": "w1", "name": "deploy", "arguments": {}}]}
{"tool_calls": [{"id": "q1", "name": "ask_human", "arguments": {"prompt": "Which colour?"}}]}
{"tool_calls": [{"id": "s1", "name": "sleep", "arguments": {"seconds": 1}}]}
{"text": "All done."}
{"text": "The fork's own answer."}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_run_with_a_write_a_question_and_a_sleep_runs_none_of_them_again() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (deploy, deploys) = Counting::new("deploy", Effect::Write);
    let runtime = runtime_with(Arc::clone(&journal), SCRIPT, tools_with(vec![deploy]));
    let (run, turn) = begin(&runtime, "ship it").await;
    until(&runtime, &run, |view| {
        view.status == Status::Waiting(SuspendKind::Question)
    })
    .await;
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "blue".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    let done = until(&runtime, &run, |view| view.status == Status::Completed).await;
    assert_eq!(done.response.as_deref(), Some("All done."));
    assert_eq!(deploys.load(Ordering::SeqCst), 1);

    let fork = fork_at(&runtime, &run, turn.clone(), ForkCut::After, None).await;
    assert_eq!(fork.status, Status::Completed);
    assert_eq!(fork.response.as_deref(), Some("All done."));
    let copied = kinds(&journal, &fork.run_id).await;
    for kind in [
        "forked_from",
        "tool_call_completed",
        "suspended",
        "resumed",
        "sleep_started",
        "sleep_completed",
        "turn_completed",
    ] {
        assert!(copied.contains(&kind), "{kind} in {copied:?}");
    }
    assert_eq!(
        deploys.load(Ordering::SeqCst),
        1,
        "the write is copied, not made again"
    );
    // Its own next turn: the model's next call, and still no write.
    let next = next_turn(&runtime, &fork.run_id, "and now?").await;
    assert_eq!(next.response.as_deref(), Some("The fork's own answer."));
    assert_eq!(deploys.load(Ordering::SeqCst), 1);
    // The source's journal ends with the link to it.
    let source = journal.read(&run, Seq(0)).await.unwrap();
    match &source.last().unwrap().event {
        Event::ForkedInto(link) => {
            assert_eq!(link.run, fork.run_id);
            assert_eq!(link.turn_id, turn);
            assert_eq!(link.cut, ForkCut::After);
        }
        other => panic!(
            "the source ends with its link to the fork, not {}",
            other.kind()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_leaves_out_the_sources_addresses_and_input_queued_past_the_cut() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = runtime_with(
        Arc::clone(&journal),
        r#"{"text": "one two three four five six", "delay_ms": 20}
{"text": "two"}
{"text": "three"}"#,
        spool_runtime::Tools::builtin(),
    );
    let started = runtime
        .start(spool_runtime::StartRequest {
            text: "first".into(),
            address: Some(spool_journal::Address::new("http", "desk")),
            ..spool_runtime::StartRequest::default()
        })
        .await
        .unwrap();
    let spool_runtime::Accepted::Started { run, turn } = started else {
        panic!("a new run");
    };
    // Queued behind the first turn while it streams: the second turn.
    let queued = runtime
        .send(
            &run,
            spool_runtime::MessageRequest {
                text: "second".into(),
                policy: Some(spool_wire::run::TurnPolicy::Queue),
                ..spool_runtime::MessageRequest::default()
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(queued, spool_runtime::Accepted::Queued { .. }),
        "{queued:?}"
    );
    let done = until(&runtime, &run, |view| {
        view.status == Status::Completed && view.turn_id.as_ref() != Some(&turn)
    })
    .await;
    assert_eq!(done.response.as_deref(), Some("two"));
    let fork = fork_at(
        &runtime,
        &run,
        turn.clone(),
        ForkCut::After,
        Some("again".into()),
    )
    .await;
    let log = journal.read(&fork.run_id, Seq(0)).await.unwrap();
    let state = spool_journal::fold::fold(&log);
    assert!(
        log.iter()
            .all(|e| !matches!(e.event, Event::InputQueued(_))),
        "the input queued past the cut is not the fork's"
    );
    assert!(state.queued.is_empty());
    assert!(state.addresses.is_empty(), "the address stays the source's");
    assert_eq!(state.turns, 1);
    assert_eq!(fork.status, Status::Completed, "and no turn starts from it");
    assert_eq!(
        runtime
            .find_address(&spool_journal::Address::new("http", "desk"))
            .await
            .unwrap(),
        Some(run.clone())
    );
    // The second turn again, with another message: the model's next call
    // is the fork's second.
    let again = next_turn(&runtime, &fork.run_id, "second, differently").await;
    assert_eq!(again.response.as_deref(), Some("two"));
    // Before the turn that came from the queue: the same cut.
    let before = fork_at(
        &runtime,
        &run,
        done.turn_id.clone().unwrap(),
        ForkCut::Before,
        None,
    )
    .await;
    let log = journal.read(&before.run_id, Seq(0)).await.unwrap();
    assert!(
        log.iter()
            .all(|e| !matches!(e.event, Event::InputQueued(_)))
    );
    assert_eq!(before.status, Status::Completed);
}
