//! On a cluster, a command reaching a node that does not drive its run is
//! forwarded to the node that does, and the client gets that node's reply.

use std::sync::Arc;

use spool_http::{Placement, TokenFile};
use spool_journal::RunId;
use spool_runtime::{BoxFuture, RuntimeError};

use crate::client::{Server, echo_runtime, request};

/// A placement that puts every run on the node at one address.
struct On(String);

impl Placement for On {
    fn elsewhere<'a>(
        &'a self,
        _run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<String>, RuntimeError>> {
        Box::pin(async move { Ok(Some(self.0.clone())) })
    }
}

fn placed_on(addr: &str) -> Arc<dyn Placement> {
    Arc::new(On(addr.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sent_to_another_node_is_answered_by_the_runs_node_with_its_reply_and_credentials()
 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let token = TokenFile::issue(&path, "ops").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let a = Server::start_with(echo_runtime(), {
        let tokens = tokens.clone();
        move |c| c.with_authenticator(tokens)
    })
    .await;
    // B has a journal of its own: the run exists on A only, so any answer
    // about it that B gives came from A.
    let placement = placed_on(&a.addr);
    let b = Server::start_with(echo_runtime(), move |c| {
        c.with_authenticator(tokens).with_placement(placement)
    })
    .await;
    let run = a
        .post_as(&token, "/spool/v1/runs", r#"{"text": "one"}"#)
        .await
        .json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let through_b = b
        .post_as(
            &token,
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "two"}"#,
        )
        .await;
    assert_eq!(through_b.status, 200, "{:?}", through_b.json());
    assert_eq!(through_b.json()["response"], "echo: two");
    assert_eq!(through_b.json()["run_id"], run.as_str());
    assert_eq!(through_b.header("content-type"), Some("application/json"));

    // The same command straight to A and through B: the same bytes.
    let cancel = format!("/spool/v1/runs/{run}/cancel");
    let direct = a.post_as(&token, &cancel, "").await;
    let forwarded = b.post_as(&token, &cancel, "").await;
    assert_eq!(
        (forwarded.status, &forwarded.body),
        (direct.status, &direct.body)
    );
    assert_eq!(direct.json()["status"], "not_active");

    // A drove both turns.
    let view = request(
        &a.addr,
        "GET",
        &format!("/spool/v1/runs/{run}"),
        None,
        &[("Authorization", &format!("Bearer {token}"))],
    )
    .await;
    assert_eq!(view.json()["response"], "echo: two");

    // B's authenticator still stands first: no token, no forwarding.
    let refused = b
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "x"}"#)
        .await;
    assert_eq!(refused.status, 401);
    a.stop().await;
    b.stop().await;
}

/// Sends a message to a run through `node` and checks the reply is
/// `503 node_unavailable` with `Retry-After: 1`; its error text.
async fn node_unavailable(node: &Server) -> String {
    let reply = node
        .post(
            "/spool/v1/runs/run_01aaaaaaaaaaaaaaaaaaaaaaaa",
            r#"{"text": "x"}"#,
        )
        .await;
    assert_eq!(reply.status, 503, "{:?}", reply.json());
    assert_eq!(reply.json()["code"], "node_unavailable");
    assert_eq!(reply.header("retry-after"), Some("1"));
    reply.json()["error"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_reach_the_runs_node_answers_503_node_unavailable() {
    // A port nobody listens on any more.
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = gone.local_addr().unwrap().to_string();
    drop(gone);
    let placement = placed_on(&addr);
    let b = Server::start_with(echo_runtime(), move |c| c.with_placement(placement)).await;
    let error = node_unavailable(&b).await;
    assert!(error.contains(&addr), "{error}");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_command_is_answered_where_it_lands_never_sent_on_again() {
    let a = Server::start(echo_runtime()).await;
    let run = a.new_run(r#"{"text": "one"}"#).await;
    let placement = placed_on(&a.addr);
    let b = Server::start_with(echo_runtime(), move |c| c.with_placement(placement)).await;
    // Marked as forwarded already: B answers itself, and does not know
    // the run.
    let reply = request(
        &b.addr,
        "POST",
        &format!("/spool/v1/runs/{run}"),
        Some(br#"{"text": "two"}"#),
        &[("spool-forwarded", "1")],
    )
    .await;
    assert_eq!(reply.status, 404, "{:?}", reply.json());
    assert_eq!(reply.json()["code"], "run_not_found");
    // Reads are answered where they land, from the node's journal.
    let read = b.get(&format!("/spool/v1/runs/{run}")).await;
    assert_eq!(read.status, 404);
    a.stop().await;
    b.stop().await;
}

/// A placement that puts every run on one node until the run moves (its
/// first answer only).
struct MovesAway {
    addr: String,
    asked: std::sync::atomic::AtomicUsize,
}

impl Placement for MovesAway {
    fn elsewhere<'a>(
        &'a self,
        _run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<String>, RuntimeError>> {
        let first = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        Box::pin(async move { Ok(first.then(|| self.addr.clone())) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waiting_on_a_node_that_stopped_answering_ends_when_its_run_moves() {
    // A node that takes the connection and never answers: paused.
    let paused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let placement: Arc<dyn Placement> = Arc::new(MovesAway {
        addr: paused.local_addr().unwrap().to_string(),
        asked: std::sync::atomic::AtomicUsize::new(0),
    });
    let b = Server::start_with(echo_runtime(), move |c| c.with_placement(placement)).await;
    let error = node_unavailable(&b).await;
    assert!(
        error.contains("may or may not have been recorded"),
        "{error}"
    );
    drop(paused);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browsers_command_forwarded_to_the_runs_node_is_answered_with_its_origins_cors() {
    let a = Server::start(echo_runtime()).await;
    let run = a.new_run(r#"{"text": "one"}"#).await;
    let placement = placed_on(&a.addr);
    let b = Server::start_with(echo_runtime(), move |c| {
        c.with_placement(placement).with_guard(
            spool_http::guard::Guard::new()
                .allow_origin("http://app.example")
                .unwrap(),
        )
    })
    .await;
    // From B's own page, and from an origin B allows: A, which allows
    // neither, answers B's forwarded command as the node's, not the page's.
    for origin in [
        format!("http://{}", b.addr),
        "http://app.example".to_owned(),
    ] {
        let reply = request(
            &b.addr,
            "POST",
            &format!("/spool/v1/runs/{run}"),
            Some(br#"{"text": "two"}"#),
            &[("Origin", &origin)],
        )
        .await;
        assert_eq!(reply.status, 200, "{origin}: {:?}", reply.json());
        assert_eq!(reply.json()["response"], "echo: two");
        let cors = reply.header("access-control-allow-origin");
        if origin == "http://app.example" {
            assert_eq!(cors, Some("http://app.example"));
        } else {
            assert_eq!(cors, None, "a same-origin reply needs none");
        }
    }
    a.stop().await;
    b.stop().await;
}
