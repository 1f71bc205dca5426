//! The `Runtime`: the API every transport rides on. It turns calls (start,
//! message, respond, cancel, reset, clear, compact) into journal events and
//! drives each run's turns in a task of its own, detached from the caller.
//!
//! `builder` makes one, `requests` holds what callers pass and get back,
//! `commands` changes runs and `queries` reads them. Every command locks
//! the run through [`crate::runs::Locked`], which holds its cached state.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use spool_journal::fold::Status;
use spool_journal::{Event, Journal, RunId};
use tokio_util::sync::CancellationToken;

use crate::agents::Agent;
use crate::error::RuntimeError;
use crate::hub::Hub;
use crate::runs::{Locked, Runs};

mod builder;
mod commands;
mod queries;
mod requests;

pub use builder::RuntimeBuilder;
pub use commands::MAX_ANSWERS;
pub use requests::{
    Accepted, CancelOutcome, DeleteRequest, ForkRequest, MessageRequest, Recovery, StartRequest,
};

/// How many runs recovery reads at once: a node may take over tens of
/// thousands, each a round trip to a shared database, and a server's
/// start reads every run that is not mid-turn.
const RECOVERY_READS: usize = 16;

/// What recovery will do, listed by [`Runtime::recovery`].
#[derive(Debug)]
#[must_use = "nothing is recovered until the plan runs"]
pub struct RecoveryPlan {
    runtime: Runtime,
    interrupted: Vec<RunId>,
    to_read: Vec<RunId>,
}

impl RecoveryPlan {
    /// The runs that were mid-turn: each is driven again, first thing.
    #[must_use]
    pub fn interrupted(&self) -> usize {
        self.interrupted.len()
    }

    /// The runs whose log is read to learn whether anything was left to
    /// do (a sleep, a cancel, queued input).
    #[must_use]
    pub fn to_read(&self) -> usize {
        self.to_read.len()
    }

    /// Drives the interrupted runs again (each in a task of its own, at
    /// once), then reads the others 16 at a time, sleeping runs first,
    /// then runs parked for a person, then ended ones, acting on what each
    /// log says was left; what it did.
    pub async fn run(self) -> Recovery {
        self.runtime.run_plan(self.interrupted, self.to_read).await
    }
}

/// A cheap-to-clone handle on the runtime.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("agent", &self.inner.runs.agents.current())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) ids: Arc<dyn crate::ids::IdSource>,
    pub(crate) hub: Hub,
    /// Runs with a driver task.
    pub(crate) driving: Mutex<HashMap<RunId, Driving>>,
    /// The runs in memory, each with the lock its appends take.
    pub(crate) runs: Runs,
    /// Runs with a wake-up armed.
    pub(crate) sleeping: Mutex<HashSet<(RunId, String)>>,
    /// Whether the journal writes, and the runs waiting until it does.
    pub(crate) storage: Arc<crate::storage::Storage>,
    /// Every task the runtime started.
    pub(crate) tasks: crate::tasks::Tasks,
    /// The addresses each retired run held, as retention's `keep_latest`
    /// read them (a retired run never changes).
    pub(crate) held: Mutex<HashMap<RunId, Arc<[spool_journal::Address]>>>,
}

/// A run's driver task, as the runtime tracks it.
#[derive(Debug, Default)]
pub(crate) struct Driving {
    /// Cancels the current turn.
    pub(crate) token: CancellationToken,
    /// Set when there may be new work; the driver looks again before it
    /// stops.
    pub(crate) dirty: bool,
}

impl Runtime {
    /// A runtime on `journal` with the echo engine and the built-in tools.
    #[must_use]
    pub fn builder(journal: Arc<dyn Journal>) -> RuntimeBuilder {
        RuntimeBuilder::new(journal)
    }

    /// Stops every task the runtime started (run drivers, sleep timers,
    /// the storage probe, schedules) and waits until none runs. A turn in
    /// progress stops where it is, as if the process had ended: its
    /// journal keeps it, and [`Runtime::recover`] on the next start
    /// resumes it (a tool call cut off is settled by its effect, as after
    /// a crash). Nothing is recorded for the stop.
    ///
    /// Afterwards the runtime starts nothing: a command is still recorded,
    /// and its turn waits for the next start. Call it last, once the
    /// transports have stopped taking requests; dropping the last handle to
    /// the runtime then closes its journal (the SQLite store checkpoints
    /// and empties its write-ahead log as it closes).
    pub async fn shutdown(&self) {
        self.inner.tasks.stop().await;
    }

    /// Resumes what the journal says was in progress: runs that were
    /// running (their recorded steps are replayed, never re-run), cancels
    /// recorded before a stop, queued input, and sleeps (re-armed). Waiting
    /// runs stay waiting. [`recovery`](Self::recovery), then
    /// [`RecoveryPlan::run`].
    ///
    /// A run whose log cannot be read (its hash chain does not verify, say)
    /// is left alone and reported in [`Recovery::unreadable`]: one bad run
    /// must not keep a server from starting. Requests for it answer
    /// `conversation_corrupt`.
    ///
    /// # Errors
    ///
    /// When the journal cannot be listed.
    pub async fn recover(&self) -> Result<Recovery, RuntimeError> {
        Ok(self.recovery().await?.run().await)
    }

    /// What [`recover`](Self::recover) will do, from one listing of the
    /// journal and no read of any run's log: which runs were mid-turn,
    /// and which must be read to learn whether anything was left to do.
    /// Nothing starts until [`RecoveryPlan::run`].
    ///
    /// A server lists before it listens (a journal that cannot be listed
    /// stops it there) and runs the plan once it accepts requests: tens of
    /// thousands of drivers started first would queue ahead of its first
    /// accept. A request for a run not recovered yet reads the run, as any
    /// request does.
    ///
    /// # Errors
    ///
    /// When the journal cannot be listed.
    pub async fn recovery(&self) -> Result<RecoveryPlan, RuntimeError> {
        let mut interrupted = Vec::new();
        // Read in this order: sleeps (a turn goes on when each is due,
        // maybe at once), runs parked for a person (a cancel recorded
        // before the stop ends the turn), runs whose turn ended (input
        // queued behind it, left by a crash between the two).
        let (mut asleep, mut parked, mut ended) = (Vec::new(), Vec::new(), Vec::new());
        for summary in self.inner.journal.runs().await? {
            match summary.status {
                Status::Running => interrupted.push(summary.run_id),
                Status::Retired | Status::Pending => {}
                Status::Waiting(spool_wire::run::SuspendKind::Sleep) => asleep.push(summary.run_id),
                Status::Waiting(_) => parked.push(summary.run_id),
                Status::Completed | Status::Failed | Status::Cancelled => {
                    ended.push(summary.run_id);
                }
            }
        }
        asleep.append(&mut parked);
        asleep.append(&mut ended);
        Ok(RecoveryPlan {
            runtime: self.clone(),
            interrupted,
            to_read: asleep,
        })
    }

    /// Resumes only the runs the journal lists as running: turns cut off
    /// mid-way, each driven on from its log. Nothing else's log is read,
    /// so the cost follows the interrupted runs, not the journal: what a
    /// one-shot process (`spool run`) does before its own run. Cancels,
    /// queued input and sleeps of idle runs are left for the next full
    /// [`recover`](Self::recover) (a server's start).
    ///
    /// # Errors
    ///
    /// When the journal cannot be listed.
    pub async fn recover_interrupted(&self) -> Result<Recovery, RuntimeError> {
        let mut recovery = Recovery::default();
        for summary in self.inner.journal.runs_with_status(Status::Running).await? {
            self.recover_one(summary.run_id, &summary.status, &mut recovery)
                .await;
        }
        Ok(recovery)
    }

    /// [`recover`](Self::recover) for `runs` only: what a node of a
    /// cluster does with the runs it takes over from a node that died.
    /// What this runtime had cached of them is dropped first (another
    /// process drove them since), so each is read from its log; the
    /// journal is not listed, so the cost follows the runs taken. Up to
    /// 16 runs are read at once: a node may take over tens of thousands,
    /// each a round trip to a shared database.
    ///
    /// # Errors
    ///
    /// None today: a run that cannot be read is reported in
    /// [`Recovery::unreadable`]. The `Result` leaves room for a store
    /// error that stops the whole recovery.
    pub async fn recover_runs(&self, runs: &[RunId]) -> Result<Recovery, RuntimeError> {
        Ok(self.recover_each(runs.to_vec(), true).await)
    }

    /// Drives `plan`'s interrupted runs, then reads the rest.
    async fn run_plan(&self, interrupted: Vec<RunId>, to_read: Vec<RunId>) -> Recovery {
        // Mid-turn: the driver reads the log itself, nothing to read first.
        for run in &interrupted {
            self.inner.clone().ensure_driver(run);
        }
        let mut recovery = self.recover_each(to_read, false).await;
        recovery.resumed += interrupted.len();
        recovery
    }

    /// Recovers `runs` in order, [`RECOVERY_READS`] at a time; `taken`:
    /// runs another process drove, whose cached copies are dropped first.
    async fn recover_each(&self, runs: Vec<RunId>, taken: bool) -> Recovery {
        let mut recovery = Recovery::default();
        let mut left = runs.into_iter();
        let mut reading = tokio::task::JoinSet::new();
        loop {
            while reading.len() < RECOVERY_READS {
                let Some(run) = left.next() else { break };
                let runtime = self.clone();
                reading.spawn(async move { runtime.recover_read(run, taken).await });
            }
            let Some(done) = reading.join_next().await else {
                break;
            };
            match done {
                Ok(one) => {
                    recovery.resumed += one.resumed;
                    recovery.unreadable.extend(one.unreadable);
                }
                // A recovery that panicked is a bug; it is not hidden.
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => {}
            }
        }
        recovery
    }

    /// Recovers one run from its log; `taken`: its cached copy is dropped
    /// first.
    async fn recover_read(&self, run: RunId, taken: bool) -> Recovery {
        let mut recovery = Recovery::default();
        if !taken {
            // Not running, as listed: its log says whether anything is
            // left to do.
            self.resume_from_log(run, &mut recovery).await;
            return recovery;
        }
        self.inner.runs.invalidate(&run).await;
        let status = match self.inner.lock(&run).await {
            Ok(locked) => locked.state().status,
            // A schedule's record run is its scheduler's, and an
            // unknown one has nothing to recover.
            Err(RuntimeError::RunNotFound(_)) => return recovery,
            Err(error) => {
                tracing::error!(run_id = %run, %error, "a run's log cannot be read; it is left as it is");
                recovery.unreadable.push((run, error));
                return recovery;
            }
        };
        self.recover_one(run, &status, &mut recovery).await;
        recovery
    }

    async fn recover_one(&self, run: RunId, status: &Status, recovery: &mut Recovery) {
        match status {
            Status::Running => {
                self.inner.clone().ensure_driver(&run);
                recovery.resumed += 1;
            }
            Status::Retired | Status::Pending => {}
            _ => self.resume_from_log(run, recovery).await,
        }
    }

    /// Acts on what `run`'s log says was left to do (a sleep, a cancel,
    /// queued input).
    async fn resume_from_log(&self, run: RunId, recovery: &mut Recovery) {
        match self.inner.resume(&run).await {
            Ok(resumed) => recovery.resumed += usize::from(resumed),
            Err(error) => {
                tracing::error!(run_id = %run, %error, "a run's log cannot be read; it is left as it is");
                recovery.unreadable.push((run, error));
            }
        }
    }
}

impl Inner {
    /// The agent new runs start on and runs that follow upgrades move to,
    /// once the journal keeps its definition: the digest a run records
    /// (`run_created.agent`, `agent_changed.to`) always names a definition
    /// the journal holds.
    pub(crate) async fn current_agent(&self) -> Result<Arc<Agent>, RuntimeError> {
        Ok(self.runs.agents.current_kept(&*self.journal).await?)
    }

    /// After `run`'s deletion: nothing of it stays in memory.
    pub(crate) fn forget(&self, run: &RunId) {
        self.runs.remove(run);
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run);
        self.sleeping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(sleeper, _)| sleeper != run);
    }

    /// Fires the cancel token of the run's current turn, if a driver runs.
    pub(crate) fn cancel_turn(&self, run: &RunId) {
        if let Some(driving) = self
            .driving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run)
        {
            driving.token.cancel();
        }
    }

    /// Locks an existing run with its cached state.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, also for a schedule's record run: its log is the
    /// scheduler's alone, and no caller reaches it (nor appends a turn to
    /// it); a journal error when its log must be read and cannot.
    pub(crate) async fn lock(&self, run: &RunId) -> Result<Locked, RuntimeError> {
        // A run this process drives changes only through it (a node that
        // lost it finds out when its next append is refused), so only the
        // others are checked against their logs: no read per driver step.
        let recheck = self.runs.shared
            && !self
                .driving
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(run);
        let locked = Locked::existing(&self.runs, &*self.journal, run, recheck).await?;
        let reserved = locked
            .state()
            .created
            .as_ref()
            .and_then(|created| created.address.as_ref())
            .is_some_and(|address| address.namespace == crate::schedule::RECORD_NAMESPACE);
        if reserved {
            return Err(RuntimeError::RunNotFound(run.clone()));
        }
        Ok(locked)
    }

    /// Appends at the run's head, under the run's lock.
    pub(crate) async fn append(&self, run: &RunId, events: Vec<Event>) -> Result<(), RuntimeError> {
        let mut locked = self.lock(run).await?;
        locked.append(&*self.journal, events).await
    }
}
