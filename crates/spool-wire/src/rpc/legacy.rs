//! The legacy adapter (seed 001 §9, step 2): a client that still sends
//! `t`-discriminated messages keeps working on the same endpoint.
//!
//! `{"t":"run", ...}` maps to a `submit.run` request whose params are the
//! rest of the message, and back. Spool always answers in envelopes; only
//! the client's input is read both ways.

use serde_json::{Map, Value};

use super::{Envelope, Frame, Id, METHOD_SUBMIT_RUN, Request, Response, decode};

/// The id a legacy message gets: legacy messages carry none, and the one
/// reply a legacy client expects is the run's result.
pub const LEGACY_REQUEST_ID: i64 = 1;

/// Maps a legacy client message to an envelope; `None` when it is not one
/// the adapter knows (only `t: "run"` is).
///
/// ```
/// use serde_json::json;
/// use spool_wire::rpc::{envelope_to_legacy, legacy_to_envelope};
///
/// let legacy = json!({"t": "run", "tasks": ["build"]});
/// let envelope = legacy_to_envelope(&legacy).unwrap();
/// assert_eq!(envelope.to_value(), json!({"jsonrpc": "2.0", "id": 1, "method": "submit.run", "params": {"tasks": ["build"]}}));
/// assert_eq!(envelope_to_legacy(&envelope), Some(legacy));
/// ```
#[must_use]
pub fn legacy_to_envelope(message: &Value) -> Option<Envelope> {
    let object = message.as_object()?;
    if object.get("t").and_then(Value::as_str) != Some("run") {
        return None;
    }
    let params: Map<String, Value> = object
        .iter()
        .filter(|(k, _)| *k != "t")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(Envelope::Request(Request {
        id: Id::from(LEGACY_REQUEST_ID),
        method: METHOD_SUBMIT_RUN.to_owned(),
        params: Some(Value::Object(params)),
    }))
}

/// Maps a `submit.run` request back to the legacy client message; `None`
/// for anything else, or params that are not an object.
#[must_use]
pub fn envelope_to_legacy(envelope: &Envelope) -> Option<Value> {
    let Envelope::Request(request) = envelope else {
        return None;
    };
    if request.method != METHOD_SUBMIT_RUN {
        return None;
    }
    let mut message = Map::new();
    message.insert("t".to_owned(), Value::String("run".to_owned()));
    match &request.params {
        None => {}
        Some(Value::Object(params)) => {
            message.extend(params.iter().map(|(k, v)| (k.clone(), v.clone())))
        }
        Some(_) => return None,
    }
    Some(Value::Object(message))
}

/// Decodes a client frame that may be either shape: an object with `t`
/// and no `jsonrpc` is read as legacy, everything else as JSON-RPC.
///
/// # Errors
///
/// As [`decode`]; a legacy message of an unknown `t` is −32600.
pub fn decode_client(text: &str) -> Result<Frame, Response> {
    let legacy = serde_json::from_str::<Value>(text)
        .ok()
        .filter(|v| v.get("t").is_some() && v.get("jsonrpc").is_none());
    match legacy {
        Some(message) => legacy_to_envelope(&message)
            .map(Frame::Single)
            .ok_or_else(|| {
                Response::error(
                    Id::Null,
                    super::ErrorObject::with_reason(
                        super::codes::INVALID_REQUEST,
                        "unknown legacy message type",
                    ),
                )
            }),
        None => decode(text),
    }
}
