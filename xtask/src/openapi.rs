//! `cargo xtask openapi`: `docs/openapi.json` checked against the real
//! server by a tool nobody here wrote. Schemathesis (from PyPI, installed
//! by pip into `target/schemathesis`) generates requests from the document
//! and checks every reply against it: schema-valid requests accepted,
//! schema-violating ones refused, replies as documented. The stream route
//! is left out (its reads end only by timeout), and so is `compact`, whose
//! 501 on the echo engine the seed mandates and the document declares.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::served::{self, Served};
use crate::{say, section};

/// The schemathesis release the check is pinned to.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// Examples per operation: enough to find a disagreement, bounded so the
/// check takes seconds.
const EXAMPLES: &str = "10";
/// A fixed seed: the same requests on every run, so a failure reproduces.
const SEED: &str = "1";

pub(crate) fn run(root: &Path) -> Result<()> {
    section("openapi: schemathesis against spool serve");
    let st = install(&served::target(root).join("schemathesis"), SCHEMATHESIS)?.join("st");
    let spool = served::spool(root)?;
    let work = served::work_dir(root, "openapi")?;
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
    let server = Served::start(
        &spool,
        work.clone(),
        &["--token-file".as_ref(), tokens.as_ref()],
    )?;
    let addr = &server.addr;
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
    drop(server);
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
        .args(["install", "--quiet", "--disable-pip-version-check"])
        // Several requirements may be named, separated by spaces.
        .args(requirement.split_whitespace())
        .status()
        .context("starting pip")?;
    if !status.success() {
        bail!("pip install {requirement} failed ({status})");
    }
    std::fs::write(&marker, b"")?;
    Ok(bin)
}
