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

/// `[[schedule]]` in `spool.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDefinition {
    /// Its name: letters, digits, `-`, `_` and `.`, up to 64.
    pub name: String,
    /// A cron expression: five fields, or six with seconds first
    /// (`0 9 * * MON-FRI`, `*/30 * * * * *`).
    pub cron: String,
    /// The IANA time zone the expression is read in (`UTC` by default).
    #[serde(default = "utc")]
    pub time_zone: String,
    /// The message each firing sends.
    pub text: String,
    /// The HTTP address whose run each firing messages (created on first
    /// use); absent, each firing starts a fresh run.
    #[serde(default)]
    pub address: Option<String>,
    /// One-turn context sent with each firing's message.
    #[serde(default)]
    pub context: Vec<String>,
    /// What a firing does while the previous one's turn is in progress.
    #[serde(default)]
    pub overlap: Overlap,
    /// What a start does about occurrences missed while the server was
    /// down.
    #[serde(default)]
    pub catch_up: CatchUp,
}

fn utc() -> String {
    "UTC".into()
}

/// What a firing does while the target's turn is in progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Nothing: the firing is recorded as skipped (the default).
    #[default]
    Skip,
    /// To an address: the message is queued behind the running turn. For
    /// a fresh run per firing: the firing starts its own run anyway.
    Queue,
}

/// What a start does about occurrences missed while the server was down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Fire once, for the latest missed occurrence (the default).
    #[default]
    Latest,
    /// Fire none of them.
    Skip,
}

impl Overlap {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Queue => "queue",
        }
    }
}

impl CatchUp {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Latest => "latest",
            Self::Skip => "skip",
        }
    }
}

/// A definition, checked: its expression parsed, its zone found.
#[derive(Clone, Debug)]
struct Parsed {
    definition: ScheduleDefinition,
    cron: Cron,
    zone: TimeZone,
}

impl ScheduleDefinition {
    fn parse(&self) -> Result<Parsed, String> {
        let name = &self.name;
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid_name {
            return Err(format!(
                "schedule name `{name}`: use 1 to 64 letters, digits, `-`, `_` or `.`"
            ));
        }
        let cron = Cron::from_str(&self.cron)
            .map_err(|e| format!("schedule `{name}`: cron expression `{}`: {e}", self.cron))?;
        let zone = TimeZone::get(&self.time_zone)
            .map_err(|e| format!("schedule `{name}`: time zone `{}`: {e}", self.time_zone))?;
        if self.text.trim().is_empty() {
            return Err(format!("schedule `{name}`: `text` is empty"));
        }
        if self.address.as_deref().is_some_and(str::is_empty) {
            return Err(format!(
                "schedule `{name}`: `address` is empty (leave it out for a fresh run per firing)"
            ));
        }
        Ok(Parsed {
            definition: self.clone(),
            cron,
            zone,
        })
    }
}

/// Checks a configuration's schedules: each parses, and no two share a
/// name.
///
/// # Errors
///
/// [`ScheduleError::Invalid`], naming the schedule and what is wrong.
pub fn check(definitions: &[ScheduleDefinition]) -> Result<(), ScheduleError> {
    let mut names = std::collections::HashSet::new();
    for definition in definitions {
        definition.parse().map_err(ScheduleError::Invalid)?;
        if !names.insert(&definition.name) {
            return Err(ScheduleError::Invalid(format!(
                "two schedules are named `{}`",
                definition.name
            )));
        }
    }
    Ok(())
}

/// Where a scheduler's time comes from.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// `None`: the system's wall clock. `Some`: a wall time anchored to a
    /// tokio instant, advancing with tokio's time (paused in tests).
    anchor: Option<(Timestamp, tokio::time::Instant)>,
}

impl Clock {
    /// The system's wall clock.
    #[must_use]
    pub fn system() -> Self {
        Self { anchor: None }
    }

    /// `wall` now, advancing with tokio's clock from here on: under paused
    /// time a test sees firings at exact instants.
    #[must_use]
    pub fn starting_at(wall: Timestamp) -> Self {
        Self {
            anchor: Some((wall, tokio::time::Instant::now())),
        }
    }

    /// The wall time now.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        match self.anchor {
            None => Timestamp::now(),
            Some((wall, at)) => {
                let elapsed = at.elapsed().as_nanos();
                Timestamp::from_nanosecond(wall.as_nanosecond() + elapsed as i128)
                    .unwrap_or(Timestamp::MAX)
            }
        }
    }

    /// Sleeps until the wall time `at`, looking at the wall clock again at
    /// least once a minute: a clock stepped by NTP (or an operator) moves
    /// the firing with it instead of leaving it hours off.
    async fn sleep_until(&self, at: Timestamp) {
        const LOOK_AGAIN: u64 = 60_000_000_000;
        loop {
            let left = at.as_nanosecond() - self.now().as_nanosecond();
            let Ok(left) = u64::try_from(left) else {
                return;
            };
            if left == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_nanos(left.min(LOOK_AGAIN))).await;
        }
    }
}

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
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = schedule.run(&fired) => {}
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

impl State {
    /// Opens (or creates) `name`'s record run and reads its recent firings.
    async fn open(runtime: &Runtime, name: &str) -> Result<Self, RuntimeError> {
        let journal = &runtime.inner.journal;
        let address = Address::new(RECORD_NAMESPACE, name);
        // The recent part of a record run's log: enough for the history,
        // however long the schedule has run.
        let tail = |record: RunId| async move {
            let next = *journal.subscribe(&record).await?.borrow();
            let from = Seq(next.0.saturating_sub(RECORD_TAIL));
            let envelopes = journal.read(&record, from).await?;
            Ok::<_, RuntimeError>((record, envelopes))
        };
        let (record, envelopes) = match journal.find_address(&address).await? {
            Some(record) => tail(record).await?,
            None => {
                let record = runtime.inner.ids.run_id();
                let created = Event::RunCreated(RunCreated {
                    address: Some(address.clone()),
                    title: Some(format!("schedule {name}: its firings")),
                    kind: Some("schedule".into()),
                    ..RunCreated::default()
                });
                match journal.append(&record, Seq(0), vec![created]).await {
                    Ok(envelopes) => (record, envelopes),
                    // Another node sharing the journal made it first: use
                    // that one.
                    Err(spool_journal::JournalError::AddressTaken { run, .. }) => tail(run).await?,
                    Err(error) => return Err(error.into()),
                }
            }
        };
        let next = envelopes.last().map_or(Seq(0), |e| e.seq.next());
        let mut state = Self {
            record,
            next,
            history: VecDeque::new(),
            externals: HashMap::new(),
            external_order: VecDeque::new(),
            last_cron: None,
            last_run: None,
        };
        for envelope in envelopes {
            state.replay(&envelope);
        }
        Ok(state)
    }

    /// Reads what was recorded after `next` by another node sharing the
    /// journal.
    async fn refresh(&mut self, runtime: &Runtime) -> Result<(), RuntimeError> {
        let envelopes = runtime.inner.journal.read(&self.record, self.next).await?;
        for envelope in envelopes {
            self.next = envelope.seq.next();
            self.replay(&envelope);
        }
        Ok(())
    }

    /// Takes one record-run event into the in-memory view.
    fn replay(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::ScheduleFired(fired) => self.remember(Firing {
                fire_id: fired.fire_id.clone(),
                kind: fired.kind,
                scheduled_at: fired.scheduled_at,
                fired_at: envelope.recorded_at,
                delivery: None,
            }),
            Event::ScheduleDelivered(delivered) => {
                self.settle(&delivered.fire_id, &delivered.outcome);
            }
            _ => {}
        }
    }

    fn remember(&mut self, firing: Firing) {
        if matches!(firing.kind, FireKind::Cron | FireKind::CatchUp) {
            let at = timestamp(firing.scheduled_at);
            self.last_cron = Some(self.last_cron.map_or(at, |last| last.max(at)));
        }
        if firing.kind == FireKind::External {
            if self.external_order.len() == EXTERNAL_WINDOW
                && let Some(oldest) = self.external_order.pop_front()
            {
                self.externals.remove(&oldest);
            }
            self.external_order.push_back(firing.fire_id.clone());
            self.externals
                .insert(firing.fire_id.clone(), firing.clone());
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(firing);
    }

    fn settle(&mut self, fire_id: &str, delivery: &Delivery) {
        if let Delivery::Started { run_id, .. } = delivery {
            self.last_run = Some(run_id.clone());
        }
        for firing in self
            .history
            .iter_mut()
            .chain(self.externals.get_mut(fire_id))
            .filter(|f| f.fire_id == fire_id)
        {
            firing.delivery = Some(delivery.clone());
        }
    }

    /// Appends to the record run.
    async fn record(&mut self, runtime: &Runtime, event: Event) -> Result<(), RuntimeError> {
        let envelopes = runtime
            .inner
            .journal
            .append(&self.record, self.next, vec![event])
            .await?;
        if let Some(last) = envelopes.last() {
            self.next = last.seq.next();
        }
        Ok(())
    }
}

impl Schedule {
    fn name(&self) -> &str {
        &self.parsed.definition.name
    }

    async fn view(&self) -> ScheduleView {
        let mut state = self.state.lock().await;
        if self.runtime.inner.runs.shared
            && let Err(error) = state.refresh(&self.runtime).await
        {
            tracing::warn!(schedule = self.name(), %error, "reading the firings other nodes recorded");
        }
        let history = state.history.iter().cloned().collect();
        drop(state);
        let next = *self.next.lock().unwrap_or_else(PoisonError::into_inner);
        ScheduleView {
            definition: self.parsed.definition.clone(),
            next_fire_at: next.map(offset),
            history,
        }
    }

    /// The cron expression's next occurrence after `after`.
    fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let zoned = after.to_zoned(self.parsed.zone.clone());
        self.parsed
            .cron
            .find_next_occurrence(&zoned, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The next occurrence to fire, after `last` fired and after now;
    /// kept for listings.
    fn upcoming(&self, last: Option<Timestamp>) -> Option<Timestamp> {
        let now = self.clock.now();
        let due = self.next_after(last.map_or(now, |last| last.max(now)));
        *self.next.lock().unwrap_or_else(PoisonError::into_inner) = due;
        due
    }

    /// Fires each occurrence of the cron expression, one after another.
    async fn run(&self, fired: &watch::Sender<u64>) {
        loop {
            let last = self.state.lock().await.last_cron;
            let Some(due) = self.upcoming(last) else {
                tracing::warn!(
                    schedule = self.name(),
                    "the cron expression has no next occurrence"
                );
                return;
            };
            self.clock.sleep_until(due).await;
            match self.fire(FireKind::Cron, cron_id(due), due, fired).await {
                Ok(_) => {}
                // On a cluster, the node holding the record run fired it.
                Err(error) if error.kind() == crate::ErrorKind::OwnedElsewhere => {
                    tracing::debug!(schedule = self.name(), %error, "another node fires this schedule");
                }
                // Not recorded, so not fired: the occurrence is lost, as one
                // missed while the server was down would be.
                Err(error) => {
                    tracing::warn!(schedule = self.name(), %error, "a firing could not be recorded");
                }
            }
        }
    }

    /// At start: an occurrence missed since the last one fired is fired
    /// once, the latest, unless `catch_up = "skip"`.
    async fn catch_up(&self, fired: &watch::Sender<u64>) -> Result<(), RuntimeError> {
        let Some(last) = self.state.lock().await.last_cron else {
            // Never fired: nothing was missed.
            return Ok(());
        };
        let now = self.clock.now();
        let missed = self.next_after(last).is_some_and(|due| due <= now);
        if !missed || self.parsed.definition.catch_up == CatchUp::Skip {
            return Ok(());
        }
        let zoned = now.to_zoned(self.parsed.zone.clone());
        let Ok(latest) = self.parsed.cron.find_previous_occurrence(&zoned, true) else {
            return Ok(());
        };
        let latest = latest.timestamp();
        self.fire(FireKind::CatchUp, cron_id(latest), latest, fired)
            .await
            .map(drop)
    }

    /// Records a firing, delivers its message, records what became of it.
    /// `None`: an occurrence of the cron expression at or before the
    /// latest one fired (by a catch-up here, or by another node): it is
    /// not fired again.
    async fn fire(
        &self,
        kind: FireKind,
        fire_id: String,
        scheduled_at: Timestamp,
        fired: &watch::Sender<u64>,
    ) -> Result<Option<Triggered>, RuntimeError> {
        let mut state = self.state.lock().await;
        let shared = self.runtime.inner.runs.shared;
        if shared {
            // Other nodes may have fired since: see their firings first.
            state.refresh(&self.runtime).await?;
        } else {
            // A firing left in doubt by a journal that stopped writing is
            // settled before the next one, not only at the next start.
            self.settle_in_doubt(&mut state, fired).await?;
        }
        if let Some(firing) = state.externals.get(&fire_id) {
            return Ok(Some(Triggered {
                firing: firing.clone(),
                replayed: true,
            }));
        }
        if matches!(kind, FireKind::Cron | FireKind::CatchUp)
            && state.last_cron.is_some_and(|last| last >= scheduled_at)
        {
            return Ok(None);
        }
        let (target_run, target_seq) = match self.target_address() {
            Some(address) => match self.runtime.inner.journal.find_address(&address).await? {
                Some(run) => {
                    // The run's head from the runtime's cache, not the store.
                    let last = self.runtime.get(&run).await?.cursor;
                    (Some(run), Some(last.map_or(Seq(0), Seq::next)))
                }
                None => (None, None),
            },
            None => (None, None),
        };
        let record = ScheduleFired {
            fire_id: fire_id.clone(),
            scheduled_at: offset(scheduled_at),
            kind,
            target_run,
            target_seq,
        };
        // On a shared journal the append is refused unless this node holds
        // the record run's lease: one node fires each occurrence.
        state
            .record(&self.runtime, Event::ScheduleFired(record.clone()))
            .await?;
        if shared {
            // The append proved the lease this node holds, so firings left
            // in doubt before are its to settle, and no other node's.
            self.settle_in_doubt(&mut state, fired).await?;
        }
        state.remember(Firing {
            fire_id: fire_id.clone(),
            kind,
            scheduled_at: record.scheduled_at,
            fired_at: offset(self.clock.now()),
            delivery: None,
        });
        let delivery = self.deliver(&record, state.last_run.as_ref(), true).await?;
        self.settle(&mut state, &fire_id, delivery).await?;
        fired.send_modify(|n| *n += 1);
        let firing = state
            .history
            .iter()
            .rev()
            .find(|f| f.fire_id == fire_id)
            .cloned()
            .expect("the firing was just remembered");
        Ok(Some(Triggered {
            firing,
            replayed: false,
        }))
    }

    async fn settle(
        &self,
        state: &mut State,
        fire_id: &str,
        delivery: Delivery,
    ) -> Result<(), RuntimeError> {
        match &delivery {
            Delivery::Skipped { reason } => {
                tracing::info!(schedule = self.name(), fire_id, reason, "firing skipped");
            }
            Delivery::Failed { error } => {
                tracing::warn!(
                    schedule = self.name(),
                    fire_id,
                    error,
                    "firing not delivered"
                );
            }
            _ => {}
        }
        state
            .record(
                &self.runtime,
                Event::ScheduleDelivered(ScheduleDelivered {
                    fire_id: fire_id.to_owned(),
                    outcome: delivery.clone(),
                }),
            )
            .await?;
        state.settle(fire_id, &delivery);
        Ok(())
    }

    fn target_address(&self) -> Option<Address> {
        self.parsed
            .definition
            .address
            .as_ref()
            .map(|name| Address::new(TARGET_NAMESPACE, name.clone()))
    }

    /// The context line a firing's message carries: it tells the model
    /// where the message came from, and a restart where it went.
    fn context_line(&self, record: &ScheduleFired) -> String {
        let scheduled_at = timestamp(record.scheduled_at);
        format!(
            "Sent by schedule `{}` for {scheduled_at} (firing {}).",
            self.name(),
            record.fire_id
        )
    }

    /// Delivers a recorded firing's message. A journal that cannot write
    /// is an error (nothing was delivered, the firing stays in doubt); any
    /// other refusal is the firing's outcome.
    async fn deliver(
        &self,
        record: &ScheduleFired,
        last_run: Option<&RunId>,
        may_relay: bool,
    ) -> Result<Delivery, RuntimeError> {
        let definition = &self.parsed.definition;
        let mut context = vec![self.context_line(record)];
        context.extend(definition.context.iter().cloned());
        let request = match self.target_address() {
            Some(address) => StartRequest {
                text: definition.text.clone(),
                address: Some(address),
                context,
                policy: Some(match definition.overlap {
                    Overlap::Skip => TurnPolicy::IfIdle,
                    Overlap::Queue => TurnPolicy::Queue,
                }),
                ..StartRequest::default()
            },
            None => {
                if definition.overlap == Overlap::Skip
                    && let Some(run) = last_run
                    && self
                        .runtime
                        .get(run)
                        .await
                        .is_ok_and(|v| v.status.is_active())
                {
                    return Ok(Delivery::Skipped {
                        reason: format!("the previous firing's run {run} is still in progress"),
                    });
                }
                StartRequest {
                    text: definition.text.clone(),
                    operation_id: Some(record.fire_id.clone()),
                    principal: Some(self.principal.clone()),
                    title: Some(format!(
                        "{} {}",
                        self.name(),
                        timestamp(record.scheduled_at)
                    )),
                    kind: Some("schedule".into()),
                    context,
                    ..StartRequest::default()
                }
            }
        };
        let started = match self.runtime.start(request).await {
            // On a cluster, the address's run is another node's to drive:
            // the firing goes to it.
            Err(error) if may_relay && error.kind() == crate::ErrorKind::OwnedElsewhere => {
                let relayed = match (self.relay.get(), &record.target_run) {
                    (Some(relay), Some(run)) => relay.deliver(self.name(), run, record).await?,
                    _ => None,
                };
                match relayed {
                    Some(delivery) => return Ok(delivery),
                    None => Err(error),
                }
            }
            other => other,
        };
        Ok(match started {
            Ok(Accepted::Started { run, turn } | Accepted::Steered { run, turn }) => {
                Delivery::Started {
                    run_id: run,
                    turn_id: Some(turn),
                }
            }
            Ok(Accepted::Queued { run, .. }) => Delivery::Queued { run_id: run },
            Ok(Accepted::Replayed { run, .. }) => Delivery::Started {
                run_id: run,
                turn_id: None,
            },
            Err(RuntimeError::TurnInProgress { run, .. }) => Delivery::Skipped {
                reason: format!("run {run} has a turn in progress"),
            },
            Err(RuntimeError::RunWaiting(run)) => Delivery::Skipped {
                reason: format!("run {run} is waiting for an answer"),
            },
            Err(error) if error.kind() == crate::ErrorKind::Storage => return Err(error),
            Err(error) => Delivery::Failed {
                error: error.to_string(),
            },
        })
    }

    /// At start: a firing recorded but not settled (the process died in
    /// between) is looked for where its message would have gone, and
    /// delivered only if it is not there.
    async fn settle_in_doubt(
        &self,
        state: &mut State,
        fired: &watch::Sender<u64>,
    ) -> Result<(), RuntimeError> {
        let in_doubt: Vec<Firing> = state
            .history
            .iter()
            .filter(|f| f.delivery.is_none())
            .cloned()
            .collect();
        if in_doubt.is_empty() {
            return Ok(());
        }
        let records = self.records_of(state, &in_doubt).await?;
        for record in records {
            let delivery = match self.find_delivery(&record).await? {
                Some(delivery) => delivery,
                None => {
                    tracing::info!(
                        schedule = self.name(),
                        fire_id = record.fire_id,
                        "a firing recorded but never settled (a crash, a journal that stopped writing) was not delivered: delivering it now"
                    );
                    self.deliver(&record, state.last_run.as_ref(), true).await?
                }
            };
            self.settle(state, &record.fire_id, delivery).await?;
            fired.send_modify(|n| *n += 1);
        }
        Ok(())
    }

    /// The `schedule_fired` records of `firings`, read back.
    async fn records_of(
        &self,
        state: &State,
        firings: &[Firing],
    ) -> Result<Vec<ScheduleFired>, RuntimeError> {
        let from = Seq(state.next.0.saturating_sub(RECORD_TAIL));
        let envelopes = self.runtime.inner.journal.read(&state.record, from).await?;
        Ok(envelopes
            .into_iter()
            .filter_map(|e| match e.event {
                Event::ScheduleFired(fired)
                    if firings.iter().any(|f| f.fire_id == fired.fire_id) =>
                {
                    Some(fired)
                }
                _ => None,
            })
            .collect())
    }

    /// Where a firing's message went, if it went anywhere.
    async fn find_delivery(
        &self,
        record: &ScheduleFired,
    ) -> Result<Option<Delivery>, RuntimeError> {
        let journal = &self.runtime.inner.journal;
        let Some(address) = self.target_address() else {
            return Ok(journal
                .find_operation(&self.principal, &record.fire_id)
                .await?
                .map(|run| Delivery::Started {
                    run_id: run,
                    turn_id: None,
                }));
        };
        let run = match &record.target_run {
            Some(run) => run.clone(),
            None => match journal.find_address(&address).await? {
                Some(run) => run,
                None => return Ok(None),
            },
        };
        let line = self.context_line(record);
        let from = record.target_seq.unwrap_or(Seq(0));
        for envelope in journal.read(&run, from).await? {
            match &envelope.event {
                Event::TurnStarted(started) if started.context.contains(&line) => {
                    return Ok(Some(Delivery::Started {
                        run_id: run,
                        turn_id: Some(started.turn_id.clone()),
                    }));
                }
                Event::InputQueued(queued) if queued.context.contains(&line) => {
                    return Ok(Some(Delivery::Queued { run_id: run }));
                }
                _ => {}
            }
        }
        Ok(None)
    }
}

/// A cron firing's id: the instant it was due, so a catch-up and the
/// firing it stands for are one firing.
fn cron_id(at: Timestamp) -> String {
    format!("cron:{at}")
}

fn offset(at: Timestamp) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(at.as_nanosecond())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn timestamp(at: OffsetDateTime) -> Timestamp {
    Timestamp::from_nanosecond(at.unix_timestamp_nanos()).unwrap_or(Timestamp::UNIX_EPOCH)
}
