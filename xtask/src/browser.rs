//! `cargo xtask browser`: a real browser against `spool serve`. Debian's
//! Chromium, driven by Playwright for Python (from PyPI, installed by pip
//! into `target/playwright`, given the system browser's path: nothing is
//! downloaded at run time), loads a page on another origin that tries to
//! start a run with a form, with `fetch` in both modes and with a
//! WebSocket, and one on an allowed origin that does the same
//! (`xtask/browser/security.py`); then uses the web console as an
//! operator would (`xtask/browser/console.py`). `cargo xtask screenshots`
//! runs the console's scenarios to write the README's screenshots.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::openapi::install;
use crate::served::{self, Served};
use crate::{say, section};

/// The Playwright release the check is pinned to.
const PLAYWRIGHT: &str = "playwright==1.65.2";

pub(crate) fn run(root: &Path) -> Result<()> {
    section("browser: chromium against spool serve's origin and host rules");
    let Some(chromium) = chromium()? else {
        say(
            "!!! SKIPPED: no Chromium here and it could not be installed (apt-get install chromium); the browser check did not run !!!",
        );
        return Ok(());
    };
    let bin = install(&served::target(root).join("playwright"), PLAYWRIGHT)?;
    let spool = served::spool(root)?;
    let (allowed, foreign) = (free_port()?, free_port()?);
    let origin = format!("http://localhost:{allowed}");
    let server = Served::start(
        &spool,
        served::work_dir(root, "browser")?,
        &["--allow-origin".as_ref(), origin.as_ref()],
    )?;
    let outcome = Command::new(bin.join("python"))
        .arg(root.join("xtask").join("browser").join("security.py"))
        .arg(&chromium)
        .arg(&server.addr)
        .arg(allowed.to_string())
        .arg(foreign.to_string())
        .status()
        .context("starting python");
    drop(server);
    let status = outcome?;
    if !status.success() {
        bail!("a browser got past spool serve's origin or host rules ({status})");
    }
    section("browser: the web console in chromium");
    console(
        root,
        &bin,
        &chromium,
        &spool,
        &served::target(root).join("console-shots"),
    )
}

/// `cargo xtask screenshots`: the console's scenarios, writing the
/// screenshots the README and `docs/console.md` show.
pub(crate) fn screenshots(root: &Path) -> Result<()> {
    section("screenshots: the web console in chromium");
    let Some(chromium) = chromium()? else {
        bail!("no Chromium here and it could not be installed (apt-get install chromium)");
    };
    let bin = install(&served::target(root).join("playwright"), PLAYWRIGHT)?;
    let spool = served::spool(root)?;
    console(
        root,
        &bin,
        &chromium,
        &spool,
        &root.join("docs").join("images"),
    )
}

/// `cargo xtask console-timings [RUNS [TURNS]]`: the console's speed in
/// the browser's own timings, against a release `spool serve` whose
/// journal holds RUNS runs (100,000 by default), one of them of TURNS
/// turns (1,500). Prints the figures; asserts no time.
pub(crate) fn timings(root: &Path, args: &[String]) -> Result<()> {
    section("console timings: the list and a long run's page in chromium");
    let runs = args
        .first()
        .map_or(Ok(100_000), |n| n.parse())
        .context("RUNS")?;
    let turns = args
        .get(1)
        .map_or(Ok(1_500), |n| n.parse())
        .context("TURNS")?;
    let Some(chromium) = chromium()? else {
        bail!("no Chromium here and it could not be installed (apt-get install chromium)");
    };
    let bin = install(&served::target(root).join("playwright"), PLAYWRIGHT)?;
    let status = crate::cargo()
        .args(["build", "--release", "--locked", "-p", "spool-cli"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("building spool failed ({status})");
    }
    let spool = served::target(root).join("release").join("spool");
    let work = served::work_dir(root, "console-timings")?;
    let status = Command::new(bin.join("python"))
        .arg(
            root.join("xtask")
                .join("browser")
                .join("console_timings.py"),
        )
        .arg(&chromium)
        .arg(&spool)
        .arg(&work)
        .arg(runs.to_string())
        .arg(turns.to_string())
        .status()
        .context("starting python")?;
    let _ = std::fs::remove_dir_all(&work);
    if !status.success() {
        bail!("the console timings did not run ({status})");
    }
    Ok(())
}

/// Runs the console's scenarios against servers the script starts, with
/// their journals under a fresh work directory.
fn console(root: &Path, bin: &Path, chromium: &Path, spool: &Path, shots: &Path) -> Result<()> {
    let work = served::work_dir(root, "console")?;
    let status = Command::new(bin.join("python"))
        .arg(root.join("xtask").join("browser").join("console.py"))
        .arg(chromium)
        .arg(spool)
        .arg(&work)
        .arg(shots)
        .status()
        .context("starting python")?;
    let _ = std::fs::remove_dir_all(&work);
    if !status.success() {
        bail!("the web console failed in the browser ({status})");
    }
    Ok(())
}

/// The system's Chromium, installed from Debian's packages when it is
/// missing and this is root (as on CI); `None` when it cannot be had.
fn chromium() -> Result<Option<PathBuf>> {
    let find = || {
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .map(PathBuf::from)
            .find(|path| path.exists())
    };
    if let Some(found) = find() {
        return Ok(Some(found));
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    if !root {
        return Ok(None);
    }
    say("installing chromium from the distribution's packages");
    let quiet = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !quiet(&["update", "-qq"]) || !quiet(&["install", "-y", "-qq", "chromium"]) {
        return Ok(None);
    }
    Ok(find())
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
