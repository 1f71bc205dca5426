//! A host app embedding Spool: its own tool (a key-value write keyed by a
//! request id), a scripted model, a SQLite journal. Kill it in the middle
//! of the run and start it again: the run finishes, and the write was
//! applied once.
//!
//! `example-embed DIR [--hang-after-write]`: with the flag, the tool hangs
//! right after its write (before its completion is journaled), so a test
//! can kill the process at the worst moment.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example prints what it shows"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_journal::store::sqlite::{Options, Owner, SqliteJournal};
use spool_runtime::engine::ToolSpec;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{BoxFuture, MessageRequest, Runtime, Tool, ToolOutcome, Tools};
use tokio_util::sync::CancellationToken;

/// The model: call `kv_put` once, then answer.
const SCRIPT: &str = r#"{"tool_calls":[{"id":"c1","name":"kv_put","arguments":{"key":"greeting","value":"hello","request_id":"req-1"}}]}
{"text":"Saved the greeting."}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: example-embed DIR")?);
    let hang = args.next().as_deref() == Some("--hang-after-write");

    // One process owns the journal; its runs resume when it starts.
    let _owner = Owner::claim(dir.join("journal"))?;
    let journal = Arc::new(SqliteJournal::open(
        dir.join("journal"),
        Options::default(),
    )?);
    let kv = Arc::new(KvPut {
        file: dir.join("kv.json"),
        hang,
        calls: AtomicU64::new(0),
    });
    let mut tools = Tools::new();
    tools.add(kv.clone())?;
    let runtime = Runtime::builder(journal)
        .engine(Arc::new(ScriptedEngine::from_jsonl(SCRIPT)?))
        .tools(tools)
        .build();
    let recovery = runtime.recover().await?;
    println!("resumed {} run(s)", recovery.resumed);

    // The conversation `demo` of the host's own channel: a run on first use.
    let chat = runtime.channel("embed")?;
    let run = match chat.lookup("demo").await {
        Ok(view) => view,
        Err(_) => {
            let message = MessageRequest {
                text: "Save a greeting.".into(),
                ..Default::default()
            };
            let accepted = chat.from("demo", message, None).await?;
            runtime.get(accepted.run()).await?
        }
    };
    let turn = run.turn_id.clone().ok_or("the run has a turn")?;
    let done = runtime.wait_for(&run.run_id, &turn).await?;
    println!(
        "run {} {}: {}",
        done.run_id,
        done.status.state(),
        done.response.unwrap_or_default()
    );
    println!(
        "kv_put calls in this process: {}; writes applied in all: {}",
        kv.calls.load(Ordering::SeqCst),
        kv.applied()?.len()
    );
    Ok(())
}

/// The host's tool: writes `key = value` to a JSON file, once per
/// `request_id` (the store keeps the ids it applied, as a real key-value
/// service with idempotency keys would).
struct KvPut {
    file: std::path::PathBuf,
    hang: bool,
    calls: AtomicU64,
}

impl KvPut {
    fn applied(&self) -> std::io::Result<serde_json::Map<String, Value>> {
        match std::fs::read(&self.file) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).unwrap_or_default()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Map::new()),
            Err(e) => Err(e),
        }
    }
}

impl Tool for KvPut {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "kv_put".into(),
            description: "Store a value under a key.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "request_id": {"type": "string"}
                },
                "required": ["key", "value", "request_id"]
            }),
        }
    }

    // Safe to repeat under the same key: after a crash the runtime may
    // call it again with the same `request_id`, and the store applies it
    // once.
    fn effect(&self) -> Effect {
        Effect::Idempotent
    }

    fn idempotency_key(&self, input: &Value) -> Option<String> {
        input["request_id"].as_str().map(str::to_owned)
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut applied = match self.applied() {
                Ok(applied) => applied,
                Err(e) => return ToolOutcome::Error(format!("reading the store: {e}")),
            };
            let id = input["request_id"].as_str().unwrap_or_default().to_owned();
            if !applied.contains_key(&id) {
                applied.insert(id, json!({"key": input["key"], "value": input["value"]}));
                let bytes = serde_json::to_vec(&applied).unwrap_or_default();
                if let Err(e) = std::fs::write(&self.file, bytes) {
                    return ToolOutcome::Error(format!("writing the store: {e}"));
                }
            }
            println!("kv_put wrote {}", input["key"]);
            if self.hang {
                // Killed here: the write happened, its completion is not
                // in the journal yet.
                std::future::pending::<()>().await;
            }
            ToolOutcome::Output(json!({"stored": input["key"]}))
        })
    }
}
