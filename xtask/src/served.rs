//! A real `spool serve` for the checks that drive one from outside
//! (`openapi`, `clients`): built, started on a free loopback port in a
//! directory of its own, and stopped with that directory removed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::cargo;

/// The target directory (`CARGO_TARGET_DIR` or `target/`).
pub(crate) fn target(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Builds the `spool` binary (debug) and returns its path.
pub(crate) fn spool(root: &Path) -> Result<PathBuf> {
    let status = cargo()
        .args(["build", "--locked", "-p", "spool-cli"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("building spool failed ({status})");
    }
    Ok(target(root).join("debug").join("spool"))
}

/// A fresh directory under the target directory for a server's journal
/// and tokens, named for the check.
pub(crate) fn work_dir(root: &Path, check: &str) -> Result<PathBuf> {
    let dir = target(root)
        .join("xtask-servers")
        .join(format!("{check}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A running `spool serve`; killed, and its directory removed, when
/// dropped.
pub(crate) struct Served {
    child: Child,
    work: PathBuf,
    /// Where it listens (`HOST:PORT`).
    pub(crate) addr: String,
}

impl Served {
    /// Starts `spool serve --addr 127.0.0.1:0 --journal WORK/journal ARGS`
    /// in `work` and waits until it says where it listens.
    pub(crate) fn start(spool: &Path, work: PathBuf, args: &[&std::ffi::OsStr]) -> Result<Self> {
        let child = Command::new(spool)
            .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
            .arg(work.join("journal"))
            .args(args)
            .current_dir(&work)
            .stderr(Stdio::piped())
            .spawn()
            .context("starting spool serve")?;
        let mut served = Self {
            child,
            work,
            addr: String::new(),
        };
        served.addr = listening_address(&mut served.child)?;
        Ok(served)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// Reads the server's stderr until it says where it listens, then keeps
/// draining it so the server never blocks on a full pipe.
fn listening_address(server: &mut Child) -> Result<String> {
    let stderr = server.stderr.take().context("the server's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut addr = None;
    for line in lines.by_ref().take(10) {
        let line = line?;
        if let Some(rest) = line.strip_prefix("spool: listening on ") {
            addr = rest.split(' ').next().map(str::to_owned);
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    addr.context("spool serve did not say where it listens")
}
