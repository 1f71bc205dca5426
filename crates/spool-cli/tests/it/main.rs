//! End-to-end tests of the `spool` binary: the real executable, fed on
//! stdin, its stdout and exit code asserted.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod a2a;
mod agent;
mod bus;
mod cluster;
mod mcp;
mod pod;
mod postgres;
#[path = "../../../spool-mcp/tests/support/python.rs"]
mod python;
mod reload;
mod rpc;
mod runs;
mod seed_examples;
mod serve;
#[path = "../support/server.rs"]
mod server;
mod talk;
mod telemetry;
mod wire_validate;
