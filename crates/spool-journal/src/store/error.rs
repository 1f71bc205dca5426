//! What a store can refuse: one error for every store, so a caller
//! branches on the same variants whichever store it writes to.

use super::*;

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
    /// The run was deleted; its id is never used again.
    #[error("run {run} was deleted")]
    RunDeleted {
        /// The run.
        run: RunId,
    },
    /// No run has this id, and none had.
    #[error("no run {run}")]
    NoSuchRun {
        /// The run.
        run: RunId,
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
