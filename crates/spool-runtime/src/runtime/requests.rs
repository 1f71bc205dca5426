//! What callers pass the runtime and what they get back.

use serde_json::json;
use spool_journal::{Address, Principal, RunId, Seq, TurnId};
use spool_wire::run::TurnPolicy;

use crate::error::RuntimeError;

/// What [`Runtime::recover`](crate::Runtime::recover) did.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Runs resumed (driven again, or their sleep re-armed).
    pub resumed: usize,
    /// Runs whose log could not be read, and why; left as they are.
    pub unreadable: Vec<(RunId, RuntimeError)>,
}

/// Starting a run, or a message through an address.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartRequest {
    /// The user's input.
    pub text: String,
    /// A channel address; created on first use, a message to its run after.
    pub address: Option<Address>,
    /// An idempotency key; needs `principal`.
    pub operation_id: Option<String>,
    /// The verified caller.
    pub principal: Option<Principal>,
    /// A listing title, for a new run.
    pub title: Option<String>,
    /// The surface kind, for a new run.
    pub kind: Option<String>,
    /// Input for this turn only.
    pub context: Vec<String>,
    /// What to do when the run is busy: `steer` (the default), `queue`,
    /// or `if_idle` (refused).
    pub policy: Option<TurnPolicy>,
    /// Whether a new run follows newer agent definitions at its next turn
    /// (`next_turn`) or keeps the one it starts with (`pinned`); absent,
    /// the newest definition's `upgrade` decides.
    pub upgrade: Option<spool_wire::run::Upgrade>,
}

/// A fork of a run's history: a new run holding the source's events
/// through a turn's end (`after`) or up to its start (`before`).
#[derive(Clone, Debug, PartialEq)]
pub struct ForkRequest {
    /// The source's turn the fork is cut at.
    pub turn: spool_journal::TurnId,
    /// Whether the fork holds that turn or stops before it.
    pub cut: spool_journal::event::ForkCut,
    /// The fork's title; the source's by default.
    pub title: Option<String>,
    /// Who forks it: the fork's owner.
    pub principal: Option<Principal>,
}

/// A deletion of a run: who asks, why, and what to do with a turn in
/// progress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRequest {
    /// Who deletes it, as the tombstone keeps it: a principal's id,
    /// `operator`, or `retention`.
    pub by: String,
    /// Why, in words.
    pub reason: Option<String>,
    /// A run with a turn in progress (running, or waiting for an answer
    /// or a timer) is refused with `run_active` unless this is set; then
    /// the turn is cancelled first, and the run deleted once it ended.
    pub force: bool,
    /// Delete only if the run is still at this position: a sweeper that
    /// chose it from a listing leaves a run that moved since.
    pub expected: Option<Seq>,
}

/// A message to an existing run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MessageRequest {
    /// The user's input.
    pub text: String,
    /// Input for this turn only.
    pub context: Vec<String>,
    /// What to do when the run is busy: `steer` (the default), `queue`,
    /// or `if_idle` (refused).
    pub policy: Option<TurnPolicy>,
}

/// What became of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A new turn started.
    Started {
        /// The run.
        run: RunId,
        /// The turn.
        turn: TurnId,
    },
    /// Steered into the running turn.
    Steered {
        /// The run.
        run: RunId,
        /// The running turn.
        turn: TurnId,
    },
    /// Queued to run after the running turn; see
    /// [`Runtime::wait_for_queued`](crate::Runtime::wait_for_queued).
    Queued {
        /// The run.
        run: RunId,
        /// Where the input was recorded: the turn it becomes names it.
        queued: spool_journal::Seq,
    },
    /// An operation id's earlier run, returned without another turn. As
    /// the HTTP seed says, a retry's changed text does not change the
    /// admitted operation: `differs` says it changed, for the transport to
    /// log.
    Replayed {
        /// The run.
        run: RunId,
        /// Whether this request differs from the one that created the run.
        differs: bool,
    },
}

impl Accepted {
    /// The run concerned.
    #[must_use]
    pub fn run(&self) -> &RunId {
        match self {
            Self::Started { run, .. }
            | Self::Steered { run, .. }
            | Self::Queued { run, .. }
            | Self::Replayed { run, .. } => run,
        }
    }
}

/// The outcome of a cancel command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Recorded; the turn will end `cancelled`.
    Requested(TurnId),
    /// Nothing was running.
    NotActive,
    /// The named turn is not the current one.
    Stale {
        /// The current turn, if any.
        current: Option<TurnId>,
    },
}

impl StartRequest {
    /// Refuses a field over its length limit, before anything is read or
    /// recorded: every transport's requests pass here.
    pub(super) fn check_lengths(&self) -> Result<(), RuntimeError> {
        use crate::Limited;
        let fields = [
            (
                Limited::Address,
                self.address.as_ref().map(|a| a.name.as_str()),
            ),
            (Limited::Title, self.title.as_deref()),
            (Limited::OperationId, self.operation_id.as_deref()),
            (Limited::Kind, self.kind.as_deref()),
        ];
        fields
            .into_iter()
            .filter_map(|(field, value)| Some((field, value?)))
            .try_for_each(|(field, value)| field.check(value))
    }

    pub(super) fn into_message(self) -> MessageRequest {
        MessageRequest {
            text: self.text,
            context: self.context,
            policy: self.policy,
        }
    }

    /// What an operation id is held to: the same key with another body is
    /// a conflict.
    pub(super) fn hash(&self) -> String {
        let mut request = json!({
            "text": self.text,
            "title": self.title,
            "kind": self.kind,
            "context": self.context,
            "policy": self.policy.map(TurnPolicy::as_str),
        });
        // Only when said: a request hashed before the field existed
        // hashes the same.
        if let (Some(upgrade), Some(fields)) = (self.upgrade, request.as_object_mut()) {
            fields.insert("upgrade".into(), upgrade.as_str().into());
        }
        spool_wire::canonical::content_hash(&request)
    }
}
