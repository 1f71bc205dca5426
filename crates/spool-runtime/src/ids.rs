//! Where run and turn ids come from. The default is time-ordered and
//! unique across processes; [`SequentialIds`] is deterministic, for tests
//! and reproducible runs (a turn's id is derived from its position in the
//! run, so it is the same after a restart).

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use spool_journal::{RunId, TurnId};

/// Makes run and turn ids.
pub trait IdSource: Send + Sync + 'static {
    /// A new run's id.
    fn run_id(&self) -> RunId;
    /// The id of the run's `ordinal`-th turn (from 1).
    fn turn_id(&self, run: &RunId, ordinal: u64) -> TurnId;
}

/// `<prefix>_<millis><counter><salt>` in hex: sorts by creation time, never
/// repeats in a process, and two processes starting in the same
/// millisecond differ by their salt.
#[derive(Clone, Copy, Debug, Default)]
pub struct UniqueIds;

impl IdSource for UniqueIds {
    fn run_id(&self) -> RunId {
        RunId::new(unique("run")).expect("generated ids are valid")
    }

    fn turn_id(&self, _run: &RunId, _ordinal: u64) -> TurnId {
        TurnId::new(unique("turn")).expect("generated ids are valid")
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", unique_suffix())
}

/// The unique part of a generated id: time-ordered hex, as above.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SALT: OnceLock<u64> = OnceLock::new();
    // RandomState is seeded from the OS's randomness once per process:
    // enough to tell processes apart without another dependency.
    let salt = *SALT.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let millis = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{millis:012x}{:06x}{:08x}", n & 0xff_ffff, salt as u32)
}

/// `run-1`, `run-2`, … in the order runs are made in this process, and
/// `turn-N` for a run's N-th turn.
#[derive(Debug, Default)]
pub struct SequentialIds {
    runs: AtomicU64,
}

impl IdSource for SequentialIds {
    fn run_id(&self) -> RunId {
        let n = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        RunId::new(format!("run-{n}")).expect("run-N is a valid id")
    }

    fn turn_id(&self, _run: &RunId, ordinal: u64) -> TurnId {
        TurnId::new(format!("turn-{ordinal}")).expect("turn-N is a valid id")
    }
}
