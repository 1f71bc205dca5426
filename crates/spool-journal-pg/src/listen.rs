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

/// The most bytes one notification carries (the server's limit is 8000).
const MAX_PAYLOAD: usize = 7000;

/// The payloads announcing a commit's runs: one line per run, its next
/// position and its id, as few notifications as fit (one per commit, but
/// for commits touching hundreds of runs): a notification costs the
/// server and every listener far more than a line in one.
pub(crate) fn payloads<'a>(heads: impl Iterator<Item = (&'a RunId, Seq)>) -> Vec<String> {
    let mut payloads = vec![String::new()];
    for (run, next) in heads {
        let line = format!("{} {}", next.0, run.as_str());
        let last = payloads.last_mut().expect("there is always one");
        if !last.is_empty() && last.len() + 1 + line.len() > MAX_PAYLOAD {
            payloads.push(line);
        } else {
            if !last.is_empty() {
                last.push('\n');
            }
            last.push_str(&line);
        }
    }
    payloads
}

/// The runs and positions a payload announces; a line that does not
/// parse is skipped.
fn parse(payload: &str) -> impl Iterator<Item = (RunId, Seq)> + '_ {
    payload.lines().filter_map(|line| {
        let (next, run) = line.split_once(' ')?;
        Some((RunId::new(run).ok()?, Seq(next.parse().ok()?)))
    })
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
                for (run, next) in parse(&message) {
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
    let (client, mut connection) = target.open().await?;
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
    fn payloads_read_back_as_their_runs_and_positions_and_junk_lines_are_skipped() {
        let runs: Vec<RunId> = (0..3)
            .map(|n| RunId::new(format!("run-{n}")).unwrap())
            .collect();
        let payloads = payloads(runs.iter().zip([Seq(7), Seq(1), Seq(30)]));
        assert_eq!(payloads.len(), 1);
        let read: Vec<(RunId, Seq)> = parse(&payloads[0]).collect();
        assert_eq!(
            read,
            vec![
                (runs[0].clone(), Seq(7)),
                (runs[1].clone(), Seq(1)),
                (runs[2].clone(), Seq(30))
            ]
        );
        let junk: Vec<(RunId, Seq)> = parse("x run-1\n7\n3 run-2").collect();
        assert_eq!(junk, vec![(RunId::new("run-2").unwrap(), Seq(3))]);
    }

    #[test]
    fn a_commit_of_many_runs_is_announced_in_payloads_under_the_servers_limit() {
        let runs: Vec<RunId> = (0..1000)
            .map(|n| RunId::new(format!("run_01a22dc2c5db000000a915d{n:04}")).unwrap())
            .collect();
        let payloads = payloads(runs.iter().map(|run| (run, Seq(123_456))));
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        let read: Vec<RunId> = payloads
            .iter()
            .flat_map(|p| parse(p))
            .map(|(run, _)| run)
            .collect();
        assert_eq!(read, runs);
    }
}
