//! JSON-RPC's spans: one per request naming its method and the run it
//! names, one per subscription naming its run (`RUST_LOG=spool=debug`).

use std::sync::Arc;

use serde_json::json;
use spool_journal::store::memory::MemoryJournal;
use spool_rpc::Dispatcher;
use spool_runtime::Runtime;

use crate::PATIENCE;
use crate::spans_support::Capture;

#[tokio::test(flavor = "current_thread")]
async fn a_request_and_a_subscription_each_run_in_a_span_naming_their_run() {
    // Every task of this test runs on this thread, under this subscriber.
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.subscriber());
    let dispatcher = Dispatcher::new(Runtime::builder(Arc::new(MemoryJournal::new())).build());
    let (connection, _outgoing) = dispatcher.connect(None);
    let started = tokio::time::timeout(
        PATIENCE,
        connection.request("submit.run", json!({"text": "hi"})),
    )
    .await
    .unwrap()
    .unwrap();
    let run = started["run_id"].as_str().unwrap().to_owned();
    tokio::time::timeout(
        PATIENCE,
        connection.request("run.get", json!({"run_id": run})),
    )
    .await
    .unwrap()
    .unwrap();
    tokio::time::timeout(
        PATIENCE,
        connection.request("subscribe", json!({"run_id": run})),
    )
    .await
    .unwrap()
    .unwrap();
    connection.close().await;
    let seen = capture.seen();
    let requests: Vec<_> = seen.iter().filter(|s| s.name == "rpc request").collect();
    assert!(
        requests.iter().any(
            |s| s.fields.get("method").map(String::as_str) == Some("run.get")
                && s.fields.get("run_id") == Some(&run)
        ),
        "{requests:?}"
    );
    // The subscription's span is opened by the `subscribe` request's.
    assert!(
        seen.iter().any(|s| s.name == "subscription"
            && s.fields.get("run_id") == Some(&run)
            && s.parent.as_deref() == Some("rpc request")),
        "{seen:?}"
    );
}
