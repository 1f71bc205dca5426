//! The Pythons with the official protocol SDKs, for the tests that run
//! their servers and clients (shared by `spool-mcp`'s and `spool-cli`'s
//! tests). `cargo xtask ci` installs the MCP SDK under `target/py-mcp` and
//! the A2A SDK under `target/py-a2a`, and names each Python in
//! `SPOOL_MCP_PYTHON` and `SPOOL_A2A_PYTHON`; without them these tests
//! pass vacuously unless `SPOOL_REQUIRE_MCP` (`SPOOL_REQUIRE_A2A`) is set,
//! as CI sets them: there a missing SDK fails them.

use std::path::{Path, PathBuf};

/// The Python that has the SDK named by `kit` (`MCP`, `A2A`), or `None`
/// (the test then returns early).
fn kit(kit: &str) -> Option<PathBuf> {
    match std::env::var_os(format!("SPOOL_{kit}_PYTHON")) {
        Some(python) => Some(PathBuf::from(python)),
        None => {
            assert!(
                std::env::var_os(format!("SPOOL_REQUIRE_{kit}")).is_none(),
                "SPOOL_REQUIRE_{kit} is set but SPOOL_{kit}_PYTHON is not: `cargo xtask ci` sets both"
            );
            None
        }
    }
}

/// The Python that has the MCP SDK.
#[allow(dead_code, reason = "each test binary uses the kits it drives")]
pub(crate) fn python() -> Option<PathBuf> {
    kit("MCP")
}

/// The Python that has the A2A SDK.
#[allow(dead_code, reason = "each test binary uses the kits it drives")]
pub(crate) fn a2a_python() -> Option<PathBuf> {
    kit("A2A")
}

/// A file of the repository's `tests/mcp/` (the SDK's scripts, the
/// protocol's schemas).
#[allow(dead_code, reason = "each test binary uses the kits it drives")]
pub(crate) fn material(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp")
        .join(name)
}

/// A file of the repository's `tests/a2a/`.
#[allow(dead_code, reason = "each test binary uses the kits it drives")]
pub(crate) fn a2a_material(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/a2a")
        .join(name)
}
