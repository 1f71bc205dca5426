//! A2A through the real binary, driven by the official Python SDK's
//! client (`tests/a2a/drive_spool.py`) over both bindings: the basics and
//! the spec's errors, every answer parsed against the protocol's own
//! message types, a question and an approval answered with follow-up
//! messages, a task cancelled mid-stream, push notifications to a local
//! receiver, and a SIGKILL mid-turn after which the task completes with
//! its tool's write done once; and two instances, one calling the other
//! with `a2a_send`, killed mid-call. `cargo
//! xtask ci` installs the SDK and names its Python in `SPOOL_A2A_PYTHON`;
//! without it these tests pass vacuously unless `SPOOL_REQUIRE_A2A` is
//! set, as CI sets it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use crate::python::{a2a_material, a2a_python};
use crate::server::{Running, serve, terminate};

const BINDINGS: [&str; 2] = ["JSONRPC", "HTTP+JSON"];

/// Runs the driver's `scenario` against `running`, failing the test with
/// what it said unless every check passed.
fn drive(python: &Path, running: &Running, scenario: &str, binding: &str) -> String {
    let output = Command::new(python)
        .arg(a2a_material("drive_spool.py"))
        .args([scenario, &format!("http://{}", running.addr), binding])
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{scenario} over {binding}: {said}");
    assert!(said.contains("\ndone\n"), "{said}");
    assert!(!said.contains("FAILED: "), "{said}");
    said
}

fn script(dir: &Path, lines: &[serde_json::Value], extra: &str) {
    let lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
    std::fs::write(dir.join("script.jsonl"), lines.join("\n")).unwrap();
    std::fs::write(
        dir.join("spool.toml"),
        format!("[agent]\nengine = \"scripted:script.jsonl\"\n{extra}"),
    )
    .unwrap();
}

#[test]
fn the_official_a2a_client_drives_spool_over_both_bindings_and_every_answer_fits_the_protocol() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    for binding in BINDINGS {
        let said = drive(&python, &running, "basics", binding);
        assert!(
            said.contains("ok: the same messageId sent again answers the same task"),
            "{said}"
        );
    }
    let said = drive(&python, &running, "strict", "JSONRPC");
    assert!(said.contains("is a valid AgentCard"), "{said}");
    terminate(running);
}

#[test]
fn the_official_a2a_client_answers_a_question_and_an_approval_and_cancels_a_task_mid_stream() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let story: Vec<String> = (0..300).map(|n| format!("w{n}")).collect();
    script(
        dir.path(),
        &[
            json!({"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which color?"}}]}),
            json!({"tool_calls": [{"id": "c2", "name": "request_approval", "arguments": {"prompt": "Paint it blue?"}}]}),
            json!({"text": "painted"}),
            json!({"text": story.join(" "), "delay_ms": 100}),
        ],
        "",
    );
    let running = serve(dir.path(), &[]);
    for binding in BINDINGS {
        let said = drive(&python, &running, "conversation", binding);
        assert!(said.contains("ok: approved, the task completes"), "{said}");
        assert!(
            said.contains("ok: the subscription ends at canceled"),
            "{said}"
        );
    }
    terminate(running);
}

#[test]
fn the_official_a2a_client_manages_push_configs_and_a_local_receiver_gets_every_change_in_order() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        &[
            json!({"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which color?"}}]}),
            json!({"tool_calls": [{"id": "c2", "name": "request_approval", "arguments": {"prompt": "Paint it blue?"}}]}),
            json!({"text": "painted"}),
        ],
        // The receiver is on loopback, which push URLs may not reach by
        // default.
        "\n[a2a]\npush_private_networks = true\n",
    );
    let running = serve(dir.path(), &[]);
    for binding in BINDINGS {
        let said = drive(&python, &running, "push", binding);
        assert!(
            said.contains("ok: every change after, in order, once each"),
            "{said}"
        );
    }
    terminate(running);
}

#[test]
fn a_task_killed_mid_turn_completes_after_a_restart_with_its_write_done_once() {
    let Some(python) = a2a_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let writes = dir.path().join("writes.log");
    let story: Vec<String> = (0..300).map(|n| format!("w{n}")).collect();
    script(
        dir.path(),
        &[
            json!({"tool_calls": [{"id": "c1", "name": "write", "arguments": {"line": "once"}}]}),
            json!({"text": story.join(" "), "delay_ms": 20}),
        ],
        &format!(
            "\n[[tool]]\nname = \"write\"\ndescription = \"Writes a line.\"\ncommand = [\"sh\", \"-c\", \"cat >> {}; echo >> {}; echo '{{\\\"ok\\\": true}}'\"]\neffect = \"write\"\n",
            writes.display(),
            writes.display()
        ),
    );
    let running = serve(dir.path(), &[]);
    // The driver prints the task's id once the answer after the write
    // streams: the write's result is in the journal then.
    let mut driver = Command::new(&python)
        .arg(a2a_material("drive_spool.py"))
        .args(["start", &format!("http://{}", running.addr), "JSONRPC"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut task = None;
    for line in BufReader::new(driver.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(id) = line.strip_prefix("task: ") {
            task = Some(id.to_owned());
            break;
        }
    }
    let task = task.expect("the driver names the task");
    let Running { mut child, .. } = running;
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = driver.wait();
    assert_eq!(
        std::fs::read_to_string(&writes).unwrap().lines().count(),
        1,
        "the write ran before the kill"
    );

    let running = serve(dir.path(), &[]);
    let output = Command::new(&python)
        .arg(a2a_material("drive_spool.py"))
        .args([
            "finish",
            &format!("http://{}", running.addr),
            "JSONRPC",
            "",
            &task,
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        said.contains("state: TASK_STATE_COMPLETED"),
        "the task completes: {said}"
    );
    assert!(
        said.contains(&format!("answer: {}", story.join(" "))),
        "with its whole answer: {said}"
    );
    assert_eq!(
        std::fs::read_to_string(&writes).unwrap().lines().count(),
        1,
        "and its write was not done again"
    );
    terminate(running);
}

/// Waits until `ready` holds, failing the test after a minute.
fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The tasks an A2A agent lists, as `GET /a2a/tasks` answers.
fn tasks(addr: &str, query: &str) -> serde_json::Value {
    crate::bus::get_json(addr, &format!("/a2a/tasks?{query}"))
}

#[test]
fn a_run_killed_while_its_a2a_peer_works_sends_the_same_message_again_and_the_peer_runs_it_once() {
    // B: a Spool agent whose answer takes a few seconds.
    let b_dir = tempfile::tempdir().unwrap();
    let story: Vec<String> = (0..100).map(|n| format!("b{n}")).collect();
    script(
        b_dir.path(),
        &[json!({"text": story.join(" "), "delay_ms": 30})],
        "",
    );
    let b = serve(b_dir.path(), &[]);
    // A: sends B a message with `a2a_send`, then says "done".
    let a_dir = tempfile::tempdir().unwrap();
    script(
        a_dir.path(),
        &[
            json!({"tool_calls": [{"id": "c1", "name": "a2a_send", "arguments": {"peer": "b", "text": "tell me"}}]}),
            json!({"text": "done"}),
        ],
        &format!(
            "\n[[a2a.peers]]\nname = \"b\"\nurl = \"http://{}\"\n",
            b.addr
        ),
    );
    let a = serve(a_dir.path(), &[]);
    let (status, reply) = crate::serve::post(
        &a.addr,
        "/a2a/message:send",
        r#"{"message":{"messageId":"job-1","role":"ROLE_USER","parts":[{"text":"ask b"}]},"configuration":{"returnImmediately":true}}"#,
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let body = reply.split("\r\n\r\n").nth(1).unwrap();
    let task = serde_json::from_str::<serde_json::Value>(body).unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    until("B working on A's message", || {
        tasks(&b.addr, "status=TASK_STATE_WORKING")["totalSize"] == 1
    });
    let Running { mut child, .. } = a;
    child.kill().unwrap();
    child.wait().unwrap();

    // A again: recovery sends the call's message again; B knows it.
    let a = serve(a_dir.path(), &[]);
    until("A's task completing", || {
        crate::bus::get_json(&a.addr, &format!("/a2a/tasks/{task}"))["status"]["state"]
            == "TASK_STATE_COMPLETED"
    });
    let b_tasks = tasks(&b.addr, "includeArtifacts=true");
    assert_eq!(b_tasks["totalSize"], 1, "B ran the message once: {b_tasks}");
    assert_eq!(
        b_tasks["tasks"][0]["artifacts"][0]["parts"][0]["text"],
        story.join(" "),
        "{b_tasks}"
    );
    let a_task = crate::bus::get_json(&a.addr, &format!("/a2a/tasks/{task}"));
    assert_eq!(
        a_task["artifacts"][0]["parts"][0]["text"], "done",
        "{a_task}"
    );
    // What the model saw of B's answer is in A's run.
    let run = task.rsplit_once('.').unwrap().0;
    let snapshot = crate::bus::get_json(&a.addr, &format!("/spool/v1/runs/{run}/snapshot"));
    assert!(
        snapshot.to_string().contains(&story[99]),
        "B's answer reached A's model: {snapshot}"
    );
    terminate(a);
    terminate(b);
}
