//! Who waits on a run's next position: one `watch` sender per watched
//! run, announced after each commit, and the clock a store stamps rows
//! with.

use super::*;

/// Where a store gets `recorded_at` from. The pure core reads no clock; a
/// store does, through this, so tests can fix time.
pub type Clock = std::sync::Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// The system clock in UTC.
#[must_use]
pub fn system_clock() -> Clock {
    std::sync::Arc::new(OffsetDateTime::now_utc)
}

/// The subscribers of each run: one `watch` sender per run with at least
/// one live receiver, holding the run's next position.
///
/// A store subscribes in two steps, [`register`](Self::register) and then
/// [`advance`](Self::advance) with the head it read after registering: an
/// append that commits between the two notifies the registered sender, and
/// one that committed before is in the head, so no append goes unannounced.
/// Senders whose receivers have all gone are dropped by the next append to
/// their run or by an amortized sweep, so the map stays about as large as
/// the set of watched runs even when runs are watched once and never
/// written again.
#[derive(Debug, Default)]
pub struct Watchers {
    senders: std::sync::Mutex<Senders>,
}

#[derive(Debug, Default)]
struct Senders {
    map: crate::id::RunMap<watch::Sender<Seq>>,
    /// The map's size at which the next sweep runs: twice its size after
    /// the last one, so sweeping costs O(1) per registration.
    sweep_at: usize,
}

impl Senders {
    /// `run`'s sender while somebody listens; forgotten once nobody does.
    fn listened(&mut self, run: &RunId) -> Option<&watch::Sender<Seq>> {
        if self.map.get(run)?.receiver_count() == 0 {
            self.map.remove(run);
            return None;
        }
        self.map.get(run)
    }
}

/// Sets a run's announced next position to `next` unless it is already
/// later: positions never move backwards. Subscribers are woken when it
/// moves, or also when it stays if `known_too`.
fn announce(sender: &watch::Sender<Seq>, next: Seq, known_too: bool) {
    sender.send_if_modified(|seen| {
        let wake = next > *seen || (known_too && next == *seen);
        if wake {
            *seen = next;
        }
        wake
    });
}

/// The fewest senders kept before a sweep is worth running.
const WATCHERS_SWEEP_MIN: usize = 64;

impl Watchers {
    fn senders(&self) -> std::sync::MutexGuard<'_, Senders> {
        self.senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver of `run`'s position, registered before the store reads
    /// the run's head; follow with [`advance`](Self::advance).
    pub fn register(&self, run: &RunId) -> watch::Receiver<Seq> {
        let mut senders = self.senders();
        if !senders.map.contains_key(run) && senders.map.len() >= senders.sweep_at {
            senders.map.retain(|_, sender| sender.receiver_count() > 0);
            senders.sweep_at = (senders.map.len() * 2).max(WATCHERS_SWEEP_MIN);
        }
        senders
            .map
            .entry(run.clone())
            .or_insert_with(|| watch::channel(Seq(0)).0)
            .subscribe()
    }

    /// Tells `run`'s subscribers that its next position is `next`, unless
    /// they already know a later one: positions never move backwards.
    pub fn advance(&self, run: &RunId, next: Seq) {
        if let Some(sender) = self.senders().map.get(run) {
            announce(sender, next, false);
        }
    }

    /// After an append: announces `next` to the run's subscribers, or
    /// forgets the run when nobody listens any more.
    pub fn notify(&self, run: &RunId, next: Seq) {
        self.tell(run, next, false);
    }

    /// As [`notify`](Self::notify), but wakes the run's subscribers even
    /// when they already know `next`: for a store whose reads lag behind
    /// the positions its heads show (SQLite's skip events not yet synced).
    pub fn wake(&self, run: &RunId, next: Seq) {
        self.tell(run, next, true);
    }

    /// The first half of announcing an append whose caller is answered in
    /// between: `run`'s subscribers can read `next` from now on (so once
    /// the caller is answered, a receiver shows its append), but are not
    /// woken until [`rouse`](Self::rouse). Returns whether they are to be.
    pub(crate) fn set_quietly(&self, run: &RunId, next: Seq, known_too: bool) -> bool {
        let mut senders = self.senders();
        let Some(sender) = senders.listened(run) else {
            return false;
        };
        let mut wake = false;
        sender.send_if_modified(|seen| {
            wake = next > *seen || (known_too && next == *seen);
            *seen = next.max(*seen);
            // Not marked changed: nobody is woken yet.
            false
        });
        wake
    }

    /// The second half: wakes `run`'s subscribers.
    pub(crate) fn rouse(&self, run: &RunId) {
        if let Some(sender) = self.senders().map.get(run) {
            sender.send_modify(|_| {});
        }
    }

    fn tell(&self, run: &RunId, next: Seq, known_too: bool) {
        if let Some(sender) = self.senders().listened(run) {
            announce(sender, next, known_too);
        }
    }

    /// After a deletion: drops `run`'s sender, so its subscribers see it
    /// close (`changed()` fails) instead of waiting for a position that
    /// never comes.
    pub fn close(&self, run: &RunId) {
        self.senders().map.remove(run);
    }

    /// The runs somebody still watches: what a store whose notifications
    /// come from elsewhere (another process) re-reads after it may have
    /// missed some.
    pub fn watched(&self) -> Vec<RunId> {
        self.senders()
            .map
            .iter()
            .filter(|(_, sender)| sender.receiver_count() > 0)
            .map(|(run, _)| run.clone())
            .collect()
    }

    /// How many runs have a sender; for tests of the sweep.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.senders().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_of_runs_watched_once_and_never_written_do_not_accumulate() {
        let watchers = Watchers::default();
        for n in 0..10_000 {
            let run = RunId::new(format!("run-{n}")).unwrap();
            let receiver = watchers.register(&run);
            watchers.advance(&run, Seq(3));
            drop(receiver);
        }
        assert!(
            watchers.len() <= 2 * WATCHERS_SWEEP_MIN,
            "{} senders kept for 10,000 runs nobody watches",
            watchers.len()
        );
    }

    #[test]
    fn a_sweep_keeps_the_runs_still_watched() {
        let watchers = Watchers::default();
        let watched = RunId::new("watched").unwrap();
        let receiver = watchers.register(&watched);
        for n in 0..1_000 {
            drop(watchers.register(&RunId::new(format!("run-{n}")).unwrap()));
        }
        watchers.notify(&watched, Seq(5));
        assert_eq!(*receiver.borrow(), Seq(5));
    }

    #[test]
    fn a_position_set_quietly_is_read_at_once_and_wakes_nobody_until_roused() {
        let watchers = Watchers::default();
        let run = RunId::new("watched").unwrap();
        let receiver = watchers.register(&run);
        assert!(watchers.set_quietly(&run, Seq(2), false));
        assert_eq!(*receiver.borrow(), Seq(2));
        assert!(!receiver.has_changed().unwrap(), "nobody woken yet");
        watchers.rouse(&run);
        assert!(receiver.has_changed().unwrap());
        // Positions never move back, and one already known wakes nobody
        // unless asked to.
        assert!(!watchers.set_quietly(&run, Seq(1), false));
        assert_eq!(*receiver.borrow(), Seq(2));
        assert!(!watchers.set_quietly(&run, Seq(2), false));
        assert!(watchers.set_quietly(&run, Seq(2), true));
    }
}
