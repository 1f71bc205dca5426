//! The `Journal` trait and what every store shares: how an append is
//! checked and turned into rows, index changes and a new run head, and how
//! a claim is decided. The stores differ only in how they persist it.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::chain::{self, Hash, TamperEvident};
use crate::event::{Envelope, Event};
use crate::fold::{Status, transition};
use crate::id::{Address, Principal, RunId, Seq};

mod claim;
mod delete;
mod error;
pub mod faulty;
pub mod memory;
mod plan;
pub mod queue;
pub mod sqlite;
mod watchers;

pub use claim::*;
pub use delete::*;
pub use error::*;
pub use plan::*;
pub use watchers::*;

/// A boxed future, so `Journal` can be used as `dyn Journal`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A durable, append-only log of runs.
///
/// Every method is safe to call from many tasks at once. An append is
/// answered only once it is durable (as durable as the store promises),
/// and a subscriber is told of it only after that.
pub trait Journal: Send + Sync + 'static {
    /// Appends `events` to `run`, whose next position must be `expected`
    /// (a run is created by appending a `run_created` at position 0). All
    /// or nothing: on any error none of the events is recorded.
    ///
    /// Besides the log, an append keeps the indexes: `run_created` with an
    /// operation id under a principal, and `address_bound` (or an address
    /// on `run_created`), take those names for the run; `address_unbound`
    /// and `run_retired` give addresses up; a completion of a claimed call
    /// settles the claim with its output, an abandonment releases it.
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>>;

    /// The run's events from position `from` on, verified against the hash
    /// chain. An unknown run reads as empty. A store other processes
    /// delete from (PostgreSQL) answers [`JournalError::RunDeleted`] for a
    /// read from past position 0 of a run deleted since, so a process that
    /// cached the run learns it is gone.
    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: Seq,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>>;

    /// Every run with its public state, most recently updated first.
    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>>;

    /// The runs whose status is `status`, in any order: what a one-shot
    /// process recovers (the runs cut off in a turn) without reading and
    /// sorting every run's row. By default, [`runs`](Self::runs) filtered;
    /// a store that can filter where the rows are does.
    fn runs_with_status(
        &self,
        status: Status,
    ) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        Box::pin(async move {
            let mut runs = self.runs().await?;
            runs.retain(|run| run.status == status);
            Ok(runs)
        })
    }

    /// Every address bound now, with its run: what a search over
    /// addresses reads (`GET /runs?q=`), one row per binding.
    fn addresses(&self) -> BoxFuture<'_, Result<Vec<(Address, RunId)>, JournalError>>;

    /// The run an address is bound to.
    fn find_address<'a>(
        &'a self,
        address: &'a Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>>;

    /// The run created under `operation_id` by `principal`.
    fn find_operation<'a>(
        &'a self,
        principal: &'a Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>>;

    /// Claims `(tool, key)` for `holder`'s call, atomically across runs:
    /// the first holder wins and runs the tool; once its completion is
    /// appended, every later claimant gets the recorded output instead.
    ///
    /// # Errors
    ///
    /// [`JournalError::CallInFlight`] while another holder's claim is
    /// unsettled.
    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>>;

    /// A receiver of the run's next position, updated after every durable
    /// append: read `from` the last value seen to get what is new. It holds
    /// only the latest value, so a slow subscriber costs nothing.
    fn subscribe<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<watch::Receiver<Seq>, JournalError>>;

    /// Deletes `run`: its events and every row derived from them (head,
    /// addresses, operation id, idempotency claims) go in one transaction,
    /// and a [`Tombstone`] is left in their place. Deleting a deleted run
    /// answers its tombstone again; the run's id is never used again (an
    /// append to it is refused with [`JournalError::RunDeleted`]).
    ///
    /// The store removes the rows; it does not know about turns, so the
    /// caller (the runtime) deletes only a run with none in progress and
    /// no append of it in flight. The SQLite store deletes within its
    /// group commit, so a deletion costs appends no commit or sync of its
    /// own.
    ///
    /// # Errors
    ///
    /// [`JournalError::NoSuchRun`] for a run that never existed;
    /// [`JournalError::Conflict`] when [`Deletion::expected`] is given and
    /// the run moved; in a cluster, [`JournalError::LeaseLost`] when a
    /// live node other than this one drives the run.
    fn delete<'a>(
        &'a self,
        run: &'a RunId,
        deletion: Deletion,
    ) -> BoxFuture<'a, Result<Tombstone, JournalError>>;

    /// Keeps `document` (an agent definition, as JSON) under `digest`,
    /// once: a digest already kept is left as it is. Runs name the
    /// definition they started with by its digest (`run_created.agent`).
    fn keep_definition<'a>(
        &'a self,
        digest: &'a str,
        document: &'a Value,
    ) -> BoxFuture<'a, Result<(), JournalError>>;

    /// The document kept under `digest`.
    fn definition<'a>(
        &'a self,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, JournalError>>;

    /// The tombstone of a deleted run; `None` for any other.
    fn tombstone<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<Tombstone>, JournalError>>;

    /// Makes and commits a small write that records nothing of any run, to
    /// learn whether the store can write now. A runtime calls it only
    /// after a write failed on storage, to know when to resume its runs.
    /// A store with nothing to fill (memory) keeps the default, which
    /// always succeeds.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] while the store cannot write.
    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Inside an `impl Journal for Wrapper`, forwards the methods that only
/// read (`read`, `runs`, `addresses`, `find_address`, `find_operation`,
/// `subscribe`, `tombstone`, `definition`), and `delete` and
/// `keep_definition`, to
/// the journal in field `$inner`: a wrapper that watches or fails writes
/// writes only `append`, `claim` and, when it cares, `probe`.
///
/// ```
/// use spool_journal::store::memory::MemoryJournal;
/// use spool_journal::store::{BoxFuture, CallRef, Claim, ClaimKey};
/// use spool_journal::{Envelope, Event, Journal, JournalError, RunId, Seq};
///
/// /// Counts appends.
/// struct Counted {
///     inner: MemoryJournal,
///     appends: std::sync::atomic::AtomicUsize,
/// }
///
/// impl Journal for Counted {
///     fn append<'a>(
///         &'a self,
///         run: &'a RunId,
///         expected: Seq,
///         events: Vec<Event>,
///     ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
///         self.appends.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.append(run, expected, events)
///     }
///
///     fn claim<'a>(
///         &'a self,
///         key: &'a ClaimKey,
///         holder: &'a CallRef,
///     ) -> BoxFuture<'a, Result<Claim, JournalError>> {
///         self.inner.claim(key, holder)
///     }
///
///     spool_journal::forward_journal_reads!(inner);
/// }
/// ```
#[macro_export]
macro_rules! forward_journal_reads {
    ($inner:ident) => {
        fn read<'a>(
            &'a self,
            run: &'a $crate::RunId,
            from: $crate::Seq,
        ) -> $crate::store::BoxFuture<'a, Result<Vec<$crate::Envelope>, $crate::JournalError>> {
            self.$inner.read(run, from)
        }

        fn runs(
            &self,
        ) -> $crate::store::BoxFuture<
            '_,
            Result<Vec<$crate::store::RunSummary>, $crate::JournalError>,
        > {
            self.$inner.runs()
        }

        fn runs_with_status(
            &self,
            status: $crate::fold::Status,
        ) -> $crate::store::BoxFuture<
            '_,
            Result<Vec<$crate::store::RunSummary>, $crate::JournalError>,
        > {
            self.$inner.runs_with_status(status)
        }

        fn addresses(
            &self,
        ) -> $crate::store::BoxFuture<
            '_,
            Result<Vec<($crate::Address, $crate::RunId)>, $crate::JournalError>,
        > {
            self.$inner.addresses()
        }

        fn find_address<'a>(
            &'a self,
            address: &'a $crate::Address,
        ) -> $crate::store::BoxFuture<'a, Result<Option<$crate::RunId>, $crate::JournalError>> {
            self.$inner.find_address(address)
        }

        fn find_operation<'a>(
            &'a self,
            principal: &'a $crate::Principal,
            operation_id: &'a str,
        ) -> $crate::store::BoxFuture<'a, Result<Option<$crate::RunId>, $crate::JournalError>> {
            self.$inner.find_operation(principal, operation_id)
        }

        fn subscribe<'a>(
            &'a self,
            run: &'a $crate::RunId,
        ) -> $crate::store::BoxFuture<'a, Result<$crate::store::SeqWatch, $crate::JournalError>> {
            self.$inner.subscribe(run)
        }

        $crate::forward_journal_lifecycle!($inner);
    };
}

/// Inside an `impl Journal for Wrapper`, forwards deletion and agent
/// definitions (`delete`, `tombstone`, `keep_definition`, `definition`)
/// to the journal in field `$inner`: what
/// [`forward_journal_reads!`](crate::forward_journal_reads) includes, for
/// a wrapper that writes its own reads.
#[macro_export]
macro_rules! forward_journal_lifecycle {
    ($inner:ident) => {
        fn delete<'a>(
            &'a self,
            run: &'a $crate::RunId,
            deletion: $crate::store::Deletion,
        ) -> $crate::store::BoxFuture<'a, Result<$crate::store::Tombstone, $crate::JournalError>> {
            self.$inner.delete(run, deletion)
        }

        fn tombstone<'a>(
            &'a self,
            run: &'a $crate::RunId,
        ) -> $crate::store::BoxFuture<
            'a,
            Result<Option<$crate::store::Tombstone>, $crate::JournalError>,
        > {
            self.$inner.tombstone(run)
        }

        fn keep_definition<'a>(
            &'a self,
            digest: &'a str,
            document: &'a $crate::__serde_json::Value,
        ) -> $crate::store::BoxFuture<'a, Result<(), $crate::JournalError>> {
            self.$inner.keep_definition(digest, document)
        }

        fn definition<'a>(
            &'a self,
            digest: &'a str,
        ) -> $crate::store::BoxFuture<
            'a,
            Result<Option<$crate::__serde_json::Value>, $crate::JournalError>,
        > {
            self.$inner.definition(digest)
        }
    };
}

/// What [`Journal::subscribe`] gives: a run's next position as it moves.
pub type SeqWatch = watch::Receiver<Seq>;

/// One run in a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    /// The run.
    pub run_id: RunId,
    /// Its public state.
    pub status: Status,
    /// Its title, when it was given one.
    pub title: Option<String>,
    /// When it was created.
    pub created_at: OffsetDateTime,
    /// When its last event was recorded.
    pub updated_at: OffsetDateTime,
    /// Its next position (the number of events).
    pub next_seq: Seq,
}

/// An idempotency claim's name: a tool and a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    /// The tool.
    pub tool: String,
    /// The idempotency key.
    pub key: String,
}

/// A tool call in a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallRef {
    /// The run.
    pub run: RunId,
    /// The call.
    pub call_id: String,
}

/// The outcome of a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// This call holds the claim: run the tool.
    Won,
    /// The call was already made: here is its recorded output.
    Settled {
        /// The output.
        output: Value,
        /// The call that made it.
        by: CallRef,
        /// Where its completion was recorded.
        seq: Seq,
    },
}
