//! `docs/openapi.json` lists exactly the routes the router serves, and the
//! server serves every one of them; host routes mount beside Spool's.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use spool_http::channel::ROUTES;

use crate::client::*;

const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

#[test]
fn the_openapi_document_lists_exactly_the_routes_the_router_serves() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["servers"][0]["url"], "/spool/v1");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, served);
}

#[test]
fn the_openapi_document_lists_every_stream_line_type_and_error_code_the_wire_knows() {
    use spool_wire::http::{ErrorCode, StreamEventType};
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let listed = |schema: &str, field: &str| -> BTreeSet<String> {
        doc["components"]["schemas"][schema]["properties"][field]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let types: BTreeSet<String> = StreamEventType::KNOWN
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    assert_eq!(listed("StreamEvent", "type"), types);
    let codes: BTreeSet<String> = ErrorCode::KNOWN
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    assert_eq!(listed("Error", "code"), codes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_route_is_served() {
    // With a host's reload, so `/agent/reload` is served (to an
    // administrator; this caller is refused, which is routed).
    let server = Server::start_with(echo_runtime(), |channel| {
        channel.with_reload(std::sync::Arc::new(|| {
            Box::pin(async { Ok(spool_wire::http::AgentReloaded::default()) })
        }))
    })
    .await;
    let run = server.new_run(r#"{"text": "x"}"#).await;
    for (method, template) in ROUTES {
        // A deletion on a run of its own: the others' routes need theirs.
        let run = if *method == "DELETE" {
            server.new_run(r#"{"text": "x"}"#).await
        } else {
            run.clone()
        };
        let path = format!(
            "/spool/v1{}",
            template
                .replace("{id}", &run)
                .replace("{address}", "somewhere")
        );
        if template.ends_with("/stream") {
            let stream = Stream::open(&server.addr, &path).await;
            assert_eq!(stream.status, 200, "{method} {path}");
            continue;
        }
        let body = if *method == "POST" {
            Some(br#"{"text": "y"}"#.as_slice())
        } else {
            None
        };
        let reply = request(&server.addr, method, &path, body, &[]).await;
        assert_ne!(reply.status, 405, "{method} {path}");
        if reply.status == 404 {
            assert!(
                !reply.json()["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("no route"),
                "{method} {path} is not routed"
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_mounts_its_own_routes_beside_spools_and_the_authenticator_covers_them() {
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let token = spool_http::TokenFile::issue(&tokens_path, "ops").unwrap();
    let tokens = Arc::new(spool_http::TokenFile::load(&tokens_path).unwrap());
    let hook: spool_http::server::Handler = Arc::new(|_request| {
        Box::pin(async {
            spool_http::body::json(http::StatusCode::OK, &serde_json::json!({"slack": "ok"}))
        })
    });
    let server = Server::start_with(echo_runtime(), move |c| {
        c.with_authenticator(tokens).mount("/slack", hook).unwrap()
    })
    .await;
    assert_eq!(
        server.get("/slack/events").await.status,
        401,
        "a host route is authenticated too"
    );
    let bearer = format!("Bearer {token}");
    let ok = request(
        &server.addr,
        "GET",
        "/slack/events",
        None,
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(
        (ok.status, ok.json()),
        (200, serde_json::json!({"slack": "ok"}))
    );
    let elsewhere = request(
        &server.addr,
        "GET",
        "/slackers",
        None,
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(elsewhere.status, 404, "a prefix matches whole segments");
    let info = request(
        &server.addr,
        "GET",
        "/spool/v1/info",
        None,
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(
        info.json()["channels"],
        serde_json::json!(["http", "/slack"]),
        "/info names the mounted channels"
    );
    server.stop().await;
}

#[test]
fn the_spool_namespace_is_reserved_for_spools_routes() {
    let (_, closing) = tokio::sync::watch::channel(false);
    let handler: spool_http::server::Handler =
        Arc::new(|_| Box::pin(async { spool_http::body::empty(http::StatusCode::OK) }));
    for prefix in ["/spool/v1/mine", "/spool", "relative", "/"] {
        let channel = spool_http::HttpChannel::new(echo_runtime(), closing.clone());
        assert!(
            channel.mount(prefix, Arc::clone(&handler)).is_err(),
            "{prefix}"
        );
    }
}
