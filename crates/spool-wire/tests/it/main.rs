//! The wire crate's integration tests: seed vectors, one suite per family,
//! snapshots of every message type, and property tests.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod a2a;
mod bus;
mod http;
mod pod;
mod props;
mod rpc;
mod sentinel;
mod snapshots;
mod stream_data;
mod transcripts;
mod vectors;
