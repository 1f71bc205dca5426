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
                .messages()
                .rev()
                .find_map(|m| match m {
                    Message::User { content } => Some(content.as_str()),
                    _ => None,
                })
                .unwrap_or("");
            let text = format!("echo: {input}");
            super::stream_words(&text, std::time::Duration::ZERO, deltas, cancel).await?;
            // About four bytes a token, the usual rule of thumb. Reading
            // lengths rather than words keeps a long run's call as cheap
            // as a short one's, which is what the echo engine is for.
            let bytes: usize = request
                .messages()
                .map(|m| match m {
                    Message::System { content }
                    | Message::User { content }
                    | Message::Tool { content, .. }
                    | Message::Assistant { content, .. } => content.len(),
                })
                .sum();
            Ok(ModelResponse {
                usage: Some(Usage {
                    input_tokens: bytes.div_ceil(4) as u64,
                    output_tokens: text.len().div_ceil(4) as u64,
                }),
                text,
                finish_reason: Some("stop".into()),
                ..ModelResponse::default()
            })
        })
    }
}
