//! Spool's runs as an MCP server, in process: the official Rust SDK's
//! client talks to `RunsServer` over a pipe. Patience, progress, errors
//! and resources, with a scripted model.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use spool_journal::store::memory::MemoryJournal;
use spool_mcp::serve::{Patience, RunsServer};
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{RunAccess, Runtime};

/// How long any wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A client that keeps the progress messages it receives, and declares
/// the tasks extension when asked to.
#[derive(Clone, Default)]
struct Host {
    progress: Arc<Mutex<Vec<String>>>,
    /// Told after each progress message is kept.
    kept: Arc<tokio::sync::Notify>,
    tasks: bool,
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.tasks {
            capabilities.extensions = Some(
                [(
                    rmcp::model::TASKS_EXTENSION_ID.to_owned(),
                    Default::default(),
                )]
                .into(),
            );
        }
        ClientConfig::new(capabilities, Implementation::new("test-host", "1"))
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(message) = params.message {
            self.progress.lock().unwrap().push(message);
            self.kept.notify_one();
        }
    }
}

/// A runtime on `script`, served to a connected client.
async fn connected(
    script: &str,
    patience: Duration,
) -> (RunningService<RoleClient, Host>, Host, Runtime) {
    connected_as(Host::default(), script, patience).await
}

/// [`connected`], with `host` as the client.
async fn connected_as(
    host: Host,
    script: &str,
    patience: Duration,
) -> (RunningService<RoleClient, Host>, Host, Runtime) {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .build();
    let server = RunsServer::new(runtime.clone(), RunAccess::Any).with_patience(Patience(patience));
    let (near, far) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let (read, write) = tokio::io::split(far);
        if let Ok(running) = server.serve((read, write)).await {
            let _ = running.waiting().await;
        }
    });
    let (read, write) = tokio::io::split(near);
    let client = host.clone().serve((read, write)).await.unwrap();
    (client, host, runtime)
}

async fn call(
    client: &RunningService<RoleClient, Host>,
    tool: &str,
    arguments: Value,
) -> (bool, Value) {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    let result = tokio::time::timeout(
        PATIENCE,
        client.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments)),
    )
    .await
    .expect("the call ends in time")
    .unwrap();
    (
        result.is_error == Some(true),
        result.structured_content.unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_longer_than_the_patience_is_answered_as_running_with_its_run_id_never_as_a_timeout()
{
    let (client, _, runtime) = connected(
        r#"{"text": "a slow answer", "delay_ms": 400}"#,
        Duration::from_millis(50),
    )
    .await;
    let (failed, run) = call(&client, "start_run", json!({"text": "go"})).await;
    assert!(!failed, "{run}");
    assert_eq!(run["state"], "running", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let turn = spool_journal::TurnId::new(run["turn_id"].as_str().unwrap()).unwrap();
    let run_id = spool_journal::RunId::new(&id).unwrap();
    tokio::time::timeout(PATIENCE, runtime.wait_for(&run_id, &turn))
        .await
        .unwrap()
        .unwrap();
    let (_, later) = call(&client, "get_run", json!({"run_id": id})).await;
    assert_eq!(later["state"], "completed", "{later}");
    assert_eq!(later["response"], "a slow answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_asked_for_progress_receives_the_whole_streamed_answer_before_the_result() {
    let (client, host, _) = connected(
        r#"{"text": "one two three four five", "delay_ms": 20}"#,
        PATIENCE,
    )
    .await;
    // The SDK's client puts a progress token on every request.
    let (_, run) = call(&client, "start_run", json!({"text": "go"})).await;
    assert_eq!(run["state"], "completed", "{run}");
    // The server sends every progress message before the result, but the
    // SDK's client runs each notification's handler in a task of its own,
    // so the last handler may still be running when the call returns: the
    // test waits for the kept messages, with a timeout that fails it.
    let whole = "one two three four five";
    let _ = tokio::time::timeout(PATIENCE, async {
        while host.progress.lock().unwrap().concat().trim() != whole {
            host.kept.notified().await;
        }
    })
    .await;
    let streamed = host.progress.lock().unwrap().concat();
    assert_eq!(streamed.trim(), whole, "{:?}", host.progress);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_argument_and_an_unknown_run_are_failed_results_with_stable_codes() {
    let (client, _, _) = connected(r#"{"text": "x"}"#, PATIENCE).await;
    let (failed, refusal) = call(&client, "get_run", json!({"run_id": "run_nothing_here"})).await;
    assert!(failed);
    assert_eq!(refusal["code"], "run_not_found", "{refusal}");
    let (failed, refusal) = call(&client, "start_run", json!({"words": "no text"})).await;
    assert!(failed);
    assert_eq!(refusal["code"], "bad_request", "{refusal}");
    let (failed, refusal) = call(
        &client,
        "respond",
        json!({"run_id": "bad id!", "turn_id": "t"}),
    )
    .await;
    assert!(failed);
    assert_eq!(refusal["code"], "bad_request", "{refusal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_names_one_run_that_a_second_start_messages() {
    let (client, _, _) = connected("{\"text\": \"first\"}\n{\"text\": \"second\"}", PATIENCE).await;
    let (_, first) = call(
        &client,
        "start_run",
        json!({"text": "a", "address": "ticket-7"}),
    )
    .await;
    let (_, second) = call(
        &client,
        "start_run",
        json!({"text": "b", "address": "ticket-7"}),
    )
    .await;
    assert_eq!(first["run_id"], second["run_id"], "{first} {second}");
    assert_eq!(second["response"], "second", "{second}");
    let (_, listed) = call(&client, "list_runs", json!({"state": "completed"})).await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1, "{listed}");
}

/// Polls task `id` until `done` holds of it, failing after [`PATIENCE`].
async fn poll(
    client: &RunningService<RoleClient, Host>,
    id: &str,
    done: impl Fn(&rmcp::model::DetailedTask) -> bool,
) -> rmcp::model::DetailedTask {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let task = client
            .get_task(rmcp::model::GetTaskParams::new(id.to_owned()))
            .await
            .unwrap()
            .task;
        if done(&task) {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} stayed {:?}",
            task.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_a_host_with_the_tasks_extension_a_turn_is_a_task_that_asks_for_input_and_completes() {
    let host = Host {
        tasks: true,
        ..Host::default()
    };
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which colour?", "options": ["red", "blue"]}}]}
{"text": "blue it is"}"#;
    let (client, _, _) = connected_as(host, script, Duration::from_millis(50)).await;
    let Value::Object(arguments) = json!({"text": "paint it"}) else {
        unreachable!()
    };
    let response = client
        .call_tool_once(CallToolRequestParams::new("start_run").with_arguments(arguments))
        .await
        .unwrap();
    let rmcp::model::CallToolResponse::Task(created) = response else {
        panic!("expected a task, got {response:?}");
    };
    let id = created.task.task_id.clone();
    let waiting = poll(&client, &id, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    let rmcp::model::TaskPayload::InputRequired { input_requests } = &waiting.payload else {
        panic!("{waiting:?}")
    };
    let form = serde_json::to_value(&input_requests["answer"]).unwrap();
    assert_eq!(form["params"]["message"], "Which colour?", "{form}");
    assert_eq!(
        form["params"]["requestedSchema"]["properties"]["text"]["enum"],
        json!(["red", "blue"]),
        "{form}"
    );
    client
        .update_task(rmcp::model::UpdateTaskParams::new(
            id.clone(),
            [(
                "answer".to_owned(),
                json!({"action": "accept", "content": {"text": "blue"}}),
            )]
            .into(),
        ))
        .await
        .unwrap();
    let done = poll(&client, &id, |t| {
        t.status() == rmcp::model::TaskStatus::Completed
    })
    .await;
    let rmcp::model::TaskPayload::Completed { result } = &done.payload else {
        panic!("{done:?}")
    };
    assert_eq!(
        result["structuredContent"]["response"], "blue it is",
        "{result:?}"
    );
    // Compared as times: RFC 3339 text drops a fraction's trailing zeros,
    // so `…42.41Z` sorts after `…42.4138Z` as text.
    let at = |text: &str| {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
    };
    assert!(
        at(&done.task.created_at) <= at(&done.task.last_updated_at),
        "{done:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_by_its_host_cancels_the_turn_and_an_unknown_task_is_refused() {
    let host = Host {
        tasks: true,
        ..Host::default()
    };
    let (client, _, runtime) = connected_as(
        host,
        r#"{"text": "a very slow answer indeed", "delay_ms": 2000}"#,
        Duration::from_millis(50),
    )
    .await;
    let Value::Object(arguments) = json!({"text": "go"}) else {
        unreachable!()
    };
    let response = client
        .call_tool_once(CallToolRequestParams::new("start_run").with_arguments(arguments))
        .await
        .unwrap();
    let rmcp::model::CallToolResponse::Task(created) = response else {
        panic!("expected a task, got {response:?}");
    };
    assert_eq!(created.task.status, rmcp::model::TaskStatus::Working);
    let id = created.task.task_id.clone();
    client
        .cancel_task(rmcp::model::CancelTaskParams::new(id.clone()))
        .await
        .unwrap();
    poll(&client, &id, |t| {
        t.status() == rmcp::model::TaskStatus::Cancelled
    })
    .await;
    let run = spool_journal::RunId::new(id.split('/').next().unwrap()).unwrap();
    assert_eq!(
        runtime.get(&run).await.unwrap().status.state(),
        spool_wire::run::RunState::Cancelled
    );
    let unknown = client
        .get_task(rmcp::model::GetTaskParams::new(
            "run_nope/turn_nope/1".to_owned(),
        ))
        .await;
    assert!(unknown.is_err(), "{unknown:?}");
}
