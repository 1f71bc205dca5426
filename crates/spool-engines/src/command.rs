//! A provider CLI run as a child process: the request goes to its stdin as
//! JSON (`{"messages": [...], "tools": [...]}`, the runtime's
//! [`ModelRequest`]), each stdout line is a piece of the answer's text, and
//! a non-zero exit or a timeout is an `engine_cli` failure. The stderr tail
//! goes to the log, never into the turn's recorded error, which a client
//! can read.

use std::path::Path;
use std::time::Duration;

use spool_runtime::BoxFuture;
use spool_runtime::engine::{
    CallContext, Delta, Deltas, Engine, EngineError, ModelRequest, ModelResponse,
};
use spool_runtime::process::{self, Program, RunError};
use tokio_util::sync::CancellationToken;

/// An engine that runs a program for each model call.
#[derive(Debug)]
pub struct CommandEngine {
    program: Program,
    timeout: Duration,
}

impl CommandEngine {
    /// Runs `argv` (program first) for each call, killed after `timeout`. A
    /// relative program path with a `/` resolves against `base`, as command
    /// tools' do.
    ///
    /// # Errors
    ///
    /// [`SpecError::BadCommand`](crate::SpecError::BadCommand) when `argv`
    /// is empty.
    pub fn new(
        argv: Vec<String>,
        base: &Path,
        timeout: Duration,
    ) -> Result<Self, crate::SpecError> {
        let program = Program::new(&argv, base)
            .ok_or_else(|| crate::SpecError::BadCommand("command:".into()))?;
        Ok(Self { program, timeout })
    }

    /// One call under [`spool_runtime::process`]'s policy: each stdout line
    /// is streamed as it completes; the stderr tail goes to the log only.
    async fn run(
        &self,
        context: &CallContext,
        request: &ModelRequest,
        deltas: Deltas<'_>,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, EngineError> {
        let shown = self.program.path.display().to_string();
        tracing::info!(target: "spool::engine", provider = "command", program = %shown, run = %context.run, call = context.ordinal, "calling the model");
        let input = serde_json::to_vec(request).expect("a model request is plain JSON");
        // Lines are kept as printed (indentation, blank lines), each
        // streamed as soon as its newline arrives.
        let mut text = String::new();
        let mut first = true;
        let mut partial = Vec::new();
        let mut emit = |mut line: Vec<u8>, text: &mut String| {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line)
                .map_err(|_| "printed output that is not UTF-8".to_owned())?;
            let piece = if std::mem::take(&mut first) {
                line
            } else {
                format!("\n{line}")
            };
            text.push_str(&piece);
            deltas(Delta::Text(piece));
            Ok::<_, String>(())
        };
        let outcome = process::run(&self.program, &input, self.timeout, cancel, &mut |chunk| {
            partial.extend_from_slice(chunk);
            while let Some(at) = partial.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = partial.drain(..=at).collect();
                line.pop();
                emit(line, &mut text)?;
            }
            Ok(())
        })
        .await;
        let failure = match outcome {
            Err(RunError::Cancelled(_)) => return Err(EngineError::Cancelled),
            Err(error) => error.to_string(),
            Ok(exit) if exit.status.success() => {
                if !partial.is_empty() {
                    emit(std::mem::take(&mut partial), &mut text)
                        .map_err(|reason| EngineError::Cli(format!("`{shown}` {reason}")))?;
                }
                return Ok(ModelResponse {
                    text,
                    finish_reason: Some("stop".into()),
                    ..ModelResponse::default()
                });
            }
            Ok(exit) => {
                tracing::warn!(target: "spool::engine", provider = "command", run = %context.run, stderr = %exit.stderr_tail, "engine command's stderr");
                format!("`{shown}` exited with {}", exit.code())
            }
        };
        tracing::warn!(target: "spool::engine", provider = "command", run = %context.run, error = %failure, "engine command failed");
        Err(EngineError::Cli(failure))
    }
}

impl Engine for CommandEngine {
    fn call<'a>(
        &'a self,
        context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        Box::pin(self.run(context, request, deltas, cancel))
    }
}
