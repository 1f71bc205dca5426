//! Hearing other processes' commits: a connection that `LISTEN`s on the
//! journal's channel and moves local subscribers' positions, and the
//! watches that make other processes notify it.
//!
//! A commit notifies only for runs a store other than its writer's
//! watches: PostgreSQL commits notifying transactions one at a time under
//! a database-wide lock, sync to disk included, so notifying for every
//! commit made the nodes of a cluster queue behind each other. Each head
//! records the store that wrote it (`written_by`). A store subscribing to
//! a run another store wrote last sets the run's `watched_until`
//! ([`WATCH_FOR`] ahead), reading its head in the same statement, and
//! renews the watch while somebody watches; the runs it writes itself are
//! announced by its own writers, in process. No commit goes unannounced:
//! a writer's upsert of the run's head and the watch's update lock the
//! same row, so either the watch committed first and the writer's
//! upsert, which reads the row as it locked it, sees it and notifies, or
//! the writer committed first and the watch's statement, waiting for the
//! row, reads the head it wrote. Every [`TICK`] the listener asks again
//! about the watched runs without a watch: a run that did not exist yet,
//! or that this store wrote and another has taken over since (a cluster's
//! takeover), is then registered and its head read, so its subscribers
//! hear of such a commit within a tick. A store opened read-only
//! registers nothing and reads its watched runs' heads every tick.
//!
//! A notification is a hint, the log the truth: a payload that does not
//! parse is ignored, and when the connection is lost (the database
//! restarted) it is made again and every watch made again, its head read
//! back, so a commit whose notification was lost is still announced.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use spool_journal::store::Watchers;
use spool_journal::{JournalError, RunId, Seq};
use tokio_postgres::AsyncMessage;

use crate::{Readers, Target, quote_ident, storage};

/// How long a watch lasts unless renewed; one left behind by a process
/// that died costs notifications for that long, nothing else.
pub(crate) const WATCH_FOR: Duration = Duration::from_secs(60);

/// A watch is renewed once less than this is left, and trusted without
/// renewing while more is: far from [`WATCH_FOR`]'s end, so a commit
/// under way when it is trusted still sees it.
const RENEW_BELOW: Duration = Duration::from_secs(40);

/// How often the listener registers the watches not yet made (runs that
/// did not exist) and renews those due.
const TICK: Duration = Duration::from_secs(1);

/// The runs whose watch this process registered, and until when (by this
/// process's clock, counted from before the statement was sent, so never
/// later than the database's).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    until: std::sync::Mutex<HashMap<RunId, Instant>>,
}

impl Watches {
    fn until(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Instant>> {
        self.until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// For a new subscriber of `run`: its next position, read after its
    /// watch is known to hold. A watch registered recently enough is
    /// trusted and the head only read; otherwise the watch is registered
    /// (or renewed) if another store writes the run, and the head read by
    /// the same statement.
    pub(crate) async fn head(&self, readers: &Readers, run: &RunId) -> Result<Seq, JournalError> {
        let held = self
            .until()
            .get(run)
            .is_some_and(|until| until.saturating_duration_since(Instant::now()) > RENEW_BELOW);
        if held {
            return readers.next_seq(run).await;
        }
        let heads = self.register(readers, &[run.as_str()]).await?;
        Ok(heads.first().map_or(Seq(0), |(_, next)| *next))
    }

    /// Registers watches of those of `runs` another store writes and
    /// returns the heads of all that exist, remembering until when each
    /// watch registered holds.
    async fn register(
        &self,
        readers: &Readers,
        runs: &[&str],
    ) -> Result<Vec<(RunId, Seq)>, JournalError> {
        let sent = Instant::now();
        let heads = readers.watch(runs).await?;
        let mut until = self.until();
        Ok(heads
            .into_iter()
            .map(|(run, next, registered)| {
                if registered {
                    until.insert(run.clone(), sent + WATCH_FOR);
                }
                (run, next)
            })
            .collect())
    }

    /// The watched runs without a watch (runs this store writes, runs
    /// not created yet) or whose watch is due for renewal; the runs nobody
    /// watches any more are forgotten (their watch lapses).
    fn due(&self, watched: Vec<RunId>) -> Vec<RunId> {
        let now = Instant::now();
        let mut until = self.until();
        let watched: std::collections::HashSet<RunId> = watched.into_iter().collect();
        until.retain(|run, _| watched.contains(run));
        watched
            .into_iter()
            .filter(|run| {
                until
                    .get(run)
                    .is_none_or(|at| at.saturating_duration_since(now) <= RENEW_BELOW)
            })
            .collect()
    }

    /// Forgets every watch, so the next refresh makes them all again: for
    /// after the database may have restarted (a watch's commit does not
    /// wait for the disk, so the last ones may be gone).
    fn forget(&self) {
        self.until().clear();
    }
}

/// Registers or renews the watches due and tells the subscribers the
/// heads read with them.
async fn refresh(
    watches: &Watches,
    watchers: &Watchers,
    readers: &Readers,
) -> Result<(), JournalError> {
    let due = watches.due(watchers.watched());
    // Bounded statements: a process watching many runs renews them in
    // parts.
    for part in due.chunks(1000) {
        let runs: Vec<&str> = part.iter().map(RunId::as_str).collect();
        for (run, next) in watches.register(readers, &runs).await? {
            watchers.advance(&run, next);
        }
    }
    Ok(())
}

/// Refreshes the watches, saying so when that starts or stops failing
/// (once each, not at every tick of an outage).
async fn refresh_said(
    watches: &Watches,
    watchers: &Watchers,
    readers: &Readers,
    failing: &mut bool,
) {
    match refresh(watches, watchers, readers).await {
        Ok(()) if *failing => {
            *failing = false;
            tracing::info!(target: "spool::journal", "registering watched runs again");
        }
        Ok(()) => {}
        Err(error) if !*failing => {
            *failing = true;
            tracing::warn!(target: "spool::journal", %error, "registering watched runs failed; trying again every tick");
        }
        Err(_) => {}
    }
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
    watches: Arc<Watches>,
    readers: Arc<Readers>,
) -> Result<tokio::task::JoinHandle<()>, JournalError> {
    let first = listen(&target, &channel).await?;
    Ok(tokio::spawn(async move {
        let mut connection = Some(first);
        let mut pause = Duration::from_millis(100);
        let mut failing = false;
        loop {
            let (client, mut messages) = match connection.take() {
                Some(made) => made,
                None => match listen(&target, &channel).await {
                    Ok(made) => {
                        pause = Duration::from_millis(100);
                        // What was committed while nobody listened.
                        watches.forget();
                        refresh_said(&watches, &watchers, &readers, &mut failing).await;
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
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    message = messages.recv() => {
                        let Some(message) = message else { break };
                        for (run, next) in parse(&message) {
                            watchers.advance(&run, next);
                        }
                    }
                    _ = tick.tick() => refresh_said(&watches, &watchers, &readers, &mut failing).await,
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
        let read: Vec<(RunId, Seq)> = parse("7 run-0\n1 run-1\n30 run-2").collect();
        let run = |n: u32| RunId::new(format!("run-{n}")).unwrap();
        assert_eq!(
            read,
            vec![(run(0), Seq(7)), (run(1), Seq(1)), (run(2), Seq(30))]
        );
        let junk: Vec<(RunId, Seq)> = parse("x run-1\n7\n3 run-2").collect();
        assert_eq!(junk, vec![(run(2), Seq(3))]);
    }

    #[test]
    fn a_watch_is_due_until_registered_then_again_near_its_end_and_forgotten_when_unwatched() {
        let watches = Watches::default();
        let run = |n: u32| RunId::new(format!("run-{n}")).unwrap();
        assert_eq!(watches.due(vec![run(0), run(1)]).len(), 2);
        watches.until().insert(run(0), Instant::now() + WATCH_FOR);
        watches.until().insert(
            run(1),
            Instant::now() + RENEW_BELOW - Duration::from_secs(1),
        );
        assert_eq!(watches.due(vec![run(0), run(1)]), vec![run(1)]);
        // Nobody watches run 0 any more: it is forgotten, to lapse.
        assert_eq!(watches.due(vec![run(1)]), vec![run(1)]);
        assert!(!watches.until().contains_key(&run(0)));
    }
}
