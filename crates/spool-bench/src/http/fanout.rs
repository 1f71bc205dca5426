//! `stream-fanout` and `rpc-fanout`'s shared parts: many streams of one
//! run fed a turn at a time, measured beside the floor of the machine (the
//! same lines written to as many bare loopback sockets), and the memory an
//! open stream costs.

use super::*;

/// `stream-fanout`: many NDJSON subscribers on one run, held by a second
/// process (this binary, as `spool-bench subscribe`), so the server's work
/// and memory are measured apart from its clients'. The latency of each
/// line is its arrival time minus the time the journal recorded its event
/// (or, for a live delta, the time it was sent), measured at every
/// subscriber. Each turn is sent once every subscriber has the last one's
/// answer, so a figure is one turn's fan-out, not a queue of turns. The
/// baseline is the floor of the machine: a turn's seven lines, all ready
/// at once, written by one task as one HTTP/1.1 chunk in one write to each
/// of as many plain loopback sockets, read and decoded in a second process
/// by the same stream client (`Floor::ATurn`): the readers share the
/// machine's two cores with the server, so the floor's readers must do
/// the same work as the subscribers'. One bare line a round
/// (`Floor::OneLine`), the floor of the first figures, is measured beside
/// it. Then the server's resident memory per open stream, beside the
/// server's side of a bare loopback TCP connection held open.
pub(crate) fn fanout(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let subscribers = scale.pick(1_000usize, 50);
    let turns = scale.pick(20usize, 3);
    let held = scale.pick(10_000usize, 200);
    let tokio = tokio()?;
    let dir = tempfile::tempdir()?;
    tokio.block_on(async {
        let runtime = Runtime::builder(Arc::new(SqliteJournal::open(
            dir.path(),
            Options::default(),
        )?))
        .build();
        let (close_streams, closing) = watch::channel(false);
        let (url, stop) = start(HttpChannel::new(runtime, closing).handler()).await?;
        let client = Client::new(&url)?;
        let (many, turn_times, cpu) =
            latencies(&client, &url, "fanout-many", subscribers, turns).await?;
        let (mut rows, bare, bare_cpu) = beside_floors(
            &format!("stream-fanout/{subscribers} subscribers"),
            &many,
            subscribers,
            turns,
        )
        .await?;
        rows.push(turn_row(subscribers, &turn_times, &bare));
        rows.push(cpu_row(subscribers, cpu, bare_cpu));
        rows.push(open_streams(&client, &url, held).await?);
        // The latencies at the scale the memory row holds, over fewer
        // turns (each is ten times the lines), measured after it: the
        // memory they leave to the allocator would read as less memory
        // per stream.
        let turns_held = scale.pick(5usize, 2);
        let (most, turn_times, cpu) =
            latencies(&client, &url, "fanout-most", held, turns_held).await?;
        let (most_rows, bare, bare_cpu) = beside_floors(
            &format!("stream-fanout/{held} subscribers"),
            &most,
            held,
            turns_held,
        )
        .await?;
        rows.extend(most_rows);
        rows.push(turn_row(held, &turn_times, &bare));
        rows.push(cpu_row(held, cpu, bare_cpu));
        close_streams.send_replace(true);
        stop.send_replace(true);
        anyhow::Ok(rows)
    })
}

/// A fan-out's latency rows beside the floor of a turn's lines, with the
/// targets, and beside the floor of one line a round, which the fan-out
/// was measured against until 2026-12-02 and is kept to compare with
/// those figures; and the first floor's latencies (seconds, sorted) and
/// CPU per socket per round (microseconds).
pub(crate) async fn beside_floors(
    prefix: &str,
    many: &[f64],
    subscribers: usize,
    turns: usize,
) -> anyhow::Result<(Vec<Row>, Vec<f64>, f64)> {
    let (bare, bare_cpu) = bare_fanout(subscribers, turns, Floor::ATurn).await?;
    let (bare_line, _) = bare_fanout(subscribers, turns, Floor::OneLine).await?;
    let mut rows = latency_rows(
        prefix,
        many,
        &bare,
        "bare sockets, a turn as one chunk",
        FanoutTarget::NearTheFloor,
    );
    rows.extend(latency_rows(
        &format!("{prefix}, against one line a round,"),
        many,
        &bare_line,
        "bare sockets, one line",
        FanoutTarget::Beside,
    ));
    Ok((rows, bare, bare_cpu))
}

/// A turn's median time from its message to every subscriber having its
/// answer, beside the floor's slowest line (the time its last reader got
/// a round's line): what a person waiting on the slowest stream sees,
/// whatever each line's own latency, which counts from when its event was
/// recorded.
pub(crate) fn turn_row(subscribers: usize, turn_times: &[f64], bare: &[f64]) -> Row {
    Row::new(
        format!("stream-fanout/{subscribers} subscribers, message to every answer p50"),
        percentile(turn_times, 0.5) * 1e3,
        "ms",
        "bare sockets max",
        percentile(bare, 1.0) * 1e3,
    )
    .lower_is_better()
}

/// The server's CPU time per stream per turn, beside the floor's per
/// socket per round: with the readers on the same two cores, the slowest
/// line waits for about all of it, so this is what the p99 follows.
pub(crate) fn cpu_row(subscribers: usize, cpu: f64, bare_cpu: f64) -> Row {
    Row::new(
        format!("stream-fanout/{subscribers} subscribers, server CPU per stream per turn"),
        cpu,
        "us",
        "bare sockets per socket per round",
        bare_cpu,
    )
    .lower_is_better()
}

/// This process's CPU time so far (user and system), in milliseconds.
pub(crate) fn own_cpu_ms() -> anyhow::Result<f64> {
    crate::oneshot::cpu_ms("self", 14)
}

/// How close to the floor a fan-out's latencies must stay.
#[derive(Clone, Copy)]
pub(crate) enum FanoutTarget {
    /// p99 ≤ 1.2 × the floor's (JSON-RPC's fan-out, issue 56; until
    /// 2026-12-04 p99 ≤ 2 ms whatever the floor, the first target).
    P99NearTheFloor,
    /// p50 ≤ 1.1 × and p99 ≤ 1.2 × the floor's (the streams' second
    /// pass).
    NearTheFloor,
    /// None: a second floor, beside the one the target is on.
    Beside,
}

/// A fan-out's p50, p99 and max latencies (seconds, sorted) beside the
/// bare-socket floor's (`FLOOR p50` and so on), named `PREFIX p50` and so
/// on, with `target`.
pub(crate) fn latency_rows(
    prefix: &str,
    many: &[f64],
    bare: &[f64],
    floor: &str,
    target: FanoutTarget,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (label, p) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
        let row = Row::new(
            format!("{prefix} {label}"),
            percentile(many, p) * 1e3,
            "ms",
            format!("{floor} {label}"),
            percentile(bare, p) * 1e3,
        )
        .lower_is_better();
        rows.push(match (target, label) {
            (FanoutTarget::NearTheFloor, "p50") => row.at_most_times_baseline(1.1),
            (FanoutTarget::NearTheFloor | FanoutTarget::P99NearTheFloor, "p99") => {
                row.at_most_times_baseline(1.2)
            }
            _ => row,
        });
    }
    rows
}

/// Sends `turns` messages to `run`, each once `peer` says its
/// subscribers have the last one's answer; returns each turn's time from
/// sending its message to every subscriber having its answer (seconds,
/// sorted).
pub(crate) async fn drive_turns(
    client: &Client,
    run: &str,
    turns: usize,
    peer: &mut Peer,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(turns);
    for turn in 0..turns {
        let sent = Instant::now();
        let _: Value = client
            .post(
                &format!("/runs/{run}"),
                &json!({"text": format!("turn {turn}")}),
            )
            .await?;
        anyhow::ensure!(peer.line().await? == "turn", "the subscribers lost a turn");
        times.push(sent.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// A child process of this binary that holds connections to the server.
pub(crate) struct Peer {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Peer {
    /// Starts `spool-bench ARGS` and waits until it says `ready`.
    pub(crate) async fn start(args: &[String]) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the client process")?;
        let stdout = child.stdout.take().context("the client has a stdout")?;
        let mut peer = Self {
            child,
            stdout: tokio::io::BufReader::new(stdout).lines(),
        };
        anyhow::ensure!(
            peer.line().await? == "ready",
            "the client process did not get ready"
        );
        Ok(peer)
    }

    pub(crate) async fn line(&mut self) -> anyhow::Result<String> {
        self.stdout
            .next_line()
            .await?
            .context("the client process ended early (see its error above)")
    }

    /// Closes its stdin (the signal to let go) and waits for it.
    pub(crate) async fn finish(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let status = self.child.wait().await?;
        anyhow::ensure!(status.success(), "the client process failed ({status})");
        Ok(())
    }
}

/// Opens `subscribers` streams on a fresh run from another process, sends
/// `turns` messages, each once every subscriber has the last one's answer,
/// and returns every line's latency (seconds, sorted) at every subscriber,
/// each turn's time from its message to every subscriber's answer, and
/// this process's CPU time over the turns per subscriber per turn
/// (microseconds): the server's, with the few requests that send them.
pub(crate) async fn latencies(
    client: &Client,
    url: &str,
    address: &str,
    subscribers: usize,
    turns: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, f64)> {
    let ensured: spool_wire::http::AddressReply = client
        .post(&format!("/addresses/{address}"), &json!({}))
        .await?;
    let cursor = ensured.cursor.map_or(-1, |c| c as i64);
    let mut peer = Peer::start(&[
        "subscribe".into(),
        url.into(),
        ensured.run_id.clone(),
        cursor.to_string(),
        subscribers.to_string(),
        turns.to_string(),
    ])
    .await?;
    let cpu_before = own_cpu_ms()?;
    let times = drive_turns(client, &ensured.run_id, turns, &mut peer).await?;
    let cpu = (own_cpu_ms()? - cpu_before) * 1e3 / (subscribers * turns) as f64;
    let mut all: Vec<f64> = serde_json::from_str(&peer.line().await?)?;
    peer.finish().await?;
    all.sort_by(f64::total_cmp);
    Ok((all, times, cpu))
}

/// What the floor writes to each socket each round, and who reads it.
#[derive(Clone, Copy)]
pub(crate) enum Floor {
    /// One answer line, read as bare lines (`spool-bench lines`): the
    /// floor the fan-outs were first measured against. (It is the turn's
    /// `run_response` line with its `data` and real-sized ids: about 330
    /// bytes, where the first floor's line was about 150.)
    OneLine,
    /// The seven lines a stream reads for one echo turn (its start and
    /// state, three deltas, its answer and state), all ready at once, as
    /// one HTTP/1.1 chunk of an NDJSON response, read by the same stream
    /// client the fan-out's subscribers use (`spool-bench subscribe`):
    /// the least the machine does to give those readers a turn.
    ATurn,
    /// The eight `events.append` notifications a JSON-RPC subscriber reads
    /// for one echo turn (its start and status, the model call's start,
    /// three deltas, the call's end and the turn's), all ready at once, as
    /// WebSocket text frames in one write, read by the same client the
    /// `rpc-fanout` subscribers use (`spool-bench ws-subscribe`).
    ATurnOverWebSocket,
}

impl Floor {
    /// The round's NDJSON lines, each stamped now: a whole echo turn's,
    /// or its answer line alone.
    fn lines(round: usize, whole_turn: bool) -> Vec<spool_wire::http::StreamEvent> {
        use spool_wire::http::{RunState, StreamEvent, StreamEventType as Kind};
        let now = time::OffsetDateTime::now_utc();
        let turn_id = Some(format!("turn_01a23764fee8000001{round:010}"));
        let line = |seq: u64, kind, text: Option<&str>, state, data| StreamEvent {
            run_id: "run_01a23764fc6b00000068ad3c31".into(),
            seq,
            kind,
            time: now,
            turn_id: turn_id.clone(),
            text: text.map(str::to_owned),
            state,
            data,
        };
        let seq = 4 * round as u64;
        let text = format!("turn {round}");
        let answer = format!("echo: {text}");
        let response = line(
            seq + 4,
            Kind::RunResponse,
            Some(&answer),
            Some(RunState::Completed),
            Some(json!({
                "response": answer,
                "turn_id": turn_id,
                "usage": {"input_tokens": 2, "output_tokens": 3},
            })),
        );
        if !whole_turn {
            return vec![response];
        }
        vec![
            line(
                seq + 1,
                Kind::RunTurn,
                Some(&text),
                Some(RunState::Running),
                Some(json!({"policy": "steer"})),
            ),
            line(seq + 1, Kind::RunState, None, Some(RunState::Running), None),
            line(seq + 2, Kind::TextDelta, Some("echo: "), None, None),
            line(seq + 2, Kind::TextDelta, Some("turn "), None, None),
            line(
                seq + 2,
                Kind::TextDelta,
                Some(&round.to_string()),
                None,
                None,
            ),
            response,
            line(
                seq + 4,
                Kind::RunState,
                None,
                Some(RunState::Completed),
                None,
            ),
        ]
    }

    /// The round's notifications over a WebSocket, as the server sends an
    /// echo turn's (the shapes of `spool serve`'s, each stamped now).
    fn notifications(round: usize) -> Vec<Value> {
        let now = time::OffsetDateTime::now_utc()
            .unix_timestamp_nanos()
            .to_string();
        let run = "run_01a243427a5f000000a8b4586d";
        let turn = format!("turn_01a243427ee0000001{round:010}");
        let trace = "d0cdb8981fbd912294791d0da7a89ff8";
        let span = "c896dfb7922bb2d9";
        let task = format!("model:{}", 2 + 4 * round);
        let text = format!("turn {round}");
        let record = |kind: &str, body: &str, attributes: Value, span: Option<&str>| {
            let mut params = json!({
                "attributes": attributes,
                "body": body,
                "severityNumber": 9,
                "severityText": "info",
                "spool.kind": kind,
                "timeUnixNano": now,
                "traceId": trace,
            });
            if let Some(span) = span {
                params["spanId"] = json!(span);
            }
            json!({"jsonrpc": "2.0", "method": "events.append", "params": params})
        };
        let delta = |body: &str| {
            record(
                "task:stdout",
                body,
                json!({
                    "cicd.pipeline.run.id": run,
                    "cicd.pipeline.task.name": "model",
                    "cicd.worker.id": "spool",
                    "spool.stream": "text",
                    "spool.task.id": task,
                    "spool.turn_id": turn,
                }),
                Some(span),
            )
        };
        vec![
            record(
                "run:start",
                &text,
                json!({"cicd.pipeline.run.id": run, "spool.turn_id": turn}),
                None,
            ),
            record(
                "run:status",
                "running",
                json!({"cicd.pipeline.run.id": run, "spool.state": "running"}),
                None,
            ),
            record(
                "task:start",
                "model call",
                json!({
                    "cicd.pipeline.run.id": run,
                    "cicd.pipeline.task.name": "model",
                    "cicd.worker.id": "spool",
                    "spool.task.id": task,
                }),
                Some(span),
            ),
            delta("echo: "),
            delta("turn "),
            delta(&round.to_string()),
            record(
                "task:complete",
                "model call completed",
                json!({
                    "cicd.pipeline.run.id": run,
                    "cicd.pipeline.task.name": "model",
                    "cicd.pipeline.task.run.result": "success",
                    "cicd.worker.id": "spool",
                    "gen_ai.usage.input_tokens": 2,
                    "gen_ai.usage.output_tokens": 3,
                    "spool.task.id": task,
                }),
                Some(span),
            ),
            record(
                "run:end",
                &format!("echo: {text}"),
                json!({
                    "cicd.pipeline.result": "success",
                    "cicd.pipeline.run.id": run,
                    "spool.turn_id": turn,
                }),
                None,
            ),
        ]
    }

    /// The round's bytes for one socket.
    fn bytes(self, round: usize) -> anyhow::Result<Vec<u8>> {
        use tokio_tungstenite::tungstenite::protocol::frame::Frame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        let ndjson = |whole_turn| -> anyhow::Result<Vec<u8>> {
            let mut lines = Vec::new();
            for line in Self::lines(round, whole_turn) {
                serde_json::to_writer(&mut lines, &line)?;
                lines.push(b'\n');
            }
            Ok(lines)
        };
        Ok(match self {
            Self::OneLine => ndjson(false)?,
            Self::ATurn => {
                let lines = ndjson(true)?;
                let mut chunk = format!("{:X}\r\n", lines.len()).into_bytes();
                chunk.extend_from_slice(&lines);
                chunk.extend_from_slice(b"\r\n");
                chunk
            }
            Self::ATurnOverWebSocket => {
                // A server's frames are not masked: the same bytes for
                // every socket.
                let mut frames = Vec::new();
                for notification in Self::notifications(round) {
                    Frame::message(
                        serde_json::to_vec(&notification)?,
                        OpCode::Data(Data::Text),
                        true,
                    )
                    .format(&mut frames)?;
                }
                frames
            }
        })
    }
}

/// The floor of a fan-out on this machine: one task writes a round's
/// bytes (its lines stamped as they are made, in one write) to
/// `subscribers` plain loopback sockets in turn, `rounds` times, each once
/// the reader process has every line of the last; returns every line's
/// latency (seconds, sorted) at every reader, and this process's CPU time
/// over the rounds per socket per round (microseconds).
pub(crate) async fn bare_fanout(
    subscribers: usize,
    rounds: usize,
    floor: Floor,
) -> anyhow::Result<(Vec<f64>, f64)> {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let accepting = tokio::spawn(async move {
        let mut sockets = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let (mut socket, _) = listener.accept().await?;
            socket.set_nodelay(true)?;
            if let Floor::ATurnOverWebSocket = floor {
                accept_subscriber(&mut socket).await?;
            }
            if let Floor::ATurn = floor {
                // The client's `GET`, answered as the server answers a
                // stream: a chunked NDJSON response, whose chunks follow.
                // (A `GET` has no body: the head is all it sends.)
                request_head(&mut socket).await?;
                socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n\
                          transfer-encoding: chunked\r\n\r\n",
                    )
                    .await?;
            }
            sockets.push(socket);
        }
        anyhow::Ok(sockets)
    });
    let reader: Vec<String> = match floor {
        Floor::OneLine => vec!["lines".into(), addr],
        Floor::ATurn => vec![
            "subscribe".into(),
            format!("http://{addr}"),
            "run-bare".into(),
            "-1".into(),
        ],
        Floor::ATurnOverWebSocket => vec![
            "ws-subscribe".into(),
            format!("http://{addr}"),
            "run-bare".into(),
        ],
    };
    let mut peer =
        Peer::start(&[reader, vec![subscribers.to_string(), rounds.to_string()]].concat()).await?;
    let mut sockets = accepting.await??;
    let cpu_before = own_cpu_ms()?;
    for round in 0..rounds {
        let bytes = floor.bytes(round)?;
        for socket in &mut sockets {
            socket.write_all(&bytes).await?;
        }
        anyhow::ensure!(peer.line().await? == "turn", "the readers lost a line");
    }
    let cpu = (own_cpu_ms()? - cpu_before) * 1e3 / (subscribers * rounds) as f64;
    let mut all: Vec<f64> = serde_json::from_str(&peer.line().await?)?;
    peer.finish().await?;
    all.sort_by(f64::total_cmp);
    Ok((all, cpu))
}

/// A client's request head, read to its blank line: all a `GET` sends
/// before its answer.
async fn request_head(socket: &mut tokio::net::TcpStream) -> anyhow::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(512);
    while !head.ends_with(b"\r\n\r\n") {
        anyhow::ensure!(head.len() < 8192, "a request head without its end");
        anyhow::ensure!(
            socket.read_buf(&mut head).await? > 0,
            "a client closed before its request's end"
        );
    }
    Ok(head)
}

/// Takes a `ws-subscribe` client's WebSocket handshake and its
/// `subscribe`, as the server does, and leaves the socket bare for the
/// floor's frames.
async fn accept_subscriber(socket: &mut tokio::net::TcpStream) -> anyhow::Result<()> {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    // The client sends nothing more until it has the handshake's answer,
    // so the head's read cannot take its first frame along.
    let head = String::from_utf8(request_head(socket).await?)?;
    let key = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_owned())
        })
        .context("a handshake without its key")?;
    socket
        .write_all(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\
                 connection: Upgrade\r\nsec-websocket-accept: {}\r\n\r\n",
                derive_accept_key(key.as_bytes())
            )
            .as_bytes(),
        )
        .await?;
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(&mut *socket, Role::Server, None).await;
    let request = loop {
        match ws
            .next()
            .await
            .context("a client closed before subscribing")??
        {
            tokio_tungstenite::tungstenite::Message::Text(text) => break text,
            _ => continue,
        }
    };
    let request: Value = serde_json::from_str(request.as_str())?;
    let answer = json!({
        "jsonrpc": "2.0",
        "id": request["id"],
        "result": {"channels": ["spool:events"], "subscribed": request["params"]["run_id"]},
    });
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        answer.to_string(),
    ))
    .await?;
    Ok(())
}

/// The server's resident bytes per open stream, beside the server's side
/// of a bare loopback connection.
pub(crate) async fn open_streams(client: &Client, url: &str, count: usize) -> anyhow::Result<Row> {
    // The bare connections first, then dropped, so both figures start from
    // a process that has already had that many sockets.
    let bare = bare_connection_bytes(count).await?;
    let ensured: spool_wire::http::AddressReply =
        client.post("/addresses/fanout-held", &json!({})).await?;
    let cursor = ensured.cursor.map_or(-1, |c| c as i64);
    let before = resident_bytes()?;
    let peer = Peer::start(&[
        "subscribe".into(),
        url.into(),
        ensured.run_id.clone(),
        cursor.to_string(),
        count.to_string(),
        "0".into(),
    ])
    .await?;
    let per_stream = resident_bytes()?.saturating_sub(before) as f64 / count as f64;
    peer.finish().await?;
    Ok(Row::new(
        format!("stream-fanout/{count} open streams, server"),
        per_stream,
        "B/stream",
        "bare TCP, server side",
        bare,
    )
    .lower_is_better()
    // 10 k streams in 200 MiB.
    .figure_at_most(200.0 * 1024.0 * 1024.0 / 10_000.0))
}

/// This process's resident bytes per bare loopback TCP connection it
/// accepts, `count` of them held open by another process.
pub(crate) async fn bare_connection_bytes(count: usize) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let before = resident_bytes()?;
    let accepting = tokio::spawn(async move {
        let mut held = Vec::with_capacity(count);
        for _ in 0..count {
            held.push(listener.accept().await?.0);
        }
        anyhow::Ok(held)
    });
    let peer = Peer::start(&["connect".into(), addr, count.to_string()]).await?;
    let held = accepting.await??;
    let bare = resident_bytes()?.saturating_sub(before) as f64 / count as f64;
    peer.finish().await?;
    drop(held);
    Ok(bare)
}

/// `spool-bench subscribe URL RUN CURSOR COUNT RESPONSES`: opens COUNT
/// streams on RUN from CURSOR (-1: none), says `ready`, then either holds
/// them until stdin closes (RESPONSES = 0) or reads each until it has seen
/// RESPONSES answers and prints every line's latency as one JSON array.
pub(crate) fn subscribe(args: &[String]) -> anyhow::Result<()> {
    let [url, run, cursor, count, responses] = args else {
        anyhow::bail!("usage: spool-bench subscribe URL RUN CURSOR COUNT RESPONSES");
    };
    let cursor: i64 = cursor.parse()?;
    let cursor = u64::try_from(cursor).ok();
    let count: usize = count.parse()?;
    let responses: usize = responses.parse()?;
    tokio()?.block_on(async {
        let client = Client::new(url)?;
        let mut streams = Vec::with_capacity(count);
        for i in 0..count {
            streams.push(client.stream(run, cursor).await.with_context(|| {
                format!("opening stream {i} of {count} (each is an open file: `ulimit -n` must allow {count} and more)")
            })?);
        }
        say("ready")?;
        if responses == 0 {
            let mut stdin = tokio::io::stdin();
            tokio::io::copy(&mut stdin, &mut tokio::io::sink()).await?;
            return anyhow::Ok(());
        }
        let (answered, answers) = tokio::sync::mpsc::unbounded_channel();
        let mut readers = Vec::with_capacity(count);
        for mut lines in streams {
            let answered = answered.clone();
            readers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut answers = 0;
                while answers < responses {
                    let Some(line) = lines.next().await? else {
                        anyhow::bail!("a stream ended early");
                    };
                    answers += usize::from(arrived(&line, &mut seen, &answered));
                }
                anyhow::Ok((seen, lines))
            }));
        }
        drop(answered);
        collect(readers, answers, count, responses).await
    })
}

/// Notes a line's latency, as it arrives, in `seen`; for an answer, tells
/// `answered` too. Whether it was an answer.
pub(crate) fn arrived(
    line: &spool_wire::http::StreamEvent,
    seen: &mut Vec<f64>,
    answered: &tokio::sync::mpsc::UnboundedSender<()>,
) -> bool {
    seen.push((time::OffsetDateTime::now_utc() - line.time).as_seconds_f64());
    let answer = line.kind == spool_wire::http::StreamEventType::RunResponse;
    if answer {
        let _ = answered.send(());
    }
    answer
}

/// A reader's task: the latencies it saw, and its connection.
pub(crate) type Reader<C> = tokio::task::JoinHandle<anyhow::Result<(Vec<f64>, C)>>;

/// Says `turn` each time all `count` readers have had one more answer,
/// then every latency the readers saw, as one JSON array. Each reader
/// hands back its connection with its latencies, and the connections are
/// closed only after the last turn: a reader that closed as soon as it had
/// its last answer would load the last turn's fan-out, still writing to
/// the others, with thousands of closes.
pub(crate) async fn collect<C: Send + 'static>(
    readers: Vec<Reader<C>>,
    mut answers: tokio::sync::mpsc::UnboundedReceiver<()>,
    count: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    for _ in 0..rounds {
        for _ in 0..count {
            answers
                .recv()
                .await
                .context("a reader ended before its last answer")?;
        }
        say("turn")?;
    }
    let mut all = Vec::new();
    let mut connections = Vec::with_capacity(readers.len());
    for reader in readers {
        let (seen, connection) = reader.await??;
        all.extend(seen);
        connections.push(connection);
    }
    say(&serde_json::to_string(&all)?)?;
    drop(connections);
    Ok(())
}
