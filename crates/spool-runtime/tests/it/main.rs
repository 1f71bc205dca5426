//! The runtime's integration tests: turns, tools, suspension, policies,
//! cancellation, the event hub, recovery after a crash, and concurrency.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod agent;
mod approval;
mod budgets;
mod cancel_safe;
mod channels;
mod concurrency;
mod deletion;
mod first_wins;
mod forks;
mod gate;
mod hub;
mod incremental;
mod keys;
mod lifecycle;
mod limits;
mod recovery;
mod schedules;
mod steering;
mod storage;
mod supervision;
mod support;
mod turns;
mod upgrades;
