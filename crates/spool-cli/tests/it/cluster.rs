//! Three `spool serve --cluster` processes on one PostgreSQL journal:
//! runs spread over them complete, a node killed mid-turn has its runs
//! finished by the others with no write run twice, a node paused past its
//! lease cannot write when it wakes, and a stream on one node follows a
//! run another node drives.

use std::io::{Read, Write};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::serve::{post, stream_lines};
use crate::server::{Running, serve_on, terminate};

/// The lease the tests run with: short, so takeovers come quickly.
const LEASE: &str = "2";

fn node(dir: &std::path::Path, url: &str, name: &str) -> Running {
    serve_on(
        dir,
        url.as_ref(),
        &["--cluster", "--lease-seconds", LEASE, "--node-name", name],
        &[],
    )
}

/// An agent whose turn writes once (a `write` tool appending to
/// writes.log) and then streams a slow answer.
fn slow_writer(dir: &std::path::Path) -> std::path::PathBuf {
    let writes = dir.join("writes.log");
    std::fs::write(
        dir.join("script.jsonl"),
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"write\", \"arguments\": {\"id\": \"w1\"}}]}\n{\"text\": \"one two three four five six seven eight nine ten\", \"delay_ms\": 300}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("spool.toml"),
        format!(
            "[agent]\nengine = \"scripted:script.jsonl\"\n\n[[tool]]\nname = \"write\"\ndescription = \"Writes.\"\ncommand = [\"sh\", \"-c\", \"cat >> {}; echo; echo '{{\\\"ok\\\": true}}'\"]\neffect = \"write\"\n",
            writes.display()
        ),
    )
    .unwrap();
    writes
}

/// Creates a run at `address` on `node` and sends it a message in the
/// background (the request waits for the turn, which may end elsewhere).
fn start_turn(node: &str, address: &str) -> String {
    let (status, ensured) = post(node, &format!("/spool/v1/addresses/{address}"), "", None);
    assert_eq!(status, 200, "{ensured}");
    let run = ensured
        .split("\"run_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let addr = node.to_owned();
    let path = format!("/spool/v1/runs/{run}");
    std::thread::spawn(move || {
        let _ = std::net::TcpStream::connect(&addr).map(|mut s| {
            let body = r#"{"text": "do it"}"#;
            let _ = write!(
                s,
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.read_to_end(&mut Vec::new());
        });
    });
    run
}

/// Waits until `lines` shows the turn streaming its answer.
fn wait_for_text(lines: &Receiver<serde_json::Value>) {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the run streams its answer");
        if line["type"] == "text_delta" {
            return;
        }
    }
}

/// The turn's final answer, as a stream of the run shows it.
fn response(lines: &Receiver<serde_json::Value>, within: Duration) -> String {
    loop {
        let line = lines
            .recv_timeout(within)
            .expect("the run's turn ends within the lease time and a margin");
        if line["type"] == "run_response" {
            return line["text"].as_str().unwrap_or_default().to_owned();
        }
    }
}

/// How many times the `write` tool ran: each run appends its input,
/// `{"id":"w1"}`, to the log.
fn writes_in(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("w1")
        .count()
}

#[test]
fn three_nodes_complete_300_runs_spread_over_them() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Running> = ["a", "b", "c"]
        .iter()
        .map(|name| node(dir.path(), &url, name))
        .collect();
    let clients: Vec<_> = (0..6)
        .map(|client| {
            let addr = nodes[client % 3].addr.clone();
            std::thread::spawn(move || {
                for n in 0..50 {
                    let answer = crate::bus::run_to_end(&addr, &format!("hello {client}-{n}"));
                    assert_eq!(
                        answer["response"],
                        format!("echo: hello {client}-{n}"),
                        "{answer}"
                    );
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    for running in nodes {
        assert!(terminate(running).success());
    }
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "list", "--json", "--journal", &url])
        .output()
        .unwrap();
    let completed = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|line| line.contains("\"state\":\"completed\""))
        .count();
    assert_eq!(completed, 300);
}

#[test]
fn a_node_killed_mid_turn_has_its_runs_finished_by_the_others_and_no_write_runs_twice() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let writes = slow_writer(dir.path());
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    let c = node(dir.path(), &url, "c");
    let on_a: Vec<String> = (0..4)
        .map(|n| start_turn(&a.addr, &format!("a{n}")))
        .collect();
    let on_b = start_turn(&b.addr, "b0");
    // Kill A once every turn it drives has written and is streaming.
    for run in &on_a {
        wait_for_text(&stream_lines(
            &a.addr,
            &format!("/spool/v1/runs/{run}/stream"),
        ));
    }
    let Running { mut child, .. } = a;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // A stream on C of each run, wherever it is driven now: every one ends
    // with its whole answer within the lease time and a margin.
    let within = Duration::from_secs(2 + 30);
    for run in on_a.iter().chain([&on_b]) {
        let lines = stream_lines(&c.addr, &format!("/spool/v1/runs/{run}/stream"));
        assert_eq!(
            response(&lines, within),
            "one two three four five six seven eight nine ten",
            "run {run}"
        );
    }
    assert_eq!(writes_in(&writes), 5, "each turn wrote once, none twice");
    assert!(terminate(b).success());
    assert!(terminate(c).success());
}

#[test]
fn a_node_paused_past_its_lease_cannot_write_when_it_wakes_and_lets_its_runs_go() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let writes = slow_writer(dir.path());
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    let run = start_turn(&a.addr, "paused");
    wait_for_text(&stream_lines(
        &a.addr,
        &format!("/spool/v1/runs/{run}/stream"),
    ));
    let pid = a.child.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    // B takes the run over once A's lease ran out, and finishes it.
    let lines = stream_lines(&b.addr, &format!("/spool/v1/runs/{run}/stream"));
    assert_eq!(
        response(&lines, Duration::from_secs(30)),
        "one two three four five six seven eight nine ten"
    );
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    // A wakes mid-answer: it finds its lease gone, joins again, and what
    // its turn tries to record is refused.
    loop {
        let line = a
            .said
            .recv_timeout(Duration::from_secs(30))
            .expect("the woken node says its lease lapsed");
        if line.contains("this node's lease lapsed") {
            break;
        }
    }
    // The run's log holds one answer: B's. A's was never written.
    let shown = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "show", &run, "--json", "--journal", &url])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(log.matches("\"turn_completed\"").count(), 1, "{log}");
    assert_eq!(writes_in(&writes), 1, "the write ran once");
    // And A now answers a command for the run as a node that does not
    // hold it.
    let (status, reply) = post(
        &a.addr,
        &format!("/spool/v1/runs/{run}"),
        r#"{"text": "more"}"#,
        None,
    );
    assert_eq!(status, 409, "{reply}");
    assert!(reply.contains("run_owned_elsewhere"), "{reply}");
    assert!(terminate(a).success());
    assert!(terminate(b).success());
}
