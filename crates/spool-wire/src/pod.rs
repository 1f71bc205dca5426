//! The Pod protocol (seed 003): one named agent driven over JSONL, a Unix
//! socket or stdio. Clients send methods `{"method", "params"?}`; the pod
//! broadcasts events `{"event", "data"}` to every listener.
//!
//! ```
//! use spool_wire::pod::{Event, Method, TextData};
//!
//! assert_eq!(Method::decode(r#"{"method": "resume"}"#).unwrap(), Method::Resume { answer: None });
//! assert_eq!(
//!     Method::decode(r#"{"method": "run", "params": {"input": "Hi"}}"#).unwrap(),
//!     Method::Run { input: "Hi".into() },
//! );
//! let event = Event::TextDelta(TextData { text: "The capital".into() });
//! assert_eq!(event.encode_line(), "{\"event\":\"text_delta\",\"data\":{\"text\":\"The capital\"}}\n");
//! ```

use serde::{Deserialize, Serialize, Serializer, ser::SerializeMap};
use serde_json::{Map, Value};

use crate::code::{Rejection, serde_util, string_enum};

/// A client → pod method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    /// Start a turn with this input; refused with `already_running` while
    /// one runs (first wins).
    Run {
        /// The user's input.
        input: String,
    },
    /// Resume a paused pod. A pause that asks a person (a question, an
    /// approval) needs an answer: `{"text", "approved"?}` as `params`, an
    /// addition to the seed, whose `resume` carries none.
    Resume {
        /// The answer, when the pause asks for one.
        answer: Option<ResumeAnswer>,
    },
    /// Cancel the running turn.
    Cancel,
    /// Ask for a `status` event.
    GetStatus,
    /// Ask for a `history` event.
    GetHistory,
}

/// The answer a `resume` carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeAnswer {
    /// The answer's text.
    #[serde(default)]
    pub text: String,
    /// For an approval: `true` approves, `false` rejects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
}

string_enum! {
    /// Pod error codes.
    pub enum ErrorCode {
        /// `run` while a turn runs.
        AlreadyRunning = "already_running",
        /// `resume` or `cancel` with no turn running.
        NotRunning = "not_running",
        /// `resume` when not paused.
        NotPaused = "not_paused",
        /// The model provider failed.
        ProviderError = "provider_error",
        /// A tool failed.
        ToolError = "tool_error",
        /// The pod failed unexpectedly.
        Internal = "internal",
        /// A line that does not decode as a method.
        InvalidRequest = "invalid_request",
    }
}

string_enum! {
    /// How a turn ended.
    pub enum TurnResult {
        /// The model answered.
        Finished = "finished",
        /// The turn parked and can be resumed.
        Paused = "paused",
        /// The turn stopped at a limit (`run_end` only).
        LimitReached = "limit_reached",
    }
}

string_enum! {
    /// The pod's state.
    pub enum PodState {
        /// No turn running.
        Idle = "idle",
        /// A turn is running.
        Running = "running",
        /// A turn is parked.
        Paused = "paused",
    }
}

/// Why a line was refused; the code is always a pod code.
pub type PodRejection = Rejection<ErrorCode>;

impl Method {
    /// The wire name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Run { .. } => "run",
            Self::Resume { .. } => "resume",
            Self::Cancel => "cancel",
            Self::GetStatus => "get_status",
            Self::GetHistory => "get_history",
        }
    }

    /// Reads one method line.
    ///
    /// # Errors
    ///
    /// `invalid_request` when the line is not a JSON object, names no or an
    /// unknown method, or `run` lacks a string `input`.
    pub fn decode(line: &str) -> Result<Self, PodRejection> {
        let value =
            serde_util::parse(line).map_err(|e| PodRejection::new(ErrorCode::InvalidRequest, e))?;
        Self::from_value(&value)
    }

    /// Reads a method from a parsed value.
    ///
    /// # Errors
    ///
    /// As [`Method::decode`].
    pub fn from_value(value: &Value) -> Result<Self, PodRejection> {
        let invalid = |message: String| PodRejection::new(ErrorCode::InvalidRequest, message);
        let object = value
            .as_object()
            .ok_or_else(|| invalid("a method must be a JSON object".into()))?;
        let name = object
            .get("method")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("`method` must be a string".into()))?;
        // Unit methods may omit `params`; an explicit null or object is
        // tolerated, anything else is a malformed line.
        let params = match object.get("params") {
            None | Some(Value::Null) => None,
            Some(Value::Object(params)) => Some(params),
            Some(_) => return Err(invalid("`params` must be an object".into())),
        };
        match name {
            "run" => {
                let input = params
                    .and_then(|p| p.get("input"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("`run` needs `params.input`, a string".into()))?;
                Ok(Self::Run {
                    input: input.to_owned(),
                })
            }
            "resume" => {
                // `{}` is no answer, as absent params are.
                let answer = params
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        serde_util::from_value::<ResumeAnswer>(Value::Object(p.clone()))
                            .map_err(|e| invalid(format!("`resume` params: {e}")))
                    })
                    .transpose()?;
                Ok(Self::Resume { answer })
            }
            "cancel" => Ok(Self::Cancel),
            "get_status" => Ok(Self::GetStatus),
            "get_history" => Ok(Self::GetHistory),
            other => Err(invalid(format!("unknown method `{other}`"))),
        }
    }

    /// The method as one JSONL line, `\n` included.
    #[must_use]
    pub fn encode_line(&self) -> String {
        line_of(self)
    }
}

impl Serialize for Method {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("method", self.name())?;
        match self {
            Self::Run { input } => {
                let mut params = Map::new();
                params.insert("input".into(), Value::String(input.clone()));
                map.serialize_entry("params", &params)?;
            }
            Self::Resume {
                answer: Some(answer),
            } => map.serialize_entry("params", answer)?,
            _ => {}
        }
        map.end()
    }
}

/// `turn_start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The turn's number, from 1.
    pub turn: u64,
}

/// `turn_end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEnd {
    /// The turn's number.
    pub turn: u64,
    /// `finished` or `paused`.
    pub result: TurnResult,
}

/// `run_end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// `finished`, `paused` or `limit_reached`.
    pub result: TurnResult,
}

/// The data of the four text events (`text_delta`, `text_done`,
/// `thinking_delta`, `thinking_done`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextData {
    /// A delta, or the whole block on `*_done`.
    pub text: String,
}

/// `tool_call_start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallStart {
    /// The call id.
    pub id: String,
    /// The tool.
    pub name: String,
}

/// `tool_call_args_delta`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallArgsDelta {
    /// The call id.
    pub id: String,
    /// A fragment of the arguments' JSON text.
    pub json: String,
}

/// `tool_call_done`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDone {
    /// The call id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The complete arguments, as JSON text.
    pub arguments: String,
}

/// `tool_result`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call id.
    pub id: String,
    /// What the tool returned, as text.
    pub output: String,
    /// Whether the tool failed.
    #[serde(default)]
    pub is_error: bool,
}

/// `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// `idle`, `running` or `paused`.
    pub state: PodState,
    /// The session (run) id.
    pub session_id: String,
    /// The pod's name.
    pub pod_name: String,
}

/// `history`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// The conversation so far.
    pub items: Vec<HistoryItem>,
}

/// `usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// `error`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorData {
    /// The stable code.
    pub code: ErrorCode,
    /// A human-readable reason.
    pub message: String,
}

/// One conversation item, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HistoryItem {
    /// A user or assistant message.
    Message {
        /// The item's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// Who spoke.
        role: Role,
        /// Its parts.
        content: Vec<ContentPart>,
        /// Its status.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<ItemStatus>,
    },
    /// A tool call by the assistant.
    ToolCall {
        /// The item's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// Links the call to its result.
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments, as JSON text.
        arguments: String,
        /// Its status.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<ItemStatus>,
    },
    /// A tool's result.
    ToolResult {
        /// The item's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// Links the result to its call.
        call_id: String,
        /// The output, as text.
        output: String,
    },
    /// The model's reasoning.
    Reasoning {
        /// The item's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The reasoning text.
        text: String,
        /// Its status.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<ItemStatus>,
    },
    /// An item of a type this version does not know (or a known type in a
    /// shape it does not read), kept as it came: one new kind of item never
    /// hides the rest of a history.
    #[serde(untagged)]
    Other(Value),
}

/// A part of a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A refusal by the assistant.
    Refusal {
        /// The refusal.
        refusal: String,
    },
    /// A part of a kind this version does not know (an image, say), kept
    /// as it came.
    #[serde(untagged)]
    Other(Value),
}

string_enum! {
    /// Who spoke.
    pub enum Role {
        /// The user.
        User = "user",
        /// The assistant.
        Assistant = "assistant",
        /// The system prompt.
        System = "system",
    }
}

string_enum! {
    /// An item's status, lowercased without separators as the protocol
    /// writes it.
    pub enum ItemStatus {
        /// Being generated.
        InProgress = "inprogress",
        /// Complete.
        Completed = "completed",
        /// Cut short (for example at the token limit).
        Incomplete = "incomplete",
    }
}

/// Declares [`Event`] from one table, so the names, the encoder and the
/// decoder cannot drift apart.
macro_rules! pod_events {
    ($( $(#[$doc:meta])* $variant:ident($data:ty) = $name:literal, )+) => {
        /// A pod → client event, broadcast to every listener.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Event {
            $( $(#[$doc])* $variant($data), )+
            /// An event this version does not know, kept so a listener can
            /// skip it (events are additive).
            Unknown {
                /// Its name.
                event: String,
                /// Its data.
                data: Value,
            },
        }

        impl Event {
            /// Every event name this version knows.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The wire name.
            #[must_use]
            pub fn name(&self) -> &str {
                match self {
                    $(Self::$variant(_) => $name,)+
                    Self::Unknown { event, .. } => event,
                }
            }


            fn from_parts(name: &str, data: Value) -> Result<Self, String> {
                match name {
                    $($name => serde_util::from_value(data).map(Self::$variant),)+
                    other => Ok(Self::Unknown { event: other.to_owned(), data }),
                }
            }
        }

        /// The known events as serde reads them straight from text: the
        /// fast path for well-formed lines. Anything it refuses (an
        /// unknown event, a bad field) goes the general way, which keeps
        /// unknown events and words its errors.
        #[derive(Deserialize)]
        #[serde(tag = "event", content = "data")]
        enum Known {
            $( #[serde(rename = $name)] $variant($data), )+
        }

        impl From<Known> for Event {
            fn from(known: Known) -> Self {
                match known {
                    $(Known::$variant(data) => Self::$variant(data),)+
                }
            }
        }

        // Data is written field by field, not through a `Value`, so each
        // event keeps the field order the protocol document prints.
        impl Serialize for Event {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("event", self.name())?;
                match self {
                    $(Self::$variant(data) => map.serialize_entry("data", data)?,)+
                    Self::Unknown { data, .. } => map.serialize_entry("data", data)?,
                }
                map.end()
            }
        }
    };
}

pod_events! {
    /// A turn started.
    TurnStart(TurnStart) = "turn_start",
    /// A turn ended.
    TurnEnd(TurnEnd) = "turn_end",
    /// A piece of the answer.
    TextDelta(TextData) = "text_delta",
    /// A text block ended; the whole text.
    TextDone(TextData) = "text_done",
    /// A piece of the model's thinking.
    ThinkingDelta(TextData) = "thinking_delta",
    /// A thinking block ended.
    ThinkingDone(TextData) = "thinking_done",
    /// A tool call began.
    ToolCallStart(ToolCallStart) = "tool_call_start",
    /// A fragment of a tool call's arguments.
    ToolCallArgsDelta(ToolCallArgsDelta) = "tool_call_args_delta",
    /// A tool call's arguments are complete.
    ToolCallDone(ToolCallDone) = "tool_call_done",
    /// A tool returned.
    ToolResult(ToolResult) = "tool_result",
    /// The pod's state, on request or on change.
    Status(Status) = "status",
    /// The conversation, on request.
    History(History) = "history",
    /// Token usage.
    Usage(Usage) = "usage",
    /// Something failed.
    Error(ErrorData) = "error",
    /// The whole run ended (sent by the protocol's own implementation after
    /// the last `turn_end`).
    RunEnd(RunEnd) = "run_end",
}

impl Event {
    /// An `error` event.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error(ErrorData {
            code,
            message: message.into(),
        })
    }

    /// Reads one event line.
    ///
    /// # Errors
    ///
    /// `invalid_request` when the line is not an object with a string
    /// `event`, or a known event's `data` has the wrong shape. An unknown
    /// event is not an error: it decodes as [`Event::Unknown`].
    pub fn decode(line: &str) -> Result<Self, PodRejection> {
        if let Ok(known) = serde_json::from_str::<Known>(line) {
            return Ok(known.into());
        }
        let value =
            serde_util::parse(line).map_err(|e| PodRejection::new(ErrorCode::InvalidRequest, e))?;
        Self::from_value(value)
    }

    /// Reads an event from a parsed value.
    ///
    /// # Errors
    ///
    /// As [`Event::decode`].
    pub fn from_value(value: Value) -> Result<Self, PodRejection> {
        let invalid = |message: String| PodRejection::new(ErrorCode::InvalidRequest, message);
        let Value::Object(mut object) = value else {
            return Err(invalid("an event must be a JSON object".into()));
        };
        let name = match object.remove("event") {
            Some(Value::String(name)) => name,
            _ => return Err(invalid("`event` must be a string".into())),
        };
        let data = object.remove("data").unwrap_or(Value::Null);
        Self::from_parts(&name, data).map_err(|e| invalid(format!("`{name}` data: {e}")))
    }

    /// The event as one JSONL line, `\n` included.
    #[must_use]
    pub fn encode_line(&self) -> String {
        line_of(self)
    }
}

fn line_of<T: Serialize>(message: &T) -> String {
    let mut line =
        serde_json::to_string(message).expect("pod messages are plain JSON and always serialize");
    line.push('\n');
    line
}
