//! Compaction and budgets through the public API: what the model sees after
//! a summary, and a budget that parks, extends or fails a turn.

use crate::support::*;
use crate::turns::{Compacting, message, start, started};
use serde_json::json;
use spool_journal::event::{Answer, Effect};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, RunId, Seq, TurnId};
use spool_runtime::ErrorKind;
use spool_runtime::Runtime;
use spool_wire::run::{SuspendKind, TurnPolicy};
use std::sync::Arc;

/// A run on the `Compacting` engine whose first turn (`one`) has settled.
async fn compacting_after_one() -> (Arc<dyn Journal>, Runtime, RunId) {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal))
        .engine(Arc::new(Compacting))
        .build();
    let (run, turn) = started(runtime.start(start("one")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    (journal, runtime, run)
}

/// Sends `text` to the idle `run` and waits for its turn to settle.
async fn next_turn(runtime: &Runtime, run: &RunId, text: &str) {
    let (_, turn) = started(
        runtime
            .send(run, message(text, TurnPolicy::Steer))
            .await
            .unwrap(),
    );
    settle(runtime, run, &turn).await;
}

/// What the model is asked after a compaction: the summary, then `text`.
fn after_summary(summary: &str, text: &str) -> spool_runtime::engine::ModelRequest {
    spool_runtime::engine::ModelRequest::new(
        vec![
            spool_runtime::Message::User {
                content: format!("Summary of the conversation so far: {summary}"),
            },
            spool_runtime::Message::User {
                content: text.into(),
            },
        ],
        spool_runtime::Tools::builtin().specs(),
    )
}

/// The hash of the last model request `run` recorded.
async fn last_request(journal: &Arc<dyn Journal>, run: &RunId) -> String {
    journal
        .read(run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find_map(|e| match e.event {
            Event::ModelCallRequested(r) => Some(r.request_hash),
            _ => None,
        })
        .expect("a model request was recorded")
}

fn budgeted(journal: &Arc<dyn Journal>, budgets: spool_runtime::agent::Budgets) -> Runtime {
    let (tool, _) = Counting::new("count", Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "count", "arguments": {}}], "usage": {"input_tokens": 10, "output_tokens": 5}}
{"text": "finished", "usage": {"input_tokens": 20, "output_tokens": 5}}"#;
    Runtime::builder(Arc::clone(journal))
        .engine(Arc::new(
            spool_runtime::engines::ScriptedEngine::from_jsonl(script).unwrap(),
        ))
        .tools(tools_with(vec![tool]))
        .budgets(budgets)
        .build()
}

/// A run started under a `steps_per_turn` budget of `steps` (the
/// `budgeted` agent), and its view once the turn reaches a boundary.
pub(crate) async fn started_under_steps(
    journal: &Arc<dyn Journal>,
    steps: u64,
) -> (Runtime, RunId, TurnId, spool_runtime::RunView) {
    let runtime = budgeted(
        journal,
        spool_runtime::agent::Budgets {
            steps_per_turn: Some(steps),
            ..Default::default()
        },
    );
    let (run, turn) = started(runtime.start(start("count")).await.unwrap());
    let view = settle(&runtime, &run, &turn).await;
    (runtime, run, turn, view)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_budget_parks_the_run_and_an_approval_extends_it() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (runtime, run, turn, view) = started_under_steps(&journal, 1).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Budget));
    let suspend = view.suspend.unwrap();
    assert_eq!(suspend.kind, SuspendKind::Budget);
    assert!(
        suspend
            .prompt
            .contains("steps_per_turn budget is used up (1 of 1)"),
        "{}",
        suspend.prompt
    );
    let silent = runtime
        .respond(
            &run,
            None,
            vec![Answer {
                text: "ok".into(),
                approved: None,
            }],
        )
        .await
        .unwrap_err();
    assert_eq!(
        silent.kind(),
        ErrorKind::InvalidAnswer,
        "a budget needs a verdict"
    );
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "go on".into(),
                approved: Some(true),
            }],
        )
        .await
        .unwrap();
    let view = until(&runtime, &run, |v| v.status == Status::Completed).await;
    assert_eq!(view.response.as_deref(), Some("finished"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declining_to_extend_a_used_up_budget_fails_the_turn_with_code_budget() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = budgeted(
        &journal,
        spool_runtime::agent::Budgets {
            tokens: Some(15),
            ..Default::default()
        },
    );
    let (run, turn) = started(runtime.start(start("count")).await.unwrap());
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Waiting(SuspendKind::Budget)
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
    until(&runtime, &run, |v| v.status == Status::Failed).await;
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
    assert_eq!(failure.code.as_str(), "budget");
    assert!(
        failure.message.contains("tokens budget (15)"),
        "{}",
        failure.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_budget_prices_recorded_usage_and_parks_the_run_when_crossed() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    // The first call uses 10 in + 5 out: at $100 per million input tokens
    // and $200 per million output, that is 1000 + 1000 micro-dollars.
    let (tool, _) = Counting::new("count", Effect::Read);
    let script = r#"{"tool_calls": [{"id": "c1", "name": "count", "arguments": {}}], "usage": {"input_tokens": 10, "output_tokens": 5}}
{"text": "finished"}"#;
    let runtime = Runtime::builder(Arc::clone(&journal))
        .engine(Arc::new(
            spool_runtime::engines::ScriptedEngine::from_jsonl(script).unwrap(),
        ))
        .tools(tools_with(vec![tool]))
        .budgets(spool_runtime::agent::Budgets {
            cost_usd: Some(0.002),
            ..Default::default()
        })
        .pricing(spool_runtime::agent::Pricing {
            input_per_million: 100.0,
            output_per_million: 200.0,
        })
        .build();
    let (run, turn) = started(runtime.start(start("spend")).await.unwrap());
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Waiting(SuspendKind::Budget));
    let exceeded = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::BudgetExceeded(b) => Some(b),
            _ => None,
        });
    let exceeded = exceeded.unwrap();
    assert_eq!(
        (exceeded.budget.as_str(), exceeded.limit, exceeded.used),
        ("cost_micro_usd", 2000, 2000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_replaces_older_context_with_the_engines_summary_for_the_model_not_the_display_history()
 {
    let (journal, runtime, run) = compacting_after_one().await;
    let before = runtime.snapshot(&run).await.unwrap().messages;
    runtime.compact(&run).await.unwrap();
    // The seed: compaction does not remove older messages from display
    // history.
    assert_eq!(runtime.snapshot(&run).await.unwrap().messages, before);
    assert_eq!(
        before,
        [
            json!({"role": "user", "content": [{"type": "text", "text": "one"}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "echo: one"}]}),
        ]
    );
    next_turn(&runtime, &run, "two").await;
    // The model saw the summary in place of the first turn.
    assert_eq!(
        last_request(&journal, &run).await,
        after_summary("2 messages so far", "two").hash()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_compaction_covers_the_first_summary_and_the_turns_after_it() {
    let (journal, runtime, run) = compacting_after_one().await;
    runtime.compact(&run).await.unwrap();
    next_turn(&runtime, &run, "two").await;
    runtime.compact(&run).await.unwrap();
    let log = journal.read(&run, Seq(0)).await.unwrap();
    let compactions: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::Compacted(c) => Some((e.seq, c.from, c.to, c.summary.clone())),
            _ => None,
        })
        .collect();
    let answered: Vec<Seq> = log
        .iter()
        .filter(|e| matches!(e.event, Event::ModelCallCompleted(_)))
        .map(|e| e.seq)
        .collect();
    let [
        (first_at, from, to, first),
        (_, second_from, second_to, second),
    ] = compactions.as_slice()
    else {
        panic!("two compactions, got {compactions:?}");
    };
    // The first covers turn one, from its input to its answer.
    assert_eq!((*from, *to), (Seq(1), answered[0]));
    assert_eq!(first, "2 messages so far");
    // The second starts at the first's summary and ends at turn two's
    // answer: the positions come from the log, not from the cache.
    assert_eq!((*second_from, *second_to), (*first_at, answered[1]));
    assert_eq!(
        second, "3 messages so far",
        "the summary, `two` and its answer"
    );
    next_turn(&runtime, &run, "three").await;
    assert_eq!(
        last_request(&journal, &run).await,
        after_summary("3 messages so far", "three").hash()
    );
}
