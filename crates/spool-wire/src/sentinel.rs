//! The recorded sentinels (seed 004): how a suspension, a sleep and a tool
//! failure sit inside a journaled tool completion.
//!
//! Every tool intent in the journal is followed by exactly one completion.
//! Three outcomes are not plain output, so each is recorded *inside* the
//! completion's output as a one-key object under a reserved name:
//!
//! ```json
//! {"__spool_suspend": {"reason": "needs approval", "input_schema": {"type": "object"}}}
//! {"__spool_sleep": {"wake_at": "2026-08-14T09:00:00Z"}}
//! {"__spool_error": {"is_error": true, "kind": "handler", "message": "tool failed: reset", "attempts": 2}}
//! ```
//!
//! Recording the sleep as a completion (not an event instead of one) is what
//! lets a week-long sleep hold no idempotency claim and leave no dangling
//! intent: the completion settles the call, then `SleepStarted` follows.
//!
//! Decoding triggers only on an object with **exactly one key** equal to a
//! reserved name. Anything else (extra keys, the name nested deeper, the
//! name as a string) is ordinary output. A one-key object under a reserved
//! name whose body is wrong is neither: it is [`MalformedSentinel`], because
//! silently reading it as ordinary output would replay a different path.
//!
//! ```
//! use serde_json::json;
//! use spool_wire::sentinel::{Sentinel, Suspension};
//!
//! let parked = Sentinel::Suspend(Suspension::new("pick a region", json!({"type": "string"})));
//! let recorded = parked.encode();
//! assert_eq!(Sentinel::decode(&recorded).unwrap(), Some(parked));
//! assert_eq!(Sentinel::decode(&json!({"result": 1})).unwrap(), None);
//! ```

use serde::Deserialize;
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::code::string_enum;

/// The reserved key of a recorded suspension.
pub const SUSPEND_KEY: &str = "__spool_suspend";
/// The reserved key of a recorded sleep.
pub const SLEEP_KEY: &str = "__spool_sleep";
/// The reserved key of a recorded tool failure.
pub const ERROR_KEY: &str = "__spool_error";
/// All three reserved keys.
pub const RESERVED_KEYS: [&str; 3] = [SUSPEND_KEY, SLEEP_KEY, ERROR_KEY];

/// A tool outcome recorded inside a completion instead of plain output.
#[derive(Clone, Debug, PartialEq)]
pub enum Sentinel {
    /// The tool parked the run until someone (or something) answers.
    Suspend(Suspension),
    /// The tool parked the run until an instant.
    Sleep(Sleep),
    /// The tool call failed after its last attempt.
    Failure(ToolFailure),
}

/// What a suspended tool waits for.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspension {
    /// Why the run is parked, shown to whoever answers.
    pub reason: String,
    /// The JSON Schema the answer must satisfy.
    pub input_schema: Value,
    /// What the run waits on. Absent means a person (a gate); it is written
    /// only when the tool named one, so a gate's record stays the two-key
    /// body it has always been.
    pub kind: Option<SuspensionKind>,
}

string_enum! {
    /// What a suspension waits on, when it is not a person.
    pub enum SuspensionKind {
        /// A webhook or another program's signal.
        Signal = "signal",
    }
}

/// A recorded request to park until an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sleep {
    /// When the run wakes, in UTC.
    pub wake_at: OffsetDateTime,
}

/// A recorded tool failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFailure {
    /// Which layer of the dispatch failed.
    pub kind: FailureKind,
    /// The full error chain (see [`error_chain`]), never truncated here.
    pub message: String,
    /// How many times the call executed, retries included.
    pub attempts: u32,
}

string_enum! {
    /// The layer of the tool dispatch that failed: a layer, not an error
    /// variant, so the recorded strings stay a small stable set.
    pub enum FailureKind {
        /// The arguments did not match the tool's input schema; it never ran.
        InvalidInput = "invalid_input",
        /// The tool ran and its handler failed.
        Handler = "handler",
        /// The tool ran but its result could not be used.
        OutputSerialization = "output_serialization",
    }
}

/// A one-key object under a reserved name whose body is not what the name
/// promises.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed {key} sentinel: {message}")]
pub struct MalformedSentinel {
    /// The reserved key that was present.
    pub key: &'static str,
    /// What was wrong with its body.
    pub message: String,
}

impl Suspension {
    /// A suspension waiting on a person.
    pub fn new(reason: impl Into<String>, input_schema: Value) -> Self {
        Self {
            reason: reason.into(),
            input_schema,
            kind: None,
        }
    }

    /// The same suspension, waiting on a signal instead of a person.
    #[must_use]
    pub fn on_signal(mut self) -> Self {
        self.kind = Some(SuspensionKind::Signal);
        self
    }
}

impl Sleep {
    /// A sleep until `wake_at`, normalized to UTC.
    #[must_use]
    pub fn until(wake_at: OffsetDateTime) -> Self {
        Self {
            wake_at: wake_at.to_offset(time::UtcOffset::UTC),
        }
    }
}

impl ToolFailure {
    /// A failure whose message is the full chain of `error` and its sources.
    #[must_use]
    pub fn from_error(kind: FailureKind, error: &dyn std::error::Error, attempts: u32) -> Self {
        Self {
            kind,
            message: error_chain(error),
            attempts,
        }
    }
}

impl Sentinel {
    /// The completion output that records this outcome.
    #[must_use]
    pub fn encode(&self) -> Value {
        match self {
            Self::Suspend(suspension) => {
                let mut body = Map::new();
                body.insert("reason".into(), json!(suspension.reason));
                body.insert("input_schema".into(), suspension.input_schema.clone());
                if let Some(kind) = &suspension.kind {
                    body.insert("kind".into(), json!(kind.as_str()));
                }
                json!({ SUSPEND_KEY: body })
            }
            Self::Sleep(sleep) => json!({ SLEEP_KEY: { "wake_at": rfc3339_utc(sleep.wake_at) } }),
            Self::Failure(failure) => json!({
                ERROR_KEY: {
                    "is_error": true,
                    "kind": failure.kind.as_str(),
                    "message": failure.message,
                    "attempts": failure.attempts,
                }
            }),
        }
    }

    /// Reads a completion output: `Ok(None)` for ordinary output,
    /// `Ok(Some(_))` for a sentinel, and an error for a one-key object under
    /// a reserved name whose body is wrong.
    ///
    /// # Errors
    ///
    /// [`MalformedSentinel`] when the reserved key is present alone but its
    /// body does not decode.
    pub fn decode(output: &Value) -> Result<Option<Self>, MalformedSentinel> {
        let Some((key, body)) = reserved_entry(output) else {
            return Ok(None);
        };
        let malformed = |message: &str| MalformedSentinel {
            key,
            message: message.to_owned(),
        };
        let body = body
            .as_object()
            .ok_or_else(|| malformed("the body must be an object"))?;
        let sentinel = match key {
            SUSPEND_KEY => Self::Suspend(Suspension {
                reason: string_field(body, "reason")
                    .ok_or_else(|| malformed("`reason` must be a string"))?,
                input_schema: body
                    .get("input_schema")
                    .cloned()
                    .ok_or_else(|| malformed("`input_schema` is required"))?,
                // A null kind reads as absent: logs written before the key
                // existed may carry it that way.
                kind: match body.get("kind") {
                    None | Some(Value::Null) => None,
                    // A kind this version does not know names a wait it
                    // cannot keep: not a suspension it may replay.
                    Some(Value::String(kind)) => match SuspensionKind::parse(kind) {
                        known if known.is_known() => Some(known),
                        _ => return Err(malformed("`kind` must be `signal` when present")),
                    },
                    Some(_) => return Err(malformed("`kind` must be a string")),
                },
            }),
            SLEEP_KEY => {
                let text = string_field(body, "wake_at")
                    .ok_or_else(|| malformed("`wake_at` must be a string"))?;
                let wake_at = OffsetDateTime::parse(&text, &Rfc3339)
                    .map_err(|_| malformed("`wake_at` must be an RFC 3339 instant"))?;
                Self::Sleep(Sleep::until(wake_at))
            }
            _ => {
                if body.get("is_error") != Some(&Value::Bool(true)) {
                    return Err(malformed("`is_error` must be true"));
                }
                Self::Failure(ToolFailure {
                    kind: FailureKind::parse(
                        &string_field(body, "kind")
                            .ok_or_else(|| malformed("`kind` must be a string"))?,
                    ),
                    message: string_field(body, "message")
                        .ok_or_else(|| malformed("`message` must be a string"))?,
                    attempts: body
                        .get("attempts")
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            malformed("`attempts` must be an integer from 0 to 4294967295")
                        })?,
                })
            }
        };
        Ok(Some(sentinel))
    }

    /// Whether `output` claims a reserved name: a one-key object whose key is
    /// one of [`RESERVED_KEYS`], well-formed or not. A tool must not return
    /// such a value as ordinary output, or replay would misread it.
    #[must_use]
    pub fn is_reserved(output: &Value) -> bool {
        reserved_entry(output).is_some()
    }
}

/// A completion output read from its JSON text: a sentinel, or the ordinary
/// output it is.
#[derive(Clone, Debug, PartialEq)]
pub enum Recorded {
    /// A suspension, a sleep or a failure.
    Sentinel(Sentinel),
    /// Anything else, as parsed.
    Output(Value),
}

/// Why a completion output's text could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordedError {
    /// The text is not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// A one-key object under a reserved name whose body is wrong.
    #[error(transparent)]
    Malformed(#[from] MalformedSentinel),
}

impl Recorded {
    /// Reads a completion output from its text, with exactly the answers
    /// [`Sentinel::decode`] gives for the parsed value.
    ///
    /// ```
    /// use spool_wire::sentinel::{Recorded, Sentinel};
    ///
    /// let failed = r#"{"__spool_error": {"is_error": true, "kind": "handler", "message": "reset", "attempts": 2}}"#;
    /// assert!(matches!(Recorded::decode(failed), Ok(Recorded::Sentinel(Sentinel::Failure(_)))));
    /// assert_eq!(Recorded::decode(r#"{"rows": 3}"#), Ok(Recorded::Output(serde_json::json!({"rows": 3}))));
    /// ```
    ///
    /// # Errors
    ///
    /// [`RecordedError::NotJson`] for text that is not JSON, and
    /// [`RecordedError::Malformed`] as [`Sentinel::decode`] returns it.
    pub fn decode(text: &str) -> Result<Self, RecordedError> {
        // A well-formed sentinel is read straight into its fields, without
        // building a `Value` first. Whatever that direct read refuses
        // (ordinary output, a bad body, a repeated key) is parsed and read by
        // `Sentinel::decode`, which alone defines the answers; the direct
        // read accepts only what it would accept, and reads it the same.
        if let Ok(direct) = serde_json::from_str::<Direct>(text)
            && let Some(sentinel) = direct.into_sentinel()
        {
            return Ok(Self::Sentinel(sentinel));
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|e| RecordedError::NotJson(crate::code::serde_util::reason(&e)))?;
        Ok(match Sentinel::decode(&value)? {
            Some(sentinel) => Self::Sentinel(sentinel),
            None => Self::Output(value),
        })
    }
}

/// A sentinel as its text spells it: one key, a body of known fields.
#[derive(Deserialize)]
enum Direct {
    #[serde(rename = "__spool_suspend")]
    Suspend(Object<SuspendBody>),
    #[serde(rename = "__spool_sleep")]
    Sleep(Object<SleepBody>),
    #[serde(rename = "__spool_error")]
    Error(Object<ErrorBody>),
}

#[derive(Deserialize)]
struct SuspendBody {
    reason: String,
    input_schema: Value,
    #[serde(default)]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct SleepBody {
    wake_at: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    is_error: bool,
    kind: String,
    message: String,
    attempts: u32,
}

/// A body read only from a JSON object: derived structs also take an array
/// of their fields in order, which a recorded body never is.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Fields(std::marker::PhantomData))
    }
}

impl Direct {
    /// The sentinel, or `None` for what only the general reading can judge.
    fn into_sentinel(self) -> Option<Sentinel> {
        Some(match self {
            Self::Suspend(Object(body)) => Sentinel::Suspend(Suspension {
                reason: body.reason,
                input_schema: body.input_schema,
                // An unknown kind is the general reading's to refuse.
                kind: match body.kind.as_deref().map(SuspensionKind::parse) {
                    Some(kind) if !kind.is_known() => return None,
                    kind => kind,
                },
            }),
            Self::Sleep(Object(body)) => Sentinel::Sleep(Sleep::until(
                OffsetDateTime::parse(&body.wake_at, &Rfc3339).ok()?,
            )),
            Self::Error(Object(body)) => {
                if !body.is_error {
                    return None;
                }
                Sentinel::Failure(ToolFailure {
                    kind: FailureKind::parse(&body.kind),
                    message: body.message,
                    attempts: body.attempts,
                })
            }
        })
    }
}

/// The result a woken sleep hands back: the tool returned a deadline, not a
/// value, so the result is derived from the recorded instant and is the same
/// on every replay.
///
/// ```
/// use spool_wire::sentinel::slept_output;
/// let at = time::macros::datetime!(2026-08-14 11:00 +02:00);
/// assert_eq!(slept_output(at), serde_json::json!({"slept_until": "2026-08-14T09:00:00Z"}));
/// ```
#[must_use]
pub fn slept_output(wake_at: OffsetDateTime) -> Value {
    json!({ "slept_until": rfc3339_utc(wake_at) })
}

/// Joins an error's message with every `source()` below it, separated by
/// `": "`, so the recorded message keeps what `thiserror` spreads across a
/// chain.
///
/// ```
/// use spool_wire::sentinel::error_chain;
///
/// #[derive(Debug)]
/// struct Reset;
/// impl std::fmt::Display for Reset {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("connection reset") }
/// }
/// impl std::error::Error for Reset {}
///
/// #[derive(Debug)]
/// struct Fetch(Reset);
/// impl std::fmt::Display for Fetch {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("fetch failed") }
/// }
/// impl std::error::Error for Fetch {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
///
/// assert_eq!(error_chain(&Fetch(Reset)), "fetch failed: connection reset");
/// ```
#[must_use]
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        // io::Error and others repeat their source's text as their own; a
        // chain that says the same thing twice helps nobody.
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = inner.source();
    }
    message
}

/// The text a JSON value becomes when handed to a model: a string as its
/// bare text, anything else as canonical JSON, so the request that carries it
/// hashes the same on every replay.
///
/// ```
/// use serde_json::json;
/// use spool_wire::sentinel::content_string;
/// assert_eq!(content_string(&json!("plain")), "plain");
/// assert_eq!(content_string(&json!({"b": 1, "a": 2})), r#"{"a":2,"b":1}"#);
/// ```
#[must_use]
pub fn content_string(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => crate::canonical::canonical_json(other),
    }
}

/// Formats an instant as RFC 3339 in UTC, the form every recorded instant
/// takes.
pub(crate) fn rfc3339_utc(instant: OffsetDateTime) -> String {
    instant
        .to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .expect("a UTC instant within years 0000..=9999 always formats as RFC 3339")
}

fn reserved_entry(output: &Value) -> Option<(&'static str, &Value)> {
    let map = output.as_object()?;
    if map.len() != 1 {
        return None;
    }
    let (key, body) = map.iter().next()?;
    let key = RESERVED_KEYS.into_iter().find(|reserved| reserved == key)?;
    Some((key, body))
}

fn string_field(body: &Map<String, Value>, name: &str) -> Option<String> {
    body.get(name).and_then(Value::as_str).map(str::to_owned)
}
