//! `state.patch`: a run's state document (what `state.snapshot` answers)
//! followed event by event, each change sent as an RFC 6902 JSON Patch
//! from the document at one journal position to the document at the next.
//!
//! The patches are made from what changed, not by comparing whole
//! documents: the run's fields (`state`, `cursor`, `suspend`, …) are
//! compared one by one (a handful of small values), and the conversation
//! is append-only but for its pending tail and a clear (see
//! [`Conversation`]), so a patch costs what the event added, however long
//! the run.

use serde_json::{Map, Value, json};
use spool_journal::{Envelope, RunId};
use spool_runtime::view::{Conversation, Document};
use spool_wire::http::SnapshotReply;

/// A run's document as a subscriber was last sent it.
#[derive(Debug)]
pub struct Patcher {
    document: Document,
    /// What the subscriber holds: `None` before its first patch.
    shown: Option<Shown>,
}

/// The parts of a sent document a patch is made against.
#[derive(Debug)]
struct Shown {
    cursor: Option<u64>,
    /// The run's fields, `messages` aside.
    fields: Map<String, Value>,
    settled: usize,
    pending: usize,
    clears: u64,
}

/// One `state.patch`: the document at `from` (`None`: the empty document
/// `{}`) made into the document at `to` by `patch`.
#[derive(Clone, Debug, PartialEq)]
pub struct StatePatch {
    /// The position of the document the patch applies to.
    pub from: Option<u64>,
    /// The position of the document it makes.
    pub to: Option<u64>,
    /// The operations, in order.
    pub patch: Vec<Value>,
}

impl StatePatch {
    /// The notification's params: `{run_id, from, to, patch}`.
    #[must_use]
    pub fn params(&self, run: &RunId) -> Value {
        json!({"run_id": run.as_str(), "from": self.from, "to": self.to, "patch": self.patch})
    }
}

impl Patcher {
    /// A patcher for `run`, before its first event.
    #[must_use]
    pub fn new(run: &RunId) -> Self {
        Self {
            document: Document::new(run),
            shown: None,
        }
    }

    /// Folds an event the subscriber already has (at or before the cursor
    /// it resumes from): nothing is sent for it.
    pub fn skip(&mut self, envelope: &Envelope) {
        self.document.apply(envelope);
        self.shown = Some(self.current());
    }

    /// Folds the run's next event; the patch that brings the subscriber's
    /// document up to it, or `None` when the event changed nothing shown.
    pub fn apply(&mut self, envelope: &Envelope) -> Option<StatePatch> {
        self.document.apply(envelope);
        let next = self.current();
        let patch = match &self.shown {
            // The first document: the whole of it.
            None => vec![json!({"op": "replace", "path": "", "value": self.document_value()})],
            Some(shown) => self.diff(shown, &next),
        };
        let from = self.shown.as_ref().and_then(|s| s.cursor);
        let to = next.cursor;
        self.shown = Some(next);
        (!patch.is_empty()).then_some(StatePatch { from, to, patch })
    }

    /// The document as `state.snapshot` answers it.
    fn document_value(&self) -> Value {
        serde_json::to_value(SnapshotReply {
            run: spool_edge::tables::reply(&self.document.view()),
            messages: self.document.conversation().messages(),
        })
        .expect("a snapshot is plain JSON")
    }

    fn current(&self) -> Shown {
        let view = self.document.view();
        let Ok(Value::Object(fields)) = serde_json::to_value(spool_edge::tables::reply(&view))
        else {
            unreachable!("a run reply is a JSON object")
        };
        let conversation = self.document.conversation();
        Shown {
            cursor: view.cursor.map(|s| s.0),
            fields,
            settled: conversation.settled().len(),
            pending: conversation.pending().len(),
            clears: conversation.clears(),
        }
    }

    fn diff(&self, shown: &Shown, next: &Shown) -> Vec<Value> {
        let mut patch = Vec::new();
        for (key, value) in &next.fields {
            let path = format!("/{}", escape(key));
            match shown.fields.get(key) {
                None => patch.push(json!({"op": "add", "path": path, "value": value})),
                Some(old) if old != value => {
                    patch.push(json!({"op": "replace", "path": path, "value": value}));
                }
                Some(_) => {}
            }
        }
        for key in shown.fields.keys() {
            if !next.fields.contains_key(key) {
                patch.push(json!({"op": "remove", "path": format!("/{}", escape(key))}));
            }
        }
        messages_patch(self.document.conversation(), shown, next, &mut patch);
        patch
    }
}

/// The operations that bring `/messages` from `shown` to `next`.
fn messages_patch(
    conversation: &Conversation,
    shown: &Shown,
    next: &Shown,
    patch: &mut Vec<Value>,
) {
    // A clear started the conversation over.
    if next.clears != shown.clears || next.settled < shown.settled {
        patch.push(json!({"op": "replace", "path": "/messages", "value": conversation.messages()}));
        return;
    }
    if next.settled == shown.settled {
        // Only the pending tail can have grown.
        for message in conversation.pending().iter().skip(shown.pending) {
            patch.push(json!({"op": "add", "path": "/messages/-", "value": message}));
        }
        return;
    }
    // Settled messages were added: they go before the tail, so the tail
    // shown is taken off (from its end) and put back after them.
    for at in (shown.settled..shown.settled + shown.pending).rev() {
        patch.push(json!({"op": "remove", "path": format!("/messages/{at}")}));
    }
    for message in conversation
        .settled()
        .iter()
        .skip(shown.settled)
        .chain(conversation.pending())
    {
        patch.push(json!({"op": "add", "path": "/messages/-", "value": message}));
    }
}

/// A key as a JSON Pointer reference token (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};
    use spool_journal::{Envelope, RunId, Seq};

    use super::Patcher;

    fn envelope(run: &RunId, seq: u64, kind: &str, payload: Value) -> Envelope {
        Envelope {
            run_id: run.clone(),
            seq: Seq(seq),
            recorded_at: time::OffsetDateTime::UNIX_EPOCH,
            event: serde_json::from_value(json!({"kind": kind, "payload": payload})).unwrap(),
        }
    }

    #[test]
    fn input_steered_during_a_model_call_is_shown_last_then_moves_after_the_calls_answer() {
        let run = RunId::new("r").unwrap();
        let events = [
            envelope(&run, 0, "run_created", json!({})),
            envelope(
                &run,
                1,
                "turn_started",
                json!({"turn_id": "t1", "input": "hi", "policy": "steer"}),
            ),
            envelope(
                &run,
                2,
                "model_call_requested",
                json!({"request_hash": "h"}),
            ),
            envelope(
                &run,
                3,
                "input_steered",
                json!({"turn_id": "t1", "input": "and also"}),
            ),
            envelope(
                &run,
                4,
                "input_steered",
                json!({"turn_id": "t1", "input": "one more"}),
            ),
            envelope(
                &run,
                5,
                "model_call_completed",
                json!({"message": {"text": "Hello."}}),
            ),
            envelope(
                &run,
                6,
                "turn_completed",
                json!({"turn_id": "t1", "response": "Hello."}),
            ),
        ];
        let mut patcher = Patcher::new(&run);
        let mut document = json!({});
        let mut whole = spool_runtime::view::Document::new(&run);
        for event in &events {
            whole.apply(event);
            if let Some(patch) = patcher.apply(event) {
                let patch: json_patch::Patch =
                    serde_json::from_value(Value::Array(patch.patch)).unwrap();
                json_patch::patch(&mut document, &patch).unwrap();
            }
            assert_eq!(
                document["messages"],
                json!(whole.conversation().messages()),
                "at {}",
                event.seq
            );
        }
        let texts: Vec<&str> = document["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["hi", "Hello.", "and also", "one more"]);
    }
}
