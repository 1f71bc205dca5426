//! Tracing at the edge: a span per connection, a span per request inside
//! it carrying the run it names, and a span per run's driver, so a slow
//! request can be followed from its socket to the run's turn
//! (`RUST_LOG=spool=debug` shows them).

use crate::client::*;
use crate::spans_support::{Capture, Seen};

#[tokio::test(flavor = "current_thread")]
async fn a_request_runs_in_a_span_inside_its_connections_naming_its_run_and_the_run_has_its_own() {
    // Every task of this test runs on this thread, under this subscriber.
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.subscriber());
    let server = Server::start(echo_runtime()).await;
    let started = server.post("/spool/v1/runs", r#"{"text": "hi"}"#).await;
    assert_eq!(started.status, 200);
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let reply = server.get(&format!("/spool/v1/runs/{run}")).await;
    assert_eq!(reply.status, 200);
    server.stop().await;
    let seen: Vec<Seen> = capture.seen();
    let named = |name: &str| -> Vec<&Seen> { seen.iter().filter(|s| s.name == name).collect() };
    let requests = named("request");
    let read = requests
        .iter()
        .find(|s| s.fields.get("path").is_some_and(|p| p.ends_with(&run)))
        .unwrap_or_else(|| panic!("the GET's span among {requests:?}"));
    assert_eq!(read.fields.get("method").map(String::as_str), Some("GET"));
    assert_eq!(read.fields.get("run_id"), Some(&run), "{read:?}");
    assert_eq!(read.parent.as_deref(), Some("connection"), "{read:?}");
    let connections = named("connection");
    assert!(
        connections.iter().all(
            |c| c.fields.get("transport").map(String::as_str) == Some("tcp")
                && c.fields.contains_key("peer")
        ),
        "{connections:?}"
    );
    let runs = named("run");
    assert!(
        runs.iter().any(|r| r.fields.get("run_id") == Some(&run)),
        "the run's driver has a span naming it: {runs:?}"
    );
}
