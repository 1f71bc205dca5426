//! The journal's integration tests: pinned event encodings, the fold, the
//! replay cursor, the conformance suite against both stores, the SQLite
//! store's own guarantees, crash safety, and property tests.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod conformance;
mod crash;
mod cursor;
mod deletion;
mod events;
mod fold;
mod layout;
mod props;
mod sqlite;
mod support;
