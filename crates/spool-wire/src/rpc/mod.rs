//! JSON-RPC 2.0 envelopes (seed 001): one envelope for every Spool wire
//! surface, carrying OpenTelemetry-LogRecord-shaped events.
//!
//! [`decode`] follows the JSON-RPC 2.0 specification: text that is not JSON
//! is a parse error (−32700); JSON that is not a valid request, and an empty
//! batch, are invalid requests (−32600); a batch decodes entry by entry, and
//! [`batch_reply`] leaves notifications out of the answer, sending nothing
//! when every entry was a notification.
//!
//! ```
//! use spool_wire::rpc::{self, Envelope, Frame, codes};
//!
//! let frame = rpc::decode(r#"{"jsonrpc":"2.0","id":1,"method":"state.snapshot"}"#).unwrap();
//! let Frame::Single(Envelope::Request(request)) = frame else { panic!("a request") };
//! assert_eq!(request.method, "state.snapshot");
//!
//! let refused = rpc::decode("{not json").unwrap_err();
//! assert_eq!(refused.error_object().map(|e| e.code), Some(codes::PARSE_ERROR));
//! ```

mod envelope;
mod event;
mod frame;
mod legacy;

pub use envelope::{
    Envelope, ErrorObject, Frame, Id, Notification, Outcome, Request, Response, batch_reply, decode,
};
pub use event::{Severity, WireEvent};
pub use frame::{SseFrame, encode_batch, encode_ndjson, encode_sse, encode_ws};
pub use legacy::{
    ClientFrame, LEGACY_REQUEST_ID, decode_client, decode_client_frame, envelope_to_legacy,
    legacy_to_envelope, server_to_legacy,
};

/// The wire protocol version reported by `/version`.
pub const WIRE_PROTOCOL_VERSION: &str = "1.0";

/// The running event stream: server → client `events.append` notifications.
pub const CHANNEL_EVENTS: &str = "spool:events";
/// The derived view-model: `state.snapshot` requests, `state.patch` notifications.
pub const CHANNEL_STATE: &str = "spool:state";
/// Typed inspector queries.
pub const CHANNEL_RPC: &str = "spool:rpc";
/// Driving a run: `submit.run`, streamed `events.append`, then the result.
pub const CHANNEL_SUBMIT: &str = "spool:submit";
/// The four channels, in the order `/version` lists them.
pub const CHANNELS: [&str; 4] = [CHANNEL_EVENTS, CHANNEL_STATE, CHANNEL_RPC, CHANNEL_SUBMIT];

/// A channel's name as Spool spells it: the seed's `vx:*` names are
/// aliases of Spool's `spool:*` ones, so a client written against the
/// seed subscribes unchanged; any other name is given back as it is.
///
/// ```
/// use spool_wire::rpc::{CHANNEL_EVENTS, canonical_channel};
/// assert_eq!(canonical_channel("vx:events"), CHANNEL_EVENTS);
/// assert_eq!(canonical_channel("spool:events"), CHANNEL_EVENTS);
/// assert_eq!(canonical_channel("other"), "other");
/// ```
#[must_use]
pub fn canonical_channel(name: &str) -> &str {
    match name.strip_prefix("vx:") {
        Some(rest) => CHANNELS
            .iter()
            .find(|channel| channel.strip_prefix("spool:") == Some(rest))
            .copied()
            .unwrap_or(name),
        None => name,
    }
}

/// Notification carrying one [`WireEvent`].
pub const METHOD_EVENTS_APPEND: &str = "events.append";
/// Request for the current run state.
pub const METHOD_STATE_SNAPSHOT: &str = "state.snapshot";
/// Notification carrying patches to the run state.
pub const METHOD_STATE_PATCH: &str = "state.patch";
/// Request that starts a run and answers with its result.
pub const METHOD_SUBMIT_RUN: &str = "submit.run";

/// JSON-RPC error codes: the specification's five, and Spool's own in the
/// implementation-defined range −32000..−32099.
pub mod codes {
    /// The text was not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON was not a valid request object (or was an empty batch).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The method's parameters were wrong.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// A clean user-facing failure, with no stack.
    pub const USER_ERROR: i64 = -32000;
    /// The hash named is unknown.
    pub const UNKNOWN_HASH: i64 = -32001;
    /// The run named does not exist.
    pub const RUN_NOT_FOUND: i64 = -32002;
    /// The caller is not authorized.
    pub const UNAUTHORIZED: i64 = -32003;
    /// The caller is rate limited.
    pub const RATE_LIMITED: i64 = -32004;

    /// Every code above, with the short name and message Spool uses for it.
    pub const ALL: [(i64, &str, &str); 10] = [
        (PARSE_ERROR, "parse_error", "Parse error"),
        (INVALID_REQUEST, "invalid_request", "Invalid Request"),
        (METHOD_NOT_FOUND, "method_not_found", "Method not found"),
        (INVALID_PARAMS, "invalid_params", "Invalid params"),
        (INTERNAL_ERROR, "internal_error", "Internal error"),
        (USER_ERROR, "user_error", "User error"),
        (UNKNOWN_HASH, "unknown_hash", "Unknown hash"),
        (RUN_NOT_FOUND, "run_not_found", "Run not found"),
        (UNAUTHORIZED, "unauthorized", "Unauthorized"),
        (RATE_LIMITED, "rate_limited", "Rate limited"),
    ];

    /// The standard message for a code Spool knows.
    #[must_use]
    pub fn message(code: i64) -> Option<&'static str> {
        ALL.iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, _, message)| *message)
    }

    /// Whether `code` is in the range the specification reserves for
    /// server (implementation-defined) errors.
    #[must_use]
    pub fn is_server_error(code: i64) -> bool {
        (-32099..=-32000).contains(&code)
    }
}

/// The `/version` handshake document.
///
/// ```
/// use spool_wire::rpc::VersionDocument;
/// let doc = VersionDocument::new("0.1.0", vec!["getRunState".into()]);
/// assert_eq!(doc.protocol, "1.0");
/// assert!(doc.is_compatible_with("1.3"));
/// assert!(!doc.is_compatible_with("2.0"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VersionDocument {
    /// The wire protocol version, `1.0`.
    pub protocol: String,
    /// The Spool release answering.
    pub spool: String,
    /// The channels this server serves.
    pub channels: Vec<String>,
    /// The RPC methods an inspector may call.
    pub rpc: Vec<String>,
}

impl VersionDocument {
    /// The document for this protocol version with all four channels.
    pub fn new(spool_version: impl Into<String>, rpc: Vec<String>) -> Self {
        Self {
            protocol: WIRE_PROTOCOL_VERSION.to_owned(),
            spool: spool_version.into(),
            channels: CHANNELS.iter().map(|c| (*c).to_owned()).collect(),
            rpc,
        }
    }

    /// Version-prefix matching: a `1.x` peer works with a `1.y` server.
    #[must_use]
    pub fn is_compatible_with(&self, peer_version: &str) -> bool {
        let major = |v: &str| v.split('.').next().map(str::to_owned);
        major(&self.protocol).is_some_and(|m| !m.is_empty() && Some(m) == major(peer_version))
    }
}
