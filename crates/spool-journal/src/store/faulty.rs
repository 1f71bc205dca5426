//! A journal whose writes fail as on a full disk while it is set full: for
//! testing what a host (a runtime, a channel, an embedder's own code) does
//! when its journal cannot write. Reads and subscriptions pass through.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{BoxFuture, CallRef, Claim, ClaimKey, Journal, JournalError};
use crate::event::{Envelope, Event};
use crate::id::{RunId, Seq};

/// The error a write meets while the journal is full: SQLite's own text
/// for `SQLITE_FULL`, as the SQLite store reports it.
pub const FULL: &str = "nothing was recorded: database or disk is full";

/// `J`, with writes (appends, claims, probes) refused with
/// [`JournalError::Storage`] while [`Faulty::set_full`] is on. A refused
/// write records nothing, as a failed commit does.
#[derive(Debug, Default)]
pub struct Faulty<J> {
    inner: J,
    full: AtomicBool,
    /// Writes refused but probes taken: a disk with room for a small
    /// commit and not for a run's events.
    nearly_full: AtomicBool,
    refused: AtomicUsize,
}

impl<J: Journal> Faulty<J> {
    /// `inner`, writable until set full.
    pub fn new(inner: J) -> Self {
        Self {
            inner,
            full: AtomicBool::new(false),
            nearly_full: AtomicBool::new(false),
            refused: AtomicUsize::new(0),
        }
    }

    /// The journal underneath, to read it past the fault.
    pub fn inner(&self) -> &J {
        &self.inner
    }

    /// Makes every write fail (`true`) or pass (`false`) from now on.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Makes appends and claims fail while probes pass (`true`), as on a
    /// disk with room for a one-row commit only; `false` ends it.
    pub fn set_nearly_full(&self, nearly_full: bool) {
        self.nearly_full.store(nearly_full, Ordering::SeqCst);
    }

    /// How many writes were refused so far.
    pub fn refused_writes(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    fn writable(&self) -> Result<(), JournalError> {
        if self.full.load(Ordering::SeqCst) || self.nearly_full.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(JournalError::storage(FULL));
        }
        Ok(())
    }
}

impl<J: Journal> Journal for Faulty<J> {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        match self.writable() {
            Ok(()) => self.inner.append(run, expected, events),
            Err(full) => Box::pin(async move { Err(full) }),
        }
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        match self.writable() {
            Ok(()) => self.inner.claim(key, holder),
            Err(full) => Box::pin(async move { Err(full) }),
        }
    }

    crate::forward_journal_reads!(inner);

    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        if self.full.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async { Err(JournalError::storage(FULL)) });
        }
        self.inner.probe()
    }
}
