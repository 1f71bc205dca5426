//! `cargo xtask clients`: `spool serve`'s JSON-RPC framings driven by
//! clients nobody here wrote, from another ecosystem: Python's
//! `websockets` (from PyPI, installed by pip into `target/py-websockets`)
//! over `/ws`, and `curl -N` on `/events` (SSE) and `/stream` (NDJSON). The
//! script is `xtask/clients/rpc_clients.py`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::openapi::{install, listening_address, tempfile_dir};
use crate::{cargo, section};

/// The `websockets` release the check is pinned to.
const WEBSOCKETS: &str = "websockets==15.0.1";

pub(crate) fn run(root: &Path) -> Result<()> {
    section("clients: python websockets and curl against spool serve");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    let bin = install(&target.join("py-websockets"), WEBSOCKETS)?;
    let status = cargo()
        .args(["build", "--locked", "-p", "spool-cli"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("building spool failed ({status})");
    }
    let work = tempfile_dir(&target, "clients")?;
    // Loopback, no token file: the framings need no token, as an operator
    // on the same machine would run them.
    let mut server = Command::new(target.join("debug").join("spool"))
        .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
        .arg(work.join("journal"))
        .current_dir(&work)
        .stderr(Stdio::piped())
        .spawn()
        .context("starting spool serve")?;
    let outcome = listening_address(&mut server).and_then(|addr| {
        Command::new(bin.join("python"))
            .arg(root.join("xtask").join("clients").join("rpc_clients.py"))
            .arg(&addr)
            .status()
            .context("starting python")
    });
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&work);
    let status = outcome?;
    if !status.success() {
        bail!("a client nobody here wrote disagreed with spool serve ({status})");
    }
    Ok(())
}
