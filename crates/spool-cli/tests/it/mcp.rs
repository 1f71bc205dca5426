//! MCP both ways through the real binary. `spool serve` with an `[[mcp]]`
//! server written with the official Python SDK (`tests/mcp/tools_server.py`):
//! a person's approval before a write, and what a SIGKILL between a call and
//! its result leaves for each effect. And the SDK's own client
//! (`tests/mcp/drive_spool.py`) driving `spool mcp serve --stdio` and `/mcp`. `cargo xtask ci` installs the SDK and names its Python in
//! `SPOOL_MCP_PYTHON`; without it these tests pass vacuously unless
//! `SPOOL_REQUIRE_MCP` is set, as CI sets it.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bus::get_json;
use crate::python::{material, python};
use crate::serve::{kill, post};
use crate::server::{Running, serve, terminate};

/// How long any wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A definition whose scripted model makes `calls` (one model answer
/// each), then says "done", with the test server as `[[mcp]]` `t`.
fn agent(dir: &Path, python: &Path, approval: &str, calls: &[Value]) {
    let mut script: Vec<String> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            json!({"tool_calls": [{"id": format!("c{}", i + 1), "name": call["name"], "arguments": call["arguments"]}]})
                .to_string()
        })
        .collect();
    script.push(json!({"text": "done"}).to_string());
    std::fs::write(dir.join("script.jsonl"), script.join("\n")).unwrap();
    let server = material("tools_server.py");
    std::fs::write(
        dir.join("spool.toml"),
        format!(
            "[agent]\nengine = \"scripted:script.jsonl\"\n\n[[mcp]]\nname = \"t\"\ncommand = [{:?}, {:?}, \"stdio\"]\nenv = {{ SPOOL_MCP_LOG = {:?} }}\napproval = {approval:?}\n",
            python.display().to_string(),
            server.display().to_string(),
            dir.join("calls.log").display().to_string(),
        ),
    )
    .unwrap();
}

/// The executions the server logged of `tool`.
fn executed(dir: &Path, tool: &str) -> usize {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["tool"] == tool)
        .count()
}

/// Waits until `ready` holds, failing the test after [`PATIENCE`].
fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a run at address `job` and sends it "go" from a thread (the
/// request waits for the turn, which may never end on this server).
fn start(running: &Running) -> String {
    let run = ensure(running);
    send(running, &run);
    run
}

/// The run at address `job`, made without a turn.
fn ensure(running: &Running) -> String {
    let (_, ensured) = post(&running.addr, "/spool/v1/addresses/job", "", None);
    let body = ensured.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str::<Value>(body).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sends `run` "go" from a thread.
fn send(running: &Running, run: &str) {
    let addr = running.addr.clone();
    let path = format!("/spool/v1/runs/{run}");
    std::thread::spawn(move || {
        let _ = std::net::TcpStream::connect(&addr).map(|mut s| {
            let body = r#"{"text": "go"}"#;
            let _ = write!(
                s,
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.read_to_end(&mut Vec::new());
        });
    });
}

/// The run as `GET /runs/{id}` shows it.
fn run(running: &Running, run: &str) -> Value {
    get_json(&running.addr, &format!("/spool/v1/runs/{run}"))
}

#[test]
fn a_write_that_asks_first_is_sent_only_once_a_person_approves_it() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    agent(
        dir.path(),
        &python,
        "destructive",
        &[json!({"name": "t__write_note", "arguments": {"text": "hello"}})],
    );
    let running = serve(dir.path(), &[]);
    let id = start(&running);
    until("the approval", || run(&running, &id)["state"] == "waiting");
    let parked = run(&running, &id);
    assert_eq!(parked["suspend"]["kind"], "approval", "{parked}");
    assert_eq!(parked["suspend"]["tool_call_id"], "c1.approval", "{parked}");
    assert_eq!(
        executed(dir.path(), "write_note"),
        0,
        "nothing was sent yet"
    );
    let (status, reply) = post(
        &running.addr,
        &format!("/spool/v1/runs/{id}/respond"),
        r#"{"responses": [{"text": "ok", "approved": true}]}"#,
        None,
    );
    assert!(status < 300, "{reply}");
    until("the run's end", || {
        run(&running, &id)["state"] == "completed"
    });
    assert_eq!(executed(dir.path(), "write_note"), 1);
    assert!(terminate(running).success());
}

#[test]
fn a_write_cut_off_by_a_sigkill_ran_once_and_parks_the_run_for_reconciliation_after_a_restart() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    agent(
        dir.path(),
        &python,
        "never",
        &[json!({"name": "t__write_note", "arguments": {"text": "hello", "hold_seconds": 120}})],
    );
    let first = serve(dir.path(), &[]);
    let id = start(&first);
    until("the write's execution", || {
        executed(dir.path(), "write_note") == 1
    });
    kill(first);
    let second = serve(dir.path(), &[]);
    until("the reconciliation", || {
        run(&second, &id)["state"] == "waiting"
    });
    let parked = run(&second, &id);
    assert_eq!(parked["suspend"]["kind"], "reconciliation", "{parked}");
    assert_eq!(
        executed(dir.path(), "write_note"),
        1,
        "the write was never sent again"
    );
    assert!(terminate(second).success());
}

#[test]
fn an_idempotent_call_and_a_read_cut_off_by_a_sigkill_are_sent_again_after_a_restart() {
    let Some(python) = python() else { return };
    for (tool, arguments) in [
        (
            "upsert",
            json!({"key": "k", "value": "v", "hold_seconds": 120}),
        ),
        ("lookup", json!({"key": "k", "hold_seconds": 120})),
    ] {
        let dir = tempfile::tempdir().unwrap();
        agent(
            dir.path(),
            &python,
            "never",
            &[json!({"name": format!("t__{tool}"), "arguments": arguments})],
        );
        let first = serve(dir.path(), &[]);
        let id = start(&first);
        until("the first execution", || executed(dir.path(), tool) == 1);
        kill(first);
        let second = serve(dir.path(), &[]);
        until("the run's end", || {
            run(&second, &id)["state"] == "completed"
        });
        assert_eq!(executed(dir.path(), tool), 2, "{tool} was sent again, once");
        assert!(terminate(second).success());
    }
}

/// A definition whose model asks one question, then answers "done", then
/// "again" (what `tests/mcp/drive_spool.py` expects).
fn asking_agent(dir: &Path) {
    std::fs::write(
        dir.join("script.jsonl"),
        [
            json!({"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which colour?"}}]}),
            json!({"text": "done"}),
            json!({"text": "again"}),
        ]
        .map(|line| line.to_string())
        .join("\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("spool.toml"),
        "[agent]\nengine = \"scripted:script.jsonl\"\n",
    )
    .unwrap();
}

/// Runs the SDK's client script with `args`, and what it printed.
fn drive(python: &Path, dir: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new(python)
        .arg(material("drive_spool.py"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{args:?}: {said}");
    assert!(said.contains("all checks passed"), "{said}");
    said
}

#[test]
fn the_official_python_client_drives_spool_mcp_serve_over_stdio_in_both_protocol_generations() {
    let Some(python) = python() else { return };
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let dir = tempfile::tempdir().unwrap();
        asking_agent(dir.path());
        let spool = env!("CARGO_BIN_EXE_spool");
        let output = std::process::Command::new(&python)
            .arg(material("drive_spool.py"))
            .args([mode, "stdio", spool, "mcp", "serve", "--stdio"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success() && said.contains("all checks passed"),
            "{mode}: {said}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            said.contains(&format!("protocol {version}")),
            "{mode}: {said}"
        );
    }
}

#[test]
fn the_official_python_client_drives_slash_mcp_on_spool_serve_with_a_token_in_both_protocol_generations()
 {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    asking_agent(dir.path());
    let tokens = dir.path().join("tokens");
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["token", "new", "host", "--token-file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let token = String::from_utf8(made.stdout).unwrap().trim().to_owned();
    let running = serve(dir.path(), &["--token-file", tokens.to_str().unwrap()]);
    let url = format!("http://{}/mcp", running.addr);
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let said = drive(&python, dir.path(), &[mode, "http", &url, &token]);
        assert!(
            said.contains(&format!("protocol {version}")),
            "{mode}: {said}"
        );
    }
    assert!(terminate(running).success());
}

/// The definition every message Spool sends over MCP must satisfy: by the
/// method of the request it answers, or its own method.
fn definition_of(method: &str) -> Option<&'static str> {
    Some(match method {
        "initialize" => "InitializeResult",
        "server/discover" => "DiscoverResult",
        "tools/list" => "ListToolsResult",
        "tools/call" => "CallToolResult",
        "resources/list" => "ListResourcesResult",
        "resources/read" => "ReadResourceResult",
        "resources/subscribe" | "resources/unsubscribe" | "ping" => "EmptyResult",
        "notifications/progress" => "ProgressNotification",
        "notifications/resources/updated" => "ResourceUpdatedNotification",
        "subscriptions/listen" => "SubscriptionsListenResult",
        "notifications/subscriptions/acknowledged" => "SubscriptionsAcknowledgedNotification",
        _ => return None,
    })
}

#[test]
fn every_message_spool_sends_over_mcp_validates_against_the_schema_of_the_version_negotiated() {
    let Some(python) = python() else { return };
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let dir = tempfile::tempdir().unwrap();
        asking_agent(dir.path());
        let (sent, received) = (dir.path().join("in.log"), dir.path().join("out.log"));
        // The SDK's client talks to Spool through two `tee`s: every line
        // each side sent is kept.
        let wire = format!(
            "tee {:?} | {:?} mcp serve --stdio | tee {:?}",
            sent.display().to_string(),
            env!("CARGO_BIN_EXE_spool"),
            received.display().to_string()
        );
        drive(&python, dir.path(), &[mode, "stdio", "sh", "-c", &wire]);

        let schema: Value = serde_json::from_slice(
            &std::fs::read(material(&format!("schema/{version}.json"))).unwrap(),
        )
        .unwrap();
        let validator = |name: &str| {
            jsonschema::validator_for(&json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$defs": schema["$defs"],
                "$ref": format!("#/$defs/{name}"),
            }))
            .unwrap()
        };
        // The check can fail: a result the schema forbids is refused.
        assert!(
            !validator("CallToolResult").is_valid(&json!({"content": "not a list"})),
            "{version}: the schema check refuses nothing"
        );
        let lines = |path: &Path| -> Vec<Value> {
            std::fs::read_to_string(path)
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect()
        };
        let methods: std::collections::HashMap<String, String> = lines(&sent)
            .into_iter()
            .filter_map(|m| Some((m.get("id")?.to_string(), m["method"].as_str()?.to_owned())))
            .collect();
        let mut checked = std::collections::BTreeSet::new();
        for message in lines(&received) {
            let (envelope, body, name) = if let Some(method) = message["method"].as_str() {
                let name = definition_of(method).unwrap_or_else(|| {
                    panic!("{version}: Spool sent `{method}`, which this test does not know")
                });
                ("JSONRPCNotification", &message, name)
            } else if message.get("error").is_some() {
                ("JSONRPCErrorResponse", &message, "JSONRPCErrorResponse")
            } else {
                let method = &methods[&message["id"].to_string()];
                let name = definition_of(method).unwrap_or_else(|| {
                    panic!("{version}: an answer to `{method}`, which this test does not know")
                });
                ("JSONRPCResultResponse", &message["result"], name)
            };
            for (what, value, definition) in
                [("envelope", &message, envelope), ("body", body, name)]
            {
                let problems: Vec<String> = validator(definition)
                    .iter_errors(value)
                    .map(|e| format!("{}: {e}", e.instance_path()))
                    .collect();
                assert!(
                    problems.is_empty(),
                    "{version}: the {what} of a message is not a valid {definition}: {problems:?}\n{message}"
                );
            }
            checked.insert(name);
        }
        for expected in [
            "ListToolsResult",
            "CallToolResult",
            "ListResourcesResult",
            "ReadResourceResult",
        ] {
            assert!(
                checked.contains(expected),
                "{version}: no {expected} was checked: {checked:?}"
            );
        }
    }
}

#[test]
fn an_mcp_servers_progress_reaches_the_runs_stream_as_tool_progress_lines() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    agent(
        dir.path(),
        &python,
        "never",
        &[json!({"name": "t__slow", "arguments": {"seconds": 0.5}})],
    );
    let running = serve(dir.path(), &[]);
    let id = ensure(&running);
    // Subscribed before the turn: progress is live only.
    let lines = crate::serve::stream_lines(&running.addr, &format!("/spool/v1/runs/{id}/stream"));
    send(&running, &id);
    let mut progress = Vec::new();
    loop {
        let line = lines
            .recv_timeout(PATIENCE)
            .expect("the run streams to its end");
        if line["type"] == "tool_progress" {
            assert_eq!(line["data"]["id"], "c1", "{line}");
            progress.push(line["text"].as_str().unwrap().to_owned());
        }
        if line["type"] == "run_response" {
            break;
        }
    }
    assert_eq!(
        progress.len(),
        10,
        "every notification arrives: {progress:?}"
    );
    assert_eq!(progress[0], "step 0 (0/10)");
    assert_eq!(progress[9], "step 9 (9/10)");
    assert!(terminate(running).success());
}
