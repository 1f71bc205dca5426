//! The HTTP framings mounted beside the HTTP channel: `/version`, SSE on
//! `/events` with `Last-Event-ID` resumption, NDJSON on `/stream`, all
//! behind the channel's authenticator.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use spool_http::{HttpChannel, Listener, TokenFile};
use spool_runtime::{Runtime, StartRequest};
use tokio::sync::{mpsc, watch};

use crate::PATIENCE;

struct Server {
    addr: String,
    _stop: watch::Sender<bool>,
}

async fn server(runtime: &Runtime, tokens: Option<Arc<TokenFile>>) -> Server {
    let listener = Listener::tcp("127.0.0.1:0").await.unwrap();
    server_on(listener, runtime, tokens)
}

fn server_on(listener: Listener, runtime: &Runtime, tokens: Option<Arc<TokenFile>>) -> Server {
    let (stop, closing) = watch::channel(false);
    let dispatcher = spool_rpc::Dispatcher::new(runtime.clone());
    let mut channel = HttpChannel::new(runtime.clone(), closing.clone());
    for (prefix, handler) in spool_rpc::http::routes(&dispatcher, &closing) {
        channel = channel.mount(prefix, handler).unwrap();
    }
    if let Some(tokens) = tokens {
        channel = channel.with_authenticator(tokens);
    }
    let addr = listener.describe();
    let mut until = closing;
    tokio::spawn(spool_http::serve(listener, channel.handler(), async move {
        let _ = until.wait_for(|stop| *stop).await;
    }));
    Server { addr, _stop: stop }
}

/// A GET whose body is read line by line as it arrives.
async fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, mpsc::Receiver<String>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(
            request
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let (lines, receiver) = mpsc::channel(1024);
    let mut body = response.into_body();
    tokio::spawn(async move {
        let mut partial = String::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            partial.push_str(&String::from_utf8_lossy(&data));
            while let Some(at) = partial.find('\n') {
                let line: String = partial.drain(..=at).collect();
                if lines.send(line.trim_end().to_owned()).await.is_err() {
                    return;
                }
            }
        }
        if !partial.is_empty() {
            let _ = lines.send(partial).await;
        }
    });
    (status, receiver)
}

async fn line(lines: &mut mpsc::Receiver<String>) -> String {
    tokio::time::timeout(PATIENCE, lines.recv())
        .await
        .expect("a line in time")
        .expect("the stream is open")
}

/// SSE events read until `run:end`: `(id, kind, spanId)` each.
async fn sse_until_end(lines: &mut mpsc::Receiver<String>) -> Vec<(u64, String, Value)> {
    let mut events = Vec::new();
    let mut id = None;
    loop {
        let text = line(lines).await;
        if let Some(rest) = text.strip_prefix("id: ") {
            id = Some(rest.parse::<u64>().unwrap());
        } else if let Some(rest) = text.strip_prefix("data: ") {
            let envelope: Value = serde_json::from_str(rest).unwrap();
            let kind = envelope["params"]["spool.kind"]
                .as_str()
                .unwrap()
                .to_owned();
            let span = envelope["params"]["spanId"].clone();
            events.push((id.take().expect("each event has an id"), kind.clone(), span));
            if kind == "run:end" {
                return events;
            }
        }
    }
}

async fn finished_run(runtime: &Runtime) -> String {
    let accepted = runtime
        .start(StartRequest {
            text: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let turn = runtime.get(accepted.run()).await.unwrap().turn_id.unwrap();
    runtime.wait_for(accepted.run(), &turn).await.unwrap();
    accepted.run().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_ids_are_cursors_and_a_reconnect_resumes_after_last_event_id_without_gap_or_repeat() {
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let run = finished_run(&runtime).await;
    let (status, mut lines) = get(&server.addr, &format!("/events?run_id={run}"), &[]).await;
    assert_eq!(status, 200);
    let all = sse_until_end(&mut lines).await;
    let model = all
        .iter()
        .find(|(_, kind, span)| kind == "task:start" && !span.is_null())
        .unwrap();
    // Resume right after the model call's start: what follows comes once,
    // in the same spans.
    let resume = model.0;
    let (_, mut lines) = get(
        &server.addr,
        &format!("/events?run_id={run}"),
        &[("last-event-id", &resume.to_string())],
    )
    .await;
    let rest = sse_until_end(&mut lines).await;
    let expected: Vec<_> = all
        .iter()
        .filter(|(id, _, _)| *id > resume)
        .cloned()
        .collect();
    assert_eq!(rest, expected);
    assert!(
        rest.iter()
            .any(|(_, kind, span)| kind == "task:complete" && *span == model.2),
        "the resumed stream keeps the call's span"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_carries_one_envelope_per_line_and_version_answers_the_capabilities() {
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let run = finished_run(&runtime).await;
    let (status, mut lines) =
        get(&server.addr, &format!("/stream?run_id={run}&cursor=0"), &[]).await;
    assert_eq!(status, 200);
    let first: Value = serde_json::from_str(&line(&mut lines).await).unwrap();
    assert_eq!(first["jsonrpc"], "2.0");
    assert_eq!(first["method"], "events.append");
    let (status, mut version) = get(&server.addr, "/version", &[]).await;
    assert_eq!(status, 200);
    let document: Value = serde_json::from_str(&line(&mut version).await).unwrap();
    assert_eq!(document["protocol"], "1.0");
    assert!(
        document["rpc"]
            .as_array()
            .unwrap()
            .contains(&Value::from("submit.run"))
    );
    let (status, _) = get(&server.addr, "/stream?run_id=run-none", &[]).await;
    assert_eq!(status, 404);
    let (status, _) = get(
        &server.addr,
        &format!("/stream?run_id={run}&cursor=999"),
        &[],
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_framings_are_behind_the_channels_authenticator() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let token = TokenFile::issue(&path, "ops").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let runtime = crate::echo();
    let server = server(&runtime, Some(tokens)).await;
    let run = finished_run(&runtime).await;
    for path in [
        "/version".to_owned(),
        format!("/events?run_id={run}"),
        "/ws".to_owned(),
    ] {
        let (status, _) = get(&server.addr, &path, &[]).await;
        assert_eq!(status, 401, "{path}");
    }
    let bearer = format!("Bearer {token}");
    let (status, _) = get(
        &server.addr,
        &format!("/events?run_id={run}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 200);
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn websocket(addr: &str) -> Socket {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (socket, response) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), stream)
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 101);
    socket
}

async fn receive(socket: &mut Socket) -> tokio_tungstenite::tungstenite::Message {
    use futures_util::StreamExt;
    tokio::time::timeout(PATIENCE, socket.next())
        .await
        .expect("a message in time")
        .expect("the socket is open")
        .unwrap()
}

async fn receive_json(socket: &mut Socket) -> Value {
    match receive(socket).await {
        tokio_tungstenite::tungstenite::Message::Text(text) => {
            serde_json::from_str(text.as_str()).unwrap()
        }
        other => panic!("a text message, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_drives_a_run_and_reads_its_events_on_one_connection() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let runtime = crate::scripted(
        r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"Deploying to eu-west-1."}"#,
    );
    let server = server(&runtime, None).await;
    let mut socket = websocket(&server.addr).await;
    let submit = r#"{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{"text":"deploy"}}"#;
    socket.send(Message::text(submit)).await.unwrap();
    let mut kinds = Vec::new();
    let parked = loop {
        let message = receive_json(&mut socket).await;
        if message["id"] == 1 {
            break message;
        }
        kinds.push(message["params"]["spool.kind"].as_str().unwrap().to_owned());
    };
    assert_eq!(parked["result"]["state"], "waiting");
    assert!(kinds.contains(&"run:start".to_owned()), "{kinds:?}");
    let run = parked["result"]["run_id"].as_str().unwrap().to_owned();
    let respond = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"run.respond","params":{{"run_id":"{run}","responses":[{{"text":"eu-west-1"}}]}}}}"#
    );
    socket.send(Message::text(respond)).await.unwrap();
    let subscribe =
        format!(r#"{{"jsonrpc":"2.0","id":3,"method":"subscribe","params":{{"run_id":"{run}"}}}}"#);
    socket.send(Message::text(subscribe)).await.unwrap();
    // The turn goes on to its end, seen through the subscription.
    loop {
        let message = receive_json(&mut socket).await;
        if message["params"]["spool.kind"] == "run:end" {
            assert_eq!(message["params"]["body"], "Deploying to eu-west-1.");
            break;
        }
    }
}

/// The tests' TLS identity for `localhost` (its README says how it was made).
const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spool-engines/tests/tls");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_tls_drives_a_run_on_a_listener_serving_tls() {
    use futures_util::SinkExt;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio_tungstenite::tungstenite::Message;
    let runtime = crate::echo();
    let identity = spool_http::tls::CertificateFiles::load(
        std::path::Path::new(&format!("{TLS_DIR}/localhost.pem")),
        std::path::Path::new(&format!("{TLS_DIR}/localhost.key")),
    )
    .unwrap();
    let listener = Listener::tls("127.0.0.1:0", identity.server_config().unwrap())
        .await
        .unwrap();
    let server = server_on(listener, &runtime, None);
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(format!("{TLS_DIR}/localhost.pem")).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut socket, response) = tokio_tungstenite::client_async("wss://localhost/ws", tls)
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 101);
    let submit = r#"{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{"text":"over tls"}}"#;
    socket.send(Message::text(submit)).await.unwrap();
    let answer = loop {
        use futures_util::StreamExt;
        let message = tokio::time::timeout(PATIENCE, socket.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .unwrap();
        let Message::Text(text) = message else {
            panic!("a text message, not {message:?}");
        };
        let message: Value = serde_json::from_str(text.as_str()).unwrap();
        if message["id"] == 1 {
            break message;
        }
    };
    assert_eq!(answer["result"]["state"], "completed", "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_message_is_refused_and_the_session_goes_on() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let mut socket = websocket(&server.addr).await;
    socket.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(receive_json(&mut socket).await["error"]["code"], -32600);
    socket
        .send(Message::text(r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#))
        .await
        .unwrap();
    assert_eq!(receive_json(&mut socket).await["result"], "pong");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_1_mib_ends_the_session_with_close_code_1009() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let mut socket = websocket(&server.addr).await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(1024 * 1024 + 1)
    );
    // The server may close while the frame is still being written.
    let _ = socket.send(Message::text(huge)).await;
    match receive(&mut socket).await {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Size),
        other => panic!("a close frame saying why, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_legacy_runs_on_one_socket_are_answered_in_the_legacy_shape_under_ids_of_their_own() {
    use futures_util::SinkExt;
    use std::collections::HashMap;
    use tokio_tungstenite::tungstenite::Message;
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let mut socket = websocket(&server.addr).await;
    socket
        .send(Message::text(r#"{"t":"run","text":"one"}"#))
        .await
        .unwrap();
    socket
        .send(Message::text(r#"{"t":"run","text":"two"}"#))
        .await
        .unwrap();
    // Per id: the events' kinds, then the result.
    let mut kinds: HashMap<String, Vec<String>> = HashMap::new();
    let mut results: HashMap<String, Value> = HashMap::new();
    while results.len() < 2 {
        let message = receive_json(&mut socket).await;
        assert!(
            message.get("jsonrpc").is_none(),
            "legacy, not an envelope: {message}"
        );
        let id = message["id"]
            .as_str()
            .expect("each message names its request")
            .to_owned();
        match message["t"].as_str() {
            Some("event") => {
                assert!(!results.contains_key(&id), "events come before the result");
                kinds
                    .entry(id)
                    .or_default()
                    .push(message["event"]["spool.kind"].as_str().unwrap().to_owned());
            }
            Some("result") => {
                results.insert(id, message["result"].clone());
            }
            _ => panic!("an event or a result: {message}"),
        }
    }
    let mut answers: Vec<&str> = results
        .values()
        .map(|r| r["response"].as_str().unwrap())
        .collect();
    answers.sort_unstable();
    assert_eq!(answers, ["echo: one", "echo: two"]);
    for (id, result) in &results {
        let seen = &kinds[id];
        assert_eq!(
            seen.first().map(String::as_str),
            Some("run:start"),
            "{id}: {seen:?}"
        );
        assert!(seen.contains(&"run:end".to_owned()), "{id}: {seen:?}");
        assert_eq!(result["state"], "completed");
    }
    // An unknown legacy type is refused as an envelope, and the session
    // goes on.
    socket
        .send(Message::text(r#"{"t":"dance"}"#))
        .await
        .unwrap();
    assert_eq!(receive_json(&mut socket).await["error"]["code"], -32600);
    // Bad params come back as a legacy error.
    socket
        .send(Message::text(r#"{"t":"run","txt":"typo"}"#))
        .await
        .unwrap();
    let refused = receive_json(&mut socket).await;
    assert_eq!(refused["t"], "error", "{refused}");
    assert_eq!(refused["error"]["code"], -32602);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpsees_websocket_client_drives_a_run_and_reads_its_events() {
    use jsonrpsee::core::client::{ClientT, Error, SubscriptionClientT};
    use jsonrpsee::core::params::ObjectParams;
    use jsonrpsee::ws_client::WsClientBuilder;
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let client = WsClientBuilder::default()
        .build(format!("ws://{}/ws", server.addr))
        .await
        .unwrap();
    let mut events = client
        .subscribe_to_method::<Value>("events.append")
        .await
        .unwrap();
    let mut params = ObjectParams::new();
    params.insert("text", "hello").unwrap();
    let reply: Value = client.request("submit.run", params).await.unwrap();
    assert_eq!(reply["state"], "completed");
    assert_eq!(reply["response"], "echo: hello");
    let run = reply["run_id"].as_str().unwrap().to_owned();
    // The turn's events were sent before the answer; jsonrpsee hands them
    // over in order.
    let mut kinds = Vec::new();
    while kinds.last().map(String::as_str) != Some("run:end") {
        let event = tokio::time::timeout(PATIENCE, events.next())
            .await
            .expect("an event in time")
            .expect("the client is open")
            .unwrap();
        assert_eq!(event["attributes"]["cicd.pipeline.run.id"], run.as_str());
        kinds.push(event["spool.kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("run:start"),
        "{kinds:?}"
    );
    // Errors arrive as JSON-RPC errors with the seed's codes.
    let unknown = client
        .request::<Value, _>("rpc.nope", jsonrpsee::rpc_params![])
        .await;
    match unknown {
        Err(Error::Call(error)) => assert_eq!(error.code(), -32601),
        other => panic!("method not found, not {other:?}"),
    }
    let pong: String = client
        .request("ping", jsonrpsee::rpc_params![])
        .await
        .unwrap();
    assert_eq!(pong, "pong");
}

/// One client connection over a framing that carries requests.
enum Framing {
    InProcess(crate::Client),
    Stdio {
        input: tokio::io::DuplexStream,
        lines: mpsc::Receiver<String>,
    },
    WebSocket(Box<Socket>),
}

impl Framing {
    async fn stdio(runtime: &Runtime) -> Self {
        use tokio::io::AsyncBufReadExt;
        let (input, server_input) = tokio::io::duplex(1 << 20);
        let (server_output, output) = tokio::io::duplex(1 << 20);
        let dispatcher = spool_rpc::Dispatcher::new(runtime.clone());
        tokio::spawn(async move {
            spool_rpc::stdio::serve(&dispatcher, server_input, server_output)
                .await
                .unwrap();
        });
        let (sender, lines) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut output = tokio::io::BufReader::new(output).lines();
            while let Ok(Some(line)) = output.next_line().await {
                if sender.send(line).await.is_err() {
                    return;
                }
            }
        });
        Self::Stdio { input, lines }
    }

    async fn send(&mut self, text: &str) {
        use futures_util::SinkExt;
        use tokio::io::AsyncWriteExt;
        match self {
            Self::InProcess(client) => client.connection.receive(text).await,
            Self::Stdio { input, .. } => {
                input
                    .write_all(format!("{text}\n").as_bytes())
                    .await
                    .unwrap();
            }
            Self::WebSocket(socket) => socket
                .send(tokio_tungstenite::tungstenite::Message::text(text))
                .await
                .unwrap(),
        }
    }

    async fn next(&mut self) -> Value {
        match self {
            Self::InProcess(client) => client.next().await,
            Self::Stdio { lines, .. } => serde_json::from_str(&line(lines).await).unwrap(),
            Self::WebSocket(socket) => receive_json(socket).await,
        }
    }
}

/// What a client sees of one scripted conversation, times aside: each
/// request's answer in the order sent, the notifications in the order they
/// came, and apart from them those of the closing subscription.
#[derive(Debug, Default, PartialEq)]
struct Transcript {
    answers: Vec<Value>,
    notifications: Vec<Value>,
    subscribed: Vec<Value>,
}

/// Times (`timeUnixNano`, a run's `updated`) are taken out; so are live
/// deltas, which a turn may stream before a late subscriber is listening
/// (the journal's events are what every framing must agree on).
fn comparable(message: &Value) -> Option<Value> {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("timeUnixNano");
                map.remove("updated");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if message["params"]["attributes"]
        .get("spool.stream")
        .is_some()
    {
        return None;
    }
    let mut message = message.clone();
    strip(&mut message);
    Some(message)
}

/// Whether `message` is the `state.patch` that reaches position `end`.
fn reaches(message: &Value, end: &Value) -> bool {
    message["method"] == "state.patch" && message["params"]["to"] == *end
}

/// The conversation: two turns, every method, a batch, and errors; then a
/// subscription to both channels read to the run's last position.
async fn converse(framing: &mut Framing) -> Transcript {
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"submit.run","params":{"text":"hi"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"submit.run","params":{"run_id":"run-1","text":"again"}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"state.snapshot","params":{"run_id":"run-1"}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"run.get","params":{"run_id":"run-1"}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"run.list"}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"rpc.nope"}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"submit.run","params":{"txt":"typo"}}"#,
        r#"[{"jsonrpc":"2.0","id":8,"method":"ping"},{"jsonrpc":"2.0","method":"ping"},{"jsonrpc":"2.0","id":9,"method":"run.get","params":{"run_id":"nope"}}]"#,
        r#"{"jsonrpc":"2.0","id":10,"method":"getCapabilities"}"#,
        "not json",
    ];
    let mut transcript = Transcript::default();
    let mut end = Value::Null;
    for request in requests {
        framing.send(request).await;
        loop {
            let message = framing.next().await;
            if message.get("method").is_some() {
                transcript.notifications.extend(comparable(&message));
                continue;
            }
            if message["id"] == 3 {
                end = message["result"]["cursor"].clone();
            }
            transcript.answers.extend(comparable(&message));
            break;
        }
    }
    framing
        .send(r#"{"jsonrpc":"2.0","id":11,"method":"subscribe","params":{"run_id":"run-1","channels":["spool:events","spool:state"]}}"#)
        .await;
    let (mut answered, mut reached) = (false, false);
    while !(answered && reached) {
        let message = framing.next().await;
        if message.get("method").is_some() {
            reached |= reaches(&message, &end);
            transcript.subscribed.extend(comparable(&message));
        } else {
            answered = true;
            transcript.answers.extend(comparable(&message));
        }
    }
    transcript
}

/// A runtime whose ids are the same in every run of the conversation.
fn sequential() -> Runtime {
    Runtime::builder(Arc::new(spool_journal::store::memory::MemoryJournal::new()))
        .ids(Arc::new(spool_runtime::SequentialIds::default()))
        .build()
}

/// The notifications a server-to-client framing (SSE or NDJSON) sends for
/// the conversation's run, both channels, read to position `end`.
async fn streamed(addr: &str, path: &str, end: &Value) -> Vec<Value> {
    let (status, mut lines) = get(
        addr,
        &format!("{path}?run_id=run-1&channels=spool:events,spool:state"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{path}");
    let mut notifications = Vec::new();
    loop {
        let text = line(&mut lines).await;
        let data = if path == "/events" {
            match text.strip_prefix("data: ") {
                Some(data) => data.to_owned(),
                None => continue,
            }
        } else {
            text
        };
        let message: Value = serde_json::from_str(&data).unwrap();
        let done = reaches(&message, end);
        notifications.extend(comparable(&message));
        if done {
            return notifications;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_conversation_gets_the_same_answers_and_events_over_every_framing() {
    let runtime = sequential();
    let mut in_process = Framing::InProcess(crate::Client::new(&runtime));
    let reference = converse(&mut in_process).await;
    assert_eq!(reference.answers.len(), 11, "{:#?}", reference.answers);
    assert!(
        reference.notifications.len() > 10,
        "the turns' events: {:#?}",
        reference.notifications
    );
    assert!(
        reference
            .subscribed
            .iter()
            .any(|n| n["method"] == "state.patch"),
        "the subscription carries patches"
    );

    let runtime = sequential();
    let mut stdio = Framing::stdio(&runtime).await;
    assert_eq!(converse(&mut stdio).await, reference, "stdio");

    let runtime = sequential();
    let server = server(&runtime, None).await;
    let mut socket = Framing::WebSocket(Box::new(websocket(&server.addr).await));
    assert_eq!(converse(&mut socket).await, reference, "WebSocket");

    // The read-only framings carry what the subscription carried.
    let end = reference.answers[2]["result"]["cursor"].clone();
    for path in ["/events", "/stream"] {
        assert_eq!(
            streamed(&server.addr, path, &end).await,
            reference.subscribed,
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_that_is_not_text_is_400_never_ignored() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let runtime = crate::echo();
    let server = server(&runtime, None).await;
    let run = runtime
        .start(spool_runtime::StartRequest {
            text: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let spool_runtime::Accepted::Started { run, .. } = run else {
        panic!("a fresh run starts");
    };
    let mut socket = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let mut request =
        format!("GET /events?run_id={run} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nLast-Event-ID: ").into_bytes();
    request.extend_from_slice(&[0xff, 0xfe]);
    request.extend_from_slice(b"\r\n\r\n");
    socket.write_all(&request).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(crate::PATIENCE, socket.read_to_end(&mut reply))
        .await
        .expect("an answer in time")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("\"code\":\"bad_request\""), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_owner_access_the_event_framings_find_only_the_callers_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let alice = TokenFile::issue(&path, "alice").unwrap();
    let bob = TokenFile::issue(&path, "bob").unwrap();
    let tokens = Arc::new(TokenFile::load(&path).unwrap());
    let runtime = crate::echo();
    let listener = Listener::tcp("127.0.0.1:0").await.unwrap();
    let (stop, closing) = watch::channel(false);
    let access = spool_runtime::RunAccess::Owner;
    let dispatcher = spool_rpc::Dispatcher::new(runtime.clone()).with_run_access(access);
    let mut channel = HttpChannel::new(runtime.clone(), closing.clone())
        .with_authenticator(tokens.clone())
        .with_run_access(access);
    for (prefix, handler) in spool_rpc::http::routes(&dispatcher, &closing) {
        channel = channel.mount(prefix, handler).unwrap();
    }
    let addr = listener.describe();
    let mut until = closing;
    tokio::spawn(spool_http::serve(listener, channel.handler(), async move {
        let _ = until.wait_for(|stop| *stop).await;
    }));
    // Alice's run, made as the channel makes it: her proven principal.
    let principal = spool_runtime::Authenticator::authenticate(
        tokens.as_ref(),
        &spool_runtime::Credentials {
            headers: vec![("authorization".into(), format!("Bearer {alice}"))],
            peer: None,
        },
    )
    .await
    .unwrap();
    let started = runtime
        .start(spool_runtime::StartRequest {
            text: "mine".into(),
            principal,
            ..Default::default()
        })
        .await
        .unwrap();
    let spool_runtime::Accepted::Started { run, .. } = started else {
        panic!("a fresh run starts");
    };
    for path in [
        format!("/events?run_id={run}"),
        format!("/stream?run_id={run}"),
    ] {
        let (status, _) = get(&addr, &path, &[("authorization", &format!("Bearer {bob}"))]).await;
        assert_eq!(status, 404, "bob: {path}");
        let (status, _) = get(
            &addr,
            &path,
            &[("authorization", &format!("Bearer {alice}"))],
        )
        .await;
        assert_eq!(status, 200, "alice: {path}");
    }
    drop(stop);
}
