//! Shared helpers: envelopes at fixed times, and events in few words.

use serde_json::{Value, json};
use spool_journal::event::*;
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_wire::run::{SuspendKind, TurnPolicy};
use time::OffsetDateTime;

pub(crate) fn run(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

pub(crate) fn turn(name: &str) -> TurnId {
    TurnId::new(name).unwrap()
}

/// A log of `events` for run `r`, at positions from `from`.
pub(crate) fn log(r: &str, from: u64, events: Vec<Event>) -> Vec<Envelope> {
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Envelope {
            run_id: run(r),
            seq: Seq(from + i as u64),
            recorded_at: OffsetDateTime::UNIX_EPOCH
                + time::Duration::seconds(from as i64 + i as i64),
            event,
        })
        .collect()
}

pub(crate) fn created() -> Event {
    Event::RunCreated(RunCreated::default())
}

pub(crate) fn started(t: &str, input: &str) -> Event {
    Event::TurnStarted(TurnStarted {
        turn_id: turn(t),
        input: input.into(),
        context: vec![],
        policy: TurnPolicy::Steer,
        from_queue: None,
        operation_id: None,
    })
}

pub(crate) fn model_requested(hash: &str) -> Event {
    Event::ModelCallRequested(ModelCallRequested {
        request_hash: hash.into(),
        new_messages: vec![],
    })
}

pub(crate) fn model_completed(message: Value, input_tokens: u64) -> Event {
    Event::ModelCallCompleted(ModelCallCompleted {
        message: message.into(),
        usage: Some(Usage {
            input_tokens,
            output_tokens: 1,
        }),
        finish_reason: None,
    })
}

pub(crate) fn tool_call(call_id: &str, effect: Effect, key: Option<&str>) -> ToolCallRequested {
    ToolCallRequested {
        call_id: call_id.into(),
        tool: "deploy".into(),
        input: json!({"env": "staging"}),
        effect,
        idempotency_key: key.map(str::to_owned),
    }
}

pub(crate) fn tool_done(call_id: &str, output: Value) -> Event {
    Event::ToolCallCompleted(ToolCallCompleted {
        call_id: call_id.into(),
        output: output.into(),
    })
}

pub(crate) fn suspended(t: &str, kind: SuspendKind, prompt: &str) -> Suspended {
    Suspended {
        turn_id: turn(t),
        kind,
        prompt: prompt.into(),
        call_id: None,
        input_schema: None,
        options: None,
    }
}

pub(crate) fn turn_done(t: &str, response: &str) -> Event {
    Event::TurnCompleted(TurnCompleted {
        turn_id: turn(t),
        response: Some(response.into()),
        usage: None,
    })
}
