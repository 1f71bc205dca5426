//! `cargo xtask e2e-otel`: a real OpenTelemetry collector from a package
//! registry receives a `spool run`'s telemetry. The collector is rotel
//! (from PyPI, installed by pip into `target/py-rotel`; the package
//! carries the collector's binary), listening for OTLP/HTTP and printing
//! what it receives to a file; the run's spans and LogRecords must be
//! there, as the collector decoded them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::openapi::install;
use crate::section;
use crate::served;

/// The rotel release the check is pinned to.
const ROTEL: &str = "rotel==0.0.1a15";

/// How long the collector may take to start, and to print what it got.
const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) fn run(root: &Path) -> Result<()> {
    section("e2e-otel: a spool run's telemetry into rotel, a real collector");
    let venv = served::target(root).join("py-rotel");
    install(&venv, ROTEL)?;
    let agent = find(&venv.join("lib"), "rotel-agent")?
        .context("the rotel package carries no rotel-agent binary")?;
    let spool = served::spool(root)?;
    let work = served::work_dir(root, "e2e-otel")?;
    let (http, grpc) = (free_port()?, free_port()?);
    let log = work.join("collector.log");
    let collector = Collector(
        Command::new(&agent)
            .args(["start", "--exporter", "blackhole"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .args(["--debug-log", "traces", "--debug-log", "logs"])
            .args(["--debug-log-verbosity", "detailed"])
            .stdout(std::fs::File::create(&log)?)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?,
    );
    wait_for(PATIENCE, "the collector to listen", || {
        Ok(std::net::TcpStream::connect(("127.0.0.1", http)).is_ok())
    })?;
    let output = Command::new(&spool)
        .args(["run", "hello collector", "--journal"])
        .arg(work.join("journal"))
        .current_dir(&work)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{http}"),
        )
        .env("OTEL_SERVICE_NAME", "spool-e2e")
        .output()
        .context("starting spool run")?;
    let said = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("spool run failed ({}): {said}", output.status);
    }
    let run = said
        .split("spool: run ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("spool run names its run: {said}"))?
        .to_owned();
    let expected = [
        "service.name: Str(spool-e2e)".to_owned(),
        "gen_ai.operation.name: Str(invoke_agent)".to_owned(),
        "gen_ai.operation.name: Str(chat)".to_owned(),
        format!("spool.run.id: Str({run})"),
        format!("cicd.pipeline.run.id: Str({run})"),
    ];
    let found = wait_for(
        PATIENCE,
        "the collector to print the run's telemetry",
        || {
            let printed = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(expected.iter().all(|line| printed.contains(line.as_str())))
        },
    );
    drop(collector);
    if let Err(error) = found {
        let printed = std::fs::read_to_string(&log).unwrap_or_default();
        let missing: Vec<&String> = expected
            .iter()
            .filter(|l| !printed.contains(l.as_str()))
            .collect();
        bail!("{error}: missing {missing:?} in {}", log.display());
    }
    let _ = std::fs::remove_dir_all(&work);
    say(&format!(
        "e2e-otel: rotel received run {run}'s spans and LogRecords"
    ));
    Ok(())
}

/// The collector; stopped when dropped.
struct Collector(Child);

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn say(line: &str) {
    crate::say(line);
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Checks `ready` every 50 ms until it holds, or fails after `patience`.
fn wait_for(patience: Duration, what: &str, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
    let started = Instant::now();
    while started.elapsed() < patience {
        if ready()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("waited {patience:?} for {what}")
}

/// The first file named `name` under `dir`.
fn find(dir: &Path, name: &str) -> Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if let Some(found) = find(&path, name)? {
                return Ok(Some(found));
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}
