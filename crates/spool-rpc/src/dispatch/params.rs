//! The methods' params as they decode, the channels a subscription names,
//! and the failures a method answers with (a runtime error as JSON-RPC
//! says it).

use super::*;

/// `submit.run`'s params: the HTTP channel's start fields, and `run_id` to
/// continue a run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmitRun {
    pub(super) text: String,
    #[serde(default)]
    pub(super) run_id: Option<String>,
    #[serde(default)]
    pub(super) address: Option<String>,
    #[serde(default)]
    pub(super) operation_id: Option<String>,
    #[serde(default)]
    pub(super) title: Option<String>,
    #[serde(default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) context: Option<Vec<String>>,
    #[serde(default)]
    pub(super) turn_policy: Option<wire::TurnPolicy>,
    /// For a new run: whether it follows newer agent definitions.
    #[serde(default)]
    pub(super) upgrade: Option<spool_wire::run::Upgrade>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunParams {
    pub(super) run_id: String,
}

/// `state.snapshot`'s params: the run, or none for the one the
/// connection subscribes to.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SnapshotParams {
    #[serde(default)]
    pub(super) run_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RespondParams {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) turn_id: Option<String>,
    pub(super) responses: Vec<AnswerParams>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AnswerParams {
    #[serde(default)]
    pub(super) text: String,
    #[serde(default)]
    pub(super) approved: Option<bool>,
    /// The turn the answer is for, as the HTTP channel's answers name it.
    #[serde(default)]
    pub(super) turn_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelParams {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) turn_id: Option<String>,
}

/// `run.fork`'s params: the run, and the fork's `after`, `before` and
/// `title` as `POST /runs/{id}/fork` takes them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForkParams {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) after: Option<String>,
    #[serde(default)]
    pub(super) before: Option<String>,
    #[serde(default)]
    pub(super) title: Option<String>,
}

/// `run.delete`'s params: the run, and whether a turn in progress is
/// cancelled first (`DELETE /runs/{id}?force=true`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteParams {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) force: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    #[serde(default)]
    pub(super) limit: Option<usize>,
}

/// `unsubscribe`'s params: the run, and the channels to leave (all of
/// them when none are named).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Unsubscribe {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) channels: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Subscribe {
    pub(super) run_id: String,
    #[serde(default)]
    pub(super) cursor: Option<u64>,
    #[serde(default)]
    pub(super) channels: Option<Vec<String>>,
}

/// The channels a subscription carries.
#[derive(Clone, Copy, Debug)]
pub(super) struct Channels {
    pub(super) events: bool,
    pub(super) state: bool,
}

impl Channels {
    /// The channels asked for: `spool:events` when none are named.
    pub(super) fn of(names: Option<&[String]>) -> Result<Self, Failure> {
        let Some(names) = names else {
            return Ok(Self {
                events: true,
                state: false,
            });
        };
        let mut channels = Self {
            events: false,
            state: false,
        };
        if names.len() > MAX_CHANNELS {
            return Err(invalid_params(format!(
                "`channels` names at most {MAX_CHANNELS} channels"
            )));
        }
        for name in names {
            // The seed's `vx:*` names are aliases of Spool's.
            match rpc::canonical_channel(name) {
                rpc::CHANNEL_EVENTS => channels.events = true,
                rpc::CHANNEL_STATE => channels.state = true,
                other => {
                    return Err(invalid_params(format!(
                        "channel `{other}` cannot be subscribed to; `{}` and `{}` can",
                        rpc::CHANNEL_EVENTS,
                        rpc::CHANNEL_STATE
                    )));
                }
            }
        }
        if !(channels.events || channels.state) {
            return Err(invalid_params("`channels` names no channel"));
        }
        Ok(channels)
    }

    /// As one number, to share with a running subscription.
    pub(super) fn bits(self) -> u8 {
        u8::from(self.events) | (u8::from(self.state) << 1)
    }

    /// From [`Channels::bits`].
    pub(super) fn from_bits(bits: u8) -> Self {
        Self {
            events: bits & 1 != 0,
            state: bits & 2 != 0,
        }
    }

    pub(super) fn names(self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.events {
            names.push(rpc::CHANNEL_EVENTS);
        }
        if self.state {
            names.push(rpc::CHANNEL_STATE);
        }
        names
    }
}

/// Decodes a method's params; absent params read as `{}`.
pub(super) fn params<T: DeserializeOwned>(value: &Value) -> Result<T, Failure> {
    let value = if value.is_null() { &json!({}) } else { value };
    T::deserialize(value).map_err(|e| invalid_params(e.to_string()))
}

pub(super) fn run_id(raw: &str) -> Result<RunId, Failure> {
    RunId::new(raw).map_err(|e| invalid_params(format!("`run_id`: {e}")))
}

pub(super) fn invalid_params(reason: impl Into<String>) -> Failure {
    Failure(ErrorObject::with_reason(codes::INVALID_PARAMS, reason))
}

pub(super) fn internal() -> ErrorObject {
    ErrorObject::with_reason(codes::INTERNAL_ERROR, "internal error")
}

/// A runtime error as JSON-RPC says it: the code by kind, and `data` with
/// the runtime's kind and the HTTP channel's code, so a client of both
/// branches on one vocabulary. Internal details go to the log.
pub(super) fn runtime_error(error: RuntimeError) -> Failure {
    let kind = error.kind();
    let http = spool_edge::tables::error_code(kind);
    let code = match kind {
        ErrorKind::RunNotFound | ErrorKind::AddressNotFound => codes::RUN_NOT_FOUND,
        ErrorKind::BadRequest
        | ErrorKind::InvalidAnswer
        | ErrorKind::AddressTooLong
        | ErrorKind::TitleTooLong
        | ErrorKind::OperationIdTooLong => codes::INVALID_PARAMS,
        ErrorKind::Internal => codes::INTERNAL_ERROR,
        _ => codes::USER_ERROR,
    };
    if code == codes::INTERNAL_ERROR {
        tracing::error!(target: "spool::rpc", error = %error, "internal error");
        return Failure(internal());
    }
    let mut object = ErrorObject::with_reason(code, error.to_string());
    object.data = Some(json!({"reason": error.to_string(), "code": http.as_str()}));
    Failure(object)
}

pub(super) fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("replies are plain JSON values")
}

pub(super) fn now_nanos() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(0)
}
