//! Fuzzes the bus decoders: a request or response body must decode or be
//! refused with a code, never panic, and what decodes must re-decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::validate::{Kind, validate};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for kind in [Kind::BusRequest, Kind::BusResponse] {
        if let Ok(encoded) = validate(kind, text) {
            assert_eq!(validate(kind, &encoded).as_deref(), Ok(encoded.as_str()), "re-encoding is stable");
        }
    }
});
