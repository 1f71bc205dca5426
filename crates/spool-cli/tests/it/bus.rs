//! `spool serve --bus` and `spool bus talk`: one instance delegating to
//! another over loopback, both the real binary.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::server::{Running, serve, terminate};

/// The bus address a server said it listens on.
/// The secret every test's worker keeps in `bus.secret`.
pub(crate) const SECRET: &str = "a-secret-for-the-test";

/// `spool serve` as the bus instance `worker`, taking delegations from
/// `reviewer` with the secret [`SECRET`] (in `DIR/bus.secret`, 0600),
/// listed in `registry`, and `extra` flags; with the secret's path.
pub(crate) fn serve_worker(
    dir: &std::path::Path,
    registry: &std::path::Path,
    extra: &[&str],
) -> (Running, std::path::PathBuf) {
    let secret = dir.join("bus.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut args = vec![
        "--instance",
        "worker",
        "--bus",
        "127.0.0.1:0",
        "--bus-peer",
        "reviewer",
        "--bus-secret-file",
        secret.to_str().unwrap(),
        "--bus-registry",
        registry.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (serve(dir, &args), secret)
}

pub(crate) fn bus_addr(notes: &[String]) -> String {
    notes
        .iter()
        .find_map(|line| line.strip_prefix("spool: bus worker on "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("the server names its bus address: {notes:?}"))
        .to_owned()
}

fn talk(addr: &str, secret: &std::path::Path, from: &str, prompt: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args([
            "bus",
            "talk",
            "worker",
            prompt,
            "--to",
            addr,
            "--secret-file",
        ])
        .arg(secret)
        .args(["--from", from])
        .output()
        .unwrap()
}

fn spool(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn spool_bus_talk_delegates_to_a_served_instance_and_prints_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("run").join("bus-registry.json");
    let registry_arg = registry.to_str().unwrap();
    let (server, secret) = serve_worker(dir.path(), &registry, &[]);
    let addr = bus_addr(&server.notes);
    let answer = talk(&addr, &secret, "reviewer", "hello over the bus");
    assert!(answer.status.success(), "{answer:?}");
    assert_eq!(
        String::from_utf8_lossy(&answer.stdout).trim(),
        "echo: hello over the bus"
    );
    // Not a peer: refused, and not worth retrying.
    let refused = talk(&addr, &secret, "stranger", "hello");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("peer_not_allowed"),
        "{refused:?}"
    );
    // By name, through the registry: its port and secret are there.
    let found = spool(&[
        "bus",
        "talk",
        "worker",
        "found by name",
        "--from",
        "reviewer",
        "--bus-registry",
        registry_arg,
    ]);
    assert!(found.status.success(), "{found:?}");
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).trim(),
        "echo: found by name"
    );
    let listed = spool(&["bus", "list", "--bus-registry", registry_arg]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.starts_with("worker\t") && listed.contains("\tok"),
        "{listed}"
    );
    assert!(terminate(server).success());
    // A graceful stop leaves the registry.
    let listed = spool(&["bus", "list", "--bus-registry", registry_arg]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
        "{listed:?}"
    );
}

#[test]
fn serve_refuses_a_bus_secret_others_may_read() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("bus.secret");
    std::fs::write(&secret, "shared").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
        .arg(dir.path().join("journal"))
        .args([
            "--instance",
            "worker",
            "--bus",
            "127.0.0.1:0",
            "--bus-secret-file",
        ])
        .arg(&secret)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("0600"),
        "{output:?}"
    );
}

/// An instance's directory: its `spool.toml` (an agent with `[bus]`) and
/// a script for its model.
fn instance_dir(root: &std::path::Path, name: &str, bus: &str, script: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("script.jsonl"), script).unwrap();
    std::fs::write(
        dir.join("spool.toml"),
        format!(
            "[agent]\nengine = \"scripted:script.jsonl\"\n\n[bus]\ninstance = \"{name}\"\n{bus}"
        ),
    )
    .unwrap();
    dir
}

/// A run started over the HTTP channel, waiting for its turn's end: the
/// answer's JSON.
pub(crate) fn run_to_end(addr: &str, text: &str) -> serde_json::Value {
    let body = serde_json::json!({ "text": text }).to_string();
    let (_, reply) = crate::serve::post(addr, "/spool/v1/runs", &body, None);
    let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(json).unwrap_or_else(|_| panic!("a JSON answer: {reply}"))
}

/// `GET path`'s JSON body.
pub(crate) fn get_json(addr: &str, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(json).unwrap_or_else(|_| panic!("a JSON answer: {reply}"))
}

/// The runs a server lists.
fn runs(addr: &str) -> Vec<serde_json::Value> {
    get_json(addr, "/spool/v1/runs")["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits for the server to log a delegation: the run it made.
fn delegation_run(said: &std::sync::mpsc::Receiver<String>) -> String {
    loop {
        let line = said
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the worker logs the delegation");
        if let Some(rest) = line.split("bus: delegation accepted").nth(1) {
            let (_, run) = rest.split_once("run_id=").expect("the log names the run");
            return run
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "_-.:".contains(*c))
                .collect();
        }
    }
}

const DELEGATE_TO_WORKER: &str = "{\"tool_calls\": [{\"id\": \"d1\", \"name\": \"delegate\", \"arguments\": {\"instance\": \"worker\", \"prompt\": \"count to ten\"}}]}\n{\"text\": \"reviewed\"}\n";

#[test]
fn a_worker_killed_mid_delegation_and_restarted_answers_the_retry_with_its_one_run() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("bus-registry.json");
    let registry = registry.display();
    let counted = "one two three four five six seven eight nine ten";
    let worker_dir = instance_dir(
        root.path(),
        "worker",
        &format!("listen = \"127.0.0.1:0\"\npeers = [\"reviewer\"]\nregistry = \"{registry}\"\n"),
        &format!(
            "{}\n",
            serde_json::json!({"text": counted, "delay_ms": 150})
        ),
    );
    let reviewer_dir = instance_dir(
        root.path(),
        "reviewer",
        &format!(
            "peers = [\"worker\"]\nregistry = \"{registry}\"\ndelegate = true\nattempts = 20\n"
        ),
        DELEGATE_TO_WORKER,
    );
    let worker = serve(&worker_dir, &[]);
    let reviewer = serve(&reviewer_dir, &[]);
    let reviewer_addr = reviewer.addr.clone();
    let asked = std::thread::spawn(move || run_to_end(&reviewer_addr, "review the count"));
    // Kill the worker while its delegated turn streams its answer.
    let run = delegation_run(&worker.said);
    let lines = crate::serve::stream_lines(&worker.addr, &format!("/spool/v1/runs/{run}/stream"));
    loop {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the delegated run streams");
        if line["type"] == "text_delta" {
            break;
        }
    }
    let Running { mut child, .. } = worker;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Restarted on another port: the reviewer finds it in the registry
    // again, sends the same delegation, and gets the resumed run's answer.
    let worker = serve(&worker_dir, &[]);
    let answer = asked.join().unwrap();
    assert_eq!(answer["response"], "reviewed", "{answer}");
    let reviewer_run = answer["run_id"].as_str().unwrap();
    let snapshot = get_json(
        &reviewer.addr,
        &format!("/spool/v1/runs/{reviewer_run}/snapshot"),
    );
    assert!(
        snapshot.to_string().contains(counted),
        "the worker's whole answer is the tool's output: {snapshot}"
    );
    let worker_runs = runs(&worker.addr);
    assert_eq!(worker_runs.len(), 1, "the prompt ran once: {worker_runs:?}");
    assert_eq!(worker_runs[0]["id"], run.as_str());
    assert!(terminate(reviewer).success());
    assert!(terminate(worker).success());
}

#[test]
fn two_instances_delegating_to_each_other_stop_at_the_maximum_depth() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("bus-registry.json");
    let registry = registry.display();
    // Every run of each delegates to the other, then answers with its
    // name: reviewer → worker (depth 1) → reviewer (2) → worker (3) is
    // the maximum, refused before it is sent.
    let bus = |peer: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\npeers = [\"{peer}\"]\nregistry = \"{registry}\"\ndelegate = true\nmax_depth = 3\n"
        )
    };
    let script = |to: &str, name: &str| {
        format!(
            "{}\n{}\n",
            serde_json::json!({"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"instance": to, "prompt": "pass it on"}}]}),
            serde_json::json!({"text": format!("{name} done")})
        )
    };
    let worker = serve(
        &instance_dir(
            root.path(),
            "worker",
            &bus("reviewer"),
            &script("reviewer", "worker"),
        ),
        &[],
    );
    let reviewer = serve(
        &instance_dir(
            root.path(),
            "reviewer",
            &bus("worker"),
            &script("worker", "reviewer"),
        ),
        &[],
    );
    let answer = run_to_end(&reviewer.addr, "start");
    assert_eq!(answer["response"], "reviewer done", "{answer}");
    assert_eq!(runs(&worker.addr).len(), 1);
    let reviewer_runs = runs(&reviewer.addr);
    assert_eq!(
        reviewer_runs.len(),
        2,
        "the loop came back once: {reviewer_runs:?}"
    );
    let looped = reviewer_runs
        .iter()
        .find(|r| r["id"] != answer["run_id"])
        .unwrap();
    let snapshot = get_json(
        &reviewer.addr,
        &format!("/spool/v1/runs/{}/snapshot", looped["id"].as_str().unwrap()),
    );
    assert!(
        snapshot
            .to_string()
            .contains("bus error max_depth_exceeded"),
        "the third hop was refused: {snapshot}"
    );
    assert!(terminate(reviewer).success());
    assert!(terminate(worker).success());
}

#[test]
fn a_bus_table_without_instance_is_served_under_the_instance_flag() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("run").join("bus-registry.json");
    std::fs::write(
        dir.path().join("spool.toml"),
        format!(
            "[bus]\nlisten = \"127.0.0.1:0\"\npeers = [\"reviewer\"]\nregistry = \"{}\"\n",
            registry.display()
        ),
    )
    .unwrap();
    let server = serve(dir.path(), &["--instance", "worker"]);
    assert!(
        server
            .notes
            .iter()
            .any(|line| line.starts_with("spool: bus worker on ")),
        "{:?}",
        server.notes
    );
}

#[test]
fn cancelling_a_delegating_run_cancels_the_run_it_delegated_to_the_other_instance() {
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("bus-registry.json");
    let registry = registry.display();
    // The worker's answer streams for a minute: long enough to be cut off.
    let worker_dir = instance_dir(
        root.path(),
        "worker",
        &format!("listen = \"127.0.0.1:0\"\npeers = [\"reviewer\"]\nregistry = \"{registry}\"\n"),
        &format!(
            "{}\n",
            serde_json::json!({"text": "one two three four five six seven eight nine ten eleven twelve", "delay_ms": 5000})
        ),
    );
    let reviewer_dir = instance_dir(
        root.path(),
        "reviewer",
        &format!("peers = [\"worker\"]\nregistry = \"{registry}\"\ndelegate = true\n"),
        DELEGATE_TO_WORKER,
    );
    let worker = serve(&worker_dir, &[]);
    let reviewer = serve(&reviewer_dir, &[]);
    let reviewer_addr = reviewer.addr.clone();
    let asked = std::thread::spawn(move || run_to_end(&reviewer_addr, "review the count"));
    let delegated = delegation_run(&worker.said);
    let lines =
        crate::serve::stream_lines(&worker.addr, &format!("/spool/v1/runs/{delegated}/stream"));
    // The reviewer's run, cancelled while its delegate call waits.
    let reviewing = runs(&reviewer.addr)
        .first()
        .and_then(|run| run["id"].as_str().map(str::to_owned))
        .expect("the reviewer's run is listed");
    let (status, reply) = crate::serve::post(
        &reviewer.addr,
        &format!("/spool/v1/runs/{reviewing}/cancel"),
        "{}",
        None,
    );
    assert_eq!(status, 202, "{reply}");
    let answer = asked.join().unwrap();
    assert_eq!(answer["state"], "cancelled", "{answer}");
    // The worker's delegated run ends cancelled too, well before its
    // answer would have finished streaming.
    loop {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the delegated run is cancelled in time");
        if line["type"] == "run_state" && line["state"] == "cancelled" {
            break;
        }
    }
    assert!(terminate(reviewer).success());
    assert!(terminate(worker).success());
}
