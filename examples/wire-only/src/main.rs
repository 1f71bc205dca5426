//! Spool's wire formats without Spool's runtime: this program depends on
//! `spool-wire` alone (no tokio, no hyper, no SQLite) and checks one
//! message of each of the five protocols, refuses a bad one with the
//! protocol's own code, and converts between shapes.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example prints what it shows"
)]

use serde_json::json;
use spool_wire::validate::{Kind, validate};
use spool_wire::{canonical, rpc};

fn main() {
    let messages = [
        // 000, the bus: one instance asks another.
        (
            Kind::BusRequest,
            r#"{"fromInstance":"reviewer","prompt":"Check this answer","depth":1}"#,
        ),
        // 001, JSON-RPC 2.0 with OTel LogRecord events.
        (
            Kind::Rpc,
            r#"{"jsonrpc":"2.0","id":7,"method":"submit.run","params":{"text":"build"}}"#,
        ),
        // 002, the HTTP channel: a start and a stream line.
        (
            Kind::HttpStart,
            r#"{"text":"Summarize the plan.","address":"browser-42"}"#,
        ),
        (
            Kind::HttpEvent,
            r#"{"run_id":"r1","seq":3,"type":"run_response","time":"2026-11-30T07:00:00Z","text":"Done."}"#,
        ),
        // 003, the Pod protocol.
        (
            Kind::PodMethod,
            r#"{"method":"run","params":{"input":"hi"}}"#,
        ),
        // 004, a recorded sentinel inside a tool completion.
        (
            Kind::Sentinel,
            r#"{"__spool_suspend":{"reason":"Which region?","input_schema":{"type":"object"}}}"#,
        ),
        // And a bad one: a bus request from nobody, refused with its code.
        (
            Kind::BusRequest,
            r#"{"fromInstance":"","prompt":"","depth":0}"#,
        ),
    ];
    for (kind, text) in messages {
        match validate(kind, text) {
            Ok(encoded) => println!("ok {}: {encoded}", kind.name()),
            Err(invalid) => println!(
                "refused {} ({}): {}",
                kind.name(),
                invalid.code.as_deref().unwrap_or("no code"),
                invalid.message
            ),
        }
    }

    // Convert: a legacy `{"t": "run"}` client message to a JSON-RPC
    // request, framed as a server-sent event.
    let legacy = json!({"t": "run", "tasks": ["build"]});
    if let Some(envelope) = rpc::legacy_to_envelope(&legacy) {
        print!("sse: {}", rpc::encode_sse(&envelope, Some(1)));
    }
    // And a content hash over canonical JSON (key order does not matter).
    let a = canonical::content_hash(&json!({"b": 1, "a": [true, null]}));
    let b = canonical::content_hash(&json!({"a": [true, null], "b": 1}));
    println!("hash: {a} (same for any key order: {})", a == b);
}
