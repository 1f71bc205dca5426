//! The `anthropic` engine against recorded Messages API streams.

use serde_json::json;
use spool_engines::{AnthropicEngine, ApiKey, RetryPolicy, Settings};
use spool_journal::event::Usage;
use spool_runtime::engine::{Delta, Message, ModelRequest, ToolCall, ToolSpec};
use std::time::Duration;

use crate::replay::{Replay, Reply, call, hello, text_of};

const KEY: &str = "sk-ant-test-77aa";

fn engine(url: &str) -> AnthropicEngine {
    let mut settings = Settings::new(url);
    settings.api_key = Some(ApiKey::new(KEY));
    settings.retry = RetryPolicy {
        max_retries: 2,
        base: Duration::from_millis(1),
        cap: Duration::from_millis(5),
    };
    AnthropicEngine::new("smollm2", settings).unwrap()
}

#[tokio::test]
async fn a_recorded_text_answer_streams_as_text_deltas_with_usage() {
    let server = Replay::start(vec![Reply::transcript("anthropic/text.sse")]).await;
    let outcome = call(&engine(&server.url), "an-text", &hello()).await;
    let response = outcome.result.unwrap();
    assert!(outcome.deltas.iter().all(|d| matches!(d, Delta::Text(_))));
    assert_eq!(outcome.deltas.len(), 12);
    assert_eq!(response.text, "\"Jeez, hello, it's you! It");
    assert_eq!(text_of(&outcome.deltas), response.text);
    // Cached prompt tokens count as prompt tokens.
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 22,
            output_tokens: 12
        })
    );
    assert_eq!(response.finish_reason.as_deref(), Some("max_tokens"));
}

#[tokio::test]
async fn the_request_is_a_streamed_message_with_tool_results_in_the_users_turn() {
    let server = Replay::start(vec![Reply::transcript("anthropic/text.sse")]).await;
    let request = ModelRequest::new(
        vec![
            Message::System {
                content: "sys".into(),
            },
            Message::User {
                content: "weather?".into(),
            },
            Message::Assistant {
                content: "Checking.".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "toolu_1".into(),
                        name: "get_weather".into(),
                        arguments: json!({"city": "Paris"}),
                    },
                    ToolCall {
                        id: "toolu_2".into(),
                        name: "get_weather".into(),
                        arguments: json!({"city": "Rome"}),
                    },
                ],
            },
            Message::Tool {
                call_id: "toolu_1".into(),
                content: "sunny".into(),
            },
            Message::Tool {
                call_id: "toolu_2".into(),
                content: "rain".into(),
            },
            Message::User {
                content: "thanks".into(),
            },
        ],
        vec![ToolSpec {
            name: "get_weather".into(),
            description: "Weather for a city.".into(),
            input_schema: json!({"type": "object"}),
        }],
    );
    call(&engine(&server.url), "an-request", &request)
        .await
        .result
        .unwrap();
    let sent = &server.received()[0];
    assert_eq!(sent.request_line(), "POST /v1/messages HTTP/1.1");
    assert_eq!(sent.header("x-api-key").as_deref(), Some(KEY));
    assert_eq!(
        sent.header("anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.body,
        json!({
            "model": "smollm2",
            "max_tokens": 4096,
            "stream": true,
            "system": "sys",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"},
                    {"type": "text", "text": "thanks"},
                ]},
            ],
            "tools": [{"name": "get_weather", "description": "Weather for a city.", "input_schema": {"type": "object"}}],
        })
    );
}

#[tokio::test]
async fn thinking_text_and_a_split_tool_input_stream_in_order() {
    let server = Replay::start(vec![Reply::transcript("anthropic/thinking_tool_use.sse")]).await;
    let outcome = call(&engine(&server.url), "an-tools", &hello()).await;
    let response = outcome.result.unwrap();
    let args = |f: &str| Delta::ToolCallArguments {
        id: "toolu_01".into(),
        fragment: f.into(),
    };
    assert_eq!(
        outcome.deltas,
        vec![
            Delta::Thinking("Paris weather: ".into()),
            Delta::Thinking("use the tool.".into()),
            Delta::Text("Checking.".into()),
            Delta::ToolCallStart {
                id: "toolu_01".into(),
                name: "get_weather".into()
            },
            args("{\"city\": \"Pa"),
            args("ris\"}"),
            Delta::ToolCallDone {
                id: "toolu_01".into(),
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            },
        ]
    );
    assert_eq!(
        response.thinking.as_deref(),
        Some("Paris weather: use the tool.")
    );
    assert_eq!(response.text, "Checking.");
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "toolu_01".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"})
        }]
    );
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 412,
            output_tokens: 89
        })
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_use"));
}

#[tokio::test]
async fn an_error_event_after_text_fails_the_call_without_a_retry() {
    let server = Replay::start(vec![
        Reply::transcript("anthropic/error_mid_stream.sse"),
        Reply::transcript("anthropic/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "an-midstream", &hello()).await;
    assert_eq!(text_of(&outcome.deltas), "Hello");
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert!(error.to_string().contains("overloaded_error"), "{error}");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn an_overload_before_any_answer_is_retried() {
    let server = Replay::start(vec![
        Reply::transcript("anthropic/overloaded_first.sse"),
        Reply::transcript("anthropic/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "an-overload", &hello()).await;
    assert_eq!(outcome.result.unwrap().text, "\"Jeez, hello, it's you! It");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_429_then_success_answers_and_a_529_is_retried_too() {
    let server = Replay::start(vec![
        Reply::refusal(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        )
        .header("retry-after", "0"),
        Reply::refusal(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        Reply::transcript("anthropic/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "an-429", &hello()).await;
    assert!(outcome.result.is_ok());
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn refusals_are_classified_by_status_and_error_type() {
    for (status, kind, code) in [
        (401, "authentication_error", "auth"),
        (403, "permission_error", "auth"),
        (400, "invalid_request_error", "provider_error"),
        (404, "not_found_error", "provider_error"),
    ] {
        let body = format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"no"}}}}"#);
        let server = Replay::start(vec![Reply::refusal(status, &body)]).await;
        let engine = engine(&server.url);
        let error = call(&engine, "an-refusal", &hello())
            .await
            .result
            .unwrap_err();
        assert_eq!(error.code().as_str(), code, "HTTP {status}");
        assert!(error.to_string().contains(kind), "{error}");
        assert_eq!(server.received().len(), 1, "HTTP {status} is not retried");
    }
}

#[tokio::test]
async fn a_connection_cut_mid_message_fails_without_a_retry() {
    let server = Replay::start(vec![
        // Past the third text delta, before `message_stop`.
        Reply::transcript("anthropic/text.sse").cut_after(900),
        Reply::transcript("anthropic/text.sse"),
    ])
    .await;
    let engine = engine(&server.url);
    let outcome = call(&engine, "an-cut", &hello()).await;
    assert!(
        !outcome.deltas.is_empty(),
        "part of the answer streamed before the cut"
    );
    assert_eq!(
        outcome.result.unwrap_err().code().as_str(),
        "provider_error"
    );
    assert_eq!(server.received().len(), 1);
}
