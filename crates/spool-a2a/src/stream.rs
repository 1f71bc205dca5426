//! Streams of a task's changes as Server-Sent Events: the task first,
//! then each status and artifact change in the order the journal holds
//! them, ending where the task rests. The JSON-RPC binding wraps each
//! item in a response envelope; HTTP+JSON sends the item itself.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use spool_edge::body::{Body, ChannelBody};
use spool_journal::Principal;
use spool_wire::a2a::{self, Error, ErrorKind, StreamResponse};

use crate::server::A2aServer;
use crate::task::Watch;

/// How many framed items a stream's body holds before the reader waits.
const BODY_QUEUE: usize = 32;

/// `SubscribeToTask`: the task's watch, unless it has finished.
pub(crate) async fn subscribe(
    server: &A2aServer,
    caller: Option<&Principal>,
    id: &str,
) -> Result<Watch, Error> {
    let watch = server.open(caller, id).await?;
    let state = watch.tracker().state();
    if state.is_terminal() {
        return Err(Error::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "task `{id}` is {}: a finished task has no updates to subscribe to; read it with GetTask",
                state.as_str()
            ),
        )
        .with("taskId", id));
    }
    Ok(watch)
}

/// The watch as an SSE body: for JSON-RPC (`rpc` is the request's id and
/// whether it used a v0.3 name) each item is a response envelope.
pub(crate) fn sse(
    server: &A2aServer,
    mut watch: Watch,
    rpc: Option<(Value, bool)>,
) -> Response<Body> {
    let (sender, body) = ChannelBody::new(BODY_QUEUE);
    let mut closing = server.closing.clone();
    tokio::spawn(async move {
        let frame = |item: StreamResponse| -> Bytes {
            let value = serde_json::to_value(&item).expect("A2A types are plain JSON");
            let value = match &rpc {
                Some((id, legacy)) => {
                    let result = if *legacy {
                        a2a::v0_3::item(value)
                    } else {
                        value
                    };
                    json!({"jsonrpc": "2.0", "id": id, "result": result})
                }
                None => value,
            };
            Bytes::from(format!("data: {value}\n\n"))
        };
        let first = StreamResponse::Task(watch.tracker().task());
        if sender.send(frame(first)).await.is_err() {
            return;
        }
        loop {
            let item = tokio::select! {
                item = watch.next() => item,
                // Shutdown ends the stream; the task goes on in the journal.
                _ = closing.wait_for(|closing| *closing) => None,
            };
            let Some(item) = item else { break };
            if sender.send(frame(item)).await.is_err() {
                // The client went away; the task goes on.
                break;
            }
        }
    });
    let mut response = Response::new(body.boxed());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
