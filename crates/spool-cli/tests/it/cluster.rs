//! Three `spool serve --cluster` processes on one PostgreSQL journal:
//! runs spread over them complete, a node killed mid-turn has its runs
//! finished by the others with no write run twice, a node paused past its
//! lease cannot write when it wakes, and a stream on one node follows a
//! run another node drives; a database away past their leases (a test
//! `cargo xtask ci` runs on a server of its own) loses no answered run.

use std::io::{Read, Write};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::serve::{post, stream_lines, stream_lines_as};
use crate::server::{Running, serve_on, terminate};

/// The lease the tests run with: short, so takeovers come quickly.
const LEASE: &str = "2";

fn node(dir: &std::path::Path, url: &str, name: &str) -> Running {
    node_with(dir, url, name, &[], &[])
}

/// A node started with more flags and environment variables.
fn node_with(
    dir: &std::path::Path,
    url: &str,
    name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Running {
    let mut args = vec!["--cluster", "--lease-seconds", LEASE, "--node-name", name];
    args.extend_from_slice(flags);
    serve_on(dir, url.as_ref(), &args, env)
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
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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

/// Nodes a, b and c on the journal at `url`.
fn three_nodes(dir: &std::path::Path, url: &str) -> Vec<Running> {
    ["a", "b", "c"]
        .iter()
        .map(|name| node(dir, url, name))
        .collect()
}

/// `spool runs show RUN --json`: the run's log, a line per event.
fn log_of(url: &str, run: &str) -> String {
    let shown = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "show", run, "--json", "--journal", url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&shown.stdout).into_owned()
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
    let nodes = three_nodes(dir.path(), &url);
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

/// A reply's body, without the headers (their `Date` differs).
fn body_of(reply: &str) -> &str {
    reply.split("\r\n\r\n").nth(1).unwrap_or_default()
}

#[test]
fn every_node_answers_a_command_for_a_run_another_node_drives_as_that_node_does() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), &url);
    let (a, b, c) = (&nodes[0].addr, &nodes[1].addr, &nodes[2].addr);
    let run_at = |via: &str, text: &str| {
        let body = serde_json::json!({ "text": text, "address": "desk" }).to_string();
        let (status, reply) = post(via, "/spool/v1/runs", &body, None);
        assert_eq!(status, 200, "{reply}");
        serde_json::from_str::<serde_json::Value>(body_of(&reply)).unwrap()
    };
    let started = run_at(a, "one");
    let run = started["run_id"].as_str().unwrap().to_owned();
    // A message through B to the run's id and another through C to its
    // address: each is a turn A drives and answers, and the client gets
    // A's reply.
    let (status, reply) = post(
        b,
        &format!("/spool/v1/runs/{run}"),
        &serde_json::json!({ "text": "two" }).to_string(),
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
    assert_eq!(reply["response"], "echo: two", "{reply}");
    assert_eq!(reply["run_id"], run.as_str());
    let reply = run_at(c, "three");
    assert_eq!(reply["response"], "echo: three", "{reply}");
    assert_eq!(reply["run_id"], run.as_str());
    // The same command to A and through C: the same answer.
    let cancel = format!("/spool/v1/runs/{run}/cancel");
    let (direct_status, direct) = post(a, &cancel, "{}", None);
    let (status, forwarded) = post(c, &cancel, "{}", None);
    assert_eq!(
        (status, body_of(&forwarded)),
        (direct_status, body_of(&direct))
    );
    // Reads are every node's own, from the shared journal: the same view.
    let views: Vec<serde_json::Value> = [a, b, c]
        .iter()
        .map(|node| crate::bus::get_json(node, &format!("/spool/v1/runs/{run}")))
        .collect();
    assert_eq!(views[0]["response"], "echo: three", "{}", views[0]);
    assert_eq!(views[1], views[0]);
    assert_eq!(views[2], views[0]);
    // The log holds three turns, every one A's.
    let log = log_of(&url, &run);
    assert_eq!(log.matches("\"turn_completed\"").count(), 3, "{log}");
    for running in nodes {
        assert!(terminate(running).success());
    }
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
    let log = log_of(&url, &run);
    assert_eq!(log.matches("\"turn_completed\"").count(), 1, "{log}");
    assert_eq!(writes_in(&writes), 1, "the write ran once");
    // And a command for the run sent to A is B's to answer now: A sends
    // it on, and B records the turn (whose model, scripted for one turn,
    // has nothing more to say).
    let (status, reply) = post(
        &a.addr,
        &format!("/spool/v1/runs/{run}"),
        r#"{"text": "more"}"#,
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let log = log_of(&url, &run);
    assert_eq!(log.matches("\"input\":\"more\"").count(), 1, "{log}");
    assert!(terminate(a).success());
    assert!(terminate(b).success());
}

#[test]
fn a_schedule_on_three_nodes_fires_each_occurrence_once_and_goes_on_after_its_node_dies() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[[schedule]]\nname = \"tick\"\ncron = \"* * * * * *\"\ntext = \"tick\"\naddress = \"ticker\"\n",
    )
    .unwrap();
    // A starts first: it makes the schedule's record run, and so fires it.
    let a = node(dir.path(), &url, "a");
    let (status, reply) = post(&a.addr, "/spool/v1/addresses/ticker", "", None);
    assert_eq!(status, 200, "{reply}");
    let ensured: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let b = node(dir.path(), &url, "b");
    let c = node(dir.path(), &url, "c");
    let lines = stream_lines(&b.addr, &format!("/spool/v1/runs/{run}/stream"));
    let answered = |n: usize| {
        for _ in 0..n {
            response(&lines, Duration::from_secs(30));
        }
    };
    answered(2);
    let Running { mut child, .. } = a;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // B or C takes the schedule over within the lease time, and it goes
    // on firing every second.
    answered(3);
    assert!(terminate(b).success());
    assert!(terminate(c).success());
    let log = log_of(&url, &run);
    let mut firings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("\"turn_started\""))
        .filter_map(|line| line.split("(firing ").nth(1)?.split(')').next())
        .collect();
    let delivered = firings.len();
    assert!(delivered >= 5, "{log}");
    firings.sort_unstable();
    firings.dedup();
    assert_eq!(
        firings.len(),
        delivered,
        "an occurrence delivered twice: {log}"
    );
}

#[test]
fn a_schedule_firing_for_an_address_another_node_drives_is_delivered_by_that_node() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[[schedule]]\nname = \"report\"\ncron = \"0 0 1 1 *\"\ntext = \"report\"\naddress = \"desk\"\n",
    )
    .unwrap();
    let tokens = dir.path().join("tokens");
    let issued = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["token", "new", "ops", "--trigger", "--token-file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(issued.status.success());
    let token = String::from_utf8(issued.stdout).unwrap().trim().to_owned();
    let with_tokens = |name: &str| {
        node_with(
            dir.path(),
            &url,
            name,
            &["--token-file", tokens.to_str().unwrap()],
            &[],
        )
    };
    // A starts first: it makes the schedule's record run, and so fires it.
    let a = with_tokens("a");
    let b = with_tokens("b");
    // The address's run is made through B: B drives it.
    let (status, reply) = post(&b.addr, "/spool/v1/addresses/desk", "", Some(&token));
    assert_eq!(status, 200, "{reply}");
    let ensured: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let lines = stream_lines_as(
        &b.addr,
        &format!("/spool/v1/runs/{run}/stream"),
        Some(&token),
    );
    // The trigger reaches A (forwarded by B), which records the firing and
    // hands its message to B.
    let (status, reply) = post(
        &b.addr,
        "/spool/v1/schedules/report/trigger",
        "{}",
        Some(&token),
    );
    assert_eq!(status, 202, "{reply}");
    let firing: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
    assert_eq!(firing["status"], "started", "{firing}");
    assert_eq!(firing["run_id"], run.as_str(), "{firing}");
    assert_eq!(response(&lines, Duration::from_secs(30)), "echo: report");
    // The route a node hands firings over through does not exist for a
    // client, however authenticated.
    let (status, reply) = post(
        &b.addr,
        "/spool/v1/schedules/report/deliver",
        "{}",
        Some(&token),
    );
    assert_eq!(status, 404, "{reply}");
    for running in [a, b] {
        assert!(terminate(running).success());
    }
}

/// A time by which something must have happened, however many unrelated
/// things happen meanwhile.
struct Deadline(std::time::Instant);

impl Deadline {
    fn in_secs(secs: u64) -> Self {
        Self(std::time::Instant::now() + Duration::from_secs(secs))
    }

    /// The time left: zero once past, so a wait then fails at once.
    fn left(&self) -> Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }
}

/// `POST /runs` on `addr`: the reply's status and JSON body, or why there
/// was no reply.
fn post_run(addr: &str, text: &str) -> Result<(String, serde_json::Value), String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let body = serde_json::json!({ "text": text }).to_string();
    write!(
        stream,
        "POST /spool/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .map_err(|e| e.to_string())?;
    let status = reply.split(' ').nth(1).unwrap_or_default().to_owned();
    let answer = serde_json::from_str(body_of(&reply))
        .unwrap_or_else(|_| serde_json::Value::String(reply.clone()));
    Ok((status, answer))
}

/// `POST /runs` on `addr`: the id of the one-turn run it completed, or
/// what answered instead (`STATUS code`, or why there was no answer).
fn try_run(addr: &str, text: &str) -> Result<String, String> {
    let (status, answer) = post_run(addr, text)?;
    match answer["run_id"].as_str() {
        Some(run) if status == "200" && answer["response"] == format!("echo: {text}") => {
            Ok(run.to_owned())
        }
        _ => Err(format!(
            "{status} {}",
            answer["code"]
                .as_str()
                .map_or_else(|| answer.to_string(), str::to_owned)
        )),
    }
}

/// What a node answered a one-turn run with while its database may be
/// away.
enum Outcome {
    /// Completed: the run's id.
    Completed(String),
    /// `202`: the turn was taken (its start is recorded) and waits for the
    /// journal; the run's id.
    Taken(String),
    /// Anything else, as `STATUS code`.
    Other(String),
}

fn run_outcome(addr: &str, text: &str) -> Outcome {
    let (status, answer) = match post_run(addr, text) {
        Ok(reply) => reply,
        Err(why) => return Outcome::Other(why),
    };
    match (status.as_str(), answer["run_id"].as_str()) {
        ("200", Some(run)) if answer["response"] == format!("echo: {text}") => {
            Outcome::Completed(run.to_owned())
        }
        ("202", Some(run)) if answer["state"] == "running" => Outcome::Taken(run.to_owned()),
        _ => Outcome::Other(format!(
            "{status} {}",
            answer["code"]
                .as_str()
                .map_or_else(|| answer.to_string(), str::to_owned)
        )),
    }
}

#[test]
#[ignore = "stops the server: `cargo xtask ci` runs it on a server of its own"]
fn three_nodes_serve_on_after_the_database_is_away_past_their_leases_and_lose_no_answered_run() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some(url) = crate::postgres::database() else {
        return;
    };
    let command = |name: &str| {
        let command = std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} names a command for the test server (cargo xtask ci sets it)")
        });
        let status = Command::new("sh").args(["-c", &command]).status().unwrap();
        assert!(status.success(), "{name}: {status}");
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), &url);
    // One client per node, each running one-turn runs one after another
    // and telling the test what answered each.
    let stop = Arc::new(AtomicBool::new(false));
    let (told, outcomes) = std::sync::mpsc::channel::<(usize, Outcome)>();
    let clients: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(client, node)| {
            let addr = node.addr.clone();
            let stop = Arc::clone(&stop);
            let told = told.clone();
            std::thread::spawn(move || {
                for n in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let _ = told.send((client, run_outcome(&addr, &format!("hello {client}-{n}"))));
                }
            })
        })
        .collect();
    drop(told);
    let mut answered: Vec<String> = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    let mut refused = 0;
    let mut take = |outcome: Outcome| match outcome {
        Outcome::Completed(run) => {
            answered.push(run);
            true
        }
        // The database went away between the turn's start and its end:
        // the run was acknowledged, and must not be lost either.
        Outcome::Taken(run) => {
            taken.push(run);
            false
        }
        // While the database is away a node refuses at once, with the
        // code a client retries on, and records nothing.
        Outcome::Other(refusal) => {
            assert_eq!(refusal, "503 journal_unavailable");
            refused += 1;
            false
        }
    };
    // Waits until every client has had `n` more runs answered, within a
    // minute however many are refused meanwhile.
    let mut answered_by_each = |n: usize| {
        let deadline = Deadline::in_secs(60);
        let mut counts = [0_usize; 3];
        while counts.iter().any(|&c| c < n) {
            let (client, outcome) = outcomes
                .recv_timeout(deadline.left())
                .expect("every node answers runs within a minute");
            if take(outcome) {
                counts[client] += 1;
            }
        }
    };
    answered_by_each(5);
    command("JOURNAL_PG_STOP");
    // Away past every node's lease: each has failed to renew four times,
    // once every third of the lease.
    for node in &nodes {
        let deadline = Deadline::in_secs(30);
        let mut failed = 0;
        while failed < 4 {
            let line = node
                .said
                .recv_timeout(deadline.left())
                .expect("a node tries to renew its lease every third of the lease time");
            failed += usize::from(line.contains("renewing this node's lease"));
        }
    }
    command("JOURNAL_PG_START");
    // Every node reconnects, finds its lease lapsed, joins again, and
    // serves again: each answers ten more.
    answered_by_each(10);
    for node in &nodes {
        let deadline = Deadline::in_secs(30);
        while !node
            .said
            .recv_timeout(deadline.left())
            .expect("a node says it joined again")
            .contains("this node's lease lapsed")
        {}
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    for (_, outcome) in outcomes.try_iter() {
        take(outcome);
    }
    assert!(refused > 0, "runs were refused while the database was away");
    for running in nodes {
        assert!(
            terminate(running).success(),
            "a node stops cleanly after the restart"
        );
    }
    // No run a node answered as completed is lost, nor one it took.
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "list", "--json", "--journal", &url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    let completed: std::collections::HashSet<&str> = listed
        .lines()
        .filter(|line| line.contains("\"state\":\"completed\""))
        .filter_map(|line| line.split("\"run_id\":\"").nth(1)?.split('"').next())
        .collect();
    assert!(answered.len() >= 45, "{} runs answered", answered.len());
    for run in &answered {
        assert!(
            completed.contains(run.as_str()),
            "run {run} was answered but is not listed completed"
        );
    }
    for run in &taken {
        assert!(
            listed.contains(&format!("\"run_id\":\"{run}\"")),
            "run {run} was taken but is not listed"
        );
    }
}

#[test]
fn nodes_serving_tls_forward_a_message_for_a_run_another_node_drives_over_tls() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A certificate for 127.0.0.1 too: each node advertises
    // `https://127.0.0.1:PORT`, and the others check it against that.
    let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");
    let (cert, key) = (format!("{tls}/node.pem"), format!("{tls}/node.key"));
    let node_over_tls = |name: &str| {
        node_with(
            dir.path(),
            &url,
            name,
            &["--tls-cert", &cert, "--tls-key", &key],
            &[("SSL_CERT_FILE", &cert)],
        )
    };
    let (a, b) = (node_over_tls("a"), node_over_tls("b"));
    let say = |node: &Running, text: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(["run", "--url", &format!("https://{}", node.addr)])
            .args(["--address", "desk", text])
            .env("SSL_CERT_FILE", &cert)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(say(&a, "one"), "echo: one");
    // The run is A's: B can only answer by forwarding to A, over TLS.
    assert_eq!(say(&b, "two"), "echo: two");
    assert!(terminate(a).success());
    assert!(terminate(b).success());
}

/// `spool cluster nodes --json`: one object per member.
fn members(url: &str) -> Vec<serde_json::Value> {
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["cluster", "nodes", "--json", "--journal", url])
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn cluster_nodes_lists_each_live_node_with_its_runs_and_a_stopped_nodes_runs_under_the_taker() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    for text in ["one", "two", "three"] {
        try_run(&a.addr, text).unwrap();
    }
    let listed = members(&url);
    assert_eq!(listed.len(), 2, "{listed:?}");
    let (first, second) = (&listed[0], &listed[1]);
    assert_eq!(
        (&first["name"], &first["alive"]),
        (&"a".into(), &true.into())
    );
    assert_eq!(first["runs"], 3, "{first}");
    assert_eq!(first["address"], format!("http://{}", a.addr));
    assert_eq!((&second["name"], &second["runs"]), (&"b".into(), &0.into()));
    assert!(second["lease_left_ms"].as_i64().unwrap() > 0, "{second}");
    // A leaves; B takes its runs over at its next look and says so.
    assert!(terminate(a).success());
    loop {
        let line = b
            .said
            .recv_timeout(Duration::from_secs(30))
            .expect("the remaining node takes the runs over");
        if line.contains("took over 3 runs") {
            break;
        }
    }
    let listed = members(&url);
    assert_eq!(listed.len(), 1, "the stopped node is gone: {listed:?}");
    assert_eq!(
        (&listed[0]["name"], &listed[0]["runs"]),
        (&"b".into(), &3.into())
    );
    assert!(terminate(b).success());
}

#[test]
fn a_node_whose_first_takeover_outlasts_its_lease_keeps_the_lease_meanwhile_and_then_serves() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), &url, "a");
    let before = try_run(&a.addr, "before").unwrap();
    // A leaves: the next node to look takes its run over.
    assert!(terminate(a).success());
    // The test holds every lease row, so B's first takeover waits for it
    // as long as a takeover of many runs would take.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("BEGIN; SELECT 1 FROM spool_leases FOR UPDATE")
            .await
            .unwrap();
        client
    });
    let starting = std::thread::spawn({
        let (dir, url) = (dir.path().to_owned(), url.clone());
        move || node(&dir, &url, "b")
    });
    // B stays alive past one and a half leases (2 s) while its takeover
    // waits: its lease is renewed meanwhile.
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let held = client
                    .query_opt(
                        "SELECT 1 FROM spool_nodes WHERE name = 'b'
                         AND expires_at > clock_timestamp()
                         AND clock_timestamp() - joined_at > interval '3 seconds'",
                        &[],
                    )
                    .await
                    .unwrap();
                if held.is_some() {
                    return;
                }
            }
        })
        .await
        .expect("the node waiting on its takeover keeps its lease past the lease time");
        client.batch_execute("COMMIT").await.unwrap();
    });
    let b = starting.join().unwrap();
    // A's run is B's now, under the same number B joined with.
    let listed = members(&url);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (&listed[0]["name"], &listed[0]["runs"]),
        (&"b".into(), &1.into()),
        "{listed:?}"
    );
    try_run(&b.addr, "after").unwrap();
    assert!(log_of(&url, &before).contains("echo: before"));
    assert!(terminate(b).success());
}

/// `DELETE path` on `addr`: the status and the reply's body.
fn delete(addr: &str, path: &str) -> (u16, serde_json::Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "DELETE {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body_of(&reply)).unwrap())
}

#[test]
fn a_run_deleted_through_any_node_is_gone_from_every_node_and_the_others_stay() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), &url);
    let (a, b, c) = (&nodes[0].addr, &nodes[1].addr, &nodes[2].addr);
    // Six runs, all driven by A, which made them.
    let runs: Vec<String> = (0..6)
        .map(|i| {
            let body = serde_json::json!({ "text": format!("run {i}") }).to_string();
            let (status, reply) = post(a, "/spool/v1/runs", &body, None);
            assert_eq!(status, 200, "{reply}");
            serde_json::from_str::<serde_json::Value>(body_of(&reply)).unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // On A itself, through B (forwarded to A), and with the command line
    // through C.
    let (status, gone) = delete(a, &format!("/spool/v1/runs/{}", runs[0]));
    assert_eq!(status, 200, "{gone}");
    let (status, gone) = delete(b, &format!("/spool/v1/runs/{}", runs[1]));
    assert_eq!(
        (status, gone["run_id"].as_str()),
        (200, Some(runs[1].as_str())),
        "{gone}"
    );
    let deleted = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "delete", &runs[2], "--url", &format!("http://{c}")])
        .output()
        .unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert!(String::from_utf8_lossy(&deleted.stdout).contains(&format!("{}  deleted", runs[2])));
    for node in [a, b, c] {
        for run in &runs[..3] {
            let view = crate::bus::get_json(node, &format!("/spool/v1/runs/{run}"));
            assert_eq!(view["code"], "run_deleted", "{node}: {view}");
        }
        for run in &runs[3..] {
            let view = crate::bus::get_json(node, &format!("/spool/v1/runs/{run}"));
            assert_eq!(view["state"], "completed", "{node}: {view}");
        }
    }
    // A new turn on a kept run still goes through A, whoever is asked.
    let (status, reply) = post(
        c,
        &format!("/spool/v1/runs/{}", runs[3]),
        &serde_json::json!({ "text": "again" }).to_string(),
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "list", "--json", "--journal", &url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for run in &runs[..3] {
        assert!(!listed.contains(run.as_str()), "{listed}");
    }
    for run in &runs[3..] {
        assert!(listed.contains(run.as_str()), "{listed}");
    }
    for running in nodes {
        assert!(terminate(running).success());
    }
}

#[test]
fn one_node_sweeps_retention_for_the_cluster_and_deletes_runs_another_node_drives() {
    let Some(url) = crate::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nengine = \"echo\"\n\n[retention]\ncompleted = \"1s\"\n",
    )
    .unwrap();
    // A joins first: the live node with the lowest number sweeps.
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    let runs: Vec<String> = (0..3)
        .map(|i| {
            let body = serde_json::json!({ "text": format!("run {i}") }).to_string();
            let (status, reply) = post(&b.addr, "/spool/v1/runs", &body, None);
            assert_eq!(status, 200, "{reply}");
            let run: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
            assert_eq!(run["state"], "completed", "{run}");
            run["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    // Waited on A's own report of the deletion: B made and drives the
    // runs, A deletes them.
    let mut deleted = 0;
    while deleted < runs.len() {
        let line = a
            .said
            .recv_timeout(Duration::from_secs(30))
            .expect("node A reports its sweep within 30 s");
        if line.contains("runs past their retention deleted") {
            let count = line
                .split("deleted=")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("a count in {line}"));
            deleted += count;
        }
    }
    assert_eq!(deleted, runs.len());
    for node in [&a.addr, &b.addr] {
        for run in &runs {
            let view = crate::bus::get_json(node, &format!("/spool/v1/runs/{run}"));
            assert_eq!(view["code"], "run_deleted", "{node}: {view}");
        }
    }
    let swept_on_b: Vec<String> = b
        .said
        .try_iter()
        .filter(|line| line.contains("runs past their retention deleted"))
        .collect();
    assert!(swept_on_b.is_empty(), "only A sweeps: {swept_on_b:?}");
    for node in [a, b] {
        assert!(terminate(node).success());
    }
}
