//! The `command` engine against real child processes.

use std::path::Path;
use std::time::Duration;

use spool_engines::CommandEngine;
use spool_runtime::engine::{Delta, EngineError, Message, ModelRequest};

use crate::replay::{call, capture_logs, log_lines};

fn engine(script: &str, timeout: Duration) -> CommandEngine {
    CommandEngine::new(
        vec!["sh".into(), "-c".into(), script.into()],
        Path::new("."),
        timeout,
    )
    .unwrap()
}

fn hello() -> ModelRequest {
    ModelRequest::new(
        vec![Message::User {
            content: "Say hello.".into(),
        }],
        vec![],
    )
}

#[tokio::test]
async fn each_stdout_line_streams_as_text_and_the_request_arrives_on_stdin() {
    // The script answers with the request's first message, read from stdin.
    let script =
        r#"read -r request; echo "first line"; printf '%s\n' "$request" | grep -o '"Say hello."'"#;
    let outcome = call(
        &engine(script, Duration::from_secs(20)),
        "cmd-lines",
        &hello(),
    )
    .await;
    let response = outcome.result.unwrap();
    assert_eq!(
        outcome.deltas,
        vec![
            Delta::Text("first line".into()),
            Delta::Text("\n\"Say hello.\"".into())
        ]
    );
    assert_eq!(response.text, "first line\n\"Say hello.\"");
}

#[tokio::test]
async fn a_failing_command_is_engine_cli_with_stderr_in_the_log_only() {
    capture_logs();
    let script = "echo 'partial'; echo 'secret detail from the provider' >&2; exit 3";
    let outcome = call(
        &engine(script, Duration::from_secs(20)),
        "cmd-fail",
        &hello(),
    )
    .await;
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "engine_cli");
    assert!(error.to_string().contains("exited with 3"), "{error}");
    assert!(
        !error.to_string().contains("secret detail"),
        "stderr must not reach the turn: {error}"
    );
    let logged = log_lines("run=cmd-fail");
    assert!(
        logged
            .iter()
            .any(|l| l.contains("secret detail from the provider")),
        "{logged:?}"
    );
}

#[tokio::test]
async fn a_command_over_its_time_is_killed_as_engine_cli() {
    let outcome = call(
        &engine("sleep 30", Duration::from_millis(200)),
        "cmd-slow",
        &hello(),
    )
    .await;
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "engine_cli");
    assert!(error.to_string().contains("timed out"), "{error}");
}

#[test]
fn a_command_engine_without_a_program_is_refused_not_a_panic() {
    let error = CommandEngine::new(Vec::new(), Path::new("."), Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(error, spool_engines::SpecError::BadCommand(_)),
        "{error}"
    );
}

#[tokio::test]
async fn a_missing_program_is_engine_cli() {
    let engine = CommandEngine::new(
        vec!["./no-such-provider".into()],
        Path::new("/nonexistent"),
        Duration::from_secs(5),
    )
    .unwrap();
    let error = call(&engine, "cmd-missing", &hello())
        .await
        .result
        .unwrap_err();
    assert!(matches!(error, EngineError::Cli(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("/nonexistent/./no-such-provider"),
        "{error}"
    );
}

#[tokio::test]
async fn indentation_and_blank_lines_are_kept_as_printed() {
    let script = r#"printf 'fn main() {\n    run();\n}\n\nDone.'"#;
    let outcome = call(
        &engine(script, Duration::from_secs(20)),
        "cmd-layout",
        &hello(),
    )
    .await;
    let response = outcome.result.unwrap();
    assert_eq!(response.text, "fn main() {\n    run();\n}\n\nDone.");
    let streamed: String = outcome
        .deltas
        .iter()
        .map(|d| match d {
            Delta::Text(t) => t.as_str(),
            other => panic!("text only: {other:?}"),
        })
        .collect();
    assert_eq!(streamed, response.text);
}

#[tokio::test]
async fn more_output_than_the_cap_is_engine_cli() {
    let outcome = call(
        &engine("yes spool", Duration::from_secs(20)),
        "cmd-flood",
        &hello(),
    )
    .await;
    let error = outcome.result.unwrap_err();
    assert_eq!(error.code().as_str(), "engine_cli");
    assert!(error.to_string().contains("more than"), "{error}");
}
