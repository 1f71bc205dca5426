//! A schedule's record run: its recent firings read at start, kept as
//! they happen, and each firing and delivery journaled there.

use super::*;

impl State {
    /// Opens (or creates) `name`'s record run and reads its recent firings.
    pub(super) async fn open(runtime: &Runtime, name: &str) -> Result<Self, RuntimeError> {
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
    pub(super) async fn refresh(&mut self, runtime: &Runtime) -> Result<(), RuntimeError> {
        let envelopes = runtime.inner.journal.read(&self.record, self.next).await?;
        for envelope in envelopes {
            self.next = envelope.seq.next();
            self.replay(&envelope);
        }
        Ok(())
    }

    /// Takes one record-run event into the in-memory view.
    pub(super) fn replay(&mut self, envelope: &Envelope) {
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

    pub(super) fn remember(&mut self, firing: Firing) {
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

    pub(super) fn settle(&mut self, fire_id: &str, delivery: &Delivery) {
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
    pub(super) async fn record(
        &mut self,
        runtime: &Runtime,
        event: Event,
    ) -> Result<(), RuntimeError> {
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
