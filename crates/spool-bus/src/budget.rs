//! The instance budget: a USD cap on what every turn delegated to this
//! instance costs together. A delegated turn reserves the most one turn
//! may cost (the agent's `budgets.cost_usd`) before it starts, under one
//! lock, so delegations arriving together cannot pass the cap between
//! them; when the turn ends the reservation is replaced by what the run
//! has really cost, priced from its recorded usage.
//!
//! What was spent is read back from the journal at start (every run a
//! bus caller created), so a restart does not reset it. A turn that
//! crosses its own `cost_usd` parks at the next model call; that call may
//! take it past the reservation by what one call costs, which is the
//! bound of this cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use spool_journal::RunId;
use spool_runtime::agent::Pricing;
use spool_runtime::{Runtime, RuntimeError};

use crate::server::AUTHENTICATOR;

/// The cap, what one turn reserves, and the prices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Every delegated turn's cost together, in micro-USD.
    pub cap_micro_usd: u64,
    /// What one turn reserves before it starts, in micro-USD.
    pub turn_micro_usd: u64,
    /// What tokens cost.
    pub pricing: Pricing,
}

/// The instance budget's account.
#[derive(Debug)]
pub struct Ledger {
    limits: Limits,
    state: Mutex<Account>,
}

#[derive(Debug, Default)]
struct Account {
    /// What each delegated run has cost so far, as last settled.
    runs: HashMap<RunId, u64>,
    /// Their sum.
    spent: u64,
    /// Held by turns that have not ended.
    reserved: u64,
}

/// A turn's hold on the budget; given back when dropped unless settled.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Ledger>,
    amount: u64,
}

impl Ledger {
    /// An account with nothing spent.
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(Account::default()),
        })
    }

    /// An account holding what `runtime`'s delegated runs have cost.
    ///
    /// # Errors
    ///
    /// When the journal cannot list or read its runs.
    pub async fn load(limits: Limits, runtime: &Runtime) -> Result<Arc<Self>, RuntimeError> {
        let ledger = Self::new(limits);
        for summary in runtime.list().await? {
            let delegated = runtime
                .owner(&summary.run_id)
                .await?
                .is_some_and(|p| p.authenticator == AUTHENTICATOR);
            if delegated {
                let usage = runtime.usage(&summary.run_id).await?;
                ledger.record(&summary.run_id, usage);
            }
        }
        Ok(ledger)
    }

    /// Spent and reserved, in micro-USD.
    #[must_use]
    pub fn totals(&self) -> (u64, u64) {
        let account = self.lock();
        (account.spent, account.reserved)
    }

    /// Holds one turn's most before it starts.
    ///
    /// # Errors
    ///
    /// What is spent and held when one more turn would pass the cap.
    pub fn reserve(self: &Arc<Self>) -> Result<Reservation, String> {
        let mut account = self.lock();
        let amount = self.limits.turn_micro_usd;
        let after = account
            .spent
            .saturating_add(account.reserved)
            .saturating_add(amount);
        if after > self.limits.cap_micro_usd {
            return Err(format!(
                "the instance budget of {} USD is spent: {} USD spent, {} USD held by turns running, and a turn may cost {} USD",
                usd(self.limits.cap_micro_usd),
                usd(account.spent),
                usd(account.reserved),
                usd(amount)
            ));
        }
        account.reserved += amount;
        Ok(Reservation {
            ledger: Arc::clone(self),
            amount,
        })
    }

    /// Sets what `run` has cost to what `usage` costs.
    pub fn record(&self, run: &RunId, usage: spool_journal::event::Usage) {
        let cost = self
            .limits
            .pricing
            .micro_usd(usage.input_tokens, usage.output_tokens);
        let mut account = self.lock();
        let before = account.runs.insert(run.clone(), cost).unwrap_or(0);
        account.spent = account.spent.saturating_sub(before).saturating_add(cost);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Account> {
        // The account is two sums and a map, each update whole under the
        // lock: a panic elsewhere cannot leave it half-changed.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Reservation {
    /// The turn ended: its hold is replaced by what `run` has cost.
    pub fn settle(self, run: &RunId, usage: spool_journal::event::Usage) {
        self.ledger.record(run, usage);
        // Dropping gives the hold back.
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut account = self.ledger.lock();
        account.reserved = account.reserved.saturating_sub(self.amount);
    }
}

/// Micro-USD as USD, for messages.
fn usd(micro: u64) -> String {
    format!("{:.6}", micro as f64 / 1e6)
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cap_micro_usd: 1_000,
            turn_micro_usd: 400,
            pricing: Pricing {
                input_per_million: 1.0,
                output_per_million: 1.0,
            },
        }
    }

    #[test]
    fn reservations_past_the_cap_are_refused_until_one_is_given_back() {
        let ledger = Ledger::new(limits());
        let first = ledger.reserve().unwrap();
        let _second = ledger.reserve().unwrap();
        let refused = ledger.reserve().unwrap_err();
        assert!(refused.contains("0.0008 USD held"), "{refused}");
        drop(first);
        assert!(ledger.reserve().is_ok());
    }

    #[test]
    fn settling_replaces_the_hold_with_the_runs_cost() {
        let ledger = Ledger::new(limits());
        let run = RunId::new("run_a").unwrap();
        let usage = |tokens| spool_journal::event::Usage {
            input_tokens: tokens,
            output_tokens: 0,
        };
        ledger.reserve().unwrap().settle(&run, usage(100));
        assert_eq!(ledger.totals(), (100, 0));
        // The same run settled again counts its cost once, as it is now.
        ledger.reserve().unwrap().settle(&run, usage(250));
        assert_eq!(ledger.totals(), (250, 0));
    }
}
