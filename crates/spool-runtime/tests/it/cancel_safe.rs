//! A subscription's `next()` is cancel-safe: a caller that drops it (a
//! `select!` beside its own input, as `spool chat` does) and calls again
//! loses no delta and no event, even when the drop lands while the
//! subscription is reading the journal.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use spool_journal::store::BoxFuture;
use spool_journal::{Address, Journal};
use spool_runtime::engine::{CallContext, Delta, Deltas, EngineError};
use spool_runtime::hub::StreamItem;
use spool_runtime::{Engine, MessageRequest, ModelRequest, ModelResponse, Runtime};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::support::{Instrumented, PATIENCE};

/// Streams "partial", says so, then answers once its gate opens.
struct Partial {
    open: watch::Receiver<bool>,
    published: Arc<Notify>,
}

impl Engine for Partial {
    fn call<'a>(
        &'a self,
        _context: &'a CallContext,
        _request: &'a ModelRequest,
        deltas: Deltas<'a>,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        let mut open = self.open.clone();
        Box::pin(async move {
            deltas(Delta::Text("partial".into()));
            self.published.notify_one();
            if open.wait_for(|open| *open).await.is_err() {
                return Err(EngineError::Cancelled);
            }
            Ok(ModelResponse {
                text: "partial answer".into(),
                ..ModelResponse::default()
            })
        })
    }
}

fn describe(item: &StreamItem) -> Value {
    match item {
        StreamItem::Event(envelope) => Value::from(envelope.event.kind()),
        StreamItem::Delta(delta) => Value::from(format!("delta {:?}", delta.delta)),
        StreamItem::Lagged { .. } => Value::from("lagged"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_dropped_while_reading_the_journal_loses_no_delta_and_no_event() {
    let journal = Arc::new(Instrumented::default());
    let (answer, open) = watch::channel(false);
    let published = Arc::new(Notify::new());
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>)
        .engine(Arc::new(Partial {
            open,
            published: Arc::clone(&published),
        }))
        .build();
    let run = runtime
        .ensure(&Address::new("test", "cancel-safe"))
        .await
        .unwrap()
        .run_id;
    let mut stream = runtime.subscribe(&run, None).await.unwrap();
    let first = stream.next().await.unwrap();
    assert_eq!(describe(&first), "run_created");
    journal.holding.store(true, Ordering::SeqCst);
    runtime
        .send(
            &run,
            MessageRequest {
                text: "go".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    // The delta waits in the broadcast, beside the change notices.
    tokio::time::timeout(PATIENCE, published.notified())
        .await
        .expect("the engine streams in time");
    // Twice, the caller gives up on `next()` while it waits for a read:
    // whatever it had taken (a change notice, a delta) must survive.
    for _ in 0..2 {
        tokio::time::timeout(PATIENCE, async {
            tokio::select! {
                item = stream.next() => panic!("an item came while reads are held: {item:?}"),
                () = journal.entered.notified() => {}
            }
        })
        .await
        .expect("the subscription reads the journal in time");
    }
    journal.holding.store(false, Ordering::SeqCst);
    journal.go.send_replace(true);
    answer.send_replace(true);
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            seen.push(describe(&item));
            if seen.last() == Some(&Value::from("turn_completed")) {
                break;
            }
        }
    })
    .await
    .expect("the turn's items arrive in time");
    assert_eq!(
        seen,
        [
            "turn_started",
            "model_call_requested",
            "delta Text(\"partial\")",
            "model_call_completed",
            "turn_completed"
        ]
    );
}
