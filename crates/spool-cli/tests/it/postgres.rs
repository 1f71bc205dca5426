//! The `spool` binary on a PostgreSQL journal (`--journal postgres://…`):
//! serving, reading, refusing a second owner, and `spool journal copy`
//! between SQLite and PostgreSQL. The server is `JOURNAL_PG_URL`'s (`cargo
//! xtask ci` starts one); each test makes a database of its own.

use std::process::{Command, Output};

use crate::server::{serve_on, terminate};

/// A fresh database's URL on the test server, or `None` (said) to skip.
pub(crate) fn database() -> Option<String> {
    let Ok(server) = std::env::var("JOURNAL_PG_URL") else {
        assert!(
            std::env::var_os("SPOOL_REQUIRE_PG").is_none(),
            "SPOOL_REQUIRE_PG is set but JOURNAL_PG_URL is not"
        );
        #[allow(clippy::print_stderr, reason = "a skipped test says why")]
        {
            eprintln!("skipped: JOURNAL_PG_URL is not set");
        }
        return None;
    };
    let name = format!("spool_{:016x}", fastrand::u64(..));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    });
    let (base, _) = server.rsplit_once('/').unwrap();
    Some(format!("{base}/{name}"))
}

fn spool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .env_remove("SPOOL_JOURNAL")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn serve_on_a_postgres_url_completes_runs_that_runs_list_then_reads_there() {
    let Some(url) = database() else { return };
    let dir = tempfile::tempdir().unwrap();
    let running = serve_on(dir.path(), url.as_ref(), &[], &[]);
    for n in 0..3 {
        let answer = crate::bus::run_to_end(&running.addr, &format!("hello {n}"));
        assert_eq!(answer["response"], format!("echo: hello {n}"), "{answer}");
    }
    assert!(terminate(running).success());
    let listed = spool(&["runs", "list", "--json", "--journal", &url]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let runs: Vec<serde_json::Value> = text(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(
        runs.iter().all(|run| run["state"] == "completed"),
        "{runs:?}"
    );
    // Nothing was written beside the server: the database is the journal.
    assert!(!dir.path().join("postgres:").exists());
}

#[test]
fn a_server_on_postgres_says_whether_its_connection_to_the_database_is_encrypted() {
    let Some(url) = database() else { return };
    let dir = tempfile::tempdir().unwrap();
    let said = |url: &str| {
        let running = serve_on(dir.path(), url.as_ref(), &[], &[]);
        let notes = running.notes.join("\n");
        assert!(terminate(running).success());
        notes
    };
    // `cargo xtask pg` and `ci` start a server offering TLS (its root in
    // JOURNAL_PG_CA), which a URL without `sslmode` then uses.
    if std::env::var_os("JOURNAL_PG_CA").is_some() {
        let notes = said(&url);
        assert!(notes.contains("over TLS"), "{notes}");
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    let notes = said(&format!("{url}{separator}sslmode=disable"));
    assert!(notes.contains("not encrypted"), "{notes}");
}

#[test]
fn a_second_server_on_the_same_postgres_journal_is_refused_with_the_first_ones_pid() {
    let Some(url) = database() else { return };
    let dir = tempfile::tempdir().unwrap();
    let first = serve_on(dir.path(), url.as_ref(), &[], &[]);
    let second = spool(&["serve", "--addr", "127.0.0.1:0", "--journal", &url]);
    assert!(!second.status.success());
    let said = text(&second.stderr);
    assert!(
        said.contains("is in use by another process")
            && said.contains(&format!("(pid {})", first.child.id())),
        "{said}"
    );
    // The server trusts any password: one is given so the message can be
    // seen not to show it.
    let with_password = url.replacen("postgres@", "postgres:hunter2@", 1);
    let third = spool(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--journal",
        &with_password,
    ]);
    let said = text(&third.stderr);
    assert!(
        said.contains("postgres:***@") && !said.contains("hunter2"),
        "{said}"
    );
    assert!(terminate(first).success());
}

#[test]
fn an_unknown_journal_scheme_is_refused_by_name_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["runs", "list", "--journal", "mysql://db/x"][..],
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--journal",
            "mysql://db/x",
        ][..],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("SPOOL_JOURNAL")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "a usage error");
        let said = text(&output.stderr);
        assert!(said.contains("unknown journal scheme `mysql://`"), "{said}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn journal_copy_moves_runs_to_postgres_and_back_with_identical_logs() {
    let Some(url) = database() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("journal");
    crate::runs::journal_with_one_run(&sqlite);
    // And runs as the echo agent leaves them, over several appends.
    for n in 0..2 {
        let output = Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(["run", &format!("hi {n}"), "--journal"])
            .arg(&sqlite)
            .current_dir(dir.path())
            .env_remove("SPOOL_JOURNAL")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    let back = dir.path().join("back");
    let sqlite = sqlite.to_str().unwrap();
    let back = back.to_str().unwrap();
    for (from, to) in [(sqlite, url.as_str()), (url.as_str(), back)] {
        let copied = spool(&["journal", "copy", from, to]);
        assert!(copied.status.success(), "{}", text(&copied.stderr));
        assert!(
            text(&copied.stdout).starts_with("copied 3 runs"),
            "{}",
            text(&copied.stdout)
        );
    }
    // Every run reads the same, event for event, in all three.
    let list =
        |journal: &str| text(&spool(&["runs", "list", "--json", "--journal", journal]).stdout);
    assert_eq!(list(&url), list(sqlite));
    assert_eq!(list(back), list(sqlite));
    let ids: Vec<String> = list(sqlite)
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 3);
    for id in &ids {
        let show = |journal: &str| {
            let shown = spool(&["runs", "show", id, "--json", "--journal", journal]);
            assert!(shown.status.success(), "{}", text(&shown.stderr));
            text(&shown.stdout)
        };
        assert_eq!(show(&url), show(sqlite), "run {id} in PostgreSQL");
        assert_eq!(show(back), show(sqlite), "run {id} back in SQLite");
    }
    // A journal that holds runs is not copied into.
    let again = spool(&["journal", "copy", sqlite, &url]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("already holds 3 runs"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn cluster_mode_on_a_directory_journal_is_refused_and_its_flags_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let journal = journal.to_str().unwrap();
    let on_dir = spool(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--journal",
        journal,
        "--cluster",
    ]);
    assert!(!on_dir.status.success());
    assert!(
        text(&on_dir.stderr).contains("--cluster needs a PostgreSQL journal"),
        "{}",
        text(&on_dir.stderr)
    );
    let lone = spool(&["serve", "--journal", journal, "--node-name", "a"]);
    assert_eq!(lone.status.code(), Some(2), "a usage error");
    assert!(
        text(&lone.stderr).contains("--cluster"),
        "{}",
        text(&lone.stderr)
    );
}

#[test]
fn cluster_nodes_on_a_directory_journal_is_refused_naming_the_kind_of_journal_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let listed = spool(&["cluster", "nodes", "--journal", journal.to_str().unwrap()]);
    assert!(!listed.status.success());
    assert!(
        text(&listed.stderr).contains("a cluster's journal is a postgres:// URL"),
        "{}",
        text(&listed.stderr)
    );
}

#[test]
fn a_cluster_node_on_every_interface_needs_an_address_the_others_can_reach() {
    let Some(url) = database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let issued = spool(&[
        "token",
        "new",
        "ops",
        "--token-file",
        tokens.to_str().unwrap(),
    ]);
    assert!(issued.status.success(), "{}", text(&issued.stderr));
    let refused = spool(&[
        "serve",
        "--addr",
        "0.0.0.0:0",
        "--token-file",
        tokens.to_str().unwrap(),
        "--journal",
        &url,
        "--cluster",
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("pass --advertise http://THIS-HOST:"),
        "{}",
        text(&refused.stderr)
    );
    let bad = spool(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--journal",
        &url,
        "--cluster",
        "--advertise",
        "ftp://x",
    ]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--advertise `ftp://x`"),
        "{}",
        text(&bad.stderr)
    );
}

/// `spool serve` with `[retention] completed = "2s"` on `journal`: a run
/// that completed is deleted by the server's sweeper once two seconds
/// have passed, and answers 410 from then on, while a run kept waiting
/// is never swept.
fn serve_sweeps_a_completed_run_past_its_retention(dir: &std::path::Path, journal: &str) {
    std::fs::write(
        dir.join("spool.toml"),
        "[agent]\nengine = \"scripted:script.jsonl\"\n\n[retention]\ncompleted = \"2s\"\ncancelled = \"2s\"\n",
    )
    .unwrap();
    std::fs::write(dir.join("script.jsonl"), "{\"text\": \"done\"}\n").unwrap();
    let running = serve_on(dir, journal.as_ref(), &[], &[]);
    assert!(
        running.notes.iter().any(|note| note.contains("retention:")),
        "the server says it sweeps: {:?}",
        running.notes
    );
    let done = crate::bus::run_to_end(&running.addr, "finish");
    assert_eq!(done["state"], "completed", "{done}");
    let run = done["run_id"].as_str().unwrap().to_owned();
    let (status, ensured) = crate::serve::post(&running.addr, "/spool/v1/addresses/kept", "", None);
    assert_eq!(status, 200, "{ensured}");
    // The run's stream stays open while the run lives and ends when it is
    // deleted: read to its end (the connection closes with it).
    {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&running.addr).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        write!(
            stream,
            "GET /spool/v1/runs/{run}/stream HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut seen = Vec::new();
        stream
            .read_to_end(&mut seen)
            .expect("the run's stream ends within 30 s, when the sweeper deletes it");
    }
    let view = crate::bus::get_json(&running.addr, &format!("/spool/v1/runs/{run}"));
    assert_eq!(view["code"], "run_deleted", "{view}");
    let kept = crate::bus::get_json(&running.addr, "/spool/v1/addresses/kept");
    let kept = crate::bus::get_json(
        &running.addr,
        &format!("/spool/v1/runs/{}", kept["run_id"].as_str().unwrap()),
    );
    assert_eq!(
        kept["state"], "pending",
        "a run that never ended is kept: {kept}"
    );
    assert!(terminate(running).success());
}

#[test]
fn serve_sweeps_runs_past_their_retention_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    serve_sweeps_a_completed_run_past_its_retention(dir.path(), journal.to_str().unwrap());
}

#[test]
fn serve_sweeps_runs_past_their_retention_on_postgres() {
    let Some(url) = database() else { return };
    let dir = tempfile::tempdir().unwrap();
    serve_sweeps_a_completed_run_past_its_retention(dir.path(), &url);
}
