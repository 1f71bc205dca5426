//! `spool rpc --stdio`: the real binary as an editor or agent host runs it,
//! one envelope per line on stdin and stdout.

use std::io::Write;
use std::process::{Command, Stdio};

/// `spool rpc --stdio` on a fresh journal, sent `lines` and then EOF
/// (which ends the session once what is in progress is answered); it must
/// exit 0.
pub(crate) fn rpc_stdio(lines: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["rpc", "--stdio", "--journal"])
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .env_remove("SPOOL_JOURNAL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for line in lines {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn rpc_over_stdio_streams_a_turns_events_then_answers_and_writes_only_json_to_stdout() {
    let output = rpc_stdio(&[
        r#"{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{"text":"hello"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"run.get","params":{"run_id":"run-none"}}"#,
    ]);
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("every stdout line is one JSON envelope"))
        .collect();
    let answer = lines
        .iter()
        .position(|m| m["id"] == 1)
        .expect("submit.run is answered");
    assert_eq!(lines[answer]["result"]["response"], "echo: hello");
    let events = lines[..answer]
        .iter()
        .filter(|m| m["method"] == "events.append")
        .count();
    assert!(events >= 4, "the turn's events came first: {lines:?}");
    let missing = lines
        .iter()
        .find(|m| m["id"] == 2)
        .expect("run.get is answered");
    assert_eq!(missing["error"]["code"], -32002);
}
