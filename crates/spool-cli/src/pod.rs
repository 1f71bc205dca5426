//! `spool pod serve NAME`, `spool pod attach NAME` and `spool pod list`:
//! the Pod protocol (seed 003) on a Unix socket in the pod's runtime
//! directory, a terminal client for it, and the pods found there. `spool serve --pod NAME` serves pods beside the HTTP
//! channel through [`serve_pods`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use spool_runtime::Runtime;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::journal::Process;
use crate::serve::{Signals, load_agent, open_runtime, recover, say};

#[derive(Debug, Subcommand)]
pub(crate) enum PodCommand {
    /// Serve one pod on its Unix socket, on the local journal.
    Serve(PodServeArgs),
    /// A terminal client: prints the pod's events as they come and sends
    /// what is typed (`run`, or the answer while the pod is paused; and
    /// /cancel, /status, /history, /resume, /approve, /reject, /quit).
    Attach {
        /// The pod's name.
        name: String,
        /// The root of the pods' runtime directories
        /// (default: $XDG_RUNTIME_DIR/spool/pods).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
    /// The pods in the runtime directory, with their state.
    List {
        /// The root of the pods' runtime directories
        /// (default: $XDG_RUNTIME_DIR/spool/pods).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct PodServeArgs {
    /// The pod's name: its session is the run at the address pod/NAME.
    name: String,
    /// The journal: a directory (SQLite) or a postgres:// URL.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: crate::journal::JournalAt,
    /// The agent definition; `./spool.toml`, or the built-in echo agent.
    #[arg(long)]
    agent: Option<PathBuf>,
    #[arg(long, value_name = "SPEC", help = spool_engines::MODEL_HELP)]
    model: Option<spool_engines::Spec>,
    /// The root of the pods' runtime directories
    /// (default: $XDG_RUNTIME_DIR/spool/pods).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
}

pub(crate) fn run(command: PodCommand) -> anyhow::Result<ExitCode> {
    match command {
        PodCommand::List { runtime_dir } => {
            let root = runtime_dir.unwrap_or_else(spool_pod::dir::default_root);
            let found = spool_pod::dir::list(&root);
            if found.is_empty() {
                say(&format!("spool: no pods in {}", root.display()));
            }
            let mut out = std::io::stdout().lock();
            for pod in found {
                let state = pod.status.as_ref().map_or("unknown", |s| s.state.as_str());
                let session = pod.status.as_ref().map_or("-", |s| s.session_id.as_str());
                let live = if pod.live { "served" } else { "not served" };
                writeln!(out, "{}\t{state}\t{live}\t{session}", pod.name)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        PodCommand::Attach { name, runtime_dir } => {
            let root = runtime_dir.unwrap_or_else(spool_pod::dir::default_root);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(attach(&root, &name))
        }
        PodCommand::Serve(args) => crate::telemetry::block_on(serve(args)),
    }
}

async fn serve(args: PodServeArgs) -> anyhow::Result<ExitCode> {
    let agent = load_agent(args.agent.as_deref(), args.model.as_ref())?;
    let (runtime, _owner) = open_runtime(&args.journal, &agent, None, Process::Serving).await?;
    recover(&runtime).await?;
    let (stop, closing) = watch::channel(false);
    // Before the pod says it listens: a stop sent at once is graceful.
    let signals = Signals::install();
    let pods = serve_pods(
        &runtime,
        &[args.name],
        args.runtime_dir.as_deref(),
        &closing,
    )
    .await?;
    signals.received().await;
    say("spool: shutting down; the pod's session stays durable in the journal");
    stop.send_replace(true);
    pods.close();
    pods.wait().await;
    Ok(ExitCode::SUCCESS)
}

/// Serves each pod of `names` in its runtime directory under `root` (the
/// default when `None`) until `closing` turns true. Every directory is set
/// up before any pod is served, so a name already served elsewhere stops
/// the start with nothing half-started.
///
/// # Errors
///
/// A bad or repeated name, a pod already served, a socket that cannot be
/// bound.
pub(crate) async fn serve_pods(
    runtime: &Runtime,
    names: &[String],
    root: Option<&Path>,
    closing: &watch::Receiver<bool>,
) -> anyhow::Result<TaskTracker> {
    let root = root.map_or_else(spool_pod::dir::default_root, Path::to_owned);
    let mut dirs = Vec::new();
    for (at, name) in names.iter().enumerate() {
        anyhow::ensure!(
            spool_pod::valid_name(name),
            "`{name}` is not a pod name: 1 to 64 of letters, digits, `-`, `_` and `.`"
        );
        anyhow::ensure!(!names[..at].contains(name), "pod `{name}` is named twice");
        dirs.push(spool_pod::dir::PodDir::create(&root, name)?);
    }
    // Bound before the server says it listens: a client that reads that
    // line finds every pod's socket there.
    let mut bound = Vec::new();
    for (name, dir) in names.iter().zip(dirs) {
        let listener = dir.bind()?;
        let pod = spool_pod::Pod::open(runtime.clone(), name).await?;
        say(&format!(
            "spool: pod {name} on {} (session {})",
            dir.socket().display(),
            pod.session()
        ));
        bound.push((pod, dir, listener));
    }
    let tasks = TaskTracker::new();
    for (pod, dir, listener) in bound {
        let mut closing = closing.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = closing.wait_for(|closing| *closing).await;
            };
            spool_pod::daemon::serve_in(pod.clone(), &dir, listener, shutdown).await;
            pod.close().await;
            drop(dir);
        });
    }
    Ok(tasks)
}

/// `spool pod attach`: the pod's events to stdout, typed lines to the pod.
async fn attach(root: &Path, name: &str) -> anyhow::Result<ExitCode> {
    use spool_wire::pod::{Event, Method, PodState, ResumeAnswer};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    let socket = root.join(name).join("sock");
    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .with_context(|| {
            format!(
                "connecting to pod {name} at {} (is it served? `spool pod list` shows the pods)",
                socket.display()
            )
        })?;
    let (reader, mut writer) = stream.into_split();
    let mut events = tokio::io::BufReader::new(reader).lines();
    let mut typed = crate::talk::stdin_lines();
    let mut view = Terminal::default();
    let mut state = PodState::Idle;
    loop {
        tokio::select! {
            line = events.next_line() => {
                let Some(line) = line.context("reading from the pod")? else {
                    view.note("the pod closed the connection");
                    return Ok(ExitCode::from(1));
                };
                match Event::decode(&line) {
                    Ok(event) => {
                        if let Event::Status(status) = &event {
                            state = status.state.clone();
                        }
                        view.show(&event);
                    }
                    Err(rejection) => view.note(&format!("an event that does not decode: {}", rejection.message)),
                }
            }
            line = typed.recv() => {
                let Some(line) = line else {
                    // Input ended: leave the pod to its turn.
                    return Ok(ExitCode::SUCCESS);
                };
                let line = line.trim();
                let method = match line {
                    "" => continue,
                    "/quit" => return Ok(ExitCode::SUCCESS),
                    "/cancel" => Method::Cancel,
                    "/status" => Method::GetStatus,
                    "/history" => Method::GetHistory,
                    "/resume" => Method::Resume { answer: None },
                    "/approve" | "/reject" => Method::Resume {
                        answer: Some(ResumeAnswer {
                            text: String::new(),
                            approved: Some(line == "/approve"),
                        }),
                    },
                    command if command.starts_with('/') => {
                        view.note("commands: /cancel /status /history /resume /approve /reject /quit");
                        continue;
                    }
                    // While the pod waits, what is typed is the answer.
                    text if state == PodState::Paused => Method::Resume {
                        answer: Some(ResumeAnswer {
                            text: text.to_owned(),
                            approved: None,
                        }),
                    },
                    text => Method::Run {
                        input: text.to_owned(),
                    },
                };
                writer
                    .write_all(method.encode_line().as_bytes())
                    .await
                    .context("writing to the pod")?;
            }
        }
    }
}

/// How events are shown: text streamed as it comes, everything else one
/// line each, summarized.
#[derive(Debug, Default)]
struct Terminal {
    /// Whether the cursor is in the middle of streamed text.
    streaming: bool,
}

/// At most this many characters of a tool's input or output are shown.
const SUMMARY: usize = 200;

fn summary(text: &str) -> String {
    let flat = text.replace('\n', " ");
    match flat.char_indices().nth(SUMMARY) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

impl Terminal {
    fn show(&mut self, event: &spool_wire::pod::Event) {
        use spool_wire::pod::Event;
        match event {
            Event::TextDelta(delta) => {
                self.streaming = true;
                crate::talk::out(&delta.text, false);
            }
            // The deltas already showed the text; a block that came whole
            // (nothing streamed) is shown now.
            Event::TextDone(done) => {
                if self.streaming {
                    self.end_stream();
                } else {
                    crate::talk::out(&done.text, true);
                }
            }
            Event::ThinkingDelta(_) | Event::ToolCallStart(_) | Event::ToolCallArgsDelta(_) => {}
            Event::ThinkingDone(thinking) => {
                self.line(&format!("(thinking) {}", summary(&thinking.text)))
            }
            Event::ToolCallDone(call) => {
                self.line(&format!("→ {} {}", call.name, summary(&call.arguments)));
            }
            Event::ToolResult(result) => {
                let mark = if result.is_error { "✗" } else { "←" };
                self.line(&format!("{mark} {}", summary(&result.output)));
            }
            Event::Status(status) => self.line(&format!("[{}]", status.state.as_str())),
            Event::TurnStart(start) => self.line(&format!("[turn {}]", start.turn)),
            Event::TurnEnd(end) => {
                self.line(&format!("[turn {} {}]", end.turn, end.result.as_str()))
            }
            Event::Usage(usage) => self.line(&format!(
                "[{} tokens in, {} out]",
                usage.input_tokens, usage.output_tokens
            )),
            Event::Error(error) => {
                self.line(&format!("error {}: {}", error.code.as_str(), error.message))
            }
            Event::History(history) => {
                self.line(&format!("[history: {} items]", history.items.len()));
                for item in &history.items {
                    let shown = serde_json::to_string(item).unwrap_or_default();
                    self.line(&format!("  {}", summary(&shown)));
                }
            }
            other => self.line(&format!("[{}]", other.name())),
        }
    }

    fn end_stream(&mut self) {
        if self.streaming {
            crate::talk::out("", true);
            self.streaming = false;
        }
    }

    fn line(&mut self, text: &str) {
        self.end_stream();
        crate::talk::out(text, true);
    }

    fn note(&mut self, text: &str) {
        self.end_stream();
        say(&format!("spool: {text}"));
    }
}
