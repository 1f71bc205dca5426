//! A pod over a real Unix socket, driven as `socat` or `spool pod attach`
//! would drive it, and in process.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use spool_journal::store::memory::MemoryJournal;
use spool_pod::Pod;
use spool_runtime::Runtime;
use spool_runtime::engines::ScriptedEngine;
use spool_wire::pod::{ErrorCode, Event, Method, PodState, TurnResult};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

const PATIENCE: Duration = Duration::from_secs(20);

fn runtime(script: Option<&str>) -> Runtime {
    let mut builder = Runtime::builder(Arc::new(MemoryJournal::new()));
    if let Some(script) = script {
        builder = builder.engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()));
    }
    builder.build()
}

/// A pod served on a socket in a fresh runtime directory.
struct Served {
    pod: Pod,
    socket: std::path::PathBuf,
    _dir: spool_pod::dir::PodDir,
    _root: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(runtime: Runtime, name: &str) -> Served {
    let root = tempfile::tempdir().unwrap();
    let dir = spool_pod::dir::PodDir::create(root.path(), name).unwrap();
    let listener = dir.bind().unwrap();
    let pod = Pod::open(runtime, name).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(spool_pod::daemon::serve(
        pod.clone(),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    Served {
        pod,
        socket: dir.socket(),
        _dir: dir,
        _root: root,
        _stop: stop,
    }
}

struct Client {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
}

impl Client {
    /// Connects and reads the `status` every listener gets first.
    async fn connect(served: &Served) -> (Self, Event) {
        let stream = UnixStream::connect(&served.socket).await.unwrap();
        let (reader, writer) = stream.into_split();
        let mut client = Self {
            lines: BufReader::new(reader).lines(),
            writer,
        };
        let first = client.next().await;
        assert!(matches!(first, Event::Status(_)), "status first: {first:?}");
        (client, first)
    }

    async fn send(&mut self, line: &[u8]) {
        self.writer.write_all(line).await.unwrap();
        self.writer.write_all(b"\n").await.unwrap();
    }

    async fn call(&mut self, method: &Method) {
        self.writer
            .write_all(method.encode_line().as_bytes())
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Event {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("the connection is open");
        Event::decode(&line).unwrap()
    }

    /// Events until one that `done` accepts, that one included.
    async fn until(&mut self, done: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await;
            let stop = done(&event);
            events.push(event);
            if stop {
                return events;
            }
        }
    }
}

fn is_error(event: &Event, code: ErrorCode) -> bool {
    matches!(event, Event::Error(error) if error.code == code)
}

const ASKS: &str = r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"Deploying to eu-west-1."}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_clients_sending_run_at_once_start_one_turn_and_all_see_the_same_events() {
    let served = serve(runtime(Some(ASKS)), "deploy").await;
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(Client::connect(&served).await.0);
    }
    let run = Method::Run {
        input: "deploy".into(),
    };
    // Sent without waiting for any answer.
    for client in &mut clients {
        client.call(&run).await;
    }
    // Each sees the turn park, and nine refusals, broadcast.
    let mut seen = Vec::new();
    for client in &mut clients {
        let mut events = Vec::new();
        let mut refusals = 0;
        let mut paused = false;
        while !(paused && refusals == 9) {
            let event = client.next().await;
            refusals += usize::from(is_error(&event, ErrorCode::AlreadyRunning));
            paused |= matches!(&event, Event::TurnEnd(end) if end.result == TurnResult::Paused);
            events.push(event);
        }
        seen.push(events);
    }
    let starts = seen[0]
        .iter()
        .filter(|e| matches!(e, Event::TurnStart(_)))
        .count();
    assert_eq!(starts, 1, "exactly one turn: {:?}", seen[0]);
    for events in &seen[1..] {
        assert_eq!(
            events, &seen[0],
            "every listener, the same events in the same order"
        );
    }
    assert_eq!(served.pod.state(), PodState::Paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_turn_resumes_with_an_answer_and_ends_finished_with_its_result() {
    let served = serve(runtime(Some(ASKS)), "ask").await;
    let (mut client, _) = Client::connect(&served).await;
    client
        .call(&Method::Run {
            input: "deploy".into(),
        })
        .await;
    // The turn's end, then the state it leaves the pod in.
    let parked = client
        .until(|e| matches!(e, Event::Status(s) if s.state == PodState::Paused))
        .await;
    assert!(
        matches!(&parked[parked.len() - 2], Event::TurnEnd(end) if end.result == TurnResult::Paused),
        "{parked:?}"
    );
    assert!(
        parked
            .iter()
            .any(|e| matches!(e, Event::TurnStart(start) if start.turn == 1))
    );
    assert!(
        parked
            .iter()
            .any(|e| matches!(e, Event::ToolCallDone(call) if call.name == "ask_human"))
    );
    // A question needs an answer.
    client.call(&Method::Resume { answer: None }).await;
    let refused = client.next().await;
    assert!(is_error(&refused, ErrorCode::InvalidRequest), "{refused:?}");
    client
        .send(br#"{"method":"resume","params":{"text":"eu-west-1"}}"#)
        .await;
    let rest = client
        .until(|e| matches!(e, Event::Status(s) if s.state == PodState::Idle))
        .await;
    assert!(
        rest.iter()
            .any(|e| matches!(e, Event::TextDone(t) if t.text == "Deploying to eu-west-1.")),
        "{rest:?}"
    );
    assert!(
        rest.iter()
            .any(|e| matches!(e, Event::TurnEnd(end) if end.result == TurnResult::Finished))
    );
    // The turn starts again as it goes on: every turn_end has its
    // turn_start, and the answer is the asking call's result.
    let started = rest
        .iter()
        .position(|e| matches!(e, Event::TurnStart(start) if start.turn == 1))
        .unwrap_or_else(|| panic!("turn_start after the resume: {rest:?}"));
    let answered = rest
        .iter()
        .position(|e| matches!(e, Event::ToolResult(r) if r.id == "q" && r.output == "eu-west-1"))
        .unwrap_or_else(|| panic!("the answer as the call's result: {rest:?}"));
    assert!(started < answered, "{rest:?}");
    // Nothing to resume or cancel now.
    client.call(&Method::Resume { answer: None }).await;
    assert!(is_error(&client.next().await, ErrorCode::NotPaused));
    client.call(&Method::Cancel).await;
    assert!(is_error(&client.next().await, ErrorCode::NotRunning));
    client.call(&Method::GetHistory).await;
    let Event::History(history) = client.next().await else {
        panic!("a history");
    };
    assert!(history.items.len() >= 4, "{history:?}");
    // The history has the answered question's result, as the live event.
    assert!(
        history.items.iter().any(|item| matches!(
            item,
            spool_wire::pod::HistoryItem::ToolResult { call_id, output, .. }
                if call_id == "q" && output == "eu-west-1"
        )),
        "{history:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_that_do_not_decode_are_refused_to_their_sender_alone_and_the_connection_goes_on() {
    let served = serve(runtime(None), "strict").await;
    let (mut sender, _) = Client::connect(&served).await;
    let (mut other, _) = Client::connect(&served).await;
    let huge = vec![b'x'; 2 * 1024 * 1024];
    for line in [
        &huge[..],
        b"\xff\xfe not utf-8",
        br#"{"method":"dance"}"#,
        br#"{"method":"run"}"#,
        b"not json",
    ] {
        sender.send(line).await;
        let refused = sender.next().await;
        assert!(is_error(&refused, ErrorCode::InvalidRequest), "{refused:?}");
    }
    sender.call(&Method::GetStatus).await;
    assert!(matches!(sender.next().await, Event::Status(_)));
    // The other listener saw only the status, broadcast.
    assert!(matches!(other.next().await, Event::Status(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_never_reads_is_disconnected_with_a_reason_and_never_stalls_a_turn() {
    let pod = Pod::open(runtime(None), "busy").await.unwrap();
    let mut stuck = pod.listen();
    let mut watcher = pod.listen();
    // Each echo turn is several events; enough turns to overflow a queue.
    let turns = spool_pod::QUEUE / 4;
    for turn in 0..turns {
        pod.call(Method::Run {
            input: format!("turn {turn}"),
        })
        .await;
        loop {
            let event = tokio::time::timeout(PATIENCE, watcher.recv())
                .await
                .expect("the turn goes on")
                .expect("the watcher keeps up");
            if matches!(&event, Event::Status(s) if s.state == PodState::Idle) {
                break;
            }
        }
    }
    // The stuck listener holds what fit, then why it was let go.
    let mut last = None;
    while let Some(event) = stuck.recv().await {
        last = Some(event);
    }
    let Some(Event::Error(error)) = last else {
        panic!("a last error, not {last:?}");
    };
    assert!(error.message.contains("behind"), "{}", error.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_for_a_live_pod_is_refused_and_a_stale_socket_is_replaced() {
    let served = serve(runtime(None), "solo").await;
    let root = served.socket.parent().unwrap().parent().unwrap().to_owned();
    match spool_pod::dir::PodDir::create(&root, "solo") {
        Err(spool_pod::dir::DirError::Live { .. }) => {}
        other => panic!("refused as live, not {other:?}"),
    }
    // A socket nobody answers on (its process died) is replaced.
    let stale = root.join("gone");
    std::fs::create_dir_all(&stale).unwrap();
    drop(std::os::unix::net::UnixListener::bind(stale.join("sock")).unwrap());
    let dir = spool_pod::dir::PodDir::create(&root, "gone").unwrap();
    dir.bind().unwrap();
    // A file that is not a socket is never removed.
    let odd = root.join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::write(odd.join("sock"), b"mine").unwrap();
    assert!(matches!(
        spool_pod::dir::PodDir::create(&root, "odd"),
        Err(spool_pod::dir::DirError::NotASocket(_))
    ));
    assert_eq!(std::fs::read(odd.join("sock")).unwrap(), b"mine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_sleeping_pod_wakes_it_now() {
    let served = serve(
        runtime(Some(
            r#"{"tool_calls":[{"id":"s","name":"sleep","arguments":{"seconds":3600}}]}
{"text":"Awake."}"#,
        )),
        "nap",
    )
    .await;
    let (mut client, _) = Client::connect(&served).await;
    client
        .call(&Method::Run {
            input: "sleep an hour".into(),
        })
        .await;
    client
        .until(|e| matches!(e, Event::Status(s) if s.state == PodState::Paused))
        .await;
    client.call(&Method::Resume { answer: None }).await;
    let rest = client
        .until(|e| matches!(e, Event::Status(s) if s.state == PodState::Idle))
        .await;
    assert!(
        rest.iter()
            .any(|e| matches!(e, Event::TextDone(t) if t.text == "Awake.")),
        "{rest:?}"
    );
    assert!(
        rest.iter().any(
            |e| matches!(e, Event::ToolResult(r) if r.id == "s" && r.output.contains("slept_until"))
        ),
        "the sleep's end is the sleeping call's result: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_listens_with_a_callback_and_calls_methods_in_process() {
    let pod = Pod::open(runtime(None), "embedded").await.unwrap();
    let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
    pod.listen_with(move |event| sender.send(event).is_ok());
    pod.call(Method::Run { input: "hi".into() }).await;
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event in time")
            .expect("the callback is called");
        let done = matches!(&event, Event::TurnEnd(_));
        seen.push(event);
        if done {
            break;
        }
    }
    assert!(
        matches!(&seen[0], Event::Status(s) if s.state == PodState::Idle),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| matches!(e, Event::TextDone(t) if t.text == "echo: hi")),
        "{seen:?}"
    );
    // Closing ends the callback's task.
    tokio::time::timeout(PATIENCE, pod.close())
        .await
        .expect("the pod closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_run_still_reads_the_turn_to_its_end() {
    // What `echo '{"method":"run",…}' | socat - UNIX:pod.sock` does: the
    // line, then EOF on the server's read side, then read until closed.
    let served = serve(
        runtime(Some(r#"{"text":"Deploying to eu-west-1.","delay_ms":1}"#)),
        "deploy",
    )
    .await;
    let stream = UnixStream::connect(&served.socket).await.unwrap();
    let (reader, mut writer) = stream.into_split();
    writer
        .write_all(br#"{"method":"run","params":{"input":"go"}}"#)
        .await
        .unwrap();
    writer.write_all(b"\n").await.unwrap();
    writer.shutdown().await.unwrap();
    let mut lines = BufReader::new(reader).lines();
    let mut events = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("the server writes or closes in time")
        .unwrap()
    {
        events.push(Event::decode(&line).unwrap());
    }
    let names: Vec<&str> = events.iter().map(Event::name).collect();
    assert!(names.contains(&"turn_start"), "{names:?}");
    assert!(names.contains(&"text_done"), "{names:?}");
    assert!(
        names.contains(&"turn_end"),
        "the turn's end reached the half-closed client: {names:?}"
    );
    // The last word is the pod at rest, and then the server closed.
    assert!(
        matches!(events.last(), Some(Event::Status(status)) if status.state == spool_wire::pod::PodState::Idle),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_get_status_gets_its_answer_and_the_close() {
    let served = serve(runtime(None), "idle").await;
    let stream = UnixStream::connect(&served.socket).await.unwrap();
    let (reader, mut writer) = stream.into_split();
    writer
        .write_all(b"{\"method\":\"get_status\"}\n")
        .await
        .unwrap();
    writer.shutdown().await.unwrap();
    let mut lines = BufReader::new(reader).lines();
    let mut statuses = 0;
    while let Some(line) = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("the server answers and closes in time")
        .unwrap()
    {
        if matches!(Event::decode(&line).unwrap(), Event::Status(_)) {
            statuses += 1;
        }
    }
    assert_eq!(statuses, 2, "the first status and get_status's answer");
}

#[path = "../../../spool-http/tests/support/spans.rs"]
mod spans_support;

#[tokio::test(flavor = "current_thread")]
async fn a_method_runs_in_a_span_inside_its_connections_naming_the_session() {
    // Every task of this test runs on this thread, under this subscriber.
    let capture = spans_support::Capture::default();
    let _default = tracing::subscriber::set_default(capture.subscriber());
    let served = serve(runtime(None), "spans").await;
    let (mut client, _) = Client::connect(&served).await;
    client.call(&Method::GetStatus).await;
    assert!(matches!(client.next().await, Event::Status(_)));
    let session = served.pod.session().to_string();
    let seen = capture.seen();
    assert!(
        seen.iter().any(|s| s.name == "pod method"
            && s.fields.get("method").map(String::as_str) == Some("get_status")
            && s.fields.get("run_id") == Some(&session)
            && s.parent.as_deref() == Some("pod connection")),
        "{seen:?}"
    );
}
