//! The Python with the official MCP SDK, for the tests that run its
//! servers and clients (shared by `spool-mcp`'s and `spool-cli`'s tests).
//! `cargo xtask ci` installs the SDK under `target/py-mcp` and names its
//! Python in `SPOOL_MCP_PYTHON`; without it these tests pass vacuously
//! unless `SPOOL_REQUIRE_MCP` is set, as CI sets it: there a missing SDK
//! fails them.

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

/// A file of the repository's `tests/mcp/` (the SDK's scripts, the
/// protocol's schemas).
pub(crate) fn material(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp")
        .join(name)
}
