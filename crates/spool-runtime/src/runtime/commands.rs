//! The commands: what changes a run. Each locks the run (its state comes
//! from the cache), checks, appends, and lets the lock go before it wakes
//! the run's driver, which takes the same lock.

use spool_journal::event::{
    AddressBinding, Answer, CancelRequested, Compacted, ContextCleared, InputQueued, InputSteered,
    Resumed, RunCreated, RunRetired, ToolCallAbandoned, ToolCallResolved, TurnStarted,
};
use spool_journal::fold::Status;
use spool_journal::{Event, JournalError, RunId, Seq, TurnId};
use spool_wire::run::{SuspendKind, TurnPolicy};

use super::{
    Accepted, CancelOutcome, DeleteRequest, ForkRequest, MessageRequest, Runtime, StartRequest,
};
use crate::error::RuntimeError;
use crate::runs::Locked;

/// The most answers one `respond` records: a question is answered by a
/// person or a program, not by thousands of entries in one event.
pub const MAX_ANSWERS: usize = 64;

impl Runtime {
    /// Starts a run (or messages one through an address, or returns an
    /// operation id's earlier run).
    ///
    /// # Errors
    ///
    /// `BadRequest` for an operation id without a principal or with an
    /// address; as [`Runtime::send`] for a message through an address. An
    /// operation id used before returns its run, whatever this request
    /// says ([`Accepted::Replayed`]).
    pub async fn start(&self, request: StartRequest) -> Result<Accepted, RuntimeError> {
        request.check_lengths()?;
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
                return self.replay_operation(run, &request).await;
            }
        }
        if let Some(address) = &request.address
            && let Some(run) = self.inner.journal.find_address(address).await?
        {
            return self.send(&run, request.into_message()).await;
        }
        let agent = self.inner.current_agent().await?;
        let run = self.inner.ids.run_id();
        let turn = self.inner.ids.turn_id(&run, 1);
        let created = Event::RunCreated(RunCreated {
            address: request.address.clone(),
            operation_id: request.operation_id.clone(),
            request_hash: request.operation_id.as_ref().map(|_| request.hash()),
            title: request.title.clone(),
            kind: request.kind.clone(),
            principal: request.principal.clone(),
            agent: agent.digest().map(str::to_owned),
            upgrade: request.upgrade,
        });
        let started = TurnStarted {
            turn_id: turn.clone(),
            input: request.text.clone(),
            context: request.context.clone(),
            policy: request.policy.unwrap_or(TurnPolicy::Steer),
            from_queue: None,
            operation_id: None,
        };
        let mut locked = Locked::fresh(&self.inner.runs, &run, &agent).await;
        let events = std::iter::once(created)
            .chain(
                self.inner
                    .starting_turn(locked.cached(), &run, started, &agent),
            )
            .collect();
        match locked.append(&*self.inner.journal, events).await {
            Ok(()) => {}
            // Someone else took the address or the operation id first: go
            // through what they made.
            Err(RuntimeError::Journal(JournalError::AddressTaken { run, .. })) => {
                return self.send(&run, request.into_message()).await;
            }
            Err(RuntimeError::Journal(JournalError::OperationTaken { run, .. })) => {
                return self.replay_operation(run, &request).await;
            }
            Err(other) => return Err(other),
        }
        drop(locked);
        self.inner.clone().ensure_driver(&run);
        Ok(Accepted::Started { run, turn })
    }

    async fn replay_operation(
        &self,
        run: RunId,
        request: &StartRequest,
    ) -> Result<Accepted, RuntimeError> {
        let locked = self.inner.lock(&run).await?;
        let recorded = locked
            .state()
            .created
            .as_ref()
            .and_then(|created| created.request_hash.clone());
        drop(locked);
        let differs = recorded.as_deref() != Some(request.hash().as_str());
        Ok(Accepted::Replayed { run, differs })
    }

    /// Sends a message to an existing run: a new turn when it is idle;
    /// steered into or queued after the running turn when it is busy.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, `RunRetired`, `RunWaiting` (answer it with
    /// [`Runtime::respond`]), or `TurnInProgress` for
    /// [`TurnPolicy::IfIdle`] while a turn is in progress.
    pub async fn send(
        &self,
        run: &RunId,
        message: MessageRequest,
    ) -> Result<Accepted, RuntimeError> {
        self.send_with(run, message, None).await
    }

    /// [`Runtime::send`] under an idempotency key: the first message with
    /// `operation_id` in the run starts (or queues) its turn and records
    /// the key with it; the same key again is answered
    /// [`Accepted::Replayed`] without another turn, whatever the message
    /// says. [`Runtime::operation_position`] tells where the first was
    /// recorded. A steered message cannot be found again, so a keyed
    /// message to a busy run is queued, never steered.
    ///
    /// # Errors
    ///
    /// As [`Runtime::send`]; `BadRequest` for a key over its length limit.
    pub async fn send_once(
        &self,
        run: &RunId,
        operation_id: &str,
        mut message: MessageRequest,
    ) -> Result<Accepted, RuntimeError> {
        crate::Limited::OperationId.check(operation_id)?;
        if message.policy != Some(TurnPolicy::IfIdle) {
            message.policy = Some(TurnPolicy::Queue);
        }
        self.send_with(run, message, Some(operation_id.to_owned()))
            .await
    }

    /// [`Runtime::send_once`] to the run at `address`, making the run
    /// (created by `principal`, of surface `kind`) with its first turn in
    /// one write when there is none: what a surface whose conversations
    /// are named by its callers' message ids uses, so a message resent
    /// after a crash finds its run and its turn, never a second of either.
    ///
    /// # Errors
    ///
    /// As [`Runtime::send_once`]; `BadRequest` for an address or key over
    /// its length limit.
    pub async fn send_once_to(
        &self,
        address: &spool_journal::Address,
        principal: Option<spool_journal::Principal>,
        kind: Option<String>,
        operation_id: &str,
        message: MessageRequest,
    ) -> Result<Accepted, RuntimeError> {
        crate::Limited::Address.check(&address.name)?;
        crate::Limited::OperationId.check(operation_id)?;
        if let Some(kind) = &kind {
            crate::Limited::Kind.check(kind)?;
        }
        // Made without looking first: a new conversation is the common
        // case, and the journal refuses an address already taken
        // atomically (below), which is when the earlier run is used.
        let agent = self.inner.current_agent().await?;
        let run = self.inner.ids.run_id();
        let turn = self.inner.ids.turn_id(&run, 1);
        let created = Event::RunCreated(RunCreated {
            address: Some(address.clone()),
            principal,
            kind,
            agent: agent.digest().map(str::to_owned),
            ..RunCreated::default()
        });
        let started = TurnStarted {
            turn_id: turn.clone(),
            input: message.text.clone(),
            context: message.context.clone(),
            policy: TurnPolicy::Queue,
            from_queue: None,
            operation_id: Some(operation_id.to_owned()),
        };
        let mut locked = Locked::fresh(&self.inner.runs, &run, &agent).await;
        let events = std::iter::once(created)
            .chain(
                self.inner
                    .starting_turn(locked.cached(), &run, started, &agent),
            )
            .collect();
        match locked.append(&*self.inner.journal, events).await {
            Ok(()) => {}
            // Made before (the same message sent again) or meanwhile.
            Err(RuntimeError::Journal(JournalError::AddressTaken { run, .. })) => {
                drop(locked);
                return self.send_once(&run, operation_id, message).await;
            }
            Err(other) => return Err(other),
        }
        drop(locked);
        self.inner.clone().ensure_driver(&run);
        Ok(Accepted::Started { run, turn })
    }

    async fn send_with(
        &self,
        run: &RunId,
        message: MessageRequest,
        operation_id: Option<String>,
    ) -> Result<Accepted, RuntimeError> {
        let policy = message.policy.unwrap_or(TurnPolicy::Steer);
        let current = self.inner.current_agent().await?;
        let locked = self.inner.lock(run).await?;
        let state = locked.state();
        if let Some(operation) = &operation_id
            && state.operations.contains_key(operation)
        {
            return Ok(Accepted::Replayed {
                run: run.clone(),
                differs: false,
            });
        }
        if state.status != Status::Retired {
            locked.cached().check_size(run)?;
        }
        let (events, accepted) = match (&state.status, &state.turn, policy) {
            (Status::Retired, ..) => return Err(RuntimeError::RunRetired(run.clone())),
            // Checked and refused under the run's lock: of callers racing on
            // an idle run, the first starts the turn and the rest see it.
            (Status::Running | Status::Waiting(_), Some(turn), TurnPolicy::IfIdle) => {
                return Err(RuntimeError::TurnInProgress {
                    run: run.clone(),
                    turn: turn.clone(),
                });
            }
            (Status::Waiting(_), ..) => return Err(RuntimeError::RunWaiting(run.clone())),
            (Status::Running, Some(_), TurnPolicy::Queue) => (
                vec![Event::InputQueued(InputQueued {
                    input: message.text,
                    context: message.context,
                    operation_id,
                })],
                // Appended at the head, under this lock.
                Accepted::Queued {
                    run: run.clone(),
                    queued: locked.cached().next(),
                },
            ),
            (Status::Running, Some(turn), _) => (
                vec![Event::InputSteered(InputSteered {
                    turn_id: turn.clone(),
                    input: message.text,
                })],
                Accepted::Steered {
                    run: run.clone(),
                    turn: turn.clone(),
                },
            ),
            _ => {
                let turn = self.inner.ids.turn_id(run, locked.state().turns + 1);
                let started = TurnStarted {
                    turn_id: turn.clone(),
                    input: message.text,
                    context: message.context,
                    policy,
                    from_queue: None,
                    operation_id,
                };
                (
                    self.inner
                        .starting_turn(locked.cached(), run, started, &current),
                    Accepted::Started {
                        run: run.clone(),
                        turn,
                    },
                )
            }
        };
        self.append_and_drive(locked, events).await?;
        Ok(accepted)
    }

    /// Answers a waiting run. Each answer is checked against the schema the
    /// suspension recorded before `resumed` is written.
    ///
    /// # Errors
    ///
    /// `RunNotWaiting` when the run is not waiting for an answer, or
    /// `turn` names an older turn; `InvalidAnswer` when an answer does not
    /// fit; `BadRequest` for no answer or more than [`MAX_ANSWERS`].
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
        if answers.len() > MAX_ANSWERS {
            return Err(RuntimeError::BadRequest(format!(
                "at most {MAX_ANSWERS} answers to one question, not {}",
                answers.len()
            )));
        }
        let locked = self.inner.lock(run).await?;
        let state = locked.state();
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
            return self.append_and_drive(locked, vec![resumed]).await;
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
        self.append_and_drive(locked, vec![resumed]).await
    }

    /// Ends a durable sleep now, before its time: the sleeping tool's
    /// result says when it was woken, and the turn goes on. A sleep wakes
    /// by itself at its time; this is for whoever will not wait.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; `RunNotWaiting` when the run is not asleep.
    pub async fn wake(&self, run: &RunId) -> Result<(), RuntimeError> {
        let not_asleep = || RuntimeError::RunNotWaiting {
            run: run.clone(),
            turn: None,
        };
        let locked = self.inner.lock(run).await?;
        let sleep = locked.state().sleep.clone().ok_or_else(not_asleep)?;
        drop(locked);
        let now = time::OffsetDateTime::now_utc();
        if self.inner.wake(run, &sleep, Some(now)).await? {
            Ok(())
        } else {
            Err(not_asleep())
        }
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
        let mut locked = self.inner.lock(run).await?;
        let state = locked.state();
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
            locked.append(&*self.inner.journal, vec![event]).await?;
        }
        drop(locked);
        self.inner.cancel_turn(run);
        // A parked turn has no driver to notice; start one to end it.
        self.inner.clone().ensure_driver(run);
        Ok(CancelOutcome::Requested(current))
    }

    /// Retires a run for good and frees every address it holds. A running
    /// turn is cancelled first.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; `RunRetired` when it already is.
    pub async fn reset(&self, run: &RunId, reason: Option<String>) -> Result<(), RuntimeError> {
        self.retire(run, reason, None).await
    }

    /// [`Runtime::reset`], freeing only the run's addresses in `namespace`
    /// (the HTTP seed: reset "frees bindings in the HTTP namespace only");
    /// its addresses elsewhere stay bound to the retired run, for their
    /// transport to replace.
    ///
    /// # Errors
    ///
    /// As [`Runtime::reset`].
    pub async fn reset_in(
        &self,
        run: &RunId,
        reason: Option<String>,
        namespace: &str,
    ) -> Result<(), RuntimeError> {
        self.retire(run, reason, Some(namespace)).await
    }

    async fn retire(
        &self,
        run: &RunId,
        reason: Option<String>,
        namespace: Option<&str>,
    ) -> Result<(), RuntimeError> {
        self.inner.cancel_turn(run);
        let mut locked = self.inner.lock(run).await?;
        let state = locked.state();
        if state.status == Status::Retired {
            return Err(RuntimeError::RunRetired(run.clone()));
        }
        let mut events: Vec<Event> = state
            .addresses
            .iter()
            .filter(|a| namespace.is_none_or(|ns| a.namespace == ns))
            .map(|a| Event::AddressUnbound(AddressBinding { address: a.clone() }))
            .collect();
        events.push(Event::RunRetired(RunRetired {
            reason,
            namespace: namespace.map(str::to_owned),
        }));
        locked.append(&*self.inner.journal, events).await
    }

    /// Drops the model's context; the run and its log remain.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, `RunRetired`, or `RunActive` while a turn is in
    /// progress.
    pub async fn clear(&self, run: &RunId) -> Result<(), RuntimeError> {
        let mut locked = self.idle(run).await?;
        locked
            .append(
                &*self.inner.journal,
                vec![Event::ContextCleared(ContextCleared {})],
            )
            .await
    }

    /// Summarizes older context through the engine.
    ///
    /// # Errors
    ///
    /// `CompactionUnsupported` when the engine cannot, `Engine` when it
    /// failed; as [`Runtime::clear`] otherwise.
    pub async fn compact(&self, run: &RunId) -> Result<(), RuntimeError> {
        let mut locked = self.idle(run).await?;
        // An idle run's whole history is in the cache's model view.
        let messages = std::sync::Arc::clone(locked.cached().history.messages());
        let engine = std::sync::Arc::clone(&locked.cached().agent.engine);
        let summary = engine.compact(&messages).await.map_err(|e| match e {
            crate::engine::EngineError::CompactionUnsupported => {
                RuntimeError::CompactionUnsupported
            }
            other => RuntimeError::Engine(other),
        })?;
        drop(messages);
        // The cache keeps no conversation entries (see `Cached::state`):
        // their positions come from the log, read while the run is locked.
        let log = self.inner.journal.read(run, Seq(0)).await?;
        let conversation = spool_journal::fold::fold(&log).conversation;
        let (Some(first), Some(last)) = (conversation.first(), conversation.last()) else {
            return Ok(());
        };
        let event = Event::Compacted(Compacted {
            summary,
            from: first.seq,
            to: last.seq,
        });
        locked.append(&*self.inner.journal, vec![event]).await
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
        // What an operator records is held to what a tool's output is: a
        // one-key object under a sentinel's reserved name would be misread
        // as a suspension, a sleep or a failure on replay.
        if spool_wire::sentinel::Sentinel::is_reserved(&output) {
            return Err(RuntimeError::BadRequest(
                "the output is a one-key object under a reserved sentinel name; wrap it or rename the key".into(),
            ));
        }
        self.reconcile(
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
        self.reconcile(
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

    async fn reconcile(
        &self,
        run: &RunId,
        call_id: &str,
        event: Event,
    ) -> Result<(), RuntimeError> {
        let locked = self.inner.lock(run).await?;
        let waiting_on_it = locked.state().suspension.as_ref().is_some_and(|s| {
            s.kind == SuspendKind::Reconciliation && s.call_id.as_deref() == Some(call_id)
        });
        if !waiting_on_it {
            return Err(RuntimeError::RunNotWaiting {
                run: run.clone(),
                turn: None,
            });
        }
        self.append_and_drive(locked, vec![event]).await
    }

    /// Appends `events` while the run is locked, lets the lock go, and
    /// makes sure a driver picks the run up: how a message, an answer or a
    /// settlement sets a run moving.
    /// Records a surface's own note with the run (`noted`): the latest
    /// note of a key holds, and a `null` value withdraws it. No turn reads
    /// notes; [`Runtime::notes`] gives them back. Written under the run's
    /// lock, beside whatever its turn is doing, and durable when this
    /// returns.
    ///
    /// # Errors
    ///
    /// `RunNotFound`, `RunRetired` (a retired run keeps what it has), or
    /// `BadRequest` for an empty namespace or key.
    pub async fn note(
        &self,
        run: &RunId,
        note: spool_journal::event::Note,
    ) -> Result<(), RuntimeError> {
        if note.namespace.is_empty() || note.key.is_empty() {
            return Err(RuntimeError::BadRequest(
                "a note needs a namespace and a key".into(),
            ));
        }
        let mut locked = self.inner.lock(run).await?;
        if locked.state().status == Status::Retired {
            return Err(RuntimeError::RunRetired(run.clone()));
        }
        locked
            .append(&*self.inner.journal, vec![Event::Noted(note)])
            .await
    }

    async fn append_and_drive(
        &self,
        mut locked: Locked,
        events: Vec<Event>,
    ) -> Result<(), RuntimeError> {
        locked.append(&*self.inner.journal, events).await?;
        let run = locked.run().clone();
        // The driver takes the same lock.
        drop(locked);
        self.inner.clone().ensure_driver(&run);
        Ok(())
    }

    /// The run, locked, when no turn is in progress.
    async fn idle(&self, run: &RunId) -> Result<Locked, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        match locked.state().status {
            Status::Retired => Err(RuntimeError::RunRetired(run.clone())),
            Status::Running | Status::Waiting(_) => Err(RuntimeError::RunActive(run.clone())),
            _ => Ok(locked),
        }
    }

    /// Forks `source`: a new run whose history is the source's through
    /// the end of `request.turn` (`ForkCut::After`) or up to its start
    /// (`ForkCut::Before`), recorded as a link in both journals
    /// (`forked_from` in the fork, `forked_into` in the source). Nothing
    /// of the source runs again: its model answers and tool results are
    /// copied as recorded. The fork holds none of the source's addresses,
    /// operation ids or surfaces' notes, nor input queued past the cut;
    /// it then takes turns like any run.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; `TurnNotFound` for a turn the source does not
    /// have; `RunActive` for `After` a turn that has not ended.
    pub async fn fork(
        &self,
        source: &RunId,
        request: ForkRequest,
    ) -> Result<crate::RunView, RuntimeError> {
        use spool_journal::event::{ForkCut, ForkLink};
        if let Some(title) = &request.title {
            crate::Limited::Title.check(title)?;
        }
        // The log as of one position, read under the run's lock.
        let (log, created) = {
            let locked = self.inner.lock(source).await?;
            let mut log = self.inner.journal.read(source, Seq(0)).await?;
            log.truncate(usize::try_from(locked.cached().next().0).unwrap_or(usize::MAX));
            (log, locked.state().created.clone().unwrap_or_default())
        };
        let turn = &request.turn;
        let starts = |event: &Event| matches!(event, Event::TurnStarted(s) if s.turn_id == *turn);
        let ends = |event: &Event| match event {
            Event::TurnCompleted(e) => e.turn_id == *turn,
            Event::TurnFailed(e) => e.turn_id == *turn,
            Event::TurnCancelled(e) => e.turn_id == *turn,
            _ => false,
        };
        let Some(start) = log.iter().position(|e| starts(&e.event)) else {
            return Err(RuntimeError::TurnNotFound {
                run: source.clone(),
                turn: turn.clone(),
            });
        };
        // How many of the source's events the fork holds.
        let held = match request.cut {
            ForkCut::Before => start,
            ForkCut::After => match log[start..].iter().position(|e| ends(&e.event)) {
                Some(end) => start + end + 1,
                // Still running or parked: what it holds is not settled.
                None => return Err(RuntimeError::RunActive(source.clone())),
            },
        };
        let prefix = &log[..held];
        let through = prefix.last().map_or(Seq(0), |e| e.seq);
        // Input queued past the cut never ran there: it is not the fork's.
        let pending: std::collections::HashSet<Seq> = spool_journal::fold::fold(prefix)
            .queued
            .iter()
            .map(|(seq, _)| *seq)
            .collect();
        let agent = self.inner.current_agent().await?;
        let fork = self.inner.ids.run_id();
        let link = ForkLink {
            run: source.clone(),
            through,
            turn_id: turn.clone(),
            cut: request.cut,
        };
        let mut events = vec![
            Event::RunCreated(RunCreated {
                title: request.title.clone().or(created.title),
                kind: created.kind,
                principal: request.principal.clone(),
                agent: agent.digest().map(str::to_owned),
                ..RunCreated::default()
            }),
            Event::ForkedFrom(link.clone()),
        ];
        // Where each copied event lands in the fork, for the events that
        // name a position (a queued turn's input, a compaction's range).
        let mut landed: Vec<(Seq, Seq)> = Vec::new();
        for envelope in prefix.iter().skip(1) {
            let kept = match &envelope.event {
                // What belongs to the source alone: its names, its
                // surfaces' records, its schedule's, its links.
                Event::AddressBound(_)
                | Event::AddressUnbound(_)
                | Event::Noted(_)
                | Event::ScheduleFired(_)
                | Event::ScheduleDelivered(_)
                | Event::ForkedFrom(_)
                | Event::ForkedInto(_)
                // The fork runs on the agent its `run_created` names.
                | Event::AgentChanged(_)
                | Event::RunCreated(_)
                | Event::RunRetired(_) => None,
                Event::InputQueued(_) if pending.contains(&envelope.seq) => None,
                Event::InputQueued(queued) => Some(Event::InputQueued(InputQueued {
                    operation_id: None,
                    ..queued.clone()
                })),
                Event::TurnStarted(started) => Some(Event::TurnStarted(TurnStarted {
                    operation_id: None,
                    from_queue: started.from_queue.map(|seq| landing(&landed, seq, false)),
                    ..started.clone()
                })),
                Event::Compacted(compacted) => Some(Event::Compacted(Compacted {
                    from: landing(&landed, compacted.from, true),
                    to: landing(&landed, compacted.to, false),
                    summary: compacted.summary.clone(),
                })),
                other => Some(other.clone()),
            };
            if let Some(event) = kept {
                let at = Seq(u64::try_from(events.len()).unwrap_or(u64::MAX));
                landed.push((envelope.seq, at));
                events.push(event);
            }
        }
        let mut locked = crate::runs::Locked::fresh(&self.inner.runs, &fork, &agent).await;
        locked.append(&*self.inner.journal, events).await?;
        drop(locked);
        // The source's end of the link, written once the fork exists: a
        // crash between the two leaves a fork that names its source.
        self.inner
            .append(
                source,
                vec![Event::ForkedInto(ForkLink {
                    run: fork.clone(),
                    ..link
                })],
            )
            .await?;
        self.get(&fork).await
    }
}

/// How long a forced deletion waits for the turn it cancelled to end
/// before it gives up with `run_active`: a tool that ignores its cancel
/// signal keeps its turn going.
const DELETE_WAITS: std::time::Duration = std::time::Duration::from_secs(30);

impl Runtime {
    /// Makes `agent` the one new runs start on (a reload of the agent's
    /// definition); the digest it replaces. Runs in flight keep theirs,
    /// or move to it when their next turn starts if they follow upgrades
    /// (`upgrade = "next_turn"`, theirs or else `agent`'s). The journal
    /// keeps the new definition before the first run names it.
    pub fn load_agent(&self, agent: crate::AgentSpec) -> Option<String> {
        let digest = agent.digest().map(str::to_owned);
        let previous = self.inner.runs.agents.replace(agent.into());
        tracing::info!(agent = ?digest, previous = ?previous, "the agent definition new runs start on was replaced");
        previous
    }
}

impl Runtime {
    /// Deletes `run`: its events and everything derived from them (its
    /// cached state, addresses, operation id, idempotency claims, its
    /// streams, which end) go, and a tombstone stays, so a later request
    /// for it is refused with `run_deleted` rather than `run_not_found`.
    /// Deleting a deleted run answers its tombstone again.
    ///
    /// A run with a turn in progress is refused unless
    /// [`DeleteRequest::force`]: then its turn is cancelled (as
    /// [`Runtime::cancel`] does) and the run deleted once the turn ended.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; `RunActive` for a turn in progress without `force`,
    /// or one that did not end within 30 s of its cancel; `OwnedElsewhere`
    /// when the run moved past [`DeleteRequest::expected`] or another
    /// node drives it.
    pub async fn delete(
        &self,
        run: &RunId,
        request: DeleteRequest,
    ) -> Result<spool_journal::store::Tombstone, RuntimeError> {
        let locked = match self.inner.lock(run).await {
            Ok(locked) => locked,
            Err(RuntimeError::RunDeleted(tombstone)) => return Ok(tombstone),
            Err(error) => return Err(error),
        };
        let mut locked = if locked.state().status.is_active() {
            if !request.force {
                return Err(RuntimeError::RunActive(run.clone()));
            }
            drop(locked);
            self.cancel(run, None).await?;
            self.until_idle(run).await?
        } else {
            locked
        };
        let deletion = spool_journal::store::Deletion {
            by: request.by,
            reason: request.reason,
            expected: request.expected,
        };
        let tombstone = self.inner.journal.delete(run, deletion).await;
        locked.unload();
        drop(locked);
        let tombstone = tombstone?;
        self.inner.forget(run);
        tracing::info!(run_id = %run, by = %tombstone.by, events = tombstone.events, "run deleted");
        Ok(tombstone)
    }

    /// Waits until `run` has no turn in progress, and locks it then.
    async fn until_idle(&self, run: &RunId) -> Result<Locked, RuntimeError> {
        let mut positions = self.inner.journal.subscribe(run).await?;
        let idle = async {
            loop {
                let locked = self.inner.lock(run).await?;
                if !locked.state().status.is_active() {
                    return Ok(locked);
                }
                drop(locked);
                if positions.changed().await.is_err() {
                    return Err(RuntimeError::RunActive(run.clone()));
                }
            }
        };
        tokio::time::timeout(DELETE_WAITS, idle)
            .await
            .unwrap_or_else(|_| Err(RuntimeError::RunActive(run.clone())))
    }
}

/// Where the source's position `seq` lands in a fork: the fork's
/// position of the copied event at it, or, for a position whose event was
/// not copied, of the nearest copied one after it (`after`) or before it.
fn landing(landed: &[(Seq, Seq)], seq: Seq, after: bool) -> Seq {
    let at = landed.partition_point(|(source, _)| *source < seq);
    match landed.get(at) {
        Some((source, fork)) if *source == seq => *fork,
        _ if after => landed.get(at).map_or(Seq(0), |(_, fork)| *fork),
        _ => at
            .checked_sub(1)
            .and_then(|before| landed.get(before))
            .map_or(Seq(0), |(_, fork)| *fork),
    }
}
