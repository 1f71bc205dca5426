//! `spool rpc --stdio`: the real binary as an editor or agent host runs it,
//! one envelope per line on stdin and stdout.

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn rpc_over_stdio_streams_a_turns_events_then_answers_and_writes_only_json_to_stdout() {
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
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{{"text":"hello"}}}}"#
        )
        .unwrap();
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":2,"method":"run.get","params":{{"run_id":"run-none"}}}}"#
        )
        .unwrap();
        // Closing stdin ends the session once what is in progress is answered.
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
