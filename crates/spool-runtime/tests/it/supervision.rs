//! Drivers that cannot wedge: an engine or a tool (a host's code) that
//! panics fails its turn with a recorded `internal` failure, and the run
//! takes its next turn as if nothing happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, RunId, Seq};
use spool_runtime::engine::{CallContext, Deltas, EngineError, ToolSpec};
use spool_runtime::{BoxFuture, Engine, ModelRequest, ModelResponse, Runtime, Tool, ToolOutcome};
use tokio_util::sync::CancellationToken;

use crate::support::{begin, kinds, next_turn, runtime_with, settle, tools_with};

/// A tool whose every call panics.
struct Panicking;

impl Tool for Panicking {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "boom".into(),
            description: "panics".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Idempotent
    }

    fn idempotency_key(&self, input: &Value) -> Option<String> {
        input.get("key").and_then(Value::as_str).map(str::to_owned)
    }

    fn call<'a>(
        &'a self,
        _input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async { panic!("the tool's own bug") })
    }
}

/// An engine whose first call panics before it returns a future, whose
/// second panics inside its future, and whose later calls echo.
#[derive(Default)]
struct PanicsTwice {
    calls: AtomicUsize,
}

impl Engine for PanicsTwice {
    fn call<'a>(
        &'a self,
        context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => panic!("the engine's own bug"),
            1 => Box::pin(async { panic!("a bug in the engine's future") }),
            _ => spool_runtime::engines::EchoEngine.call(context, request, deltas, cancel),
        }
    }
}

async fn last_failure(journal: &Arc<dyn Journal>, run: &RunId) -> (String, String) {
    let log = journal.read(run, Seq(0)).await.unwrap();
    log.iter()
        .rev()
        .find_map(|e| match &e.event {
            Event::TurnFailed(failed) => Some((failed.code.to_string(), failed.message.clone())),
            _ => None,
        })
        .expect("a turn_failed is recorded")
}

#[tokio::test]
async fn a_panicking_tool_fails_its_turn_as_internal_and_the_run_takes_its_next_turn() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "boom", "arguments": {"key": "k1"}}]}
{"text": "still here"}
{"tool_calls": [{"id": "c2", "name": "boom", "arguments": {"key": "k1"}}]}"#;
    let runtime = runtime_with(
        Arc::clone(&journal),
        script,
        tools_with(vec![Arc::new(Panicking)]),
    );
    let (run, turn) = begin(&runtime, "go").await;
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Failed);
    let (code, message) = last_failure(&journal, &run).await;
    assert_eq!(code, "internal");
    assert!(
        message.contains("`boom` panicked: the tool's own bug"),
        "{message}"
    );
    // The call is given up, not left open: its idempotency claim is
    // released too (the third call below claims the same key again).
    let recorded = kinds(&journal, &run).await;
    assert!(
        recorded.ends_with(&["tool_call_requested", "tool_call_abandoned", "turn_failed"]),
        "{recorded:?}"
    );
    let view = next_turn(&runtime, &run, "again").await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("still here"));
    let view = next_turn(&runtime, &run, "same key").await;
    let (_, message) = last_failure(&journal, &run).await;
    assert_eq!(view.status, Status::Failed);
    assert!(
        message.contains("panicked"),
        "the released key runs the tool again rather than waiting on the first call: {message}"
    );
}

#[tokio::test]
async fn an_engine_panicking_before_or_inside_its_future_fails_the_turn_as_internal_and_the_run_goes_on()
 {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal))
        .engine(Arc::new(PanicsTwice::default()))
        .build();
    let (run, turn) = begin(&runtime, "first").await;
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, Status::Failed);
    let (code, message) = last_failure(&journal, &run).await;
    assert_eq!(code, "internal");
    assert!(
        message.contains("the engine panicked: the engine's own bug"),
        "{message}"
    );
    let view = next_turn(&runtime, &run, "second").await;
    assert_eq!(view.status, Status::Failed);
    let (code, message) = last_failure(&journal, &run).await;
    assert_eq!(code, "internal");
    assert!(
        message.contains("the engine panicked: a bug in the engine's future"),
        "{message}"
    );
    let view = next_turn(&runtime, &run, "third").await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(view.response.as_deref(), Some("echo: third"));
}
