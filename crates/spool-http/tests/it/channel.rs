//! The channel's routes, each clause of its document.

use serde_json::{Value, json};

use crate::client::*;

fn ask() -> &'static str {
    r#"{"tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy to staging?"}}]}
{"text": "Deployed to staging."}"#
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_runs_answers_at_the_turns_boundary_with_response_and_usage() {
    let server = Server::start(echo_runtime()).await;
    let reply = server
        .post(
            "/spool/v1/runs",
            r#"{"text": "Summarize the plan.", "title": "Plan"}"#,
        )
        .await;
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!(body["state"], "completed");
    assert_eq!(body["response"], "echo: Summarize the plan.");
    assert!(body["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert!(body["turn_id"].is_string() && body["cursor"].is_u64());
    let run = body["run_id"].as_str().unwrap();
    let got = server.get(&format!("/spool/v1/runs/{run}")).await;
    assert_eq!(got.json()["response"], "echo: Summarize the plan.");
    let listed = server.get("/spool/v1/runs").await.json();
    assert_eq!(listed["runs"][0]["id"], run);
    assert_eq!(listed["runs"][0]["title"], "Plan");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_replies_with_its_suspend_refuses_messages_and_clear_and_is_answered_through_respond()
 {
    let server = Server::start(scripted_runtime(ask())).await;
    let waiting = server
        .post("/spool/v1/runs", r#"{"text": "deploy"}"#)
        .await
        .json();
    assert_eq!(waiting["state"], "waiting");
    assert_eq!(waiting["suspend"]["kind"], "approval");
    assert_eq!(waiting["suspend"]["prompt"], "Deploy to staging?");
    assert_eq!(waiting["suspend"]["tool_call_id"], "c1");
    let run = waiting["run_id"].as_str().unwrap();
    let turn = waiting["suspend"]["turn_id"].as_str().unwrap();
    let message = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "hello?"}"#)
        .await;
    assert_eq!(
        (message.status, message.json()["code"].clone()),
        (409, json!("run_waiting"))
    );
    let clear = server
        .post(&format!("/spool/v1/runs/{run}/clear"), "")
        .await;
    assert_eq!(
        (clear.status, clear.json()["code"].clone()),
        (409, json!("run_active"))
    );
    let stale = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            r#"{"responses":[{"turn_id":"turn_old","text":"ok","approved":true}]}"#,
        )
        .await;
    assert_eq!(
        (stale.status, stale.json()["code"].clone()),
        (409, json!("run_not_waiting"))
    );
    let done = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            &format!(r#"{{"responses":[{{"turn_id":"{turn}","text":"yes","approved":true}}]}}"#),
        )
        .await;
    assert_eq!(done.status, 200);
    assert_eq!(done.json()["state"], "completed");
    assert_eq!(done.json()["response"], "Deployed to staging.");
    let again = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            r#"{"responses":[{"text":"more"}]}"#,
        )
        .await;
    assert_eq!(
        (again.status, again.json()["code"].clone()),
        (409, json!("run_not_waiting"))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_run_id_is_400_invalid_run_id_and_an_unknown_one_is_404() {
    let server = Server::start(echo_runtime()).await;
    let bad = server.get("/spool/v1/runs/not%20valid").await;
    assert_eq!(
        (bad.status, bad.json()["code"].clone()),
        (400, json!("invalid_run_id"))
    );
    let unknown = server.get("/spool/v1/runs/run-404").await;
    assert_eq!(
        (unknown.status, unknown.json()["code"].clone()),
        (404, json!("run_not_found"))
    );
    let message = server
        .post("/spool/v1/runs/run-404", r#"{"text": "hi"}"#)
        .await;
    assert_eq!(
        message.status, 404,
        "id-addressed routes never create a run"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_use_the_channels_codes() {
    let server = Server::start(echo_runtime()).await;
    let cases: [(&str, u16, &str); 4] = [
        (
            r#"{"text": "x", "turn_policy": "interrupt"}"#,
            400,
            "unknown_turn_policy",
        ),
        (
            r#"{"text": "x", "operation_id": "op-1"}"#,
            400,
            "bad_request",
        ),
        (
            r#"{"text": "x", "address": "a", "operation_id": "op-1"}"#,
            400,
            "bad_request",
        ),
        ("{not json", 400, "bad_request"),
    ];
    for (body, status, code) in cases {
        let reply = server.post("/spool/v1/runs", body).await;
        assert_eq!(
            (
                reply.status,
                reply.json()["code"].as_str().unwrap().to_owned()
            ),
            (status, code.to_owned()),
            "{body}"
        );
        assert!(reply.json()["error"].is_string());
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_is_ensured_without_a_turn_and_looked_up_with_slashes_encoded() {
    let server = Server::start(echo_runtime()).await;
    let missing = server.get("/spool/v1/addresses/browser%2F42").await;
    assert_eq!(missing.status, 404);
    let ensured = server
        .post("/spool/v1/addresses/browser%2F42", "")
        .await
        .json();
    assert_eq!(ensured["cursor"], 0);
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        server.get(&format!("/spool/v1/runs/{run}")).await.json()["state"],
        "pending"
    );
    let found = server.get("/spool/v1/addresses/browser%2F42").await.json();
    assert_eq!(found["run_id"], run);
    let through = server
        .post(
            "/spool/v1/runs",
            r#"{"address": "browser/42", "text": "hi"}"#,
        )
        .await
        .json();
    assert_eq!(
        through["run_id"], run,
        "a message through the address goes to its run"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_catching_up_from_a_cursor_writes_the_lines_already_read_together() {
    let server = Server::start(echo_runtime()).await;
    let ensured = server.post("/spool/v1/addresses/batched", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    for turn in 0..3 {
        let reply = server
            .post(
                &format!("/spool/v1/runs/{run}"),
                &format!(r#"{{"text": "turn {turn}"}}"#),
            )
            .await
            .json();
        assert_eq!(reply["state"], "completed");
    }
    let mut stream = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=0"),
    )
    .await;
    // The history is read at once, so it leaves in one write, not one per line.
    assert!(stream.next_frame_lines().await > 1);
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        let line = stream.next().await.unwrap();
        if line["type"] == "run_response" {
            seqs.push(line["seq"].as_u64().unwrap());
        }
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

#[tokio::test]
async fn a_stream_from_a_cursor_replays_then_goes_live_across_turns() {
    let server = Server::start(echo_runtime()).await;
    let ensured = server.post("/spool/v1/addresses/live", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let mut stream = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=0"),
    )
    .await;
    assert_eq!(stream.status, 200);
    let content_type = stream
        .headers
        .iter()
        .find(|(n, _)| n == "content-type")
        .map(|(_, v)| v.clone());
    assert_eq!(content_type.as_deref(), Some("application/x-ndjson"));
    assert!(
        stream
            .headers
            .iter()
            .any(|(n, v)| n == "cache-control" && v == "no-store")
    );
    let reply = server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "hello stream"}"#,
        )
        .await
        .json();
    assert_eq!(reply["state"], "completed");
    let mut durable = Vec::new();
    let mut text = String::new();
    loop {
        let line = stream.next().await.unwrap();
        match line["type"].as_str().unwrap() {
            "text_delta" => text.push_str(line["text"].as_str().unwrap()),
            kind => {
                durable.push((line["seq"].as_u64().unwrap(), kind.to_owned()));
                if kind == "run_state" && line["state"] == "completed" {
                    break;
                }
            }
        }
    }
    assert!(durable[0].0 > 0, "strictly after the cursor: {durable:?}");
    assert_eq!(
        durable,
        durable_lines_after(&server.addr, &run, 0, "completed").await,
        "the same lines a full read has after the cursor: no gap, no duplicate"
    );
    assert_eq!(
        text, "echo: hello stream",
        "the answer streamed as it was made"
    );
    server.stop().await;
}

/// The durable lines (seq and type) a full read of the run's stream has
/// after `cursor`, up to the `run_state` line with `state`.
async fn durable_lines_after(
    addr: &str,
    run: &str,
    cursor: u64,
    state: &str,
) -> Vec<(u64, String)> {
    let mut stream = Stream::open(addr, &format!("/spool/v1/runs/{run}/stream")).await;
    let mut lines = Vec::new();
    loop {
        let line = stream.next().await.unwrap();
        let seq = line["seq"].as_u64().unwrap();
        let kind = line["type"].as_str().unwrap().to_owned();
        if seq > cursor && !kind.ends_with("_delta") {
            lines.push((seq, kind.clone()));
        }
        if seq > cursor && kind == "run_state" && line["state"] == state {
            return lines;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_past_the_runs_last_position_is_400_never_a_replay_from_the_start() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "x"}"#).await;
    let last = server.get(&format!("/spool/v1/runs/{run}")).await.json()["cursor"]
        .as_u64()
        .unwrap();
    for cursor in [last + 1, u64::MAX] {
        let reply = server
            .get(&format!("/spool/v1/runs/{run}/stream?cursor={cursor}"))
            .await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (400, json!("bad_request")),
            "{cursor}"
        );
        assert!(
            reply.json()["error"].as_str().unwrap().contains("past"),
            "{}",
            reply.json()
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_that_are_not_utf8_malformed_or_overlong_are_400_and_never_collide() {
    let server = Server::start(echo_runtime()).await;
    let long = "a".repeat(513);
    for raw in ["%ff%fe", "%80%80", "%fe%ff", "%zz", "x%4"] {
        let reply = server
            .post(&format!("/spool/v1/addresses/{raw}"), "{}")
            .await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (400, json!("bad_request")),
            "{raw}"
        );
    }
    // Over the limit every transport shares, with its own code.
    let reply = server
        .post(&format!("/spool/v1/addresses/{long}"), "{}")
        .await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (400, json!("address_too_long"))
    );
    let cafe = server.post("/spool/v1/addresses/caf%C3%A9", "{}").await;
    assert_eq!(cafe.status, 200, "an encoded UTF-8 address is fine");
    let plain = server.post("/spool/v1/addresses/cafe", "{}").await;
    assert_ne!(cafe.json()["run_id"], plain.json()["run_id"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_that_is_not_a_non_negative_integer_is_400() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "x"}"#).await;
    for cursor in ["-1", "abc", "1.5"] {
        let reply = server
            .get(&format!("/spool/v1/runs/{run}/stream?cursor={cursor}"))
            .await;
        assert_eq!(
            (reply.status, reply.json()["code"].clone()),
            (400, json!("bad_request")),
            "{cursor}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answers_not_active_with_200_for_idle_and_unknown_runs() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "x"}"#).await;
    for target in [run.as_str(), "run-unknown"] {
        let reply = server
            .post(&format!("/spool/v1/runs/{target}/cancel"), "")
            .await;
        assert_eq!(
            (reply.status, reply.json()["status"].clone()),
            (200, json!("not_active")),
            "{target}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_waiting_run_is_202_requested_and_it_ends_cancelled() {
    let server = Server::start(scripted_runtime(ask())).await;
    let waiting = server
        .post("/spool/v1/runs", r#"{"text": "deploy"}"#)
        .await
        .json();
    let run = waiting["run_id"].as_str().unwrap();
    let turn = waiting["turn_id"].as_str().unwrap();
    let stale = server
        .post(
            &format!("/spool/v1/runs/{run}/cancel"),
            r#"{"turn_id": "turn_old"}"#,
        )
        .await;
    assert_eq!(
        (stale.status, stale.json()["status"].clone()),
        (200, json!("stale"))
    );
    let requested = server
        .post(
            &format!("/spool/v1/runs/{run}/cancel"),
            &format!(r#"{{"turn_id": "{turn}"}}"#),
        )
        .await;
    assert_eq!(
        (requested.status, requested.json()["status"].clone()),
        (202, json!("requested"))
    );
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    loop {
        let line = stream.next().await.unwrap();
        if line["state"] == "cancelled" {
            break;
        }
    }
    assert_eq!(
        server.get(&format!("/spool/v1/runs/{run}")).await.json()["state"],
        "cancelled"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_clear_answer_204_and_compact_without_engine_support_is_501() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "x", "address": "desk"}"#).await;
    assert_eq!(
        server
            .post(&format!("/spool/v1/runs/{run}/clear"), "")
            .await
            .status,
        204
    );
    let compact = server
        .post(&format!("/spool/v1/runs/{run}/compact"), "")
        .await;
    assert_eq!(
        (compact.status, compact.json()["code"].clone()),
        (501, json!("compaction_unsupported"))
    );
    assert_eq!(
        server
            .post(
                &format!("/spool/v1/runs/{run}/reset"),
                r#"{"reason": "Start a separate task"}"#
            )
            .await
            .status,
        204
    );
    assert_eq!(
        server.get(&format!("/spool/v1/runs/{run}")).await.json()["state"],
        "retired"
    );
    let again = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "more"}"#)
        .await;
    assert_eq!(
        (again.status, again.json()["code"].clone()),
        (409, json!("run_retired"))
    );
    assert_eq!(
        server.get("/spool/v1/addresses/desk").await.status,
        404,
        "reset frees the address"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_has_messages_state_and_cursor_and_is_not_cached() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "remember"}"#).await;
    let reply = server.get(&format!("/spool/v1/runs/{run}/snapshot")).await;
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let body = reply.json();
    assert_eq!(body["state"], "completed");
    let roles: Vec<Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].clone())
        .collect();
    assert_eq!(roles, [json!("user"), json!("assistant")]);
    assert!(body["cursor"].is_u64());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_names_the_version_and_the_mounted_channel() {
    let server =
        Server::start_with(echo_runtime(), |c| c.with_agent(Some("reviewer".into()))).await;
    let info = server.get("/spool/v1/info").await.json();
    assert_eq!(info["agent"], "reviewer");
    assert_eq!(info["channels"], json!(["http"]));
    assert!(info["version"].is_string());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_turn_does_not_stop_the_turn_and_is_logged_499() {
    let logs = logs();
    let server = Server::start(scripted_runtime(
        r#"{"text": "a slow and steady answer", "delay_ms": 50}"#,
    ))
    .await;
    let run = server.post("/spool/v1/addresses/leaver", "").await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let body = r#"{"text": "go"}"#;
    let head = format!(
        "POST /spool/v1/runs/{run} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    // Once the answer is streaming, the client goes away.
    loop {
        let line = stream.next().await.expect("the stream stays open");
        if line["type"] == "text_delta" {
            break;
        }
    }
    drop(socket);
    loop {
        let line = stream.next().await.expect("the stream stays open");
        if line["type"] == "run_response" {
            assert_eq!(line["text"], "a slow and steady answer");
            break;
        }
    }
    let logged = logs
        .line_with(&[&format!("path=\"/spool/v1/runs/{run}\""), "status=499"])
        .await;
    assert!(logged.contains("code=\"client_closed\""), "{logged}");
    // Every request gets its line: the stream's too.
    logs.line_with(&[
        &format!("path=\"/spool/v1/runs/{run}/stream\""),
        "status=200",
    ])
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumes_from_its_cursor_on_a_restarted_server_with_no_gap() {
    let journal: std::sync::Arc<dyn spool_journal::Journal> =
        std::sync::Arc::new(spool_journal::store::memory::MemoryJournal::new());
    let first =
        Server::start(spool_runtime::Runtime::builder(std::sync::Arc::clone(&journal)).build())
            .await;
    let run = first.new_run(r#"{"text": "one"}"#).await;
    let seen = first.get(&format!("/spool/v1/runs/{run}")).await.json()["cursor"]
        .as_u64()
        .unwrap();
    first
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "two"}"#)
        .await;
    first.stop().await;
    let second = Server::start(spool_runtime::Runtime::builder(journal).build()).await;
    let mut stream = Stream::open(
        &second.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor={seen}"),
    )
    .await;
    let mut durable = Vec::new();
    loop {
        let line = stream.next().await.unwrap();
        durable.push((
            line["seq"].as_u64().unwrap(),
            line["type"].as_str().unwrap().to_owned(),
        ));
        if line["type"] == "run_state" && line["state"] == "completed" {
            break;
        }
    }
    assert_eq!(
        durable,
        durable_lines_after(&second.addr, &run, seen, "completed").await,
        "the same lines a full read has after the cursor"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_lines_keep_the_channels_field_order() {
    let server = Server::start(echo_runtime()).await;
    let run = server.post("/spool/v1/addresses/ordered", "").await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "hi"}"#)
        .await;
    let mut kinds = Vec::new();
    loop {
        let line = stream.next_text().await.unwrap();
        assert!(
            line.starts_with(&format!(r#"{{"run_id":"{run}","seq":"#)),
            "{line}"
        );
        let after_seq = line
            .split_once(r#","type":""#)
            .map(|(head, _)| head)
            .unwrap();
        assert!(
            !after_seq.contains(r#""time""#),
            "type comes before time: {line}"
        );
        let kind = line
            .split(r#""type":""#)
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_owned();
        kinds.push(kind.clone());
        if kind == "run_response" {
            break;
        }
    }
    assert!(
        kinds.contains(&"text_delta".to_owned()),
        "deltas keep the order too: {kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_runs_pages_through_every_run_once_newest_first() {
    let server = Server::start(echo_runtime()).await;
    let mut started = Vec::new();
    for n in 0..7 {
        started.push(server.new_run(&format!(r#"{{"text": "run {n}"}}"#)).await);
    }
    let mut seen = Vec::new();
    let mut path = "/spool/v1/runs?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = server.get(&path).await;
        assert_eq!(page.status, 200);
        let page = page.json();
        let runs = page["runs"].as_array().unwrap();
        assert!(runs.len() <= 3);
        seen.extend(runs.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        pages += 1;
        match page["next"].as_str() {
            Some(next) => path = format!("/spool/v1/runs?limit=3&after={next}"),
            None => break,
        }
    }
    assert_eq!(pages, 3, "7 runs in pages of 3");
    started.reverse();
    assert_eq!(seen, started, "every run once, the last started first");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_runs_refuses_a_bad_limit_or_after_with_bad_request() {
    let server = Server::start(echo_runtime()).await;
    let paths = ["limit=0", "limit=1001", "limit=ten", "after=nonsense"]
        .map(|query| format!("/spool/v1/runs?{query}"));
    server.refuses_as_bad_requests(&paths).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_upload_is_501_files_unsupported_and_starts_nothing() {
    let server = Server::start(echo_runtime()).await;
    // Refused on its Content-Type, before any of the body is read.
    let reply = request(
        &server.addr,
        "POST",
        "/spool/v1/runs",
        None,
        &[
            ("Content-Type", "multipart/form-data; boundary=x"),
            ("Content-Length", "0"),
        ],
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (501, json!("files_unsupported"))
    );
    let listed = server.get("/spool/v1/runs").await.json();
    assert_eq!(listed["runs"], json!([]), "no run was made");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_in_run_requests_are_tolerated() {
    let server = Server::start(echo_runtime()).await;
    let started = server
        .post(
            "/spool/v1/runs",
            r#"{"text": "hi", "files": [], "priority": 3, "auth": {"ID": "me", "Extra": true}}"#,
        )
        .await;
    assert_eq!(started.status, 200, "{:?}", started.json());
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let message = server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "again", "title": "ignored here", "x": null}"#,
        )
        .await;
    assert_eq!(message.status, 200, "{:?}", message.json());
    assert_eq!(message.json()["response"], "echo: again");
    server.stop().await;
}

#[test]
fn runtime_error_kinds_map_to_the_channels_codes_and_statuses() {
    use spool_http::channel::error_code;
    use spool_journal::{JournalError, RunId, Seq, TurnId};
    use spool_runtime::{ErrorKind, RuntimeError};
    use spool_wire::http::ErrorCode;
    let moved = RuntimeError::Journal(JournalError::Conflict {
        run: RunId::new("r").unwrap(),
        expected: Seq(3),
        actual: Seq(4),
    });
    assert_eq!(error_code(moved.kind()), ErrorCode::RunOwnedElsewhere);
    assert_eq!(error_code(moved.kind()).status(), Some(409));
    let full = RuntimeError::Journal(JournalError::storage("disk full"));
    assert_eq!(error_code(full.kind()), ErrorCode::JournalUnavailable);
    assert_eq!(error_code(full.kind()).status(), Some(503));
    let busy = RuntimeError::TurnInProgress {
        run: RunId::new("r").unwrap(),
        turn: TurnId::new("t").unwrap(),
    };
    assert_eq!(error_code(busy.kind()), ErrorCode::RunActive);
    assert_eq!(
        error_code(ErrorKind::AddressNotFound),
        ErrorCode::RunNotFound
    );
    assert_eq!(error_code(ErrorKind::InvalidAnswer), ErrorCode::BadRequest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_turn_id_is_malformed_is_400_and_cancels_nothing() {
    let server = Server::start(scripted_runtime(ask())).await;
    let waiting = server
        .post("/spool/v1/runs", r#"{"text": "deploy"}"#)
        .await
        .json();
    let run = waiting["run_id"].as_str().unwrap();
    let refused = server
        .post(
            &format!("/spool/v1/runs/{run}/cancel"),
            r#"{"turn_id": "not a turn!"}"#,
        )
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["code"], "bad_request");
    let view = server.get(&format!("/spool/v1/runs/{run}")).await.json();
    assert_eq!(
        view["state"], "waiting",
        "the waiting run was not cancelled"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_respond_whose_answers_name_different_turns_is_400_and_records_nothing() {
    let server = Server::start(scripted_runtime(ask())).await;
    let waiting = server
        .post("/spool/v1/runs", r#"{"text": "deploy"}"#)
        .await
        .json();
    let run = waiting["run_id"].as_str().unwrap();
    let turn = waiting["turn_id"].as_str().unwrap();
    let body = json!({"responses": [
        {"turn_id": turn, "text": "yes", "approved": true},
        {"turn_id": "turn_other", "text": "no", "approved": false},
    ]});
    let refused = server
        .post(&format!("/spool/v1/runs/{run}/respond"), &body.to_string())
        .await;
    assert_eq!(refused.status, 400, "{:?}", refused.json());
    assert_eq!(refused.json()["code"], "bad_request");
    let malformed =
        json!({"responses": [{"turn_id": "not a turn!", "text": "yes", "approved": true}]});
    let refused = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            &malformed.to_string(),
        )
        .await;
    assert_eq!(refused.status, 400, "{:?}", refused.json());
    let view = server.get(&format!("/spool/v1/runs/{run}")).await.json();
    assert_eq!(view["state"], "waiting");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_an_empty_id_is_no_route_and_an_unknown_address_404_names_it() {
    let server = Server::start(echo_runtime()).await;
    let empty = server.get("/spool/v1/runs/").await;
    assert_eq!(empty.status, 404);
    assert_eq!(empty.json()["code"], "run_not_found");
    let unknown = server.get("/spool/v1/addresses/desk-9").await;
    assert_eq!(unknown.status, 404);
    assert!(
        unknown.json()["error"].as_str().unwrap().contains("desk-9"),
        "{:?}",
        unknown.json()
    );
    server.stop().await;
}
