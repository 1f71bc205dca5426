//! The HTTP channel's bodies (seed 002), served under [`BASE_PATH`].
//!
//! Request decoding is tolerant, as the channel's document says: unknown
//! fields are ignored (their acceptance is no proof they have an effect),
//! and `null` reads as absent, as the Go decoder this channel was first
//! written against does. What is checked is what the channel promises to
//! refuse: a wrong type, a missing `text`, an unknown `turn_policy`,
//! `operation_id` beside `address`, an empty `responses`.
//!
//! ```
//! use spool_wire::http::{ErrorCode, StartRun, TurnPolicy};
//!
//! let start = StartRun::decode(r#"{"address":"browser-42","text":"Summarize.","turn_policy":"queue","extra":1}"#).unwrap();
//! assert_eq!(start.turn_policy(), TurnPolicy::Queue);
//!
//! let refused = StartRun::decode(r#"{"text":"x","turn_policy":"interrupt"}"#).unwrap_err();
//! assert_eq!(refused.code, ErrorCode::UnknownTurnPolicy);
//! assert_eq!(refused.code.status(), Some(400));
//! ```

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::code::{Rejection, serde_util, string_enum};

pub mod data;

/// Every route of the channel starts here.
pub const BASE_PATH: &str = "/spool/v1";
/// The largest JSON body a run route reads (1 MiB).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The stream's content type.
pub const NDJSON_CONTENT_TYPE: &str = "application/x-ndjson";

/// Why a request body was refused; the code maps to the reply's status.
pub type HttpRejection = Rejection<ErrorCode>;

/// `POST /runs`: a new run, or a message through an address.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartRun {
    /// The user's input.
    pub text: String,
    /// An HTTP-local conversation key, created on first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// An idempotency key for authenticated starts; never with `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// A listing title, used on the first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The surface kind (`dm`, `thread`, …), used on the first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Input for this turn only, kept apart from the history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<String>>,
    /// `steer` (the default) or `queue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_policy: Option<TurnPolicy>,
    /// A self-asserted identity, ignored when an authenticator is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Principal>,
    /// For a new run: `next_turn` to move to the server's newest agent
    /// definition as each turn starts, `pinned` to keep the one it starts
    /// with; absent, the newest definition's `upgrade` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::run::Upgrade>,
}

/// `POST /runs/{id}`: a message to an exact existing run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageRun {
    /// The user's input.
    pub text: String,
    /// Input for this turn only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<String>>,
    /// `steer` (the default) or `queue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_policy: Option<TurnPolicy>,
    /// A self-asserted identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Principal>,
}

/// An identity. Its JSON field names are capitalized (`Authenticator`,
/// `Kind`, `ID`, `Attributes`), unlike the snake_case request fields; the
/// lowercase spellings are read too, as a Go decoder would.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Which authenticator proved it (`token`, …).
    #[serde(rename = "Authenticator", alias = "authenticator", default)]
    pub authenticator: String,
    /// What kind of caller (`token`, `app`, `user`, …).
    #[serde(rename = "Kind", alias = "kind", default)]
    pub kind: String,
    /// Who.
    #[serde(rename = "ID", alias = "id", default)]
    pub id: String,
    /// Anything else the authenticator vouches for.
    #[serde(
        rename = "Attributes",
        alias = "attributes",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub attributes: BTreeMap<String, String>,
}

string_enum! {
    /// What happens to input that arrives while a turn runs.
    pub enum TurnPolicy {
        /// Give it to the model before its next call in the running turn.
        Steer = "steer",
        /// Run it as a new turn after the running one.
        Queue = "queue",
    }
}

string_enum! {
    /// A run's public state.
    pub enum RunState {
        /// Created, no turn yet (or a crash before the first one).
        Pending = "pending",
        /// A turn is running.
        Running = "running",
        /// Parked; `suspend` says why.
        Waiting = "waiting",
        /// The last turn completed; the run takes another.
        Completed = "completed",
        /// The last turn failed; the run takes another.
        Failed = "failed",
        /// The last turn was cancelled; the run takes another.
        Cancelled = "cancelled",
        /// Permanently closed.
        Retired = "retired",
    }
}

impl RunState {
    /// Whether a turn has reached a boundary where `POST /runs` answers:
    /// completed, waiting, failed or cancelled.
    #[must_use]
    pub fn is_boundary(&self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Waiting | Self::Failed | Self::Cancelled
        )
    }
}

string_enum! {
    /// What a waiting run waits for.
    pub enum SuspendKind {
        /// A free-text answer.
        Question = "question",
        /// An explicit yes or no.
        Approval = "approval",
        /// A tool-defined answer.
        Custom = "custom",
        /// A webhook or another program.
        Signal = "signal",
        /// A timer.
        Sleep = "sleep",
        /// An operator's decision to spend more.
        Budget = "budget",
        /// An operator's decision about a write that may or may not have happened.
        Reconciliation = "reconciliation",
    }
}

/// Why a run waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspend {
    /// What it waits for.
    pub kind: SuspendKind,
    /// What to show whoever answers.
    pub prompt: String,
    /// Choices, when the question has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// The parked tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The parked turn; send it back with the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// Token usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// A run's state and latest boundary result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReply {
    /// The run.
    pub run_id: String,
    /// Its state.
    pub state: RunState,
    /// The turn this reply is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The last journal position; stream after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
    /// The assistant's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Why the run waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<Suspend>,
    /// Token usage of the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `GET /runs/{id}/snapshot`: the run reply plus the conversation, from one
/// replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotReply {
    /// The run's state, as [`RunReply`].
    #[serde(flatten)]
    pub run: RunReply,
    /// Complete messages with their content parts.
    pub messages: Vec<Value>,
}

/// `GET /runs`: a page of runs, and how many match the filters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    /// The page.
    pub runs: Vec<RunRow>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// How many runs the caller may see match the filters, over all
    /// pages.
    pub total: u64,
}

/// One run in a listing: its journal row, with what its state adds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// The run.
    pub id: String,
    /// Its state.
    pub state: RunState,
    /// Its title.
    pub title: Option<String>,
    /// When its last event was recorded (RFC 3339).
    pub updated: Option<String>,
    /// When it was created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Its address in this channel, or else the first it holds in any
    /// (`namespace:name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Turns started over its life.
    #[serde(default)]
    pub turns: u64,
    /// Tokens every model call used, over all turns.
    #[serde(default)]
    pub usage: Usage,
    /// What those tokens cost in USD under the server's `[pricing]`;
    /// absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Why the last turn failed, while the run rests failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Why it waits, while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<Suspend>,
    /// The tool call a tool's suspension parked, with its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ParkedCall>,
    /// Its last journal position: stream after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
    /// The run it was forked from, when it is a fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// How many events its journal holds.
    #[serde(default)]
    pub events: u64,
    /// The bytes those events take as stored (absent for a run the
    /// runtime keeps to itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Past `warn_at` of a `[limits]` limit: once past the limit itself,
    /// new input to the run is refused with `run_too_large`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub near_limit: bool,
    /// The digest (`sha256:…`) of the agent definition the run started
    /// with; `spool agent diff` compares two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// Where a fork came from: the source run and the turn it was cut at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    /// The source run.
    pub run_id: String,
    /// The source's turn.
    pub turn_id: String,
    /// `after` (the fork holds the turn) or `before` (it stops before it).
    pub cut: String,
}

/// A turn's failure: its stable code and message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The stable code (`provider_error`, `internal`, …).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// A parked tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedCall {
    /// The call.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, as the model gave them.
    pub arguments: Value,
}

/// `GET /runs/{id}/events`: a page of the run's journal, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalPage {
    /// The page.
    pub events: Vec<JournalEntry>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// One recorded event with its timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Its journal position.
    pub seq: u64,
    /// Its kind (`turn_started`, `model_call_completed`, …; see
    /// `docs/journal.md`).
    pub kind: String,
    /// When it was recorded (RFC 3339).
    pub time: String,
    /// The turn it belongs to, once one started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// For a model or tool call's completion: milliseconds since its
    /// request was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// For a model call's completion: the tokens it used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// For a model call's completion: what it cost in USD under the
    /// server's `[pricing]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The event's payload as recorded.
    pub data: Value,
}

/// `POST /runs/{id}/respond`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Respond {
    /// One answer or more.
    pub responses: Vec<Answer>,
}

/// One answer to a waiting run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The answer's text.
    #[serde(default)]
    pub text: String,
    /// The suspension's turn, to refuse a delayed answer to an older turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// For approvals: `true` approves, `false` rejects, absent is a
    /// text-only answer and rejects nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
}

/// `POST /runs/{id}/cancel`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// The turn observed, so a later turn is safe from a stale command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

string_enum! {
    /// The outcome of a cancel command.
    pub enum CancelStatus {
        /// Saved; wait for `cancelled`. Answered with 202.
        Requested = "requested",
        /// Nothing was running. Answered with 200.
        NotActive = "not_active",
        /// The named turn is not the current one. Answered with 200.
        Stale = "stale",
    }
}

impl CancelStatus {
    /// 202 for `requested`, 200 for the no-op outcomes.
    #[must_use]
    pub fn status(&self) -> u16 {
        if *self == Self::Requested { 202 } else { 200 }
    }
}

/// The reply to a cancel command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelReply {
    /// What happened.
    pub status: CancelStatus,
    /// The run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The turn concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// `POST /runs/{id}/reset`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reset {
    /// Why, for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The reply to `DELETE /runs/{id}`: the run's tombstone, all that is
/// left of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// The run.
    pub run_id: String,
    /// When it was deleted (RFC 3339).
    pub deleted_at: String,
    /// Who deleted it: the caller's id, `operator` (the command line) or
    /// `retention`.
    pub by: String,
    /// Why, when that was said (the retention rule that expired it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How many events were removed.
    pub events: u64,
}

/// The reply to `POST /agent/reload`: which agent definition new runs
/// start on now, and what the reload could not apply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReloaded {
    /// The digest (`sha256:…`) of the definition new runs start on.
    pub agent: String,
    /// The digest it replaced; absent when the definition did not change
    /// (or the server ran none before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Whether the definition changed.
    pub changed: bool,
    /// Sections that differ but configure the server itself (`server`,
    /// `schedule`, `retention`, `telemetry`, `bus`, `a2a`, `agent.name`): they take
    /// effect at the next start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_required: Vec<String>,
    /// The digests of the definitions in memory, the current one first:
    /// the others are those runs in memory still run on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_memory: Vec<String>,
}

/// `POST /runs/{id}/fork`: a new run holding the run's history through a
/// turn's end (`after`) or up to its start (`before`); exactly one of the
/// two.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fork {
    /// Through this turn's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Up to this turn's start: to run it again, or with another message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// The fork's title; the source's by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

impl Fork {
    /// The turn and whether the fork holds it (`true`: `after`).
    ///
    /// # Errors
    ///
    /// `bad_request` unless exactly one of `after` and `before` is given.
    pub fn cut(&self) -> Result<(&str, bool), HttpRejection> {
        match (&self.after, &self.before) {
            (Some(turn), None) => Ok((turn, true)),
            (None, Some(turn)) => Ok((turn, false)),
            _ => Err(HttpRejection::new(
                ErrorCode::BadRequest,
                "give exactly one of `after` (through that turn) and `before` (up to it)",
            )),
        }
    }
}

/// The reply to an address ensure or lookup: the run, not a model result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressReply {
    /// The bound run.
    pub run_id: String,
    /// The last journal position; stream after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
}

string_enum! {
    /// Every stream line type. The first six are the seed's; the rest are
    /// Spool's (the seed leaves "other types" to the runtime), listed with
    /// their `data` in `docs/protocol/http.md`. A type this version does
    /// not know reads as `Unknown`.
    pub enum StreamEventType {
        /// A turn started (`text`: its input).
        RunTurn = "run_turn",
        /// A cancel was saved.
        RunCancelRequested = "run_cancel_requested",
        /// The state changed (`state`): sent on every transition.
        RunState = "run_state",
        /// The run parked (`text`: the prompt; `data`: the suspension).
        RunSuspend = "run_suspend",
        /// The run was answered and goes on.
        RunResume = "run_resume",
        /// The turn's answer (`text`).
        RunResponse = "run_response",
        /// The run was made (`data`: `title`, `kind`, `address`).
        RunCreated = "run_created",
        /// Input steered into or queued behind the running turn (`text`;
        /// `data.policy`: `steer` or `queue`).
        RunInput = "run_input",
        /// The model called a tool (`data`: `call_id`, `name`, `input`,
        /// `effect`).
        ToolCall = "tool_call",
        /// A tool call's result (`text`: what the model sees; `data`:
        /// `call_id`, and `error`, `resolved` or `abandoned` when so).
        ToolResult = "tool_result",
        /// The model's context changed (`data.change`: `cleared` or
        /// `compacted`).
        RunContext = "run_context",
        /// An address was bound to or freed from the run (`data`:
        /// `address`, `bound`).
        RunAddress = "run_address",
        /// Live: a piece of the answer (`text`).
        TextDelta = "text_delta",
        /// Live: a piece of the model's thinking (`text`).
        ThinkingDelta = "thinking_delta",
        /// Live: a tool call began (`data`: `id`, `name`).
        ToolCallStart = "tool_call_start",
        /// Live: a piece of a tool call's arguments (`data`: `id`, `json`).
        ToolCallArgsDelta = "tool_call_args_delta",
        /// Live: a tool call's arguments are complete (`data`: `id`,
        /// `name`, `arguments`).
        ToolCallDone = "tool_call_done",
        /// Live: a running tool call's progress (`data`: `id`, `message`).
        /// Spool's own type, beside the seed's (which leaves room for other
        /// types).
        ToolProgress = "tool_progress",
        /// The reader fell behind and the stream ends here: resume from
        /// `seq`.
        Lagged = "lagged",
    }
}

/// One NDJSON stream line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    /// The run.
    pub run_id: String,
    /// The journal position; the cursor to resume after.
    pub seq: u64,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: StreamEventType,
    /// When, RFC 3339.
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// The turn concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Text, for deltas and answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The new state, for `run_state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RunState>,
    /// Anything else the event carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// `GET /health`: liveness only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always true when answered.
    pub ok: bool,
    /// `ready`.
    pub status: String,
}

impl Health {
    /// The one reply health gives.
    #[must_use]
    pub fn ready() -> Self {
        Self {
            ok: true,
            status: "ready".to_owned(),
        }
    }
}

/// `GET /ready`, Spool's readiness route beside the seed's liveness-only
/// `/health`: whether the server can take work now. 200 with `status:
/// "ready"`, or 503 with `status: "journal_unavailable"` while the journal
/// cannot write (runs waiting for it resume by themselves once it can).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// Whether the server can take work.
    pub ok: bool,
    /// `ready` or `journal_unavailable`.
    pub status: String,
    /// Runs whose turn waits for the journal, when it cannot write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_runs: Option<u64>,
}

/// `GET /schedules`: every configured schedule (none: an empty list).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleList {
    /// The schedules, by name.
    pub schedules: Vec<ScheduleReply>,
    /// Whether this caller may trigger them (`POST
    /// /schedules/{name}/trigger`): what a console asks before it offers
    /// the button.
    #[serde(default)]
    pub can_trigger: bool,
}

/// A schedule: its definition, next firing and recent firings (`GET
/// /schedules/{name}`, and each item of the list).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleReply {
    /// Its name.
    pub name: String,
    /// Its cron expression (five fields, or six with seconds first).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub time_zone: String,
    /// The message each firing sends.
    pub text: String,
    /// The HTTP address whose run each firing messages; absent, each
    /// firing starts a fresh run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// One-turn context sent with each firing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// `skip` or `queue`: a firing while the last one's turn runs.
    pub overlap: String,
    /// `latest` or `skip`: occurrences missed while the server was down.
    pub catch_up: String,
    /// The next firing by the cron expression.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub next_fire_at: Option<OffsetDateTime>,
    /// Recent firings, oldest first.
    pub history: Vec<FiringReply>,
}

/// One firing of a schedule, and the reply to a trigger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiringReply {
    /// Its id within the schedule: `cron:<instant>`, `manual:<id>` or
    /// `external:<caller's id>`.
    pub fire_id: String,
    /// `cron`, `catch_up`, `manual` or `external`.
    pub kind: String,
    /// When it was due.
    #[serde(with = "time::serde::rfc3339")]
    pub scheduled_at: OffsetDateTime,
    /// When it was recorded.
    #[serde(with = "time::serde::rfc3339")]
    pub fired_at: OffsetDateTime,
    /// `started`, `queued`, `skipped`, `failed`, or `in_doubt` (recorded;
    /// the next start settles it).
    pub status: String,
    /// The run its message went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The turn it started, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Why it was skipped or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /schedules/{name}/trigger`: `{}` for a manual firing, or `{id,
/// scheduled_at, kind: "external"}` for one fired by the caller's own
/// scheduler (retried with the same id, it fires once). Decoded strictly:
/// an unknown field or a trailing value is a 400.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerRequest {
    /// The caller's stable id for the firing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When the caller's scheduler had it due (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub scheduled_at: Option<OffsetDateTime>,
    /// `external`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// The longest external trigger id, in characters.
pub const MAX_TRIGGER_ID: usize = 256;

/// A trigger, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TriggerKind {
    /// `{}`.
    Manual,
    /// `{id, scheduled_at, kind: "external"}`.
    External {
        /// The caller's id.
        id: String,
        /// When it was due.
        scheduled_at: OffsetDateTime,
    },
}

impl TriggerRequest {
    /// Which trigger this is.
    ///
    /// # Errors
    ///
    /// `bad_request` for a partial external trigger, a kind other than
    /// `external`, or an empty or over-long id.
    pub fn check(self) -> Result<TriggerKind, HttpRejection> {
        let bad = |message: &str| HttpRejection::new(ErrorCode::BadRequest, message);
        match (self.id, self.scheduled_at, self.kind.as_deref()) {
            (None, None, None) => Ok(TriggerKind::Manual),
            (Some(id), Some(scheduled_at), Some("external")) => {
                if id.is_empty() || id.chars().count() > MAX_TRIGGER_ID {
                    return Err(bad("`id` must be 1 to 256 characters"));
                }
                Ok(TriggerKind::External { id, scheduled_at })
            }
            (_, _, Some(kind)) if kind != "external" => Err(bad("`kind` must be `external`")),
            _ => Err(bad(
                "an external trigger needs `id`, `scheduled_at` and `kind: \"external\"` together; a manual one sends `{}`",
            )),
        }
    }
}

/// `GET /info`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    /// The agent's name, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The Spool release.
    pub version: String,
    /// The mounted channels.
    pub channels: Vec<String>,
}

/// Every non-2xx reply: `{"error": "…", "code": "…"}`. Branch on `code`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable; internal details never go here.
    pub error: String,
    /// The stable code.
    pub code: ErrorCode,
}

string_enum! {
    /// The channel's stable error codes.
    pub enum ErrorCode {
        /// The body or a parameter is malformed.
        BadRequest = "bad_request",
        /// The run id is malformed.
        InvalidRunId = "invalid_run_id",
        /// `turn_policy` is neither `steer` nor `queue`.
        UnknownTurnPolicy = "unknown_turn_policy",
        /// No valid credentials.
        Unauthenticated = "unauthenticated",
        /// No such run (or route).
        RunNotFound = "run_not_found",
        /// No schedule has the name.
        ScheduleNotFound = "schedule_not_found",
        /// The caller is known but may not do this (trigger a schedule).
        Forbidden = "forbidden",
        /// The body names a turn the run's history does not hold (a
        /// fork's `after` or `before`): 409, as the route and its run
        /// exist.
        TurnNotFound = "turn_not_found",
        /// The route exists, not with this method.
        MethodNotAllowed = "method_not_allowed",
        /// The run waits for an answer; use `/respond`.
        RunWaiting = "run_waiting",
        /// `/respond` to a run that is not waiting (or a stale turn id).
        RunNotWaiting = "run_not_waiting",
        /// A turn is running.
        RunActive = "run_active",
        /// No turn is running.
        RunNotActive = "run_not_active",
        /// The run is retired.
        RunRetired = "run_retired",
        /// The run was deleted: only its tombstone is left (410).
        RunDeleted = "run_deleted",
        /// The run's history is past a limit (`[limits]`): new input to
        /// it is refused; start a new run or fork an earlier turn.
        RunTooLarge = "run_too_large",
        /// Another node owns the run.
        RunOwnedElsewhere = "run_owned_elsewhere",
        /// The journal cannot be replayed into a conversation.
        ConversationCorrupt = "conversation_corrupt",
        /// The body did not arrive within the time allowed.
        RequestTimeout = "request_timeout",
        /// The body is over the cap.
        TooLarge = "too_large",
        /// The request target (path and query) is too long.
        UriTooLong = "uri_too_long",
        /// The request's headers are too many or too large.
        HeadersTooLarge = "headers_too_large",
        /// The client went away first.
        ClientClosed = "client_closed",
        /// File uploads are not supported.
        FilesUnsupported = "files_unsupported",
        /// The engine cannot compact.
        CompactionUnsupported = "compaction_unsupported",
        /// The model provider failed a call the request needed (a
        /// compaction's summary); the message carries the engine's code.
        EngineFailed = "engine_failed",
        /// The request carries an `Origin` that is neither the server's
        /// own nor allowed (`--allow-origin`): a page on another site.
        OriginNotAllowed = "origin_not_allowed",
        /// The request's `Host` is not served on this listener (a
        /// loopback listener serves loopback names and `--allow-host`).
        HostNotAllowed = "host_not_allowed",
        /// The body is not declared JSON (`application/json` or
        /// `application/*+json`, UTF-8).
        UnsupportedMediaType = "unsupported_media_type",
        /// An address is longer than [`crate::run::MAX_ADDRESS_BYTES`].
        AddressTooLong = "address_too_long",
        /// A title is longer than [`crate::run::MAX_TITLE_BYTES`].
        TitleTooLong = "title_too_long",
        /// An operation id is longer than
        /// [`crate::run::MAX_OPERATION_ID_BYTES`].
        OperationIdTooLong = "operation_id_too_long",
        /// A reloaded agent definition does not parse, or its engine or
        /// tools cannot be built: the server keeps the definition it had.
        AgentInvalid = "agent_invalid",
        /// The server failed; details are in its log.
        Internal = "internal",
        /// The journal cannot write now (a full disk, a failing device):
        /// nothing was recorded. Runs resume by themselves once it can;
        /// retry after `Retry-After` seconds.
        JournalUnavailable = "journal_unavailable",
        /// On a cluster: the node that drives the run could not be
        /// reached to forward the command to; nothing was recorded. Retry
        /// after `Retry-After` seconds (a dead node's runs move to a live
        /// one within the lease time).
        NodeUnavailable = "node_unavailable",
    }
}

impl ErrorCode {
    /// The HTTP status the code is answered with; `None` for a code this
    /// version does not know.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        Some(match self {
            Self::BadRequest
            | Self::InvalidRunId
            | Self::UnknownTurnPolicy
            | Self::AddressTooLong
            | Self::TitleTooLong
            | Self::OperationIdTooLong => 400,
            Self::Unauthenticated => 401,
            Self::Forbidden | Self::OriginNotAllowed | Self::HostNotAllowed => 403,
            Self::RunNotFound | Self::ScheduleNotFound => 404,
            Self::RunDeleted => 410,
            Self::MethodNotAllowed => 405,
            Self::RunWaiting
            | Self::RunNotWaiting
            | Self::RunActive
            | Self::RunNotActive
            | Self::RunRetired
            | Self::RunTooLarge
            | Self::RunOwnedElsewhere
            | Self::ConversationCorrupt
            | Self::TurnNotFound => 409,
            Self::RequestTimeout => 408,
            Self::AgentInvalid => 422,
            Self::TooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::UriTooLong => 414,
            Self::HeadersTooLarge => 431,
            Self::ClientClosed => 499,
            Self::Internal => 500,
            Self::FilesUnsupported | Self::CompactionUnsupported => 501,
            Self::EngineFailed => 502,
            Self::JournalUnavailable | Self::NodeUnavailable => 503,
            Self::Unknown(_) => return None,
        })
    }
}

impl ErrorBody {
    /// An error reply.
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            code,
        }
    }
}

impl From<HttpRejection> for ErrorBody {
    fn from(rejection: HttpRejection) -> Self {
        Self::new(rejection.code, rejection.message)
    }
}

/// Reads a JSON object body into `T`. An empty body reads as `{}`, so
/// commands whose fields are all optional (cancel, reset) need none.
///
/// # Errors
///
/// `bad_request` when the body is not a JSON object or a field has the
/// wrong type.
pub fn decode_body<T: DeserializeOwned>(text: &str) -> Result<T, HttpRejection> {
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_util::object_from_str(text).map_err(|e| {
        let e = if e == "must be a JSON object" {
            "body must be a JSON object".to_owned()
        } else {
            e
        };
        HttpRejection::new(ErrorCode::BadRequest, e)
    })
}

fn check_turn_policy(policy: Option<&TurnPolicy>) -> Result<(), HttpRejection> {
    match policy {
        Some(TurnPolicy::Unknown(other)) => Err(HttpRejection::new(
            ErrorCode::UnknownTurnPolicy,
            format!("unknown turn_policy `{other}`; use `steer` or `queue`"),
        )),
        _ => Ok(()),
    }
}

impl StartRun {
    /// Reads and checks a `POST /runs` body.
    ///
    /// # Errors
    ///
    /// `bad_request` for a malformed body, a missing `text`, an empty
    /// `address` or `operation_id`, or `operation_id` together with
    /// `address`; `unknown_turn_policy` for a policy other than steer or
    /// queue. (That `operation_id` needs a verified principal is checked
    /// where the principal is known, by the transport.)
    pub fn decode(text: &str) -> Result<Self, HttpRejection> {
        let start: Self = decode_body(text)?;
        check_turn_policy(start.turn_policy.as_ref())?;
        if start.address.as_deref() == Some("") {
            return Err(HttpRejection::new(
                ErrorCode::BadRequest,
                "`address` must not be empty",
            ));
        }
        if start.operation_id.as_deref() == Some("") {
            return Err(HttpRejection::new(
                ErrorCode::BadRequest,
                "`operation_id` must not be empty",
            ));
        }
        if start.operation_id.is_some() && start.address.is_some() {
            return Err(HttpRejection::new(
                ErrorCode::BadRequest,
                "`operation_id` cannot accompany `address`",
            ));
        }
        Ok(start)
    }

    /// The policy, `steer` when none was given.
    #[must_use]
    pub fn turn_policy(&self) -> TurnPolicy {
        self.turn_policy.clone().unwrap_or(TurnPolicy::Steer)
    }
}

impl MessageRun {
    /// Reads and checks a `POST /runs/{id}` body.
    ///
    /// # Errors
    ///
    /// `bad_request` for a malformed body or a missing `text`;
    /// `unknown_turn_policy` for a policy other than steer or queue.
    pub fn decode(text: &str) -> Result<Self, HttpRejection> {
        let message: Self = decode_body(text)?;
        check_turn_policy(message.turn_policy.as_ref())?;
        Ok(message)
    }

    /// The policy, `steer` when none was given.
    #[must_use]
    pub fn turn_policy(&self) -> TurnPolicy {
        self.turn_policy.clone().unwrap_or(TurnPolicy::Steer)
    }
}

impl Respond {
    /// Reads and checks a `/respond` body.
    ///
    /// # Errors
    ///
    /// `bad_request` for a malformed body or an empty `responses`.
    pub fn decode(text: &str) -> Result<Self, HttpRejection> {
        let respond: Self = decode_body(text)?;
        if respond.responses.is_empty() {
            return Err(HttpRejection::new(
                ErrorCode::BadRequest,
                "`responses` must not be empty",
            ));
        }
        Ok(respond)
    }
}

/// Go's decoder reads a JSON `null` map as an empty one; so does this.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<BTreeMap<String, String>>::deserialize(deserializer)?.unwrap_or_default())
}
