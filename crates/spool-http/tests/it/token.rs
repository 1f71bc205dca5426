//! Authentication: the token file, and the channel's use of it.

use std::sync::Arc;

use serde_json::json;
use spool_http::TokenFile;

use crate::client::*;

fn token_file(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let path = dir.join("tokens");
    let token = TokenFile::issue(&path, "ops").unwrap();
    (path, token)
}

#[test]
fn an_issued_token_is_stored_only_as_its_hash_in_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = token_file(dir.path());
    assert_eq!(token.len(), 64);
    let stored = std::fs::read_to_string(&path).unwrap();
    assert!(
        !stored.contains(&token),
        "the token itself is never written"
    );
    assert!(stored.starts_with("ops sha256:"));
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        TokenFile::issue(&path, "ops").is_err(),
        "a name is issued once"
    );
    assert!(TokenFile::issue(&path, "bad name").is_err());
}

#[test]
fn a_token_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = token_file(dir.path());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        TokenFile::load(&path)
            .unwrap_err()
            .to_string()
            .contains("chmod 600")
    );
}

#[test]
fn a_token_file_open_to_its_group_says_its_mode_and_what_they_can_do() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = token_file(dir.path());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o610)).unwrap();
    let refused = TokenFile::load(&path).unwrap_err().to_string();
    assert!(
        refused.contains("mode 0610: its group or others can execute;"),
        "{refused}"
    );
}

#[test]
fn an_empty_token_file_is_refused_since_it_would_lock_everyone_out() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    // Made private, as `spool token new` makes it, and holding only a
    // comment.
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    std::fs::write(&path, "# no tokens yet\n\n").unwrap();
    let refused = TokenFile::load(&path).unwrap_err();
    assert!(
        matches!(refused, spool_http::token::TokenFileError::Empty(_)),
        "{refused}"
    );
    assert!(refused.to_string().contains("spool token new"), "{refused}");
    // The file is still the one `spool token new` fills.
    TokenFile::issue(&path, "ops").unwrap();
    assert!(TokenFile::load(&path).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replays_of_an_operation_answer_at_its_turns_boundary_like_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = token_file(dir.path());
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    // The turn streams slowly, then parks on an approval.
    let script = r#"{"text": "I will ask first, slowly.", "delay_ms": 30, "tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy?"}}]}"#;
    let server = Arc::new(
        Server::start_with(scripted_runtime(script), move |c| {
            c.with_authenticator(tokens)
        })
        .await,
    );
    let body = r#"{"operation_id": "deploy-7", "text": "Deploy."}"#;
    let mut requests = Vec::new();
    for _ in 0..20 {
        let (server, token) = (Arc::clone(&server), token.clone());
        requests.push(tokio::spawn(async move {
            server.post_as(&token, "/spool/v1/runs", body).await.json()
        }));
    }
    let mut runs = std::collections::BTreeSet::new();
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply["state"], "waiting", "{reply}");
        assert_eq!(reply["suspend"]["prompt"], "Deploy?", "{reply}");
        runs.insert(reply["run_id"].to_string());
    }
    assert_eq!(runs.len(), 1, "one run for one operation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_authenticator_every_route_but_health_needs_a_valid_token() {
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = token_file(dir.path());
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server = Server::start_with(echo_runtime(), move |c| c.with_authenticator(tokens)).await;
    assert_eq!(
        server.get("/spool/v1/health").await.status,
        200,
        "health is public"
    );
    assert_eq!(
        server.get("/spool/v1/ready").await.status,
        200,
        "so is readiness"
    );
    // Unknown paths and wrong methods too: without credentials a caller
    // learns nothing, not even which routes exist.
    for (method, path, headers) in [
        ("GET", "/spool/v1/info", vec![]),
        (
            "GET",
            "/spool/v1/runs",
            vec![("Authorization", "Bearer wrong")],
        ),
        (
            "GET",
            "/spool/v1/runs",
            vec![("Authorization", "Basic b3BzOng=")],
        ),
        ("GET", "/spool/v1/nope", vec![]),
        ("DELETE", "/spool/v1/runs", vec![]),
        ("GET", "/elsewhere", vec![]),
    ] {
        let reply = request(&server.addr, method, path, None, &headers).await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (401, json!("unauthenticated")),
            "{path} {headers:?}"
        );
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    }
    let bearer = format!("Bearer {token}");
    let ok = request(
        &server.addr,
        "GET",
        "/spool/v1/info",
        None,
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(ok.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_id_works_under_a_verified_principal_and_ignores_a_body_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = token_file(dir.path());
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server = Server::start_with(echo_runtime(), move |c| c.with_authenticator(tokens)).await;
    let body = r#"{"operation_id": "deploy-42", "text": "Prepare a staging deployment.", "auth": {"Authenticator": "x", "Kind": "x", "ID": "mallory"}}"#;
    let first = server.post_as(&token, "/spool/v1/runs", body).await.json();
    let again = server.post_as(&token, "/spool/v1/runs", body).await.json();
    assert_eq!(
        first["run_id"], again["run_id"],
        "the same key under the same principal returns the saved run"
    );
    let changed = r#"{"operation_id": "deploy-42", "text": "Deploy to production."}"#;
    let replayed = server.post_as(&token, "/spool/v1/runs", changed).await;
    assert_eq!(
        replayed.status, 200,
        "a retry's changed text does not change the admitted operation"
    );
    assert_eq!(replayed.json()["run_id"], first["run_id"]);
    assert_eq!(replayed.json()["response"], first["response"]);
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    server.stop().await;
}

/// An authenticator whose backing service is down.
struct Broken;

impl spool_runtime::Authenticator for Broken {
    fn authenticate<'a>(
        &'a self,
        _credentials: &'a spool_runtime::Credentials,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<Option<spool_journal::Principal>, spool_runtime::AuthError>,
    > {
        Box::pin(async {
            Err(spool_runtime::AuthError::Failed(
                "the identity service at 10.0.0.7 timed out".into(),
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_authenticator_is_500_internal_with_the_detail_only_in_the_log() {
    let logs = logs();
    let server =
        Server::start_with(echo_runtime(), |c| c.with_authenticator(Arc::new(Broken))).await;
    let reply = server.get("/spool/v1/runs").await;
    assert_eq!(
        (reply.status, reply.json()),
        (500, json!({"error": "internal error", "code": "internal"}))
    );
    logs.line_with(&["the authenticator failed", "10.0.0.7 timed out"])
        .await;
    server.stop().await;
}

#[test]
fn an_admin_token_is_marked_in_the_file_and_any_other_third_word_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    TokenFile::issue(&path, "ops").unwrap();
    TokenFile::issue_admin(&path, "root").unwrap();
    let stored = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = stored.lines().collect();
    assert!(lines[0].starts_with("ops sha256:") && !lines[0].ends_with(" admin"));
    assert!(lines[1].starts_with("root sha256:") && lines[1].ends_with(" admin"));
    assert!(TokenFile::load(&path).is_ok());
    std::fs::write(&path, format!("{} owner\n", lines[0])).unwrap();
    let refused = TokenFile::load(&path).unwrap_err().to_string();
    assert!(
        refused.contains("line 1") && refused.contains("admin"),
        "{refused}"
    );
}

/// Three tokens, `alice`, `bob` and the administrator `root`, and a server
/// whose runs belong to their creators.
async fn owned_server(dir: &std::path::Path) -> (Server, [String; 3]) {
    let path = dir.join("tokens");
    let alice = TokenFile::issue(&path, "alice").unwrap();
    let bob = TokenFile::issue(&path, "bob").unwrap();
    let root = TokenFile::issue_admin(&path, "root").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server = Server::start_with(echo_runtime(), |channel| {
        channel
            .with_authenticator(tokens)
            .with_run_access(spool_http::channel::RunAccess::Owner)
    })
    .await;
    (server, [alice, bob, root])
}

async fn as_token(server: &Server, token: &str, method: &str, path: &str, body: &str) -> Reply {
    let bearer = format!("Bearer {token}");
    let body = (method == "POST").then_some(body.as_bytes());
    request(
        &server.addr,
        method,
        path,
        body,
        &[("Authorization", &bearer)],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_owner_access_a_run_exists_only_for_its_creator_and_administrators() {
    let dir = tempfile::tempdir().unwrap();
    let (server, [alice, bob, root]) = owned_server(dir.path()).await;
    let started = as_token(
        &server,
        &alice,
        "POST",
        "/spool/v1/runs",
        r#"{"text": "mine", "address": "alice-desk"}"#,
    )
    .await;
    assert_eq!(started.status, 200, "{:?}", started.json());
    let run = started.json()["run_id"].as_str().unwrap().to_owned();

    // To bob the run does not exist, by any route.
    for (method, path, body) in [
        ("GET", format!("/spool/v1/runs/{run}"), ""),
        (
            "POST",
            format!("/spool/v1/runs/{run}"),
            r#"{"text": "hijack"}"#,
        ),
        ("GET", format!("/spool/v1/runs/{run}/snapshot"), ""),
        ("GET", format!("/spool/v1/runs/{run}/stream"), ""),
        ("POST", format!("/spool/v1/runs/{run}/reset"), "{}"),
        ("POST", format!("/spool/v1/runs/{run}/clear"), "{}"),
        ("POST", format!("/spool/v1/runs/{run}/compact"), "{}"),
        (
            "POST",
            format!("/spool/v1/runs/{run}/respond"),
            r#"{"responses": [{"text": "yes"}]}"#,
        ),
        ("GET", "/spool/v1/addresses/alice-desk".to_owned(), ""),
        ("POST", "/spool/v1/addresses/alice-desk".to_owned(), ""),
        (
            "POST",
            "/spool/v1/runs".to_owned(),
            r#"{"text": "hijack", "address": "alice-desk"}"#,
        ),
    ] {
        let reply = as_token(&server, &bob, method, &path, body).await;
        assert_eq!(reply.status, 404, "{method} {path}: {:?}", reply.json());
        assert_eq!(reply.json()["code"], "run_not_found");
    }
    // Cancel answers as for an unknown run: a harmless no-op.
    let cancel = as_token(
        &server,
        &bob,
        "POST",
        &format!("/spool/v1/runs/{run}/cancel"),
        "{}",
    )
    .await;
    assert_eq!(cancel.status, 200);
    assert_eq!(cancel.json(), json!({"status": "not_active"}));
    let listed = as_token(&server, &bob, "GET", "/spool/v1/runs", "")
        .await
        .json();
    assert_eq!(listed["runs"], json!([]), "bob lists none of alice's runs");

    // Alice and root reach it; bob's own run is his.
    for token in [&alice, &root] {
        let view = as_token(&server, token, "GET", &format!("/spool/v1/runs/{run}"), "").await;
        assert_eq!(view.status, 200);
        let listed = as_token(&server, token, "GET", "/spool/v1/runs", "")
            .await
            .json();
        assert_eq!(listed["runs"][0]["id"], run.as_str());
    }
    let ensured = as_token(&server, &bob, "POST", "/spool/v1/addresses/bob-desk", "").await;
    assert_eq!(ensured.status, 200);
    let bobs = ensured.json()["run_id"].as_str().unwrap().to_owned();
    let view = as_token(
        &server,
        &alice,
        "GET",
        &format!("/spool/v1/runs/{bobs}"),
        "",
    )
    .await;
    assert_eq!(
        view.status, 404,
        "a run made through an address belongs to its maker"
    );
    // Nothing bob sent reached alice's run.
    let snapshot = as_token(
        &server,
        &alice,
        "GET",
        &format!("/spool/v1/runs/{run}/snapshot"),
        "",
    )
    .await;
    assert!(!snapshot.json().to_string().contains("hijack"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_any_admitted_caller_reaches_any_run_as_the_seed_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let alice = TokenFile::issue(&path, "alice").unwrap();
    let bob = TokenFile::issue(&path, "bob").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server =
        Server::start_with(echo_runtime(), |channel| channel.with_authenticator(tokens)).await;
    let run = as_token(
        &server,
        &alice,
        "POST",
        "/spool/v1/runs",
        r#"{"text": "mine"}"#,
    )
    .await
    .json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = as_token(&server, &bob, "GET", &format!("/spool/v1/runs/{run}"), "").await;
    assert_eq!(view.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_deleted_only_by_its_owner_and_then_answers_410_run_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (server, [alice, bob, _root]) = owned_server(dir.path()).await;
    let started = as_token(
        &server,
        &alice,
        "POST",
        "/spool/v1/runs",
        r#"{"text": "forget me"}"#,
    )
    .await;
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let path = format!("/spool/v1/runs/{run}");

    let refused = as_token(&server, &bob, "DELETE", &path, "").await;
    assert_eq!(
        (refused.status, refused.json()["code"].clone()),
        (404, serde_json::json!("run_not_found")),
        "to another caller the run does not exist, to delete either"
    );
    assert_eq!(
        as_token(&server, &alice, "GET", &path, "").await.status,
        200
    );

    let bad = as_token(
        &server,
        &alice,
        "DELETE",
        &format!("{path}?force=maybe"),
        "",
    )
    .await;
    assert_eq!(
        (bad.status, bad.json()["code"].clone()),
        (400, serde_json::json!("bad_request"))
    );

    let deleted = as_token(&server, &alice, "DELETE", &path, "").await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.json());
    let tombstone = deleted.json();
    assert_eq!(tombstone["run_id"], serde_json::json!(run));
    assert_eq!(tombstone["by"], serde_json::json!("alice"));
    assert!(tombstone["events"].as_u64().unwrap() > 0);

    for route in [
        path.clone(),
        format!("{path}/snapshot"),
        format!("{path}/events"),
    ] {
        let gone = as_token(&server, &alice, "GET", &route, "").await;
        assert_eq!(
            (gone.status, gone.json()["code"].clone()),
            (410, serde_json::json!("run_deleted")),
            "{route}"
        );
    }
    let again = as_token(&server, &alice, "DELETE", &path, "").await;
    assert_eq!(
        again.status, 410,
        "a deleted run is gone to a second DELETE too"
    );
    let listed = as_token(&server, &alice, "GET", "/spool/v1/runs", "").await;
    assert!(
        !listed.json()["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| row["id"] == serde_json::json!(run)),
        "the listing no longer holds it"
    );
}
