//! Response and request bodies: JSON replies, the channel's error body,
//! capped and timed request reading, and a streaming body fed by a bounded
//! channel.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use spool_wire::http::{ErrorBody, ErrorCode};
use tokio::sync::mpsc;

/// The body every reply uses.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A JSON reply.
#[must_use]
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).expect("replies are plain JSON and always serialize");
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An empty reply.
#[must_use]
pub fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = status;
    response
}

/// The channel's error reply, `{"error", "code"}`, with the code's status.
#[must_use]
pub fn error(code: ErrorCode, message: impl Into<String>) -> Response<Body> {
    let status = code
        .status()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, &ErrorBody::new(code, message))
}

/// How long a client has to send a request's body, from the end of its
/// headers: a client that trickles bytes must not hold a connection (and
/// the memory of a half-read body) for ever.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a request body of at most `cap` bytes within `deadline`.
///
/// A `Content-Length` over the cap is refused before anything is read.
/// The bytes are gathered into one buffer as they come, so a body sent a
/// byte at a time costs what it holds, not a buffer per frame.
///
/// # Errors
///
/// A `too_large` (413) reply past the cap; `request_timeout` (408) when the
/// body is not all there by the deadline; `bad_request` when it cannot be
/// read.
pub async fn read_capped<B>(
    body: B,
    cap: usize,
    deadline: Duration,
) -> Result<Bytes, Box<Response<Body>>>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let too_large = || {
        Box::new(error(
            ErrorCode::TooLarge,
            format!("the body is over {cap} bytes"),
        ))
    };
    if usize::try_from(body.size_hint().lower()).map_or(true, |announced| announced > cap) {
        return Err(too_large());
    }
    let read = async {
        let mut body = body;
        let mut gathered = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                Box::new(error(
                    ErrorCode::BadRequest,
                    format!("the body could not be read: {e}"),
                ))
            })?;
            if let Ok(data) = frame.into_data() {
                if gathered.len() + data.len() > cap {
                    return Err(too_large());
                }
                gathered.extend_from_slice(&data);
            }
        }
        Ok(gathered.freeze())
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or_else(|_| {
            Err(Box::new(error(
                ErrorCode::RequestTimeout,
                format!(
                    "the body did not arrive within {} s",
                    deadline.as_secs_f64()
                ),
            )))
        })
}

/// A body fed line by line from a bounded channel: each message is sent as
/// its own frame, so a client sees it as soon as it is written. The body
/// ends when the sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    receiver: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender that feeds it, holding at most `bound`
    /// unsent messages.
    #[must_use]
    pub fn new(bound: usize) -> (mpsc::Sender<Bytes>, Self) {
        let (sender, receiver) = mpsc::channel(bound.max(1));
        (sender, Self { receiver })
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver
            .poll_recv(cx)
            .map(|line| line.map(|bytes| Ok(Frame::data(bytes))))
    }
}
