//! Fuzzes the JSON-RPC decoders (strict, legacy-aware, WireEvent, SSE):
//! decode or refuse with a code, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::rpc;
use spool_wire::validate::{Kind, validate};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(rpc::Frame::Single(envelope)) = rpc::decode(text) {
        assert_eq!(rpc::decode(&rpc::encode_ws(&envelope)), Ok(rpc::Frame::Single(envelope)), "round trip");
    }
    let _ = rpc::decode_client(text);
    let _ = validate(Kind::WireEvent, text);
    let _ = validate(Kind::RpcVersion, text);
    let frame = rpc::SseFrame::parse(text);
    let _ = rpc::decode(&frame.data);
});
