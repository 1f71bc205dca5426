//! `spool agent check` and `spool agent diff`.

use std::process::Command;

fn spool(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .output()
        .unwrap()
}

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

#[test]
fn a_provider_engine_without_its_key_fails_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nengine = \"anthropic/claude-sonnet-4-5\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["agent", "check"])
        .current_dir(dir.path())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
}

#[test]
fn a_provider_engine_pointed_at_a_local_server_checks_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nengine = \"openai/smollm2\"\n\n[provider]\nbase_url = \"http://127.0.0.1:8080/v1\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["agent", "check"])
        .current_dir(dir.path())
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("engine   openai/smollm2"));
}

#[test]
fn a_bus_section_with_delegate_on_adds_the_delegate_tool_and_its_schema_is_published() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[bus]\ninstance = \"reviewer\"\npeers = [\"worker\"]\ndelegate = true\n",
    )
    .unwrap();
    let output = check(&[], dir.path());
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    for line in [
        "tool     delegate (idempotent)",
        "bus      reviewer (listen off; peers worker; max depth 3)",
    ] {
        assert!(stdout.contains(line), "missing `{line}` in:\n{stdout}");
    }
    // A misspelt key in [bus] fails, naming it.
    std::fs::write(
        dir.path().join("spool.toml"),
        "[bus]\ninstance = \"reviewer\"\ndelegates = true\n",
    )
    .unwrap();
    let output = check(&[], dir.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("delegates"),
        "{output:?}"
    );
    let schema = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["agent", "schema"])
        .output()
        .unwrap();
    let schema: serde_json::Value = serde_json::from_slice(&schema.stdout).unwrap();
    let bus = &schema["properties"]["bus"]["properties"];
    for key in [
        "instance",
        "listen",
        "peers",
        "max_depth",
        "budget_usd",
        "delegate",
    ] {
        assert!(
            bus.get(key).is_some(),
            "[bus] has `{key}` in the schema: {bus}"
        );
    }
}

#[test]
fn an_mcp_table_is_read_by_agent_check_which_fails_on_a_server_that_does_not_start_and_its_schema_is_published()
 {
    let dir = tempfile::tempdir().unwrap();
    // A misspelt key fails, naming it.
    std::fs::write(
        dir.path().join("spool.toml"),
        "[[mcp]]\nname = \"notes\"\ncomand = [\"notes-server\"]\n",
    )
    .unwrap();
    let output = check(&[], dir.path());
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("comand"),
        "{output:?}"
    );
    // A server whose program is not there fails the check, named.
    std::fs::write(
        dir.path().join("spool.toml"),
        "[[mcp]]\nname = \"notes\"\ncommand = [\"./no-such-mcp-server\"]\n",
    )
    .unwrap();
    let output = check(&[], dir.path());
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("mcp      notes: MCP server `notes` is not available"),
        "{stdout}"
    );
    let schema = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["agent", "schema"])
        .output()
        .unwrap();
    let schema: serde_json::Value = serde_json::from_slice(&schema.stdout).unwrap();
    let mcp = &schema["properties"]["mcp"]["items"]["properties"];
    for key in [
        "name",
        "command",
        "url",
        "token_file",
        "tools",
        "approval",
        "effect",
    ] {
        assert!(
            mcp.get(key).is_some(),
            "[[mcp]] has `{key}` in the schema: {mcp}"
        );
    }
}

#[test]
fn agent_diff_says_what_changed_between_a_kept_digest_and_a_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.toml");
    let after = dir.path().join("after.toml");
    std::fs::write(&before, "[agent]\nsystem_prompt = \"Be brief.\"\n").unwrap();
    std::fs::write(
        &after,
        "[agent]\nsystem_prompt = \"Be thorough.\"\n\n[budgets]\ntokens = 20000\n",
    )
    .unwrap();
    let checked = spool(&["agent", "check", before.to_str().unwrap()]);
    let stdout = String::from_utf8(checked.stdout).unwrap();
    let digest = stdout
        .lines()
        .find_map(|line| line.strip_prefix("digest   "))
        .unwrap_or_else(|| panic!("check prints the digest: {stdout}"))
        .to_owned();
    // The journal keeps the definition a run started with.
    let journal = dir.path().join("journal");
    let document: serde_json::Value = serde_json::json!({"agent": {"system_prompt": "Be brief."}});
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let store = spool_journal::store::sqlite::SqliteJournal::open(
                &journal,
                spool_journal::store::sqlite::Options::default(),
            )
            .unwrap();
            spool_journal::Journal::keep_definition(&store, &digest, &document)
                .await
                .unwrap();
        });
    let journal = journal.to_str().unwrap();
    let diff = spool(&[
        "agent",
        "diff",
        &digest,
        after.to_str().unwrap(),
        "--journal",
        journal,
    ]);
    assert_eq!(
        diff.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    assert_eq!(
        String::from_utf8(diff.stdout).unwrap(),
        "~ agent.system_prompt: \"Be brief.\" -> \"Be thorough.\"\n+ budgets = {\"tokens\":20000}\n"
    );
    let same = spool(&[
        "agent",
        "diff",
        &digest,
        before.to_str().unwrap(),
        "--journal",
        journal,
    ]);
    assert_eq!(same.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&same.stdout), "");
    let unknown = spool(&[
        "agent",
        "diff",
        &format!("sha256:{}", "0".repeat(64)),
        before.to_str().unwrap(),
        "--journal",
        journal,
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("keeps no agent definition"));
}
