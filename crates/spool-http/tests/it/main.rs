//! The HTTP channel over real sockets: one test per clause of the
//! channel's document.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod channel;
mod client;
mod console;
mod fork;
mod forward;
mod openapi;
mod remote;
mod schedules;
mod server;
mod spans;
#[path = "../support/spans.rs"]
mod spans_support;
mod streams;
mod token;
