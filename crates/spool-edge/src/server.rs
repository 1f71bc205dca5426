//! The server plumbing: listeners (TCP, TLS over TCP, and a Unix socket
//! created 0600), HTTP/1.1 with keep-alive, a header-read timeout against slow clients,
//! and connection upgrades (a handler may take a connection over, as a
//! WebSocket does), and graceful shutdown: stop accepting, let open
//! requests and streams close (streams are told to end), then return. Runs
//! stay durable in the journal whatever happens here.

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::body::Body;

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long shutdown waits for open connections before it returns anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A request handler: every request gets a reply (errors are replies too).
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> spool_runtime::BoxFuture<'static, Response<Body>> + Send + Sync,
>;

pub use spool_runtime::dirs::user_runtime_dir;

/// How many connections the kernel may hold, handshake done, before the
/// server accepts them (it caps this at `net.core.somaxconn`, 4 096 by
/// default since Linux 5.4). The standard library's 128 is overrun by a
/// burst of clients connecting at once, and the kernel then drops the
/// handshake's last packet: the client believes it is connected and its
/// request waits for a retransmission, a second and more later (measured:
/// 1 000 clients sending at once waited up to 6.8 s at the 99th
/// percentile, `cargo xtask bench --only first-token`).
const BACKLOG: u32 = 4096;

/// Binds `addr` (resolved; the first address that binds wins) with
/// [`BACKLOG`].
async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for address in tokio::net::lookup_host(addr).await? {
        let socket = if address.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As the standard library's bind does: a restarted server takes
        // its port back while old connections linger in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        match socket.bind(address).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{addr}` names no address"),
        )
    }))
}

/// Where the server listens.
#[derive(Debug)]
pub enum Listener {
    /// A TCP socket.
    Tcp(TcpListener),
    /// A TCP socket whose connections speak TLS (`https://`, `wss://`).
    Tls(TcpListener, Arc<rustls::ServerConfig>),
    /// A Unix socket, and its path (removed on shutdown).
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds a TCP address.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound.
    pub async fn tcp(addr: &str) -> std::io::Result<Self> {
        Ok(Self::Tcp(bind(addr).await?))
    }

    /// Binds a TCP address whose connections are served over TLS with
    /// `config` (see [`crate::tls::CertificateFiles`]).
    ///
    /// # Errors
    ///
    /// When the address cannot be bound.
    pub async fn tls(addr: &str, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        Ok(Self::Tls(bind(addr).await?, config))
    }

    /// Binds a Unix socket at `path`, readable and writable by its owner
    /// only. A stale socket left by a dead server is replaced; any other
    /// file at the path is an error.
    ///
    /// # Errors
    ///
    /// When the path holds something else, or cannot be bound.
    pub fn unix(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self::Unix(listener, path.to_owned()))
    }

    /// The local address, for logs (`127.0.0.1:8080`, `unix:/run/spool.sock`).
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(listener) | Self::Tls(listener, _) => listener
                .local_addr()
                .map_or_else(|_| "tcp".into(), |a| a.to_string()),
            Self::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }
}

/// A listener other machines can reach, without an authenticator: anyone
/// who can connect could drive every run.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to listen on {0} without an authenticator: pass a token file (or set an authenticator), or bind to loopback"
)]
pub struct Exposed(pub String);

/// Refuses a TCP address that is not loopback when nothing authenticates
/// callers. A Unix socket is private to its owner (created 0600), and
/// loopback to this machine's users; anything else needs an
/// authenticator. `HttpChannel::serve` (spool-http) checks this; a host that
/// binds before building its channel can check first.
///
/// # Errors
///
/// [`Exposed`] for a non-loopback address without an authenticator.
pub fn check_exposure(addr: std::net::SocketAddr, authenticated: bool) -> Result<(), Exposed> {
    if addr.ip().is_loopback() || authenticated {
        Ok(())
    } else {
        Err(Exposed(addr.to_string()))
    }
}

impl Listener {
    /// [`check_exposure`] for this listener.
    ///
    /// # Errors
    ///
    /// [`Exposed`] for a non-loopback TCP listener without an
    /// authenticator.
    pub fn check_exposure(&self, authenticated: bool) -> Result<(), Exposed> {
        match self {
            Self::Tcp(listener) | Self::Tls(listener, _) => match listener.local_addr() {
                Ok(addr) => check_exposure(addr, authenticated),
                // An address that cannot be read is not assumed private.
                Err(_) if authenticated => Ok(()),
                Err(_) => Err(Exposed("a TCP socket".into())),
            },
            Self::Unix(..) => Ok(()),
        }
    }
}

/// Serves `handler` on `listener` until `shutdown` completes, then shuts
/// down gracefully. The low-level path: it does not know whether
/// `handler` authenticates, so it checks nothing; serving a channel with
/// `HttpChannel::serve` (spool-http) refuses an exposed listener without an
/// authenticator.
///
/// # Errors
///
/// Only for errors of the listener itself; a failed connection is dropped
/// and serving goes on.
pub async fn serve(
    listener: Listener,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // hyper-util's `GracefulShutdown` cannot watch a connection that may be
    // upgraded, so connections are tracked here: each is told to finish
    // when `stopping` turns true, and shutdown waits for the tracker.
    let (stop, stopping) = watch::channel(false);
    let connections = TaskTracker::new();
    let graceful = Graceful {
        stopping,
        connections: connections.clone(),
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener) => match accepted {
                Ok(Accepted::Tcp(stream)) => {
                    let span = connection_span("tcp", stream.peer_addr().ok());
                    spawn_tcp(stream, &handler, &graceful, span);
                }
                Ok(Accepted::Tls(stream, acceptor)) => {
                    let span = connection_span("tls", stream.peer_addr().ok());
                    spawn_tls(stream, acceptor, &handler, &graceful, span);
                }
                Ok(Accepted::Unix(stream)) => spawn(stream, &handler, &graceful, connection_span("unix", None)),
                // A client that failed mid-handshake is its own problem;
                // the listener goes on. Out of file descriptors, accept
                // fails at once every time: a short pause keeps that from
                // spinning a core while connections close.
                Err(error) => {
                    tracing::warn!(target: "spool::http", %error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    let path = match &listener {
        Listener::Unix(_, path) => Some(path.clone()),
        Listener::Tcp(_) | Listener::Tls(..) => None,
    };
    drop(listener);
    stop.send_replace(true);
    connections.close();
    tokio::select! {
        () = connections.wait() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

enum Accepted {
    Tcp(TcpStream),
    /// A TCP connection before its TLS handshake.
    Tls(TcpStream, tokio_rustls::TlsAcceptor),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(listener) => Ok(Accepted::Tcp(accept_tcp(listener).await?)),
        Listener::Tls(listener, config) => Ok(Accepted::Tls(
            accept_tcp(listener).await?,
            tokio_rustls::TlsAcceptor::from(Arc::clone(config)),
        )),
        Listener::Unix(listener, _) => listener.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

async fn accept_tcp(listener: &TcpListener) -> std::io::Result<TcpStream> {
    let (stream, _) = listener.accept().await?;
    // A stream line goes out as it is written: Nagle's algorithm would
    // hold a small line back while an earlier one waits for its
    // acknowledgement. Only a speed-up: a socket that refuses it is
    // served as it is.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// What a connection needs to know of the server's shutdown.
struct Graceful {
    stopping: watch::Receiver<bool>,
    connections: TaskTracker,
}

/// A connection's span: every request on it runs inside, so a request
/// can be followed back to its socket (`RUST_LOG=spool=debug`).
fn connection_span(transport: &'static str, peer: Option<std::net::SocketAddr>) -> tracing::Span {
    match peer {
        Some(peer) => tracing::debug_span!(target: "spool::edge", "connection", transport, %peer),
        None => tracing::debug_span!(target: "spool::edge", "connection", transport),
    }
}

fn spawn<I>(io: I, handler: &Handler, graceful: &Graceful, span: tracing::Span)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    graceful.connections.spawn(
        connection(io, Arc::clone(handler), graceful.stopping.clone(), None).instrument(span),
    );
}

/// Serves a plain TCP connection through a socket its requests carry
/// (`crate::tap`): a stream's driver may write to it directly.
fn spawn_tcp(stream: TcpStream, handler: &Handler, graceful: &Graceful, span: tracing::Span) {
    let (io, tap) = crate::tap::SharedTcp::new(stream);
    graceful.connections.spawn(
        connection(
            io,
            Arc::clone(handler),
            graceful.stopping.clone(),
            Some(tap),
        )
        .instrument(span),
    );
}

/// Serves a TLS connection once its handshake is done. The handshake runs
/// in the connection's own task, so a client that stalls in it holds up
/// no one else; it has [`HEADER_READ_TIMEOUT`] to finish.
fn spawn_tls(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    handler: &Handler,
    graceful: &Graceful,
    span: tracing::Span,
) {
    let (handler, stopping) = (Arc::clone(handler), graceful.stopping.clone());
    let served = async move {
        let handshake = tokio::time::timeout(HEADER_READ_TIMEOUT, handshake(stream, &acceptor));
        tokio::select! {
            shook = handshake => if let Ok(Some(tls)) = shook {
                connection(tls, handler, stopping, None).await;
            },
            // A server stopping takes no new requests: a handshake still
            // in progress is dropped, not waited for.
            () = stopped(stopping.clone()) => {}
        }
    };
    graceful.connections.spawn(served.instrument(span));
}

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A connection's TLS handshake; `None` when it fails (logged: a client
/// that does not trust the certificate says why on its side).
async fn handshake(
    mut stream: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0_u8; 1];
    if stream.peek(&mut first).await.ok()? == 0 {
        return None;
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        // Plain HTTP sent to the TLS port (`curl http://` for `https://`)
        // is told so in plain HTTP, not met with a closed connection its
        // client cannot explain.
        refuse_plain(&mut stream).await;
        return None;
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Some(tls),
        Err(error) => {
            tracing::debug!(target: "spool::http", %error, "a TLS handshake failed");
            None
        }
    }
}

/// Answers a plain-text request on a TLS port with `bad_request`.
async fn refuse_plain(stream: &mut TcpStream) {
    use spool_wire::http::{ErrorBody, ErrorCode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The request's head is read before the reply, to its blank line (a
    // client may send it in several writes), within a bound and a wait.
    // A client still writing when the connection closed would get a reset
    // instead of the reply.
    let mut head = Vec::with_capacity(1024);
    let _ = tokio::time::timeout(PLAIN_LINGER, async {
        let mut chunk = [0_u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < PLAIN_HEAD_MAX {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let body = ErrorBody::new(
        ErrorCode::BadRequest,
        "this port speaks TLS: use https:// (wss:// for a WebSocket)",
    );
    let Ok(body) = serde_json::to_vec(&body) else {
        return;
    };
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
    // What the client still sends (a body) is read and dropped until it
    // closes its side, within a bound and a wait: closing with it unread
    // would reset the connection, and the reply with it.
    let _ = tokio::time::timeout(PLAIN_LINGER, async {
        let mut chunk = [0_u8; 4096];
        let mut drained = 0;
        while drained < PLAIN_DRAIN_MAX {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// How long a plain-text request on a TLS port is waited on, for its head
/// and then for its client to close.
const PLAIN_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// The most of a plain-text request's head read before the refusal.
const PLAIN_HEAD_MAX: usize = 8 * 1024;

/// The most read and dropped after the refusal.
const PLAIN_DRAIN_MAX: usize = 64 * 1024;

/// Serves one connection until it closes, or finishes its request in
/// progress and closes once the server is stopping. Each request carries
/// `tap`, the connection's shared socket, when it has one.
async fn connection<I>(
    io: I,
    handler: Handler,
    stopping: watch::Receiver<bool>,
    tap: Option<Arc<crate::tap::Tap>>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut request: Request<Incoming>| {
        if let Some(tap) = &tap {
            request.extensions_mut().insert(Arc::clone(tap));
        }
        let reply = handler(request);
        async move { Ok::<_, Infallible>(reply.await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let io = TokioIo::new(crate::refusals::Refusals::new(io));
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stopped(stopping) => {
            // Finish the request in progress, take no more.
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Resolves once the server is stopping (or gone).
async fn stopped(mut stopping: watch::Receiver<bool>) {
    // The guard `wait_for` returns is not held past this line.
    let _ = stopping.wait_for(|stopping| *stopping).await.map(|_| ());
}
