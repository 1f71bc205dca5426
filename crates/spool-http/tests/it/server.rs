//! The plumbing: routing errors, caps, the Unix socket, shutdown.

use std::sync::Arc;

use crate::client::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_public_and_answers_ready() {
    let server = Server::start(echo_runtime()).await;
    let reply = server.get("/spool/v1/health").await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"ok": true, "status": "ready"})
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_path_is_a_json_404() {
    let server = Server::start(echo_runtime()).await;
    for path in [
        "/",
        "/spool/v1/nope",
        "/spool/v1/runs/r1/teleport",
        "/other",
    ] {
        let reply = server.get(path).await;
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.json()["code"], "run_not_found", "{path}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_405_method_not_allowed_with_an_allow_header() {
    let server = Server::start(echo_runtime()).await;
    let reply = server.post("/spool/v1/health", "{}").await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.json()["code"], "method_not_allowed");
    assert_eq!(reply.header("allow"), Some("GET"));
    let reply = request(&server.addr, "DELETE", "/spool/v1/runs", None, &[]).await;
    assert_eq!(reply.header("allow"), Some("GET, POST"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_1_mib_is_413_too_large_and_64_kib_is_accepted() {
    let server = Server::start(echo_runtime()).await;
    let big = format!(r#"{{"text": "{}"}}"#, "x".repeat(1024 * 1024 + 1024));
    let reply = server.post("/spool/v1/runs", &big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.json()["code"], "too_large");
    let fine = format!(r#"{{"text": "{}"}}"#, "y".repeat(64 * 1024));
    let reply = server.post("/spool/v1/runs", &fine).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["state"], "completed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_serves_the_channel_and_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.sock");
    let server = Server::start_unix(&path);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut socket = tokio::net::UnixStream::connect(&path).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    socket
        .write_all(b"GET /spool/v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    socket.read_to_string(&mut raw).await.unwrap();
    assert!(
        raw.starts_with("HTTP/1.1 200") && raw.contains("\"ready\""),
        "{raw}"
    );
    server.stop().await;
    assert!(!path.exists(), "the socket is removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_and_returns() {
    let server = Server::start(echo_runtime()).await;
    let ensured = server.post("/spool/v1/addresses/watcher", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    assert_eq!(stream.status, 200);
    assert_eq!(
        stream.next().await.unwrap()["seq"],
        0,
        "the journal from the start"
    );
    server.stop().await;
    assert_eq!(
        stream.next().await,
        None,
        "the stream ended with the server"
    );
}

// Paused time: the runtime jumps the clock forward whenever every task
// waits, so the server's header timer fires without the test waiting
// HEADER_READ_TIMEOUT of real time.
#[tokio::test(start_paused = true)]
async fn a_client_that_never_finishes_its_headers_is_disconnected_after_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(echo_runtime()).await;
    let mut slow = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    slow.write_all(b"GET /spool/v1/health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        spool_http::server::HEADER_READ_TIMEOUT * 3,
        slow.read_to_end(&mut rest),
    )
    .await
    .expect("the server closes the connection");
    // Closed (or reset): no reply to a request that never arrived whole,
    // and not before the timeout.
    assert!(read.is_err() || !String::from_utf8_lossy(&rest).contains("200 OK"));
    assert!(started.elapsed() >= spool_http::server::HEADER_READ_TIMEOUT);
    // Other clients are served as usual.
    assert_eq!(server.get("/spool/v1/health").await.status, 200);
    server.stop().await;
}

/// Reads from `socket` until `needle` has arrived or the server closes.
async fn read_until(socket: &mut tokio::net::TcpStream, needle: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = socket.read(&mut buffer).await.unwrap_or(0);
        seen.extend_from_slice(&buffer[..n]);
        if n == 0 || String::from_utf8_lossy(&seen).contains(needle) {
            return String::from_utf8_lossy(&seen).into_owned();
        }
    }
}

// Paused time, as for the header timeout above: the body's deadline fires
// without the test waiting for it.
#[tokio::test(start_paused = true)]
async fn a_body_that_never_finishes_is_answered_request_timeout_after_the_body_timeout() {
    use tokio::io::AsyncWriteExt;
    let server = Server::start(echo_runtime()).await;
    let mut slow = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    slow.write_all(
        b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"text\"",
    )
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    let reply = tokio::time::timeout(
        spool_http::body::BODY_READ_TIMEOUT * 3,
        read_until(&mut slow, "request_timeout"),
    )
    .await
    .expect("the server answers a stalled body");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"code\":\"request_timeout\""), "{reply}");
    assert!(started.elapsed() >= spool_http::body::BODY_READ_TIMEOUT);
    assert_eq!(server.get("/spool/v1/health").await.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_over_the_cap_is_413_before_any_of_the_body_is_read() {
    use tokio::io::AsyncWriteExt;
    let server = Server::start(echo_runtime()).await;
    let mut client = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    // The headers announce two million bytes; none of them is ever sent.
    client
        .write_all(
            b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n",
        )
        .await
        .unwrap();
    let reply = tokio::time::timeout(PATIENCE, read_until(&mut client, "too_large"))
        .await
        .expect("the server answers without waiting for the body");
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("\"code\":\"too_large\""), "{reply}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_finished_run_ends_its_task_when_the_client_goes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut open = None;
    let server = Server::start_with(echo_runtime(), |channel| {
        open = Some(channel.open_streams());
        channel
    })
    .await;
    let mut open = open.unwrap();
    let run = server.new_run(r#"{"text": "hello"}"#).await;
    // Several clients, each reading the run's whole log and then leaving
    // while the run, finished, never writes again.
    for _ in 0..8 {
        let mut client = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
        let request =
            format!("GET /spool/v1/runs/{run}/stream HTTP/1.1\r\nHost: localhost\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0_u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("run_response") {
            let n = tokio::time::timeout(PATIENCE, client.read(&mut buffer))
                .await
                .expect("the log comes at once")
                .unwrap();
            assert!(n > 0, "the stream stays open on a finished run");
            seen.extend_from_slice(&buffer[..n]);
        }
        assert!(*open.borrow() >= 1, "the stream's task is running");
        drop(client);
    }
    tokio::time::timeout(PATIENCE, open.wait_for(|open| *open == 0))
        .await
        .expect("every stream task ends once its client has gone")
        .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_cannot_write_is_503_journal_unavailable_and_ready_says_so_until_it_writes_again()
 {
    use spool_journal::store::faulty::Faulty;
    use spool_journal::store::memory::MemoryJournal;
    let journal = Arc::new(Faulty::new(MemoryJournal::new()));
    let runtime =
        spool_runtime::Runtime::builder(Arc::clone(&journal) as Arc<dyn spool_journal::Journal>)
            .build();
    let mut health = runtime.watch_journal_health();
    let server = Server::start(runtime).await;
    assert_eq!(server.get("/spool/v1/ready").await.status, 200);

    journal.set_full(true);
    let refused = server.post("/spool/v1/runs", r#"{"text": "hello"}"#).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["code"], "journal_unavailable");
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert!(
        !String::from_utf8_lossy(&refused.body).contains("disk is full"),
        "the store's own words stay in the server's log"
    );
    let ready = server.get("/spool/v1/ready").await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["status"], "journal_unavailable");
    assert_eq!(ready.header("retry-after"), Some("5"));
    // Liveness stays liveness: the process is up.
    assert_eq!(server.get("/spool/v1/health").await.status, 200);

    // Nothing else writes: the runtime's own probe finds the room.
    journal.set_full(false);
    tokio::time::timeout(PATIENCE, health.wait_for(|h| h.is_writable()))
        .await
        .expect("the probe sees the journal write again")
        .unwrap();
    assert_eq!(server.get("/spool/v1/ready").await.status, 200);
    let started = server.post("/spool/v1/runs", r#"{"text": "hello"}"#).await;
    assert_eq!(started.status, 200);
    assert_eq!(started.json()["state"], "completed");
    server.stop().await;
}

/// The echo engine, which fills the journal's disk during its first call:
/// the turn's input is recorded, its first answer cannot be.
struct FillsTheDisk(
    Arc<spool_journal::store::faulty::Faulty<spool_journal::store::memory::MemoryJournal>>,
    std::sync::atomic::AtomicBool,
);

impl spool_runtime::Engine for FillsTheDisk {
    fn call<'a>(
        &'a self,
        context: &'a spool_runtime::engine::CallContext,
        request: &'a spool_runtime::ModelRequest,
        deltas: spool_runtime::engine::Deltas<'a>,
        cancel: &'a tokio_util::sync::CancellationToken,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<spool_runtime::ModelResponse, spool_runtime::engine::EngineError>,
    > {
        if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.0.set_full(true);
        }
        spool_runtime::engines::EchoEngine.call(context, request, deltas, cancel)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_taken_before_the_journal_filled_is_202_running_and_completes_once_it_writes() {
    use spool_journal::store::faulty::Faulty;
    use spool_journal::store::memory::MemoryJournal;
    let journal = Arc::new(Faulty::new(MemoryJournal::new()));
    let runtime =
        spool_runtime::Runtime::builder(Arc::clone(&journal) as Arc<dyn spool_journal::Journal>)
            .engine(Arc::new(FillsTheDisk(Arc::clone(&journal), false.into())))
            .build();
    let server = Server::start(runtime).await;
    let taken = server.post("/spool/v1/runs", r#"{"text": "hello"}"#).await;
    assert_eq!(taken.status, 202, "{:?}", taken.json());
    let taken = taken.json();
    assert_eq!(taken["state"], "running");
    let run = taken["run_id"].as_str().unwrap().to_owned();

    // Once there is room, the run's own stream shows the turn finish.
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    journal.set_full(false);
    loop {
        let line = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the turn goes on once the journal writes")
            .expect("the stream stays open");
        if line["type"] == "run_response" {
            assert_eq!(line["text"], "echo: hello");
            break;
        }
    }
    assert_eq!(
        server.get(&format!("/spool/v1/runs/{run}")).await.json()["state"],
        "completed"
    );
    server.stop().await;
}

/// Sends `raw` on a fresh connection and reads until the server closes it.
async fn raw_exchange(addr: &str, raw: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read all of a
    // request it refuses; what it answers is what counts.
    let _ = socket.write_all(raw).await;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, socket.read_to_end(&mut reply))
        .await
        .expect("the server answers and closes in time");
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_refuses_before_routing_get_the_json_error_body() {
    let server = Server::start(echo_runtime()).await;
    let long_target = format!(
        "GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(70_000)
    );
    let many_headers = format!(
        "GET /spool/v1/health HTTP/1.1\r\nHost: localhost\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect::<String>()
    );
    let cases: [(&[u8], &str, &str); 3] = [
        (b"GARBAGE\r\n\r\n", "400", "bad_request"),
        (long_target.as_bytes(), "414", "uri_too_long"),
        (many_headers.as_bytes(), "431", "headers_too_large"),
    ];
    for (raw, status, code) in cases {
        let reply = raw_exchange(&server.addr, raw).await;
        assert!(reply.starts_with(&format!("HTTP/1.1 {status} ")), "{reply}");
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], code);
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    // The server still serves.
    assert_eq!(server.get("/spool/v1/health").await.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_without_an_authenticator_refuses_to_serve_where_other_machines_can_reach_it() {
    // Any non-loopback address of this machine: 0.0.0.0 is every one.
    let listener = spool_http::Listener::tcp("0.0.0.0:0").await.unwrap();
    let (_stop, closing) = tokio::sync::watch::channel(false);
    let channel = spool_http::HttpChannel::new(echo_runtime(), closing);
    let refused = channel.serve(listener, async {}).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(
        refused.to_string().contains("without an authenticator"),
        "{refused}"
    );
    assert!(spool_http::server::check_exposure("127.0.0.1:8080".parse().unwrap(), false).is_ok());
    assert!(spool_http::server::check_exposure("10.0.0.1:8080".parse().unwrap(), true).is_ok());
}
