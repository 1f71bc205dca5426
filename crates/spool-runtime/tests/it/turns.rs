//! Turns through the public API: one test per claim.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use spool_journal::event::{Answer, Effect};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Address, Event, Journal, Principal, RunId, Seq, TurnId};
use spool_runtime::ErrorKind;
use spool_runtime::{Accepted, CancelOutcome, MessageRequest, Runtime, StartRequest};
use spool_wire::run::{SuspendKind, TurnPolicy};

use crate::budgets::started_under_steps;
use crate::support::*;

pub(crate) fn start(text: &str) -> StartRequest {
    StartRequest {
        text: text.into(),
        ..StartRequest::default()
    }
}

pub(crate) fn started(accepted: Accepted) -> (RunId, TurnId) {
    match accepted {
        Accepted::Started { run, turn } => (run, turn),
        other => panic!("expected a new turn, got {other:?}"),
    }
}

pub(crate) fn message(text: &str, policy: TurnPolicy) -> MessageRequest {
    MessageRequest {
        text: text.into(),
        context: vec![],
        policy: Some(policy),
    }
}

/// The new messages each recorded model request carried.
pub(crate) async fn requests(journal: &Arc<dyn Journal>, run: &RunId) -> Vec<Vec<Value>> {
    journal
        .read(run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::ModelCallRequested(r) => Some(r.new_messages),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_engine_answers_echo_and_the_run_completes() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let (run, turn) = started(runtime.start(start("hello there")).await.unwrap());
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("echo: hello there"));
    assert!(view.usage.is_some(), "the reply carries the turn's usage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_ends_the_turn_is_recorded_in_one_append_with_the_turns_end() {
    let journal = ticking_journal();
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let (run, turn) = started(runtime.start(start("hello there")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    assert_eq!(
        stamped(&journal, &run, Seq(0)).await,
        [
            ("run_created", 0),
            ("turn_started", 0),
            ("model_call_requested", 0),
            ("model_call_completed", 1),
            ("turn_completed", 1)
        ],
        "two appends: the start with its first call's intent, the answer with the turn's end"
    );
}

/// Each event's kind and the second its append stamped (a clock that
/// ticks once per append).
async fn stamped(journal: &Arc<dyn Journal>, run: &RunId, from: Seq) -> Vec<(&'static str, i64)> {
    journal
        .read(run, from)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.event.kind(), e.recorded_at.unix_timestamp()))
        .collect()
}

/// A journal whose clock ticks one second per append (each append reads
/// the clock once).
fn ticking_journal() -> Arc<dyn Journal> {
    let ticks = Arc::new(AtomicUsize::new(0));
    Arc::new(MemoryJournal::with_clock(Arc::new(move || {
        let n = ticks.fetch_add(1, Ordering::SeqCst);
        time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(n as i64)
    })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_starts_a_turn_records_its_first_calls_intent_with_the_start_and_the_call_is_made_once()
 {
    let journal = ticking_journal();
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let (run, first) = started(runtime.start(start("one")).await.unwrap());
    settle(&runtime, &run, &first).await;
    let second_at = journal.read(&run, Seq(0)).await.unwrap().len() as u64;
    let (_, second) = started(
        runtime
            .send(&run, message("two", TurnPolicy::Steer))
            .await
            .unwrap(),
    );
    let view = settle(&runtime, &run, &second).await;
    // The intent recorded with the start is the request the driver made:
    // a different one would have stopped the turn as a divergence.
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("echo: two"));
    assert_eq!(
        stamped(&journal, &run, Seq(second_at)).await,
        [
            ("turn_started", 2),
            ("model_call_requested", 2),
            ("model_call_completed", 3),
            ("turn_completed", 3)
        ]
    );
    assert_eq!(
        requests(&journal, &run).await,
        [
            vec![json!({"role": "user", "content": "one"})],
            vec![json!({"role": "user", "content": "two"})]
        ],
        "one intent per turn, each with its turn's input"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_used_up_before_the_first_call_records_the_start_without_an_intent() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (_, run, _, view) = started_under_steps(&journal, 0).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Budget));
    assert!(
        requests(&journal, &run).await.is_empty(),
        "no model call was asked for"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_runs_once_write_ahead_and_its_result_reaches_the_model() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (tool, runs) = Counting::new("count", Effect::Write);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "count", "arguments": {}}]}
{"text": "counted"}"#;
    let runtime = runtime_with(Arc::clone(&journal), script, tools_with(vec![tool]));
    let (run, turn) = started(runtime.start(start("count once")).await.unwrap());
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.response.as_deref(), Some("counted"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        kinds(&journal, &run).await,
        [
            "run_created",
            "turn_started",
            "model_call_requested",
            "model_call_completed",
            "tool_call_requested",
            "tool_call_completed",
            "model_call_requested",
            "model_call_completed",
            "turn_completed"
        ],
        "the intent is recorded before the call, the completion before the next step"
    );
    let second = &requests(&journal, &run).await[1];
    assert_eq!(
        second,
        &[json!({"role": "tool", "call_id": "c1", "content": "{\"ran\":1}"})]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_human_parks_the_run_until_answered_and_the_answer_reaches_the_model() {
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"text": "deploying to eu-west-1"}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("deploy")).await.unwrap());
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Question));
    let suspend = view.suspend.unwrap();
    assert_eq!(
        (suspend.prompt.as_str(), suspend.call_id.as_deref()),
        ("Which region?", Some("c1"))
    );
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "eu-west-1".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("deploying to eu-west-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_answers_than_the_bound_are_refused_and_nothing_is_recorded() {
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"text": "deploying"}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("deploy")).await.unwrap());
    let parked = settle(&runtime, &run, &turn).await;
    let answer = |n: usize| Answer {
        text: format!("answer {n}"),
        approved: None,
    };
    let too_many: Vec<Answer> = (0..=spool_runtime::MAX_ANSWERS).map(answer).collect();
    let refused = runtime
        .respond(&run, Some(&turn), too_many)
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::BadRequest, "{refused}");
    let still = runtime.get(&run).await.unwrap();
    assert_eq!(still.cursor, parked.cursor, "nothing was recorded");
    let enough: Vec<Answer> = (0..spool_runtime::MAX_ANSWERS).map(answer).collect();
    runtime.respond(&run, Some(&turn), enough).await.unwrap();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_answered_without_a_verdict_is_a_text_only_answer_and_false_a_rejection() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy?"}}]}
{"tool_calls": [{"id": "c2", "name": "request_approval", "arguments": {"prompt": "Deploy now?"}}]}
{"text": "not deploying"}"#;
    let runtime = runtime_with(
        Arc::clone(&journal),
        script,
        spool_runtime::Tools::builtin(),
    );
    let (run, turn) = started(runtime.start(start("deploy")).await.unwrap());
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Waiting(SuspendKind::Approval)
    );
    // No verdict: the text goes to the model, which decides what it means.
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "Use staging only.".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Waiting(SuspendKind::Approval),
        "the model asked again"
    );
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "no".into(),
                approved: Some(false),
            }],
        )
        .await
        .unwrap();
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed
    );
    let requests = requests(&journal, &run).await;
    assert_eq!(
        requests[1],
        [json!({"role": "tool", "call_id": "c1", "content": "Use staging only."})]
    );
    assert_eq!(
        requests[2],
        [
            json!({"role": "tool", "call_id": "c2", "content": "{\"approved\":false,\"text\":\"no\"}"})
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_naming_a_stale_turn_is_refused() {
    let script =
        r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Sure?"}}]}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let old = TurnId::new("turn_old").unwrap();
    let refused = runtime
        .respond(
            &run,
            Some(&old),
            vec![Answer {
                text: "yes".into(),
                approved: None,
            }],
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::RunNotWaiting, "{refused}");
    assert_eq!(
        runtime.get(&run).await.unwrap().status,
        Status::Waiting(SuspendKind::Question),
        "nothing was applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_a_waiting_run_is_refused_with_run_waiting() {
    let script =
        r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Sure?"}}]}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let refused = runtime
        .send(&run, message("another thing", TurnPolicy::Steer))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::RunWaiting);
}

fn gated(
    effect: Effect,
) -> (
    Arc<Gated>,
    Arc<AtomicUsize>,
    Arc<tokio::sync::Notify>,
    Arc<tokio::sync::Notify>,
) {
    let started = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let tool = Arc::new(Gated {
        effect,
        started: Arc::clone(&started),
        entered: Arc::clone(&entered),
        gate: Arc::clone(&gate),
    });
    (tool, started, entered, gate)
}

async fn entered(notify: &tokio::sync::Notify) {
    tokio::time::timeout(PATIENCE, notify.notified())
        .await
        .expect("the tool starts in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_input_reaches_the_model_before_its_next_call_in_the_same_turn() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (tool, _, entered_tool, gate) = gated(Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "done"}"#;
    let runtime = runtime_with(Arc::clone(&journal), script, tools_with(vec![tool]));
    let (run, turn) = started(runtime.start(start("check")).await.unwrap());
    entered(&entered_tool).await;
    let steered = runtime
        .send(&run, message("also check DNS", TurnPolicy::Steer))
        .await
        .unwrap();
    assert_eq!(
        steered,
        Accepted::Steered {
            run: run.clone(),
            turn: turn.clone()
        }
    );
    gate.notify_one();
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed
    );
    let second = &requests(&journal, &run).await[1];
    assert_eq!(
        second[1],
        json!({"role": "user", "content": "also check DNS"}),
        "{second:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_input_runs_as_the_next_turn_after_the_running_one() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (tool, _, entered_tool, gate) = gated(Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "first done"}
{"text": "second done"}"#;
    let runtime = runtime_with(Arc::clone(&journal), script, tools_with(vec![tool]));
    let (run, turn) = started(runtime.start(start("first")).await.unwrap());
    entered(&entered_tool).await;
    let Accepted::Queued {
        run: queued_in,
        queued,
    } = runtime
        .send(&run, message("second", TurnPolicy::Queue))
        .await
        .unwrap()
    else {
        panic!("a message with the queue policy to a busy run is queued");
    };
    assert_eq!(queued_in, run);
    gate.notify_one();
    settle(&runtime, &run, &turn).await;
    let second = tokio::time::timeout(PATIENCE, runtime.wait_for_queued(&run, queued))
        .await
        .expect("the queued turn runs in time")
        .unwrap();
    assert_eq!(second.status, Status::Completed);
    assert_ne!(second.turn_id.as_ref(), Some(&turn));
    assert_eq!(second.response.as_deref(), Some("second done"));
    // A waiter that looks only now, its turn overtaken by the queued one,
    // still gets its own turn's reply.
    let first = runtime.wait_for(&run, &turn).await.unwrap();
    assert_eq!(first.turn_id.as_ref(), Some(&turn));
    assert_eq!(first.response.as_deref(), Some("first done"));
    assert_eq!(first.status, Status::Completed);
    let finished: Vec<String> = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match &e.event {
            Event::TurnCompleted(c) => c.response.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(finished, ["first done", "second done"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_requested_for_the_running_turn_and_the_turn_ends_cancelled() {
    let (tool, _, entered_tool, _gate) = gated(Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}"#;
    let runtime = runtime_with(
        Arc::new(MemoryJournal::new()),
        script,
        tools_with(vec![tool]),
    );
    let (run, turn) = started(runtime.start(start("wait")).await.unwrap());
    entered(&entered_tool).await;
    let stale = runtime
        .cancel(&run, Some(&TurnId::new("turn_other").unwrap()))
        .await
        .unwrap();
    assert_eq!(
        stale,
        CancelOutcome::Stale {
            current: Some(turn.clone())
        }
    );
    assert_eq!(
        runtime.cancel(&run, Some(&turn)).await.unwrap(),
        CancelOutcome::Requested(turn.clone())
    );
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Cancelled
    );
    assert_eq!(
        runtime.cancel(&run, None).await.unwrap(),
        CancelOutcome::NotActive,
        "nothing runs now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parked_turn_ends_it_cancelled() {
    let script =
        r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Sure?"}}]}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    assert_eq!(
        runtime.cancel(&run, None).await.unwrap(),
        CancelOutcome::Requested(turn.clone())
    );
    let view = until(&runtime, &run, |view| {
        view.status != Status::Waiting(SuspendKind::Question)
    })
    .await;
    assert_eq!(view.status, Status::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_retires_the_run_and_frees_its_address_for_a_new_run() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let address = Address::new("http", "browser/42");
    let request = StartRequest {
        address: Some(address.clone()),
        ..start("hi")
    };
    let (run, turn) = started(runtime.start(request.clone()).await.unwrap());
    settle(&runtime, &run, &turn).await;
    runtime
        .reset(&run, Some("start over".into()))
        .await
        .unwrap();
    assert_eq!(runtime.get(&run).await.unwrap().status, Status::Retired);
    assert_eq!(
        runtime.lookup(&address).await.unwrap_err().kind(),
        ErrorKind::AddressNotFound
    );
    assert_eq!(
        runtime
            .send(&run, message("more", TurnPolicy::Steer))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::RunRetired
    );
    let (fresh, _) = started(runtime.start(request).await.unwrap());
    assert_ne!(fresh, run, "the address now leads to a new run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_through_a_known_address_goes_to_its_run() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let request = StartRequest {
        address: Some(Address::new("http", "desk")),
        ..start("one")
    };
    let (run, turn) = started(runtime.start(request.clone()).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let (again, second) = started(
        runtime
            .start(StartRequest {
                text: "two".into(),
                ..request
            })
            .await
            .unwrap(),
    );
    assert_eq!(again, run);
    assert_eq!(
        settle(&runtime, &run, &second).await.response.as_deref(),
        Some("echo: two")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensuring_an_address_creates_a_pending_run_without_a_model_turn() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let address = Address::new("http", "browser-7");
    let view = runtime.ensure(&address).await.unwrap();
    assert_eq!(view.status, Status::Pending);
    assert_eq!(view.cursor, Some(Seq(0)));
    assert_eq!(
        runtime.ensure(&address).await.unwrap().run_id,
        view.run_id,
        "ensuring again finds the same run"
    );
    assert_eq!(runtime.lookup(&address).await.unwrap().run_id, view.run_id);
    assert_eq!(kinds(&journal, &view.run_id).await, ["run_created"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_drops_the_model_context_but_keeps_the_run_and_its_log() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let (run, turn) = started(runtime.start(start("remember this")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    runtime.clear(&run).await.unwrap();
    assert!(
        runtime.snapshot(&run).await.unwrap().messages.is_empty(),
        "the conversation is empty"
    );
    assert!(
        kinds(&journal, &run).await.contains(&"turn_completed"),
        "the log keeps everything"
    );
    let (_, next) = started(
        runtime
            .send(&run, message("fresh start", TurnPolicy::Steer))
            .await
            .unwrap(),
    );
    assert_eq!(
        settle(&runtime, &run, &next).await.response.as_deref(),
        Some("echo: fresh start")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_and_compact_are_refused_while_a_turn_is_in_progress() {
    let (tool, _, entered_tool, gate) = gated(Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "gated", "arguments": {}}]}
{"text": "ok"}"#;
    let runtime = runtime_with(
        Arc::new(MemoryJournal::new()),
        script,
        tools_with(vec![tool]),
    );
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    entered(&entered_tool).await;
    assert_eq!(
        runtime.clear(&run).await.unwrap_err().kind(),
        ErrorKind::RunActive
    );
    assert_eq!(
        runtime.compact(&run).await.unwrap_err().kind(),
        ErrorKind::RunActive
    );
    gate.notify_one();
    settle(&runtime, &run, &turn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacting_with_an_engine_that_cannot_is_compaction_unsupported() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    assert_eq!(
        runtime.compact(&run).await.unwrap_err().kind(),
        ErrorKind::CompactionUnsupported
    );
}

fn operator() -> Principal {
    Principal {
        authenticator: "token".into(),
        kind: "token".into(),
        id: "ops".into(),
        ..Principal::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_operation_id_and_body_returns_the_saved_run_without_another_turn() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let request = StartRequest {
        operation_id: Some("deploy-42".into()),
        principal: Some(operator()),
        ..start("deploy")
    };
    let (run, turn) = started(runtime.start(request.clone()).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let before = kinds(&journal, &run).await.len();
    assert_eq!(
        runtime.start(request).await.unwrap(),
        Accepted::Replayed {
            run: run.clone(),
            differs: false
        }
    );
    assert_eq!(kinds(&journal, &run).await.len(), before, "no second turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_operation_id_with_a_different_body_returns_the_saved_run_and_says_it_differs() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal)).build();
    let request = StartRequest {
        operation_id: Some("deploy-42".into()),
        principal: Some(operator()),
        ..start("deploy")
    };
    let (run, turn) = started(runtime.start(request.clone()).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let before = kinds(&journal, &run).await.len();
    let changed = runtime
        .start(StartRequest {
            text: "deploy to production".into(),
            ..request
        })
        .await
        .unwrap();
    assert_eq!(
        changed,
        Accepted::Replayed {
            run: run.clone(),
            differs: true
        }
    );
    assert_eq!(kinds(&journal, &run).await.len(), before, "no second turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_id_without_a_verified_principal_is_a_bad_request() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let request = StartRequest {
        operation_id: Some("k".into()),
        ..start("x")
    };
    assert_eq!(
        runtime.start(request).await.unwrap_err().kind(),
        ErrorKind::BadRequest
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_fails_the_turn_with_its_code() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = runtime_with(
        Arc::clone(&journal),
        r#"{"error": "model server overloaded"}"#,
        spool_runtime::Tools::builtin(),
    );
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    assert_eq!(settle(&runtime, &run, &turn).await.status, Status::Failed);
    let failure = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::TurnFailed(f) => Some(f),
            _ => None,
        });
    let failure = failure.unwrap();
    assert_eq!(failure.code.as_str(), "provider_error");
    assert!(failure.message.contains("overloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_the_scripts_end_fails_with_an_error_that_says_so() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = runtime_with(
        Arc::clone(&journal),
        r#"{"text": "only one"}"#,
        spool_runtime::Tools::builtin(),
    );
    let (run, turn) = started(runtime.start(start("one")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let (_, second) = started(
        runtime
            .send(&run, message("two", TurnPolicy::Steer))
            .await
            .unwrap(),
    );
    assert_eq!(settle(&runtime, &run, &second).await.status, Status::Failed);
    let message = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find_map(|e| match e.event {
            Event::TurnFailed(f) => Some(f.message),
            _ => None,
        });
    assert!(message.unwrap().contains("the script has 1 steps"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_that_fails_a_tools_schema_is_a_recorded_invalid_input_failure_the_model_sees() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"question": "?"}}, {"id": "c2", "name": "no_such_tool", "arguments": {}}]}
{"text": "sorry"}"#;
    let runtime = runtime_with(
        Arc::clone(&journal),
        script,
        spool_runtime::Tools::builtin(),
    );
    let (run, turn) = started(runtime.start(start("x")).await.unwrap());
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed
    );
    let outputs: Vec<Value> = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::ToolCallCompleted(c) => Some(std::sync::Arc::unwrap_or_clone(c.output)),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 2);
    for output in &outputs {
        assert_eq!(
            output["__spool_error"]["kind"],
            json!("invalid_input"),
            "{output}"
        );
        assert_eq!(
            output["__spool_error"]["attempts"],
            json!(0),
            "the tool never ran"
        );
    }
    let second = &requests(&journal, &run).await[1];
    assert!(
        second[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("error: invalid input for `ask_human`"),
        "{second:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_call_under_a_claimed_key_runs_once_across_runs() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (tool, runs) = Counting::new("charge", Effect::Idempotent);
    // A script line answers a run's N-th call, so both runs follow the
    // same two lines.
    let script = r#"{"tool_calls": [{"id": "c1", "name": "charge", "arguments": {"key": "order-7"}}]}
{"text": "charged"}"#;
    let first = runtime_with(Arc::clone(&journal), script, tools_with(vec![tool.clone()]));
    let (run, turn) = started(first.start(start("pay")).await.unwrap());
    settle(&first, &run, &turn).await;
    let (other, other_turn) = started(first.start(start("pay again")).await.unwrap());
    assert_eq!(
        settle(&first, &other, &other_turn).await.status,
        Status::Completed
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call got the recorded output"
    );
}

/// The echo engine, with a compaction that summarizes by counting.
pub(crate) struct Compacting;

impl spool_runtime::Engine for Compacting {
    fn call<'a>(
        &'a self,
        context: &'a spool_runtime::engine::CallContext,
        request: &'a spool_runtime::ModelRequest,
        deltas: spool_runtime::engine::Deltas<'a>,
        cancel: &'a tokio_util::sync::CancellationToken,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<spool_runtime::ModelResponse, spool_runtime::engine::EngineError>,
    > {
        spool_runtime::engines::EchoEngine.call(context, request, deltas, cancel)
    }

    fn compact<'a>(
        &'a self,
        messages: &'a [spool_runtime::Message],
    ) -> spool_runtime::BoxFuture<'a, Result<String, spool_runtime::engine::EngineError>> {
        Box::pin(async move { Ok(format!("{} messages so far", messages.len())) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_mid_stream_stops_the_model_at_once_and_records_no_answer() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    // Ten minutes of streaming if nothing stopped it.
    let words = vec!["word"; 600].join(" ");
    let script = format!(r#"{{"text": "{words}", "delay_ms": 1000}}"#);
    let runtime = runtime_with(
        Arc::clone(&journal),
        &script,
        spool_runtime::Tools::builtin(),
    );
    let pending = runtime
        .ensure(&Address::new("http", "cancel-stream"))
        .await
        .unwrap();
    let mut stream = runtime
        .subscribe(&pending.run_id, pending.cursor)
        .await
        .unwrap();
    let (_, turn) = started(
        runtime
            .send(&pending.run_id, message("talk", TurnPolicy::Steer))
            .await
            .unwrap(),
    );
    // Wait for the first streamed word: the model call is under way.
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            if matches!(item, spool_runtime::hub::StreamItem::Delta(_)) {
                return;
            }
        }
    })
    .await
    .expect("the answer starts streaming");
    assert_eq!(
        runtime.cancel(&pending.run_id, Some(&turn)).await.unwrap(),
        CancelOutcome::Requested(turn.clone())
    );
    assert_eq!(
        settle(&runtime, &pending.run_id, &turn).await.status,
        Status::Cancelled
    );
    let kinds = kinds(&journal, &pending.run_id).await;
    assert!(
        !kinds.contains(&"model_call_completed"),
        "the interrupted answer is not recorded: {kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_shows_steered_input_after_the_answer_it_came_too_late_for() {
    let (engine, gate) = crate::support::Held::new();
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(engine)
        .build();
    let (run, turn) = started(runtime.start(start("hello")).await.unwrap());
    gate.entered().await;
    // Steered in while the first model call is under way: the model sees
    // it in the next call, after its first answer.
    assert!(matches!(
        runtime
            .send(&run, message("also this", TurnPolicy::Steer))
            .await
            .unwrap(),
        Accepted::Steered { .. }
    ));
    gate.open();
    settle(&runtime, &run, &turn).await;
    let messages = runtime.snapshot(&run).await.unwrap().messages;
    let shown: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["content"][0]["text"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("user", "hello"),
            ("assistant", "echo: hello"),
            ("user", "also this"),
            ("assistant", "echo: also this"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_shows_a_question_and_its_answer_without_the_recorded_sentinel() {
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"text": "deploying to eu-west-1"}"#;
    let runtime = scripted(script);
    let (run, turn) = started(runtime.start(start("deploy")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "eu-west-1".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    settle(&runtime, &run, &turn).await;
    let messages = runtime.snapshot(&run).await.unwrap().messages;
    let text = serde_json::to_string(&messages).unwrap();
    assert!(!text.contains("__spool"), "{text}");
    assert_eq!(messages[1]["content"][0]["type"], "tool_call", "{text}");
    assert_eq!(messages[2]["role"], "user", "{text}");
    assert_eq!(messages[2]["tool_call_id"], "c1", "{text}");
    assert_eq!(messages[2]["content"][0]["text"], "eu-west-1", "{text}");
    assert_eq!(messages[3]["content"][0]["text"], "deploying to eu-west-1");
    runtime.clear(&run).await.unwrap();
    assert!(
        runtime.snapshot(&run).await.unwrap().messages.is_empty(),
        "a clear starts the display history over"
    );
}
