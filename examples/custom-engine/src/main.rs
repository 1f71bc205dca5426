//! A model provider Spool does not ship, as an `Engine`: here a local
//! "model" that answers from a small table, streaming its answer word by
//! word and reporting its tokens. It is registered with
//! `RuntimeBuilder::engine`, without editing any Spool crate; a real one
//! would call its provider's API in `call` the same way.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example prints what it shows"
)]

use std::sync::Arc;

use spool_journal::event::Usage;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::engine::{CallContext, Delta, Deltas, EngineError};
use spool_runtime::hub::StreamItem;
use spool_runtime::{
    BoxFuture, Engine, Message, MessageRequest, ModelRequest, ModelResponse, Runtime, StartRequest,
};
use tokio_util::sync::CancellationToken;

/// The provider: answers the last user message from its table.
struct TableModel {
    answers: Vec<(&'static str, &'static str)>,
}

impl Engine for TableModel {
    fn call<'a>(
        &'a self,
        _context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        Box::pin(async move {
            let question = request
                .messages()
                .rev()
                .find_map(|m| match m {
                    Message::User { content } => Some(content.to_lowercase()),
                    _ => None,
                })
                .unwrap_or_default();
            let Some((_, answer)) = self.answers.iter().find(|(k, _)| question.contains(k)) else {
                // A stable code, never a guess: the turn fails `provider_error`.
                return Err(EngineError::Provider(format!("no answer for `{question}`")));
            };
            // Stream the answer as a provider's SSE would, and stop when
            // the turn is cancelled.
            for (i, word) in answer.split(' ').enumerate() {
                if cancel.is_cancelled() {
                    return Err(EngineError::Cancelled);
                }
                let piece = if i == 0 {
                    word.to_owned()
                } else {
                    format!(" {word}")
                };
                deltas(Delta::Text(piece));
                tokio::task::yield_now().await;
            }
            Ok(ModelResponse {
                text: (*answer).to_owned(),
                usage: Some(Usage {
                    input_tokens: question.split_whitespace().count() as u64,
                    output_tokens: answer.split_whitespace().count() as u64,
                }),
                finish_reason: Some("stop".into()),
                ..ModelResponse::default()
            })
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = TableModel {
        answers: vec![("capital of france", "The capital of France is Paris.")],
    };
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(engine))
        .build();
    // Live deltas are not kept for late subscribers: make the run (no turn
    // yet), open its stream, then send the question.
    let address = runtime.channel("faq")?.address("demo");
    let run = runtime.ensure(&address).await?;
    let mut events = runtime.subscribe(&run.run_id, run.cursor).await?;
    let question = MessageRequest {
        text: "What is the capital of France?".into(),
        ..Default::default()
    };
    runtime.send(&run.run_id, question).await?;
    let mut streamed = String::new();
    while let Some(item) = events.next().await {
        match item {
            StreamItem::Delta(live) => {
                if let Delta::Text(piece) = live.delta {
                    streamed.push_str(&piece);
                }
            }
            StreamItem::Event(envelope) => {
                if let spool_journal::Event::TurnCompleted(done) = &envelope.event {
                    println!("streamed: {streamed}");
                    println!("answer: {}", done.response.clone().unwrap_or_default());
                    let usage = done.usage.unwrap_or_default();
                    println!(
                        "tokens: {} in, {} out",
                        usage.input_tokens, usage.output_tokens
                    );
                    break;
                }
            }
            StreamItem::Lagged { .. } => break,
        }
    }
    // A question the table cannot answer fails the turn with a stable code.
    let failed = runtime
        .start(StartRequest {
            text: "What is the meaning of life?".into(),
            ..Default::default()
        })
        .await?;
    let turn = runtime.get(failed.run()).await?.turn_id.ok_or("a turn")?;
    let view = runtime.wait_for(failed.run(), &turn).await?;
    println!("unanswerable: {}", view.status.state());
    Ok(())
}
