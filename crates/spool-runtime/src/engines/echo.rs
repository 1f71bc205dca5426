//! `echo`: answers `echo: <the last user message>`, streamed word by word.
//! The embedded default: Spool runs end to end with no model configured.

use spool_journal::event::Usage;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::engine::{
    CallContext, Deltas, Engine, EngineError, Message, ModelRequest, ModelResponse,
};

/// The echo engine.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoEngine;

impl Engine for EchoEngine {
    fn call<'a>(
        &'a self,
        _context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        Box::pin(async move {
            let input = request
                .messages
                .iter()
                .rev()
                .find_map(|m| match m {
                    Message::User { content } => Some(content.as_str()),
                    _ => None,
                })
                .unwrap_or("");
            let text = format!("echo: {input}");
            super::stream_words(&text, std::time::Duration::ZERO, deltas, cancel).await?;
            let words = |t: &str| t.split_whitespace().count() as u64;
            Ok(ModelResponse {
                usage: Some(Usage {
                    input_tokens: request
                        .messages
                        .iter()
                        .map(|m| match m {
                            Message::System { content }
                            | Message::User { content }
                            | Message::Tool { content, .. } => words(content),
                            Message::Assistant { content, .. } => words(content),
                        })
                        .sum(),
                    output_tokens: words(&text),
                }),
                text,
                finish_reason: Some("stop".into()),
                ..ModelResponse::default()
            })
        })
    }
}
