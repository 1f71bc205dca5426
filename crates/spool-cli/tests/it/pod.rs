//! `spool serve --pod`: the Pod protocol on a Unix socket of the real
//! binary, across a SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::server::{Running, serve, terminate};

/// A connection to pod `name` under `root`, its events read line by line.
struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    fn connect(root: &Path, name: &str) -> Self {
        let stream = UnixStream::connect(root.join(name).join("sock")).unwrap();
        // A read that waits this long fails the test.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Self {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.writer, "{line}").unwrap();
    }

    fn next(&mut self) -> Value {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("an event in time");
        assert!(!line.is_empty(), "the pod closed the connection");
        serde_json::from_str(&line).unwrap()
    }
}

#[test]
fn a_pod_killed_mid_turn_resumes_the_turn_on_restart_with_nothing_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pods");
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
    let root_arg = root.to_str().unwrap();
    let pod_args = ["--pod", "job", "--runtime-dir", root_arg];
    let first = serve(dir.path(), &pod_args);
    let mut client = Client::connect(&root, "job");
    assert_eq!(client.next()["data"]["state"], "idle");
    client.send(r#"{"method":"run","params":{"input":"do it"}}"#);
    // Killed while the second answer streams: the write is done and
    // recorded, the model call after it under way.
    let mut session = Value::Null;
    loop {
        let event = client.next();
        if event["event"] == "status" {
            session = event["data"]["session_id"].clone();
        }
        if event["event"] == "text_delta" {
            break;
        }
    }
    let Running { mut child, .. } = first;
    child.kill().unwrap(); // SIGKILL: its socket is left behind
    child.wait().unwrap();

    let second = serve(dir.path(), &pod_args);
    let mut client = Client::connect(&root, "job");
    let status = client.next();
    assert_eq!(status["event"], "status");
    assert_eq!(status["data"]["session_id"], session, "the same session");
    if status["data"]["state"] == "running" {
        // The resumed turn, live, to its end.
        loop {
            let event = client.next();
            if event["event"] == "turn_end" {
                assert_eq!(event["data"]["result"], "finished");
                break;
            }
        }
    }
    client.send(r#"{"method":"get_history"}"#);
    let history = loop {
        let event = client.next();
        if event["event"] == "history" {
            break event;
        }
    };
    let texts: Vec<&str> = history["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["role"] == "assistant")
        .filter_map(|item| item["content"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["one two three four five six seven eight nine ten"]);
    let written = std::fs::read_to_string(&writes).unwrap();
    assert_eq!(
        written.lines().filter(|l| !l.is_empty()).count(),
        1,
        "the write ran once: {written:?}"
    );
    assert!(terminate(second).success());
    assert!(
        !root.join("job").join("sock").exists(),
        "a graceful stop removes the socket"
    );
}

#[test]
fn spool_pod_attach_in_a_terminal_runs_what_is_typed_and_streams_the_answer() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pods");
    let root_arg = root.to_str().unwrap();
    let server = serve(dir.path(), &["--pod", "term", "--runtime-dir", root_arg]);
    // `script` gives the client a pseudo-terminal, as a person's shell
    // would.
    let attach = format!(
        "{} pod attach term --runtime-dir {root_arg}",
        env!("CARGO_BIN_EXE_spool")
    );
    let mut child = Command::new("script")
        .args(["-qfec", &attach, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("util-linux's `script` runs the client in a pseudo-terminal");
    let mut stdout = child.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut chunk) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..n]);
            while let Some(at) = bytes.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = bytes.drain(..=at).collect();
                let line = String::from_utf8_lossy(&line).trim_end().to_owned();
                if sender.send(line).is_err() {
                    return;
                }
            }
        }
    });
    let until = |text: &str| -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("`{text}` in time; saw {seen:?}"));
            let done = line.contains(text);
            seen.push(line);
            if done {
                return seen;
            }
        }
    };
    // Connected: the pod's state comes first.
    until("[idle]");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "hello there").unwrap();
    let turn = until("[turn 1 finished]");
    assert!(
        turn.iter().any(|l| l == "echo: hello there"),
        "the answer, streamed onto one line: {turn:?}"
    );
    writeln!(stdin, "/quit").unwrap();
    let (sender, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    let status = exited
        .recv_timeout(Duration::from_secs(20))
        .expect("the client quits on /quit")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(terminate(server).success());
}
