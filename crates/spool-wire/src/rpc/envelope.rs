//! The four envelope shapes, their ids, and the specification's decoding
//! rules for single messages and batches.

use serde::{Deserialize, Serialize, Serializer, ser::SerializeMap};
use serde_json::{Number, Value};

use super::codes;

/// A request id: a number, a string, or (discouraged, but legal) null.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Id {
    /// A numeric id, kept exactly as sent.
    Number(Number),
    /// A string id.
    String(String),
    /// The null id, also used when a request's id could not be read.
    Null,
}

/// A call that expects an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Echoed in the response.
    pub id: Id,
    /// The method to call.
    pub method: String,
    /// An object or an array, when present.
    pub params: Option<Value>,
}

/// A call that expects no answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Notification {
    /// The method to call.
    pub method: String,
    /// An object or an array, when present.
    pub params: Option<Value>,
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The request's id, or null when it could not be read.
    pub id: Id,
    /// The result or the error.
    pub outcome: Outcome,
}

/// What a response carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The call succeeded with this value (which may be null).
    Result(Value),
    /// The call failed.
    Error(ErrorObject),
}

/// A JSON-RPC error object. Stack traces never go here; `data` carries
/// optional structured context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// See [`super::codes`].
    pub code: i64,
    /// One short sentence.
    pub message: String,
    /// Optional structured context. An explicit `null` is kept as
    /// `Some(Value::Null)`, distinct from an absent `data`, so a peer's
    /// error re-encodes exactly.
    #[serde(
        default,
        deserialize_with = "crate::code::serde_util::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub data: Option<Value>,
}

/// One JSON-RPC message.
#[derive(Clone, Debug, PartialEq)]
pub enum Envelope {
    /// A call with an id.
    Request(Request),
    /// A call without an id.
    Notification(Notification),
    /// An answer.
    Response(Response),
}

/// One frame of text: a single message or a batch. Each batch entry decodes
/// on its own; an entry that is not a valid message is the error response
/// to send for it.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A single message.
    Single(Envelope),
    /// A non-empty batch.
    Batch(Vec<Result<Envelope, Response>>),
}

impl ErrorObject {
    /// An error with the code's standard message and `reason` as `data`.
    pub fn with_reason(code: i64, reason: impl Into<String>) -> Self {
        Self {
            code,
            message: codes::message(code).unwrap_or("Server error").to_owned(),
            data: Some(Value::String(reason.into())),
        }
    }
}

impl Id {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Number(n) => Some(Self::Number(n.clone())),
            Value::String(s) => Some(Self::String(s.clone())),
            Value::Null => Some(Self::Null),
            _ => None,
        }
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Self {
        Self::Number(n.into())
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Self::String(s.to_owned())
    }
}

impl Response {
    /// A successful response.
    #[must_use]
    pub fn result(id: Id, result: Value) -> Self {
        Self {
            id,
            outcome: Outcome::Result(result),
        }
    }

    /// An error response.
    #[must_use]
    pub fn error(id: Id, error: ErrorObject) -> Self {
        Self {
            id,
            outcome: Outcome::Error(error),
        }
    }

    /// The error object, when this response is one.
    #[must_use]
    pub fn error_object(&self) -> Option<&ErrorObject> {
        match &self.outcome {
            Outcome::Error(error) => Some(error),
            Outcome::Result(_) => None,
        }
    }
}

impl Envelope {
    /// A request.
    pub fn request(id: impl Into<Id>, method: impl Into<String>, params: Option<Value>) -> Self {
        Self::Request(Request {
            id: id.into(),
            method: method.into(),
            params,
        })
    }

    /// A notification.
    pub fn notification(method: impl Into<String>, params: Option<Value>) -> Self {
        Self::Notification(Notification {
            method: method.into(),
            params,
        })
    }

    /// The envelope as a JSON value (keys sorted, as `Value` keeps them).
    #[must_use]
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self)
            .expect("an envelope is a map of JSON values and always serializes")
    }

    /// Reads one message from a parsed value.
    ///
    /// # Errors
    ///
    /// The −32600 error response to send, carrying the message's id when it
    /// could be read.
    pub fn from_value(value: &Value) -> Result<Self, Response> {
        Self::from_owned(value.clone())
    }

    /// Reads one message from a parsed value it takes, moving `params`,
    /// `result` and `error` out of it rather than copying them.
    ///
    /// # Errors
    ///
    /// As [`Envelope::from_value`].
    pub fn from_owned(value: Value) -> Result<Self, Response> {
        let Value::Object(mut object) = value else {
            return Err(invalid(Id::Null, "a message must be a JSON object"));
        };
        Self::from_parts(Parts {
            jsonrpc: Version(
                object.remove("jsonrpc").as_ref().and_then(Value::as_str) == Some("2.0"),
            ),
            id: object.remove("id"),
            method: object.remove("method"),
            params: object.remove("params"),
            result: object.remove("result"),
            error: object.remove("error"),
        })
    }

    /// The specification's rules, over the members a message may have: the
    /// one place they are written, whether the members came from a parsed
    /// `Value` or straight from the text.
    fn from_parts(parts: Parts) -> Result<Self, Response> {
        // The id, when readable, goes into the error response so the caller
        // can match it; anything unreadable answers with null, as the
        // specification says.
        let id = parts.id.as_ref().map(Id::from_value);
        let reply_id = id.clone().flatten().unwrap_or(Id::Null);
        if !parts.jsonrpc.0 {
            return Err(invalid(reply_id, "`jsonrpc` must be \"2.0\""));
        }
        if let Some(method) = parts.method {
            let answers = parts.result.is_some() || parts.error.is_some();
            return method_call(method, parts.params, answers, id, reply_id);
        }
        let Some(id) = id else {
            return Err(invalid(
                Id::Null,
                "a message needs `method`, or `id` with `result` or `error`",
            ));
        };
        let Some(id) = id else {
            return Err(invalid(Id::Null, "`id` must be a number, a string or null"));
        };
        match (parts.result, parts.error) {
            (Some(result), None) => Ok(Self::Response(Response::result(id, result))),
            (None, Some(error)) => match ErrorObject::deserialize(error) {
                Ok(error) => Ok(Self::Response(Response::error(id, error))),
                Err(_) => Err(invalid(
                    id,
                    "`error` must be an object with an integer `code` and a string `message`",
                )),
            },
            (Some(_), Some(_)) => Err(invalid(id, "a response has `result` or `error`, not both")),
            (None, None) => Err(invalid(
                id,
                "a message needs `method`, or `id` with `result` or `error`",
            )),
        }
    }
}

fn method_call(
    method: Value,
    params: Option<Value>,
    answers: bool,
    id: Option<Option<Id>>,
    reply_id: Id,
) -> Result<Envelope, Response> {
    let Value::String(method) = method else {
        return Err(invalid(reply_id, "`method` must be a string"));
    };
    if answers {
        return Err(invalid(
            reply_id,
            "a call cannot also carry `result` or `error`",
        ));
    }
    let params = match params {
        None => None,
        Some(params @ (Value::Object(_) | Value::Array(_))) => Some(params),
        Some(_) => return Err(invalid(reply_id, "`params` must be an object or an array")),
    };
    match id {
        None => Ok(Envelope::Notification(Notification { method, params })),
        Some(Some(id)) => Ok(Envelope::Request(Request { id, method, params })),
        Some(None) => Err(invalid(Id::Null, "`id` must be a number, a string or null")),
    }
}

fn invalid(id: Id, reason: &str) -> Response {
    Response::error(id, ErrorObject::with_reason(codes::INVALID_REQUEST, reason))
}

/// The members of a message the rules read: `jsonrpc` as whether it is
/// `"2.0"`, the others each kept as sent (an explicit `null` is
/// `Some(Value::Null)`); any other member is ignored.
#[derive(Deserialize)]
struct Parts {
    #[serde(default)]
    jsonrpc: Version,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    id: Option<Value>,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    method: Option<Value>,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    params: Option<Value>,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    result: Option<Value>,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    error: Option<Value>,
}

/// Whether a message's `jsonrpc` member is the string `"2.0"`, read
/// without keeping a copy: nothing else about it matters. Read from text,
/// anything but a string is refused, which sends the message down the
/// general path, where it is answered.
#[derive(Default)]
struct Version(bool);

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Version;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, version: &str) -> Result<Version, E> {
                Ok(Version(version == "2.0"))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

/// A call, the usual frame both ways (a client's requests, a server's
/// event notifications), read with nothing else allowed: any other member
/// (`result`, `error`) or a missing one refuses it at once, and the frame
/// takes the path that reads every member.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    jsonrpc: Version,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    id: Option<Value>,
    method: String,
    #[serde(default, deserialize_with = "crate::code::serde_util::present")]
    params: Option<Value>,
}

/// Decodes one frame of text: a message or a batch.
///
/// # Errors
///
/// The single error response to send: −32700 when the text is not JSON,
/// −32600 when a single message is invalid or a batch is empty.
pub fn decode(text: &str) -> Result<Frame, Response> {
    // A single object, the usual frame, is read straight into its members
    // without building the top-level map: first as a plain call (the
    // frame both ways on a busy connection, and the quickest reading),
    // then with every member the rules read. Anything else, and any
    // object the direct reads refuse (bad JSON, a repeated member, which a
    // `Value` resolves by keeping the last), takes the general path below;
    // all three give the same answer, and a property test holds them to
    // it.
    if text.trim_start().starts_with('{') {
        if let Ok(call) = serde_json::from_str::<Call>(text) {
            return Envelope::from_parts(Parts {
                jsonrpc: call.jsonrpc,
                id: call.id,
                method: Some(Value::String(call.method)),
                params: call.params,
                result: None,
                error: None,
            })
            .map(Frame::Single);
        }
        if let Ok(parts) = serde_json::from_str::<Parts>(text) {
            return Envelope::from_parts(parts).map(Frame::Single);
        }
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Response::error(
            Id::Null,
            ErrorObject::with_reason(codes::PARSE_ERROR, crate::code::serde_util::reason(&e)),
        )
    })?;
    match value {
        Value::Array(entries) if entries.is_empty() => {
            Err(invalid(Id::Null, "a batch must not be empty"))
        }
        Value::Array(entries) => Ok(Frame::Batch(
            entries.into_iter().map(Envelope::from_owned).collect(),
        )),
        single => Envelope::from_owned(single).map(Frame::Single),
    }
}

/// The answer to a batch: the responses in order, without the entries that
/// were notifications (`None`). `None` when nothing is left, in which case
/// the server sends nothing at all.
#[must_use]
pub fn batch_reply(replies: impl IntoIterator<Item = Option<Response>>) -> Option<Vec<Response>> {
    let replies: Vec<Response> = replies.into_iter().flatten().collect();
    (!replies.is_empty()).then_some(replies)
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Number(n) => n.serialize(serializer),
            Self::String(s) => serializer.serialize_str(s),
            Self::Null => serializer.serialize_unit(),
        }
    }
}

// Fields are written in the order the specification and the seed print
// them (`jsonrpc` first), so encoded frames are byte-identical to theirs.
impl Serialize for Envelope {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        match self {
            Self::Request(request) => {
                map.serialize_entry("id", &request.id)?;
                map.serialize_entry("method", &request.method)?;
                if let Some(params) = &request.params {
                    map.serialize_entry("params", params)?;
                }
            }
            Self::Notification(notification) => {
                map.serialize_entry("method", &notification.method)?;
                if let Some(params) = &notification.params {
                    map.serialize_entry("params", params)?;
                }
            }
            Self::Response(response) => write_response(&mut map, response)?,
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_owned(value).map_err(|response| {
            let reason = response
                .error_object()
                .and_then(|e| e.data.as_ref())
                .and_then(Value::as_str)
                .unwrap_or("invalid JSON-RPC message")
                .to_owned();
            serde::de::Error::custom(reason)
        })
    }
}

impl Serialize for Response {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        write_response(&mut map, self)?;
        map.end()
    }
}

/// The fields after `jsonrpc`, shared by a bare response and an enveloped
/// one so the two can never disagree on field order.
fn write_response<M: SerializeMap>(map: &mut M, response: &Response) -> Result<(), M::Error> {
    map.serialize_entry("id", &response.id)?;
    match &response.outcome {
        Outcome::Result(result) => map.serialize_entry("result", result),
        Outcome::Error(error) => map.serialize_entry("error", error),
    }
}
