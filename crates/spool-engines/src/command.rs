//! A provider CLI run as a child process: the request goes to its stdin as
//! JSON (`{"messages": [...], "tools": [...]}`, the runtime's
//! [`ModelRequest`]), each stdout line is a piece of the answer's text, and
//! a non-zero exit or a timeout is an `engine_cli` failure. The stderr tail
//! goes to the log, never into the turn's recorded error, which a client
//! can read.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use spool_runtime::BoxFuture;
use spool_runtime::engine::{
    CallContext, Delta, Deltas, Engine, EngineError, ModelRequest, ModelResponse,
};
use spool_runtime::tools::command::{MAX_OUTPUT_BYTES, STDERR_TAIL_BYTES, read_tail, tail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// How long stderr may stay open after the child exits.
const STDERR_GRACE: Duration = Duration::from_secs(1);

/// An engine that runs a program for each model call.
#[derive(Debug)]
pub struct CommandEngine {
    program: PathBuf,
    args: Vec<String>,
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
        let mut argv = argv.into_iter();
        let Some(first) = argv.next() else {
            return Err(crate::SpecError::BadCommand("command:".into()));
        };
        let program = if Path::new(&first).is_relative() && first.contains('/') {
            base.join(&first)
        } else {
            PathBuf::from(&first)
        };
        Ok(Self {
            program,
            args: argv.collect(),
            timeout,
        })
    }

    async fn run(
        &self,
        context: &CallContext,
        request: &ModelRequest,
        deltas: Deltas<'_>,
    ) -> Result<ModelResponse, EngineError> {
        let shown = self.program.display().to_string();
        tracing::info!(target: "spool::engine", provider = "command", program = %shown, run = %context.run, call = context.ordinal, "calling the model");
        let mut child = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| EngineError::Cli(format!("could not start `{shown}`: {e}")))?;
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(EngineError::Cli(format!("`{shown}` has no pipes")));
        };
        let input = serde_json::to_vec(request).expect("a model request is plain JSON");
        let feed = async move {
            // A program that answers without reading all its input is its
            // own business; a broken pipe is not its failure.
            let _ = stdin.write_all(&input).await;
        };
        let read = async {
            // Lines are kept as printed (indentation, blank lines), each
            // streamed as soon as its newline arrives.
            let mut text = String::new();
            let mut first = true;
            let mut partial = Vec::new();
            let mut total = 0;
            let mut chunk = [0u8; 8192];
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
            loop {
                let n = stdout.read(&mut chunk).await.map_err(|e| e.to_string())?;
                total += n;
                if total > MAX_OUTPUT_BYTES {
                    return Err(format!("printed more than {MAX_OUTPUT_BYTES} bytes"));
                }
                partial.extend_from_slice(&chunk[..n]);
                while let Some(at) = partial.iter().position(|&b| b == b'\n') {
                    let mut line: Vec<u8> = partial.drain(..=at).collect();
                    line.pop();
                    emit(line, &mut text)?;
                }
                if n == 0 {
                    if !partial.is_empty() {
                        emit(std::mem::take(&mut partial), &mut text)?;
                    }
                    return Ok(text);
                }
            }
        };
        // Stderr is drained beside stdout (a child blocked on a full pipe
        // would hang), in a task of its own so a refused stdout can end the
        // child without waiting for its stderr to close.
        let errors = tokio::spawn(async move { read_tail(&mut stderr, STDERR_TAIL_BYTES).await });
        let (_, text) = tokio::join!(feed, read);
        // Closed, so whatever still writes to it stops.
        drop(stdout);
        if text.is_err() {
            // Its output was refused: it need not finish printing more.
            let _ = child.start_kill();
        }
        let status = child
            .wait()
            .await
            .map_err(|e| EngineError::Cli(format!("`{shown}`: {e}")))?;
        // A process the child left behind may hold stderr open: its tail is
        // what arrived by the child's exit and a moment after.
        let mut errors = errors;
        let stderr_tail = match tokio::time::timeout(STDERR_GRACE, &mut errors).await {
            Ok(Ok(Ok(bytes))) => tail(&bytes),
            _ => {
                errors.abort();
                String::new()
            }
        };
        let failure = match (&text, status.success()) {
            (Ok(_), true) => None,
            (Err(reason), _) => Some(format!("`{shown}` {reason}")),
            (Ok(_), false) => Some(format!(
                "`{shown}` exited with {}",
                status
                    .code()
                    .map_or_else(|| "a signal".to_owned(), |c| c.to_string())
            )),
        };
        if let Some(failure) = failure {
            tracing::warn!(target: "spool::engine", provider = "command", run = %context.run, error = %failure, stderr = %stderr_tail, "engine command failed");
            return Err(EngineError::Cli(failure));
        }
        Ok(ModelResponse {
            text: text.unwrap_or_default(),
            finish_reason: Some("stop".into()),
            ..ModelResponse::default()
        })
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
        Box::pin(async move {
            // Dropping the run's future kills the child (`kill_on_drop`).
            tokio::select! {
                () = cancel.cancelled() => Err(EngineError::Cancelled),
                result = tokio::time::timeout(self.timeout, self.run(context, request, deltas)) => {
                    result.unwrap_or_else(|_| {
                        let failure = format!(
                            "`{}` timed out after {}s",
                            self.program.display(),
                            self.timeout.as_secs_f64()
                        );
                        tracing::warn!(target: "spool::engine", provider = "command", run = %context.run, error = %failure, "engine command failed");
                        Err(EngineError::Cli(failure))
                    })
                }
            }
        })
    }
}
