//! `state.patch`: a run's document followed by RFC 6902 patches, applied
//! here with an implementation nobody here wrote (`json-patch`).

use std::sync::Arc;

use serde_json::{Value, json};
use spool_journal::RunId;
use spool_journal::event::Effect;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::engine::ToolSpec;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{BoxFuture, Runtime, Tool, ToolOutcome, Tools};
use tokio_util::sync::CancellationToken;

use super::{Client, PATIENCE};

/// Adds two numbers.
struct Add;

impl Tool for Add {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "add".into(),
            description: "Add two numbers.".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Read
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        let sum = input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0);
        Box::pin(async move { ToolOutcome::Output(json!(sum)) })
    }
}

/// A conversation with a tool call, a question and its answer, and a
/// context clear.
fn runtime() -> Runtime {
    let script = r#"{"text":"Hello."}
{"tool_calls":[{"id":"a","name":"add","arguments":{"a":2,"b":3}}]}
{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"2 + 3 = 5, in eu-west-1."}
{"text":"Fresh start."}"#;
    let mut tools = Tools::builtin();
    tools.add(Arc::new(Add)).unwrap();
    Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .tools(tools)
        .build()
}

/// Reads `state.patch` notifications, applying each to `document` (whose
/// position is `at`), until the document reaches position `end`.
async fn follow(client: &mut Client, document: &mut Value, mut at: Option<u64>, end: u64) {
    while at != Some(end) {
        let message = client.next().await;
        assert_eq!(message["method"], "state.patch", "only patches: {message}");
        let params = &message["params"];
        assert_eq!(
            params["from"].as_u64(),
            at,
            "each patch starts where the last ended: {params}"
        );
        let patch: json_patch::Patch = serde_json::from_value(params["patch"].clone())
            .unwrap_or_else(|e| panic!("an RFC 6902 patch: {e}: {params}"));
        json_patch::patch(document, &patch)
            .unwrap_or_else(|e| panic!("the patch applies: {e}: {params}\nto {document}"));
        at = params["to"].as_u64();
        assert_eq!(document["cursor"].as_u64(), at, "the document is at `to`");
    }
}

#[tokio::test]
async fn state_patches_applied_to_a_snapshot_or_to_nothing_give_the_snapshot_taken_at_the_end() {
    let runtime = runtime();
    let mut driver = Client::new(&runtime);
    let first = driver.call(1, "submit.run", json!({"text": "hi"})).await;
    let run = first["result"]["run_id"].clone();
    let start = driver
        .call(2, "state.snapshot", json!({"run_id": run}))
        .await["result"]
        .clone();
    let start_cursor = start["cursor"].as_u64().unwrap();

    // One follower resumes from the snapshot, one starts from nothing.
    let mut resumed = Client::new(&runtime);
    let subscribed = resumed
        .call(
            1,
            "subscribe",
            json!({"run_id": run, "cursor": start_cursor, "channels": ["spool:state"]}),
        )
        .await;
    assert_eq!(subscribed["result"]["channels"], json!(["spool:state"]));
    let mut fresh = Client::new(&runtime);
    fresh
        .call(
            1,
            "subscribe",
            json!({"run_id": run, "channels": ["spool:state"]}),
        )
        .await;

    // A tool call, then a question, answered.
    let parked = driver
        .call(
            3,
            "submit.run",
            json!({"run_id": run, "text": "add 2 and 3, then deploy"}),
        )
        .await;
    assert_eq!(parked["result"]["state"], "waiting", "{parked}");
    let turn = parked["result"]["turn_id"].clone();
    let answered = driver
        .call(
            4,
            "run.respond",
            json!({"run_id": run, "turn_id": turn, "responses": [{"text": "eu-west-1"}]}),
        )
        .await;
    assert!(answered.get("result").is_some(), "{answered}");
    let run_id = RunId::new(run.as_str().unwrap()).unwrap();
    let turn_id = spool_journal::TurnId::new(turn.as_str().unwrap()).unwrap();
    tokio::time::timeout(PATIENCE, runtime.wait_for(&run_id, &turn_id))
        .await
        .unwrap()
        .unwrap();
    // A clear starts the conversation over; a turn follows it.
    runtime.clear(&run_id).await.unwrap();
    let last = driver
        .call(5, "submit.run", json!({"run_id": run, "text": "again"}))
        .await;
    assert_eq!(last["result"]["response"], "Fresh start.", "{last}");

    let end = driver
        .call(6, "state.snapshot", json!({"run_id": run}))
        .await["result"]
        .clone();
    let end_cursor = end["cursor"].as_u64().unwrap();

    let mut document = start.clone();
    follow(&mut resumed, &mut document, Some(start_cursor), end_cursor).await;
    assert_eq!(document, end, "from the first snapshot");
    assert_ne!(start, end);

    let mut document = json!({});
    follow(&mut fresh, &mut document, None, end_cursor).await;
    assert_eq!(document, end, "from nothing");
}

#[tokio::test]
async fn state_snapshot_without_a_run_answers_the_one_run_the_connection_subscribes_to_or_the_servers_runs()
 {
    let runtime = runtime();
    let mut client = Client::new(&runtime);
    // The seed's own call, `state.snapshot()`, with no params at all.
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "state.snapshot"}))
        .await;
    // Subscribed to nothing: the server's state, the runs and theirs (none
    // yet), as `run.list` answers.
    let none = client.until_response(1).await.1;
    assert_eq!(
        none["result"]["runs"],
        json!([]),
        "subscribed to nothing: {none}"
    );
    let run = client.call(2, "submit.run", json!({"text": "hi"})).await["result"]["run_id"].clone();
    let listed = client.call(8, "state.snapshot", json!({})).await;
    assert_eq!(listed["result"]["runs"][0]["id"], run, "{listed}");
    let subscribed = client
        .call(
            3,
            "subscribe",
            json!({"run_id": run, "channels": ["spool:state"]}),
        )
        .await;
    assert!(subscribed.get("result").is_some(), "{subscribed}");
    client
        .send(json!({"jsonrpc": "2.0", "id": 4, "method": "state.snapshot"}))
        .await;
    let snapshot = client.until_response(4).await.1;
    assert_eq!(snapshot["result"]["run_id"], run, "{snapshot}");
    // Two runs followed: which one is for the caller to say.
    let other =
        client.call(5, "submit.run", json!({"text": "two"})).await["result"]["run_id"].clone();
    client
        .call(
            6,
            "subscribe",
            json!({"run_id": other, "channels": ["spool:state"]}),
        )
        .await;
    let two = client.call(7, "state.snapshot", json!({})).await;
    assert_eq!(two["error"]["code"], -32602, "{two}");
}
