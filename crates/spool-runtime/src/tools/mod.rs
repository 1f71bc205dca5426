//! The built-in tools: `ask_human` (a question), `request_approval` (an
//! explicit yes or no) and `sleep` (park until an instant).

pub mod command;

use std::sync::Arc;

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_wire::run::SuspendKind;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::engine::ToolSpec;
use crate::tool::{Suspension, Tool, ToolOutcome};

/// Every built-in tool.
#[must_use]
pub fn builtin() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(AskHuman),
        Arc::new(RequestApproval),
        Arc::new(SleepTool),
    ]
}

/// `ask_human {prompt, options?}`: parks the run with a question.
#[derive(Clone, Copy, Debug)]
pub struct AskHuman;

impl Tool for AskHuman {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "ask_human".into(),
            description: "Ask the person a question and wait for the answer.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "minLength": 1},
                    "options": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["prompt"],
                "additionalProperties": false
            }),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Read
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let options = input.get("options").and_then(Value::as_array).map(|o| {
                o.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            });
            let mut answer = json!({
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": 1}},
                "required": ["text"]
            });
            if let Some(options) = &options {
                answer["properties"]["text"] = json!({"enum": options});
            }
            ToolOutcome::Suspend(Suspension {
                kind: SuspendKind::Question,
                prompt: prompt_of(&input),
                options,
                answer_schema: answer,
            })
        })
    }
}

/// The `prompt` a question or approval asks (its schema requires one).
fn prompt_of(input: &Value) -> String {
    input
        .get("prompt")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// `request_approval {prompt}`: parks the run for a person's verdict
/// (`approved: true` or `false`), or a text-only answer without one.
#[derive(Clone, Copy, Debug)]
pub struct RequestApproval;

impl Tool for RequestApproval {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "request_approval".into(),
            description: "Ask the person to approve or reject, and wait for the verdict.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"prompt": {"type": "string", "minLength": 1}},
                "required": ["prompt"],
                "additionalProperties": false
            }),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Read
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            ToolOutcome::Suspend(Suspension {
                kind: SuspendKind::Approval,
                prompt: prompt_of(&input),
                options: Some(vec!["approve".into(), "reject".into()]),
                // `approved: true` approves, `false` rejects, and an answer
                // without it is a text-only answer that rejects nothing (the
                // HTTP seed's rule): the model reads the text.
                answer_schema: json!({
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}, "text": {"type": "string"}}
                }),
            })
        })
    }
}

/// `sleep {seconds}` or `sleep {until}` (RFC 3339): parks the run until an
/// instant. The wake-up is durable: it survives a restart.
#[derive(Clone, Copy, Debug)]
pub struct SleepTool;

impl Tool for SleepTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sleep".into(),
            description:
                "Wait until a number of seconds has passed, or until an instant (RFC 3339).".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "seconds": {"type": "number", "minimum": 0},
                    "until": {"type": "string"}
                },
                "oneOf": [{"required": ["seconds"]}, {"required": ["until"]}],
                "additionalProperties": false
            }),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Read
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            if let Some(until) = input.get("until").and_then(Value::as_str) {
                return match time::OffsetDateTime::parse(
                    until,
                    &time::format_description::well_known::Rfc3339,
                ) {
                    Ok(at) => ToolOutcome::Sleep(at),
                    Err(_) => {
                        ToolOutcome::Error(format!("`until` is not an RFC 3339 instant: {until}"))
                    }
                };
            }
            let seconds = input.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
            match time::Duration::checked_seconds_f64(seconds) {
                Some(wait) => ToolOutcome::Sleep(time::OffsetDateTime::now_utc() + wait),
                None => ToolOutcome::Error(format!("cannot sleep {seconds} seconds")),
            }
        })
    }
}
