//! `spool runs list` and `spool runs show` against a real journal.

use std::process::{Command, Output};

use spool_journal::event::{RunCreated, TurnCompleted, TurnStarted};
use spool_journal::store::sqlite::{FILE_NAME, Options, SqliteJournal};
use spool_journal::{Event, Journal, RunId, Seq, TurnId};
use spool_wire::run::TurnPolicy;

pub(crate) fn journal_with_one_run(dir: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let journal = SqliteJournal::open(dir, Options::default()).unwrap();
        let run = RunId::new("run-1").unwrap();
        let turn = TurnId::new("turn-1").unwrap();
        journal
            .append(
                &run,
                Seq(0),
                vec![
                    Event::RunCreated(RunCreated {
                        title: Some("Deploy plan".into()),
                        ..RunCreated::default()
                    }),
                    Event::TurnStarted(TurnStarted {
                        turn_id: turn.clone(),
                        input: "Deploy it.".into(),
                        context: vec![],
                        policy: TurnPolicy::Steer,
                        from_queue: None,
                        operation_id: None,
                    }),
                    Event::TurnCompleted(TurnCompleted {
                        turn_id: turn,
                        response: Some("Deployed.".into()),
                        usage: None,
                    }),
                ],
            )
            .await
            .unwrap();
    });
}

fn spool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .env_remove("SPOOL_JOURNAL")
        .output()
        .unwrap()
}

#[test]
fn runs_list_prints_one_line_per_run_with_state_and_title() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let output = spool(&["runs", "list", "--journal", dir.path().to_str().unwrap()]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("run-1")
            && lines[0].contains("completed")
            && lines[0].ends_with("Deploy plan"),
        "{}",
        lines[0]
    );
}

#[test]
fn runs_list_json_prints_one_object_per_run_in_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let output = spool(&[
        "runs",
        "list",
        "--json",
        "--journal",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let run = &lines[0];
    assert_eq!(run["run_id"], "run-1");
    assert_eq!(run["state"], "completed");
    assert_eq!(run["title"], "Deploy plan");
    assert_eq!(run["events"], 3);
    assert!(run.get("waiting_for").is_none());
    for time in ["created_at", "updated_at"] {
        let text = run[time].as_str().unwrap();
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{time} is RFC 3339: {text}: {e}"));
    }
}

#[test]
fn runs_show_prints_the_folded_state_and_every_event() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let output = spool(&[
        "runs",
        "show",
        "run-1",
        "--journal",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("state      completed"), "{stdout}");
    assert!(stdout.contains("response   Deployed."), "{stdout}");
    for kind in ["run_created", "turn_started", "turn_completed"] {
        assert!(stdout.contains(kind), "the log shows {kind}: {stdout}");
    }
}

#[test]
fn runs_show_json_prints_the_envelopes_as_ndjson() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let output = spool(&[
        "runs",
        "show",
        "run-1",
        "--json",
        "--journal",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0));
    let envelopes: Vec<spool_journal::Envelope> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        envelopes.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        [0, 1, 2]
    );
}

#[test]
fn a_log_that_does_not_verify_is_reported_with_run_and_seq_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let conn = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE events SET body = replace(body, 'Deploy it.', 'Delete it.') WHERE seq = 1",
        [],
    )
    .unwrap();
    let output = spool(&[
        "runs",
        "show",
        "run-1",
        "--journal",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("run-1") && stderr.contains("seq 1") && stderr.contains("tamper-evident"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_run_or_a_missing_journal_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = spool(&[
        "runs",
        "list",
        "--journal",
        dir.path().join("nope").to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no journal"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    journal_with_one_run(dir.path());
    let unknown = spool(&[
        "runs",
        "show",
        "run-9",
        "--journal",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no run run-9"));
}

#[test]
fn runs_show_finds_a_run_by_its_address_as_a_delegated_runs_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
        journal
            .append(
                &RunId::new("run-7").unwrap(),
                Seq(0),
                vec![
                    Event::RunCreated(RunCreated::default()),
                    Event::AddressBound(spool_journal::event::AddressBinding {
                        address: spool_journal::Address::new("bus", "reviewer/d-42"),
                    }),
                ],
            )
            .await
            .unwrap();
    });
    let journal = dir.path().to_str().unwrap();
    let output = spool(&["runs", "show", "bus/reviewer/d-42", "--journal", journal]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("run        run-7"), "{stdout}");
    let missing = spool(&["runs", "show", "bus/reviewer/d-43", "--journal", journal]);
    assert_ne!(missing.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("no run at the address bus/reviewer/d-43"),
        "{stderr}"
    );
}

#[test]
fn runs_fork_copies_a_run_on_a_journal_no_server_holds_and_prints_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let journal = dir.path().to_str().unwrap();
    let forked = spool(&[
        "runs",
        "fork",
        "run-1",
        "--after",
        "turn-1",
        "--title",
        "Again",
        "--journal",
        journal,
    ]);
    assert!(
        forked.status.success(),
        "{}",
        String::from_utf8_lossy(&forked.stderr)
    );
    let fork = String::from_utf8(forked.stdout).unwrap().trim().to_owned();
    assert!(fork.starts_with("run_") && fork != "run-1", "{fork}");
    let shown = spool(&["runs", "show", &fork, "--json", "--journal", journal]);
    let kinds: Vec<String> = String::from_utf8(shown.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["event"]["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "run_created",
            "forked_from",
            "turn_started",
            "turn_completed"
        ]
    );
    // A turn the run does not have is refused, and nothing is made.
    let refused = spool(&[
        "runs",
        "fork",
        "run-1",
        "--before",
        "turn-9",
        "--journal",
        journal,
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no turn `turn-9`"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let listed = spool(&["runs", "list", "--journal", journal]);
    assert_eq!(String::from_utf8(listed.stdout).unwrap().lines().count(), 2);
}

#[test]
fn runs_delete_older_than_says_what_would_go_then_deletes_it_and_the_run_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    journal_with_one_run(dir.path());
    let journal = dir.path().to_str().unwrap();
    let young = spool(&["runs", "delete", "--older-than", "1d", "--journal", journal]);
    assert!(young.status.success());
    assert_eq!(
        String::from_utf8_lossy(&young.stdout),
        "",
        "a run of seconds ago is not a day old"
    );
    let dry = spool(&[
        "runs",
        "delete",
        "--older-than",
        "0s",
        "--dry-run",
        "--journal",
        journal,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&dry.stdout),
        "run-1  would be deleted\n"
    );
    let listed = spool(&["runs", "list", "--journal", journal]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("run-1"),
        "a dry run deletes nothing"
    );
    let deleted = spool(&["runs", "delete", "--older-than", "0s", "--journal", journal]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout),
        "run-1  deleted  (3 events)\n"
    );
    let listed = spool(&["runs", "list", "--journal", journal]);
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "",
        "the run is gone"
    );
    let again = spool(&["runs", "delete", "run-1", "--journal", journal]);
    assert!(
        again.status.success(),
        "deleting a deleted run answers its tombstone"
    );
    let unknown = spool(&["runs", "delete", "run-9", "--journal", journal]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("run-9  not deleted: no run run-9"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    let nothing = spool(&["runs", "delete", "--journal", journal]);
    assert!(!nothing.status.success(), "a deletion names its runs");
}
