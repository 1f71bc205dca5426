//! The A2A server driven in process: tasks, idempotency, streams and errors.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod peer;
mod push;
#[path = "../../../spool-mcp/tests/support/python.rs"]
mod python;
mod server;
