//! Where this process's writer put each run's events after the index's
//! mark, so a read scans the unindexed tail from its run's first event
//! there instead of from the mark.
//!
//! The per-run index is written behind the commits, a batch at a time
//! (`INDEX_BATCH` events), and a read finds a run's newest events by
//! scanning the events after the mark: about 100 µs for a full batch,
//! paid by every read under load, of any run. With these positions a
//! read of a run with no event in the tail (a parked run's, an idle run's
//! `GET`) skips everything this writer wrote, and a read of a run that
//! entered the tail late skips what came before it; a run appending all
//! along still scans most of the tail.
//!
//! Another process may append to the same file (the store stays correct
//! under several writers). Its events are covered all the same: the
//! writer forgets every position when it sees another connection's
//! commit at the start of its own (`data_version`), and until its next
//! index those reads scan from the mark; a commit it has not seen yet was
//! made after every commit of this writer, so it lies past every position
//! kept here, where the reads still look.

use std::sync::{Mutex, PoisonError};

use crate::id::{RunId, RunMap};

/// The positions, shared by the writer (which sets them) and the reads.
#[derive(Debug, Default)]
pub(super) struct Tail {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The index's mark the positions are for; `None` while they are not
    /// known (another connection committed, or a commit failed).
    through: Option<i64>,
    /// The last position this writer committed after the mark (the mark
    /// itself when none): every event after the mark up to it is this
    /// writer's.
    last: i64,
    /// Each run's first position after the mark, for the runs this writer
    /// appended to since.
    first: RunMap<i64>,
}

impl Tail {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index now reaches `through`, and this writer wrote everything
    /// up to it or saw it written (an open, or an index that took the
    /// whole tail).
    pub(super) fn start(&self, through: i64) {
        let mut state = self.state();
        state.through = Some(through);
        state.last = through;
        state.first.clear();
    }

    /// Forgets every position: another connection committed, or a commit
    /// failed. Reads scan from the mark until the next [`Tail::start`].
    pub(super) fn forget(&self) {
        self.state().through = None;
    }

    /// Records a commit, before it is made: `first` the runs it brings
    /// into the tail, each with its first position, and `last` its last
    /// position. Made before the commit, so a read whose snapshot holds
    /// the commit finds them.
    pub(super) fn commit(&self, first: Vec<(RunId, i64)>, last: i64) {
        let mut state = self.state();
        if state.through.is_none() {
            return;
        }
        state.first.extend(first);
        state.last = state.last.max(last);
    }

    /// Where a read of `run` whose snapshot has the index at `through`
    /// scans the tail from (every event of the run after the mark lies
    /// past it): `through` itself when nothing is known.
    pub(super) fn scan_after(&self, through: i64, run: &RunId) -> i64 {
        let state = self.state();
        if state.through != Some(through) {
            return through;
        }
        match state.first.get(run) {
            Some(first) => first - 1,
            None => state.last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str) -> RunId {
        RunId::new(name).unwrap()
    }

    #[test]
    fn a_read_scans_from_its_runs_first_event_after_the_mark_or_past_this_writers_last() {
        let tail = Tail::default();
        // Nothing known yet: from the mark.
        assert_eq!(tail.scan_after(10, &run("a")), 10);
        tail.start(10);
        tail.commit(vec![(run("a"), 11)], 13);
        tail.commit(vec![(run("b"), 14)], 20);
        assert_eq!(tail.scan_after(10, &run("a")), 10);
        assert_eq!(tail.scan_after(10, &run("b")), 13);
        // A run this writer did not append to since the mark: only what
        // another process may have written after this writer's last.
        assert_eq!(tail.scan_after(10, &run("c")), 20);
        // A snapshot from before the index moved: from its own mark.
        tail.start(20);
        assert_eq!(tail.scan_after(10, &run("b")), 10);
        assert_eq!(tail.scan_after(20, &run("b")), 20);
    }

    #[test]
    fn once_forgotten_every_read_scans_from_the_mark_until_the_next_index() {
        let tail = Tail::default();
        tail.start(10);
        tail.commit(vec![(run("a"), 15)], 15);
        tail.forget();
        // Commits meanwhile are not recorded.
        tail.commit(vec![(run("b"), 16)], 16);
        assert_eq!(tail.scan_after(10, &run("a")), 10);
        assert_eq!(tail.scan_after(10, &run("b")), 10);
        assert_eq!(tail.scan_after(10, &run("c")), 10);
        tail.start(16);
        assert_eq!(tail.scan_after(16, &run("c")), 16);
    }
}
