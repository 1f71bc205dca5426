//! The Anthropic Messages API, streamed: `message_start`, content blocks
//! (text, thinking, `tool_use` with `input_json_delta`), `message_delta`
//! with usage and stop reason, `message_stop`, and `error` events.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};
use spool_journal::event::Usage;
use spool_runtime::engine::{
    CallContext, Delta, EngineError, Message, ModelRequest, ModelResponse, ToolCall,
};

use crate::config::{ApiKey, DEFAULT_ANTHROPIC_MAX_TOKENS, Settings};
use crate::sse;
use crate::stream::{Decoder, Dialect, Failure, Progress, http_engine};

/// The API version Spool speaks.
const VERSION: &str = "2023-06-01";

http_engine!(
    /// An engine over the Anthropic Messages API (`/v1/messages`).
    AnthropicEngine,
    Anthropic
);

#[derive(Debug)]
pub(crate) struct Anthropic {
    model: String,
}

impl Dialect for Anthropic {
    const NAME: &'static str = "anthropic";
    const PATH: &'static str = "v1/messages";
    type Decoder = Stream;

    fn model(&self) -> &str {
        &self.model
    }

    fn body(&self, request: &ModelRequest, settings: &Settings) -> Value {
        let mut system = Vec::new();
        let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
        for message in request.messages() {
            let (role, blocks) = match message {
                Message::System { content } => {
                    system.push(content.as_str());
                    continue;
                }
                Message::User { content } => {
                    ("user", vec![json!({ "type": "text", "text": content })])
                }
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    // The API refuses empty text blocks.
                    let text =
                        (!content.is_empty()).then(|| json!({ "type": "text", "text": content }));
                    let calls = tool_calls.iter().map(|call| {
                        json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments })
                    });
                    ("assistant", text.into_iter().chain(calls).collect())
                }
                Message::Tool { call_id, content } => (
                    "user",
                    vec![
                        json!({ "type": "tool_result", "tool_use_id": call_id, "content": content }),
                    ],
                ),
            };
            if blocks.is_empty() {
                continue;
            }
            // Roles must alternate: a tool's results join the user's turn.
            match turns.last_mut() {
                Some((last, content)) if *last == role => content.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        }
        let messages: Vec<Value> = turns
            .into_iter()
            .map(|(role, content)| json!({ "role": role, "content": content }))
            .collect();
        let mut body = json!({
            "model": self.model,
            "max_tokens": settings.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
            "messages": messages,
            "stream": true,
        });
        if !system.is_empty() {
            body["system"] = system.join("\n\n").into();
        }
        if !request.tools().is_empty() {
            body["tools"] = request
                .tools()
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": tool.input_schema,
                    })
                })
                .collect();
        }
        body
    }

    fn authorize(
        &self,
        request: http::request::Builder,
        key: Option<&ApiKey>,
    ) -> http::request::Builder {
        let request = request.header("anthropic-version", VERSION);
        match key {
            Some(key) => request.header("x-api-key", key.expose()),
            None => request,
        }
    }

    fn decoder(&self, _context: &CallContext) -> Stream {
        Stream::default()
    }

    fn error_kind(body: &Value) -> Option<String> {
        body.pointer("/error/type")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn is_quota(_kind: &str) -> bool {
        // Anthropic reports spent credit as a 400 or 403, never a 429.
        false
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: Start,
    },
    ContentBlockStart {
        index: usize,
        content_block: Block,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDelta,
        #[serde(default)]
        usage: Option<StreamUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: Value,
    },
    /// Anthropic adds event types; a client ignores those it does not know.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Start {
    #[serde(default)]
    usage: Option<StreamUsage>,
}

#[derive(Default, Deserialize)]
struct StreamUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Default, Deserialize)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// A `tool_use` block being assembled.
#[derive(Debug)]
struct Partial {
    id: String,
    name: String,
    input: String,
}

/// One streamed message being read.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    text: String,
    thinking: String,
    open: BTreeMap<usize, Partial>,
    calls: Vec<ToolCall>,
    input_tokens: u64,
    output_tokens: u64,
    usage_seen: bool,
    stop_reason: Option<String>,
}

impl Decoder for Stream {
    fn event(&mut self, event: &sse::Event, out: &mut Vec<Delta>) -> Result<Progress, Failure> {
        let parsed: Event = serde_json::from_str(&event.data).map_err(|e| {
            Failure::fatal(EngineError::Provider(format!(
                "a stream event is not a Messages API event: {e}"
            )))
        })?;
        match parsed {
            Event::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage(&usage);
                }
            }
            Event::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                Block::Text { text } => self.text(text, out),
                Block::Thinking { thinking } => self.thinking(thinking, out),
                Block::ToolUse { id, name } => {
                    out.push(Delta::ToolCallStart {
                        id: id.clone(),
                        name: name.clone(),
                    });
                    self.open.insert(
                        index,
                        Partial {
                            id,
                            name,
                            input: String::new(),
                        },
                    );
                }
                Block::Other => {}
            },
            Event::ContentBlockDelta { index, delta } => match delta {
                BlockDelta::TextDelta { text } => self.text(text, out),
                BlockDelta::ThinkingDelta { thinking } => self.thinking(thinking, out),
                BlockDelta::InputJsonDelta { partial_json } => {
                    let Some(call) = self.open.get_mut(&index) else {
                        return Err(Failure::fatal(EngineError::Provider(format!(
                            "arguments for block {index}, which is not a tool call"
                        ))));
                    };
                    if !partial_json.is_empty() {
                        call.input.push_str(&partial_json);
                        out.push(Delta::ToolCallArguments {
                            id: call.id.clone(),
                            fragment: partial_json,
                        });
                    }
                }
                BlockDelta::Other => {}
            },
            Event::ContentBlockStop { index } => {
                if let Some(mut call) = self.open.remove(&index) {
                    if call.input.trim().is_empty() {
                        call.input = "{}".into();
                    }
                    let arguments: Value = serde_json::from_str(&call.input).map_err(|e| {
                        Failure::fatal(EngineError::Provider(format!(
                            "tool call `{}` has input that is not JSON: {e}",
                            call.name
                        )))
                    })?;
                    out.push(Delta::ToolCallDone {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: call.input,
                    });
                    self.calls.push(ToolCall {
                        id: call.id,
                        name: call.name,
                        arguments,
                    });
                }
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    self.usage(&usage);
                }
            }
            Event::MessageStop => return Ok(Progress::Done),
            Event::Ping | Event::Other => {}
            Event::Error { error } => {
                let kind = error.get("type").and_then(Value::as_str).unwrap_or("error");
                let what = format!("the provider failed mid-answer ({kind})");
                // Overload and API errors are transient; the caller retries
                // them only while nothing has reached the turn.
                return Err(match kind {
                    "overloaded_error" | "api_error" => Failure::retry(EngineError::Provider(what)),
                    "rate_limit_error" => Failure::retry(EngineError::Budget(what)),
                    "authentication_error" | "permission_error" => {
                        Failure::fatal(EngineError::Auth(what))
                    }
                    _ => Failure::fatal(EngineError::Provider(what)),
                });
            }
        }
        Ok(Progress::More)
    }

    fn finish(self, _out: &mut Vec<Delta>) -> Result<ModelResponse, EngineError> {
        if let Some(call) = self.open.values().next() {
            return Err(EngineError::Provider(format!(
                "tool call `{}` was never closed",
                call.name
            )));
        }
        Ok(ModelResponse {
            text: self.text,
            thinking: (!self.thinking.is_empty()).then_some(self.thinking),
            tool_calls: self.calls,
            usage: self.usage_seen.then_some(Usage {
                input_tokens: self.input_tokens,
                output_tokens: self.output_tokens,
            }),
            finish_reason: self.stop_reason,
        })
    }
}

impl Stream {
    fn text(&mut self, text: String, out: &mut Vec<Delta>) {
        if !text.is_empty() {
            self.text.push_str(&text);
            out.push(Delta::Text(text));
        }
    }

    fn thinking(&mut self, thinking: String, out: &mut Vec<Delta>) {
        if !thinking.is_empty() {
            self.thinking.push_str(&thinking);
            out.push(Delta::Thinking(thinking));
        }
    }

    /// Usage counts are cumulative: later events replace earlier ones.
    /// Cached prompt tokens are prompt tokens all the same.
    fn usage(&mut self, usage: &StreamUsage) {
        self.usage_seen = true;
        if usage.input_tokens.is_some()
            || usage.cache_creation_input_tokens.is_some()
            || usage.cache_read_input_tokens.is_some()
        {
            self.input_tokens = usage.input_tokens.unwrap_or(0)
                + usage.cache_creation_input_tokens.unwrap_or(0)
                + usage.cache_read_input_tokens.unwrap_or(0);
        }
        if let Some(output) = usage.output_tokens {
            self.output_tokens = output;
        }
    }
}
