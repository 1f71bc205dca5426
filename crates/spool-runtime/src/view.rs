//! What the runtime tells callers about a run: its state and latest
//! boundary result, and the conversation for display.

use serde_json::Value;
use spool_journal::event::{Suspended, Usage};
use spool_journal::fold::{ItemContent, State, Status};
use spool_journal::{RunId, Seq, TurnId};
use spool_wire::run::SuspendKind;

use crate::runs::Locked;

/// A run's state and latest boundary result.
#[derive(Clone, Debug, PartialEq)]
pub struct RunView {
    /// The run.
    pub run_id: RunId,
    /// Its public state.
    pub status: Status,
    /// The current (or last) turn.
    pub turn_id: Option<TurnId>,
    /// The last journal position: stream after it.
    pub cursor: Option<Seq>,
    /// The last turn's answer.
    pub response: Option<String>,
    /// Why it waits, while it waits for an answer.
    pub suspend: Option<Suspended>,
    /// Tokens the last turn used.
    pub usage: Option<Usage>,
    /// Its title.
    pub title: Option<String>,
}

/// A run's conversation, state and cursor, read at one position.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The state.
    pub view: RunView,
    /// The conversation for display: `{"role", "content"}` objects, with
    /// tool calls and results.
    pub messages: Vec<Value>,
}

impl RunView {
    pub(crate) fn of(locked: &Locked) -> Self {
        let cached = locked.cached();
        let state = &cached.state;
        Self {
            run_id: locked.run().clone(),
            status: state.status,
            turn_id: state.turn.clone(),
            cursor: state.last_seq,
            response: state.response.clone(),
            suspend: state.suspension.clone().or_else(|| budget_suspend(state)),
            // The last turn's usage: what its completion recorded.
            usage: cached.turn_usage,
            title: state.title().map(str::to_owned),
        }
    }
}

impl Snapshot {
    pub(crate) fn of(locked: &Locked) -> Self {
        let messages = locked
            .state()
            .conversation
            .iter()
            .map(|item| match &item.content {
                ItemContent::User(text) => serde_json::json!({"role": "user", "content": text}),
                ItemContent::Assistant(message) => {
                    let text = message.get("text").cloned().unwrap_or(Value::String(String::new()));
                    let mut shown = serde_json::json!({"role": "assistant", "content": text});
                    if let Some(calls) = message.get("tool_calls") {
                        shown["tool_calls"] = calls.clone();
                    }
                    shown
                }
                ItemContent::ToolResult { call_id, output } => {
                    serde_json::json!({"role": "tool", "call_id": call_id, "content": output})
                }
                ItemContent::Answers(answers) => serde_json::json!({
                    "role": "user",
                    "content": answers.iter().map(|a| a.text.as_str()).collect::<Vec<_>>().join("\n"),
                    "answers": serde_json::to_value(answers).unwrap_or_default(),
                }),
                ItemContent::Summary(summary) => serde_json::json!({"role": "summary", "content": summary}),
            })
            .collect();
        Self {
            view: RunView::of(locked),
            messages,
        }
    }
}

/// A used-up budget, shown the way every other wait is: what is used up,
/// and the verdict that answers it.
fn budget_suspend(state: &State) -> Option<Suspended> {
    let (Status::Waiting(SuspendKind::Budget), Some(budget), Some(turn)) =
        (&state.status, &state.budget, &state.turn)
    else {
        return None;
    };
    Some(Suspended {
        turn_id: turn.clone(),
        kind: SuspendKind::Budget,
        prompt: format!(
            "the {} budget is used up ({} of {}): approve to extend it, or reject to end the turn",
            budget.budget, budget.used, budget.limit
        ),
        call_id: None,
        input_schema: Some(serde_json::json!({"type": "object", "required": ["approved"]}).into()),
        options: Some(vec!["approve".into(), "reject".into()]),
    })
}
