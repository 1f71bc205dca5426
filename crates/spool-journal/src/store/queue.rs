//! What a store with one writer (SQLite's thread, PostgreSQL's task) queues
//! and answers: the operations callers send, and each one's answer held
//! until the transaction holding it has committed or failed.

use tokio::sync::oneshot;

use super::{CallRef, Claim, ClaimKey, Deletion, Encoded, JournalError, Tombstone, Watchers};
use crate::event::Envelope;
use crate::id::{RunId, Seq};

/// An operation for the writer, with where its answer goes.
#[derive(Debug)]
pub enum Op {
    /// [`Journal::append`](super::Journal::append).
    Append {
        /// The run.
        run: RunId,
        /// The events, laid out by the caller at their expected positions
        /// and encoded (but for [`Encoded::deferred`], which leaves the
        /// encoding to the writer).
        append: Encoded,
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
    /// [`Journal::keep_definition`](super::Journal::keep_definition):
    /// committed like a probe, with the batch it arrives in.
    Define {
        /// The digest.
        digest: String,
        /// The definition, as canonical JSON.
        document: String,
        /// The caller.
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    /// [`Journal::delete`](super::Journal::delete): committed in a
    /// transaction of its own, never grouped with appends.
    Delete {
        /// The run.
        run: RunId,
        /// Who, why, and where the run must be.
        deletion: Deletion,
        /// The caller.
        reply: oneshot::Sender<Result<Tombstone, JournalError>>,
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
    /// A deletion's answer: its run, whose subscribers are let go once it
    /// is durable, and its tombstone.
    Delete(
        oneshot::Sender<Result<Tombstone, JournalError>>,
        RunId,
        Result<Tombstone, JournalError>,
    ),
}

impl Done {
    /// `op` answered with `error` without being applied.
    #[must_use]
    pub fn refused(op: Op, error: JournalError) -> Self {
        match op {
            Op::Append { reply, .. } => Self::Append(reply, Err(error)),
            Op::Claim { reply, .. } => Self::Claim(reply, Err(error)),
            Op::Probe { reply } | Op::Define { reply, .. } => Self::Probe(reply),
            Op::Delete { run, reply, .. } => Self::Delete(reply, run, Err(error)),
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
            Self::Delete(reply, ..) => {
                let _ = reply.send(Err(error()));
            }
        }
    }

    /// The transaction holding `done` committed: each append's new
    /// position is set where its run's subscribers read it, every caller
    /// is answered, and then the subscribers are woken (when the position
    /// moved, as [`Watchers::notify`] does). A caller that stopped waiting
    /// (its request was dropped) is told nothing; the append stands.
    ///
    /// A caller is what moves its run on (the runtime's next step waits
    /// for its append); a subscriber only watches. Woken in this order, a
    /// run with ten thousand subscribers does not queue its next step
    /// behind ten thousand wake-ups, and a subscriber woken after it often
    /// finds the step's live output already there to write with the
    /// events, in one write. A caller that reads a receiver once answered
    /// still finds its append there.
    pub fn commit_all(done: impl IntoIterator<Item = Self>, watchers: &Watchers) {
        Self::answer_then_wake(done, watchers, false);
    }

    /// [`commit_all`](Self::commit_all), waking subscribers even when they
    /// already know a position, as [`Watchers::wake`] does: for a store
    /// whose reads lag the heads it shows.
    pub fn commit_all_waking(done: impl IntoIterator<Item = Self>, watchers: &Watchers) {
        Self::answer_then_wake(done, watchers, true);
    }

    fn answer_then_wake(
        done: impl IntoIterator<Item = Self>,
        watchers: &Watchers,
        known_too: bool,
    ) {
        let mut woken = Vec::new();
        for entry in done {
            match entry {
                Self::Append(reply, Ok((run, envelopes, next))) => {
                    if watchers.set_quietly(&run, next, known_too) {
                        woken.push(run);
                    }
                    let _ = reply.send(Ok(envelopes));
                }
                Self::Append(reply, Err(error)) => {
                    let _ = reply.send(Err(error));
                }
                Self::Claim(reply, result) => {
                    let _ = reply.send(result);
                }
                Self::Probe(reply) => {
                    let _ = reply.send(Ok(()));
                }
                Self::Delete(reply, run, result) => {
                    if result.is_ok() {
                        watchers.close(&run);
                    }
                    let _ = reply.send(result);
                }
            }
        }
        for run in &woken {
            watchers.rouse(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Wake, Waker};

    use super::*;

    type Answer = oneshot::Receiver<Result<Vec<Envelope>, JournalError>>;

    /// A subscriber's waker that notes, when it is woken, whether the
    /// append's caller already has its answer.
    struct Witness {
        answer: Mutex<Answer>,
        answered_when_woken: Mutex<Option<bool>>,
    }

    impl Wake for Witness {
        fn wake(self: Arc<Self>) {
            let answered = self.answer.lock().unwrap().try_recv().is_ok();
            *self.answered_when_woken.lock().unwrap() = Some(answered);
        }
    }

    #[test]
    fn a_commit_answers_its_caller_before_it_wakes_the_runs_subscribers() {
        let watchers = Watchers::default();
        let run = RunId::new("watched").unwrap();
        let mut receiver = watchers.register(&run);
        let (reply, answer) = oneshot::channel();
        let witness = Arc::new(Witness {
            answer: Mutex::new(answer),
            answered_when_woken: Mutex::new(None),
        });
        let waker = Waker::from(Arc::clone(&witness));
        {
            let mut changed = Box::pin(receiver.changed());
            assert!(
                changed
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            Done::commit_all(
                [Done::Append(reply, Ok((run.clone(), Vec::new(), Seq(1))))],
                &watchers,
            );
        }
        assert_eq!(
            *witness.answered_when_woken.lock().unwrap(),
            Some(true),
            "the subscriber was woken, after the caller was answered"
        );
        assert_eq!(*receiver.borrow_and_update(), Seq(1));
    }
}
