//! The `data` of each stream line type: one payload struct per type, what
//! the server builds lines from and what a client decodes them into with
//! [`StreamEvent::payload`]. Types with no `data` (`run_cancel_requested`,
//! the text and thinking deltas, `lagged`) decode to [`LineData::None`].

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use super::{StreamEvent, StreamEventType, SuspendKind, Usage};

/// `run_created`: how the run was created (who made it stays out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCreatedData {
    /// Its listing title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its surface kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The address it was created through, `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// `run_turn`: a turn began; the line's `text` is its input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTurnData {
    /// `steer` or `queue`: how input arriving during it is handled.
    pub policy: String,
    /// Its one-turn context.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
}

/// `run_input`: input steered into the running turn or queued after it;
/// the line's `text` is the input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInputData {
    /// `steer` or `queue`.
    pub policy: String,
}

/// `tool_call`: a tool call is about to be made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallData {
    /// The call.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// Its input.
    pub input: Value,
    /// `read`, `idempotent` or `write`.
    pub effect: String,
}

/// `tool_result`: a tool call's outcome; the line's `text` is its output.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultData {
    /// The call.
    pub call_id: String,
    /// The tool's failure, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// An operator settled a dangling call with this output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resolved: bool,
    /// An operator gave a dangling call up.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
}

/// `run_suspend`: the run parked for an answer, or ran out of a budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunSuspendData {
    /// Parked for an answer.
    Suspended(SuspendData),
    /// A budget ran out; an operator decides.
    Budget(BudgetData),
}

/// What a parked run asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuspendData {
    /// The parked turn.
    pub turn_id: String,
    /// What it waits for.
    pub kind: SuspendKind,
    /// What to show whoever answers.
    pub prompt: String,
    /// The parked tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The JSON Schema the answer must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
}

/// A budget that ran out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetData {
    /// Which (`tokens`, `steps_per_turn`, `wall_seconds`, `cost_usd`).
    pub budget: String,
    /// Its limit.
    pub limit: u64,
    /// What was used.
    pub used: u64,
}

/// `run_resume`: the run was answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResumeData {
    /// The turn that was parked.
    pub turn_id: String,
    /// The answers.
    pub answers: Vec<AnswerData>,
}

/// One answer, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerData {
    /// The text.
    #[serde(default)]
    pub text: String,
    /// The verdict, for an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
}

/// `run_response`: the turn's answer; the line's `text` is its response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResponseData {
    /// The turn.
    pub turn_id: String,
    /// The answer's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Tokens the turn used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `run_context`: the model's context changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunContextData {
    /// `cleared` or `compacted`.
    pub change: String,
}

/// `run_address`: the run took a name or gave one up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAddressData {
    /// `namespace/name`.
    pub address: String,
    /// Taken (`true`) or given up.
    pub bound: bool,
}

/// `run_state`, for the transitions that say more than the new state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunStateData {
    /// The turn failed (the line's `text` is the message).
    Failed(FailedData),
    /// The run sleeps until an instant.
    Sleeping(SleepData),
    /// The run was retired.
    Retired(RetiredData),
}

/// Why a turn failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedData {
    /// The turn.
    pub turn_id: String,
    /// A stable code (`provider_error`, `budget`, `internal`, …).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// A sleep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SleepData {
    /// The tool call that asked to sleep.
    pub call_id: String,
    /// When it wakes, RFC 3339.
    #[serde(with = "time::serde::rfc3339")]
    pub wake_at: OffsetDateTime,
}

/// A retirement.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredData {
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The one namespace whose addresses it freed (absent: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `tool_call_start`: the model began a tool call (live only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallStartData {
    /// The call's id.
    pub id: String,
    /// The tool.
    pub name: String,
}

/// `tool_call_args_delta`: a fragment of a tool call's arguments (live
/// only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallArgsDeltaData {
    /// The call's id.
    pub id: String,
    /// The next fragment of its JSON arguments.
    pub json: String,
}

/// `tool_progress`: a running tool call's progress (live only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolProgressData {
    /// The call's id.
    pub id: String,
    /// What the tool said of its progress.
    pub message: String,
}

/// `tool_call_done`: the model finished a tool call (live only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDoneData {
    /// The call's id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, whole, as the JSON text the model wrote.
    pub arguments: String,
}

/// A line's `data`, typed by the line's type.
#[derive(Clone, Debug, PartialEq)]
pub enum LineData {
    /// `run_created`.
    RunCreated(RunCreatedData),
    /// `run_turn`.
    RunTurn(RunTurnData),
    /// `run_input`.
    RunInput(RunInputData),
    /// `tool_call`.
    ToolCall(ToolCallData),
    /// `tool_result`.
    ToolResult(ToolResultData),
    /// `run_suspend`.
    RunSuspend(RunSuspendData),
    /// `run_resume`.
    RunResume(RunResumeData),
    /// `run_response`.
    RunResponse(RunResponseData),
    /// `run_context`.
    RunContext(RunContextData),
    /// `run_address`.
    RunAddress(RunAddressData),
    /// `run_state` with more than the state.
    RunState(RunStateData),
    /// `tool_call_start`.
    ToolCallStart(ToolCallStartData),
    /// `tool_call_args_delta`.
    ToolCallArgsDelta(ToolCallArgsDeltaData),
    /// `tool_call_done`.
    ToolCallDone(ToolCallDoneData),
    /// `tool_progress`.
    ToolProgress(ToolProgressData),
    /// No `data`: `run_cancel_requested`, the text and thinking deltas,
    /// `lagged`, a `run_state` that says only the state.
    None,
    /// A type this version does not know, its `data` as sent.
    Unknown(Option<Value>),
}

impl StreamEvent {
    /// The line's `data`, decoded by its type.
    ///
    /// # Errors
    ///
    /// When `data` does not have its type's shape.
    pub fn payload(&self) -> Result<LineData, serde_json::Error> {
        fn typed<T: DeserializeOwned>(data: Option<&Value>) -> Result<T, serde_json::Error> {
            T::deserialize(data.unwrap_or(&Value::Null))
        }
        let data = self.data.as_ref();
        Ok(match &self.kind {
            StreamEventType::RunCreated => LineData::RunCreated(match data {
                Some(data) => RunCreatedData::deserialize(data)?,
                None => RunCreatedData::default(),
            }),
            StreamEventType::RunTurn => LineData::RunTurn(typed(data)?),
            StreamEventType::RunInput => LineData::RunInput(typed(data)?),
            StreamEventType::ToolCall => LineData::ToolCall(typed(data)?),
            StreamEventType::ToolResult => LineData::ToolResult(typed(data)?),
            StreamEventType::RunSuspend => LineData::RunSuspend(typed(data)?),
            StreamEventType::RunResume => LineData::RunResume(typed(data)?),
            StreamEventType::RunResponse => LineData::RunResponse(typed(data)?),
            StreamEventType::RunContext => LineData::RunContext(typed(data)?),
            StreamEventType::RunAddress => LineData::RunAddress(typed(data)?),
            StreamEventType::RunState => match data {
                Some(data) => LineData::RunState(RunStateData::deserialize(data)?),
                None => LineData::None,
            },
            StreamEventType::ToolCallStart => LineData::ToolCallStart(typed(data)?),
            StreamEventType::ToolCallArgsDelta => LineData::ToolCallArgsDelta(typed(data)?),
            StreamEventType::ToolCallDone => LineData::ToolCallDone(typed(data)?),
            StreamEventType::ToolProgress => LineData::ToolProgress(typed(data)?),
            StreamEventType::RunCancelRequested
            | StreamEventType::TextDelta
            | StreamEventType::ThinkingDelta
            | StreamEventType::Lagged => LineData::None,
            StreamEventType::Unknown(_) => LineData::Unknown(self.data.clone()),
        })
    }
}

/// A payload as a line's `data`.
///
/// # Panics
///
/// Never: the payloads are plain JSON values.
#[must_use]
pub fn to_data<T: Serialize>(payload: &T) -> Value {
    serde_json::to_value(payload).expect("stream payloads are plain JSON values")
}
