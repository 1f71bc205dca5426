//! The engines that live in the runtime: `echo`, the embedded default, and
//! `scripted`, the test double. Real providers live in `spool-engines`.

mod echo;
mod scripted;

pub use echo::EchoEngine;
pub use scripted::{ScriptError, ScriptedEngine};

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::{Delta, Deltas, EngineError};

/// Streams `text` word by word (spaces kept with the word that follows
/// them), waiting `pace` between words, until done or cancelled.
async fn stream_words(
    text: &str,
    pace: Duration,
    deltas: Deltas<'_>,
    cancel: &CancellationToken,
) -> Result<(), EngineError> {
    let mut start = 0;
    let bytes = text.as_bytes();
    while start < text.len() {
        // A word, and the spaces before the next one.
        let mut end = start;
        while end < text.len() && bytes[end] != b' ' {
            end += 1;
        }
        while end < text.len() && bytes[end] == b' ' {
            end += 1;
        }
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        deltas(Delta::Text(text[start..end].to_owned()));
        start = end;
        if !pace.is_zero() && start < text.len() {
            tokio::select! {
                () = cancel.cancelled() => return Err(EngineError::Cancelled),
                () = tokio::time::sleep(pace) => {}
            }
        }
    }
    Ok(())
}
