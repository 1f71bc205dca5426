//! Idempotency keys: a keyed tool's call without its key is refused as
//! `invalid_input` and never runs unclaimed (seed 004).

use std::sync::Arc;

use serde_json::{Value, json};
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, Seq};
use spool_runtime::agent::AgentDefinition;

use crate::support::*;
use crate::turns::{start, started};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_tools_call_without_its_key_is_refused_as_invalid_input_and_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let definition = AgentDefinition::from_toml(&format!(
        r#"
[[tool]]
name = "charge"
description = "charges an order once"
command = ["sh", "-c", "touch {}; echo '{{\"charged\": true}}'"]
effect = "idempotent"
idempotency_key = "/order"
input_schema = {{ type = "object" }}
"#,
        marker.display()
    ))
    .unwrap();
    let tools = definition.tools(dir.path()).unwrap();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "charge", "arguments": {"amount": 5}}]}
{"text": "could not charge"}"#;
    let runtime = runtime_with(Arc::clone(&journal), script, tools);
    let (run, turn) = started(runtime.start(start("pay")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    let outputs: Vec<Value> = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::ToolCallCompleted(c) => Some(Arc::unwrap_or_clone(c.output)),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 1);
    assert_eq!(
        outputs[0]["__spool_error"]["kind"],
        json!("invalid_input"),
        "{}",
        outputs[0]
    );
    assert!(!marker.exists(), "the command never ran unclaimed");

    // With its key, the same tool runs.
    let keyed = r#"{"tool_calls": [{"id": "c1", "name": "charge", "arguments": {"order": "o-1"}}]}
{"text": "charged"}"#;
    let runtime = runtime_with(
        Arc::new(MemoryJournal::new()),
        keyed,
        definition.tools(dir.path()).unwrap(),
    );
    let (run, turn) = started(runtime.start(start("pay")).await.unwrap());
    settle(&runtime, &run, &turn).await;
    assert!(marker.exists(), "a keyed call runs");
}
