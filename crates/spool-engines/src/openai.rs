//! OpenAI-compatible chat completions, streamed: text and reasoning deltas,
//! tool calls assembled by index from their argument fragments, usage from
//! `stream_options.include_usage`, and `data: [DONE]`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};
use spool_journal::event::Usage;
use spool_runtime::engine::{
    CallContext, Delta, EngineError, Message, ModelRequest, ModelResponse, ToolCall,
};

use crate::config::{ApiKey, Settings};
use crate::sse;
use crate::stream::{Decoder, Dialect, Failure, Progress, http_engine};

http_engine!(
    /// An engine over any OpenAI-compatible `/chat/completions` endpoint.
    OpenAiEngine,
    OpenAi
);

#[derive(Debug)]
pub(crate) struct OpenAi {
    model: String,
}

impl Dialect for OpenAi {
    const NAME: &'static str = "openai";
    const PATH: &'static str = "chat/completions";
    type Decoder = Stream;

    fn model(&self) -> &str {
        &self.model
    }

    fn body(&self, request: &ModelRequest, settings: &Settings) -> Value {
        let messages: Vec<Value> = request.messages().map(message).collect();
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if !request.tools().is_empty() {
            body["tools"] = request
                .tools()
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.input_schema,
                        }
                    })
                })
                .collect();
        }
        if let Some(max) = settings.max_tokens {
            // OpenAI's own API replaced `max_tokens` (which its reasoning
            // models refuse); every compatible server reads `max_tokens`.
            let field = if is_openai(&settings.base_url) {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            body[field] = max.into();
        }
        body
    }

    fn authorize(
        &self,
        request: http::request::Builder,
        key: Option<&ApiKey>,
    ) -> http::request::Builder {
        match key {
            Some(key) => request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", key.expose()),
            ),
            None => request,
        }
    }

    fn decoder(&self, context: &CallContext) -> Stream {
        Stream {
            ordinal: context.ordinal,
            ..Stream::default()
        }
    }

    fn error_kind(body: &Value) -> Option<String> {
        let error = body.get("error")?;
        // `code` is the precise one (`insufficient_quota`); `type` the family.
        error
            .get("code")
            .and_then(Value::as_str)
            .or_else(|| error.get("type").and_then(Value::as_str))
            .map(str::to_owned)
    }

    fn is_quota(kind: &str) -> bool {
        kind == "insufficient_quota"
    }
}

/// Whether `base_url` is OpenAI's own API.
fn is_openai(base_url: &str) -> bool {
    http::Uri::try_from(base_url).is_ok_and(|uri| uri.host() == Some("api.openai.com"))
}

fn message(message: &Message) -> Value {
    match message {
        Message::System { content } => json!({ "role": "system", "content": content }),
        Message::User { content } => json!({ "role": "user", "content": content }),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut value = json!({ "role": "assistant", "content": content });
            if !tool_calls.is_empty() {
                if content.is_empty() {
                    value["content"] = Value::Null;
                }
                value["tool_calls"] = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": call.arguments.to_string() },
                        })
                    })
                    .collect();
            }
            value
        }
        Message::Tool { call_id, content } => {
            json!({ "role": "tool", "tool_call_id": call_id, "content": content })
        }
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: ChoiceDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Default, Deserialize)]
struct ChoiceDelta {
    #[serde(default)]
    content: Option<String>,
    /// llama.cpp, vLLM and DeepSeek name a reasoning model's thinking so.
    #[serde(default)]
    reasoning_content: Option<String>,
    /// Ollama and OpenRouter name it so.
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<CallDelta>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// A tool call being assembled.
#[derive(Debug, Default)]
struct Partial {
    id: String,
    name: String,
    arguments: String,
    started: bool,
}

/// One streamed completion being read.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    ordinal: u64,
    text: String,
    thinking: String,
    calls: BTreeMap<usize, Partial>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
}

impl Decoder for Stream {
    fn event(&mut self, event: &sse::Event, out: &mut Vec<Delta>) -> Result<Progress, Failure> {
        if event.data.trim() == "[DONE]" {
            return Ok(Progress::Done);
        }
        let chunk: Chunk = serde_json::from_str(&event.data).map_err(|e| {
            Failure::fatal(EngineError::Provider(format!(
                "a stream chunk is not a chat completion chunk: {e}"
            )))
        })?;
        if let Some(error) = chunk.error {
            let kind = OpenAi::error_kind(&json!({ "error": error }));
            return Err(Failure::fatal(EngineError::Provider(match kind {
                Some(kind) => format!("the provider failed mid-answer ({kind})"),
                None => "the provider failed mid-answer".into(),
            })));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
            });
        }
        // Spool asks for one choice; others (n > 1 servers) are ignored.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(Progress::More);
        };
        if let Some(reason) = choice.finish_reason {
            self.finish_reason = Some(reason);
        }
        let delta = choice.delta;
        if let Some(thinking) = delta.reasoning_content.or(delta.reasoning)
            && !thinking.is_empty()
        {
            self.thinking.push_str(&thinking);
            out.push(Delta::Thinking(thinking));
        }
        if let Some(text) = delta.content
            && !text.is_empty()
        {
            self.text.push_str(&text);
            out.push(Delta::Text(text));
        }
        for call in delta.tool_calls {
            self.tool_call(call, out);
        }
        Ok(Progress::More)
    }

    fn finish(self, out: &mut Vec<Delta>) -> Result<ModelResponse, EngineError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, mut call) in self.calls {
            if !call.started {
                // A call whose name never came cannot be run.
                return Err(EngineError::Provider(format!(
                    "tool call {index} came without a name"
                )));
            }
            if call.arguments.trim().is_empty() {
                call.arguments = "{}".into();
            }
            let arguments: Value = serde_json::from_str(&call.arguments).map_err(|e| {
                EngineError::Provider(format!(
                    "tool call `{}` has arguments that are not JSON: {e}",
                    call.name
                ))
            })?;
            out.push(Delta::ToolCallDone {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments,
            });
            tool_calls.push(ToolCall {
                id: call.id,
                name: call.name,
                arguments,
            });
        }
        Ok(ModelResponse {
            text: self.text,
            thinking: (!self.thinking.is_empty()).then_some(self.thinking),
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
        })
    }
}

impl Stream {
    /// One fragment of a tool call, keyed by its index: the id and name
    /// come first (once), the arguments in pieces after.
    fn tool_call(&mut self, delta: CallDelta, out: &mut Vec<Delta>) {
        let ordinal = self.ordinal;
        let call = self.calls.entry(delta.index).or_default();
        if let Some(id) = delta.id.filter(|id| !id.is_empty())
            && call.id.is_empty()
        {
            call.id = id;
        }
        let (name, fragment) = match delta.function {
            Some(function) => (function.name, function.arguments.unwrap_or_default()),
            None => (None, String::new()),
        };
        if let Some(name) = name.filter(|name| !name.is_empty())
            && call.name.is_empty()
        {
            call.name = name;
        }
        call.arguments.push_str(&fragment);
        if !call.started && !call.name.is_empty() {
            if call.id.is_empty() {
                // Some servers give no id; the turn needs one per call.
                call.id = format!("call_{ordinal}_{}", delta.index);
            }
            call.started = true;
            out.push(Delta::ToolCallStart {
                id: call.id.clone(),
                name: call.name.clone(),
            });
            if !call.arguments.is_empty() {
                out.push(Delta::ToolCallArguments {
                    id: call.id.clone(),
                    fragment: call.arguments.clone(),
                });
            }
        } else if call.started && !fragment.is_empty() {
            out.push(Delta::ToolCallArguments {
                id: call.id.clone(),
                fragment,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_cap_is_sent_under_the_name_the_endpoint_reads() {
        let request = ModelRequest::new(
            vec![Message::User {
                content: "hi".into(),
            }],
            vec![],
        );
        let dialect = OpenAi { model: "m".into() };
        let mut settings = Settings::new("https://api.openai.com/v1");
        settings.max_tokens = Some(64);
        let body = dialect.body(&request, &settings);
        assert_eq!(body["max_completion_tokens"], 64);
        assert!(body.get("max_tokens").is_none());
        settings.base_url = "http://127.0.0.1:8080/v1".into();
        let body = dialect.body(&request, &settings);
        assert_eq!(body["max_tokens"], 64);
        assert!(body.get("max_completion_tokens").is_none());
    }
}
