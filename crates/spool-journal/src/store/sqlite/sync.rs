//! The SQLite store's syncer: each commit's write-ahead log made durable
//! (`fdatasync`) on a thread of its own while the writer builds the next
//! commit, and the positions reads must skip until then.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Counters, Durability, FILE_NAME, Heads, MAX_CACHED_HEADS};
use crate::id::RunMap;
use crate::store::queue::Done;
use crate::store::{Head, Watchers};

/// How far this process's commits are durable, shared by the writer, the
/// syncer and the reads.
///
/// Events at positions in `(synced, written]` are committed, so SQLite's
/// readers see them, but their sync has not returned: reads skip them, so
/// nothing a power loss could still take back is ever shown (a stream
/// that showed one would contradict the run recovered after it). The
/// writer raises `written` before each `COMMIT` and the syncer `synced`
/// after each sync, so a reader that takes `written` after its snapshot
/// began has every unsynced event of that snapshot in the range. Heads
/// and indexes (the run listing, addresses) are not held back: they may
/// show a commit up to one sync before it is durable.
#[derive(Debug, Default)]
pub(super) struct Durable {
    /// The highest event position known synced.
    pub(super) synced: AtomicI64,
    /// The highest event position committed.
    pub(super) written: AtomicI64,
    /// The writer's count of the last commit known synced.
    pub(super) synced_commit: AtomicU64,
    /// Why the journal stopped writing: a sync failed, and what SQLite
    /// holds may differ from the disk, so nothing more is written until
    /// the journal is opened again (and SQLite recovers from the disk).
    failed: Mutex<Option<String>>,
    /// The writer left the write-ahead log at close
    /// ([`Options::keep_wal_below`](super::Options::keep_wal_below)), so
    /// no reading connection may checkpoint it as it closes.
    pub(super) wal_kept: AtomicBool,
}

impl Durable {
    /// Everything up to `last` is durable already: what an open found.
    pub(super) fn starting_at(last: i64) -> Self {
        Self {
            synced: AtomicI64::new(last),
            written: AtomicI64::new(last),
            ..Self::default()
        }
    }

    /// The positions reads skip: `(synced, written]`. Taken after a read
    /// transaction's snapshot began.
    pub(super) fn hidden(&self) -> (i64, i64) {
        let written = self.written.load(Ordering::Acquire);
        (self.synced.load(Ordering::Acquire), written)
    }

    pub(super) fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Makes a commit's write-ahead log durable: `fdatasync` of the `-wal`
/// file through a descriptor of the syncer's own (a sync reaches every
/// write to the file, whichever descriptor made it), or nothing at all
/// for [`Durability::LoseRecentCommitsOnPowerLoss`].
pub(super) type SyncFn = Box<dyn FnMut() -> std::io::Result<()> + Send>;

pub(super) fn sync_wal(path: &Path, durability: Durability, counters: Arc<Counters>) -> SyncFn {
    if durability == Durability::LoseRecentCommitsOnPowerLoss {
        return Box::new(|| Ok(()));
    }
    let wal = path.with_file_name(format!("{FILE_NAME}-wal"));
    let mut file: Option<std::fs::File> = None;
    Box::new(move || {
        // Opened at the first sync, after the writer's first commit: SQLite
        // makes the file, and keeps it while its connection is open. SQLite
        // locks the database and `-shm` files, never `-wal`, so this
        // descriptor takes no lock away when it closes.
        let file = match &mut file {
            Some(file) => file,
            None => file.insert(std::fs::OpenOptions::new().write(true).open(&wal)?),
        };
        file.sync_data()?;
        counters.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
}

/// One commit, handed from the writer to the syncer.
pub(super) struct Committed {
    /// The writer's count of it.
    pub(super) number: u64,
    /// Its callers' answers.
    pub(super) done: Vec<Done>,
    /// The heads it wrote.
    pub(super) heads: RunMap<Head>,
    /// Its highest event position, or 0 when it appended none.
    pub(super) last_pos: i64,
}

/// Commits the syncer may lag behind the writer before the writer waits:
/// the syncer syncs everything queued at once, so more buys nothing.
const SYNC_QUEUE: usize = 4;

/// Where commits are made durable, in the order they were made, by the
/// syncer thread or by the writer itself.
///
/// Under load the writer hands each commit over and goes on with the next
/// while the syncer syncs (one sync for every commit queued meanwhile).
/// With nothing else waiting and nothing being synced, the writer syncs
/// its commit itself: handing it over would only add a thread's wake-up
/// to a lone caller's wait (a fifth more time per append, measured with
/// one run appending).
pub(super) struct Syncing {
    state: Mutex<SyncState>,
    changed: std::sync::Condvar,
    /// Called only by whoever set `SyncState::busy`.
    sync: Mutex<SyncFn>,
    /// The sync does nothing ([`Durability::LoseRecentCommitsOnPowerLoss`]):
    /// the writer answers every commit itself, since a hand-over would
    /// overlap nothing.
    always_here: bool,
    durable: Arc<Durable>,
    heads: Arc<Heads>,
    watchers: Arc<Watchers>,
}

#[derive(Default)]
pub(super) struct SyncState {
    queue: std::collections::VecDeque<Committed>,
    /// A thread is syncing and answering a group: nobody else may, or
    /// answers and heads could go out of order.
    busy: bool,
    /// The writer stopped: the syncer ends once the queue is empty.
    closed: bool,
}

impl Syncing {
    pub(super) fn new(
        sync: SyncFn,
        always_here: bool,
        durable: Arc<Durable>,
        heads: Arc<Heads>,
        watchers: Arc<Watchers>,
    ) -> Self {
        Self {
            state: Mutex::default(),
            changed: std::sync::Condvar::new(),
            sync: Mutex::new(sync),
            always_here,
            durable,
            heads,
            watchers,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(
        &self,
        state: std::sync::MutexGuard<'a, SyncState>,
    ) -> std::sync::MutexGuard<'a, SyncState> {
        self.changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `committed` durable: here and now when `alone` (nothing else
    /// waits for the writer) and nothing is queued or being synced,
    /// otherwise by the syncer, waiting for room in its queue.
    pub(super) fn submit(&self, committed: Committed, alone: bool) {
        let mut state = self.state();
        if (alone || self.always_here) && !state.busy && state.queue.is_empty() {
            state.busy = true;
            drop(state);
            self.finish(vec![committed]);
            self.state().busy = false;
            self.changed.notify_all();
            return;
        }
        while state.queue.len() >= SYNC_QUEUE {
            state = self.wait(state);
        }
        state.queue.push_back(committed);
        drop(state);
        self.changed.notify_all();
    }

    /// Whether a commit may be handed to the syncer's thread at all (not
    /// when syncs do nothing).
    pub(super) fn hands_over(&self) -> bool {
        !self.always_here
    }

    /// The writer stopped: the syncer finishes the queue and ends.
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.changed.notify_all();
    }

    /// The syncer thread: syncs every commit queued since its last sync at
    /// once, until the writer stops.
    pub(super) fn run(&self) {
        loop {
            let group: Vec<Committed> = {
                let mut state = self.state();
                loop {
                    if !state.busy && !state.queue.is_empty() {
                        break;
                    }
                    if state.closed && state.queue.is_empty() && !state.busy {
                        return;
                    }
                    state = self.wait(state);
                }
                state.busy = true;
                state.queue.drain(..).collect()
            };
            // The writer may be waiting for room.
            self.changed.notify_all();
            self.finish(group);
            self.state().busy = false;
            self.changed.notify_all();
        }
    }

    /// Syncs once for `group`, then makes its heads the journal's, tells
    /// subscribers and answers callers; or fails them all if the sync
    /// failed, now or before.
    fn finish(&self, mut group: Vec<Committed>) {
        let failure = self.durable.failure().or_else(|| {
            let mut sync = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
            let error = (sync)().err()?;
            let message = format!(
                "syncing the write-ahead log failed ({error}): the last commits may not be on disk, \
                 and the journal writes nothing more until it is opened again"
            );
            tracing::error!(target: "spool::journal", %error, "a sync failed; the journal stops writing");
            *self
                .durable
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
            Some(message)
        });
        if let Some(message) = failure {
            for committed in group {
                for entry in committed.done {
                    entry.fail(&message);
                }
            }
            return;
        }
        let last_pos = group.iter().map(|c| c.last_pos).max().unwrap_or(0);
        self.durable.synced.fetch_max(last_pos, Ordering::AcqRel);
        {
            // Before subscribers are told: `subscribe` relies on it.
            let mut heads = self.heads.lock();
            for committed in &mut group {
                if heads.len() + committed.heads.len() > MAX_CACHED_HEADS {
                    heads.clear();
                }
                heads.extend(committed.heads.drain());
            }
        }
        if let Some(last) = group.last() {
            // After the heads: the writer then forgets its own copies.
            self.durable
                .synced_commit
                .store(last.number, Ordering::Release);
        }
        // A subscriber that read the run's head before the sync may
        // already know a position; it is woken all the same, since its
        // reads skipped the events until now.
        Done::commit_all_waking(
            group.into_iter().flat_map(|committed| committed.done),
            &self.watchers,
        );
    }
}
