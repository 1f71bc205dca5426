//! `spool serve --bus` and `spool bus talk`: one instance delegating to
//! another over loopback, both the real binary.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::server::{serve, terminate};

/// The bus address a server said it listens on.
fn bus_addr(notes: &[String]) -> String {
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
    let secret = dir.path().join("bus.secret");
    std::fs::write(&secret, "a-secret-for-the-test\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret_arg = secret.to_str().unwrap();
    let registry = dir.path().join("run").join("bus-registry.json");
    let registry_arg = registry.to_str().unwrap();
    let server = serve(
        dir.path(),
        &[
            "--instance",
            "worker",
            "--bus",
            "127.0.0.1:0",
            "--bus-peer",
            "reviewer",
            "--bus-secret-file",
            secret_arg,
            "--bus-registry",
            registry_arg,
        ],
    );
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
