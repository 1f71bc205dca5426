//! Spool's benchmarks. Every figure is printed beside a baseline measured
//! in the same run on the same machine, as a ratio, because these machines
//! are shared and noisy and only the ratio means much. Nothing here is a
//! test: no figure fails a build.
//!
//! Usage: `spool-bench [--quick] [--only NAME] [--report PATH]`; normally
//! through `cargo xtask bench`, which builds it in release mode.

use std::io::Write;
use std::process::ExitCode;

mod a2a;
mod first_token;
mod http;
mod journal;
mod long;
mod mcp;
mod model;
mod oneshot;
mod otel;
mod pg;
mod recovery;
mod report;
mod rpc;
mod salvor;
mod serve;
mod sweep;
mod wire;

use report::Row;

/// How long and how large each benchmark runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scale {
    /// A brief run that only proves the benchmarks still work.
    pub(crate) quick: bool,
}

impl Scale {
    /// `full` normally, `quick` under `--quick`.
    pub(crate) fn pick<T>(self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

type Bench = fn(Scale) -> anyhow::Result<Vec<Row>>;

/// In the order they run. `one-shot-run` comes first: a one-shot run's
/// few syncs and its start-up wait behind whatever the machine is still
/// doing, and after the PostgreSQL rows the database server goes on
/// writing and working for a while (`spool --version` itself took 1.6–2.1
/// ms there against 1.3 before, and `spool run` 6.0–7.1 ms against 4.4).
/// For the same reason the PostgreSQL rows come last: every row after
/// them would share the machine with that work (a full run read the
/// stream fan-out's p99 at 10 000 subscribers 2.25 × the floor after
/// them, where two runs of it alone straight after read 1.24 and 1.49 ×).
const BENCHES: &[(&str, Bench)] = &[
    ("one-shot-run", oneshot::run),
    ("journal-append", journal::append),
    ("journal-sweep", sweep::run),
    ("replay-fold", journal::fold),
    ("journal-open", journal::open),
    ("wire-decode", wire::decode),
    ("http-runs", http::runs),
    ("serve-runs", serve::run),
    ("recovery", recovery::run),
    ("first-token", first_token::run),
    ("a2a-tasks", a2a::run),
    ("soak", http::soak),
    ("parked-runs", http::parked),
    ("stream-fanout", http::fanout),
    ("rpc-fanout", rpc::fanout),
    ("long-run", long::run),
    ("mcp-tool-call", mcp::run),
    ("otel-dead-collector", otel::dead_collector),
    ("salvor", salvor::run),
    ("journal-append-pg", pg::append),
    ("http-runs-pg", pg::cluster_runs),
    ("recovery-pg", recovery::cluster),
];

/// Benchmarks that measure this process's own memory, run in a process of their
/// own: after the others, the allocator holds hundreds of megabytes it
/// reuses, and a growth measured on top of that is no growth at all (a
/// full run once read 0.07 MB of growth over a 986 MB "idle" process).
const ALONE: &[&str] = &["soak", "parked-runs", "stream-fanout", "rpc-fanout"];

/// Runs benchmark `name` as `spool-bench --only NAME` and takes its rows
/// from the report it writes.
fn alone(name: &str, scale: Scale) -> anyhow::Result<Vec<Row>> {
    let dir = tempfile::tempdir()?;
    let report = dir.path().join("report.json");
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command.args(["--only", name, "--report"]).arg(&report);
    if scale.quick {
        command.arg("--quick");
    }
    // Its table is printed once, with everything else.
    let status = command.stdout(std::process::Stdio::null()).status()?;
    anyhow::ensure!(
        status.success(),
        "spool-bench --only {name} failed ({status})"
    );
    report::read(&report)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "spool-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // The client processes `stream-fanout` and `rpc-fanout` start: this
    // binary again.
    let all: Vec<String> = std::env::args().skip(1).collect();
    match all.first().map(String::as_str) {
        Some("subscribe") => return http::subscribe(&all[1..]),
        Some("connect") => return http::connect(&all[1..]),
        Some("lines") => return http::lines(&all[1..]),
        Some("ws-subscribe") => return rpc::subscribe(&all[1..]),
        // The two sides of `mcp-tool-call`.
        Some("mcp-echo") => return mcp::mcp_echo(),
        Some("echo-tool") => return mcp::echo_tool(),
        _ => {}
    }
    let mut scale = Scale { quick: false };
    let mut only: Option<String> = None;
    let mut report_path: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => scale.quick = true,
            "--only" => {
                only = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--only needs a benchmark name"))?,
                )
            }
            "--report" => {
                report_path = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--report needs a path"))?,
                )
            }
            other => anyhow::bail!(
                "unknown argument `{other}`; usage: spool-bench [--quick] [--only NAME] [--report PATH]"
            ),
        }
    }
    if let Some(name) = &only
        && !BENCHES.iter().any(|(n, _)| n == name)
    {
        let names: Vec<&str> = BENCHES.iter().map(|(n, _)| *n).collect();
        anyhow::bail!("no benchmark `{name}`; there are: {}", names.join(", "));
    }
    let mut rows = Vec::new();
    for (name, bench) in BENCHES {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        let _ = writeln!(
            std::io::stderr(),
            "running {name}{}",
            if scale.quick { " (quick)" } else { "" }
        );
        if ALONE.contains(name) && only.is_none() {
            rows.extend(alone(name, scale)?);
        } else {
            rows.extend(bench(scale)?);
        }
    }
    report::print(&rows, &mut std::io::stdout().lock())?;
    if let Some(path) = report_path {
        report::write(&rows, scale, std::path::Path::new(&path))?;
    }
    Ok(())
}
