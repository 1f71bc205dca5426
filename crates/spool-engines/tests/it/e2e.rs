//! Full Spool turns through the runtime with a provider engine: against the
//! replay server (always), and against a real model server (opt-in: `cargo
//! xtask e2e-llm` starts llama.cpp's `llama-server` and sets
//! `SPOOL_E2E_LLM_URL`). The model is tiny and repetitive, so these assert
//! on the protocol, never on the wording.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use spool_engines::{AnthropicEngine, ApiKey, OpenAiEngine, Settings};
use spool_journal::event::Event;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Journal, RunId, Seq, TurnId};
use spool_runtime::engine::{CallContext, Delta};
use spool_runtime::{Accepted, MessageRequest, StartRequest};
use spool_runtime::{Engine, RunView, Runtime};
use tokio_util::sync::CancellationToken;

use crate::replay::{Replay, Reply, hello};

fn runtime(engine: Arc<dyn Engine>) -> (Runtime, Arc<MemoryJournal>) {
    let journal = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(journal.clone()).engine(engine).build();
    (runtime, journal)
}

async fn turn(runtime: &Runtime, accepted: Accepted) -> (RunId, TurnId, RunView) {
    let Accepted::Started { run, turn } = accepted else {
        panic!("a turn starts: {accepted:?}")
    };
    let view = tokio::time::timeout(Duration::from_secs(300), runtime.wait_for(&run, &turn))
        .await
        .expect("the turn ends in time")
        .unwrap();
    (run, turn, view)
}

fn start(text: &str) -> StartRequest {
    StartRequest {
        text: text.into(),
        ..StartRequest::default()
    }
}

#[tokio::test]
async fn a_turn_through_the_runtime_records_the_providers_answer_and_usage() {
    let server = Replay::start(vec![Reply::transcript("openai/text.sse")]).await;
    let engine = OpenAiEngine::new("smollm2", Settings::new(format!("{}/v1", server.url))).unwrap();
    let (runtime, journal) = runtime(Arc::new(engine));
    let (run, _, view) = turn(&runtime, runtime.start(start("Say hello.")).await.unwrap()).await;
    assert_eq!(view.status, Status::Completed);
    assert_eq!(
        view.response.as_deref(),
        Some("It's a pleasure to make your acquaintance. I'm El")
    );
    let events = journal.read(&run, Seq(0)).await.unwrap();
    let completed = events
        .iter()
        .find_map(|e| match &e.event {
            Event::ModelCallCompleted(c) => Some(c.clone()),
            _ => None,
        })
        .expect("the model call is recorded");
    assert_eq!(
        completed.usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((22, 12))
    );
    assert_eq!(completed.finish_reason.as_deref(), Some("length"));
}

#[tokio::test]
async fn a_provider_refusal_fails_the_turn_with_its_stable_code_and_no_key() {
    let server = Replay::start(vec![Reply::refusal(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
    )])
    .await;
    let mut settings = Settings::new(&server.url);
    settings.api_key = Some(ApiKey::new("sk-ant-never-recorded"));
    let engine = AnthropicEngine::new("claude", settings).unwrap();
    let (runtime, journal) = runtime(Arc::new(engine));
    let (run, _, view) = turn(&runtime, runtime.start(start("hi")).await.unwrap()).await;
    assert_eq!(view.status, Status::Failed);
    let events = journal.read(&run, Seq(0)).await.unwrap();
    let failed = events
        .iter()
        .find_map(|e| match &e.event {
            Event::TurnFailed(f) => Some(f.clone()),
            _ => None,
        })
        .expect("the failure is recorded");
    assert_eq!(failed.code.as_str(), "auth");
    let recorded =
        serde_json::to_string(&events.iter().map(|e| &e.event).collect::<Vec<_>>()).unwrap();
    assert!(!recorded.contains("sk-ant-never-recorded"));
}

/// The real server's URL, which `cargo xtask e2e-llm` sets.
fn llm_url() -> String {
    std::env::var("SPOOL_E2E_LLM_URL")
        .expect("SPOOL_E2E_LLM_URL names a running llama-server: run `cargo xtask e2e-llm`")
}

fn real_settings(base: String) -> Settings {
    let mut settings = Settings::new(base);
    // Short answers keep a one-thread CPU model quick.
    settings.max_tokens = Some(24);
    settings
}

/// One streamed call straight to the engine, then two turns of one run
/// through the runtime: the second carries the first's conversation.
async fn full_turns(engine: Arc<dyn Engine>) {
    let deltas = Mutex::new(Vec::new());
    let push = |delta| deltas.lock().unwrap().push(delta);
    let context = CallContext {
        run: RunId::new("e2e-direct").unwrap(),
        ordinal: 0,
    };
    let request = hello();
    let response = tokio::time::timeout(
        Duration::from_secs(300),
        engine.call(&context, &request, &push, &CancellationToken::new()),
    )
    .await
    .expect("the model answers in time")
    .unwrap();
    let deltas = deltas.into_inner().unwrap();
    assert!(
        deltas.len() > 1,
        "the answer streamed in pieces: {deltas:?}"
    );
    let streamed: String = deltas
        .iter()
        .map(|d| match d {
            Delta::Text(t) => t.as_str(),
            other => panic!("a plain answer streams text only: {other:?}"),
        })
        .collect();
    assert_eq!(streamed, response.text);
    let usage = response.usage.expect("the server reports usage");
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );
    assert!(response.finish_reason.is_some());

    let (runtime, journal) = runtime(engine);
    let (run, _, first) = turn(
        &runtime,
        runtime.start(start("Name a colour.")).await.unwrap(),
    )
    .await;
    assert_eq!(first.status, Status::Completed);
    let second = runtime
        .send(
            &run,
            MessageRequest {
                text: "Name another.".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    let (_, _, second) = turn(&runtime, second).await;
    assert_eq!(second.status, Status::Completed);
    let events = journal.read(&run, Seq(0)).await.unwrap();
    let calls: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::ModelCallCompleted(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2, "one model call per turn");
    assert!(
        calls
            .iter()
            .all(|c| c.usage.is_some_and(|u| u.output_tokens > 0))
    );
    // The second call saw the first turn's answer: its prompt is longer.
    let prompt = |i: usize| calls[i].usage.unwrap().input_tokens;
    assert!(prompt(1) > prompt(0), "{} then {}", prompt(0), prompt(1));
}

#[tokio::test]
#[ignore = "needs a real model server: cargo xtask e2e-llm"]
async fn e2e_openai_engine_runs_full_turns_against_llama_server() {
    let engine = OpenAiEngine::new("smollm2", real_settings(format!("{}/v1", llm_url()))).unwrap();
    full_turns(Arc::new(engine)).await;
}

#[tokio::test]
#[ignore = "needs a real model server: cargo xtask e2e-llm"]
async fn e2e_anthropic_engine_runs_full_turns_against_llama_server() {
    let engine = AnthropicEngine::new("smollm2", real_settings(llm_url())).unwrap();
    full_turns(Arc::new(engine)).await;
}

#[tokio::test]
async fn compaction_asks_the_provider_for_a_summary_and_a_refusal_is_engine_failed() {
    let server = Replay::start(vec![
        Reply::transcript("anthropic/text.sse"),
        Reply::transcript("anthropic/text.sse"),
        Reply::refusal(
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"no"}}"#,
        ),
    ])
    .await;
    let engine = AnthropicEngine::new("m", Settings::new(&server.url)).unwrap();
    let (runtime, journal) = runtime(Arc::new(engine));
    let (run, _, view) = turn(&runtime, runtime.start(start("Say hello.")).await.unwrap()).await;
    assert_eq!(view.status, Status::Completed);
    runtime.compact(&run).await.unwrap();
    let summary = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::Compacted(c) => Some(c.summary),
            _ => None,
        })
        .expect("the summary is recorded");
    assert_eq!(summary, "\"Jeez, hello, it's you! It");
    let asked = &server.received()[1];
    assert!(
        asked.body["system"]
            .as_str()
            .unwrap()
            .starts_with("Summarize")
    );
    let transcript = asked.body["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(transcript.contains("user: Say hello."), "{transcript}");
    // A refused summary is an engine failure, naming `auth`.
    let error = runtime.compact(&run).await.unwrap_err();
    assert_eq!(
        error.kind(),
        spool_runtime::ErrorKind::EngineFailed,
        "{error}"
    );
    assert!(error.to_string().starts_with("auth:"), "{error}");
    assert_eq!(
        server.received().len(),
        3,
        "a credentials refusal is not retried"
    );
}
