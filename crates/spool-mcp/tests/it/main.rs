//! The MCP client against a server written with the official Python SDK
//! (`tests/mcp/tools_server.py`, `mcp` from PyPI). `cargo xtask ci`
//! installs the SDK under `target/py-mcp` and names its Python in
//! `SPOOL_MCP_PYTHON`; without it these tests pass vacuously unless
//! `SPOOL_REQUIRE_MCP` is set, as CI sets it: there a missing SDK fails.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod client;

use std::path::{Path, PathBuf};

/// The Python that has the SDK, or `None` (the test then returns early).
pub(crate) fn python() -> Option<PathBuf> {
    match std::env::var_os("SPOOL_MCP_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None => {
            assert!(
                std::env::var_os("SPOOL_REQUIRE_MCP").is_none(),
                "SPOOL_REQUIRE_MCP is set but SPOOL_MCP_PYTHON is not: `cargo xtask ci` sets both"
            );
            None
        }
    }
}

/// The test server's script.
pub(crate) fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/tools_server.py")
}
