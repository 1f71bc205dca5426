//! Bus v1 (seed 000): one Spool instance delegating a prompt to another over
//! `POST /api/talk`.
//!
//! Requests are strict (the only extension point is `ext`), responses pass
//! unknown keys through, and both accept the legacy unversioned shapes.
//! Capability lists are additive: a capability this version does not know is
//! kept and ignored, never rejected (the seed's own reader rejected them,
//! breaking its own "additive" rule).
//!
//! ```
//! use spool_wire::bus::{BusRequest, BusResponse, ErrorCode};
//!
//! let request = BusRequest::decode(
//!     r#"{"fromInstance":"reviewer","prompt":"Check this","depth":1,"capabilities":["structured-errors","streaming"]}"#,
//! ).unwrap();
//! assert_eq!(request.version(), 1); // absent means the legacy v1 shape
//!
//! let reply = BusResponse::failure("worker", ErrorCode::BudgetExhausted, "Budget exhausted.", 12);
//! assert!(!reply.is_retryable());
//! assert_eq!(reply.protocol_version, Some(1));
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::code::serde_util::{self, present};
use crate::code::{Rejection, string_enum};

/// The bus protocol version this crate speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// The delegation endpoint.
pub const TALK_PATH: &str = "/api/talk";
/// The health endpoint.
pub const HEALTH_PATH: &str = "/api/health";
/// The largest request body a server reads (256 KiB); a larger one is
/// `request_too_large`.
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;
/// The depth limit when none is configured: `depth >= 3` is refused.
pub const DEFAULT_MAX_DEPTH: u64 = 3;

/// A delegation request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BusRequest {
    /// The calling instance; never empty.
    pub from_instance: String,
    /// The delegated prompt; may be empty.
    pub prompt: String,
    /// Hops so far; the caller increments it before sending.
    pub depth: u64,
    /// `1`, or absent on a legacy request (read as 1).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol_version: Option<u64>,
    /// What the caller implements.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub capabilities: Option<Vec<Capability>>,
    /// Free-form extensions: the one place a newer caller may add fields.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub ext: Option<Map<String, Value>>,
}

/// The response envelope, for success and failure alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BusResponse {
    /// Whether the delegation succeeded.
    pub success: bool,
    /// The answer; empty on failure. Absent in legacy failures.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub text: Option<String>,
    /// The answering instance.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub from_instance: Option<String>,
    /// A human-readable reason, surfaced as is by chat and CLI paths.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<String>,
    /// The stable code to branch on.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub error_code: Option<ErrorCode>,
    /// Whether the same delegation may be tried again without an operator.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub retryable: Option<bool>,
    /// How long the answer took.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub duration_ms: Option<u64>,
    /// `1` from a v1 server; absent in legacy responses.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol_version: Option<u64>,
    /// What the server implements.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub capabilities: Option<Vec<Capability>>,
    /// Keys this version does not know, passed through unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

string_enum! {
    /// A capability flag. Lists are additive; unknown flags are kept and
    /// ignored.
    pub enum Capability {
        /// Failures carry `errorCode`.
        StructuredErrors = "structured-errors",
        /// Failures carry `retryable`.
        RetryableErrors = "retryable-errors",
    }
}

string_enum! {
    /// The bus's stable, additive error codes.
    pub enum ErrorCode {
        /// The request did not parse or validate.
        InvalidRequest = "invalid_request",
        /// The request body was over the size cap.
        RequestTooLarge = "request_too_large",
        /// The target has no usable bus configuration.
        BusDisabled = "bus_disabled",
        /// The bearer secret did not match.
        AuthFailed = "auth_failed",
        /// The caller is not among the target's peers.
        PeerNotAllowed = "peer_not_allowed",
        /// `depth` reached the limit.
        MaxDepthExceeded = "max_depth_exceeded",
        /// The target's handler produced a result that failed validation.
        InvalidHandlerResponse = "invalid_handler_response",
        /// The target failed unexpectedly.
        InternalError = "internal_error",
        /// The target could not be reached.
        InstanceUnavailable = "instance_unavailable",
        /// The target's reply was not a valid envelope.
        InvalidResponse = "invalid_response",
        /// The call did not finish in time.
        Timeout = "timeout",
        /// The target itself is over budget (not the caller).
        BudgetExhausted = "budget_exhausted",
        /// The target could not authenticate its own model provider.
        Auth = "auth",
        /// The target lacks permission to write.
        WritePermission = "write_permission",
        /// A chat-delivery conflict at the target.
        TelegramConflict = "telegram_conflict",
        /// A chat-delivery failure at the target.
        TelegramDelivery = "telegram_delivery",
        /// The target's engine command failed.
        EngineCli = "engine_cli",
        /// A file workflow failed at the target.
        FileWorkflow = "file_workflow",
        /// A workflow was in the wrong state.
        WorkflowState = "workflow_state",
        /// A session was in the wrong state.
        SessionState = "session_state",
        /// The failure could not be classified (the literal code `unknown`).
        Unclassified = "unknown",
        /// The request carries an `Origin` (a web page's); the bus serves
        /// other instances, never browsers. Spool's addition.
        OriginNotAllowed = "origin_not_allowed",
        /// The request's `Host` is not a loopback name (DNS rebinding).
        /// Spool's addition.
        HostNotAllowed = "host_not_allowed",
        /// The body is not declared JSON. Spool's addition.
        UnsupportedMediaType = "unsupported_media_type",
    }
}

impl ErrorCode {
    /// Whether a caller may reasonably try the same delegation again without
    /// operator action, by the seed's table.
    ///
    /// A code this version does not know is not retryable: retrying what we
    /// cannot classify risks repeating a permanent failure forever, and a v1
    /// server always states `retryable` explicitly anyway.
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            Self::InvalidRequest
            | Self::RequestTooLarge
            | Self::BusDisabled
            | Self::AuthFailed
            | Self::PeerNotAllowed
            | Self::MaxDepthExceeded
            | Self::BudgetExhausted
            | Self::Auth
            | Self::WritePermission
            | Self::FileWorkflow
            | Self::WorkflowState
            | Self::SessionState
            | Self::OriginNotAllowed
            | Self::HostNotAllowed
            | Self::UnsupportedMediaType
            | Self::Unknown(_) => false,
            Self::InvalidHandlerResponse
            | Self::InternalError
            | Self::InstanceUnavailable
            | Self::InvalidResponse
            | Self::Timeout
            | Self::TelegramConflict
            | Self::TelegramDelivery
            | Self::EngineCli
            | Self::Unclassified => true,
        }
    }

    /// The HTTP status a bus server answers with when it refuses a request
    /// before its handler runs; `None` for codes that come back as a 200
    /// with `success: false`.
    #[must_use]
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::InvalidRequest => Some(400),
            Self::AuthFailed => Some(401),
            Self::BusDisabled
            | Self::PeerNotAllowed
            | Self::OriginNotAllowed
            | Self::HostNotAllowed => Some(403),
            Self::RequestTooLarge => Some(413),
            Self::UnsupportedMediaType => Some(415),
            Self::MaxDepthExceeded => Some(429),
            Self::InvalidHandlerResponse | Self::InternalError => Some(500),
            _ => None,
        }
    }
}

/// Why a bus message was refused; `code` is always a bus code.
pub type BusRejection = Rejection<ErrorCode>;

/// The capabilities this crate implements and stamps on every response.
#[must_use]
pub fn capabilities() -> Vec<Capability> {
    vec![Capability::StructuredErrors, Capability::RetryableErrors]
}

impl BusRequest {
    /// A v1 request from `from_instance` at `depth`, stamped with the version
    /// and capabilities.
    pub fn new(from_instance: impl Into<String>, prompt: impl Into<String>, depth: u64) -> Self {
        Self {
            from_instance: from_instance.into(),
            prompt: prompt.into(),
            depth,
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: Some(capabilities()),
            ext: None,
        }
    }

    /// Parses and validates a request body.
    ///
    /// # Errors
    ///
    /// `invalid_request` when the text is not JSON, a field is missing or of
    /// the wrong type, a top-level key is unknown, `fromInstance` is empty,
    /// or `protocolVersion` is anything but 1.
    pub fn decode(text: &str) -> Result<Self, BusRejection> {
        serde_util::object_from_str::<Self>(text)
            .map_err(|e| BusRejection::new(ErrorCode::InvalidRequest, e))?
            .checked()
    }

    /// Validates an already-parsed request body.
    ///
    /// # Errors
    ///
    /// As [`BusRequest::decode`].
    pub fn from_value(value: Value) -> Result<Self, BusRejection> {
        if !value.is_object() {
            return Err(BusRejection::new(
                ErrorCode::InvalidRequest,
                "the request must be a JSON object",
            ));
        }
        serde_util::from_value::<Self>(value)
            .map_err(|e| BusRejection::new(ErrorCode::InvalidRequest, e))?
            .checked()
    }

    /// The rules serde cannot state: a non-empty `fromInstance`, version 1.
    fn checked(self) -> Result<Self, BusRejection> {
        let request = self;
        if request.from_instance.is_empty() {
            return Err(BusRejection::new(
                ErrorCode::InvalidRequest,
                "`fromInstance` must not be empty",
            ));
        }
        if let Some(version) = request.protocol_version
            && version != PROTOCOL_VERSION
        {
            return Err(BusRejection::new(
                ErrorCode::InvalidRequest,
                format!("unsupported `protocolVersion` {version}; this server speaks 1"),
            ));
        }
        Ok(request)
    }

    /// The protocol version: the stated one, or 1 for a legacy request.
    #[must_use]
    pub fn version(&self) -> u64 {
        self.protocol_version.unwrap_or(PROTOCOL_VERSION)
    }

    /// Whether the caller advertised `capability`.
    #[must_use]
    pub fn has_capability(&self, capability: &Capability) -> bool {
        self.capabilities
            .as_ref()
            .is_some_and(|list| list.contains(capability))
    }
}

impl BusResponse {
    /// A v1 success envelope.
    pub fn success(
        from_instance: impl Into<String>,
        text: impl Into<String>,
        duration_ms: u64,
    ) -> Self {
        Self {
            success: true,
            text: Some(text.into()),
            from_instance: Some(from_instance.into()),
            error: None,
            error_code: None,
            retryable: None,
            duration_ms: Some(duration_ms),
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: Some(capabilities()),
            extra: Map::new(),
        }
    }

    /// A v1 failure envelope with the code's default `retryable`.
    pub fn failure(
        from_instance: impl Into<String>,
        code: ErrorCode,
        error: impl Into<String>,
        duration_ms: u64,
    ) -> Self {
        Self {
            success: false,
            text: Some(String::new()),
            from_instance: Some(from_instance.into()),
            error: Some(error.into()),
            retryable: Some(code.retryable()),
            error_code: Some(code),
            duration_ms: Some(duration_ms),
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: Some(capabilities()),
            extra: Map::new(),
        }
    }

    /// Parses a response body, accepting the legacy shapes (success without a
    /// version; failure with only `success: false` and `error`).
    ///
    /// # Errors
    ///
    /// `invalid_response` when the text is not a JSON object with a boolean
    /// `success`, a known field has the wrong type, or `protocolVersion` is
    /// present and not 1.
    pub fn decode(text: &str) -> Result<Self, BusRejection> {
        serde_util::object_from_str::<Self>(text)
            .map_err(|e| BusRejection::new(ErrorCode::InvalidResponse, e))?
            .checked()
    }

    /// Validates an already-parsed response body.
    ///
    /// # Errors
    ///
    /// As [`BusResponse::decode`].
    pub fn from_value(value: Value) -> Result<Self, BusRejection> {
        if !value.is_object() {
            return Err(BusRejection::new(
                ErrorCode::InvalidResponse,
                "the response must be a JSON object",
            ));
        }
        serde_util::from_value::<Self>(value)
            .map_err(|e| BusRejection::new(ErrorCode::InvalidResponse, e))?
            .checked()
    }

    /// The rule serde cannot state: a stated version is 1.
    fn checked(self) -> Result<Self, BusRejection> {
        let response = self;
        if let Some(version) = response.protocol_version
            && version != PROTOCOL_VERSION
        {
            return Err(BusRejection::new(
                ErrorCode::InvalidResponse,
                format!("unsupported `protocolVersion` {version}"),
            ));
        }
        Ok(response)
    }

    /// The answer text; empty when absent.
    #[must_use]
    pub fn text(&self) -> &str {
        self.text.as_deref().unwrap_or("")
    }

    /// The failure's code: the stated one, or `unknown` for a failure that
    /// names none (a legacy failure). `None` on success.
    #[must_use]
    pub fn code(&self) -> Option<ErrorCode> {
        if self.success {
            return None;
        }
        Some(self.error_code.clone().unwrap_or(ErrorCode::Unclassified))
    }

    /// Whether the caller may try again: the response's explicit `retryable`
    /// wins, else the code's default. A success is never "retryable".
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match (self.retryable, self.code()) {
            (_, None) => false,
            (Some(explicit), Some(_)) => explicit,
            (None, Some(code)) => code.retryable(),
        }
    }
}
