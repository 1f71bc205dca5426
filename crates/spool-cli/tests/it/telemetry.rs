//! `spool serve` exporting over OTLP/HTTP when the standard variables name
//! a collector: a run's spans, its HTTP request's span, LogRecords and
//! metrics reach it, the last of them flushed at SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc;

use crate::server::{serve_with, terminate};

/// A collector stand-in: each request's path and body, answered 200.
fn collector() -> (String, mpsc::Receiver<(String, Vec<u8>)>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            reader.read_line(&mut head).unwrap();
            let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            // Kept before the answer: once the server has its 200, the
            // request is here to read.
            if sender.send((path, body)).is_err() {
                return;
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (format!("http://{addr}"), received)
}

#[test]
fn serve_exports_a_runs_traces_logs_and_metrics_to_the_collector_the_variables_name() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, received) = collector();
    let server = serve_with(
        dir.path(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "spool-under-test"),
        ],
    );
    assert!(
        server
            .notes
            .iter()
            .any(|n| n.contains("telemetry on: traces, logs, metrics")),
        "{:?}",
        server.notes
    );
    let answer = crate::bus::run_to_end(&server.addr, "hello telemetry");
    let run = answer["run_id"].as_str().unwrap().to_owned();
    // SIGTERM flushes what is queued, metrics included.
    assert!(terminate(server).success());
    let mut paths = std::collections::BTreeMap::<String, Vec<u8>>::new();
    // The server waited for each answer before it exited: everything sent
    // is here.
    while let Ok((path, body)) = received.try_recv() {
        paths.entry(path).or_default().extend(body);
    }
    for path in ["/v1/traces", "/v1/logs", "/v1/metrics"] {
        assert!(paths.contains_key(path), "{path} in {:?}", paths.keys());
    }
    // Protobuf keeps strings as they are: the run's id is in its spans and
    // records, and the service's name in the resource.
    let has = |path: &str, text: &str| {
        paths[path]
            .windows(text.len())
            .any(|window| window == text.as_bytes())
    };
    assert!(has("/v1/traces", &run));
    assert!(has("/v1/traces", "spool-under-test"));
    assert!(has("/v1/logs", &run));
    assert!(has("/v1/metrics", "spool.runs.started"));
    assert!(has("/v1/metrics", "spool.streams.open"));
    // The request that started the run is a server span, named for its
    // route.
    assert!(has("/v1/traces", "POST /spool/v1/runs"));
    assert!(has("/v1/traces", "http.response.status_code"));
}

#[test]
fn the_exporter_trusts_what_ssl_cert_file_names_and_refuses_a_file_without_a_certificate() {
    // The OTLP exporter follows the one outbound trust policy: the roots
    // `SSL_CERT_FILE` adds are read, and a file without any certificate
    // stops the server at start, naming it, as for every other client.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
        .arg(dir.path().join("journal"))
        .current_dir(dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318")
        .env("SSL_CERT_FILE", &empty)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let pid = child.id().to_string();
    // A server that starts anyway would never exit: wait on the exit, and
    // fail (killing it) if it does not come.
    let (sender, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = sender.send((child.wait(), text));
    });
    let Ok((status, stderr)) = exited.recv_timeout(std::time::Duration::from_secs(20)) else {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        panic!("the server started with an SSL_CERT_FILE holding no certificate");
    };
    assert!(!status.unwrap().success());
    assert!(
        stderr.contains("empty.pem holds no usable certificate"),
        "{stderr}"
    );
}
