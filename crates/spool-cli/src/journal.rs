//! Where a journal is (`--journal`: a directory for SQLite, a
//! `postgres://` URL for PostgreSQL), opening it for a runtime or for
//! reading, and `spool journal copy`, which moves a journal between
//! stores.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use spool_journal::event::{Effect, Event};
use spool_journal::store::sqlite::{self, SqliteJournal};
use spool_journal::store::{CallRef, ClaimKey, Clock};
use spool_journal::{Journal, JournalError, Seq};
use spool_journal_pg::{Cluster, Renewal};
use spool_runtime::Runtime;
use time::OffsetDateTime;

/// A journal's location, as `--journal` names it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JournalAt {
    /// SQLite in this directory.
    Dir(PathBuf),
    /// PostgreSQL at this URL.
    Postgres(String),
}

impl FromStr for JournalAt {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if spool_journal_pg::is_url(text) {
            return Ok(Self::Postgres(text.to_owned()));
        }
        // Anything else with a scheme is a store this build does not
        // have, never a directory named `mysql:`.
        if let Some((scheme, _)) = text.split_once("://")
            && !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            return Err(format!(
                "unknown journal scheme `{scheme}://`: a journal is a directory (SQLite) or a postgres:// URL"
            ));
        }
        if text.is_empty() {
            return Err("the journal is empty: give a directory or a postgres:// URL".to_owned());
        }
        Ok(Self::Dir(PathBuf::from(text)))
    }
}

impl fmt::Display for JournalAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::Postgres(url) => f.write_str(&spool_journal_pg::redact(url)),
        }
    }
}

/// This process's claim on a journal, held as long as it drives runs.
#[derive(Debug)]
pub(crate) enum Claim {
    Dir(#[allow(dead_code, reason = "held for its lock")] sqlite::Owner),
    Postgres(spool_journal_pg::Owner),
    /// A node of a cluster: it drives the runs it holds leases on.
    Node(Arc<Cluster>),
}

impl Claim {
    /// Resolves when the claim is lost (a PostgreSQL owner's connection
    /// ended); never for a directory's lock, which lives with the process.
    pub(crate) async fn lost(&self) {
        match self {
            // A node whose lease lapses joins again (`keep_node`).
            Self::Dir(_) | Self::Node(_) => std::future::pending().await,
            Self::Postgres(owner) => owner.lost().await,
        }
    }
}

/// How long the process that opens a journal lives, which decides what
/// it leaves at close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Process {
    /// A server: a graceful stop leaves the SQLite write-ahead log empty.
    Serving,
    /// One command (`spool run`, `spool chat`): a small write-ahead log is
    /// left for the next to append to (`sqlite::KEEP_WAL_BELOW`): emptying
    /// it and starting a new one cost such a process about 1 ms.
    OneShot,
}

/// Opens the journal for a runtime, and claims it for this process.
pub(crate) async fn open_owned(
    at: &JournalAt,
    process: Process,
) -> anyhow::Result<(Arc<dyn Journal>, Claim)> {
    open_owned_with(at, None, process).await
}

/// [`open_owned`], its store's `recorded_at` from `clock` when given.
async fn open_owned_with(
    at: &JournalAt,
    clock: Option<Clock>,
    process: Process,
) -> anyhow::Result<(Arc<dyn Journal>, Claim)> {
    let in_use = |error: JournalError| match error {
        JournalError::InUse { .. } => anyhow::anyhow!(
            "{error}: a server has it? talk to it with `--url`, or give this process its own `--journal`"
        ),
        other => anyhow::Error::new(other),
    };
    match at {
        JournalAt::Dir(dir) => {
            let owner = sqlite::Owner::claim(dir).map_err(in_use)?;
            let mut options = sqlite::Options::default();
            if let Some(clock) = clock {
                options.clock = clock;
            }
            if process == Process::OneShot {
                options.keep_wal_below = sqlite::KEEP_WAL_BELOW;
            }
            let store = SqliteJournal::open(dir, options)
                .with_context(|| format!("opening the journal in {}", dir.display()))?;
            Ok((Arc::new(store), Claim::Dir(owner)))
        }
        JournalAt::Postgres(url) => {
            // Opening first creates the tables, where the claim records
            // its pid; opening is safe beside another owner.
            let mut options = pg_options();
            if let Some(clock) = clock {
                options.clock = clock;
            }
            let store = spool_journal_pg::PgJournal::connect(url, options)
                .await
                .with_context(|| format!("opening the journal at {at}"))?;
            if process == Process::Serving {
                crate::serve::say(&format!("spool: journal at {at}, {}", transport(&store)));
            }
            let owner = spool_journal_pg::Owner::claim(url, None)
                .await
                .map_err(in_use)?;
            Ok((Arc::new(store), Claim::Postgres(owner)))
        }
    }
}

/// How the store reaches its database, for the line a server starts with.
fn transport(store: &spool_journal_pg::PgJournal) -> &'static str {
    if store.encrypted() {
        "over TLS"
    } else {
        "not encrypted (a Unix socket, `sslmode=disable`, or a server offering no TLS: `sslmode=require` refuses that)"
    }
}

/// Opens an existing journal for reading only.
pub(crate) async fn open_read_only(at: &JournalAt) -> anyhow::Result<Arc<dyn Journal>> {
    match at {
        JournalAt::Dir(dir) => Ok(Arc::new(
            SqliteJournal::open_read_only(dir)
                .with_context(|| format!("opening the journal in {}", dir.display()))?,
        )),
        JournalAt::Postgres(url) => Ok(Arc::new(
            spool_journal_pg::PgJournal::connect_read_only(url, pg_options())
                .await
                .with_context(|| format!("opening the journal at {at}"))?,
        )),
    }
}

fn pg_options() -> spool_journal_pg::Options {
    spool_journal_pg::Options::default()
}

/// `spool serve`'s cluster flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterArgs {
    /// Serve as one node of a cluster on a PostgreSQL journal: drive only
    /// the runs this node holds leases on, and take over the runs of nodes
    /// that die (docs/cluster.md).
    #[arg(long)]
    pub(crate) cluster: bool,
    /// The node's name, for operators (default: the host name and pid).
    #[arg(long, requires = "cluster")]
    pub(crate) node_name: Option<String>,
    /// How long a node's leases outlive its last renewal: a dead node's
    /// runs move after this long.
    #[arg(long, requires = "cluster", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) lease_seconds: u64,
    /// Where the other nodes reach this one to forward it commands for
    /// the runs it drives: `http://HOST:PORT`, `https://HOST[:PORT]`
    /// (`--tls-cert`, or a TLS proxy in front of it: a name its
    /// certificate is for) or `unix:/PATH` (default: the address it
    /// listens on; needed when that is 0.0.0.0 or ::).
    #[arg(long, requires = "cluster", value_name = "URL")]
    pub(crate) advertise: Option<String>,
}

impl ClusterArgs {
    /// The URL other nodes forward commands to: `--advertise`, or the
    /// listener's own address with `scheme` (`http`, `https`) when it
    /// names one host.
    pub(crate) fn advertised(&self, listening: &str, scheme: &str) -> anyhow::Result<String> {
        if let Some(url) = &self.advertise {
            spool_http::Client::new(url).map_err(|_| {
                anyhow::anyhow!(
                    "--advertise `{url}`: give http://HOST:PORT, https://HOST[:PORT] or unix:/PATH"
                )
            })?;
            return Ok(url.trim_end_matches('/').to_owned());
        }
        if let Ok(addr) = listening.parse::<std::net::SocketAddr>() {
            if addr.ip().is_unspecified() {
                bail!(
                    "listening on {addr} names no host the other nodes can reach: pass --advertise {scheme}://THIS-HOST:{}",
                    addr.port()
                );
            }
            return Ok(format!("{scheme}://{addr}"));
        }
        Ok(listening.to_owned())
    }
}

/// Which node drives a run, for the HTTP channel: the live node holding
/// its lease, when that is not this one.
pub(crate) struct Placement(pub(crate) Arc<Cluster>);

impl spool_http::Placement for Placement {
    fn elsewhere<'a>(
        &'a self,
        run: &'a spool_journal::RunId,
    ) -> spool_runtime::BoxFuture<'a, Result<Option<String>, spool_runtime::RuntimeError>> {
        Box::pin(async move {
            let holder = self.0.holder(run).await?;
            Ok(holder
                .filter(|(node, _)| *node != self.0.node())
                .and_then(|(_, address)| address))
        })
    }
}

/// Joins the cluster on the journal at `at` and opens the journal fenced
/// by the node's leases.
pub(crate) async fn open_node(
    at: &JournalAt,
    args: &ClusterArgs,
    address: &str,
) -> anyhow::Result<(Arc<dyn Journal>, Arc<Cluster>)> {
    let JournalAt::Postgres(url) = at else {
        bail!("--cluster needs a PostgreSQL journal (--journal postgres://…): nodes share it");
    };
    let name = args.node_name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let cluster = Cluster::join(
        url,
        spool_journal_pg::ClusterOptions {
            schema: None,
            name,
            address: Some(address.to_owned()),
            lease: Duration::from_secs(args.lease_seconds),
        },
    )
    .await
    .with_context(|| format!("joining the cluster at {at}"))?;
    let options = spool_journal_pg::Options {
        fence: Some(cluster.fence()),
        writers: spool_journal_pg::cluster::NODE_WRITERS,
        ..pg_options()
    };
    let store = spool_journal_pg::PgJournal::connect(url, options)
        .await
        .with_context(|| format!("opening the journal at {at}"))?;
    crate::serve::say(&format!(
        "spool: node {} of the cluster at {at} (lease {} s), {}",
        cluster.node(),
        args.lease_seconds,
        transport(&store)
    ));
    Ok((Arc::new(store), Arc::new(cluster)))
}

/// Keeps this node's lease, every third of the lease time, from now on
/// and for as long as the process runs; takes over what dead nodes left
/// and recovers it, then keeps doing so at the same pace. Returns what the
/// first look took over, and how many of those runs it resumed; later
/// takeovers are handed to the scheduler in `schedules` once it is there
/// (a schedule whose record run moved here fires from this node now).
///
/// The lease is renewed by a task of its own, started before the first
/// takeover: taking over and recovering many runs (a node that served
/// tens of thousands stopped) can take longer than a lease, and a lease
/// that lapsed meanwhile would hand the runs on again as soon as they were
/// taken.
pub(crate) async fn keep_node(
    node: Arc<Cluster>,
    runtime: Runtime,
    schedules: Arc<std::sync::OnceLock<spool_runtime::Scheduler>>,
) -> anyhow::Result<(Vec<spool_journal::RunId>, usize)> {
    let renewing = tokio::spawn({
        let node = Arc::clone(&node);
        async move {
            let mut tick = every_third_of_lease(&node).await;
            loop {
                tick.tick().await;
                match node.renew().await {
                    Ok(Renewal::Renewed) => {}
                    Ok(Renewal::Rejoined { was, now }) => crate::serve::say(&format!(
                        "spool: this node's lease lapsed (it was paused or cut off); its runs as node {was} are no longer its own; it is node {now} now"
                    )),
                    // The node left: the server is stopping.
                    Err(JournalError::Closed) => return,
                    Err(error) => {
                        tracing::warn!(target: "spool::cluster", %error, "renewing this node's lease");
                    }
                }
            }
        }
    });
    let first = take_over(&node, &runtime).await?;
    tokio::spawn(async move {
        let mut tick = every_third_of_lease(&node).await;
        loop {
            tick.tick().await;
            // Once the node left, the runs are for the other nodes.
            if renewing.is_finished() {
                return;
            }
            match take_over(&node, &runtime).await {
                Ok((runs, _)) if !runs.is_empty() => {
                    if let Some(schedules) = schedules.get()
                        && let Err(error) = schedules.taken_over(&runs).await
                    {
                        tracing::warn!(target: "spool::cluster", %error, "settling the schedules taken over");
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(target: "spool::cluster", %error, "taking over the runs of dead nodes");
                }
            }
        }
    });
    Ok(first)
}

/// A tick every third of the node's lease time, its first (immediate)
/// one already taken.
async fn every_third_of_lease(node: &Cluster) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(node.lease() / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tick
}

async fn take_over(
    node: &Cluster,
    runtime: &Runtime,
) -> anyhow::Result<(Vec<spool_journal::RunId>, usize)> {
    let runs = node.take_over().await?;
    if runs.is_empty() {
        return Ok((runs, 0));
    }
    let recovery = runtime.recover_runs(&runs).await?;
    crate::serve::say(&format!(
        "spool: took over {} runs from nodes that stopped; {} resumed",
        runs.len(),
        recovery.resumed
    ));
    for (run, error) in &recovery.unreadable {
        crate::serve::say(&format!(
            "spool: run {run} cannot be read and is left as it is: {error}"
        ));
    }
    Ok((runs, recovery.resumed))
}

#[derive(Debug, Subcommand)]
pub(crate) enum JournalCommand {
    /// Copy every run of one journal into another, empty one (SQLite to
    /// PostgreSQL or back), verifying each run's hash chain on both
    /// sides. FROM is only read; stop the server that writes it first.
    Copy {
        /// The journal to copy: a directory or a postgres:// URL.
        from: JournalAt,
        /// Where to copy it: a directory or a postgres:// URL, holding no
        /// runs yet.
        to: JournalAt,
    },
}

pub(crate) fn run(command: JournalCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        match command {
            JournalCommand::Copy { from, to } => copy(&from, &to).await,
        }
    })
}

/// The copy writes through the target store's own `append`, so the target
/// keeps its indexes exactly as if the runs had happened there; its clock
/// gives each append the time the source recorded, so every envelope, and
/// so every hash, comes out identical.
async fn copy(from: &JournalAt, to: &JournalAt) -> anyhow::Result<ExitCode> {
    if from == to {
        bail!("FROM and TO are the same journal");
    }
    let source = open_read_only(from).await?;
    let at = Arc::new(Mutex::new(OffsetDateTime::UNIX_EPOCH));
    let clock: Clock = {
        let at = Arc::clone(&at);
        Arc::new(move || *at.lock().unwrap_or_else(PoisonError::into_inner))
    };
    let (target, _claim) = open_owned_with(to, Some(clock), Process::Serving).await?;
    let existing = target.runs().await?;
    if !existing.is_empty() {
        bail!(
            "{to} already holds {} runs: copy into an empty journal",
            existing.len()
        );
    }
    let runs = source.runs().await?;
    let mut events = 0_u64;
    for summary in &runs {
        let run = &summary.run_id;
        let log = source
            .read(run, Seq(0))
            .await
            .with_context(|| format!("reading run {run} from {from}"))?;
        // One append per instant the source recorded: the source's own
        // appends, as near as the log tells.
        let mut start = 0;
        while start < log.len() {
            let when = log[start].recorded_at;
            let end = start
                + log[start..]
                    .iter()
                    .take_while(|e| e.recorded_at == when)
                    .count();
            for envelope in &log[start..end] {
                // An idempotent call's claim is the store's, not the
                // log's: take it again as the call first did, so a later
                // call under the same key is answered, not run again. The
                // first claimant in the copy holds it; the output is the
                // same whoever does.
                if let Event::ToolCallRequested(request) = &envelope.event
                    && let (Effect::Idempotent, Some(key)) =
                        (request.effect, &request.idempotency_key)
                {
                    let key = ClaimKey {
                        tool: request.tool.clone(),
                        key: key.clone(),
                    };
                    let holder = CallRef {
                        run: run.clone(),
                        call_id: request.call_id.clone(),
                    };
                    match target.claim(&key, &holder).await {
                        Ok(_) | Err(JournalError::CallInFlight { .. }) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
            *at.lock().unwrap_or_else(PoisonError::into_inner) = when;
            let batch = log[start..end].iter().map(|e| e.event.clone()).collect();
            target
                .append(run, Seq(start as u64), batch)
                .await
                .with_context(|| format!("writing run {run} to {to}"))?;
            start = end;
        }
        // Read back through the target's own verification: the same
        // envelopes, so the same bytes and the same hash chain.
        let copied = target.read(run, Seq(0)).await?;
        if copied != log {
            bail!("run {run} reads back differently from {to}; the copy is not faithful");
        }
        events += log.len() as u64;
    }
    crate::talk::out(
        &format!(
            "copied {} runs ({events} events) from {from} to {to}; every hash chain verified",
            runs.len()
        ),
        true,
    );
    Ok(ExitCode::SUCCESS)
}
