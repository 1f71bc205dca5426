//! The `Runtime`: the API every transport rides on. It turns calls (start,
//! message, respond, cancel, reset, clear, compact) into journal events and
//! drives each run's turns in a task of its own, detached from the caller.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::json;
use spool_journal::event::{
    AddressBinding, Answer, CancelRequested, Compacted, ContextCleared, InputQueued, InputSteered,
    Resumed, RunCreated, RunRetired, ToolCallAbandoned, ToolCallResolved, TurnStarted,
};
use spool_journal::fold::{State, Status, fold};
use spool_journal::{Address, Envelope, Event, Journal, Principal, RunId, Seq, TurnId};
use spool_wire::http::{SuspendKind, TurnPolicy};
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::hub::{Hub, Subscription};
use crate::tool::Tools;
use crate::view::{RunView, Snapshot};

/// A cheap-to-clone handle on the runtime.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("tools", &self.inner.tools)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) tools: Tools,
    pub(crate) system_prompt: Option<String>,
    pub(crate) budgets: crate::agent::Budgets,
    pub(crate) pricing: Option<crate::agent::Pricing>,
    pub(crate) ids: Arc<dyn crate::ids::IdSource>,
    pub(crate) hub: Hub,
    /// Runs with a driver task.
    pub(crate) driving: Mutex<HashMap<RunId, Driving>>,
    /// One appender at a time per run, in this process.
    locks: Mutex<HashMap<RunId, Arc<tokio::sync::Mutex<()>>>>,
    /// Runs with a wake-up armed.
    pub(crate) sleeping: Mutex<HashSet<RunId>>,
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

/// Builds a runtime.
pub struct RuntimeBuilder {
    journal: Arc<dyn Journal>,
    engine: Arc<dyn Engine>,
    tools: Tools,
    system_prompt: Option<String>,
    budgets: crate::agent::Budgets,
    pricing: Option<crate::agent::Pricing>,
    ids: Arc<dyn crate::ids::IdSource>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder").finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The model engine (the echo engine by default).
    #[must_use]
    pub fn engine(mut self, engine: Arc<dyn Engine>) -> Self {
        self.engine = engine;
        self
    }

    /// The tools (the built-ins by default).
    #[must_use]
    pub fn tools(mut self, tools: Tools) -> Self {
        self.tools = tools;
        self
    }

    /// The system prompt.
    #[must_use]
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// The budgets checked before each model call (none by default).
    #[must_use]
    pub fn budgets(mut self, budgets: crate::agent::Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// What the engine's model costs, for the cost budget.
    #[must_use]
    pub fn pricing(mut self, pricing: crate::agent::Pricing) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// Everything an agent definition says: system prompt, tools, budgets,
    /// pricing, and the engine when the runtime provides it (`echo`,
    /// `scripted:`); other engine specs are set with
    /// [`RuntimeBuilder::engine`].
    ///
    /// # Errors
    ///
    /// When the tools or a script do not load.
    pub fn agent(mut self, loaded: &crate::agent::Loaded) -> Result<Self, String> {
        let definition = &loaded.definition;
        self.system_prompt
            .clone_from(&definition.agent.system_prompt);
        self.tools = definition.tools(&loaded.base)?;
        self.budgets = definition.budgets;
        self.pricing = definition.pricing;
        if let Some(engine) = definition.builtin_engine(&loaded.base)? {
            self.engine = engine;
        }
        Ok(self)
    }

    /// Where run and turn ids come from (unique, time-ordered ids by
    /// default).
    #[must_use]
    pub fn ids(mut self, ids: Arc<dyn crate::ids::IdSource>) -> Self {
        self.ids = ids;
        self
    }

    /// The runtime, with nothing running yet: call [`Runtime::recover`].
    #[must_use]
    pub fn build(self) -> Runtime {
        Runtime {
            inner: Arc::new(Inner {
                journal: self.journal,
                engine: self.engine,
                tools: self.tools,
                system_prompt: self.system_prompt,
                budgets: self.budgets,
                pricing: self.pricing,
                ids: self.ids,
                hub: Hub::default(),
                driving: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                sleeping: Mutex::new(HashSet::new()),
            }),
        }
    }
}

/// What [`Runtime::recover`] did.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Runs resumed (driven again, or their sleep re-armed).
    pub resumed: usize,
    /// Runs whose log could not be read, and why; left as they are.
    pub unreadable: Vec<(RunId, RuntimeError)>,
}

/// Starting a run, or a message through an address.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartRequest {
    /// The user's input.
    pub text: String,
    /// A channel address; created on first use, a message to its run after.
    pub address: Option<Address>,
    /// An idempotency key; needs `principal`.
    pub operation_id: Option<String>,
    /// The verified caller.
    pub principal: Option<Principal>,
    /// A listing title, for a new run.
    pub title: Option<String>,
    /// The surface kind, for a new run.
    pub kind: Option<String>,
    /// Input for this turn only.
    pub context: Vec<String>,
    /// `steer` (default) or `queue`, when the run is busy.
    pub policy: Option<TurnPolicy>,
}

/// A message to an existing run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MessageRequest {
    /// The user's input.
    pub text: String,
    /// Input for this turn only.
    pub context: Vec<String>,
    /// `steer` (default) or `queue`, when the run is busy.
    pub policy: Option<TurnPolicy>,
}

/// What became of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A new turn started.
    Started {
        /// The run.
        run: RunId,
        /// The turn.
        turn: TurnId,
    },
    /// Steered into the running turn.
    Steered {
        /// The run.
        run: RunId,
        /// The running turn.
        turn: TurnId,
    },
    /// Queued to run after the running turn.
    Queued {
        /// The run.
        run: RunId,
    },
    /// An operation id's earlier run, returned without another turn.
    Replayed {
        /// The run.
        run: RunId,
    },
}

impl Accepted {
    /// The run concerned.
    #[must_use]
    pub fn run(&self) -> &RunId {
        match self {
            Self::Started { run, .. }
            | Self::Steered { run, .. }
            | Self::Queued { run }
            | Self::Replayed { run } => run,
        }
    }
}

/// The outcome of a cancel command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Recorded; the turn will end `cancelled`.
    Requested(TurnId),
    /// Nothing was running.
    NotActive,
    /// The named turn is not the current one.
    Stale {
        /// The current turn, if any.
        current: Option<TurnId>,
    },
}

impl Runtime {
    /// A runtime on `journal` with the echo engine and the built-in tools.
    #[must_use]
    pub fn builder(journal: Arc<dyn Journal>) -> RuntimeBuilder {
        RuntimeBuilder {
            journal,
            engine: Arc::new(crate::engines::EchoEngine),
            tools: Tools::builtin(),
            system_prompt: None,
            budgets: crate::agent::Budgets::default(),
            pricing: None,
            ids: Arc::new(crate::ids::UniqueIds),
        }
    }

    /// Resumes what the journal says was in progress: runs that were
    /// running (their recorded steps are replayed, never re-run), cancels
    /// recorded before a stop, queued input, and sleeps (re-armed). Waiting
    /// runs stay waiting.
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
        let mut recovery = Recovery::default();
        for summary in self.inner.journal.runs().await? {
            match summary.status {
                Status::Running => {
                    self.inner.clone().ensure_driver(&summary.run_id);
                    recovery.resumed += 1;
                }
                Status::Retired | Status::Pending => {}
                _ => {
                    let state = match self.load(&summary.run_id).await {
                        Ok((_, state)) => state,
                        Err(error) => {
                            recovery.unreadable.push((summary.run_id, error));
                            continue;
                        }
                    };
                    if let Some(sleep) = &state.sleep {
                        self.inner.arm_sleep(&summary.run_id, sleep.clone());
                        recovery.resumed += 1;
                    } else if !state.queued.is_empty() || state.cancel_requested.is_some() {
                        self.inner.clone().ensure_driver(&summary.run_id);
                        recovery.resumed += 1;
                    }
                }
            }
        }
        Ok(recovery)
    }

    /// Starts a run (or messages one through an address, or returns an
    /// operation id's earlier run).
    ///
    /// # Errors
    ///
    /// `BadRequest` for an operation id without a principal or with an
    /// address; `OperationConflict` for an operation id reused with a
    /// different request; as [`Runtime::send`] for a message through an
    /// address.
    pub async fn start(&self, request: StartRequest) -> Result<Accepted, RuntimeError> {
        if let Some(operation_id) = &request.operation_id {
            let Some(principal) = &request.principal else {
                return Err(RuntimeError::BadRequest(
                    "`operation_id` needs a verified principal".into(),
                ));
            };
            if request.address.is_some() {
                return Err(RuntimeError::BadRequest(
                    "`operation_id` cannot accompany `address`".into(),
                ));
            }
            if let Some(run) = self
                .inner
                .journal
                .find_operation(principal, operation_id)
                .await?
            {
                return self.replay_operation(run, operation_id, &request).await;
            }
        }
        if let Some(address) = &request.address
            && let Some(run) = self.inner.journal.find_address(address).await?
        {
            return self.send(&run, request.into_message()).await;
        }
        let run = self.inner.ids.run_id();
        let turn = self.inner.ids.turn_id(&run, 1);
        let created = Event::RunCreated(RunCreated {
            address: request.address.clone(),
            operation_id: request.operation_id.clone(),
            request_hash: request.operation_id.as_ref().map(|_| request.hash()),
            title: request.title.clone(),
            kind: request.kind.clone(),
            principal: request.principal.clone(),
        });
        let started = Event::TurnStarted(TurnStarted {
            turn_id: turn.clone(),
            input: request.text.clone(),
            context: request.context.clone(),
            policy: request.policy.clone().unwrap_or(TurnPolicy::Steer),
            from_queue: None,
        });
        match self.inner.append(&run, vec![created, started]).await {
            Ok(_) => {}
            // Someone else took the address or the operation id first: go
            // through what they made.
            Err(RuntimeError::Journal(spool_journal::JournalError::AddressTaken {
                run, ..
            })) => {
                return self.send(&run, request.into_message()).await;
            }
            Err(RuntimeError::Journal(spool_journal::JournalError::OperationTaken {
                run,
                operation_id,
            })) => {
                return self.replay_operation(run, &operation_id, &request).await;
            }
            Err(other) => return Err(other),
        }
        self.inner.clone().ensure_driver(&run);
        Ok(Accepted::Started { run, turn })
    }

    async fn replay_operation(
        &self,
        run: RunId,
        operation_id: &str,
        request: &StartRequest,
    ) -> Result<Accepted, RuntimeError> {
        let log = self.inner.journal.read(&run, Seq(0)).await?;
        let recorded = log.first().and_then(|e| match &e.event {
            Event::RunCreated(created) => created.request_hash.clone(),
            _ => None,
        });
        if recorded.as_deref() == Some(request.hash().as_str()) {
            Ok(Accepted::Replayed { run })
        } else {
            Err(RuntimeError::OperationConflict {
                operation_id: operation_id.to_owned(),
                run,
            })
        }
    }

    /// Sends a message to an existing run: a new turn when it is idle;
    /// steered into or queued after the running turn when it is busy.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, `RunRetired`, or `RunWaiting` (answer it with
    /// [`Runtime::respond`]).
    pub async fn send(
        &self,
        run: &RunId,
        message: MessageRequest,
    ) -> Result<Accepted, RuntimeError> {
        let lock = self.inner.lock(run);
        let guard = lock.lock().await;
        let (log, state) = self.load(run).await?;
        let next = Seq(log.len() as u64);
        let (events, accepted) = match &state.status {
            Status::Retired => return Err(RuntimeError::RunRetired(run.clone())),
            Status::Waiting(_) => return Err(RuntimeError::RunWaiting(run.clone())),
            Status::Running => {
                let turn = state.turn.clone().expect("a running run has a turn");
                match message.policy.unwrap_or(TurnPolicy::Steer) {
                    TurnPolicy::Queue => (
                        vec![Event::InputQueued(InputQueued {
                            input: message.text,
                            context: message.context,
                        })],
                        Accepted::Queued { run: run.clone() },
                    ),
                    TurnPolicy::Steer => (
                        vec![Event::InputSteered(InputSteered {
                            turn_id: turn.clone(),
                            input: message.text,
                        })],
                        Accepted::Steered {
                            run: run.clone(),
                            turn,
                        },
                    ),
                    TurnPolicy::Unknown(policy) => {
                        return Err(RuntimeError::BadRequest(format!(
                            "unknown turn policy `{policy}`"
                        )));
                    }
                }
            }
            _ => {
                let turn = self.inner.ids.turn_id(run, crate::turn::turns(&log) + 1);
                (
                    vec![Event::TurnStarted(TurnStarted {
                        turn_id: turn.clone(),
                        input: message.text,
                        context: message.context,
                        policy: message.policy.unwrap_or(TurnPolicy::Steer),
                        from_queue: None,
                    })],
                    Accepted::Started {
                        run: run.clone(),
                        turn,
                    },
                )
            }
        };
        self.append_and_drive(run, guard, next, events).await?;
        Ok(accepted)
    }

    /// Answers a waiting run. Each answer is checked against the schema the
    /// suspension recorded before `resumed` is written.
    ///
    /// # Errors
    ///
    /// `RunNotWaiting` when the run is not waiting for an answer, or
    /// `turn` names an older turn; `InvalidAnswer` when an answer does not
    /// fit.
    pub async fn respond(
        &self,
        run: &RunId,
        turn: Option<&TurnId>,
        answers: Vec<Answer>,
    ) -> Result<(), RuntimeError> {
        if answers.is_empty() {
            return Err(RuntimeError::BadRequest(
                "at least one answer is needed".into(),
            ));
        }
        let lock = self.inner.lock(run);
        let guard = lock.lock().await;
        let (log, state) = self.load(run).await?;
        let not_waiting = || RuntimeError::RunNotWaiting {
            run: run.clone(),
            turn: turn.cloned(),
        };
        if let (Status::Waiting(SuspendKind::Budget), Some(current)) = (&state.status, &state.turn)
        {
            // A budget is answered with a verdict: approve to extend it,
            // reject to end the turn.
            if turn.is_some_and(|t| t != current) {
                return Err(not_waiting());
            }
            if answers.iter().any(|a| a.approved.is_none()) {
                return Err(RuntimeError::InvalidAnswer {
                    run: run.clone(),
                    reason:
                        "a budget is answered with `approved`: true extends it, false ends the turn"
                            .into(),
                });
            }
            let resumed = Event::Resumed(Resumed {
                turn_id: current.clone(),
                answers,
            });
            return self
                .append_and_drive(run, guard, Seq(log.len() as u64), vec![resumed])
                .await;
        }
        let Some(suspension) = &state.suspension else {
            return Err(if state.status == Status::Retired {
                RuntimeError::RunRetired(run.clone())
            } else {
                not_waiting()
            });
        };
        if matches!(suspension.kind, SuspendKind::Reconciliation) {
            return Err(RuntimeError::BadRequest(
                "a reconciliation is settled with resolve or abandon, not an answer".into(),
            ));
        }
        if turn.is_some_and(|t| t != &suspension.turn_id) {
            return Err(not_waiting());
        }
        if let Some(schema) = &suspension.input_schema {
            for answer in &answers {
                let value = serde_json::to_value(answer).expect("an answer is plain JSON");
                crate::tool::check_answer(schema, &value).map_err(|reason| {
                    RuntimeError::InvalidAnswer {
                        run: run.clone(),
                        reason,
                    }
                })?;
            }
        }
        let resumed = Event::Resumed(Resumed {
            turn_id: suspension.turn_id.clone(),
            answers,
        });
        self.append_and_drive(run, guard, Seq(log.len() as u64), vec![resumed])
            .await
    }

    /// Asks the running turn to stop. Durable: a cancel recorded before a
    /// crash is applied on recovery. Cooperative: the model stream stops at
    /// once and running tools are signalled; the turn ends `cancelled`.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn cancel(
        &self,
        run: &RunId,
        turn: Option<&TurnId>,
    ) -> Result<CancelOutcome, RuntimeError> {
        let lock = self.inner.lock(run);
        let _guard = lock.lock().await;
        let (log, state) = self.load(run).await?;
        if turn.is_some() && turn != state.turn.as_ref() {
            return Ok(CancelOutcome::Stale {
                current: state.turn.clone(),
            });
        }
        let (true, Some(current)) = (state.status.is_active(), state.turn.clone()) else {
            return Ok(CancelOutcome::NotActive);
        };
        if state.cancel_requested.is_none() {
            let event = Event::CancelRequested(CancelRequested {
                turn_id: Some(current.clone()),
            });
            self.inner
                .journal
                .append(run, Seq(log.len() as u64), vec![event])
                .await?;
        }
        drop(_guard);
        self.inner.cancel_turn(run);
        // A parked turn has no driver to notice; start one to end it.
        self.inner.clone().ensure_driver(run);
        Ok(CancelOutcome::Requested(current))
    }

    /// Retires a run for good and frees its addresses in `namespace` (all
    /// of them, since a retired run holds none). A running turn is
    /// cancelled first.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; `RunRetired` when it already is.
    pub async fn reset(&self, run: &RunId, reason: Option<String>) -> Result<(), RuntimeError> {
        self.inner.cancel_turn(run);
        let lock = self.inner.lock(run);
        let _guard = lock.lock().await;
        let (log, state) = self.load(run).await?;
        if state.status == Status::Retired {
            return Err(RuntimeError::RunRetired(run.clone()));
        }
        let mut events: Vec<Event> = state
            .addresses
            .iter()
            .map(|a| Event::AddressUnbound(AddressBinding { address: a.clone() }))
            .collect();
        events.push(Event::RunRetired(RunRetired { reason }));
        self.inner
            .journal
            .append(run, Seq(log.len() as u64), events)
            .await?;
        Ok(())
    }

    /// Drops the model's context; the run and its log remain.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, `RunRetired`, or `RunActive` while a turn is in
    /// progress.
    pub async fn clear(&self, run: &RunId) -> Result<(), RuntimeError> {
        let lock = self.inner.lock(run);
        let _guard = lock.lock().await;
        let (log, state) = self.idle(run).await?;
        self.inner
            .journal
            .append(
                run,
                Seq(log.len() as u64),
                vec![Event::ContextCleared(ContextCleared {})],
            )
            .await?;
        let _ = state;
        Ok(())
    }

    /// Summarizes older context through the engine.
    ///
    /// # Errors
    ///
    /// `CompactionUnsupported` when the engine cannot, `Engine` when it
    /// failed; as [`Runtime::clear`] otherwise.
    pub async fn compact(&self, run: &RunId) -> Result<(), RuntimeError> {
        let lock = self.inner.lock(run);
        let _guard = lock.lock().await;
        let (log, state) = self.idle(run).await?;
        let messages = crate::turn::history(&log, self.inner.system_prompt.as_deref());
        let summary = self
            .inner
            .engine
            .compact(&messages)
            .await
            .map_err(|e| match e {
                crate::engine::EngineError::CompactionUnsupported => {
                    RuntimeError::CompactionUnsupported
                }
                other => RuntimeError::Engine(other),
            })?;
        let (Some(first), Some(last)) = (state.conversation.first(), state.conversation.last())
        else {
            return Ok(());
        };
        let event = Event::Compacted(Compacted {
            summary,
            from: first.seq,
            to: last.seq,
        });
        self.inner
            .journal
            .append(run, Seq(log.len() as u64), vec![event])
            .await?;
        Ok(())
    }

    /// Settles a dangling write an operator checked: it happened, with this
    /// output. The run goes on.
    ///
    /// # Errors
    ///
    /// `RunNotWaiting` unless the run waits on reconciliation of `call_id`.
    pub async fn resolve(
        &self,
        run: &RunId,
        call_id: &str,
        output: serde_json::Value,
        operator: Option<String>,
    ) -> Result<(), RuntimeError> {
        self.settle(
            run,
            call_id,
            Event::ToolCallResolved(ToolCallResolved {
                call_id: call_id.into(),
                output: output.into(),
                operator,
            }),
        )
        .await
    }

    /// Gives a dangling write up: it did not happen, or should not count.
    /// The turn fails rather than guess.
    ///
    /// # Errors
    ///
    /// As [`Runtime::resolve`].
    pub async fn abandon(
        &self,
        run: &RunId,
        call_id: &str,
        reason: Option<String>,
        operator: Option<String>,
    ) -> Result<(), RuntimeError> {
        self.settle(
            run,
            call_id,
            Event::ToolCallAbandoned(ToolCallAbandoned {
                call_id: call_id.into(),
                reason,
                operator,
            }),
        )
        .await
    }

    async fn settle(&self, run: &RunId, call_id: &str, event: Event) -> Result<(), RuntimeError> {
        let lock = self.inner.lock(run);
        let guard = lock.lock().await;
        let (log, state) = self.load(run).await?;
        let waiting_on_it = state.suspension.as_ref().is_some_and(|s| {
            s.kind == SuspendKind::Reconciliation && s.call_id.as_deref() == Some(call_id)
        });
        if !waiting_on_it {
            return Err(RuntimeError::RunNotWaiting {
                run: run.clone(),
                turn: None,
            });
        }
        self.append_and_drive(run, guard, Seq(log.len() as u64), vec![event])
            .await
    }

    /// Appends `events` at `next` while the run's lock is held, lets the
    /// lock go, and makes sure a driver picks the run up: how a message, an
    /// answer or a settlement sets a run moving.
    async fn append_and_drive(
        &self,
        run: &RunId,
        guard: tokio::sync::MutexGuard<'_, ()>,
        next: Seq,
        events: Vec<Event>,
    ) -> Result<(), RuntimeError> {
        self.inner.journal.append(run, next, events).await?;
        // The driver takes the same lock.
        drop(guard);
        self.inner.clone().ensure_driver(run);
        Ok(())
    }

    /// A run's state and latest boundary result.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn get(&self, run: &RunId) -> Result<RunView, RuntimeError> {
        let (log, state) = self.load(run).await?;
        Ok(RunView::from_log(run, &log, &state))
    }

    /// A run's conversation, state and cursor, from one replay.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn snapshot(&self, run: &RunId) -> Result<Snapshot, RuntimeError> {
        let (log, state) = self.load(run).await?;
        Ok(Snapshot::from_log(run, &log, &state))
    }

    /// The run an address is bound to, without creating one.
    ///
    /// # Errors
    ///
    /// `RunNotFound` when no run holds the address.
    pub async fn lookup(&self, address: &Address) -> Result<RunView, RuntimeError> {
        let run = self
            .inner
            .journal
            .find_address(address)
            .await?
            .ok_or_else(|| RuntimeError::RunNotFound(RunId::new("unbound").expect("a valid id")))?;
        self.get(&run).await
    }

    /// The run an address is bound to, creating a pending run (and no model
    /// turn) when there is none: subscribe to it before the first message.
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn ensure(&self, address: &Address) -> Result<RunView, RuntimeError> {
        if let Some(run) = self.inner.journal.find_address(address).await? {
            return self.get(&run).await;
        }
        let run = self.inner.ids.run_id();
        let created = Event::RunCreated(RunCreated {
            address: Some(address.clone()),
            ..RunCreated::default()
        });
        match self.inner.append(&run, vec![created]).await {
            Ok(_) => self.get(&run).await,
            Err(RuntimeError::Journal(spool_journal::JournalError::AddressTaken {
                run, ..
            })) => self.get(&run).await,
            Err(other) => Err(other),
        }
    }

    /// Every run, most recently updated first.
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn list(&self) -> Result<Vec<spool_journal::store::RunSummary>, RuntimeError> {
        Ok(self.inner.journal.runs().await?)
    }

    /// A run's events after `cursor` (the last position the caller saw),
    /// then live events, with no gap and no duplicate.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn subscribe(
        &self,
        run: &RunId,
        cursor: Option<Seq>,
    ) -> Result<Subscription, RuntimeError> {
        self.load(run).await?;
        Ok(Subscription::open(
            &self.inner.hub,
            Arc::clone(&self.inner.journal),
            run.clone(),
            cursor,
        )
        .await?)
    }

    /// Waits until `turn` of `run` reaches a boundary (completed, waiting,
    /// failed or cancelled), and returns the run then.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn wait_for(&self, run: &RunId, turn: &TurnId) -> Result<RunView, RuntimeError> {
        let mut positions = self.inner.journal.subscribe(run).await?;
        loop {
            let (log, state) = self.load(run).await?;
            if crate::turn::reached_boundary(&log, turn) || state.status == Status::Retired {
                return Ok(RunView::from_log(run, &log, &state));
            }
            if positions.changed().await.is_err() {
                return Err(RuntimeError::Journal(spool_journal::JournalError::Closed));
            }
        }
    }

    async fn load(&self, run: &RunId) -> Result<(Vec<Envelope>, State), RuntimeError> {
        self.inner.load(run).await
    }

    async fn idle(&self, run: &RunId) -> Result<(Vec<Envelope>, State), RuntimeError> {
        let (log, state) = self.load(run).await?;
        match state.status {
            Status::Retired => Err(RuntimeError::RunRetired(run.clone())),
            Status::Running | Status::Waiting(_) => Err(RuntimeError::RunActive(run.clone())),
            _ => Ok((log, state)),
        }
    }
}

impl Inner {
    /// Fires the cancel token of the run's current turn, if a driver runs.
    fn cancel_turn(&self, run: &RunId) {
        if let Some(driving) = self
            .driving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run)
        {
            driving.token.cancel();
        }
    }

    pub(crate) fn lock(&self, run: &RunId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(run.clone()).or_default())
    }

    pub(crate) async fn load(&self, run: &RunId) -> Result<(Vec<Envelope>, State), RuntimeError> {
        let log = self.journal.read(run, Seq(0)).await?;
        if log.is_empty() {
            return Err(RuntimeError::RunNotFound(run.clone()));
        }
        let state = fold(&log);
        Ok((log, state))
    }

    /// Appends at the run's current end, under the run's lock.
    pub(crate) async fn append(
        &self,
        run: &RunId,
        events: Vec<Event>,
    ) -> Result<Vec<Envelope>, RuntimeError> {
        let lock = self.lock(run);
        let _guard = lock.lock().await;
        let next = self.journal.subscribe(run).await?.borrow().to_owned();
        Ok(self.journal.append(run, next, events).await?)
    }
}

impl StartRequest {
    fn into_message(self) -> MessageRequest {
        MessageRequest {
            text: self.text,
            context: self.context,
            policy: self.policy,
        }
    }

    /// What an operation id is held to: the same key with another body is
    /// a conflict.
    fn hash(&self) -> String {
        spool_wire::canonical::content_hash(&json!({
            "text": self.text,
            "title": self.title,
            "kind": self.kind,
            "context": self.context,
            "policy": self.policy.as_ref().map(TurnPolicy::as_str),
        }))
    }
}
