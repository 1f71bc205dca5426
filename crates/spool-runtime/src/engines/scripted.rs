//! `scripted`: a JSONL script where line N answers the run's N-th model
//! call. The test double, and a way to demo a run without a model.
//!
//! Each line is `{"text": "…"}` with optional `"thinking"`, `"tool_calls":
//! [{"id", "name", "arguments"}]`, `"usage": {"input_tokens",
//! "output_tokens"}` and `"delay_ms"` (the pace of the streamed words), or
//! `{"error": "…"}` for a provider error. A call past the script's end is a
//! provider error that says so.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use spool_journal::event::Usage;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::engine::{
    CallContext, Delta, Deltas, Engine, EngineError, ModelRequest, ModelResponse, ToolCall,
};

/// A script, checked when loaded.
#[derive(Clone, Debug)]
pub struct ScriptedEngine {
    lines: Vec<Line>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    id: String,
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// A script that does not load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("reading the script {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a script step.
    #[error("script line {line}: {reason}")]
    Line {
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl ScriptedEngine {
    /// Loads a script from JSONL text. Blank lines are skipped.
    ///
    /// # Errors
    ///
    /// [`ScriptError::Line`] for a line that is not a step (unknown keys
    /// included), or one with both `error` and an answer.
    pub fn from_jsonl(text: &str) -> Result<Self, ScriptError> {
        let mut lines = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw).map_err(|e| ScriptError::Line {
                line: index + 1,
                reason: e.to_string(),
            })?;
            if line.error.is_some() && (line.text.is_some() || !line.tool_calls.is_empty()) {
                return Err(ScriptError::Line {
                    line: index + 1,
                    reason: "a step is an answer or an error, not both".into(),
                });
            }
            lines.push(line);
        }
        Ok(Self { lines })
    }

    /// Loads a script file.
    ///
    /// # Errors
    ///
    /// [`ScriptError::Read`] when the file cannot be read; as
    /// [`ScriptedEngine::from_jsonl`] otherwise.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ScriptError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_jsonl(&text)
    }
}

impl Engine for ScriptedEngine {
    fn call<'a>(
        &'a self,
        context: &'a CallContext,
        _request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        Box::pin(async move {
            let index = usize::try_from(context.ordinal).unwrap_or(usize::MAX);
            let Some(line) = self.lines.get(index) else {
                return Err(EngineError::Provider(format!(
                    "the script has {} steps; run {} made call {}",
                    self.lines.len(),
                    context.run,
                    context.ordinal + 1
                )));
            };
            if let Some(error) = &line.error {
                return Err(EngineError::Provider(error.clone()));
            }
            let pace = Duration::from_millis(line.delay_ms);
            if let Some(thinking) = &line.thinking {
                deltas(Delta::Thinking(thinking.clone()));
            }
            let text = line.text.clone().unwrap_or_default();
            super::stream_words(&text, pace, deltas, cancel).await?;
            let tool_calls: Vec<ToolCall> = line
                .tool_calls
                .iter()
                .map(|call| {
                    deltas(Delta::ToolCallStart {
                        id: call.id.clone(),
                        name: call.name.clone(),
                    });
                    let arguments = call.arguments.to_string();
                    deltas(Delta::ToolCallArguments {
                        id: call.id.clone(),
                        fragment: arguments.clone(),
                    });
                    deltas(Delta::ToolCallDone {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments,
                    });
                    ToolCall {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                    }
                })
                .collect();
            Ok(ModelResponse {
                finish_reason: Some(
                    if tool_calls.is_empty() {
                        "stop"
                    } else {
                        "tool_use"
                    }
                    .into(),
                ),
                text,
                thinking: line.thinking.clone(),
                tool_calls,
                usage: line.usage,
            })
        })
    }
}
