//! The `Engine` trait: one streamed model call. What a model sees
//! ([`Message`]), what it is asked ([`ModelRequest`]), what it streams
//! ([`Delta`]) and what it answers ([`ModelResponse`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spool_journal::event::Usage;
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

/// One model call's request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The whole conversation, system prompt first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
}

impl ModelRequest {
    /// The request's content hash: what the journal records, and what a
    /// replay must reproduce.
    #[must_use]
    pub fn hash(&self) -> String {
        let value = serde_json::to_value(self)
            .expect("a model request is plain JSON and always serializes");
        spool_wire::canonical::content_hash(&value)
    }
}

/// What a model streams while it answers. Live only: deltas are never
/// recorded.
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
    pub fn code(&self) -> &'static str {
        match self {
            Self::Provider(_) => "provider_error",
            Self::Auth(_) => "auth",
            Self::Budget(_) => "budget",
            Self::Timeout(_) => "timeout",
            Self::Cli(_) => "engine_cli",
            Self::Cancelled => "cancelled",
            Self::CompactionUnsupported => "compaction_unsupported",
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
