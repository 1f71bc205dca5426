//! The queries: what reads a run. Each is answered from the run's cached
//! state; none reads a log from the start while the run is cached.

use std::sync::Arc;

use spool_journal::event::RunCreated;
use spool_journal::fold::Status;
use spool_journal::{Address, Event, JournalError, RunId, Seq, TurnId};

use super::Runtime;
use crate::error::RuntimeError;
use crate::hub::Subscription;
use crate::runs::Locked;
use crate::view::{RunDetail, RunView, Snapshot};

impl Runtime {
    /// A run's state and latest boundary result.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn get(&self, run: &RunId) -> Result<RunView, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(RunView::of(&locked))
    }

    /// What a listing shows of a run: its view with its turns, tokens,
    /// cost, addresses, failure and parked call. Read from the run's
    /// cached state, as [`Runtime::get`] is.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn detail(&self, run: &RunId) -> Result<RunDetail, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(RunDetail::of(&locked))
    }

    /// A page of the run's journal: at most `limit` of its recorded
    /// events after position `after` (from the start without one), each
    /// with its timing ([`TimedEvent`](crate::activity::timing::TimedEvent)),
    /// and whether more follow. The log is read from its start, to time
    /// the calls whose requests lie before the page.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when the log cannot be read.
    pub async fn journal(
        &self,
        run: &RunId,
        after: Option<Seq>,
        limit: usize,
    ) -> Result<(Vec<crate::activity::timing::TimedEvent>, bool), RuntimeError> {
        // Through the lock, so a run the runtime hides (a schedule's
        // record) is as unknown here as everywhere else.
        // Priced by the run's own agent.
        let pricing = self.inner.lock(run).await?.cached().agent.pricing;
        let log = self.inner.journal.read(run, Seq(0)).await?;
        let mut timing = crate::activity::timing::Timing::default();
        let mut page = Vec::with_capacity(limit.min(log.len()));
        let mut more = false;
        for envelope in log {
            let skipped = after.is_some_and(|after| envelope.seq <= after);
            let timed = timing.time(envelope, pricing.as_ref());
            if skipped {
                continue;
            }
            if page.len() == limit {
                more = true;
                break;
            }
            page.push(timed);
        }
        Ok((page, more))
    }

    /// Every address bound now, with its run: what a search over
    /// addresses reads.
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn addresses(&self) -> Result<Vec<(Address, RunId)>, RuntimeError> {
        Ok(self.inner.journal.addresses().await?)
    }

    /// A run's conversation, state and cursor.
    ///
    /// # Errors
    ///
    /// `RunNotFound`.
    pub async fn snapshot(&self, run: &RunId) -> Result<Snapshot, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        // One replay, under the run's lock: the messages, the state and
        // the cursor are all as of the same position.
        let mut log = self.inner.journal.read(run, Seq(0)).await?;
        log.truncate(usize::try_from(locked.cached().next().0).unwrap_or(usize::MAX));
        Ok(Snapshot::of(&locked, &log))
    }

    /// The run an address is bound to, without creating one.
    ///
    /// # Errors
    ///
    /// `AddressNotFound` when no run holds the address.
    pub async fn lookup(&self, address: &Address) -> Result<RunView, RuntimeError> {
        let run = self
            .find_address(address)
            .await?
            .ok_or_else(|| RuntimeError::AddressNotFound(address.clone()))?;
        self.get(&run).await
    }

    /// The id of the run an address is bound to, if any: one indexed read,
    /// without loading the run (a cluster node asks it to tell which node
    /// drives an address's run).
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn find_address(&self, address: &Address) -> Result<Option<RunId>, RuntimeError> {
        Ok(self.inner.journal.find_address(address).await?)
    }

    /// The run an address is bound to, creating a pending run (and no model
    /// turn) when there is none: subscribe to it before the first message.
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn ensure(&self, address: &Address) -> Result<RunView, RuntimeError> {
        self.ensure_as(address, None).await
    }

    /// [`Runtime::ensure`], recording `principal` as the creator of a run
    /// it makes (what [`Runtime::owner`] answers).
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn ensure_as(
        &self,
        address: &Address,
        principal: Option<spool_journal::Principal>,
    ) -> Result<RunView, RuntimeError> {
        crate::Limited::Address.check(&address.name)?;
        if let Some(run) = self.inner.journal.find_address(address).await? {
            return self.get(&run).await;
        }
        let agent = self.inner.current_agent().await?;
        let run = self.inner.ids.run_id();
        let created = Event::RunCreated(RunCreated {
            address: Some(address.clone()),
            principal,
            agent: agent.digest().map(str::to_owned),
            ..RunCreated::default()
        });
        let mut locked = Locked::fresh(&self.inner.runs, &run, &agent).await;
        match locked.append(&*self.inner.journal, vec![created]).await {
            Ok(()) => Ok(RunView::of(&locked)),
            Err(RuntimeError::Journal(JournalError::AddressTaken { run, .. })) => {
                drop(locked);
                self.get(&run).await
            }
            Err(other) => Err(other),
        }
    }

    /// The agent definition kept under `digest` (`run_created.agent`), as
    /// JSON: what `spool agent diff` compares.
    ///
    /// # Errors
    ///
    /// When the journal cannot be read.
    pub async fn definition(
        &self,
        digest: &str,
    ) -> Result<Option<serde_json::Value>, RuntimeError> {
        Ok(self.inner.journal.definition(digest).await?)
    }

    /// The digest of the definition new runs start with, when the runtime
    /// was given one ([`RuntimeBuilder::agent`](crate::RuntimeBuilder::agent),
    /// [`Runtime::load_agent`]).
    #[must_use]
    pub fn agent_digest_now(&self) -> Option<String> {
        self.inner.runs.agents.current().digest().map(str::to_owned)
    }

    /// The digests of the agent definitions in memory, the current one
    /// first: the others are held by runs in memory that run on them, and
    /// dropped once none does.
    #[must_use]
    pub fn agents_in_memory(&self) -> Vec<String> {
        self.inner.runs.agents.in_memory()
    }

    /// Who created `run`, when that was proven (a verified principal
    /// passed to [`Runtime::start`] or [`Runtime::ensure_as`]): what a
    /// transport checks when runs belong to their creators.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when its log must be read and cannot.
    pub async fn owner(
        &self,
        run: &RunId,
    ) -> Result<Option<spool_journal::Principal>, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(locked
            .state()
            .created
            .as_ref()
            .and_then(|created| created.principal.clone()))
    }

    /// The run `principal` created under `operation_id`, if it did: what
    /// [`Runtime::start`] would return as [`Accepted::Replayed`](crate::Accepted),
    /// asked without starting anything.
    ///
    /// # Errors
    ///
    /// When the journal fails.
    pub async fn operation(
        &self,
        principal: &spool_journal::Principal,
        operation_id: &str,
    ) -> Result<Option<RunId>, RuntimeError> {
        Ok(self
            .inner
            .journal
            .find_operation(principal, operation_id)
            .await?)
    }

    /// Where the message sent to `run` under `operation_id`
    /// ([`Runtime::send_once`]) was recorded: its `turn_started` or
    /// `input_queued` event. `None` when no message had that key.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when its log must be read and cannot.
    pub async fn operation_position(
        &self,
        run: &RunId,
        operation_id: &str,
    ) -> Result<Option<Seq>, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(locked.state().operations.get(operation_id).copied())
    }

    /// The notes `namespace` keeps with `run` ([`Runtime::note`]), by key.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when its log must be read and cannot.
    pub async fn notes(
        &self,
        run: &RunId,
        namespace: &str,
    ) -> Result<std::collections::BTreeMap<String, serde_json::Value>, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(locked
            .state()
            .notes
            .get(namespace)
            .cloned()
            .unwrap_or_default())
    }

    /// The tokens every model call of `run` used, over all its turns: what
    /// a host charging a run as a whole (the bus's instance budget) prices.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when its log must be read and cannot.
    pub async fn usage(&self, run: &RunId) -> Result<spool_journal::event::Usage, RuntimeError> {
        let locked = self.inner.lock(run).await?;
        Ok(locked.state().usage)
    }

    /// How many subscriptions to runs are open now: every transport's
    /// streams, and the runtime's own readers.
    #[must_use]
    pub fn open_streams(&self) -> usize {
        self.inner.hub.open_streams()
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
    /// `RunNotFound`; `BadRequest` for a cursor past the run's last
    /// position (no client was given one, so it is a mistake, and reading
    /// it as anything else would skip or repeat events).
    pub async fn subscribe(
        &self,
        run: &RunId,
        cursor: Option<Seq>,
    ) -> Result<Subscription, RuntimeError> {
        let next = self.inner.lock(run).await?.cached().next();
        if let Some(cursor) = cursor.filter(|cursor| *cursor >= next) {
            return Err(RuntimeError::BadRequest(format!(
                "cursor {cursor} is past run {run}'s last position, {}",
                next.0.saturating_sub(1)
            )));
        }
        Ok(Subscription::open(
            &self.inner.hub,
            Arc::clone(&self.inner.journal),
            run.clone(),
            cursor,
        )
        .await?)
    }

    /// Waits until `turn` of `run` reaches a boundary (completed, waiting,
    /// failed or cancelled), and returns the run then. `turn` is one this
    /// runtime handed out for the run: a turn that is no longer the run's
    /// current one was overtaken by a later turn, so it is over.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; [`ErrorKind::Storage`](crate::ErrorKind::Storage)
    /// when the journal cannot write and the run waits for it (the turn
    /// goes on by itself once it can).
    pub async fn wait_for(&self, run: &RunId, turn: &TurnId) -> Result<RunView, RuntimeError> {
        let mut stalls = self.inner.storage.stalls();
        let mut positions = self.inner.journal.subscribe(run).await?;
        // Where the turn's end can be: after the head seen while it ran.
        let mut ends_after: Option<Seq> = None;
        loop {
            if self.inner.storage.is_stalled(run) {
                let reason = match self.journal_health() {
                    crate::JournalHealth::Unavailable { reason, .. } => reason,
                    crate::JournalHealth::Writable => "a write failed".into(),
                };
                return Err(RuntimeError::Journal(JournalError::storage(format!(
                    "run {run} waits for the journal, which cannot write ({reason}); its turn goes on once it can"
                ))));
            }
            {
                let locked = self.inner.lock(run).await?;
                let state = locked.state();
                let over = state.turn.as_ref() != Some(turn)
                    || matches!(
                        state.status,
                        Status::Completed
                            | Status::Failed
                            | Status::Cancelled
                            | Status::Waiting(_)
                            | Status::Retired
                    );
                if state.turn.as_ref() != Some(turn) {
                    // Overtaken: a later turn started before this waiter
                    // looked (a queued one, at once). The reply is still
                    // this turn's own, read from where it ended.
                    let title = state.title().map(str::to_owned);
                    drop(locked);
                    let from = ends_after.unwrap_or(Seq(0));
                    if let Some(view) = self.turn_end(run, turn, from, title).await? {
                        return Ok(view);
                    }
                    return self.get(run).await;
                }
                if over {
                    return Ok(RunView::of(&locked));
                }
                ends_after.get_or_insert(locked.cached().next());
            }
            // The appender folds into the cache before it lets the lock
            // go, so the state read after this wake-up holds the append.
            tokio::select! {
                changed = positions.changed() => if changed.is_err() {
                    return Err(RuntimeError::Journal(JournalError::Closed));
                },
                // A stall anywhere: look whether it was this run's.
                _ = stalls.changed() => {}
            }
        }
    }

    /// The run as `turn` left it at its last boundary, read from the log
    /// after `from`: for a waiter whose turn was overtaken before it looked.
    async fn turn_end(
        &self,
        run: &RunId,
        turn: &TurnId,
        from: Seq,
        title: Option<String>,
    ) -> Result<Option<RunView>, RuntimeError> {
        use spool_journal::Event;
        let mut view = None;
        for envelope in self.inner.journal.read(run, from).await? {
            let (status, response, usage, suspend) = match envelope.event {
                Event::TurnCompleted(done) if &done.turn_id == turn => {
                    (Status::Completed, done.response, done.usage, None)
                }
                Event::TurnFailed(failed) if &failed.turn_id == turn => {
                    (Status::Failed, None, None, None)
                }
                Event::TurnCancelled(cancelled) if &cancelled.turn_id == turn => {
                    (Status::Cancelled, None, None, None)
                }
                Event::Suspended(suspended) if &suspended.turn_id == turn => {
                    (Status::Waiting(suspended.kind), None, None, Some(suspended))
                }
                _ => continue,
            };
            view = Some(RunView {
                run_id: run.clone(),
                status,
                turn_id: Some(turn.clone()),
                cursor: Some(envelope.seq),
                response,
                suspend,
                usage,
                title: title.clone(),
            });
        }
        Ok(view)
    }

    /// Waits until the input queued at `queued` has become a turn and that
    /// turn reaches a boundary, and returns the run then: the reply a
    /// caller that queued a message waits for. When the queued input is
    /// dropped before it starts (the run was reset), returns the run as it
    /// is.
    ///
    /// # Errors
    ///
    /// As [`Runtime::wait_for`].
    pub async fn wait_for_queued(
        &self,
        run: &RunId,
        queued: spool_journal::Seq,
    ) -> Result<RunView, RuntimeError> {
        let mut positions = self.inner.journal.subscribe(run).await?;
        // Where the next read starts: the events before it were looked
        // at already, so a wake-up reads only what is new.
        let mut from = queued;
        loop {
            // Looked at before the log is read: an input no longer queued
            // then either started a turn the read below finds, or was
            // dropped.
            let still_queued = {
                let locked = self.inner.lock(run).await?;
                locked.state().queued.iter().any(|(seq, _)| *seq == queued)
            };
            // The turn it became names it; only the log after it is read.
            let read = self.inner.journal.read(run, from).await?;
            if let Some(last) = read.last() {
                from = last.seq.next();
            }
            let started = read.into_iter().find_map(|envelope| match envelope.event {
                spool_journal::Event::TurnStarted(started)
                    if started.from_queue == Some(queued) =>
                {
                    Some(started.turn_id)
                }
                _ => None,
            });
            if let Some(turn) = started {
                return self.wait_for(run, &turn).await;
            }
            if !still_queued {
                return self.get(run).await;
            }
            if positions.changed().await.is_err() {
                return Err(RuntimeError::Journal(JournalError::Closed));
            }
        }
    }

    /// The turn an accepted command's answer waits for: the turn it
    /// started or steered into, or, for a replayed operation, its run's
    /// turn while that still runs. `None` when the answer is ready now (a
    /// replay of a settled run) or waits for queued input
    /// ([`Runtime::settle`] waits for both).
    ///
    /// A replay is answered the same way on every surface: the saved run,
    /// never another turn, whatever the retried request says (the HTTP
    /// seed's rule); one that differs from the request that made the run
    /// is logged here, once, as a warning.
    ///
    /// # Errors
    ///
    /// As [`Runtime::get`].
    pub async fn pending_turn(
        &self,
        accepted: &crate::Accepted,
    ) -> Result<Option<(RunId, TurnId)>, RuntimeError> {
        use crate::Accepted;
        match accepted {
            Accepted::Started { run, turn } | Accepted::Steered { run, turn } => {
                Ok(Some((run.clone(), turn.clone())))
            }
            Accepted::Queued { .. } => Ok(None),
            Accepted::Replayed { run, differs } => {
                if *differs {
                    tracing::warn!(target: "spool::runtime", run_id = %run, "an operation id was retried with a different request; its saved run is answered unchanged");
                }
                let view = self.get(run).await?;
                Ok(match (view.status, view.turn_id) {
                    (Status::Running, Some(turn)) => Some((run.clone(), turn)),
                    _ => None,
                })
            }
        }
    }

    /// Settles an accepted command: the run once the turn its answer waits
    /// for ([`Runtime::pending_turn`]) reaches a boundary, or once queued
    /// input has run, or as it is. What every transport answers a command
    /// with.
    ///
    /// # Errors
    ///
    /// As [`Runtime::wait_for`].
    pub async fn settle(&self, accepted: &crate::Accepted) -> Result<RunView, RuntimeError> {
        if let crate::Accepted::Queued { run, queued } = accepted {
            return self.wait_for_queued(run, *queued).await;
        }
        match self.pending_turn(accepted).await? {
            Some((run, turn)) => self.wait_for(&run, &turn).await,
            None => self.get(accepted.run()).await,
        }
    }

    /// Whether the journal can write, as the runtime last saw it: a write
    /// that failed on storage makes it [`JournalHealth::Unavailable`]
    /// until a probe or another write succeeds. What a readiness check
    /// answers.
    ///
    /// [`JournalHealth::Unavailable`]: crate::JournalHealth::Unavailable
    #[must_use]
    pub fn journal_health(&self) -> crate::JournalHealth {
        self.inner.storage.health().borrow().clone()
    }

    /// The journal's health as it changes, for a host that reports it (or
    /// a test that waits for the journal to come back).
    #[must_use]
    pub fn watch_journal_health(&self) -> tokio::sync::watch::Receiver<crate::JournalHealth> {
        self.inner.storage.health()
    }

    /// How many runs are in memory now: at most what
    /// [`RuntimeBuilder::cached_runs`](crate::RuntimeBuilder::cached_runs)
    /// allows, plus those in use.
    #[must_use]
    pub fn cached_runs(&self) -> usize {
        self.inner.runs.len()
    }
}
