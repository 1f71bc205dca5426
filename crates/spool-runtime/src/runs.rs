//! The runs this process keeps in memory: each run's folded state, its
//! head, the model's view of its conversation and its current turn's
//! events, advanced event by event as this process appends. No command
//! reads a run's log from the start while the run is cached; the log is
//! read (and its hash chain verified) once, when the run is first touched
//! or after it was evicted.
//!
//! Every append of this process goes through a [`Locked`] run, so the
//! cache and the journal cannot drift apart: the lock is held from the
//! read of the state, through the checks, to the append and the fold of
//! what was appended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use spool_journal::event::Usage;
use spool_journal::fold::{State, Status};
use spool_journal::{Envelope, Event, Journal, JournalError, RunId, Seq};
use tokio::sync::OwnedMutexGuard;

use crate::agents::{Agent, Agents, Named};
use crate::error::RuntimeError;
use crate::history::History;

/// How many runs stay cached by default. A cached run costs its state and
/// its model history: a run parked on an approval about 12 KB (measured;
/// mostly JSON trees), a long conversation what its messages hold. 1,024
/// keeps a server with 10,000 parked runs near 2.5 KB a run on average
/// (`cargo xtask bench --only parked-runs`). Runs in use are never
/// evicted, so more may be in memory while more are busy.
pub const DEFAULT_CACHED_RUNS: usize = 1024;

/// A bounded map from run to its cached state and lock, least recently
/// used first out.
pub(crate) struct Runs {
    map: Mutex<Map>,
    capacity: usize,
    /// The agents runs run on: a run read from its log starts on the
    /// current one and moves to the one its log names.
    pub(crate) agents: Arc<Agents>,
    /// Other processes append to the journal: a cached run another
    /// process may have changed is checked against its log before use.
    pub(crate) shared: bool,
}

#[derive(Default)]
struct Map {
    slots: HashMap<RunId, Slot>,
    /// A counter, not a clock: the order in which slots were last used.
    tick: u64,
    /// Inserts to wait before the next sweep. After a sweep that could
    /// not get under the bound (every slot in use, as when thousands of
    /// runs resume at once), the next waits for an eighth of the bound in
    /// inserts, so a full map is not rescanned on every insert.
    sweep_in: usize,
    /// Sweeps so far, for the tests that hold sweeping to its bound.
    sweeps: u64,
}

struct Slot {
    entry: Arc<tokio::sync::Mutex<Cached>>,
    used: u64,
}

impl Runs {
    pub(crate) fn new(capacity: usize, agents: Arc<Agents>) -> Self {
        Self {
            map: Mutex::new(Map::default()),
            capacity: capacity.max(1),
            agents,
            shared: false,
        }
    }

    /// See [`crate::RuntimeBuilder::shared_journal`].
    pub(crate) fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// The run's slot, made empty (to be loaded) when it has none.
    fn entry(&self, run: &RunId) -> Arc<tokio::sync::Mutex<Cached>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.tick += 1;
        let tick = map.tick;
        if let Some(slot) = map.slots.get_mut(run) {
            slot.used = tick;
            return Arc::clone(&slot.entry);
        }
        map.sweep_in = map.sweep_in.saturating_sub(1);
        if map.slots.len() >= self.capacity && map.sweep_in == 0 {
            map.sweeps += 1;
            evict(&mut map.slots, self.capacity);
            if map.slots.len() >= self.capacity {
                map.sweep_in = self.capacity.div_ceil(8);
            }
        }
        let entry = Arc::new(tokio::sync::Mutex::new(Cached::new(self.agents.current())));
        map.slots.insert(
            run.clone(),
            Slot {
                entry: Arc::clone(&entry),
                used: tick,
            },
        );
        entry
    }

    /// Drops the run's slot unless someone holds it: a run that does not
    /// exist keeps no memory.
    fn forget(&self, run: &RunId) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .slots
            .get(run)
            .is_some_and(|slot| Arc::strong_count(&slot.entry) == 1)
        {
            map.slots.remove(run);
        }
    }

    /// Drops `run`'s slot, held or not: after its deletion, whoever holds
    /// it finds it unloaded and reads the (empty) log.
    pub(crate) fn remove(&self, run: &RunId) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.slots.remove(run);
    }

    /// Drops what is cached of `run`, so its log is read again when it is
    /// next locked: another process may have appended to it meanwhile.
    pub(crate) async fn invalidate(&self, run: &RunId) {
        self.entry(run).lock_owned().await.loaded = false;
    }

    /// How many runs are cached.
    pub(crate) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .len()
    }
}

/// Evicts the least recently used slots nobody holds, down to seven
/// eighths of `capacity`, so a full map is swept once per many inserts
/// rather than on each one. A slot held by a task (a lock waited for or
/// taken, a driver between steps) stays: its lock must stay the one lock.
fn evict(slots: &mut HashMap<RunId, Slot>, capacity: usize) {
    let keep = capacity - capacity / 8;
    let mut idle: Vec<(u64, RunId)> = slots
        .iter()
        .filter(|(_, slot)| Arc::strong_count(&slot.entry) == 1)
        .map(|(run, slot)| (slot.used, run.clone()))
        .collect();
    idle.sort_unstable_by_key(|(used, _)| *used);
    let excess = slots.len().saturating_sub(keep);
    for (_, run) in idle.into_iter().take(excess) {
        slots.remove(&run);
    }
}

/// What the runtime keeps of one run.
#[derive(Debug)]
pub(crate) struct Cached {
    /// Whether the log has been read into this entry.
    loaded: bool,
    /// The run's next position.
    next: Seq,
    /// The same, readable without the run's lock: where a live delta made
    /// now is placed (the driver reads it while its model streams, as
    /// commands append).
    head: Arc<AtomicU64>,
    /// The folded state, without its conversation: the model's view of it
    /// is [`Cached::history`], and the one command that needs its entries'
    /// positions (compaction) reads the log for them. Kept, it would hold
    /// every answer a second time, as a JSON tree (about 1.4 KB for a
    /// one-line answer), in every cached run.
    pub(crate) state: State,
    /// The model's conversation before the current turn's `turn_started`.
    pub(crate) history: History,
    /// The current turn's events from its `turn_started` on, while a turn
    /// is in progress; empty otherwise. `None` while the run is parked and
    /// untouched: a parked run's state answers every command and query, and
    /// its turn's events (most of what it would cost in memory) are read
    /// back, from the turn's start only, when it is next appended to.
    turn_log: Option<Vec<Envelope>>,
    /// Where the current (or last) turn's `turn_started` is.
    turn_start: Option<Seq>,
    /// Model calls requested before the current turn.
    pub(crate) calls_before_turn: u64,
    calls: u64,
    /// The usage the current (or last) turn's completion recorded.
    pub(crate) turn_usage: Option<Usage>,
    /// The bytes the run's events take as the journal stores them.
    pub(crate) bytes: u64,
    /// The agent the run's turns run on: its engine, tools, prompt,
    /// budgets and limits.
    pub(crate) agent: Arc<Agent>,
    /// Whether the run was said to be near its limit.
    warned: bool,
}

/// Counts what is written to it: an event's stored size, without a copy.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Cached {
    fn new(agent: Arc<Agent>) -> Self {
        Self {
            loaded: false,
            next: Seq(0),
            head: Arc::default(),
            state: State::default(),
            history: History::new(agent.system.clone()),
            turn_log: Some(Vec::new()),
            turn_start: None,
            calls_before_turn: 0,
            calls: 0,
            turn_usage: None,
            bytes: 0,
            agent,
            warned: false,
        }
    }

    /// Whether the run is past `warn_at` of a limit.
    pub(crate) fn near_limit(&self) -> bool {
        self.agent.limits.near(self.next.0, self.bytes)
    }

    /// `RunTooLarge` when the run is past a limit: new input is refused.
    pub(crate) fn check_size(&self, run: &RunId) -> Result<(), RuntimeError> {
        let limits = &self.agent.limits;
        if limits.exceeded(self.next.0, self.bytes) {
            return Err(RuntimeError::RunTooLarge {
                run: run.clone(),
                events: self.next.0,
                bytes: self.bytes,
                max_events: limits.max_events,
                max_bytes: limits.max_bytes,
            });
        }
        Ok(())
    }

    /// The run's next position (the number of its events).
    pub(crate) fn next(&self) -> Seq {
        self.next
    }

    /// The run's next position as appends move it, readable without the
    /// lock.
    pub(crate) fn head(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.head)
    }

    /// The current turn's events from its `turn_started` on (empty when no
    /// turn is in progress). Read back first if the run was parked: see
    /// [`Locked::existing`] and [`Locked::append`].
    pub(crate) fn turn_log(&self) -> &[Envelope] {
        self.turn_log.as_deref().unwrap_or_default()
    }

    /// Folds one appended (or read) event; `named` holds the agents the
    /// events name.
    fn apply(&mut self, envelope: Envelope, named: &Named) {
        let mut size = Counter(0);
        if serde_json::to_writer(&mut size, &envelope).is_ok() {
            self.bytes += size.0;
        }
        match &envelope.event {
            Event::RunCreated(created) => {
                if let Some(digest) = &created.agent {
                    self.run_on(named.get(digest));
                }
            }
            Event::AgentChanged(changed) => self.run_on(named.get(&changed.to)),
            _ => {}
        }
        if !self.warned && self.near_limit() {
            self.warned = true;
            tracing::warn!(run_id = %envelope.run_id, events = envelope.seq.0 + 1, bytes = self.bytes,
                max_events = self.agent.limits.max_events, max_bytes = self.agent.limits.max_bytes,
                "a run nears its size limit ([limits] in spool.toml): past it, new input to it is refused");
        }
        self.state.apply(&envelope);
        if !self.state.conversation.is_empty() {
            self.state.conversation = Vec::new();
        }
        self.next = envelope.seq.next();
        self.head.store(self.next.0, Ordering::Release);
        match &envelope.event {
            Event::TurnStarted(_) => {
                self.settle_turn_log();
                self.turn_start = Some(envelope.seq);
                self.calls_before_turn = self.calls;
                self.turn_usage = None;
            }
            Event::ModelCallRequested(_) => self.calls += 1,
            Event::TurnCompleted(done) if self.state.turn.as_ref() == Some(&done.turn_id) => {
                self.turn_usage = done.usage;
            }
            _ => {}
        }
        if self.state.status.is_active() {
            if let Some(turn_log) = &mut self.turn_log {
                turn_log.push(envelope);
            }
        } else {
            self.settle_turn_log();
            self.history.apply(&envelope);
        }
    }

    /// Runs the run's turns from here on `agent`: its prompt heads the
    /// conversation the model sees, its limits hold. `None` (an agent the
    /// folding did not resolve, which every caller does) keeps the one it
    /// has.
    fn run_on(&mut self, agent: Option<&Arc<Agent>>) {
        if let Some(agent) = agent
            && !Arc::ptr_eq(agent, &self.agent)
        {
            self.agent = Arc::clone(agent);
            self.history.set_system(agent.system.clone());
            self.warned = false;
        }
    }

    /// Moves the finished turn's events into the history.
    fn settle_turn_log(&mut self) {
        match self.turn_log.take() {
            Some(turn_log) => {
                for envelope in turn_log {
                    self.history.apply(&envelope);
                }
            }
            // Every append to a parked run reads its turn back first, so a
            // turn never ends without its events; should one, the history
            // would miss them: read the whole run again instead.
            None => self.loaded = false,
        }
        self.turn_log = Some(Vec::new());
    }

    /// Lets a parked run's turn events go.
    fn park(&mut self) {
        if matches!(self.state.status, Status::Waiting(_)) {
            self.turn_log = None;
        }
    }

    /// Reads a parked run's current turn back, from its start only.
    async fn unpark(&mut self, journal: &dyn Journal, run: &RunId) -> Result<(), RuntimeError> {
        if self.turn_log.is_some() || !self.state.status.is_active() {
            return Ok(());
        }
        let Some(start) = self.turn_start else {
            return Err(RuntimeError::corrupt(
                run,
                "a turn in progress has no start".into(),
            ));
        };
        let turn_log = journal.read(run, start).await?;
        match turn_log.first() {
            Some(first) if first.seq == start && matches!(first.event, Event::TurnStarted(_)) => {}
            _ => {
                return Err(RuntimeError::corrupt(
                    run,
                    format!("the turn started at seq {start} does not read back"),
                ));
            }
        }
        self.turn_log = Some(turn_log);
        Ok(())
    }

    /// Reads what the journal holds past this entry's head.
    async fn load(
        &mut self,
        journal: &dyn Journal,
        run: &RunId,
        agents: &Agents,
    ) -> Result<(), JournalError> {
        if !self.loaded {
            *self = Self::new(agents.current());
        }
        let envelopes = journal.read(run, self.next).await?;
        let named = agents
            .named(journal, crate::agents::events(&envelopes))
            .await?;
        for envelope in envelopes {
            self.apply(envelope, &named);
        }
        self.park();
        self.loaded = true;
        Ok(())
    }
}

/// One run, locked, with its cached state: how every command reads a run
/// and appends to it. Dropping it lets the run go.
pub(crate) struct Locked {
    run: RunId,
    guard: OwnedMutexGuard<Cached>,
    agents: Arc<Agents>,
}

impl std::fmt::Debug for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked").field("run", &self.run).finish()
    }
}

impl Locked {
    /// Locks `run`, reading its log once if it is not cached. With
    /// `recheck` (a journal other processes append to, and a run this one
    /// is not driving), a cached run is first checked for events past its
    /// head, and read again when there are.
    pub(crate) async fn existing(
        runs: &Runs,
        journal: &dyn Journal,
        run: &RunId,
        recheck: bool,
    ) -> Result<Self, RuntimeError> {
        let mut guard = runs.entry(run).lock_owned().await;
        if guard.loaded && recheck {
            match journal.read(run, guard.next).await {
                Ok(newer) if newer.is_empty() => {}
                // Moved on, or deleted (by another node's sweep): read
                // again, which finds the tombstone of a deleted run.
                Ok(_) | Err(JournalError::RunDeleted { .. }) => guard.loaded = false,
                Err(error) => return Err(error.into()),
            }
        }
        if !guard.loaded {
            guard.load(journal, run, &runs.agents).await?;
        }
        if guard.next == Seq(0) {
            drop(guard);
            runs.forget(run);
            // A deleted run says so, rather than that it never was.
            if let Some(tombstone) = journal.tombstone(run).await? {
                return Err(RuntimeError::RunDeleted(tombstone));
            }
            return Err(RuntimeError::RunNotFound(run.clone()));
        }
        // A running turn's driver walks its events; a parked one's are read
        // when something is appended to it.
        if guard.state.status == Status::Running {
            guard.unpark(journal, run).await?;
        }
        Ok(Self {
            run: run.clone(),
            guard,
            agents: Arc::clone(&runs.agents),
        })
    }

    /// Locks a run this process is about to create under a fresh id, on
    /// `agent`: it has no log to read.
    pub(crate) async fn fresh(runs: &Runs, run: &RunId, agent: &Arc<Agent>) -> Self {
        let mut guard = runs.entry(run).lock_owned().await;
        if !guard.loaded {
            *guard = Cached::new(Arc::clone(agent));
            guard.loaded = true;
        }
        Self {
            run: run.clone(),
            guard,
            agents: Arc::clone(&runs.agents),
        }
    }

    /// The run.
    pub(crate) fn run(&self) -> &RunId {
        &self.run
    }

    /// Marks the cached run to be read again by whoever locks it next:
    /// after its deletion, a command waiting on this lock reads the
    /// (empty) log and finds the tombstone.
    pub(crate) fn unload(&mut self) {
        self.guard.loaded = false;
    }

    /// The cached run.
    pub(crate) fn cached(&self) -> &Cached {
        &self.guard
    }

    /// The folded state.
    pub(crate) fn state(&self) -> &State {
        &self.guard.state
    }

    /// Appends `events` at the run's head and folds them in. A parked
    /// run's turn is read back first, so the turn's events are whole when
    /// it goes on or ends. On a refusal (an address or operation id taken,
    /// a malformed append) nothing was written and the cache stands; on any
    /// other failure it is read again from the journal next time, since the
    /// log may have moved.
    pub(crate) async fn append(
        &mut self,
        journal: &dyn Journal,
        events: Vec<Event>,
    ) -> Result<(), RuntimeError> {
        self.guard.unpark(journal, &self.run).await?;
        let named = self.agents.named(journal, events.iter()).await?;
        match journal.append(&self.run, self.guard.next, events).await {
            Ok(envelopes) => {
                for envelope in envelopes {
                    self.guard.apply(envelope, &named);
                }
                self.guard.park();
                Ok(())
            }
            Err(error) => {
                if !matches!(
                    error,
                    JournalError::AddressTaken { .. }
                        | JournalError::OperationTaken { .. }
                        | JournalError::InvalidAppend { .. }
                ) {
                    self.guard.loaded = false;
                }
                Err(error.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents() -> Arc<Agents> {
        let echo = crate::agents::AgentSpec::new(
            Arc::new(crate::engines::EchoEngine),
            crate::tool::LiveTools::default(),
        );
        Arc::new(Agents::new(echo.into(), None))
    }

    fn run(n: usize) -> RunId {
        RunId::new(format!("run_{n}")).expect("a valid id")
    }

    #[test]
    fn runs_in_use_are_never_evicted_and_a_full_map_is_not_rescanned_on_every_insert() {
        let runs = Runs::new(64, agents());
        let held: Vec<_> = (0..1000).map(|n| runs.entry(&run(n))).collect();
        assert_eq!(runs.len(), 1000, "a slot in use keeps its lock");
        let sweeps = runs.map.lock().expect("not poisoned").sweeps;
        assert!(
            sweeps <= (1000 - 64) / 8 + 1,
            "{sweeps} sweeps for 936 inserts over the bound"
        );
        drop(held);
    }

    #[test]
    fn a_cached_run_keeps_no_copy_of_its_answers_json_once_its_turn_is_over() {
        let answer = Arc::new(
            serde_json::json!({"text": "done", "usage": {"input_tokens": 1, "output_tokens": 2}}),
        );
        let events = [
            serde_json::json!({"kind": "run_created", "payload": {}}),
            serde_json::json!({"kind": "turn_started", "payload": {"turn_id": "turn_1", "input": "go", "policy": "steer"}}),
            serde_json::json!({"kind": "model_call_requested", "payload": {"request_hash": "h", "new_messages": [{"role": "user", "content": "go"}]}}),
        ]
        .into_iter()
        .map(|event| serde_json::from_value::<Event>(event).expect("an event"))
        .chain([
            Event::ModelCallCompleted(spool_journal::event::ModelCallCompleted {
                message: Arc::clone(&answer),
                usage: None,
                finish_reason: None,
            }),
            serde_json::from_value(serde_json::json!({"kind": "turn_completed", "payload": {"turn_id": "turn_1", "response": "done"}}))
                .expect("an event"),
        ]);
        let mut cached = Cached::new(agents().current());
        for (seq, event) in events.enumerate() {
            cached.apply(
                Envelope {
                    run_id: run(0),
                    seq: Seq(seq as u64),
                    recorded_at: time::OffsetDateTime::UNIX_EPOCH,
                    event,
                },
                &Named::default(),
            );
        }
        assert_eq!(cached.state.status, Status::Completed);
        assert_eq!(
            cached.history.messages().len(),
            2,
            "the model still sees both"
        );
        assert!(cached.state.conversation.is_empty());
        assert_eq!(
            Arc::strong_count(&answer),
            1,
            "only the caller holds the answer's JSON tree"
        );
    }

    #[test]
    fn a_map_held_over_its_bound_comes_back_under_it_once_its_runs_are_let_go() {
        let runs = Runs::new(16, agents());
        let held: Vec<_> = (0..40).map(|n| runs.entry(&run(n))).collect();
        drop(held);
        for n in 40..44 {
            drop(runs.entry(&run(n)));
        }
        assert!(runs.len() <= 16, "{} cached", runs.len());
        // The least recently used went first; the newest stayed.
        let map = runs.map.lock().expect("not poisoned");
        assert!(map.slots.contains_key(&run(43)));
        assert!(!map.slots.contains_key(&run(0)));
    }
}
