//! A run's recorded events with their timing: the turn each belongs to,
//! and on a model or tool call's completion how long the call took since
//! its request was recorded, with a model call's tokens and cost. What a
//! journal view shows (the HTTP channel's `GET /runs/{id}/events`).

use std::collections::HashMap;

use spool_journal::event::Usage;
use spool_journal::{Envelope, Event, TurnId};
use time::OffsetDateTime;

use crate::agent::Pricing;

/// One recorded event, timed against the events before it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TimedEvent {
    /// The event as recorded.
    pub envelope: Envelope,
    /// The turn under way when it was recorded.
    pub turn: Option<TurnId>,
    /// For a model or tool call's completion: the time since its request
    /// was recorded (never negative).
    pub duration: Option<time::Duration>,
    /// For a model call's completion: the tokens it used.
    pub usage: Option<Usage>,
    /// For a model call's completion: what its tokens cost in
    /// micro-dollars, under the runtime's pricing.
    pub cost_micro_usd: Option<u64>,
}

/// What timing a completion needs from the events before it: when the
/// open model call and each open tool call was requested, and the turn
/// under way. Fed every event from the start of the log, in order.
#[derive(Default)]
pub(crate) struct Timing {
    turn: Option<TurnId>,
    model_requested: Option<OffsetDateTime>,
    tools_requested: HashMap<String, OffsetDateTime>,
}

impl Timing {
    /// `envelope`, timed against what came before it.
    pub(crate) fn time(&mut self, envelope: Envelope, pricing: Option<&Pricing>) -> TimedEvent {
        let at = envelope.recorded_at;
        let since = |from: OffsetDateTime| (at - from).max(time::Duration::ZERO);
        let mut duration = None;
        let mut usage = None;
        match &envelope.event {
            Event::TurnStarted(started) => self.turn = Some(started.turn_id.clone()),
            Event::ModelCallRequested(_) => self.model_requested = Some(at),
            Event::ModelCallCompleted(completed) => {
                duration = self.model_requested.take().map(since);
                usage = completed.usage;
            }
            Event::ToolCallRequested(requested) => {
                self.tools_requested.insert(requested.call_id.clone(), at);
            }
            Event::ToolCallCompleted(completed) => {
                duration = self.tools_requested.remove(&completed.call_id).map(since);
            }
            Event::ToolCallResolved(resolved) => {
                duration = self.tools_requested.remove(&resolved.call_id).map(since);
            }
            Event::ToolCallAbandoned(abandoned) => {
                self.tools_requested.remove(&abandoned.call_id);
            }
            _ => {}
        }
        TimedEvent {
            turn: self.turn.clone(),
            duration,
            cost_micro_usd: usage
                .zip(pricing)
                .map(|(u, p)| p.micro_usd(u.input_tokens, u.output_tokens)),
            usage,
            envelope,
        }
    }
}
