//! A channel of the host's own: a line-based TCP chat. Each connection
//! says its user name on its first line; the user's conversation is the
//! address `chat/NAME`, so a user who reconnects finds the same run. Each
//! later line is a message, or the answer when the run asked a question;
//! the answer streams back as the model writes it.
//!
//! `example-custom-channel [ADDR]` (default `127.0.0.1:0`) prints where it
//! listens; `nc 127.0.0.1 PORT` is a client.
//!
//! It is a transport as `docs/extending.md` ("Writing a transport") walks
//! through: commands go to the runtime, and what a run does comes back
//! through the activity layer (`spool_runtime::activity`), whose facts this
//! file maps to its own wire (lines of text) and nothing else.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example prints what it shows"
)]

use std::sync::Arc;

use spool_journal::RunId;
use spool_journal::event::Answer;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::activity::{Activity, Reader, TurnOutcome};
use spool_runtime::engine::Delta;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::hub::StreamItem;
use spool_runtime::{Channel, MessageRequest, Runtime};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The model: asks which region, then answers (streamed word by word).
const SCRIPT: &str = r#"{"tool_calls":[{"id":"q1","name":"ask_human","arguments":{"prompt":"Which region?"}}]}
{"text":"Deploying to the region you chose.","delay_ms":1}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(ScriptedEngine::from_jsonl(SCRIPT)?))
        .build();
    let chat = runtime.channel("chat")?;
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (socket, _) = listener.accept().await?;
        let (runtime, chat) = (runtime.clone(), chat.clone());
        tokio::spawn(async move {
            if let Err(error) = converse(&runtime, &chat, socket).await {
                eprintln!("connection ended: {error}");
            }
        });
    }
}

/// One connection: a user's lines in, the run's answers out.
async fn converse(
    runtime: &Runtime,
    chat: &Channel,
    socket: TcpStream,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    let Some(user) = lines.next_line().await? else {
        return Ok(());
    };
    write
        .write_all(format!("hello {user}\n").as_bytes())
        .await?;
    while let Some(text) = lines.next_line().await? {
        // The user's run, made (with no turn) on first use, and its stream
        // opened before anything is sent: live deltas are not kept for a
        // subscriber that comes late.
        let view = runtime.ensure(&chat.address(&user)).await?;
        let events = runtime.subscribe(&view.run_id, view.cursor).await?;
        if matches!(view.status, Status::Waiting(_)) {
            // A question waits for this line.
            let answer = Answer {
                text,
                approved: None,
            };
            runtime
                .respond(&view.run_id, view.turn_id.as_ref(), vec![answer])
                .await?;
        } else {
            let message = MessageRequest {
                text,
                ..Default::default()
            };
            chat.from(&user, message, None).await?;
        }
        follow(runtime, &view.run_id, events, &mut write).await?;
    }
    Ok(())
}

/// Writes the run's answer as it streams, until the turn ends or asks: the
/// chat's table over the run's activity.
async fn follow(
    runtime: &Runtime,
    run: &RunId,
    mut events: spool_runtime::hub::Subscription,
    write: &mut tokio::net::tcp::OwnedWriteHalf,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The subscription starts where the run was: each event is read on its
    // own (what this chat shows needs no memory of earlier ones).
    let reader = Reader::stateless();
    let mut started = false;
    while let Some(item) = events.next().await {
        let facts: Vec<Activity<'_>> = match &item {
            StreamItem::Delta(live) => vec![reader.delta(live)],
            StreamItem::Event(envelope) => reader.clone().envelope(envelope).collect(),
            // Fell behind the live deltas: the answer is in the run's view.
            StreamItem::Lagged { .. } => {
                let view = runtime.get(run).await?;
                let answer = view.response.unwrap_or_default();
                write
                    .write_all(format!("bot> {answer}\n").as_bytes())
                    .await?;
                return Ok(());
            }
        };
        for fact in facts {
            match fact {
                Activity::ModelStreamed {
                    delta: Delta::Text(piece),
                    ..
                } => {
                    if !started {
                        write.write_all(b"bot> ").await?;
                        started = true;
                    }
                    write.write_all(piece.as_bytes()).await?;
                }
                Activity::Suspended(question) => {
                    write
                        .write_all(format!("bot asks: {}\n", question.prompt).as_bytes())
                        .await?;
                    return Ok(());
                }
                Activity::TurnEnded(TurnOutcome::Completed(_)) => {
                    write.write_all(b"\n").await?;
                    return Ok(());
                }
                Activity::TurnEnded(TurnOutcome::Failed(failed)) => {
                    write
                        .write_all(format!("bot failed: {}\n", failed.message).as_bytes())
                        .await?;
                    return Ok(());
                }
                Activity::TurnEnded(TurnOutcome::Cancelled(_)) => {
                    write.write_all(b"bot: cancelled\n").await?;
                    return Ok(());
                }
                _ => {}
            }
        }
    }
    Ok(())
}
