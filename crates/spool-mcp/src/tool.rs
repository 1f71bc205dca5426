//! One MCP server tool as a Spool tool: its name as the model sees it, its
//! effect (the operator's word, else the server's annotations), whether a
//! person approves a call first, and its result as the model's output.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_runtime::engine::ToolSpec;
use spool_runtime::{BoxFuture, Tool, ToolContext, ToolOutcome};
use tokio_util::sync::CancellationToken;

use crate::client::Server;
use crate::config::Approval;

/// The longest tool name providers accept (OpenAI's and Anthropic's limit).
pub const MAX_NAME: usize = 64;

/// A tool of an MCP server.
#[derive(Debug)]
pub struct McpTool {
    server: Arc<Server>,
    /// The server's name for it.
    tool: String,
    spec: ToolSpec,
    effect: Effect,
}

/// The name the model sees for `tool` of `server`: `SERVER__TOOL`, every
/// character outside `[A-Za-z0-9_-]` made `_` (providers refuse a dot),
/// cut to [`MAX_NAME`].
#[must_use]
pub fn model_name(server: &str, tool: &str) -> String {
    let tool: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("{server}__{tool}");
    name.truncate(MAX_NAME);
    name
}

/// What a tool may do to the world: the operator's `effect` for it, else
/// its annotations (`readOnlyHint` a read, `idempotentHint` idempotent),
/// else a write, the strictest.
#[must_use]
pub fn effect_of(tool: &rmcp::model::Tool, operator: Option<Effect>) -> Effect {
    if let Some(effect) = operator {
        return effect;
    }
    let hints = tool.annotations.as_ref();
    if hints.and_then(|a| a.read_only_hint) == Some(true) {
        Effect::Read
    } else if hints.and_then(|a| a.idempotent_hint) == Some(true) {
        Effect::Idempotent
    } else {
        Effect::Write
    }
}

impl McpTool {
    /// `tool` of `server`, as the model will see it.
    #[must_use]
    pub fn new(server: Arc<Server>, tool: &rmcp::model::Tool) -> Self {
        let section = server.section();
        let effect = effect_of(tool, section.effect.get(tool.name.as_ref()).copied());
        let spec = ToolSpec {
            name: model_name(&section.name, &tool.name),
            description: tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .unwrap_or_default()
                .to_owned(),
            input_schema: Value::Object((*tool.input_schema).clone()),
        };
        Self {
            tool: tool.name.to_string(),
            server,
            spec,
            effect,
        }
    }

    /// The server's name for the tool.
    #[must_use]
    pub fn server_tool(&self) -> &str {
        &self.tool
    }
}

impl McpTool {
    async fn send(
        &self,
        input: Value,
        cancel: &CancellationToken,
        progress: Option<crate::client::Progress>,
    ) -> ToolOutcome {
        let arguments = match input {
            Value::Object(map) => map,
            // The input was checked against the server's schema, which MCP
            // requires to be an object's.
            _ => serde_json::Map::new(),
        };
        match self
            .server
            .call(&self.tool, arguments, cancel, progress)
            .await
        {
            Ok(result) => outcome(&result),
            Err(error) => ToolOutcome::Error(error.to_string()),
        }
    }
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn effect(&self) -> Effect {
        self.effect
    }

    fn approval(&self, input: &Value) -> Option<String> {
        let ask = match self.server.section().approval {
            Approval::Never => false,
            Approval::Always => true,
            Approval::Destructive => self.effect != Effect::Read,
        };
        ask.then(|| {
            let mut shown = input.to_string();
            if shown.len() > 500 {
                let mut end = 500;
                while !shown.is_char_boundary(end) {
                    end -= 1;
                }
                shown.truncate(end);
                shown.push('…');
            }
            format!(
                "Allow the MCP server `{}` to run `{}` with {shown}?",
                self.server.section().name,
                self.tool
            )
        })
    }

    fn call<'a>(
        &'a self,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(self.send(input, cancel, None))
    }

    fn call_in<'a>(
        &'a self,
        context: &'a ToolContext,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        // The server's progress for this call goes to the run's streams.
        let context = context.clone();
        let progress: crate::client::Progress = Arc::new(move |message| context.progress(message));
        Box::pin(self.send(input, cancel, Some(progress)))
    }
}

/// A call's result as the model's output: its text, its structured
/// content with the text beside it when they differ, and a short
/// placeholder for each image, audio or binary part. An output larger than
/// a command tool may print ([`spool_runtime::process::MAX_OUTPUT_BYTES`])
/// is a failed call rather than a journal entry that size.
#[must_use]
pub fn outcome(result: &CallToolResult) -> ToolOutcome {
    let outcome = unbounded(result);
    if let ToolOutcome::Output(output) = &outcome {
        let size = serde_json::to_vec(output).map_or(usize::MAX, |bytes| bytes.len());
        if size > spool_runtime::process::MAX_OUTPUT_BYTES {
            return ToolOutcome::Error(format!(
                "the tool's result is {size} bytes, more than the {} a tool may return",
                spool_runtime::process::MAX_OUTPUT_BYTES
            ));
        }
    }
    outcome
}

fn unbounded(result: &CallToolResult) -> ToolOutcome {
    let text = result
        .content
        .iter()
        .map(part_text)
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        return ToolOutcome::Error(if text.is_empty() {
            "the tool reported an error without a message".into()
        } else {
            text
        });
    }
    match &result.structured_content {
        None => ToolOutcome::Output(Value::String(text)),
        // The text is often the structured value serialized (the spec asks
        // servers to send both): then once is enough.
        Some(structured)
            if text.is_empty()
                || serde_json::from_str::<Value>(&text).ok().as_ref() == Some(structured) =>
        {
            ToolOutcome::Output(structured.clone())
        }
        Some(structured) => ToolOutcome::Output(json!({"structured": structured, "text": text})),
    }
}

/// One content part as text.
fn part_text(part: &ContentBlock) -> String {
    match part {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!(
            "[image {}, {} base64 characters]",
            image.mime_type,
            image.data.len()
        ),
        ContentBlock::Audio(audio) => format!(
            "[audio {}, {} base64 characters]",
            audio.mime_type,
            audio.data.len()
        ),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            rmcp::model::ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            rmcp::model::ResourceContents::BlobResourceContents { uri, blob, .. } => {
                format!("[resource {uri}, {} base64 characters]", blob.len())
            }
            _ => "[a resource of a kind this Spool does not know]".into(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link {}]", link.uri),
        _ => "[a content part of a kind this Spool does not know]".into(),
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolResult, ContentBlock};
    use serde_json::json;
    use spool_runtime::ToolOutcome;

    use super::outcome;

    #[test]
    fn a_result_past_the_output_cap_is_a_failed_call_and_one_under_it_is_the_output() {
        let big = "x".repeat(spool_runtime::process::MAX_OUTPUT_BYTES + 1);
        match outcome(&CallToolResult::success(vec![ContentBlock::text(big)])) {
            ToolOutcome::Error(message) => assert!(message.contains("more than"), "{message}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(
            outcome(&CallToolResult::success(vec![ContentBlock::text("small")])),
            ToolOutcome::Output(json!("small"))
        );
    }

    #[test]
    fn structured_content_repeated_as_text_is_given_once_and_an_error_flag_fails_the_call() {
        let value = json!({"temperature": 21});
        let mut result = CallToolResult::structured(value.clone());
        result.content = vec![ContentBlock::text(value.to_string())];
        assert_eq!(outcome(&result), ToolOutcome::Output(value));
        let mut failed = CallToolResult::success(vec![ContentBlock::text("no such city")]);
        failed.is_error = Some(true);
        assert_eq!(outcome(&failed), ToolOutcome::Error("no such city".into()));
    }
}
