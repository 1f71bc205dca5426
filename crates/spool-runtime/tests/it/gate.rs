//! The release gate: a reference run (three turns; read, idempotent and
//! write command tools; a question; a budget crossing) is killed with
//! SIGKILL at every event boundary in a child process, then recovered by a
//! fresh process. Every recovered log must equal the uninterrupted run's,
//! byte for byte, or (where the kill left a write dangling, so an operator
//! settled it) event for event once that settlement is read as the
//! completion it stands for. No write tool may run twice.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Envelope, Event, Journal, RunId, Seq};
use spool_wire::run::SuspendKind;

fn gate(dir: &Path, kill_after: Option<u64>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spool-runtime-gate"));
    command.arg(dir.join("journal")).arg(dir.join("work"));
    if let Some(n) = kill_after {
        command.args(["--kill-after", &n.to_string()]);
    }
    std::fs::create_dir_all(dir.join("work")).unwrap();
    command.output().unwrap()
}

fn finished(output: &std::process::Output) -> u64 {
    assert!(
        output.status.success(),
        "the gate finishes: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    stdout
        .trim()
        .strip_prefix("done ")
        .unwrap()
        .parse()
        .unwrap()
}

fn final_log(dir: &Path) -> Vec<Envelope> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let journal = SqliteJournal::open(dir.join("journal"), Options::default()).unwrap();
        journal
            .read(&RunId::new("run-1").unwrap(), Seq(0))
            .await
            .unwrap()
    })
}

fn bytes(log: &[Envelope]) -> Vec<String> {
    log.iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect()
}

/// The events, with an operator's settlement of a dangling write read as
/// the completion it stands for.
fn settled(log: &[Envelope]) -> Vec<Value> {
    log.iter()
        .filter(|e| !matches!(&e.event, Event::Suspended(s) if s.kind == SuspendKind::Reconciliation))
        .map(|e| match &e.event {
            Event::ToolCallResolved(r) => json!({"kind": "tool_call_completed", "payload": {"call_id": r.call_id, "output": r.output}}),
            event => serde_json::to_value(event).unwrap(),
        })
        .collect()
}

fn lines(dir: &Path, file: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join("work").join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_crash_point_recovers_to_the_reference_log_and_no_write_runs_twice() {
    let reference_dir = tempfile::tempdir().unwrap();
    let boundaries = finished(&gate(reference_dir.path(), None));
    let reference = final_log(reference_dir.path());
    assert_eq!(lines(reference_dir.path(), "writes.log"), ["w1", "w2"]);
    assert!(
        boundaries >= 28,
        "the reference run crosses every kind of step ({boundaries} appends)"
    );
    let mut identical = 0;
    let mut reconciled = 0;
    for kill_after in 0..boundaries {
        let dir = tempfile::tempdir().unwrap();
        let killed = gate(dir.path(), Some(kill_after));
        assert!(
            matches!(killed.status.signal(), Some(9 | 6)),
            "crash point {kill_after}: the first process dies by a signal, got {:?}",
            killed.status
        );
        finished(&gate(dir.path(), None));
        let recovered = final_log(dir.path());
        if bytes(&recovered) == bytes(&reference) {
            identical += 1;
        } else {
            assert_eq!(
                settled(&recovered),
                settled(&reference),
                "crash point {kill_after}: the recovered run differs"
            );
            assert!(
                recovered
                    .iter()
                    .any(|e| matches!(&e.event, Event::ToolCallResolved(_))),
                "crash point {kill_after}: a log may differ only by an operator's settlement"
            );
            reconciled += 1;
        }
        assert_eq!(
            lines(dir.path(), "writes.log"),
            ["w1", "w2"],
            "crash point {kill_after}: each write ran exactly once"
        );
        let reserved = lines(dir.path(), "reserve.log");
        assert!(
            !reserved.is_empty() && reserved.iter().all(|k| k == "k1"),
            "crash point {kill_after}: the idempotent call ran under its one key: {reserved:?}"
        );
    }
    assert_eq!(identical + reconciled, boundaries);
    assert!(
        identical > reconciled,
        "most crash points recover byte for byte ({identical} of {boundaries})"
    );
    assert_eq!(
        reconciled, 2,
        "exactly the two writes' windows need an operator"
    );
}

/// The events, settled, without their request hashes: a run begun by an
/// earlier Spool records version-1 hashes (`sha256:`), this one chained
/// hashes (`sha256-chain:`); everything else must agree.
fn without_hashes(events: Vec<Value>) -> Vec<Value> {
    events
        .into_iter()
        .map(|mut event| {
            if event["kind"] == "model_call_requested" {
                event["payload"]["request_hash"] = Value::Null;
            }
            event
        })
        .collect()
}

/// `tests/fixtures/v1-mid-turn/journal.db` was written by the previous
/// Spool (commit c749ad4's `spool-runtime-gate --kill-after 23`, its WAL
/// checkpointed into the file): the reference run killed inside turn two
/// right after a model call's intent, every request hash of version 1, a
/// write (`w1`) and a reservation (`k1`) already done.
#[test]
fn a_journal_the_previous_spool_left_mid_turn_resumes_and_finishes_like_the_reference() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-mid-turn/journal.db");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("journal")).unwrap();
    std::fs::copy(&fixture, dir.path().join("journal").join("journal.db")).unwrap();
    let before = final_log(dir.path());
    assert_eq!(before.len(), 25);
    assert!(matches!(
        &before[24].event,
        Event::ModelCallRequested(r) if r.request_hash.starts_with("sha256:")
    ));
    finished(&gate(dir.path(), None));
    let after = final_log(dir.path());
    assert_eq!(
        bytes(&after[..25]),
        bytes(&before),
        "what the previous Spool wrote stays as it was"
    );
    let reference_dir = tempfile::tempdir().unwrap();
    finished(&gate(reference_dir.path(), None));
    let reference = final_log(reference_dir.path());
    assert_eq!(
        without_hashes(settled(&after)),
        without_hashes(settled(&reference))
    );
    assert_eq!(
        lines(dir.path(), "writes.log"),
        ["w2"],
        "the write done before the upgrade is not done again"
    );
    assert!(lines(dir.path(), "reserve.log").is_empty());
}
