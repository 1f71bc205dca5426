//! Budgets: what a turn may spend before it waits for an operator, checked
//! before each new model call from what the turn recorded.

use spool_journal::event::{BudgetExceeded, Usage};
use spool_journal::{Envelope, Event, TurnId};

use spool_wire::run::Budget;

use crate::agent::{Budgets, Pricing};

/// The budgets this runtime checks, in the order it checks them.
const CHECKED: [Budget; 4] = [
    Budget::StepsPerTurn,
    Budget::Tokens,
    Budget::WallSeconds,
    Budget::CostMicroUsd,
];

/// A budget's configured limit.
fn limit(budget: &Budget, budgets: &Budgets) -> Option<u64> {
    match budget {
        Budget::StepsPerTurn => budgets.steps_per_turn,
        Budget::Tokens => budgets.tokens,
        Budget::WallSeconds => budgets.wall_seconds,
        Budget::CostMicroUsd => budgets.cost_micro_usd(),
        // A budget a newer Spool recorded has no limit here.
        Budget::Unknown(_) => None,
    }
}

/// What the budgets say about one more model call.
pub(crate) enum Verdict {
    Within,
    /// A budget is used up: park the run.
    Exceeded(BudgetExceeded),
    /// An operator refused to extend a used-up budget: end the turn.
    Refused(String),
}

/// Checks the budgets against the current turn's recorded events (from its
/// `turn_started` on). An approving answer to a `budget_exceeded` raises
/// that budget to what was used plus its limit again; a rejecting one
/// refuses.
pub(crate) fn verdict(
    budgets: &Budgets,
    pricing: Option<&Pricing>,
    turn_log: &[Envelope],
    turn: &TurnId,
) -> Verdict {
    let mut limits = CHECKED.map(|budget| {
        let limit = limit(&budget, budgets);
        (budget, limit)
    });
    let mut last: Option<&BudgetExceeded> = None;
    for envelope in turn_log {
        match &envelope.event {
            Event::BudgetExceeded(exceeded) => last = Some(exceeded),
            Event::Resumed(resumed) if &resumed.turn_id == turn => {
                if let Some(exceeded) = last.take() {
                    if resumed.answers.iter().any(|a| a.approved == Some(false)) {
                        return Verdict::Refused(format!(
                            "the {} budget ({}) was used up and an operator declined to extend it",
                            exceeded.budget, exceeded.limit
                        ));
                    }
                    for (budget, limit) in &mut limits {
                        if *budget == exceeded.budget {
                            let base = limit.unwrap_or(exceeded.limit);
                            *limit = Some(exceeded.used.saturating_add(base));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let Some(start) = turn_log.first() else {
        return Verdict::Within;
    };
    let mut steps = 0u64;
    let mut spent = Usage::default();
    for envelope in turn_log {
        match &envelope.event {
            Event::ModelCallRequested(_) => steps += 1,
            Event::ModelCallCompleted(done) => {
                if let Some(usage) = done.usage {
                    spent += usage;
                }
            }
            _ => {}
        }
    }
    for (budget, limit) in limits {
        let Some(limit) = limit else { continue };
        let used = match budget {
            Budget::StepsPerTurn => steps,
            Budget::Tokens => spent.input_tokens.saturating_add(spent.output_tokens),
            Budget::CostMicroUsd => {
                pricing.map_or(0, |p| p.micro_usd(spent.input_tokens, spent.output_tokens))
            }
            Budget::WallSeconds => (time::OffsetDateTime::now_utc() - start.recorded_at)
                .whole_seconds()
                .max(0) as u64,
            // Not among the budgets checked here.
            Budget::Unknown(_) => continue,
        };
        if used >= limit {
            return Verdict::Exceeded(BudgetExceeded {
                budget,
                limit,
                used,
            });
        }
    }
    Verdict::Within
}
