//! Spool's automation, run as `cargo xtask <command>`: `ci` (everything CI
//! checks, in order), `tidy` (the crate graph and file conventions), `fuzz`
//! (every fuzz target for a while), `bench`, and `e2e-llm` (real model turns
//! against a local llama.cpp server). It depends on nothing heavy, so it
//! builds in seconds on a fresh clone.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod api;
mod browser;
mod clients;
mod e2e_llm;
mod e2e_otel;
mod examples;
mod openapi;
mod pg;
mod served;
mod tidy;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci                   fmt check, clippy, nextest, doctests, rustdoc, tidy,
                       api, examples, openapi, clients, browser,
                       e2e-otel, bench --quick (what CI runs)
  examples             run the four examples under examples/ and check what
                       they print
  api [--bless]        compare each library's public API with api/*.txt
                       (--bless: write them)
  clients              drive spool serve's JSON-RPC framings with Python's
                       websockets (installed by pip under target/) and curl
  browser              load pages on an allowed and a foreign origin in
                       Chromium (Debian's, installed when missing) driven by
                       Playwright (installed by pip under target/) against
                       spool serve: the foreign one starts no run; then
                       use the web console through every scenario
  screenshots          run the console's browser scenarios and write their
                       screenshots to docs/images/
  console-timings [RUNS [TURNS]]
                       time the console in chromium against a release build
                       with RUNS runs (100000) and a TURNS-turn run (1500)
  e2e-otel             send a spool run's telemetry to rotel, a real
                       OpenTelemetry collector (installed by pip under
                       target/), and check what it received
  tidy                 check the crate layering and file conventions
  openapi              check docs/openapi.json against spool serve with
                       schemathesis (installed by pip under target/)
  bench [--quick] [--only NAME]
                       build in release mode and run the benchmarks; prints a
                       table and writes target/bench/report.json
  pg -- COMMAND…       run COMMAND with a throwaway PostgreSQL (installed
                       from Debian's packages when missing), its URL in
                       JOURNAL_PG_URL
  fuzz [--seconds N]   run every fuzz target for N seconds each (default 30)
  e2e-llm              build llama.cpp's llama-server (once, cached under
                       target/e2e-llm) and run full turns through the openai
                       and anthropic engines against a real model";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => tidy::run(&root()),
        Some("openapi") => openapi::run(&root()),
        Some("clients") => clients::run(&root()),
        Some("browser") => browser::run(&root()),
        Some("screenshots") => browser::screenshots(&root()),
        Some("console-timings") => browser::timings(&root(), &args[1..]),
        Some("e2e-otel") => e2e_otel::run(&root()),
        Some("examples") => examples::run(&root()),
        Some("api") => api::run(&root(), args.get(1).map(String::as_str) == Some("--bless")),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("e2e-llm") => e2e_llm::run(&args[1..]),
        Some("pg") => pg::run(&args[1..]),
        Some("help" | "-h" | "--help") => {
            say(USAGE);
            return ExitCode::SUCCESS;
        }
        _ => {
            say(USAGE);
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            say(&format!("xtask: {error:#}"));
            ExitCode::FAILURE
        }
    }
}

/// The official MCP Python SDK the MCP tests' servers and clients use.
const MCP_SDK: &str = "mcp==2.3.0";

/// The official A2A Python SDK whose client drives the A2A tests, with
/// its server routes and an ASGI server for the peer agent they call.
const A2A_SDK: &str = "a2a-sdk[http-server]==1.3.0 uvicorn==0.55.0";

/// Everything CI checks, in order, stopping at the first failure.
fn ci() -> Result<()> {
    let root = root();
    let steps: [(&str, &[&str]); 5] = [
        ("format", &["fmt", "--all", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "tests",
            &[
                "nextest",
                "run",
                "--workspace",
                "--locked",
                "--no-fail-fast",
            ],
        ),
        ("doctests", &["test", "--doc", "--workspace", "--locked"]),
        ("docs", &["doc", "--no-deps", "--workspace", "--locked"]),
    ];
    // The PostgreSQL store's and the cluster's tests need a server; one
    // is started for the whole run and stopped at its end.
    let postgres = pg::Server::start()?;
    // The MCP tests run servers written with the official Python SDK.
    let mcp_python =
        openapi::install(&served::target(&root).join("py-mcp"), MCP_SDK)?.join("python");
    // The A2A tests drive `spool serve` with the official Python SDK's
    // client.
    let a2a_python =
        openapi::install(&served::target(&root).join("py-a2a"), A2A_SDK)?.join("python");
    for (name, args) in steps {
        section(name);
        let mut command = cargo();
        command
            .env("JOURNAL_PG_URL", &postgres.url)
            .envs(postgres.ca_env())
            .env("SPOOL_REQUIRE_PG", "1")
            .env("SPOOL_MCP_PYTHON", &mcp_python)
            .env("SPOOL_REQUIRE_MCP", "1")
            .env("SPOOL_A2A_PYTHON", &a2a_python)
            .env("SPOOL_REQUIRE_A2A", "1");
        command
            .args(args)
            .current_dir(&root)
            // Snapshot tests must compare, never write, under CI.
            .env("INSTA_UPDATE", "no");
        if name == "docs" {
            // A broken doc link or stray HTML in a doc comment fails, as
            // clippy's warnings do.
            command.env("RUSTDOCFLAGS", "-D warnings");
        }
        let status = command
            .status()
            .with_context(|| format!("starting cargo for {name}"))?;
        if !status.success() {
            bail!("{name} failed ({status})");
        }
    }
    drop(postgres);
    // The tests that restart or stop PostgreSQL under load get a server
    // of their own (a restart would break every other test sharing one),
    // and run one at a time: one's restart must not end another's outage.
    section("PostgreSQL restarted under load");
    let restarted = pg::Server::start()?;
    let status = cargo()
        .args([
            "nextest",
            "run",
            "--locked",
            "-p",
            "spool-journal-pg",
            "-p",
            "spool-cli",
            "--run-ignored",
            "only",
            "--test-threads",
            "1",
        ])
        .envs(restarted.env())
        .env("SPOOL_REQUIRE_PG", "1")
        .current_dir(&root)
        .status()
        .context("starting cargo for the restart test")?;
    if !status.success() {
        bail!("the restart test failed ({status})");
    }
    drop(restarted);
    section("tidy");
    tidy::run(&root)?;
    api::run(&root, false)?;
    examples::run(&root)?;
    openapi::run(&root)?;
    clients::run(&root)?;
    browser::run(&root)?;
    e2e_otel::run(&root)?;
    // The benchmarks must keep working; their figures are not judged here.
    bench(&["--quick".to_owned()])?;
    say("xtask ci: all checks passed");
    Ok(())
}

/// Builds the benchmarks in release mode and runs them. The figures are
/// reported, never judged: a slow machine does not fail a build.
fn bench(args: &[String]) -> Result<()> {
    let root = root();
    section("building benchmarks (release)");
    let status = cargo()
        // `spool` too: the one-shot benchmark runs it as a user does.
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "spool-bench",
            "-p",
            "spool-cli",
        ])
        .current_dir(&root)
        .status()?;
    if !status.success() {
        bail!("building the benchmarks failed ({status})");
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let report = target.join("bench").join("report.json");
    // The PostgreSQL store's rows run against a server of their own.
    let postgres = pg::Server::start_durable()?;
    section("running benchmarks");
    let status = Command::new(target.join("release").join("spool-bench"))
        .env("JOURNAL_PG_URL", &postgres.url)
        .env("SPOOL_BIN", target.join("release").join("spool"))
        .args(args)
        .arg("--report")
        .arg(&report)
        .current_dir(&root)
        .status()
        .context("starting spool-bench")?;
    if !status.success() {
        bail!("the benchmarks failed to run ({status})");
    }
    say(&format!("report written to {}", report.display()));
    Ok(())
}

/// Runs every target under `fuzz/fuzz_targets` for a while each, installing
/// cargo-fuzz first when it is missing. `-s none` builds without a
/// sanitizer, which works on the stable toolchain.
fn fuzz(args: &[String]) -> Result<()> {
    let seconds: u64 = match args {
        [] => 30,
        [flag, n] if flag == "--seconds" => n.parse().context("--seconds takes a whole number")?,
        _ => bail!("usage: cargo xtask fuzz [--seconds N]"),
    };
    let root = root();
    let has_fuzz = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_fuzz {
        section("installing cargo-fuzz");
        let status = cargo()
            .args(["install", "cargo-fuzz", "--locked"])
            .status()?;
        if !status.success() {
            bail!("could not install cargo-fuzz ({status})");
        }
    }
    let mut targets: Vec<String> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))?
        .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(str::to_owned))
        .collect();
    targets.sort();
    for target in &targets {
        section(&format!("fuzz {target} for {seconds}s"));
        let status = cargo()
            .args([
                "fuzz",
                "run",
                "-s",
                "none",
                target,
                "--",
                &format!("-max_total_time={seconds}"),
            ])
            .current_dir(&root)
            .status()?;
        if !status.success() {
            bail!(
                "fuzz target {target} found a failure ({status}); the input is under fuzz/artifacts/{target}"
            );
        }
    }
    say(&format!(
        "xtask fuzz: {} targets ran {seconds}s each without a failure",
        targets.len()
    ));
    Ok(())
}

/// The workspace root: xtask's manifest directory is `<root>/xtask`.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one directory below the workspace root")
        .to_path_buf()
}

/// Runs `command` to its end; fails unless it succeeds.
pub(crate) fn run_tool(command: &mut Command) -> Result<()> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The cargo that is running us, so the pinned toolchain is used throughout.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub(crate) fn section(name: &str) {
    say(&format!("\n==> {name}"));
}

#[allow(clippy::print_stderr, reason = "xtask's output is its progress report")]
pub(crate) fn say(text: &str) {
    eprintln!("{text}");
}
