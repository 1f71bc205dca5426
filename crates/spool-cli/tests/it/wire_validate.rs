//! `spool wire validate`: one report line per input line, exit 0/1/2.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn spool(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    // Written from a thread so a large input cannot deadlock against a full
    // stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

fn reports(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn valid_lines_are_echoed_re_encoded_in_spools_field_order_and_exit_0() {
    let output = spool(
        &["wire", "validate", "pod-method"],
        b"{\"params\":{\"input\":\"hi\"},\"method\":\"run\"}\n{\"method\":\"cancel\"}\n",
    );
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "{\"line\":1,\"ok\":true,\"value\":{\"method\":\"run\",\"params\":{\"input\":\"hi\"}}}\n{\"line\":2,\"ok\":true,\"value\":{\"method\":\"cancel\"}}\n"
    );
}

#[test]
fn an_invalid_line_reports_its_number_reason_and_protocol_code_and_exits_1() {
    let input = b"{\"fromInstance\":\"a\",\"prompt\":\"p\",\"depth\":0}\n\n{\"fromInstance\":\"a\",\"prompt\":\"p\",\"depth\":-1}\n";
    let output = spool(&["wire", "validate", "bus-request"], input);
    assert_eq!(output.status.code(), Some(1));
    let reports = reports(&output);
    assert_eq!(reports.len(), 2, "the blank line is skipped but counted");
    assert_eq!(reports[0]["ok"], json!(true));
    assert_eq!(reports[1]["line"], json!(3));
    assert_eq!(reports[1]["ok"], json!(false));
    assert_eq!(reports[1]["code"], json!("invalid_request"));
    assert!(
        reports[1]["error"].as_str().unwrap().contains("depth"),
        "{}",
        reports[1]
    );
    let keys: Vec<&String> = reports[1].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 4);
}

#[test]
fn a_json_rpc_error_reports_its_integer_code_in_decimal() {
    let output = spool(&["wire", "validate", "rpc"], b"{oops\n[]\n");
    assert_eq!(output.status.code(), Some(1));
    let reports = reports(&output);
    assert_eq!(reports[0]["code"], json!("-32700"));
    assert_eq!(reports[1]["code"], json!("-32600"));
}

#[test]
fn a_sentinel_near_miss_is_refused_without_a_code() {
    let output = spool(
        &["wire", "validate", "sentinel"],
        b"{\"__spool_sleep\":{\"wake_at\":\"2026-08-14T09:00:00Z\"},\"x\":1}\n",
    );
    assert_eq!(output.status.code(), Some(1));
    let reports = reports(&output);
    assert!(reports[0].get("code").is_none());
    assert!(
        reports[0]["error"]
            .as_str()
            .unwrap()
            .contains("not a sentinel")
    );
}

#[test]
fn an_overlong_line_is_reported_and_the_lines_after_it_still_validate() {
    let mut input = vec![b'x'; 5000];
    input.extend_from_slice(b"\n{\"ok\":true,\"status\":\"ready\"}\n");
    let output = spool(
        &["wire", "validate", "http-health", "--max-line-bytes", "100"],
        &input,
    );
    assert_eq!(output.status.code(), Some(1));
    let reports = reports(&output);
    assert_eq!(reports[0]["error"], json!("line longer than 100 bytes"));
    assert_eq!(
        reports[1],
        json!({"line": 2, "ok": true, "value": {"ok": true, "status": "ready"}})
    );
}

#[test]
fn a_last_line_without_a_newline_is_still_validated() {
    let output = spool(
        &["wire", "validate", "http-error"],
        b"{\"error\":\"gone\",\"code\":\"run_not_found\"}",
    );
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(reports(&output).len(), 1);
}

#[test]
fn an_unknown_kind_is_a_usage_error_with_exit_2() {
    let output = spool(&["wire", "validate", "smoke-signal"], b"");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("bus-request"),
        "the error lists the valid kinds"
    );
}

#[test]
fn every_seed_vector_validates_through_the_binary() {
    let vectors = include_str!("../../../spool-wire/tests/vectors/seeds.jsonl");
    let mut by_kind: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for line in vectors.lines().filter(|l| !l.trim().is_empty()) {
        let vector: Value = serde_json::from_str(line).unwrap();
        by_kind
            .entry(vector["kind"].as_str().unwrap().to_owned())
            .or_default()
            .push(vector["value"].clone());
    }
    for (kind, values) in by_kind {
        let input: String = values.iter().map(|v| format!("{v}\n")).collect();
        let output = spool(&["wire", "validate", &kind], input.as_bytes());
        assert_eq!(
            output.status.code(),
            Some(0),
            "{kind}: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let reports = reports(&output);
        for (report, value) in reports.iter().zip(&values) {
            assert_eq!(&report["value"], value, "{kind}");
        }
        assert_eq!(reports.len(), values.len());
    }
}
