//! The JSON-RPC dispatcher, driven as a client would: envelopes in, the
//! connection's outbox read back.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use spool_journal::RunId;
use spool_journal::store::memory::MemoryJournal;
use spool_rpc::{Connection, Dispatcher, Outgoing};
use spool_runtime::Runtime;
use spool_runtime::engines::ScriptedEngine;
use tokio::sync::mpsc;

mod access;
mod http;
mod spans;
#[path = "../../../spool-http/tests/support/spans.rs"]
mod spans_support;
mod state;
mod upgrade;

const PATIENCE: Duration = Duration::from_secs(20);

fn echo() -> Runtime {
    Runtime::builder(Arc::new(MemoryJournal::new())).build()
}

fn scripted(script: &str) -> Runtime {
    Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .build()
}

struct Client {
    connection: Connection,
    outgoing: mpsc::Receiver<Outgoing>,
}

impl Client {
    fn new(runtime: &Runtime) -> Self {
        let (connection, outgoing) = Dispatcher::new(runtime.clone()).connect(None);
        Self {
            connection,
            outgoing,
        }
    }

    async fn send(&self, message: Value) {
        self.connection.receive(&message.to_string()).await;
    }

    /// The next thing the server sends, as JSON.
    async fn next(&mut self) -> Value {
        let message = tokio::time::timeout(PATIENCE, self.outgoing.recv())
            .await
            .expect("the server answers in time")
            .expect("the connection is open");
        serde_json::from_str(&message.to_json()).unwrap()
    }

    /// Everything sent until the response with `id`, and that response.
    async fn until_response(&mut self, id: i64) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let message = self.next().await;
            if message["id"] == id && message.get("method").is_none() {
                return (before, message);
            }
            before.push(message);
        }
    }

    async fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.until_response(id).await.1
    }
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|m| m["method"] == "events.append")
        .map(|m| m["params"]["spool.kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn submit_run_streams_the_turns_events_then_answers_with_the_run_reply() {
    let runtime = echo();
    let mut client = Client::new(&runtime);
    client
        .send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "submit.run", "params": {"text": "hello"}}),
        )
        .await;
    let (events, reply) = client.until_response(1).await;
    let result = &reply["result"];
    assert_eq!(result["state"], "completed");
    assert_eq!(result["response"], "echo: hello");
    let run = RunId::new(result["run_id"].as_str().unwrap()).unwrap();
    let kinds = kinds(&events);
    for (expected, before) in [
        ("run:start", "task:start"),
        ("task:start", "task:complete"),
        ("task:complete", "run:end"),
    ] {
        let a = kinds
            .iter()
            .position(|k| k == expected)
            .unwrap_or_else(|| panic!("{expected} in {kinds:?}"));
        let b = kinds
            .iter()
            .position(|k| k == before)
            .unwrap_or_else(|| panic!("{before} in {kinds:?}"));
        assert!(a < b, "{expected} before {before}: {kinds:?}");
    }
    assert!(
        kinds.contains(&"task:stdout".to_owned()),
        "the answer streamed: {kinds:?}"
    );
    let trace = spool_rpc::events::trace_id(&run);
    for event in events.iter().filter(|m| m["method"] == "events.append") {
        assert_eq!(event["params"]["traceId"], trace.as_str());
        let valid = spool_wire::validate::validate(
            spool_wire::validate::Kind::WireEvent,
            &event["params"].to_string(),
        );
        assert!(valid.is_ok(), "{valid:?}");
    }
}

#[tokio::test]
async fn a_parked_turn_answers_waiting_and_run_respond_resumes_it() {
    let runtime = scripted(
        r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"Deploying to eu-west-1."}"#,
    );
    let mut client = Client::new(&runtime);
    let parked = client
        .call(1, "submit.run", json!({"text": "deploy"}))
        .await;
    assert_eq!(parked["result"]["state"], "waiting", "{parked}");
    assert_eq!(parked["result"]["suspend"]["prompt"], "Which region?");
    let run = parked["result"]["run_id"].clone();
    let turn = parked["result"]["turn_id"].clone();
    let answered = client
        .call(
            2,
            "run.respond",
            json!({"run_id": run, "turn_id": turn, "responses": [{"text": "eu-west-1"}]}),
        )
        .await;
    assert!(answered.get("result").is_some(), "{answered}");
    let run_id = RunId::new(run.as_str().unwrap()).unwrap();
    let turn_id = spool_journal::TurnId::new(turn.as_str().unwrap()).unwrap();
    tokio::time::timeout(PATIENCE, runtime.wait_for(&run_id, &turn_id))
        .await
        .unwrap()
        .unwrap();
    let done = client.call(3, "run.get", json!({"run_id": run})).await;
    assert_eq!(done["result"]["state"], "completed");
    assert_eq!(done["result"]["response"], "Deploying to eu-west-1.");
    let snapshot = client
        .call(4, "state.snapshot", json!({"run_id": run}))
        .await;
    assert!(
        snapshot["result"]["messages"].as_array().unwrap().len() >= 2,
        "{snapshot}"
    );
}

#[tokio::test]
async fn run_respond_takes_the_turn_inside_each_answer_as_the_http_channel_does_and_refuses_two_turns()
 {
    let runtime = scripted(
        r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"Deploying to eu-west-1."}"#,
    );
    let mut client = Client::new(&runtime);
    let parked = client
        .call(1, "submit.run", json!({"text": "deploy"}))
        .await;
    let run = parked["result"]["run_id"].clone();
    let turn = parked["result"]["turn_id"].clone();
    // Two turns named: refused, and nothing is answered.
    let refused = client
        .call(
            2,
            "run.respond",
            json!({"run_id": run, "turn_id": "turn_other", "responses": [{"text": "eu-west-1", "turn_id": turn}]}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let waiting = client.call(3, "run.get", json!({"run_id": run})).await;
    assert_eq!(waiting["result"]["state"], "waiting");
    // A stale turn inside the answer is the stale turn it is.
    let stale = client
        .call(
            4,
            "run.respond",
            json!({"run_id": run, "responses": [{"text": "eu-west-1", "turn_id": "turn_stale"}]}),
        )
        .await;
    assert_eq!(stale["error"]["data"]["code"], "run_not_waiting", "{stale}");
    // The seed's shape: the turn inside the answer.
    let answered = client
        .call(
            5,
            "run.respond",
            json!({"run_id": run, "responses": [{"text": "eu-west-1", "turn_id": turn}]}),
        )
        .await;
    assert!(answered.get("result").is_some(), "{answered}");
    let run_id = RunId::new(run.as_str().unwrap()).unwrap();
    let turn_id = spool_journal::TurnId::new(turn.as_str().unwrap()).unwrap();
    tokio::time::timeout(PATIENCE, runtime.wait_for(&run_id, &turn_id))
        .await
        .unwrap()
        .unwrap();
    let done = client.call(6, "run.get", json!({"run_id": run})).await;
    assert_eq!(done["result"]["response"], "Deploying to eu-west-1.");
}

#[tokio::test]
async fn errors_use_the_seeds_codes_and_carry_the_http_channels_code() {
    let runtime =
        scripted(r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"?"}}]}"#);
    let mut client = Client::new(&runtime);
    let unknown = client.call(1, "run.teleport", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601);
    let extra = client
        .call(2, "run.get", json!({"run_id": "r", "extra": 1}))
        .await;
    assert_eq!(extra["error"]["code"], -32602);
    let missing = client
        .call(3, "run.get", json!({"run_id": "run-nope"}))
        .await;
    assert_eq!(missing["error"]["code"], -32002);
    assert_eq!(missing["error"]["data"]["code"], "run_not_found");
    let parked = client.call(4, "submit.run", json!({"text": "go"})).await;
    let run = parked["result"]["run_id"].clone();
    let busy = client
        .call(5, "submit.run", json!({"text": "again", "run_id": run}))
        .await;
    assert_eq!(busy["error"]["code"], -32000, "{busy}");
    assert_eq!(busy["error"]["data"]["code"], "run_waiting");
    client.connection.receive("{not json").await;
    let parse = client.next().await;
    assert_eq!(parse["error"]["code"], -32700);
    assert_eq!(parse["id"], Value::Null);
    // A notification is never answered, even one that fails.
    client
        .send(json!({"jsonrpc": "2.0", "method": "run.teleport"}))
        .await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 6, "method": "ping"}))
        .await;
    let (between, pong) = client.until_response(6).await;
    assert!(
        between.is_empty(),
        "nothing answered the notification: {between:?}"
    );
    assert_eq!(pong["result"], "pong");
}

#[tokio::test]
async fn a_batch_is_answered_in_one_array_without_its_notifications() {
    let runtime = echo();
    let mut client = Client::new(&runtime);
    client
        .connection
        .receive(
            &json!([
                {"jsonrpc": "2.0", "id": "a", "method": "ping"},
                {"jsonrpc": "2.0", "method": "ping"},
                {"jsonrpc": "2.0", "id": "b", "method": "getCapabilities"},
                {"nonsense": true}
            ])
            .to_string(),
        )
        .await;
    let batch = client.next().await;
    let replies = batch.as_array().expect("one array");
    assert_eq!(replies.len(), 3, "{batch}");
    assert_eq!(replies[0]["id"], "a");
    assert_eq!(replies[1]["id"], "b");
    assert_eq!(replies[1]["result"]["protocol"], "1.0");
    assert_eq!(replies[2]["error"]["code"], -32600);
    client.connection.receive("[]").await;
    assert_eq!(client.next().await["error"]["code"], -32600);
}

#[tokio::test]
async fn subscribe_sends_a_runs_events_from_a_cursor_and_unsubscribe_ends_them() {
    let runtime = echo();
    let mut client = Client::new(&runtime);
    let first = client.call(1, "submit.run", json!({"text": "one"})).await;
    let run = first["result"]["run_id"].clone();
    let cursor = first["result"]["cursor"].clone();
    // From the start: the first turn's events, from the journal.
    let subscribed = client
        .call(2, "subscribe", json!({"run_id": run, "cursor": null}))
        .await;
    assert_eq!(subscribed["result"]["subscribed"], run);
    let mut seen = Vec::new();
    while !seen.contains(&"run:end".to_owned()) {
        let message = client.next().await;
        seen.extend(kinds(&[message]));
    }
    // A bad channel is refused.
    let bad = client
        .call(
            3,
            "subscribe",
            json!({"run_id": run, "channels": ["spool:nope"]}),
        )
        .await;
    assert_eq!(bad["error"]["code"], -32602);
    let ended = client.call(4, "unsubscribe", json!({"run_id": run})).await;
    assert_eq!(ended["result"]["unsubscribed"], true);
    assert!(cursor.as_u64().is_some());
}

#[tokio::test]
async fn unsubscribing_from_one_channel_of_two_keeps_the_other() {
    let runtime = echo();
    let mut driver = Client::new(&runtime);
    let first = driver.call(1, "submit.run", json!({"text": "one"})).await;
    let run = first["result"]["run_id"].clone();
    let mut follower = Client::new(&runtime);
    let subscribed = follower
        .call(
            1,
            "subscribe",
            json!({"run_id": run, "cursor": first["result"]["cursor"], "channels": ["spool:events", "spool:state"]}),
        )
        .await;
    assert_eq!(
        subscribed["result"]["channels"],
        json!(["spool:events", "spool:state"])
    );
    let left = follower
        .call(
            2,
            "unsubscribe",
            json!({"run_id": run, "channels": ["spool:events"]}),
        )
        .await;
    assert_eq!(left["result"]["unsubscribed"], true, "{left}");
    assert_eq!(left["result"]["channels"], json!(["spool:state"]));
    // The next turn reaches the follower as state patches only.
    let second = driver
        .call(2, "submit.run", json!({"text": "two", "run_id": run}))
        .await;
    let end = second["result"]["cursor"].as_u64().unwrap();
    loop {
        let message = follower.next().await;
        assert_ne!(message["method"], "events.append", "{message}");
        if message["method"] == "state.patch" && message["params"]["to"].as_u64() == Some(end) {
            break;
        }
    }
    // Leaving the last channel ends the subscription.
    let ended = follower
        .call(
            3,
            "unsubscribe",
            json!({"run_id": run, "channels": ["vx:state"]}),
        )
        .await;
    assert_eq!(ended["result"]["unsubscribed"], true, "{ended}");
    assert_eq!(ended["result"]["channels"], json!([]));
    let again = follower
        .call(4, "unsubscribe", json!({"run_id": run}))
        .await;
    assert_eq!(again["result"]["unsubscribed"], false, "{again}");
}

#[tokio::test]
async fn closing_a_connection_answers_the_requests_in_progress_first() {
    let runtime = echo();
    let mut client = Client::new(&runtime);
    client.send(json!({"jsonrpc": "2.0", "id": 1, "method": "submit.run", "params": {"text": "last words"}})).await;
    client.connection.close().await;
    let (_, reply) = client.until_response(1).await;
    assert_eq!(reply["result"]["response"], "echo: last words");
}

#[test]
fn trace_and_span_ids_are_valid_otlp_ids_derived_from_the_run() {
    let run = RunId::new("run-1").unwrap();
    let trace = spool_rpc::events::trace_id(&run);
    assert_eq!(trace.len(), 32);
    assert!(
        trace
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(trace, "0".repeat(32));
    assert_eq!(
        trace,
        spool_rpc::events::trace_id(&run),
        "the same on every call"
    );
    assert_ne!(
        trace,
        spool_rpc::events::trace_id(&RunId::new("run-2").unwrap())
    );
    let span = spool_rpc::events::span_id(&run, "tool:c1");
    assert_eq!(span.len(), 16);
    assert_ne!(span, spool_rpc::events::span_id(&run, "tool:c2"));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_floods_requests_without_reading_is_read_no_faster_than_it_is_answered() {
    let runtime = echo();
    let mut client = Client::new(&runtime);
    let ping = |id: usize| json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string();
    // The outbox fills, then the requests in flight wait on it.
    let taken = spool_rpc::OUTBOX + spool_rpc::MAX_IN_FLIGHT;
    for id in 0..taken {
        client.connection.receive(&ping(id)).await;
    }
    // One more is not taken while nobody reads (paused time: the timeout
    // fires as soon as everything waits).
    let more = ping(taken);
    let waiting =
        tokio::time::timeout(Duration::from_secs(60), client.connection.receive(&more)).await;
    assert!(waiting.is_err(), "a flood is held back, not buffered");
    // Reading lets it through, and every request is answered once.
    let mut ids = std::collections::BTreeSet::new();
    while ids.len() < taken {
        ids.insert(client.next().await["id"].as_u64().unwrap());
    }
    client.connection.receive(&more).await;
    ids.insert(client.next().await["id"].as_u64().unwrap());
    assert_eq!(ids.len(), taken + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_run_sends_every_event_of_the_turn_before_its_answer() {
    // On a durable journal, as `spool serve` runs.
    let dir = tempfile::tempdir().unwrap();
    let journal = spool_journal::store::sqlite::SqliteJournal::open(
        dir.path(),
        spool_journal::store::sqlite::Options::default(),
    )
    .unwrap();
    let runtime = Runtime::builder(Arc::new(journal)).build();
    let mut client = Client::new(&runtime);
    // The turn's last events reach the hub's readers after the boundary is
    // known: many turns give a late one every chance to be overtaken.
    for id in 1..=50 {
        client
            .send(json!({"jsonrpc": "2.0", "id": id, "method": "submit.run", "params": {"text": format!("turn {id}")}}))
            .await;
        let (events, reply) = client.until_response(id).await;
        let kinds = kinds(&events);
        assert_eq!(
            kinds
                .iter()
                .rev()
                .take(2)
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["run:status", "run:end"],
            "turn {id} ends with run:end and its status before the answer: {kinds:?}"
        );
        let last = events.last().unwrap();
        assert_eq!(last["params"]["body"], "completed");
        assert_eq!(reply["result"]["state"], "completed");
    }
}

#[tokio::test]
async fn a_runs_notifications_are_encoded_once_for_all_its_subscriptions() {
    let runtime = echo();
    let dispatcher = Dispatcher::new(runtime.clone());
    let (driver, mut driven) = dispatcher.connect(None);
    driver
        .receive(r#"{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{"text":"hi"}}"#)
        .await;
    let run = loop {
        let message: Value = serde_json::from_str(&driven.recv().await.unwrap().to_json()).unwrap();
        if message["id"] == 1 {
            break message["result"]["run_id"].as_str().unwrap().to_owned();
        }
    };
    // Two subscriptions on two connections of one dispatcher.
    let mut texts = Vec::new();
    for _ in 0..2 {
        let (connection, mut outgoing) = dispatcher.connect(None);
        connection
            .request("subscribe", json!({"run_id": run}))
            .await
            .unwrap();
        let mut events = Vec::new();
        loop {
            let message = tokio::time::timeout(PATIENCE, outgoing.recv())
                .await
                .unwrap()
                .unwrap();
            let Outgoing::Event { text, .. } = message else {
                continue;
            };
            let done = String::from_utf8_lossy(&text).contains(r#""spool.kind":"run:end""#);
            events.push(text);
            if done {
                break;
            }
        }
        texts.push(events);
    }
    assert_eq!(texts[0], texts[1]);
    for (a, b) in texts[0].iter().zip(&texts[1]) {
        assert_eq!(a.as_ptr(), b.as_ptr(), "one encoding, shared");
    }
}

#[tokio::test]
async fn a_later_turns_deltas_are_its_own_after_the_hub_forgot_the_run() {
    let runtime = echo();
    let dispatcher = Dispatcher::new(runtime.clone());
    // The deltas a subscription sees during one turn of `run`.
    async fn watched_turn(
        dispatcher: &Dispatcher,
        runtime: &Runtime,
        run: &RunId,
        text: &str,
    ) -> Vec<String> {
        let (connection, mut outgoing) = dispatcher.connect(None);
        connection
            .request("subscribe", json!({"run_id": run.as_str()}))
            .await
            .unwrap();
        let message = spool_runtime::MessageRequest {
            text: text.into(),
            context: Vec::new(),
            policy: None,
        };
        let spool_runtime::Accepted::Started { turn, .. } =
            runtime.send(run, message).await.unwrap()
        else {
            panic!("a turn");
        };
        let mut deltas = Vec::new();
        loop {
            let message = tokio::time::timeout(PATIENCE, outgoing.recv())
                .await
                .unwrap()
                .unwrap();
            let message: Value = serde_json::from_str(&message.to_json()).unwrap();
            let params = &message["params"];
            if params["attributes"]["spool.stream"] == "text" {
                deltas.push(params["body"].as_str().unwrap().to_owned());
            }
            if params["spool.kind"] == "run:end"
                && params["attributes"]["spool.turn_id"] == turn.as_str()
            {
                return deltas;
            }
        }
    }
    let first = runtime
        .start(spool_runtime::StartRequest {
            text: "zero".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let run = first.run().clone();
    let turn = runtime.get(&run).await.unwrap().turn_id.unwrap();
    runtime.wait_for(&run, &turn).await.unwrap();
    let seen = watched_turn(&dispatcher, &runtime, &run, "one").await;
    assert!(seen.iter().any(|d| d.contains("one")), "{seen:?}");
    // A turn nobody watches: the hub forgets the run at its end, and its
    // delta counter starts over.
    let accepted = runtime
        .send(
            &run,
            spool_runtime::MessageRequest {
                text: "unwatched".into(),
                context: Vec::new(),
                policy: None,
            },
        )
        .await
        .unwrap();
    let spool_runtime::Accepted::Started { turn, .. } = accepted else {
        panic!("a turn")
    };
    runtime.wait_for(&run, &turn).await.unwrap();
    let seen = watched_turn(&dispatcher, &runtime, &run, "three").await;
    assert!(seen.iter().any(|d| d.contains("three")), "{seen:?}");
    assert!(
        !seen.iter().any(|d| d.contains("one")),
        "no delta of an earlier turn: {seen:?}"
    );
}
