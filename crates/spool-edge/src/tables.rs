//! The tables every transport shares: a run as the HTTP channel's reply,
//! a runtime error's kind as the HTTP channel's code, the namespace of
//! HTTP addresses, the caller a transport proved, and the WebSocket
//! subprotocols. JSON-RPC carries the same reply and codes in its `data`,
//! so a client of both branches on one vocabulary.

use spool_journal::Principal;
use spool_runtime::{ErrorKind, RunView};
use spool_wire::http::{self as wire, ErrorCode, RunReply, Usage};

/// The namespace the addresses of the HTTP channel and of JSON-RPC live in
/// (one namespace: a run made through one is found through the other).
pub const HTTP_NAMESPACE: &str = "http";

/// The caller the authenticator proved, put in a mounted handler's
/// request extensions (`None`: no authenticator, or an unattributed
/// caller), so a host route (a transport mounted beside the channel) holds
/// callers to what the channel does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Authenticated(pub Option<Principal>);

/// The WebSocket subprotocol a browser offers with its token: a browser
/// cannot set `Authorization` on a WebSocket, and a token in the URL would
/// land in logs and history. The server chooses [`WS_PROTOCOL`] and never
/// echoes this one.
pub const WS_BEARER_PREFIX: &str = "spool.bearer.";

/// The WebSocket subprotocol the server chooses when it is offered.
pub const WS_PROTOCOL: &str = "spool.v1";

/// The subprotocols a WebSocket handshake offers (`Sec-WebSocket-Protocol`,
/// comma-separated, over one header or several), trimmed.
pub fn ws_protocols(headers: &http::HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// A run view as the channel's reply.
#[must_use]
pub fn reply(view: &RunView) -> RunReply {
    RunReply {
        run_id: view.run_id.to_string(),
        state: view.status.state().into(),
        turn_id: view.turn_id.as_ref().map(ToString::to_string),
        cursor: view.cursor.map(|s| s.0),
        response: view.response.clone(),
        suspend: view.suspend.as_ref().map(|s| wire::Suspend {
            kind: s.kind.into(),
            prompt: s.prompt.clone(),
            options: s.options.clone(),
            tool_call_id: s.call_id.clone(),
            turn_id: Some(s.turn_id.to_string()),
        }),
        usage: view.usage.map(|u| Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
        }),
    }
}

/// A deleted run's tombstone as the channel's reply to its deletion.
#[must_use]
pub fn deleted(tombstone: &spool_journal::store::Tombstone) -> wire::Deleted {
    wire::Deleted {
        run_id: tombstone.run_id.to_string(),
        deleted_at: tombstone
            .deleted_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        by: tombstone.by.clone(),
        reason: tombstone.reason.clone(),
        events: tombstone.events,
    }
}

/// Who a deletion names as its author: the proven caller's id, or
/// `anonymous` on a server without credentials.
#[must_use]
pub fn deleter(principal: Option<&Principal>) -> String {
    principal.map_or_else(|| "anonymous".to_owned(), |p| p.id.clone())
}

/// The channel's code for a runtime error's kind: the HTTP channel's half
/// of the runtime's error table.
#[must_use]
pub fn error_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::RunNotFound | ErrorKind::AddressNotFound => ErrorCode::RunNotFound,
        ErrorKind::TurnNotFound => ErrorCode::TurnNotFound,
        // The seed has no first-wins rule; a turn in progress is what
        // `run_active` says.
        ErrorKind::RunActive | ErrorKind::TurnInProgress => ErrorCode::RunActive,
        ErrorKind::RunWaiting => ErrorCode::RunWaiting,
        ErrorKind::RunNotWaiting => ErrorCode::RunNotWaiting,
        ErrorKind::RunRetired => ErrorCode::RunRetired,
        ErrorKind::RunDeleted => ErrorCode::RunDeleted,
        ErrorKind::RunTooLarge => ErrorCode::RunTooLarge,
        ErrorKind::InvalidAnswer | ErrorKind::BadRequest => ErrorCode::BadRequest,
        ErrorKind::CompactionUnsupported => ErrorCode::CompactionUnsupported,
        ErrorKind::EngineFailed => ErrorCode::EngineFailed,
        ErrorKind::ConversationCorrupt => ErrorCode::ConversationCorrupt,
        ErrorKind::OwnedElsewhere => ErrorCode::RunOwnedElsewhere,
        ErrorKind::Storage => ErrorCode::JournalUnavailable,
        ErrorKind::AddressTooLong => ErrorCode::AddressTooLong,
        ErrorKind::TitleTooLong => ErrorCode::TitleTooLong,
        ErrorKind::OperationIdTooLong => ErrorCode::OperationIdTooLong,
        // Kinds added later map to `internal` until the channel names them.
        ErrorKind::Internal | _ => ErrorCode::Internal,
    }
}
