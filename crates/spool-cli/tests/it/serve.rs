//! `spool serve` and `spool token new`: the real binary on a real socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Command;
use std::time::Duration;

pub(crate) use crate::server::{Running, serve, terminate};

/// One `POST` on a fresh connection: the status and the whole reply.
pub(crate) fn post(addr: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    // A turn may take a delegation's retries to answer; the wait only
    // matters when something is broken.
    stream
        .set_read_timeout(Some(Duration::from_secs(90)))
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    // One write: a server may answer (and close) on the request's first
    // segment, as a TLS port refusing plain HTTP does.
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    (status, reply)
}

#[test]
fn serve_runs_the_echo_agent_by_default_keeps_runs_across_a_restart_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let (status, reply) = post(
        &running.addr,
        "/spool/v1/runs",
        r#"{"text": "hello", "address": "desk"}"#,
        None,
    );
    assert_eq!(status, 200, "{reply}");
    assert!(reply.contains(r#""response":"echo: hello""#), "{reply}");
    assert!(terminate(running).success(), "a graceful stop exits 0");
    // Everything is in the journal's file: its write-ahead log was emptied
    // (SQLite removes it with the last connection).
    let wal = dir.path().join("journal").join("journal.db-wal");
    assert_eq!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()),
        0,
        "a graceful stop leaves the write-ahead log empty"
    );
    let again = serve(dir.path(), &[]);
    let (status, reply) = post(
        &again.addr,
        "/spool/v1/runs",
        r#"{"text": "again", "address": "desk"}"#,
        None,
    );
    assert_eq!(status, 200);
    assert!(
        reply.contains(r#""response":"echo: again""#),
        "the same run took another turn: {reply}"
    );
    assert!(terminate(again).success());
}

#[test]
fn serve_refuses_a_run_cache_of_zero_runs_as_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--cached-runs", "0", "--journal"])
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--cached-runs"), "{stderr}");
    assert!(
        !dir.path().join("journal").exists(),
        "nothing is opened before the flags are checked"
    );
}

#[test]
fn serve_refuses_owner_run_access_without_a_token_file_as_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--run-access", "owner", "--journal"])
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--token-file"));
    assert!(!dir.path().join("journal").exists());
}

#[test]
fn serve_refuses_a_non_loopback_address_without_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--addr", "0.0.0.0:0", "--journal"])
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("without an authenticator"));
}

#[test]
fn serve_refuses_a_tls_key_of_another_certificate_before_opening_anything() {
    let dir = tempfile::tempdir().unwrap();
    let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--addr", "127.0.0.1:0", "--tls-cert"])
        .arg(format!("{tls}/localhost.pem"))
        .arg("--tls-key")
        .arg(format!("{tls}/renewed.key"))
        .arg("--journal")
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("renewed.key does not go with"),
        "the error names the files: {said}"
    );
    assert!(!dir.path().join("journal").exists());
}

#[test]
fn a_tls_port_answers_plain_http_with_bad_request_and_serves_others_while_one_stalls_in_its_handshake()
 {
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = crate::talk::serve_tls(dir.path());
    // Connected, and silent: its handshake never starts.
    let _stalled = std::net::TcpStream::connect(&running.addr).unwrap();
    let (status, reply) = post(&running.addr, "/spool/v1/runs", r#"{"text": "hi"}"#, None);
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply.contains(r#""code":"bad_request""#) && reply.contains("use https://"),
        "{reply}"
    );
    let served = crate::talk::run_over_tls(dir.path(), &url, "still served", Some("localhost.pem"));
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
    assert!(terminate(running).success());
}

#[test]
fn a_token_made_by_spool_token_new_admits_requests_to_a_server_that_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["token", "new", "ops", "--token-file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(output.status.success());
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let running = serve(dir.path(), &["--token-file", tokens.to_str().unwrap()]);
    assert_eq!(
        post(&running.addr, "/spool/v1/runs", r#"{"text": "hi"}"#, None).0,
        401
    );
    assert_eq!(
        post(
            &running.addr,
            "/spool/v1/runs",
            r#"{"text": "hi"}"#,
            Some(&token)
        )
        .0,
        200
    );
    assert!(terminate(running).success());
}

/// Reads NDJSON lines of a raw HTTP stream (chunked framing skipped).
pub(crate) fn stream_lines(addr: &str, path: &str) -> std::sync::mpsc::Receiver<serde_json::Value> {
    stream_lines_as(addr, path, None)
}

/// [`stream_lines`] with a bearer token.
pub(crate) fn stream_lines_as(
    addr: &str,
    path: &str,
    token: Option<&str>,
) -> std::sync::mpsc::Receiver<serde_json::Value> {
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n"
    )
    .unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(socket).lines() {
            let Ok(line) = line else { return };
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(line.trim())
                && value.is_object()
                && sender.send(value).is_err()
            {
                return;
            }
        }
    });
    lines
}

#[test]
fn a_server_killed_mid_run_resumes_it_on_restart_with_nothing_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let writes = dir.path().join("writes.log");
    std::fs::write(
        dir.path().join("script.jsonl"),
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"write\", \"arguments\": {\"id\": \"w1\"}}]}\n{\"text\": \"one two three four five six seven eight nine ten\", \"delay_ms\": 150}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        format!(
            "[agent]\nengine = \"scripted:script.jsonl\"\n\n[[tool]]\nname = \"write\"\ndescription = \"Writes.\"\ncommand = [\"sh\", \"-c\", \"cat >> {}; echo; echo '{{\\\"ok\\\": true}}'\"]\neffect = \"write\"\n",
            writes.display()
        ),
    )
    .unwrap();
    let first = serve(dir.path(), &[]);
    let (_, ensured) = post(&first.addr, "/spool/v1/addresses/job", "", None);
    let run = ensured
        .split("\"run_id\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let lines = stream_lines(&first.addr, &format!("/spool/v1/runs/{run}/stream"));
    let addr = first.addr.clone();
    let run_path = format!("/spool/v1/runs/{run}");
    // The request waits for the turn's end, which this server will not see.
    std::thread::spawn(move || {
        let _ = std::net::TcpStream::connect(&addr).map(|mut s| {
            let body = r#"{"text": "do it"}"#;
            let _ = write!(
                s,
                "POST {run_path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.read_to_end(&mut Vec::new());
        });
    });
    // Kill it while the second answer streams: the write is done and
    // recorded, the model call after it is under way.
    next_of(
        &lines,
        "text_delta",
        Duration::from_secs(20),
        "the run streams",
    );
    kill(first);
    let second = serve(dir.path(), &[]);
    let lines = stream_lines(&second.addr, &format!("/spool/v1/runs/{run}/stream"));
    let response = next_of(
        &lines,
        "run_response",
        Duration::from_secs(30),
        "the resumed run streams to its end",
    );
    assert_eq!(
        response["text"],
        "one two three four five six seven eight nine ten"
    );
    let written = std::fs::read_to_string(&writes).unwrap();
    assert_eq!(
        written.lines().filter(|l| !l.is_empty()).count(),
        1,
        "the write ran once: {written:?}"
    );
    assert!(terminate(second).success());
}

/// The next line of `type` on a stream, within `patience`; `what` says
/// what the test waited for when it does not come.
fn next_of(
    lines: &std::sync::mpsc::Receiver<serde_json::Value>,
    kind: &str,
    patience: Duration,
    what: &str,
) -> serde_json::Value {
    loop {
        let line = lines.recv_timeout(patience).expect(what);
        if line["type"] == kind {
            return line;
        }
    }
}

/// SIGKILLs the server.
pub(crate) fn kill(running: Running) {
    let Running { mut child, .. } = running;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The `run_id` in a whole HTTP reply.
fn run_id_in(reply: &str) -> String {
    reply
        .split("\"run_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no run_id in {reply}"))
        .to_owned()
}

#[test]
fn a_server_killed_with_runs_asleep_and_mid_turn_resumes_both_after_a_restart_and_says_what_its_reading_resumed()
 {
    let dir = tempfile::tempdir().unwrap();
    // The first call of a run sleeps, the second answers; "slow" runs
    // stream their one answer slowly instead. The sleep outlasts the
    // second server, which re-arms it and is killed before it ends.
    std::fs::write(
        dir.path().join("script.jsonl"),
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"sleep\", \"arguments\": {\"seconds\": 3}}]}\n{\"text\": \"rested\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("slow.jsonl"),
        "{\"text\": \"one two three four five six\", \"delay_ms\": 200}\n",
    )
    .unwrap();
    let on_script = |script: &str| {
        std::fs::write(
            dir.path().join("spool.toml"),
            format!("[agent]\nengine = \"scripted:{script}\"\n"),
        )
        .unwrap();
    };
    on_script("script.jsonl");
    let first = serve(dir.path(), &[]);
    let (status, asleep) = post(&first.addr, "/spool/v1/runs", r#"{"text": "nap"}"#, None);
    assert_eq!(status, 200, "{asleep}");
    assert!(asleep.contains("\"state\":\"waiting\""), "{asleep}");
    let asleep = run_id_in(&asleep);
    kill(first);

    // A second server, on the slow script, leaves a run mid-turn.
    on_script("slow.jsonl");
    let second = serve(dir.path(), &[]);
    let (_, ensured) = post(&second.addr, "/spool/v1/addresses/slow", "", None);
    let slow = run_id_in(&ensured);
    let (addr, path) = (second.addr.clone(), format!("/spool/v1/runs/{slow}"));
    // The request waits for the turn's end, which this server will not see.
    std::thread::spawn(move || post(&addr, &path, r#"{"text": "talk slowly"}"#, None));
    let lines = stream_lines(&second.addr, &format!("/spool/v1/runs/{slow}/stream"));
    next_of(
        &lines,
        "text_delta",
        Duration::from_secs(20),
        "the slow run streams",
    );
    kill(second);

    on_script("script.jsonl");
    let third = serve(dir.path(), &[]);
    crate::reload::said(&third, "recovery read the journal: 1 more runs resumed");
    for (run, answer) in [(&asleep, "rested"), (&slow, "one two three four five six")] {
        let lines = stream_lines(&third.addr, &format!("/spool/v1/runs/{run}/stream"));
        let response = next_of(
            &lines,
            "run_response",
            Duration::from_secs(30),
            "the resumed run streams to its end",
        );
        assert_eq!(response["text"], answer, "run {run}");
    }
    assert!(terminate(third).success());
}

#[test]
fn a_run_whose_journal_was_altered_is_409_conversation_corrupt_and_the_server_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let (status, reply) = post(
        &running.addr,
        "/spool/v1/runs",
        r#"{"text": "Deploy it."}"#,
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let run = reply
        .split("\"run_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert!(terminate(running).success());

    let conn = rusqlite::Connection::open(
        dir.path()
            .join("journal")
            .join(spool_journal::store::sqlite::FILE_NAME),
    )
    .unwrap();
    let altered = conn
        .execute(
            "UPDATE events SET body = replace(body, 'Deploy it.', 'Delete it.') WHERE run_id = ?1",
            [&run],
        )
        .unwrap();
    assert!(altered > 0);
    drop(conn);

    let again = serve(dir.path(), &[]);
    let (status, reply) = post(
        &again.addr,
        &format!("/spool/v1/runs/{run}"),
        r#"{"text": "and again"}"#,
        None,
    );
    assert_eq!(status, 409, "{reply}");
    assert!(
        reply.contains(r#""code":"conversation_corrupt""#),
        "{reply}"
    );
    // Other runs are unaffected.
    let (status, reply) = post(&again.addr, "/spool/v1/runs", r#"{"text": "new"}"#, None);
    assert_eq!(status, 200, "{reply}");
    assert!(terminate(again).success());
}

#[test]
fn a_schedule_in_spool_toml_fires_under_serve_and_its_turn_streams_on_its_address() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[[schedule]]\nname = \"tick\"\ncron = \"* * * * * *\"\ntext = \"tick\"\naddress = \"ticker\"\n",
    )
    .unwrap();
    let running = serve(dir.path(), &[]);
    // Ensure the address (the schedule may have bound it already), then
    // follow its run from the start.
    let (status, reply) = post(&running.addr, "/spool/v1/addresses/ticker", "", None);
    assert_eq!(status, 200, "{reply}");
    let body = reply.split("\r\n\r\n").nth(1).unwrap();
    let run: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();
    let lines = stream_lines(&running.addr, &format!("/spool/v1/runs/{run}/stream"));
    let mut fired = false;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) {
        if line["type"] == "run_turn" {
            let context = line["data"]["context"][0].as_str().unwrap_or_default();
            assert!(context.starts_with("Sent by schedule `tick`"), "{line}");
            assert_eq!(line["text"], "tick");
        }
        if line["type"] == "run_response" {
            fired = true;
            break;
        }
    }
    assert!(fired, "a firing's turn answered within 20 s");
    assert!(terminate(running).success());
}
