//! Several nodes on one journal: who drives which run, and what happens
//! when a node dies or is paused past its lease.
//!
//! - **A node** is one process's membership, a row in `spool_nodes` with a
//!   number from a sequence (never reused, so it doubles as the fencing
//!   token) and an expiry the node pushes forward every third of the
//!   lease time ([`Cluster::renew`]): renewing all of a node's leases is
//!   one row's update, however many runs it drives.
//! - **A run's lease** is a row in `spool_leases` naming the node that
//!   drives it. A node takes the lease of a run it creates (or of one that
//!   has none, from before the cluster) in the same transaction as the
//!   append.
//! - **Fencing**: a store opened with the node's [`Fence`] checks, in every
//!   append's transaction, that its node is alive (its row there and not
//!   expired) and that it holds each run's lease, locking both rows until
//!   it commits. A node that wakes from a pause past its lease finds its
//!   row gone or expired and its appends refused with
//!   [`JournalError::Lapsed`]; it cannot write until it joins again. An
//!   append to a run another node holds is refused with
//!   [`JournalError::LeaseLost`].
//! - **Takeover** ([`Cluster::take_over`]): a live node deletes the rows of
//!   expired nodes and moves their leases to itself in one transaction,
//!   which waits for any append of theirs still in flight; the runs it
//!   gets back are read from their logs and recovered exactly as after a
//!   restart.
//!
//! Time is the database's (`clock_timestamp()`), so the nodes' clocks need
//! not agree.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use spool_journal::{JournalError, RunId};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::{Target, storage, stored_run_id};

/// The lease time when none is given: a dead node's runs move after
/// this long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The writers ([`Options::writers`](crate::Options::writers)) a cluster
/// node's store has. A lone store keeps two, so one's transaction is under
/// way while the other waits for its commit; in a cluster the nodes'
/// writers already overlap each other at the database, and every writer
/// more splits a node's group commits into smaller ones, each with the
/// database's per-transaction work. Measured with one-turn runs from 64
/// clients (`cargo xtask bench --only http-runs-pg`, 2026-12-01): three
/// nodes of two writers made 5.4 appends per commit against one node's
/// 16, and served 1 196 runs/s against its 1 730 (0.69); three nodes of
/// one writer made 10.6 per commit and served 1 588 against one such
/// node's 1 580 (1.00).
pub const NODE_WRITERS: usize = 1;

/// The node a store fences its appends with: shared with its [`Cluster`],
/// which changes it when the node rejoins after its lease lapsed.
#[derive(Clone, Debug, Default)]
pub struct Fence(Arc<AtomicI64>);

impl Fence {
    /// The node's current number; 0 before it joined.
    #[must_use]
    pub fn node(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }
}

/// How a node joins.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The journal's schema, as in [`crate::Options::schema`].
    pub schema: Option<String>,
    /// The node's name, for operators (the host name, say).
    pub name: String,
    /// Where other nodes and operators reach it (its HTTP address).
    pub address: Option<String>,
    /// How long the node's leases outlive its last renewal.
    pub lease: Duration,
}

/// What [`Cluster::renew`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The node's leases run another lease time from now.
    Renewed,
    /// The node's lease had lapsed (it was paused or cut off) and its row
    /// was gone or expired: it joined again as node `now`. Every run it
    /// drove as node `was` is no longer its own.
    Rejoined {
        /// The old number.
        was: i64,
        /// The new one.
        now: i64,
    },
}

/// One node's membership of a cluster, on connections of its own.
pub struct Cluster {
    /// Renewals, leaving and lookups of a run's holder.
    client: Mutex<Client>,
    /// Takeovers, whose transaction may wait on rows that appends in
    /// flight hold: on a connection apart, so a renewal never waits
    /// behind one, however long it takes.
    takeovers: Mutex<Client>,
    target: Target,
    fence: Fence,
    name: String,
    address: Option<String>,
    lease: Duration,
    /// Set by [`Cluster::leave`]: the node neither renews nor takes over
    /// any more.
    left: std::sync::atomic::AtomicBool,
    /// Whether the lease-less runs were adopted: once, at the first look
    /// (they come only from before the cluster), not a scan every time.
    adopted: std::sync::atomic::AtomicBool,
    /// The cluster's shared secret (see [`Cluster::secret`]).
    secret: String,
}

impl std::fmt::Debug for Cluster {
    // Everything but the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("target", &self.target)
            .field("node", &self.fence.node())
            .field("name", &self.name)
            .field("address", &self.address)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the cluster of the journal at `url` as a new node, creating or
    /// migrating the journal's schema and tables first when needed.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the server cannot be reached;
    /// [`JournalError::NewerSchema`] for a database written by a newer
    /// Spool.
    pub async fn join(url: &str, options: ClusterOptions) -> Result<Self, JournalError> {
        let target = Target::parse(url, options.schema.clone())?;
        let client = target.migrated().await?;
        // Made by the first node to join, from the server's strong random
        // source; every later node reads the same.
        // Two statements: the read, in a snapshot of its own, sees the
        // secret another node joining at once made.
        client
            .batch_execute(
                "INSERT INTO spool_meta (key, value)
                 VALUES ('node_secret', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''))
                 ON CONFLICT (key) DO NOTHING",
            )
            .await
            .map_err(storage)?;
        let secret: String = client
            .query_one(
                "SELECT value FROM spool_meta WHERE key = 'node_secret'",
                &[],
            )
            .await
            .map_err(storage)?
            .get(0);
        let takeovers = target.connect().await?;
        let cluster = Self {
            client: Mutex::new(client),
            takeovers: Mutex::new(takeovers),
            target,
            fence: Fence::default(),
            name: options.name,
            address: options.address,
            lease: options.lease.max(Duration::from_millis(100)),
            left: std::sync::atomic::AtomicBool::new(false),
            adopted: std::sync::atomic::AtomicBool::new(false),
            secret,
        };
        let node = cluster.register(&*cluster.client.lock().await).await?;
        cluster.fence.0.store(node, Ordering::Release);
        Ok(cluster)
    }

    /// The fence to open this node's store with.
    #[must_use]
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// A secret every node of the cluster shares (kept in the journal's
    /// database, made when the first node joined): what one node shows
    /// another when it asks something for itself rather than for a
    /// client, as when a schedule's firing is handed to the node that
    /// drives its address's run. Anyone who can read the database can
    /// read it, as they could the journal.
    #[must_use]
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// This node's current number.
    #[must_use]
    pub fn node(&self) -> i64 {
        self.fence.node()
    }

    /// The lease time.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    fn lease_ms(&self) -> f64 {
        self.lease.as_secs_f64() * 1e3
    }

    async fn register(&self, client: &Client) -> Result<i64, JournalError> {
        let row = client
            .query_one(
                "INSERT INTO spool_nodes (id, name, address, expires_at)
                 VALUES (nextval('spool_node_ids'), $1, $2,
                         clock_timestamp() + $3 * interval '1 millisecond')
                 RETURNING id",
                &[&self.name, &self.address, &self.lease_ms()],
            )
            .await
            .map_err(storage)?;
        let node: i64 = row.get(0);
        tracing::info!(target: "spool::cluster", node, name = %self.name, "joined the cluster");
        Ok(node)
    }

    /// The client, made again when its connection was lost.
    async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Client>, JournalError> {
        self.connected(&self.client).await
    }

    /// The client in `slot`, made again when its connection was lost.
    async fn connected<'a>(
        &self,
        slot: &'a Mutex<Client>,
    ) -> Result<tokio::sync::MutexGuard<'a, Client>, JournalError> {
        let mut client = slot.lock().await;
        if client.is_closed() {
            *client = self.target.connect().await?;
        }
        Ok(client)
    }

    /// Pushes this node's expiry a lease time forward; when it had already
    /// lapsed, joins again under a new number (see [`Renewal::Rejoined`]).
    ///
    /// # Errors
    ///
    /// [`JournalError::Closed`] once the node left;
    /// [`JournalError::Storage`] when the database cannot be reached; the
    /// node's leases then lapse unless a later renewal gets through.
    pub async fn renew(&self) -> Result<Renewal, JournalError> {
        if self.left.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let client = self.client().await?;
        let was = self.node();
        let renewed = client
            .execute(
                "UPDATE spool_nodes SET expires_at = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE id = $1 AND expires_at > clock_timestamp()",
                &[&was, &self.lease_ms()],
            )
            .await
            .map_err(storage)?;
        if renewed == 1 {
            return Ok(Renewal::Renewed);
        }
        let now = self.register(&client).await?;
        self.fence.0.store(now, Ordering::Release);
        tracing::warn!(target: "spool::cluster", was, now, "this node's lease had lapsed; its runs are no longer its own and it joined again");
        Ok(Renewal::Rejoined { was, now })
    }

    /// Takes over the runs of every node whose lease expired, and, at the
    /// node's first look, the unfinished runs that have no lease (from
    /// before the journal had a cluster): they are this node's now.
    /// Recover each from its log.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the database cannot be reached or
    /// the transaction fails; nothing moved then.
    pub async fn take_over(&self) -> Result<Vec<RunId>, JournalError> {
        if self.left.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let client = self.connected(&self.takeovers).await?;
        let me = self.node();
        let adopt = !self.adopted.load(Ordering::Acquire);
        client.batch_execute("BEGIN").await.map_err(storage)?;
        let moved = async {
            // Node rows first, then leases: the order appends lock them
            // in, so the two never deadlock.
            let dead: Vec<i64> = client
                .query(
                    "DELETE FROM spool_nodes WHERE expires_at < clock_timestamp() AND id <> $1 RETURNING id",
                    &[&me],
                )
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let mut runs: Vec<String> = Vec::new();
            if !dead.is_empty() {
                tracing::warn!(target: "spool::cluster", ?dead, "taking over the runs of nodes whose lease expired");
                runs.extend(
                    client
                        .query(
                            "UPDATE spool_leases SET node = $1 WHERE node = ANY($2) RETURNING run_id",
                            &[&me, &dead],
                        )
                        .await?
                        .iter()
                        .map(|row| row.get::<_, String>(0)),
                );
            }
            if !adopt {
                return Ok(runs);
            }
            runs.extend(
                client
                    .query(
                        "INSERT INTO spool_leases (run_id, node)
                         SELECT r.run_id, $1 FROM spool_runs r
                         WHERE r.status NOT IN ('retired', 'pending')
                           AND NOT EXISTS (SELECT 1 FROM spool_leases l WHERE l.run_id = r.run_id)
                         ON CONFLICT (run_id) DO NOTHING
                         RETURNING run_id",
                        &[&me],
                    )
                    .await?
                    .iter()
                    .map(|row| row.get::<_, String>(0)),
            );
            Ok::<_, tokio_postgres::Error>(runs)
        }
        .await;
        let runs = match moved {
            Ok(runs) => runs,
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(storage(error));
            }
        };
        client.batch_execute("COMMIT").await.map_err(storage)?;
        self.adopted.store(true, Ordering::Release);
        runs.iter().map(|run| stored_run_id(run)).collect()
    }

    /// Leaves the cluster: the node's row expires now, so the other nodes
    /// take its runs over at their next look instead of after the lease.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the database cannot be reached; the
    /// lease then runs out by itself.
    pub async fn leave(&self) -> Result<(), JournalError> {
        self.left.store(true, Ordering::Release);
        let client = self.client().await?;
        client
            .execute(
                "UPDATE spool_nodes SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE id = $1",
                &[&self.node()],
            )
            .await
            .map_err(storage)?;
        Ok(())
    }

    /// Whether this node is the one that sweeps retention: the live node
    /// with the lowest number (the longest joined). When it dies, the
    /// next lowest sweeps once its lease lapsed; a node whose own lease
    /// lapsed is not live, so two nodes never both think they are it for
    /// longer than a sweep.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the database cannot be reached.
    pub async fn sweeps(&self) -> Result<bool, JournalError> {
        let client = self.client().await?;
        let lowest: Option<i64> = client
            .query_one(
                "SELECT min(id) FROM spool_nodes WHERE expires_at > clock_timestamp()",
                &[],
            )
            .await
            .map_err(storage)?
            .get(0);
        Ok(lowest == Some(self.node()))
    }

    /// The node that holds `run`'s lease, with its address, while that
    /// node is alive.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the database cannot be reached.
    pub async fn holder(&self, run: &RunId) -> Result<Option<(i64, Option<String>)>, JournalError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT n.id, n.address FROM spool_leases l JOIN spool_nodes n ON n.id = l.node
                 WHERE l.run_id = $1 AND n.expires_at > clock_timestamp()",
                &[&run.as_str()],
            )
            .await
            .map_err(storage)?;
        Ok(row.map(|row| (row.get(0), row.get(1))))
    }
}

/// A node as the cluster's membership table holds it: what an operator
/// asks of a cluster (`spool cluster nodes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its number (a node that rejoined after its lease lapsed has a new
    /// one).
    pub id: i64,
    /// Its name (`--node-name`).
    pub name: String,
    /// Where the other nodes reach it, if it said.
    pub address: Option<String>,
    /// When it joined, in milliseconds since the Unix epoch.
    pub joined_at_ms: i64,
    /// The time left on its lease, in milliseconds; zero or less when it
    /// lapsed that long ago (a lapsed node's runs move to the next node
    /// that looks, which also removes its row).
    pub lease_left_ms: i64,
    /// How many runs it holds the lease of.
    pub runs: i64,
}

impl Member {
    /// Whether its lease still runs: it drives its runs.
    #[must_use]
    pub fn alive(&self) -> bool {
        self.lease_left_ms > 0
    }
}

/// The members of the cluster on the journal at `url` (in `schema`, or
/// the URL's search path), by number, read in one statement without
/// joining: what the database holds now, lapsed nodes not yet taken over
/// included. A journal that never had a cluster has none.
///
/// # Errors
///
/// [`JournalError::Storage`] when the server cannot be reached or holds no
/// journal there; [`JournalError::NewerSchema`] for a database written by
/// a newer Spool.
pub async fn members(url: &str, schema: Option<String>) -> Result<Vec<Member>, JournalError> {
    let client = Target::parse(url, schema)?.connect().await?;
    crate::schema::check(&client).await?;
    let clustered: bool = client
        .query_one("SELECT to_regclass('spool_nodes') IS NOT NULL", &[])
        .await
        .map_err(storage)?
        .get(0);
    if !clustered {
        // A journal from before clusters, read by this build as it is.
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT n.id, n.name, n.address,
                    (extract(epoch FROM n.joined_at) * 1000)::bigint,
                    (extract(epoch FROM n.expires_at - clock_timestamp()) * 1000)::bigint,
                    (SELECT count(*) FROM spool_leases l WHERE l.node = n.id)
             FROM spool_nodes n ORDER BY n.id",
            &[],
        )
        .await
        .map_err(storage)?;
    Ok(rows
        .iter()
        .map(|row| Member {
            id: row.get(0),
            name: row.get(1),
            address: row.get(2),
            joined_at_ms: row.get(3),
            lease_left_ms: row.get(4),
            runs: row.get(5),
        })
        .collect())
}
