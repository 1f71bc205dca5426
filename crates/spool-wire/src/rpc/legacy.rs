//! The legacy adapter (seed 001 §9, step 2): a client that still sends
//! `t`-discriminated messages keeps working on the same endpoint.
//!
//! `{"t":"run", ...}` maps to a `submit.run` request whose params are the
//! rest of the message, and back. What a server sends for such a request
//! maps to the legacy server messages: `{"t":"event"}` for each of its
//! `events.append`, then `{"t":"result"}` or `{"t":"error"}`, each with the
//! request's id, so a client running several at once on one connection
//! tells them apart (the seed's adapter gave every legacy request id 1 and
//! every answer id 0, so two of them collided).

use serde_json::{Map, Value, json};

use super::{
    Envelope, Frame, Id, METHOD_EVENTS_APPEND, METHOD_SUBMIT_RUN, Outcome, Request, Response,
    decode,
};

/// The id [`legacy_to_envelope`] gives a legacy message, which carries
/// none. A server running several legacy requests on one connection gives
/// each its own (see [`server_to_legacy`]).
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

/// What a legacy client is sent for `envelope`, an envelope a server sends
/// about the legacy request `request`: its `events.append` as
/// `{"t":"event","id","event"}`, its answer as `{"t":"result","id","result"}`
/// or `{"t":"error","id","error"}`. `None` for anything else.
///
/// ```
/// use serde_json::json;
/// use spool_wire::rpc::{Envelope, Id, Response, server_to_legacy};
///
/// let id = Id::from("legacy-2");
/// let answer = Envelope::Response(Response::result(id.clone(), json!({"state": "completed"})));
/// assert_eq!(
///     server_to_legacy(&answer, &id),
///     Some(json!({"t": "result", "id": "legacy-2", "result": {"state": "completed"}}))
/// );
/// ```
#[must_use]
pub fn server_to_legacy(envelope: &Envelope, request: &Id) -> Option<Value> {
    match envelope {
        Envelope::Notification(notification) if notification.method == METHOD_EVENTS_APPEND => {
            Some(json!({"t": "event", "id": request, "event": notification.params}))
        }
        Envelope::Response(response) => Some(match &response.outcome {
            Outcome::Result(result) => json!({"t": "result", "id": response.id, "result": result}),
            Outcome::Error(error) => json!({"t": "error", "id": response.id, "error": error}),
        }),
        _ => None,
    }
}

/// A client message read either way.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientFrame {
    /// A JSON-RPC envelope or batch.
    Rpc(Frame),
    /// A legacy message, as the request it maps to (with
    /// [`LEGACY_REQUEST_ID`]; a server gives it an id of its own).
    Legacy(Request),
}

/// Decodes a client frame that may be either shape: an object with `t`
/// and no `jsonrpc` is read as legacy, everything else as JSON-RPC.
///
/// # Errors
///
/// As [`decode`]; a legacy message of an unknown `t` is −32600.
pub fn decode_client(text: &str) -> Result<Frame, Response> {
    decode_client_frame(text).map(|frame| match frame {
        ClientFrame::Rpc(frame) => frame,
        ClientFrame::Legacy(request) => Frame::Single(Envelope::Request(request)),
    })
}

/// [`decode_client`], saying which shape the message was.
///
/// # Errors
///
/// As [`decode_client`].
pub fn decode_client_frame(text: &str) -> Result<ClientFrame, Response> {
    let legacy = serde_json::from_str::<Value>(text)
        .ok()
        .filter(|v| v.get("t").is_some() && v.get("jsonrpc").is_none());
    match legacy {
        Some(message) => legacy_to_envelope(&message)
            .and_then(|envelope| match envelope {
                Envelope::Request(request) => Some(ClientFrame::Legacy(request)),
                _ => None,
            })
            .ok_or_else(|| {
                Response::error(
                    Id::Null,
                    super::ErrorObject::with_reason(
                        super::codes::INVALID_REQUEST,
                        "unknown legacy message type",
                    ),
                )
            }),
        None => decode(text).map(ClientFrame::Rpc),
    }
}
