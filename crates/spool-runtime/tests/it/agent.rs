//! The agent definition and command tools.

use std::sync::Arc;

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, Seq};
use spool_runtime::agent::{AgentDefinition, AgentError, CommandToolDefinition};
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::tools::command::CommandTool;
use spool_runtime::{Runtime, Tool, ToolOutcome};
use tokio_util::sync::CancellationToken;

use crate::support::*;

fn shell(name: &str, script: &str, effect: Effect) -> CommandToolDefinition {
    CommandToolDefinition {
        name: name.into(),
        description: "a test tool".into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        effect,
        timeout_seconds: 10.0,
        input_schema: json!({"type": "object"}),
        attempts: 1,
        idempotency_key: None,
    }
}

async fn call(definition: CommandToolDefinition, input: Value) -> ToolOutcome {
    let tool = CommandTool::new(definition, std::path::Path::new(".")).unwrap();
    tool.call(input, &CancellationToken::new()).await
}

fn error_of(outcome: ToolOutcome) -> String {
    match outcome {
        ToolOutcome::Error(message) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_missing_default_file_means_the_built_in_agent_and_a_note_says_so() {
    let loaded = AgentDefinition::load(None).unwrap();
    assert_eq!(loaded.definition, AgentDefinition::default());
    assert_eq!(loaded.definition.agent.engine, "echo");
    assert!(loaded.note.unwrap().contains("built-in agent"));
}

#[test]
fn a_missing_named_file_is_an_error_naming_it() {
    let error =
        AgentDefinition::load(Some(std::path::Path::new("/nonexistent/agent.toml"))).unwrap_err();
    assert!(matches!(error, AgentError::Read { .. }));
    assert!(
        error.to_string().contains("/nonexistent/agent.toml"),
        "{error}"
    );
}

#[test]
fn an_unknown_key_is_an_error_that_names_the_key() {
    let error = AgentDefinition::from_toml("[budgets]\nstep_per_turn = 3\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("step_per_turn"), "{error}");
    let error = AgentDefinition::from_toml("[agent]\nengine = \"echo\"\nmodle = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("modle"), "{error}");
}

#[test]
fn a_full_definition_parses_with_its_defaults() {
    let definition = AgentDefinition::from_toml(
        r#"
[agent]
name = "reviewer"
system_prompt = "Review plans."
builtin_tools = ["ask_human"]

[[tool]]
name = "deploy"
description = "Deploy."
command = ["./deploy.sh", "--quiet"]
effect = "write"
input_schema = { type = "object", required = ["env"] }

[budgets]
steps_per_turn = 5
tokens = 1000
"#,
    )
    .unwrap();
    assert_eq!(definition.agent.name.as_deref(), Some("reviewer"));
    assert_eq!(
        definition.tools[0].timeout_seconds, 60.0,
        "a timeout by default"
    );
    assert_eq!(
        definition.tools[0].input_schema,
        json!({"type": "object", "required": ["env"]})
    );
    assert_eq!(definition.budgets.steps_per_turn, Some(5));
    let names: Vec<String> = definition
        .tools(std::path::Path::new("."))
        .unwrap()
        .specs()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        ["ask_human", "deploy"],
        "only the built-ins that are on, and the command tools"
    );
}

#[test]
fn a_definition_that_breaks_a_rule_is_refused_with_the_rule() {
    for (text, says) in [
        ("[agent]\nbuiltin_tools = [\"teleport\"]\n", "teleport"),
        (
            "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = []\neffect = \"read\"\n",
            "command",
        ),
        (
            "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"x\"]\neffect = \"read\"\ntimeout_seconds = 0\n",
            "timeout_seconds",
        ),
        (
            "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"x\"]\neffect = \"write\"\nidempotency_key = \"/k\"\n",
            "idempotent",
        ),
        (
            "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"x\"]\neffect = \"sometimes\"\n",
            "sometimes",
        ),
    ] {
        let error = AgentDefinition::from_toml(text).unwrap_err().to_string();
        assert!(error.contains(says), "{text:?} -> {error}");
    }
}

#[tokio::test]
async fn a_command_tool_gets_its_input_on_stdin_and_its_json_stdout_is_the_output() {
    let outcome = call(
        shell("echo_back", "cat", Effect::Read),
        json!({"x": [1, 2]}),
    )
    .await;
    assert_eq!(outcome, ToolOutcome::Output(json!({"x": [1, 2]})));
    assert_eq!(
        call(shell("quiet", "cat > /dev/null", Effect::Read), json!({})).await,
        ToolOutcome::Output(Value::Null)
    );
}

#[tokio::test]
async fn a_non_zero_exit_is_a_failure_carrying_the_tail_of_stderr() {
    let message = error_of(
        call(
            shell("bad", "echo 'disk full' >&2; exit 3", Effect::Write),
            json!({}),
        )
        .await,
    );
    assert!(
        message.contains("exited with 3") && message.contains("disk full"),
        "{message}"
    );
}

#[tokio::test]
async fn output_that_is_not_json_is_a_failure_that_shows_it() {
    let message =
        error_of(call(shell("chatty", "echo hello world", Effect::Read), json!({})).await);
    assert!(
        message.contains("not JSON") && message.contains("hello world"),
        "{message}"
    );
}

#[tokio::test]
async fn a_call_past_its_timeout_is_killed_and_is_a_failure() {
    let mut slow = shell("slow", "sleep 30", Effect::Read);
    slow.timeout_seconds = 0.2;
    let message = error_of(call(slow, json!({})).await);
    assert!(message.contains("timed out after 0.2s"), "{message}");
}

#[tokio::test]
async fn output_past_the_cap_is_a_failure_not_an_unbounded_buffer() {
    let message = error_of(
        call(
            shell(
                "flood",
                "head -c 1100000 /dev/zero | tr '\\0' a",
                Effect::Read,
            ),
            json!({}),
        )
        .await,
    );
    assert!(message.contains("printed more than"), "{message}");
}

#[test]
fn an_idempotent_command_tool_takes_its_key_from_the_input() {
    let mut definition = shell("charge", "cat", Effect::Idempotent);
    definition.idempotency_key = Some("/order/id".into());
    let tool = CommandTool::new(definition, std::path::Path::new(".")).unwrap();
    assert_eq!(
        tool.idempotency_key(&json!({"order": {"id": "o-7"}}))
            .as_deref(),
        Some("o-7")
    );
    assert_eq!(
        tool.idempotency_key(&json!({"order": {"id": 7}}))
            .as_deref(),
        Some("7")
    );
    assert_eq!(tool.idempotency_key(&json!({})), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_calls_a_command_tool_from_the_definition_and_records_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("deployed.log");
    let definition = AgentDefinition::from_toml(&format!(
        "[[tool]]\nname = \"deploy\"\ndescription = \"Deploy.\"\ncommand = [\"sh\", \"-c\", \"cat >> {}; echo '{{\\\"ok\\\": true}}'\"]\neffect = \"write\"\n",
        log.display()
    ))
    .unwrap();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "deploy", "arguments": {"env": "staging"}}]}
{"text": "deployed"}"#;
    let runtime = Runtime::builder(Arc::clone(&journal))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .tools(definition.tools(dir.path()).unwrap())
        .build();
    let (run, turn) = begin(&runtime, "deploy").await;
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        r#"{"env":"staging"}"#,
        "the tool ran once, with its input"
    );
    let output = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::ToolCallCompleted(c) => Some(std::sync::Arc::unwrap_or_clone(c.output)),
            _ => None,
        });
    assert_eq!(output, Some(json!({"ok": true})));
}

#[test]
fn a_cost_budget_needs_pricing_and_sane_numbers() {
    let error = AgentDefinition::from_toml("[budgets]\ncost_usd = 1.0\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("[pricing]"), "{error}");
    let error = AgentDefinition::from_toml("[budgets]\ncost_usd = -1.0\n[pricing]\ninput_per_million = 1.0\noutput_per_million = 1.0\n").unwrap_err().to_string();
    assert!(error.contains("positive"), "{error}");
    let ok = AgentDefinition::from_toml("[budgets]\ncost_usd = 0.5\n[pricing]\ninput_per_million = 3.0\noutput_per_million = 15.0\n").unwrap();
    assert_eq!(ok.budgets.cost_micro_usd(), Some(500_000));
    assert_eq!(ok.pricing.unwrap().micro_usd(1_000, 100), 3_000 + 1_500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_built_from_a_definition_uses_its_prompt_tools_and_budgets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.jsonl"),
        "{\"text\": \"scripted hello\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nsystem_prompt = \"Be brief.\"\nengine = \"scripted:script.jsonl\"\nbuiltin_tools = []\n\n[budgets]\nsteps_per_turn = 4\n",
    )
    .unwrap();
    let loaded = AgentDefinition::load(Some(&dir.path().join("spool.toml"))).unwrap();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    // The engine spec is spool-engines' to build; the script is given here.
    let script =
        spool_runtime::engines::ScriptedEngine::from_file(dir.path().join("script.jsonl")).unwrap();
    let runtime = Runtime::builder(Arc::clone(&journal))
        .agent(&loaded)
        .unwrap()
        .engine(Arc::new(script))
        .build();
    let (run, turn) = begin(&runtime, "hi").await;
    assert_eq!(
        settle(&runtime, &run, &turn).await.response.as_deref(),
        Some("scripted hello")
    );
    let expected = spool_runtime::ModelRequest::new(
        vec![
            spool_runtime::Message::System {
                content: "Be brief.".into(),
            },
            spool_runtime::Message::User {
                content: "hi".into(),
            },
        ],
        vec![],
    );
    let recorded = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::ModelCallRequested(r) => Some(r.request_hash),
            _ => None,
        });
    assert_eq!(
        recorded,
        Some(expected.hash()),
        "the system prompt and no tools reached the model"
    );
}

fn loaded(text: &str) -> spool_runtime::agent::Loaded {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.toml");
    std::fs::write(&path, text).unwrap();
    spool_runtime::agent::AgentDefinition::load(Some(&path)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_records_the_digest_of_its_definition_and_the_journal_keeps_each_definition_once() {
    let journal: std::sync::Arc<dyn spool_journal::Journal> =
        std::sync::Arc::new(spool_journal::store::memory::MemoryJournal::new());
    let first = loaded("[agent]\nsystem_prompt = \"Be brief.\"\n");
    // The same settings laid out otherwise, with a comment: the same digest.
    let same = loaded("# the same agent\n[agent]\nsystem_prompt    = 'Be brief.'\n");
    let second = loaded("[agent]\nsystem_prompt = \"Be thorough.\"\n");
    assert_eq!(first.digest(), same.digest());
    assert_ne!(first.digest(), second.digest());
    assert!(first.digest().starts_with("sha256:") && first.digest().len() == 71);

    let mut runs = Vec::new();
    for definition in [&first, &first, &second] {
        let runtime = spool_runtime::Runtime::builder(std::sync::Arc::clone(&journal))
            .agent(definition)
            .unwrap()
            .build();
        let (run, turn) = crate::support::begin(&runtime, "hello").await;
        crate::support::settle(&runtime, &run, &turn).await;
        runs.push((runtime, run));
    }
    for ((runtime, run), definition) in runs.iter().zip([&first, &first, &second]) {
        assert_eq!(
            runtime.detail(run).await.unwrap().agent,
            Some(definition.digest()),
            "each run names the definition it started with"
        );
    }
    let runtime = &runs[0].0;
    assert_eq!(
        runtime.definition(&first.digest()).await.unwrap(),
        Some(first.document.clone())
    );
    assert_eq!(
        runtime.definition(&second.digest()).await.unwrap(),
        Some(second.document.clone()),
        "the journal keeps both definitions"
    );
}
