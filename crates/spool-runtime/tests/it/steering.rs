//! Steered input always reaches the model: input steered in while the
//! turn's last model call runs is not left recorded and unread; the turn
//! calls the model again with it, and the caller's turn answers it.

use std::sync::Arc;

use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, Seq};
use spool_runtime::{Accepted, MessageRequest, Runtime};

use crate::support::{Held, begin, settle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_steered_during_the_last_model_call_is_answered_in_the_same_turn() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (held, gate) = Held::new();
    let runtime = Runtime::builder(Arc::clone(&journal)).engine(held).build();
    let (run, turn) = begin(&runtime, "first").await;
    // The model is answering "first" (its intent is recorded) when the
    // second message arrives.
    gate.entered().await;
    let steered = runtime
        .send(
            &run,
            MessageRequest {
                text: "and this too".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        steered,
        Accepted::Steered {
            run: run.clone(),
            turn: turn.clone()
        }
    );
    gate.open();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.response.as_deref(), Some("echo: and this too"));
    let log = journal.read(&run, Seq(0)).await.unwrap();
    let requests: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ModelCallRequested(r) => Some(r.new_messages.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 2, "the model was called again: {log:?}");
    assert_eq!(requests[1][0]["content"], "and this too");
}
