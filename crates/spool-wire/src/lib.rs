//! Every wire shape Spool speaks, as plain types with their codecs: no I/O,
//! no async runtime, no database, no other Spool crate.
//!
//! A program that only needs to read or write Spool's messages (a client,
//! a proxy, a log reader, a browser build for `wasm32`) depends on this
//! crate alone. One module per family:
//!
//! | module | seed | what it holds |
//! | --- | --- | --- |
//! | [`bus`] | 000 | bus v1 request and response envelopes, error codes with their retry table, capabilities |
//! | [`rpc`] | 001 | JSON-RPC 2.0 envelopes and batches, OTel-LogRecord [`rpc::WireEvent`], WS/SSE/NDJSON framing, the legacy adapter |
//! | [`http`] | 002 | the HTTP channel's request and reply bodies, states, suspensions, error codes with their statuses |
//! | [`pod`] | 003 | Pod JSONL methods, events and history items |
//! | [`sentinel`] | 004 | suspension, sleep and failure sentinels inside tool completions |
//! | [`run`] | — | the vocabulary every transport shares: run states, suspension kinds, turn policies |
//! | [`canonical`] | 004 | RFC 8785 canonical JSON and `sha256:` content hashes |
//! | [`line`](mod@line) | — | a bounded line splitter for every JSONL reader |
//! | [`validate`] | — | check one message of a named kind and re-encode it |
//!
//! Rules the families share: codes are additive, so an unknown code decodes
//! as `Unknown(String)` and re-encodes unchanged; decoders never panic on
//! any input; and every refusal carries the protocol's stable code.
//!
//! ```
//! use spool_wire::validate::{Kind, validate};
//!
//! let reply = validate(Kind::HttpError, r#"{"error":"no such run","code":"run_not_found"}"#).unwrap();
//! assert_eq!(reply, r#"{"error":"no such run","code":"run_not_found"}"#);
//! ```
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod code;

pub mod a2a;
pub mod bus;
pub mod canonical;
pub mod http;
pub mod line;
pub mod pod;
pub mod rpc;
pub mod run;
pub mod sentinel;
pub mod validate;

pub use code::Rejection;
