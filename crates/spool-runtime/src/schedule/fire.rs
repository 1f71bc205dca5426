//! Firing a schedule: the loop that waits for each occurrence, catching
//! up after a restart, the firing recorded before its message is
//! delivered, and a firing in doubt settled from its target's log.

use super::*;

impl Schedule {
    pub(super) fn name(&self) -> &str {
        &self.parsed.definition.name
    }

    pub(super) async fn view(&self) -> ScheduleView {
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
    pub(super) fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let zoned = after.to_zoned(self.parsed.zone.clone());
        self.parsed
            .cron
            .find_next_occurrence(&zoned, false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The next occurrence to fire, after `last` fired and after now;
    /// kept for listings.
    pub(super) fn upcoming(&self, last: Option<Timestamp>) -> Option<Timestamp> {
        let now = self.clock.now();
        let due = self.next_after(last.map_or(now, |last| last.max(now)));
        *self.next.lock().unwrap_or_else(PoisonError::into_inner) = due;
        due
    }

    /// Fires each occurrence of the cron expression, one after another.
    pub(super) async fn run(&self, fired: &watch::Sender<u64>) {
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
    pub(super) async fn catch_up(&self, fired: &watch::Sender<u64>) -> Result<(), RuntimeError> {
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
    pub(super) async fn fire(
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

    pub(super) async fn settle(
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

    pub(super) fn target_address(&self) -> Option<Address> {
        self.parsed
            .definition
            .address
            .as_ref()
            .map(|name| Address::new(TARGET_NAMESPACE, name.clone()))
    }

    /// The context line a firing's message carries: it tells the model
    /// where the message came from, and a restart where it went.
    pub(super) fn context_line(&self, record: &ScheduleFired) -> String {
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
    pub(super) async fn deliver(
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
    pub(super) async fn settle_in_doubt(
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
    pub(super) async fn records_of(
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
    pub(super) async fn find_delivery(
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
pub(super) fn cron_id(at: Timestamp) -> String {
    format!("cron:{at}")
}

pub(super) fn offset(at: Timestamp) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(at.as_nanosecond())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

pub(super) fn timestamp(at: OffsetDateTime) -> Timestamp {
    Timestamp::from_nanosecond(at.unix_timestamp_nanos()).unwrap_or(Timestamp::UNIX_EPOCH)
}
