//! The memory store: the `Journal` contract without durability, for tests
//! and for hosts that keep nothing across restarts. It stores the same
//! bytes and chain hashes as the durable stores and verifies them on read.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

use super::{
    BoxFuture, CallRef, Claim, ClaimDecision, ClaimKey, ClaimRow, Clock, Deletion, Head,
    IndexChange, Journal, JournalError, Row, RunSummary, Tombstone, Watchers, decide_claim,
    decode_row, plan, system_clock,
};
use crate::chain::{GENESIS, Verifier};
use crate::event::{Envelope, Event};
use crate::id::{Address, Principal, RunId, Seq};

/// A journal held in memory.
pub struct MemoryJournal {
    inner: Mutex<Inner>,
    watchers: Watchers,
    clock: Clock,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<RunId, (Head, Vec<Row>)>,
    addresses: HashMap<Address, RunId>,
    operations: HashMap<(String, String), RunId>,
    claims: HashMap<ClaimKey, ClaimRow>,
    claimed_calls: HashMap<CallRef, ClaimKey>,
    tombstones: HashMap<RunId, Tombstone>,
    definitions: HashMap<String, serde_json::Value>,
}

impl std::fmt::Debug for MemoryJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJournal").finish_non_exhaustive()
    }
}

impl Default for MemoryJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryJournal {
    /// An empty journal on the system clock.
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(system_clock())
    }

    /// An empty journal on `clock`.
    #[must_use]
    pub fn with_clock(clock: Clock) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            watchers: Watchers::default(),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every mutation below is planned before anything is changed, so a
        // panic elsewhere cannot leave the maps half-updated.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Overwrites a stored row's bytes, keeping its hash: what a torn or
    /// tampered write looks like. For conformance tests only.
    #[cfg(feature = "conformance")]
    pub fn tamper(&self, run: &RunId, seq: Seq, bytes: Vec<u8>) {
        let mut inner = self.lock();
        if let Some(row) = inner
            .runs
            .get_mut(run)
            .and_then(|(_, rows)| rows.get_mut(usize::try_from(seq.0).unwrap_or(usize::MAX)))
        {
            row.bytes = bytes;
        }
    }

    fn append_now(
        &self,
        run: &RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> Result<(Vec<Envelope>, Seq), JournalError> {
        let mut inner = self.lock();
        if inner.tombstones.contains_key(run) {
            return Err(JournalError::RunDeleted { run: run.clone() });
        }
        let plan = plan(
            run,
            inner.runs.get(run).map(|(head, _)| head),
            expected,
            events,
            (self.clock)(),
        )?;
        // Check every index change before making any: an unbind only ever
        // releases this run's own names, so the checks do not depend on
        // their order.
        for change in &plan.changes {
            match change {
                IndexChange::Bind(address) => {
                    if let Some(owner) = inner.addresses.get(address).filter(|owner| *owner != run)
                    {
                        return Err(JournalError::AddressTaken {
                            address: address.clone(),
                            run: owner.clone(),
                        });
                    }
                }
                IndexChange::Operation {
                    scope,
                    operation_id,
                } => {
                    let key = (scope.clone(), operation_id.clone());
                    if let Some(owner) = inner.operations.get(&key).filter(|owner| *owner != run) {
                        return Err(JournalError::OperationTaken {
                            operation_id: operation_id.clone(),
                            run: owner.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        for change in plan.changes {
            match change {
                IndexChange::Bind(address) => {
                    inner.addresses.insert(address, run.clone());
                }
                IndexChange::Unbind(address) => {
                    if inner.addresses.get(&address) == Some(run) {
                        inner.addresses.remove(&address);
                    }
                }
                IndexChange::UnbindAll => inner.addresses.retain(|_, owner| owner != run),
                IndexChange::UnbindNamespace(namespace) => inner
                    .addresses
                    .retain(|address, owner| owner != run || address.namespace != namespace),
                IndexChange::Operation {
                    scope,
                    operation_id,
                } => {
                    inner.operations.insert((scope, operation_id), run.clone());
                }
                IndexChange::Settle {
                    call_id,
                    output,
                    seq,
                } => {
                    let call = CallRef {
                        run: run.clone(),
                        call_id,
                    };
                    if let Some(key) = inner.claimed_calls.get(&call).cloned()
                        && let Some(claim) = inner.claims.get_mut(&key)
                    {
                        claim
                            .settled
                            .get_or_insert_with(|| (std::sync::Arc::unwrap_or_clone(output), seq));
                    }
                }
                IndexChange::Release { call_id } => {
                    let call = CallRef {
                        run: run.clone(),
                        call_id,
                    };
                    if let Some(key) = inner.claimed_calls.remove(&call)
                        && inner.claims.get(&key).is_some_and(|c| c.settled.is_none())
                    {
                        inner.claims.remove(&key);
                    }
                }
            }
        }
        let next = plan.head.next_seq;
        let entry = inner
            .runs
            .entry(run.clone())
            .or_insert_with(|| (plan.head.clone(), Vec::new()));
        entry.0 = plan.head;
        entry.1.extend(plan.rows);
        Ok((plan.envelopes, next))
    }

    fn delete_now(&self, run: &RunId, deletion: Deletion) -> Result<Tombstone, JournalError> {
        let mut inner = self.lock();
        if let Some(tombstone) = inner.tombstones.get(run) {
            return Ok(tombstone.clone());
        }
        let Some((head, _)) = inner.runs.get(run) else {
            return Err(JournalError::NoSuchRun { run: run.clone() });
        };
        deletion.check(run, head.next_seq)?;
        let events = head.next_seq.0;
        inner.runs.remove(run);
        inner.addresses.retain(|_, owner| owner != run);
        inner.operations.retain(|_, owner| owner != run);
        let held: Vec<CallRef> = inner
            .claimed_calls
            .keys()
            .filter(|call| &call.run == run)
            .cloned()
            .collect();
        for call in held {
            if let Some(key) = inner.claimed_calls.remove(&call) {
                inner.claims.remove(&key);
            }
        }
        let tombstone = Tombstone {
            run_id: run.clone(),
            deleted_at: (self.clock)(),
            by: deletion.by,
            reason: deletion.reason,
            events,
        };
        inner.tombstones.insert(run.clone(), tombstone.clone());
        Ok(tombstone)
    }

    fn read_now(&self, run: &RunId, from: Seq) -> Result<Vec<Envelope>, JournalError> {
        let (rows, prev) = {
            let inner = self.lock();
            let Some((_, rows)) = inner.runs.get(run) else {
                return Ok(Vec::new());
            };
            let start = usize::try_from(from.0)
                .unwrap_or(usize::MAX)
                .min(rows.len());
            let prev = if start == 0 {
                GENESIS
            } else {
                rows[start - 1].hash
            };
            (rows[start..].to_vec(), prev)
        };
        let mut verifier = Verifier::new(run.clone(), from, prev);
        rows.iter()
            .map(|row| {
                verifier.check(row.seq, &row.bytes, &row.hash)?;
                decode_row(run, row.seq, &row.bytes)
            })
            .collect()
    }
}

impl Journal for MemoryJournal {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(async move {
            let (envelopes, next) = self.append_now(run, expected, events)?;
            self.watchers.notify(run, next);
            Ok(envelopes)
        })
    }

    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: Seq,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(async move { self.read_now(run, from) })
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        Box::pin(async move {
            let inner = self.lock();
            let mut runs: Vec<RunSummary> = inner
                .runs
                .iter()
                .map(|(run, (head, _))| head.clone().into_summary(run.clone()))
                .collect();
            super::newest_first(&mut runs);
            Ok(runs)
        })
    }

    fn addresses(&self) -> BoxFuture<'_, Result<Vec<(Address, RunId)>, JournalError>> {
        Box::pin(async move {
            Ok(self
                .lock()
                .addresses
                .iter()
                .map(|(address, run)| (address.clone(), run.clone()))
                .collect())
        })
    }

    fn find_address<'a>(
        &'a self,
        address: &'a Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        Box::pin(async move { Ok(self.lock().addresses.get(address).cloned()) })
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        Box::pin(async move {
            let key = (principal.scope(), operation_id.to_owned());
            Ok(self.lock().operations.get(&key).cloned())
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            match decide_claim(inner.claims.get(key).cloned(), holder) {
                ClaimDecision::Take => {
                    inner.claims.insert(
                        key.clone(),
                        ClaimRow {
                            holder: holder.clone(),
                            settled: None,
                        },
                    );
                    inner.claimed_calls.insert(holder.clone(), key.clone());
                    Ok(Claim::Won)
                }
                ClaimDecision::Answer(answer) => {
                    answer.map_err(|by| JournalError::CallInFlight { by })
                }
            }
        })
    }

    fn delete<'a>(
        &'a self,
        run: &'a RunId,
        deletion: Deletion,
    ) -> BoxFuture<'a, Result<Tombstone, JournalError>> {
        Box::pin(async move {
            let tombstone = self.delete_now(run, deletion)?;
            self.watchers.close(run);
            Ok(tombstone)
        })
    }

    fn tombstone<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, JournalError>> {
        Box::pin(async move { Ok(self.lock().tombstones.get(run).cloned()) })
    }

    fn keep_definition<'a>(
        &'a self,
        digest: &'a str,
        document: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async move {
            self.lock()
                .definitions
                .entry(digest.to_owned())
                .or_insert_with(|| document.clone());
            Ok(())
        })
    }

    fn definition<'a>(
        &'a self,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, JournalError>> {
        Box::pin(async move { Ok(self.lock().definitions.get(digest).cloned()) })
    }

    fn subscribe<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<watch::Receiver<Seq>, JournalError>> {
        Box::pin(async move {
            let receiver = self.watchers.register(run);
            let next = self
                .lock()
                .runs
                .get(run)
                .map_or(Seq(0), |(head, _)| head.next_seq);
            self.watchers.advance(run, next);
            Ok(receiver)
        })
    }
}
