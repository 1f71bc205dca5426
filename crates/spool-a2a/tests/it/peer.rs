//! The `a2a_send` tool against an A2A agent written with the official
//! Python SDK (`tests/a2a/peer_server.py`): a task's question comes back
//! to the model with its id and is answered with a second call, and a
//! call executed again (as recovery does after a crash) sends the same
//! message id, even when the peer died in between.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use spool_a2a::config::PeerSection;
use spool_a2a::peer::A2aSend;
use spool_journal::{RunId, TurnId};
use spool_runtime::{Tool, ToolContext, ToolOutcome};
use tokio_util::sync::CancellationToken;

use crate::python::{a2a_material, a2a_python};

/// The peer agent on a free port, once it serves.
struct PeerProcess(Child, u16);

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn peer(python: &Path, log: &Path, port: Option<u16>) -> PeerProcess {
    let port = port.unwrap_or_else(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    });
    let mut child = Command::new(python)
        .arg(a2a_material("peer_server.py"))
        .args([&port.to_string(), log.to_str().unwrap(), "30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "listening", "the peer serves");
    PeerProcess(child, port)
}

fn tool(port: u16) -> A2aSend {
    A2aSend::new(
        &[PeerSection {
            name: "p".into(),
            url: format!("http://127.0.0.1:{port}"),
            token_file: None,
            timeout_seconds: 60,
        }],
        Path::new("."),
    )
}

fn context(call: &str) -> ToolContext {
    ToolContext::new(
        RunId::new("run-1").unwrap(),
        TurnId::new("turn-1").unwrap(),
        call,
    )
}

async fn call(tool: &A2aSend, call: &str, input: Value) -> ToolOutcome {
    tool.call_in(&context(call), input, &CancellationToken::new())
        .await
}

fn received(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_peer_tasks_question_reaches_the_model_and_a_second_call_answers_it() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.log");
    let server = peer(&python, &log, None);
    let send = tool(server.1);
    let ToolOutcome::Output(plain) = call(&send, "c1", json!({"peer": "p", "text": "hello"})).await
    else {
        panic!("a plain message is answered");
    };
    assert_eq!(plain["state"], "completed", "{plain}");
    assert_eq!(plain["answer"], "peer: hello", "{plain}");
    let ToolOutcome::Output(asked) = call(&send, "c2", json!({"peer": "p", "text": "ask"})).await
    else {
        panic!("a question is an output, not a failure");
    };
    assert_eq!(asked["state"], "input-required", "{asked}");
    assert_eq!(asked["question"], "Which size?", "{asked}");
    let task = asked["task_id"].as_str().unwrap();
    let ToolOutcome::Output(answered) = call(
        &send,
        "c3",
        json!({"peer": "p", "text": "large", "task_id": task}),
    )
    .await
    else {
        panic!("the answer is taken");
    };
    assert_eq!(answered["task_id"], task, "{answered}");
    assert_eq!(answered["state"], "completed", "{answered}");
    assert_eq!(answered["answer"], "size: large", "{answered}");
    let ToolOutcome::Error(unknown) =
        call(&send, "c4", json!({"peer": "nobody", "text": "x"})).await
    else {
        panic!("an unknown peer is a failure");
    };
    assert!(unknown.contains("nobody"), "{unknown}");
}

#[tokio::test]
async fn a_call_executed_again_after_the_peer_died_mid_call_sends_the_same_message() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.log");
    let server = peer(&python, &log, None);
    let port = server.1;
    let send = std::sync::Arc::new(tool(port));
    let waiting = {
        let send = std::sync::Arc::clone(&send);
        tokio::spawn(async move { call(&send, "c1", json!({"peer": "p", "text": "slow"})).await })
    };
    // The peer has the message once it logged it; then it dies.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while received(&log).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the peer never got the message"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(server);
    let ToolOutcome::Error(failed) = waiting.await.unwrap() else {
        panic!("a peer gone mid-call fails the call");
    };
    assert!(failed.contains("(retryable)"), "{failed}");
    // Executed again, as recovery does: the same message, to the peer
    // back on its port.
    let server = peer(&python, &log, Some(port));
    let again = tokio::spawn({
        let send = std::sync::Arc::clone(&send);
        async move { call(&send, "c1", json!({"peer": "p", "text": "slow"})).await }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while received(&log).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the message was not sent again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let ids: Vec<Value> = received(&log)
        .iter()
        .map(|m| m["message_id"].clone())
        .collect();
    assert_eq!(ids[0], ids[1], "the same message id both times: {ids:?}");
    again.abort();
    drop(server);
}
