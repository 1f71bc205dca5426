//! `cargo xtask openapi`: `docs/openapi.json` checked against the real
//! server by a tool nobody here wrote. Schemathesis (from PyPI, installed
//! by pip into `target/schemathesis`) generates requests from the document
//! and checks every reply against it: schema-valid requests accepted,
//! schema-violating ones refused, replies as documented. The stream route
//! is left out (its reads end only by timeout), and so is `compact`, whose
//! 501 on the echo engine the seed mandates and the document declares.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{cargo, say, section};

/// The schemathesis release the check is pinned to.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// Examples per operation: enough to find a disagreement, bounded so the
/// check takes seconds.
const EXAMPLES: &str = "10";
/// A fixed seed: the same requests on every run, so a failure reproduces.
const SEED: &str = "1";

pub(crate) fn run(root: &Path) -> Result<()> {
    section("openapi: schemathesis against spool serve");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    let st = install(&target.join("schemathesis"), SCHEMATHESIS)?.join("st");
    let status = cargo()
        .args(["build", "--locked", "-p", "spool-cli"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("building spool failed ({status})");
    }
    let spool = target.join("debug").join("spool");
    let work = tempfile_dir(&target, "openapi")?;
    let tokens = work.join("tokens");
    let issued = Command::new(&spool)
        .args(["token", "new", "schemathesis", "--trigger", "--token-file"])
        .arg(&tokens)
        .output()
        .context("starting spool token new")?;
    if !issued.status.success() {
        bail!(
            "spool token new failed: {}",
            String::from_utf8_lossy(&issued.stderr)
        );
    }
    let token = String::from_utf8(issued.stdout)?.trim().to_owned();
    // One schedule, named as the document's example, so the trigger route
    // is exercised past its lookup; it fires only when triggered.
    std::fs::write(
        work.join("spool.toml"),
        "[[schedule]]\nname = \"nightly\"\ncron = \"0 3 1 1 *\"\ntext = \"Run the nightly checks.\"\naddress = \"nightly\"\noverlap = \"queue\"\n",
    )?;
    let mut server = Command::new(&spool)
        .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
        .arg(work.join("journal"))
        .arg("--token-file")
        .arg(&tokens)
        .current_dir(&work)
        .stderr(Stdio::piped())
        .spawn()
        .context("starting spool serve")?;
    let addr = listening_address(&mut server)?;
    let outcome = Command::new(&st)
        .arg("--config-file")
        .arg(root.join("xtask").join("schemathesis.toml"))
        .arg("run")
        .arg(root.join("docs").join("openapi.json"))
        .args(["--url", &format!("http://{addr}/spool/v1")])
        .args(["--checks", "all", "-n", EXAMPLES, "--seed", SEED])
        .args(["--exclude-path-regex", "/stream$"])
        .args(["--exclude-operation-id", "compact"])
        .args(["--request-timeout", "10"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .current_dir(&work)
        .status()
        .context("starting schemathesis");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&work);
    let status = outcome?;
    if !status.success() {
        bail!("schemathesis found the server and docs/openapi.json disagreeing ({status})");
    }
    Ok(())
}

/// The `bin` directory of a virtual environment under `dir` holding
/// `requirement`, made and filled by pip the first time.
pub(crate) fn install(dir: &Path, requirement: &str) -> Result<std::path::PathBuf> {
    let bin = dir.join("bin");
    let marker = dir.join(requirement);
    if marker.exists() {
        return Ok(bin);
    }
    say(&format!("installing {requirement} into {}", dir.display()));
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .status()
        .context("starting python3 -m venv")?;
    if !status.success() {
        bail!("python3 -m venv failed ({status})");
    }
    let status = Command::new(bin.join("pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ])
        .status()
        .context("starting pip")?;
    if !status.success() {
        bail!("pip install {requirement} failed ({status})");
    }
    std::fs::write(&marker, b"")?;
    Ok(bin)
}

/// A fresh directory under the target directory for a server's journal
/// and tokens, named for the check.
pub(crate) fn tempfile_dir(target: &Path, check: &str) -> Result<std::path::PathBuf> {
    let dir = target
        .join("xtask-servers")
        .join(format!("{check}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Reads the server's stderr until it says where it listens, then keeps
/// draining it so the server never blocks on a full pipe.
pub(crate) fn listening_address(server: &mut std::process::Child) -> Result<String> {
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
