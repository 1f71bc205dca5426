//! `spool a2a card URL` prints an A2A agent's card; `spool a2a send URL
//! TEXT` sends it a message and prints the task it answers (its state,
//! then its answer or its question). For operators checking a peer before
//! naming it in `[[a2a.peers]]`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use spool_wire::a2a::{Message, Part, Role, SendMessageRequest, TaskState};

#[derive(Debug, Subcommand)]
pub(crate) enum A2aCommand {
    /// Fetch and print the agent card at URL/.well-known/agent-card.json.
    Card {
        /// The agent's base URL.
        url: String,
        #[command(flatten)]
        auth: Auth,
    },
    /// Send TEXT to the agent at URL and print the task it answers once
    /// it rests (completed, failed, or asking for input). Exits 1 unless
    /// the task completed or asks for input.
    Send {
        /// The agent's base URL.
        url: String,
        /// The message.
        text: String,
        /// Answer this task (one that asked for input).
        #[arg(long)]
        task_id: Option<String>,
        /// Continue this conversation.
        #[arg(long)]
        context_id: Option<String>,
        /// How long to wait for the task to rest, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_seconds: u64,
        #[command(flatten)]
        auth: Auth,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct Auth {
    /// A file whose contents are sent as `Authorization: Bearer …`.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl Auth {
    fn token(&self) -> anyhow::Result<Option<String>> {
        self.token_file
            .as_ref()
            .map(|file| {
                std::fs::read_to_string(file)
                    .map(|t| t.trim().to_owned())
                    .with_context(|| format!("reading {}", file.display()))
            })
            .transpose()
    }
}

const CARD_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn run(command: A2aCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut out = std::io::stdout().lock();
        match command {
            A2aCommand::Card { url, auth } => {
                let card =
                    spool_a2a::client::card(&url, auth.token()?.as_deref(), CARD_TIMEOUT).await?;
                writeln!(out, "{}", serde_json::to_string_pretty(&card)?)?;
                Ok(ExitCode::SUCCESS)
            }
            A2aCommand::Send {
                url,
                text,
                task_id,
                context_id,
                timeout_seconds,
                auth,
            } => {
                let token = auth.token()?;
                let card = spool_a2a::client::card(&url, token.as_deref(), CARD_TIMEOUT).await?;
                // A fresh id each time: an operator resending means it.
                let message_id = format!(
                    "spool-cli-{}",
                    spool_runtime::IdSource::run_id(&spool_runtime::UniqueIds)
                );
                let request = SendMessageRequest {
                    tenant: None,
                    message: Message {
                        message_id,
                        context_id,
                        task_id,
                        role: Role::User,
                        parts: vec![Part::text(text)],
                        metadata: None,
                        extensions: Vec::new(),
                        reference_task_ids: Vec::new(),
                    },
                    configuration: None,
                    metadata: None,
                };
                let task = spool_a2a::client::send(
                    &card,
                    token.as_deref(),
                    &request,
                    Duration::from_secs(timeout_seconds),
                )
                .await?;
                writeln!(out, "task     {}", task.id)?;
                writeln!(out, "context  {}", task.context_id)?;
                writeln!(out, "state    {}", task.status.state.legacy())?;
                if let Some(message) = &task.status.message {
                    writeln!(out, "said     {}", message.text())?;
                }
                for artifact in task.artifacts.iter().flatten() {
                    for part in &artifact.parts {
                        if let Some(text) = &part.text {
                            writeln!(out, "{text}")?;
                        }
                    }
                }
                Ok(match task.status.state {
                    TaskState::Completed | TaskState::InputRequired => ExitCode::SUCCESS,
                    _ => ExitCode::FAILURE,
                })
            }
        }
    })
}
