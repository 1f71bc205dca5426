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
    BoxFuture, CallRef, Claim, ClaimDecision, ClaimKey, ClaimRow, Clock, Encoded, Head,
    IndexChange, Journal, JournalError, RunSummary, Watchers, decide_claim, decode_row, encode,
    link, system_clock,
};
use crate::chain::{GENESIS, Hash, Verifier};
use crate::event::{Envelope, Event, SCHEMA_VERSION};
use crate::fold::Status;
use crate::id::{Address, Principal, RunId, RunMap, Seq};

mod ahead;
mod checkpoint;
mod sync;
mod tail;
use sync::{Committed, Durable, SyncFn, Syncing, sync_wal};

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

/// The event tables of a new journal (layout version `STORE_VERSION`).
///
/// Events sit in arrival order (`pos`, the rowid), so a group commit's
/// events are written side by side at the end of one B-tree instead of
/// each in its own run's place: keeping a `(run_id, seq)` B-tree in the
/// commit cost three quarters of SQLite's appends/s at 64 runs, because
/// every run's rows dirtied their own leaf pages (see docs/performance.md).
/// The per-run index, `event_index`, is written behind the commits in
/// batches (`INDEX_BATCH` events, without an fsync of its own), and
/// `indexed.through` says how far it reaches: a read takes the indexed
/// part through it and scans the short tail of events after it, and
/// opening the journal indexes whatever tail a crash left.
const EVENT_TABLES: &str = "
CREATE TABLE events (
    pos INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    hash BLOB NOT NULL
);
CREATE TABLE event_index (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    pos INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE indexed (through INTEGER NOT NULL);
INSERT INTO indexed (through) VALUES (0);
";

/// The rest of a journal's tables: run heads and the indexes commands
/// check (addresses, operation ids, idempotency claims).
///
/// A run's row in `runs` is its head as of the index's mark
/// (`indexed.through`), written with the index in its batches, not by
/// every commit: rewriting the heads of the runs a commit touched dirtied
/// pages of their own all over the table (a fifth of appends/s at 64
/// runs, see docs/performance.md). A head is its row moved on by the run's
/// events after the mark (`load_head`), and opening the journal writes the
/// heads of whatever tail a crash left.
const SCHEMA: &str = "
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL,
    last_hash BLOB NOT NULL,
    status TEXT NOT NULL,
    title TEXT,
    created_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE addresses (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
CREATE INDEX addresses_run ON addresses (run_id);
CREATE TABLE operations (
    scope TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (scope, operation_id)
) WITHOUT ROWID;
CREATE TABLE claims (
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    output TEXT,
    settled_seq INTEGER,
    PRIMARY KEY (tool, key)
) WITHOUT ROWID;
CREATE UNIQUE INDEX claims_holder ON claims (run_id, call_id);
";

/// The journal's layout, recorded as `store_version` in `meta` (apart from
/// `schema_version`, the events' vocabulary). Version 1 (no
/// `store_version`) kept events in a `(run_id, seq)` B-tree; opening such
/// a journal for writing migrates it, and a read-only open reads it as it
/// is. Version 2 wrote every run's head with each commit; version 3 keeps
/// the same tables and writes heads behind, with the index, so a build
/// that reads heads from their rows alone must not open it (it would
/// append after a stale head).
const STORE_VERSION: u32 = 3;

/// How many events the writer lets go unindexed before it indexes them in
/// a transaction of their own. The larger, the fewer index pages each
/// event costs (64 runs appending: each run's leaf page written once per
/// batch, not once per commit); the smaller, the shorter the tail a
/// listing of runs, or a read from another process, scans and decodes
/// (about 100 µs for a full one). A read in this process scans only from
/// its run's first event in the tail (`tail.rs`), and the writer reads no
/// tail at all. 4 096 was tried: no more appends per second on this
/// project's disk (three interleaved runs), and a listing four times the
/// work.
const INDEX_BATCH: usize = 1_024;

/// A commit's one statement per event.
const INSERT_EVENT: &str = "INSERT INTO events (run_id, seq, body, hash) VALUES (?1, ?2, ?3, ?4)";

/// Takes the unindexed tail into `event_index` and moves the mark; the
/// same statement serves the writer's batches, an open after a crash and
/// a migration, and it indexes what any writer of the file appended.
const INDEX_TAIL: &str = "
INSERT OR IGNORE INTO event_index (run_id, seq, pos)
    SELECT run_id, seq, pos FROM events WHERE pos > (SELECT through FROM indexed) ORDER BY pos;
UPDATE indexed SET through = (SELECT coalesce(max(pos), 0) FROM events);
";

/// How far the per-run index reaches: the last event position it holds.
fn index_mark(conn: &Connection) -> Result<i64, JournalError> {
    conn.prepare_cached("SELECT through FROM indexed")
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
        .map_err(storage)
}

/// A version-1 journal's events (in a table renamed `events_by_run`),
/// moved into the arrival-order table in run order, so `pos` grows with
/// `seq` within each run as reads need.
const MOVE_BY_RUN: &str = "
INSERT INTO events (run_id, seq, body, hash)
    SELECT run_id, seq, body, hash FROM events_by_run ORDER BY run_id, seq;
DROP TABLE events_by_run;
";

/// Where a journal's events are, as its reads need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Version 1: one `(run_id, seq)` B-tree (read-only opens of a journal
    /// no writer has migrated yet).
    ByRun,
    /// Versions 2 and 3: arrival order, indexed behind (and, in version 3,
    /// heads written behind with the index).
    InArrivalOrder,
}

/// WAL pages at which the writer copies what the checkpointer's thread
/// has not yet into the database file, so the log starts over
/// (`checkpoint.rs`). SQLite's default (1 000) checkpoints every dozen
/// commits when many runs append at once, and each checkpoint rewrites the
/// same hot B-tree pages and syncs the file; ten times the window writes
/// each hot page once per hundred commits: +16 % appends/s at 64 runs
/// with `synchronous=FULL`, +28 % with `NORMAL` (`cargo xtask bench
/// --only journal-append`, three runs each). Unless a long read holds a
/// checkpoint back, the WAL stays under about 40 MiB.
const WAL_CHECKPOINT_PAGES: u32 = 10_000;

/// What a WAL file is cut back to after a checkpoint empties it, should a
/// long read have let it grow past the checkpoint window.
const WAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// The lock file that marks a journal's owner.
pub const OWNER_FILE: &str = "owner.lock";

/// The claim of one process to drive a journal's runs: an exclusive
/// advisory lock on `owner.lock` in the journal's directory, held until
/// dropped (or the process dies, when the OS lets it go).
///
/// The store itself stays safe under several writers (an append checks
/// the run's head, so a chain never forks); what one owner protects is the
/// runtime above it: two processes recovering the same journal would both
/// resume its interrupted turns and run their tools twice. `spool serve`,
/// `spool run` and `spool chat` claim the journal before they open it.
#[derive(Debug)]
pub struct Owner {
    _file: std::fs::File,
}

impl Owner {
    /// Claims the journal in `dir` (creating the directory when needed)
    /// for this process.
    ///
    /// # Errors
    ///
    /// [`JournalError::InUse`] when another process holds it, with that
    /// process's id; [`JournalError::Storage`] when the lock file cannot
    /// be used.
    pub fn claim(dir: impl AsRef<Path>) -> Result<Self, JournalError> {
        use std::io::{Read, Write};
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| JournalError::storage(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join(OWNER_FILE);
        let failed = |e: std::io::Error| JournalError::storage(format!("{}: {e}", path.display()));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // The holder's pid is a courtesy in the message; without
                // it the refusal stands all the same.
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(JournalError::InUse {
                    dir: dir.to_owned(),
                    holder: holder.trim().parse().ok(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
        }
        // The holder's pid, for the message another process shows: written
        // over the last one, and the file cut only when that was longer.
        // A truncation costs a synchronous journal update even to the same
        // length (ext4: 0.3 ms, traced, of a one-shot run's 6 to 9), and
        // to nothing it freed the file's block only to allocate another.
        let pid = std::process::id().to_string();
        let before = file.metadata().map_err(failed)?.len();
        file.write_all(pid.as_bytes()).map_err(failed)?;
        if before > pid.len() as u64 {
            file.set_len(pid.len() as u64).map_err(failed)?;
        }
        Ok(Self { _file: file })
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
        conn.execute_batch("PRAGMA synchronous=NORMAL")
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

/// The writer thread's state.
struct Writer {
    counters: Arc<Counters>,
    conn: Connection,
    receiver: mpsc::Receiver<Op>,
    clock: Clock,
    max_batch: usize,
    /// Run heads as last committed and synced, so an append need not read
    /// its run's row back. Another process committing to the file clears
    /// it (see `data_version`).
    heads: Arc<Heads>,
    /// Heads committed but not yet synced, with the commit that wrote
    /// them: the syncer makes them the journal's once their commit is
    /// synced, and the writer forgets them then.
    unsynced: RunMap<(u64, Head)>,
    /// Commits so far, counted to match heads with their sync.
    commits: u64,
    /// Where commits are made durable.
    syncing: Arc<Syncing>,
    /// The syncer's thread, started at the first commit handed over (a
    /// process whose appends come one at a time, as `spool run`'s do,
    /// syncs each itself and never starts it), joined when the writer
    /// stops.
    syncer_thread: Option<thread::JoinHandle<()>>,
    /// The syncer's thread could not be started: the writer syncs every
    /// commit itself.
    syncer_failed: bool,
    durable: Arc<Durable>,
    /// SQLite's count of commits by *other* connections, as of our last
    /// transaction (or the open): when it moves, our cached heads may be
    /// stale.
    data_version: i64,
    /// Events committed since the index last took the tail.
    unindexed: usize,
    /// The heads of the runs this writer appended to since the index last
    /// took the tail, which the index writes to their rows; `None` when
    /// another connection may have appended too (see `data_version`), and
    /// the index reads the tail's heads from the log instead.
    behind: Option<RunMap<Head>>,
    /// See [`Options::keep_wal_below`].
    keep_wal_below: u64,
    /// Written blocks kept ahead of the log's last frame (`ahead.rs`): for
    /// a journal that syncs every commit and empties its log at close;
    /// `None` for one that keeps a small log for the next process, whose
    /// size decides that, or does not sync.
    ahead: Option<ahead::Ahead>,
    /// Writing the log ahead failed at the last try.
    ahead_failing: bool,
    /// The write-ahead log's file.
    wal: PathBuf,
    /// Where each run's events after the index's mark begin, for reads.
    tail: Arc<tail::Tail>,
    /// Copies the log into the database file behind the writer.
    checkpointer: Arc<checkpoint::Checkpointer>,
}

/// The most heads kept; past it the cache starts over, so memory stays
/// bounded however many runs a journal holds. A head saves one indexed
/// read per append, which matters for the runs appending now, not for the
/// many that finished: 4,096 covers far more runs than are in a turn at
/// once, and keeps the cache under a megabyte (at 65,536, a server that
/// served 50,000 one-turn runs held 11 MB more for heads it never used).
const MAX_CACHED_HEADS: usize = 4_096;

/// Why an operation did not apply.
enum Failed {
    /// Refused before it wrote anything: only its caller is told.
    Refused(JournalError),
    /// SQLite failed part-way: the whole transaction must be rolled back.
    Broken(JournalError),
}

impl Writer {
    fn run(mut self) {
        // Ends when every sender is gone: the journal was dropped.
        while let Some(first) = self.receiver.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match self.receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        // Every commit synced and answered before the log is emptied.
        self.syncing.close();
        if let Some(thread) = self.syncer_thread.take() {
            let _ = thread.join();
        }
        if self.unindexed > 0 {
            self.index_tail();
        }
        self.checkpointer.close();
        if self.keeps_wal() {
            return;
        }
        // A clean stop leaves everything in the database file and the
        // write-ahead log empty (it reached tens of MiB under load, and
        // stayed that size on disk after a stop).
        if let Err(error) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
            tracing::warn!(target: "spool::journal", %error, "the write-ahead log was not emptied at close");
        }
    }

    /// Whether the log is left as it is at close (smaller than
    /// [`Options::keep_wal_below`]): then no connection checkpoints it as
    /// it closes, which SQLite's last connection otherwise does, syncing
    /// and deleting the log. Every commit of events in it was synced; the
    /// index written just before is not, and a power loss that takes it
    /// back leaves a tail the next open indexes again.
    fn keeps_wal(&self) -> bool {
        let small = std::fs::metadata(&self.wal)
            .is_ok_and(|file| file.len() > 0 && file.len() < self.keep_wal_below);
        if !small || self.durable.failure().is_some() {
            return false;
        }
        match self
            .conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        {
            Ok(_) => {
                self.durable.wal_kept.store(true, Ordering::Release);
                true
            }
            Err(error) => {
                tracing::warn!(target: "spool::journal", %error, "the write-ahead log is emptied at close after all");
                false
            }
        }
    }

    fn commit(&mut self, batch: Vec<Op>) {
        if let Some(failure) = self.durable.failure() {
            return fail_all(batch, &failure);
        }
        if let Err(error) = self.begin() {
            return fail_all(batch, &format!("could not begin a transaction: {error}"));
        }
        // Heads this transaction changes; they join the cache only once it
        // commits.
        // Sized once: grown append by append, it was rehashed a handful
        // of times in every commit.
        let mut pending: RunMap<Head> =
            RunMap::with_capacity_and_hasher(batch.len(), Default::default());
        let mut done = Vec::with_capacity(batch.len());
        let mut firsts = Vec::new();
        let mut appended = 0;
        // Taken from the statement cache once per commit, not per append.
        let mut insert = match self.conn.prepare_cached(INSERT_EVENT) {
            Ok(insert) => insert,
            Err(error) => {
                // Nothing was written: the transaction is let go.
                let _ = self.conn.execute_batch("ROLLBACK");
                return fail_all(
                    batch,
                    &format!("could not prepare the events' insert: {error}"),
                );
            }
        };
        let mut broken: Option<String> = None;
        for op in batch {
            if broken.is_some() {
                done.push(Done::refused(
                    op,
                    JournalError::storage("the batch's transaction failed"),
                ));
                continue;
            }
            let entry = match op {
                Op::Append { run, append, reply } => {
                    match self.append(&mut insert, &mut pending, &mut firsts, &run, append) {
                        Ok((envelopes, next)) => {
                            appended += envelopes.len();
                            Done::Append(reply, Ok((run, envelopes, next)))
                        }
                        Err(Failed::Refused(error)) => Done::Append(reply, Err(error)),
                        Err(Failed::Broken(error)) => {
                            broken = Some(error.to_string());
                            Done::Append(reply, Err(error))
                        }
                    }
                }
                Op::Claim { key, holder, reply } => match claim(&self.conn, &key, &holder) {
                    Ok(claim) => Done::Claim(reply, Ok(claim)),
                    Err(error @ JournalError::CallInFlight { .. }) => {
                        Done::Claim(reply, Err(error))
                    }
                    Err(error) => {
                        broken = Some(error.to_string());
                        Done::Claim(reply, Err(error))
                    }
                },
                Op::Probe { reply } => {
                    let probed_at = (self.clock)()
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default();
                    if let Err(error) = self.conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('probed_at', ?1) \
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        params![probed_at],
                    ) {
                        broken = Some(error.to_string());
                    }
                    Done::Probe(reply)
                }
            };
            done.push(entry);
        }
        // Back to the cache before the commit.
        drop(insert);
        let committing = std::time::Instant::now();
        let last_pos = if appended > 0 {
            self.conn.last_insert_rowid()
        } else {
            0
        };
        let failure = match broken {
            Some(reason) => Some(reason),
            None => {
                // Before the commit shows its events to readers: they skip
                // them until the syncer has synced them.
                self.durable.written.fetch_max(last_pos, Ordering::AcqRel);
                self.tail.commit(firsts, last_pos);
                exec(&self.conn, "COMMIT", [])
                    .err()
                    .map(|e| format!("commit failed: {e}"))
            }
        };
        if let Some(reason) = failure {
            tracing::error!(operations = done.len(), %reason, "a group commit failed; nothing of it was recorded");
            // Nothing of this batch is durable; say so to every caller, and
            // forget cached heads in case the failure left them doubtful.
            if let Err(error) = self.conn.execute_batch("ROLLBACK") {
                // SQLite rolls a failed COMMIT back itself; a ROLLBACK with
                // no transaction open is refused, and that is harmless.
                tracing::debug!(%error, "rollback after a failed commit");
            }
            self.heads.lock().clear();
            self.unsynced.clear();
            self.tail.forget();
            let message = format!("nothing was recorded: {reason}");
            for entry in done {
                entry.fail(&message);
            }
            return;
        }
        tracing::debug!(
            operations = done.len(),
            commit_ms = committing.elapsed().as_secs_f64() * 1e3,
            "group commit"
        );
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .operations
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        self.commits += 1;
        for (run, head) in &pending {
            self.unsynced
                .insert(run.clone(), (self.commits, head.clone()));
            if let Some(behind) = &mut self.behind {
                behind.insert(run.clone(), head.clone());
            }
        }
        let committed = Committed {
            number: self.commits,
            done,
            heads: pending,
            last_pos,
        };
        let alone =
            self.receiver.is_empty() || !self.syncing.hands_over() || !self.syncer_running();
        self.syncing.submit(committed, alone);
        self.unindexed += appended;
        if self.unindexed >= INDEX_BATCH {
            self.index_tail();
        }
    }

    /// Whether the syncer's thread runs, started now if it does not yet:
    /// when it cannot start, the writer syncs on its own, slower but
    /// just as durable.
    fn syncer_running(&mut self) -> bool {
        if self.syncer_thread.is_some() {
            return true;
        }
        if self.syncer_failed {
            return false;
        }
        let syncing = Arc::clone(&self.syncing);
        match thread::Builder::new()
            .name("spool-journal-sync".into())
            .spawn(move || syncing.run())
        {
            Ok(thread) => {
                self.syncer_thread = Some(thread);
                true
            }
            Err(error) => {
                tracing::error!(target: "spool::journal", %error, "the syncer thread did not start; the writer syncs each commit itself");
                self.syncer_failed = true;
                false
            }
        }
    }

    /// Indexes the events committed since the last time, in a transaction
    /// nobody waits on a sync for: an index a power loss takes back is
    /// rebuilt from the events at open, and the next commit's sync covers
    /// it (the log is written in order).
    fn index_tail(&mut self) {
        let indexed = in_transaction(&self.conn, "indexing appended events", |conn| {
            // Another connection may have appended since our last commit
            // (the next `begin` forgets our heads for it): then ours may
            // be stale, and the tail's heads are read from the log.
            let known = if data_version(conn).map_err(storage)? == self.data_version {
                self.behind.as_ref()
            } else {
                None
            };
            catch_up(conn, known)
        });
        // The mark the index reached, for reads to start the tail after.
        let indexed = indexed.and_then(|()| index_mark(&self.conn));
        match indexed {
            Ok(through) => {
                self.unindexed = 0;
                self.behind = Some(RunMap::default());
                self.tail.start(through);
            }
            // Reads scan the longer tail meanwhile; the next commit tries
            // again.
            Err(error) => {
                tracing::warn!(target: "spool::journal", %error, "indexing waits for the next batch")
            }
        }
    }

    /// Begins the write transaction, forgets the unsynced heads the
    /// syncer has made the journal's, and drops cached heads if another
    /// connection has committed since our last one.
    fn begin(&mut self) -> rusqlite::Result<()> {
        let synced = self.durable.synced_commit.load(Ordering::Acquire);
        self.unsynced.retain(|_, (commit, _)| *commit > synced);
        exec(&self.conn, "BEGIN IMMEDIATE", [])?;
        let version = data_version(&self.conn)?;
        if self.data_version != version {
            self.heads.lock().clear();
            self.unsynced.clear();
            // Another connection may have appended to these runs: until
            // the next index, their rows are moved on from the log, and
            // reads scan the whole tail.
            self.behind = None;
            self.tail.forget();
            self.data_version = version;
        }
        // Under the log's write lock: nobody else appends frames now.
        if let Some(ahead) = &mut self.ahead {
            match ahead.keep() {
                Ok(written) => {
                    if written > 0 {
                        tracing::debug!(target: "spool::journal", bytes = written, "the write-ahead log's file written ahead of its frames");
                    }
                    self.ahead_failing = false;
                }
                // Only speed is lost (SQLite grows the file itself), and
                // the next commit tries again: a full disk may have room
                // by then. Said once per spell of failures.
                Err(error) => {
                    if !self.ahead_failing {
                        tracing::warn!(target: "spool::journal", %error, "the write-ahead log could not be written ahead of its frames");
                    }
                    self.ahead_failing = true;
                }
            }
        }
        Ok(())
    }

    /// The run's head, and whether this writer already put events of it
    /// after the index's mark (the head came from this transaction, an
    /// unsynced commit or the heads kept for the index).
    fn head(
        &self,
        pending: &RunMap<Head>,
        run: &RunId,
    ) -> Result<(Option<Head>, bool), JournalError> {
        if let Some(head) = pending.get(run) {
            return Ok((Some(head.clone()), true));
        }
        if let Some((_, head)) = self.unsynced.get(run) {
            return Ok((Some(head.clone()), true));
        }
        if let Some(head) = self.behind.as_ref().and_then(|behind| behind.get(run)) {
            return Ok((Some(head.clone()), true));
        }
        if let Some(head) = self.heads.lock().get(run) {
            return Ok((Some(head.clone()), false));
        }
        if self.behind.is_some() {
            // Every run with events after the index's mark is in `behind`
            // (this writer wrote the whole tail), so this one's row is its
            // head: no scan of the tail, which a new run's first append
            // paid for every run created.
            return Ok((stored_head(&self.conn, run)?, false));
        }
        Ok((load_head(&self.conn, Layout::InArrivalOrder, run)?, false))
    }

    fn append(
        &self,
        insert: &mut rusqlite::CachedStatement<'_>,
        pending: &mut RunMap<Head>,
        firsts: &mut Vec<(RunId, i64)>,
        run: &RunId,
        append: Encoded,
    ) -> Result<(Vec<Envelope>, Seq), Failed> {
        let (head, in_tail) = self.head(pending, run).map_err(Failed::Broken)?;
        let plan = link(run, head.as_ref(), append).map_err(Failed::Refused)?;
        // Every refusal is decided before anything is written: an unbind only
        // releases this run's own names, so the checks do not depend on
        // their order, and earlier operations of this transaction are
        // visible to them.
        check_indexes(&self.conn, run, &plan.changes)?;
        write_plan(&self.conn, insert, run, &plan).map_err(Failed::Broken)?;
        // The run's first events after the index's mark: where reads of
        // it start scanning the tail (`tail.rs`). Without `behind` the
        // positions are forgotten until the next index anyway.
        if !in_tail && self.behind.is_some() {
            let count = i64::try_from(plan.rows.len()).unwrap_or(i64::MAX);
            firsts.push((run.clone(), self.conn.last_insert_rowid() - (count - 1)));
        }
        let next = plan.head.next_seq;
        pending.insert(run.clone(), plan.head);
        Ok((plan.envelopes, next))
    }
}

/// A number SQLite moves whenever a connection other than `conn` commits
/// to the file.
fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |row| row.get(0))
}

fn fail_all(batch: Vec<Op>, message: &str) {
    let message = format!("nothing was recorded: {message}");
    for op in batch {
        Done::refused(op, JournalError::storage(message.clone())).fail(&message);
    }
}

fn check_indexes(conn: &Connection, run: &RunId, changes: &[IndexChange]) -> Result<(), Failed> {
    for change in changes {
        match change {
            IndexChange::Bind(address) => {
                let owner: Option<String> = conn
                    .prepare_cached(
                        "SELECT run_id FROM addresses WHERE namespace = ?1 AND name = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![address.namespace, address.name], |row| row.get(0))
                            .optional()
                    })
                    .map_err(|e| Failed::Broken(storage(e)))?;
                if let Some(owner) = owner.filter(|o| o != run.as_str()) {
                    return Err(Failed::Refused(JournalError::AddressTaken {
                        address: address.clone(),
                        run: stored_run_id(&owner).map_err(Failed::Broken)?,
                    }));
                }
            }
            IndexChange::Operation {
                scope,
                operation_id,
            } => {
                let owner: Option<String> = conn
                    .prepare_cached(
                        "SELECT run_id FROM operations WHERE scope = ?1 AND operation_id = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![scope, operation_id], |row| row.get(0))
                            .optional()
                    })
                    .map_err(|e| Failed::Broken(storage(e)))?;
                if let Some(owner) = owner.filter(|o| o != run.as_str()) {
                    return Err(Failed::Refused(JournalError::OperationTaken {
                        operation_id: operation_id.clone(),
                        run: stored_run_id(&owner).map_err(Failed::Broken)?,
                    }));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes a checked plan's index changes and rows (not its head: heads are
/// written once per run per transaction, by `write_heads`).
fn write_plan(
    conn: &Connection,
    insert: &mut rusqlite::CachedStatement<'_>,
    run: &RunId,
    plan: &super::Plan,
) -> Result<(), JournalError> {
    for change in &plan.changes {
        match change {
            IndexChange::Bind(address) => exec(
                conn,
                "INSERT OR IGNORE INTO addresses (namespace, name, run_id) VALUES (?1, ?2, ?3)",
                params![address.namespace, address.name, run.as_str()],
            ),
            IndexChange::Unbind(address) => exec(
                conn,
                "DELETE FROM addresses WHERE namespace = ?1 AND name = ?2 AND run_id = ?3",
                params![address.namespace, address.name, run.as_str()],
            ),
            IndexChange::UnbindAll => exec(conn, "DELETE FROM addresses WHERE run_id = ?1", params![run.as_str()]),
            IndexChange::UnbindNamespace(namespace) => exec(
                conn,
                "DELETE FROM addresses WHERE run_id = ?1 AND namespace = ?2",
                params![run.as_str(), namespace],
            ),
            IndexChange::Operation { scope, operation_id } => exec(
                conn,
                "INSERT OR IGNORE INTO operations (scope, operation_id, run_id) VALUES (?1, ?2, ?3)",
                params![scope, operation_id, run.as_str()],
            ),
            IndexChange::Settle { call_id, output, seq } => exec(
                conn,
                "UPDATE claims SET output = ?1, settled_seq = ?2
                 WHERE run_id = ?3 AND call_id = ?4 AND settled_seq IS NULL",
                params![output.to_string(), seq_sql(*seq)?, run.as_str(), call_id],
            ),
            IndexChange::Release { call_id } => exec(
                conn,
                "DELETE FROM claims WHERE run_id = ?1 AND call_id = ?2 AND settled_seq IS NULL",
                params![run.as_str(), call_id],
            ),
        }
        .map_err(storage)?;
    }
    for row in &plan.rows {
        insert
            .execute(params![
                run.as_str(),
                seq_sql(row.seq)?,
                row.bytes,
                &row.hash[..]
            ])
            .map_err(storage)?;
    }
    Ok(())
}

/// Writes the heads of the runs the index's batch moves past.
fn write_heads(conn: &Connection, heads: &RunMap<Head>) -> Result<(), JournalError> {
    let mut upsert = conn
        .prepare_cached(
            "INSERT INTO runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (run_id) DO UPDATE SET next_seq = ?2, last_hash = ?3, status = ?4, title = ?5, updated_ns = ?7",
        )
        .map_err(storage)?;
    for (run, head) in heads {
        upsert
            .execute(params![
                run.as_str(),
                seq_sql(head.next_seq)?,
                &head.last_hash[..],
                head.status.encode(),
                head.title,
                nanos(head.created_at),
                nanos(head.updated_at),
            ])
            .map_err(storage)?;
    }
    Ok(())
}

fn claim(conn: &Connection, key: &ClaimKey, holder: &CallRef) -> Result<Claim, JournalError> {
    let existing = conn
        .query_row(
            "SELECT run_id, call_id, output, settled_seq FROM claims WHERE tool = ?1 AND key = ?2",
            params![key.tool, key.key],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                ))
            },
        )
        .optional()
        .map_err(storage)?;
    let existing = match existing {
        None => None,
        Some((run, call_id, output, settled_seq)) => {
            let settled = match (output, settled_seq) {
                (Some(output), Some(seq)) => {
                    let output: Value = serde_json::from_str(&output).map_err(|e| {
                        JournalError::storage(format!("a settled claim's output is not JSON: {e}"))
                    })?;
                    Some((output, Seq(u64::try_from(seq).unwrap_or_default())))
                }
                _ => None,
            };
            Some(ClaimRow {
                holder: CallRef {
                    run: stored_run_id(&run)?,
                    call_id,
                },
                settled,
            })
        }
    };
    match decide_claim(existing, holder) {
        ClaimDecision::Take => {
            exec(
                conn,
                "INSERT INTO claims (tool, key, run_id, call_id) VALUES (?1, ?2, ?3, ?4)",
                params![key.tool, key.key, holder.run.as_str(), holder.call_id],
            )
            .map_err(storage)?;
            Ok(Claim::Won)
        }
        ClaimDecision::Answer(answer) => answer.map_err(|by| JournalError::CallInFlight { by }),
    }
}

/// A run's head: its row, moved on by its events after the index's mark.
/// Readers call it inside one read transaction (`in_snapshot`), so the
/// row and the mark come from the same snapshot; the writer, inside its
/// own.
fn load_head(conn: &Connection, layout: Layout, run: &RunId) -> Result<Option<Head>, JournalError> {
    let row = stored_head(conn, run)?;
    if layout == Layout::ByRun {
        return Ok(row);
    }
    let mut heads = RunMap::default();
    if let Some(row) = row {
        heads.insert(run.clone(), row);
    }
    fold_tail(conn, Some(run), &mut heads)?;
    Ok(heads.remove(run))
}

/// The events after the index's mark, of every run (`?1` null) or of one.
const TAIL_EVENTS: &str = "SELECT run_id, seq, body, hash FROM events
     WHERE pos > (SELECT through FROM indexed) AND (?1 IS NULL OR run_id = ?1) ORDER BY pos";

/// Moves the heads of the runs with events after the index's mark on by
/// them, into `heads`; `only` narrows it to one run. A head already in
/// `heads` is taken as that run's row (the stored row is read for any
/// other), and a run the tail creates starts from its first event.
fn fold_tail(
    conn: &Connection,
    only: Option<&RunId>,
    heads: &mut RunMap<Head>,
) -> Result<(), JournalError> {
    let mut statement = conn.prepare_cached(TAIL_EVENTS).map_err(storage)?;
    let mut rows = statement
        .query(params![only.map(RunId::as_str)])
        .map_err(storage)?;
    // Runs whose row was looked for and not found: new in the tail.
    let mut looked = std::collections::HashSet::new();
    while let Some(found) = rows.next().map_err(storage)? {
        let run = stored_run_id(&found.get::<_, String>(0).map_err(storage)?)?;
        let seq = Seq(u64::try_from(found.get::<_, i64>(1).map_err(storage)?).unwrap_or(u64::MAX));
        if !heads.contains_key(&run)
            && looked.insert(run.clone())
            && let Some(row) = stored_head(conn, &run)?
        {
            heads.insert(run.clone(), row);
        }
        let next = heads.get(&run).map_or(Seq(0), |head| head.next_seq);
        // A version-2 journal's rows already count its tail.
        if seq < next {
            continue;
        }
        let tampered = || {
            JournalError::from(crate::chain::TamperEvident {
                run: run.clone(),
                seq,
            })
        };
        if seq != next {
            return Err(JournalError::Corrupt {
                run: run.clone(),
                seq,
                reason: format!("the log's tail skips from position {} to {}", next.0, seq.0),
            });
        }
        let body = stored_bytes(found.get_ref(2).map_err(storage)?).ok_or_else(tampered)?;
        let hash = stored_bytes(found.get_ref(3).map_err(storage)?)
            .and_then(|hash| Hash::try_from(hash.as_slice()).ok())
            .ok_or_else(tampered)?;
        let envelope = decode_row(&run, seq, &body)?;
        let head = heads
            .entry(run)
            .or_insert_with(|| Head::genesis(envelope.recorded_at));
        // The next append links to this hash: it is checked, as a read
        // checks it.
        if crate::chain::link(&head.last_hash, &envelope.run_id, seq, &body) != hash {
            return Err(crate::chain::TamperEvident {
                run: envelope.run_id,
                seq,
            }
            .into());
        }
        head.advance(&envelope.event, hash, envelope.recorded_at);
    }
    Ok(())
}

/// Indexes the events after the index's mark and writes their runs'
/// heads: `known` when the writer holds the head of every run in the tail
/// (it appended them all), else each moved on from its row by the log.
fn catch_up(conn: &Connection, known: Option<&RunMap<Head>>) -> Result<(), JournalError> {
    let mut folded = RunMap::default();
    let heads = match known {
        Some(heads) => heads,
        None => {
            fold_tail(conn, None, &mut folded)?;
            &folded
        }
    };
    write_heads(conn, heads)?;
    conn.execute_batch(INDEX_TAIL).map_err(storage)
}

/// A run's row in `runs`: its head as of the index's mark.
fn stored_head(conn: &Connection, run: &RunId) -> Result<Option<Head>, JournalError> {
    let row = conn
        .prepare_cached(
            "SELECT next_seq, last_hash, status, title, created_ns, updated_ns FROM runs WHERE run_id = ?1",
        )
        .map_err(storage)?
        .query_row(params![run.as_str()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    let Some((next_seq, last_hash, status, title, created, updated)) = row else {
        return Ok(None);
    };
    let corrupt = |reason: &str| JournalError::Corrupt {
        run: run.clone(),
        seq: Seq(u64::try_from(next_seq).unwrap_or_default()),
        reason: reason.to_owned(),
    };
    Ok(Some(Head {
        next_seq: Seq(u64::try_from(next_seq).map_err(|_| corrupt("negative next_seq"))?),
        last_hash: Hash::try_from(last_hash.as_slice())
            .map_err(|_| corrupt("a head hash is not 32 bytes"))?,
        status: Status::decode(&status).ok_or_else(|| corrupt("unknown run status"))?,
        title,
        created_at: from_nanos(created),
        updated_at: from_nanos(updated),
    }))
}

fn read_events(
    conn: &Connection,
    layout: Layout,
    durable: &Durable,
    tail: &tail::Tail,
    run: &RunId,
    from: Seq,
) -> Result<Vec<Envelope>, JournalError> {
    // One read transaction, so the predecessor's hash, the index's mark
    // and the rows come from the same snapshot.
    in_snapshot(conn, |conn| {
        read_snapshot(conn, layout, durable, tail, run, from)
    })
}

/// A run's rows from `from` on: the indexed ones in `seq` order, then the
/// unindexed tail (events after the index's mark), in arrival order,
/// which is `seq` order within a run.
/// Both skip the positions in `(?4, ?5]`, committed but not yet synced.
const READ_INDEXED: &str =
    "SELECT e.seq, e.body, e.hash FROM event_index i CROSS JOIN events e ON e.pos = i.pos
     WHERE i.run_id = ?1 AND i.seq >= ?2 AND (e.pos <= ?4 OR e.pos > ?5) ORDER BY i.seq";
const READ_TAIL: &str =
    "SELECT seq, body, hash FROM events WHERE pos > ?3 AND run_id = ?1 AND seq >= ?2
     AND (pos <= ?4 OR pos > ?5) ORDER BY pos";
/// The same for a version-1 journal (read only, so nothing is unsynced).
const READ_BY_RUN: &str =
    "SELECT seq, body, hash FROM events WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq";

fn read_snapshot(
    conn: &Connection,
    layout: Layout,
    durable: &Durable,
    tail: &tail::Tail,
    run: &RunId,
    from: Seq,
) -> Result<Vec<Envelope>, JournalError> {
    let through: i64 = match layout {
        Layout::ByRun => 0,
        Layout::InArrivalOrder => index_mark(conn)?,
    };
    // After the statement above began the snapshot: every unsynced event
    // it holds is in the range (see `Durable`).
    let bounds = Bounds {
        tail_after: tail.scan_after(through, run),
        hidden: durable.hidden(),
    };
    let prev = if from.0 == 0 {
        GENESIS
    } else {
        let before = Seq(from.0 - 1);
        let mut found = None;
        scan(conn, layout, run, before, bounds, |seq, _, hash| {
            if seq == before {
                found = Some(hash);
            }
            Ok(false)
        })?;
        match found {
            None => return Ok(Vec::new()),
            Some(hash) => Hash::try_from(hash.unwrap_or_default().as_slice()).map_err(|_| {
                crate::chain::TamperEvident {
                    run: run.clone(),
                    seq: before,
                }
            })?,
        }
    };
    let mut verifier = Verifier::new(run.clone(), from, prev);
    let mut envelopes = Vec::new();
    scan(conn, layout, run, from, bounds, |seq, bytes, hash| {
        let tampered = || crate::chain::TamperEvident {
            run: run.clone(),
            seq,
        };
        let (Some(bytes), Some(hash)) = (bytes, hash) else {
            return Err(tampered().into());
        };
        let hash = Hash::try_from(hash.as_slice()).map_err(|_| tampered())?;
        verifier.check(seq, &bytes, &hash)?;
        envelopes.push(decode_row(run, seq, &bytes)?);
        Ok(true)
    })?;
    Ok(envelopes)
}

/// Where a read's snapshot has its events: the run's events after the
/// index's mark lie past `tail_after` (the mark, or later when the writer
/// said where the run's tail begins: `tail.rs`), and `hidden` holds the
/// positions not yet synced.
#[derive(Clone, Copy)]
struct Bounds {
    tail_after: i64,
    hidden: (i64, i64),
}

/// Hands `row` each of a run's rows from `from` on, in `seq` order, until
/// it answers `false`.
fn scan(
    conn: &Connection,
    layout: Layout,
    run: &RunId,
    from: Seq,
    bounds: Bounds,
    mut row: impl FnMut(Seq, Option<Vec<u8>>, Option<Vec<u8>>) -> Result<bool, JournalError>,
) -> Result<(), JournalError> {
    let queries: &[&str] = match layout {
        Layout::ByRun => &[READ_BY_RUN],
        Layout::InArrivalOrder => &[READ_INDEXED, READ_TAIL],
    };
    let (synced, written) = bounds.hidden;
    for sql in queries {
        let mut statement = conn.prepare_cached(sql).map_err(storage)?;
        let mut rows = if *sql == READ_BY_RUN {
            statement.query(params![run.as_str(), seq_sql(from)?])
        } else {
            // Unused numbered parameters are allowed: `?3` serves the tail.
            statement.query(params![
                run.as_str(),
                seq_sql(from)?,
                bounds.tail_after,
                synced,
                written
            ])
        }
        .map_err(storage)?;
        while let Some(found) = rows.next().map_err(storage)? {
            let seq =
                Seq(u64::try_from(found.get::<_, i64>(0).map_err(storage)?).unwrap_or(u64::MAX));
            let bytes = stored_bytes(found.get_ref(1).map_err(storage)?);
            let hash = stored_bytes(found.get_ref(2).map_err(storage)?);
            if !row(seq, bytes, hash)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

fn list_runs(conn: &Connection, layout: Layout) -> Result<Vec<RunSummary>, JournalError> {
    in_snapshot(conn, |conn| {
        let stored = summaries(
            conn.prepare_cached(
                "SELECT run_id, next_seq, status, title, created_ns, updated_ns FROM runs",
            )
            .map_err(storage)?,
            [],
        )?;
        // Newest first: sorted here, as the tail's runs join the rows.
        let mut runs = with_tail(conn, layout, stored)?;
        super::newest_first(&mut runs);
        Ok(runs)
    })
}

/// `stored` (summaries of rows) with the runs the log's tail moved on
/// replaced by their heads, and the runs it created added.
fn with_tail(
    conn: &Connection,
    layout: Layout,
    mut stored: Vec<RunSummary>,
) -> Result<Vec<RunSummary>, JournalError> {
    if layout == Layout::ByRun {
        return Ok(stored);
    }
    let mut moved = RunMap::default();
    fold_tail(conn, None, &mut moved)?;
    if moved.is_empty() {
        return Ok(stored);
    }
    stored.retain(|run| !moved.contains_key(&run.run_id));
    stored.extend(
        moved
            .into_iter()
            .map(|(run_id, head)| head.into_summary(run_id)),
    );
    Ok(stored)
}

/// Runs `read` in one read transaction, so everything it reads comes from
/// one snapshot (a row and the index's mark, say).
fn in_snapshot<T>(
    conn: &Connection,
    read: impl FnOnce(&Connection) -> Result<T, JournalError>,
) -> Result<T, JournalError> {
    exec(conn, "BEGIN", []).map_err(storage)?;
    let result = read(conn);
    // Ending a read transaction cannot lose data, but a connection left
    // inside one would refuse the next BEGIN: roll back instead.
    if let Err(error) = exec(conn, "COMMIT", []) {
        tracing::warn!(%error, "ending a read transaction failed; rolling it back");
        conn.execute_batch("ROLLBACK").map_err(storage)?;
    }
    result
}

/// The summaries `statement` selects (`run_id, next_seq, status, title,
/// created_ns, updated_ns`) with `params`.
fn summaries(
    mut statement: rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<RunSummary>, JournalError> {
    let rows = statement
        .query_map(params, |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .map_err(storage)?;
    rows.map(|row| {
        let (run, next_seq, status, title, created, updated) = row.map_err(storage)?;
        let run_id = stored_run_id(&run)?;
        Ok(RunSummary {
            status: Status::decode(&status).ok_or_else(|| JournalError::Corrupt {
                run: run_id.clone(),
                seq: Seq(0),
                reason: format!("unknown run status `{status}`"),
            })?,
            run_id,
            title,
            created_at: from_nanos(created),
            updated_at: from_nanos(updated),
            next_seq: Seq(u64::try_from(next_seq).unwrap_or_default()),
        })
    })
    .collect()
}

/// Creates the schema in a new file, or checks an existing file's versions
/// and migrates its layout to this build's.
fn migrate(conn: &Connection) -> Result<(), JournalError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    )
    .map_err(storage)?;
    if stored_version(conn, "schema_version")?.is_none() {
        return in_transaction(conn, "creating the journal", |conn| {
            conn.execute_batch(&format!(
                "{SCHEMA} {EVENT_TABLES}
                 INSERT INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
                 INSERT INTO meta (key, value) VALUES ('store_version', '{STORE_VERSION}');"
            ))
            .map_err(storage)
        });
    }
    if check_schema(conn)? == Layout::ByRun {
        tracing::info!(target: "spool::journal", "moving the journal's events into arrival order (layout version 1 to 3), once");
        in_transaction(conn, "migrating the journal to layout version 3", |conn| {
            conn.execute_batch(&format!(
                "ALTER TABLE events RENAME TO events_by_run; {EVENT_TABLES} {MOVE_BY_RUN} {INDEX_TAIL}
                 INSERT INTO meta (key, value) VALUES ('store_version', '{STORE_VERSION}')
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value;"
            ))
            .map_err(storage)
        })?;
    }
    // A version-2 journal's rows hold every run's head, its tail's too:
    // they are already what version 3 keeps, so only the number changes.
    if stored_version(conn, "store_version")? == Some(2) {
        in_transaction(conn, "migrating the journal to layout version 3", |conn| {
            exec(
                conn,
                "UPDATE meta SET value = ?1 WHERE key = 'store_version'",
                params![STORE_VERSION.to_string()],
            )
            .map(drop)
            .map_err(storage)
        })?;
    }
    // Journals made before 2026-12-01 kept the runs in update order in an
    // index every commit rewrote (a tenth of appends/s with 64 runs
    // appending); a listing reads every run anyway, and sorts them.
    let by_update: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'index' AND name = 'runs_updated'",
            [],
            |row| row.get(0),
        )
        .map_err(storage)?;
    if by_update {
        in_transaction(conn, "dropping the index of runs by update time", |conn| {
            conn.execute_batch("DROP INDEX runs_updated")
                .map_err(storage)
        })?;
    }
    // What a crash left unindexed; an open with nothing to index commits
    // nothing (a one-shot `spool run` would pay an fsync for it).
    let behind: bool = conn
        .query_row(
            "SELECT coalesce(max(pos), 0) > (SELECT through FROM indexed) FROM events",
            [],
            |row| row.get(0),
        )
        .map_err(storage)?;
    if !behind {
        return Ok(());
    }
    in_transaction(conn, "indexing the journal's last events", |conn| {
        catch_up(conn, None)
    })
}

/// Runs `work` in one write transaction, rolled back if any of it fails.
fn in_transaction(
    conn: &Connection,
    doing: &str,
    work: impl FnOnce(&Connection) -> Result<(), JournalError>,
) -> Result<(), JournalError> {
    let result = conn
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(storage)
        .and_then(|()| work(conn))
        .and_then(|()| conn.execute_batch("COMMIT").map_err(storage));
    result.map_err(|error| {
        if !conn.is_autocommit()
            && let Err(rollback) = conn.execute_batch("ROLLBACK")
        {
            tracing::debug!(error = %rollback, "rollback after a failed transaction");
        }
        match error {
            JournalError::Storage { message, source } => JournalError::Storage {
                message: format!("{doing}: {message}"),
                source,
            },
            // A corrupt or tampered log says so in its own terms.
            other => other,
        }
    })
}

/// Checks that this build reads the journal, and says where its events are.
fn check_schema(conn: &Connection) -> Result<Layout, JournalError> {
    let Some(events) = stored_version(conn, "schema_version")? else {
        return Err(JournalError::storage(
            "the file is not a Spool journal (no schema version)",
        ));
    };
    if events > SCHEMA_VERSION {
        return Err(JournalError::NewerSchema {
            found: events,
            supported: SCHEMA_VERSION,
        });
    }
    match stored_version(conn, "store_version")?.unwrap_or(1) {
        1 => Ok(Layout::ByRun),
        2 | STORE_VERSION => Ok(Layout::InArrivalOrder),
        found => Err(JournalError::NewerSchema {
            found,
            supported: STORE_VERSION,
        }),
    }
}

fn stored_version(conn: &Connection, key: &str) -> Result<Option<u32>, JournalError> {
    let text: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
            row.get(0)
        })
        .optional()
        .or_else(|e| match e {
            // A read-only open of a file with no meta table: not a journal.
            rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.contains("no such table") => {
                Ok(None)
            }
            other => Err(other),
        })
        .map_err(storage)?;
    text.map(|t| {
        t.parse()
            .map_err(|_| JournalError::storage(format!("unreadable {key} `{t}`")))
    })
    .transpose()
}

/// A few read connections, reused.
struct ReadPool {
    path: PathBuf,
    read_only: bool,
    /// Where the events are.
    layout: Layout,
    /// Open the file as one nothing changes (a journal on a read-only
    /// filesystem): SQLite then needs no `-shm` file beside it.
    immutable: bool,
    /// The writer's progress, for reads to skip events not yet synced;
    /// a read-only journal's stays empty (it cannot know another
    /// process's).
    durable: Arc<Durable>,
    /// Where the writer put each run's events after the index's mark; a
    /// read-only journal's knows none.
    tail: Arc<tail::Tail>,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    const MAX_IDLE: usize = 4;

    fn new(path: PathBuf, read_only: bool) -> Self {
        Self {
            path,
            read_only,
            layout: Layout::InArrivalOrder,
            immutable: false,
            durable: Arc::default(),
            tail: Arc::default(),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Result<Connection, JournalError> {
        if let Some(conn) = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Ok(conn);
        }
        let mut flags = OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        flags |= if self.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
        };
        let conn = if self.immutable {
            Connection::open_with_flags(immutable_uri(&self.path), flags)
        } else {
            Connection::open_with_flags(&self.path, flags)
        }
        .map_err(storage)?;
        plan_once(&conn)?;
        conn.execute_batch("PRAGMA busy_timeout=10000; PRAGMA query_only=ON;")
            .map_err(storage)?;
        Ok(conn)
    }

    fn give(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < Self::MAX_IDLE {
            idle.push(conn);
        }
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        // The writer closed first and left the log: the last of these
        // connections to close would checkpoint and delete it.
        if self.durable.wal_kept.load(Ordering::Acquire) {
            let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
            for conn in idle.iter() {
                let _ = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
            }
        }
    }
}

/// Prepares and plans each of the store's statements once per connection.
///
/// Without the query planner stability guarantee, SQLite (3.54, as
/// rusqlite bundles it) marked the read queries, which compare bound
/// parameters with indexed columns, to be planned again whenever a
/// parameter was bound to a new value: every read of a run parsed and
/// planned its query anew (`sqlite3Reprepare` was a sixth of the CPU of
/// opening a journal of 10 k runs). The store's queries have one right
/// plan whatever the values. The cache holds every statement the store
/// has (fewer than forty), so none is evicted and parsed again.
fn plan_once(conn: &Connection) -> Result<(), JournalError> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(storage)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
    Ok(())
}

/// Statements kept prepared per connection: more than the store has.
const STATEMENTS_CACHED: usize = 64;

/// Refuses to open a journal whose write-ahead log went missing.
///
/// A writer that stops cleanly leaves neither `-wal` nor `-shm`. After a
/// crash both stay, and SQLite's WAL index (`-shm`, laid out in SQLite's
/// documented WAL format) records in its header how many frames of the
/// log hold committed transactions. A log that is gone or shorter than
/// that (deleted by hand, or lost in a copy) would make SQLite open the
/// database as of its last checkpoint: every event acknowledged since
/// would silently vanish. The index is in memory-mapped pages a power
/// loss may leave older, never newer, than the synced log, so the check
/// never refuses a journal that is whole.
fn check_wal(path: &Path) -> Result<(), JournalError> {
    let index = path.with_file_name(format!("{FILE_NAME}-shm"));
    let wal = path.with_file_name(format!("{FILE_NAME}-wal"));
    // The header only: the index itself grows with the log. Without one
    // (or with one a writer left half written) nothing can be concluded.
    let Some(expected) = std::fs::File::open(&index)
        .ok()
        .and_then(|file| ahead::read_header(&file))
        .as_ref()
        .and_then(ahead::wal_end)
    else {
        return Ok(());
    };
    let found = std::fs::metadata(&wal).map_or(0, |m| m.len());
    if found < expected {
        return Err(JournalError::WalMissing {
            wal,
            index,
            expected,
            found,
        });
    }
    Ok(())
}

/// `path` as an SQLite URI that opens it immutable: the bytes a URI gives
/// meaning to, and any byte that is not ASCII, are percent-encoded.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii() && !b"%?#".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// A stored body or hash as bytes. Rows are written as blobs; text with the
/// same bytes is read too (it is what SQL string functions leave), and
/// anything else is `None`, which the caller reports as tampering.
fn stored_bytes(value: rusqlite::types::ValueRef<'_>) -> Option<Vec<u8>> {
    match value {
        rusqlite::types::ValueRef::Blob(bytes) | rusqlite::types::ValueRef::Text(bytes) => {
            Some(bytes.to_vec())
        }
        _ => None,
    }
}

/// Executes a statement through the connection's statement cache: the
/// writer runs the same few statements for every operation (and `BEGIN`
/// and `COMMIT` for every commit and read), and parsing them each time
/// would cost more than running them.
fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

fn storage(error: rusqlite::Error) -> JournalError {
    JournalError::storage_from(error)
}

fn seq_sql(seq: Seq) -> Result<i64, JournalError> {
    i64::try_from(seq.0)
        .map_err(|_| JournalError::storage(format!("seq {seq} does not fit SQLite's integers")))
}

fn stored_run_id(text: &str) -> Result<RunId, JournalError> {
    RunId::new(text).map_err(|e| JournalError::storage(format!("a stored run id is invalid: {e}")))
}

fn nanos(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

fn from_nanos(nanos: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `run`'s creation.
    async fn create(journal: &SqliteJournal, run: &RunId) {
        journal
            .append(
                run,
                Seq(0),
                vec![Event::RunCreated(crate::event::RunCreated::default())],
            )
            .await
            .unwrap();
    }

    /// What a journal on a read-only filesystem is read through, tried
    /// where the filesystem is writable (a test cannot mount one): a
    /// stopped journal in a directory whose name needs escaping in a URI
    /// reads the same through the immutable pool as through a plain one.
    #[test]
    fn a_stopped_journal_reads_the_same_opened_immutable_under_any_directory_name() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("a?b#c%d é");
        let tokio = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let run = RunId::new("r").unwrap();
        tokio.block_on(async {
            let journal = SqliteJournal::open(&dir, Options::default()).unwrap();
            create(&journal, &run).await;
        });
        let path = dir.join(FILE_NAME);
        // As a writer that stopped cleanly leaves it: everything in the
        // file, the write-ahead log empty.
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let mut pool = ReadPool::new(path.clone(), true);
        pool.immutable = true;
        let conn = pool.take().unwrap();
        let layout = check_schema(&conn).unwrap();
        let immutable = list_runs(&conn, layout).unwrap();
        let plain = list_runs(&ReadPool::new(path, true).take().unwrap(), layout).unwrap();
        assert_eq!(immutable.len(), 1);
        assert_eq!(immutable, plain);
    }

    /// How long a test waits for what it expects before it fails.
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

    /// A sync the test controls: it passes at once until `hold` is set,
    /// then says it began and waits to be let go; with `fail` set it
    /// fails as a disk would.
    struct Gate {
        hold: Arc<std::sync::atomic::AtomicBool>,
        fail: Arc<std::sync::atomic::AtomicBool>,
        began: std::sync::mpsc::Receiver<()>,
        go: std::sync::mpsc::Sender<()>,
    }

    impl Gate {
        fn wait_until_a_sync_began(&self) {
            self.began
                .recv_timeout(PATIENCE)
                .expect("a sync began in time");
        }

        fn let_one_sync_go(&self) {
            self.go.send(()).unwrap();
        }
    }

    fn gated(dir: &Path, options: Options) -> (SqliteJournal, Gate) {
        let hold = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (began_sender, began) = std::sync::mpsc::channel();
        let (go, go_receiver) = std::sync::mpsc::channel::<()>();
        let counters = Arc::new(Counters::default());
        let sync: SyncFn = Box::new({
            let (hold, fail) = (Arc::clone(&hold), Arc::clone(&fail));
            move || {
                if fail.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("the disk is gone"));
                }
                if hold.load(Ordering::SeqCst) {
                    let _ = began_sender.send(());
                    let _ = go_receiver.recv();
                }
                Ok(())
            }
        });
        let journal =
            SqliteJournal::open_syncing(&dir.join(FILE_NAME), options, counters, sync).unwrap();
        let gate = Gate {
            hold,
            fail,
            began,
            go,
        };
        (journal, gate)
    }

    fn started(n: u64) -> Event {
        Event::TurnStarted(crate::event::TurnStarted {
            turn_id: crate::id::TurnId::new(format!("t{n}")).unwrap(),
            input: "hello".into(),
            context: Vec::new(),
            policy: spool_wire::run::TurnPolicy::Steer,
            from_queue: None,
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// An event SQLite has committed is not read, nor announced, until
    /// the sync that makes it durable returns: a power loss before then
    /// could take it back, and a stream that had shown it would then
    /// contradict the run recovered after it.
    #[test]
    fn an_event_is_read_and_announced_only_once_its_commit_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, gate) = gated(dir.path(), Options::default());
        let journal = Arc::new(journal);
        // Dropped before the journal, should the test fail: a held sync
        // then goes on, and the journal's threads can stop.
        let gate = gate;
        let run = RunId::new("r").unwrap();
        runtime().block_on(async {
            create(&journal, &run).await;
            let mut announced = journal.subscribe(&run).await.unwrap();
            assert_eq!(*announced.borrow_and_update(), Seq(1));
            gate.hold.store(true, Ordering::SeqCst);
            let append = tokio::spawn({
                let (journal, run) = (Arc::clone(&journal), run.clone());
                async move { journal.append(&run, Seq(1), vec![started(1)]).await }
            });
            gate.wait_until_a_sync_began();
            // Committed: the file holds the row for any SQLite reader.
            let rows: i64 = Connection::open(dir.path().join(FILE_NAME))
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM events WHERE run_id = 'r'",
                    [],
                    |row| row.get(0),
                )
                .unwrap();
            assert_eq!(rows, 2, "the commit is in the file before its sync");
            let read = journal.read(&run, Seq(0)).await.unwrap();
            assert_eq!(read.len(), 1, "only the synced event is read");
            assert!(journal.read(&run, Seq(1)).await.unwrap().is_empty());
            assert!(!announced.has_changed().unwrap(), "nothing announced yet");
            gate.hold.store(false, Ordering::SeqCst);
            gate.let_one_sync_go();
            let envelopes = append.await.unwrap().unwrap();
            assert_eq!(envelopes[0].seq, Seq(1));
            tokio::time::timeout(PATIENCE, announced.wait_for(|next| *next == Seq(2)))
                .await
                .expect("announced once synced")
                .unwrap();
            assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 2);
        });
    }

    /// What the journal held when it was opened is durable: its events
    /// are read while the first commit of this process syncs.
    #[test]
    fn events_from_before_the_open_are_read_while_the_first_commit_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let old = RunId::new("old").unwrap();
        runtime().block_on(async {
            let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
            create(&journal, &old).await;
        });
        let (journal, gate) = gated(dir.path(), Options::default());
        let journal = Arc::new(journal);
        let gate = gate;
        runtime().block_on(async {
            gate.hold.store(true, Ordering::SeqCst);
            let append = tokio::spawn({
                let journal = Arc::clone(&journal);
                async move { create(&journal, &RunId::new("new").unwrap()).await }
            });
            gate.wait_until_a_sync_began();
            assert_eq!(journal.read(&old, Seq(0)).await.unwrap().len(), 1);
            gate.hold.store(false, Ordering::SeqCst);
            gate.let_one_sync_go();
            append.await.unwrap();
        });
    }

    /// While the syncer syncs one commit, the writer makes the next: a
    /// commit costs the larger of SQLite's work and the sync, not both.
    #[test]
    fn the_writer_commits_while_the_commit_before_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            max_batch: 1,
            ..Options::default()
        };
        let (journal, gate) = gated(dir.path(), options);
        let journal = Arc::new(journal);
        // Dropped before the journal, should the test fail: a held sync
        // then goes on, and the journal's threads can stop.
        let gate = gate;
        let runs: Vec<RunId> = (0..3)
            .map(|i| RunId::new(format!("r{i}")).unwrap())
            .collect();
        runtime().block_on(async {
            for run in &runs {
                create(&journal, run).await;
            }
            let before = journal.stats();
            gate.hold.store(true, Ordering::SeqCst);
            let append = |run: &RunId| {
                let (journal, run) = (Arc::clone(&journal), run.clone());
                tokio::spawn(async move { journal.append(&run, Seq(1), vec![started(1)]).await })
            };
            // Alone, the first is synced by the writer itself, which holds
            // the next two in its queue meanwhile.
            let first = append(&runs[0]);
            gate.wait_until_a_sync_began();
            let queued = [append(&runs[1]), append(&runs[2])];
            let writer = journal.writer.as_ref().unwrap();
            let deadline = std::time::Instant::now() + PATIENCE;
            while writer.max_capacity() - writer.capacity() < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "both appends queued in time"
                );
                tokio::task::yield_now().await;
            }
            gate.let_one_sync_go();
            first.await.unwrap().unwrap();
            // The second, with the third waiting behind it, goes to the
            // syncer, whose sync is held; the writer commits the third.
            gate.wait_until_a_sync_began();
            while journal.stats().commits - before.commits < 3 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the third append committed while the second's sync was held: {:?}",
                    journal.stats()
                );
                tokio::task::yield_now().await;
            }
            for task in &queued {
                assert!(!task.is_finished(), "no caller answered before its sync");
            }
            gate.hold.store(false, Ordering::SeqCst);
            gate.let_one_sync_go();
            for task in queued {
                task.await.unwrap().unwrap();
            }
        });
    }

    /// A sync that fails leaves SQLite's pages and the disk possibly
    /// apart: its callers are told their events may not be durable, and
    /// the journal refuses every write after it, saying why, until it is
    /// opened again; reads still skip what was never synced.
    #[test]
    fn a_failed_sync_fails_its_callers_and_every_write_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, gate) = gated(dir.path(), Options::default());
        let run = RunId::new("r").unwrap();
        runtime().block_on(async {
            create(&journal, &run).await;
            gate.fail.store(true, Ordering::SeqCst);
            let failed = journal.append(&run, Seq(1), vec![started(1)]).await;
            let message = failed.unwrap_err().to_string();
            assert!(
                message.contains("syncing the write-ahead log failed")
                    && message.contains("the disk is gone"),
                "{message}"
            );
            gate.fail.store(false, Ordering::SeqCst);
            let after = journal.append(&run, Seq(2), vec![started(2)]).await;
            assert!(
                after
                    .unwrap_err()
                    .to_string()
                    .contains("writes nothing more until it is opened again")
            );
            assert!(journal.probe().await.is_err());
            assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 1);
        });
        drop(journal);
        // Opened again, SQLite recovers from what the disk holds.
        let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
        runtime().block_on(async {
            let next = journal.subscribe(&run).await.unwrap();
            let next = *next.borrow();
            let appended = journal.append(&run, next, vec![started(3)]).await;
            assert!(appended.is_ok(), "{appended:?}");
        });
    }

    /// Reading many runs reuses each read query's plan: no statement is
    /// parsed and planned again because a new run was bound to it.
    #[test]
    fn reading_many_runs_plans_each_read_query_once() {
        let dir = tempfile::tempdir().unwrap();
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio.block_on(async {
            let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
            for i in 0..5 {
                let run = RunId::new(format!("r{i}")).unwrap();
                create(&journal, &run).await;
                assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 1);
            }
            // Reads one after another share one pooled connection.
            let conn = journal.readers.take().unwrap();
            for sql in [READ_INDEXED, READ_TAIL] {
                let statement = conn.prepare_cached(sql).unwrap();
                assert!(
                    statement.get_status(rusqlite::StatementStatus::VmStep) > 0,
                    "the pooled connection ran {sql}"
                );
                assert_eq!(
                    statement.get_status(rusqlite::StatementStatus::RePrepare),
                    0,
                    "{sql} was planned again"
                );
            }
        });
    }
}
