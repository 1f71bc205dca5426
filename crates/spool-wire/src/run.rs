//! The run vocabulary every transport shares: a run's state, what a
//! waiting run waits for, and what happens to input that arrives while a
//! turn runs.
//!
//! These enums are closed: the journal and the runtime hold only values
//! they know, and a value they do not know is refused where it enters
//! ([`std::str::FromStr`] and serde name the values they accept). Each
//! transport maps them to its own words at its edge; the HTTP channel's
//! open forms in [`crate::http`] convert with `From` (outward) and
//! `TryFrom` (inward, refusing `Unknown`).
//!
//! ```
//! use spool_wire::run::{SuspendKind, TurnPolicy};
//!
//! assert_eq!("approval".parse::<SuspendKind>(), Ok(SuspendKind::Approval));
//! let refused = "whenever".parse::<TurnPolicy>().unwrap_err();
//! assert_eq!(refused.to_string(), "unknown turn policy `whenever` (known: steer, queue, if_idle)");
//! // Outward, the HTTP channel's open form says the same.
//! assert_eq!(spool_wire::http::SuspendKind::from(SuspendKind::Approval).as_str(), "approval");
//! ```

pub use crate::code::UnknownValue;
use crate::code::{closed_enum, string_enum};
use crate::http;

closed_enum! {
    /// A run's state.
    pub enum RunState as "run state" {
        /// Created, no turn yet.
        Pending = "pending",
        /// A turn is running.
        Running = "running",
        /// Parked; the suspension says why.
        Waiting = "waiting",
        /// The last turn completed; the run takes another.
        Completed = "completed",
        /// The last turn failed; the run takes another.
        Failed = "failed",
        /// The last turn was cancelled; the run takes another.
        Cancelled = "cancelled",
        /// Closed for good.
        Retired = "retired",
    }
}

closed_enum! {
    /// What a waiting run waits for.
    pub enum SuspendKind as "suspension kind" {
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
        /// An operator's decision about a write that may or may not have
        /// happened.
        Reconciliation = "reconciliation",
    }
}

closed_enum! {
    /// What happens to input that arrives while a turn is in progress.
    pub enum TurnPolicy as "turn policy" {
        /// Give it to the model before its next call in the running turn.
        Steer = "steer",
        /// Run it as a new turn after the running one.
        Queue = "queue",
        /// Start a turn only if none is in progress, atomically; refuse it
        /// otherwise. Of many callers racing on an idle run, exactly one
        /// starts a turn (the Pod protocol's "the first run wins").
        IfIdle = "if_idle",
    }
}

closed_enum! {
    /// Whether a run follows its agent's newer definitions: `pinned` runs
    /// every turn on the definition it started with; `next_turn` moves to
    /// the server's newest definition when its next turn starts.
    pub enum Upgrade as "upgrade policy" {
        /// Every turn on the definition the run started with.
        Pinned = "pinned",
        /// Each turn on the newest definition when the turn starts.
        NextTurn = "next_turn",
    }
}

string_enum! {
    /// Why a turn failed: the code a `turn_failed` records, and what a
    /// transport shows a client. Additive and persisted, so open: a code a
    /// newer Spool wrote reads back as `Unknown` and re-encodes unchanged.
    pub enum FailureCode {
        /// The runtime could not go on (a panic in host code, a log that
        /// does not replay, a turn that made no progress).
        Internal = "internal",
        /// A budget ran out and an operator declined to extend it, or the
        /// provider's quota or rate limit held after every retry.
        Budget = "budget",
        /// An operator gave up a write that may or may not have happened.
        ToolAbandoned = "tool_abandoned",
        /// The model provider refused or failed the call.
        ProviderError = "provider_error",
        /// The provider refused the credentials.
        Auth = "auth",
        /// The provider did not answer in time.
        Timeout = "timeout",
        /// A provider run as a child process failed.
        EngineCli = "engine_cli",
        /// The call was cancelled (a turn that ends so is `cancelled`, not
        /// failed).
        Cancelled = "cancelled",
        /// The engine cannot compact a conversation.
        CompactionUnsupported = "compaction_unsupported",
    }
}

string_enum! {
    /// A budget, by the name a `budget_exceeded` records. Persisted, so
    /// open like [`FailureCode`].
    pub enum Budget {
        /// Model calls in one turn.
        StepsPerTurn = "steps_per_turn",
        /// Input and output tokens in one turn.
        Tokens = "tokens",
        /// Seconds since the turn started.
        WallSeconds = "wall_seconds",
        /// What the turn's tokens cost, in millionths of a US dollar.
        CostMicroUsd = "cost_micro_usd",
    }
}

macro_rules! to_and_from_http {
    ($($name:ident),+) => {$(
        impl From<$name> for http::$name {
            fn from(value: $name) -> Self {
                Self::parse(value.as_str())
            }
        }

        impl TryFrom<&http::$name> for $name {
            type Error = UnknownValue;

            fn try_from(value: &http::$name) -> Result<Self, Self::Error> {
                value.as_str().parse()
            }
        }
    )+};
}

to_and_from_http!(RunState, SuspendKind, TurnPolicy);

/// The longest address (the name within its namespace) any transport
/// takes, in bytes of UTF-8: `address_too_long` past it.
pub const MAX_ADDRESS_BYTES: usize = 512;
/// The longest run title, in bytes of UTF-8: `title_too_long` past it.
pub const MAX_TITLE_BYTES: usize = 1024;
/// The longest operation id, in bytes of UTF-8: `operation_id_too_long`
/// past it.
pub const MAX_OPERATION_ID_BYTES: usize = 256;
/// The longest surface kind (`dm`, `thread`), in bytes of UTF-8.
pub const MAX_KIND_BYTES: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_through_its_name_and_the_http_form() {
        for state in RunState::KNOWN {
            assert_eq!(state.as_str().parse(), Ok(*state));
            assert_eq!(
                RunState::try_from(&http::RunState::from(*state)),
                Ok(*state)
            );
        }
        for kind in SuspendKind::KNOWN {
            assert_eq!(kind.as_str().parse(), Ok(*kind));
            assert_eq!(
                SuspendKind::try_from(&http::SuspendKind::from(*kind)),
                Ok(*kind)
            );
        }
        for policy in TurnPolicy::KNOWN {
            assert_eq!(policy.as_str().parse(), Ok(*policy));
        }
    }

    #[test]
    fn an_unknown_http_value_is_refused_on_entry() {
        let unknown = http::SuspendKind::Unknown("telepathy".into());
        let refused = SuspendKind::try_from(&unknown).unwrap_err();
        assert_eq!(refused.value, "telepathy");
        assert_eq!(refused.what, "suspension kind");
    }

    #[test]
    fn an_unknown_value_does_not_decode_from_json() {
        let error = serde_json::from_str::<TurnPolicy>(r#""later""#).unwrap_err();
        assert!(
            error.to_string().contains("unknown turn policy `later`"),
            "{error}"
        );
        assert_eq!(
            serde_json::to_string(&TurnPolicy::IfIdle).unwrap(),
            r#""if_idle""#
        );
    }
}
