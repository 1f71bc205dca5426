//! `serve-runs`: the `spool serve` process as a user runs it, measured from
//! outside: one-turn runs over keep-alive connections from 16 and 64
//! clients, the server's CPU per run (from `/proc/PID/stat`), its threads
//! after each load (against the idle server's) and its resident memory
//! after 1 000 runs. The baseline for CPU is the
//! same server answering `GET /health` on the same connections: what a
//! request costs the HTTP plumbing alone. Needs the `spool` binary in
//! `SPOOL_BIN` (`cargo xtask bench` builds it); without it the rows are
//! skipped, said.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Scale;
use crate::report::Row;

/// A child process, killed (and waited for) when dropped.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `PROGRAM serve ARGS` started in `dir`, its standard error to `stderr`
/// (a file or nothing: a pipe nobody reads would block it), killed when
/// dropped. How every server a benchmark measures from outside is started.
pub(crate) fn serving(
    program: &str,
    dir: &Path,
    args: &[&OsStr],
    stderr: Stdio,
) -> anyhow::Result<Killed> {
    let child = Command::new(program)
        .arg("serve")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {program} serve"))?;
    Ok(Killed(child))
}

/// A free loopback address, given back for a server to take.
pub(crate) fn free_addr() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

/// A `spool serve` child, killed when dropped.
pub(crate) struct Server {
    child: Killed,
    pub(crate) addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    pub(crate) fn start(spool: &str) -> anyhow::Result<Self> {
        Self::start_with(spool, &[])
    }

    /// A server whose directory holds `files` (`spool.toml`, a script),
    /// each a name and its contents.
    pub(crate) fn start_with(spool: &str, files: &[(&str, &str)]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        for (name, contents) in files {
            std::fs::write(dir.path().join(name), contents)?;
        }
        let addr = free_addr()?;
        let journal = dir.path().join("journal");
        let args = [
            OsStr::new("--addr"),
            OsStr::new(&addr),
            OsStr::new("--journal"),
            journal.as_os_str(),
        ];
        let server = Self {
            child: serving(spool, dir.path(), &args, Stdio::null())?,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&server.addr).is_err() {
            if Instant::now() > deadline {
                bail!("spool serve did not listen on {} within 30 s", server.addr);
            }
            std::thread::yield_now();
        }
        Ok(server)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// User and system CPU of process `pid` so far, in milliseconds.
pub(crate) fn cpu_ms(pid: u32) -> anyhow::Result<f64> {
    crate::oneshot::cpu_ms(&pid.to_string(), 14)
}

/// A field of `/proc/PID/status` (its number).
pub(crate) fn status_field(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .next()
        .context("an empty status field")?
        .parse()?)
}

/// One keep-alive HTTP/1.1 connection.
pub(crate) struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    pub(crate) async fn open(addr: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
        })
    }

    /// Sends one request and reads its reply; the status and the body.
    pub(crate) async fn request(
        &mut self,
        head: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        self.request_with(head, "", body).await
    }

    /// [`request`](Self::request) with more header lines (each ending in
    /// `\r\n`).
    pub(crate) async fn request_with(
        &mut self,
        head: &str,
        headers: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        // One write: with TCP_NODELAY, a head and a body written apart go
        // out as two segments, and the server would be woken twice per
        // request, which is the client's cost, not the server's.
        let mut request = format!(
            "{head} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .context("a reply without a status line")?
            .parse()?;
        let mut length = None;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("the connection closed in a reply's headers");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = Some(value.trim().parse::<usize>()?);
            }
        }
        let mut body = vec![0; length.context("a reply without Content-Length")?];
        self.stream.read_exact(&mut body).await?;
        Ok((status, body))
    }
}

/// Requests answered per second by `clients` keep-alive connections, each
/// sending `head` with `body` until `duration` has passed; every reply
/// must be a 200 holding `expect`.
pub(crate) async fn closed_loop(
    addr: &str,
    head: &'static str,
    body: &'static [u8],
    expect: &'static str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    closed_loop_with(
        addr,
        head,
        Arc::new(|_| body.to_vec()),
        expect,
        clients,
        duration,
    )
    .await
}

/// [`closed_loop`] with each request's body made by `body` from a number
/// no other request of the loop gets.
pub(crate) async fn closed_loop_with(
    addr: &str,
    head: &'static str,
    body: Arc<dyn Fn(u64) -> Vec<u8> + Send + Sync>,
    expect: &'static str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let numbers = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut conn = Conn::open(addr).await?;
        let done = Arc::clone(&done);
        let numbers = Arc::clone(&numbers);
        let body = Arc::clone(&body);
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < duration {
                let body = body(numbers.fetch_add(1, Ordering::Relaxed));
                let (status, reply) = conn.request(head, &body).await?;
                if status != 200 || !String::from_utf8_lossy(&reply).contains(expect) {
                    bail!(
                        "{head} answered {status}: {}",
                        String::from_utf8_lossy(&reply)
                    );
                }
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

pub(crate) const RUN: (&str, &[u8], &str) = (
    "POST /spool/v1/runs",
    b"{\"text\":\"hello\"}",
    "\"completed\"",
);
const HEALTH: (&str, &[u8], &str) = ("GET /spool/v1/health", b"", "");

/// The rate and the server's CPU per request of one closed loop.
async fn measured(
    server: &Server,
    (head, body, expect): (&'static str, &'static [u8], &'static str),
    clients: usize,
    duration: Duration,
) -> anyhow::Result<(f64, f64)> {
    let before = cpu_ms(server.pid())?;
    let started = Instant::now();
    let rate = closed_loop(&server.addr, head, body, expect, clients, duration).await?;
    let requests = rate * started.elapsed().as_secs_f64();
    let cpu = cpu_ms(server.pid())? - before;
    Ok((rate, cpu / requests.max(1.0)))
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("serve-runs")? else {
        return Ok(Vec::new());
    };
    let duration = scale.pick(Duration::from_secs(6), Duration::from_millis(400));
    let tokio = crate::http::tokio()?;
    let mut rows = Vec::new();

    // Memory after the first 1 000 runs of a fresh server.
    {
        let server = Server::start(&spool)?;
        let idle = status_field(server.pid(), "VmRSS:")? / 1024.0;
        tokio.block_on(async {
            let mut conn = Conn::open(&server.addr).await?;
            for _ in 0..1_000 {
                let (status, _) = conn.request(RUN.0, RUN.1).await?;
                anyhow::ensure!(status == 200, "a run answered {status}");
            }
            anyhow::Ok(())
        })?;
        let after = status_field(server.pid(), "VmRSS:")? / 1024.0;
        rows.push(
            Row::new(
                "serve-runs/RSS after 1000 runs",
                after,
                "MB",
                "idle server",
                idle,
            )
            .lower_is_better()
            .figure_at_most(20.0),
        );
    }

    let mut rates = Vec::new();
    for clients in [16usize, 64] {
        // A fresh server per load, so neither inherits the other's runs.
        let server = Server::start(&spool)?;
        let idle_threads = status_field(server.pid(), "Threads:")?;
        let ((rate, cpu), (health_rate, health_cpu)) = tokio.block_on(async {
            // Warm: connections, caches, the journal's first pages.
            closed_loop(&server.addr, RUN.0, RUN.1, RUN.2, clients, duration / 6).await?;
            let runs = measured(&server, RUN, clients, duration).await?;
            let health = measured(&server, HEALTH, clients, duration / 2).await?;
            anyhow::Ok((runs, health))
        })?;
        let threads = status_field(server.pid(), "Threads:")?;
        rates.push(rate);
        rows.push(Row::new(
            format!("serve-runs/{clients} clients"),
            rate,
            "runs/s",
            "GET /health req/s",
            health_rate,
        ));
        rows.push(
            Row::new(
                format!("serve-runs/{clients} clients, server CPU per run"),
                cpu,
                "ms",
                "CPU per GET /health",
                health_cpu,
            )
            .lower_is_better()
            .figure_at_most(0.4),
        );
        rows.push(Row::new(
            format!("serve-runs/{clients} clients, threads after"),
            threads,
            "threads",
            "idle server",
            idle_threads,
        ));
    }
    if let [at_16, at_64] = rates[..] {
        // Throughput that holds as clients grow.
        rows.push(
            Row::new(
                "serve-runs/64 clients against 16",
                at_64,
                "runs/s",
                "16 clients",
                at_16,
            )
            .ratio_at_least(1.0),
        );
    }
    Ok(rows)
}
