//! The replay cursor: walks a recorded turn in step with the runtime's
//! requests and answers each with the recorded result, or with a permit to
//! act live once the record runs out.
//!
//! A [`Permit`] can only be made here, so code that is replaying cannot
//! act: a tool runs only when the cursor hands out a permit for it. A
//! request that differs from the record is a [`Divergence`] with both
//! sides, never papered over. A call the record shows was requested but
//! never completed is classified by its effect: a `read` is done again, an
//! `idempotent` call is retried under its recorded key, and a `write` needs
//! an operator ([`ToolStep::NeedsReconciliation`]).
//!
//! ```
//! use serde_json::json;
//! use spool_journal::cursor::{ModelStep, ReplayCursor};
//! use spool_journal::event::{Envelope, Event, ModelCallCompleted, ModelCallRequested};
//! use spool_journal::id::{RunId, Seq};
//!
//! let run = RunId::new("r1").unwrap();
//! let at = |seq, event| Envelope { run_id: run.clone(), seq: Seq(seq), recorded_at: time::OffsetDateTime::UNIX_EPOCH, event };
//! let log = vec![
//!     at(1, Event::ModelCallRequested(ModelCallRequested { request_hash: "sha256:aa".into(), new_messages: vec![] })),
//!     at(2, Event::ModelCallCompleted(ModelCallCompleted { message: json!("hi").into(), usage: None, finish_reason: None })),
//! ];
//! let mut cursor = ReplayCursor::new(log, Seq(3));
//! let ModelStep::Replayed(done) = cursor.model_call("sha256:aa").unwrap() else { panic!() };
//! assert_eq!(*done.message, json!("hi"));
//! // The record is exhausted: the next call is live, and only now may act.
//! let ModelStep::Live(permit) = cursor.model_call("sha256:bb").unwrap() else { panic!() };
//! assert!(!permit.intent_recorded());
//! ```

use serde_json::Value;

use crate::event::{
    Effect, Envelope, Event, ModelCallCompleted, ModelCallRequested, Resumed, SleepStarted,
    Suspended, ToolCallAbandoned, ToolCallRequested,
};
use crate::id::Seq;

/// Leave to act live. Only the cursor makes one: its fields are private and
/// it has no constructor, so code outside this module cannot forge one.
///
/// ```compile_fail
/// let forged = spool_journal::cursor::Permit { intent_recorded: false, intent_seq: None };
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Permit {
    intent_recorded: bool,
    intent_seq: Option<Seq>,
}

impl Permit {
    /// Whether the intent is already durable (a dangling call being done
    /// again): the runtime must not record it a second time.
    #[must_use]
    pub fn intent_recorded(&self) -> bool {
        self.intent_recorded
    }

    /// Where the intent was recorded, when it was.
    #[must_use]
    pub fn intent_seq(&self) -> Option<Seq> {
        self.intent_seq
    }
}

/// A recorded request that is not the one the runtime made now.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "replay diverged at seq {seq}: the log records {recorded}, the run now asks for {requested}"
)]
pub struct Divergence {
    /// Where the record and the request part.
    pub seq: Seq,
    /// What the log holds there.
    pub recorded: String,
    /// What was asked for.
    pub requested: String,
}

/// The answer to a model call.
#[derive(Debug, PartialEq)]
pub enum ModelStep {
    /// The recorded completion.
    Replayed(ModelCallCompleted),
    /// Call the model.
    Live(Permit),
}

/// The answer to a tool call.
#[derive(Debug, PartialEq)]
pub enum ToolStep {
    /// The recorded output (a completion, or an operator's resolution).
    Replayed(Value),
    /// An operator gave the call up.
    Abandoned(ToolCallAbandoned),
    /// Run the tool (again, for a dangling `read`).
    Live(Permit),
    /// A dangling `idempotent` call: run it again under this key.
    Retry {
        /// The permit.
        permit: Permit,
        /// The recorded idempotency key.
        key: Option<String>,
    },
    /// A dangling `write`: it may or may not have happened, so it must not
    /// be run blind.
    NeedsReconciliation {
        /// Where the intent was recorded.
        seq: Seq,
        /// The recorded intent.
        evidence: ToolCallRequested,
        /// Whether the run was already parked for it (a `reconciliation`
        /// suspension is recorded): the runtime must not park it twice.
        parked: bool,
    },
}

/// The answer to a suspension.
#[derive(Debug, PartialEq)]
pub enum SuspendStep {
    /// The recorded answer.
    Replayed(Resumed),
    /// Recorded and still unanswered: the run stays parked.
    Parked,
    /// Record the suspension.
    Live(Permit),
}

/// The answer to a sleep.
#[derive(Debug, PartialEq)]
pub enum SleepStep {
    /// The recorded wake-up; `early`: when it came before its time.
    Woke {
        /// When the sleep was ended early, if it was.
        early: Option<time::OffsetDateTime>,
    },
    /// Recorded and not yet woken: the run stays parked until this record's
    /// `wake_at`.
    Sleeping(SleepStarted),
    /// Record the sleep.
    Live(Permit),
}

/// Walks a recorded turn.
#[derive(Debug)]
pub struct ReplayCursor {
    log: Vec<Envelope>,
    pos: usize,
}

impl ReplayCursor {
    /// A cursor over the recorded events of a turn, in order (everything
    /// after its `turn_started`). `_next_seq` is where live appends go.
    #[must_use]
    pub fn new(log: Vec<Envelope>, _next_seq: Seq) -> Self {
        Self { log, pos: 0 }
    }

    /// Where the next recorded action is, if any: events before it belong
    /// to the step being replayed (steered input picked up for a model
    /// call, say).
    #[must_use]
    pub fn next_action_seq(&self) -> Option<Seq> {
        self.next_action().map(|at| self.log[at].seq)
    }

    /// Whether every recorded action has been replayed.
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        self.next_action().is_none()
    }

    /// The runtime is about to call the model with the request hashing to
    /// `request_hash`.
    ///
    /// # Errors
    ///
    /// [`Divergence`] when the record holds another action here.
    pub fn model_call(&mut self, request_hash: &str) -> Result<ModelStep, Divergence> {
        let Some(at) = self.next_action() else {
            return Ok(ModelStep::Live(fresh()));
        };
        match &self.log[at].event {
            Event::ModelCallRequested(recorded) if recorded.request_hash == request_hash => {
                let seq = self.log[at].seq;
                self.pos = at + 1;
                match self.take_completion(|e| matches!(e, Event::ModelCallCompleted(_))) {
                    Some(Event::ModelCallCompleted(done)) => Ok(ModelStep::Replayed(done)),
                    // A model call has no effect: a dangling one is made
                    // again, under the intent already recorded.
                    _ => Ok(ModelStep::Live(recorded_at(seq))),
                }
            }
            _ => Err(self.diverged(at, format!("model call {request_hash}"))),
        }
    }

    /// The runtime is about to call a tool. The call matches the record by
    /// tool, input, effect and idempotency key.
    ///
    /// # Errors
    ///
    /// [`Divergence`] when the record holds another action here.
    pub fn tool_call(&mut self, request: &ToolCallRequested) -> Result<ToolStep, Divergence> {
        let Some(at) = self.next_action() else {
            return Ok(ToolStep::Live(fresh()));
        };
        let recorded = match &self.log[at].event {
            Event::ToolCallRequested(recorded)
                if recorded.tool == request.tool
                    && recorded.input == request.input
                    && recorded.effect == request.effect
                    && recorded.idempotency_key == request.idempotency_key =>
            {
                recorded.clone()
            }
            _ => {
                return Err(self.diverged(
                    at,
                    format!(
                        "tool call {} {}",
                        request.tool,
                        crate::canonical(&request.input)
                    ),
                ));
            }
        };
        let seq = self.log[at].seq;
        self.pos = at + 1;
        let call_id = recorded.call_id.clone();
        // A dangling write parks the run with a reconciliation suspension
        // for this very call; the operator's resolution comes after it, and
        // both belong to this step.
        let parked = self.skip_reconciliation(&call_id);
        let completion = self.take_completion(|e| match e {
            Event::ToolCallCompleted(c) => c.call_id == call_id,
            Event::ToolCallResolved(r) => r.call_id == call_id,
            Event::ToolCallAbandoned(a) => a.call_id == call_id,
            _ => false,
        });
        Ok(match completion {
            Some(Event::ToolCallCompleted(done)) => {
                ToolStep::Replayed(std::sync::Arc::unwrap_or_clone(done.output))
            }
            Some(Event::ToolCallResolved(resolved)) => {
                ToolStep::Replayed(std::sync::Arc::unwrap_or_clone(resolved.output))
            }
            Some(Event::ToolCallAbandoned(abandoned)) => ToolStep::Abandoned(abandoned),
            _ => match recorded.effect {
                Effect::Read => ToolStep::Live(recorded_at(seq)),
                Effect::Idempotent => ToolStep::Retry {
                    permit: recorded_at(seq),
                    key: recorded.idempotency_key,
                },
                Effect::Write => ToolStep::NeedsReconciliation {
                    seq,
                    evidence: recorded,
                    parked,
                },
            },
        })
    }

    /// The runtime is about to park the run for an answer. Matches the
    /// record by kind, prompt and call id.
    ///
    /// # Errors
    ///
    /// [`Divergence`] when the record holds another action here.
    pub fn suspend(&mut self, request: &Suspended) -> Result<SuspendStep, Divergence> {
        let Some(at) = self.next_action() else {
            return Ok(SuspendStep::Live(fresh()));
        };
        match &self.log[at].event {
            Event::Suspended(recorded)
                if recorded.kind == request.kind
                    && recorded.prompt == request.prompt
                    && recorded.call_id == request.call_id =>
            {
                self.pos = at + 1;
                match self.take_completion(|e| matches!(e, Event::Resumed(_))) {
                    Some(Event::Resumed(resumed)) => Ok(SuspendStep::Replayed(resumed)),
                    _ => Ok(SuspendStep::Parked),
                }
            }
            _ => Err(self.diverged(
                at,
                format!("suspension ({}) {:?}", request.kind, request.prompt),
            )),
        }
    }

    /// The runtime is about to park the run until an instant, for the tool
    /// call `call_id`.
    ///
    /// # Errors
    ///
    /// [`Divergence`] when the record holds another action here.
    pub fn sleep(&mut self, call_id: &str) -> Result<SleepStep, Divergence> {
        let Some(at) = self.next_action() else {
            return Ok(SleepStep::Live(fresh()));
        };
        match &self.log[at].event {
            Event::SleepStarted(recorded) if recorded.call_id == call_id => {
                let recorded = recorded.clone();
                self.pos = at + 1;
                match self.take_completion(
                    |e| matches!(e, Event::SleepCompleted(c) if c.call_id == call_id),
                ) {
                    Some(Event::SleepCompleted(woke)) => Ok(SleepStep::Woke {
                        early: woke.woken_at,
                    }),
                    _ => Ok(SleepStep::Sleeping(recorded)),
                }
            }
            _ => Err(self.diverged(at, format!("sleep for call {call_id}"))),
        }
    }

    /// The next recorded action, when it is a model call: its hash says
    /// which form of request hash the record was made with.
    #[must_use]
    pub fn peek_model_call(&self) -> Option<&ModelCallRequested> {
        match &self.log[self.next_action()?].event {
            Event::ModelCallRequested(requested) => Some(requested),
            _ => None,
        }
    }

    /// The next recorded action, when it is a suspension: its details were
    /// fixed by the tool's live outcome, so a replay takes them from here.
    #[must_use]
    pub fn peek_suspension(&self) -> Option<&Suspended> {
        match &self.log[self.next_action()?].event {
            Event::Suspended(suspended) => Some(suspended),
            _ => None,
        }
    }

    /// Passes over a `reconciliation` suspension for `call_id` if it is the
    /// next action; says whether there was one.
    fn skip_reconciliation(&mut self, call_id: &str) -> bool {
        let Some(at) = self.next_action() else {
            return false;
        };
        match &self.log[at].event {
            Event::Suspended(s)
                if s.kind == spool_wire::run::SuspendKind::Reconciliation
                    && s.call_id.as_deref() == Some(call_id) =>
            {
                self.pos = at + 1;
                true
            }
            _ => false,
        }
    }

    /// The index of the next recorded action (a request the runtime makes),
    /// passing over events that are not actions.
    fn next_action(&self) -> Option<usize> {
        (self.pos..self.log.len()).find(|&i| {
            matches!(
                self.log[i].event,
                Event::ModelCallRequested(_)
                    | Event::ToolCallRequested(_)
                    | Event::Suspended(_)
                    | Event::SleepStarted(_)
            )
        })
    }

    /// Takes the completion of the action just matched: the first event
    /// before the next action that `is_completion` accepts.
    fn take_completion(&mut self, is_completion: impl Fn(&Event) -> bool) -> Option<Event> {
        let end = self.next_action().unwrap_or(self.log.len());
        let found = (self.pos..end).find(|&i| is_completion(&self.log[i].event))?;
        self.pos = found + 1;
        Some(self.log[found].event.clone())
    }

    fn diverged(&self, at: usize, requested: String) -> Divergence {
        let recorded = &self.log[at];
        Divergence {
            seq: recorded.seq,
            recorded: format!(
                "{} {}",
                recorded.event.kind(),
                String::from_utf8_lossy(&recorded.event.to_bytes())
            ),
            requested,
        }
    }
}

fn fresh() -> Permit {
    Permit {
        intent_recorded: false,
        intent_seq: None,
    }
}

fn recorded_at(seq: Seq) -> Permit {
    Permit {
        intent_recorded: true,
        intent_seq: Some(seq),
    }
}
