//! What a run did, read once: its journal events and live deltas as typed
//! [`Activity`], with one meaning for every case, which each transport maps
//! to its own wire type and nothing else.
//!
//! The meanings every surface shares (`docs/architecture.md`, "Activity"):
//!
//! - A tool call **ends** when the result the model sees is known: its
//!   output, its failure, a person's answer to its question, its waking from
//!   a sleep, an operator's resolution, or its abandonment. A tool that
//!   suspends or sleeps first **parks** ([`Activity::ToolCallParked`]); it
//!   ends later, when answered or woken, or when its turn ends without that
//!   ([`ToolOutcome::Interrupted`]).
//! - A recorded output under a reserved sentinel key whose body is not what
//!   the key promises is [`ToolOutcome::Malformed`]: a failed call, which
//!   the runtime will not replay (the run's next step reports
//!   `conversation_corrupt`). No surface shows it as a success.
//! - Every tool call a turn started ends before the turn does; so does its
//!   model call in progress ([`Activity::ModelCallInterrupted`]).
//! - A state change ([`Activity::StateChanged`]) comes after the facts that
//!   caused it, within the same event.
//!
//! A [`Reader`] remembers what a run has open (its turn, the model call in
//! progress, the tool calls awaiting a result) so that a fact can say what
//! its journal event alone does not: which tool a completion ends, which
//! call an answer goes to. [`Reader::stateless`] reads each event on its
//! own, for a mapper that shares one encoding of an event among all its
//! readers (the HTTP stream); what needs memory is then absent.
//!
//! Facts borrow from the event they are read from; a reader allocates only
//! to remember an open tool call.

use std::borrow::Cow;

use serde_json::Value;
use spool_journal::event::{
    Answer, BudgetExceeded, CancelRequested, ModelCallCompleted, RunCreated, RunRetired,
    SleepStarted, Suspended, ToolCallAbandoned, ToolCallRequested, ToolCallResolved, TurnCancelled,
    TurnCompleted, TurnFailed, TurnStarted,
};
use spool_journal::fold::Status;
use spool_journal::{Address, Envelope, Event, Seq, TurnId};
use spool_wire::sentinel::{self, MalformedSentinel, Sentinel, Sleep, Suspension, ToolFailure};
use time::OffsetDateTime;

use crate::engine::Delta;
use crate::hub::LiveDelta;

/// One fact of a run's activity.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Activity<'a> {
    /// The run exists.
    Created(&'a RunCreated),
    /// A turn began. `number` counts the turns the reader saw start (1 for
    /// the first it saw; 0 from a stateless reader).
    TurnStarted {
        /// The journal record.
        started: &'a TurnStarted,
        /// The turn's number.
        number: u64,
    },
    /// Input joined the run during a turn: steered into it (`turn` names
    /// it) or queued to run after it.
    Input {
        /// The input.
        input: &'a str,
        /// The running turn it was steered into; absent when queued.
        turn: Option<&'a TurnId>,
        /// The caller's idempotency key for queued input
        /// (`Runtime::send_once`).
        operation: Option<&'a str>,
    },
    /// A model call began; `call` is its request's journal position, which
    /// names it.
    ModelCallStarted {
        /// The call.
        call: Seq,
    },
    /// A piece of the model call in progress, streamed live.
    ModelStreamed {
        /// The model call, when the reader saw it start.
        call: Option<Seq>,
        /// The turn streaming it.
        turn: &'a TurnId,
        /// The piece.
        delta: &'a Delta,
    },
    /// A running tool call reported its progress (live only).
    ToolProgress {
        /// The call, as the model gave its id.
        call_id: &'a str,
        /// The tool, when the reader saw the call start.
        tool: Option<Cow<'a, str>>,
        /// The turn it runs in.
        turn: &'a TurnId,
        /// What the tool said.
        message: &'a str,
    },
    /// A model call answered.
    ModelCallEnded {
        /// The call, when the reader saw it start.
        call: Option<Seq>,
        /// The recorded answer.
        done: &'a ModelCallCompleted,
    },
    /// A model call's turn ended before its answer was recorded.
    ModelCallInterrupted {
        /// The call.
        call: Seq,
    },
    /// A tool call began.
    ToolCallStarted(&'a ToolCallRequested),
    /// A tool call parked its turn: it waits for an answer or a time, and
    /// ends when that comes.
    ToolCallParked {
        /// The call.
        call_id: &'a str,
        /// The tool, when the reader saw the call start.
        tool: Option<Cow<'a, str>>,
        /// What it waits for.
        parked: Parked,
    },
    /// A tool call's result is known.
    ToolCallEnded {
        /// The call.
        call_id: Cow<'a, str>,
        /// The tool, when the reader saw the call start.
        tool: Option<Cow<'a, str>>,
        /// Its result.
        outcome: ToolOutcome<'a>,
    },
    /// The run waits for an answer.
    Suspended(&'a Suspended),
    /// A budget is used up: the run waits for a verdict.
    BudgetStopped(&'a BudgetExceeded),
    /// A wait was answered.
    Resumed {
        /// The turn resumed.
        turn: &'a TurnId,
        /// The answers.
        answers: &'a [Answer],
    },
    /// A tool call's sleep began.
    SleepStarted(&'a SleepStarted),
    /// Someone asked to cancel the run's turn.
    CancelRequested(&'a CancelRequested),
    /// A turn ended.
    TurnEnded(TurnOutcome<'a>),
    /// The model's context was cleared (`true`) or compacted.
    ContextChanged {
        /// Cleared rather than compacted.
        cleared: bool,
    },
    /// An address was bound to the run or released.
    AddressChanged {
        /// The address.
        address: &'a Address,
        /// Bound rather than released.
        bound: bool,
    },
    /// The run was retired.
    Retired(&'a RunRetired),
    /// The run's state moved, after the facts above that moved it.
    StateChanged(Status),
}

/// What a parked tool call waits for.
#[derive(Clone, Debug, PartialEq)]
pub enum Parked {
    /// An answer.
    Suspended(Suspension),
    /// An instant.
    Slept(Sleep),
}

/// How a tool call ended.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutcome<'a> {
    /// The tool's output.
    Output(&'a Value),
    /// The tool failed after its last attempt.
    Failed(ToolFailure),
    /// A person or program answered the call's question.
    Answered(&'a [Answer]),
    /// The call's sleep ended: at its time, or early (`early`) at `at`.
    Woke {
        /// When, when the reader knows it.
        at: Option<OffsetDateTime>,
        /// Woken before its time.
        early: bool,
    },
    /// An operator settled a call whose outcome was unknown.
    Resolved(&'a ToolCallResolved),
    /// An operator gave the call up.
    Abandoned(&'a ToolCallAbandoned),
    /// The recorded output is under a reserved key but is not what the key
    /// promises: the runtime cannot read it.
    Malformed(MalformedSentinel),
    /// Its turn ended before its result.
    Interrupted,
}

/// The text an operator's abandonment shows when it gives no reason.
pub const ABANDONED: &str = "abandoned by an operator";

/// The text an interrupted tool call shows.
pub const INTERRUPTED: &str = "the turn ended before the tool's result";

impl ToolOutcome<'_> {
    /// Whether the call failed: a failure, a malformed record, an
    /// abandonment or an interruption.
    #[must_use]
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Self::Failed(_) | Self::Malformed(_) | Self::Abandoned(_) | Self::Interrupted
        )
    }

    /// The call's result as text: what the model was shown for a result it
    /// was given, the failure's message otherwise.
    #[must_use]
    pub fn text(&self) -> String {
        match self {
            Self::Output(output) => sentinel::content_string(output),
            Self::Failed(failure) => format!("error: {}", failure.message),
            Self::Answered(answers) => crate::view::answers_output(answers),
            Self::Woke { at, .. } => match at {
                Some(at) => sentinel::content_string(&sentinel::slept_output(*at)),
                None => "woke".to_owned(),
            },
            Self::Resolved(resolved) => sentinel::content_string(&resolved.output),
            Self::Abandoned(abandoned) => abandoned
                .reason
                .clone()
                .unwrap_or_else(|| ABANDONED.to_owned()),
            Self::Malformed(malformed) => format!("error: malformed recorded output: {malformed}"),
            Self::Interrupted => INTERRUPTED.to_owned(),
        }
    }

    /// The outcome's name, as telemetry records it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Output(_) => "ok",
            Self::Failed(_) => "error",
            Self::Answered(_) => "answered",
            Self::Woke { .. } => "woke",
            Self::Resolved(_) => "resolved",
            Self::Abandoned(_) => "abandoned",
            Self::Malformed(_) => "malformed",
            Self::Interrupted => "interrupted",
        }
    }
}

/// How a turn ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TurnOutcome<'a> {
    /// With an answer.
    Completed(&'a TurnCompleted),
    /// With a failure.
    Failed(&'a TurnFailed),
    /// Cancelled.
    Cancelled(&'a TurnCancelled),
}

impl<'a> TurnOutcome<'a> {
    /// The turn.
    #[must_use]
    pub fn turn(&self) -> &'a TurnId {
        match self {
            Self::Completed(done) => &done.turn_id,
            Self::Failed(failed) => &failed.turn_id,
            Self::Cancelled(cancelled) => &cancelled.turn_id,
        }
    }
}

/// The facts of one journal event, in order: up to three of its own,
/// after the ends of whatever its turn left open.
#[derive(Debug)]
pub struct Facts<'a> {
    /// Open calls a turn's end closes; empty (unallocated) otherwise.
    closed: std::vec::IntoIter<Activity<'a>>,
    own: std::iter::Flatten<std::array::IntoIter<Option<Activity<'a>>, 3>>,
}

impl<'a> Iterator for Facts<'a> {
    type Item = Activity<'a>;

    fn next(&mut self) -> Option<Activity<'a>> {
        self.closed.next().or_else(|| self.own.next())
    }
}

/// A tool call the reader saw start and not yet end.
#[derive(Clone, Debug)]
struct Open {
    call_id: String,
    tool: String,
    /// Whether it parked on a suspension.
    asked: bool,
    /// When its sleep wakes, while it sleeps.
    wake_at: Option<OffsetDateTime>,
}

/// Reads one run's events and deltas, in order, into [`Activity`].
#[derive(Clone, Debug, Default)]
pub struct Reader {
    stateless: bool,
    turns: u64,
    model: Option<Seq>,
    open: Vec<Open>,
}

impl Reader {
    /// A reader before the run's first event.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader that remembers nothing: each event's facts on their own.
    /// Facts that need memory (the tool a completion ends, the call an
    /// answer goes to, the ends of what a turn left open) are absent.
    #[must_use]
    pub fn stateless() -> Self {
        Self {
            stateless: true,
            ..Self::default()
        }
    }

    /// The model call in progress, when the reader saw it start.
    #[must_use]
    pub fn model_call(&self) -> Option<Seq> {
        self.model
    }

    /// The turns the reader saw start.
    #[must_use]
    pub fn turns(&self) -> u64 {
        self.turns
    }

    /// The fact of a live delta.
    #[must_use]
    pub fn delta<'a>(&self, delta: &'a LiveDelta) -> Activity<'a> {
        if let Delta::ToolProgress { id, message } = &delta.delta {
            return Activity::ToolProgress {
                call_id: id,
                tool: self.tool_of(id),
                turn: &delta.turn,
                message,
            };
        }
        Activity::ModelStreamed {
            call: self.model,
            turn: &delta.turn,
            delta: &delta.delta,
        }
    }

    fn take_open(&mut self, call_id: &str) -> Option<Open> {
        let at = self.open.iter().position(|open| open.call_id == call_id)?;
        Some(self.open.remove(at))
    }

    fn tool_of<'a>(&self, call_id: &str) -> Option<Cow<'a, str>> {
        self.open
            .iter()
            .find(|open| open.call_id == call_id)
            .map(|open| Cow::Owned(open.tool.clone()))
    }

    /// The facts of the run's next journal event.
    pub fn envelope<'a>(&mut self, envelope: &'a Envelope) -> Facts<'a> {
        let mut closed = Vec::new();
        let mut own: [Option<Activity<'a>>; 3] = [None, None, None];
        let ended = |call_id: Cow<'a, str>, tool, outcome| Activity::ToolCallEnded {
            call_id,
            tool,
            outcome,
        };
        let first = match &envelope.event {
            Event::RunCreated(created) => Some(Activity::Created(created)),
            Event::TurnStarted(started) => {
                if !self.stateless {
                    self.turns += 1;
                }
                Some(Activity::TurnStarted {
                    started,
                    number: self.turns,
                })
            }
            Event::InputSteered(steered) => Some(Activity::Input {
                input: &steered.input,
                turn: Some(&steered.turn_id),
                operation: None,
            }),
            Event::InputQueued(queued) => Some(Activity::Input {
                input: &queued.input,
                turn: None,
                operation: queued.operation_id.as_deref(),
            }),
            Event::ModelCallRequested(_) => {
                if !self.stateless {
                    self.model = Some(envelope.seq);
                }
                Some(Activity::ModelCallStarted { call: envelope.seq })
            }
            Event::ModelCallCompleted(done) => Some(Activity::ModelCallEnded {
                call: self.model.take(),
                done,
            }),
            Event::ToolCallRequested(call) => {
                // A call re-requested after a restart is the same call.
                if !self.stateless && !self.open.iter().any(|open| open.call_id == call.call_id) {
                    self.open.push(Open {
                        call_id: call.call_id.clone(),
                        tool: call.tool.clone(),
                        asked: false,
                        wake_at: None,
                    });
                }
                Some(Activity::ToolCallStarted(call))
            }
            Event::ToolCallCompleted(done) => {
                let call_id = done.call_id.as_str();
                match Sentinel::decode(&done.output) {
                    Ok(Some(Sentinel::Suspend(suspension))) => Some(Activity::ToolCallParked {
                        call_id,
                        tool: self.tool_of(call_id),
                        parked: Parked::Suspended(suspension),
                    }),
                    Ok(Some(Sentinel::Sleep(sleep))) => Some(Activity::ToolCallParked {
                        call_id,
                        tool: self.tool_of(call_id),
                        parked: Parked::Slept(sleep),
                    }),
                    Ok(None) => Some(self.end(call_id, ToolOutcome::Output(&done.output))),
                    Ok(Some(Sentinel::Failure(failure))) => {
                        Some(self.end(call_id, ToolOutcome::Failed(failure)))
                    }
                    Err(malformed) => Some(self.end(call_id, ToolOutcome::Malformed(malformed))),
                }
            }
            Event::ToolCallResolved(resolved) => {
                Some(self.end(&resolved.call_id, ToolOutcome::Resolved(resolved)))
            }
            Event::ToolCallAbandoned(abandoned) => {
                Some(self.end(&abandoned.call_id, ToolOutcome::Abandoned(abandoned)))
            }
            Event::Suspended(suspended) => {
                if let Some(call) = &suspended.call_id
                    && let Some(open) = self.open.iter_mut().find(|open| open.call_id == *call)
                {
                    open.asked = true;
                }
                Some(Activity::Suspended(suspended))
            }
            Event::BudgetExceeded(exceeded) => Some(Activity::BudgetStopped(exceeded)),
            Event::Resumed(resumed) => {
                // The answer is the result of the call that asked.
                if let Some(at) = self.open.iter().position(|open| open.asked) {
                    let open = self.open.remove(at);
                    own[1] = Some(ended(
                        Cow::Owned(open.call_id),
                        Some(Cow::Owned(open.tool)),
                        ToolOutcome::Answered(&resumed.answers),
                    ));
                }
                Some(Activity::Resumed {
                    turn: &resumed.turn_id,
                    answers: &resumed.answers,
                })
            }
            Event::SleepStarted(sleep) => {
                if let Some(open) = self
                    .open
                    .iter_mut()
                    .find(|open| open.call_id == sleep.call_id)
                {
                    open.wake_at = Some(sleep.wake_at);
                }
                Some(Activity::SleepStarted(sleep))
            }
            Event::SleepCompleted(woke) => {
                let open = self.take_open(&woke.call_id);
                let at = woke
                    .woken_at
                    .or_else(|| open.as_ref().and_then(|open| open.wake_at));
                Some(ended(
                    Cow::Borrowed(&woke.call_id),
                    open.map(|open| Cow::Owned(open.tool)),
                    ToolOutcome::Woke {
                        at,
                        early: woke.woken_at.is_some(),
                    },
                ))
            }
            Event::CancelRequested(cancel) => Some(Activity::CancelRequested(cancel)),
            Event::TurnCompleted(done) => {
                Some(self.turn_ended(TurnOutcome::Completed(done), &mut closed))
            }
            Event::TurnFailed(failed) => {
                Some(self.turn_ended(TurnOutcome::Failed(failed), &mut closed))
            }
            Event::TurnCancelled(cancelled) => {
                Some(self.turn_ended(TurnOutcome::Cancelled(cancelled), &mut closed))
            }
            Event::ContextCleared(_) => Some(Activity::ContextChanged { cleared: true }),
            Event::Compacted(_) => Some(Activity::ContextChanged { cleared: false }),
            Event::AddressBound(binding) => Some(Activity::AddressChanged {
                address: &binding.address,
                bound: true,
            }),
            Event::AddressUnbound(binding) => Some(Activity::AddressChanged {
                address: &binding.address,
                bound: false,
            }),
            Event::RunRetired(retired) => Some(Activity::Retired(retired)),
            // A schedule's own records, a surface's, and the links of a
            // fork: nothing a run did.
            Event::ScheduleFired(_)
            | Event::ScheduleDelivered(_)
            | Event::Noted(_)
            | Event::ForkedFrom(_)
            | Event::ForkedInto(_) => None,
            // Which definition the next turn runs on: the run's detail
            // shows it.
            Event::AgentChanged(_) => None,
        };
        own[0] = first;
        own[2] = spool_journal::fold::moved_to(&envelope.event).map(Activity::StateChanged);
        Facts {
            closed: closed.into_iter(),
            own: own.into_iter().flatten(),
        }
    }

    /// A tool call's end, naming the tool when the reader saw it start.
    fn end<'a>(&mut self, call_id: &'a str, outcome: ToolOutcome<'a>) -> Activity<'a> {
        Activity::ToolCallEnded {
            call_id: Cow::Borrowed(call_id),
            tool: self.take_open(call_id).map(|open| Cow::Owned(open.tool)),
            outcome,
        }
    }

    /// A turn's end: what it left open ends first, interrupted.
    fn turn_ended<'a>(
        &mut self,
        outcome: TurnOutcome<'a>,
        closed: &mut Vec<Activity<'a>>,
    ) -> Activity<'a> {
        if let Some(call) = self.model.take() {
            closed.push(Activity::ModelCallInterrupted { call });
        }
        for open in self.open.drain(..) {
            closed.push(Activity::ToolCallEnded {
                call_id: Cow::Owned(open.call_id),
                tool: Some(Cow::Owned(open.tool)),
                outcome: ToolOutcome::Interrupted,
            });
        }
        Activity::TurnEnded(outcome)
    }
}

pub mod timing;

#[cfg(test)]
mod tests;
