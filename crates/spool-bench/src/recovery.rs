//! `recovery`: `spool serve` killed (`SIGKILL`) with 10 000 runs in flight
//! (mid model call, parked on a question, asleep) beside 20 000 ended
//! ones, then started again on the same journal, measured from outside:
//! the time until it answers a request, and until every interrupted run
//! drives again (its model call asked again, its sleep, due while the
//! server was down, ended and its turn going on). The model is the
//! benchmark's stand-in ([`crate::model`]), which hangs the first calls
//! and sees the ones asked again. The baseline is the same server started
//! on an empty journal. `recovery-pg`: the same for a cluster node killed
//! on a PostgreSQL journal, the time until another node drives its runs,
//! against the lease.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::Scale;
use crate::model::{self, Asked, Reply};
use crate::report::Row;
use crate::serve::{Conn, Killed, free_addr, serving};

/// How long a `spool serve` may take to do anything measured here before
/// the benchmark gives up, saying what it waited for.
const PATIENCE: Duration = Duration::from_secs(120);

/// What the stand-in saw.
#[derive(Default)]
struct Seen {
    /// Set once the server is killed: calls from then on are the
    /// restarted server's.
    restarted: AtomicBool,
    /// First calls held open (model calls in flight at the kill).
    hung: AtomicUsize,
    /// Sleeps that ended before the kill: the benchmark's sleeps were too
    /// short for this machine.
    early: AtomicUsize,
    /// Calls made by the restarted server for interrupted runs.
    resumed: AtomicUsize,
    /// How many of those make every interrupted run driven again, and
    /// when the first and the last came.
    target: AtomicUsize,
    first_at: Mutex<Option<Instant>>,
    all_at: Mutex<Option<Instant>>,
    all: tokio::sync::Notify,
}

impl Seen {
    fn resumed_one(&self) {
        let seen = self.resumed.fetch_add(1, Ordering::SeqCst) + 1;
        if seen == 1 {
            *self
                .first_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        }
        if seen == self.target.load(Ordering::SeqCst) {
            *self
                .all_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
            self.all.notify_one();
        }
    }
}

/// A `spool serve` on a directory that outlives it.
struct Serving {
    _child: Killed,
    started: Instant,
}

impl Serving {
    /// `spool serve` in `dir` on the journal in `dir/journal`.
    fn start(spool: &str, dir: &Path, addr: &str, log: &str) -> anyhow::Result<Self> {
        let journal = dir.join("journal");
        let journal = journal
            .to_str()
            .context("a journal path that is not UTF-8")?;
        Self::start_on(spool, dir, &["--addr", addr, "--journal", journal], log)
    }

    /// `spool serve ARGS` in `dir`, its standard error in `dir/log`.
    fn start_on(spool: &str, dir: &Path, args: &[&str], log: &str) -> anyhow::Result<Self> {
        let log = std::fs::File::create(dir.join(log))?;
        let started = Instant::now();
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        Ok(Self {
            _child: serving(spool, dir, &args, log.into())?,
            started,
        })
    }

    /// Time from the start until `GET /health` is answered 200.
    async fn until_answering(&self, addr: &str) -> anyhow::Result<Duration> {
        loop {
            if let Ok(mut conn) = Conn::open(addr).await
                && let Ok((200, _)) = conn.request("GET /spool/v1/health", b"").await
            {
                return Ok(self.started.elapsed());
            }
            if self.started.elapsed() > PATIENCE {
                bail!("spool serve did not answer on {addr} within {PATIENCE:?}");
            }
            // The poll's own pace: a millisecond of resolution.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("recovery")? else {
        return Ok(Vec::new());
    };
    let (hanging, parked, sleeping, ended) =
        scale.pick((2_500, 5_000, 2_500, 20_000), (20, 20, 20, 40));
    let sleep = scale.pick(6.0, 2.0);
    let tokio = crate::http::tokio()?;
    tokio.block_on(async {
        let seen = Arc::new(Seen::default());
        let url = model::start(stand_in(&seen, sleep)).await?;
        let definition = model::definition(&url);

        // The floor: the same server on an empty journal.
        let mut empty = Vec::new();
        for i in 0..3 {
            let dir = tempfile::tempdir()?;
            std::fs::write(dir.path().join("spool.toml"), &definition)?;
            let addr = free_addr()?;
            let server = Serving::start(&spool, dir.path(), &addr, &format!("empty-{i}.log"))?;
            empty.push(server.until_answering(&addr).await?);
        }
        empty.sort();
        let empty = empty[1];

        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("spool.toml"), &definition)?;
        let addr = free_addr()?;
        let first = Serving::start(&spool, dir.path(), &addr, "first.log")?;
        first.until_answering(&addr).await?;
        // Ended runs first, the sleeps last: the first sleep must still be
        // running when the last is parked and the server killed.
        let mut texts = Vec::new();
        texts.extend(std::iter::repeat_n("done", ended));
        texts.extend(std::iter::repeat_n("hang", hanging));
        texts.extend(std::iter::repeat_n("park", parked));
        texts.extend(std::iter::repeat_n("sleep", sleeping));
        create(&addr, texts).await?;
        until_in_flight(&addr, &seen, parked + sleeping, hanging).await?;
        let all_parked = Instant::now();
        drop(first);
        let early = seen.early.load(Ordering::SeqCst);
        if early > 0 {
            bail!("{early} sleeps of {sleep} s ended before the kill: this machine created the runs too slowly for the benchmark's sleeps");
        }
        // Every sleep is due before the restart: each ends as soon as the
        // restarted server arms it.
        let due = all_parked + Duration::from_secs_f64(sleep);
        tokio::time::sleep_until(due.into()).await;

        seen.target.store(hanging + sleeping, Ordering::SeqCst);
        seen.restarted.store(true, Ordering::SeqCst);
        let again = Serving::start(&spool, dir.path(), &addr, "again.log")?;
        let answering = again.until_answering(&addr).await?;
        let (_, all_at) = until_all_resumed(&seen).await?;
        let driving = all_at.duration_since(again.started);
        let in_flight = hanging + parked + sleeping;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(vec![
            Row::new(
                format!("recovery/until the server answers, {in_flight} runs in flight and {ended} ended"),
                ms(answering),
                "ms",
                "empty journal",
                ms(empty),
            )
            .lower_is_better()
            .figure_at_most(300.0),
            Row::new(
                format!("recovery/until all {} interrupted runs drive again", hanging + sleeping),
                ms(driving),
                "ms",
                "empty journal, answering",
                ms(empty),
            )
            .lower_is_better()
            .figure_at_most(2_000.0),
        ])
    })
}

/// The stand-in's answers to the runs `create` makes: a `hang` run's first
/// call is held open, and asked again once `seen.restarted` is set; a
/// `park` run asks a person; a `sleep` run sleeps `sleep` seconds, and its
/// turn goes on after.
fn stand_in(seen: &Arc<Seen>, sleep: f64) -> model::Answer {
    let seen = Arc::clone(seen);
    Arc::new(move |asked: &Asked| {
        let restarted = seen.restarted.load(Ordering::SeqCst);
        if asked.role == "tool" {
            // A sleep's end: the turn goes on.
            if restarted {
                seen.resumed_one();
            } else {
                seen.early.fetch_add(1, Ordering::SeqCst);
            }
            return Reply::text("done");
        }
        match asked.text.as_str() {
            "hang" if restarted => {
                seen.resumed_one();
                Reply::text("done")
            }
            "hang" => {
                seen.hung.fetch_add(1, Ordering::SeqCst);
                Reply::Hang
            }
            "park" => Reply::Call {
                name: "ask_human",
                arguments: json!({"prompt": "Go on?"}),
            },
            "sleep" => Reply::Call {
                name: "sleep",
                arguments: json!({ "seconds": sleep }),
            },
            _ => Reply::text("done"),
        }
    })
}

/// Waits until `waiting` runs on the server at `addr` wait and the
/// stand-in holds `hanging` calls open.
async fn until_in_flight(
    addr: &str,
    seen: &Seen,
    waiting: usize,
    hanging: usize,
) -> anyhow::Result<()> {
    let since = Instant::now();
    loop {
        let waiting_now = count(addr, "waiting").await?;
        if waiting_now == waiting && seen.hung.load(Ordering::SeqCst) == hanging {
            return Ok(());
        }
        if since.elapsed() > PATIENCE {
            bail!(
                "after {PATIENCE:?}, {waiting_now} of {waiting} runs wait and {} of {hanging} model calls are in flight",
                seen.hung.load(Ordering::SeqCst)
            );
        }
        // A listing of the journal a poll: polled no faster.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the stand-in has seen every call `seen.target` counts; the
/// instants the first and the last came.
async fn until_all_resumed(seen: &Seen) -> anyhow::Result<(Instant, Instant)> {
    tokio::time::timeout(PATIENCE, seen.all.notified())
        .await
        .with_context(|| {
            format!(
                "after {PATIENCE:?} the stand-in had seen {} of the {} calls of the interrupted runs",
                seen.resumed.load(Ordering::SeqCst),
                seen.target.load(Ordering::SeqCst)
            )
        })?;
    let at = |instant: &Mutex<Option<Instant>>, which: &str| {
        instant
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .with_context(|| format!("the {which} call's instant"))
    };
    Ok((at(&seen.first_at, "first")?, at(&seen.all_at, "last")?))
}

/// `recovery-pg`: two `spool serve --cluster` nodes on one PostgreSQL
/// journal (a database of its own on the bench's durable server). Node A
/// holds runs mid model call and runs parked on a question when it is
/// killed (`SIGKILL`); the figure is the time from the kill until node B
/// has asked every one of those model calls again, stated against the
/// lease: a dead node's leases lapse up to a lease after its last renewal
/// (renewed every third of it), and the others look every third of it, so
/// B takes over between two thirds of a lease and four thirds after the
/// kill, then reads and drives the runs.
pub(crate) fn cluster(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("recovery-pg")? else {
        return Ok(Vec::new());
    };
    let Some(server) = crate::pg::server("recovery-pg")? else {
        return Ok(Vec::new());
    };
    let (hanging, parked) = scale.pick((1_000, 1_000), (10, 10));
    let lease_seconds = scale.pick(2_u64, 1);
    let trials = scale.pick(3, 1);
    let tokio = crate::http::tokio()?;
    let lease = Duration::from_secs(lease_seconds);
    let mut moved = Vec::new();
    for trial in 0..trials {
        let database = format!("recovery_{}_{trial}", std::process::id());
        let url = tokio.block_on(crate::pg::create_database(&server, &database))?;
        // Where the kill falls between node A's renewals decides how much
        // of its last lease is left: the trials' kills are spread over the
        // third of a lease between two renewals, so that the figures
        // sample the window rather than the one point this machine's pace
        // of making runs would put every kill at.
        let phase = lease / 3 * u32::try_from(trial)? / u32::try_from(trials)?;
        let outcome = tokio.block_on(node_dies(
            &spool,
            &url,
            hanging,
            parked,
            lease_seconds,
            phase,
        ));
        // Both nodes are gone by now; the database goes whatever happened,
        // and a failed trial's own error is the one told.
        let dropped = tokio.block_on(crate::pg::drop_database(&server, &database));
        moved.push(outcome?);
        dropped?;
    }
    let lease_ms = lease.as_secs_f64() * 1e3;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut all: Vec<Duration> = moved.iter().map(|m| m.all).collect();
    let mut spans: Vec<Duration> = moved.iter().map(|m| m.span).collect();
    all.sort();
    spans.sort();
    // The ratio is in leases, with no target: issue 56 asks for the time
    // stated against the lease, which is what an operator sets.
    let row = |which: String, took: Duration| {
        Row::new(
            format!("recovery-pg/{which} of {trials}"),
            ms(took),
            "ms",
            format!("the lease, {lease_seconds} s"),
            lease_ms,
        )
    };
    let killed = format!(
        "a killed node's {hanging} runs mid model call asked again on another, {parked} parked beside them,"
    );
    let mut rows = vec![row(format!("{killed} median"), all[all.len() / 2])];
    if trials > 1 {
        rows.insert(0, row(format!("{killed} fastest"), all[0]));
        rows.push(row(format!("{killed} slowest"), all[all.len() - 1]));
    }
    rows.push(row(
        "the other node's first call asked again to its last, median".to_owned(),
        spans[spans.len() / 2],
    ));
    Ok(rows)
}

/// What one trial of `cluster` took.
struct Moved {
    /// From node A's kill until node B had asked again every call A held.
    all: Duration,
    /// From B's first call asked again to its last: B's reading and
    /// driving of the runs, apart from the wait for A's leases.
    span: Duration,
}

/// One trial of `cluster` on the empty database at `url`: the time from
/// node A's kill until node B has asked again every model call A held.
/// The kill comes `phase` after the runs are in flight.
async fn node_dies(
    spool: &str,
    url: &str,
    hanging: usize,
    parked: usize,
    lease_seconds: u64,
    phase: Duration,
) -> anyhow::Result<Moved> {
    let seen = Arc::new(Seen::default());
    let model = model::start(stand_in(&seen, 0.0)).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("spool.toml"), model::definition(&model))?;
    let lease = lease_seconds.to_string();
    let node = |name: &str| -> anyhow::Result<(Serving, String)> {
        let addr = free_addr()?;
        let args = [
            "--addr",
            &addr,
            "--journal",
            url,
            "--cluster",
            "--node-name",
            name,
            "--lease-seconds",
            &lease,
        ];
        let serving = Serving::start_on(spool, dir.path(), &args, &format!("{name}.log"))?;
        Ok((serving, addr))
    };
    let (a, a_addr) = node("a")?;
    a.until_answering(&a_addr).await?;
    let (b, b_addr) = node("b")?;
    b.until_answering(&b_addr).await?;
    let mut texts = Vec::new();
    texts.extend(std::iter::repeat_n("hang", hanging));
    texts.extend(std::iter::repeat_n("park", parked));
    create(&a_addr, texts).await?;
    until_in_flight(&a_addr, &seen, parked, hanging).await?;
    // Not a wait for anything: the kill's place between renewals.
    tokio::time::sleep(phase).await;
    seen.target.store(hanging, Ordering::SeqCst);
    seen.restarted.store(true, Ordering::SeqCst);
    let killed = Instant::now();
    drop(a);
    let (first_at, all_at) = until_all_resumed(&seen).await?;
    drop(b);
    Ok(Moved {
        all: all_at.duration_since(killed),
        span: all_at.duration_since(first_at),
    })
}

/// Creates a run per text from 32 connections; every run but an ended
/// one is answered at once (`Prefer: respond-async`).
async fn create(addr: &str, texts: Vec<&'static str>) -> anyhow::Result<()> {
    let texts = Arc::new(Mutex::new(texts.into_iter()));
    let mut clients = Vec::new();
    for _ in 0..32 {
        let mut conn = Conn::open(addr).await?;
        let texts = Arc::clone(&texts);
        clients.push(tokio::spawn(async move {
            loop {
                let next = texts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .next();
                let Some(text) = next else { break };
                let body = json!({ "text": text }).to_string();
                let headers = if text == "done" {
                    ""
                } else {
                    "Prefer: respond-async\r\n"
                };
                let (status, reply) = conn
                    .request_with("POST /spool/v1/runs", headers, body.as_bytes())
                    .await?;
                if status != 200 && status != 202 {
                    bail!(
                        "POST /runs {text} answered {status}: {}",
                        String::from_utf8_lossy(&reply)
                    );
                }
            }
            anyhow::Ok(())
        }));
    }
    for client in clients {
        client.await??;
    }
    Ok(())
}

/// How many runs are in `state` (`GET /runs`' `total`).
async fn count(addr: &str, state: &str) -> anyhow::Result<usize> {
    let mut conn = Conn::open(addr).await?;
    let (status, body) = conn
        .request(&format!("GET /spool/v1/runs?state={state}&limit=1"), b"")
        .await?;
    anyhow::ensure!(status == 200, "GET /runs answered {status}");
    let listing: Value = serde_json::from_slice(&body)?;
    listing["total"]
        .as_u64()
        .and_then(|total| usize::try_from(total).ok())
        .context("a listing without total")
}
