//! A writer: a task that group-commits appends, claims and probes into
//! PostgreSQL on a connection of its own (a store runs a few, each for its
//! share of the runs).
//!
//! A batch is one transaction. It first takes an advisory lock per run it
//! appends to, in run-id order (every Spool writer does the same, so two
//! never deadlock on them), and reads those runs' heads: from then on no
//! other process can append to them until this one commits, so the heads
//! it plans from are the truth. Index changes run in statement order, so
//! a later append in the batch sees an earlier one's; an append refused by
//! an index (an address another run holds) is undone to its savepoint and
//! the rest of the batch stands. The rows go in one statement and the
//! heads in another, which also notifies other processes of the runs some
//! process watches (none when nobody does), pipelined, then one `COMMIT`,
//! and only then is anyone answered or told.
//!
//! A batch of plain appends (no index changes) to runs whose heads this
//! writer wrote last, or that the batch creates, skips reading them: it is
//! planned from the heads it knows (or none) and written in one round
//! trip, the locks, one statement for the
//! rows, heads and notification (fenced inside it), and `COMMIT`
//! pipelined. A head made stale by another writer fails that statement
//! on the rows' primary key, and a fence that does not hold makes it
//! write nothing; either way the batch is then written the usual way,
//! which answers each caller as it would have.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use spool_journal::store::queue::{Done, Op};
use spool_journal::store::{
    CallRef, Claim, ClaimDecision, ClaimKey, ClaimRow, Clock, Head, IndexChange, JournalError,
    Plan, Watchers, changes_indexes, decide_claim, link,
};
use spool_journal::{Envelope, RunId, Seq};
use tokio::sync::mpsc;
use tokio_postgres::{Client, Statement};

use crate::cluster::Fence;
use crate::schema::LOCK_CLASS;
use crate::{Target, head_of, nanos, seq_sql, storage, stored_run_id, stored_seq};

mod delete;
mod known;
mod statements;
mod transact;

pub(crate) use delete::tombstone_of;
use known::*;
pub(crate) use statements::Setup;
use statements::*;
use transact::*;

/// What the writer has done, for [`crate::PgJournal::stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) commits: std::sync::atomic::AtomicU64,
    /// Of them, batches written from known heads in one round trip.
    pub(crate) known: std::sync::atomic::AtomicU64,
    pub(crate) operations: std::sync::atomic::AtomicU64,
}

pub(crate) struct Writer {
    counters: Arc<Counters>,
    target: Target,
    fence: Option<Fence>,
    announce: Announce,
    watchers: Arc<Watchers>,
    clock: Clock,
    max_batch: usize,
    receiver: mpsc::Receiver<Op>,
    connection: Option<(Client, Statements)>,
    /// The heads this writer last committed, by run: a batch of plain
    /// appends that all continue from them is written in one round trip
    /// ([`write_known`]) instead of two. Another writer appending to one
    /// of these runs meanwhile (another process, a node that took it
    /// over) makes its head stale; the rows' primary key then refuses
    /// that batch, which is written again the usual way.
    known: HashMap<RunId, Head>,
}

/// The most runs whose heads a writer keeps: past it, it forgets them all
/// and learns again from its next batches (a head is about 150 bytes).
const KNOWN_RUNS: usize = 16_384;

impl Writer {
    /// Connects, and starts the writer task; its queue is returned.
    pub(crate) async fn start(setup: Setup) -> Result<mpsc::Sender<Op>, JournalError> {
        let (sender, receiver) = mpsc::channel(setup.queue.max(1));
        let mut writer = Self {
            counters: setup.counters,
            target: setup.target,
            fence: setup.fence,
            announce: Announce {
                channel: setup.channel,
                store: setup.store,
            },
            watchers: setup.watchers,
            clock: setup.clock,
            max_batch: setup.max_batch.max(1),
            receiver,
            connection: None,
            known: HashMap::new(),
        };
        writer.connect().await?;
        tokio::spawn(writer.run());
        Ok(sender)
    }

    async fn connect(&mut self) -> Result<(), JournalError> {
        let client = self.target.connect_by_key().await?;
        let statements = Statements::prepare(&client).await.map_err(storage)?;
        self.connection = Some((client, statements));
        Ok(())
    }

    async fn run(mut self) {
        // Ends when every sender is gone: the journal was dropped.
        while let Some(first) = self.receiver.recv().await {
            let mut batch = vec![first];
            // Once the queue is empty, the writer lets the tasks already
            // woken run before it commits: a commit's answers wake many
            // callers at once, and the first of their next appends wakes
            // the writer, which without the yield would often commit that
            // one alone while the rest queue behind it. Measured with
            // `journal-append-pg` and `http-runs-pg` (docs/performance.md,
            // thirty-third): 64 runs' appends 1.45 x, with commits of 27
            // appends against 17; a lone append is not slower.
            let mut yielded = false;
            while batch.len() < self.max_batch {
                match self.receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) if !yielded => {
                        yielded = true;
                        tokio::task::yield_now().await;
                    }
                    Err(_) => break,
                }
            }
            self.commit(batch).await;
        }
    }

    /// Commits `batch`: its appends, claims and probes in one group
    /// transaction, then each deletion in one of its own.
    async fn commit(&mut self, batch: Vec<Op>) {
        let (deletions, batch): (Vec<Op>, Vec<Op>) = batch
            .into_iter()
            .partition(|op| matches!(op, Op::Delete { .. }));
        if !batch.is_empty() {
            self.commit_group(batch).await;
        }
        for op in deletions {
            let Op::Delete {
                run,
                deletion,
                reply,
            } = op
            else {
                continue;
            };
            // Forgotten whatever the outcome: the next append reads the
            // head the database holds.
            self.known.remove(&run);
            let connected = self
                .connection
                .as_ref()
                .is_some_and(|(client, _)| !client.is_closed());
            if !connected && let Err(error) = self.connect().await {
                let _ = reply.send(Err(error));
                continue;
            }
            let Some((client, _)) = self.connection.as_ref() else {
                continue;
            };
            let fence = self.fence.as_ref().map(Fence::node);
            let result = delete::delete(client, fence, &run, deletion, (self.clock)()).await;
            if result.is_ok() {
                self.counted(1);
            }
            Done::commit_all([Done::Delete(reply, run, result)], &self.watchers);
        }
    }

    async fn commit_group(&mut self, batch: Vec<Op>) {
        if self
            .connection
            .as_ref()
            .is_none_or(|(client, _)| client.is_closed())
            && let Err(error) = self.connect().await
        {
            let message = format!("nothing was recorded: the database cannot be reached: {error}");
            for op in batch {
                Done::refused(op, JournalError::Closed).fail(&message);
            }
            return;
        }
        let Some((client, statements)) = self.connection.as_ref() else {
            return;
        };
        let operations = batch.len();
        let now = (self.clock)();
        let fence = self.fence.as_ref().map(Fence::node);
        let batch = match plan_known(&self.known, batch) {
            Err(batch) => batch,
            Ok(planned) => {
                let runs: Vec<RunId> = planned.changed.keys().cloned().collect();
                match write_known(client, statements, &self.announce, fence, planned).await {
                    Known::Committed(done, changed) => {
                        self.remember(changed);
                        self.counted(operations);
                        self.counters
                            .known
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Done::commit_all(done, &self.watchers);
                        return;
                    }
                    Known::Again(refused, batch) => {
                        for run in &runs {
                            self.known.remove(run);
                        }
                        Done::commit_all(refused, &self.watchers);
                        batch
                    }
                    Known::Unknown(done, reason) => {
                        for run in &runs {
                            self.known.remove(run);
                        }
                        let message = format!(
                            "the connection to the database was lost while committing; \
                             the events may or may not be recorded (read the run to know): {reason}"
                        );
                        tracing::error!(target: "spool::journal", operations, %message, "a group commit failed");
                        self.connection = None;
                        for entry in done {
                            entry.fail(&message);
                        }
                        return;
                    }
                }
            }
        };
        let Some((client, statements)) = self.connection.as_ref() else {
            return;
        };
        let (done, outcome, changed) =
            transact(client, statements, &self.announce, fence, now, batch).await;
        if let Err(failure) = outcome {
            for run in changed.keys() {
                self.known.remove(run);
            }
            let message = match failure {
                Failure::Before(reason) => format!("nothing was recorded: {reason}"),
                Failure::Commit(reason) if client.is_closed() => format!(
                    "the connection to the database was lost while committing; \
                     the events may or may not be recorded (read the run to know): {reason}"
                ),
                Failure::Commit(reason) => format!("nothing was recorded: commit failed: {reason}"),
            };
            tracing::error!(target: "spool::journal", operations, %message, "a group commit failed");
            if !client.is_closed()
                && let Err(error) = client.batch_execute("ROLLBACK").await
            {
                tracing::debug!(%error, "rollback after a failed batch");
            }
            if client.is_closed() {
                self.connection = None;
            }
            for entry in done {
                entry.fail(&message);
            }
            return;
        }
        // Durable now: count it, answer callers, then tell subscribers.
        self.remember(changed);
        self.counted(operations);
        Done::commit_all(done, &self.watchers);
    }

    /// Heads just committed, known from now on.
    fn remember(&mut self, changed: HashMap<RunId, Head>) {
        if self.known.len() + changed.len() > KNOWN_RUNS {
            self.known.clear();
        }
        self.known.extend(changed);
    }

    /// A commit of `operations`, counted.
    fn counted(&self, operations: usize) {
        self.counters
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.counters
            .operations
            .fetch_add(operations as u64, std::sync::atomic::Ordering::Relaxed);
    }
}
