//! The state fold: a pure function from a log prefix to the run's state.
//! The store keeps its run listing with the same function, event by event,
//! so the listing and a full replay can never disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;
use spool_wire::run::{RunState, SuspendKind};
use time::OffsetDateTime;

use crate::event::{
    Answer, BudgetExceeded, CancelRequested, Envelope, Event, RunCreated, SleepStarted, Suspended,
    ToolCallRequested, Usage,
};
use crate::id::{Address, RunId, Seq, TurnId};

/// A run's state after some prefix of its log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// The run, once its first event is folded.
    pub run_id: Option<RunId>,
    /// What created it.
    pub created: Option<RunCreated>,
    /// The public state.
    pub status: Status,
    /// The current (or last) turn.
    pub turn: Option<TurnId>,
    /// What the run waits for, while it waits for an answer.
    pub suspension: Option<Suspended>,
    /// When it wakes, while it sleeps.
    pub sleep: Option<SleepStarted>,
    /// The budget that stopped it, while it waits on one.
    pub budget: Option<BudgetExceeded>,
    /// A cancel requested for the current turn and not yet acted on.
    pub cancel_requested: Option<CancelRequested>,
    /// The conversation as the model sees it, after clears and compactions.
    pub conversation: Vec<Item>,
    /// Tokens used by every model call so far.
    pub usage: Usage,
    /// The last turn's answer.
    pub response: Option<String>,
    /// How many turns have started, over the run's whole life (clears
    /// and compactions included): what a listing shows beside its tokens.
    pub turns: u64,
    /// Why the last turn failed, while the run rests failed.
    pub failure: Option<crate::event::TurnFailed>,
    /// The tool call whose recorded suspension parks the run, with its
    /// arguments, while it waits: what whoever answers is shown.
    pub parked_call: Option<ToolCallRequested>,
    /// Tool calls requested and not yet completed, by call id: on recovery
    /// these are the dangling intents.
    pub open_calls: BTreeMap<String, (Seq, ToolCallRequested)>,
    /// A model call requested and not yet answered.
    pub open_model_call: Option<(Seq, String)>,
    /// Input queued to run as later turns, oldest first, with where each
    /// was recorded.
    pub queued: std::collections::VecDeque<(Seq, crate::event::InputQueued)>,
    /// The addresses the run holds.
    pub addresses: BTreeSet<Address>,
    /// Surfaces' own records (`noted`), by namespace and key: the latest
    /// value of each.
    pub notes: BTreeMap<String, BTreeMap<String, Value>>,
    /// Messages sent with an idempotency key (`operation_id` on
    /// `turn_started` or `input_queued`): where each was recorded.
    pub operations: BTreeMap<String, Seq>,
    /// The last position folded.
    pub last_seq: Option<Seq>,
    /// When the last event was recorded.
    pub updated_at: Option<OffsetDateTime>,
    /// When the run was created (its first event recorded).
    pub created_at: Option<OffsetDateTime>,
    /// Where the run was forked from, when it is a fork.
    pub forked_from: Option<crate::event::ForkLink>,
    /// The digest of the agent definition the run's turns run on: the
    /// one it was created with, or the last it moved to.
    pub agent: Option<String>,
}

/// A run's public state, with why it waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Status {
    /// Created, no turn yet.
    #[default]
    Pending,
    /// A turn is running.
    Running,
    /// Parked; the kind says why.
    Waiting(SuspendKind),
    /// The last turn completed.
    Completed,
    /// The last turn failed.
    Failed,
    /// The last turn was cancelled.
    Cancelled,
    /// Closed for good.
    Retired,
}

impl Status {
    /// The state in the vocabulary every transport shares; each maps it
    /// to its own words.
    #[must_use]
    pub fn state(&self) -> RunState {
        match self {
            Self::Pending => RunState::Pending,
            Self::Running => RunState::Running,
            Self::Waiting(_) => RunState::Waiting,
            Self::Completed => RunState::Completed,
            Self::Failed => RunState::Failed,
            Self::Cancelled => RunState::Cancelled,
            Self::Retired => RunState::Retired,
        }
    }

    /// Whether a turn is in progress (running or parked).
    #[must_use]
    pub fn is_active(&self) -> bool {
        matches!(self, Self::Running | Self::Waiting(_))
    }
}

/// One entry of the conversation, with the position that recorded it.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Where it was recorded.
    pub seq: Seq,
    /// What it is.
    pub content: ItemContent,
}

/// What a conversation entry holds.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemContent {
    /// The user's input (a turn's, or steered into one).
    User(String),
    /// The assistant's message.
    Assistant(Arc<Value>),
    /// A tool's output.
    ToolResult {
        /// The call.
        call_id: String,
        /// Its output.
        output: Arc<Value>,
    },
    /// Answers to a suspension.
    Answers(Vec<Answer>),
    /// A summary standing for compacted entries.
    Summary(String),
}

/// Folds a whole log.
#[must_use]
pub fn fold<'a>(log: impl IntoIterator<Item = &'a Envelope>) -> State {
    let mut state = State::default();
    for envelope in log {
        state.apply(envelope);
    }
    state
}

/// The public state after `event`, given the state before it. Pure and
/// total: the fold and every store's run listing use this one function.
#[must_use]
pub fn transition(status: &Status, event: &Event) -> Status {
    match (status, event) {
        // Retirement is permanent.
        (Status::Retired, _) | (_, Event::RunRetired(_)) => Status::Retired,
        (_, Event::TurnStarted(_) | Event::Resumed(_) | Event::SleepCompleted(_)) => {
            Status::Running
        }
        (_, Event::Suspended(suspended)) => Status::Waiting(suspended.kind),
        (_, Event::SleepStarted(_)) => Status::Waiting(SuspendKind::Sleep),
        (_, Event::BudgetExceeded(_)) => Status::Waiting(SuspendKind::Budget),
        // An operator settled the dangling write either way: the turn goes
        // on (with the output, or to fail rather than guess).
        (
            Status::Waiting(SuspendKind::Reconciliation),
            Event::ToolCallResolved(_) | Event::ToolCallAbandoned(_),
        ) => Status::Running,
        (_, Event::TurnCompleted(_)) => Status::Completed,
        (_, Event::TurnFailed(_)) => Status::Failed,
        (_, Event::TurnCancelled(_)) => Status::Cancelled,
        (status, _) => *status,
    }
}

/// The state `event` moves a run to, when it is an event that moves one
/// (a turn starting, parking, resuming or ending; retirement), read as
/// from a running turn: what a transport says when it streams the event.
#[must_use]
pub fn moved_to(event: &Event) -> Option<Status> {
    let moves = matches!(
        event,
        Event::TurnStarted(_)
            | Event::Suspended(_)
            | Event::Resumed(_)
            | Event::SleepStarted(_)
            | Event::SleepCompleted(_)
            | Event::BudgetExceeded(_)
            | Event::TurnCompleted(_)
            | Event::TurnFailed(_)
            | Event::TurnCancelled(_)
            | Event::RunRetired(_)
    );
    moves.then(|| transition(&Status::Running, event))
}

impl Status {
    /// A compact text form for stores' listings (`waiting:approval`).
    #[must_use]
    pub fn encode(&self) -> String {
        match self {
            Self::Waiting(kind) => format!("waiting:{kind}"),
            other => other.state().as_str().to_owned(),
        }
    }

    /// Reads [`Status::encode`]'s form; `None` for anything else.
    #[must_use]
    pub fn decode(text: &str) -> Option<Self> {
        if let Some(kind) = text.strip_prefix("waiting:") {
            return kind.parse().ok().map(Self::Waiting);
        }
        Some(match text.parse().ok()? {
            RunState::Pending => Self::Pending,
            RunState::Running => Self::Running,
            RunState::Completed => Self::Completed,
            RunState::Failed => Self::Failed,
            RunState::Cancelled => Self::Cancelled,
            RunState::Retired => Self::Retired,
            RunState::Waiting => return None,
        })
    }
}

impl State {
    /// Folds one more event, copying only what the state keeps of it: a
    /// model call's request messages, say, are read and left in the log.
    pub fn apply(&mut self, envelope: &Envelope) {
        let seq = envelope.seq;
        if self.run_id.is_none() {
            self.run_id = Some(envelope.run_id.clone());
        }
        self.last_seq = Some(seq);
        self.updated_at = Some(envelope.recorded_at);
        if self.created_at.is_none() {
            self.created_at = Some(envelope.recorded_at);
        }
        // Retirement is permanent: nothing after it changes the state but
        // the bookkeeping above.
        if self.status == Status::Retired {
            return;
        }
        let event = &envelope.event;
        let before = std::mem::take(&mut self.status);
        self.status = transition(&before, event);
        match event {
            Event::RunCreated(created) => {
                if let Some(address) = &created.address {
                    self.addresses.insert(address.clone());
                }
                self.agent.clone_from(&created.agent);
                self.created = Some(created.clone());
            }
            Event::TurnStarted(started) => {
                if let Some(from) = started.from_queue {
                    self.queued.retain(|(seq, _)| *seq != from);
                }
                if let Some(operation) = &started.operation_id {
                    self.operations.insert(operation.clone(), seq);
                }
                self.turn = Some(started.turn_id.clone());
                self.turns += 1;
                self.failure = None;
                self.parked_call = None;
                self.suspension = None;
                self.sleep = None;
                self.budget = None;
                self.cancel_requested = None;
                self.response = None;
                self.push(seq, ItemContent::User(started.input.clone()));
            }
            Event::InputQueued(queued) => {
                if let Some(operation) = &queued.operation_id {
                    self.operations.insert(operation.clone(), seq);
                }
                self.queued.push_back((seq, queued.clone()));
            }
            Event::InputSteered(steered) => {
                self.push(seq, ItemContent::User(steered.input.clone()));
            }
            Event::ModelCallRequested(requested) => {
                self.open_model_call = Some((seq, requested.request_hash.clone()));
            }
            Event::ModelCallCompleted(completed) => {
                self.open_model_call = None;
                if let Some(usage) = completed.usage {
                    self.usage += usage;
                }
                self.push(seq, ItemContent::Assistant(completed.message.clone()));
            }
            Event::ToolCallRequested(requested) => {
                self.open_calls
                    .insert(requested.call_id.clone(), (seq, requested.clone()));
            }
            Event::ToolCallCompleted(completed) => {
                let requested = self.open_calls.remove(&completed.call_id);
                // A suspension is recorded inside the call's completion
                // (seed 004); its `suspended` follows.
                if completed
                    .output
                    .get(spool_wire::sentinel::SUSPEND_KEY)
                    .is_some()
                {
                    self.parked_call = requested.map(|(_, requested)| requested);
                }
                self.push(
                    seq,
                    ItemContent::ToolResult {
                        call_id: completed.call_id.clone(),
                        output: completed.output.clone(),
                    },
                );
            }
            Event::ToolCallResolved(resolved) => {
                self.open_calls.remove(&resolved.call_id);
                if before == Status::Waiting(SuspendKind::Reconciliation) {
                    self.suspension = None;
                }
                self.push(
                    seq,
                    ItemContent::ToolResult {
                        call_id: resolved.call_id.clone(),
                        output: resolved.output.clone(),
                    },
                );
            }
            Event::ToolCallAbandoned(abandoned) => {
                self.open_calls.remove(&abandoned.call_id);
                if before == Status::Waiting(SuspendKind::Reconciliation) {
                    self.suspension = None;
                }
            }
            Event::Suspended(suspended) => self.suspension = Some(suspended.clone()),
            Event::Resumed(resumed) => {
                self.suspension = None;
                self.parked_call = None;
                self.budget = None;
                self.push(seq, ItemContent::Answers(resumed.answers.clone()));
            }
            Event::SleepStarted(sleep) => self.sleep = Some(sleep.clone()),
            Event::SleepCompleted(_) => self.sleep = None,
            Event::CancelRequested(cancel) => self.cancel_requested = Some(cancel.clone()),
            Event::TurnCompleted(completed) => {
                self.finish();
                self.response.clone_from(&completed.response);
            }
            Event::TurnFailed(failed) => {
                self.finish();
                self.failure = Some(failed.clone());
            }
            Event::TurnCancelled(_) => self.finish(),
            Event::ContextCleared(_) => self.conversation.clear(),
            Event::Compacted(compacted) => {
                let at = self
                    .conversation
                    .iter()
                    .position(|item| item.seq >= compacted.from);
                self.conversation
                    .retain(|item| item.seq < compacted.from || item.seq > compacted.to);
                let summary = Item {
                    seq,
                    content: ItemContent::Summary(compacted.summary.clone()),
                };
                let at = at
                    .unwrap_or(self.conversation.len())
                    .min(self.conversation.len());
                self.conversation.insert(at, summary);
            }
            Event::BudgetExceeded(budget) => self.budget = Some(budget.clone()),
            Event::AddressBound(binding) => {
                self.addresses.insert(binding.address.clone());
            }
            Event::AddressUnbound(binding) => {
                self.addresses.remove(&binding.address);
            }
            Event::RunRetired(retired) => match &retired.namespace {
                None => self.addresses.clear(),
                Some(namespace) => self.addresses.retain(|a| &a.namespace != namespace),
            },
            // A schedule's record run holds its firings; they change no
            // conversation and no state.
            Event::ScheduleFired(_) | Event::ScheduleDelivered(_) => {}
            Event::ForkedFrom(link) => self.forked_from = Some(link.clone()),
            // A link to a fork changes nothing here.
            Event::ForkedInto(_) => {}
            Event::AgentChanged(changed) => self.agent = Some(changed.to.clone()),
            Event::Noted(note) => {
                let namespace = self.notes.entry(note.namespace.clone()).or_default();
                if note.value.is_null() {
                    namespace.remove(&note.key);
                    if namespace.is_empty() {
                        self.notes.remove(&note.namespace);
                    }
                } else {
                    namespace.insert(note.key.clone(), note.value.clone());
                }
            }
        }
    }

    /// The title given when the run was created.
    #[must_use]
    pub fn title(&self) -> Option<&str> {
        self.created.as_ref().and_then(|c| c.title.as_deref())
    }

    /// Open tool calls whose effect is `write`: what an operator must settle
    /// before the run may go on after a crash.
    pub fn dangling_writes(&self) -> impl Iterator<Item = &(Seq, ToolCallRequested)> {
        self.open_calls
            .values()
            .filter(|(_, call)| call.effect == crate::event::Effect::Write)
    }

    fn push(&mut self, seq: Seq, content: ItemContent) {
        self.conversation.push(Item { seq, content });
    }

    fn finish(&mut self) {
        self.suspension = None;
        self.parked_call = None;
        self.sleep = None;
        self.budget = None;
        self.cancel_requested = None;
    }
}
