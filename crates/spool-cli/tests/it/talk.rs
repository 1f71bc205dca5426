//! `spool run` and `spool chat`: the real binary, in-process on a local
//! journal and against a real server, its stdin scripted.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::serve::{serve, terminate};

const APPROVAL_AGENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/approval/spool.toml"
);

struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `spool ARGS` in `dir` with `input` on stdin (then closed), and
/// fails the test if it has not exited within 30 s.
fn spool(dir: &Path, args: &[&str], input: &str) -> Finished {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .current_dir(dir)
        .env_remove("SPOOL_JOURNAL")
        .env_remove("SPOOL_URL")
        .env_remove("SPOOL_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let pid = child.id().to_string();
    let (sender, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match exited.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => {
            let output = output.unwrap();
            Finished {
                code: output.status.code(),
                stdout: String::from_utf8(output.stdout).unwrap(),
                stderr: String::from_utf8(output.stderr).unwrap(),
            }
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid]).status();
            // What it said before it was killed is what explains the hang.
            let said = exited
                .recv_timeout(Duration::from_secs(5))
                .ok()
                .and_then(Result::ok)
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!(
                "`spool {}` did not exit within 30 s; its stderr:\n{said}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn run_in_process_prints_only_the_answer_on_stdout_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let done = spool(dir.path(), &["run", "hello there"], "");
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert_eq!(done.stdout, "echo: hello there\n");
    assert!(done.stderr.contains("spool: run run_"), "{}", done.stderr);
    assert!(
        dir.path().join(".spool").exists(),
        "the run is kept in the default journal"
    );
}

#[test]
fn a_one_shot_run_records_its_creation_and_first_turn_in_one_append() {
    let dir = tempfile::tempdir().unwrap();
    let done = spool(dir.path(), &["run", "hello"], "");
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    let run = done
        .stderr
        .split_whitespace()
        .find(|word| word.starts_with("run_"))
        .unwrap()
        .to_owned();
    let shown = spool(dir.path(), &["runs", "show", &run, "--json"], "");
    assert_eq!(shown.code, Some(0), "stderr: {}", shown.stderr);
    let events: Vec<serde_json::Value> = shown
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kind = |n: usize| events[n]["event"]["kind"].as_str().unwrap().to_owned();
    assert_eq!(
        (kind(0), kind(1)),
        ("run_created".to_owned(), "turn_started".to_owned())
    );
    // One append is stamped once: two would each read the clock.
    assert_eq!(
        events[0]["recorded_at"], events[1]["recorded_at"],
        "{}",
        shown.stdout
    );
}

#[test]
fn one_shot_runs_leave_a_small_write_ahead_log_that_the_next_appends_to() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join(".spool").join("journal.db-wal");
    let first = spool(dir.path(), &["run", "one"], "");
    assert_eq!(first.code, Some(0), "stderr: {}", first.stderr);
    let left = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(left > 0, "the first run's commits stay in the log");
    let second = spool(dir.path(), &["run", "two"], "");
    assert_eq!(second.code, Some(0), "stderr: {}", second.stderr);
    assert_eq!(second.stdout, "echo: two\n");
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) > left,
        "the second run appended to the log rather than starting another"
    );
    let listed = spool(dir.path(), &["runs", "list", "--json"], "");
    assert_eq!(listed.code, Some(0), "stderr: {}", listed.stderr);
    assert_eq!(
        listed
            .stdout
            .lines()
            .filter(|line| line.contains(r#""state":"completed""#))
            .count(),
        2,
        "{}",
        listed.stdout
    );
}

#[test]
fn run_asks_an_approval_on_the_terminal_and_records_the_verdict_typed() {
    let dir = tempfile::tempdir().unwrap();
    let done = spool(
        dir.path(),
        &[
            "run",
            "--agent",
            APPROVAL_AGENT,
            "--address",
            "deploy",
            "deploy it",
        ],
        "no\n",
    );
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert!(
        done.stderr
            .contains("? Deploy the plan to staging? [approve / reject] (yes/no)"),
        "{}",
        done.stderr
    );
    assert_eq!(
        done.stdout,
        "I will ask before deploying.\nApproved, so the plan is deployed to staging.\n"
    );
    // The journal holds the answer as typed: "no" is a rejection.
    let shown = spool(dir.path(), &["runs", "list", "--journal", ".spool"], "");
    let run = shown
        .stdout
        .split_whitespace()
        .find(|word| word.starts_with("run_"))
        .unwrap()
        .to_owned();
    let log = spool(
        dir.path(),
        &["runs", "show", "--journal", ".spool", &run],
        "",
    );
    assert!(
        log.stdout
            .contains(r#"{"answers":[{"approved":false,"text":"no"}]"#),
        "{}",
        log.stdout
    );
}

#[test]
fn run_with_input_closed_leaves_the_run_waiting_and_chat_on_its_address_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = ["--agent", APPROVAL_AGENT, "--address", "later"];
    let left = spool(
        dir.path(),
        &[&["run"], &agent[..], &["deploy it"]].concat(),
        "",
    );
    assert_eq!(left.code, Some(2), "stderr: {}", left.stderr);
    assert!(
        left.stderr
            .contains("the run waits for an answer; continue with `spool chat --address later`"),
        "{}",
        left.stderr
    );
    assert_eq!(left.stdout, "I will ask before deploying.\n");

    // A new process on the same journal finds the question from the
    // journal alone, and the next line answers it.
    let chat = spool(dir.path(), &[&["chat"], &agent[..]].concat(), "yes\n");
    assert_eq!(chat.code, Some(0), "stderr: {}", chat.stderr);
    assert_eq!(
        chat.stderr.matches("? Deploy the plan to staging?").count(),
        1,
        "{}",
        chat.stderr
    );
    assert_eq!(
        chat.stdout,
        "Approved, so the plan is deployed to staging.\n"
    );
}

#[test]
fn chat_takes_turns_in_order_refuses_unknown_commands_and_new_starts_a_fresh_run() {
    let dir = tempfile::tempdir().unwrap();
    let done = spool(
        dir.path(),
        &["chat", "--address", "room"],
        "first\nsecond\n/nwe\n/new\nthird\n/quit\nnever sent\n",
    );
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert_eq!(done.stdout, "echo: first\necho: second\necho: third\n");
    assert!(
        done.stderr.contains("spool: unknown command /nwe"),
        "a mistyped command is not sent: {}",
        done.stderr
    );
    let runs: Vec<&str> = done
        .stderr
        .lines()
        .filter(|line| line.starts_with("spool: run run_"))
        .collect();
    assert_eq!(runs.len(), 2, "{}", done.stderr);
    assert!(runs[0].ends_with("(address room)"), "{}", runs[0]);
    assert_ne!(runs[0], runs[1]);
}

#[test]
fn run_and_chat_against_a_server_stream_the_same_answers_as_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &["--agent", APPROVAL_AGENT]);
    let url = format!("http://{}", running.addr);
    let run = spool(
        dir.path(),
        &["run", "--url", &url, "--address", "team/one", "deploy it"],
        "yes\n",
    );
    let chat = spool(
        dir.path(),
        &["chat", "--url", &url, "--address", "team/two"],
        "deploy it\nyes\n/quit\n",
    );
    let status = terminate(running);
    assert!(status.success());
    for done in [&run, &chat] {
        assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
        assert_eq!(
            done.stdout,
            "I will ask before deploying.\nApproved, so the plan is deployed to staging.\n"
        );
    }
    // The address with a slash travelled as one path segment.
    assert!(run.stderr.contains("(address team/one)"), "{}", run.stderr);
}

#[test]
fn run_against_an_unreachable_server_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1 on loopback: nothing listens there.
    let done = spool(
        dir.path(),
        &["run", "--url", "http://127.0.0.1:1", "hi"],
        "",
    );
    assert_eq!(done.code, Some(1));
    assert!(
        done.stderr.contains("spool: connecting to 127.0.0.1:1: "),
        "{}",
        done.stderr
    );
    let done = spool(dir.path(), &["run", "--url", "ftp://example", "hi"], "");
    assert_eq!(done.code, Some(1));
    assert!(
        done.stderr.contains("is not a Spool URL"),
        "{}",
        done.stderr
    );
}

#[test]
fn run_refuses_a_journal_a_server_owns_and_points_to_url() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let journal = dir.path().join("journal");
    let done = spool(
        dir.path(),
        &["run", "--journal", journal.to_str().unwrap(), "hi"],
        "",
    );
    let status = terminate(running);
    assert!(status.success());
    assert_eq!(done.code, Some(1));
    assert!(
        done.stderr.contains("is in use by another process (pid ")
            && done.stderr.contains("talk to it with `--url`"),
        "{}",
        done.stderr
    );
    assert_eq!(done.stdout, "", "no run was made");
}

#[test]
fn cancel_in_chat_ends_the_running_turn_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    // A model call that would take a minute: only a cancel ends it sooner.
    std::fs::write(
        dir.path().join("slow.jsonl"),
        r#"{"text": "never finished", "delay_ms": 60000}"#,
    )
    .unwrap();
    let done = spool(
        dir.path(),
        &[
            "chat",
            "--model",
            "scripted:slow.jsonl",
            "--address",
            "slow",
        ],
        "start the long job\n/cancel\n/quit\n",
    );
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert!(
        done.stderr.contains("spool: the turn was cancelled"),
        "{}",
        done.stderr
    );
    assert!(!done.stdout.contains("never finished"), "{}", done.stdout);
}

#[test]
fn run_with_a_command_engine_prints_the_programs_answer() {
    let dir = tempfile::tempdir().unwrap();
    let model = "command:sh -c 'cat > request.json; echo from the provider'";
    let done = spool(dir.path(), &["run", "--model", model, "hello there"], "");
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert_eq!(done.stdout, "from the provider\n");
    // The program got the conversation as JSON on stdin.
    let request: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("request.json")).unwrap()).unwrap();
    let last = request["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last,
        serde_json::json!({"role": "user", "content": "hello there"})
    );
}

#[test]
fn run_with_a_failing_command_engine_reports_engine_cli() {
    let dir = tempfile::tempdir().unwrap();
    let model = "command:sh -c 'echo provider trouble >&2; exit 4'";
    let done = spool(dir.path(), &["run", "--model", model, "hello"], "");
    assert_ne!(done.code, Some(0));
    assert!(done.stderr.contains("engine_cli"), "{}", done.stderr);
}

/// The tests' TLS identity for `localhost` (its README says how it was made).
const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");

/// `spool serve` over TLS with copies of the tests' `localhost` identity
/// in `dir/tls` (so a test may renew them), and its `https://` URL.
pub(crate) fn serve_tls(dir: &std::path::Path) -> (crate::serve::Running, String) {
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    std::fs::copy(format!("{TLS_DIR}/localhost.pem"), tls.join("cert.pem")).unwrap();
    std::fs::copy(format!("{TLS_DIR}/localhost.key"), tls.join("key.pem")).unwrap();
    let (cert, key) = (tls.join("cert.pem"), tls.join("key.pem"));
    let running = crate::serve::serve(
        dir,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let port = running.addr.rsplit(':').next().unwrap().to_owned();
    (running, format!("https://localhost:{port}"))
}

/// `spool run --url URL TEXT` trusting the roots in `roots` (a file in
/// [`TLS_DIR`]), or only the web's when `None`.
pub(crate) fn run_over_tls(
    dir: &std::path::Path,
    url: &str,
    text: &str,
    roots: Option<&str>,
) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spool"));
    command
        .args(["run", "--url", url, text])
        .current_dir(dir)
        .env_remove("SSL_CERT_FILE");
    if let Some(roots) = roots {
        command.env("SSL_CERT_FILE", format!("{TLS_DIR}/{roots}"));
    }
    command.output().unwrap()
}

#[test]
fn run_reaches_a_server_serving_tls_by_its_https_url_trusting_the_roots_in_ssl_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = serve_tls(dir.path());
    let trusted = run_over_tls(dir.path(), &url, "hello over tls", Some("localhost.pem"));
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&trusted.stdout).trim(),
        "echo: hello over tls"
    );
    // The certificate is signed by nobody the web trusts: without the
    // root, the client refuses it and says so.
    let refused = run_over_tls(dir.path(), &url, "hello", None);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("TLS with localhost:") && said.contains("certificate"),
        "{said}"
    );
    assert!(terminate(running).success());
}

#[test]
fn a_renewed_certificate_is_served_from_the_next_connection_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (running, url) = serve_tls(dir.path());
    let before = run_over_tls(dir.path(), &url, "before", Some("localhost.pem"));
    assert!(
        before.status.success(),
        "{}",
        String::from_utf8_lossy(&before.stderr)
    );
    // Renewed as certbot and cert-manager do: new files renamed into
    // place, the key first.
    let tls = dir.path().join("tls");
    for (from, to) in [("renewed.key", "key.pem"), ("renewed.pem", "cert.pem")] {
        let staged = tls.join(format!("{to}.new"));
        std::fs::copy(format!("{TLS_DIR}/{from}"), &staged).unwrap();
        std::fs::rename(&staged, tls.join(to)).unwrap();
    }
    let renewed = run_over_tls(dir.path(), &url, "after", Some("renewed.pem"));
    assert!(
        renewed.status.success(),
        "the renewed certificate is served: {}",
        String::from_utf8_lossy(&renewed.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&renewed.stdout).trim(),
        "echo: after"
    );
    let old = run_over_tls(dir.path(), &url, "old", Some("localhost.pem"));
    assert!(
        !old.status.success(),
        "the replaced certificate is no longer served"
    );
    assert!(terminate(running).success());
}
