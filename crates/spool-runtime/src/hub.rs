//! The live event hub: what a subscriber of a run sees. Durable events come
//! from the journal (so a subscriber that opens with a cursor gets the
//! journal after it, then live events, with no gap and no duplicate); live
//! deltas come from a bounded broadcast per run, and the latest are kept in
//! a small ring so a subscriber that reconnects mid-generation sees the
//! text so far.
//!
//! Every queue here is bounded. A subscriber that falls behind the delta
//! broadcast is told it lagged, with the last position it got, and its
//! stream ends; it resumes from that cursor.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use spool_journal::{Envelope, Journal, RunId, Seq, TurnId};
use tokio::sync::{broadcast, watch};

use crate::engine::Delta;

/// How many deltas a subscriber may fall behind before it is told it lagged.
pub const DELTA_QUEUE: usize = 1024;
/// How many recent deltas a run keeps for subscribers that reconnect.
pub const DELTA_RING: usize = 256;
/// How many recent durable events a watched run keeps in memory, so that
/// one journal read serves all of its subscribers.
pub const RECENT_EVENTS: usize = 256;

/// A live delta, tagged with the run's next position when it was made:
/// it follows every durable event before that position.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveDelta {
    /// The turn streaming it.
    pub turn: TurnId,
    /// The run's next position when it was made.
    pub after: Seq,
    /// The delta's number, increasing across the process (and so within a
    /// run, even after the hub forgot it between turns): a delta is never
    /// delivered twice, and a number names one delta.
    pub n: u64,
    /// The delta.
    pub delta: Delta,
}

/// What a subscriber receives.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamItem {
    /// A durable event, shared with the run's other subscribers.
    Event(Arc<Envelope>),
    /// A live delta.
    Delta(LiveDelta),
    /// The subscriber fell behind and its stream ends here; resume after
    /// this position (the last event it got, if any).
    Lagged {
        /// The last position delivered.
        last: Option<Seq>,
    },
}

/// The runs with live deltas or subscribers. An entry is made when a run
/// publishes or is subscribed to and dropped when its turn ends with
/// nobody listening; runs subscribed to and never written again (a stream
/// opened on a finished run) are dropped by an amortized sweep when the
/// map has doubled, so it stays about as large as the set of live runs.
#[derive(Default)]
pub(crate) struct Hub {
    runs: Mutex<HubRuns>,
    /// Subscriptions open now, for telemetry.
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl Hub {
    /// How many subscriptions are open.
    pub(crate) fn open_streams(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One open subscription, counted while it lives.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Counted {
    fn new(open: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(Arc::clone(open))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Default)]
struct HubRuns {
    map: HashMap<RunId, RunDeltas>,
    sweep_at: usize,
}

/// The fewest entries kept before a sweep is worth running.
const HUB_SWEEP_MIN: usize = 64;

/// The next delta's number, across every run of the process.
static NEXT_DELTA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

struct RunDeltas {
    /// Made by the first subscriber: a channel of `DELTA_QUEUE` slots is
    /// about 100 KiB, and made for every run that streamed a reply (then
    /// freed at its turn's end) it was the largest cost of a one-turn run
    /// nobody watched.
    sender: Option<broadcast::Sender<LiveDelta>>,
    ring: VecDeque<LiveDelta>,
    recent: Arc<Shared>,
}

/// A run's recent events and the lock its subscribers take to fill them.
#[derive(Debug, Default)]
struct Shared {
    recent: Mutex<Recent>,
    /// Held while one subscriber reads the journal, so the others woken by
    /// the same append wait for its read instead of all reading.
    fill: tokio::sync::Mutex<()>,
}

/// A watched run's latest durable events, contiguous by position, as read
/// (and verified) from the journal by one of its subscribers. When an
/// append wakes a thousand subscribers, the first reads the journal under
/// the lock and the rest share what it read.
#[derive(Debug, Default)]
struct Recent {
    events: VecDeque<Arc<Envelope>>,
}

impl Recent {
    /// The events from `start` up to (not including) `head`, when all of
    /// them are here.
    fn covering(&self, start: Seq, head: Seq) -> Option<Vec<Arc<Envelope>>> {
        if head <= start {
            return Some(Vec::new());
        }
        let first = self.events.front()?.seq;
        let end = self.events.back()?.seq.next();
        if first > start || end < head {
            return None;
        }
        let skip = usize::try_from(start.0 - first.0).ok()?;
        let take = usize::try_from(head.0 - start.0).ok()?;
        Some(self.events.iter().skip(skip).take(take).cloned().collect())
    }

    /// Keeps `read` (contiguous events just read from the journal), joined
    /// to what is here when they meet, else in its place.
    fn remember(&mut self, read: &[Arc<Envelope>]) {
        let Some(first) = read.first() else { return };
        let end = self.events.back().map(|e| e.seq.next());
        match end {
            Some(end)
                if self.events.front().is_some_and(|f| f.seq <= first.seq) && first.seq <= end =>
            {
                self.events
                    .extend(read.iter().filter(|e| e.seq >= end).cloned());
            }
            _ => {
                self.events.clear();
                self.events.extend(read.iter().cloned());
            }
        }
        while self.events.len() > RECENT_EVENTS {
            self.events.pop_front();
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Hub {
    fn runs(&self) -> std::sync::MutexGuard<'_, HubRuns> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(&self, run: &RunId, f: impl FnOnce(&mut RunDeltas) -> T) -> T {
        let mut runs = self.runs();
        if !runs.map.contains_key(run) && runs.map.len() >= runs.sweep_at {
            // Idle entries: nobody listens and no generation is in progress.
            runs.map
                .retain(|_, deltas| deltas.listened() || !deltas.ring.is_empty());
            runs.sweep_at = (runs.map.len() * 2).max(HUB_SWEEP_MIN);
        }
        let entry = runs.map.entry(run.clone()).or_insert_with(|| RunDeltas {
            sender: None,
            // Grows as deltas come, up to `DELTA_RING`.
            ring: VecDeque::new(),
            recent: Arc::default(),
        });
        f(entry)
    }

    /// Publishes a delta. Never blocks; with no subscriber it only joins
    /// the ring.
    pub(crate) fn publish(&self, run: &RunId, turn: &TurnId, after: Seq, delta: Delta) {
        self.with(run, |deltas| {
            let live = LiveDelta {
                turn: turn.clone(),
                after,
                n: NEXT_DELTA.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                delta,
            };
            if deltas.ring.len() == DELTA_RING {
                deltas.ring.pop_front();
            }
            deltas.ring.push_back(live.clone());
            // Refused only when nobody listens; the ring has it for whoever
            // subscribes next.
            if let Some(sender) = &deltas.sender {
                let _ = sender.send(live);
            }
        });
    }

    /// Forgets a run's deltas when its turn ends: they are no longer "the
    /// generation in progress".
    pub(crate) fn end_turn(&self, run: &RunId) {
        let mut runs = self.runs();
        if let Some(deltas) = runs.map.get_mut(run) {
            if !deltas.listened() {
                // Nobody listens: a parked or finished run costs nothing here.
                runs.map.remove(run);
            } else {
                deltas.ring.clear();
                // A run whose subscribers all leave before its next turn
                // keeps its entry; it should not keep events too. The next
                // append's first reader refills this from the journal.
                deltas
                    .recent
                    .recent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .events
                    .clear();
            }
        }
    }

    fn join(&self, run: &RunId) -> Joined {
        // Subscribing before copying the ring means nothing falls between
        // the two; the counter drops what is in both.
        self.with(run, |deltas| Joined {
            deltas: deltas
                .sender
                .get_or_insert_with(|| broadcast::channel(DELTA_QUEUE).0)
                .subscribe(),
            ring: deltas.ring.iter().cloned().collect(),
            recent: Arc::clone(&deltas.recent),
        })
    }
}

impl RunDeltas {
    fn listened(&self) -> bool {
        self.sender.as_ref().is_some_and(|s| s.receiver_count() > 0)
    }
}

struct Joined {
    deltas: broadcast::Receiver<LiveDelta>,
    ring: Vec<LiveDelta>,
    recent: Arc<Shared>,
}

/// Where a subscription stands between deliveries (see
/// [`Subscription::resting`]): the next durable position it delivers, and
/// the last delta it delivered of the generation after the event before
/// that position, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resting {
    /// The next durable position to deliver.
    pub next: Seq,
    /// The number of the last delta delivered that is placed at `next`.
    pub live_delta: Option<u64>,
}

/// A run's event stream from a cursor.
pub struct Subscription {
    run: RunId,
    journal: Arc<dyn Journal>,
    positions: watch::Receiver<Seq>,
    deltas: broadcast::Receiver<LiveDelta>,
    recent: Arc<Shared>,
    /// The next durable position to deliver.
    next: Seq,
    /// The last delta delivered, by counter.
    last_n: Option<u64>,
    /// Its place: the position it was made before.
    last_after: Option<Seq>,
    /// Deltas received and not yet placed: drained before the events they
    /// follow were read, or received by a pump that was dropped.
    held: Vec<LiveDelta>,
    /// The last read found nothing new: wait for a change before reading.
    stalled: bool,
    ready: VecDeque<StreamItem>,
    ended: bool,
    _counted: Counted,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("run", &self.run)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) async fn open(
        hub: &Hub,
        journal: Arc<dyn Journal>,
        run: RunId,
        after: Option<Seq>,
    ) -> Result<Self, spool_journal::JournalError> {
        let positions = journal.subscribe(&run).await?;
        let Joined {
            deltas,
            ring,
            recent,
        } = hub.join(&run);
        let mut subscription = Self {
            run,
            journal,
            positions,
            deltas,
            recent,
            next: after.map_or(Seq(0), Seq::next),
            last_n: None,
            last_after: None,
            held: Vec::new(),
            stalled: false,
            ready: VecDeque::new(),
            ended: false,
            _counted: Counted::new(&hub.open),
        };
        subscription.catch_up().await?;
        // The generation in progress: deltas made after the last durable
        // event this subscriber has now seen.
        for delta in ring {
            if delta.after == subscription.next {
                subscription.deliver(delta);
            }
        }
        Ok(subscription)
    }

    /// A second subscription in this one's state: it delivers what this
    /// one would from here, at its own pace. A transport that writes one
    /// subscription's items to many clients gives one that cannot keep up
    /// a subscription of its own this way, with nothing repeated and
    /// nothing left out (its deltas wait in its own queue, as any slow
    /// subscriber's do).
    pub fn fork(&mut self) -> Self {
        // Subscribed first, then the deltas already sent are taken here and
        // copied: one sent in between is in both, and delivered once (a
        // delta is delivered only past the last one's number).
        let deltas = self.deltas.resubscribe();
        let mut sent = Vec::new();
        let lagged = self.take_sent(&mut sent);
        // Placed as a read would place them: a delta at this position is
        // ready now, one after it waits for the events before it, and one
        // before it has had its place.
        for delta in sent {
            if self.last_n.is_some_and(|n| delta.n <= n) || delta.after < self.next {
                continue;
            }
            if delta.after == self.next && self.held.is_empty() {
                self.deliver(delta);
            } else {
                self.held.push(delta);
            }
        }
        if lagged {
            self.lagged();
        }
        Self {
            run: self.run.clone(),
            journal: Arc::clone(&self.journal),
            positions: self.positions.clone(),
            deltas,
            recent: Arc::clone(&self.recent),
            next: self.next,
            last_n: self.last_n,
            last_after: self.last_after,
            held: self.held.clone(),
            stalled: false,
            ready: self.ready.clone(),
            ended: self.ended,
            _counted: Counted::new(&self._counted.0),
        }
    }

    /// Where this subscription stands when it has delivered everything it
    /// read and holds nothing back; `None` while items wait in it, or once
    /// it has ended. Two subscriptions of a run at the same resting place
    /// deliver the same items from there on, so one may stand in for the
    /// other (a transport that writes one subscription's items to many
    /// clients joins a client's stream to it there).
    #[must_use]
    pub fn resting(&self) -> Option<Resting> {
        (self.ready.is_empty() && self.held.is_empty() && !self.ended).then(|| Resting {
            next: self.next,
            // A delta before the last event delivered has had its place:
            // no delta still to come is placed before it.
            live_delta: self.last_n.filter(|_| self.last_after == Some(self.next)),
        })
    }

    /// The next item; `None` once the stream has ended (after a `Lagged`,
    /// or when the journal closes).
    ///
    /// Cancel-safe: a caller may drop this future (in a `select!` beside
    /// its input, say) and call again without losing or reordering
    /// anything. A delta taken from the broadcast is kept before anything
    /// is awaited, and events are read whenever the journal's head is past
    /// what was delivered, not on a change notice a dropped read would
    /// have used up.
    pub async fn next(&mut self) -> Option<StreamItem> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            if *self.positions.borrow() > self.next && !self.stalled {
                let before = self.next;
                self.pump().await;
                // A read that found nothing past `next` waits for the next
                // change instead of reading again at once.
                self.stalled = self.next == before && self.ready.is_empty();
                continue;
            }
            tokio::select! {
                changed = self.positions.changed() => {
                    self.stalled = false;
                    if changed.is_err() {
                        self.ended = true;
                    }
                }
                delta = self.deltas.recv() => match delta {
                    Ok(delta) => {
                        self.held.push(delta);
                        self.pump().await;
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => self.lagged(),
                    Err(broadcast::error::RecvError::Closed) => self.ended = true,
                },
            }
        }
    }

    /// The next item if one is already read and waiting, without waiting:
    /// a writer that got one item batches the ones behind it into the same
    /// write.
    pub fn ready(&mut self) -> Option<StreamItem> {
        self.ready.pop_front()
    }

    /// Reads new durable events, then drains the deltas waiting, and puts
    /// each delta in its place.
    ///
    /// A delta tagged `after = A` was published once event A-1 was durable
    /// and before event A was appended: it belongs just before the first
    /// event with `seq >= A`. A delta drained here whose events before it
    /// were appended after the read is held until a later pump reads them,
    /// so no delta overtakes an event it follows.
    async fn pump(&mut self) {
        let start = self.next;
        let events = match self.read_from(start).await {
            Ok(events) => events,
            Err(_) => {
                self.ended = true;
                return;
            }
        };
        // Taken only after the read: a pump dropped during it leaves them.
        let mut deltas = std::mem::take(&mut self.held);
        let lagged = self.take_sent(&mut deltas);
        // Drop what was already delivered, and deltas whose place (before an
        // event delivered earlier) has passed: the event that follows them
        // carries their content in full.
        // Numbered in the order they were sent: one taken twice (a fork's
        // copy and its own queue's) passes once.
        let mut last_n = self.last_n;
        let mut deltas = deltas
            .into_iter()
            .filter(|d| {
                let new = last_n.is_none_or(|n| d.n > n);
                if new {
                    last_n = Some(d.n);
                }
                new && d.after >= start
            })
            .peekable();
        for envelope in events {
            while let Some(delta) = deltas.next_if(|d| d.after <= envelope.seq) {
                self.deliver(delta);
            }
            self.next = envelope.seq.next();
            self.ready.push_back(StreamItem::Event(envelope));
        }
        for delta in deltas {
            if delta.after <= self.next {
                self.deliver(delta);
            } else {
                // Its place is after events this read did not see yet
                // (appended between the read and the drain); the position
                // change they made will pump again and place it then.
                self.held.push(delta);
            }
        }
        if lagged {
            self.lagged();
        }
    }

    /// The durable events from `start` that the journal has announced:
    /// from the run's shared recent events when they cover them, else read
    /// (and verified) from the journal and shared. Only one subscriber of a
    /// run reads the journal at a time; the others woken by the same append
    /// find its read in the recent events when they get the lock.
    async fn read_from(
        &self,
        start: Seq,
    ) -> Result<Vec<Arc<Envelope>>, spool_journal::JournalError> {
        let recent = |head: Seq| {
            self.recent
                .recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .covering(start, head)
        };
        if let Some(events) = recent(*self.positions.borrow()) {
            return Ok(events);
        }
        let _filling = self.recent.fill.lock().await;
        if let Some(events) = recent(*self.positions.borrow()) {
            return Ok(events);
        }
        let events: Vec<Arc<Envelope>> = self
            .journal
            .read(&self.run, start)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
        self.recent
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remember(&events);
        Ok(events)
    }

    /// Moves the deltas sent and not yet taken into `into`; whether the
    /// broadcast had dropped some first (this subscriber lagged).
    fn take_sent(&mut self, into: &mut Vec<LiveDelta>) -> bool {
        loop {
            match self.deltas.try_recv() {
                Ok(delta) => into.push(delta),
                Err(broadcast::error::TryRecvError::Lagged(_)) => return true,
                Err(_) => return false,
            }
        }
    }

    fn deliver(&mut self, delta: LiveDelta) {
        self.last_n = Some(delta.n);
        self.last_after = Some(delta.after);
        self.ready.push_back(StreamItem::Delta(delta));
    }

    fn lagged(&mut self) {
        self.ended = true;
        let last = self.next.0.checked_sub(1).map(Seq);
        self.ready.push_back(StreamItem::Lagged { last });
    }

    /// Reads durable events from `next` on.
    async fn catch_up(&mut self) -> Result<(), spool_journal::JournalError> {
        for envelope in self.journal.read(&self.run, self.next).await? {
            self.next = envelope.seq.next();
            self.ready.push_back(StreamItem::Event(Arc::new(envelope)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize) -> RunId {
        RunId::new(format!("run-{n}")).expect("a valid id")
    }

    #[test]
    fn runs_subscribed_to_once_and_never_written_do_not_accumulate() {
        let hub = Hub::default();
        for n in 0..10_000 {
            drop(hub.join(&run(n)));
        }
        let kept = hub.runs().map.len();
        assert!(
            kept <= 2 * HUB_SWEEP_MIN,
            "{kept} entries kept for 10,000 idle runs"
        );
    }

    #[test]
    fn a_sweep_keeps_runs_with_subscribers_or_a_generation_in_progress() {
        let hub = Hub::default();
        let listened = hub.join(&run(0));
        let turn = TurnId::new("turn-1").expect("a valid id");
        hub.publish(&run(1), &turn, Seq(0), Delta::Text("so far".into()));
        for n in 2..1_000 {
            drop(hub.join(&run(n)));
        }
        let runs = hub.runs();
        assert!(runs.map.contains_key(&run(0)) && runs.map.contains_key(&run(1)));
        drop(listened);
    }
}
