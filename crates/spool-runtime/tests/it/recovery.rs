//! Recovery after a crash: the first runtime's tasks are stopped mid-turn
//! by shutting its Tokio runtime down (nothing of it runs again), and a
//! second runtime recovers from the same journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use spool_journal::event::{Answer, CancelRequested, Effect};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, RunId, Seq, TurnId};
use spool_runtime::{Accepted, Runtime, StartRequest, Tool, Tools};
use spool_wire::run::SuspendKind;

use crate::support::*;

struct Crashable {
    journal: Arc<dyn Journal>,
    started: Arc<AtomicUsize>,
    /// The gate of the runtime made last. Each runtime gets its own: a
    /// crashed runtime's tasks are dropped in the background, and until
    /// they are, its tool still waits on its gate and would take the
    /// permit meant for the recovering runtime's.
    gate: std::sync::Mutex<Arc<tokio::sync::Notify>>,
    script: &'static str,
    effect: Effect,
    extra: Vec<Arc<dyn Tool>>,
}

impl Crashable {
    fn new(script: &'static str, effect: Effect, extra: Vec<Arc<dyn Tool>>) -> Self {
        Self {
            journal: Arc::new(MemoryJournal::new()),
            started: Arc::new(AtomicUsize::new(0)),
            gate: std::sync::Mutex::default(),
            script,
            effect,
            extra,
        }
    }

    fn runtime(&self, entered: Arc<tokio::sync::Notify>) -> Runtime {
        let gate = Arc::new(tokio::sync::Notify::new());
        *self.gate.lock().unwrap() = Arc::clone(&gate);
        let gated = Arc::new(Gated {
            effect: self.effect,
            started: Arc::clone(&self.started),
            entered,
            gate,
        });
        let mut tools: Vec<Arc<dyn Tool>> = vec![gated];
        tools.extend(self.extra.iter().cloned());
        runtime_with(Arc::clone(&self.journal), self.script, tools_with(tools))
    }

    /// Opens the gate of the runtime made last.
    fn open_gate(&self) {
        self.gate.lock().unwrap().notify_one();
    }

    /// Starts a run on a runtime of its own and stops that runtime dead
    /// once the gated tool is running.
    fn start_and_crash(&self) -> (RunId, TurnId) {
        start_and_crash(
            |entered| self.runtime(entered),
            StartRequest {
                text: "go".into(),
                ..StartRequest::default()
            },
        )
    }
}

/// Starts `request` on a runtime of its own, made by `runtime` with the
/// signal its blocking tool gives when entered, and stops that runtime
/// dead once the tool is running.
fn start_and_crash(
    runtime: impl FnOnce(Arc<tokio::sync::Notify>) -> Runtime,
    request: StartRequest,
) -> (RunId, TurnId) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let entered = Arc::new(tokio::sync::Notify::new());
    let runtime = runtime(Arc::clone(&entered));
    let accepted = tokio.block_on(async {
        let accepted = runtime.start(request).await.unwrap();
        tokio::time::timeout(PATIENCE, entered.notified())
            .await
            .expect("the blocking tool starts");
        accepted
    });
    // The crash: every task of the first runtime stops where it is.
    tokio.shutdown_background();
    match accepted {
        Accepted::Started { run, turn } => (run, turn),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_interrupted_mid_call_waits_for_an_operator_and_never_runs_again() {
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "done after reconciliation"}"#,
        Effect::Write,
        vec![],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    let runtime = crash.runtime(Arc::new(tokio::sync::Notify::new()));
    assert_eq!(
        runtime.recover().await.unwrap().resumed,
        1,
        "the running run is resumed"
    );
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Reconciliation));
    assert_eq!(view.suspend.unwrap().call_id.as_deref(), Some("c1"));
    assert_eq!(
        crash.started.load(Ordering::SeqCst),
        1,
        "the write was not run blind"
    );
    runtime
        .resolve(
            &run,
            "c1",
            serde_json::json!("deployed"),
            Some("ops".into()),
        )
        .await
        .unwrap();
    let view = until(&runtime, &run, |view| view.status == Status::Completed).await;
    assert_eq!(view.response.as_deref(), Some("done after reconciliation"));
    assert_eq!(
        crash.started.load(Ordering::SeqCst),
        1,
        "the write ran exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_resolve_under_a_reserved_sentinel_name_is_refused_and_the_run_keeps_waiting()
{
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "done after reconciliation"}"#,
        Effect::Write,
        vec![],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    let runtime = crash.runtime(Arc::new(tokio::sync::Notify::new()));
    runtime.recover().await.unwrap();
    settle(&runtime, &run, &turn).await;
    for reserved in [
        serde_json::json!({"__spool_suspend": {"kind": "question", "prompt": "?"}}),
        serde_json::json!({"__spool_sleep": {"until": "2030-01-01T00:00:00Z"}}),
        serde_json::json!({"__spool_error": "boom"}),
    ] {
        let refused = runtime
            .resolve(&run, "c1", reserved.clone(), Some("ops".into()))
            .await
            .unwrap_err();
        assert_eq!(
            refused.kind(),
            spool_runtime::ErrorKind::BadRequest,
            "{reserved}"
        );
    }
    let view = runtime.get(&run).await.unwrap();
    assert_eq!(view.status, Status::Waiting(SuspendKind::Reconciliation));
    // The same value wrapped is ordinary output.
    runtime
        .resolve(
            &run,
            "c1",
            serde_json::json!({"result": {"__spool_error": "boom"}}),
            Some("ops".into()),
        )
        .await
        .unwrap();
    until(&runtime, &run, |view| view.status == Status::Completed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_fails_the_turn_rather_than_guess() {
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}"#,
        Effect::Write,
        vec![],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    let runtime = crash.runtime(Arc::new(tokio::sync::Notify::new()));
    runtime.recover().await.unwrap();
    settle(&runtime, &run, &turn).await;
    runtime
        .abandon(&run, "c1", Some("it never reached the API".into()), None)
        .await
        .unwrap();
    let view = until(&runtime, &run, |view| view.status == Status::Failed).await;
    assert_eq!(view.status, Status::Failed);
    assert_eq!(crash.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_interrupted_mid_call_runs_again_and_recorded_results_are_replayed_not_rerun() {
    let (counter, counted) = Counting::new("count", Effect::Write);
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c0", "name": "count", "arguments": {}}]}
{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "all done"}"#,
        Effect::Read,
        vec![counter],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    let entered = Arc::new(tokio::sync::Notify::new());
    let runtime = crash.runtime(Arc::clone(&entered));
    runtime.recover().await.unwrap();
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the read runs again");
    crash.open_gate();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("all done"));
    assert_eq!(
        crash.started.load(Ordering::SeqCst),
        2,
        "the dangling read ran again"
    );
    assert_eq!(
        counted.load(Ordering::SeqCst),
        1,
        "the recorded write was replayed, not run again"
    );
    let requested = kinds(&crash.journal, &run)
        .await
        .iter()
        .filter(|k| **k == "tool_call_requested")
        .count();
    assert_eq!(requested, 2, "the read's intent was not recorded twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_recorded_before_a_crash_is_applied_on_recovery() {
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}"#,
        Effect::Read,
        vec![],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    let next = Seq(crash.journal.read(&run, Seq(0)).await.unwrap().len() as u64);
    crash
        .journal
        .append(
            &run,
            next,
            vec![Event::CancelRequested(CancelRequested {
                turn_id: Some(turn.clone()),
            })],
        )
        .await
        .unwrap();
    let runtime = crash.runtime(Arc::new(tokio::sync::Notify::new()));
    runtime.recover().await.unwrap();
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Cancelled
    );
    assert_eq!(
        crash.started.load(Ordering::SeqCst),
        1,
        "the cancelled turn did not run its tool again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_run_wakes_after_a_restart() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "sleep", "arguments": {"seconds": 0.3}}]}
{"text": "woke up"}"#;
    let (run, turn) = tokio::task::block_in_place(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let first = runtime_with(
            Arc::clone(&journal),
            script,
            spool_runtime::Tools::builtin(),
        );
        let (run, turn) = tokio.block_on(async {
            let (run, turn) = begin(&first, "nap").await;
            assert_eq!(
                settle(&first, &run, &turn).await.status,
                Status::Waiting(SuspendKind::Sleep)
            );
            (run, turn)
        });
        tokio.shutdown_background();
        (run, turn)
    });
    let second = runtime_with(
        Arc::clone(&journal),
        script,
        spool_runtime::Tools::builtin(),
    );
    assert_eq!(
        second.recover().await.unwrap().resumed,
        1,
        "the sleep is re-armed"
    );
    let view = until(&second, &run, |view| view.status == Status::Completed).await;
    assert_eq!(view.response.as_deref(), Some("woke up"));
    assert_eq!(view.turn_id, Some(turn));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_woken_early_says_when_and_a_later_sleep_of_the_run_still_wakes_by_itself() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "sleep", "arguments": {"seconds": 3600}}]}
{"text": "woke up"}
{"tool_calls": [{"id": "c2", "name": "sleep", "arguments": {"seconds": 0.2}}]}
{"text": "woke again"}"#;
    let runtime = runtime_with(journal, script, spool_runtime::Tools::builtin());
    let (run, turn) = begin(&runtime, "nap for an hour").await;
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Waiting(SuspendKind::Sleep)
    );
    let before = time::OffsetDateTime::now_utc();
    runtime.wake(&run).await.unwrap();
    let view = until(&runtime, &run, |view| view.status == Status::Completed).await;
    assert_eq!(view.response.as_deref(), Some("woke up"));
    // The tool's result says when the sleep ended, not the hour it asked.
    let snapshot = runtime.snapshot(&run).await.unwrap();
    let slept = snapshot
        .messages
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let until_text: serde_json::Value = serde_json::from_str(&slept).unwrap();
    let woke = time::OffsetDateTime::parse(
        until_text["slept_until"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(
        woke - before < time::Duration::minutes(1),
        "woken now, not in an hour: {slept}"
    );
    // Nothing left to wake.
    assert!(matches!(
        runtime.wake(&run).await,
        Err(spool_runtime::RuntimeError::RunNotWaiting { .. })
    ));
    // A second sleep of the same run, while the first one's timer still
    // runs, is armed and wakes by itself.
    let message = spool_runtime::MessageRequest {
        text: "nap briefly".into(),
        context: Vec::new(),
        policy: None,
    };
    let Accepted::Started { .. } = runtime.send(&run, message).await.unwrap() else {
        panic!("a new turn");
    };
    let view = until(&runtime, &run, |view| {
        view.response.as_deref() == Some("woke again")
    })
    .await;
    assert_eq!(view.status, Status::Completed);
}

/// Records the context of every call it gets; the first call never
/// returns (the crash comes while it runs), later ones answer.
struct Witness {
    seen: Arc<std::sync::Mutex<Vec<spool_runtime::ToolContext>>>,
    entered: Arc<tokio::sync::Notify>,
}

impl Tool for Witness {
    fn spec(&self) -> spool_runtime::engine::ToolSpec {
        spool_runtime::engine::ToolSpec {
            name: "witness".into(),
            description: "records where it runs".into(),
            input_schema: serde_json::json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Idempotent
    }

    fn call<'a>(
        &'a self,
        _input: serde_json::Value,
        _cancel: &'a tokio_util::sync::CancellationToken,
    ) -> spool_runtime::BoxFuture<'a, spool_runtime::ToolOutcome> {
        Box::pin(async { panic!("the runtime calls call_in") })
    }

    fn call_in<'a>(
        &'a self,
        context: &'a spool_runtime::ToolContext,
        _input: serde_json::Value,
        _cancel: &'a tokio_util::sync::CancellationToken,
    ) -> spool_runtime::BoxFuture<'a, spool_runtime::ToolOutcome> {
        Box::pin(async move {
            let first = {
                let mut seen = self.seen.lock().unwrap();
                seen.push(context.clone());
                seen.len() == 1
            };
            self.entered.notify_one();
            if first {
                std::future::pending::<()>().await;
            }
            spool_runtime::ToolOutcome::Output(serde_json::json!("seen"))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_is_told_its_run_turn_call_and_creator_and_told_the_same_after_a_crash() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let script = r#"{"tool_calls": [{"id": "w1", "name": "witness", "arguments": {}}]}
{"text": "witnessed"}"#;
    let runtime = |entered: &Arc<tokio::sync::Notify>| {
        let witness = Arc::new(Witness {
            seen: Arc::clone(&seen),
            entered: Arc::clone(entered),
        });
        runtime_with(Arc::clone(&journal), script, tools_with(vec![witness]))
    };
    let principal = spool_journal::Principal {
        authenticator: "bus".into(),
        kind: "instance".into(),
        id: "reviewer".into(),
        attributes: [("depth".to_owned(), "1".to_owned())].into(),
    };
    let (run, turn) = tokio::task::block_in_place(|| {
        start_and_crash(
            |entered| runtime(&entered),
            StartRequest {
                text: "go".into(),
                principal: Some(principal.clone()),
                ..StartRequest::default()
            },
        )
    });
    let second = runtime(&Arc::new(tokio::sync::Notify::new()));
    second.recover().await.unwrap();
    let view = settle(&second, &run, &turn).await;
    assert_eq!(view.response.as_deref(), Some("witnessed"));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "called, then called again after the crash");
    let first = &seen[0];
    assert_eq!(
        (&first.run, &first.turn, first.call_id.as_str()),
        (&run, &turn, "w1")
    );
    assert_eq!(first.principal.as_ref(), Some(&principal));
    assert_eq!(seen[1], *first, "the recovered call is told the same");
}

/// Three runs a crash left in three states: one mid-turn, one asleep, one
/// whose last turn ended with input queued (a crash between the turn's
/// end and the queued turn's start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_drives_interrupted_runs_before_it_reads_the_rest_and_the_reading_resumes_sleeps_and_queued_input()
 {
    let journal = Arc::new(Instrumented::default());
    let shared: Arc<dyn Journal> = journal.clone();
    let (mid_turn, asleep, ended) = tokio::task::block_in_place(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let runs = tokio.block_on(async {
            let sleeper = runtime_with(
                Arc::clone(&shared),
                r#"{"tool_calls": [{"id": "c1", "name": "sleep", "arguments": {"seconds": 0.2}}]}"#,
                Tools::builtin(),
            );
            let (asleep, turn) = begin(&sleeper, "nap").await;
            assert_eq!(
                settle(&sleeper, &asleep, &turn).await.status,
                Status::Waiting(SuspendKind::Sleep)
            );
            let talker = runtime_with(Arc::clone(&shared), r#"{"text": "hi"}"#, Tools::builtin());
            let (ended, turn) = begin(&talker, "hello").await;
            assert_eq!(
                settle(&talker, &ended, &turn).await.status,
                Status::Completed
            );
            // The model answers slowly, word by word: the crash finds the
            // turn mid-call.
            let slow = runtime_with(
                Arc::clone(&shared),
                r#"{"text": "a b c d e f", "delay_ms": 60000}"#,
                Tools::builtin(),
            );
            let (mid_turn, _) = begin(&slow, "slow").await;
            (mid_turn, asleep, ended)
        });
        tokio.shutdown_background();
        runs
    });
    let next = Seq(shared.read(&ended, Seq(0)).await.unwrap().len() as u64);
    shared
        .append(
            &ended,
            next,
            vec![Event::InputQueued(spool_journal::event::InputQueued {
                input: "and then?".into(),
                context: Vec::new(),
                operation_id: None,
            })],
        )
        .await
        .unwrap();
    // Every read of the asleep and the ended run waits from here on.
    *journal.only.lock().unwrap() = vec![asleep.clone(), ended.clone()];
    journal.holding.store(true, Ordering::SeqCst);
    let runtime = runtime_with(
        Arc::clone(&shared),
        r#"{"text": "resumed"}
{"text": "after"}"#,
        Tools::builtin(),
    );
    let plan = tokio::time::timeout(PATIENCE, runtime.recovery())
        .await
        .expect("planning reads no run's log")
        .unwrap();
    assert_eq!(
        plan.interrupted(),
        1,
        "only the run mid-turn is driven at once"
    );
    assert_eq!(plan.to_read(), 2);
    let recovering = tokio::spawn(plan.run());
    let view = until(&runtime, &mid_turn, |view| view.status == Status::Completed).await;
    assert_eq!(
        view.response.as_deref(),
        Some("resumed"),
        "the interrupted turn finished while the other runs were still unread"
    );
    assert!(
        !recovering.is_finished(),
        "the held reads hold the rest of recovery"
    );
    journal.go.send_replace(true);
    let recovery = tokio::time::timeout(PATIENCE, recovering)
        .await
        .expect("recovery finishes once the reads are let go")
        .unwrap();
    assert!(recovery.unreadable.is_empty(), "{:?}", recovery.unreadable);
    assert_eq!(
        recovery.resumed, 3,
        "the sleep re-armed and the queued input started"
    );
    let woke = until(&runtime, &asleep, |view| view.status == Status::Completed).await;
    assert_eq!(woke.response.as_deref(), Some("after"));
    until(&runtime, &ended, |view| {
        view.status == Status::Completed && view.response.as_deref() == Some("after")
    })
    .await;
    let started = kinds(&shared, &ended)
        .await
        .into_iter()
        .filter(|kind| *kind == "turn_started")
        .count();
    assert_eq!(started, 2, "the queued input ran as the run's second turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_taken_over_in_a_batch_larger_than_is_read_at_once_resume_only_the_interrupted_one() {
    let crash = Crashable::new(
        r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "all done"}"#,
        Effect::Read,
        vec![],
    );
    let (run, turn) = tokio::task::block_in_place(|| crash.start_and_crash());
    // Finished runs around it, more than are read at once, and a run
    // the journal does not know.
    let finisher = runtime_with(
        Arc::clone(&crash.journal),
        r#"{"text": "hi"}"#,
        tools_with(vec![]),
    );
    let mut taken = Vec::new();
    for _ in 0..40 {
        let (finished, its_turn) = begin(&finisher, "hello").await;
        assert_eq!(
            settle(&finisher, &finished, &its_turn).await.status,
            Status::Completed
        );
        taken.push(finished);
    }
    taken.insert(20, run.clone());
    taken.push(RunId::new("run_never_made").unwrap());
    let entered = Arc::new(tokio::sync::Notify::new());
    let runtime = crash.runtime(Arc::clone(&entered));
    let recovery = runtime.recover_runs(&taken).await.unwrap();
    assert_eq!(recovery.resumed, 1, "only the interrupted run had work");
    assert!(recovery.unreadable.is_empty(), "{:?}", recovery.unreadable);
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the interrupted read runs again");
    crash.open_gate();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.response.as_deref(), Some("all done"));
    assert_eq!(crash.started.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_suspension_whose_kind_disagrees_with_its_completion_is_corrupt_not_guessed() {
    // A person's question recorded, and a `suspended` after it that says
    // it waits for a signal: replay refuses to pick one.
    let script = r#"{"tool_calls": [{"id": "q1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}
{"text": "done"}"#;
    let first: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = runtime_with(Arc::clone(&first), script, Tools::builtin());
    let Accepted::Started { run, turn } = runtime
        .start(StartRequest {
            text: "go".into(),
            ..StartRequest::default()
        })
        .await
        .unwrap()
    else {
        panic!("a fresh run")
    };
    let parked = settle(&runtime, &run, &turn).await;
    assert_eq!(parked.status, Status::Waiting(SuspendKind::Question));
    runtime.shutdown().await;
    // The same log, its suspension's kind changed, in a journal of its own.
    let altered: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    for envelope in first.read(&run, Seq(0)).await.unwrap() {
        let mut event = envelope.event;
        if let Event::Suspended(suspended) = &mut event {
            suspended.kind = SuspendKind::Signal;
        }
        altered
            .append(&run, envelope.seq, vec![event])
            .await
            .unwrap();
    }
    let runtime = runtime_with(Arc::clone(&altered), script, Tools::builtin());
    runtime.recover().await.unwrap();
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "the blue one".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Failed, "{view:?}");
    let log = altered.read(&run, Seq(0)).await.unwrap();
    let failed = log
        .iter()
        .find_map(|e| match &e.event {
            Event::TurnFailed(failed) => Some(failed.message.clone()),
            _ => None,
        })
        .expect("the turn failed");
    assert!(failed.contains("parked on a person"), "{failed}");
}
