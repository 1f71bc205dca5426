//! The methods that act on runs: `submit.run` and the turn it streams,
//! `subscribe` and the events it forwards, `run.respond`, `run.cancel`
//! and `run.list`.

use super::*;
use tracing::Instrument;

impl Connection {
    /// `submit.run`: starts a run (or a turn of `run_id`), streams the
    /// turn's `events.append` on this connection, and answers with the
    /// turn's reply once it reaches a boundary.
    /// `legacy`: the id of the legacy request this is, whose events go out
    /// in the legacy shape.
    pub(super) async fn submit_run(
        &self,
        submit: SubmitRun,
        legacy: Option<&Id>,
    ) -> Result<Value, Failure> {
        let runtime = self.runtime();
        let policy = submit
            .turn_policy
            .as_ref()
            .map(spool_wire::run::TurnPolicy::try_from)
            .transpose()
            .map_err(|unknown| invalid_params(unknown.to_string()))?;
        // Where the stream starts: after everything the run held before.
        let (before, accepted) = match &submit.run_id {
            Some(id) => {
                let run = self.reached(id).await?;
                let before = runtime.get(&run).await.map_err(runtime_error)?.cursor;
                let message = MessageRequest {
                    text: submit.text,
                    context: submit.context.unwrap_or_default(),
                    policy,
                };
                (
                    before,
                    runtime.send(&run, message).await.map_err(runtime_error)?,
                )
            }
            None => {
                if submit.operation_id.is_some() && self.inner.principal.is_none() {
                    return Err(invalid_params(
                        "`operation_id` needs an authenticated caller",
                    ));
                }
                let address = submit
                    .address
                    .as_ref()
                    .map(|name| Address::new(spool_edge::tables::HTTP_NAMESPACE, name.clone()));
                let before = match &address {
                    Some(address) => match runtime.lookup(address).await {
                        // A message through an address bound to another's
                        // run is refused as for an unknown address.
                        Ok(view)
                            if !self
                                .inner
                                .access
                                .reaches(runtime, self.inner.principal.as_ref(), &view.run_id)
                                .await
                                .map_err(runtime_error)? =>
                        {
                            return Err(runtime_error(RuntimeError::AddressNotFound(
                                address.clone(),
                            )));
                        }
                        Ok(view) => view.cursor,
                        Err(_) => None,
                    },
                    None => None,
                };
                let request = StartRequest {
                    text: submit.text,
                    address,
                    operation_id: submit.operation_id,
                    principal: self.inner.principal.clone(),
                    title: submit.title,
                    kind: submit.kind,
                    context: submit.context.unwrap_or_default(),
                    policy,
                    upgrade: submit.upgrade,
                };
                (before, runtime.start(request).await.map_err(runtime_error)?)
            }
        };
        // The turn the answer waits for is streamed to its boundary (a
        // replay of a running operation from where the run is now); the
        // rest settle as on every surface.
        let pending = runtime
            .pending_turn(&accepted)
            .await
            .map_err(runtime_error)?;
        let view = match pending {
            Some((run, turn)) => {
                let from = match accepted {
                    Accepted::Replayed { .. } => {
                        runtime.get(&run).await.map_err(runtime_error)?.cursor
                    }
                    _ => before,
                };
                self.stream_turn(&run, &turn, from, legacy).await?
            }
            // Queued input settles once it has run; anything else named no
            // turn to wait for (a settled replay): the run as it is. Not
            // `settle` for both, which would ask for the pending turn (and
            // log a differing replay) a second time.
            None => match &accepted {
                Accepted::Queued { .. } => runtime.settle(&accepted).await,
                other => runtime.get(other.run()).await,
            }
            .map_err(runtime_error)?,
        };
        Ok(to_value(&spool_edge::tables::reply(&view)))
    }

    /// Sends `turn`'s events (from after `before`) until the turn reaches a
    /// boundary, and returns the run then.
    pub(super) async fn stream_turn(
        &self,
        run: &RunId,
        turn: &TurnId,
        before: Option<Seq>,
        legacy: Option<&Id>,
    ) -> Result<RunView, Failure> {
        let runtime = self.runtime();
        let mut items = runtime
            .subscribe(run, before)
            .await
            .map_err(runtime_error)?;
        let mut mapper = Mapper::new(run);
        // The last journal position sent.
        let mut sent = before;
        let boundary = runtime.wait_for(run, turn);
        tokio::pin!(boundary);
        let view = loop {
            tokio::select! {
                // Events first: everything up to the boundary goes out
                // before the answer.
                biased;
                item = items.next() => match item {
                    Some(item) => {
                        if let StreamItem::Event(envelope) = &item {
                            sent = Some(envelope.seq);
                        }
                        if self.forward(run, &mut mapper, item, legacy).await.is_break() {
                            // Lagged: the answer still comes.
                            return boundary.await.map_err(runtime_error);
                        }
                    }
                    None => return boundary.await.map_err(runtime_error),
                },
                view = &mut boundary => break view.map_err(runtime_error)?,
            }
        };
        // The boundary is known before its events reach the subscription:
        // what the journal holds up to it goes out before the answer.
        let Some(last) = view.cursor else {
            return Ok(view);
        };
        while sent.is_none_or(|sent| sent < last) {
            let Some(item) = items.next().await else {
                break;
            };
            if let StreamItem::Event(envelope) = &item {
                sent = Some(envelope.seq);
            }
            if self
                .forward(run, &mut mapper, item, legacy)
                .await
                .is_break()
            {
                break;
            }
        }
        Ok(view)
    }

    /// A journal event's `events.append` notifications for a subscription,
    /// encoded by the first subscription of the run to reach it.
    pub(super) fn encoded_events(
        &self,
        mapper: &mut Mapper,
        envelope: &spool_journal::Envelope,
    ) -> Arc<[Outgoing]> {
        let mut mapped = false;
        let encoded = self.inner.encoded.events.line(envelope, |envelope| {
            mapped = true;
            mapper
                .envelope(envelope)
                .iter()
                .map(|event| {
                    Outgoing::event(envelope.seq.0, rpc::METHOD_EVENTS_APPEND, to_value(event))
                })
                .collect()
        });
        if !mapped {
            mapper.advance(envelope);
        }
        encoded
    }

    /// A live delta's `events.append`, encoded once for the run's
    /// subscriptions (with the time the first of them sent it).
    pub(super) fn encoded_delta(
        &self,
        run: &RunId,
        mapper: &Mapper,
        delta: &LiveDelta,
    ) -> Option<Outgoing> {
        let encode = || {
            let event = mapper.delta(delta, now_nanos())?;
            // Live only: a client resuming from here gets what the journal
            // holds after the last durable position.
            Some(Outgoing::event(
                delta.after.0.saturating_sub(1),
                rpc::METHOD_EVENTS_APPEND,
                to_value(&event),
            ))
        };
        // A delta's number names it within its run.
        self.inner
            .encoded
            .deltas
            .get_or_encode(run, Seq(delta.n), encode)
    }

    /// Sends a journal event's `events.append` notifications.
    pub(super) async fn send_events(
        &self,
        mapper: &mut Mapper,
        envelope: &spool_journal::Envelope,
        legacy: Option<&Id>,
    ) {
        for event in mapper.envelope(envelope) {
            self.notify_event(envelope.seq.0, &event, legacy).await;
        }
    }

    /// Sends one hub item as `events.append`; `Break` when the subscriber
    /// fell behind (it was told, with the cursor to resume after).
    pub(super) async fn forward(
        &self,
        run: &RunId,
        mapper: &mut Mapper,
        item: StreamItem,
        legacy: Option<&Id>,
    ) -> std::ops::ControlFlow<()> {
        match item {
            StreamItem::Event(envelope) => self.send_events(mapper, &envelope, legacy).await,
            StreamItem::Delta(delta) => {
                let nanos = now_nanos();
                if let Some(event) = mapper.delta(&delta, nanos) {
                    // Live only: a client resuming from here gets what the
                    // journal holds after the last durable position.
                    self.notify_event(delta.after.0.saturating_sub(1), &event, legacy)
                        .await;
                }
            }
            StreamItem::Lagged { last } => {
                self.notify(
                    "subscription.lagged",
                    json!({"run_id": run.as_str(), "cursor": last.map(|s| s.0)}),
                )
                .await;
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    /// `subscribe`: `events.append` (channel `spool:events`) and/or
    /// `state.patch` (channel `spool:state`) for a run from a cursor,
    /// journal first, then live, until `unsubscribe`, the connection's end,
    /// or the subscriber falling behind.
    pub(super) async fn subscribe(&self, subscribe: Subscribe) -> Result<Value, Failure> {
        let run = self.reached(&subscribe.run_id).await?;
        let channels = Channels::of(subscribe.channels.as_deref())?;
        let cursor = subscribe.cursor;
        let last = self
            .runtime()
            .get(&run)
            .await
            .map_err(runtime_error)?
            .cursor;
        if let Some(cursor) = cursor
            && last.is_none_or(|last| cursor > last.0)
        {
            return Err(invalid_params(format!(
                "cursor {cursor} is past run {run}'s last position"
            )));
        }
        // From the start, so the mapper knows the model call a resumed
        // stream is in the middle of (its span) and the patcher the
        // document at the cursor; what is at or before the cursor is not
        // sent.
        let items = self
            .runtime()
            .subscribe(&run, None)
            .await
            .map_err(runtime_error)?;
        let token = self.inner.closed.child_token();
        let carried = Arc::new(std::sync::atomic::AtomicU8::new(channels.bits()));
        let following = Following {
            token: token.clone(),
            channels: Arc::clone(&carried),
        };
        if let Some(previous) = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.clone(), following)
        {
            // One subscription per run and connection: the new one wins.
            previous.token.cancel();
        }
        let connection = self.clone();
        let subscribed = run.clone();
        let span = tracing::debug_span!(target: "spool::rpc", "subscription", run_id = %subscribed);
        self.inner.streams.spawn(
            async move {
                let mut items = items;
                let mut mapper = Mapper::new(&subscribed);
                let mut patcher = channels.state.then(|| Patcher::new(&subscribed));
                loop {
                    let item = tokio::select! {
                        () = token.cancelled() => break,
                        // Nobody reads the connection any more (a host dropped
                        // it without closing it): the subscription ends.
                        () = connection.inner.outbox.closed() => break,
                        item = items.next() => item,
                    };
                    let Some(item) = item else { break };
                    if let StreamItem::Event(envelope) = &item
                        && cursor.is_some_and(|cursor| envelope.seq.0 <= cursor)
                    {
                        mapper.advance(envelope);
                        if let Some(patcher) = &mut patcher {
                            patcher.skip(envelope);
                        }
                        continue;
                    }
                    // What the subscription carries now: `unsubscribe` may
                    // have left one of its channels.
                    let channels = Channels::from_bits(carried.load(Ordering::SeqCst));
                    let flow = match item {
                        StreamItem::Event(envelope) => {
                            // A position's events go out before its patch: a
                            // client resuming after it has both.
                            if channels.events {
                                for event in
                                    connection.encoded_events(&mut mapper, &envelope).iter()
                                {
                                    connection.send(event.clone()).await;
                                }
                            } else {
                                mapper.advance(&envelope);
                            }
                            if let Some(patch) = patcher.as_mut().and_then(|p| p.apply(&envelope))
                                && channels.state
                            {
                                connection
                                    .notify_at(
                                        envelope.seq.0,
                                        rpc::METHOD_STATE_PATCH,
                                        patch.params(&subscribed),
                                    )
                                    .await;
                            }
                            std::ops::ControlFlow::Continue(())
                        }
                        StreamItem::Delta(_) if !channels.events => {
                            std::ops::ControlFlow::Continue(())
                        }
                        StreamItem::Delta(delta) => {
                            if let Some(event) =
                                connection.encoded_delta(&subscribed, &mapper, &delta)
                            {
                                connection.send(event).await;
                            }
                            std::ops::ControlFlow::Continue(())
                        }
                        item => {
                            connection
                                .forward(&subscribed, &mut mapper, item, None)
                                .await
                        }
                    };
                    if flow.is_break() {
                        break;
                    }
                }
                let mut subscriptions = connection
                    .inner
                    .subscriptions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if subscriptions
                    .get(&subscribed)
                    .is_some_and(|f| f.token.is_cancelled() || f.token == token)
                {
                    subscriptions.remove(&subscribed);
                }
            }
            .instrument(span),
        );
        Ok(json!({"subscribed": run.as_str(), "channels": channels.names()}))
    }

    pub(super) async fn respond(&self, respond: RespondParams) -> Result<Value, Failure> {
        let run = self.reached(&respond.run_id).await?;
        // The turn may be named beside the answers or inside each of them
        // (as the HTTP channel takes it): one meaning, and answers that
        // name different turns are refused, as over HTTP.
        let mut named = respond
            .responses
            .iter()
            .filter_map(|answer| answer.turn_id.as_deref())
            .chain(respond.turn_id.as_deref());
        let turn = named.next();
        if let Some(first) = turn
            && named.any(|other| other != first)
        {
            return Err(invalid_params(
                "the answers name different turns; answer one turn at a time",
            ));
        }
        let turn = turn
            .map(TurnId::new)
            .transpose()
            .map_err(|e| invalid_params(format!("`turn_id`: {e}")))?;
        if respond.responses.is_empty() {
            return Err(invalid_params("`responses` needs at least one answer"));
        }
        let answers = respond
            .responses
            .into_iter()
            .map(|answer| Answer {
                text: answer.text,
                approved: answer.approved,
            })
            .collect();
        self.runtime()
            .respond(&run, turn.as_ref(), answers)
            .await
            .map_err(runtime_error)?;
        let view = self.runtime().get(&run).await.map_err(runtime_error)?;
        Ok(to_value(&spool_edge::tables::reply(&view)))
    }

    /// `run.fork`: a new run holding the run's history through a turn's
    /// end (`after`) or up to its start (`before`), owned by the caller;
    /// the reply is the fork's `RunReply`.
    pub(super) async fn fork(&self, params: ForkParams) -> Result<Value, Failure> {
        let run = self.reached(&params.run_id).await?;
        let fork = spool_wire::http::Fork {
            after: params.after,
            before: params.before,
            title: params.title,
        };
        let (turn, after) = fork
            .cut()
            .map_err(|rejection| invalid_params(rejection.message))?;
        let turn = TurnId::new(turn).map_err(|e| invalid_params(format!("the turn: {e}")))?;
        let request = spool_runtime::ForkRequest {
            turn,
            cut: if after {
                spool_journal::event::ForkCut::After
            } else {
                spool_journal::event::ForkCut::Before
            },
            title: fork.title.clone(),
            principal: self.inner.principal.clone(),
        };
        let view = self
            .runtime()
            .fork(&run, request)
            .await
            .map_err(runtime_error)?;
        Ok(to_value(&spool_edge::tables::reply(&view)))
    }

    /// `run.delete`: the run's events and what is derived from them go,
    /// its tombstone stays (the reply); ownership as for every method.
    pub(super) async fn delete(&self, params: DeleteParams) -> Result<Value, Failure> {
        let run = self.reached(&params.run_id).await?;
        let tombstone = self
            .runtime()
            .delete(
                &run,
                spool_runtime::DeleteRequest {
                    by: spool_edge::tables::deleter(self.inner.principal.as_ref()),
                    reason: None,
                    force: params.force,
                    expected: None,
                },
            )
            .await
            .map_err(runtime_error)?;
        Ok(to_value(&spool_edge::tables::deleted(&tombstone)))
    }

    pub(super) async fn cancel(&self, cancel: CancelParams) -> Result<Value, Failure> {
        let run = run_id(&cancel.run_id)?;
        // Another principal's run is cancelled as an unknown one is: a
        // harmless `not_active`.
        let reached = self
            .inner
            .access
            .reaches(self.runtime(), self.inner.principal.as_ref(), &run)
            .await;
        match reached {
            Ok(true) => {}
            Ok(false) | Err(RuntimeError::RunNotFound(_)) => {
                return Ok(to_value(&CancelReply {
                    status: CancelStatus::NotActive,
                    run_id: None,
                    turn_id: None,
                }));
            }
            Err(error) => return Err(runtime_error(error)),
        }
        let turn = cancel
            .turn_id
            .as_deref()
            .map(TurnId::new)
            .transpose()
            .map_err(|e| invalid_params(format!("`turn_id`: {e}")))?;
        let reply = match self.runtime().cancel(&run, turn.as_ref()).await {
            Ok(CancelOutcome::Requested(turn)) => CancelReply {
                status: CancelStatus::Requested,
                run_id: Some(run.to_string()),
                turn_id: Some(turn.to_string()),
            },
            Ok(CancelOutcome::Stale { current }) => CancelReply {
                status: CancelStatus::Stale,
                run_id: Some(run.to_string()),
                turn_id: current.map(|t| t.to_string()),
            },
            // As over HTTP: cancelling an unknown or idle run is harmless.
            Ok(CancelOutcome::NotActive) | Err(RuntimeError::RunNotFound(_)) => CancelReply {
                status: CancelStatus::NotActive,
                run_id: None,
                turn_id: None,
            },
            Err(error) => return Err(runtime_error(error)),
        };
        Ok(to_value(&reply))
    }

    pub(super) async fn list(&self, list: ListParams) -> Result<Value, Failure> {
        let limit = list.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(invalid_params("`limit` must be 1 to 1000"));
        }
        let all = self.runtime().list().await.map_err(runtime_error)?;
        // Under owner access a page holds the caller's runs only.
        let mut listed = Vec::with_capacity(limit.min(all.len()));
        for summary in all {
            if listed.len() == limit {
                break;
            }
            let reached = self
                .inner
                .access
                .reaches(
                    self.runtime(),
                    self.inner.principal.as_ref(),
                    &summary.run_id,
                )
                .await;
            match reached {
                Ok(true) => listed.push(summary),
                // Gone since it was listed, or another's.
                Ok(false) | Err(RuntimeError::RunNotFound(_)) => {}
                Err(error) => return Err(runtime_error(error)),
            }
        }
        let runs: Vec<Value> = listed
            .into_iter()
            .map(|summary| {
                json!({
                    "id": summary.run_id.as_str(),
                    "state": summary.status.state().as_str(),
                    "title": summary.title,
                    "updated": summary.updated_at.unix_timestamp(),
                })
            })
            .collect();
        Ok(json!({"runs": runs}))
    }
}
