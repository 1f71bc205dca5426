//! `rpc-fanout`: many JSON-RPC clients on WebSockets (`/ws`), each
//! subscribed to one busy run, held by a second process (this binary, as
//! `spool-bench ws-subscribe`) so the server's work and memory are
//! measured apart from its clients'. As `stream-fanout` does for NDJSON:
//! the latency of each `events.append` is its arrival time minus its
//! `timeUnixNano` (the time the journal recorded the event, or a live
//! delta's sending time), at every subscriber, one turn at a time; the
//! baseline is the machine's floor: a turn's eight notifications, all
//! ready at once, as WebSocket frames in one write to each of as many
//! plain loopback sockets, read by the same client code in a second
//! process (`Floor::ATurnOverWebSocket`), with one bare line a round
//! measured beside it. Then the server's resident memory per
//! subscribed WebSocket, idle (beside a bare loopback TCP connection's),
//! and after the turns (beside the idle figure): what would show a buffer
//! that grows without bound.

use std::sync::Arc;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use spool_http::{Client, HttpChannel};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_runtime::Runtime;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::Scale;
use crate::http::{
    FanoutTarget, Floor, Peer, bare_connection_bytes, bare_fanout, collect, drive_turns,
    latency_rows, own_cpu_ms, resident_bytes, say, start, tokio,
};
use crate::report::Row;

pub(crate) fn fanout(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let subscribers = scale.pick(1_000usize, 50);
    let turns = scale.pick(20usize, 3);
    let tokio = tokio()?;
    let dir = tempfile::tempdir()?;
    tokio.block_on(async {
        let runtime = Runtime::builder(Arc::new(SqliteJournal::open(
            dir.path(),
            Options::default(),
        )?))
        .build();
        let (close_streams, closing) = watch::channel(false);
        let dispatcher = spool_rpc::Dispatcher::new(runtime.clone());
        let mut channel = HttpChannel::new(runtime, closing.clone());
        for (prefix, handler) in spool_rpc::http::routes(&dispatcher, &closing) {
            channel = channel.mount(prefix, handler)?;
        }
        let (url, stop) = start(channel.handler()).await?;
        let client = Client::new(&url)?;
        let bare_bytes = bare_connection_bytes(subscribers).await?;

        let ensured: spool_wire::http::AddressReply =
            client.post("/addresses/rpc-fanout", &json!({})).await?;
        let before = resident_bytes()?;
        let mut peer = Peer::start(&[
            "ws-subscribe".into(),
            url.clone(),
            ensured.run_id.clone(),
            subscribers.to_string(),
            turns.to_string(),
        ])
        .await?;
        // Subscribed and idle, as `stream-fanout`'s open streams are
        // measured; then again after the turns, with what they left behind.
        let idle = resident_bytes()?.saturating_sub(before) as f64 / subscribers as f64;
        let cpu_before = own_cpu_ms()?;
        drive_turns(&client, &ensured.run_id, turns, &mut peer).await?;
        let cpu = (own_cpu_ms()? - cpu_before) * 1e3 / (subscribers * turns) as f64;
        let per_client = resident_bytes()?.saturating_sub(before) as f64 / subscribers as f64;
        let mut many: Vec<f64> = serde_json::from_str(&peer.line().await?)?;
        peer.finish().await?;
        many.sort_by(f64::total_cmp);
        let (bare, bare_cpu) = bare_fanout(subscribers, turns, Floor::ATurnOverWebSocket).await?;
        let (bare_line, _) = bare_fanout(subscribers, turns, Floor::OneLine).await?;

        let prefix = format!("rpc-fanout/{subscribers} WebSocket subscribers");
        let mut rows = latency_rows(
            &prefix,
            &many,
            &bare,
            "bare sockets, a turn's frames in one write",
            FanoutTarget::P99NearTheFloor,
        );
        rows.extend(latency_rows(
            &format!("{prefix}, against one line a round,"),
            &many,
            &bare_line,
            "bare sockets, one line",
            FanoutTarget::Beside,
        ));
        rows.push(
            Row::new(
                format!("{prefix}, server CPU per subscriber per turn"),
                cpu,
                "us",
                "bare sockets per socket per round",
                bare_cpu,
            )
            .lower_is_better(),
        );
        rows.push(
            Row::new(
                format!("rpc-fanout/{subscribers} WebSocket subscribers, server"),
                idle,
                "B/client",
                "bare TCP, server side",
                bare_bytes,
            )
            .lower_is_better()
            // As an NDJSON stream's: 10 k in 200 MiB.
            .figure_at_most(200.0 * 1024.0 * 1024.0 / 10_000.0),
        );
        rows.push(
            Row::new(
                format!(
                    "rpc-fanout/{subscribers} WebSocket subscribers, server after {turns} turns"
                ),
                per_client,
                "B/client",
                "the same, before the turns",
                idle,
            )
            .lower_is_better(),
        );
        close_streams.send_replace(true);
        stop.send_replace(true);
        anyhow::Ok(rows)
    })
}

/// A client's WebSocket to `spool serve`.
pub(crate) type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// `spool-bench ws-subscribe URL RUN COUNT RESPONSES`: opens COUNT
/// WebSockets to URL's `/ws`, subscribes each to RUN, says `ready`, reads
/// each until it has seen RESPONSES `run:end` events, and prints every
/// event's latency as one JSON array.
pub(crate) fn subscribe(args: &[String]) -> anyhow::Result<()> {
    let [url, run, count, responses] = args else {
        anyhow::bail!("usage: spool-bench ws-subscribe URL RUN COUNT RESPONSES");
    };
    let addr = url
        .strip_prefix("http://")
        .context("the URL is http://HOST:PORT")?
        .to_owned();
    let count: usize = count.parse()?;
    let responses: usize = responses.parse()?;
    tokio()?.block_on(async {
        let mut sockets = Vec::with_capacity(count);
        for i in 0..count {
            sockets.push(subscribed(&addr, run, None).await.with_context(|| {
                format!("opening WebSocket {i} of {count} (each is an open file: `ulimit -n` must allow {count} and more)")
            })?);
        }
        say("ready")?;
        let (answered, answers) = tokio::sync::mpsc::unbounded_channel();
        let mut readers = Vec::with_capacity(count);
        for mut socket in sockets {
            let answered = answered.clone();
            readers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut ends = 0;
                while ends < responses {
                    let message = socket.next().await.context("a socket closed early")??;
                    let Message::Text(text) = message else {
                        continue;
                    };
                    let envelope: Value = serde_json::from_str(text.as_str())?;
                    if envelope["method"] != "events.append" {
                        continue;
                    }
                    let event = &envelope["params"];
                    let sent: i128 = event["timeUnixNano"]
                        .as_str()
                        .context("an event has its time")?
                        .parse()?;
                    let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
                    seen.push((now - sent) as f64 / 1e9);
                    if event["spool.kind"] == "run:end" {
                        ends += 1;
                        let _ = answered.send(());
                    }
                }
                anyhow::Ok((seen, socket))
            }));
        }
        drop(answered);
        collect(readers, answers, count, responses).await
    })
}

/// A WebSocket to `addr`'s `/ws`, its writes not held back.
pub(crate) async fn websocket(addr: &str) -> anyhow::Result<Socket> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (socket, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), stream).await?;
    Ok(socket)
}

/// The next JSON-RPC envelope the server sends on `socket`.
pub(crate) async fn envelope(socket: &mut Socket) -> anyhow::Result<Value> {
    loop {
        let message = socket
            .next()
            .await
            .context("the server closed the WebSocket")??;
        if let Message::Text(text) = message {
            return Ok(serde_json::from_str(text.as_str())?);
        }
    }
}

/// A WebSocket to `addr`'s `/ws`, subscribed to `run` from after
/// `cursor` (from its start without one).
pub(crate) async fn subscribed(
    addr: &str,
    run: &str,
    cursor: Option<u64>,
) -> anyhow::Result<Socket> {
    let mut socket = websocket(addr).await?;
    let mut params = json!({ "run_id": run });
    if let Some(cursor) = cursor {
        params["cursor"] = cursor.into();
    }
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": params});
    socket.send(Message::text(request.to_string())).await?;
    let answer = envelope(&mut socket).await?;
    anyhow::ensure!(
        answer["result"]["subscribed"] == run,
        "subscribing failed: {answer}"
    );
    Ok(socket)
}
