//! The `a2a_send {peer, text, task_id?}` tool: the agent sends a message
//! to an A2A agent named in `[[a2a.peers]]` and gets the task it answers.
//!
//! A tool of its own rather than `delegate` learning `a2a:` targets: the
//! bus's `delegate` answers text or a bus error code, while an A2A peer
//! answers a task that may ask for input, which the model must see (its
//! id and its question) to answer with a second call.
//!
//! The message's `messageId` is made from the call's run, turn and call
//! id, the same on every execution of the call: a crash between sending
//! and recording the answer sends the same message again, and a peer that
//! keeps message ids (as Spool does) answers with the same task instead
//! of doing the work twice. So the tool is `idempotent`, as `delegate` is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_runtime::engine::ToolSpec;
use spool_runtime::{BoxFuture, Tool, ToolContext, ToolOutcome};
use spool_wire::a2a::{AgentCard, Message, Part, Role, SendMessageRequest, Task, TaskState};
use tokio_util::sync::CancellationToken;

use crate::client::{self, ClientError};
use crate::config::PeerSection;

/// The tool's name.
pub const NAME: &str = "a2a_send";

/// How long fetching a peer's card may take.
const CARD_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
struct Peer {
    name: String,
    url: String,
    token_file: Option<PathBuf>,
    timeout: Duration,
}

/// `a2a_send`, for the peers `[[a2a.peers]]` names.
#[derive(Debug)]
pub struct A2aSend {
    peers: Vec<Peer>,
    /// Each peer's card, fetched at its first use and again after a send
    /// to it fails to reach it (it may have moved).
    cards: Mutex<HashMap<String, AgentCard>>,
}

impl A2aSend {
    /// The tool for `peers`, their token files relative to `base`.
    #[must_use]
    pub fn new(peers: &[PeerSection], base: &Path) -> Self {
        Self {
            peers: peers
                .iter()
                .map(|peer| Peer {
                    name: peer.name.clone(),
                    url: peer.url.clone(),
                    token_file: peer.token_file.as_ref().map(|file| base.join(file)),
                    timeout: Duration::from_secs(peer.timeout_seconds),
                })
                .collect(),
            cards: Mutex::default(),
        }
    }

    async fn card(&self, peer: &Peer, token: Option<&str>) -> Result<AgentCard, ClientError> {
        let cached = self
            .cards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer.name)
            .cloned();
        if let Some(card) = cached {
            return Ok(card);
        }
        let card = client::card(&peer.url, token, CARD_TIMEOUT).await?;
        self.cards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer.name.clone(), card.clone());
        Ok(card)
    }

    fn forget(&self, peer: &Peer) {
        self.cards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&peer.name);
    }
}

/// The message id of a call: the same for every execution of it
/// ([`ToolContext::stable_id`]).
#[must_use]
pub fn message_id(context: &ToolContext) -> String {
    context.stable_id("spool")
}

/// The task as the model reads it: its ids and state, and its answer or
/// its question.
fn output(peer: &str, task: &Task) -> Value {
    let text = spool_wire::a2a::text_of;
    let answer: String = task
        .artifacts
        .iter()
        .flatten()
        .map(|artifact| text(&artifact.parts))
        .collect::<Vec<_>>()
        .join("\n");
    let said = task.status.message.as_ref().map(|m| text(&m.parts));
    let mut out = json!({
        "peer": peer,
        "task_id": task.id,
        "context_id": task.context_id,
        "state": task.status.state.legacy(),
    });
    if !answer.is_empty() {
        out["answer"] = answer.into();
    }
    if let Some(said) = said {
        let key = if task.status.state == TaskState::InputRequired {
            "question"
        } else {
            "status"
        };
        out[key] = said.into();
    }
    if task.status.state == TaskState::InputRequired {
        out["note"] = "answer with a2a_send again, passing this task_id".into();
    }
    out
}

impl Tool for A2aSend {
    fn spec(&self) -> ToolSpec {
        let names: Vec<&str> = self.peers.iter().map(|p| p.name.as_str()).collect();
        ToolSpec {
            name: NAME.into(),
            description: format!(
                "Send a message to another agent over A2A and wait for its task's answer (or its question). Peers: {}.",
                names.join(", ")
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "peer": {"type": "string", "enum": names, "description": "The agent to send to."},
                    "text": {"type": "string", "minLength": 1, "description": "The message."},
                    "task_id": {"type": "string", "description": "A task that asked for input: this message answers it."}
                },
                "required": ["peer", "text"],
                "additionalProperties": false
            }),
        }
    }

    fn effect(&self) -> Effect {
        // The same call sends the same message id: a peer that keeps them
        // answers the same task.
        Effect::Idempotent
    }

    fn call<'a>(
        &'a self,
        _input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async {
            ToolOutcome::Error(
                "`a2a_send` runs inside a run: its message id is made from the call's".into(),
            )
        })
    }

    fn call_in<'a>(
        &'a self,
        context: &'a ToolContext,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let name = input["peer"].as_str().unwrap_or_default();
            let Some(peer) = self.peers.iter().find(|p| p.name == name) else {
                return ToolOutcome::Error(format!("no A2A peer is named `{name}`"));
            };
            let token = match &peer.token_file {
                Some(file) => match std::fs::read_to_string(file) {
                    Ok(token) => Some(token.trim().to_owned()),
                    Err(e) => {
                        return ToolOutcome::Error(format!(
                            "a2a peer `{name}`: reading {}: {e}",
                            file.display()
                        ));
                    }
                },
                None => None,
            };
            let request = SendMessageRequest {
                tenant: None,
                message: Message {
                    message_id: message_id(context),
                    context_id: None,
                    task_id: input["task_id"].as_str().map(str::to_owned),
                    role: Role::User,
                    parts: vec![Part::text(input["text"].as_str().unwrap_or_default())],
                    metadata: None,
                    extensions: Vec::new(),
                    reference_task_ids: Vec::new(),
                },
                configuration: None,
                metadata: None,
            };
            let sent = async {
                let card = self.card(peer, token.as_deref()).await?;
                client::send(&card, token.as_deref(), &request, peer.timeout).await
            };
            let task = tokio::select! {
                task = sent => task,
                () = cancel.cancelled() => {
                    return ToolOutcome::Error(format!(
                        "the message to a2a peer `{name}` was cancelled with its turn"
                    ));
                }
            };
            match task {
                Ok(task)
                    if matches!(task.status.state, TaskState::Failed | TaskState::Rejected) =>
                {
                    ToolOutcome::Error(format!(
                        "a2a peer `{name}`'s task {} {}: {}",
                        task.id,
                        task.status.state.legacy(),
                        output(name, &task)
                    ))
                }
                Ok(task) => ToolOutcome::Output(output(name, &task)),
                Err(error) => {
                    if matches!(error, ClientError::Unreachable(..)) {
                        self.forget(peer);
                    }
                    let retry = if error.retryable() {
                        "retryable"
                    } else {
                        "not retryable"
                    };
                    ToolOutcome::Error(format!("a2a peer `{name}` ({retry}): {error}"))
                }
            }
        })
    }
}

/// The tool for `[a2a]`'s peers, or `None` when it names none.
#[must_use]
pub fn tool(section: &crate::A2aSection, base: &Path) -> Option<Arc<A2aSend>> {
    (!section.peers.is_empty()).then(|| Arc::new(A2aSend::new(&section.peers, base)))
}
