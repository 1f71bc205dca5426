//! `salvor`: `spool serve` beside `salvor serve` (a Rust durable agent
//! runtime, built from its own repository), on the same machine, the same
//! stand-in model ([`crate::model`]: Spool through its `openai` engine,
//! salvor through Anthropic's Messages API) and the same clients, measured
//! from outside both processes, trials taken in turn.
//!
//! A one-turn durable run each way, as each server offers it: Spool's
//! `POST /spool/v1/runs`, answered at the turn's end; salvor's
//! `POST /v1/runs`, answered at once, then its run's event stream
//! (`GET /v1/runs/{id}/events`) read until its `end` frame says
//! `completed`. Salvor's stream reads its store every 50 ms (its
//! default), so a client waits for that poll after each run: 256 clients
//! are measured besides 16 and 64, enough to keep salvor's runs going
//! while its clients wait. Beside the rates, each server's CPU per run and its
//! resident memory after 1 000 runs made one at a time on a fresh server.
//! Needs `SPOOL_BIN` and `SALVOR_BIN` (salvor's `salvor` binary:
//! `cargo build --release -p salvor-cli --no-default-features` in its
//! checkout); without either the rows are skipped, said. `cargo xtask
//! bench` does not build salvor: it is a third party's whole workspace.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Scale;
use crate::model::{self, Reply};
use crate::report::Row;
use crate::serve::{
    Conn, Killed, RUN, Server, closed_loop, cpu_ms, free_addr, serving, status_field,
};

/// A `salvor serve` child on a store of its own, killed when dropped.
struct Salvor {
    child: Killed,
    addr: String,
    agent: String,
    _dir: tempfile::TempDir,
}

impl Salvor {
    /// Starts `salvor serve` and registers an agent whose model is the
    /// stand-in at `base` (`http://HOST:PORT`, to which salvor appends
    /// `/v1/messages`).
    async fn start(salvor: &str, base: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let addr = free_addr()?;
        // Its log to a file: a pipe nobody reads would block it.
        let log = std::fs::File::create(dir.path().join("salvor.log"))?;
        let store = dir.path().join("salvor.db");
        let args = [
            OsStr::new("--bind"),
            OsStr::new(&addr),
            OsStr::new("--store"),
            store.as_os_str(),
        ];
        let mut server = Self {
            child: serving(salvor, dir.path(), &args, log.into())?,
            addr,
            agent: String::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = loop {
            if let Ok(conn) = Conn::open(&server.addr).await {
                break conn;
            }
            if Instant::now() > deadline {
                bail!("salvor serve did not listen on {} within 30 s", server.addr);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let definition = json!({"model": "stand-in", "llm": {"base_url": base}});
        let (status, reply) = conn
            .request("POST /v1/agents", definition.to_string().as_bytes())
            .await?;
        anyhow::ensure!(
            status == 201,
            "salvor refused the agent ({status}): {}",
            String::from_utf8_lossy(&reply)
        );
        let reply: Value = serde_json::from_slice(&reply)?;
        server.agent = reply["agent"].as_str().context("an agent hash")?.to_owned();
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// One salvor run on `conn`: started, then its event stream read on a
/// connection of its own until the stream's `end` frame, which must say
/// `completed`.
async fn salvor_run(conn: &mut Conn, addr: &str, agent: &str) -> anyhow::Result<()> {
    let start = json!({"agent": agent, "input": "hello"}).to_string();
    let (status, reply) = conn.request("POST /v1/runs", start.as_bytes()).await?;
    if status != 201 {
        bail!(
            "salvor's POST /v1/runs answered {status}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    let reply: Value = serde_json::from_slice(&reply)?;
    let run = reply["run"].as_str().context("a run id")?;
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream
        .write_all(
            format!(
                "GET /v1/runs/{run}/events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut lines = BufReader::new(stream).lines();
    let mut ended = false;
    while let Some(line) = lines.next_line().await? {
        if line == "event: end" {
            ended = true;
        } else if ended && let Some(data) = line.strip_prefix("data:") {
            let end: Value = serde_json::from_str(data.trim())?;
            anyhow::ensure!(
                end["status"]["state"] == "completed",
                "a salvor run ended {end}"
            );
            return Ok(());
        }
    }
    bail!("salvor's event stream of {run} closed before its end frame")
}

/// Salvor runs per second from `clients` keep-alive connections until
/// `duration` has passed.
async fn salvor_loop(server: &Salvor, clients: usize, duration: Duration) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut conn = Conn::open(&server.addr).await?;
        let (addr, agent) = (server.addr.clone(), server.agent.clone());
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < duration {
                salvor_run(&mut conn, &addr, &agent).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// A rate and the process's CPU per run over it (milliseconds).
async fn with_cpu(
    pid: u32,
    load: impl std::future::Future<Output = anyhow::Result<f64>>,
) -> anyhow::Result<(f64, f64)> {
    let before = cpu_ms(pid)?;
    let started = Instant::now();
    let rate = load.await?;
    let runs = rate * started.elapsed().as_secs_f64();
    Ok((rate, (cpu_ms(pid)? - before) / runs.max(1.0)))
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("salvor")? else {
        return Ok(Vec::new());
    };
    let Ok(salvor) = std::env::var("SALVOR_BIN") else {
        crate::http::say(
            "salvor: skipped, SALVOR_BIN is not set (build salvor from its repository: \
             cargo build --release -p salvor-cli --no-default-features)",
        )?;
        return Ok(Vec::new());
    };
    let duration = scale.pick(Duration::from_secs(5), Duration::from_millis(400));
    let trials = scale.pick(2, 1);
    let tokio = crate::http::tokio()?;
    tokio.block_on(async {
        let url = model::start(Arc::new(|_: &model::Asked| Reply::text("echo"))).await?;
        let base = url.trim_end_matches("/v1").to_owned();
        let definition = model::definition(&url);
        let mut rows = Vec::new();
        for clients in [16usize, 64, 256] {
            let spooled = Server::start_with(&spool, &[("spool.toml", &definition)])?;
            let salvored = Salvor::start(&salvor, &base).await?;
            // Warm: connections, caches, the stores' first pages.
            closed_loop(&spooled.addr, RUN.0, RUN.1, RUN.2, clients, duration / 5).await?;
            salvor_loop(&salvored, clients, duration / 5).await?;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..trials {
                ours.push(
                    with_cpu(
                        spooled.pid(),
                        closed_loop(&spooled.addr, RUN.0, RUN.1, RUN.2, clients, duration),
                    )
                    .await?,
                );
                theirs.push(
                    with_cpu(salvored.pid(), salvor_loop(&salvored, clients, duration)).await?,
                );
            }
            let mean = |trials: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
                trials.iter().map(pick).sum::<f64>() / trials.len() as f64
            };
            rows.push(Row::new(
                format!("salvor/one-turn runs over HTTP, {clients} clients"),
                mean(&ours, |t| t.0),
                "runs/s",
                "salvor serve, the same clients",
                mean(&theirs, |t| t.0),
            ));
            rows.push(
                Row::new(
                    format!("salvor/server CPU per run, {clients} clients"),
                    mean(&ours, |t| t.1),
                    "ms",
                    "salvor serve's",
                    mean(&theirs, |t| t.1),
                )
                .lower_is_better(),
            );
        }
        // Memory after the first 1 000 runs of fresh servers.
        let spooled = Server::start_with(&spool, &[("spool.toml", &definition)])?;
        let salvored = Salvor::start(&salvor, &base).await?;
        let mut conn = Conn::open(&spooled.addr).await?;
        let (head, body, expect) = RUN;
        for _ in 0..1_000 {
            let (status, reply) = conn.request(head, body).await?;
            anyhow::ensure!(
                status == 200 && String::from_utf8_lossy(&reply).contains(expect),
                "a Spool run answered {status}"
            );
        }
        let mut conn = Conn::open(&salvored.addr).await?;
        for _ in 0..1_000 {
            salvor_run(&mut conn, &salvored.addr, &salvored.agent).await?;
        }
        rows.push(
            Row::new(
                "salvor/RSS after 1000 runs",
                status_field(spooled.pid(), "VmRSS:")? / 1024.0,
                "MB",
                "salvor serve's",
                status_field(salvored.pid(), "VmRSS:")? / 1024.0,
            )
            .lower_is_better(),
        );
        anyhow::Ok(rows)
    })
}
