//! Test support for the release gate: drives a reference scenario to its
//! end over a SQLite journal, resuming wherever an earlier process stopped.
//! With `--kill-after N` it lets N appends through and SIGKILLs itself when
//! about to make the next, so a test can stop it at every event boundary.
//!
//! Usage: `spool-runtime-gate <journal-dir> <work-dir> [--kill-after N]`.
//! On success it prints `done <appends>` and exits 0.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use spool_journal::event::Answer;
use spool_journal::fold::Status;
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::store::{BoxFuture, CallRef, Claim, ClaimKey};
use spool_journal::{Address, Envelope, Event, Journal, JournalError, RunId, Seq};
use spool_runtime::agent::AgentDefinition;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{MessageRequest, Runtime, RuntimeError, SequentialIds, StartRequest};
use spool_wire::run::SuspendKind;

/// The turns' inputs.
const INPUTS: [&str; 3] = ["one", "two", "three"];

/// The model's answers, by call: turn 1 reads and writes; turn 2 asks a
/// person, reserves under a key, writes, and crosses the step budget;
/// turn 3 answers plainly.
const SCRIPT: &str = r#"{"tool_calls": [{"id": "c0", "name": "lookup", "arguments": {"q": 1}}], "usage": {"input_tokens": 5, "output_tokens": 1}}
{"tool_calls": [{"id": "c1", "name": "write", "arguments": {"id": "w1"}}]}
{"text": "turn one done"}
{"tool_calls": [{"id": "c3", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"tool_calls": [{"id": "c4", "name": "reserve", "arguments": {"key": "k1"}}]}
{"tool_calls": [{"id": "c5", "name": "write", "arguments": {"id": "w2"}}]}
{"text": "turn two done"}
{"text": "bye"}"#;

fn agent(work: &Path) -> String {
    let logged = |file: &str, field: &str, answer: &str| {
        format!(
            "v=$(cat | sed -n 's/.*\"{field}\":\"\\([^\"]*\\)\".*/\\1/p'); echo \"$v\" >> {}; echo '{{\"{answer}\": \"'\"$v\"'\"}}'",
            work.join(file).display()
        )
    };
    format!(
        r#"
[agent]
builtin_tools = ["ask_human"]

[[tool]]
name = "lookup"
description = "Reads."
command = ["cat"]
effect = "read"

[[tool]]
name = "reserve"
description = "Reserves under a key."
command = ["sh", "-c", {reserve:?}]
effect = "idempotent"
idempotency_key = "/key"

[[tool]]
name = "write"
description = "Writes."
command = ["sh", "-c", {write:?}]
effect = "write"

[budgets]
steps_per_turn = 3
"#,
        reserve = logged("reserve.log", "key", "reserved"),
        write = logged("writes.log", "id", "wrote"),
    )
}

/// A journal that lets `limit` appends through and kills the process on
/// the next one, as a crash would: no destructor, no flush.
struct KillAfter {
    inner: SqliteJournal,
    limit: Option<u64>,
    appends: AtomicU64,
}

impl Journal for KillAfter {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        let n = self.appends.fetch_add(1, Ordering::SeqCst);
        if self.limit == Some(n) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::process::abort();
        }
        self.inner.append(run, expected, events)
    }
    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        self.inner.claim(key, holder)
    }
    spool_journal::forward_journal_reads!(inner);
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(journal_dir), Some(work)) = (args.first(), args.get(1)) else {
        let _ = writeln!(
            std::io::stderr(),
            "usage: spool-runtime-gate <journal-dir> <work-dir> [--kill-after N]"
        );
        return ExitCode::from(2);
    };
    let limit = match (args.get(2).map(String::as_str), args.get(3)) {
        (Some("--kill-after"), Some(n)) => n.parse().ok(),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = runtime.map_err(|e| e.to_string()).and_then(|tokio| {
        tokio.block_on(drive(
            PathBuf::from(journal_dir),
            PathBuf::from(work),
            limit,
        ))
    });
    match outcome {
        Ok(appends) => {
            let _ = writeln!(std::io::stdout(), "done {appends}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "gate: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn drive(journal_dir: PathBuf, work: PathBuf, limit: Option<u64>) -> Result<u64, String> {
    // A fixed clock: the only source of difference between runs left is
    // what the crash did.
    let clock: spool_journal::store::Clock =
        Arc::new(|| time::macros::datetime!(2026-01-01 00:00 UTC));
    let sqlite = SqliteJournal::open(
        &journal_dir,
        Options {
            clock,
            ..Options::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let journal = Arc::new(KillAfter {
        inner: sqlite,
        limit,
        appends: AtomicU64::new(0),
    });
    let definition = AgentDefinition::from_toml(&agent(&work)).map_err(|e| e.to_string())?;
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>)
        .engine(Arc::new(
            ScriptedEngine::from_jsonl(SCRIPT).map_err(|e| e.to_string())?,
        ))
        .tools(definition.tools(&work).map_err(|e| e.to_string())?)
        .budgets(definition.budgets)
        .ids(Arc::new(SequentialIds::default()))
        .build();
    let recovery = runtime.recover().await.map_err(|e| e.to_string())?;
    // A crash must never leave a log that does not read back.
    if let Some((run, error)) = recovery.unreadable.first() {
        return Err(format!(
            "run {run} does not read back after the crash: {error}"
        ));
    }
    let address = Address::new("gate", "main");
    loop {
        let view = match runtime.lookup(&address).await {
            Ok(view) => view,
            Err(RuntimeError::AddressNotFound(_)) => {
                let request = StartRequest {
                    text: INPUTS[0].into(),
                    address: Some(address.clone()),
                    ..StartRequest::default()
                };
                runtime.start(request).await.map_err(|e| e.to_string())?;
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        let run = view.run_id.clone();
        let log = journal
            .read(&run, Seq(0))
            .await
            .map_err(|e| e.to_string())?;
        let turns = log
            .iter()
            .filter(|e| matches!(e.event, Event::TurnStarted(_)))
            .count();
        let acted = match &view.status {
            Status::Completed if turns < INPUTS.len() => {
                let message = MessageRequest {
                    text: INPUTS[turns].into(),
                    ..MessageRequest::default()
                };
                runtime.send(&run, message).await.map(drop)
            }
            Status::Completed => return Ok(journal.appends.load(Ordering::SeqCst)),
            Status::Waiting(SuspendKind::Question) => {
                runtime
                    .respond(
                        &run,
                        None,
                        vec![Answer {
                            text: "eu-west-1".into(),
                            approved: None,
                        }],
                    )
                    .await
            }
            Status::Waiting(SuspendKind::Budget) => {
                runtime
                    .respond(
                        &run,
                        None,
                        vec![Answer {
                            text: "go on".into(),
                            approved: Some(true),
                        }],
                    )
                    .await
            }
            Status::Waiting(SuspendKind::Reconciliation) => {
                let call = view
                    .suspend
                    .and_then(|s| s.call_id)
                    .ok_or("a reconciliation names its call")?;
                let output = reconcile(&log, &call, &work)?;
                runtime
                    .resolve(&run, &call, output, Some("gate".into()))
                    .await
            }
            Status::Running | Status::Pending => {
                let turn = view.turn_id.clone().ok_or("a running run has a turn")?;
                runtime.wait_for(&run, &turn).await.map(drop)
            }
            other => return Err(format!("the run ended {other:?}")),
        };
        acted.map_err(|e| e.to_string())?;
    }
}

/// The operator's check of a dangling write: find its intent, confirm in
/// the write log that it happened, and settle it with what the tool prints.
fn reconcile(log: &[Envelope], call: &str, work: &Path) -> Result<Value, String> {
    let id = log
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolCallRequested(r) if r.call_id == call => {
                r.input.get("id").and_then(Value::as_str).map(str::to_owned)
            }
            _ => None,
        })
        .ok_or("the dangling call has a recorded intent")?;
    let written = std::fs::read_to_string(work.join("writes.log")).unwrap_or_default();
    if !written.lines().any(|line| line == id) {
        return Err(format!("write {id} is dangling but did not happen"));
    }
    Ok(json!({"wrote": id}))
}
