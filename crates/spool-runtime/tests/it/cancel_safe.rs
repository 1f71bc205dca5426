//! A subscription's `next()` is cancel-safe: a caller that drops it (a
//! `select!` beside its own input, as `spool chat` does) and calls again
//! loses no delta and no event, even when the drop lands while the
//! subscription is reading the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::store::{BoxFuture, CallRef, Claim, ClaimKey, RunSummary};
use spool_journal::{Address, Envelope, Event, Journal, JournalError, Principal, RunId, Seq};
use spool_runtime::engine::{CallContext, Delta, Deltas, EngineError};
use spool_runtime::hub::StreamItem;
use spool_runtime::{Engine, MessageRequest, ModelRequest, ModelResponse, Runtime};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::support::PATIENCE;

/// A memory journal whose reads, once held, wait until let go, saying
/// when one has begun.
#[derive(Default)]
struct HeldReads {
    inner: MemoryJournal,
    holding: AtomicBool,
    entered: Notify,
    go: watch::Sender<bool>,
}

impl Journal for HeldReads {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        self.inner.append(run, expected, events)
    }

    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: Seq,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(async move {
            if self.holding.load(Ordering::SeqCst) {
                self.entered.notify_one();
                let mut go = self.go.subscribe();
                if go.wait_for(|go| *go).await.is_err() {
                    return Err(JournalError::Closed);
                }
            }
            self.inner.read(run, from).await
        })
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        self.inner.runs()
    }

    fn find_address<'a>(
        &'a self,
        address: &'a Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        self.inner.find_address(address)
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        self.inner.find_operation(principal, operation_id)
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        self.inner.claim(key, holder)
    }

    fn subscribe<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<watch::Receiver<Seq>, JournalError>> {
        self.inner.subscribe(run)
    }
}

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
    let journal = Arc::new(HeldReads::default());
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
