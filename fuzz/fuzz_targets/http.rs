//! Fuzzes every HTTP channel body decoder: decode or refuse with a channel
//! code, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::validate::{Kind, validate};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for (kind, name) in Kind::ALL {
        if name.starts_with("http-") {
            let _ = validate(kind, text);
        }
    }
});
