//! What a store with one writer (SQLite's thread, PostgreSQL's task) queues
//! and answers: the operations callers send, and each one's answer held
//! until the transaction holding it has committed or failed.

use tokio::sync::oneshot;

use super::{CallRef, Claim, ClaimKey, JournalError, Watchers};
use crate::event::{Envelope, Event};
use crate::id::{RunId, Seq};

/// An operation for the writer, with where its answer goes.
#[derive(Debug)]
pub enum Op {
    /// [`Journal::append`](super::Journal::append).
    Append {
        /// The run.
        run: RunId,
        /// Its expected next position.
        expected: Seq,
        /// The events.
        events: Vec<Event>,
        /// The caller.
        reply: oneshot::Sender<Result<Vec<Envelope>, JournalError>>,
    },
    /// [`Journal::claim`](super::Journal::claim).
    Claim {
        /// The claim.
        key: ClaimKey,
        /// Its claimant.
        holder: CallRef,
        /// The caller.
        reply: oneshot::Sender<Result<Claim, JournalError>>,
    },
    /// [`Journal::probe`](super::Journal::probe): a small write committed
    /// like any other.
    Probe {
        /// The caller.
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
}

/// An operation applied inside the open transaction, its answer waiting
/// for the transaction's outcome.
#[derive(Debug)]
pub enum Done {
    /// An append: on success the run, its envelopes and its next position.
    Append(
        oneshot::Sender<Result<Vec<Envelope>, JournalError>>,
        Result<(RunId, Vec<Envelope>, Seq), JournalError>,
    ),
    /// A claim's answer.
    Claim(
        oneshot::Sender<Result<Claim, JournalError>>,
        Result<Claim, JournalError>,
    ),
    /// A probe.
    Probe(oneshot::Sender<Result<(), JournalError>>),
}

impl Done {
    /// `op` answered with `error` without being applied.
    #[must_use]
    pub fn refused(op: Op, error: JournalError) -> Self {
        match op {
            Op::Append { reply, .. } => Self::Append(reply, Err(error)),
            Op::Claim { reply, .. } => Self::Claim(reply, Err(error)),
            Op::Probe { reply } => Self::Probe(reply),
        }
    }

    /// The transaction failed: the caller is told `message`, whatever the
    /// operation's own outcome was. A caller that stopped waiting needs no
    /// answer.
    pub fn fail(self, message: &str) {
        let error = || JournalError::storage(message.to_owned());
        match self {
            Self::Append(reply, _) => {
                let _ = reply.send(Err(error()));
            }
            Self::Claim(reply, _) => {
                let _ = reply.send(Err(error()));
            }
            Self::Probe(reply) => {
                let _ = reply.send(Err(error()));
            }
        }
    }

    /// The transaction committed: an append's subscribers are told, then
    /// the caller is answered. A caller that stopped waiting (its request
    /// was dropped) is told nothing; the append stands.
    pub fn commit(self, watchers: &Watchers) {
        self.commit_with(|run, next| watchers.notify(run, next));
    }

    /// [`commit`](Self::commit), announcing an append's new position with
    /// `announce` instead of [`Watchers::notify`].
    pub fn commit_with(self, announce: impl FnOnce(&RunId, Seq)) {
        match self {
            Self::Append(reply, result) => {
                let result = result.map(|(run, envelopes, next)| {
                    announce(&run, next);
                    envelopes
                });
                let _ = reply.send(result);
            }
            Self::Claim(reply, result) => {
                let _ = reply.send(result);
            }
            Self::Probe(reply) => {
                let _ = reply.send(Ok(()));
            }
        }
    }
}
