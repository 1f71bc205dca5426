//! The A2A operations in process, on a scripted model: a message is one
//! task however often it is sent, a message to a busy context waits as a
//! submitted task, another principal's task does not exist, listings page
//! newest first, and the bindings' framings (v0.3 shapes, error bodies).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use spool_a2a::{A2aServer, TaskRef};
use spool_journal::Principal;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{RunAccess, Runtime};
use spool_wire::a2a::{
    Error, ErrorKind, ListTasksRequest, Message, Part, Role, SendMessageConfiguration,
    SendMessageRequest, Task, TaskRequest, TaskState,
};

/// How long any wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

fn server(script: &str, access: RunAccess) -> (A2aServer, Runtime) {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .build();
    // Never closing: these tests end with the runtime.
    let (closing, closed) = tokio::sync::watch::channel(false);
    std::mem::forget(closing);
    (A2aServer::new(runtime.clone(), access, closed), runtime)
}

fn principal(id: &str) -> Principal {
    Principal {
        authenticator: "test".into(),
        kind: "token".into(),
        id: id.into(),
        attributes: BTreeMap::new(),
    }
}

fn message(id: &str, text: &str, context: Option<&str>) -> SendMessageRequest {
    SendMessageRequest {
        tenant: None,
        message: Message {
            message_id: id.into(),
            context_id: context.map(str::to_owned),
            task_id: None,
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        },
        configuration: Some(SendMessageConfiguration {
            return_immediately: true,
            ..SendMessageConfiguration::default()
        }),
        metadata: None,
    }
}

fn get(id: &str) -> TaskRequest {
    TaskRequest {
        id: id.into(),
        history_length: None,
        tenant: None,
        metadata: None,
    }
}

/// Reads the task until it is in `state`, failing after [`PATIENCE`]:
/// it waits on the task's own journal, not on a clock.
async fn until(server: &A2aServer, caller: Option<&Principal>, id: &str, state: TaskState) -> Task {
    tokio::time::timeout(PATIENCE, async {
        let at = TaskRef::parse(id).unwrap();
        // Subscribed before each read: a change after the read wakes it.
        let mut changes = server.runtime().subscribe(&at.run, None).await.unwrap();
        while changes.ready().is_some() {}
        loop {
            let task = server.get(caller, &get(id)).await.unwrap();
            if task.status.state == state {
                return task;
            }
            changes.next().await.expect("the run's events go on");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("task {id} never reached {state:?}"))
}

#[tokio::test]
async fn the_same_message_sent_twice_or_at_once_is_one_task_and_one_turn() {
    let (server, runtime) = server(r#"{"text": "hi"}"#, RunAccess::Any);
    let (a, b) = tokio::join!(
        server.send(None, message("m-1", "hello", None)),
        server.send(None, message("m-1", "hello, edited", None)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.task, b.task, "one message id, one task");
    let again = server
        .send(None, message("m-1", "hello", None))
        .await
        .unwrap();
    assert_eq!(again.task, a.task, "and once more after it ran");
    let task = until(&server, None, &a.task.id(), TaskState::Completed).await;
    assert_eq!(
        task.artifacts.unwrap()[0].parts[0].text.as_deref(),
        Some("hi")
    );
    let mut log = runtime.subscribe(&a.task.run, None).await.unwrap();
    let mut turns = 0;
    while let Some(item) = log.ready() {
        if let spool_runtime::hub::StreamItem::Event(envelope) = item
            && matches!(envelope.event, spool_journal::Event::TurnStarted(_))
        {
            turns += 1;
        }
    }
    assert_eq!(turns, 1, "one turn in the context");
}

#[tokio::test]
async fn a_message_to_a_busy_context_is_a_submitted_task_that_runs_after_the_one_before() {
    let slow = json!({"text": "first answer is long enough to stream", "delay_ms": 50}).to_string();
    let script = format!("{slow}\n{}", json!({"text": "second"}));
    let (server, _runtime) = server(&script, RunAccess::Any);
    let first = server.send(None, message("a", "one", None)).await.unwrap();
    let context = first.task.run.to_string();
    let second = server
        .send(None, message("b", "two", Some(&context)))
        .await
        .unwrap();
    assert_ne!(first.task, second.task);
    let waiting = server.get(None, &get(&second.task.id())).await.unwrap();
    assert_eq!(
        waiting.status.state,
        TaskState::Submitted,
        "queued behind the first"
    );
    let done = until(&server, None, &second.task.id(), TaskState::Completed).await;
    assert_eq!(
        done.artifacts.unwrap()[0].parts[0].text.as_deref(),
        Some("second")
    );
    let first = server.get(None, &get(&first.task.id())).await.unwrap();
    assert_eq!(
        first.status.state,
        TaskState::Completed,
        "the first finished before"
    );
}

#[tokio::test]
async fn another_principals_task_and_context_do_not_exist_for_a_caller_under_owner_access() {
    let (server, _runtime) = server(r#"{"text": "hi"}"#, RunAccess::Owner);
    let (alice, bob) = (principal("alice"), principal("bob"));
    let hers = server
        .send(Some(&alice), message("m", "mine", None))
        .await
        .unwrap();
    let id = hers.task.id();
    until(&server, Some(&alice), &id, TaskState::Completed).await;
    let kind = |result: Result<Task, Error>| result.map(|_| ()).unwrap_err().kind;
    assert_eq!(
        kind(server.get(Some(&bob), &get(&id)).await),
        ErrorKind::TaskNotFound
    );
    assert_eq!(
        kind(server.cancel(Some(&bob), &get(&id)).await),
        ErrorKind::TaskNotFound
    );
    let into_hers = server
        .send(
            Some(&bob),
            message("n", "yours?", Some(hers.task.run.as_str())),
        )
        .await
        .unwrap_err();
    assert_eq!(
        into_hers.kind,
        ErrorKind::InvalidParams,
        "her context is unknown to him"
    );
    // The same message id from him is his own task, in his own context.
    let his = server
        .send(Some(&bob), message("m", "mine too", None))
        .await
        .unwrap();
    assert_ne!(his.task.run, hers.task.run);
    let listed = server
        .list(Some(&bob), &ListTasksRequest::default())
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 1, "his listing holds his task only");
    assert_eq!(listed.tasks[0].id, his.task.id());
}

#[tokio::test]
async fn list_tasks_pages_newest_first_and_filters_by_state_and_context() {
    let (server, _runtime) = server(r#"{"text": "hi"}"#, RunAccess::Any);
    let mut ids = Vec::new();
    for n in 0..5 {
        let sent = server
            .send(None, message(&format!("m{n}"), "x", None))
            .await
            .unwrap();
        until(&server, None, &sent.task.id(), TaskState::Completed).await;
        ids.push(sent.task.id());
    }
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let page = server
            .list(
                None,
                &ListTasksRequest {
                    page_size: Some(2),
                    page_token: token.clone(),
                    ..ListTasksRequest::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(page.total_size, 5);
        seen.extend(page.tasks.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = Some(page.next_page_token);
    }
    ids.reverse();
    assert_eq!(seen, ids, "every task once, newest first");
    let working = server
        .list(
            None,
            &ListTasksRequest {
                status: Some(TaskState::Working),
                ..ListTasksRequest::default()
            },
        )
        .await
        .unwrap();
    assert!(working.tasks.is_empty());
    let one = TaskRef::parse(&ids[0]).unwrap();
    let by_context = server
        .list(
            None,
            &ListTasksRequest {
                context_id: Some(one.run.to_string()),
                ..ListTasksRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(by_context.tasks.len(), 1);
    for bad in [0, 101] {
        let refused = server
            .list(
                None,
                &ListTasksRequest {
                    page_size: Some(bad),
                    ..ListTasksRequest::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InvalidParams, "pageSize {bad}");
    }
}

#[tokio::test]
async fn a_task_id_that_names_no_message_is_task_not_found() {
    let (server, _runtime) = server(r#"{"text": "hi"}"#, RunAccess::Any);
    let sent = server.send(None, message("m", "x", None)).await.unwrap();
    let run = sent.task.run.to_string();
    for id in [
        format!("{run}.0"),
        format!("{run}.999"),
        run.clone(),
        "not a task".to_owned(),
        "run_nothing.1".to_owned(),
    ] {
        let error = server.get(None, &get(&id)).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::TaskNotFound, "{id}");
    }
}

#[tokio::test]
async fn a_message_without_text_or_data_is_refused_with_the_content_type_error() {
    let (server, _runtime) = server(r#"{"text": "hi"}"#, RunAccess::Any);
    let mut request = message("m", "x", None);
    request.message.parts = vec![Part {
        url: Some("https://example.com/a.png".into()),
        media_type: Some("image/png".into()),
        ..Part::default()
    }];
    let error = server.send(None, request).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::ContentTypeNotSupported);
    let mut request = message("m2", "x", None);
    request.message.parts.clear();
    assert_eq!(
        server.send(None, request).await.unwrap_err().kind,
        ErrorKind::InvalidParams
    );
    let mut request = message("m3", "x", None);
    request.message.role = Role::Agent;
    assert_eq!(
        server.send(None, request).await.unwrap_err().kind,
        ErrorKind::InvalidParams
    );
}

#[test]
fn a_v1_task_rewritten_for_v0_3_has_kinds_and_lowercase_states() {
    let task = json!({"task": {
        "id": "r.1", "contextId": "r",
        "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
            "messageId": "s", "role": "ROLE_AGENT", "parts": [{"text": "which?"}]}},
        "history": [{"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"a": 1}}]}]
    }});
    let old: Value = spool_wire::a2a::v0_3::item(task);
    assert_eq!(old["kind"], "task");
    assert_eq!(old["status"]["state"], "input-required");
    assert_eq!(old["status"]["message"]["role"], "agent");
    assert_eq!(old["status"]["message"]["parts"][0]["kind"], "text");
    assert_eq!(old["history"][0]["parts"][0]["kind"], "data");
    let update = json!({"statusUpdate": {"taskId": "r.1", "contextId": "r",
        "status": {"state": "TASK_STATE_COMPLETED"}}});
    let old = spool_wire::a2a::v0_3::item(update);
    assert_eq!(old["kind"], "status-update");
    assert_eq!(old["final"], true);
}

#[tokio::test]
async fn two_subscribers_to_one_task_see_the_same_changes_in_the_same_order() {
    let story: Vec<String> = (0..40).map(|n| format!("w{n}")).collect();
    let script = json!({"text": story.join(" "), "delay_ms": 5}).to_string();
    let (server, runtime) = server(&script, RunAccess::Any);
    let sent = server.send(None, message("m", "go", None)).await.unwrap();
    let watch = || spool_a2a::task::Watch::open(&runtime, sent.task.clone());
    let (first, second) = (watch().await.unwrap(), watch().await.unwrap());
    let drain = |mut watch: spool_a2a::task::Watch| async move {
        let mut items = Vec::new();
        while let Some(item) = watch.next().await {
            items.push(serde_json::to_value(&item).unwrap());
        }
        items
    };
    // Both opened while the turn streams (the last assertion fails
    // otherwise); each ends where the task rests.
    let (a, b) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(drain(first), drain(second))
    })
    .await
    .expect("both streams end");
    let durable = |items: &[Value]| -> Vec<Value> {
        // Pieces of the answer are live: a subscriber opened after some
        // were sent does not get those. The changes recorded in the
        // journal are the same for both.
        items
            .iter()
            .filter(|item| {
                item.get("artifactUpdate")
                    .is_none_or(|u| u["lastChunk"] == true)
            })
            .cloned()
            .collect()
    };
    assert_eq!(durable(&a), durable(&b));
    assert_eq!(
        durable(&a).last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}
