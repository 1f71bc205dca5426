//! The HTTP listener's framings of JSON-RPC, mounted beside the HTTP
//! channel on the same listener and behind the same authenticator:
//!
//! - `GET /version`: the version document;
//! - `GET /events?run_id=…&cursor=…&channels=…`: `text/event-stream`,
//!   each `events.append` and `state.patch` as `id: <cursor>` and `data:
//!   <envelope>`; a reconnect with `Last-Event-ID` resumes after that
//!   position;
//! - `GET /stream?run_id=…&cursor=…&channels=…`: `application/x-ndjson`,
//!   one envelope per line.
//!
//! Both streams are one `subscribe` of a [`Connection`](crate::Connection) whose outbox is
//! written to the response as it comes; the client going away ends it.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;
use spool_edge::body::{self, Body, ChannelBody};
use spool_edge::server::Handler;
use spool_edge::tables::Authenticated;
use spool_wire::http::ErrorCode;
use tokio::sync::watch;

use crate::dispatch::{Dispatcher, Outgoing};

/// How many framed messages a stream's body holds before the connection's
/// outbox waits (and, past that, its subscription lags).
const BODY_QUEUE: usize = 64;

/// The four routes (`/ws` from [`crate::ws`]), as `(prefix, handler)` pairs to mount on the HTTP
/// channel (`HttpChannel::mount`). `closing` turning true ends open
/// streams (the server's graceful shutdown), as the channel's own do.
#[must_use]
pub fn routes(
    dispatcher: &Dispatcher,
    closing: &watch::Receiver<bool>,
) -> Vec<(&'static str, Handler)> {
    let version: Handler = Arc::new(|request: Request<Incoming>| {
        Box::pin(async move {
            if request.method() != Method::GET {
                return body::error(ErrorCode::MethodNotAllowed, "`/version` takes GET");
            }
            body::json(StatusCode::OK, &crate::capabilities())
        })
    });
    let stream = |framing: Framing| -> Handler {
        let dispatcher = dispatcher.clone();
        let closing = closing.clone();
        Arc::new(move |request: Request<Incoming>| {
            let dispatcher = dispatcher.clone();
            let closing = closing.clone();
            Box::pin(async move { open(&dispatcher, &request, framing, closing).await })
        })
    };
    vec![
        ("/version", version),
        ("/events", stream(Framing::Sse)),
        ("/stream", stream(Framing::Ndjson)),
        ("/ws", crate::ws::route(dispatcher, closing)),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Sse,
    Ndjson,
}

async fn open(
    dispatcher: &Dispatcher,
    request: &Request<Incoming>,
    framing: Framing,
    mut closing: watch::Receiver<bool>,
) -> Response<Body> {
    if request.method() != Method::GET {
        return body::error(ErrorCode::MethodNotAllowed, "event streams take GET");
    }
    let query = request.uri().query().unwrap_or_default();
    let mut run_id = None;
    let mut cursor = None;
    let mut channels = None;
    for (name, value) in query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
    {
        let Ok(value) = percent_encoding::percent_decode_str(value).decode_utf8() else {
            return body::error(
                ErrorCode::BadRequest,
                format!("`{name}` is not UTF-8 once decoded"),
            );
        };
        let value = value.into_owned();
        let slot = match name {
            "run_id" => &mut run_id,
            "cursor" => &mut cursor,
            "channels" => &mut channels,
            other => {
                return body::error(
                    ErrorCode::BadRequest,
                    format!(
                        "unknown parameter `{other}`; the stream takes run_id, cursor and channels"
                    ),
                );
            }
        };
        if slot.replace(value).is_some() {
            return body::error(ErrorCode::BadRequest, format!("`{name}` is given twice"));
        }
    }
    let Some(run_id) = run_id else {
        return body::error(ErrorCode::BadRequest, "`run_id` is required");
    };
    // A reconnecting SSE client says where it was.
    // A header used as data is refused when it is not text, never
    // skipped: a client that sent a position must not be served another.
    let resume = match request.headers().get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(id)) => Some(id.to_owned()),
        Some(Err(_)) => {
            return body::error(ErrorCode::BadRequest, "`Last-Event-ID` is not ASCII text");
        }
    };
    let cursor = match resume.or(cursor).map(|c| c.parse::<u64>()) {
        None => None,
        Some(Ok(cursor)) => Some(cursor),
        Some(Err(_)) => {
            return body::error(
                ErrorCode::BadRequest,
                "`cursor` must be a non-negative integer",
            );
        }
    };
    let channels: Option<Vec<String>> = channels.map(|c| c.split(',').map(str::to_owned).collect());
    let principal = request
        .extensions()
        .get::<Authenticated>()
        .and_then(|caller| caller.0.clone());
    // The caller's session ends the stream too: a revoked token's streams
    // end within the token file's reload period.
    if let Some(session) = request.extensions().get::<spool_edge::session::Session>() {
        closing = session.ending();
    }
    let (connection, mut outgoing) = dispatcher.connect(principal);
    let subscribed = connection
        .request(
            "subscribe",
            json!({"run_id": run_id, "cursor": cursor, "channels": channels}),
        )
        .await;
    if let Err(error) = subscribed {
        connection.close().await;
        let code = error
            .data
            .as_ref()
            .and_then(|d| d["code"].as_str())
            .map_or(ErrorCode::BadRequest, ErrorCode::parse);
        return body::error(
            code,
            error
                .data
                .and_then(|d| d["reason"].as_str().map(str::to_owned))
                .unwrap_or(error.message),
        );
    }
    let (sender, channel_body) = ChannelBody::new(BODY_QUEUE);
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                message = outgoing.recv() => message,
                _ = closing.wait_for(|closing| *closing) => None,
            };
            let Some(message) = message else { break };
            let text = message.to_bytes();
            let mut framed = Vec::with_capacity(text.len() + 32);
            match (framing, &message) {
                (Framing::Sse, Outgoing::Event { cursor, .. }) => {
                    framed.extend_from_slice(format!("id: {cursor}\ndata: ").as_bytes());
                }
                (Framing::Sse, _) => framed.extend_from_slice(b"data: "),
                (Framing::Ndjson, _) => {}
            }
            framed.extend_from_slice(&text);
            framed.extend_from_slice(if framing == Framing::Sse {
                b"\n\n"
            } else {
                b"\n"
            });
            if sender.send(Bytes::from(framed)).await.is_err() {
                // The client went away.
                break;
            }
        }
        // Sends fail from here on, so nothing waits on this outbox while
        // the subscription stops.
        drop(outgoing);
        connection.close().await;
    });
    let mut response = Response::new(http_body_util::BodyExt::boxed(channel_body));
    let content_type = match framing {
        Framing::Sse => "text/event-stream",
        Framing::Ndjson => spool_wire::http::NDJSON_CONTENT_TYPE,
    };
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
