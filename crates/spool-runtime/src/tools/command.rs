//! Command tools: a tool run as a child process, so operators add tools
//! without Rust. The input goes to the program as JSON on stdin; its stdout
//! must be one JSON value (empty means `null`). A non-zero exit, a timeout,
//! or output that is not JSON is a failure whose message carries the tail of
//! stderr. Output is capped, and the process is killed when the call times
//! out or the turn is cancelled.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use spool_journal::event::Effect;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::agent::CommandToolDefinition;
use crate::engine::ToolSpec;
use crate::tool::{Tool, ToolOutcome};

/// The most stdout a call may print.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// How much of stderr a failure keeps.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// A command tool.
#[derive(Clone, Debug)]
pub struct CommandTool {
    definition: CommandToolDefinition,
    program: std::path::PathBuf,
}

impl CommandTool {
    /// A tool from its definition; a relative program path with a `/` is
    /// taken from `base`.
    #[must_use]
    pub fn new(definition: CommandToolDefinition, base: &Path) -> Self {
        let first = Path::new(&definition.command[0]);
        let program = if first.is_relative() && definition.command[0].contains('/') {
            base.join(first)
        } else {
            first.to_owned()
        };
        Self {
            definition,
            program,
        }
    }

    async fn run(&self, input: Value, cancel: &CancellationToken) -> Result<Value, String> {
        let mut child = tokio::process::Command::new(&self.program)
            .args(&self.definition.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start `{}`: {e}", self.program.display()))?;
        let mut stdin = child.stdin.take().ok_or("the child has no stdin")?;
        let mut stdout = child.stdout.take().ok_or("the child has no stdout")?;
        let mut stderr = child.stderr.take().ok_or("the child has no stderr")?;
        let input = serde_json::to_vec(&input).map_err(|e| e.to_string())?;
        let work = async {
            // A program that exits without reading its input is its own
            // business; a broken pipe here is not the tool's failure.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
            // Both pipes are read to the end (a child blocked on a full pipe
            // would look like a timeout); only bounded amounts are kept.
            let (out, err) = tokio::join!(
                read_capped(&mut stdout, MAX_OUTPUT_BYTES),
                read_tail(&mut stderr, STDERR_TAIL_BYTES)
            );
            let (out, err) = (
                out.map_err(|e| e.to_string())?,
                err.map_err(|e| e.to_string())?,
            );
            let status = child.wait().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status, out, err))
        };
        let timeout = Duration::from_secs_f64(self.definition.timeout_seconds);
        let (status, out, err) = tokio::select! {
            result = tokio::time::timeout(timeout, work) => match result {
                Ok(result) => result?,
                Err(_) => return Err(format!("timed out after {}s", self.definition.timeout_seconds)),
            },
            () = cancel.cancelled() => return Err("cancelled".into()),
        };
        let Some(out) = out else {
            return Err(format!("printed more than {MAX_OUTPUT_BYTES} bytes"));
        };
        let tail = tail(&err);
        if !status.success() {
            let code = status
                .code()
                .map_or_else(|| "a signal".to_owned(), |c| c.to_string());
            return Err(format!(
                "exited with {code}{}",
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(": {tail}")
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

/// Reads to the end, keeping at most `cap` bytes; `None` when there were
/// more (the rest is read and dropped, so the writer never blocks).
async fn read_capped(
    reader: &mut (impl AsyncReadExt + Unpin),
    cap: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut kept = Vec::new();
    let mut over = false;
    let mut chunk = [0u8; 8192];
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Ok((!over).then_some(kept));
        }
        if kept.len() + n > cap {
            over = true;
            kept.clear();
        } else if !over {
            kept.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Reads to the end, keeping only the last `keep` bytes: a child's stderr
/// is drained whole (a full pipe would block it) but only its tail kept.
///
/// # Errors
///
/// When reading fails.
pub async fn read_tail(
    reader: &mut (impl AsyncReadExt + Unpin),
    keep: usize,
) -> std::io::Result<Vec<u8>> {
    let mut tail = std::collections::VecDeque::with_capacity(keep);
    let mut chunk = [0u8; 8192];
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Ok(tail.into_iter().collect());
        }
        for &byte in &chunk[..n] {
            if tail.len() == keep {
                tail.pop_front();
            }
            tail.push_back(byte);
        }
    }
}

/// The last [`STDERR_TAIL_BYTES`] of `bytes` as trimmed text, cut on a
/// character boundary.
#[must_use]
pub fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let start = text.len().saturating_sub(STDERR_TAIL_BYTES);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
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
