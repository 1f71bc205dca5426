//! Spool's journal: the append-only log that lets a run survive a crash.
//!
//! The pure core ([`event`], [`fold`], [`cursor`], [`chain`]) does no I/O
//! and reads no clock: given the same log it gives the same answers,
//! anywhere. Stores sit behind the [`Journal`] trait:
//! [`store::sqlite::SqliteJournal`] (the embedded default: WAL, one
//! group-committing writer thread, each commit synced before it is
//! answered) and
//! [`store::memory::MemoryJournal`] (tests, and hosts that need no
//! durability). Both pass the same conformance suite (the `conformance`
//! feature).
//!
//! What this crate deliberately does not do: run anything. It records what
//! the runtime did and tells it, on replay, what was already done.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod chain;
pub mod cursor;
pub mod event;
pub mod fold;
pub mod id;
pub mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use event::{Envelope, Event};
pub use id::{Address, Principal, RunId, Seq, TurnId};
pub use store::{Journal, JournalError};

/// For the forwarding macros: a wrapper's crate need not name serde_json.
#[doc(hidden)]
pub use serde_json as __serde_json;

/// Canonical JSON text of a value, for hashes and messages.
fn canonical(value: &serde_json::Value) -> String {
    spool_wire::canonical::canonical_json(value)
}
