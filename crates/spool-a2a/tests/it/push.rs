//! Push notifications against a local receiver: each state change POSTed
//! in order with the config's token and authentication; a receiver that
//! keeps failing given up on after the documented tries, recorded in the
//! journal; and a change left undelivered when the process stopped
//! delivered by the next one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use spool_a2a::A2aServer;
use spool_a2a::config::A2aSection;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{RunAccess, Runtime};
use spool_wire::a2a::{
    AuthenticationInfo, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    TaskPushNotificationConfig,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// How long any wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A POST the receiver got: its headers (lowercased names) and body.
#[derive(Debug)]
struct Received {
    headers: BTreeMap<String, String>,
    body: Value,
}

/// A receiver on a free port that answers each POST with the status
/// `status` holds, and hands what it got to the returned channel.
async fn receiver(status: Arc<AtomicU16>) -> (String, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (sender, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let sender = sender.clone();
            let status = Arc::clone(&status);
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                let mut headers = BTreeMap::new();
                let mut line = String::new();
                read.read_line(&mut line).await.unwrap();
                loop {
                    line.clear();
                    read.read_line(&mut line).await.unwrap();
                    let Some((name, value)) = line.trim_end().split_once(": ") else {
                        break;
                    };
                    headers.insert(name.to_ascii_lowercase(), value.to_owned());
                }
                let length: usize = headers["content-length"].parse().unwrap();
                let mut body = vec![0; length];
                read.read_exact(&mut body).await.unwrap();
                let code = status.load(Ordering::SeqCst);
                let _ = sender.send(Received {
                    headers,
                    body: serde_json::from_slice(&body).unwrap(),
                });
                let reply =
                    format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = write.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, received)
}

fn server(runtime: &Runtime, closing: tokio::sync::watch::Receiver<bool>) -> A2aServer {
    let section = A2aSection {
        push_private_networks: true,
        ..A2aSection::default()
    };
    A2aServer::new(runtime.clone(), RunAccess::Any, closing)
        .with_card(section, None)
        .with_push_backoff(Duration::from_millis(5))
}

fn message(id: &str, text: &str, push: Option<TaskPushNotificationConfig>) -> SendMessageRequest {
    SendMessageRequest {
        tenant: None,
        message: Message {
            message_id: id.into(),
            context_id: None,
            task_id: None,
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        },
        configuration: Some(SendMessageConfiguration {
            return_immediately: true,
            task_push_notification_config: push,
            ..SendMessageConfiguration::default()
        }),
        metadata: None,
    }
}

fn config(url: &str) -> TaskPushNotificationConfig {
    TaskPushNotificationConfig {
        tenant: None,
        id: None,
        task_id: None,
        url: url.to_owned(),
        token: Some("tok-1".into()),
        authentication: Some(AuthenticationInfo {
            scheme: "Bearer".into(),
            credentials: Some("secret".into()),
        }),
    }
}

async fn next(received: &mut mpsc::UnboundedReceiver<Received>) -> Received {
    tokio::time::timeout(PATIENCE, received.recv())
        .await
        .expect("a push within the patience")
        .expect("the receiver runs")
}

fn state(received: &Received) -> &str {
    received.body["statusUpdate"]["status"]["state"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn each_state_change_is_posted_in_order_with_the_configs_token_and_authentication() {
    let script = [
        json!({"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}),
        json!({"text": "done"}),
    ]
    .map(|line| line.to_string())
    .join("\n");
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(&script).unwrap()))
        .build();
    let (_closing, closed) = tokio::sync::watch::channel(false);
    let server = server(&runtime, closed);
    let (url, mut received) = receiver(Arc::new(AtomicU16::new(200))).await;
    let sent = server
        .send(None, message("m1", "go", Some(config(&url))))
        .await
        .unwrap();
    let first = next(&mut received).await;
    assert_eq!(
        state(&first),
        "TASK_STATE_INPUT_REQUIRED",
        "{:?}",
        first.body
    );
    assert_eq!(first.body["statusUpdate"]["taskId"], sent.task.id());
    assert_eq!(first.headers["x-a2a-notification-token"], "tok-1");
    assert_eq!(first.headers["authorization"], "Bearer secret");
    assert_eq!(first.headers["content-type"], "application/a2a+json");
    let answer = SendMessageRequest {
        message: Message {
            task_id: Some(sent.task.id()),
            ..message("m2", "blue", None).message
        },
        ..message("m2", "blue", None)
    };
    server.send(None, answer).await.unwrap();
    assert_eq!(state(&next(&mut received).await), "TASK_STATE_WORKING");
    assert_eq!(state(&next(&mut received).await), "TASK_STATE_COMPLETED");
    let configs = server
        .push_list(
            None,
            &spool_wire::a2a::PushConfigRequest {
                task_id: sent.task.id(),
                id: None,
                tenant: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        configs.configs.len(),
        1,
        "one config, named after the message"
    );
    assert_eq!(configs.configs[0].id.as_deref(), Some("message:m1"));
}

#[tokio::test]
async fn a_receiver_that_keeps_failing_is_given_up_on_after_the_documented_tries_and_that_is_recorded()
 {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(
            ScriptedEngine::from_jsonl(r#"{"text": "hi"}"#).unwrap(),
        ))
        .build();
    let (_closing, closed) = tokio::sync::watch::channel(false);
    let server = server(&runtime, closed);
    let (url, mut received) = receiver(Arc::new(AtomicU16::new(500))).await;
    let sent = server
        .send(None, message("m1", "go", Some(config(&url))))
        .await
        .unwrap();
    for _ in 0..spool_a2a::push::ATTEMPTS {
        assert_eq!(state(&next(&mut received).await), "TASK_STATE_COMPLETED");
    }
    // The note says so once the last try failed; wait on the run's events.
    let mut changes = runtime.subscribe(&sent.task.run, None).await.unwrap();
    while changes.ready().is_some() {}
    let given_up = tokio::time::timeout(PATIENCE, async {
        loop {
            let notes = runtime
                .notes(&sent.task.run, spool_a2a::push::NAMESPACE)
                .await
                .unwrap();
            if let Some(why) = notes["message:m1"].get("given_up").and_then(Value::as_str) {
                return why.to_owned();
            }
            changes.next().await.unwrap();
        }
    })
    .await
    .expect("the config is given up on");
    assert!(given_up.contains("answered 500"), "{given_up}");
    assert!(
        received.try_recv().is_err(),
        "nothing is sent after giving up"
    );
}

#[tokio::test]
async fn a_change_left_undelivered_when_the_server_stopped_is_delivered_by_the_next_one() {
    let journal = Arc::new(MemoryJournal::new());
    let build = || {
        Runtime::builder(Arc::clone(&journal) as Arc<_>)
            .engine(Arc::new(
                ScriptedEngine::from_jsonl(r#"{"text": "hi"}"#).unwrap(),
            ))
            .build()
    };
    let runtime = build();
    let (closing, closed) = tokio::sync::watch::channel(false);
    // The first server's receiver is down: nothing is delivered before it
    // stops (its retries wait far longer than this test).
    let first = A2aServer::new(runtime.clone(), RunAccess::Any, closed)
        .with_card(
            A2aSection {
                push_private_networks: true,
                ..A2aSection::default()
            },
            None,
        )
        .with_push_backoff(Duration::from_secs(3600));
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = down.local_addr().unwrap().port();
    drop(down);
    let sent = first
        .send(
            None,
            message(
                "m1",
                "go",
                Some(config(&format!("http://127.0.0.1:{port}/hook"))),
            ),
        )
        .await
        .unwrap();
    first
        .get(
            None,
            &spool_wire::a2a::TaskRequest {
                id: sent.task.id(),
                history_length: None,
                tenant: None,
                metadata: None,
            },
        )
        .await
        .unwrap();
    closing.send_replace(true);
    runtime.shutdown().await;

    // The next server, its receiver up on the config's port.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let runtime = build();
    runtime.recover().await.unwrap();
    let (_closing, closed) = tokio::sync::watch::channel(false);
    let second = server(&runtime, closed);
    let resumed = second.resume_push().await.unwrap();
    assert_eq!(resumed, 1, "the undelivered config is resumed");
    let (socket, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the next server delivers")
        .unwrap();
    let mut request = String::new();
    let mut reader = BufReader::new(socket);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        request.push_str(&line);
    }
    assert!(request.starts_with("POST /hook"), "{request}");
}
