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
    let client = match Client::new(&node_url(address)) {
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
        // This node checked the browser's origin already, and answers it
        // with the CORS headers: the node the command goes to serves
        // another node, not the page (it would see a foreign origin).
        if !HOP_BY_HOP.contains(name) && name != header::ORIGIN {
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

/// A node's advertised address as a client URL: a bare `HOST:PORT` (what
/// a TCP listener describes itself as) is spoken to over plain HTTP.
fn node_url(address: &str) -> String {
    if ["http://", "https://", "unix:"]
        .iter()
        .any(|scheme| address.starts_with(scheme))
    {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// The header a node shows the cluster's secret in when it asks another
/// node something for itself rather than for a client: a schedule's
/// firing handed to the node that drives its address's run.
pub const NODE_SECRET: HeaderName = HeaderName::from_static("spool-node-secret");

/// The route a handed-over firing is delivered through, under
/// `/spool/v1`: answered only to a caller showing the cluster's secret
/// ([`NODE_SECRET`]), to anyone else as a route that does not exist.
pub(crate) fn relayed_delivery(path: &str) -> Option<&str> {
    path.strip_prefix(spool_wire::http::BASE_PATH)?
        .strip_prefix("/schedules/")?
        .strip_suffix("/deliver")
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// Whether `headers` show the cluster's `secret`, compared in time that
/// does not depend on where they differ.
pub(crate) fn shows_secret(headers: &http::HeaderMap, secret: &str) -> bool {
    use sha2::{Digest, Sha256};
    let Some(shown) = headers.get(&NODE_SECRET) else {
        return false;
    };
    let shown: [u8; 32] = Sha256::digest(shown.as_bytes()).into();
    let secret: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    crate::token::constant_time_eq(&shown, &secret)
}

/// A schedule [`Relay`](spool_runtime::schedule::Relay) over HTTP: a
/// firing for a run another node drives goes to that node, at the address
/// it advertises, with the cluster's secret, and that node delivers it.
pub struct HttpRelay {
    placement: std::sync::Arc<dyn Placement>,
    secret: String,
}

impl HttpRelay {
    /// A relay that finds nodes through `placement` and shows `secret`
    /// (the cluster's, which every node's channel is given too).
    #[must_use]
    pub fn new(placement: std::sync::Arc<dyn Placement>, secret: impl Into<String>) -> Self {
        Self {
            placement,
            secret: secret.into(),
        }
    }
}

impl std::fmt::Debug for HttpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRelay").finish_non_exhaustive()
    }
}

impl spool_runtime::schedule::Relay for HttpRelay {
    fn deliver<'a>(
        &'a self,
        schedule: &'a str,
        run: &'a RunId,
        firing: &'a spool_journal::event::ScheduleFired,
    ) -> BoxFuture<'a, Result<Option<spool_journal::event::Delivery>, RuntimeError>> {
        Box::pin(async move {
            use spool_journal::event::Delivery;
            let Some(address) = self.placement.elsewhere(run).await? else {
                return Ok(None);
            };
            // Whether it was delivered is not known when the request could
            // not be made or its reply was lost: the firing stays in doubt,
            // and the recording node settles it later from the run's log.
            let in_doubt = |why: String| {
                RuntimeError::Journal(spool_journal::JournalError::storage(format!(
                    "the firing's message went to the node at {address}, which drives run {run}, and {why}: the firing stays in doubt until it is found delivered or delivered again"
                )))
            };
            let client = Client::new(&node_url(&address))
                .map_err(|e| in_doubt(format!("its address is not usable ({e})")))?;
            let body = serde_json::to_vec(firing).map_err(|e| in_doubt(e.to_string()))?;
            let mut request = Request::new(Full::new(Bytes::from(body)));
            *request.method_mut() = http::Method::POST;
            // A schedule's name is letters, digits, `-`, `_` and `.`: a
            // path segment as it is.
            *request.uri_mut() = format!(
                "{}/schedules/{schedule}/deliver",
                spool_wire::http::BASE_PATH
            )
            .parse()
            .map_err(|e: http::uri::InvalidUri| in_doubt(e.to_string()))?;
            let headers = request.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(FORWARDED, HeaderValue::from_static("1"));
            headers.insert(
                NODE_SECRET,
                HeaderValue::from_str(&self.secret)
                    .map_err(|e| in_doubt(format!("the secret is not a header value ({e})")))?,
            );
            let reply = client
                .send_request(request)
                .await
                .map_err(|e| in_doubt(format!("could not be reached ({e})")))?;
            match crate::client::decode::<Delivery>(reply).await {
                Ok(delivery) => Ok(Some(delivery)),
                Err(crate::ClientError::Reply {
                    status, message, ..
                }) if status < 500 => Ok(Some(Delivery::Failed {
                    error: format!(
                        "the node at {address}, which drives run {run}, refused it: {message}"
                    ),
                })),
                Err(error) => Err(in_doubt(format!("did not say what became of it ({error})"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_schedules_deliver_path_is_the_relayed_route() {
        assert_eq!(
            relayed_delivery("/spool/v1/schedules/report/deliver"),
            Some("report")
        );
        for other in [
            "/spool/v1/schedules//deliver",
            "/spool/v1/schedules/a/b/deliver",
            "/spool/v1/schedules/report/trigger",
            "/spool/v1/runs/report/deliver",
            "/schedules/report/deliver",
        ] {
            assert_eq!(relayed_delivery(other), None, "{other}");
        }
    }

    #[test]
    fn the_secret_is_shown_only_by_the_exact_value() {
        let mut headers = http::HeaderMap::new();
        assert!(!shows_secret(&headers, "s3cret"));
        headers.insert(NODE_SECRET, HeaderValue::from_static("s3cre"));
        assert!(!shows_secret(&headers, "s3cret"));
        headers.insert(NODE_SECRET, HeaderValue::from_static("s3cret"));
        assert!(shows_secret(&headers, "s3cret"));
    }
}
