//! A2A (Agent2Agent protocol, v1.0): the JSON shapes of its data model
//! (`specification/a2a.proto` in `a2aproject/A2A`, as ProtoJSON: camelCase
//! fields, enums by their proto names), the requests Spool answers, and
//! the protocol's errors with their JSON-RPC codes and HTTP statuses.
//!
//! Decoding is lenient where the specification asks it to be: unknown
//! fields are ignored, and the v0.3 spellings of states and roles
//! (`working`, `input-required`, `user`) are read as their v1.0 names.
//! Encoding always writes v1.0; [`v0_3`] rewrites a v1.0 value into the
//! v0.3 shape for the v0.3 method names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version this module speaks.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The earlier version whose method names are answered too.
pub const LEGACY_VERSION: &str = "0.3";
/// The HTTP+JSON binding's media type.
pub const MEDIA_TYPE: &str = "application/a2a+json";
/// Where the public agent card is served.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// Where v0.2 clients look for it.
pub const LEGACY_CARD_PATH: &str = "/.well-known/agent.json";
/// The header a push notification carries its config's token in.
pub const NOTIFICATION_TOKEN_HEADER: &str = "x-a2a-notification-token";
/// The service parameter (HTTP header) that names a request's version.
pub const VERSION_HEADER: &str = "a2a-version";
/// The `domain` of every error's `google.rpc.ErrorInfo`.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// A task's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Known, not yet worked on (queued behind another task).
    Submitted,
    /// Being worked on.
    Working,
    /// Done, with its artifacts.
    Completed,
    /// Ended by a failure.
    Failed,
    /// Cancelled.
    Canceled,
    /// Waiting for the client's input.
    InputRequired,
    /// Refused by the agent.
    Rejected,
    /// Waiting for the client to authenticate.
    AuthRequired,
}

impl TaskState {
    /// Every state, in the proto's order.
    pub const ALL: [Self; 8] = [
        Self::Submitted,
        Self::Working,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
        Self::InputRequired,
        Self::Rejected,
        Self::AuthRequired,
    ];

    /// The v1.0 name (`TASK_STATE_WORKING`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            Self::Rejected => "TASK_STATE_REJECTED",
            Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
        }
    }

    /// The v0.3 name (`working`, `input-required`).
    #[must_use]
    pub fn legacy(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::InputRequired => "input-required",
            Self::Rejected => "rejected",
            Self::AuthRequired => "auth-required",
        }
    }

    /// Reads either spelling.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == text || state.legacy() == text)
    }

    /// Completed, failed, canceled or rejected: nothing more happens.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Terminal, or waiting for the client: where a blocking send and a
    /// stream stop.
    #[must_use]
    pub fn is_resting(self) -> bool {
        self.is_terminal() || matches!(self, Self::InputRequired | Self::AuthRequired)
    }
}

impl Serialize for TaskState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown task state `{text}`: one of {}",
                Self::ALL.map(Self::as_str).join(", ")
            ))
        })
    }
}

/// Who sent a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The client.
    User,
    /// The agent.
    Agent,
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            Self::User => "ROLE_USER",
            Self::Agent => "ROLE_AGENT",
        })
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match String::deserialize(deserializer)?.as_str() {
            "ROLE_USER" | "user" => Ok(Self::User),
            "ROLE_AGENT" | "agent" => Ok(Self::Agent),
            other => Err(serde::de::Error::custom(format!(
                "unknown role `{other}`: ROLE_USER or ROLE_AGENT"
            ))),
        }
    }
}

/// A piece of a message or an artifact: exactly one of `text`, `raw`,
/// `url` or `data`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// Text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Bytes, base64 as ProtoJSON writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// A file by reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Structured data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// A file's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Its media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    #[must_use]
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }
}

/// A message between client and agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Its id, chosen by the sender.
    pub message_id: String,
    /// The conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who sent it.
    pub role: Role,
    /// Its content.
    pub parts: Vec<Part>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Extensions it uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Tasks it refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// An agent's text message in a task.
    #[must_use]
    pub fn agent(message_id: String, context: &str, task: &str, text: String) -> Self {
        Self {
            message_id,
            context_id: Some(context.to_owned()),
            task_id: Some(task.to_owned()),
            role: Role::Agent,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }

    /// Its parts' text ([`text_of`]).
    #[must_use]
    pub fn text(&self) -> String {
        text_of(&self.parts)
    }
}

/// The text of `parts`' text parts, one per line, and their data parts as
/// JSON: what a model is given of a message or an artifact.
#[must_use]
pub fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|part| {
            part.text
                .clone()
                .or_else(|| part.data.as_ref().map(Value::to_string))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A task's state with its message and time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// What the agent says about it (the question, the failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// When it took this state (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// An output of a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Its id, unique in the task.
    pub artifact_id: String,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its content.
    pub parts: Vec<Part>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A unit of work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Its id, chosen by the agent.
    pub id: String,
    /// Its conversation.
    pub context_id: String,
    /// Where it stands.
    pub status: TaskStatus,
    /// Its outputs; absent where a listing leaves them out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<Artifact>>,
    /// Its messages, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Message>>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

impl Task {
    /// The task with at most `length` of its latest messages (`Some(0)`:
    /// none), the specification's `historyLength`.
    #[must_use]
    pub fn with_history_length(mut self, length: Option<u32>) -> Self {
        if let (Some(length), Some(history)) = (length, self.history.as_mut()) {
            let keep = usize::try_from(length).unwrap_or(usize::MAX);
            if keep == 0 {
                self.history = None;
            } else if history.len() > keep {
                history.drain(..history.len() - keep);
            }
        }
        self
    }
}

/// A task's state changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its conversation.
    pub context_id: String,
    /// Its new status.
    pub status: TaskStatus,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A task's artifact was made or grew.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its conversation.
    pub context_id: String,
    /// The artifact, or the piece of it.
    pub artifact: Artifact,
    /// The parts add to the artifact's earlier ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
    /// The artifact is complete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_chunk: bool,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// One item of a stream, and a push notification's body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    /// The task as it stands.
    Task(Task),
    /// A message.
    Message(Message),
    /// A status change.
    StatusUpdate(TaskStatusUpdateEvent),
    /// An artifact change.
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

/// `SendMessage`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SendMessageResponse {
    /// The task the message made or continued.
    Task(Task),
    /// A direct answer.
    Message(Message),
}

/// How a send is carried out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Media types the client accepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_output_modes: Vec<String>,
    /// A push notification config for the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_push_notification_config: Option<TaskPushNotificationConfig>,
    /// How many of the task's messages the answer carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    /// Answer at once instead of at the task's terminal or interrupted
    /// state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub return_immediately: bool,
    /// v0.3's inverse of `returnImmediately`.
    #[serde(default, skip_serializing)]
    pub blocking: Option<bool>,
}

/// `SendMessage` and `SendStreamingMessage`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    /// A tenant, on agents that host several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The message.
    pub message: Message,
    /// How to carry it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<SendMessageConfiguration>,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// How a push notification authenticates to its receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationInfo {
    /// The HTTP scheme (`Bearer`, `Basic`).
    pub scheme: String,
    /// Its credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// A task's push notification config: where its changes are POSTed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskPushNotificationConfig {
    /// A tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Its id (the agent makes one when the client gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Where to POST.
    pub url: String,
    /// Sent as `X-A2A-Notification-Token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Sent as `Authorization: SCHEME CREDENTIALS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<AuthenticationInfo>,
}

/// `ListTaskPushNotificationConfigs`' answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTaskPushNotificationConfigsResponse {
    /// The task's configs.
    pub configs: Vec<TaskPushNotificationConfig>,
    /// Empty: every config is on one page.
    pub next_page_token: String,
}

/// `GetTaskPushNotificationConfig`, `DeleteTaskPushNotificationConfig`
/// and `ListTaskPushNotificationConfigs` (which leaves `id` out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfigRequest {
    /// The task.
    pub task_id: String,
    /// The config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `GetTask`, `CancelTask` and `SubscribeToTask`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRequest {
    /// The task.
    pub id: String,
    /// How many of its messages the answer carries (`GetTask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    /// A tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Metadata (`CancelTask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// `ListTasks`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    /// Only this conversation's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskState>,
    /// At most this many (1 to 100; 50 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<i64>,
    /// Where the previous page ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_token: Option<String>,
    /// How many messages each task carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    /// Only tasks whose status changed after this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_timestamp_after: Option<String>,
    /// Whether each task carries its artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_artifacts: Option<bool>,
    /// A tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `ListTasks`' answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    /// The page.
    pub tasks: Vec<Task>,
    /// Where the next page starts; empty on the last.
    pub next_page_token: String,
    /// The page size used.
    pub page_size: i64,
    /// How many tasks match, over all pages.
    pub total_size: i64,
}

/// The largest `pageSize`.
pub const MAX_PAGE_SIZE: i64 = 100;
/// The `pageSize` when none is given.
pub const DEFAULT_PAGE_SIZE: i64 = 50;

/// An interface the agent is reached at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// Its URL.
    pub url: String,
    /// `JSONRPC`, `HTTP+JSON` or `GRPC`.
    pub protocol_binding: String,
    /// The protocol version it speaks.
    pub protocol_version: String,
    /// A tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// What the agent can do beyond the core.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `SendStreamingMessage` and `SubscribeToTask`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,
    /// Push notification configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_notifications: Option<bool>,
    /// `GetExtendedAgentCard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_agent_card: Option<bool>,
}

/// A skill the agent offers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Words it is found by.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

/// An agent's self-description.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Where it is reached, preferred first.
    pub supported_interfaces: Vec<AgentInterface>,
    /// Its version.
    pub version: String,
    /// Its documentation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation_url: Option<String>,
    /// What it can do.
    pub capabilities: AgentCapabilities,
    /// How callers authenticate, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security_schemes: BTreeMap<String, Value>,
    /// Which schemes a call needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_requirements: Vec<Value>,
    /// Media types it reads.
    pub default_input_modes: Vec<String>,
    /// Media types it writes.
    pub default_output_modes: Vec<String>,
    /// Its skills.
    pub skills: Vec<AgentSkill>,
}

impl AgentCard {
    /// The first interface with `binding` (`JSONRPC`, `HTTP+JSON`).
    #[must_use]
    pub fn interface(&self, binding: &str) -> Option<&AgentInterface> {
        self.supported_interfaces
            .iter()
            .find(|interface| interface.protocol_binding == binding)
    }
}

/// The A2A errors (specification §3.3.2), and the standard JSON-RPC ones
/// the bindings share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The body is not JSON.
    Parse,
    /// Not a valid JSON-RPC request.
    InvalidRequest,
    /// No such method (or route).
    MethodNotFound,
    /// A parameter is missing or wrong.
    InvalidParams,
    /// The agent failed.
    Internal,
    /// No such task, or not the caller's.
    TaskNotFound,
    /// The task cannot be cancelled now.
    TaskNotCancelable,
    /// Push notifications are not offered.
    PushNotificationNotSupported,
    /// Not supported here, or not in the task's state.
    UnsupportedOperation,
    /// A media type the agent does not take.
    ContentTypeNotSupported,
    /// An agent answered outside the specification.
    InvalidAgentResponse,
    /// No extended card is configured.
    ExtendedAgentCardNotConfigured,
    /// A required extension was not declared.
    ExtensionSupportRequired,
    /// The `A2A-Version` is not spoken.
    VersionNotSupported,
    /// No valid credentials.
    Unauthenticated,
}

impl ErrorKind {
    /// The JSON-RPC code.
    #[must_use]
    pub fn code(self) -> i64 {
        match self {
            Self::Parse => -32700,
            Self::InvalidRequest => -32600,
            Self::MethodNotFound => -32601,
            Self::InvalidParams => -32602,
            Self::Internal => -32603,
            Self::TaskNotFound => -32001,
            Self::TaskNotCancelable => -32002,
            Self::PushNotificationNotSupported => -32003,
            Self::UnsupportedOperation => -32004,
            Self::ContentTypeNotSupported => -32005,
            Self::InvalidAgentResponse => -32006,
            Self::ExtendedAgentCardNotConfigured => -32007,
            Self::ExtensionSupportRequired => -32008,
            Self::VersionNotSupported => -32009,
            // Not in the specification's table: the JSON-RPC binding
            // leaves authentication to HTTP (401), which this is only on
            // a stream already open.
            Self::Unauthenticated => -32010,
        }
    }

    /// The HTTP status on the HTTP+JSON binding.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Self::TaskNotFound | Self::MethodNotFound => 404,
            Self::Internal | Self::InvalidAgentResponse => 500,
            Self::Unauthenticated => 401,
            _ => 400,
        }
    }

    /// The `google.rpc.Status` name for [`ErrorKind::status`].
    #[must_use]
    pub fn grpc_status(self) -> &'static str {
        match self {
            Self::TaskNotFound | Self::MethodNotFound => "NOT_FOUND",
            Self::Internal | Self::InvalidAgentResponse => "INTERNAL",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::Parse | Self::InvalidRequest | Self::InvalidParams => "INVALID_ARGUMENT",
            Self::ContentTypeNotSupported => "INVALID_ARGUMENT",
            _ => "FAILED_PRECONDITION",
        }
    }

    /// The `ErrorInfo.reason`: the error's name in UPPER_SNAKE_CASE
    /// without `Error`.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::Parse => "PARSE_ERROR",
            Self::InvalidRequest => "INVALID_REQUEST",
            Self::MethodNotFound => "METHOD_NOT_FOUND",
            Self::InvalidParams => "INVALID_PARAMS",
            Self::Internal => "INTERNAL",
            Self::TaskNotFound => "TASK_NOT_FOUND",
            Self::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::InvalidAgentResponse => "INVALID_AGENT_RESPONSE",
            Self::ExtendedAgentCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            Self::ExtensionSupportRequired => "EXTENSION_SUPPORT_REQUIRED",
            Self::VersionNotSupported => "VERSION_NOT_SUPPORTED",
            Self::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The kind a JSON-RPC code names, for a client reading a peer's error.
    #[must_use]
    pub fn from_code(code: i64) -> Option<Self> {
        [
            Self::Parse,
            Self::InvalidRequest,
            Self::MethodNotFound,
            Self::InvalidParams,
            Self::Internal,
            Self::TaskNotFound,
            Self::TaskNotCancelable,
            Self::PushNotificationNotSupported,
            Self::UnsupportedOperation,
            Self::ContentTypeNotSupported,
            Self::InvalidAgentResponse,
            Self::ExtendedAgentCardNotConfigured,
            Self::ExtensionSupportRequired,
            Self::VersionNotSupported,
            Self::Unauthenticated,
        ]
        .into_iter()
        .find(|kind| kind.code() == code)
    }
}

/// An A2A error: its kind, what went wrong, and the `ErrorInfo` metadata.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// Which error.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
    /// `ErrorInfo.metadata` (the task id, the versions spoken).
    pub metadata: BTreeMap<String, String>,
}

impl Error {
    /// An error with no metadata.
    #[must_use]
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            metadata: BTreeMap::new(),
        }
    }

    /// With one more `ErrorInfo.metadata` entry.
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata.insert(key.to_owned(), value.into());
        self
    }

    /// The task `id` does not exist or is not the caller's.
    #[must_use]
    pub fn task_not_found(id: &str) -> Self {
        Self::new(ErrorKind::TaskNotFound, format!("task `{id}` not found")).with("taskId", id)
    }

    /// The `details` (HTTP+JSON) and `data` (JSON-RPC) array: one
    /// `google.rpc.ErrorInfo`.
    #[must_use]
    pub fn details(&self) -> Value {
        serde_json::json!([{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": self.kind.reason(),
            "domain": ERROR_DOMAIN,
            "metadata": self.metadata,
        }])
    }

    /// The JSON-RPC `error` member.
    #[must_use]
    pub fn rpc(&self) -> Value {
        serde_json::json!({
            "code": self.kind.code(),
            "message": self.message,
            "data": self.details(),
        })
    }

    /// The HTTP+JSON body (`google.rpc.Status`).
    #[must_use]
    pub fn http(&self) -> Value {
        serde_json::json!({"error": {
            "code": self.kind.status(),
            "status": self.kind.grpc_status(),
            "message": self.message,
            "details": self.details(),
        }})
    }
}

/// Rewrites a v1.0 value (a task, a message, a stream item or a send's
/// answer) into v0.3's shape, for the v0.3 method names: a `kind` on each
/// object, lowercase states and roles, `parts` as `{"kind": "text"}`, and
/// a stream item or a send's answer as the object itself rather than
/// wrapped in `{"task": …}`.
pub mod v0_3 {
    use serde_json::{Map, Value};

    use super::TaskState;

    /// A stream item or a send's answer (`{"task": …}`, `{"statusUpdate":
    /// …}`) as v0.3 writes it.
    #[must_use]
    pub fn item(value: Value) -> Value {
        let Value::Object(wrapper) = value else {
            return value;
        };
        match wrapper.into_iter().next() {
            Some((key, inner)) => match key.as_str() {
                "task" => task(inner),
                "message" => message(inner),
                "statusUpdate" => status_update(inner),
                "artifactUpdate" => artifact_update(inner),
                _ => inner,
            },
            None => Value::Object(Map::new()),
        }
    }

    /// A task.
    #[must_use]
    pub fn task(value: Value) -> Value {
        let Value::Object(mut task) = value else {
            return value;
        };
        task.insert("kind".into(), "task".into());
        if let Some(status) = task.remove("status") {
            task.insert("status".into(), status_of(status));
        }
        for key in ["history"] {
            if let Some(Value::Array(items)) = task.remove(key) {
                task.insert(
                    key.into(),
                    Value::Array(items.into_iter().map(message).collect()),
                );
            }
        }
        if let Some(Value::Array(items)) = task.remove("artifacts") {
            task.insert(
                "artifacts".into(),
                Value::Array(items.into_iter().map(artifact).collect()),
            );
        }
        Value::Object(task)
    }

    /// A message.
    #[must_use]
    pub fn message(value: Value) -> Value {
        let Value::Object(mut message) = value else {
            return value;
        };
        message.insert("kind".into(), "message".into());
        if let Some(Value::String(role)) = message.get("role") {
            let role = if role == "ROLE_AGENT" {
                "agent"
            } else {
                "user"
            };
            message.insert("role".into(), role.into());
        }
        parts_of(&mut message);
        Value::Object(message)
    }

    fn artifact(value: Value) -> Value {
        let Value::Object(mut artifact) = value else {
            return value;
        };
        parts_of(&mut artifact);
        Value::Object(artifact)
    }

    fn parts_of(object: &mut Map<String, Value>) {
        if let Some(Value::Array(parts)) = object.remove("parts") {
            let parts = parts
                .into_iter()
                .map(|part| match part {
                    Value::Object(mut part) => {
                        let kind = if part.contains_key("data") {
                            "data"
                        } else if part.contains_key("text") {
                            "text"
                        } else {
                            "file"
                        };
                        part.insert("kind".into(), kind.into());
                        Value::Object(part)
                    }
                    other => other,
                })
                .collect();
            object.insert("parts".into(), Value::Array(parts));
        }
    }

    fn status_of(value: Value) -> Value {
        let Value::Object(mut status) = value else {
            return value;
        };
        if let Some(state) = status
            .get("state")
            .and_then(Value::as_str)
            .and_then(TaskState::parse)
        {
            status.insert("state".into(), state.legacy().into());
        }
        if let Some(inner) = status.remove("message") {
            status.insert("message".into(), message(inner));
        }
        Value::Object(status)
    }

    fn status_update(value: Value) -> Value {
        let Value::Object(mut event) = value else {
            return value;
        };
        event.insert("kind".into(), "status-update".into());
        let terminal = event
            .get("status")
            .and_then(|s| s.get("state"))
            .and_then(Value::as_str)
            .and_then(TaskState::parse)
            .is_some_and(TaskState::is_resting);
        event.insert("final".into(), terminal.into());
        if let Some(status) = event.remove("status") {
            event.insert("status".into(), status_of(status));
        }
        Value::Object(event)
    }

    fn artifact_update(value: Value) -> Value {
        let Value::Object(mut event) = value else {
            return value;
        };
        event.insert("kind".into(), "artifact-update".into());
        if let Some(inner) = event.remove("artifact") {
            event.insert("artifact".into(), artifact(inner));
        }
        Value::Object(event)
    }
}
