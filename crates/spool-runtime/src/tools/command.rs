//! Command tools: a tool run as a child process, so operators add tools
//! without Rust. The input goes to the program as JSON on stdin; its stdout
//! must be one JSON value (empty means `null`). A non-zero exit, a timeout,
//! or output that is not JSON is a failure whose message carries the tail of
//! stderr. Output is capped, and the process is killed when the call times
//! out or the turn is cancelled.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use spool_journal::event::Effect;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::agent::{CommandToolDefinition, DefinitionError};
use crate::engine::ToolSpec;
use crate::process::{self, Program};
use crate::tool::{Tool, ToolOutcome};

/// A command tool.
#[derive(Clone, Debug)]
pub struct CommandTool {
    definition: CommandToolDefinition,
    program: Program,
}

impl CommandTool {
    /// A tool from its definition; a relative program path with a `/` is
    /// taken from `base`.
    ///
    /// # Errors
    ///
    /// [`DefinitionError::Rule`] when the definition names no program (a
    /// loaded definition always does).
    pub fn new(definition: CommandToolDefinition, base: &Path) -> Result<Self, DefinitionError> {
        let program = Program::new(&definition.command, base).ok_or_else(|| {
            DefinitionError::Rule(format!(
                "tool `{}`: `command` needs at least the program",
                definition.name
            ))
        })?;
        Ok(Self {
            definition,
            program,
        })
    }

    /// Runs the program under [`crate::process`]'s policy; the stderr tail
    /// goes into the failure, which the model reads.
    async fn run(&self, input: Value, cancel: &CancellationToken) -> Result<Value, String> {
        let input = serde_json::to_vec(&input).map_err(|e| e.to_string())?;
        let limit = Duration::from_secs_f64(self.definition.timeout_seconds);
        let mut out = Vec::new();
        let exit = process::run(&self.program, &input, limit, cancel, &mut |chunk| {
            out.extend_from_slice(chunk);
            Ok(())
        })
        .await
        .map_err(|error| error.to_string())?;
        if !exit.status.success() {
            return Err(format!(
                "exited with {}{}",
                exit.code(),
                if exit.stderr_tail.is_empty() {
                    String::new()
                } else {
                    format!(": {}", exit.stderr_tail)
                }
            ));
        }
        let text =
            String::from_utf8(out).map_err(|_| "printed output that is not UTF-8".to_owned())?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| {
            let shown: String = text.chars().take(200).collect();
            format!("printed output that is not JSON ({e}): {shown}")
        })
    }
}

impl Tool for CommandTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.definition.name.clone(),
            description: self.definition.description.clone(),
            input_schema: self.definition.input_schema.clone(),
        }
    }

    fn effect(&self) -> Effect {
        self.definition.effect
    }

    fn attempts(&self) -> u32 {
        self.definition.attempts
    }

    fn keyed(&self) -> bool {
        self.definition.idempotency_key.is_some()
    }

    fn idempotency_key(&self, input: &Value) -> Option<String> {
        let pointer = self.definition.idempotency_key.as_deref()?;
        match input.pointer(pointer)? {
            Value::String(key) => Some(key.clone()),
            other => Some(other.to_string()),
        }
    }

    fn call<'a>(
        &'a self,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            match self.run(input, cancel).await {
                Ok(output) => ToolOutcome::Output(output),
                Err(message) => {
                    ToolOutcome::Error(format!("tool `{}` {message}", self.definition.name))
                }
            }
        })
    }
}
