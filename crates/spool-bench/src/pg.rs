//! `journal-append-pg`: the PostgreSQL store's appends beside what plain
//! PostgreSQL does with the same rows on the same server, in the same run:
//! one transaction per event, batched inserts of the store's own group
//! size, and (the floor of any journal of this layout) those batches with
//! a journal's statements and none of its code. `http-runs-pg`: one-turn runs over HTTP on three cluster
//! nodes against one node, on the same database. Both need a server in
//! `JOURNAL_PG_URL` (`cargo xtask bench` starts one, with fsync on);
//! without one the rows are skipped, said.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use spool_journal_pg::{Options, PgJournal};

use crate::Scale;
use crate::journal::{runtime, timed_appends, typical_bytes};
use crate::report::Row;

/// The bench server's URL, or `None` after saying that `bench` is skipped.
pub(crate) fn server(bench: &str) -> anyhow::Result<Option<String>> {
    match std::env::var("JOURNAL_PG_URL") {
        Ok(url) => Ok(Some(url)),
        Err(_) => {
            crate::http::say(&format!(
                "{bench}: skipped, JOURNAL_PG_URL is not set (cargo xtask bench starts a server)"
            ))?;
            Ok(None)
        }
    }
}

/// Creates the empty database `name` on the server at `server`; its URL.
/// For a whole `spool serve`, which opens its journal in the database's
/// default schema: a database of its own is what keeps a trial's journal
/// apart from every other.
pub(crate) async fn create_database(server: &str, name: &str) -> anyhow::Result<String> {
    on_server(server, &format!("CREATE DATABASE {name}")).await?;
    // The server's URL names its database last, before any parameters.
    let (base, params) = match server.split_once('?') {
        Some((base, params)) => (base, format!("?{params}")),
        None => (server, String::new()),
    };
    let (host, _) = base
        .rsplit_once('/')
        .filter(|(host, _)| host.contains("://"))
        .with_context(|| format!("JOURNAL_PG_URL `{server}` names no database to replace"))?;
    Ok(format!("{host}/{name}{params}"))
}

/// Drops the database `create_database` made, with any session still on
/// it.
pub(crate) async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    on_server(server, &format!("DROP DATABASE {name} WITH (FORCE)")).await
}

/// Runs `sql` (a statement that cannot run in a transaction) on a
/// connection of its own, closed after it.
async fn on_server(server: &str, sql: &str) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(server, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    client.batch_execute(sql).await?;
    drop(client);
    connection.await??;
    Ok(())
}

pub(crate) fn append(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(url) = server("journal-append-pg")? else {
        return Ok(Vec::new());
    };
    let duration = scale.pick(Duration::from_secs(4), Duration::from_millis(300));
    let runtime = runtime()?;
    runtime.block_on(async {
        let bytes = typical_bytes()?;
        let mut rows = Vec::new();
        let mut per_event = None;
        for runs in [1, 8, 64] {
            let (spool, group) = spool_appends(&url, runs, duration).await?;
            let per_event = match per_event {
                Some(n) => n,
                None => *per_event
                    .insert(plain(&url, duration, 1, bytes, 1, Statements::Rows).await?),
            };
            let batch = group.round().max(1.0) as usize;
            let writers = Options::default().writers;
            let batched = plain(&url, duration, batch, bytes, writers, Statements::Rows).await?;
            let journal_sql =
                plain(&url, duration, batch, bytes, writers, Statements::Journal).await?;
            let (one_pass, copied) = if runs == 64 {
                (
                    Some(
                        plain(&url, duration, batch, bytes, writers, Statements::JournalOnePass)
                            .await?,
                    ),
                    Some(plain(&url, duration, batch, bytes, writers, Statements::Copy).await?),
                )
            } else {
                (None, None)
            };
            let name = format!("journal-append-pg/{runs} runs");
            let vs_batched = Row::new(
                &name,
                spool,
                "events/s",
                format!("plain batched INSERT, batch {group:.1} x {writers} connections"),
                batched,
            );
            rows.push(if runs == 64 {
                vs_batched.ratio_at_least(0.8)
            } else {
                vs_batched
            });
            rows.push(Row::new(
                &name,
                spool,
                "events/s",
                format!(
                    "a journal's SQL, no code, 2 round trips (locks, heads read; rows, heads upserted), batch {group:.1} x {writers}"
                ),
                journal_sql,
            ));
            if let Some(copied) = copied {
                rows.push(Row::new(
                    &name,
                    spool,
                    "events/s",
                    format!(
                        "plain binary COPY, a transaction per COPY, batch {group:.1} x {writers} connections"
                    ),
                    copied,
                ));
            }
            if let Some(one_pass) = one_pass {
                rows.push(Row::new(
                    &name,
                    spool,
                    "events/s",
                    format!(
                        "a journal's SQL, no code, 1 round trip (rows, heads upserted; no locks), batch {group:.1} x {writers}"
                    ),
                    one_pass,
                ));
            }
            rows.push(Row::new(
                &name,
                spool,
                "events/s",
                "plain INSERT; COMMIT per event",
                per_event,
            ));
        }
        anyhow::Ok(rows)
    })
}

/// A name no other table or schema of this process uses (the bench's
/// server is thrown away after it).
fn schema() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn spool_appends(url: &str, runs: usize, duration: Duration) -> anyhow::Result<(f64, f64)> {
    let options = Options {
        schema: Some(format!("{}_{runs}", schema())),
        ..Options::default()
    };
    let journal = Arc::new(PgJournal::connect(url, options).await?);
    timed_appends(journal, PgJournal::stats, runs, duration).await
}

/// What a baseline transaction does besides inserting its rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Statements {
    /// Nothing: the rows alone.
    Rows,
    /// What a commit of a journal shared by writers does when it does not
    /// know its runs' heads, as Spool's store then does it: lock the runs
    /// and read their heads (one round trip, as the rows are planned from
    /// them), then insert the rows and upsert the heads (a second round
    /// trip, with `COMMIT`). The same SQL without Spool's code. Nobody
    /// watches the runs, so, as in Spool's store, no commit notifies.
    Journal,
    /// The least any journal keeping its run heads in a table must do:
    /// the rows and the heads upserted, in one round trip (no locks, no
    /// heads read: as if
    /// the writer knew every head and no other writer existed). Spool's
    /// store does this, plus the runs' locks and its fence, for appends
    /// continuing the heads it wrote last.
    JournalOnePass,
    /// The rows alone, as [`Statements::Rows`], sent by `COPY … FROM STDIN
    /// (FORMAT binary)`, each `COPY` its own transaction: whether the
    /// binary path's cheaper rows pay for the round trip more it takes
    /// (the server answers `COPY` before it takes its rows).
    Copy,
}

/// Plain PostgreSQL inserting rows of `bytes` bytes for 64 runs, `batch`
/// rows per transaction (its `BEGIN`, one `INSERT … SELECT FROM unnest`
/// and `COMMIT` pipelined in one round trip), from `connections`
/// connections at once, each on its own share of the runs: the same rows
/// with the same grouping and parallelism as the store's writers, with
/// none of a journal's work (or, with [`Statements::Journal`], with its
/// statements and none of its code). `batch == 1` is one autocommitted
/// insert per row.
async fn plain(
    url: &str,
    duration: Duration,
    batch: usize,
    bytes: usize,
    connections: usize,
    statements: Statements,
) -> anyhow::Result<f64> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let table = format!("{}_plain_{batch}", schema());
    // The store's two tables as its schema lays them out (`schema.rs`):
    // heads found by run alone, with room in their pages, so an upsert
    // moving one is heap-only there as here.
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (run_id TEXT COLLATE \"C\" NOT NULL, seq BIGINT NOT NULL,
                                   body BYTEA NOT NULL, hash BYTEA NOT NULL, PRIMARY KEY (run_id, seq));
             CREATE TABLE {table}_heads (run_id TEXT COLLATE \"C\" PRIMARY KEY, next_seq BIGINT NOT NULL,
                                   last_hash BYTEA NOT NULL, status TEXT NOT NULL, title TEXT,
                                   created_ns BIGINT NOT NULL, updated_ns BIGINT NOT NULL)
                                   WITH (fillfactor = 70);"
        ))
        .await?;
    let connections = connections.max(1);
    let start = Instant::now();
    let inserting = (0..connections).map(|lane| {
        let (url, table) = (url.to_owned(), table.clone());
        async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let insert = client
                .prepare(&format!(
                    "INSERT INTO {table} (run_id, seq, body, hash)
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bytea[])"
                ))
                .await?;
            // The store's own statements (writer.rs), on this table.
            let lock = client
                .prepare(
                    "SELECT pg_advisory_xact_lock(7, hashtext(r))
                     FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i) ORDER BY i",
                )
                .await?;
            let heads = client
                .prepare(&format!(
                    "SELECT run_id, next_seq, last_hash, status, title, created_ns, updated_ns
                     FROM {table}_heads WHERE run_id = ANY($1::text[])"
                ))
                .await?;
            let copy = client
                .prepare(&format!(
                    "COPY {table} (run_id, seq, body, hash) FROM STDIN (FORMAT binary)"
                ))
                .await?;
            let heads_put = client
                .prepare(&format!(
                    "INSERT INTO {table}_heads (run_id, next_seq, last_hash, status, title, created_ns, updated_ns)
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])
                     ON CONFLICT (run_id) DO UPDATE SET next_seq = excluded.next_seq,
                         last_hash = excluded.last_hash, status = excluded.status,
                         title = excluded.title, updated_ns = excluded.updated_ns"
                ))
                .await?;
            let body = vec![b'x'; bytes];
            let hash = vec![7_u8; 32];
            let runs: Vec<String> = (0..64)
                .filter(|i| i % connections == lane)
                .map(|i| format!("run-{i}"))
                .collect();
            let mut seqs = vec![0_i64; runs.len()];
            let mut n = 0_usize;
            while start.elapsed() < duration {
                let (mut ids, mut at, mut bodies, mut hashes) = (
                    Vec::with_capacity(batch),
                    Vec::with_capacity(batch),
                    Vec::with_capacity(batch),
                    Vec::with_capacity(batch),
                );
                let mut touched = Vec::new();
                for _ in 0..batch {
                    let run = n % runs.len();
                    seqs[run] += 1;
                    ids.push(runs[run].as_str());
                    at.push(seqs[run]);
                    bodies.push(body.as_slice());
                    hashes.push(hash.as_slice());
                    touched.push(run);
                    n += 1;
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&ids, &at, &bodies, &hashes];
                if statements == Statements::Copy {
                    use tokio_postgres::binary_copy::BinaryCopyInWriter;
                    use tokio_postgres::types::Type;
                    let sink = client.copy_in(&copy).await?;
                    let writer = BinaryCopyInWriter::new(
                        sink,
                        &[Type::TEXT, Type::INT8, Type::BYTEA, Type::BYTEA],
                    );
                    let mut writer = std::pin::pin!(writer);
                    for i in 0..batch {
                        writer
                            .as_mut()
                            .write(&[&ids[i], &at[i], &bodies[i], &hashes[i]])
                            .await?;
                    }
                    writer.finish().await?;
                } else if batch == 1 && statements == Statements::Rows {
                    // Autocommit: the statement is its own transaction.
                    client.execute(&insert, &params).await?;
                } else if statements == Statements::Rows {
                    tokio::try_join!(
                        client.batch_execute("BEGIN"),
                        client.execute(&insert, &params),
                        client.batch_execute("COMMIT"),
                    )?;
                } else {
                    touched.sort_unstable();
                    touched.dedup();
                    let locked: Vec<&str> = touched.iter().map(|&r| runs[r].as_str()).collect();
                    let locked_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&locked];
                    if statements == Statements::Journal {
                        tokio::try_join!(
                            client.batch_execute("BEGIN"),
                            client.execute(&lock, &locked_param),
                            client.query(&heads, &locked_param),
                        )?;
                    }
                    let next: Vec<i64> = touched.iter().map(|&r| seqs[r] + 1).collect();
                    let last: Vec<&[u8]> = touched.iter().map(|_| hash.as_slice()).collect();
                    let status: Vec<&str> = touched.iter().map(|_| "running").collect();
                    let title: Vec<Option<&str>> = touched.iter().map(|_| None).collect();
                    // Each commit's own time, as a store's heads carry.
                    let times: Vec<i64> = touched.iter().map(|_| n as i64).collect();
                    let put: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                        [&locked, &next, &last, &status, &title, &times, &times];
                    let begin = async {
                        if statements == Statements::JournalOnePass {
                            client.batch_execute("BEGIN").await?;
                        }
                        Ok::<_, tokio_postgres::Error>(())
                    };
                    tokio::try_join!(
                        begin,
                        client.execute(&insert, &params),
                        client.execute(&heads_put, &put),
                        client.batch_execute("COMMIT"),
                    )?;
                }
            }
            anyhow::Ok(n)
        }
    });
    let mut n = 0;
    for inserted in futures_util::future::join_all(inserting).await {
        n += inserted?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// One-turn runs per second over HTTP from 64 clients, spread evenly over
/// three cluster nodes in this process, against the same clients on one
/// node: what leases, fencing and three writers cost. The nodes share the
/// machine's cores with the database and the clients, so this measures
/// coordination, not scaling out. Beside it, with no target, what tells
/// the two apart: journal operations per commit, and the CPU each run costs the
/// database and this process (the nodes and their clients).
pub(crate) fn cluster_runs(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(url) = server("http-runs-pg")? else {
        return Ok(Vec::new());
    };
    let duration = scale.pick(Duration::from_secs(5), Duration::from_millis(300));
    let tokio = crate::http::tokio()?;
    let clients = 64;
    let (one, three) = tokio.block_on(async {
        let one = nodes_serving(&url, 1, clients, duration).await?;
        let three = nodes_serving(&url, 3, clients, duration).await?;
        anyhow::Ok((one, three))
    })?;
    let name = format!("http-runs-pg/{clients} clients on 3 nodes");
    Ok(vec![
        Row::new(&name, three.rate, "runs/s", "the same on 1 node", one.rate).ratio_at_least(0.8),
        Row::new(
            format!("{name}, journal operations per commit"),
            three.operations_per_commit(),
            "operations",
            "the same on 1 node",
            one.operations_per_commit(),
        ),
        Row::new(
            format!("{name}, database CPU per run"),
            three.database_us_per_run(),
            "us",
            "the same on 1 node",
            one.database_us_per_run(),
        )
        .lower_is_better(),
        Row::new(
            format!("{name}, nodes' and clients' CPU per run"),
            three.own_us_per_run(),
            "us",
            "the same on 1 node",
            one.own_us_per_run(),
        )
        .lower_is_better(),
        // Both sides keep the two cores busy, so runs/s follows this
        // ratio: what the first row can reach here.
        Row::new(
            format!("{name}, all CPU per run"),
            three.database_us_per_run() + three.own_us_per_run(),
            "us",
            "the same on 1 node",
            one.database_us_per_run() + one.own_us_per_run(),
        )
        .lower_is_better(),
    ])
}

/// What one side of `http-runs-pg` served, and what it cost.
struct Served {
    rate: f64,
    runs: f64,
    commits: u64,
    /// The journal operations (appends, mostly) those commits carried.
    operations: u64,
    /// CPU of the database's processes over the load, in milliseconds.
    database_ms: f64,
    /// CPU of this process (the nodes and the clients), in milliseconds.
    own_ms: f64,
}

impl Served {
    fn operations_per_commit(&self) -> f64 {
        self.operations as f64 / self.commits.max(1) as f64
    }

    fn database_us_per_run(&self) -> f64 {
        self.database_ms * 1e3 / self.runs.max(1.0)
    }

    fn own_us_per_run(&self) -> f64 {
        self.own_ms * 1e3 / self.runs.max(1.0)
    }
}

/// The CPU time, in milliseconds, of each process the database server's
/// postmaster started (its backends, WAL writer, checkpointer), by pid.
/// The postmaster is found as the parent of a backend of this `url`.
async fn database_cpu(url: &str) -> anyhow::Result<std::collections::HashMap<u32, f64>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let parent = |pid: &str| crate::oneshot::stat_field(pid, 4).ok();
    // Read while the backend lives: it ends with its connection.
    let postmaster = parent(&backend.to_string())
        .with_context(|| format!("the database's backend {backend} is not on this machine"))?;
    drop(client);
    connection.await??;
    let mut cpu = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc")? {
        let name = entry?.file_name();
        let Some(pid) = name.to_str() else { continue };
        if parent(pid).as_deref() == Some(postmaster.as_str()) {
            // A backend may end between the two reads.
            if let Ok(ms) = crate::oneshot::cpu_ms(pid, 14) {
                cpu.insert(pid.parse()?, ms);
            }
        }
    }
    Ok(cpu)
}

/// Runs/s of `clients` clients over `nodes` cluster nodes on a fresh
/// schema, each node with its own store, lease loop and HTTP server.
async fn nodes_serving(
    url: &str,
    nodes: usize,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Served> {
    let schema = schema();
    let mut urls = Vec::new();
    let mut stops = Vec::new();
    let mut journals = Vec::new();
    for n in 0..nodes {
        let cluster = Arc::new(
            spool_journal_pg::Cluster::join(
                url,
                spool_journal_pg::ClusterOptions {
                    schema: Some(schema.clone()),
                    name: format!("bench-{n}"),
                    address: None,
                    lease: spool_journal_pg::cluster::DEFAULT_LEASE,
                },
            )
            .await?,
        );
        // As `spool serve --cluster` opens it.
        let options = Options {
            schema: Some(schema.clone()),
            fence: Some(cluster.fence()),
            writers: spool_journal_pg::cluster::NODE_WRITERS,
            ..Options::default()
        };
        let journal = Arc::new(PgJournal::connect(url, options).await?);
        journals.push(Arc::clone(&journal));
        let runtime = spool_runtime::Runtime::builder(journal)
            .engine(Arc::new(
                spool_runtime::engines::ScriptedEngine::from_jsonl(crate::http::ONE_TURN)?,
            ))
            .shared_journal(true)
            .build();
        // The node renews its membership as `spool serve` does.
        let renewing = Arc::clone(&cluster);
        let renew = tokio::spawn(async move {
            let mut tick = tokio::time::interval(renewing.lease() / 3);
            loop {
                tick.tick().await;
                let _ = renewing.renew().await;
            }
        });
        let (stop_runtime, closing) = tokio::sync::watch::channel(false);
        let channel = spool_http::HttpChannel::new(runtime, closing);
        let (node_url, stop) = crate::http::start(channel.handler()).await?;
        urls.push(node_url);
        stops.push((stop_runtime, stop, renew, cluster));
    }
    let per_node = clients / nodes;
    let loads = urls.iter().enumerate().map(|(n, node_url)| {
        // The first nodes take the clients left over.
        let mine = per_node + usize::from(n < clients % nodes);
        crate::http::load(
            node_url,
            "/runs",
            serde_json::json!({"text": "go"}),
            mine,
            duration,
        )
    });
    let database_before = database_cpu(url).await?;
    let own_before = crate::http::own_cpu_ms()?;
    let (commits_before, operations_before) = journals_stats(&journals);
    let mut rate = 0.0;
    let mut runs = 0;
    for outcome in futures_util::future::join_all(loads).await {
        let (node_rate, latencies) = outcome?;
        rate += node_rate;
        runs += latencies.len();
    }
    let own_ms = crate::http::own_cpu_ms()? - own_before;
    let (commits, operations) = journals_stats(&journals);
    // A backend that began during the load counts from nothing; one that
    // ended is lost, and the nodes keep theirs open until they stop.
    let database_ms = database_cpu(url)
        .await?
        .iter()
        .map(|(pid, ms)| ms - database_before.get(pid).copied().unwrap_or(0.0))
        .sum();
    for (stop_runtime, stop, renew, cluster) in stops {
        stop_runtime.send_replace(true);
        stop.send_replace(true);
        renew.abort();
        cluster.leave().await?;
    }
    Ok(Served {
        rate,
        runs: runs as f64,
        commits: commits - commits_before,
        operations: operations - operations_before,
        database_ms,
        own_ms,
    })
}

/// Commits and the operations they carried, over all the nodes' stores
/// so far.
fn journals_stats(journals: &[Arc<PgJournal>]) -> (u64, u64) {
    journals
        .iter()
        .fold((0, 0), |(commits, operations), journal| {
            let stats = journal.stats();
            (commits + stats.commits, operations + stats.operations)
        })
}
