//! The bus server driven over loopback HTTP as another instance would:
//! every check in its order with its status and code, and delegations.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use spool_bus::{BusServer, Settings};
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::Runtime;
use spool_runtime::engines::ScriptedEngine;
use tokio::sync::watch;

const PATIENCE: Duration = Duration::from_secs(20);
const SECRET: &str = "s3cret-of-the-worker";

fn runtime(script: Option<&str>) -> Runtime {
    let mut builder = Runtime::builder(Arc::new(MemoryJournal::new()));
    if let Some(script) = script {
        builder = builder.engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()));
    }
    builder.build()
}

fn settings() -> Settings {
    Settings {
        instance: "worker".into(),
        peers: vec!["reviewer".into()],
        max_depth: 3,
        secret: SECRET.into(),
        budget: None,
    }
}

/// A server on a free loopback port; it stops when the sender is dropped.
async fn serve(server: &BusServer) -> (String, watch::Sender<bool>) {
    let listener = spool_edge::Listener::tcp("127.0.0.1:0").await.unwrap();
    let addr = listener.describe();
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(spool_edge::serve(listener, server.handler(), async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    (addr, stop)
}

/// One request: its status and JSON body.
async fn call(
    addr: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Vec<u8>,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json");
    if let Some(bearer) = bearer {
        request = request.header("authorization", format!("Bearer {bearer}"));
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, sender.send_request(request))
        .await
        .expect("an answer in time")
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn talk(addr: &str, bearer: Option<&str>, request: &Value) -> (u16, Value) {
    call(
        addr,
        "POST",
        "/api/talk",
        bearer,
        request.to_string().into_bytes(),
    )
    .await
}

fn request(from: &str, depth: u64) -> Value {
    json!({"fromInstance": from, "prompt": "check this", "depth": depth, "protocolVersion": 1, "capabilities": ["structured-errors", "retryable-errors"]})
}

/// Asserts a v1 failure envelope from the worker with `code`.
fn refused(reply: &(u16, Value), status: u16, code: &str) {
    let (got, body) = reply;
    assert_eq!(*got, status, "{body}");
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], code, "{body}");
    assert_eq!(body["fromInstance"], "worker");
    assert_eq!(body["protocolVersion"], 1);
    assert!(body["durationMs"].is_u64(), "{body}");
    assert!(body["capabilities"].is_array(), "{body}");
    assert!(body["retryable"].is_boolean(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_answers_in_its_order_with_its_status_and_code() {
    let server = BusServer::new(runtime(None), settings());
    let (addr, _stop) = serve(&server).await;
    // Too large is refused first, whatever else is wrong.
    let huge = vec![b'x'; 256 * 1024 + 1];
    refused(
        &call(&addr, "POST", "/api/talk", None, huge).await,
        413,
        "request_too_large",
    );
    // The secret before the body: a wrong one, and one of another length.
    refused(
        &talk(
            &addr,
            Some("wrong-secret-of-the-worker"),
            &request("reviewer", 0),
        )
        .await,
        401,
        "auth_failed",
    );
    refused(
        &talk(&addr, Some("x"), &request("reviewer", 0)).await,
        401,
        "auth_failed",
    );
    refused(
        &talk(&addr, None, &json!("not even an object")).await,
        401,
        "auth_failed",
    );
    // Then the body's schema, the peer, the depth.
    refused(
        &call(
            &addr,
            "POST",
            "/api/talk",
            Some(SECRET),
            b"{not json".to_vec(),
        )
        .await,
        400,
        "invalid_request",
    );
    refused(
        &talk(
            &addr,
            Some(SECRET),
            &json!({"fromInstance": "", "prompt": "p", "depth": 0}),
        )
        .await,
        400,
        "invalid_request",
    );
    refused(
        &talk(&addr, Some(SECRET), &request("stranger", 0)).await,
        403,
        "peer_not_allowed",
    );
    refused(
        &talk(&addr, Some(SECRET), &request("reviewer", 3)).await,
        429,
        "max_depth_exceeded",
    );
    // A legacy request (no version, no capabilities) is accepted.
    let (status, answer) = talk(
        &addr,
        Some(SECRET),
        &json!({"fromInstance": "reviewer", "prompt": "hi", "depth": 2}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["success"], true);
    assert_eq!(answer["text"], "echo: hi");
    assert_eq!(answer["fromInstance"], "worker");
    assert_eq!(answer["protocolVersion"], 1);
    // `*` admits any instance.
    let open = BusServer::new(
        runtime(None),
        Settings {
            peers: vec!["*".into()],
            ..settings()
        },
    );
    let (any, _open) = serve(&open).await;
    assert_eq!(
        talk(&any, Some(SECRET), &request("stranger", 0)).await.0,
        200
    );
    // An instance whose bus is off says so, after the size check.
    let (addr, _stop) = serve(&BusServer::disabled("worker")).await;
    refused(
        &talk(&addr, Some(SECRET), &request("reviewer", 0)).await,
        403,
        "bus_disabled",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_names_the_instance_so_a_caller_can_check_before_sending_its_secret() {
    let (addr, _stop) = serve(&BusServer::new(runtime(None), settings())).await;
    let (status, health) = call(&addr, "GET", "/api/health", None, Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(
        health,
        json!({"status": "ok", "kind": "spool", "instance": "worker", "protocolVersion": 1})
    );
    let (status, body) = call(&addr, "GET", "/elsewhere", None, Vec::new()).await;
    assert_eq!(status, 404);
    assert_eq!(body["errorCode"], "invalid_request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_delegation_sent_twice_runs_once_and_answers_the_same() {
    let runtime = runtime(None);
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let mut first = request("reviewer", 1);
    first["ext"] = json!({"spool": {"delegation_id": "d-42"}});
    let one = talk(&addr, Some(SECRET), &first).await;
    let two = talk(&addr, Some(SECRET), &first).await;
    assert_eq!(one.1["text"], "echo: check this");
    assert_eq!(two.1["text"], one.1["text"]);
    assert_eq!(
        runtime.list().await.unwrap().len(),
        1,
        "one run for one delegation"
    );
    // The same id with another prompt is still that delegation (the rule
    // every surface answers a replayed operation by): its outcome, no run.
    let mut changed = first.clone();
    changed["prompt"] = json!("something else");
    let three = talk(&addr, Some(SECRET), &changed).await;
    assert_eq!(three.0, 200, "{three:?}");
    assert_eq!(three.1["text"], one.1["text"]);
    assert_eq!(runtime.list().await.unwrap().len(), 1);
    // Without an id, each request is a delegation of its own.
    talk(&addr, Some(SECRET), &request("reviewer", 1)).await;
    assert_eq!(runtime.list().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_id_over_its_limit_is_invalid_request_and_not_retried() {
    let runtime = runtime(None);
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let mut long = request("reviewer", 1);
    long["ext"] = json!({"spool": {"delegation_id": "d".repeat(257)}});
    let (_, body) = talk(&addr, Some(SECRET), &long).await;
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], "invalid_request", "{body}");
    assert_eq!(body["retryable"], false, "{body}");
    assert!(runtime.list().await.unwrap().is_empty(), "nothing was run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_that_parks_answers_workflow_state_naming_its_run() {
    let script =
        r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}"#;
    let (addr, _stop) = serve(&BusServer::new(runtime(Some(script)), settings())).await;
    let (status, answer) = talk(&addr, Some(SECRET), &request("reviewer", 0)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["success"], false);
    assert_eq!(answer["errorCode"], "workflow_state");
    assert_eq!(answer["retryable"], false);
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains("run_") && error.contains("Which region?"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delegation_carries_the_code_of_its_failure() {
    // A provider's failure is the seed's `engine_cli`.
    let script = r#"{"error": "the model is down"}"#;
    let (addr, _stop) = serve(&BusServer::new(runtime(Some(script)), settings())).await;
    let (status, answer) = talk(&addr, Some(SECRET), &request("reviewer", 0)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["success"], false);
    assert_eq!(answer["errorCode"], "engine_cli", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("the model is down"),
        "{answer}"
    );
}

mod delegate;

mod client {
    use std::time::Duration;

    use spool_bus::client::{Options, Route, Target, talk};

    use super::*;

    fn target(addr: &str, instance: &str) -> Route {
        Route::Direct(Target {
            addr: addr.parse().unwrap(),
            instance: instance.into(),
            secret: SECRET.into(),
        })
    }

    fn quick() -> Options {
        Options {
            timeout: PATIENCE,
            attempts: 2,
            backoff: Duration::from_millis(10),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delegation_reaches_the_instance_its_health_check_names() {
        let runtime = runtime(None);
        let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
        let answer = talk(
            "reviewer",
            &target(&addr, "worker"),
            "hello",
            1,
            None,
            &quick(),
        )
        .await;
        assert!(answer.success, "{answer:?}");
        assert_eq!(answer.text(), "echo: hello");
        assert_eq!(answer.from_instance.as_deref(), Some("worker"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_port_answering_as_another_instance_never_gets_the_secret() {
        let runtime = runtime(None);
        let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
        let answer = talk(
            "reviewer",
            &target(&addr, "someone-else"),
            "hello",
            1,
            None,
            &quick(),
        )
        .await;
        assert!(!answer.success);
        assert_eq!(
            answer.code(),
            Some(spool_wire::bus::ErrorCode::InstanceUnavailable)
        );
        assert!(
            runtime.list().await.unwrap().is_empty(),
            "nothing was delegated"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_listening_is_instance_unavailable_and_retryable() {
        // A port that was free a moment ago.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let answer = talk(
            "reviewer",
            &target(&addr, "worker"),
            "hello",
            1,
            None,
            &quick(),
        )
        .await;
        assert_eq!(
            answer.code(),
            Some(spool_wire::bus::ErrorCode::InstanceUnavailable)
        );
        assert!(answer.is_retryable());
    }

    #[tokio::test]
    async fn an_address_off_this_machine_is_refused_before_any_connection() {
        let answer = talk(
            "reviewer",
            &target("192.0.2.1:9", "worker"),
            "hello",
            1,
            None,
            &quick(),
        )
        .await;
        assert_eq!(
            answer.code(),
            Some(spool_wire::bus::ErrorCode::InvalidRequest)
        );
    }
}

mod registry {
    use std::os::unix::fs::PermissionsExt;

    use spool_bus::registry;

    #[test]
    fn twenty_instances_registering_at_once_are_all_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool").join("bus-registry.json");
        let threads: Vec<_> = (0..20u16)
            .map(|n| {
                let path = path.clone();
                std::thread::spawn(move || {
                    registry::register(&path, &format!("instance-{n}"), 7000 + n, "s").unwrap();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let instances = registry::read(&path).unwrap();
        assert_eq!(instances.len(), 20, "{instances:?}");
        assert_eq!(instances["instance-7"].port, 7007);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
    }

    #[test]
    fn a_registry_others_can_read_or_in_a_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus-registry.json");
        registry::register(&path, "live", 7002, "s").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = registry::read(&path).unwrap_err();
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{error}"
        );
        assert!(
            error.to_string().contains("read or written by others"),
            "{error}"
        );
        assert!(registry::register(&path, "other", 7003, "t").is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = registry::read(&path).unwrap_err();
        assert!(
            error.to_string().contains("directory others can write"),
            "{error}"
        );
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(registry::read(&path).unwrap().len(), 1);
    }

    #[test]
    fn entries_of_processes_that_are_gone_and_entries_that_do_not_decode_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus-registry.json");
        std::fs::write(
            &path,
            r#"{"ghost": {"port": 7001, "pid": 4000000000, "secret": "s", "updatedAt": "2026-01-01T00:00:00Z"},
                "garbled": {"port": "not a port"}}"#,
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            registry::read(&path).unwrap().len(),
            1,
            "the garbled entry is left out"
        );
        registry::register(&path, "live", 7002, "s").unwrap();
        let instances = registry::read(&path).unwrap();
        assert_eq!(instances.keys().collect::<Vec<_>>(), ["live"]);
        registry::deregister(&path, "live").unwrap();
        assert!(registry::read(&path).unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_whose_port_answers_as_another_instance_or_not_at_all_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus-registry.json");
        let (addr, _stop) = super::serve(&super::BusServer::new(
            super::runtime(None),
            super::settings(),
        ))
        .await;
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        // A port bound, then let go: nothing answers there.
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // All three with this (live) process's pid: only their ports tell.
        registry::register(&path, "worker", port, "s").unwrap();
        registry::register(&path, "impostor", port, "s").unwrap();
        registry::register(&path, "gone", dead, "s").unwrap();
        let mut pruned = registry::prune_foreign(&path).await.unwrap();
        pruned.sort();
        assert_eq!(pruned, ["gone", "impostor"]);
        let left = registry::read(&path).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["worker"]);
    }
}

/// A health check that answers as the seed's reference implementation
/// does, with its own `kind`, on a free loopback port; its address.
async fn reference_health(instance: &'static str, kind: &'static str) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0_u8; 1024];
            let _ = socket.read(&mut request).await;
            let body = json!({"status": "ok", "kind": kind, "instance": instance}).to_string();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_instance_whose_health_names_another_kind_is_reached_and_a_stranger_is_not() {
    use spool_bus::client::{Probe, probe};
    let reference = reference_health("worker", "cc-telegram-bridge").await;
    assert_eq!(probe(reference, "worker").await, Probe::Itself);
    // The name is what keeps the secret from a stranger holding the port.
    assert!(matches!(
        probe(reference, "reviewer").await,
        Probe::Elsewhere(_)
    ));
    let nameless = reference_health("worker", "").await;
    assert!(matches!(
        probe(nameless, "worker").await,
        Probe::Elsewhere(_)
    ));
}

/// One raw request, its status line and body: what a browser would send,
/// headers and all.
async fn raw(addr: &str, head: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut reply))
        .await
        .expect("an answer in time")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let (_, body) = reply.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_a_browser_cannot_talk_to_the_bus_by_origin_host_or_form() {
    let server = BusServer::new(runtime(None), settings());
    let (addr, _stop) = serve(&server).await;
    let body = request("reviewer", 0).to_string();
    let cases = [
        // A cross-origin fetch from any page.
        (
            format!(
                "POST /api/talk HTTP/1.1\r\nhost: {addr}\r\norigin: http://evil.example\r\ncontent-type: application/json\r\nauthorization: Bearer {SECRET}"
            ),
            403,
            "origin_not_allowed",
        ),
        // A DNS-rebinding page: its own name in Host.
        (
            format!(
                "POST /api/talk HTTP/1.1\r\nhost: evil.example:{}\r\ncontent-type: application/json\r\nauthorization: Bearer {SECRET}",
                addr.rsplit_once(':').unwrap().1
            ),
            403,
            "host_not_allowed",
        ),
        // A form or `no-cors` body.
        (
            format!(
                "POST /api/talk HTTP/1.1\r\nhost: {addr}\r\ncontent-type: text/plain\r\nauthorization: Bearer {SECRET}"
            ),
            415,
            "unsupported_media_type",
        ),
    ];
    // Every route, the cancel route too: the guard stands before them all.
    for path in ["/api/talk", "/api/cancel"] {
        for (head, status, code) in &cases {
            let reply = raw(&addr, &head.replace("/api/talk", path), &body).await;
            refused(&reply, *status, code);
        }
    }
    // The health answer, read by a rebinding page, is refused too.
    let reply = raw(
        &addr,
        "GET /api/health HTTP/1.1\r\nhost: rebound.example",
        "",
    )
    .await;
    refused(&reply, 403, "host_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegations_failure_is_answered_200_and_not_retryable_under_its_id() {
    // The handler's answer is 200 whatever the delegation came to
    // (bus.md's check order, step 7); under a delegation id a retry would
    // be answered the same failed run, so it says not to retry.
    let runtime = runtime(Some(r#"{"error": "the provider is down"}"#));
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let mut identified = request("reviewer", 1);
    identified["ext"] = json!({"spool": {"delegation_id": "d-7"}});
    let (status, body) = talk(&addr, Some(SECRET), &identified).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], "engine_cli", "{body}");
    assert_eq!(body["retryable"], false, "{body}");
    // Without an id each request is a new delegation: the code's own
    // retryability stands.
    let (status, body) = talk(&addr, Some(SECRET), &request("reviewer", 1)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["retryable"], true, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_run_is_found_at_the_address_of_its_sender_and_id() {
    let runtime = runtime(None);
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let mut first = request("reviewer", 1);
    first["ext"] = json!({"spool": {"delegation_id": "d-42"}});
    let (status, body) = talk(&addr, Some(SECRET), &first).await;
    assert_eq!(status, 200, "{body}");
    let address = spool_journal::Address::new(spool_bus::server::NAMESPACE, "reviewer/d-42");
    let view = runtime.lookup(&address).await.unwrap();
    assert_eq!(view.response.as_deref(), Some("echo: check this"));
}

/// An engine whose calls wait for their cancellation, saying when one began.
struct Waits(Arc<tokio::sync::Notify>);

impl spool_runtime::Engine for Waits {
    fn call<'a>(
        &'a self,
        _context: &'a spool_runtime::engine::CallContext,
        _request: &'a spool_runtime::ModelRequest,
        _deltas: spool_runtime::engine::Deltas<'a>,
        cancel: &'a tokio_util::sync::CancellationToken,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<spool_runtime::ModelResponse, spool_runtime::engine::EngineError>,
    > {
        Box::pin(async move {
            self.0.notify_one();
            cancel.cancelled().await;
            Err(spool_runtime::engine::EngineError::Cancelled)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_cancels_its_delegation_and_the_delegated_run_ends_cancelled() {
    let entered = Arc::new(tokio::sync::Notify::new());
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(Waits(Arc::clone(&entered))))
        .build();
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let mut delegation = request("reviewer", 1);
    delegation["ext"] = json!({"spool": {"delegation_id": "d-9"}});
    let asked = {
        let addr = addr.clone();
        tokio::spawn(async move { talk(&addr, Some(SECRET), &delegation).await })
    };
    tokio::time::timeout(Duration::from_secs(20), entered.notified())
        .await
        .expect("the delegated run calls its model");
    let cancel = json!({"fromInstance": "reviewer", "delegationId": "d-9"});
    let (status, body) = call(
        &addr,
        "POST",
        "/api/cancel",
        Some(SECRET),
        serde_json::to_vec(&cancel).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "requested", "{body}");
    // The delegation is answered with its run's end: cancelled, a state.
    let (status, answer) = tokio::time::timeout(Duration::from_secs(20), asked)
        .await
        .expect("the delegation is answered once its run ends")
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["errorCode"], "session_state", "{answer}");
    // Another instance's delegation, or one that is over, is not active.
    let other = json!({"fromInstance": "reviewer", "delegationId": "d-unknown"});
    let (_, body) = call(
        &addr,
        "POST",
        "/api/cancel",
        Some(SECRET),
        serde_json::to_vec(&other).unwrap(),
    )
    .await;
    assert_eq!(body["text"], "not_active", "{body}");
    // Without the secret, nothing.
    let (status, body) = call(
        &addr,
        "POST",
        "/api/cancel",
        None,
        serde_json::to_vec(&cancel).unwrap(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["errorCode"], "auth_failed", "{body}");
    // A body that is not a cancel, or one from a stranger: the bus's codes.
    let (status, body) = call(
        &addr,
        "POST",
        "/api/cancel",
        Some(SECRET),
        br#"{"delegationId": 7}"#.to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["errorCode"], "invalid_request", "{body}");
    let stranger = json!({"fromInstance": "stranger", "delegationId": "d-9"});
    let (status, body) = call(
        &addr,
        "POST",
        "/api/cancel",
        Some(SECRET),
        serde_json::to_vec(&stranger).unwrap(),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["errorCode"], "peer_not_allowed", "{body}");
}

#[path = "../../../spool-http/tests/support/spans.rs"]
mod spans_support;

#[tokio::test(flavor = "current_thread")]
async fn a_delegation_runs_in_a_request_span_inside_its_connections_naming_its_run() {
    // Every task of this test runs on this thread, under this subscriber.
    let capture = spans_support::Capture::default();
    let _default = tracing::subscriber::set_default(capture.subscriber());
    let runtime = runtime(None);
    let (addr, _stop) = serve(&BusServer::new(runtime.clone(), settings())).await;
    let (status, body) = talk(&addr, Some(SECRET), &request("reviewer", 1)).await;
    assert_eq!(status, 200, "{body}");
    let run = runtime.list().await.unwrap()[0].run_id.to_string();
    let seen = capture.seen();
    assert!(
        seen.iter().any(|s| s.name == "bus request"
            && s.fields.get("run_id") == Some(&run)
            && s.parent.as_deref() == Some("connection")),
        "{seen:?}"
    );
}
