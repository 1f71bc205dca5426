//! spool-engines' tests: each provider against a local server replaying
//! recorded SSE transcripts, the command engine against real child
//! processes, and engine specs.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod anthropic;
mod command;
mod e2e;
mod openai;
mod replay;
mod spec;
