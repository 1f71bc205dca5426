//! The journal's health as the runtime sees it, and what happens to runs
//! when the journal cannot write.
//!
//! A write that fails on the journal's storage (a full disk, a failing
//! device) records nothing. The driver does not fail the run's turn for it
//! (that failure could not be recorded either, and the turn did nothing
//! wrong): it stalls the run, its waiters are answered
//! [`ErrorKind::Storage`](crate::ErrorKind::Storage) at once, and one task
//! probes the journal with a small write, backing off from
//! [`PROBE_FIRST`] to [`PROBE_MAX`]. When a probe succeeds every stalled
//! run is driven again from its log, exactly as after a restart: recorded
//! steps are replayed, a write that may have happened waits for an
//! operator, nothing runs twice. A nearly full disk may take the probe and
//! not a turn's events: runs that stall again are resumed after pauses
//! growing to [`RESUME_MAX`], since each resume may call a model again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use spool_journal::store::{BoxFuture, CallRef, Claim, ClaimKey};
use spool_journal::{Envelope, Event, Journal, JournalError, RunId, Seq};
use tokio::sync::watch;

use crate::runtime::Inner;

/// The first pause before probing a journal that failed to write.
pub const PROBE_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between probes.
pub const PROBE_MAX: Duration = Duration::from_secs(5);
/// The longest pause before resuming runs again after resumed runs met a
/// journal that still could not write (a nearly full disk takes a small
/// probe but not a turn's events). Each resume may call a model again, so
/// these pauses grow from [`PROBE_MAX`] to this, not to a busy loop.
pub const RESUME_MAX: Duration = Duration::from_secs(60);

/// Whether the journal can write, as the runtime last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalHealth {
    /// The last write succeeded.
    Writable,
    /// The last write failed on storage; the runtime probes until one
    /// succeeds.
    Unavailable {
        /// The store's error, for the operator's log.
        reason: String,
        /// Runs whose turn waits for the journal.
        stalled_runs: usize,
    },
}

impl JournalHealth {
    /// Whether the journal can write.
    #[must_use]
    pub fn is_writable(&self) -> bool {
        matches!(self, Self::Writable)
    }
}

/// The runtime's view of the journal: its health, the runs stalled on it,
/// and the one probing task.
#[derive(Debug)]
pub(crate) struct Storage {
    health: watch::Sender<JournalHealth>,
    /// A copy of `health.is_writable()` read without a lock on every write.
    writable: AtomicBool,
    stalled: Mutex<HashSet<RunId>>,
    /// `stalled`'s size, read without its lock.
    stalled_count: AtomicUsize,
    /// Bumped whenever a run stalls, so its waiters look.
    stalls: watch::Sender<u64>,
    /// Whether the probing task runs.
    probing: AtomicBool,
    /// Told when a write succeeds while the journal was unavailable.
    wrote: tokio::sync::Notify,
    /// The runtime, for the probing task to resume runs with. Weak: a
    /// runtime dropped while its journal is full is not kept alive by it.
    runtime: std::sync::OnceLock<Weak<Inner>>,
    /// When stalled runs were last resumed, and the pause the next resume
    /// waits for after it.
    resumes: Mutex<(Option<tokio::time::Instant>, Duration)>,
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            health: watch::channel(JournalHealth::Writable).0,
            writable: AtomicBool::new(true),
            stalled: Mutex::default(),
            stalled_count: AtomicUsize::new(0),
            stalls: watch::channel(0).0,
            probing: AtomicBool::new(false),
            wrote: tokio::sync::Notify::new(),
            runtime: std::sync::OnceLock::new(),
            resumes: Mutex::new((None, Duration::ZERO)),
        }
    }
}

impl Storage {
    /// Ties this to its runtime, once, as the runtime is made.
    pub(crate) fn attach(&self, runtime: Weak<Inner>) {
        let _ = self.runtime.set(runtime);
    }

    pub(crate) fn health(&self) -> watch::Receiver<JournalHealth> {
        self.health.subscribe()
    }

    /// A receiver that changes whenever a run stalls.
    pub(crate) fn stalls(&self) -> watch::Receiver<u64> {
        self.stalls.subscribe()
    }

    fn stalled(&self) -> std::sync::MutexGuard<'_, HashSet<RunId>> {
        self.stalled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes what a write's result says about the journal.
    fn saw<T>(&self, result: &Result<T, JournalError>) {
        match result {
            Err(JournalError::Storage { message, .. }) => self.unavailable(message),
            Ok(_) if !self.writable.load(Ordering::Relaxed) => {
                self.writable();
                self.wrote.notify_one();
            }
            _ => {}
        }
    }

    /// The journal cannot write: say so, and probe it until it can.
    fn unavailable(&self, reason: &str) {
        self.writable.store(false, Ordering::Relaxed);
        let stalled_runs = self.stalled_count.load(Ordering::Relaxed);
        self.health.send_replace(JournalHealth::Unavailable {
            reason: reason.to_owned(),
            stalled_runs,
        });
        self.start_probing();
    }

    fn writable(&self) {
        self.writable.store(true, Ordering::Relaxed);
        self.health.send_if_modified(|health| {
            let changed = !health.is_writable();
            *health = JournalHealth::Writable;
            changed
        });
    }

    fn start_probing(&self) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let started = self
            .runtime
            .get()
            .and_then(Weak::upgrade)
            .is_some_and(|inner| inner.tasks.spawn(probe(Arc::downgrade(&inner))));
        if !started {
            self.probing.store(false, Ordering::Release);
        }
    }

    /// Whether `run` waits for the journal.
    pub(crate) fn is_stalled(&self, run: &RunId) -> bool {
        self.stalled_count.load(Ordering::Relaxed) > 0 && self.stalled().contains(run)
    }

    /// Stalls `run` until the journal writes again.
    pub(crate) fn stall(&self, run: &RunId, reason: &str) {
        {
            let mut stalled = self.stalled();
            stalled.insert(run.clone());
            self.stalled_count.store(stalled.len(), Ordering::Relaxed);
        }
        self.unavailable(reason);
        self.stalls.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Takes `run` off the stalled set: it is being driven again.
    pub(crate) fn unstall(&self, run: &RunId) {
        if self.stalled_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut stalled = self.stalled();
        stalled.remove(run);
        self.stalled_count.store(stalled.len(), Ordering::Relaxed);
    }

    /// How long to wait before resuming runs again: nothing the first time
    /// or after a calm spell (twice [`RESUME_MAX`] without a resume); else
    /// what is left of a pause that doubles from [`PROBE_MAX`] to
    /// [`RESUME_MAX`] with each resume.
    fn resume_wait(&self) -> Duration {
        let resumes = self.resumes.lock().unwrap_or_else(PoisonError::into_inner);
        match resumes.0 {
            Some(last) if last.elapsed() < RESUME_MAX * 2 => {
                resumes.1.saturating_sub(last.elapsed())
            }
            _ => Duration::ZERO,
        }
    }

    /// Notes a resume now, for [`Storage::resume_wait`].
    fn resumed_now(&self) {
        let mut resumes = self.resumes.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = resumes
            .0
            .is_some_and(|last| last.elapsed() < RESUME_MAX * 2);
        resumes.1 = if recent {
            (resumes.1 * 2).clamp(PROBE_MAX, RESUME_MAX)
        } else {
            Duration::ZERO
        };
        resumes.0 = Some(tokio::time::Instant::now());
    }

    /// A probe succeeded: the stalled runs, taken off the set before the
    /// health says writable, so a waiter that sees the journal back finds
    /// its run being driven, not stalled.
    fn recovered(&self) -> Vec<RunId> {
        let runs: Vec<RunId> = {
            let mut stalled = self.stalled();
            self.stalled_count.store(0, Ordering::Relaxed);
            stalled.drain().collect()
        };
        self.writable();
        runs
    }
}

/// The probing task: probes the journal with backoff until a write
/// succeeds, then resumes every stalled run as a restart would. Ends when
/// the journal writes and no run stalled meanwhile, when the probe fails
/// other than on storage (a closed or read-only journal: a restart
/// resumes the runs), or when the runtime is gone. Resumes close together
/// back off across tasks (see [`Storage::resume_wait`]).
async fn probe(runtime: Weak<Inner>) {
    let mut pause = PROBE_FIRST;
    loop {
        let Some(storage) = runtime.upgrade().map(|inner| Arc::clone(&inner.storage)) else {
            return;
        };
        // A write that succeeds meanwhile (a command's) cuts the pause.
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = storage.wrote.notified() => {}
        }
        let Some(inner) = runtime.upgrade() else {
            return;
        };
        match inner.journal.probe().await {
            Ok(()) => {
                let wait = storage.resume_wait();
                if !wait.is_zero() {
                    // Runs resumed a moment ago stalled again: a nearly
                    // full disk takes the probe, not a turn. Each resume
                    // may call a model again, so wait, then probe again.
                    tracing::warn!(
                        retry_in_ms = wait.as_millis(),
                        "resumed runs met a journal that still cannot write"
                    );
                    drop(inner);
                    tokio::time::sleep(wait).await;
                    pause = Duration::ZERO;
                    continue;
                }
                let runs = storage.recovered();
                storage.resumed_now();
                tracing::info!(
                    runs = runs.len(),
                    "the journal writes again; stalled runs resume"
                );
                for run in runs {
                    if let Err(error) = inner.resume(&run).await
                        && !inner.stall_on(&run, &error)
                    {
                        tracing::error!(run_id = %run, %error, "a stalled run cannot be resumed");
                    }
                }
                storage.probing.store(false, Ordering::Release);
                // A run that stalled between the drain and the store found
                // the task still running and left the probing to it.
                if storage.stalled_count.load(Ordering::Relaxed) == 0
                    || storage.probing.swap(true, Ordering::AcqRel)
                {
                    return;
                }
                pause = PROBE_FIRST;
            }
            Err(JournalError::Storage {
                message: reason, ..
            }) => {
                storage.unavailable(&reason);
                tracing::warn!(%reason, retry_in_ms = pause.as_millis(), "the journal still cannot write");
                pause = (pause * 2).clamp(PROBE_FIRST, PROBE_MAX);
            }
            Err(error) => {
                tracing::error!(%error, "the journal cannot be probed; stalled runs wait for a restart");
                storage.probing.store(false, Ordering::Release);
                return;
            }
        }
    }
}

/// The runtime's journal: the store, with every write's result noted in
/// [`Storage`].
pub(crate) struct Watched {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) storage: Arc<Storage>,
}

impl Journal for Watched {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(async move {
            let result = self.journal.append(run, expected, events).await;
            self.storage.saw(&result);
            result
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        Box::pin(async move {
            let result = self.journal.claim(key, holder).await;
            self.storage.saw(&result);
            result
        })
    }

    spool_journal::forward_journal_reads!(journal);

    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        self.journal.probe()
    }
}
