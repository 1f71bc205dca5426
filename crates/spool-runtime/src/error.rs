//! The runtime's errors and their kinds. The kinds are the runtime's own
//! table: each transport maps a kind to its own code (HTTP status and
//! code, JSON-RPC error code, Pod code, bus code) in its own crate, the
//! way axum maps a handler's error at the edge.

use spool_journal::{JournalError, RunId, TurnId};

/// What kind of refusal or failure an error is, whatever the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No such run.
    RunNotFound,
    /// No run holds the address.
    AddressNotFound,
    /// The run has no such turn.
    TurnNotFound,
    /// The run has a turn in progress and the operation needs it idle.
    RunActive,
    /// The run waits for an answer.
    RunWaiting,
    /// The run is not waiting for this answer.
    RunNotWaiting,
    /// The run is retired for good.
    RunRetired,
    /// The run was deleted.
    RunDeleted,
    /// The run's history is past a limit (`[limits]`).
    RunTooLarge,
    /// A turn was asked for only if none was in progress, and one was.
    TurnInProgress,
    /// An answer does not fit the suspension's schema.
    InvalidAnswer,
    /// The request is malformed.
    BadRequest,
    /// The engine cannot compact.
    CompactionUnsupported,
    /// The engine failed a call the request needed.
    EngineFailed,
    /// The run's log cannot be replayed, or does not verify.
    ConversationCorrupt,
    /// Another writer moved the run's log, or holds the journal.
    OwnedElsewhere,
    /// The journal's storage failed (a full disk, a failing device), or,
    /// in a cluster, this node's lease lapsed and it is joining again;
    /// nothing was recorded. A run whose turn met it waits and resumes by
    /// itself once the journal writes (see [`Runtime::journal_health`]),
    /// unless another node took it over meanwhile.
    ///
    /// [`Runtime::journal_health`]: crate::Runtime::journal_health
    Storage,
    /// An address is longer than [`spool_wire::run::MAX_ADDRESS_BYTES`].
    AddressTooLong,
    /// A title is longer than [`spool_wire::run::MAX_TITLE_BYTES`].
    TitleTooLong,
    /// An operation id is longer than
    /// [`spool_wire::run::MAX_OPERATION_ID_BYTES`].
    OperationIdTooLong,
    /// Anything else: a bug, or a journal that has shut down.
    Internal,
}

/// A field of a request with a length limit (`spool_wire::run::MAX_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limited {
    /// An address's name.
    Address,
    /// A run's title.
    Title,
    /// An operation id.
    OperationId,
    /// A surface kind.
    Kind,
}

impl Limited {
    /// The field's name on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Address => "address",
            Self::Title => "title",
            Self::OperationId => "operation_id",
            Self::Kind => "kind",
        }
    }

    /// Its limit in bytes of UTF-8.
    #[must_use]
    pub fn limit(self) -> usize {
        use spool_wire::run;
        match self {
            Self::Address => run::MAX_ADDRESS_BYTES,
            Self::Title => run::MAX_TITLE_BYTES,
            Self::OperationId => run::MAX_OPERATION_ID_BYTES,
            Self::Kind => run::MAX_KIND_BYTES,
        }
    }

    /// `TooLong` when `value` is over the field's limit.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::TooLong`] past the limit.
    pub fn check(self, value: &str) -> Result<(), RuntimeError> {
        if value.len() > self.limit() {
            Err(RuntimeError::TooLong(self))
        } else {
            Ok(())
        }
    }
}

/// Why a runtime operation was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No such run.
    #[error("no run {0}")]
    RunNotFound(RunId),
    /// No run holds the address.
    #[error("no run holds address {0}")]
    AddressNotFound(spool_journal::Address),
    /// The run has no such turn.
    #[error("run {run} has no turn `{turn}`")]
    TurnNotFound {
        /// The run.
        run: RunId,
        /// The turn asked for.
        turn: spool_journal::TurnId,
    },
    /// A turn was asked for only if the run was idle
    /// ([`TurnPolicy::IfIdle`](spool_wire::run::TurnPolicy::IfIdle)), and
    /// a turn is in progress.
    #[error("run {run} already has turn {turn} in progress")]
    TurnInProgress {
        /// The run.
        run: RunId,
        /// The turn in progress.
        turn: TurnId,
    },
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
    /// The run's history is past a limit of `[limits]`: new input is
    /// refused.
    #[error(
        "run {run} holds {events} events ({bytes} bytes), past its limit ({max_events} events, {max_bytes} bytes; [limits] in spool.toml): start a new run, or fork it before an earlier turn to go on from there"
    )]
    RunTooLarge {
        /// The run.
        run: RunId,
        /// Its events.
        events: u64,
        /// Its bytes.
        bytes: u64,
        /// The limit on events.
        max_events: u64,
        /// The limit on bytes.
        max_bytes: u64,
    },
    /// The run was deleted: only its tombstone is left.
    #[error("run {} was deleted at {}{}", .0.run_id, .0.deleted_at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(), .0.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    RunDeleted(spool_journal::store::Tombstone),
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
    /// A field is over its length limit.
    #[error("`{}` is longer than {} bytes", .0.as_str(), .0.limit())]
    TooLong(Limited),
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

    /// What kind of error this is: what a transport maps to its code.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::RunNotFound(_) => ErrorKind::RunNotFound,
            Self::AddressNotFound(_) => ErrorKind::AddressNotFound,
            Self::TurnNotFound { .. } => ErrorKind::TurnNotFound,
            Self::TurnInProgress { .. } => ErrorKind::TurnInProgress,
            Self::RunActive(_) => ErrorKind::RunActive,
            Self::RunWaiting(_) => ErrorKind::RunWaiting,
            Self::RunNotWaiting { .. } => ErrorKind::RunNotWaiting,
            Self::RunRetired(_) => ErrorKind::RunRetired,
            Self::RunDeleted(_) => ErrorKind::RunDeleted,
            Self::RunTooLarge { .. } => ErrorKind::RunTooLarge,
            Self::InvalidAnswer { .. } => ErrorKind::InvalidAnswer,
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::CompactionUnsupported => ErrorKind::CompactionUnsupported,
            Self::Engine(_) => ErrorKind::EngineFailed,
            Self::ConversationCorrupt { .. } => ErrorKind::ConversationCorrupt,
            Self::TooLong(Limited::Address) => ErrorKind::AddressTooLong,
            Self::TooLong(Limited::Title) => ErrorKind::TitleTooLong,
            Self::TooLong(Limited::OperationId) => ErrorKind::OperationIdTooLong,
            Self::TooLong(Limited::Kind) => ErrorKind::BadRequest,
            Self::Journal(error) => match error {
                JournalError::TamperEvident(_) | JournalError::Corrupt { .. } => {
                    ErrorKind::ConversationCorrupt
                }
                // The run's log moved under this process, or another
                // process holds the journal: someone else is driving it.
                JournalError::Conflict { .. }
                | JournalError::InUse { .. }
                | JournalError::LeaseLost { .. } => ErrorKind::OwnedElsewhere,
                // A cluster node that lapsed writes again once it has
                // joined again: as after a storage failure, the run waits
                // and is resumed, or taken over by another node.
                JournalError::Storage { .. } | JournalError::Lapsed { .. } => ErrorKind::Storage,
                JournalError::RunDeleted { .. } => ErrorKind::RunDeleted,
                JournalError::NoSuchRun { .. } => ErrorKind::RunNotFound,
                _ => ErrorKind::Internal,
            },
        }
    }
}
