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

pub mod faulty;
pub mod memory;
pub mod queue;
pub mod sqlite;

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
    /// chain. An unknown run reads as empty.
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
/// read (`read`, `runs`, `find_address`, `find_operation`, `subscribe`) to
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

/// What a store can refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The run's next position is not the one expected: someone else
    /// appended first (optimistic concurrency).
    #[error("append conflict on run {run}: expected next seq {expected}, the log is at {actual}")]
    Conflict {
        /// The run.
        run: RunId,
        /// The position the caller expected.
        expected: Seq,
        /// The run's actual next position.
        actual: Seq,
    },
    /// The append breaks a rule of the log's shape.
    #[error("invalid append to run {run}: {reason}")]
    InvalidAppend {
        /// The run.
        run: RunId,
        /// What is wrong.
        reason: String,
    },
    /// The address is bound to another run.
    #[error("address {address} is bound to run {run}")]
    AddressTaken {
        /// The address.
        address: Address,
        /// The run holding it.
        run: RunId,
    },
    /// The operation id was used for another run by the same principal.
    #[error("operation id `{operation_id}` already created run {run}")]
    OperationTaken {
        /// The operation id.
        operation_id: String,
        /// The run it created.
        run: RunId,
    },
    /// Another call holds the claim and has not completed.
    #[error("tool call already in flight under this key: call {} of run {}", .by.call_id, .by.run)]
    CallInFlight {
        /// The holder.
        by: CallRef,
    },
    /// The log does not verify.
    #[error(transparent)]
    TamperEvident(#[from] TamperEvident),
    /// A stored row verifies but does not decode.
    #[error("journal of run {run} is corrupt at seq {seq}: {reason}")]
    Corrupt {
        /// The run.
        run: RunId,
        /// The position.
        seq: Seq,
        /// Why.
        reason: String,
    },
    /// The store was written by a newer Spool.
    #[error(
        "the journal's schema version is {found}; this Spool reads up to {supported}; upgrade Spool to open it"
    )]
    NewerSchema {
        /// The store's version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// The store was opened read-only.
    #[error("the journal is open read-only")]
    ReadOnly,
    /// Another process owns the journal's runs (see
    /// [`sqlite::Owner::claim`]).
    #[error("the journal in {} is in use by another process{}", .dir.display(), .holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default())]
    InUse {
        /// The journal's directory.
        dir: std::path::PathBuf,
        /// The owner's process id, when it could be read.
        holder: Option<u32>,
    },
    /// In a cluster: another node holds the run's lease. Nothing was
    /// recorded; the node must let the run go.
    #[error("run {run} is driven by another node ({reason}); nothing was recorded")]
    LeaseLost {
        /// The run.
        run: RunId,
        /// Whose lease it is.
        reason: String,
    },
    /// In a cluster: this node's own lease lapsed (it was paused, or cut
    /// off from the database, past the lease time), so it may write to no
    /// run until it has joined again, which its next renewal does; its
    /// runs are taken over, by whichever node comes first. Nothing was
    /// recorded. Unlike [`LeaseLost`](Self::LeaseLost) this says nothing
    /// about who drives the run: a caller retries, as after a storage
    /// failure.
    #[error(
        "this node's lease lapsed (node {node}: it was paused or cut off from the database past the lease time) \
         and it is joining the cluster again; nothing was recorded for run {run}"
    )]
    Lapsed {
        /// The run the append was for.
        run: RunId,
        /// The node's number when it lapsed.
        node: i64,
    },
    /// SQLite's write-ahead log is missing or cut short while its index
    /// (`-shm`) says it holds committed events: opening would serve an
    /// older past, without events that were acknowledged.
    #[error(
        "{} is {} but {} says it holds {expected} bytes of committed events: \
         opening the journal would lose events that were acknowledged. Put the file back; \
         or, to accept losing those events, delete {} as well and open again",
        .wal.display(),
        if *.found == 0 { "missing".to_owned() } else { format!("cut short at {} bytes", .found) },
        .index.display(),
        .index.display()
    )]
    WalMissing {
        /// The write-ahead log's path.
        wal: std::path::PathBuf,
        /// Its index's path.
        index: std::path::PathBuf,
        /// The bytes the index says it holds.
        expected: u64,
        /// The bytes it holds (0 when missing).
        found: u64,
    },
    /// The store has shut down.
    #[error("the journal is closed")]
    Closed,
    /// The storage engine failed: a full disk, a failing device, a file
    /// it cannot open. `message` says what, with the engine's own words;
    /// `source` is the engine's error itself, for a host that inspects it
    /// (a `rusqlite::Error` from the SQLite store).
    #[error("journal storage failed: {message}")]
    Storage {
        /// What failed.
        message: String,
        /// The storage engine's own error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

impl JournalError {
    /// A storage failure described by `message` alone.
    pub fn storage(message: impl Into<String>) -> Self {
        Self::Storage {
            message: message.into(),
            source: None,
        }
    }

    /// A storage failure caused by the storage engine's `error`, kept as
    /// the source.
    pub fn storage_from(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Storage {
            message: error.to_string(),
            source: Some(Box::new(error)),
        }
    }
}

// What follows is the part of a store every store shares, public so a
// store in another crate (PostgreSQL's) persists exactly what SQLite does.

/// Where a run's log ends: what an append needs to know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// The run's next position.
    pub next_seq: Seq,
    /// The hash of its last event ([`chain::GENESIS`] before the first).
    pub last_hash: Hash,
    /// Its public state after its last event.
    pub status: Status,
    /// Its title, from `run_created`.
    pub title: Option<String>,
    /// When it was created.
    pub created_at: OffsetDateTime,
    /// When its last event was recorded.
    pub updated_at: OffsetDateTime,
}

/// Orders a listing as every store lists runs: the most recently updated
/// first, then by run id.
pub(crate) fn newest_first(runs: &mut [RunSummary]) {
    runs.sort_by(|a, b| {
        b.updated_at
            .cmp(&a.updated_at)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
}

impl Head {
    /// A run's head before its first event, created at `at`.
    #[must_use]
    pub fn genesis(at: OffsetDateTime) -> Self {
        Head {
            next_seq: Seq(0),
            last_hash: chain::GENESIS,
            status: Status::Pending,
            title: None,
            created_at: at,
            updated_at: at,
        }
    }

    /// Moves the head past `event`, recorded at `at` with chain link
    /// `hash`: what an append does, and what a store that writes heads
    /// behind its log does to read a head from its row and the log's
    /// tail.
    pub fn advance(&mut self, event: &Event, hash: Hash, at: OffsetDateTime) {
        if let Event::RunCreated(created) = event {
            self.title.clone_from(&created.title);
        }
        self.status = transition(&self.status, event);
        self.last_hash = hash;
        self.next_seq = self.next_seq.next();
        self.updated_at = at;
    }

    /// What a listing says of run `run_id` at this head.
    #[must_use]
    pub fn into_summary(self, run_id: RunId) -> RunSummary {
        RunSummary {
            run_id,
            status: self.status,
            title: self.title,
            created_at: self.created_at,
            updated_at: self.updated_at,
            next_seq: self.next_seq,
        }
    }
}

/// A stored row: an envelope's exact bytes and its chain hash.
#[derive(Clone, Debug)]
pub struct Row {
    /// Its position.
    pub seq: Seq,
    /// The envelope's JSON, exactly as hashed.
    pub bytes: Vec<u8>,
    /// Its link in the run's hash chain.
    pub hash: Hash,
}

/// What an append changes besides the log.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexChange {
    /// The run takes the address (refused when another run holds it).
    Bind(Address),
    /// The run gives the address up, when it holds it.
    Unbind(Address),
    /// The run gives up every address it holds.
    UnbindAll,
    /// The run gives up its addresses in one namespace.
    UnbindNamespace(String),
    /// The run takes an operation id in a principal's scope (refused when
    /// another run has it).
    Operation {
        /// [`Principal::scope`].
        scope: String,
        /// The operation id.
        operation_id: String,
    },
    /// The run's claimed call completed: its claim, if any, is settled
    /// with this output.
    Settle {
        /// The call.
        call_id: String,
        /// Its output.
        output: std::sync::Arc<Value>,
        /// Where the completion is recorded.
        seq: Seq,
    },
    /// The run's claimed call was abandoned: its unsettled claim goes.
    Release {
        /// The call.
        call_id: String,
    },
}

/// An append, checked and laid out, ready to persist.
#[derive(Debug)]
pub struct Plan {
    /// What the caller is answered with.
    pub envelopes: Vec<Envelope>,
    /// What is stored, one row per envelope.
    pub rows: Vec<Row>,
    /// What changes in the indexes, in order.
    pub changes: Vec<IndexChange>,
    /// The run's head after the append.
    pub head: Head,
}

/// An append encoded before its run's head is known: each event as the
/// envelope it becomes at its expected position and time, and that
/// envelope's bytes as they will be stored and hashed. The caller encodes
/// ([`encode`]), so a store's one writer only links the append to the
/// run's head ([`link`]): encoding is most of what planning costs, and
/// callers are many where the writer is one.
#[derive(Debug)]
pub struct Encoded {
    expected: Seq,
    now: OffsetDateTime,
    envelopes: Vec<Envelope>,
    /// One per envelope, once encoded ([`Encoded::deferred`] leaves them
    /// to [`link`]); none when the append is `invalid`.
    bytes: Option<Vec<Vec<u8>>>,
    /// Why the append breaks the log's shape: what [`link`] refuses it
    /// with, once it is known not to conflict with the run's head.
    invalid: Option<&'static str>,
    /// The rows' chain hashes as linked after a row whose hash is the
    /// first ([`Encoded::chain_after`]): what [`link`] takes when the
    /// run's head turns out to end with that hash.
    chained: Option<(Hash, Vec<Hash>)>,
}

impl Encoded {
    /// The append as [`encode`] makes it, but with its bytes left to
    /// [`link`]: for a store whose writers are tasks on its callers' own
    /// threads (PostgreSQL's), where encoding in the caller takes no work
    /// off a thread of its own. Measured there, callers that encoded
    /// appended about 8 % fewer events per second than this.
    #[must_use]
    pub fn deferred(run: &RunId, expected: Seq, events: Vec<Event>, now: OffsetDateTime) -> Self {
        let mut invalid = events
            .is_empty()
            .then_some("an append holds at least one event");
        let mut seq = expected;
        let envelopes: Vec<Envelope> = events
            .into_iter()
            .map(|event| {
                let shape = match (&event, seq) {
                    (Event::RunCreated(_), Seq(0)) => None,
                    (Event::RunCreated(_), _) => {
                        Some("`run_created` may only be a run's first event")
                    }
                    (_, Seq(0)) => Some("a run's first event must be `run_created`"),
                    _ => None,
                };
                invalid = invalid.or(shape);
                let envelope = Envelope {
                    run_id: run.clone(),
                    seq,
                    recorded_at: now,
                    event,
                };
                seq = seq.next();
                envelope
            })
            .collect();
        Encoded {
            expected,
            now,
            envelopes,
            bytes: None,
            invalid,
            chained: None,
        }
    }

    /// Hashes the rows as they link after a row whose chain hash is
    /// `prev` (the run's head as the caller last knew it), so the store's
    /// one writer need not: [`link`] takes these hashes when the head it
    /// links to ends with `prev` and the run is the one encoded, and
    /// makes them again otherwise. Hashing was about a twelfth of the
    /// SQLite writer thread's time. Does nothing for an append left to be
    /// encoded ([`Encoded::deferred`]) or one [`link`] refuses.
    pub fn chain_after(&mut self, prev: Hash) {
        let Some(bytes) = &self.bytes else {
            return;
        };
        let mut last = prev;
        let hashes = self
            .envelopes
            .iter()
            .zip(bytes)
            .map(|(envelope, bytes)| {
                last = chain::link(&last, &envelope.run_id, envelope.seq, bytes);
                last
            })
            .collect();
        self.chained = Some((prev, hashes));
    }

    /// The run's next position the caller expects.
    #[must_use]
    pub fn expected(&self) -> Seq {
        self.expected
    }

    /// The events, in order.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.envelopes.iter().map(|envelope| &envelope.event)
    }

    /// How many events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// Whether it holds no event (an append [`link`] refuses).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }
}

impl Plan {
    /// The append this plan was linked from, to link again to another
    /// head (a store whose head turned out stale). Its bytes are made
    /// again from the envelopes, not taken from the rows: a store may have
    /// moved the rows out to write them.
    #[must_use]
    pub fn into_encoded(self) -> Encoded {
        let expected = self.envelopes.first().map_or(self.head.next_seq, |e| e.seq);
        Encoded {
            expected,
            now: self.head.updated_at,
            envelopes: self.envelopes,
            bytes: None,
            invalid: None,
            chained: None,
        }
    }
}

/// Encodes an append of `events` to `run` at `expected`, recorded at
/// `now`, for [`link`] to check against the run's head.
#[must_use]
pub fn encode(run: &RunId, expected: Seq, events: Vec<Event>, now: OffsetDateTime) -> Encoded {
    let mut append = Encoded::deferred(run, expected, events, now);
    if append.invalid.is_none() {
        append.bytes = Some(append.envelopes.iter().map(envelope_bytes).collect());
    }
    append
}

fn envelope_bytes(envelope: &Envelope) -> Vec<u8> {
    serde_json::to_vec(envelope).expect("envelopes are plain JSON values and always serialize")
}

/// Checks an encoded append against the run's head and lays out its rows
/// (chaining each to the one before), index changes and new head. Pure:
/// every store persists exactly this.
///
/// # Errors
///
/// [`JournalError::Conflict`] when the append's expected position is not
/// the run's next; [`JournalError::InvalidAppend`] for an append that
/// breaks the log's shape.
pub fn link(run: &RunId, head: Option<&Head>, encoded: Encoded) -> Result<Plan, JournalError> {
    let actual = head.map_or(Seq(0), |h| h.next_seq);
    if encoded.expected != actual {
        return Err(JournalError::Conflict {
            run: run.clone(),
            expected: encoded.expected,
            actual,
        });
    }
    if let Some(reason) = encoded.invalid {
        return Err(JournalError::InvalidAppend {
            run: run.clone(),
            reason: reason.to_owned(),
        });
    }
    let now = encoded.now;
    let mut head = head.cloned().unwrap_or_else(|| Head::genesis(now));
    let mut rows = Vec::with_capacity(encoded.envelopes.len());
    let mut changes = Vec::new();
    // One row per envelope, whatever the caller passed: bytes that do
    // not match the envelopes one for one are made again, and so are
    // hashes chained from another head than this one, over other bytes
    // or for another run.
    let count = encoded.envelopes.len();
    let (bytes, mut chained) = match encoded.bytes {
        Some(bytes) if bytes.len() == count => {
            let chained = encoded
                .chained
                .filter(|(prev, hashes)| {
                    *prev == head.last_hash
                        && hashes.len() == count
                        && encoded.envelopes.iter().all(|e| e.run_id == *run)
                })
                .map(|(_, hashes)| hashes.into_iter());
            (bytes, chained)
        }
        _ => (encoded.envelopes.iter().map(envelope_bytes).collect(), None),
    };
    for (envelope, bytes) in encoded.envelopes.iter().zip(bytes) {
        let seq = envelope.seq;
        changes.extend(index_changes(&envelope.event, seq));
        let hash = match chained.as_mut().and_then(Iterator::next) {
            Some(hash) => hash,
            None => chain::link(&head.last_hash, run, seq, &bytes),
        };
        head.advance(&envelope.event, hash, now);
        rows.push(Row { seq, bytes, hash });
    }
    Ok(Plan {
        envelopes: encoded.envelopes,
        rows,
        changes,
        head,
    })
}

/// Checks an append against the run's head and lays out its rows, index
/// changes and new head: [`encode`] then [`link`], for a store that does
/// both in one place.
///
/// # Errors
///
/// As [`link`].
pub fn plan(
    run: &RunId,
    head: Option<&Head>,
    expected: Seq,
    events: Vec<Event>,
    now: OffsetDateTime,
) -> Result<Plan, JournalError> {
    link(run, head, encode(run, expected, events, now))
}

/// Whether appending `event` changes an index (an address, an operation
/// id, a claim) besides the log and the run's head: a store that writes
/// plain appends a quicker way asks this before planning.
///
/// It builds nothing: building the changes would copy a tool's whole
/// output to learn that a completion settles a claim.
#[must_use]
pub fn changes_indexes(event: &Event) -> bool {
    match event {
        Event::RunCreated(created) => {
            created.address.is_some()
                || (created.operation_id.is_some() && created.principal.is_some())
        }
        Event::AddressBound(_)
        | Event::AddressUnbound(_)
        | Event::RunRetired(_)
        | Event::ToolCallCompleted(_)
        | Event::ToolCallResolved(_)
        | Event::ToolCallAbandoned(_) => true,
        _ => false,
    }
}

fn index_changes(event: &Event, seq: Seq) -> Vec<IndexChange> {
    let changes = index_changes_of(event, seq);
    // The two lists of what changes an index stay one.
    debug_assert_eq!(!changes.is_empty(), changes_indexes(event), "{event:?}");
    changes
}

fn index_changes_of(event: &Event, seq: Seq) -> Vec<IndexChange> {
    match event {
        Event::RunCreated(created) => {
            let mut changes = Vec::new();
            if let Some(address) = &created.address {
                changes.push(IndexChange::Bind(address.clone()));
            }
            if let (Some(operation_id), Some(principal)) =
                (&created.operation_id, &created.principal)
            {
                changes.push(IndexChange::Operation {
                    scope: principal.scope(),
                    operation_id: operation_id.clone(),
                });
            }
            changes
        }
        Event::AddressBound(binding) => vec![IndexChange::Bind(binding.address.clone())],
        Event::AddressUnbound(binding) => vec![IndexChange::Unbind(binding.address.clone())],
        Event::RunRetired(retired) => match &retired.namespace {
            None => vec![IndexChange::UnbindAll],
            Some(namespace) => vec![IndexChange::UnbindNamespace(namespace.clone())],
        },
        Event::ToolCallCompleted(done) => vec![IndexChange::Settle {
            call_id: done.call_id.clone(),
            output: done.output.clone(),
            seq,
        }],
        Event::ToolCallResolved(resolved) => vec![IndexChange::Settle {
            call_id: resolved.call_id.clone(),
            output: resolved.output.clone(),
            seq,
        }],
        Event::ToolCallAbandoned(abandoned) => vec![IndexChange::Release {
            call_id: abandoned.call_id.clone(),
        }],
        _ => Vec::new(),
    }
}

/// A claim as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimRow {
    /// The call holding it.
    pub holder: CallRef,
    /// Its output and where it was recorded, once settled.
    pub settled: Option<(Value, Seq)>,
}

/// What to do with a claim request, given the stored claim.
#[derive(Debug, PartialEq)]
pub enum ClaimDecision {
    /// No claim yet: store one for the holder; it wins.
    Take,
    /// Answer without changing anything.
    Answer(Result<Claim, CallRef>),
}

/// What a claim request gets, given the stored claim: the holder asking
/// again (after a crash) still holds it.
#[must_use]
pub fn decide_claim(existing: Option<ClaimRow>, holder: &CallRef) -> ClaimDecision {
    match existing {
        None => ClaimDecision::Take,
        Some(ClaimRow {
            holder: by,
            settled: Some((output, seq)),
        }) => ClaimDecision::Answer(Ok(Claim::Settled { output, by, seq })),
        // The holder asking again (say, after a crash) still holds it.
        Some(ClaimRow {
            holder: by,
            settled: None,
        }) if &by == holder => ClaimDecision::Answer(Ok(Claim::Won)),
        Some(ClaimRow {
            holder: by,
            settled: None,
        }) => ClaimDecision::Answer(Err(by)),
    }
}

/// Decodes a verified row into its envelope, checking it is the row it
/// claims to be.
///
/// # Errors
///
/// [`JournalError::Corrupt`] when the bytes are not an envelope of this
/// run at this position.
pub fn decode_row(run: &RunId, seq: Seq, bytes: &[u8]) -> Result<Envelope, JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        run: run.clone(),
        seq,
        reason,
    };
    // Checked as UTF-8 once, whole: parsing from a `str` then skips the
    // check serde_json makes on every string it reads from bytes (13 %
    // of decoding a typical row).
    let text = std::str::from_utf8(bytes).map_err(|e| corrupt(e.to_string()))?;
    let envelope: Envelope = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    if &envelope.run_id != run || envelope.seq != seq {
        return Err(corrupt(format!(
            "the row holds run {} seq {}",
            envelope.run_id, envelope.seq
        )));
    }
    Ok(envelope)
}

/// Where a store gets `recorded_at` from. The pure core reads no clock; a
/// store does, through this, so tests can fix time.
pub type Clock = std::sync::Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// The system clock in UTC.
#[must_use]
pub fn system_clock() -> Clock {
    std::sync::Arc::new(OffsetDateTime::now_utc)
}

/// The subscribers of each run: one `watch` sender per run with at least
/// one live receiver, holding the run's next position.
///
/// A store subscribes in two steps, [`register`](Self::register) and then
/// [`advance`](Self::advance) with the head it read after registering: an
/// append that commits between the two notifies the registered sender, and
/// one that committed before is in the head, so no append goes unannounced.
/// Senders whose receivers have all gone are dropped by the next append to
/// their run or by an amortized sweep, so the map stays about as large as
/// the set of watched runs even when runs are watched once and never
/// written again.
#[derive(Debug, Default)]
pub struct Watchers {
    senders: std::sync::Mutex<Senders>,
}

#[derive(Debug, Default)]
struct Senders {
    map: crate::id::RunMap<watch::Sender<Seq>>,
    /// The map's size at which the next sweep runs: twice its size after
    /// the last one, so sweeping costs O(1) per registration.
    sweep_at: usize,
}

impl Senders {
    /// `run`'s sender while somebody listens; forgotten once nobody does.
    fn listened(&mut self, run: &RunId) -> Option<&watch::Sender<Seq>> {
        if self.map.get(run)?.receiver_count() == 0 {
            self.map.remove(run);
            return None;
        }
        self.map.get(run)
    }
}

/// Sets a run's announced next position to `next` unless it is already
/// later: positions never move backwards. Subscribers are woken when it
/// moves, or also when it stays if `known_too`.
fn announce(sender: &watch::Sender<Seq>, next: Seq, known_too: bool) {
    sender.send_if_modified(|seen| {
        let wake = next > *seen || (known_too && next == *seen);
        if wake {
            *seen = next;
        }
        wake
    });
}

/// The fewest senders kept before a sweep is worth running.
const WATCHERS_SWEEP_MIN: usize = 64;

impl Watchers {
    fn senders(&self) -> std::sync::MutexGuard<'_, Senders> {
        self.senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver of `run`'s position, registered before the store reads
    /// the run's head; follow with [`advance`](Self::advance).
    pub fn register(&self, run: &RunId) -> watch::Receiver<Seq> {
        let mut senders = self.senders();
        if !senders.map.contains_key(run) && senders.map.len() >= senders.sweep_at {
            senders.map.retain(|_, sender| sender.receiver_count() > 0);
            senders.sweep_at = (senders.map.len() * 2).max(WATCHERS_SWEEP_MIN);
        }
        senders
            .map
            .entry(run.clone())
            .or_insert_with(|| watch::channel(Seq(0)).0)
            .subscribe()
    }

    /// Tells `run`'s subscribers that its next position is `next`, unless
    /// they already know a later one: positions never move backwards.
    pub fn advance(&self, run: &RunId, next: Seq) {
        if let Some(sender) = self.senders().map.get(run) {
            announce(sender, next, false);
        }
    }

    /// After an append: announces `next` to the run's subscribers, or
    /// forgets the run when nobody listens any more.
    pub fn notify(&self, run: &RunId, next: Seq) {
        self.tell(run, next, false);
    }

    /// As [`notify`](Self::notify), but wakes the run's subscribers even
    /// when they already know `next`: for a store whose reads lag behind
    /// the positions its heads show (SQLite's skip events not yet synced).
    pub fn wake(&self, run: &RunId, next: Seq) {
        self.tell(run, next, true);
    }

    /// The first half of announcing an append whose caller is answered in
    /// between: `run`'s subscribers can read `next` from now on (so once
    /// the caller is answered, a receiver shows its append), but are not
    /// woken until [`rouse`](Self::rouse). Returns whether they are to be.
    pub(crate) fn set_quietly(&self, run: &RunId, next: Seq, known_too: bool) -> bool {
        let mut senders = self.senders();
        let Some(sender) = senders.listened(run) else {
            return false;
        };
        let mut wake = false;
        sender.send_if_modified(|seen| {
            wake = next > *seen || (known_too && next == *seen);
            *seen = next.max(*seen);
            // Not marked changed: nobody is woken yet.
            false
        });
        wake
    }

    /// The second half: wakes `run`'s subscribers.
    pub(crate) fn rouse(&self, run: &RunId) {
        if let Some(sender) = self.senders().map.get(run) {
            sender.send_modify(|_| {});
        }
    }

    fn tell(&self, run: &RunId, next: Seq, known_too: bool) {
        if let Some(sender) = self.senders().listened(run) {
            announce(sender, next, known_too);
        }
    }

    /// The runs somebody still watches: what a store whose notifications
    /// come from elsewhere (another process) re-reads after it may have
    /// missed some.
    pub fn watched(&self) -> Vec<RunId> {
        self.senders()
            .map
            .iter()
            .filter(|(_, sender)| sender.receiver_count() > 0)
            .map(|(run, _)| run.clone())
            .collect()
    }

    /// How many runs have a sender; for tests of the sweep.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.senders().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_of_runs_watched_once_and_never_written_do_not_accumulate() {
        let watchers = Watchers::default();
        for n in 0..10_000 {
            let run = RunId::new(format!("run-{n}")).unwrap();
            let receiver = watchers.register(&run);
            watchers.advance(&run, Seq(3));
            drop(receiver);
        }
        assert!(
            watchers.len() <= 2 * WATCHERS_SWEEP_MIN,
            "{} senders kept for 10,000 runs nobody watches",
            watchers.len()
        );
    }

    #[test]
    fn a_sweep_keeps_the_runs_still_watched() {
        let watchers = Watchers::default();
        let watched = RunId::new("watched").unwrap();
        let receiver = watchers.register(&watched);
        for n in 0..1_000 {
            drop(watchers.register(&RunId::new(format!("run-{n}")).unwrap()));
        }
        watchers.notify(&watched, Seq(5));
        assert_eq!(*receiver.borrow(), Seq(5));
    }

    fn at(n: u64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(n as i64)
    }

    fn started(n: u64) -> Event {
        Event::TurnStarted(crate::event::TurnStarted {
            turn_id: crate::TurnId::new(format!("turn-{n}")).unwrap(),
            input: "go".into(),
            context: Vec::new(),
            policy: spool_wire::run::TurnPolicy::Steer,
            from_queue: None,
        })
    }

    /// The plan that creates `run`, at time 1.
    fn created(run: &RunId) -> Plan {
        plan(
            run,
            None,
            Seq(0),
            vec![Event::RunCreated(crate::event::RunCreated::default())],
            at(1),
        )
        .unwrap()
    }

    #[test]
    fn an_append_encoded_before_its_head_is_known_links_as_a_plan_made_with_it_would() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        let encoded = encode(&run, Seq(1), vec![started(1), started(2)], at(2));
        let linked = link(&run, Some(&created.head), encoded).unwrap();
        let planned = plan(
            &run,
            Some(&created.head),
            Seq(1),
            vec![started(1), started(2)],
            at(2),
        )
        .unwrap();
        assert_eq!(linked.envelopes, planned.envelopes);
        // Each row is its envelope's JSON, chained to the row before.
        let mut last = created.head.last_hash;
        for (row, envelope) in planned.rows.iter().zip(&planned.envelopes) {
            assert_eq!(row.bytes, serde_json::to_vec(envelope).unwrap());
            assert_eq!(row.hash, chain::link(&last, &run, row.seq, &row.bytes));
            last = row.hash;
        }
        let hashes = |p: &Plan| {
            p.rows
                .iter()
                .map(|r| (r.seq, r.bytes.clone(), r.hash))
                .collect::<Vec<_>>()
        };
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // Left to the writer to encode, the same rows.
        let deferred = Encoded::deferred(&run, Seq(1), vec![started(1), started(2)], at(2));
        let linked_later = link(&run, Some(&created.head), deferred).unwrap();
        assert_eq!(hashes(&linked_later), hashes(&planned));
        // Turned back (a store whose head was stale) after its rows were
        // moved out to be written, as PostgreSQL's writer does, it links
        // again to the same rows.
        let mut linked = linked;
        drop(std::mem::take(&mut linked.rows));
        let again = link(&run, Some(&created.head), linked.into_encoded()).unwrap();
        assert_eq!(hashes(&again), hashes(&planned));
        assert_eq!(again.head, planned.head);
    }

    #[test]
    fn hashes_a_caller_chained_are_kept_only_when_linked_after_the_head_they_assumed() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        let events = || vec![started(1), started(2)];
        let planned = plan(&run, Some(&created.head), Seq(1), events(), at(2)).unwrap();
        let hashes = |p: &Plan| p.rows.iter().map(|r| r.hash).collect::<Vec<_>>();
        // Chained after the head the run has: the same hashes.
        let mut right = encode(&run, Seq(1), events(), at(2));
        right.chain_after(created.head.last_hash);
        let linked = link(&run, Some(&created.head), right).unwrap();
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // Chained after a head the run no longer has (another append got
        // there first with the same position): made again from the head.
        let mut stale = encode(&run, Seq(1), events(), at(2));
        stale.chain_after([7; 32]);
        let linked = link(&run, Some(&created.head), stale).unwrap();
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // A first append chained after the genesis hash.
        let mut first = encode(
            &run,
            Seq(0),
            vec![Event::RunCreated(crate::event::RunCreated::default())],
            at(1),
        );
        first.chain_after(chain::GENESIS);
        assert_eq!(link(&run, None, first).unwrap().head, created.head);
        // Encoded for one run and linked for another: hashed for the run
        // it is linked to.
        let other = RunId::new("run-2").unwrap();
        let mut elsewhere = encode(&other, Seq(1), events(), at(2));
        elsewhere.chain_after(created.head.last_hash);
        let linked = link(&run, Some(&created.head), elsewhere).unwrap();
        let mut last = created.head.last_hash;
        for row in &linked.rows {
            assert_eq!(row.hash, chain::link(&last, &run, row.seq, &row.bytes));
            last = row.hash;
        }
    }

    #[test]
    fn a_stale_expected_position_is_a_conflict_before_the_appends_shape_is_judged() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        // A second `run_created`, expected at a position the run is not at.
        let misplaced = || {
            encode(
                &run,
                Seq(4),
                vec![Event::RunCreated(crate::event::RunCreated::default())],
                at(2),
            )
        };
        assert!(matches!(
            link(&run, Some(&created.head), misplaced()),
            Err(JournalError::Conflict {
                expected: Seq(4),
                actual: Seq(1),
                ..
            })
        ));
        let mut head = created.head.clone();
        head.next_seq = Seq(4);
        assert!(matches!(
            link(&run, Some(&head), misplaced()),
            Err(JournalError::InvalidAppend { .. })
        ));
        assert!(matches!(
            link(
                &run,
                Some(&created.head),
                encode(&run, Seq(1), Vec::new(), at(2))
            ),
            Err(JournalError::InvalidAppend { .. })
        ));
    }

    #[test]
    fn a_position_set_quietly_is_read_at_once_and_wakes_nobody_until_roused() {
        let watchers = Watchers::default();
        let run = RunId::new("watched").unwrap();
        let receiver = watchers.register(&run);
        assert!(watchers.set_quietly(&run, Seq(2), false));
        assert_eq!(*receiver.borrow(), Seq(2));
        assert!(!receiver.has_changed().unwrap(), "nobody woken yet");
        watchers.rouse(&run);
        assert!(receiver.has_changed().unwrap());
        // Positions never move back, and one already known wakes nobody
        // unless asked to.
        assert!(!watchers.set_quietly(&run, Seq(1), false));
        assert_eq!(*receiver.borrow(), Seq(2));
        assert!(!watchers.set_quietly(&run, Seq(2), false));
        assert!(watchers.set_quietly(&run, Seq(2), true));
    }
}
