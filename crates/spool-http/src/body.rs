//! Response and request bodies: JSON replies, the channel's error body,
//! capped request reading, and a streaming body fed by a bounded channel.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited};
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

/// Reads a request body of at most `cap` bytes.
///
/// # Errors
///
/// A `too_large` (413) reply past the cap; `bad_request` when the body
/// cannot be read.
pub async fn read_capped<B>(body: B, cap: usize) -> Result<Bytes, Box<Response<Body>>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match Limited::new(body, cap).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(Box::new(error(
                ErrorCode::TooLarge,
                format!("the body is over {cap} bytes"),
            )))
        }
        Err(e) => Err(Box::new(error(
            ErrorCode::BadRequest,
            format!("the body could not be read: {e}"),
        ))),
    }
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
