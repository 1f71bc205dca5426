//! Fuzzes the sentinel decoder: any JSON value is ordinary output, a
//! sentinel, or malformed; never a panic, and a sentinel re-encodes to
//! itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::sentinel::Sentinel;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(Some(sentinel)) = Sentinel::decode(&value) {
        assert_eq!(Sentinel::decode(&sentinel.encode()), Ok(Some(sentinel)), "round trip");
    }
});
