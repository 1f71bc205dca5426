//! The `openai` engine against recorded chat-completion streams.

use serde_json::json;
use spool_engines::{ApiKey, OpenAiEngine, RetryPolicy, Settings};
use spool_journal::event::Usage;
use spool_runtime::engine::{Delta, EngineError, Message, ModelRequest, ToolCall, ToolSpec};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::replay::{
    Replay, Reply, TestProxy, all_logs, call, call_with, capture_logs, hello, log_lines, text_of,
};

const KEY: &str = "sk-test-3f9a8c7e1d2b";

fn settings(url: &str) -> Settings {
    let mut settings = Settings::new(format!("{url}/v1"));
    settings.api_key = Some(ApiKey::new(KEY));
    settings.retry = RetryPolicy {
        max_retries: 2,
        base: Duration::from_millis(1),
        cap: Duration::from_millis(5),
    };
    settings
}

fn engine(url: &str) -> OpenAiEngine {
    OpenAiEngine::new("smollm2", settings(url)).unwrap()
}

#[tokio::test]
async fn a_recorded_text_answer_streams_as_text_deltas_with_usage() {
    let server = Replay::start(vec![Reply::transcript("openai/text.sse")]).await;
    let outcome = call(&engine(&server.url), "oa-text", &hello()).await;
    let response = outcome.result.unwrap();
    let words: Vec<_> = outcome
        .deltas
        .iter()
        .map(|d| match d {
            Delta::Text(t) => t.as_str(),
            other => panic!("only text expected, got {other:?}"),
        })
        .collect();
    assert_eq!(
        words,
        [
            "It",
            "'s",
            " a",
            " pleasure",
            " to",
            " make",
            " your",
            " acquaintance",
            ".",
            " I",
            "'m",
            " El"
        ]
    );
    assert_eq!(
        response.text,
        "It's a pleasure to make your acquaintance. I'm El"
    );
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 22,
            output_tokens: 12
        })
    );
    assert_eq!(response.finish_reason.as_deref(), Some("length"));
    assert!(response.tool_calls.is_empty());
}

#[tokio::test]
async fn the_request_is_a_streamed_chat_completion_with_the_key_in_its_header() {
    let server = Replay::start(vec![Reply::transcript("openai/text.sse")]).await;
    let request = ModelRequest::new(
        vec![
            Message::System {
                content: "sys".into(),
            },
            Message::User {
                content: "weather?".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "call_a".into(),
                    name: "get_weather".into(),
                    arguments: json!({"city": "Paris"}),
                }],
            },
            Message::Tool {
                call_id: "call_a".into(),
                content: "sunny".into(),
            },
        ],
        vec![ToolSpec {
            name: "get_weather".into(),
            description: "Weather for a city.".into(),
            input_schema: json!({"type": "object"}),
        }],
    );
    let mut settings = settings(&server.url);
    settings.max_tokens = Some(64);
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    call(&engine, "oa-request", &request).await.result.unwrap();
    let sent = &server.received()[0];
    assert_eq!(sent.request_line(), "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(
        sent.header("authorization").as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(
        sent.body,
        json!({
            "model": "smollm2",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {"type": "object"}}}],
        })
    );
}

#[tokio::test]
async fn tool_call_fragments_interleaved_by_index_assemble_into_complete_calls() {
    let server = Replay::start(vec![Reply::transcript("openai/tool_calls.sse")]).await;
    let outcome = call(&engine(&server.url), "oa-tools", &hello()).await;
    let response = outcome.result.unwrap();
    let start = |id: &str, name: &str| Delta::ToolCallStart {
        id: id.into(),
        name: name.into(),
    };
    let args = |id: &str, f: &str| Delta::ToolCallArguments {
        id: id.into(),
        fragment: f.into(),
    };
    assert_eq!(
        outcome.deltas,
        vec![
            start("call_a", "get_weather"),
            args("call_a", "{\"ci"),
            start("call_b", "get_time"),
            args("call_b", "{\"zone\":"),
            args("call_a", "ty\": \"Par"),
            args("call_b", "\"CET\"}"),
            args("call_a", "is\"}"),
            Delta::ToolCallDone {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            },
            Delta::ToolCallDone {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: "{\"zone\":\"CET\"}".into()
            },
        ]
    );
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"})
            },
            ToolCall {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: json!({"zone": "CET"})
            },
        ]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 61,
            output_tokens: 24
        })
    );
}

#[tokio::test]
async fn reasoning_content_streams_as_thinking_apart_from_the_answer() {
    let server = Replay::start(vec![Reply::transcript("openai/thinking.sse")]).await;
    let outcome = call(&engine(&server.url), "oa-think", &hello()).await;
    let response = outcome.result.unwrap();
    assert_eq!(
        outcome.deltas,
        vec![
            Delta::Thinking("The user".into()),
            Delta::Thinking(" greets me.".into()),
            Delta::Text("Hi".into()),
            Delta::Text(" there.".into()),
        ]
    );
    assert_eq!(response.thinking.as_deref(), Some("The user greets me."));
    assert_eq!(response.text, "Hi there.");
}

#[tokio::test]
async fn an_error_after_streamed_text_fails_the_call_without_a_retry() {
    let server = Replay::start(vec![
        Reply::transcript("openai/error_mid_stream.sse"),
        Reply::transcript("openai/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "oa-midstream", &hello()).await;
    assert_eq!(text_of(&outcome.deltas), "Partial answer");
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert!(error.to_string().contains("server_error"), "{error}");
    assert_eq!(
        server.received().len(),
        1,
        "a retry would repeat words the turn already has"
    );
}

#[tokio::test]
async fn a_429_is_retried_after_the_wait_the_provider_asked_for() {
    capture_logs();
    let server = Replay::start(vec![
        Reply::refusal(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#)
            .header("retry-after-ms", "30"),
        Reply::transcript("openai/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "oa-429", &hello()).await;
    assert_eq!(
        outcome.result.unwrap().text,
        "It's a pleasure to make your acquaintance. I'm El"
    );
    assert_eq!(server.received().len(), 2);
    let retries = log_lines("run=oa-429");
    let retry = retries
        .iter()
        .find(|l| l.contains("retrying"))
        .expect("the retry is logged");
    assert!(
        retry.contains("delay_ms=30") && retry.contains("from_provider=true"),
        "{retry}"
    );
    assert!(
        retry.contains("code=\"budget\"") || retry.contains("code=budget"),
        "{retry}"
    );
    assert_eq!(
        retries
            .iter()
            .filter(|l| l.contains("calling the model"))
            .count(),
        2,
        "each attempt is logged"
    );
}

#[tokio::test]
async fn an_exhausted_quota_is_a_budget_failure_at_once() {
    let server = Replay::start(vec![Reply::refusal(
        429,
        r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
    )])
    .await;
    let engine = engine(&server.url);
    let error = call(&engine, "oa-quota", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "budget");
    assert_eq!(
        server.received().len(),
        1,
        "waiting does not refill a quota"
    );
}

#[tokio::test]
async fn server_errors_are_retried_up_to_the_limit_then_fail_as_provider_errors() {
    let refusal = || Reply::refusal(503, r#"{"error":{"message":"busy","type":"server_error"}}"#);
    let server = Replay::start(vec![refusal(), refusal(), refusal(), refusal()]).await;
    let engine = engine(&server.url);
    let error = call(&engine, "oa-503", &hello()).await.result.unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert_eq!(
        error,
        EngineError::Provider("HTTP 503 (server_error)".into())
    );
    assert_eq!(
        server.received().len(),
        3,
        "the first try and max_retries = 2 more"
    );
}

#[tokio::test]
async fn a_refused_key_is_an_auth_failure_that_never_shows_the_key() {
    capture_logs();
    let server = Replay::start(vec![Reply::refusal(
        401,
        &format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#),
    )])
    .await;
    let engine = engine(&server.url);
    let error = call(&engine, "oa-401", &hello()).await.result.unwrap_err();
    assert_eq!(error.code().as_str(), "auth");
    assert_eq!(server.received().len(), 1);
    assert!(!error.to_string().contains(KEY), "{error}");
    assert!(!format!("{error:?}").contains(KEY));
    assert!(!format!("{:?}", settings(&server.url)).contains(KEY));
    assert!(!log_lines("run=oa-401").is_empty(), "the failure is logged");
    assert!(!all_logs().contains(KEY), "the key reached the log");
}

#[tokio::test]
async fn a_connection_cut_mid_answer_fails_without_a_retry() {
    let server = Replay::start(vec![
        // Cut inside the fourth event, after three words have streamed.
        Reply::transcript("openai/text.sse").cut_after(1100),
        Reply::transcript("openai/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "oa-cut", &hello()).await;
    assert!(
        !outcome.deltas.is_empty(),
        "part of the answer streamed before the cut"
    );
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_connection_cut_before_any_answer_is_retried() {
    let server = Replay::start(vec![
        // Cut inside the first event, which carries no text.
        Reply::transcript("openai/text.sse").cut_after(40),
        Reply::transcript("openai/text.sse"),
    ])
    .await;
    let outcome = call(&engine(&server.url), "oa-cut-early", &hello()).await;
    assert_eq!(
        outcome.result.unwrap().text,
        "It's a pleasure to make your acquaintance. I'm El"
    );
    assert_eq!(
        text_of(&outcome.deltas),
        "It's a pleasure to make your acquaintance. I'm El",
        "no word streamed twice"
    );
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_silent_stream_times_out_as_timeout() {
    let server = Replay::start(vec![Reply::stalled()]).await;
    let mut settings = settings(&server.url);
    settings.idle_timeout = Duration::from_millis(200);
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    let error = call(&engine, "oa-idle", &hello()).await.result.unwrap_err();
    assert_eq!(error.code().as_str(), "timeout");
}

#[tokio::test]
async fn the_request_timeout_bounds_the_whole_call() {
    let server = Replay::start(vec![Reply::stalled()]).await;
    let mut settings = settings(&server.url);
    settings.request_timeout = Duration::from_millis(200);
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    let error = call(&engine, "oa-deadline", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "timeout");
    assert!(error.to_string().contains("no complete answer"), "{error}");
}

#[tokio::test]
async fn cancelling_stops_a_stalled_call() {
    let server = Replay::start(vec![Reply::stalled()]).await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let engine = engine(&server.url);
    let request = hello();
    let (outcome, ()) = tokio::join!(call_with(&engine, "oa-cancel", &request, &cancel), async {
        // Cancel once the call is under way, held by the stalled server.
        server.wait_for_requests(1).await;
        trigger.cancel();
    });
    assert_eq!(outcome.result.unwrap_err(), EngineError::Cancelled);
}

#[tokio::test]
async fn an_unreachable_server_is_retried_then_a_provider_error() {
    // A port that was open and is now closed: connecting is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    capture_logs();
    let engine = engine(&url);
    let error = call(&engine, "oa-refused", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert_eq!(
        log_lines("run=oa-refused")
            .iter()
            .filter(|l| l.contains("calling the model"))
            .count(),
        3
    );
}

#[tokio::test]
async fn a_server_that_answers_without_streaming_is_a_provider_error_at_once() {
    let mut reply = Reply::refusal(
        200,
        r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
    );
    reply.piece = 64;
    let server = Replay::start(vec![reply]).await;
    let engine = engine(&server.url);
    let error = call(&engine, "oa-unstreamed", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert!(error.to_string().contains("application/json"), "{error}");
    assert_eq!(server.received().len(), 1);
}

/// A server configuration with `tests/tls/`'s certificate for `localhost`
/// (self-signed, valid to 2126), and that certificate's PEM file, which a
/// client may be told to trust.
fn localhost_tls() -> (std::sync::Arc<rustls::ServerConfig>, std::path::PathBuf) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
    let pem = dir.join("localhost.pem");
    let certificate = CertificateDer::from_pem_file(&pem).unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("localhost.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![certificate], key)
    .unwrap();
    (std::sync::Arc::new(config), pem)
}

#[tokio::test]
async fn https_streams_from_a_server_whose_certificate_the_ca_file_vouches_for() {
    let (tls, pem) = localhost_tls();
    let server = Replay::start_tls(vec![Reply::transcript("openai/text.sse")], tls).await;
    let mut settings = settings(&server.url);
    settings.ca_file = Some(pem);
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    let outcome = call(&engine, "oa-tls", &hello()).await;
    assert_eq!(
        outcome.result.unwrap().text,
        "It's a pleasure to make your acquaintance. I'm El"
    );
    assert_eq!(
        server.received()[0].request_line(),
        "POST /v1/chat/completions HTTP/1.1"
    );
}

#[tokio::test]
async fn a_certificate_nobody_vouches_for_fails_at_once_without_retries() {
    let (tls, _) = localhost_tls();
    let server = Replay::start_tls(vec![Reply::transcript("openai/text.sse"); 3], tls).await;
    capture_logs();
    let engine = engine(&server.url);
    let error = call(&engine, "oa-untrusted", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "provider_error");
    assert!(error.to_string().contains("certificate"), "{error}");
    let attempts = log_lines("run=oa-untrusted");
    assert_eq!(
        attempts
            .iter()
            .filter(|l| l.contains("calling the model"))
            .count(),
        1,
        "{attempts:?}"
    );
}

#[tokio::test]
async fn https_through_a_proxy_tunnels_with_connect_and_its_credentials() {
    let (tls, pem) = localhost_tls();
    let server = Replay::start_tls(vec![Reply::transcript("openai/text.sse")], tls).await;
    let proxy = TestProxy::start("alice:s3cret@", None).await;
    let mut settings = settings(&server.url);
    settings.ca_file = Some(pem);
    settings.proxy = Some(proxy.url.clone());
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    let outcome = call(&engine, "oa-proxy-tls", &hello()).await;
    assert_eq!(
        outcome.result.unwrap().text,
        "It's a pleasure to make your acquaintance. I'm El"
    );
    let heads = proxy.heads();
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    assert!(
        heads[0].starts_with(&format!("CONNECT localhost:{port} HTTP/1.1\r\n")),
        "{heads:?}"
    );
    assert!(
        heads[0].contains("Proxy-Authorization: Basic YWxpY2U6czNjcmV0\r\n"),
        "{heads:?}"
    );
    // Inside the tunnel the request is the provider's, in origin form.
    assert_eq!(
        server.received()[0].request_line(),
        "POST /v1/chat/completions HTTP/1.1"
    );
    assert_eq!(server.received()[0].header("proxy-authorization"), None);
}

#[tokio::test]
async fn plain_http_through_a_proxy_sends_the_whole_url() {
    let server = Replay::start(vec![Reply::transcript("openai/text.sse")]).await;
    let proxy = TestProxy::start("", None).await;
    let mut settings = settings(&server.url);
    settings.proxy = Some(proxy.url.clone());
    let engine = OpenAiEngine::new("smollm2", settings).unwrap();
    assert!(
        call(&engine, "oa-proxy-http", &hello())
            .await
            .result
            .is_ok()
    );
    let heads = proxy.heads();
    assert!(
        heads[0].starts_with(&format!(
            "POST {}/v1/chat/completions HTTP/1.1\r\n",
            server.url
        )),
        "{heads:?}"
    );
}

#[tokio::test]
async fn a_proxy_that_wants_credentials_is_an_auth_failure_at_once() {
    let proxy = TestProxy::start(
        "",
        Some("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"),
    )
    .await;
    let mut settings = settings("https://api.example.test");
    settings.proxy = Some(proxy.url.clone());
    let engine = OpenAiEngine::new("m", settings).unwrap();
    let error = call(&engine, "oa-proxy-407", &hello())
        .await
        .result
        .unwrap_err();
    assert_eq!(error.code().as_str(), "auth", "{error}");
    assert!(error.to_string().contains("407"), "{error}");
    assert_eq!(
        proxy.heads().len(),
        1,
        "a proxy that wants credentials is not asked again"
    );
}
