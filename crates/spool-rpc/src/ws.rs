//! `GET /ws`: JSON-RPC over a WebSocket, both ways on one connection, one
//! envelope per text message. The HTTP channel's server answers the
//! handshake and hands the connection over (hyper's upgrade); behind the
//! channel's authenticator, as every mounted route is.
//!
//! Limits: a message or frame over 1 MiB ends the session (the WebSocket
//! close code says so); a binary message is answered −32600 and the
//! session goes on; pings are answered by the WebSocket layer; a client
//! that stops reading for [`WRITE_TIMEOUT`] is dropped; the server's
//! shutdown closes the session.
//!
//! What the server buffers for a client is bounded by [`WRITE_BUFFER`]:
//! messages longer than [`FRAME`] go out in fragments of that size, and
//! the pongs of a client that floods pings without reading them are not
//! queued past the bound (the latest replaces the one waiting). Messages
//! already waiting in the outbox go out in one write.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use spool_edge::body::{self, Body};
use spool_edge::server::Handler;
use spool_edge::tables::Authenticated;
use spool_wire::http::ErrorCode;
use spool_wire::line::DEFAULT_MAX_LINE_BYTES;
use spool_wire::rpc::{Envelope, ErrorObject, Id, Response as RpcResponse, codes};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data as OpData, OpCode};
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use crate::dispatch::{Dispatcher, Outgoing};

/// How long one message may take to reach a client before it is dropped as
/// one that stopped reading.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest frame the server writes: a longer message goes out in
/// fragments of this size.
pub const FRAME: usize = 64 * 1024;

/// What the server gathers before writing to a client's socket: the
/// messages already waiting go out together.
const GATHER: usize = 4 * 1024;

/// What the server holds for one client's socket at most: what it gathers,
/// a frame and a pong.
pub const WRITE_BUFFER: usize = GATHER + FRAME + 1024;

/// How many waiting messages one write takes at most.
const BATCH: usize = 64;

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
    // A browser accepts only a subprotocol it offered: `spool.v1` is
    // chosen when offered, and a `spool.bearer.<token>` offer (read by the
    // channel's authenticator) is never echoed.
    let chosen =
        spool_edge::tables::ws_protocols(headers).any(|p| p == spool_edge::tables::WS_PROTOCOL);
    let principal = request
        .extensions()
        .get::<Authenticated>()
        .and_then(|caller| caller.0.clone());
    // The caller's session ends the WebSocket too (a revoked token).
    let closing = request
        .extensions()
        .get::<spool_edge::session::Session>()
        .map_or(closing, spool_edge::session::Session::ending);
    let upgrading = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => {
                let config = config();
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
    if chosen {
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(spool_edge::tables::WS_PROTOCOL),
        );
    }
    reply
}

/// The session's limits: what it reads (1 MiB a message, into a buffer
/// that starts small: most clients send little) and what it holds for the
/// client ([`WRITE_BUFFER`]).
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .max_message_size(Some(DEFAULT_MAX_LINE_BYTES))
        .max_frame_size(Some(DEFAULT_MAX_LINE_BYTES))
        .write_buffer_size(GATHER)
        .max_write_buffer_size(WRITE_BUFFER)
}

/// Queues one message (compact JSON) for the socket, in fragments of
/// [`FRAME`] bytes when it is longer; the caller flushes.
async fn feed<S>(
    sink: &mut S,
    bytes: bytes::Bytes,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    if bytes.len() <= FRAME {
        let text = tokio_tungstenite::tungstenite::Utf8Bytes::try_from(bytes)?;
        return sink.feed(Message::Text(text)).await;
    }
    // A text message's fragments may split a character: the message, not
    // each fragment, is UTF-8 (RFC 6455 §5.6).
    let mut start = 0;
    while start < bytes.len() {
        let end = (start + FRAME).min(bytes.len());
        let opcode = if start == 0 {
            OpCode::Data(OpData::Text)
        } else {
            OpCode::Data(OpData::Continue)
        };
        let frame = Frame::message(bytes.slice(start..end), opcode, end == bytes.len());
        sink.feed(Message::Frame(frame)).await?;
        start = end;
    }
    Ok(())
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
            // What else is already waiting goes out in the same write:
            // one event reaching a thousand clients is a thousand writes,
            // not one per message.
            let batch = async {
                feed(&mut sink, message.to_bytes()).await?;
                let mut fed = 1;
                while fed < BATCH
                    && let Ok(message) = outgoing.try_recv()
                {
                    feed(&mut sink, message.to_bytes()).await?;
                    fed += 1;
                }
                sink.flush().await
            };
            match tokio::time::timeout(WRITE_TIMEOUT, batch).await {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use spool_journal::store::memory::MemoryJournal;
    use spool_runtime::Runtime;
    use tokio::sync::watch;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use crate::Dispatcher;

    /// A session on one end of an in-memory pipe of `buffer` bytes, and a
    /// client on the other.
    async fn pair(
        buffer: usize,
    ) -> (
        tokio::task::JoinHandle<()>,
        WebSocketStream<tokio::io::DuplexStream>,
        watch::Sender<bool>,
    ) {
        let (server, client) = tokio::io::duplex(buffer);
        let dispatcher = Dispatcher::new(Runtime::builder(Arc::new(MemoryJournal::new())).build());
        let (stop, closing) = watch::channel(false);
        let server =
            WebSocketStream::from_raw_socket(server, Role::Server, Some(super::config())).await;
        let session = tokio::spawn(async move {
            super::session(&dispatcher, None, server, closing).await;
        });
        let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        (session, client, stop)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_is_dropped_after_the_write_timeout() {
        let (session, mut client, _stop) = pair(4096).await;
        // Answers far larger than the pipe holds, never read.
        let text = "x".repeat(64 * 1024);
        for id in 0..8 {
            let request = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"submit.run","params":{{"text":"{text}"}}}}"#
            );
            client.send(Message::text(request)).await.unwrap();
        }
        // Paused time runs ahead whenever everything waits: the session
        // ends once a write has waited out its timeout, and no sooner.
        let started = tokio::time::Instant::now();
        tokio::time::timeout(super::WRITE_TIMEOUT * 4, session)
            .await
            .expect("the session ends")
            .unwrap();
        assert!(started.elapsed() >= super::WRITE_TIMEOUT);
    }

    #[tokio::test]
    async fn a_ping_flood_from_a_client_that_does_not_read_queues_no_pongs_past_the_write_buffer() {
        let (_session, client, _stop) = pair(4096).await;
        let (mut sink, mut source) = client.split();
        let pings = 10_000;
        // Sent without reading a pong: the server keeps reading.
        let flood = tokio::spawn(async move {
            for _ in 0..pings {
                sink.send(Message::Ping(vec![7u8; 125].into()))
                    .await
                    .unwrap();
            }
            sink.send(Message::text(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#))
                .await
                .unwrap();
            sink
        });
        // Were the server to stop reading until its pongs are taken, the
        // flood would never finish.
        let _sink = tokio::time::timeout(Duration::from_secs(60), flood)
            .await
            .expect("the server reads the whole flood without its pongs being read")
            .unwrap();
        let mut pongs = 0;
        let answer = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match source.next().await.unwrap().unwrap() {
                    Message::Pong(_) => pongs += 1,
                    Message::Text(text) => break text,
                    other => panic!("a pong or the answer, not {other:?}"),
                }
            }
        })
        .await
        .expect("the request after the flood is answered");
        assert!(answer.as_str().contains(r#""result":"pong""#), "{answer}");
        assert!(
            pongs < pings / 10,
            "{pongs} pongs for {pings} pings: unanswered pings are not queued"
        );
    }

    #[tokio::test]
    async fn a_message_longer_than_a_frame_arrives_whole_in_fragments() {
        let (_session, mut client, _stop) = pair(4096).await;
        // Four frames' worth, with characters of several bytes, so a
        // fragment boundary falls inside one.
        let text = "é€x".repeat(super::FRAME * 4 / 6);
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{{"text":"{text}"}}}}"#
        );
        client.send(Message::text(request)).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let Message::Text(message) = client.next().await.unwrap().unwrap() else {
                    continue;
                };
                let message: serde_json::Value = serde_json::from_str(message.as_str()).unwrap();
                if message["id"] == 1 {
                    break message;
                }
            }
        })
        .await
        .expect("the answer in time");
        assert_eq!(answer["result"]["response"], format!("echo: {text}"));
    }
}
