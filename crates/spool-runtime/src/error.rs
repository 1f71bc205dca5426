//! The runtime's errors, each with the HTTP channel's code, so every
//! transport maps them the same way.

use spool_journal::{JournalError, RunId, TurnId};
use spool_wire::http::ErrorCode;

/// Why a runtime operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No such run.
    #[error("no run {0}")]
    RunNotFound(RunId),
    /// No run holds the address.
    #[error("no run holds address {0}")]
    AddressNotFound(spool_journal::Address),
    /// A turn is running; the operation needs an idle run.
    #[error("run {0} has a turn in progress")]
    RunActive(RunId),
    /// The run waits for an answer; answer it with respond.
    #[error("run {0} is waiting for an answer; use respond")]
    RunWaiting(RunId),
    /// The run is not waiting for an answer (or not for this turn).
    #[error("run {run} is not waiting for an answer{}", .turn.as_ref().map(|t| format!(" for turn {t}")).unwrap_or_default())]
    RunNotWaiting {
        /// The run.
        run: RunId,
        /// The turn the caller named, when it was stale.
        turn: Option<TurnId>,
    },
    /// The run is retired for good.
    #[error("run {0} is retired")]
    RunRetired(RunId),
    /// An answer does not satisfy the suspension's schema.
    #[error("the answer does not fit what run {run} asked for: {reason}")]
    InvalidAnswer {
        /// The run.
        run: RunId,
        /// What is wrong.
        reason: String,
    },
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The operation id already started a run with a different request.
    #[error("operation id `{operation_id}` already started run {run} with a different request")]
    OperationConflict {
        /// The operation id.
        operation_id: String,
        /// The run it started.
        run: RunId,
    },
    /// The engine cannot compact a conversation.
    #[error("this agent's engine cannot compact a conversation")]
    CompactionUnsupported,
    /// The engine failed a call the request needed.
    #[error("{code}: {0}", code = .0.code())]
    Engine(crate::engine::EngineError),
    /// The run's journal cannot be replayed into a conversation.
    #[error("run {run} cannot be replayed: {reason}")]
    ConversationCorrupt {
        /// The run.
        run: RunId,
        /// Why.
        reason: String,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl RuntimeError {
    /// The run's journal cannot be replayed into a conversation.
    pub(crate) fn corrupt(run: &RunId, reason: String) -> Self {
        Self::ConversationCorrupt {
            run: run.clone(),
            reason,
        }
    }

    /// The HTTP channel's code for this error.
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::RunNotFound(_) | Self::AddressNotFound(_) => ErrorCode::RunNotFound,
            Self::RunActive(_) => ErrorCode::RunActive,
            Self::RunWaiting(_) => ErrorCode::RunWaiting,
            Self::RunNotWaiting { .. } => ErrorCode::RunNotWaiting,
            Self::RunRetired(_) => ErrorCode::RunRetired,
            Self::InvalidAnswer { .. } | Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::OperationConflict { .. } => ErrorCode::OperationConflict,
            Self::CompactionUnsupported => ErrorCode::CompactionUnsupported,
            Self::Engine(_) => ErrorCode::EngineFailed,
            Self::ConversationCorrupt { .. } | Self::Journal(JournalError::TamperEvident(_)) => {
                ErrorCode::ConversationCorrupt
            }
            // The run's log moved under this process, or another process
            // holds the journal: someone else is driving it.
            Self::Journal(JournalError::Conflict { .. } | JournalError::InUse { .. }) => {
                ErrorCode::RunOwnedElsewhere
            }
            Self::Journal(_) => ErrorCode::Internal,
        }
    }
}
