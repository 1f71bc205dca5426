//! `spool agent check`.

use std::process::Command;

fn check(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["agent", "check"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn a_valid_definition_prints_its_engine_tools_and_budgets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nname = \"reviewer\"\nbuiltin_tools = [\"ask_human\"]\n\n[[tool]]\nname = \"deploy\"\ndescription = \"Deploy.\"\ncommand = [\"./deploy.sh\"]\neffect = \"write\"\n\n[budgets]\nsteps_per_turn = 5\n",
    )
    .unwrap();
    let output = check(&[], dir.path());
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    for line in [
        "agent    reviewer",
        "engine   echo",
        "tool     ask_human (read)",
        "tool     deploy (write)",
        "budget   steps_per_turn = 5",
    ] {
        assert!(stdout.contains(line), "missing `{line}` in:\n{stdout}");
    }
}

#[test]
fn a_definition_with_a_misspelt_key_fails_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        "[budgets]\nstep_per_turn = 5\n",
    )
    .unwrap();
    let output = check(&["agent.toml"], dir.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("step_per_turn"));
}

#[test]
fn without_a_definition_the_built_in_agent_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let output = check(&[], dir.path());
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("built-in agent") && stdout.contains("engine   echo"),
        "{stdout}"
    );
}
