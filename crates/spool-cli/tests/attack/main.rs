//! The standing attack suite: `spool serve`, the real binary, attacked as
//! a careless or hostile client would: malformed input on every route,
//! clients that stall or vanish, racing commands on one run, and SIGKILL
//! under load. Each attack is bounded in time (every read has a deadline)
//! and, where it could leak, in the server's memory. What the server
//! promises is in `docs/operations.md`.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

#[path = "../support/server.rs"]
mod server;

mod browser;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;
use server::{Running, serve, terminate};

const PATIENCE: Duration = Duration::from_secs(20);

/// A reply read to the end of its connection.
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends `raw` on a fresh connection and reads the reply until the server
/// closes the connection (every request here says `Connection: close`, or
/// is one the server refuses and closes on).
fn exchange(addr: &str, raw: &[u8]) -> Reply {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    // A server that refuses early may close before it has read it all.
    let _ = socket.write_all(raw);
    let mut reply = Vec::new();
    if let Err(error) = socket.read_to_end(&mut reply) {
        assert!(
            !reply.is_empty(),
            "no reply within {PATIENCE:?} to {:?}: {error}",
            String::from_utf8_lossy(&raw[..raw.len().min(120)])
        );
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Reply { status, body }
}

fn request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

fn post(addr: &str, path: &str, body: &str) -> Reply {
    exchange(addr, &request("POST", path, body.as_bytes()))
}

fn get(addr: &str, path: &str) -> Reply {
    exchange(addr, &request("GET", path, b""))
}

/// The server's resident memory, from `/proc`.
fn resident_bytes(running: &Running) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", running.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

fn new_run(addr: &str) -> String {
    let reply = post(addr, "/spool/v1/runs", r#"{"text": "hello"}"#);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["run_id"].as_str().unwrap().to_owned()
}

/// A refusal carries the documented body: `{"error": "…", "code": "…"}`.
/// A 4xx, or the 501 the seed gives a route the agent cannot serve
/// (`compaction_unsupported`: the echo engine cannot compact an idle run).
fn assert_refusal(reply: &Reply, what: &str) {
    assert!(
        (400..500).contains(&reply.status) || reply.status == 501,
        "{what}: {} {}",
        reply.status,
        reply.body
    );
    let body = reply.json();
    assert!(
        body["code"].as_str().is_some_and(|c| !c.is_empty())
            && body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{what}: {body}"
    );
}

#[test]
fn malformed_input_on_every_route_is_a_documented_4xx_and_never_a_5xx() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.clone();
    let run = new_run(&addr);
    let routes = [
        "/spool/v1/runs".to_owned(),
        format!("/spool/v1/runs/{run}"),
        format!("/spool/v1/runs/{run}/respond"),
        format!("/spool/v1/runs/{run}/cancel"),
        "/spool/v1/addresses/desk".to_owned(),
    ];
    let deep = "[".repeat(100_000);
    let bodies: [&[u8]; 9] = [
        b"not json",
        b"[]",
        b"{\"text\": 5}",
        b"{\"text\": \"\xff\xfe\"}",
        b"{\"text\": \"\\ud800\"}",
        b"{\"text\": \"a\", \"turn_policy\": \"sideways\"}",
        b"{\"responses\": [{\"text\": 1}]}",
        b"{\"responses\": []}",
        deep.as_bytes(),
    ];
    for route in &routes {
        for body in bodies {
            let reply = exchange(&addr, &request("POST", route, body));
            // Some bodies are valid for some routes (an address takes any
            // body); what none may get is a 5xx, or a refusal without its
            // documented body.
            assert!(
                reply.status < 500,
                "POST {route}: {} {}",
                reply.status,
                reply.body
            );
            if reply.status >= 400 {
                assert_refusal(&reply, &format!("POST {route}"));
            }
        }
    }
    let long_id = format!("/spool/v1/runs/{}", "a".repeat(5_000));
    let refused_paths = [
        ("GET", "/spool/v1/runs/%zz"),
        ("GET", "/spool/v1/runs/%ff%fe/snapshot"),
        ("POST", "/spool/v1/addresses/%80%80"),
        ("GET", long_id.as_str()),
        ("GET", "/spool/v1/runs?limit=-1"),
        ("GET", "/spool/v1/runs?limit=99999999999999999999"),
        ("GET", "/spool/v1/nope"),
        ("DELETE", "/spool/v1/runs"),
        ("PATCH", "/spool/v1/health"),
    ];
    for (method, path) in refused_paths {
        assert_refusal(
            &exchange(&addr, &request(method, path, b"")),
            &format!("{method} {path}"),
        );
    }
    let cursor = get(
        &addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=18446744073709551615"),
    );
    assert_refusal(&cursor, "a cursor past the end");
    let framing: [&[u8]; 4] = [
        b"GARBAGE\r\n\r\n",
        b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n",
        b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n{}",
    ];
    for raw in framing {
        assert_refusal(
            &exchange(&addr, raw),
            &String::from_utf8_lossy(&raw[..raw.len().min(60)]),
        );
    }
    // Still serving, and the run attacked is whole.
    assert_eq!(get(&addr, "/spool/v1/health").status, 200);
    let view = get(&addr, &format!("/spool/v1/runs/{run}"));
    assert_eq!(view.status, 200, "{}", view.body);
    assert!(terminate(running).success());
}

#[test]
fn clients_that_vanish_or_stall_leave_the_server_no_larger() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.clone();
    let run = new_run(&addr);
    let stream = format!("GET /spool/v1/runs/{run}/stream HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let open_and_drop = |count: usize| {
        for _ in 0..count {
            let mut socket = TcpStream::connect(&addr).unwrap();
            socket.set_read_timeout(Some(PATIENCE)).unwrap();
            socket.write_all(stream.as_bytes()).unwrap();
            // The finished run's log arrives at once; then the client goes.
            let mut seen = Vec::new();
            let mut buffer = [0_u8; 8192];
            while !String::from_utf8_lossy(&seen).contains("run_response") {
                let n = socket.read(&mut buffer).unwrap();
                assert!(n > 0, "the stream closed before the log");
                seen.extend_from_slice(&buffer[..n]);
            }
        }
    };
    // Warm up: the allocator's and the runtime's first pages.
    open_and_drop(500);
    let before = resident_bytes(&running);

    // A stream task that outlived its client cost about 3.4 KB: 8 000 of
    // them would be over 27 MB.
    open_and_drop(8_000);
    for _ in 0..200 {
        // A body announced and never finished, then abandoned.
        let mut socket = TcpStream::connect(&addr).unwrap();
        let _ = socket.write_all(
            b"POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n{\"text\": \"",
        );
        let _ = socket.write_all(&[b'x'; 16 * 1024]);
        // Headers never finished, then abandoned.
        let mut socket = TcpStream::connect(&addr).unwrap();
        let _ = socket.write_all(b"GET /spool/v1/health HTTP/1.1\r\nHost: localhost\r\n");
    }
    assert_eq!(get(&addr, "/spool/v1/health").status, 200);
    let after = resident_bytes(&running);
    let grown = after.saturating_sub(before);
    assert!(
        grown < 12 * 1024 * 1024,
        "the server grew {grown} bytes over 8 000 dropped streams and 400 abandoned requests ({before} -> {after})"
    );
    assert!(terminate(running).success());
}

#[test]
fn racing_commands_on_one_run_each_get_a_reply_and_leave_its_log_whole() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.clone();
    let run = new_run(&addr);
    let commands: Vec<(String, &str)> = (0..48)
        .map(|n| match n % 8 {
            0 | 1 => (format!("/spool/v1/runs/{run}"), r#"{"text": "steer"}"#),
            2 => (
                format!("/spool/v1/runs/{run}"),
                r#"{"text": "queue", "turn_policy": "queue"}"#,
            ),
            3 => (format!("/spool/v1/runs/{run}/cancel"), "{}"),
            4 => (
                format!("/spool/v1/runs/{run}/respond"),
                r#"{"responses": [{"text": "yes", "approved": true}]}"#,
            ),
            5 => (format!("/spool/v1/runs/{run}/clear"), ""),
            6 => (format!("/spool/v1/runs/{run}/compact"), ""),
            _ => (format!("/spool/v1/runs/{run}/snapshot"), ""),
        })
        .collect();
    let replies: Vec<(String, Reply)> = std::thread::scope(|scope| {
        let handles: Vec<_> = commands
            .iter()
            .map(|(path, body)| {
                let addr = addr.clone();
                scope.spawn(move || {
                    let method = if path.ends_with("/snapshot") {
                        "GET"
                    } else {
                        "POST"
                    };
                    let reply = exchange(&addr, &request(method, path, body.as_bytes()));
                    (path.clone(), reply)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (path, reply) in &replies {
        assert!(
            matches!(reply.status, 200 | 202 | 204 | 409 | 501),
            "{path}: {} {}",
            reply.status,
            reply.body
        );
        if reply.status >= 400 {
            assert_refusal(reply, path);
        }
    }
    assert!(terminate(running).success());
    // The log verifies, read from outside by the CLI.
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "show", &run, "--journal"])
        .arg(dir.path().join("journal"))
        .output()
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
}

#[test]
fn sigkill_under_load_keeps_every_acknowledged_run() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.clone();
    let (acknowledged, enough) = std::sync::mpsc::channel::<String>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (addr, acknowledged, stop) = (addr.clone(), acknowledged.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let Ok(mut socket) = TcpStream::connect(&addr) else {
                        return;
                    };
                    socket.set_read_timeout(Some(PATIENCE)).unwrap();
                    let body = br#"{"text": "keep me"}"#;
                    if socket
                        .write_all(&request("POST", "/spool/v1/runs", body))
                        .is_err()
                    {
                        return;
                    }
                    let mut reply = String::new();
                    // The kill cuts some replies short: those runs were not
                    // acknowledged, and are not counted.
                    if socket.read_to_string(&mut reply).is_err()
                        || !reply.starts_with("HTTP/1.1 200")
                    {
                        continue;
                    }
                    let Some((_, body)) = reply.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let Ok(body) = serde_json::from_str::<Value>(body) else {
                        continue;
                    };
                    if acknowledged
                        .send(body["run_id"].as_str().unwrap().to_owned())
                        .is_err()
                    {
                        return;
                    }
                }
            })
        })
        .collect();
    let mut runs = Vec::new();
    while runs.len() < 200 {
        runs.push(
            enough
                .recv_timeout(PATIENCE)
                .expect("runs are acknowledged under load"),
        );
    }
    let Running { mut child, .. } = running;
    child.kill().unwrap(); // SIGKILL, with requests in flight
    child.wait().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.join().unwrap();
    }
    runs.extend(enough.try_iter());

    let again = serve(dir.path(), &[]);
    for run in &runs {
        let view = get(&again.addr, &format!("/spool/v1/runs/{run}"));
        assert_eq!(view.status, 200, "acknowledged run {run}: {}", view.body);
        assert_eq!(view.json()["state"], "completed", "{run}");
    }
    assert!(terminate(again).success());
}
