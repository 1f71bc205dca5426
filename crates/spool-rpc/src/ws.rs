//! `GET /ws`: JSON-RPC over a WebSocket, both ways on one connection, one
//! envelope per text message. The HTTP channel's server answers the
//! handshake and hands the connection over (hyper's upgrade); behind the
//! channel's authenticator, as every mounted route is.
//!
//! Limits: a message or frame over 1 MiB ends the session (the WebSocket
//! close code says so); a binary message is answered −32600 and the
//! session goes on; pings are answered by the WebSocket layer, one pending
//! pong at a time, so a ping flood costs nothing that grows; a client that
//! stops reading for [`WRITE_TIMEOUT`] is dropped; the server's shutdown
//! closes the session.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use spool_http::body::{self, Body};
use spool_http::channel::Authenticated;
use spool_http::server::Handler;
use spool_wire::http::ErrorCode;
use spool_wire::line::DEFAULT_MAX_LINE_BYTES;
use spool_wire::rpc::{Envelope, ErrorObject, Id, Response as RpcResponse, codes};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{
    CloseFrame, Role, WebSocketConfig, frame::coding::CloseCode,
};

use crate::dispatch::{Dispatcher, Outgoing};

/// How long one message may take to reach a client before it is dropped as
/// one that stopped reading.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The `/ws` route, to mount on the HTTP channel. `closing` turning true
/// closes open sessions.
#[must_use]
pub fn route(dispatcher: &Dispatcher, closing: &watch::Receiver<bool>) -> Handler {
    let dispatcher = dispatcher.clone();
    let closing = closing.clone();
    Arc::new(move |request: Request<Incoming>| {
        let dispatcher = dispatcher.clone();
        let closing = closing.clone();
        Box::pin(async move { upgrade(dispatcher, request, closing) })
    })
}

fn upgrade(
    dispatcher: Dispatcher,
    mut request: Request<Incoming>,
    closing: watch::Receiver<bool>,
) -> Response<Body> {
    let headers = request.headers();
    let has = |name: header::HeaderName, word: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(word))
    };
    if request.method() != http::Method::GET
        || !has(header::UPGRADE, "websocket")
        || !has(header::CONNECTION, "upgrade")
    {
        return body::error(
            ErrorCode::BadRequest,
            "`/ws` is a WebSocket: GET with `Upgrade: websocket` and `Connection: Upgrade`",
        );
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        let mut reply = body::error(
            ErrorCode::BadRequest,
            "WebSocket version 13 is the one spoken here",
        );
        reply.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return reply;
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return body::error(ErrorCode::BadRequest, "`Sec-WebSocket-Key` is missing");
    };
    let accept = derive_accept_key(key.as_bytes());
    let principal = request
        .extensions()
        .get::<Authenticated>()
        .and_then(|caller| caller.0.clone());
    let upgrading = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(DEFAULT_MAX_LINE_BYTES))
                    .max_frame_size(Some(DEFAULT_MAX_LINE_BYTES));
                let socket = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                session(&dispatcher, principal, socket, closing).await;
            }
            Err(error) => {
                tracing::debug!(target: "spool::rpc", %error, "a WebSocket upgrade did not complete")
            }
        }
    });
    let mut reply = Response::new(body::empty(StatusCode::SWITCHING_PROTOCOLS).into_body());
    *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = reply.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    reply
}

/// One WebSocket session: messages in to a connection, its outbox out.
async fn session<S>(
    dispatcher: &Dispatcher,
    principal: Option<spool_journal::Principal>,
    socket: WebSocketStream<S>,
    mut closing: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = socket.split();
    let (connection, mut outgoing) = dispatcher.connect(principal);
    // The close frame to end with, set before the outbox closes.
    let (ended, told) = watch::channel(None::<CloseFrame>);
    // Fired by the writer when the client stops reading: the reader stops
    // too, and the socket is dropped.
    let gave_up = tokio_util::sync::CancellationToken::new();
    let giving_up = gave_up.clone();
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            let sent =
                tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::text(message.to_json())))
                    .await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    giving_up.cancel();
                    return;
                }
                Err(_) => {
                    tracing::info!(target: "spool::rpc", "a WebSocket client stopped reading; it is dropped");
                    giving_up.cancel();
                    return;
                }
            }
        }
        let frame = told.borrow().clone();
        let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::Close(frame))).await;
    });
    let close = loop {
        let message = tokio::select! {
            message = source.next() => message,
            () = gave_up.cancelled() => break None,
            _ = closing.wait_for(|closing| *closing) => {
                break Some(CloseFrame { code: CloseCode::Away, reason: "the server is shutting down".into() });
            }
        };
        match message {
            Some(Ok(Message::Text(text))) => connection.receive(text.as_str()).await,
            Some(Ok(Message::Binary(_))) => {
                let refusal = RpcResponse::error(
                    Id::Null,
                    ErrorObject::with_reason(
                        codes::INVALID_REQUEST,
                        "binary messages are not JSON-RPC: send text",
                    ),
                );
                connection.receive_refusal(Outgoing::One(Envelope::Response(refusal)));
            }
            Some(Ok(Message::Close(_))) | None => break None,
            // Pings are answered by the WebSocket layer.
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Err(error)) => {
                tracing::debug!(target: "spool::rpc", %error, "a WebSocket session ended");
                let frame = match error {
                    tokio_tungstenite::tungstenite::Error::Capacity(_) => Some(CloseFrame {
                        code: CloseCode::Size,
                        reason: "a message over 1 MiB".into(),
                    }),
                    _ => None,
                };
                break frame;
            }
        }
    };
    // What is in progress is answered; then, the outbox closed with the
    // connection, the writer sends the close frame.
    connection.close().await;
    ended.send_replace(close);
    drop(connection);
    let _ = writer.await;
}
