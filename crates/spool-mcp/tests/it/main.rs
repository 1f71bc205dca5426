//! The MCP client against a server written with the official Python SDK
//! (`tests/mcp/tools_server.py`, `mcp` from PyPI); see `support/python.rs`
//! for where the SDK comes from.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod client;
#[path = "../support/python.rs"]
mod python;
mod serve;

pub(crate) use python::python;

/// The test server's script.
pub(crate) fn script() -> std::path::PathBuf {
    python::material("tools_server.py")
}
