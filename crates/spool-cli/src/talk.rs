//! `spool run` and `spool chat`: a conversation with a run from the
//! terminal, in-process on the local journal or against a server's HTTP
//! channel (`--url`). Both ways the run is shown from the channel's stream
//! lines, so the terminal sees what any stream reader sees.
//!
//! Answers go to stdout; prompts, tool activity and notes to stderr, so
//! `spool run TEXT > answer.txt` keeps only the answer.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use clap::Args;
use serde_json::Value;
use spool_http::channel::NAMESPACE;
use spool_http::{Client, client::Lines};
use spool_journal::{Address, RunId, Seq, TurnId};
use spool_runtime::hub::{StreamItem, Subscription};
use spool_runtime::{Accepted, MessageRequest, Runtime, StartRequest};
use spool_wire::http::{
    Answer, Cancel, MessageRun, Respond, RunState, StreamEvent, StreamEventType,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::journal::Process;
use crate::serve::{load_agent, open_runtime, recover_interrupted, say};

/// Where the conversation happens.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// A server's URL (`http://HOST:PORT`, `https://HOST[:PORT]` behind
    /// a TLS proxy, trusting the web's roots and those in SSL_CERT_FILE,
    /// or `unix:/PATH`); without it the run happens in this process on
    /// the local journal.
    #[arg(long, env = "SPOOL_URL")]
    url: Option<String>,
    /// A bearer token for the server (see `spool token new`).
    #[arg(long, env = "SPOOL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The conversation's address: the same address continues the same
    /// run. A fresh one by default.
    #[arg(long)]
    address: Option<String>,
    /// The local journal (without `--url`): a directory (SQLite) or a
    /// postgres:// URL.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: crate::journal::JournalAt,
    /// The agent definition (without `--url`); `./spool.toml`, or the
    /// built-in echo agent.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Without `--url` only.
    #[arg(long, value_name = "SPEC", help = spool_engines::MODEL_HELP)]
    model: Option<spool_engines::Spec>,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// The message.
    text: String,
}

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    target: Target,
}

pub(crate) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::block_on(async move {
        let backend = Backend::open(&args.target).await?;
        let mut conversation = match (&backend, args.target.address) {
            // A new run here: made with its first turn in one append, so
            // the one-shot waits for one sync fewer.
            (Backend::Local { runtime, .. }, None) => {
                let (run, address) = start_local(runtime, args.text).await?;
                Conversation::following(backend, address, run).await?
            }
            (_, address) => {
                let mut conversation = Conversation::open(backend, address).await?;
                conversation.send(args.text);
                conversation
            }
        };
        let mut lines = stdin_lines();
        let outcome = conversation.until_boundary(&mut lines).await?;
        Ok(outcome.exit_code())
    })
}

/// Starts a run at a fresh address with `text` as its first turn; the
/// run and the address.
async fn start_local(runtime: &Runtime, text: String) -> anyhow::Result<(String, String)> {
    let address = fresh_address();
    let request = StartRequest {
        text,
        address: Some(Address::new(NAMESPACE, &address)),
        ..StartRequest::default()
    };
    match runtime.start(request).await? {
        Accepted::Started { run, .. } => Ok((run.to_string(), address)),
        // Its stream would begin with an older turn's answer.
        _ => Err(anyhow!(
            "the address {address} made for this run was in use already"
        )),
    }
}

pub(crate) fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::block_on(async move {
        let backend = Backend::open(&args.target).await?;
        let mut conversation = Conversation::open(backend, args.target.address).await?;
        let mut lines = stdin_lines();
        say("spool: type a message; /cancel, /clear, /new, /quit (or end of input) to leave");
        if conversation.pending.is_some() {
            conversation.show_pending();
            conversation.until_boundary(&mut lines).await?;
        }
        loop {
            prompt();
            let line = match conversation.typed.pop_front() {
                Some(line) => line,
                None => match lines.recv().await {
                    Some(line) => line,
                    None => return Ok(ExitCode::SUCCESS),
                },
            };
            match line.trim() {
                "" => {}
                "/quit" => return Ok(ExitCode::SUCCESS),
                "/cancel" => say("spool: nothing is running"),
                "/clear" => match conversation.backend.clear(&conversation.run).await {
                    Ok(()) => say("spool: context cleared; the run and its journal stay"),
                    Err(error) => say(&format!("spool: {error:#}")),
                },
                "/new" => {
                    let backend = conversation.backend.clone();
                    let typed = std::mem::take(&mut conversation.typed);
                    conversation = Conversation::open(backend, None).await?;
                    conversation.typed = typed;
                }
                command if command.starts_with('/') => say(&format!(
                    "spool: unknown command {command}; there are /cancel, /clear, /new and /quit"
                )),
                text => {
                    conversation.send(text.to_owned());
                    conversation.until_boundary(&mut lines).await?;
                }
            }
        }
    })
}

/// The terminal's lines, read on a thread of their own so a turn's events
/// and the person's typing are waited on together. The channel closes at
/// end of input.
pub(crate) fn stdin_lines() -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if sender.blocking_send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The runtime in this process (with its claim on the journal), or a
/// server.
#[derive(Clone)]
enum Backend {
    Local {
        runtime: Runtime,
        /// Kept for as long as the runtime drives the journal's runs.
        _owner: Arc<crate::journal::Claim>,
    },
    Remote(Client),
}

impl Backend {
    async fn open(target: &Target) -> anyhow::Result<Self> {
        if let Some(url) = &target.url {
            let mut client = Client::new(url)?;
            if let Some(token) = &target.token {
                client = client.with_token(token.clone());
            }
            return Ok(Self::Remote(client));
        }
        let agent = load_agent(target.agent.as_deref(), target.model.as_ref())?;
        let (runtime, owner) =
            open_runtime(&target.journal, &agent, None, Process::OneShot).await?;
        // The journal's promise: runs interrupted earlier finish now. Only
        // those: a one-shot process reads no other run's log (a server's
        // start settles idle runs' queued input, cancels and sleeps).
        let resumed = recover_interrupted(&runtime).await?;
        if resumed > 0 {
            say(&format!("spool: resumed {resumed} interrupted runs"));
        }
        Ok(Self::Local {
            runtime,
            _owner: Arc::new(owner),
        })
    }

    /// The address's run (made on first use) and its last position.
    async fn ensure(&self, address: &str) -> anyhow::Result<(String, Option<u64>)> {
        match self {
            Self::Local { runtime, .. } => {
                let view = runtime.ensure(&Address::new(NAMESPACE, address)).await?;
                Ok((view.run_id.to_string(), view.cursor.map(|s| s.0)))
            }
            Self::Remote(client) => {
                let reply = client.ensure(address).await?;
                Ok((reply.run_id, reply.cursor))
            }
        }
    }

    async fn events(&self, run: &str, cursor: Option<u64>) -> anyhow::Result<Events> {
        match self {
            Self::Local { runtime, .. } => {
                let run = RunId::new(run)?;
                let subscription = runtime.subscribe(&run, cursor.map(Seq)).await?;
                Ok(Events::Local {
                    run,
                    subscription,
                    last: cursor.map(Seq),
                    ready: std::collections::VecDeque::new(),
                })
            }
            Self::Remote(client) => Ok(Events::Remote(client.stream(run, cursor).await?)),
        }
    }

    /// A message. Over HTTP the call returns at the turn's boundary, so
    /// callers run it beside the stream.
    async fn send(self, run: String, text: String) -> anyhow::Result<()> {
        match self {
            Self::Local { runtime, .. } => {
                let message = MessageRequest {
                    text,
                    ..MessageRequest::default()
                };
                runtime.send(&RunId::new(run)?, message).await?;
            }
            Self::Remote(client) => {
                let message = MessageRun {
                    text,
                    ..MessageRun::default()
                };
                client.message(&run, &message).await?;
            }
        }
        Ok(())
    }

    async fn respond(
        self,
        run: String,
        turn: Option<String>,
        answer: Answer,
    ) -> anyhow::Result<()> {
        match self {
            Self::Local { runtime, .. } => {
                let turn = turn.map(TurnId::new).transpose()?;
                let answer = spool_journal::event::Answer {
                    text: answer.text,
                    approved: answer.approved,
                };
                runtime
                    .respond(&RunId::new(run)?, turn.as_ref(), vec![answer])
                    .await?;
            }
            Self::Remote(client) => {
                let answer = Answer {
                    turn_id: turn,
                    ..answer
                };
                let respond = Respond {
                    responses: vec![answer],
                };
                client.respond(&run, &respond).await?;
            }
        }
        Ok(())
    }

    async fn cancel(self, run: String) -> anyhow::Result<()> {
        match self {
            Self::Local { runtime, .. } => {
                runtime.cancel(&RunId::new(run)?, None).await?;
            }
            Self::Remote(client) => {
                client.cancel(&run, &Cancel::default()).await?;
            }
        }
        Ok(())
    }

    async fn clear(&self, run: &str) -> anyhow::Result<()> {
        match self {
            Self::Local { runtime, .. } => runtime.clear(&RunId::new(run)?).await?,
            Self::Remote(client) => client.clear(run).await?,
        }
        Ok(())
    }
}

/// A run's stream lines, from the hub in-process or from the server.
enum Events {
    Local {
        run: RunId,
        subscription: Subscription,
        last: Option<Seq>,
        /// Lines of an item not yet handed out (an event may be two).
        ready: std::collections::VecDeque<StreamEvent>,
    },
    Remote(Lines),
}

impl Events {
    async fn next(&mut self) -> anyhow::Result<Option<StreamEvent>> {
        match self {
            Self::Local {
                run,
                subscription,
                last,
                ready,
            } => loop {
                if let Some(line) = ready.pop_front() {
                    return Ok(Some(line));
                }
                // Cancel-safe as the subscription is: an item taken is
                // queued before anything else is awaited.
                let Some(item): Option<StreamItem> = subscription.next().await else {
                    return Ok(None);
                };
                ready.extend(spool_http::stream_lines(run, last, &item));
            },
            Self::Remote(lines) => Ok(lines.next().await?),
        }
    }
}

/// How many lines may wait for the next turn. Past it, input is not read
/// until the turn ends, so piping a large file in holds it back rather
/// than buffering it.
const TYPED_AHEAD: usize = 256;

/// A suspension waiting for the person at the terminal.
struct Pending {
    turn: Option<String>,
    approval: bool,
    prompt: String,
    options: Vec<String>,
}

/// How a turn ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Completed,
    Failed,
    Cancelled,
    Retired,
    /// Still waiting for an answer, and the input ended.
    Waiting,
}

impl Outcome {
    fn exit_code(&self) -> ExitCode {
        match self {
            Self::Completed => ExitCode::SUCCESS,
            Self::Waiting => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// One address's run, its open stream, and the calls in flight.
struct Conversation {
    backend: Backend,
    address: String,
    run: String,
    events: Events,
    pending: Option<Pending>,
    calls: JoinSet<anyhow::Result<()>>,
    /// Whether the current model call's text already arrived as deltas.
    streamed: bool,
    /// Whether stdout is in the middle of a streamed line.
    mid_line: bool,
    /// Whether the terminal's input is still open.
    input_open: bool,
    /// Messages typed while a turn ran, sent in order after it: a
    /// line-oriented chat takes turns, it does not steer.
    typed: VecDeque<String>,
    /// Whether the turn last sent has started (its `run_turn` was seen).
    turn_started: bool,
    /// A `/cancel` typed before that: sent once the turn starts, since a
    /// cancel that reached the run first would find nothing to cancel.
    cancel_wanted: bool,
}

impl Conversation {
    /// Ensures the address's run and opens its stream from the start. The
    /// history up to the run's cursor is read quietly, only to learn
    /// whether the run already waits for an answer.
    async fn open(backend: Backend, address: Option<String>) -> anyhow::Result<Self> {
        let address = address.unwrap_or_else(fresh_address);
        let (run, cursor) = backend.ensure(&address).await?;
        let mut conversation = Self::following(backend, address, run).await?;
        if let Some(cursor) = cursor {
            loop {
                let event =
                    conversation.events.next().await?.ok_or_else(|| {
                        anyhow!("the stream ended while reading the run's history")
                    })?;
                conversation.track(&event);
                if event.seq >= cursor {
                    break;
                }
            }
        }
        Ok(conversation)
    }

    /// The conversation of `run`, its stream open from the start.
    async fn following(backend: Backend, address: String, run: String) -> anyhow::Result<Self> {
        say(&format!("spool: run {run} (address {address})"));
        let events = backend.events(&run, None).await?;
        Ok(Self {
            backend,
            address,
            run,
            events,
            pending: None,
            calls: JoinSet::new(),
            streamed: false,
            mid_line: false,
            input_open: true,
            typed: VecDeque::new(),
            turn_started: false,
            cancel_wanted: false,
        })
    }

    fn send(&mut self, text: String) {
        self.streamed = false;
        self.turn_started = false;
        self.calls
            .spawn(self.backend.clone().send(self.run.clone(), text));
    }

    /// Follows the run until its turn reaches a boundary other than a
    /// suspension: suspensions are answered from the terminal, `/cancel`
    /// cancels, other lines wait for the next turn.
    async fn until_boundary(
        &mut self,
        lines: &mut mpsc::Receiver<String>,
    ) -> anyhow::Result<Outcome> {
        loop {
            tokio::select! {
                event = self.events.next() => {
                    let event = event?.ok_or_else(|| anyhow!("the server ended the stream (is it shutting down?)"))?;
                    if let Some(outcome) = self.show(&event).await? {
                        return Ok(outcome);
                    }
                }
                line = lines.recv(), if self.input_open && self.typed.len() < TYPED_AHEAD => match line {
                    Some(line) => self.input(line),
                    None => {
                        self.input_open = false;
                        if self.pending.is_some() {
                            return Ok(self.left_waiting());
                        }
                    }
                },
                Some(done) = self.calls.join_next(), if !self.calls.is_empty() => {
                    match done {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => {
                            say(&format!("spool: {error:#}"));
                            return Ok(Outcome::Failed);
                        }
                        Err(error) => return Err(anyhow!("a call to the run failed: {error}")),
                    }
                }
            }
        }
    }

    /// A line typed during a turn.
    fn input(&mut self, line: String) {
        let text = line.trim();
        if text == "/cancel" {
            if self.turn_started {
                self.cancel();
            } else {
                self.cancel_wanted = true;
            }
            return;
        }
        if text.starts_with('/') {
            // Other commands act between turns, never as an answer.
            self.typed.push_back(line);
        } else if let Some(pending) = self.pending.take() {
            let approved = pending.approval.then(|| {
                matches!(
                    text.to_ascii_lowercase().as_str(),
                    "y" | "yes" | "approve" | "ok"
                )
            });
            let answer = Answer {
                text: text.to_owned(),
                turn_id: None,
                approved,
            };
            self.calls.spawn(
                self.backend
                    .clone()
                    .respond(self.run.clone(), pending.turn, answer),
            );
        } else {
            self.typed.push_back(line);
        }
    }

    fn cancel(&mut self) {
        self.calls
            .spawn(self.backend.clone().cancel(self.run.clone()));
    }

    /// Keeps the waiting suspension current, and sends a `/cancel` typed
    /// before its turn started once it has.
    fn track(&mut self, event: &StreamEvent) {
        if event.kind == StreamEventType::RunTurn {
            self.turn_started = true;
            if std::mem::take(&mut self.cancel_wanted) {
                self.cancel();
            }
        }
        match &event.kind {
            StreamEventType::RunSuspend => {
                let data = event.data.as_ref();
                let field = |name: &str| data.and_then(|d| d.get(name));
                self.pending = Some(Pending {
                    turn: event.turn_id.clone(),
                    approval: field("kind").and_then(Value::as_str) == Some("approval"),
                    prompt: event.text.clone().unwrap_or_default(),
                    options: field("options")
                        .and_then(Value::as_array)
                        .map(|options| {
                            options
                                .iter()
                                .filter_map(|o| o.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
            StreamEventType::RunResume
            | StreamEventType::RunResponse
            | StreamEventType::RunTurn => self.pending = None,
            StreamEventType::RunState
                if event
                    .state
                    .as_ref()
                    .is_some_and(|s| *s != RunState::Waiting) =>
            {
                self.pending = None;
            }
            _ => {}
        }
    }

    /// Ends a line of streamed text, so what follows starts on its own.
    fn end_line(&mut self) {
        if self.mid_line {
            out("", true);
            self.mid_line = false;
        }
    }

    /// The input ended while the run waits for an answer.
    fn left_waiting(&self) -> Outcome {
        say(&format!(
            "spool: the run waits for an answer; continue with `spool chat --address {}`",
            self.address
        ));
        Outcome::Waiting
    }

    fn show_pending(&self) {
        if let Some(pending) = &self.pending {
            let mut line = format!("? {}", pending.prompt);
            if !pending.options.is_empty() {
                line.push_str(&format!(" [{}]", pending.options.join(" / ")));
            }
            if pending.approval {
                line.push_str(" (yes/no)");
            }
            say(&line);
        }
    }

    /// Shows one event; the outcome when it ends the turn.
    async fn show(&mut self, event: &StreamEvent) -> anyhow::Result<Option<Outcome>> {
        self.track(event);
        let text = event.text.as_deref().unwrap_or_default();
        let outcome = match &event.kind {
            StreamEventType::TextDelta => {
                self.streamed = true;
                self.mid_line = !text.ends_with('\n') && (self.mid_line || !text.is_empty());
                out(text, false);
                None
            }
            StreamEventType::ToolCallStart => {
                let name = event
                    .data
                    .as_ref()
                    .and_then(|d| d.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("a tool");
                self.end_line();
                self.streamed = false;
                say(&format!("spool: calling {name}"));
                None
            }
            StreamEventType::Lagged => {
                // The reader fell behind; resume after the last position.
                self.events = self.backend.events(&self.run, Some(event.seq)).await?;
                None
            }
            StreamEventType::RunSuspend => {
                self.end_line();
                self.streamed = false;
                self.show_pending();
                // Lines typed ahead (or piped in) answer questions in order.
                if let Some(line) = self.typed.pop_front() {
                    self.input(line);
                    None
                } else if self.input_open {
                    None
                } else {
                    Some(self.left_waiting())
                }
            }
            StreamEventType::RunResponse => {
                if self.streamed {
                    self.end_line();
                } else {
                    out(text, true);
                }
                Some(Outcome::Completed)
            }
            StreamEventType::RunState => match event.state {
                Some(RunState::Failed) => {
                    self.end_line();
                    // The stable code first: it is what a script branches on.
                    let code = event
                        .data
                        .as_ref()
                        .and_then(|data| data.get("code"))
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("unknown");
                    say(&format!("spool: the turn failed ({code}): {text}"));
                    Some(Outcome::Failed)
                }
                Some(RunState::Cancelled) => {
                    self.end_line();
                    say("spool: the turn was cancelled");
                    Some(Outcome::Cancelled)
                }
                Some(RunState::Retired) => {
                    self.end_line();
                    say("spool: the run is retired; /new starts another");
                    Some(Outcome::Retired)
                }
                _ => None,
            },
            _ => None,
        };
        Ok(outcome)
    }
}

/// An address no one has used: the time and this process.
fn fresh_address() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cli-{nanos:x}-{}", std::process::id())
}

#[allow(
    clippy::print_stdout,
    reason = "an answer or an event, for the person or a pipe"
)]
pub(crate) fn out(text: &str, end: bool) {
    let mut stdout = std::io::stdout().lock();
    let _ = if end {
        writeln!(stdout, "{text}")
    } else {
        write!(stdout, "{text}")
    };
    let _ = stdout.flush();
}

/// The chat prompt, for a person at a terminal only: piped input gets
/// none, so a script's stderr holds just the notes.
#[allow(clippy::print_stderr, reason = "the chat prompt, beside the answers")]
fn prompt() {
    if std::io::stdin().is_terminal() {
        eprint!("> ");
    }
}
