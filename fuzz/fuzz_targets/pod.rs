//! Fuzzes the Pod decoders: a method or event line must decode or be
//! refused with `invalid_request`, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::pod::{Event, Method};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(method) = Method::decode(text) {
        assert_eq!(Method::decode(&method.encode_line()), Ok(method), "round trip");
    }
    if let Ok(event) = Event::decode(text) {
        let line = event.encode_line();
        assert!(Event::decode(&line).is_ok(), "an encoded event decodes");
    }
});
