//! Encoded stream lines shared by every subscriber of a run: a journal
//! event's line depends on the event alone, so when an append wakes a
//! thousand subscribers the first encodes it and the rest copy its bytes.
//! Any transport with per-subscriber streams uses it (the JSON-RPC
//! framings keep their notifications here).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use spool_journal::{Envelope, RunId, Seq};

/// How many encoded lines are kept, across runs; the oldest go first.
pub const CACHED_LINES: usize = 1024;

/// The most recently encoded lines, by run and position (`V`: what one
/// position encodes to). A position's event never changes (the journal
/// only appends), so a line kept here is never stale.
#[derive(Debug)]
pub struct LineCache<V = Bytes> {
    inner: Mutex<Lines<V>>,
}

impl<V> Default for LineCache<V> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Lines {
                by_run: HashMap::new(),
                oldest_first: VecDeque::new(),
            }),
        }
    }
}

#[derive(Debug)]
struct Lines<V> {
    /// By run, then position: a lookup borrows the run's id, so the
    /// thousand subscribers asking for one line allocate nothing.
    by_run: HashMap<RunId, HashMap<Seq, V>>,
    oldest_first: VecDeque<(RunId, Seq)>,
}

impl<V: Clone> LineCache<V> {
    /// The event's encoding, made by `encode` the first time it is asked
    /// for.
    pub fn line(&self, envelope: &Envelope, encode: impl FnOnce(&Envelope) -> V) -> V {
        self.get_or_encode(&envelope.run_id, envelope.seq, || encode(envelope))
    }

    /// The encoding kept for `run` at `seq`, made by `encode` the first
    /// time it is asked for. `seq` need not be a journal position: a cache
    /// of live deltas keys them by their own counter.
    pub fn get_or_encode(&self, run: &RunId, seq: Seq, encode: impl FnOnce() -> V) -> V {
        if let Some(line) = self.lock().get(run, seq) {
            return line;
        }
        // Encoded outside the lock: two subscribers missing at once both
        // encode, and what they get is the same.
        let line = encode();
        let mut lines = self.lock();
        if lines.get(run, seq).is_none() {
            if lines.oldest_first.len() == CACHED_LINES
                && let Some((old_run, old_seq)) = lines.oldest_first.pop_front()
                && let Some(run_lines) = lines.by_run.get_mut(&old_run)
            {
                run_lines.remove(&old_seq);
                if run_lines.is_empty() {
                    lines.by_run.remove(&old_run);
                }
            }
            lines.oldest_first.push_back((run.clone(), seq));
            lines
                .by_run
                .entry(run.clone())
                .or_default()
                .insert(seq, line.clone());
        }
        line
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lines<V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_run.values().map(HashMap::len).sum()
    }
}

impl<V: Clone> Lines<V> {
    fn get(&self, run: &RunId, seq: Seq) -> Option<V> {
        self.by_run.get(run)?.get(&seq).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_journal::Event;
    use spool_journal::event::RunCreated;

    fn envelope(run: &str, seq: u64) -> Envelope {
        Envelope {
            run_id: RunId::new(run).unwrap(),
            seq: Seq(seq),
            recorded_at: time::OffsetDateTime::UNIX_EPOCH,
            event: Event::RunCreated(RunCreated::default()),
        }
    }

    #[test]
    fn an_events_line_is_encoded_once_however_many_subscribers_ask() {
        let cache: LineCache = LineCache::default();
        let mut encoded = 0;
        for _ in 0..1000 {
            let line = cache.line(&envelope("r", 3), |_| {
                encoded += 1;
                Bytes::from_static(b"{\"seq\":3}\n")
            });
            assert_eq!(&line[..], b"{\"seq\":3}\n");
        }
        assert_eq!(encoded, 1);
    }

    #[test]
    fn the_cache_keeps_at_most_its_bound_and_forgets_the_oldest_first() {
        let cache: LineCache = LineCache::default();
        for seq in 0..(CACHED_LINES as u64 + 10) {
            cache.line(&envelope("r", seq), |e| Bytes::from(e.seq.to_string()));
        }
        assert_eq!(cache.len(), CACHED_LINES);
        let mut encoded = false;
        cache.line(&envelope("r", 0), |_| {
            encoded = true;
            Bytes::new()
        });
        assert!(encoded, "the oldest line was forgotten and encoded again");
        let mut encoded = false;
        cache.line(&envelope("r", CACHED_LINES as u64 + 9), |_| {
            encoded = true;
            Bytes::new()
        });
        assert!(!encoded, "the newest line is still kept");
    }

    #[test]
    fn lines_of_different_runs_at_the_same_position_are_kept_apart() {
        let cache: LineCache = LineCache::default();
        let a = cache.line(&envelope("a", 1), |_| Bytes::from_static(b"a"));
        let b = cache.line(&envelope("b", 1), |_| Bytes::from_static(b"b"));
        assert_eq!((&a[..], &b[..]), (&b"a"[..], &b"b"[..]));
    }
}
