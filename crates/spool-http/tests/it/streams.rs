//! Streams that fall behind, lag, share one reader, and keep their order:
//! the channel's NDJSON streams under load.

use crate::client::*;
use serde_json::{Value, json};

/// A run's stream opened from its first position and then not read while
/// 120 messages of one 60 KB word each are sent: about 180 KB of stream
/// lines a turn (the message, its echo as a delta, the response), far
/// more in all than loopback's socket buffers hold. Returns the run, the
/// stream's cursor and the stream.
async fn stalled_reader(server: &Server) -> (String, u64, Stream) {
    let ensured = server.post("/spool/v1/addresses/slow", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let cursor = ensured["cursor"].as_u64().unwrap();
    let slow = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor={cursor}"),
    )
    .await;
    let big = "x".repeat(60_000);
    for _ in 0..120 {
        let reply = server
            .post(
                &format!("/spool/v1/runs/{run}"),
                &json!({ "text": big }).to_string(),
            )
            .await;
        assert_eq!(reply.status, 200);
    }
    (run, cursor, slow)
}

/// The positions of the durable lines `stream` sends (deltas carry the
/// position before them, not one of their own), each once, until the
/// position `end` or a `lagged` line; returns them and the `lagged` line
/// if that is where it stopped.
async fn durable_positions_to(stream: &mut Stream, end: u64) -> (Vec<u64>, Option<Value>) {
    let mut positions: Vec<u64> = Vec::new();
    while positions.last().is_none_or(|last| *last < end) {
        let line = stream.next().await.expect("the stream is open");
        let kind = line["type"].as_str().unwrap();
        if kind == "lagged" {
            return (positions, Some(line));
        }
        let seq = line["seq"].as_u64().unwrap();
        if !kind.ends_with("_delta") && positions.last() != Some(&seq) {
            positions.push(seq);
        }
    }
    (positions, None)
}

/// The positions of the durable lines after `cursor` up to `end`, as a
/// fresh reader sees them.
async fn fresh_positions(server: &Server, run: &str, cursor: u64, end: u64) -> Vec<u64> {
    let mut stream = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor={cursor}"),
    )
    .await;
    let (positions, lagged) = durable_positions_to(&mut stream, end).await;
    assert!(lagged.is_none(), "a reader that reads does not lag");
    positions
}

/// The run's last position.
async fn last_position(server: &Server, run: &str) -> u64 {
    server.get(&format!("/spool/v1/runs/{run}")).await.json()["cursor"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_held_back_by_its_socket_and_gets_every_event_when_it_reads_again()
 {
    let server = Server::start(echo_runtime()).await;
    // The durable events wait in the journal, not in the server's memory,
    // and the few deltas stay within the hub's queue.
    let (run, cursor, mut slow) = stalled_reader(&server).await;
    let end = last_position(&server, &run).await;
    let (positions, lagged) = durable_positions_to(&mut slow, end).await;
    assert_eq!(
        lagged, None,
        "a stalled reader of durable events is never cut off"
    );
    assert_eq!(
        positions,
        fresh_positions(&server, &run, cursor, end).await,
        "every durable line, once each and in order"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_falls_further_behind_the_live_deltas_than_the_hub_keeps_gets_a_lagged_line_and_resumes_from_it()
 {
    let server = Server::start(echo_runtime()).await;
    // The socket is filled first, so the stream stops being written; then
    // a reply of more words than the hub keeps deltas for a reader.
    let (run, cursor, mut slow) = stalled_reader(&server).await;
    let words = "w ".repeat(spool_runtime::hub::DELTA_QUEUE + 100);
    let reply = server
        .post(
            &format!("/spool/v1/runs/{run}"),
            &json!({ "text": words }).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200);
    let (before, lagged) = durable_positions_to(&mut slow, u64::MAX).await;
    let lagged = lagged.expect("the stream ends with where to resume");
    assert!(
        slow.next().await.is_none(),
        "the stream ends after its lagged line"
    );
    let resume = lagged["seq"].as_u64().unwrap();
    assert!(
        before.last().is_some_and(|last| *last <= resume),
        "{before:?} then {resume}"
    );
    // Resuming from it goes on after it: together the two readers saw
    // every durable line once, in order.
    let mut resumed = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor={resume}"),
    )
    .await;
    let reply = server
        .post(&format!("/spool/v1/runs/{run}"), r#"{"text": "after"}"#)
        .await;
    assert_eq!(reply.status, 200);
    let end = last_position(&server, &run).await;
    let (after, lagged) = durable_positions_to(&mut resumed, end).await;
    assert_eq!(lagged, None);
    let both: Vec<u64> = before.into_iter().chain(after).collect();
    assert_eq!(both, fresh_positions(&server, &run, cursor, end).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_a_run_streams_is_a_known_type_with_run_state_on_each_transition_and_nothing_internal()
 {
    use spool_wire::http::StreamEventType;
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which region?"}}]}
{"tool_calls": [{"id": "c2", "name": "no_such_tool", "arguments": {}}]}
{"text": "Deployed to eu-west-1."}"#;
    let server = Server::start(scripted_runtime(script)).await;
    let ensured = server.post("/spool/v1/addresses/typed", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    let waiting = server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "deploy the secret plan"}"#,
        )
        .await
        .json();
    assert_eq!(waiting["state"], "waiting");
    let turn = waiting["turn_id"].as_str().unwrap();
    let done = server
        .post(
            &format!("/spool/v1/runs/{run}/respond"),
            &json!({"responses": [{"turn_id": turn, "text": "eu-west-1"}]}).to_string(),
        )
        .await;
    assert_eq!(done.json()["state"], "completed");
    let mut lines = Vec::new();
    loop {
        let line = stream.next().await.unwrap();
        let end = line["type"] == "run_state" && line["state"] == "completed";
        lines.push(line);
        if end {
            break;
        }
    }
    let text = serde_json::to_string(&lines).unwrap();
    assert!(
        !text.contains("__spool"),
        "no recorded sentinel reaches a client: {text}"
    );
    for line in &lines {
        let kind = StreamEventType::parse(line["type"].as_str().unwrap());
        assert!(!matches!(kind, StreamEventType::Unknown(_)), "{line}");
    }
    let durable: Vec<(&str, Option<&str>)> = lines
        .iter()
        .filter(|l| !l["type"].as_str().unwrap().ends_with("_delta"))
        .filter(|l| !l["type"].as_str().unwrap().starts_with("tool_call_"))
        .map(|l| (l["type"].as_str().unwrap(), l["state"].as_str()))
        .collect();
    assert_eq!(
        durable,
        [
            ("run_created", Some("pending")),
            ("run_turn", Some("running")),
            ("run_state", Some("running")),
            ("tool_call", None),
            ("run_suspend", Some("waiting")),
            ("run_state", Some("waiting")),
            // The answer is the resume's; no tool result repeats it.
            ("run_resume", Some("running")),
            ("run_state", Some("running")),
            ("tool_call", None),
            ("tool_result", None),
            ("run_response", Some("completed")),
            ("run_state", Some("completed")),
        ],
        "{text}"
    );
    // The user's words appear as the turn's input, never in a model request.
    assert_eq!(text.matches("deploy the secret plan").count(), 1, "{text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_behind_a_running_turn_is_answered_with_the_queued_turns_reply() {
    let script = r#"{"text": "first answer", "delay_ms": 300}
{"text": "second answer"}"#;
    let server = Server::start(scripted_runtime(script)).await;
    let ensured = server.post("/spool/v1/addresses/queue", "").await.json();
    let run = ensured["run_id"].as_str().unwrap().to_owned();
    let mut stream = Stream::open(&server.addr, &format!("/spool/v1/runs/{run}/stream")).await;
    let first = {
        let addr = server.addr.clone();
        let path = format!("/spool/v1/runs/{run}");
        tokio::spawn(async move {
            request(&addr, "POST", &path, Some(br#"{"text": "one"}"#), &[]).await
        })
    };
    // Queued once the first turn runs.
    loop {
        if stream.next().await.unwrap()["type"] == "run_turn" {
            break;
        }
    }
    let queued = server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "two", "turn_policy": "queue"}"#,
        )
        .await;
    assert_eq!(queued.status, 200, "{:?}", queued.json());
    let queued = queued.json();
    let first = first.await.unwrap().json();
    assert_eq!(first["response"], "first answer");
    assert_eq!(queued["state"], "completed");
    assert_eq!(queued["response"], "second answer");
    assert_ne!(
        queued["turn_id"], first["turn_id"],
        "the reply is the queued turn's"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_frees_the_runs_http_addresses_only() {
    let runtime = echo_runtime();
    let pod = runtime.channel("pod").unwrap();
    let server = Server::start(runtime).await;
    let ensured = server.post("/spool/v1/addresses/desk", "").await.json();
    let run = spool_journal::RunId::new(ensured["run_id"].as_str().unwrap()).unwrap();
    pod.attach("desk", &run).await.unwrap();
    let reset = server
        .post(&format!("/spool/v1/runs/{run}/reset"), "{}")
        .await;
    assert_eq!(reset.status, 204);
    assert_eq!(server.get("/spool/v1/addresses/desk").await.status, 404);
    assert_eq!(
        pod.lookup("desk").await.unwrap().run_id,
        run,
        "the pod's address still leads to the run, for the pod to replace"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_parameter_is_percent_decoded_and_refused_when_given_twice() {
    let server = Server::start(echo_runtime()).await;
    let run = server.new_run(r#"{"text": "x"}"#).await;
    let twice = server
        .get(&format!("/spool/v1/runs/{run}/stream?cursor=0&cursor=3"))
        .await;
    assert_eq!(twice.status, 400);
    assert_eq!(twice.json()["code"], "bad_request");
    let mut encoded = Stream::open(
        &server.addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=%30"),
    )
    .await;
    assert_eq!(encoded.status, 200);
    let first = encoded.next().await.unwrap();
    assert!(
        first["seq"].as_u64().unwrap() >= 1,
        "after cursor 0: {first}"
    );
    assert_eq!(
        server.get("/spool/v1/runs?limit=1&limit=2").await.status,
        400
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_of_a_run_gets_the_same_delta_lines_each_between_the_positions_around_it() {
    let server = Server::start(echo_runtime()).await;
    let run = server.post("/spool/v1/addresses/shared", "").await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/spool/v1/runs/{run}/stream");
    let mut first = Stream::open(&server.addr, &path).await;
    let mut second = Stream::open(&server.addr, &path).await;
    server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "one two three four"}"#,
        )
        .await;
    // Each stream's lines up to the turn's end, as sent; the deltas of each.
    let mut deltas = Vec::new();
    for stream in [&mut first, &mut second] {
        let mut own = Vec::new();
        let mut last_durable = 0;
        let mut waiting = Vec::new();
        loop {
            let text = stream.next_text().await.expect("the stream stays open");
            let line: Value = serde_json::from_str(&text).unwrap();
            let seq = line["seq"].as_u64().unwrap();
            if line["type"] == "text_delta" {
                // The last position before it: at or after the durable line
                // before it (a model call's position gives no line) and
                // before the one after it.
                assert!(seq >= last_durable, "{text}");
                waiting.push(seq);
                own.push(text);
            } else {
                assert!(waiting.drain(..).all(|delta| delta < seq), "{text}");
                last_durable = seq;
            }
            if line["type"] == "run_state" && line["state"] == "completed" {
                break;
            }
        }
        deltas.push(own);
    }
    assert!(deltas[0].len() >= 4, "a delta a word: {:?}", deltas[0]);
    assert_eq!(
        deltas[0], deltas[1],
        "the same bytes, time included, on both streams"
    );
    server.stop().await;
}

/// Waits until the runtime has `open` subscriptions; fails the test after
/// [`PATIENCE`].
async fn until_subscriptions(runtime: &spool_runtime::Runtime, open: usize) {
    tokio::time::timeout(PATIENCE, async {
        while runtime.open_streams() != open {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} subscriptions open, not {open}", runtime.open_streams()));
}

/// `count` streams of a new run, opened and then caught up and joined to
/// one reader, and a turn sent; returns each stream's lines up to the
/// turn's end.
async fn one_turn_on_streams(
    runtime: &spool_runtime::Runtime,
    server: &Server,
    count: usize,
) -> (Vec<Stream>, Vec<Vec<String>>) {
    let run = server.post("/spool/v1/addresses/many", "").await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/spool/v1/runs/{run}/stream");
    let mut streams = Vec::new();
    for _ in 0..count {
        streams.push(Stream::open(&server.addr, &path).await);
    }
    // Each read its catch-up on its own, then joined one reader.
    until_subscriptions(runtime, 1).await;
    server
        .post(
            &format!("/spool/v1/runs/{run}"),
            r#"{"text": "one two three"}"#,
        )
        .await;
    let mut seen = Vec::new();
    for stream in &mut streams {
        let mut lines = Vec::new();
        loop {
            let text = stream.next_text().await.expect("the stream stays open");
            let line: Value = serde_json::from_str(&text).unwrap();
            lines.push(text);
            if line["type"] == "run_state" && line["state"] == "completed" {
                break;
            }
        }
        seen.push(lines);
    }
    assert_same_lines_with_deltas(&seen);
    (streams, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caught_up_streams_of_a_run_share_one_subscription_and_each_gets_every_line() {
    let runtime = echo_runtime();
    let server = Server::start(runtime.clone()).await;
    let (streams, _) = one_turn_on_streams(&runtime, &server, 3).await;
    assert_eq!(runtime.open_streams(), 1, "the turn was read once");
    // The reader ends with its last stream.
    drop(streams);
    until_subscriptions(&runtime, 0).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_streams_of_a_run_share_one_reader_and_each_get_every_line() {
    let runtime = echo_runtime();
    let server = Server::start(runtime.clone()).await;
    let (streams, seen) = one_turn_on_streams(&runtime, &server, 100).await;
    assert_eq!(seen.len(), 100);
    drop(streams);
    until_subscriptions(&runtime, 0).await;
    server.stop().await;
}
