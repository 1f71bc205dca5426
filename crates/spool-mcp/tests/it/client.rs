//! One server's tools through `McpServers`: names, effects, results,
//! failures, a server that exits, cancellation, and a changed tool list.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_mcp::McpServers;
use spool_runtime::agent::AgentDefinition;
use spool_runtime::{Tool, ToolOutcome, Tools};
use tokio_util::sync::CancellationToken;

/// How long any wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// The servers of a definition with one `[[mcp]]` table running the test
/// server, `extra` added to the table, executions logged to `log`.
fn servers(python: &Path, log: &Path, extra: &str) -> McpServers {
    let toml = format!(
        "[[mcp]]\nname = \"t\"\ncommand = [{:?}, {:?}, \"stdio\"]\nenv = {{ SPOOL_MCP_LOG = {:?} }}\n{extra}",
        python.display().to_string(),
        crate::script().display().to_string(),
        log.display().to_string(),
    );
    let definition: AgentDefinition = toml::from_str(&toml).unwrap();
    McpServers::from_definition(&definition, Path::new("")).unwrap()
}

/// The executions the server logged, by tool.
fn executed(log: &Path, tool: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["tool"] == tool)
        .count()
}

/// Waits until `ready` holds, failing the test after [`PATIENCE`].
async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !ready() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: never");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call(tools: &Tools, name: &str, input: Value) -> ToolOutcome {
    let tool = tools
        .get(name)
        .unwrap_or_else(|| panic!("{name} is offered"));
    tokio::time::timeout(PATIENCE, tool.call(input, &CancellationToken::new()))
        .await
        .expect("the call ends in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_offered_as_server_and_tool_with_effects_from_their_annotations_unless_overridden()
 {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let servers = servers(
        &python,
        &dir.path().join("log"),
        "effect = { fail = \"write\" }\n",
    );
    let tools = servers.start(Tools::new()).await.current();
    let effect = |name: &str| tools.get(name).unwrap().effect();
    assert_eq!(effect("t__lookup"), Effect::Read, "readOnlyHint");
    assert_eq!(effect("t__upsert"), Effect::Idempotent, "idempotentHint");
    assert_eq!(effect("t__write_note"), Effect::Write, "no hint: a write");
    assert_eq!(
        effect("t__fail"),
        Effect::Write,
        "the operator's word wins over readOnlyHint"
    );
    let input = json!({"text": "x"});
    assert!(
        tools
            .get("t__write_note")
            .unwrap()
            .approval(&input)
            .is_some(),
        "a write asks first by default"
    );
    assert!(
        tools.get("t__lookup").unwrap().approval(&input).is_none(),
        "a read does not"
    );
    servers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_offers_only_the_tools_it_names_and_reports_a_name_the_server_lacks() {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let servers = servers(
        &python,
        &dir.path().join("log"),
        "tools = [\"lookup\", \"missing\"]\n",
    );
    let listing = servers.list().await.remove(0);
    let names: Vec<String> = listing
        .tools
        .unwrap()
        .iter()
        .map(|t| t.spec().name)
        .collect();
    assert_eq!(names, ["t__lookup"]);
    assert!(
        listing.skipped.iter().any(|s| s.contains("`missing`")),
        "{:?}",
        listing.skipped
    );
    servers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_the_models_output_and_a_tool_error_is_a_failed_call_with_its_message() {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let servers = servers(&python, &dir.path().join("log"), "");
    let tools = servers.start(Tools::new()).await.current();
    match call(&tools, "t__lookup", json!({"key": "k"})).await {
        ToolOutcome::Output(output) => {
            // The SDK sends the text and, for a typed result, the same
            // value structured: both reach the model.
            assert_eq!(
                output,
                json!({"structured": {"result": "value of k"}, "text": "value of k"})
            );
        }
        other => panic!("expected an output, got {other:?}"),
    }
    match call(&tools, "t__fail", json!({"reason": "because"})).await {
        ToolOutcome::Error(message) => {
            assert!(message.contains("failed on purpose: because"), "{message}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    servers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_mid_call_fails_that_call_with_its_stderr_and_is_started_again_for_the_next()
 {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let servers = servers(&python, &log, "");
    let tools = servers.start(Tools::new()).await.current();
    match call(&tools, "t__exit_now", json!({})).await {
        ToolOutcome::Error(message) => {
            assert!(message.contains("exited during the call"), "{message}");
            assert!(
                message.contains("exiting mid-call, as asked"),
                "the stderr tail: {message}"
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(
        matches!(
            call(&tools, "t__lookup", json!({"key": "again"})).await,
            ToolOutcome::Output(_)
        ),
        "the next call starts the server again"
    );
    assert_eq!(executed(&log, "lookup"), 1);
    servers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_cancelled_at_the_server_too() {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let servers = servers(&python, &log, "");
    let tools = servers.start(Tools::new()).await.current();
    let slow = Arc::clone(tools.get("t__slow").unwrap());
    let cancel = CancellationToken::new();
    let call = {
        let cancel = cancel.clone();
        tokio::spawn(async move { slow.call(json!({"seconds": 60}), &cancel).await })
    };
    // Cancel once the server has the call.
    until("the server got the call", || executed(&log, "slow") > 0).await;
    cancel.cancel();
    let outcome = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
    assert!(
        matches!(outcome, ToolOutcome::Error(ref m) if m.contains("cancelled")),
        "{outcome:?}"
    );
    until("the server heard of the cancel", || {
        executed(&log, "slow_cancelled") > 0
    })
    .await;
    servers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_says_its_tools_changed_is_listed_again_for_later_turns() {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let servers = servers(&python, &dir.path().join("log"), "");
    let live = servers.start(Tools::new()).await;
    assert!(live.current().get("t__fresh").is_none());
    let grow = Arc::clone(live.current().get("t__grow").unwrap());
    assert!(matches!(
        grow.call(json!({"name": "fresh"}), &CancellationToken::new())
            .await,
        ToolOutcome::Output(_)
    ));
    until("the new tool is offered", || {
        live.current().get("t__fresh").is_some()
    })
    .await;
    servers.stop().await;
}

/// The test server over Streamable HTTP on a free loopback port; killed
/// when dropped.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    fn start(python: &Path, log: &Path, port: u16) -> Self {
        let child = std::process::Command::new(python)
            .arg(crate::script())
            .args(["http", &port.to_string()])
            .env("SPOOL_MCP_LOG", log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Ready once it accepts a connection.
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the HTTP server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_is_called_and_one_that_is_down_fails_the_call_until_it_is_back() {
    let Some(python) = crate::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let port = free_port();
    let server = HttpServer::start(&python, &log, port);
    std::fs::write(dir.path().join("token"), "secret\n").unwrap();
    let toml = format!(
        "[[mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:{}/mcp\"\nheaders = {{ X-Team = \"infra\" }}\ntoken_file = \"token\"\n",
        server.port
    );
    let definition: AgentDefinition = toml::from_str(&toml).unwrap();
    let servers = McpServers::from_definition(&definition, dir.path()).unwrap();
    let tools = servers.start(Tools::new()).await.current();
    assert_eq!(
        tools.get("web__upsert").unwrap().effect(),
        Effect::Idempotent
    );
    assert!(matches!(
        call(&tools, "web__lookup", json!({"key": "k"})).await,
        ToolOutcome::Output(_)
    ));
    drop(server);
    match call(&tools, "web__lookup", json!({"key": "down"})).await {
        ToolOutcome::Error(message) => assert!(message.contains("web"), "{message}"),
        other => panic!("expected a failure while the server is down, got {other:?}"),
    }
    let _back = HttpServer::start(&python, &log, port);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        // The first attempt after an outage may still be in its backoff.
        if let ToolOutcome::Output(_) = call(&tools, "web__lookup", json!({"key": "back"})).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never worked again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        executed(&log, "lookup"),
        2,
        "the call made while down never arrived"
    );
    servers.stop().await;
}
