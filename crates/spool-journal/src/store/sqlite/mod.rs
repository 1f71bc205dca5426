//! The SQLite store, Spool's embedded default: `<dir>/journal.db` in WAL
//! mode, written by one thread that group-commits, each commit's log
//! synced before any caller of it is answered.
//!
//! One fsync costs milliseconds on real disks, and every durable engine is
//! bound by it, so the writer turns many appends into one commit: appends
//! (from any runs) that arrive while a commit is being written go into the
//! next transaction together, an append that would break a rule refused
//! before anything of it is written, and every caller is answered only
//! after the commit holding its events is durable. The fsync is a thread
//! of its own (the syncer): while it syncs one commit's write-ahead log
//! frames, the writer already builds the next, so a commit costs the
//! larger of SQLite's work and the disk's sync instead of their sum.
//! Reads never see an event before it is durable. The async executor
//! never waits on SQLite: the writer is a plain thread fed by a bounded
//! channel, and reads run on a small pool of separate connections in
//! `spawn_blocking`. A commit writes its events side by side in arrival
//! order; each run's index is written behind it (docs/journal.md,
//! "Layout"), and the log is copied into the database file behind it by
//! a thread of its own (`checkpoint.rs`).
//!
//! Methods must be called from within a Tokio runtime.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use super::queue::{Done, Op};
use super::{
    BoxFuture, CallRef, Claim, ClaimDecision, ClaimKey, ClaimRow, Clock, Deletion, Encoded, Head,
    IndexChange, Journal, JournalError, RunSummary, Tombstone, Watchers, decide_claim, decode_row,
    encode, link, system_clock,
};
use crate::chain::{GENESIS, Hash, Verifier};
use crate::event::{Envelope, Event, SCHEMA_VERSION};
use crate::fold::Status;
use crate::id::{Address, Principal, RunId, RunMap, Seq};

mod ahead;
mod checkpoint;
mod owner;
mod pool;
mod reads;
mod schema;
mod sql;
mod sync;
mod tail;
mod writer;

pub use owner::*;
use pool::*;
use reads::*;
use schema::*;
use sql::*;
use sync::{Committed, Durable, SyncFn, Syncing, sync_wal};
use writer::*;

/// The journal file inside the journal directory.
pub const FILE_NAME: &str = "journal.db";

/// How hard a commit holds on to its data. Named for what each risks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// An acknowledged append survives a crash and a power loss: its
    /// commit's write-ahead log is synced (`fdatasync`) before it is
    /// answered, as `synchronous=FULL` would, by the syncer thread while
    /// the writer goes on with the next commit. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL` without the syncer's sync: an acknowledged
    /// append survives a process crash, but a power loss or OS crash may
    /// lose the last commits (the log stays consistent). Faster; for runs
    /// that can be repeated.
    LoseRecentCommitsOnPowerLoss,
}

/// How to open a journal.
#[derive(Clone)]
pub struct Options {
    /// How hard commits hold on.
    pub durability: Durability,
    /// The most operations one transaction takes.
    pub max_batch: usize,
    /// How many operations may wait for the writer before callers wait.
    pub queue: usize,
    /// Where `recorded_at` comes from.
    pub clock: Clock,
    /// A write-ahead log smaller than this many bytes is left as it is
    /// when the journal closes, rather than copied into the database file
    /// and emptied; 0 (the default) always empties it. Emptying costs two
    /// syncs and a truncation at close, and the next open's first commit
    /// then syncs a new log header: about 1 ms of every one-turn `spool
    /// run`, which keeps up to [`KEEP_WAL_BELOW`]. What is left is whole
    /// (its events synced); the next open reads it back.
    pub keep_wal_below: u64,
}

/// The log a one-shot process leaves at close ([`Options::keep_wal_below`]).
/// The next open reads the whole log back (about 1 ms per MiB here), and
/// a process that finds it past this size empties it at close (2 ms): at
/// 512 KiB, about ten one-turn runs apart, one-shot runs took least on
/// average (128 KiB to 1 MiB measured).
pub const KEEP_WAL_BELOW: u64 = 512 * 1024;

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("max_batch", &self.max_batch)
            .field("queue", &self.queue)
            .field("keep_wal_below", &self.keep_wal_below)
            .finish_non_exhaustive()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Full,
            max_batch: 512,
            queue: 4096,
            clock: system_clock(),
            keep_wal_below: 0,
        }
    }
}

/// What the journal has done since it was opened: its writer's commits
/// and its reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Operations (appends and claims) those commits held; divided by
    /// `commits`, the average group size.
    pub operations: u64,
    /// Syncs that made commits durable (`fdatasync` of SQLite's
    /// write-ahead log; one sync may carry several commits, none are made
    /// under [`Durability::LoseRecentCommitsOnPowerLoss`]). `operations`
    /// divided by it: how many operations shared each sync.
    pub syncs: u64,
    /// Reads served by the read connections (a run's events, its head for
    /// a subscription, the listing, an address or operation id lookup).
    pub reads: u64,
    /// Checkpoints (the write-ahead log copied into the database file)
    /// made behind the writer by the checkpointer's thread.
    pub checkpoints: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    operations: AtomicU64,
    syncs: AtomicU64,
    reads: AtomicU64,
    checkpoints: AtomicU64,
}

/// A journal in a SQLite file.
pub struct SqliteJournal {
    counters: Arc<Counters>,
    writer: Option<mpsc::Sender<Op>>,
    /// The writer thread, joined when the journal is dropped: it commits
    /// what is queued, then empties the write-ahead log.
    writer_thread: Option<thread::JoinHandle<()>>,
    readers: Arc<ReadPool>,
    watchers: Arc<Watchers>,
    heads: Arc<Heads>,
    path: PathBuf,
    /// When callers' appends are recorded: they encode their events
    /// themselves, off the writer's thread.
    clock: Clock,
}

/// Run heads as this process's writer last committed them. The writer
/// checks an append against them without reading its run's row back, and
/// subscribing to a run the process drives takes its position from them
/// without a read (a server's every `POST /runs` subscribes to its new run
/// to answer at the turn's boundary; a read is a task on the blocking pool
/// and a read transaction). Another connection committing to the file
/// empties them at the writer's next transaction (see
/// `Writer::data_version`); until then a subscriber starts from the
/// position this process committed, and SQLite tells no process of
/// another's commits in any case.
#[derive(Debug, Default)]
struct Heads {
    map: Mutex<RunMap<Head>>,
}

impl Heads {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunMap<Head>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next(&self, run: &RunId) -> Option<Seq> {
        self.lock().get(run).map(|head| head.next_seq)
    }
}

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("path", &self.path)
            .field("read_only", &self.writer.is_none())
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        // The writer's queue closes with its last sender; it commits what
        // is queued, empties the write-ahead log and ends.
        self.writer = None;
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

impl SqliteJournal {
    /// Opens (creating when needed) the journal in `dir` for reading and
    /// writing. Blocking: call it at startup or from `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// [`JournalError::NewerSchema`] for a journal written by a newer Spool;
    /// [`JournalError::Storage`] when the directory or file cannot be used.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Self, JournalError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| JournalError::storage(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join(FILE_NAME);
        check_wal(&path)?;
        let counters = Arc::new(Counters::default());
        let sync = sync_wal(&path, options.durability, Arc::clone(&counters));
        Self::open_syncing(&path, options, counters, sync)
    }

    /// [`open`](Self::open) with the syncer's sync given: a test's, to
    /// hold a sync back or fail it.
    fn open_syncing(
        path: &Path,
        options: Options,
        counters: Arc<Counters>,
        sync: SyncFn,
    ) -> Result<Self, JournalError> {
        let mut conn = Connection::open(path).map_err(storage)?;
        plan_once(&conn)?;
        // A migration at open is synced by SQLite itself; after it the
        // syncer syncs each commit (the log stays consistent either way).
        // Before anything is written (switching to WAL writes the header):
        // a new file gives the pages deletions free back to the file
        // system (`Writer::vacuum`). SQLite takes the mode only then; a
        // journal made before keeps reusing freed pages for new events.
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
            .map_err(storage)?;
        conn.execute_batch(&format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=10000;
             PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}; PRAGMA journal_size_limit={WAL_SIZE_LIMIT};"
        ))
        .map_err(storage)?;
        // Read before the migration, which catches the heads up with the
        // log: a commit by another connection after it moves this number,
        // and the writer then reads heads from the log again.
        let version = data_version(&conn).map_err(storage)?;
        migrate(&conn)?;
        // Every byte SQLite frees, zeroed as it is freed: a deleted run's
        // rows, and the stale copies page splits leave of every row. With
        // `FAST`, or on only while deleting, copies left by earlier splits
        // stayed in the file (`tests/it/deletion.rs` found them).
        conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA secure_delete=ON")
            .map_err(storage)?;
        // From here on the log is copied into the file by the
        // checkpointer's thread (`checkpoint.rs`), not in the writer's
        // commits; the hook replaces SQLite's own checkpoints.
        let checkpointer = Arc::new(checkpoint::Checkpointer::new(
            path.to_owned(),
            Arc::clone(&counters),
        ));
        let hooked = Arc::clone(&checkpointer);
        conn.wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, frames: std::ffi::c_int| {
                hooked.committed(wal, u64::try_from(frames).unwrap_or(0))
            },
        ))
        .map_err(storage)?;
        // What the file holds is durable (SQLite recovered it from the
        // disk): reads skip only what this process commits from now on.
        let last: i64 = conn
            .query_row("SELECT coalesce(max(pos), 0) FROM events", [], |row| {
                row.get(0)
            })
            .map_err(storage)?;
        // The migration indexed any tail a crash left: the writer has
        // seen every event up to the mark.
        let through = index_mark(&conn)?;
        let tail = Arc::new(tail::Tail::default());
        tail.start(through);
        let (sender, receiver) = mpsc::channel(options.queue.max(1));
        let watchers = Arc::new(Watchers::default());
        let heads = Arc::new(Heads::default());
        let durable = Arc::new(Durable::starting_at(last));
        let syncing = Arc::new(Syncing::new(
            sync,
            options.durability == Durability::LoseRecentCommitsOnPowerLoss,
            Arc::clone(&durable),
            Arc::clone(&heads),
            Arc::clone(&watchers),
        ));
        let wal = path.with_file_name(format!("{FILE_NAME}-wal"));
        let writer = Writer {
            heads: Arc::clone(&heads),
            counters: Arc::clone(&counters),
            data_version: version,
            unindexed: 0,
            // Opening wrote the heads of any tail a crash left.
            behind: Some(RunMap::default()),
            conn,
            receiver,
            clock: Arc::clone(&options.clock),
            max_batch: options.max_batch.max(1),
            syncing: Arc::clone(&syncing),
            syncer_thread: None,
            syncer_failed: false,
            durable: Arc::clone(&durable),
            unsynced: RunMap::default(),
            commits: 0,
            keep_wal_below: options.keep_wal_below,
            ahead: (options.keep_wal_below == 0 && options.durability == Durability::Full)
                .then(|| ahead::Ahead::new(&wal, WAL_SIZE_LIMIT)),
            ahead_failing: false,
            wal,
            tail: Arc::clone(&tail),
            checkpointer,
        };
        let writer_thread = thread::Builder::new()
            .name("spool-journal-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| JournalError::storage(format!("starting the writer thread: {e}")))?;
        let mut readers = ReadPool::new(path.to_owned(), false);
        readers.durable = durable;
        readers.tail = tail;
        Ok(Self {
            counters,
            writer: Some(sender),
            writer_thread: Some(writer_thread),
            readers: Arc::new(readers),
            watchers,
            heads,
            path: path.to_owned(),
            clock: options.clock,
        })
    }

    /// Opens an existing journal for reading only, alongside a server that
    /// may have it open for writing.
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::open`], and [`JournalError::Storage`] when there
    /// is no journal in `dir`.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path = dir.as_ref().join(FILE_NAME);
        if !path.exists() {
            return Err(JournalError::storage(format!(
                "no journal at {}",
                path.display()
            )));
        }
        check_wal(&path)?;
        let mut readers = ReadPool::new(path.clone(), true);
        let opened = readers.take().and_then(|conn| {
            readers.layout = check_schema(&conn)?;
            readers.give(conn);
            Ok(())
        });
        if let Err(error) = opened {
            // Only a failure to read can be a read-only filesystem; a
            // journal that was read and said no (a newer schema) is
            // answered as it is, whatever files lie beside it.
            if !matches!(error, JournalError::Storage { .. }) {
                return Err(error);
            }
            // SQLite reads a WAL-mode file only where it can make the
            // `-shm` index beside it, so a journal on a read-only
            // filesystem is refused. With no write-ahead log left (its
            // writer stopped cleanly) the file alone is the whole journal
            // and can be read as immutable; with one, reading the file
            // alone would show an older past, so that is refused instead.
            let wal = path.with_file_name(format!("{FILE_NAME}-wal"));
            if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
                let reason = match error {
                    JournalError::Storage { message, .. } => message,
                    other => other.to_string(),
                };
                return Err(JournalError::storage(format!(
                    "{reason}; {} holds events not yet in {FILE_NAME}, and its directory cannot be written to read them: \
                     copy the directory somewhere writable and read the copy",
                    wal.display()
                )));
            }
            readers = ReadPool::new(path.clone(), true);
            readers.immutable = true;
            let conn = readers.take()?;
            readers.layout = check_schema(&conn)?;
            readers.give(conn);
        }
        Ok(Self {
            counters: Arc::default(),
            writer: None,
            writer_thread: None,
            readers: Arc::new(readers),
            watchers: Arc::new(Watchers::default()),
            heads: Arc::default(),
            path,
            clock: system_clock(),
        })
    }

    /// The journal file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits, operations and reads so far.
    #[must_use]
    pub fn stats(&self) -> WriterStats {
        use Ordering::Relaxed;
        WriterStats {
            commits: self.counters.commits.load(Relaxed),
            operations: self.counters.operations.load(Relaxed),
            syncs: self.counters.syncs.load(Relaxed),
            reads: self.counters.reads.load(Relaxed),
            checkpoints: self.counters.checkpoints.load(Relaxed),
        }
    }

    async fn send<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, JournalError>>) -> Op,
    ) -> Result<T, JournalError> {
        let writer = self.writer.as_ref().ok_or(JournalError::ReadOnly)?;
        let (reply, answer) = oneshot::channel();
        writer
            .send(op(reply))
            .await
            .map_err(|_| JournalError::Closed)?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    async fn with_reader<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, JournalError> {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let readers = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || {
            let conn = readers.take()?;
            let result = work(&conn);
            readers.give(conn);
            result
        })
        .await
        .map_err(|e| JournalError::storage(format!("a read task failed: {e}")))?
    }
}

impl Journal for SqliteJournal {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        let mut append = encode(run, expected, events, (self.clock)());
        // Hashed here, on the caller's thread, after the head this process
        // last synced for the run: a run's appends come one after another,
        // so the head is nearly always the one the writer links to (and
        // when it is not, the writer hashes again).
        let prev = if expected == Seq(0) {
            Some(GENESIS)
        } else {
            self.heads
                .lock()
                .get(run)
                .filter(|head| head.next_seq == expected)
                .map(|head| head.last_hash)
        };
        if let Some(prev) = prev {
            append.chain_after(prev);
        }
        Box::pin(self.send(move |reply| Op::Append {
            run: run.clone(),
            append,
            reply,
        }))
    }

    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: Seq,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        let run = run.clone();
        let layout = self.readers.layout;
        let readers = Arc::clone(&self.readers);
        Box::pin(self.with_reader(move |conn| {
            read_events(conn, layout, &readers.durable, &readers.tail, &run, from)
        }))
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        let layout = self.readers.layout;
        Box::pin(self.with_reader(move |conn| list_runs(conn, layout)))
    }

    fn runs_with_status(
        &self,
        status: Status,
    ) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        // One scan of the heads in SQLite, without sorting them or making
        // a summary of every run; then the runs the log's tail moved on.
        let layout = self.readers.layout;
        Box::pin(self.with_reader(move |conn| {
            in_snapshot(conn, |conn| {
                let stored = summaries(
                    conn.prepare_cached(
                        "SELECT run_id, next_seq, status, title, created_ns, updated_ns FROM runs WHERE status = ?1",
                    )
                    .map_err(storage)?,
                    params![status.encode()],
                )?;
                let mut runs = with_tail(conn, layout, stored)?;
                runs.retain(|run| run.status == status);
                Ok(runs)
            })
        }))
    }

    fn addresses(&self) -> BoxFuture<'_, Result<Vec<(Address, RunId)>, JournalError>> {
        Box::pin(self.with_reader(|conn| {
            let mut statement = conn
                .prepare_cached("SELECT namespace, name, run_id FROM addresses")
                .map_err(storage)?;
            let rows = statement
                .query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                })
                .map_err(storage)?;
            let mut found = Vec::new();
            for row in rows {
                let (namespace, name, run) = row.map_err(storage)?;
                found.push((Address::new(namespace, name), stored_run_id(&run)?));
            }
            Ok(found)
        }))
    }

    fn find_address<'a>(
        &'a self,
        address: &'a Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        let address = address.clone();
        Box::pin(self.with_reader(move |conn| {
            let run: Option<String> = conn
                .query_row(
                    "SELECT run_id FROM addresses WHERE namespace = ?1 AND name = ?2",
                    params![address.namespace, address.name],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            run.map(|r| stored_run_id(&r)).transpose()
        }))
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        let scope = principal.scope();
        let operation_id = operation_id.to_owned();
        Box::pin(self.with_reader(move |conn| {
            let run: Option<String> = conn
                .query_row(
                    "SELECT run_id FROM operations WHERE scope = ?1 AND operation_id = ?2",
                    params![scope, operation_id],
                    |row| row.get(0),
                )
                .optional()
                .map_err(storage)?;
            run.map(|r| stored_run_id(&r)).transpose()
        }))
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        Box::pin(self.send(move |reply| Op::Claim {
            key: key.clone(),
            holder: holder.clone(),
            reply,
        }))
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(self.send(|reply| Op::Probe { reply }))
    }

    fn delete<'a>(
        &'a self,
        run: &'a RunId,
        deletion: Deletion,
    ) -> BoxFuture<'a, Result<Tombstone, JournalError>> {
        Box::pin(self.send(move |reply| Op::Delete {
            run: run.clone(),
            deletion,
            reply,
        }))
    }

    fn tombstone<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, JournalError>> {
        let run = run.clone();
        Box::pin(self.with_reader(move |conn| tombstone(conn, &run)))
    }

    fn keep_definition<'a>(
        &'a self,
        digest: &'a str,
        document: &'a Value,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let document = spool_wire::canonical::canonical_json(document);
        Box::pin(self.send(move |reply| Op::Define {
            digest: digest.to_owned(),
            document,
            reply,
        }))
    }

    fn definition<'a>(
        &'a self,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, JournalError>> {
        let digest = digest.to_owned();
        Box::pin(self.with_reader(move |conn| definition(conn, &digest)))
    }

    fn subscribe<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<watch::Receiver<Seq>, JournalError>> {
        let owned = run.clone();
        let layout = self.readers.layout;
        Box::pin(async move {
            // Registered first: a commit after this is announced to it.
            let receiver = self.watchers.register(run);
            // The writer records a commit's heads before it announces them.
            if let Some(next) = self.heads.next(run) {
                self.watchers.advance(run, next);
                return Ok(receiver);
            }
            let next = self
                .with_reader(move |conn| {
                    in_snapshot(conn, |conn| load_head(conn, layout, &owned))
                        .map(|head| head.map_or(Seq(0), |h| h.next_seq))
                })
                .await?;
            self.watchers.advance(run, next);
            Ok(receiver)
        })
    }
}

#[cfg(test)]
mod tests;
