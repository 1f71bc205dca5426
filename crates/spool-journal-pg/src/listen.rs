//! Hearing other processes' commits: a connection that `LISTEN`s on the
//! journal's channel and moves local subscribers' positions.
//!
//! A notification is a hint, the log the truth: a payload that does not
//! parse is ignored, and when the connection is lost (the database
//! restarted) it is made again and every watched run's head read back, so
//! a commit whose notification was lost is still announced.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use spool_journal::store::Watchers;
use spool_journal::{JournalError, RunId, Seq};
use tokio_postgres::AsyncMessage;

use crate::{Readers, Target, quote_ident, storage};

/// The payload of one run's notification: its next position and its id.
pub(crate) fn payload(run: &RunId, next: Seq) -> String {
    format!("{} {}", next.0, run.as_str())
}

fn parse(payload: &str) -> Option<(RunId, Seq)> {
    let (next, run) = payload.split_once(' ')?;
    Some((RunId::new(run).ok()?, Seq(next.parse().ok()?)))
}

/// Starts listening; the first connection is made before this returns, so
/// a journal that opened hears every commit after it.
pub(crate) async fn start(
    target: Target,
    channel: String,
    watchers: Arc<Watchers>,
    readers: Arc<Readers>,
) -> Result<tokio::task::JoinHandle<()>, JournalError> {
    let first = listen(&target, &channel).await?;
    Ok(tokio::spawn(async move {
        let mut connection = Some(first);
        let mut pause = Duration::from_millis(100);
        loop {
            let (client, mut messages) = match connection.take() {
                Some(made) => made,
                None => match listen(&target, &channel).await {
                    Ok(made) => {
                        pause = Duration::from_millis(100);
                        // What was committed while nobody listened.
                        for run in watchers.watched() {
                            match readers.next_seq(&run).await {
                                Ok(next) => watchers.advance(&run, next),
                                Err(error) => {
                                    tracing::warn!(target: "spool::journal", %error, run = %run, "re-reading a watched run's head")
                                }
                            }
                        }
                        made
                    }
                    Err(error) => {
                        tracing::warn!(target: "spool::journal", %error, "listening for other processes' commits; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(5));
                        continue;
                    }
                },
            };
            while let Some(message) = messages.recv().await {
                if let Some((run, next)) = parse(&message) {
                    watchers.advance(&run, next);
                }
            }
            drop(client);
            tracing::warn!(target: "spool::journal", "the listening connection was lost; making it again");
        }
    }))
}

type Listening = (tokio_postgres::Client, tokio::sync::mpsc::Receiver<String>);

/// Payloads waiting for the loop; when it falls behind, the connection
/// stops being read and the server holds the rest in its own queue.
const BACKLOG: usize = 4096;

/// A connection listening on `channel`, and its notifications' payloads;
/// the receiver ends when the connection does.
async fn listen(target: &Target, channel: &str) -> Result<Listening, JournalError> {
    let (client, mut connection) = target
        .config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(storage)?;
    // Notifications arrive through the connection's own message stream,
    // which this task drives in place of the usual `connection.await`.
    let (sender, receiver) = tokio::sync::mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(AsyncMessage::Notification(note)) => {
                    if sender.send(note.payload().to_owned()).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(target: "spool::journal", %error, "the listening connection ended");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", quote_ident(channel)))
        .await
        .map_err(storage)?;
    Ok((client, receiver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_reads_back_as_its_run_and_position_and_junk_is_ignored() {
        let run = RunId::new("run-1").unwrap();
        assert_eq!(parse(&payload(&run, Seq(7))), Some((run, Seq(7))));
        assert_eq!(parse("x run-1"), None);
        assert_eq!(parse("7"), None);
    }
}
