//! A run's journal as `GET /runs/{id}/events` shows it: each recorded
//! event with its time and turn, and a call's completion with how long
//! the call took, its tokens and its cost.

use std::collections::HashMap;

use spool_journal::{Envelope, Event};
use spool_runtime::agent::Pricing;
use spool_wire::http::{JournalEntry, Usage};
use time::OffsetDateTime;

/// What timing a completion needs from the events before it: when the
/// open model call and each open tool call was requested, and the turn
/// under way. Fed every event from the start of the log, in order.
#[derive(Default)]
pub(crate) struct Timing {
    turn: Option<String>,
    model_requested: Option<OffsetDateTime>,
    tools_requested: HashMap<String, OffsetDateTime>,
}

impl Timing {
    /// `envelope` as an entry, timed against what came before it.
    pub(crate) fn entry(&mut self, envelope: &Envelope, pricing: Option<&Pricing>) -> JournalEntry {
        let at = envelope.recorded_at;
        let mut duration = None;
        let mut usage = None;
        let mut cost_usd = None;
        match &envelope.event {
            Event::TurnStarted(started) => self.turn = Some(started.turn_id.to_string()),
            Event::ModelCallRequested(_) => self.model_requested = Some(at),
            Event::ModelCallCompleted(completed) => {
                duration = self.model_requested.take().map(|from| millis(from, at));
                usage = completed.usage.map(|u| Usage {
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                });
                cost_usd = completed
                    .usage
                    .zip(pricing)
                    .map(|(u, p)| p.micro_usd(u.input_tokens, u.output_tokens) as f64 / 1e6);
            }
            Event::ToolCallRequested(requested) => {
                self.tools_requested.insert(requested.call_id.clone(), at);
            }
            Event::ToolCallCompleted(completed) => {
                duration = self
                    .tools_requested
                    .remove(&completed.call_id)
                    .map(|from| millis(from, at));
            }
            Event::ToolCallResolved(resolved) => {
                duration = self
                    .tools_requested
                    .remove(&resolved.call_id)
                    .map(|from| millis(from, at));
            }
            Event::ToolCallAbandoned(abandoned) => {
                self.tools_requested.remove(&abandoned.call_id);
            }
            _ => {}
        }
        // The payload as recorded: the tag says the kind already.
        let data = match serde_json::to_value(&envelope.event) {
            Ok(serde_json::Value::Object(mut tagged)) => {
                tagged.remove("payload").unwrap_or(serde_json::Value::Null)
            }
            _ => serde_json::Value::Null,
        };
        JournalEntry {
            seq: envelope.seq.0,
            kind: envelope.event.kind().to_owned(),
            time: envelope
                .recorded_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            turn_id: self.turn.clone(),
            duration_ms: duration,
            usage,
            cost_usd,
            data,
        }
    }
}

/// Whole milliseconds from `from` to `to`, never negative (clocks that
/// step back record a later event at an earlier time).
fn millis(from: OffsetDateTime, to: OffsetDateTime) -> u64 {
    u64::try_from((to - from).whole_milliseconds()).unwrap_or(0)
}
