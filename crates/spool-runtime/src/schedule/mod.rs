//! Schedules: a message sent on a cron expression, to a run bound to an
//! address or to a fresh run per firing, with every firing journaled
//! before its message is delivered.
//!
//! Each schedule keeps a record run of its own (bound to the address
//! `spool.schedule/NAME`, reachable through no channel) whose log holds
//! its firings: `schedule_fired` before the message goes out,
//! `schedule_delivered` after. A crash between the two leaves a firing in
//! doubt, and the next start settles it from the target's own log: the
//! message carries a context line naming the firing, and a fresh run per
//! firing is created under the firing's id as an operation id. So a
//! restart never delivers a firing twice, and an occurrence missed while
//! the server was down is run once at start (`catch_up = "latest"`), never
//! once per missed minute.

use std::collections::{HashMap, VecDeque};
use std::str::FromStr as _;
use std::sync::{Arc, Mutex, PoisonError};

use croner::Cron;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Deserialize;
use spool_journal::event::{Delivery, FireKind, RunCreated, ScheduleDelivered, ScheduleFired};
use spool_journal::{Address, Envelope, Event, Principal, RunId, Seq};
use spool_wire::run::TurnPolicy;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Accepted, Runtime, RuntimeError, StartRequest};

/// The namespace of schedules' record runs: no channel reaches it.
pub const RECORD_NAMESPACE: &str = "spool.schedule";

/// The namespace a schedule's `address` names a run in: the HTTP channel's,
/// so a client can look the run up and stream it.
pub const TARGET_NAMESPACE: &str = "http";

/// The firings kept per schedule for [`Scheduler::get`]'s history.
pub const HISTORY: usize = 32;

/// How many recent external firings an external id is recognized among:
/// a retry comes minutes after its first try, not thousands of firings.
pub const EXTERNAL_WINDOW: usize = 1024;

/// How much of a record run's log a start reads: enough for the history,
/// the external-id window and a firing in doubt, however long the
/// schedule has run.
const RECORD_TAIL: u64 = 2 * EXTERNAL_WINDOW as u64 + 2 * HISTORY as u64;

mod clock;
mod definition;
mod fire;
mod record;

pub use clock::*;
pub use definition::*;
use fire::*;

/// One firing, as the schedule routes show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Firing {
    /// Its id within the schedule.
    pub fire_id: String,
    /// What fired it.
    pub kind: FireKind,
    /// When it was due.
    pub scheduled_at: OffsetDateTime,
    /// When it was recorded.
    pub fired_at: OffsetDateTime,
    /// What became of its message; `None` while in doubt.
    pub delivery: Option<Delivery>,
}

/// A schedule as the routes show it.
#[derive(Clone, Debug)]
pub struct ScheduleView {
    /// Its definition.
    pub definition: ScheduleDefinition,
    /// Its next firing by the cron expression.
    pub next_fire_at: Option<OffsetDateTime>,
    /// Its recent firings, oldest first (up to [`HISTORY`]).
    pub history: Vec<Firing>,
}

/// A firing asked for by a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Fire now.
    Manual,
    /// A caller's own scheduler fired: `id` is stable across its retries,
    /// which get the first firing back.
    External {
        /// The caller's id for the firing.
        id: String,
        /// When the caller's scheduler had it due.
        scheduled_at: OffsetDateTime,
    },
}

/// What a trigger did.
#[derive(Clone, Debug, PartialEq)]
pub struct Triggered {
    /// The firing.
    pub firing: Firing,
    /// Whether it is an earlier firing under the same external id,
    /// returned without firing again.
    pub replayed: bool,
}

/// Why a schedule operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A definition does not parse (its cron expression, time zone or
    /// name), or two share a name.
    #[error("{0}")]
    Invalid(String),
    /// No schedule has the name.
    #[error("no schedule named `{0}`")]
    NotFound(String),
    /// The journal or the runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// How a firing's message reaches a run another node drives: on a
/// cluster, the node that records a schedule's firings (the holder of its
/// record run) may not be the one driving the run its `address` is bound
/// to, and only that one may append to it. `spool serve --cluster` hands
/// the firing to that node over HTTP.
pub trait Relay: Send + Sync + 'static {
    /// Delivers `firing` of the schedule `schedule` on the node that
    /// drives `run`, as that node's [`Scheduler::deliver_relayed`] does,
    /// and returns what became of it; `Ok(None)` when no other node
    /// drives `run` (this node then answers for it).
    fn deliver<'a>(
        &'a self,
        schedule: &'a str,
        run: &'a RunId,
        firing: &'a ScheduleFired,
    ) -> crate::BoxFuture<'a, Result<Option<Delivery>, RuntimeError>>;
}

/// Where [`Relay`] is set once the scheduler has started.
type RelaySlot = Arc<std::sync::OnceLock<Arc<dyn Relay>>>;

/// The running schedules of one runtime. Cheap to clone; when the last
/// clone goes, the schedules stop.
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<SchedulerInner>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("schedules", &self.inner.schedules.keys())
            .finish_non_exhaustive()
    }
}

struct SchedulerInner {
    schedules: std::collections::BTreeMap<String, Arc<Schedule>>,
    relay: RelaySlot,
    /// Counts firings recorded (delivered or not): what a watcher waits on.
    fired: watch::Sender<u64>,
    _stop: DropGuard,
}

struct Schedule {
    parsed: Parsed,
    runtime: Runtime,
    clock: Clock,
    /// Whom a fresh run per firing is created by: its operation ids live
    /// under this principal.
    principal: Principal,
    /// Held for a whole firing: firings of one schedule (its cron's, a
    /// trigger's) happen one at a time.
    state: tokio::sync::Mutex<State>,
    next: Mutex<Option<Timestamp>>,
    /// The record run, which never changes: what a cluster node asks
    /// about to learn which node fires the schedule.
    record: RunId,
    /// How a message reaches an address's run another node drives.
    relay: RelaySlot,
}

struct State {
    /// The record run and its next position; this schedule is its only
    /// writer.
    record: RunId,
    next: Seq,
    history: VecDeque<Firing>,
    /// Recent external firings by the caller's id, and their order.
    externals: HashMap<String, Firing>,
    external_order: VecDeque<String>,
    /// The latest occurrence of the cron expression fired.
    last_cron: Option<Timestamp>,
    /// The run the last fresh-run firing started: what `overlap = "skip"`
    /// looks at.
    last_run: Option<RunId>,
}

impl Scheduler {
    /// Starts `definitions` on `runtime`, after [`Runtime::recover`]:
    /// settles a firing left in doubt by a crash, fires a missed occurrence
    /// once (per `catch_up`), and runs each schedule in a task of its own.
    ///
    /// # Errors
    ///
    /// `BadRequest` for a definition that does not parse (see [`check`]);
    /// a journal error when a record run cannot be read or written.
    pub async fn start(
        runtime: &Runtime,
        definitions: &[ScheduleDefinition],
        clock: Clock,
    ) -> Result<Self, RuntimeError> {
        check(definitions).map_err(|e| RuntimeError::BadRequest(e.to_string()))?;
        let stop = CancellationToken::new();
        let (fired, _) = watch::channel(0);
        let relay = RelaySlot::default();
        let mut schedules = std::collections::BTreeMap::new();
        for definition in definitions {
            let parsed = definition.parse().map_err(RuntimeError::BadRequest)?;
            let state = State::open(runtime, &definition.name).await?;
            let record = state.record.clone();
            let schedule = Arc::new(Schedule {
                record,
                relay: relay.clone(),
                principal: Principal {
                    authenticator: "spool".into(),
                    kind: "schedule".into(),
                    id: definition.name.clone(),
                    attributes: std::collections::BTreeMap::new(),
                },
                parsed,
                runtime: runtime.clone(),
                clock,
                state: tokio::sync::Mutex::new(state),
                next: Mutex::new(None),
            });
            // On a shared journal only the node holding the record run's
            // lease may settle or catch up, or a firing another node is
            // delivering right now would be delivered twice: that node
            // does it when it takes the run over ([`Scheduler::taken_over`]).
            if !runtime.inner.runs.shared {
                schedule
                    .settle_in_doubt(&mut *schedule.state.lock().await, &fired)
                    .await?;
                schedule.catch_up(&fired).await?;
            }
            // Known before the first listing, not when the schedule's task
            // first runs: a server answering at once would list none.
            let last = schedule.state.lock().await.last_cron;
            schedule.upcoming(last);
            schedules.insert(definition.name.clone(), schedule);
        }
        for schedule in schedules.values() {
            let (schedule, stop, fired) = (schedule.clone(), stop.clone(), fired.clone());
            // Tracked with the runtime's tasks (its shutdown stops it) and
            // caught as a driver is: a schedule that panics stops firing
            // and says why in the log, and the server goes on.
            runtime.inner.tasks.spawn(async move {
                let name = schedule.parsed.definition.name.clone();
                let firing = Box::pin(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = schedule.run(&fired) => {}
                    }
                });
                if let Err(panic) = crate::driver::polled(firing).await {
                    tracing::error!(schedule = %name, %panic, "a schedule panicked; it fires no more until the server restarts");
                }
            });
        }
        Ok(Self {
            inner: Arc::new(SchedulerInner {
                schedules,
                relay,
                fired,
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// Every schedule, by name, with its next firing and history.
    pub async fn list(&self) -> Vec<ScheduleView> {
        let mut views = Vec::with_capacity(self.inner.schedules.len());
        for schedule in self.inner.schedules.values() {
            views.push(schedule.view().await);
        }
        views
    }

    /// One schedule.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NotFound`].
    pub async fn get(&self, name: &str) -> Result<ScheduleView, ScheduleError> {
        Ok(self.schedule(name)?.view().await)
    }

    /// Fires `name` now, for a caller (a manual or an external trigger).
    /// An external id seen among the last [`EXTERNAL_WINDOW`] external
    /// firings returns that firing instead.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NotFound`]; a journal error when the firing could
    /// not be recorded (then it did not happen).
    pub async fn trigger(&self, name: &str, trigger: Trigger) -> Result<Triggered, ScheduleError> {
        let schedule = self.schedule(name)?;
        let (kind, fire_id, scheduled_at) = match trigger {
            Trigger::Manual => (
                FireKind::Manual,
                format!("manual:{}", crate::ids::unique_suffix()),
                schedule.clock.now(),
            ),
            Trigger::External { id, scheduled_at } => (
                FireKind::External,
                format!("external:{id}"),
                timestamp(scheduled_at),
            ),
        };
        schedule
            .fire(kind, fire_id, scheduled_at, &self.inner.fired)
            .await?
            // Only an occurrence of the cron expression is ever found
            // fired already.
            .ok_or_else(|| ScheduleError::Invalid("the firing was made already".into()))
    }

    /// On a shared journal, after this node took `runs` over from nodes
    /// that died: each schedule whose record run is among them is this
    /// node's to fire now. It reads what the dead node recorded, delivers
    /// a firing the dead node recorded but never delivered (unless the
    /// message is already where it went), and fires a missed occurrence
    /// once (per `catch_up`), as a restart does.
    ///
    /// # Errors
    ///
    /// A journal error when a record run cannot be read or written; the
    /// schedules not reached are settled at their next firing.
    pub async fn taken_over(&self, runs: &[RunId]) -> Result<(), RuntimeError> {
        for schedule in self.inner.schedules.values() {
            if !runs.contains(&schedule.record) {
                continue;
            }
            {
                let mut state = schedule.state.lock().await;
                state.refresh(&schedule.runtime).await?;
                schedule
                    .settle_in_doubt(&mut state, &self.inner.fired)
                    .await?;
            }
            schedule.catch_up(&self.inner.fired).await?;
            tracing::info!(
                schedule = schedule.name(),
                "this node fires the schedule now"
            );
        }
        Ok(())
    }

    /// Sends a firing's message through `relay` when the run its address
    /// is bound to is driven by another node (set once, before anything
    /// fires on a cluster: [`Scheduler::taken_over`] may fire). Without
    /// one, such a firing is recorded as failed with the holder's name.
    pub fn relay_through(&self, relay: Arc<dyn Relay>) {
        if self.inner.relay.set(relay).is_err() {
            tracing::warn!("a schedule relay was set twice; the first stays");
        }
    }

    /// Delivers a firing another node recorded, to the run of the
    /// schedule's address that this node drives: what that node's
    /// [`Relay`] asks for. It is delivered as the recording node would
    /// have delivered it, and never relayed again (a run that moved once
    /// more is the firing's failure, not a loop).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NotFound`]; [`ScheduleError::Invalid`] for a
    /// schedule without an address; a journal error when nothing could be
    /// delivered (the recording node leaves the firing in doubt and
    /// settles it later).
    pub async fn deliver_relayed(
        &self,
        name: &str,
        firing: &ScheduleFired,
    ) -> Result<Delivery, ScheduleError> {
        let schedule = self.schedule(name)?;
        if schedule.target_address().is_none() {
            return Err(ScheduleError::Invalid(format!(
                "schedule `{name}` has no address: its firings start runs of their own"
            )));
        }
        Ok(schedule.deliver(firing, None, false).await?)
    }

    /// The run that records `name`'s firings: on a cluster, the node that
    /// holds its lease fires the schedule.
    #[must_use]
    pub fn record_run(&self, name: &str) -> Option<RunId> {
        Some(self.inner.schedules.get(name)?.record.clone())
    }

    /// A receiver of the number of firings recorded since start: wait on
    /// it rather than polling the history.
    #[must_use]
    pub fn watch_firings(&self) -> watch::Receiver<u64> {
        self.inner.fired.subscribe()
    }

    fn schedule(&self, name: &str) -> Result<&Arc<Schedule>, ScheduleError> {
        self.inner
            .schedules
            .get(name)
            .ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
    }
}
