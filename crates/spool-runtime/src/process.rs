//! One child-process runner for everything Spool runs as a program: command
//! tools (`[[tool]]`) and the command engine (`command:<argv>`). One policy:
//!
//! - **stdin**: the input is written whole, then closed; a program that
//!   exits without reading it is its own business (a broken pipe is not its
//!   failure).
//! - **stdout**: handed to the caller chunk by chunk as it arrives, at most
//!   [`MAX_OUTPUT_BYTES`] in all; past that, or when the caller refuses a
//!   chunk, the child is killed and the call fails.
//! - **stderr**: drained beside stdout in a task of its own (a child
//!   blocked on a full pipe would look like a timeout); its last
//!   [`STDERR_TAIL_BYTES`] are kept, waited for at most [`STDERR_GRACE`]
//!   after the child exits (a process it left behind may hold the pipe
//!   open). What the caller does with the tail is its own policy: a tool
//!   shows it to the model, an engine only logs it.
//! - **time**: one limit for the whole call; past it, or when the call is
//!   cancelled, the child is killed (`kill_on_drop`) and the call fails.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The most stdout one call may print.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// How much of stderr is kept.
pub const STDERR_TAIL_BYTES: usize = 2048;
/// How long stderr may stay open after the child exits.
pub const STDERR_GRACE: Duration = Duration::from_secs(1);

/// A program to run: `argv[0]` and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The program, resolved.
    pub path: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Program {
    /// `argv` with its program resolved: a relative path with a `/` is
    /// taken from `base` (a definition file's directory), a bare name is
    /// looked up on `PATH` when run. `None` for an empty `argv`.
    #[must_use]
    pub fn new(argv: &[String], base: &Path) -> Option<Self> {
        let (first, args) = argv.split_first()?;
        let path = if Path::new(first).is_relative() && first.contains('/') {
            base.join(first)
        } else {
            PathBuf::from(first)
        };
        Some(Self {
            path,
            args: args.to_vec(),
        })
    }
}

/// How a run ended, when the child ran to its exit.
#[derive(Debug)]
pub struct Exit {
    /// Its exit status.
    pub status: ExitStatus,
    /// The end of what it wrote to stderr, trimmed.
    pub stderr_tail: String,
}

impl Exit {
    /// `0`, another code, or `a signal`: how it exited, in words.
    #[must_use]
    pub fn code(&self) -> String {
        self.status
            .code()
            .map_or_else(|| "a signal".to_owned(), |c| c.to_string())
    }
}

/// Why a run did not reach the child's exit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The program could not be started.
    #[error("could not start `{program}`: {source}")]
    Start {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// Its pipes could not be read.
    #[error("`{program}`: {source}")]
    Io {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// It printed more than [`MAX_OUTPUT_BYTES`].
    #[error("`{0}` printed more than {MAX_OUTPUT_BYTES} bytes")]
    TooMuchOutput(String),
    /// The caller refused what it printed.
    #[error("`{program}` {reason}")]
    Refused {
        /// The program.
        program: String,
        /// What the caller said.
        reason: String,
    },
    /// It ran past its time limit.
    #[error("`{program}` timed out after {}s", .limit.as_secs_f64())]
    TimedOut {
        /// The program.
        program: String,
        /// The limit.
        limit: Duration,
    },
    /// The call was cancelled.
    #[error("`{0}` was cancelled")]
    Cancelled(String),
}

/// Runs `program` with `input` on stdin, handing its stdout to `on_output`
/// as it arrives (an `Err` from it kills the child and fails the run),
/// under `limit` and `cancel`, by the policy above.
///
/// # Errors
///
/// [`RunError`] for a child that did not run to its exit; an exit with a
/// failing status is an [`Exit`], for the caller to judge.
pub async fn run(
    program: &Program,
    input: &[u8],
    limit: Duration,
    cancel: &CancellationToken,
    on_output: &mut (dyn FnMut(&[u8]) -> Result<(), String> + Send),
) -> Result<Exit, RunError> {
    let shown = program.path.display().to_string();
    let work = run_to_exit(program, &shown, input, on_output);
    tokio::select! {
        result = tokio::time::timeout(limit, work) => result.unwrap_or_else(|_| {
            Err(RunError::TimedOut { program: shown.clone(), limit })
        }),
        // Dropping the work drops the child, which kills it.
        () = cancel.cancelled() => Err(RunError::Cancelled(shown.clone())),
    }
}

async fn run_to_exit(
    program: &Program,
    shown: &str,
    input: &[u8],
    on_output: &mut (dyn FnMut(&[u8]) -> Result<(), String> + Send),
) -> Result<Exit, RunError> {
    let io = |source| RunError::Io {
        program: shown.to_owned(),
        source,
    };
    let mut child = tokio::process::Command::new(&program.path)
        .args(&program.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| RunError::Start {
            program: shown.to_owned(),
            source,
        })?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(io(std::io::Error::other("the child has no pipes")));
    };
    let errors = tokio::spawn(async move { read_tail(&mut stderr, STDERR_TAIL_BYTES).await });
    // Fed from a task of its own: a child that prints without reading its
    // input must not leave the feed blocked while its output is refused.
    let input = input.to_vec();
    let feed = tokio::spawn(async move {
        let _ = stdin.write_all(&input).await;
        // Closed here, so a program reading to the end sees it.
        drop(stdin);
    });
    let read = async {
        let mut total = 0;
        let mut chunk = [0u8; 8192];
        loop {
            let n = stdout.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                return Ok(());
            }
            total += n;
            if total > MAX_OUTPUT_BYTES {
                return Err(RunError::TooMuchOutput(shown.to_owned()));
            }
            on_output(&chunk[..n]).map_err(|reason| RunError::Refused {
                program: shown.to_owned(),
                reason,
            })?;
        }
    };
    let read = read.await;
    drop(stdout);
    if let Err(error) = read {
        // Its output was refused: it need not finish printing more.
        let _ = child.start_kill();
        let _ = child.wait().await;
        feed.abort();
        errors.abort();
        return Err(error);
    }
    let status = child.wait().await.map_err(io)?;
    let mut errors = errors;
    let stderr_tail = match tokio::time::timeout(STDERR_GRACE, &mut errors).await {
        Ok(Ok(Ok(bytes))) => tail(&bytes),
        _ => {
            errors.abort();
            String::new()
        }
    };
    Ok(Exit {
        status,
        stderr_tail,
    })
}

/// Reads to the end, keeping only the last `keep` bytes: a child's stderr
/// is drained whole (a full pipe would block it) but only its tail kept.
async fn read_tail(
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
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let start = text.len().saturating_sub(STDERR_TAIL_BYTES);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Program {
        Program::new(
            &["sh".to_owned(), "-c".to_owned(), script.to_owned()],
            Path::new("."),
        )
        .unwrap()
    }

    const LIMIT: Duration = Duration::from_secs(20);

    async fn run_sh(script: &str, cancel: &CancellationToken) -> (Result<Exit, RunError>, Vec<u8>) {
        let mut out = Vec::new();
        let result = run(&sh(script), b"input", LIMIT, cancel, &mut |chunk| {
            out.extend_from_slice(chunk);
            Ok(())
        })
        .await;
        (result, out)
    }

    #[tokio::test]
    async fn the_input_arrives_on_stdin_and_stdout_and_the_stderr_tail_come_back() {
        let (exit, out) = run_sh("cat; echo oops >&2; exit 3", &CancellationToken::new()).await;
        let exit = exit.unwrap();
        assert_eq!(out, b"input");
        assert_eq!(exit.code(), "3");
        assert_eq!(exit.stderr_tail, "oops");
    }

    #[tokio::test]
    async fn a_process_left_holding_stderr_does_not_hold_the_call_past_its_exit() {
        // The background sleep keeps stderr open for far longer than the
        // limit: the call must end with the child, not with the pipe.
        let (exit, out) = run_sh("sleep 600 >&2 & echo $!", &CancellationToken::new()).await;
        let pid = String::from_utf8(out).unwrap();
        // The sleep is not the child's to outlive the test.
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
        assert!(exit.unwrap().status.success());
        assert!(pid.trim().parse::<u32>().is_ok(), "{pid}");
    }

    #[tokio::test]
    async fn output_past_the_cap_kills_the_child() {
        let (result, _) = run_sh("yes", &CancellationToken::new()).await;
        assert!(
            matches!(result, Err(RunError::TooMuchOutput(_))),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_chunk_kills_the_child_and_fails_the_run() {
        let result = run(
            &sh("yes"),
            b"",
            LIMIT,
            &CancellationToken::new(),
            &mut |_| Err("printed output that is not UTF-8".into()),
        )
        .await;
        assert!(
            matches!(&result, Err(RunError::Refused { reason, .. }) if reason.contains("UTF-8")),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_cancelled_call_ends_as_cancelled() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let (result, _) = run_sh("sleep 600", &cancel).await;
        assert!(matches!(result, Err(RunError::Cancelled(_))), "{result:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_limit_times_out() {
        let result = run(
            &sh("sleep 600"),
            b"",
            Duration::from_secs(1),
            &CancellationToken::new(),
            &mut |_| Ok(()),
        )
        .await;
        assert!(
            matches!(result, Err(RunError::TimedOut { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn an_empty_command_is_no_program() {
        assert!(Program::new(&[], Path::new(".")).is_none());
        let relative = Program::new(&["./bin/tool".to_owned()], Path::new("/agents")).unwrap();
        assert_eq!(relative.path, Path::new("/agents/./bin/tool"));
        let bare = Program::new(&["jq".to_owned(), ".".to_owned()], Path::new("/agents")).unwrap();
        assert_eq!(
            (bare.path.as_path(), bare.args.as_slice()),
            (Path::new("jq"), &[".".to_owned()][..])
        );
    }
}
