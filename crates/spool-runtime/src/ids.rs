//! Fresh run and turn ids: time-ordered, unique within a process by a
//! counter and across processes by a random salt.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `<prefix>_<millis><counter><salt>` in hex: sorts by creation time, never
/// repeats in a process, and two processes starting in the same
/// millisecond differ by their salt.
pub(crate) fn new_id(prefix: &str) -> String {
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
    format!(
        "{prefix}_{millis:012x}{:06x}{:08x}",
        n & 0xff_ffff,
        salt as u32
    )
}
