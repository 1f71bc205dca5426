//! `cargo xtask clients`: `spool serve`'s JSON-RPC framings driven by
//! clients nobody here wrote, from another ecosystem: Python's
//! `websockets` (from PyPI, installed by pip into `target/py-websockets`)
//! over `/ws`, and `curl -N` on `/events` (SSE) and `/stream` (NDJSON). The
//! script is `xtask/clients/rpc_clients.py`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::openapi::install;
use crate::section;
use crate::served::{self, Served};

/// The `websockets` release the check is pinned to.
const WEBSOCKETS: &str = "websockets==15.0.1";

pub(crate) fn run(root: &Path) -> Result<()> {
    section("clients: python websockets and curl against spool serve");
    let bin = install(&served::target(root).join("py-websockets"), WEBSOCKETS)?;
    let spool = served::spool(root)?;
    // Loopback, no token file: the framings need no token, as an operator
    // on the same machine would run them.
    let server = Served::start(&spool, served::work_dir(root, "clients")?, &[])?;
    let outcome = Command::new(bin.join("python"))
        .arg(root.join("xtask").join("clients").join("rpc_clients.py"))
        .arg(&server.addr)
        .status()
        .context("starting python");
    drop(server);
    let status = outcome?;
    if !status.success() {
        bail!("a client nobody here wrote disagreed with spool serve ({status})");
    }
    Ok(())
}
