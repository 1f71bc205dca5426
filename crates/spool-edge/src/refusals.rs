//! hyper's own refusals, given the channel's JSON error body.
//!
//! hyper answers a request it cannot parse (400), a request target that is
//! too long (414) or headers that are too large (431) itself, before any
//! handler runs, with an empty body and `connection: close`; it has no hook
//! to shape that reply. Every refusal the channel sends carries the
//! documented `{"error", "code"}` body, so the connection's writes pass
//! through [`Refusals`], which recognizes exactly that reply (one of those
//! statuses, `content-length: 0`, `connection: close`: a form the channel's
//! own error replies never take, since they always have a body) and writes
//! the same status with the JSON body instead.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use spool_wire::http::{ErrorBody, ErrorCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose writes of hyper's own refusals are given a body.
#[derive(Debug)]
pub(crate) struct Refusals<I> {
    io: I,
    /// A refusal being written in place of hyper's: its bytes, how many
    /// are written, and the length of the write it stands for.
    rewriting: Option<(Bytes, usize, usize)>,
}

impl<I> Refusals<I> {
    pub(crate) fn new(io: I) -> Self {
        Self {
            io,
            rewriting: None,
        }
    }
}

/// hyper's refusal heads are a status line and three short headers.
const MAX_REFUSAL_HEAD: usize = 256;

/// The reply to write instead of `head`, when `head` is one of hyper's
/// own empty refusals.
fn rewrite(head: &[u8]) -> Option<Bytes> {
    // Every write passes here: most are turned away by these few bytes.
    if head.len() > MAX_REFUSAL_HEAD
        || !head.starts_with(b"HTTP/1.1 4")
        || !head.ends_with(b"\r\n\r\n")
    {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let (lines, rest) = text.split_once("\r\n\r\n")?;
    if !rest.is_empty() {
        return None;
    }
    let mut lines = lines.split("\r\n");
    let status_line = lines.next()?;
    let status = status_line.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let (code, message) = match status {
        "400" => (
            ErrorCode::BadRequest,
            "the request is not well-formed HTTP/1.1",
        ),
        "414" => (ErrorCode::UriTooLong, "the request target is too long"),
        "431" => (
            ErrorCode::HeadersTooLarge,
            "the request's headers are too many or too large",
        ),
        _ => return None,
    };
    let headers: Vec<&str> = lines.collect();
    let has = |wanted: &str| headers.iter().any(|h| h.eq_ignore_ascii_case(wanted));
    if !has("content-length: 0") || !has("connection: close") {
        return None;
    }
    let body = serde_json::to_vec(&ErrorBody::new(code, message)).ok()?;
    let mut reply = format!(
        "{status_line}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for header in headers
        .iter()
        .filter(|h| h.len() > 5 && h[..5].eq_ignore_ascii_case("date:"))
    {
        reply.push_str(header);
        reply.push_str("\r\n");
    }
    reply.push_str("\r\n");
    let mut reply = reply.into_bytes();
    reply.extend_from_slice(&body);
    Some(Bytes::from(reply))
}

impl<I: AsyncWrite + Unpin> Refusals<I> {
    /// Writes the refusal in progress; `Ready(Ok(n))` with the length of
    /// the write it replaces once all of it is out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some((bytes, written, stands_for)) = &mut self.rewriting {
            if *written == bytes.len() {
                let n = *stands_for;
                self.rewriting = None;
                return Poll::Ready(Ok(n));
            }
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(0))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Refusals<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Refusals<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // A write that returned Pending is offered again with the same
        // bytes; the refusal already in progress carries on.
        if self.rewriting.is_none() {
            match rewrite(buf) {
                Some(reply) => self.rewriting = Some((reply, 0, buf.len())),
                None => return Pin::new(&mut self.io).poll_write(cx, buf),
            }
        }
        self.drain(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.rewriting.is_none() {
            // hyper's refusal is a head alone, in one slice.
            let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
            let reply = match (nonempty.next(), nonempty.next()) {
                (Some(only), None) => rewrite(only),
                _ => None,
            };
            match reply {
                Some(reply) => {
                    let total = bufs.iter().map(|b| b.len()).sum();
                    self.rewriting = Some((reply, 0, total));
                }
                None => return Pin::new(&mut self.io).poll_write_vectored(cx, bufs),
            }
        }
        self.drain(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    // A refusal in progress is not yet accepted (its write has not
    // returned Ready), so a flush or shutdown covers only what was.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_refusals_get_the_json_body_and_nothing_else_changes() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 04:58:47 GMT\r\n\r\n";
        let reply = String::from_utf8(rewrite(head).unwrap().to_vec()).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("date: Mon, 30 Nov 2026 04:58:47 GMT"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "headers_too_large");

        // The channel's own replies, an empty 204 and a keep-alive 400
        // with a body, pass untouched.
        assert!(rewrite(b"HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n").is_none());
        assert!(
            rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n")
                .is_none()
        );
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
