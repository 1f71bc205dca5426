//! The schedule routes: listing, one schedule with its history, and the
//! trigger route behind its authorizer, decoded strictly.

use std::sync::Arc;

use spool_http::TokenFile;
use spool_runtime::Runtime;
use spool_runtime::schedule::{Clock, ScheduleDefinition, Scheduler};

use crate::client::*;

fn nightly() -> ScheduleDefinition {
    ScheduleDefinition {
        name: "nightly".into(),
        cron: "0 3 1 1 *".into(),
        time_zone: "Europe/Paris".into(),
        text: "Run the nightly checks.".into(),
        address: Some("nightly".into()),
        context: Vec::new(),
        overlap: Default::default(),
        catch_up: Default::default(),
    }
}

/// A server with the `nightly` schedule and a token file holding `ops`
/// (no scopes) and `cron` (the `trigger` scope); returns their tokens.
async fn server() -> (Server, String, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let ops = TokenFile::issue(&path, "ops").unwrap();
    let cron = TokenFile::issue_scoped(&path, "cron", &["trigger"]).unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let runtime = echo_runtime();
    let scheduler = Scheduler::start(&runtime, &[nightly()], Clock::system())
        .await
        .unwrap();
    let server = Server::start_with(runtime, |channel| {
        channel
            .with_schedules(scheduler)
            .with_authenticator(tokens)
            .with_trigger_authorizer(spool_http::token::trigger_authorizer())
    })
    .await;
    (server, ops, cron, dir)
}

async fn get_as(server: &Server, token: &str, path: &str) -> Reply {
    let bearer = format!("Bearer {token}");
    request(
        &server.addr,
        "GET",
        path,
        None,
        &[("Authorization", &bearer)],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedules_are_listed_with_their_definition_and_next_firing() {
    let (server, ops, _, _dir) = server().await;
    let list = get_as(&server, &ops, "/spool/v1/schedules").await;
    assert_eq!(list.status, 200);
    let schedule = &list.json()["schedules"][0];
    assert_eq!(schedule["name"], "nightly");
    assert_eq!(schedule["time_zone"], "Europe/Paris");
    assert_eq!(schedule["overlap"], "skip");
    assert_eq!(schedule["catch_up"], "latest");
    assert!(
        schedule["next_fire_at"]
            .as_str()
            .unwrap()
            .contains("-01-01T02:00:00Z")
    );
    let one = get_as(&server, &ops, "/spool/v1/schedules/nightly").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["history"], serde_json::json!([]));
    let unknown = get_as(&server, &ops, "/spool/v1/schedules/weekly").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["code"], "schedule_not_found");
    assert!(unknown.json()["error"].as_str().unwrap().contains("weekly"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_needs_a_token_with_the_trigger_scope_and_the_listing_says_who_may() {
    let (server, ops, cron, _dir) = server().await;
    let path = "/spool/v1/schedules/nightly/trigger";
    let anonymous = server.post(path, "{}").await;
    assert_eq!(anonymous.status, 401);
    // The listing says which caller may, before it tries.
    let may = |token: String| {
        let server = &server;
        async move { get_as(server, &token, "/spool/v1/schedules").await.json()["can_trigger"].clone() }
    };
    assert_eq!(may(ops.clone()).await, false);
    assert_eq!(may(cron.clone()).await, true);
    let plain = server.post_as(&ops, path, "{}").await;
    assert_eq!(plain.status, 403);
    assert_eq!(plain.json()["code"], "forbidden");
    let fired = server.post_as(&cron, path, "{}").await;
    assert_eq!(fired.status, 202, "{:?}", fired.json());
    assert_eq!(fired.json()["kind"], "manual");
    assert_eq!(fired.json()["status"], "started");
    // The firing's run is the address's, for any client to follow.
    let address = get_as(&server, &ops, "/spool/v1/addresses/nightly").await;
    assert_eq!(address.json()["run_id"], fired.json()["run_id"]);
    let history = get_as(&server, &ops, "/spool/v1/schedules/nightly")
        .await
        .json();
    assert_eq!(history["history"][0]["fire_id"], fired.json()["fire_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_trigger_is_decoded_strictly_and_fires_once_per_id() {
    let (server, _, cron, _dir) = server().await;
    let path = "/spool/v1/schedules/nightly/trigger";
    let body = r#"{"id":"job-7","scheduled_at":"2026-11-30T03:00:00Z","kind":"external"}"#;
    let first = server.post_as(&cron, path, body).await;
    assert_eq!(first.status, 202, "{:?}", first.json());
    assert_eq!(first.json()["fire_id"], "external:job-7");
    assert!(first.header("idempotent-replayed").is_none());
    let again = server.post_as(&cron, path, body).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json(), first.json());
    for bad in [
        r#"{"id":"job-8","scheduled_at":"2026-11-30T03:00:00Z","kind":"external","extra":1}"#,
        r#"{"id":"job-8","kind":"external"}"#,
        r#"{"id":"job-8","scheduled_at":"2026-11-30T03:00:00Z","kind":"cron"}"#,
        r#"{"id":"job-8","scheduled_at":"yesterday","kind":"external"}"#,
        r#"{} {}"#,
        r#"{"unknown":true}"#,
    ] {
        let refused = server.post_as(&cron, path, bad).await;
        assert_eq!(refused.status, 400, "{bad}");
        assert_eq!(refused.json()["code"], "bad_request", "{bad}");
    }
    let unknown = server
        .post_as(&cron, "/spool/v1/schedules/weekly/trigger", "{}")
        .await;
    assert_eq!(unknown.json()["code"], "schedule_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_trigger_authorizer_the_trigger_route_is_not_there() {
    let runtime: Runtime = echo_runtime();
    let scheduler = Scheduler::start(&runtime, &[nightly()], Clock::system())
        .await
        .unwrap();
    let server = Server::start_with(runtime, |channel| channel.with_schedules(scheduler)).await;
    let reply = server
        .post("/spool/v1/schedules/nightly/trigger", "{}")
        .await;
    assert_eq!(reply.status, 404);
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .contains("trigger authorizer")
    );
    // Listing needs no authorizer; a server without schedules lists none.
    assert_eq!(server.get("/spool/v1/schedules").await.status, 200);
    let bare = Server::start(echo_runtime()).await;
    assert_eq!(
        bare.get("/spool/v1/schedules").await.json(),
        serde_json::json!({"schedules": [], "can_trigger": false})
    );
}
