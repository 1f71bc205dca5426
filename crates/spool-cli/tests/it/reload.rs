//! `spool serve` reloading its agent definition: an administrator's
//! `POST /spool/v1/agent/reload` and `SIGHUP`, with runs in flight on two
//! definitions through a SIGKILL and a restart; a definition that does not
//! parse is refused and the old one stays.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::serve::{Running, post, serve, terminate};

/// A definition on its own script: the first call asks the person, the
/// second says which version answered.
fn write_version(dir: &std::path::Path, version: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("{version}.jsonl")),
        format!(
            "{{\"tool_calls\": [{{\"id\": \"c1\", \"name\": \"ask_human\", \"arguments\": {{\"prompt\": \"which?\"}}}}]}}\n{{\"text\": \"{version} answered\"}}\n{{\"text\": \"{version} again\"}}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("spool.toml"),
        format!("[agent]\nengine = \"scripted:{version}.jsonl\"\n{extra}"),
    )
    .unwrap();
}

fn body(reply: &str) -> Value {
    let (_, body) = reply.split_once("\r\n\r\n").expect("a reply has a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn get(addr: &str, path: &str, token: &str) -> Value {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    body(&reply)
}

/// Starts a run and returns its id once it waits for its answer.
fn parked_run(addr: &str, token: &str) -> String {
    let (status, reply) = post(addr, "/spool/v1/runs", r#"{"text": "go"}"#, Some(token));
    assert_eq!(status, 200, "{reply}");
    let run = body(&reply);
    assert_eq!(run["state"], "waiting", "{run}");
    run["run_id"].as_str().unwrap().to_owned()
}

fn answer(addr: &str, run: &str, token: &str) -> Value {
    let (status, reply) = post(
        addr,
        &format!("/spool/v1/runs/{run}/respond"),
        r#"{"responses": [{"text": "this one"}]}"#,
        Some(token),
    );
    assert_eq!(status, 200, "{reply}");
    body(&reply)
}

fn token(dir: &std::path::Path, name: &str, admin: bool) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spool"));
    command
        .args(["token", "new", name, "--token-file"])
        .arg(dir.join("tokens"));
    if admin {
        command.arg("--admin");
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// Waits for the server to say a line containing `needle`.
pub(crate) fn said(running: &Running, needle: &str) -> String {
    loop {
        let line = running
            .said
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the server did not say `{needle}` in time"));
        if line.contains(needle) {
            return line;
        }
    }
}

#[test]
fn a_reload_with_runs_in_flight_on_two_definitions_survives_a_kill_and_each_run_resumes_on_its_own()
{
    let dir = tempfile::tempdir().unwrap();
    write_version(dir.path(), "one", "");
    let admin = token(dir.path(), "ops", true);
    let user = token(dir.path(), "user", false);
    let flags = ["--token-file", "tokens"];
    let running = serve(dir.path(), &flags);
    let addr = running.addr.clone();

    let on_one = parked_run(&addr, &user);
    let (status, reply) = post(
        &addr,
        "/spool/v1/runs",
        r#"{"text": "go", "upgrade": "sometimes"}"#,
        Some(&user),
    );
    assert_eq!(status, 400, "an upgrade policy it does not know: {reply}");
    assert_eq!(body(&reply)["code"], "bad_request");

    // A definition that does not parse is refused; the old one stays.
    std::fs::write(dir.path().join("spool.toml"), "[agent]\nengin = \"echo\"\n").unwrap();
    let (status, reply) = post(&addr, "/spool/v1/agent/reload", "", Some(&admin));
    assert_eq!(status, 422, "{reply}");
    assert_eq!(body(&reply)["code"], "agent_invalid");
    assert!(
        body(&reply)["error"].as_str().unwrap().contains("engin"),
        "{reply}"
    );

    // Only an administrator reloads.
    write_version(dir.path(), "two", "");
    let (status, reply) = post(&addr, "/spool/v1/agent/reload", "", Some(&user));
    assert_eq!(status, 403, "{reply}");
    assert_eq!(body(&reply)["code"], "forbidden");

    let (status, reply) = post(&addr, "/spool/v1/agent/reload", "", Some(&admin));
    assert_eq!(status, 200, "{reply}");
    let reloaded = body(&reply);
    assert_eq!(reloaded["changed"], true);
    let (one, two) = (
        reloaded["previous"].as_str().unwrap().to_owned(),
        reloaded["agent"].as_str().unwrap().to_owned(),
    );
    assert_ne!(one, two);
    assert_eq!(
        reloaded["in_memory"],
        json!([two, one]),
        "the run parked on the first definition holds it"
    );
    // The same file again changes nothing; `spool agent reload` says so,
    // and refuses a caller who is not an administrator.
    let reload = |token: &str| {
        Command::new(env!("CARGO_BIN_EXE_spool"))
            .args([
                "agent",
                "reload",
                "--url",
                &format!("http://{addr}"),
                "--token",
                token,
            ])
            .output()
            .unwrap()
    };
    let same = reload(&admin);
    assert!(same.status.success(), "{same:?}");
    let printed = String::from_utf8(same.stdout).unwrap();
    assert!(printed.contains(&format!("agent     {two}")), "{printed}");
    assert!(printed.contains("previous  (unchanged)"), "{printed}");
    assert!(printed.contains(&format!("held      {one}")), "{printed}");
    let refused = reload(&user);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("administrator"),
        "{refused:?}"
    );

    let on_two = parked_run(&addr, &user);
    let summary =
        |addr: &str, run: &str| get(addr, &format!("/spool/v1/runs/{run}/summary"), &admin);
    assert_eq!(summary(&addr, &on_one)["agent"], one.as_str());
    assert_eq!(summary(&addr, &on_two)["agent"], two.as_str());

    // Killed with both runs parked, and started again on the second.
    let Running { mut child, .. } = running;
    child.kill().unwrap();
    child.wait().unwrap();
    let running = serve(dir.path(), &flags);
    let addr = running.addr.clone();
    let done = answer(&addr, &on_one, &user);
    assert_eq!(
        done["response"], "one answered",
        "the run resumed on the definition it started with: {done}"
    );
    let done = answer(&addr, &on_two, &user);
    assert_eq!(done["response"], "two answered", "{done}");

    // SIGHUP loads a third, which moves runs at their next turn.
    write_version(
        dir.path(),
        "three",
        "upgrade = \"next_turn\"\n\n[retention]\ncompleted = \"30d\"\n",
    );
    let pid = running.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    said(&running, "SIGHUP: new runs start on agent");
    // A section the server reads at its start only is named, not applied.
    said(
        &running,
        "SIGHUP: [retention] changed and takes effect at the next start",
    );
    let (status, reply) = post(
        &addr,
        &format!("/spool/v1/runs/{on_one}"),
        r#"{"text": "and now?"}"#,
        Some(&user),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        body(&reply)["response"],
        "three again",
        "the run moved to the newest definition at its next turn"
    );
    let three = summary(&addr, &on_one)["agent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(three != one && three != two, "{three}");
    assert!(terminate(running).success());
    // `spool runs list` shows the definition each run runs on now.
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["runs", "list", "--json", "--journal", "journal"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let agents: Vec<(String, String)> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|row| {
            (
                row["run_id"].as_str().unwrap().to_owned(),
                row["agent"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(agents.contains(&(on_one.clone(), three)), "{agents:?}");
    assert!(agents.contains(&(on_two.clone(), two)), "{agents:?}");
}
