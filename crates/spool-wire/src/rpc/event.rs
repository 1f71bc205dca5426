//! `WireEvent`: an event payload in OpenTelemetry LogRecord shape, so any
//! OTel pipeline reads Spool's events without a translation layer.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{Envelope, ErrorObject, METHOD_EVENTS_APPEND, codes};

/// One event, shaped as an OTel LogRecord.
///
/// ```
/// use spool_wire::rpc::{Severity, WireEvent};
///
/// let event = WireEvent::new("run:start", "0192f6a0-7c1e-7d1a-9f6b-1a2b3c4d5e6f", 1_767_225_600_000_000_000, "run started")
///     .with_attribute("cicd.pipeline.run.id", "0192f6a0-7c1e-7d1a-9f6b-1a2b3c4d5e6f");
/// let json = serde_json::to_string(&event).unwrap();
/// assert!(json.starts_with(r#"{"timeUnixNano":"1767225600000000000","severityNumber":9,"severityText":"info""#));
/// assert!(json.ends_with(r#""spool.kind":"run:start"}"#));
/// assert_eq!(WireEvent::from_value(serde_json::from_str(&json).unwrap()).unwrap(), event);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEvent {
    /// Wall-clock time in nanoseconds since the Unix epoch, written as a
    /// decimal string so JavaScript readers keep every digit.
    #[serde(with = "decimal")]
    pub time_unix_nano: u64,
    /// OTel severity, 1–24 (9 is INFO, the default).
    pub severity_number: Severity,
    /// A human label such as `info` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity_text: Option<String>,
    /// The human-readable rendering of the event.
    pub body: String,
    /// Structured, event-specific fields; OTel semantic-convention names
    /// where they exist, `spool.*` for Spool's own.
    pub attributes: Map<String, Value>,
    /// The run this event belongs to.
    pub trace_id: String,
    /// The turn or task this event is scoped to, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// What happened, under a namespaced key so OTel tooling leaves it be.
    #[serde(rename = "spool.kind")]
    pub kind: String,
}

/// An OTel severity number, 1 through 24.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Severity(u8);

impl Severity {
    /// TRACE.
    pub const TRACE: Self = Self(1);
    /// DEBUG.
    pub const DEBUG: Self = Self(5);
    /// INFO, the default.
    pub const INFO: Self = Self(9);
    /// WARN.
    pub const WARN: Self = Self(13);
    /// ERROR.
    pub const ERROR: Self = Self(17);
    /// FATAL.
    pub const FATAL: Self = Self(21);

    /// A severity, when `number` is within 1–24.
    #[must_use]
    pub fn new(number: u8) -> Option<Self> {
        (1..=24).contains(&number).then_some(Self(number))
    }

    /// The number.
    #[must_use]
    pub fn number(self) -> u8 {
        self.0
    }

    /// The lowercase label of the severity's range (`info` for 9–12, …).
    #[must_use]
    pub fn label(self) -> &'static str {
        match self.0 {
            1..=4 => "trace",
            5..=8 => "debug",
            9..=12 => "info",
            13..=16 => "warn",
            17..=20 => "error",
            _ => "fatal",
        }
    }
}

impl Serialize for Severity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.0)
    }
}

impl<'de> Deserialize<'de> for Severity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = u64::deserialize(deserializer)?;
        u8::try_from(number)
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("severityNumber {number} is outside 1-24"))
            })
    }
}

impl WireEvent {
    /// An INFO event with no attributes.
    pub fn new(
        kind: impl Into<String>,
        trace_id: impl Into<String>,
        time_unix_nano: u64,
        body: impl Into<String>,
    ) -> Self {
        Self {
            time_unix_nano,
            severity_number: Severity::INFO,
            severity_text: Some(Severity::INFO.label().to_owned()),
            body: body.into(),
            attributes: Map::new(),
            trace_id: trace_id.into(),
            span_id: None,
            kind: kind.into(),
        }
    }

    /// The same event at another severity, with its label.
    #[must_use]
    pub fn with_severity(mut self, severity: Severity) -> Self {
        self.severity_number = severity;
        self.severity_text = Some(severity.label().to_owned());
        self
    }

    /// The same event scoped to a span.
    #[must_use]
    pub fn with_span(mut self, span_id: impl Into<String>) -> Self {
        self.span_id = Some(span_id.into());
        self
    }

    /// The same event with one more attribute.
    #[must_use]
    pub fn with_attribute(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.attributes.insert(key.into(), value.into());
        self
    }

    /// The `events.append` notification carrying this event.
    #[must_use]
    pub fn to_notification(&self) -> Envelope {
        let params = serde_json::to_value(self)
            .expect("a wire event is a map of JSON values and always serializes");
        Envelope::notification(METHOD_EVENTS_APPEND, Some(params))
    }

    /// Reads an event from a parsed value.
    ///
    /// # Errors
    ///
    /// An invalid-params (−32602) error object saying which field is wrong.
    pub fn from_value(value: Value) -> Result<Self, ErrorObject> {
        if !value.is_object() {
            return Err(ErrorObject::with_reason(
                codes::INVALID_PARAMS,
                "a wire event must be a JSON object",
            ));
        }
        crate::code::serde_util::from_value(value)
            .map_err(|e| ErrorObject::with_reason(codes::INVALID_PARAMS, e))
    }
}

/// `u64` as a JSON decimal string.
mod decimal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(serde::de::Error::custom(
                "timeUnixNano must be a string of decimal digits",
            ));
        }
        text.parse().map_err(|_| {
            serde::de::Error::custom("timeUnixNano is too large for nanoseconds since 1970")
        })
    }
}
