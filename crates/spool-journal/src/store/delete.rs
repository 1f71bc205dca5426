//! Deleting a run: what a deletion asks and the tombstone it leaves. A
//! store removes the run's events and every row derived from them (its
//! head, addresses, operation id, claims) in one transaction, and keeps
//! only the tombstone, so a later request for the run can say it was
//! deleted (and when, by whom) instead of that it never existed.

use time::OffsetDateTime;

use crate::id::{RunId, Seq};

/// What a deletion asks: who asks, why, and where the run must still be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deletion {
    /// Who deleted it: a principal's name, `operator` for the command
    /// line, or `retention` for the sweeper.
    pub by: String,
    /// Why, in words: the retention rule that expired it, say.
    pub reason: Option<String>,
    /// Delete only if the run's next position is still this: a sweeper
    /// that chose the run from a listing leaves it when it moved since
    /// ([`JournalError::Conflict`](super::JournalError::Conflict)).
    pub expected: Option<Seq>,
}

impl Deletion {
    /// Refuses the deletion when [`expected`](Self::expected) is given
    /// and the run is elsewhere (`next`): it moved since it was chosen.
    ///
    /// # Errors
    ///
    /// [`JournalError::Conflict`](super::JournalError::Conflict).
    pub fn check(&self, run: &RunId, next: Seq) -> Result<(), super::JournalError> {
        match self.expected {
            Some(expected) if expected != next => Err(super::JournalError::Conflict {
                run: run.clone(),
                expected,
                actual: next,
            }),
            _ => Ok(()),
        }
    }
}

/// What is left of a deleted run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tombstone {
    /// The run.
    pub run_id: RunId,
    /// When it was deleted (the store's clock).
    pub deleted_at: OffsetDateTime,
    /// Who deleted it ([`Deletion::by`]).
    pub by: String,
    /// Why ([`Deletion::reason`]).
    pub reason: Option<String>,
    /// How many events were removed.
    pub events: u64,
}
