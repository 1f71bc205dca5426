//! The SQLite store's checkpointer: the write-ahead log's frames copied
//! into the database file on a thread and connection of their own, so the
//! writer does not stop appending while thousands of pages are copied.
//!
//! SQLite checkpoints on the connection that commits once the log passes
//! its window: the writer, in the middle of a group commit, every caller
//! of which then waits. Measured with 64 runs appending and no fsync per
//! commit, a fifth of the writer's time went to those checkpoints. Here
//! the writer's log hook (`sqlite3_wal_hook`, called after each commit
//! with the log's length) wakes this thread whenever a
//! [`STEP`] of new frames is waiting, and it copies them with a `PASSIVE`
//! checkpoint, which waits for no reader or writer: the writer goes on
//! appending meanwhile.
//!
//! A log copied in full is started over by the next write transaction
//! that finds it so; under steady appends there is always a newer frame
//! by then, so the writer itself copies what is left once the log reaches
//! [`CAP`] frames: at most a step's frames, not the whole window, and the
//! next commit starts the log over, keeping the file near its old size.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;

use super::Counters;

/// New frames that wake the checkpointer: 10 MiB of 4 KiB pages. A
/// quarter of the window: each hot page is copied four times per log
/// rather than once, and the writer's share is at most a step. A step of
/// 1 000 frames read no better (`spool-bench --only journal-append`, two
/// runs each beside 2 500).
pub(super) const STEP: u64 = 2_500;

/// The log's length in frames at which the writer copies the rest itself:
/// the log the writer checkpointed at before (`WAL_CHECKPOINT_PAGES`).
pub(super) const CAP: u64 = super::WAL_CHECKPOINT_PAGES as u64;

/// Shared by the writer's log hook and the checkpointer's thread.
pub(super) struct Checkpointer {
    /// The database file, for the thread's own connection.
    path: PathBuf,
    counters: Arc<Counters>,
    /// The thread, started when the log first has a step of frames to
    /// copy (a one-shot process never starts it), joined at close.
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The thread could not start: the writer copies the log itself at
    /// [`CAP`], as SQLite would.
    alone: AtomicBool,
    /// Frames of the log copied into the database by the last checkpoint
    /// (from the log's start; 0 once the log starts over).
    copied: AtomicU64,
    /// The thread has been asked for a checkpoint it has not begun.
    wanted: AtomicBool,
    /// The log's frames when the thread was last asked: after a failed
    /// checkpoint it is asked again only a step past them, not at every
    /// commit.
    asked: AtomicU64,
    /// The last checkpoint failed (said once per spell of failures).
    failing: AtomicBool,
    /// The writer stopped ([`close`](Self::close)): the thread ends.
    closed: Mutex<bool>,
    /// Wakes the thread: a checkpoint is wanted, or it is to end.
    changed: Condvar,
}

impl Checkpointer {
    pub(super) fn new(path: PathBuf, counters: Arc<Counters>) -> Self {
        Self {
            path,
            counters,
            thread: Mutex::new(None),
            alone: AtomicBool::new(false),
            copied: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            asked: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            closed: Mutex::new(false),
            changed: Condvar::new(),
        }
    }

    /// The writer's log hook, after each commit: `frames` are in the log.
    pub(super) fn committed(self: &Arc<Self>, wal: &mut Wal, frames: u64) -> rusqlite::Result<()> {
        let mut copied = self.copied.load(Ordering::Acquire);
        if frames < copied {
            // The log started over since the last checkpoint.
            copied = 0;
            self.copied.store(0, Ordering::Release);
        }
        if frames >= CAP {
            // The little the thread has not copied yet, here: the next
            // write transaction then starts the log over. Busy (the
            // thread is copying) is no failure: the next commit tries.
            match wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                Ok((_, done)) => {
                    if let Ok(done) = u64::try_from(done) {
                        self.copied.store(done, Ordering::Release);
                    }
                }
                Err(error) => {
                    tracing::debug!(target: "spool::journal", %error, "the writer's checkpoint waits for the next commit");
                }
            }
            return Ok(());
        }
        if frames >= copied + STEP && !self.wanted.swap(true, Ordering::AcqRel) {
            self.asked.store(frames, Ordering::Release);
            if self.started() {
                let _lock = self.lock();
                self.changed.notify_one();
            }
        }
        Ok(())
    }

    /// Whether the thread runs, started now if it does not yet.
    fn started(self: &Arc<Self>) -> bool {
        if self.alone.load(Ordering::Acquire) {
            return false;
        }
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return true;
        }
        let this = Arc::clone(self);
        match std::thread::Builder::new()
            .name("spool-journal-checkpoint".into())
            .spawn(move || this.run())
        {
            Ok(handle) => {
                *thread = Some(handle);
                true
            }
            Err(error) => {
                tracing::error!(target: "spool::journal", %error, "the checkpointer's thread did not start; the writer checkpoints itself");
                self.alone.store(true, Ordering::Release);
                false
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.closed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer stopped: the thread ends, and is joined.
    pub(super) fn close(&self) {
        *self.lock() = true;
        self.changed.notify_one();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// The checkpointer's thread, on a connection of its own, until
    /// [`close`](Self::close).
    fn run(&self) {
        let conn = match Connection::open(&self.path).and_then(|conn| {
            // Closing it must not checkpoint: the writer decides what
            // the log is left as at close.
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            // A connection learns the file is in WAL mode at its first
            // read: until then a checkpoint finds no log to copy.
            let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(rusqlite::Error::InvalidQuery);
            }
            Ok(conn)
        }) {
            Ok(conn) => conn,
            Err(error) => {
                tracing::error!(target: "spool::journal", %error, "the checkpointer could not open the journal; the writer checkpoints itself");
                self.alone.store(true, Ordering::Release);
                return;
            }
        };
        loop {
            {
                let mut closed = self.lock();
                while !*closed && !self.wanted.load(Ordering::Acquire) {
                    closed = self
                        .changed
                        .wait(closed)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if *closed {
                    return;
                }
            }
            self.wanted.store(false, Ordering::Release);
            match conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
                Ok((_, done)) => {
                    if let Ok(done) = u64::try_from(done) {
                        self.copied.store(done, Ordering::Release);
                        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
                    }
                    self.failing.store(false, Ordering::Release);
                }
                // A full disk, say: tried again a step later (the writer
                // still tries at the window), and said once.
                Err(error) => {
                    self.copied
                        .store(self.asked.load(Ordering::Acquire), Ordering::Release);
                    if !self.failing.swap(true, Ordering::AcqRel) {
                        tracing::warn!(target: "spool::journal", %error, "a checkpoint failed; the log is copied again after more commits");
                    }
                }
            }
        }
    }
}
