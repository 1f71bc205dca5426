//! A plain TCP connection that hyper and its run's stream driver share.
//!
//! hyper serves the connection through [`SharedTcp`]; the same socket is
//! the [`Tap`] a stream's request carries. Once a stream has caught up and
//! joined its run's driver (the HTTP channel's fan-out), the driver writes each batch
//! straight to the socket, framed as the HTTP/1.1 chunk hyper would have
//! written, in one loop over its streams: a commit then costs each stream
//! one write, and no task of its own. The driver writes only while hyper
//! has nothing of its own waiting (it has flushed everything it was given)
//! and the stream has nothing queued, so the bytes on the wire stay in
//! order; a socket that would block gets the batch queued for hyper's
//! task instead, as a stream without a tap does (TLS, Unix sockets).

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// A connection's socket, shared by hyper and its stream's driver: the
/// write side (the read side is hyper's alone).
#[derive(Debug)]
pub struct Tap {
    socket: OwnedWriteHalf,
    /// hyper has written out everything it was given: bytes written to
    /// the socket now come after all of it.
    flushed: AtomicBool,
}

impl Tap {
    /// Marks that hyper has bytes to write: a response about to start, or
    /// a batch handed to it.
    pub fn busy(&self) {
        self.flushed.store(false, Ordering::Release);
    }

    /// Whether bytes written to the socket now would follow everything
    /// hyper was given.
    pub fn flushed(&self) -> bool {
        self.flushed.load(Ordering::Acquire)
    }

    /// Writes what the socket takes now, without waiting: how many bytes.
    pub fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        self.socket.try_write(bytes)
    }

    fn stream(&self) -> &TcpStream {
        self.socket.as_ref()
    }

    /// Writes what the socket takes, waiting (with `cx`) until it takes
    /// some: how many bytes.
    pub fn poll_write(&self, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<std::io::Result<usize>> {
        self.poll_write_with(cx, |socket| socket.try_write(bytes))
    }

    /// `write` once the socket is writable, until it does not find it
    /// would block after all.
    fn poll_write_with(
        &self,
        cx: &mut Context<'_>,
        write: impl Fn(&OwnedWriteHalf) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.stream().poll_write_ready(cx))?;
            match write(&self.socket) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                written => return Poll::Ready(written),
            }
        }
    }
}

/// `parts`, one after another, as one HTTP/1.1 chunk, the way hyper
/// frames a body's data.
pub fn chunk<'a>(parts: impl Iterator<Item = &'a [u8]> + Clone) -> Bytes {
    let len: usize = parts.clone().map(<[u8]>::len).sum();
    let size = format!("{len:X}\r\n");
    let mut framed = BytesMut::with_capacity(size.len() + len + 2);
    framed.put_slice(size.as_bytes());
    for part in parts {
        framed.put_slice(part);
    }
    framed.put_slice(b"\r\n");
    framed.freeze()
}

/// The connection as hyper reads and writes it.
#[derive(Debug)]
pub struct SharedTcp {
    /// Read as tokio reads a socket: into the buffer's spare room without
    /// initializing it first (zeroing hyper's read buffer on every read
    /// made every open connection's pages resident).
    read: OwnedReadHalf,
    tap: Arc<Tap>,
}

impl SharedTcp {
    /// `socket`, and its tap for the connection's requests.
    pub fn new(socket: TcpStream) -> (Self, Arc<Tap>) {
        let (read, write) = socket.into_split();
        let tap = Arc::new(Tap {
            socket: write,
            flushed: AtomicBool::new(false),
        });
        (
            Self {
                read,
                tap: Arc::clone(&tap),
            },
            tap,
        )
    }
}

impl AsyncRead for SharedTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.tap.busy();
        self.tap.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.tap.busy();
        self.tap
            .poll_write_with(cx, |socket| socket.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// hyper flushes once its own buffer is written out: from here, bytes
    /// written by the driver follow all of it.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.tap.flushed.store(true, Ordering::Release);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Sends the FIN now; the socket closes with its last holder.
        Poll::Ready(socket2::SockRef::from(self.tap.stream()).shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_framed_as_one_chunk_with_their_whole_size_in_hex() {
        assert_eq!(
            &chunk([&b"hello\n"[..]].into_iter())[..],
            b"6\r\nhello\n\r\n"
        );
        let long = vec![b'x'; 300];
        let framed = chunk([&long[..]].into_iter());
        assert!(framed.starts_with(b"12C\r\nxxx"));
        assert!(framed.ends_with(b"xxx\r\n"));
        assert_eq!(framed.len(), 5 + 300 + 2);
        let parts = [&b"ab"[..], b"", b"cde\n"];
        assert_eq!(&chunk(parts.into_iter())[..], b"6\r\nabcde\n\r\n");
    }
}
