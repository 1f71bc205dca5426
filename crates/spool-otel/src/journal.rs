//! A journal whose commits are observed: each batch of events, once it is
//! durable, is queued with the time the commit took for the telemetry's
//! own task to map. The turn that committed it pays a copy and a queue
//! push, never the mapping or the export.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spool_journal::store::{BoxFuture, CallRef, Claim, ClaimKey};
use spool_journal::{Envelope, Event, Journal, JournalError, RunId, Seq};

use crate::export::Queue;

/// A journal, observed.
pub struct Observed {
    inner: Arc<dyn Journal>,
    commits: Arc<Queue<(Vec<Envelope>, Duration)>>,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed").finish_non_exhaustive()
    }
}

impl Observed {
    pub(crate) fn new(
        inner: Arc<dyn Journal>,
        commits: Arc<Queue<(Vec<Envelope>, Duration)>>,
    ) -> Self {
        Self { inner, commits }
    }
}

impl Journal for Observed {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(async move {
            let started = Instant::now();
            let appended = self.inner.append(run, expected, events).await;
            if let Ok(envelopes) = &appended {
                self.commits.push((envelopes.clone(), started.elapsed()));
            }
            appended
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        self.inner.claim(key, holder)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        self.inner.probe()
    }

    spool_journal::forward_journal_reads!(inner);
}
