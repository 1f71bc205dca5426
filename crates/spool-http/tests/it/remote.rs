//! `spool_http::Client`, the channel's own client (a hyper client), against
//! the real server: JSON calls, stable error codes, streams, tokens and
//! Unix sockets.

use std::sync::Arc;

use serde_json::{Value, json};
use spool_http::{Client, ClientError, TokenFile};
use spool_wire::http::{AddressReply, StreamEventType};

use crate::client::{PATIENCE, Server, echo_runtime, scripted_runtime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_streams_a_run_subscribed_before_its_first_turn() {
    let server = Server::start(echo_runtime()).await;
    let client = Client::new(&format!("http://{}", server.addr)).unwrap();
    let ensured: AddressReply = client
        .post("/addresses/team%2Fone", &json!({}))
        .await
        .unwrap();
    let mut lines = client
        .stream(&ensured.run_id, ensured.cursor)
        .await
        .unwrap();
    let reply: Value = client
        .post(&format!("/runs/{}", ensured.run_id), &json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(reply["response"], "echo: hi");
    let response = tokio::time::timeout(PATIENCE, async {
        loop {
            let event = lines.next().await.unwrap().expect("the stream stays open");
            if event.kind == StreamEventType::RunResponse {
                return event;
            }
        }
    })
    .await
    .expect("the response arrives on the stream");
    assert_eq!(response.text.as_deref(), Some("echo: hi"));
    assert_eq!(response.run_id, ensured.run_id);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reports_an_error_reply_with_its_status_and_stable_code() {
    let server = Server::start(echo_runtime()).await;
    let client = Client::new(&format!("http://{}/spool/v1", server.addr)).unwrap();
    let missing = client
        .get::<Value>("/runs/run_01aaaaaaaaaaaaaaaaaaaaaaaa")
        .await
        .unwrap_err();
    assert!(
        matches!(&missing, ClientError::Reply { status: 404, code, .. } if code == "run_not_found"),
        "{missing:?}"
    );
    let stream = client.stream("not a run id", None).await.unwrap_err();
    assert!(
        matches!(&stream, ClientError::Reply { status: 400, code, .. } if code == "invalid_run_id"),
        "{stream:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_sends_its_token_and_is_refused_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let token = TokenFile::issue(&path, "ops").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server = Server::start_with(echo_runtime(), move |c| c.with_authenticator(tokens)).await;
    let url = format!("http://{}", server.addr);
    let refused = Client::new(&url)
        .unwrap()
        .get::<Value>("/info")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ClientError::Reply { status: 401, code, .. } if code == "unauthenticated"),
        "{refused:?}"
    );
    let info: Value = Client::new(&url)
        .unwrap()
        .with_token(token)
        .get("/info")
        .await
        .unwrap();
    assert!(info["version"].is_string(), "{info}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reaches_a_server_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.sock");
    let server = Server::start_unix(&path);
    let client = Client::new(&format!("unix:{}", path.display())).unwrap();
    let reply: Value = client
        .post("/runs", &json!({"text": "over a socket"}))
        .await
        .unwrap();
    assert_eq!(reply["response"], "echo: over a socket");
    server.stop().await;
}

#[test]
fn a_url_that_is_not_http_https_or_unix_is_refused() {
    for url in [
        "ftp://host",
        "https://",
        "https://user@host",
        "https://host:notaport",
        "http://",
        "localhost:8080",
    ] {
        assert!(
            matches!(Client::new(url), Err(ClientError::Url(_))),
            "{url} is accepted"
        );
    }
    for url in [
        "https://host",
        "https://host:8443/spool",
        "https://[::1]:443",
    ] {
        assert!(Client::new(url).is_ok(), "{url} is refused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_typed_methods_drive_a_run_through_an_address_with_a_slash() {
    use spool_wire::http::{Answer, Cancel, MessageRun, Respond};
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"text": "deploying to eu-west-1"}"#;
    let server = Server::start(scripted_runtime(script)).await;
    let client = spool_http::Client::new(&format!("http://{}", server.addr)).unwrap();
    let ensured = client.ensure("browser/42").await.unwrap();
    assert_eq!(client.lookup("browser/42").await.unwrap(), ensured);
    let waiting = client
        .message(
            &ensured.run_id,
            &MessageRun {
                text: "deploy".into(),
                ..MessageRun::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(waiting.state, spool_wire::http::RunState::Waiting);
    let done = client
        .respond(
            &ensured.run_id,
            &Respond {
                responses: vec![Answer {
                    text: "eu-west-1".into(),
                    turn_id: waiting.turn_id.clone(),
                    approved: None,
                }],
            },
        )
        .await
        .unwrap();
    assert_eq!(done.response.as_deref(), Some("deploying to eu-west-1"));
    assert_eq!(client.run(&ensured.run_id).await.unwrap(), done);
    assert!(
        !client
            .snapshot(&ensured.run_id)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    let cancel = client
        .cancel(&ensured.run_id, &Cancel::default())
        .await
        .unwrap();
    assert_eq!(cancel.status, spool_wire::http::CancelStatus::NotActive);
    client.clear(&ensured.run_id).await.unwrap();
    client
        .reset(&ensured.run_id, &spool_wire::http::Reset::default())
        .await
        .unwrap();
    let gone = client.lookup("browser/42").await.unwrap_err();
    assert!(
        matches!(gone, spool_http::ClientError::Reply { status: 404, .. }),
        "{gone:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_over_a_unix_socket_written_by_their_own_tasks_get_every_line_of_a_turn() {
    use spool_wire::http::{RunState, StreamEventType};
    // No shared socket here: a joined stream's batches are queued for its
    // connection's task to write.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.sock");
    let server = Server::start_unix(&path);
    let client = Client::new(&format!("unix:{}", path.display())).unwrap();
    let ensured: Value = client.post("/addresses/queued", &json!({})).await.unwrap();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let mut first = client.stream(&run, None).await.unwrap();
    let mut second = client.stream(&run, None).await.unwrap();
    let _: Value = client
        .post(&format!("/runs/{run}"), &json!({"text": "one two three"}))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for stream in [&mut first, &mut second] {
        let mut lines = Vec::new();
        loop {
            let line = tokio::time::timeout(PATIENCE, stream.next())
                .await
                .expect("the turn's lines come in time")
                .unwrap()
                .expect("the stream stays open");
            let done =
                line.kind == StreamEventType::RunState && line.state == Some(RunState::Completed);
            lines.push(serde_json::to_string(&line).unwrap());
            if done {
                break;
            }
        }
        seen.push(lines);
    }
    crate::client::assert_same_lines_with_deltas(&seen);
    server.stop().await;
}
