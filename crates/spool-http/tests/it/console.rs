//! What the web console reads: the run list's rows, filters and count,
//! a run's journal with its timings, answers before a turn's end
//! (`Prefer: respond-async`), and the console's own files.

use std::sync::Arc;

use serde_json::{Value, json};
use spool_http::TokenFile;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::Runtime;
use spool_runtime::agent::Pricing;

use crate::client::*;

/// A runtime on `script` priced at $3 and $15 per million tokens.
fn priced(script: &str) -> Runtime {
    Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(
            spool_runtime::engines::ScriptedEngine::from_jsonl(script).unwrap(),
        ))
        .pricing(Pricing {
            input_per_million: 3.0,
            output_per_million: 15.0,
        })
        .build()
}

fn approval() -> &'static str {
    r#"{"tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy to staging?"}}]}
{"text": "Deployed."}"#
}

async fn list(server: &Server, query: &str) -> Value {
    let reply = server.get(&format!("/spool/v1/runs?{query}")).await;
    assert_eq!(
        reply.status,
        200,
        "{query}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

fn ids(page: &Value) -> Vec<String> {
    page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_run_carries_its_address_turns_tokens_cost_and_failure_code() {
    let server = Server::start(priced(
        r#"{"text": "first", "usage": {"input_tokens": 1000, "output_tokens": 100}}
{"error": "the provider is down"}"#,
    ))
    .await;
    let started = server
        .post(
            "/spool/v1/runs",
            r#"{"text": "hello", "address": "desk-1", "title": "Desk"}"#,
        )
        .await
        .json();
    let run = started["run_id"].as_str().unwrap();
    let failed = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "again"}"#)
        .await
        .json();
    assert_eq!(failed["state"], "failed", "{failed}");
    let page = list(&server, "").await;
    let row = &page["runs"][0];
    assert_eq!(page["total"], 1);
    assert_eq!(row["id"], run);
    assert_eq!(row["title"], "Desk");
    assert_eq!(row["address"], "desk-1");
    assert_eq!(row["turns"], 2);
    assert_eq!(
        row["usage"],
        json!({"input_tokens": 1000, "output_tokens": 100})
    );
    // 1000 × $3/M + 100 × $15/M = $0.0045.
    assert_eq!(row["cost_usd"], 0.0045);
    assert_eq!(row["failure"]["code"], "provider_error", "{row}");
    assert!(
        row["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("the provider is down"),
        "{row}"
    );
    assert_eq!(row["cursor"], failed["cursor"]);
    assert!(row["created"].is_string() && row["updated"].is_string());
    let summary = server.get(&format!("/spool/v1/runs/{run}/summary")).await;
    assert_eq!(summary.status, 200);
    assert_eq!(&summary.json(), row, "a run's summary is its listed row");
    let unknown = server.get("/spool/v1/runs/run-404/summary").await;
    assert_eq!(unknown.status, 404);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_filters_by_state_kind_and_search_counts_the_matches_and_pages_oldest_first() {
    let server = Server::start(scripted_runtime(approval())).await;
    let alpha = server
        .new_run(r#"{"text": "a", "title": "Alpha report"}"#)
        .await;
    let beta = server
        .new_run(r#"{"text": "b", "title": "Beta", "address": "Support/42"}"#)
        .await;
    let gamma = server.new_run(r#"{"text": "c", "title": "Gamma"}"#).await;
    // Beta is answered and completes; Alpha and Gamma wait.
    let answered = server
        .post(
            &format!("/spool/v1/runs/{beta}/respond"),
            r#"{"responses": [{"approved": true}]}"#,
        )
        .await;
    assert_eq!(answered.json()["state"], "completed");

    let waiting = list(&server, "state=waiting").await;
    assert_eq!(waiting["total"], 2);
    let row = &waiting["runs"][0];
    assert_eq!(row["suspend"]["kind"], "approval");
    assert_eq!(row["suspend"]["prompt"], "Deploy to staging?");
    assert_eq!(
        row["call"],
        json!({"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy to staging?"}}),
        "the parked call is shown with its arguments"
    );
    assert_eq!(list(&server, "kind=approval").await["total"], 2);
    assert_eq!(list(&server, "kind=question,signal").await["total"], 0);
    assert_eq!(
        ids(&list(&server, "state=completed,failed").await),
        std::slice::from_ref(&beta)
    );
    assert_eq!(
        ids(&list(&server, "q=ALPHA").await),
        std::slice::from_ref(&alpha),
        "a title, any case"
    );
    assert_eq!(
        ids(&list(&server, "q=support%2F4").await),
        std::slice::from_ref(&beta),
        "an address"
    );
    assert_eq!(
        ids(&list(&server, &format!("q={}", &gamma[4..])).await),
        std::slice::from_ref(&gamma),
        "a run id"
    );
    assert_eq!(list(&server, "q=nothing-like-it").await["total"], 0);
    // As a browser's form writes it: `+` for a space, `%2B` for a plus.
    assert_eq!(
        ids(&list(&server, "q=alpha+REPORT").await),
        std::slice::from_ref(&alpha)
    );
    assert_eq!(list(&server, "q=alpha%2Breport").await["total"], 0);

    // Oldest first, one a page: the inbox's walk.
    let first = list(&server, "state=waiting&order=oldest&limit=1").await;
    assert_eq!(
        (ids(&first), first["total"].clone()),
        (vec![alpha.clone()], json!(2))
    );
    let next = first["next"].as_str().unwrap();
    let second = list(
        &server,
        &format!("state=waiting&order=oldest&limit=1&after={next}"),
    )
    .await;
    assert_eq!(ids(&second), std::slice::from_ref(&gamma));
    assert!(second.get("next").is_none(), "{second}");

    let paths = [
        "state=asleep".to_owned(),
        "kind=nap".to_owned(),
        "order=sideways".to_owned(),
        format!("q={}", "x".repeat(257)),
    ]
    .map(|query| format!("/spool/v1/runs?{query}"));
    server.refuses_as_bad_requests(&paths).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_journal_is_paged_in_order_with_each_calls_duration_tokens_and_cost() {
    let server = Server::start(priced(
        r#"{"text": "thinking it over", "delay_ms": 20, "usage": {"input_tokens": 1000, "output_tokens": 100}}"#,
    ))
    .await;
    let started = server
        .post("/spool/v1/runs", r#"{"text": "go"}"#)
        .await
        .json();
    let run = started["run_id"].as_str().unwrap();
    let last = started["cursor"].as_u64().unwrap();
    let mut seen = Vec::new();
    let mut path = format!("/spool/v1/runs/{run}/events?limit=2");
    loop {
        let reply = server.get(&path).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("cache-control"), Some("no-store"));
        let page = reply.json();
        let events = page["events"].as_array().unwrap().clone();
        assert!(events.len() <= 2);
        seen.extend(events);
        match page["next"].as_u64() {
            Some(next) => path = format!("/spool/v1/runs/{run}/events?limit=2&after={next}"),
            None => break,
        }
    }
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (0..=last).collect::<Vec<_>>(),
        "every event once, in order"
    );
    let kinds: Vec<&str> = seen.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "run_created",
            "turn_started",
            "model_call_requested",
            "model_call_completed",
            "turn_completed"
        ]
    );
    let completed = &seen[3];
    // Two words at 20 ms each: the call took at least that long.
    assert!(
        completed["duration_ms"].as_u64().unwrap() >= 20,
        "{completed}"
    );
    assert_eq!(
        completed["usage"],
        json!({"input_tokens": 1000, "output_tokens": 100})
    );
    assert_eq!(completed["cost_usd"], 0.0045);
    assert_eq!(completed["turn_id"], started["turn_id"]);
    assert_eq!(seen[1]["data"]["input"], "go", "the payload as recorded");
    assert!(seen[0].get("turn_id").is_none(), "no turn before the first");

    let paths = ["after=-1", "limit=0", "limit=1001"]
        .map(|query| format!("/spool/v1/runs/{run}/events?{query}"));
    server.refuses_as_bad_requests(&paths).await;
    let unknown = server.get("/spool/v1/runs/run-404/events").await;
    assert_eq!(
        (unknown.status, unknown.json()["code"].clone()),
        (404, json!("run_not_found"))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_respond_async_answers_202_once_recorded_and_the_stream_shows_the_turn() {
    let words = (0..30)
        .map(|n| format!("w{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "{}\n{}\n",
        json!({"tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Go?"}}]}),
        json!({"text": words, "delay_ms": 20})
    );
    let server = Server::start(scripted_runtime(&script)).await;
    let prefer = [("Prefer", "respond-async")];
    let started = request(
        &server.addr,
        "POST",
        "/spool/v1/runs",
        Some(br#"{"text": "go"}"#),
        &prefer,
    )
    .await;
    assert_eq!(started.status, 202);
    assert_eq!(started.header("preference-applied"), Some("respond-async"));
    let body = started.json();
    let run = body["run_id"].as_str().unwrap().to_owned();
    assert!(body["turn_id"].is_string(), "{body}");
    // The suspension arrives on the stream, after the reply.
    let mut stream = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=0"),
    )
    .await;
    let suspend = loop {
        let line = stream.next().await.expect("the stream goes on");
        if line["type"] == "run_suspend" {
            break line;
        }
    };
    let turn = suspend["turn_id"].as_str().unwrap();
    let answered = request(
        &server.addr,
        "POST",
        &format!("/spool/v1/runs/{run}/respond"),
        Some(format!(r#"{{"responses":[{{"turn_id":"{turn}","approved":true}}]}}"#).as_bytes()),
        &prefer,
    )
    .await;
    assert_eq!(
        answered.status,
        202,
        "{}",
        String::from_utf8_lossy(&answered.body)
    );
    assert_eq!(
        answered.json()["state"],
        "running",
        "answered before the turn ends"
    );
    let response = loop {
        let line = stream.next().await.expect("the stream goes on");
        if line["type"] == "run_response" {
            break line;
        }
    };
    assert_eq!(response["text"], words);
    // Without the preference the seed's answer at the boundary stands.
    let plain = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "again"}"#)
        .await;
    assert_eq!(plain.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_without_a_token_under_a_strict_policy_and_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    TokenFile::issue(&path, "ops").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let server = Server::start_with(echo_runtime(), move |c| {
        c.with_authenticator(tokens).with_console()
    })
    .await;
    let page = server.get("/").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let policy = page.header("content-security-policy").unwrap();
    assert!(policy.contains("script-src 'self'") && policy.contains("connect-src 'self'"));
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let html = String::from_utf8(page.body.clone()).unwrap();
    // Nothing inline for the policy to allow: every script has a source,
    // no element carries a style or a handler.
    assert!(!html.contains("<script>") && !html.contains(" style=") && !html.contains(" onclick="));
    // Every file the page names is served, with its type; its modules
    // import only each other.
    let mut named: Vec<&str> = html
        .split(['"', '\''])
        .filter(|part| part.starts_with("/console/"))
        .collect();
    named.sort_unstable();
    named.dedup();
    assert!(named.contains(&"/console/app.js") && named.contains(&"/console/style.css"));
    for asset in spool_http::console::paths().filter(|p| *p != "/") {
        let reply = server.get(asset).await;
        assert_eq!(reply.status, 200, "{asset}");
        let kind = reply.header("content-type").unwrap();
        let expected = match asset.rsplit('.').next() {
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            _ => "image/svg+xml",
        };
        assert_eq!(kind, expected, "{asset}");
        if asset.ends_with(".js") {
            let text = String::from_utf8(reply.body.clone()).unwrap();
            for import in text.lines().filter(|l| l.starts_with("import ")) {
                let from = import.rsplit('"').nth(1).unwrap();
                let served = format!("/console/{}", from.trim_start_matches("./"));
                assert!(
                    spool_http::console::paths().any(|p| p == served),
                    "{asset} imports {from}, which is not served"
                );
            }
        }
    }
    // The data behind it still needs the token.
    assert_eq!(server.get("/spool/v1/runs").await.status, 401);
    let post = request(&server.addr, "POST", "/", Some(b"{}"), &[]).await;
    assert_eq!(
        (post.status, post.header("allow")),
        (405, Some("GET, HEAD"))
    );
    server.stop().await;

    let without = Server::start(echo_runtime()).await;
    let reply = without.get("/").await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (404, json!("run_not_found"))
    );
    without.stop().await;
}

#[test]
fn the_console_docs_state_the_bytes_its_first_load_ships() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/console.md"
    ))
    .unwrap();
    let bytes = spool_http::console::first_load_bytes().to_string();
    // Written with a comma between thousands, as the docs write numbers.
    let (thousands, rest) = bytes.split_at(bytes.len() - 3);
    let stated = format!("{thousands},{rest} bytes");
    assert!(
        docs.contains(&stated),
        "docs/console.md should state the first load's {stated}"
    );
}
