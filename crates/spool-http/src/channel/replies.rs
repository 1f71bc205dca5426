//! The channel's replies and refusals: cancel's outcomes, a wrong method,
//! the guard's refusals and runtime errors in the channel's error body,
//! a request's credentials, and its log line.

use super::*;

/// The header that marks a reply to a retried `operation_id`: the saved
/// run, not a new turn.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The header that says a request's `Prefer: respond-async` was honoured.
pub const PREFERENCE_APPLIED: &str = "preference-applied";

/// Whether a request asked to be answered before its turn's boundary
/// (`Prefer: respond-async`, RFC 7240; several preferences may share the
/// header, or headers).
pub(super) fn prefers_async(headers: &http::HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .split(';')
                .next()
                .is_some_and(|name| name.trim().eq_ignore_ascii_case("respond-async"))
        })
}

/// A cancel's reply: 202 for `requested`, 200 for the no-op outcomes.
pub(super) fn cancel_reply(
    status: CancelStatus,
    run: Option<&RunId>,
    turn_id: Option<String>,
) -> Response<Body> {
    let code = StatusCode::from_u16(status.status()).unwrap_or(StatusCode::OK);
    body::json(
        code,
        &CancelReply {
            status,
            run_id: run.map(ToString::to_string),
            turn_id,
        },
    )
}

/// 405 `method_not_allowed`, with the `Allow` header listing `allowed`.
pub(super) fn method_not_allowed(
    method: &Method,
    path: &str,
    allowed: &[Method],
) -> Response<Body> {
    let mut reply = body::error(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {path}"),
    );
    let allow = allowed
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(value) = HeaderValue::from_str(&allow) {
        reply.headers_mut().insert(header::ALLOW, value);
    }
    reply
}

/// A request's credentials: its headers, and for a WebSocket handshake
/// without `Authorization` the token of a `spool.bearer.<token>`
/// subprotocol, as an `Authorization: Bearer` header would carry it.
pub(super) fn credentials(headers: &http::HeaderMap) -> Credentials {
    let mut pairs: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    if !headers.contains_key(header::AUTHORIZATION)
        && let Some(token) =
            spool_edge::tables::ws_protocols(headers).find_map(|p| p.strip_prefix(WS_BEARER_PREFIX))
    {
        pairs.push(("authorization".into(), format!("Bearer {token}")));
    }
    Credentials {
        headers: pairs,
        peer: None,
    }
}

/// A refusal of the guard, in the channel's error body. A file upload is
/// the seed's `files_unsupported`; a multipart type without its boundary
/// is not an upload at all, just a malformed header.
pub(crate) fn refused(refusal: &crate::guard::Refusal) -> Response<Body> {
    use crate::guard::Refusal;
    let code = match refusal {
        Refusal::Origin(_) => ErrorCode::OriginNotAllowed,
        Refusal::Host(_) => ErrorCode::HostNotAllowed,
        Refusal::MediaType(_) => ErrorCode::UnsupportedMediaType,
        Refusal::Upload(value) if !value.to_ascii_lowercase().contains("boundary=") => {
            return body::error(
                ErrorCode::BadRequest,
                "a multipart content type needs its boundary; runs take a JSON body",
            );
        }
        Refusal::Upload(_) => ErrorCode::FilesUnsupported,
    };
    body::error(code, refusal.message())
}

/// One request's log line, written when the request ends. A request whose
/// future is dropped before it has a reply lost its client (the server
/// drops it when the connection closes): that is logged as 499
/// `client_closed`, the seed's code for it. Its turn, detached, goes on.
pub(super) struct RequestLog {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) started: std::time::Instant,
    pub(super) status: Option<u16>,
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (method, path) = (&self.method, &self.path);
        match self.status {
            Some(status) => {
                tracing::info!(target: "spool::http", %method, path, status, millis, "request");
            }
            None => tracing::info!(
                target: "spool::http",
                %method,
                path,
                status = 499,
                code = ErrorCode::ClientClosed.as_str(),
                millis,
                "request: the client left before the reply"
            ),
        }
    }
}

/// How long a client is told to wait before retrying while the journal
/// cannot write: about the runtime's longest pause between probes.
pub(super) const JOURNAL_RETRY_AFTER_SECONDS: u64 = spool_runtime::PROBE_MAX.as_secs();

pub(crate) fn runtime_error(error: &RuntimeError) -> Response<Body> {
    let code = error_code(error.kind());
    match code {
        // Details go to the server's log, never the reply.
        ErrorCode::Internal => {
            tracing::error!(target: "spool::http", error = %error, "internal error");
            body::error(code, "internal error")
        }
        ErrorCode::JournalUnavailable => {
            tracing::warn!(target: "spool::http", error = %error, "the journal cannot write");
            let mut reply = body::error(
                code,
                "the journal cannot write now; nothing of this request was recorded. \
                 Runs resume by themselves once it can: retry later",
            );
            reply.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(JOURNAL_RETRY_AFTER_SECONDS),
            );
            reply
        }
        _ => body::error(code, error.to_string()),
    }
}
