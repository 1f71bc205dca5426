//! A run's journal as `GET /runs/{id}/events` shows it: each timed event
//! the runtime reads ([`spool_runtime::activity::timing`]) in the wire's
//! shape, its payload as recorded.

use spool_runtime::activity::timing::TimedEvent;
use spool_wire::http::{JournalEntry, Usage};

/// `timed` as the wire's entry.
pub(crate) fn entry(timed: TimedEvent) -> JournalEntry {
    let envelope = timed.envelope;
    // The payload as recorded: the entry's `kind` names it already.
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
        turn_id: timed.turn.map(|turn| turn.to_string()),
        duration_ms: timed
            .duration
            .map(|d| u64::try_from(d.whole_milliseconds()).unwrap_or(0)),
        usage: timed.usage.map(|u| Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
        }),
        cost_usd: timed.cost_micro_usd.map(usd),
        data,
    }
}

/// Micro-dollars in dollars, as the wire writes a cost.
pub(crate) fn usd(micro: u64) -> f64 {
    micro as f64 / 1e6
}
