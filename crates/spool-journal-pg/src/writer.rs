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

/// The statements a batch runs, prepared once per connection.
struct Statements {
    lock: Statement,
    heads: Statement,
    bind: Statement,
    operation: Statement,
    unbind: Statement,
    unbind_all: Statement,
    unbind_namespace: Statement,
    settle: Statement,
    release: Statement,
    claim_get: Statement,
    claim_take: Statement,
    events: Statement,
    heads_put: Statement,
    probe: Statement,
    fence_node: Statement,
    fence_leases: Statement,
    lease_take: Statement,
    /// A batch of plain appends from known heads, in one statement
    /// (rows, heads, notification), unfenced and fenced.
    known: Statement,
    known_fenced: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            // `WITH ORDINALITY … ORDER BY`: the locks are taken in the
            // array's (sorted) order.
            lock: client
                .prepare(&format!(
                    "SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext(r))
                     FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i) ORDER BY i"
                ))
                .await?,
            heads: client
                .prepare(
                    "SELECT run_id, next_seq, last_hash, status, title, created_ns, updated_ns
                     FROM spool_runs WHERE run_id = ANY($1::text[])",
                )
                .await?,
            // The upsert waits for a concurrent binder to commit and
            // returns whoever holds the name: this run, or the one to
            // refuse for.
            bind: client
                .prepare(
                    "INSERT INTO spool_addresses (namespace, name, run_id) VALUES ($1, $2, $3)
                     ON CONFLICT (namespace, name) DO UPDATE SET run_id = spool_addresses.run_id
                     RETURNING run_id",
                )
                .await?,
            operation: client
                .prepare(
                    "INSERT INTO spool_operations (scope, operation_id, run_id) VALUES ($1, $2, $3)
                     ON CONFLICT (scope, operation_id) DO UPDATE SET run_id = spool_operations.run_id
                     RETURNING run_id",
                )
                .await?,
            unbind: client
                .prepare(
                    "DELETE FROM spool_addresses WHERE namespace = $1 AND name = $2 AND run_id = $3",
                )
                .await?,
            unbind_all: client
                .prepare("DELETE FROM spool_addresses WHERE run_id = $1")
                .await?,
            unbind_namespace: client
                .prepare("DELETE FROM spool_addresses WHERE run_id = $1 AND namespace = $2")
                .await?,
            settle: client
                .prepare(
                    "UPDATE spool_claims SET output = $1, settled_seq = $2
                     WHERE run_id = $3 AND call_id = $4 AND settled_seq IS NULL",
                )
                .await?,
            release: client
                .prepare(
                    "DELETE FROM spool_claims WHERE run_id = $1 AND call_id = $2 AND settled_seq IS NULL",
                )
                .await?,
            claim_get: client
                .prepare(
                    "SELECT run_id, call_id, output, settled_seq FROM spool_claims
                     WHERE tool = $1 AND key = $2 FOR UPDATE",
                )
                .await?,
            claim_take: client
                .prepare(
                    "INSERT INTO spool_claims (tool, key, run_id, call_id) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tool, key) DO NOTHING",
                )
                .await?,
            events: client
                .prepare(
                    "INSERT INTO spool_events (run_id, seq, body, hash)
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bytea[])",
                )
                .await?,
            heads_put: client
                .prepare(&format!(
                    "WITH heads AS (
                         INSERT INTO spool_runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns, written_by)
                         SELECT *, $9 FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])
                         ON CONFLICT (run_id) DO UPDATE SET next_seq = excluded.next_seq,
                             last_hash = excluded.last_hash, status = excluded.status,
                             title = excluded.title, updated_ns = excluded.updated_ns,
                             written_by = excluded.written_by
                         RETURNING run_id, next_seq, watched_until),
                     {}
                     SELECT count(*) FROM told",
                    told_sql(8)
                ))
                .await?,
            probe: client
                .prepare(
                    "INSERT INTO spool_meta (key, value) VALUES ('probed_at', $1)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )
                .await?,
            // Both locked until the batch commits: a takeover that would
            // move them waits for it, and then sees its events.
            fence_node: client
                .prepare(
                    "SELECT expires_at > clock_timestamp() FROM spool_nodes WHERE id = $1 FOR SHARE",
                )
                .await?,
            fence_leases: client
                .prepare(
                    "SELECT l.run_id, l.node, n.address FROM spool_leases l
                     LEFT JOIN spool_nodes n ON n.id = l.node
                     WHERE l.run_id = ANY($1::text[]) FOR SHARE OF l",
                )
                .await?,
            lease_take: client
                .prepare(
                    "INSERT INTO spool_leases (run_id, node) SELECT unnest($1::text[]), $2
                     ON CONFLICT (run_id) DO NOTHING",
                )
                .await?,
            known: client.prepare(&known_sql("true", "")).await?,
            // The node alive and holding the lease of every run but those
            // the batch creates ($15), decided once for the statement, with
            // the rows locked as the usual fencing reads lock them (a
            // takeover waits for this commit); the runs created take their
            // leases. The leases are found by run alone: a condition on the
            // node could let the planner walk every lease the node holds.
            known_fenced: client
                .prepare(&known_sql(
                    "EXISTS (SELECT 1 FROM spool_nodes
                             WHERE id = $14 AND expires_at > clock_timestamp() FOR SHARE)
                     AND (SELECT count(*) FILTER (WHERE l.node = $14) FROM
                             (SELECT node FROM spool_leases
                              WHERE run_id = ANY($5::text[]) FOR SHARE) AS l)
                         = cardinality($5::text[]) - cardinality($15::text[])",
                    "taken AS (
                         INSERT INTO spool_leases (run_id, node)
                         SELECT r, $14 FROM unnest($15::text[]) AS r, fence WHERE fence.ok
                         ON CONFLICT (run_id) DO NOTHING
                         RETURNING 1),",
                ))
                .await?,
        })
    }
}

/// The statement that writes a batch planned from known heads: the rows,
/// the heads and the notification of watched runs (and `more`, further common table
/// expressions, each ending in a comma), each only when `fence` holds
/// (decided once), and how many rows and heads it wrote. A row already at
/// its position (the head known was stale, or a run it creates exists)
/// fails it with a unique violation.
fn known_sql(fence: &str, more: &str) -> String {
    format!(
        "WITH fence AS (SELECT {fence} AS ok),
         {more}
         written AS (
             INSERT INTO spool_events (run_id, seq, body, hash)
             SELECT e.run_id, e.seq, e.body, e.hash
             FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bytea[])
                  AS e(run_id, seq, body, hash), fence
             WHERE fence.ok
             RETURNING 1),
         heads AS (
             INSERT INTO spool_runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns, written_by)
             SELECT h.run_id, h.next_seq, h.last_hash, h.status, h.title, h.created_ns, h.updated_ns, $13
             FROM unnest($5::text[], $6::bigint[], $7::bytea[], $8::text[], $9::text[], $10::bigint[], $11::bigint[])
                  AS h(run_id, next_seq, last_hash, status, title, created_ns, updated_ns), fence
             WHERE fence.ok
             ON CONFLICT (run_id) DO UPDATE SET next_seq = excluded.next_seq,
                 last_hash = excluded.last_hash, status = excluded.status,
                 title = excluded.title, updated_ns = excluded.updated_ns,
                 written_by = excluded.written_by
             RETURNING run_id, next_seq, watched_until),
         {told}
         SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM heads), (SELECT count(*) FROM told)",
        told = told_sql(12)
    )
}

/// The common table expression `told`, reading the upsert `heads`
/// (`run_id, next_seq, watched_until`): a notification on the channel in
/// parameter `channel` for the runs some process watches, a line per run
/// (its next position and id, as [`crate::listen`] parses them), 40 lines at
/// most per notification (a line is at most 150 bytes; the server takes
/// 8 000). A commit to runs nobody watches sends none, and so never waits
/// for the database-wide lock under which notifying transactions commit
/// one at a time. `watched_until` comes back from the row as the upsert
/// locked it, so a watch registered meanwhile is seen: see
/// [`crate::listen`] for why no commit goes unannounced.
fn told_sql(channel: u32) -> String {
    format!(
        "told AS (
             SELECT pg_notify(${channel}, string_agg(w.next_seq || ' ' || w.run_id, E'\\n'))
             FROM (SELECT run_id, next_seq, (row_number() OVER () - 1) / 40 AS part
                   FROM heads WHERE watched_until > clock_timestamp()) AS w
             GROUP BY w.part)"
    )
}

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

/// The columns of the rows and heads a batch writes, as arrays.
#[derive(Default)]
struct Columns {
    run_ids: Vec<String>,
    seqs: Vec<i64>,
    bodies: Vec<Vec<u8>>,
    hashes: Vec<Vec<u8>>,
}

impl Columns {
    /// An append's rows, after those already in.
    fn push(&mut self, run: &RunId, rows: Vec<spool_journal::store::Row>) {
        for row in rows {
            self.run_ids.push(run.as_str().to_owned());
            self.seqs.push(seq_sql(row.seq).unwrap_or(i64::MAX));
            self.bodies.push(row.bytes);
            self.hashes.push(row.hash.to_vec());
        }
    }
}

/// What a writer's upsert of heads records and announces with: the store
/// that wrote them, and the channel on which a commit announces the runs
/// another store watches.
pub(crate) struct Announce {
    channel: String,
    store: i64,
}

/// What a writer is started with.
pub(crate) struct Setup {
    pub(crate) counters: Arc<Counters>,
    pub(crate) target: Target,
    pub(crate) fence: Option<Fence>,
    /// The notification channel.
    pub(crate) channel: String,
    /// The store's number, recorded with each head its writers write.
    pub(crate) store: i64,
    pub(crate) watchers: Arc<Watchers>,
    pub(crate) clock: Clock,
    pub(crate) max_batch: usize,
    pub(crate) queue: usize,
}

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
            while batch.len() < self.max_batch {
                match self.receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(batch).await;
        }
    }

    async fn commit(&mut self, batch: Vec<Op>) {
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

/// A batch of plain appends planned from the heads the writer knows.
struct Planned {
    /// The appends planned, in order: the caller, the run and its plan.
    appends: Vec<(AppendReply, RunId, Plan)>,
    /// Appends their plan refused (an invalid append): so answered
    /// whatever becomes of the rest.
    refused: Vec<Done>,
    /// Each run's head after the batch.
    changed: HashMap<RunId, Head>,
    /// The runs the batch creates (their first append, from no head).
    created: Vec<String>,
}

type AppendReply = tokio::sync::oneshot::Sender<Result<Vec<Envelope>, JournalError>>;

/// The batch planned from `known` heads, or the batch as it came when
/// any operation needs more than those heads (a claim, a probe, a run
/// not known that the append does not create, an append not at its known
/// head, an event that changes an index), checked before anything is
/// taken apart. A run's first append (`run_created` at position 0, of a
/// run this writer does not know) is planned from no head: if the run
/// exists after all, its first row is there and the statement fails on
/// it.
fn plan_known(known: &HashMap<RunId, Head>, batch: Vec<Op>) -> Result<Planned, Vec<Op>> {
    let plain = {
        let mut next: HashMap<&RunId, Seq> = HashMap::new();
        batch.iter().all(|op| {
            let Op::Append { run, append, .. } = op else {
                return false;
            };
            let expected = append.expected();
            let Some(at) = next
                .get(run)
                .copied()
                .or_else(|| known.get(run).map(|head| head.next_seq))
                .or_else(|| {
                    let creates = expected == Seq(0)
                        && matches!(
                            append.events().next(),
                            Some(spool_journal::Event::RunCreated(_))
                        );
                    creates.then_some(Seq(0))
                })
            else {
                return false;
            };
            if expected != at || append.events().any(changes_indexes) {
                return false;
            }
            next.insert(run, Seq(at.0 + append.len() as u64));
            true
        })
    };
    if !plain {
        return Err(batch);
    }
    let mut planned = Planned {
        appends: Vec::with_capacity(batch.len()),
        refused: Vec::new(),
        changed: HashMap::new(),
        created: Vec::new(),
    };
    for op in batch {
        let Op::Append { run, append, reply } = op else {
            unreachable!("only appends were let through");
        };
        let head = planned.changed.get(&run).or_else(|| known.get(&run));
        let creates = head.is_none();
        match link(&run, head, append) {
            Err(refused) => planned.refused.push(Done::Append(reply, Err(refused))),
            Ok(plan) => {
                if creates {
                    planned.created.push(run.as_str().to_owned());
                }
                planned.changed.insert(run.clone(), plan.head.clone());
                planned.appends.push((reply, run, plan));
            }
        }
    }
    Ok(planned)
}

/// What became of a batch written from known heads.
enum Known {
    /// Committed: the callers' answers, and the heads now known.
    Committed(Vec<Done>, HashMap<RunId, Head>),
    /// Nothing recorded (a head was stale, the fence did not hold, a
    /// statement failed): the refusals to answer, and the rest of the
    /// batch, to be written the usual way.
    Again(Vec<Done>, Vec<Op>),
    /// The connection was lost with the `COMMIT` sent: recorded or not.
    Unknown(Vec<Done>, String),
}

/// Writes a batch planned from known heads in one round trip: `BEGIN`,
/// the runs' locks (as every writer takes them), one statement writing
/// the rows, the heads and the notification when the node is alive and
/// holds every run's lease, and `COMMIT`, pipelined.
async fn write_known(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    fence: Option<i64>,
    planned: Planned,
) -> Known {
    let Planned {
        mut appends,
        refused,
        changed,
        created,
    } = planned;
    let mut columns = Columns::default();
    for (_, run, plan) in &mut appends {
        columns.push(run, std::mem::take(&mut plan.rows));
    }
    let heads = HeadColumns::of(&changed);
    let mut runs: Vec<&str> = heads.ids.clone();
    runs.sort_unstable();
    let runs_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&runs];
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &columns.run_ids,
        &columns.seqs,
        &columns.bodies,
        &columns.hashes,
    ];
    params.extend(heads.params());
    params.push(&announce.channel);
    params.push(&announce.store);
    let node;
    let statement = match fence {
        Some(fenced) => {
            node = fenced;
            params.push(&node);
            params.push(&created);
            &st.known_fenced
        }
        None => &st.known,
    };
    // Every result is awaited before any is judged, so none of the
    // pipelined statements is dropped unanswered.
    let (begun, locked, written, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.execute(&st.lock, &runs_param),
        client.query_one(statement, &params),
        client.batch_execute("COMMIT"),
    );
    let outcome = begun
        .and(locked.map(drop))
        .and(written)
        .and_then(|row| committed.map(|()| row));
    let again = |appends: Vec<(AppendReply, RunId, Plan)>, refused: Vec<Done>| {
        Known::Again(
            refused,
            appends
                .into_iter()
                .map(|(reply, run, plan)| Op::Append {
                    run,
                    append: plan.into_encoded(),
                    reply,
                })
                .collect(),
        )
    };
    match outcome {
        Ok(row) if row.get::<_, i64>(0) == columns.seqs.len() as i64 => {
            let mut done = refused;
            done.extend(appends.into_iter().map(|(reply, run, plan)| {
                Done::Append(reply, Ok((run, plan.envelopes, plan.head.next_seq)))
            }));
            Known::Committed(done, changed)
        }
        // The fence did not hold: nothing was written, and the usual way
        // tells each caller why.
        Ok(_) => again(appends, refused),
        Err(error) if client.is_closed() => {
            let mut done = refused;
            done.extend(
                appends
                    .into_iter()
                    .map(|(reply, ..)| Done::Append(reply, Err(JournalError::Closed))),
            );
            Known::Unknown(done, error.to_string())
        }
        Err(error) => {
            tracing::debug!(target: "spool::journal", %error, "a batch from known heads was not written; writing it again from the heads stored");
            again(appends, refused)
        }
    }
}

/// Heads as the columns the upserts take.
struct HeadColumns<'a> {
    ids: Vec<&'a str>,
    next: Vec<i64>,
    hashes: Vec<&'a [u8]>,
    statuses: Vec<String>,
    titles: Vec<Option<&'a str>>,
    created: Vec<i64>,
    updated: Vec<i64>,
}

impl<'a> HeadColumns<'a> {
    fn of(changed: &'a HashMap<RunId, Head>) -> Self {
        let mut columns = Self {
            ids: Vec::with_capacity(changed.len()),
            next: Vec::with_capacity(changed.len()),
            hashes: Vec::with_capacity(changed.len()),
            statuses: Vec::with_capacity(changed.len()),
            titles: Vec::with_capacity(changed.len()),
            created: Vec::with_capacity(changed.len()),
            updated: Vec::with_capacity(changed.len()),
        };
        for (run, head) in changed {
            columns.ids.push(run.as_str());
            columns
                .next
                .push(seq_sql(head.next_seq).unwrap_or(i64::MAX));
            columns.hashes.push(&head.last_hash[..]);
            columns.statuses.push(head.status.encode());
            columns.titles.push(head.title.as_deref());
            columns.created.push(nanos(head.created_at));
            columns.updated.push(nanos(head.updated_at));
        }
        columns
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 7] {
        [
            &self.ids,
            &self.next,
            &self.hashes,
            &self.statuses,
            &self.titles,
            &self.created,
            &self.updated,
        ]
    }
}

/// Why a batch did not commit.
enum Failure {
    /// Before `COMMIT` was sent: nothing is recorded.
    Before(String),
    /// `COMMIT` itself failed: recorded or not, depending on whether the
    /// server got it (the caller tells by whether the connection lives).
    Commit(String),
}

/// Applies the batch in one transaction and commits it. Every operation
/// gets a `Done`, to be answered by the caller once the outcome is known.
async fn transact(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    fence: Option<i64>,
    now: time::OffsetDateTime,
    batch: Vec<Op>,
) -> (Vec<Done>, Result<(), Failure>, HashMap<RunId, Head>) {
    let before = |e: tokio_postgres::Error| Failure::Before(e.to_string());
    let mut runs: Vec<&str> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Append { run, .. } => Some(run.as_str()),
            _ => None,
        })
        .collect();
    runs.sort_unstable();
    runs.dedup();
    // One round trip: the statements are pipelined, and the server runs
    // them in order (the run locks, then the node, then the leases, as a
    // takeover locks them, then the heads).
    let started = async {
        if runs.is_empty() {
            client.batch_execute("BEGIN").await?;
            return Ok((Vec::new(), None));
        }
        let runs_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&runs];
        let Some(node) = fence else {
            let ((), _, heads) = tokio::try_join!(
                client.batch_execute("BEGIN"),
                client.execute(&st.lock, &runs_param),
                client.query(&st.heads, &runs_param),
            )?;
            return Ok((heads, None));
        };
        let node_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&node];
        let ((), _, alive, leases, heads) = tokio::try_join!(
            client.batch_execute("BEGIN"),
            client.execute(&st.lock, &runs_param),
            client.query_opt(&st.fence_node, &node_param),
            client.query(&st.fence_leases, &runs_param),
            client.query(&st.heads, &runs_param),
        )?;
        let alive = alive.is_some_and(|row| row.get::<_, bool>(0));
        let leases: HashMap<String, (i64, Option<String>)> = leases
            .iter()
            .map(|row| (row.get::<_, String>(0), (row.get(1), row.get(2))))
            .collect();
        Ok((
            heads,
            Some(Fenced {
                node,
                alive,
                leases,
            }),
        ))
    }
    .await;
    let (stored, fenced) = match started {
        Ok(rows) => rows,
        Err(error) => {
            let done = batch
                .into_iter()
                .map(|op| Done::refused(op, JournalError::Closed))
                .collect();
            return (done, Err(before(error)), HashMap::new());
        }
    };
    let mut heads: HashMap<RunId, Head> = HashMap::with_capacity(stored.len());
    let mut broken: Option<String> = None;
    for row in &stored {
        match stored_run_id(row.get(0)).and_then(|run| Ok((head_of(&run, row, 1)?, run))) {
            Ok((head, run)) => {
                heads.insert(run, head);
            }
            Err(error) => broken = Some(error.to_string()),
        }
    }
    // Heads this transaction changes, written once per run at the end.
    let mut changed: HashMap<RunId, Head> = HashMap::new();
    // Runs with no lease yet that this batch appends to: this node's now.
    let mut leased: Vec<String> = Vec::new();
    let mut columns = Columns::default();
    let mut done = Vec::with_capacity(batch.len());
    for op in batch {
        if let Some(reason) = &broken {
            done.push(Done::refused(op, JournalError::storage(reason.clone())));
            continue;
        }
        let entry = match op {
            Op::Append { run, append, reply } => {
                let head = changed.get(&run).or_else(|| heads.get(&run));
                // Whether the append takes the run's lease (nobody holds it).
                let mut takes_lease = false;
                if let Some(fenced) = &fenced {
                    match fenced.check(&run) {
                        Ok(held) => takes_lease = !held,
                        Err(lost) => {
                            done.push(Done::Append(reply, Err(lost)));
                            continue;
                        }
                    }
                }
                match link(&run, head, append) {
                    Err(refused) => Done::Append(reply, Err(refused)),
                    Ok(plan) => match write_changes(client, st, &run, &plan.changes).await {
                        Err(error) => {
                            broken = Some(error.to_string());
                            Done::Append(reply, Err(JournalError::storage(error.to_string())))
                        }
                        Ok(Some(refused)) => Done::Append(reply, Err(refused)),
                        Ok(None) => {
                            let next = plan.head.next_seq;
                            columns.push(&run, plan.rows);
                            if takes_lease && !leased.iter().any(|r| r == run.as_str()) {
                                leased.push(run.as_str().to_owned());
                            }
                            changed.insert(run.clone(), plan.head);
                            Done::Append(reply, Ok((run, plan.envelopes, next)))
                        }
                    },
                }
            }
            Op::Claim { key, holder, reply } => match claim(client, st, &key, &holder).await {
                Ok(answer) => Done::Claim(reply, answer),
                Err(error) => {
                    broken = Some(error.to_string());
                    Done::Claim(reply, Err(JournalError::storage(error.to_string())))
                }
            },
            Op::Probe { reply } => {
                let probed_at = now
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default();
                if let Err(error) = client.execute(&st.probe, &[&probed_at]).await {
                    broken = Some(error.to_string());
                }
                Done::Probe(reply)
            }
        };
        done.push(entry);
    }
    if let Some(reason) = broken {
        return (done, Err(Failure::Before(reason)), changed);
    }
    let leases = fence
        .filter(|_| !leased.is_empty())
        .map(|node| (leased, node));
    let committed = write_and_commit(client, st, announce, &columns, &changed, leases).await;
    (done, committed, changed)
}

/// What fencing found at the start of a batch.
struct Fenced {
    node: i64,
    alive: bool,
    /// Each run's holder, with its address while it is a member.
    leases: HashMap<String, (i64, Option<String>)>,
}

impl Fenced {
    /// Whether this node may append to `run`: `Ok(true)` when it holds
    /// the run's lease, `Ok(false)` when nobody does (it takes it).
    fn check(&self, run: &RunId) -> Result<bool, JournalError> {
        let lost = |reason: String| JournalError::LeaseLost {
            run: run.clone(),
            reason,
        };
        if !self.alive {
            return Err(JournalError::Lapsed {
                run: run.clone(),
                node: self.node,
            });
        }
        match self.leases.get(run.as_str()) {
            Some((holder, _)) if *holder == self.node => Ok(true),
            Some((holder, Some(address))) => Err(lost(format!(
                "node {holder} at {address} holds its lease: send it there"
            ))),
            Some((holder, None)) => Err(lost(format!("node {holder} holds its lease"))),
            None => Ok(false),
        }
    }
}

/// The batch's rows, its heads, its notifications, the leases it takes
/// and the `COMMIT`, pipelined on the one connection: one round trip and
/// the server's fsync.
///
/// A statement that fails aborts the transaction, and the `COMMIT` behind
/// it then rolls back (the server answers it without an error), so any
/// failed statement means nothing was recorded, unless the connection
/// itself was lost, when the commit may have happened.
async fn write_and_commit(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    columns: &Columns,
    changed: &HashMap<RunId, Head>,
    leases: Option<(Vec<String>, i64)>,
) -> Result<(), Failure> {
    let outcome = write_rows(client, st, announce, columns, changed, leases.as_ref()).await;
    match outcome {
        Ok(()) => Ok(()),
        Err(error) if client.is_closed() => Err(Failure::Commit(error.to_string())),
        Err(error) => Err(Failure::Before(error.to_string())),
    }
}

async fn write_rows(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    columns: &Columns,
    changed: &HashMap<RunId, Head>,
    leases: Option<&(Vec<String>, i64)>,
) -> Result<(), tokio_postgres::Error> {
    if changed.is_empty() {
        // Claims and probes only.
        return client.batch_execute("COMMIT").await;
    }
    let rows: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [
        &columns.run_ids,
        &columns.seqs,
        &columns.bodies,
        &columns.hashes,
    ];
    let head_columns = HeadColumns::of(changed);
    let mut heads = Vec::from(head_columns.params());
    heads.push(&announce.channel);
    heads.push(&announce.store);
    let taken = async {
        match leases {
            Some((runs, node)) => client.execute(&st.lease_take, &[runs, node]).await,
            None => Ok(0),
        }
    };
    // Every result is awaited before any is judged, so none of the
    // pipelined statements is dropped unanswered.
    let (events, heads, taken, committed) = tokio::join!(
        client.execute(&st.events, &rows),
        client.execute(&st.heads_put, &heads),
        taken,
        client.batch_execute("COMMIT"),
    );
    events?;
    heads?;
    taken?;
    committed
}

/// Writes an append's index changes; `Ok(Some(refusal))` when an index
/// refuses it, with everything it wrote undone.
async fn write_changes(
    client: &Client,
    st: &Statements,
    run: &RunId,
    changes: &[IndexChange],
) -> Result<Option<JournalError>, tokio_postgres::Error> {
    if changes.is_empty() {
        return Ok(None);
    }
    let guarded = changes
        .iter()
        .any(|c| matches!(c, IndexChange::Bind(_) | IndexChange::Operation { .. }));
    if guarded {
        client.batch_execute("SAVEPOINT spool_append").await?;
    }
    let id = run.as_str();
    let mut refused = None;
    for change in changes {
        match change {
            IndexChange::Bind(address) => {
                let owner: String = client
                    .query_one(&st.bind, &[&address.namespace, &address.name, &id])
                    .await?
                    .get(0);
                if owner != id {
                    refused = Some(match stored_run_id(&owner) {
                        Ok(holder) => JournalError::AddressTaken {
                            address: address.clone(),
                            run: holder,
                        },
                        Err(error) => error,
                    });
                    break;
                }
            }
            IndexChange::Operation {
                scope,
                operation_id,
            } => {
                let owner: String = client
                    .query_one(&st.operation, &[scope, operation_id, &id])
                    .await?
                    .get(0);
                if owner != id {
                    refused = Some(match stored_run_id(&owner) {
                        Ok(holder) => JournalError::OperationTaken {
                            operation_id: operation_id.clone(),
                            run: holder,
                        },
                        Err(error) => error,
                    });
                    break;
                }
            }
            IndexChange::Unbind(address) => {
                client
                    .execute(&st.unbind, &[&address.namespace, &address.name, &id])
                    .await?;
            }
            IndexChange::UnbindAll => {
                client.execute(&st.unbind_all, &[&id]).await?;
            }
            IndexChange::UnbindNamespace(namespace) => {
                client
                    .execute(&st.unbind_namespace, &[&id, namespace])
                    .await?;
            }
            IndexChange::Settle {
                call_id,
                output,
                seq,
            } => {
                let seq = seq_sql(*seq).unwrap_or(i64::MAX);
                client
                    .execute(&st.settle, &[&output.to_string(), &seq, &id, call_id])
                    .await?;
            }
            IndexChange::Release { call_id } => {
                client.execute(&st.release, &[&id, call_id]).await?;
            }
        }
    }
    if guarded {
        if refused.is_some() {
            client
                .batch_execute("ROLLBACK TO SAVEPOINT spool_append")
                .await?;
        }
        client
            .batch_execute("RELEASE SAVEPOINT spool_append")
            .await?;
    }
    Ok(refused)
}

/// Decides a claim inside the transaction; the outer error breaks the
/// batch, the inner one answers this caller only.
async fn claim(
    client: &Client,
    st: &Statements,
    key: &ClaimKey,
    holder: &CallRef,
) -> Result<Result<Claim, JournalError>, tokio_postgres::Error> {
    // Twice at most: a claim taken by another process between our read
    // and our insert is read back (the insert waited for it to commit).
    for _ in 0..2 {
        let row = client
            .query_opt(&st.claim_get, &[&key.tool, &key.key])
            .await?;
        let existing = match row.map(|row| stored_claim(&row)).transpose() {
            Ok(existing) => existing,
            Err(error) => return Ok(Err(error)),
        };
        match decide_claim(existing, holder) {
            ClaimDecision::Take => {
                let taken = client
                    .execute(
                        &st.claim_take,
                        &[&key.tool, &key.key, &holder.run.as_str(), &holder.call_id],
                    )
                    .await?;
                if taken == 1 {
                    return Ok(Ok(Claim::Won));
                }
            }
            ClaimDecision::Answer(answer) => {
                return Ok(answer.map_err(|by| JournalError::CallInFlight { by }));
            }
        }
    }
    Ok(Err(JournalError::storage(
        "a claim was taken and gone again while it was being decided",
    )))
}

fn stored_claim(row: &tokio_postgres::Row) -> Result<ClaimRow, JournalError> {
    let output: Option<String> = row.get(2);
    let settled_seq: Option<i64> = row.get(3);
    let settled = match (output, settled_seq) {
        (Some(output), Some(seq)) => {
            let output: Value = serde_json::from_str(&output).map_err(|e| {
                JournalError::storage(format!("a settled claim's output is not JSON: {e}"))
            })?;
            Some((output, stored_seq(seq)))
        }
        _ => None,
    };
    Ok(ClaimRow {
        holder: CallRef {
            run: stored_run_id(row.get(0))?,
            call_id: row.get(1),
        },
        settled,
    })
}
