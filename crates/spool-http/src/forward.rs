//! A command for a run another node drives, sent on to that node: on a
//! cluster any node answers any route, and the client sees the answer the
//! driving node gives, byte for byte.
//!
//! Why forward rather than append the command to the journal for the
//! owner to pick up: a command's reply depends on the driving node's
//! memory (a message answered at its turn's boundary, a cancel that stops
//! the turn in flight, a `run_active` refusal), so only that node can give
//! it; a journaled command would need a second protocol to carry the
//! reply back, and would put every command behind a poll. Reads (a run's
//! view, snapshot, stream, the listings) need no forwarding: every node
//! reads them from the shared journal.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use spool_journal::RunId;
use spool_runtime::{BoxFuture, RuntimeError};
use spool_wire::http::ErrorCode;

use crate::body::{self, Body};
use crate::client::Client;

/// Where a run is driven, for a channel on one node of several sharing a
/// journal (`spool serve --cluster` gives its channel the cluster's).
pub trait Placement: Send + Sync + 'static {
    /// The HTTP address (`http://HOST:PORT`, `HOST:PORT` or `unix:/PATH`) of the live
    /// node that drives `run`, when that is another node; `None` when this
    /// node drives it or nobody does (this node then takes it).
    fn elsewhere<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<String>, RuntimeError>>;
}

/// The header a forwarded request carries: a node never forwards a
/// request that has it, so two nodes that disagree about a run (its lease
/// moving between them) answer instead of sending it back and forth.
pub const FORWARDED: HeaderName = HeaderName::from_static("spool-forwarded");

/// How large a forwarded command's reply may be: replies are a run's
/// view, far below this; a peer sending more is not a Spool node.
const MAX_REPLY_BYTES: usize = 64 << 20;

/// Headers that belong to one connection, not to the request (RFC 9110
/// §7.6.1), and the length, which the forwarded body sets again.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::CONTENT_LENGTH,
    header::HOST,
];

/// Whether `request` came from another node.
pub(crate) fn forwarded(headers: &http::HeaderMap) -> bool {
    headers.contains_key(&FORWARDED)
}

/// Where `run` should be answered: `Some(address)` when another node
/// drives it. A placement that cannot tell (its database away) leaves the
/// command here, where the journal's fencing still refuses a write to a
/// run this node does not hold.
pub(crate) async fn holder(placement: &dyn Placement, run: &RunId) -> Option<String> {
    match placement.elsewhere(run).await {
        Ok(address) => address,
        Err(error) => {
            tracing::warn!(target: "spool::http", run = %run, %error, "could not tell which node drives the run; answering here");
            None
        }
    }
}

/// How often a forwarded command that is still waiting for its reply
/// checks that its run has not moved: a node that stops answering (paused,
/// cut off) loses its lease, and the command must not wait on it for ever.
const RECHECK: Duration = Duration::from_secs(2);

/// Sends the command (`parts` and its `bytes`) for `run` to the node at
/// `address` and returns that node's reply as it is. While it waits, it
/// checks every [`RECHECK`] that the node still drives the run; if the
/// run moved, the node stopped answering, and the client is told so
/// instead of waiting on it.
pub(crate) async fn forward(
    placement: &dyn Placement,
    run: &RunId,
    address: &str,
    parts: &http::request::Parts,
    bytes: Bytes,
) -> Response<Body> {
    let sent = send(address, parts, bytes);
    let moved = async {
        loop {
            tokio::time::sleep(RECHECK).await;
            match placement.elsewhere(run).await {
                Ok(Some(now)) if now == address => {}
                // Cannot tell: keep waiting for the reply.
                Err(_) => {}
                Ok(_) => return,
            }
        }
    };
    tokio::select! {
        reply = sent => reply,
        () = moved => node_unavailable(format!("the node at {address} stopped answering while it had this command, and the run has moved to another node: the command may or may not have been recorded; read the run before sending it again")),
    }
}

/// `503 node_unavailable` with `Retry-After: 1`.
fn node_unavailable(message: String) -> Response<Body> {
    let mut reply = body::error(ErrorCode::NodeUnavailable, message);
    reply
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    reply
}

async fn send(address: &str, parts: &http::request::Parts, bytes: Bytes) -> Response<Body> {
    let unavailable = |why: String| {
        node_unavailable(format!(
            "the node that drives this run, at {address}, {why}; retry shortly (if it has died, another node takes the run over within its lease time)"
        ))
    };
    // A bare `HOST:PORT` (what a TCP listener describes itself as) is
    // spoken to over plain HTTP.
    let url = if address.starts_with("http://") || address.starts_with("unix:") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    let client = match Client::new(&url) {
        Ok(client) => client,
        Err(error) => return unavailable(format!("has an address this node cannot use ({error})")),
    };
    let mut request = Request::new(Full::new(bytes));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), ToString::to_string)
        .parse()
        .unwrap_or_else(|_| parts.uri.clone());
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(name) {
            request.headers_mut().append(name.clone(), value.clone());
        }
    }
    request
        .headers_mut()
        .insert(FORWARDED, HeaderValue::from_static("1"));
    let reply = match client.send_request(request).await {
        Ok(reply) => reply,
        Err(error) => return unavailable(format!("could not be reached ({error})")),
    };
    let (mut head, incoming) = reply.into_parts();
    let bytes = match Limited::new(incoming, MAX_REPLY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => return unavailable(format!("broke off its reply ({error})")),
    };
    for name in HOP_BY_HOP {
        head.headers.remove(name);
    }
    Response::from_parts(head, Full::new(bytes).boxed())
}
