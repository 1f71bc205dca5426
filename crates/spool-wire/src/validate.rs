//! Checks one message of a named kind and re-encodes it the way Spool
//! would send it: the logic behind `spool wire validate`, kept here so the
//! binary holds none of it and any program can check a peer's messages.
//!
//! ```
//! use spool_wire::validate::{Kind, validate};
//!
//! let ok = validate(Kind::PodMethod, r#"{"params": {"input": "hi"}, "method": "run"}"#).unwrap();
//! assert_eq!(ok, r#"{"method":"run","params":{"input":"hi"}}"#);
//!
//! let bad = validate(Kind::BusRequest, r#"{"fromInstance":"","prompt":"","depth":0}"#).unwrap_err();
//! assert_eq!(bad.code.as_deref(), Some("invalid_request"));
//! ```

use serde::Serialize;
use serde_json::Value;

use crate::{bus, http, pod, rpc, sentinel};

/// The kinds of message [`validate`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A bus `POST /api/talk` body.
    BusRequest,
    /// A bus response envelope.
    BusResponse,
    /// A JSON-RPC message or batch.
    Rpc,
    /// A JSON-RPC message, or a legacy `{"t": "run"}` client message.
    RpcClient,
    /// The `/version` document.
    RpcVersion,
    /// A `WireEvent` (the params of `events.append`).
    WireEvent,
    /// A Pod method line.
    PodMethod,
    /// A Pod event line.
    PodEvent,
    /// A tool completion output that must be a sentinel.
    Sentinel,
    /// A `POST /runs` body.
    HttpStart,
    /// A `POST /runs/{id}` body.
    HttpMessage,
    /// A `/respond` body.
    HttpRespond,
    /// A `/cancel` body.
    HttpCancel,
    /// A `/cancel` reply.
    HttpCancelReply,
    /// A `/reset` body.
    HttpReset,
    /// A run reply.
    HttpReply,
    /// A snapshot reply.
    HttpSnapshot,
    /// An address ensure or lookup reply.
    HttpAddressReply,
    /// One NDJSON stream event.
    HttpEvent,
    /// A non-2xx reply body.
    HttpError,
    /// The `/health` reply.
    HttpHealth,
    /// The `/info` reply.
    HttpInfo,
}

impl Kind {
    /// Every kind with its command-line name.
    pub const ALL: [(Self, &'static str); 22] = [
        (Self::BusRequest, "bus-request"),
        (Self::BusResponse, "bus-response"),
        (Self::Rpc, "rpc"),
        (Self::RpcClient, "rpc-client"),
        (Self::RpcVersion, "rpc-version"),
        (Self::WireEvent, "wire-event"),
        (Self::PodMethod, "pod-method"),
        (Self::PodEvent, "pod-event"),
        (Self::Sentinel, "sentinel"),
        (Self::HttpStart, "http-start"),
        (Self::HttpMessage, "http-message"),
        (Self::HttpRespond, "http-respond"),
        (Self::HttpCancel, "http-cancel"),
        (Self::HttpCancelReply, "http-cancel-reply"),
        (Self::HttpReset, "http-reset"),
        (Self::HttpReply, "http-reply"),
        (Self::HttpSnapshot, "http-snapshot"),
        (Self::HttpAddressReply, "http-address-reply"),
        (Self::HttpEvent, "http-event"),
        (Self::HttpError, "http-error"),
        (Self::HttpHealth, "http-health"),
        (Self::HttpInfo, "http-info"),
    ];

    /// The command-line name.
    #[must_use]
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(kind, _)| *kind == self)
            .map(|(_, name)| *name)
            .expect("every kind is listed in Kind::ALL")
    }

    /// The kind with this command-line name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(kind, _)| *kind)
    }
}

/// Why a message did not validate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// A sentence saying what is wrong.
    pub message: String,
    /// The protocol's code for it, when the protocol has one (JSON-RPC's
    /// integer codes are given in decimal).
    pub code: Option<String>,
}

impl Invalid {
    fn coded(code: impl ToString, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: Some(code.to_string()),
        }
    }
}

impl<C: std::fmt::Display> From<crate::code::Rejection<C>> for Invalid {
    fn from(rejection: crate::code::Rejection<C>) -> Self {
        Self::coded(rejection.code, rejection.message)
    }
}

/// Checks `text` as one message of `kind` and returns it re-encoded by
/// Spool, as compact JSON in the field order Spool writes.
///
/// # Errors
///
/// [`Invalid`] with the protocol's code when it has one.
pub fn validate(kind: Kind, text: &str) -> Result<String, Invalid> {
    match kind {
        Kind::BusRequest => Ok(encode(&bus::BusRequest::decode(text)?)),
        Kind::BusResponse => Ok(encode(&bus::BusResponse::decode(text)?)),
        Kind::Rpc => rpc_frame(rpc::decode(text)),
        Kind::RpcClient => rpc_frame(rpc::decode_client(text)),
        Kind::RpcVersion => plain::<rpc::VersionDocument>(text),
        Kind::WireEvent => {
            let value = crate::code::serde_util::parse(text)
                .map_err(|m| Invalid::coded(rpc::codes::PARSE_ERROR, m))?;
            rpc::WireEvent::from_value(value)
                .map(|event| encode(&event))
                .map_err(|e| Invalid::coded(e.code, reason_of(&e)))
        }
        Kind::PodMethod => Ok(encode(&pod::Method::decode(text)?)),
        Kind::PodEvent => Ok(encode(&pod::Event::decode(text)?)),
        Kind::Sentinel => {
            let value = crate::code::serde_util::parse(text).map_err(|message| Invalid {
                message,
                code: None,
            })?;
            match sentinel::Sentinel::decode(&value) {
                Ok(Some(sentinel)) => Ok(encode(&sentinel.encode())),
                Ok(None) => Err(Invalid {
                    message: format!(
                        "ordinary output, not a sentinel: a sentinel is an object with exactly one key of {}",
                        sentinel::RESERVED_KEYS.join(", ")
                    ),
                    code: None,
                }),
                Err(malformed) => Err(Invalid {
                    message: malformed.to_string(),
                    code: None,
                }),
            }
        }
        Kind::HttpStart => Ok(encode(&http::StartRun::decode(text)?)),
        Kind::HttpMessage => Ok(encode(&http::MessageRun::decode(text)?)),
        Kind::HttpRespond => Ok(encode(&http::Respond::decode(text)?)),
        Kind::HttpCancel => Ok(encode(&http::decode_body::<http::Cancel>(text)?)),
        Kind::HttpCancelReply => Ok(encode(&http::decode_body::<http::CancelReply>(text)?)),
        Kind::HttpReset => Ok(encode(&http::decode_body::<http::Reset>(text)?)),
        Kind::HttpReply => Ok(encode(&http::decode_body::<http::RunReply>(text)?)),
        Kind::HttpSnapshot => Ok(encode(&http::decode_body::<http::SnapshotReply>(text)?)),
        Kind::HttpAddressReply => Ok(encode(&http::decode_body::<http::AddressReply>(text)?)),
        Kind::HttpEvent => Ok(encode(&http::decode_body::<http::StreamEvent>(text)?)),
        Kind::HttpError => Ok(encode(&http::decode_body::<http::ErrorBody>(text)?)),
        Kind::HttpHealth => Ok(encode(&http::decode_body::<http::Health>(text)?)),
        Kind::HttpInfo => Ok(encode(&http::decode_body::<http::Info>(text)?)),
    }
}

fn rpc_frame(frame: Result<rpc::Frame, rpc::Response>) -> Result<String, Invalid> {
    let rejected = |response: &rpc::Response, at: Option<usize>| {
        let error = response.error_object();
        let code = error.map_or(rpc::codes::INVALID_REQUEST, |e| e.code);
        let reason = error.map(reason_of).unwrap_or_default();
        match at {
            Some(index) => Invalid::coded(code, format!("batch entry {index}: {reason}")),
            None => Invalid::coded(code, reason),
        }
    };
    match frame {
        Err(response) => Err(rejected(&response, None)),
        Ok(rpc::Frame::Single(envelope)) => Ok(rpc::encode_ws(&envelope)),
        Ok(rpc::Frame::Batch(entries)) => {
            let mut envelopes = Vec::with_capacity(entries.len());
            for (index, entry) in entries.into_iter().enumerate() {
                envelopes.push(entry.map_err(|response| rejected(&response, Some(index)))?);
            }
            Ok(rpc::encode_batch(&envelopes))
        }
    }
}

fn reason_of(error: &rpc::ErrorObject) -> String {
    match error.data.as_ref().and_then(Value::as_str) {
        Some(reason) => reason.to_owned(),
        None => error.message.clone(),
    }
}

/// A document with no protocol code of its own: any mismatch is simply
/// invalid.
fn plain<T: serde::de::DeserializeOwned + Serialize>(text: &str) -> Result<String, Invalid> {
    let value = crate::code::serde_util::parse(text).map_err(|message| Invalid {
        message,
        code: None,
    })?;
    crate::code::serde_util::from_value::<T>(value)
        .map(|doc| encode(&doc))
        .map_err(|message| Invalid {
            message,
            code: None,
        })
}

fn encode<T: Serialize>(message: &T) -> String {
    serde_json::to_string(message).expect("wire messages are plain JSON and always serialize")
}
