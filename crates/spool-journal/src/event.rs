//! The event vocabulary: everything durable about a run, one envelope per
//! journal position.
//!
//! An envelope is `{run_id, seq, recorded_at, event}` with the event
//! adjacently tagged `{"kind", "payload"}`. Fields added later are optional
//! and left out when absent, so a log written earlier stays byte-identical
//! when re-encoded; a pinned-JSON test per kind holds that line. A log from a
//! newer schema is refused by the store (see [`SCHEMA_VERSION`]).
//!
//! Text, thinking and tool-argument deltas are not here: they are live only.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spool_wire::run::{Budget, FailureCode, SuspendKind, TurnPolicy};
use time::OffsetDateTime;

use crate::id::{Address, Principal, RunId, Seq, TurnId};

/// The event schema this crate writes and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One durable event at one position of one run's journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The run.
    pub run_id: RunId,
    /// The position, contiguous from 0.
    pub seq: Seq,
    /// When the store recorded it (UTC).
    #[serde(with = "time::serde::rfc3339")]
    pub recorded_at: OffsetDateTime,
    /// What happened.
    pub event: Event,
}

/// Everything durable that happens to a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum Event {
    /// The run exists.
    RunCreated(RunCreated),
    /// A turn began with the user's input.
    TurnStarted(TurnStarted),
    /// Input steered into the running turn, given to the model before its
    /// next call.
    InputSteered(InputSteered),
    /// Input that arrived during a turn, to run as the next turn.
    InputQueued(InputQueued),
    /// A model call is about to be made (write-ahead).
    ModelCallRequested(ModelCallRequested),
    /// The model call answered.
    ModelCallCompleted(ModelCallCompleted),
    /// A tool call is about to be made (write-ahead).
    ToolCallRequested(ToolCallRequested),
    /// The tool call's one completion; its output may be a sentinel.
    ToolCallCompleted(ToolCallCompleted),
    /// The run parked for an answer.
    Suspended(Suspended),
    /// The run was answered.
    Resumed(Resumed),
    /// The run parked until an instant.
    SleepStarted(SleepStarted),
    /// The instant came.
    SleepCompleted(SleepCompleted),
    /// Someone asked for the running turn to stop.
    CancelRequested(CancelRequested),
    /// The turn answered.
    TurnCompleted(TurnCompleted),
    /// The turn failed.
    TurnFailed(TurnFailed),
    /// The turn stopped on request.
    TurnCancelled(TurnCancelled),
    /// The model's context was dropped; the run and its log remain.
    ContextCleared(ContextCleared),
    /// Older context was replaced by a summary.
    Compacted(Compacted),
    /// A budget ran out; the run waits for an operator.
    BudgetExceeded(BudgetExceeded),
    /// The run took a name in a channel.
    AddressBound(AddressBinding),
    /// The run gave a name up.
    AddressUnbound(AddressBinding),
    /// The run is closed for good.
    RunRetired(RunRetired),
    /// An operator settled a dangling tool call with its output.
    ToolCallResolved(ToolCallResolved),
    /// An operator gave a dangling tool call up.
    ToolCallAbandoned(ToolCallAbandoned),
    /// A schedule fired: recorded in the schedule's own record run before
    /// its message is delivered, so a restart never delivers it twice.
    ScheduleFired(ScheduleFired),
    /// What became of a firing's message.
    ScheduleDelivered(ScheduleDelivered),
    /// A surface's own record kept with the run (an A2A task's push
    /// notification config and what was delivered to it): no turn and no
    /// state reads it, and the surface that wrote it reads it back.
    Noted(Note),
    /// This run is a fork: its history up to here was copied from
    /// another run's (always at position 1, after `run_created`).
    ForkedFrom(ForkLink),
    /// A fork was made of this run's history through a position.
    ForkedInto(ForkLink),
    /// The run moved to another agent definition: the turn that follows,
    /// and the ones after it, run on `to` (its model, tools, prompt,
    /// budgets and limits). Recorded before a turn's `turn_started`.
    AgentChanged(AgentChanged),
}

/// Token usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// `run_created`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCreated {
    /// The address the run was created through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Address>,
    /// The idempotency key it was created under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// A hash of the request that created it, so a retry with a different
    /// body under the same operation id is told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
    /// A listing title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The surface kind (`dm`, `thread`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Who created it, when that was proven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    /// The digest (`sha256:…`) of the agent definition the run started
    /// with; the journal keeps the definition once per digest, in a record
    /// run at the address `spool.agent/DIGEST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Whether the run follows newer definitions of its agent, when its
    /// creator said; absent, the newest definition's `upgrade` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<spool_wire::run::Upgrade>,
}

/// `turn_started`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnStarted {
    /// The turn.
    pub turn_id: TurnId,
    /// The user's input.
    pub input: String,
    /// Input for this turn only, kept apart from the history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// How input arriving during the turn is handled.
    pub policy: TurnPolicy,
    /// The `input_queued` event this turn runs, when it came from the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_queue: Option<Seq>,
    /// The caller's idempotency key for the message that started it (an
    /// A2A `messageId`): the same key sent to the run again is answered
    /// with this turn, never another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `input_queued`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputQueued {
    /// The input.
    pub input: String,
    /// Input for that turn only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// The caller's idempotency key for the message, as on
    /// [`TurnStarted::operation_id`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `input_steered`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputSteered {
    /// The turn it was steered into.
    pub turn_id: TurnId,
    /// The input.
    pub input: String,
}

/// `model_call_requested`: the request as a hash plus what is new since the
/// previous call, so a long run's log grows with its conversation, not with
/// the square of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCallRequested {
    /// The content hash of the whole request.
    pub request_hash: String,
    /// The messages added since the previous call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_messages: Vec<Value>,
}

/// `model_call_completed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCallCompleted {
    /// The assistant's message, as the engine produced it. Shared, so a
    /// replayed conversation holds it without a copy.
    pub message: Arc<Value>,
    /// Tokens used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Why the model stopped (`stop`, `tool_use`, `length`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// What a tool call may do to the world, which decides what recovery may
/// do with a call that has no completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// No effect: run it again.
    Read,
    /// Safe to repeat under the same idempotency key.
    Idempotent,
    /// Not safe to repeat: an operator decides.
    Write,
}

impl Effect {
    /// The wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Idempotent => "idempotent",
            Self::Write => "write",
        }
    }
}

/// `tool_call_requested`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequested {
    /// The model's call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments.
    pub input: Value,
    /// What the call may do.
    pub effect: Effect,
    /// The key an idempotent or keyed call is claimed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// `tool_call_completed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallCompleted {
    /// The call.
    pub call_id: String,
    /// Its output; a suspension, sleep or failure is a sentinel here.
    /// Shared, as a message is.
    pub output: Arc<Value>,
}

/// `suspended`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suspended {
    /// The parked turn.
    pub turn_id: TurnId,
    /// What it waits for.
    pub kind: SuspendKind,
    /// What to show whoever answers.
    pub prompt: String,
    /// The parked tool call, when a tool parked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The JSON Schema the answer must satisfy; shared with the state's
    /// copy of the suspension, since a schema is often the largest part of
    /// a parked run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Arc<Value>>,
    /// Choices, when the question has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
}

/// One answer to a suspension.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The text.
    #[serde(default)]
    pub text: String,
    /// `true` approves, `false` rejects, absent rejects nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
}

/// `resumed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    /// The turn that was parked.
    pub turn_id: TurnId,
    /// The answers.
    pub answers: Vec<Answer>,
}

/// `sleep_started`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SleepStarted {
    /// The tool call that asked to sleep.
    pub call_id: String,
    /// When to wake, UTC.
    #[serde(with = "time::serde::rfc3339")]
    pub wake_at: OffsetDateTime,
}

/// `sleep_completed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SleepCompleted {
    /// The tool call that slept.
    pub call_id: String,
    /// When the sleep was ended before its time (a pod's `resume`): the
    /// tool's result says this instant. Absent when it woke at its time.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub woken_at: Option<OffsetDateTime>,
}

/// `cancel_requested`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CancelRequested {
    /// The turn the caller saw, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
}

/// `turn_completed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnCompleted {
    /// The turn.
    pub turn_id: TurnId,
    /// The answer's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Tokens the turn used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `turn_failed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnFailed {
    /// The turn.
    pub turn_id: TurnId,
    /// A stable code (`provider_error`, `internal`, `budget`, …).
    pub code: FailureCode,
    /// What went wrong, in full.
    pub message: String,
}

/// `turn_cancelled`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnCancelled {
    /// The turn.
    pub turn_id: TurnId,
}

/// `context_cleared`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContextCleared {}

/// `compacted`: the conversation recorded at `from..=to` is replaced, for
/// the model, by `summary`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compacted {
    /// The summary the engine wrote.
    pub summary: String,
    /// The first position summarized.
    pub from: Seq,
    /// The last position summarized.
    pub to: Seq,
}

/// `budget_exceeded`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    /// Which budget (`tokens`, `steps_per_turn`, …).
    pub budget: Budget,
    /// Its limit.
    pub limit: u64,
    /// What was used.
    pub used: u64,
}

/// `address_bound` and `address_unbound`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddressBinding {
    /// The address.
    pub address: Address,
}

/// `run_retired`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRetired {
    /// Why, for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The one namespace whose addresses retiring frees (the HTTP
    /// channel's reset frees its own only); absent, every address of the
    /// run is freed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `tool_call_resolved`: an operator says a dangling call happened, with
/// this output; it serves as the call's completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallResolved {
    /// The call.
    pub call_id: String,
    /// Its output, shared as a completion's is.
    pub output: Arc<Value>,
    /// Who settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
}

/// `tool_call_abandoned`: an operator gives a dangling call up; the turn
/// fails rather than guess.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallAbandoned {
    /// The call.
    pub call_id: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who gave it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
}

/// `schedule_fired`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleFired {
    /// The firing's id, unique within its schedule: `cron:<instant>` for a
    /// firing of the cron expression (or its catch-up), `manual:<uuid>`,
    /// `external:<caller's id>`.
    pub fire_id: String,
    /// The instant it was due (a manual firing: when it was asked for).
    #[serde(with = "time::serde::rfc3339")]
    pub scheduled_at: OffsetDateTime,
    /// What fired it.
    pub kind: FireKind,
    /// The run bound to the schedule's address when the firing was
    /// recorded (absent for a fresh run per firing, or an address not yet
    /// bound)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_run: Option<RunId>,
    /// ...and that run's next position then: after a crash, its log from
    /// there says whether the message was delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_seq: Option<Seq>,
}

/// What fired a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireKind {
    /// Its cron expression came due.
    Cron,
    /// An occurrence missed while the server was down, run once at start.
    CatchUp,
    /// A caller asked for a firing now.
    Manual,
    /// A caller's scheduler fired it, under its own id.
    External,
}

impl FireKind {
    /// The wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cron => "cron",
            Self::CatchUp => "catch_up",
            Self::Manual => "manual",
            Self::External => "external",
        }
    }
}

/// `noted`: a keyed record of a surface's own. The latest record of a
/// key is the one that holds; a `null` value withdraws the key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// Whose record it is (`a2a.push`): the surface that reads it.
    pub namespace: String,
    /// What it is about, within the namespace.
    pub key: String,
    /// The record; `null` withdraws the key's earlier one.
    pub value: Value,
}

/// `forked_from` and `forked_into`: the two ends of a fork, each in its
/// run's journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForkLink {
    /// The other run: the source in `forked_from`, the fork in
    /// `forked_into`.
    pub run: RunId,
    /// The source's last position the fork holds.
    pub through: Seq,
    /// The source's turn the fork was cut at.
    pub turn_id: TurnId,
    /// Whether the fork holds that turn (`after`) or stops before it
    /// (`before`).
    pub cut: ForkCut,
}

/// `agent_changed`: a run's move from one agent definition to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentChanged {
    /// The digest the run ran on until now (absent for a run that
    /// recorded none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The digest it runs on from here.
    pub to: String,
}

/// Where a fork is cut, relative to its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkCut {
    /// Through the turn's end.
    After,
    /// Up to the turn's start: to run it again, or with another message.
    Before,
}

/// `schedule_delivered`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleDelivered {
    /// The firing.
    pub fire_id: String,
    /// What became of its message.
    pub outcome: Delivery,
}

/// What became of a firing's message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Delivery {
    /// A turn started with it.
    Started {
        /// The run.
        run_id: RunId,
        /// The turn, when known (a delivery found after a crash knows only
        /// its run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<TurnId>,
    },
    /// Queued behind the run's running turn.
    Queued {
        /// The run.
        run_id: RunId,
    },
    /// Not delivered, by the schedule's policy (the run was busy or
    /// waiting for an answer).
    Skipped {
        /// Why.
        reason: String,
    },
    /// Not delivered: the runtime refused it.
    Failed {
        /// Why.
        error: String,
    },
}

impl Event {
    /// The wire name of the kind (`turn_started`, …).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunCreated(_) => "run_created",
            Self::TurnStarted(_) => "turn_started",
            Self::InputSteered(_) => "input_steered",
            Self::InputQueued(_) => "input_queued",
            Self::ModelCallRequested(_) => "model_call_requested",
            Self::ModelCallCompleted(_) => "model_call_completed",
            Self::ToolCallRequested(_) => "tool_call_requested",
            Self::ToolCallCompleted(_) => "tool_call_completed",
            Self::Suspended(_) => "suspended",
            Self::Resumed(_) => "resumed",
            Self::SleepStarted(_) => "sleep_started",
            Self::SleepCompleted(_) => "sleep_completed",
            Self::CancelRequested(_) => "cancel_requested",
            Self::TurnCompleted(_) => "turn_completed",
            Self::TurnFailed(_) => "turn_failed",
            Self::TurnCancelled(_) => "turn_cancelled",
            Self::ContextCleared(_) => "context_cleared",
            Self::Compacted(_) => "compacted",
            Self::BudgetExceeded(_) => "budget_exceeded",
            Self::AddressBound(_) => "address_bound",
            Self::AddressUnbound(_) => "address_unbound",
            Self::RunRetired(_) => "run_retired",
            Self::ToolCallResolved(_) => "tool_call_resolved",
            Self::ToolCallAbandoned(_) => "tool_call_abandoned",
            Self::ScheduleFired(_) => "schedule_fired",
            Self::ScheduleDelivered(_) => "schedule_delivered",
            Self::Noted(_) => "noted",
            Self::ForkedFrom(_) => "forked_from",
            Self::ForkedInto(_) => "forked_into",
            Self::AgentChanged(_) => "agent_changed",
        }
    }

    /// The event's canonical stored bytes: compact JSON in field order. These
    /// exact bytes are what the hash chain covers.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("events are plain JSON values and always serialize")
    }
}
