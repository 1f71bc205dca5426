//! `journal-append-pg`: the PostgreSQL store's appends beside what plain
//! PostgreSQL does with the same rows on the same server, in the same run:
//! one transaction per event, and batched inserts of the store's own
//! group size. `http-runs-pg`: one-turn runs over HTTP on three cluster
//! nodes against one node, on the same database. Both need a server in
//! `JOURNAL_PG_URL` (`cargo xtask bench` starts one, with fsync on);
//! without one the rows are skipped, said.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spool_journal_pg::{Options, PgJournal};

use crate::Scale;
use crate::journal::{runtime, timed_appends, typical_bytes};
use crate::report::Row;

/// The bench server's URL, or `None` after saying that `bench` is skipped.
fn server(bench: &str) -> anyhow::Result<Option<String>> {
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
                None => *per_event.insert(plain(&url, duration, 1, bytes, 1).await?),
            };
            let batch = group.round().max(1.0) as usize;
            let writers = Options::default().writers;
            let batched = plain(&url, duration, batch, bytes, writers).await?;
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

/// Plain PostgreSQL inserting rows of `bytes` bytes for 64 runs, `batch`
/// rows per transaction (its `BEGIN`, one `INSERT … SELECT FROM unnest`
/// and `COMMIT` pipelined in one round trip), from `connections`
/// connections at once, each on its own share of the runs: the same rows
/// with the same grouping and parallelism as the store's writers, with
/// none of a journal's work. `batch == 1` is one autocommitted insert per
/// row.
async fn plain(
    url: &str,
    duration: Duration,
    batch: usize,
    bytes: usize,
    connections: usize,
) -> anyhow::Result<f64> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let table = format!("{}_plain_{batch}", schema());
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (run_id TEXT COLLATE \"C\" NOT NULL, seq BIGINT NOT NULL,
                                   body BYTEA NOT NULL, hash BYTEA NOT NULL, PRIMARY KEY (run_id, seq))"
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
                for _ in 0..batch {
                    let run = n % runs.len();
                    seqs[run] += 1;
                    ids.push(runs[run].as_str());
                    at.push(seqs[run]);
                    bodies.push(body.as_slice());
                    hashes.push(hash.as_slice());
                    n += 1;
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&ids, &at, &bodies, &hashes];
                if batch == 1 {
                    // Autocommit: the statement is its own transaction.
                    client.execute(&insert, &params).await?;
                } else {
                    tokio::try_join!(
                        client.batch_execute("BEGIN"),
                        client.execute(&insert, &params),
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
/// coordination, not scaling out.
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
    Ok(vec![
        Row::new(
            format!("http-runs-pg/{clients} clients on 3 nodes"),
            three,
            "runs/s",
            "the same on 1 node",
            one,
        )
        .ratio_at_least(0.8),
    ])
}

/// Runs/s of `clients` clients over `nodes` cluster nodes on a fresh
/// schema, each node with its own store, lease loop and HTTP server.
async fn nodes_serving(
    url: &str,
    nodes: usize,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let schema = schema();
    let mut urls = Vec::new();
    let mut stops = Vec::new();
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
    let mut rate = 0.0;
    for outcome in futures_util::future::join_all(loads).await {
        rate += outcome?.0;
    }
    for (stop_runtime, stop, renew, cluster) in stops {
        stop_runtime.send_replace(true);
        stop.send_replace(true);
        renew.abort();
        cluster.leave().await?;
    }
    Ok(rate)
}
