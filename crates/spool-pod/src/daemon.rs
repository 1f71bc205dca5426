//! The daemon: a pod on a Unix socket, JSONL both ways. A connection is a
//! listener (every event, from a `status` on); each line it sends is a
//! method. A line that does not decode (not JSON, not UTF-8, over 1 MiB,
//! an unknown method, `run` without `input`) is answered `invalid_request`
//! to that connection alone, and the connection stays usable. A client
//! that takes no event for [`WRITE_TIMEOUT`] is disconnected.

use std::future::Future;

use spool_wire::line::{DEFAULT_MAX_LINE_BYTES, LineCodec};
use spool_wire::pod::{ErrorCode, Event, Method};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::TaskTracker;

use crate::pod::Pod;

/// How long one event may take to reach a client before the connection is
/// closed as one that stopped reading.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `pod` on `listener` until `shutdown` resolves; then stops
/// taking connections, closes the open ones and returns.
pub async fn serve(pod: Pod, listener: UnixListener, shutdown: impl Future<Output = ()>) {
    let connections = TaskTracker::new();
    let closing = tokio_util::sync::CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let pod = pod.clone();
                    let closing = closing.clone();
                    // A span per connection; its methods' spans run inside.
                    let span = tracing::debug_span!(target: "spool::pod", "pod connection", pod = pod.name());
                    connections.spawn(tracing::Instrument::instrument(
                        async move { connection(pod, stream, closing).await },
                        span,
                    ));
                }
                Err(error) => {
                    tracing::warn!(target: "spool::pod", %error, "accepting a pod connection failed");
                }
            },
        }
    }
    closing.cancel();
    connections.close();
    connections.wait().await;
}

/// One connection: its listener's events out, its lines in.
///
/// A client that shuts its write side after its last line (`echo … |
/// socat`, `nc -N`) still reads: the events it is owed (the answers to its
/// methods, and a turn it started up to its end or pause) are written
/// before the connection closes.
async fn connection(pod: Pod, stream: UnixStream, closing: tokio_util::sync::CancellationToken) {
    let (mut reader, mut writer) = stream.into_split();
    let mut listener = pod.listen();
    let id = listener.id();
    let (half_closed, mut draining) = tokio::sync::watch::channel(false);
    let resting = pod.clone();
    let mut writing = tokio::spawn(async move {
        let mut drain = false;
        loop {
            // The state first, then the queue: a turn's last events are in
            // the queue once the state says it ended.
            if drain && resting.rests().await && listener.is_drained() {
                break;
            }
            let event = tokio::select! {
                event = listener.recv() => event,
                changed = draining.changed(), if !drain => {
                    if changed.is_err() {
                        break;
                    }
                    drain = *draining.borrow();
                    continue;
                }
            };
            let Some(event) = event else {
                break;
            };
            if writer
                .write_all(event.encode_line().as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
        // The listener ends (it fell behind, or the pod closed), the client
        // went away, or it half-closed and got what it was owed: the
        // connection is done.
        let _ = writer.shutdown().await;
    });
    let mut codec = LineCodec::new(DEFAULT_MAX_LINE_BYTES);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut written = false;
    let mut ended = false;
    loop {
        let read = tokio::select! {
            () = closing.cancelled() => break,
            // Dropped (it fell behind): reading on would serve no one.
            _ = &mut writing => {
                written = true;
                break;
            }
            read = reader.read(&mut chunk) => read,
        };
        let n = match read {
            Ok(0) => {
                ended = true;
                break;
            }
            Err(_) => break,
            Ok(n) => n,
        };
        for line in codec.push(&chunk[..n]) {
            match line
                .text
                .map_err(|e| e.to_string())
                .and_then(|text| Method::decode(&text).map_err(|rejection| rejection.message))
            {
                Ok(method) => pod.call(method).await,
                Err(reason) => pod.tell(
                    id,
                    Event::error(
                        ErrorCode::InvalidRequest,
                        format!("line {}: {reason}", line.number),
                    ),
                ),
            }
        }
    }
    if ended && !written {
        // Half-closed: the writer finishes what is owed, unless the server
        // stops first.
        let _ = half_closed.send(true);
        tokio::select! {
            _ = &mut writing => written = true,
            () = closing.cancelled() => {}
        }
    }
    if !written {
        // Unregisters the listener (dropped with the writer task).
        writing.abort();
        let _ = writing.await;
    }
}

/// Serves `pod` on `listener` (bound by [`crate::dir::PodDir::bind`],
/// before the host says it is ready) until `shutdown` resolves, keeping
/// `status.json` in `dir` to the pod's state. The directory's files go
/// when `dir` is dropped, after this returns.
pub async fn serve_in(
    pod: Pod,
    dir: &crate::dir::PodDir,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
) {
    let mut watcher = pod.listen();
    let write = |state: spool_wire::pod::PodState, session: String| {
        let status = crate::dir::StatusFile {
            pod_name: pod.name().to_owned(),
            state: state.as_str().to_owned(),
            session_id: session,
            pid: std::process::id(),
        };
        if let Err(error) = dir.write_status(&status) {
            tracing::warn!(target: "spool::pod", %error, "status.json was not written");
        }
    };
    let keep_status = async {
        while let Some(event) = watcher.recv().await {
            if let Event::Status(status) = event {
                write(status.state, status.session_id);
            }
        }
    };
    let serving = serve(pod.clone(), listener, shutdown);
    tokio::pin!(serving, keep_status);
    let mut keeping = true;
    loop {
        tokio::select! {
            () = &mut serving => return,
            () = &mut keep_status, if keeping => {
                keeping = false;
                tracing::warn!(target: "spool::pod", pod = pod.name(), "status.json is no longer kept up to date");
            }
        }
    }
}
