//! The seeds' own examples of what a client sends (seeds 000, 001, 003:
//! `crates/spool-wire/tests/vectors/seeds.jsonl`), sent as they are to a
//! running `spool` and answered as each seed says.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::Value;

use crate::server::terminate;

/// The seeds' examples of `kind`, as sent.
fn examples(kind: &str) -> Vec<Value> {
    include_str!("../../../spool-wire/tests/vectors/seeds.jsonl")
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|vector| vector["kind"] == kind)
        .map(|vector| vector["value"].clone())
        .collect()
}

/// `POST path` on `addr` with a bearer: the status and the JSON body.
fn post(addr: &str, path: &str, bearer: &str, body: &str) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAuthorization: Bearer {bearer}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn the_bus_and_pod_seeds_client_examples_are_answered_as_their_seeds_say() {
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods");
    let (server, _) = crate::bus::serve_worker(
        dir.path(),
        &dir.path().join("bus-registry.json"),
        &["--pod", "helper", "--runtime-dir", pods.to_str().unwrap()],
    );
    // Seed 000: the request shape is delegated and answered with a v1
    // success envelope.
    let bus = crate::bus::bus_addr(&server.notes);
    for request in examples("bus-request") {
        let (status, answer) = post(&bus, "/api/talk", crate::bus::SECRET, &request.to_string());
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["success"], true, "{answer}");
        assert_eq!(answer["fromInstance"], "worker", "{answer}");
        assert_eq!(answer["protocolVersion"], 1, "{answer}");
        assert_eq!(
            answer["text"], "echo: Please verify this answer",
            "{answer}"
        );
    }
    // Seed 003: each method, in the seed's order, answered by its event.
    let stream = UnixStream::connect(pods.join("helper").join("sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut next = || {
        let mut line = String::new();
        reader.read_line(&mut line).expect("an event in time");
        serde_json::from_str::<Value>(&line).unwrap()
    };
    assert_eq!(next()["event"], "status", "a listener's first event");
    for method in examples("pod-method") {
        writeln!(writer, "{method}").unwrap();
        let name = method["method"].as_str().unwrap();
        // What the seed says each method is answered with, on an idle pod
        // (the run's turn ends before the next method is sent).
        let done = |event: &Value| match name {
            "run" => event["event"] == "turn_end" && event["data"]["result"] == "finished",
            "resume" => event["event"] == "error" && event["data"]["code"] == "not_paused",
            "cancel" => event["event"] == "error" && event["data"]["code"] == "not_running",
            "get_status" => event["event"] == "status",
            "get_history" => event["event"] == "history",
            other => panic!("a method the seed does not have: {other}"),
        };
        let mut seen = Vec::new();
        loop {
            let event = next();
            let stop = done(&event);
            seen.push(event["event"].as_str().unwrap_or_default().to_owned());
            if stop {
                break;
            }
            assert!(seen.len() < 100, "{name}: {seen:?}");
        }
        if name == "run" {
            assert!(seen.contains(&"turn_start".to_owned()), "{seen:?}");
            assert!(seen.contains(&"text_done".to_owned()), "{seen:?}");
        }
    }
    assert!(terminate(server).success());
}

#[test]
fn the_json_rpc_seeds_client_example_is_answered_with_a_result() {
    // Seed 001 §5.1: `state.snapshot` with no params, over stdio.
    let requests: Vec<String> = examples("rpc")
        .into_iter()
        .filter(|v| v.get("method").is_some() && v.get("id").is_some())
        .map(|v| v.to_string())
        .collect();
    let requests: Vec<&str> = requests.iter().map(String::as_str).collect();
    let output = crate::rpc::rpc_stdio(&requests);
    let answers: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], 1, "{answers:?}");
    assert!(answers[0].get("result").is_some(), "{answers:?}");
}
