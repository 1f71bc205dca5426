//! The `Engine` trait: one streamed model call. What a model sees
//! ([`Message`]), what it is asked ([`ModelRequest`]), what it streams
//! ([`Delta`]) and what it answers ([`ModelResponse`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use spool_journal::event::Usage;
use spool_wire::run::FailureCode;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;

/// One message of the conversation a model sees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The system prompt.
    System {
        /// Its text.
        content: String,
    },
    /// The user (a turn's input, steered input, or an answer).
    User {
        /// Its text.
        content: String,
    },
    /// The model.
    Assistant {
        /// Its text.
        content: String,
        /// The tools it called.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// A tool's result, for the model.
    Tool {
        /// The call it answers.
        call_id: String,
        /// The result, as text.
        content: String,
    },
}

/// A tool call the model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments.
    pub arguments: Value,
}

/// A tool as the model is told of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its input.
    pub input_schema: Value,
}

/// One model call's request: the conversation a model sees, system prompt
/// first, and the tools it may call.
///
/// The earlier part of the conversation is shared with the runtime's
/// in-memory copy of the run, not copied for every call, so a request at a
/// run's turn 2,000 costs what turn 10's does. Read the conversation with
/// [`ModelRequest::messages`]; it serializes as `{"messages": [...],
/// "tools": [...]}`.
#[derive(Clone, Debug)]
pub struct ModelRequest {
    /// The shared start of the conversation.
    earlier: Arc<Vec<Message>>,
    /// What follows it: this turn's messages.
    recent: Vec<Message>,
    /// The tools, shared by every request of a runtime.
    tools: Arc<[ToolSpec]>,
}

/// The prefix of a request hash made by [`ModelRequest::hash`]: a chain over
/// the messages, so a long run's next hash costs only its new messages.
pub const REQUEST_HASH_PREFIX: &str = "sha256-chain:";

impl ModelRequest {
    /// A request for `messages` (system prompt first) and `tools`.
    #[must_use]
    pub fn new(messages: Vec<Message>, tools: Vec<ToolSpec>) -> Self {
        Self {
            earlier: Arc::new(Vec::new()),
            recent: messages,
            tools: tools.into(),
        }
    }

    /// A request whose conversation is `earlier`, shared, then `recent`.
    pub(crate) fn shared(
        earlier: Arc<Vec<Message>>,
        recent: Vec<Message>,
        tools: Arc<[ToolSpec]>,
    ) -> Self {
        Self {
            earlier,
            recent,
            tools,
        }
    }

    /// The conversation, system prompt first.
    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> + Clone {
        self.earlier.iter().chain(&self.recent)
    }

    /// How many messages the conversation has.
    #[must_use]
    pub fn message_count(&self) -> usize {
        self.earlier.len() + self.recent.len()
    }

    /// The tools the model may call.
    #[must_use]
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The request's content hash: what the journal records, and what a
    /// replay must reproduce. A chain over the messages' canonical JSON,
    /// then the tools' (see [`RequestHasher`]).
    #[must_use]
    pub fn hash(&self) -> String {
        let mut hasher = RequestHasher::default();
        for message in self.messages() {
            hasher.push(message);
        }
        hasher.finish(&tools_digest(&self.tools))
    }

    /// The hash version-1 logs recorded: the content hash of the whole
    /// request's JSON. A turn recorded by an earlier Spool replays against
    /// it, so an upgrade never turns an in-flight run into a divergence.
    #[must_use]
    pub fn hash_v1(&self) -> String {
        let value = serde_json::to_value(self)
            .expect("a model request is plain JSON and always serializes");
        spool_wire::canonical::content_hash(&value)
    }
}

impl PartialEq for ModelRequest {
    fn eq(&self, other: &Self) -> bool {
        self.message_count() == other.message_count()
            && self.messages().eq(other.messages())
            && self.tools == other.tools
    }
}

impl Serialize for ModelRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Messages<'a>(&'a ModelRequest);
        impl Serialize for Messages<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.messages())
            }
        }
        let fields = if self.tools.is_empty() { 1 } else { 2 };
        let mut out = serializer.serialize_struct("ModelRequest", fields)?;
        out.serialize_field("messages", &Messages(self))?;
        if !self.tools.is_empty() {
            out.serialize_field("tools", &*self.tools)?;
        }
        out.end()
    }
}

impl<'de> Deserialize<'de> for ModelRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            messages: Vec<Message>,
            #[serde(default)]
            tools: Vec<ToolSpec>,
        }
        let wire = Wire::deserialize(deserializer)?;
        Ok(Self::new(wire.messages, wire.tools))
    }
}

/// Builds a request hash message by message: SHA-256 over the previous
/// link and the next message's canonical JSON, closed with the tools'
/// digest. The runtime keeps a run's chain up to its current turn, so each
/// model call hashes only what is new.
#[derive(Clone, Debug)]
pub struct RequestHasher {
    link: [u8; 32],
}

impl Default for RequestHasher {
    fn default() -> Self {
        Self {
            link: Sha256::digest(b"spool model request v2").into(),
        }
    }
}

impl RequestHasher {
    /// Adds the conversation's next message.
    pub fn push(&mut self, message: &Message) {
        let value = serde_json::to_value(message).expect("a message is plain JSON");
        let mut next = Sha256::new();
        next.update(self.link);
        next.update(spool_wire::canonical::canonical_json(&value).as_bytes());
        self.link = next.finalize().into();
    }

    /// The hash of the conversation so far with tools whose digest is
    /// `tools` (see [`tools_digest`]).
    #[must_use]
    pub fn finish(&self, tools: &[u8; 32]) -> String {
        let mut last = Sha256::new();
        last.update(self.link);
        last.update(tools);
        let mut out = String::with_capacity(REQUEST_HASH_PREFIX.len() + 64);
        out.push_str(REQUEST_HASH_PREFIX);
        for byte in last.finalize() {
            for nibble in [byte >> 4, byte & 0x0f] {
                out.push(char::from_digit(u32::from(nibble), 16).expect("a nibble is below 16"));
            }
        }
        out
    }
}

/// The SHA-256 of the tools' canonical JSON, the last link of a request
/// hash: computed once per runtime, since its tools do not change.
#[must_use]
pub fn tools_digest(tools: &[ToolSpec]) -> [u8; 32] {
    let value = serde_json::to_value(tools).expect("tool specs are plain JSON");
    Sha256::digest(spool_wire::canonical::canonical_json(&value).as_bytes()).into()
}

/// What a model streams while it answers, and what a tool reports while
/// it runs. Live only: deltas are never recorded.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// A piece of the answer.
    Text(String),
    /// A piece of the model's thinking.
    Thinking(String),
    /// A tool call began.
    ToolCallStart {
        /// The call id.
        id: String,
        /// The tool.
        name: String,
    },
    /// A fragment of a tool call's arguments (JSON text).
    ToolCallArguments {
        /// The call id.
        id: String,
        /// The fragment.
        fragment: String,
    },
    /// A tool call's arguments are complete.
    ToolCallDone {
        /// The call id.
        id: String,
        /// The tool.
        name: String,
        /// The complete arguments (JSON text).
        arguments: String,
    },
    /// A running tool call's progress (`ToolContext::progress`; an MCP
    /// server's progress notifications).
    ToolProgress {
        /// The call id.
        id: String,
        /// What the tool said of its progress.
        message: String,
    },
}

/// The model's complete answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The answer's text.
    pub text: String,
    /// The model's thinking, when it shared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The tools it called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tokens used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

impl ModelResponse {
    /// The assistant message this answer adds to the conversation.
    #[must_use]
    pub fn message(&self) -> Message {
        Message::Assistant {
            content: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
        }
    }
}

/// Why a model call failed. Classified by code, never by text: each
/// variant is one stable code a failed turn records, and its message is
/// safe to record (no credentials, no provider stderr).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The provider refused or failed the call, or its answer was not one
    /// the engine could read.
    #[error("model provider failed: {0}")]
    Provider(String),
    /// The provider refused the credentials (HTTP 401 or 403).
    #[error("model provider refused the credentials: {0}")]
    Auth(String),
    /// The provider's quota or rate limit held after every retry.
    #[error("model provider budget or rate limit: {0}")]
    Budget(String),
    /// The provider did not answer, or stopped streaming, in time.
    #[error("model provider timed out: {0}")]
    Timeout(String),
    /// A provider run as a child process failed or timed out.
    #[error("engine command failed: {0}")]
    Cli(String),
    /// The call was cancelled.
    #[error("model call cancelled")]
    Cancelled,
    /// The engine cannot summarize a conversation.
    #[error("this engine cannot compact a conversation")]
    CompactionUnsupported,
}

impl EngineError {
    /// The stable code a failed turn records.
    #[must_use]
    pub fn code(&self) -> FailureCode {
        match self {
            Self::Provider(_) => FailureCode::ProviderError,
            Self::Auth(_) => FailureCode::Auth,
            Self::Budget(_) => FailureCode::Budget,
            Self::Timeout(_) => FailureCode::Timeout,
            Self::Cli(_) => FailureCode::EngineCli,
            Self::Cancelled => FailureCode::Cancelled,
            Self::CompactionUnsupported => FailureCode::CompactionUnsupported,
        }
    }
}

/// Where an engine sends its deltas. Never blocks: the runtime keeps
/// deltas in a bounded ring per run.
pub type Deltas<'a> = &'a (dyn Fn(Delta) + Send + Sync);

/// Which call this is: not part of what the model sees, but an engine may
/// use it (a script answers by position) or log it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallContext {
    /// The run.
    pub run: spool_journal::RunId,
    /// The run's model calls before this one.
    pub ordinal: u64,
}

/// A model provider.
///
/// A provider Spool does not ship is an `Engine` of the host's, given to
/// [`RuntimeBuilder::engine`](crate::RuntimeBuilder::engine); no Spool
/// crate changes (`examples/custom-engine` streams its answer as deltas):
///
/// ```
/// use std::sync::Arc;
///
/// use spool_journal::store::memory::MemoryJournal;
/// use spool_runtime::engine::{CallContext, Deltas, EngineError};
/// use spool_runtime::{BoxFuture, Engine, ModelRequest, ModelResponse, Runtime, StartRequest};
/// use tokio_util::sync::CancellationToken;
///
/// /// Answers every call with the same words.
/// struct Parrot(&'static str);
///
/// impl Engine for Parrot {
///     fn call<'a>(
///         &'a self,
///         _context: &'a CallContext,
///         _request: &'a ModelRequest,
///         _deltas: Deltas<'a>,
///         _cancel: &'a CancellationToken,
///     ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
///         Box::pin(async move { Ok(ModelResponse { text: self.0.into(), ..Default::default() }) })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
///     .engine(Arc::new(Parrot("Polly wants a cracker.")))
///     .build();
/// let accepted = runtime
///     .start(StartRequest { text: "Hello?".into(), ..Default::default() })
///     .await
///     .unwrap();
/// let turn = runtime.get(accepted.run()).await.unwrap().turn_id.unwrap();
/// let done = runtime.wait_for(accepted.run(), &turn).await.unwrap();
/// assert_eq!(done.response.as_deref(), Some("Polly wants a cracker."));
/// # });
/// ```
pub trait Engine: Send + Sync + 'static {
    /// Makes one model call, streaming deltas as they come, and stops early
    /// (with [`EngineError::Cancelled`]) when `cancel` fires.
    fn call<'a>(
        &'a self,
        context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>>;

    /// Summarizes `messages` for compaction.
    ///
    /// # Errors
    ///
    /// [`EngineError::CompactionUnsupported`] unless the engine can.
    fn compact<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> BoxFuture<'a, Result<String, EngineError>> {
        let _ = messages;
        Box::pin(async { Err(EngineError::CompactionUnsupported) })
    }
}
