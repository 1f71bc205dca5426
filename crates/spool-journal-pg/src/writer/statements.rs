//! The statements a batch runs, prepared once per connection, and the
//! columns of the rows and heads it writes, as arrays.

use super::*;

/// The statements a batch runs, prepared once per connection.
pub(super) struct Statements {
    pub(super) lock: Statement,
    pub(super) heads: Statement,
    pub(super) bind: Statement,
    pub(super) operation: Statement,
    pub(super) unbind: Statement,
    pub(super) unbind_all: Statement,
    pub(super) unbind_namespace: Statement,
    pub(super) settle: Statement,
    pub(super) release: Statement,
    pub(super) claim_get: Statement,
    pub(super) claim_take: Statement,
    pub(super) events: Statement,
    pub(super) heads_put: Statement,
    pub(super) probe: Statement,
    pub(super) fence_node: Statement,
    pub(super) fence_leases: Statement,
    pub(super) lease_take: Statement,
    /// A batch of plain appends from known heads, in one statement
    /// (rows, heads, notification), unfenced and fenced.
    pub(super) known: Statement,
    pub(super) known_fenced: Statement,
}

impl Statements {
    pub(super) async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            // `WITH ORDINALITY … ORDER BY`: the locks are taken in the
            // array's (sorted) order.
            lock: client
                .prepare(&format!(
                    "SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext(r))
                     FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i) ORDER BY i"
                ))
                .await?,
            heads: client
                .prepare(
                    "SELECT run_id, next_seq, last_hash, status, title, created_ns, updated_ns
                     FROM spool_runs WHERE run_id = ANY($1::text[])",
                )
                .await?,
            // The upsert waits for a concurrent binder to commit and
            // returns whoever holds the name: this run, or the one to
            // refuse for.
            bind: client
                .prepare(
                    "INSERT INTO spool_addresses (namespace, name, run_id) VALUES ($1, $2, $3)
                     ON CONFLICT (namespace, name) DO UPDATE SET run_id = spool_addresses.run_id
                     RETURNING run_id",
                )
                .await?,
            operation: client
                .prepare(
                    "INSERT INTO spool_operations (scope, operation_id, run_id) VALUES ($1, $2, $3)
                     ON CONFLICT (scope, operation_id) DO UPDATE SET run_id = spool_operations.run_id
                     RETURNING run_id",
                )
                .await?,
            unbind: client
                .prepare(
                    "DELETE FROM spool_addresses WHERE namespace = $1 AND name = $2 AND run_id = $3",
                )
                .await?,
            unbind_all: client
                .prepare("DELETE FROM spool_addresses WHERE run_id = $1")
                .await?,
            unbind_namespace: client
                .prepare("DELETE FROM spool_addresses WHERE run_id = $1 AND namespace = $2")
                .await?,
            settle: client
                .prepare(
                    "UPDATE spool_claims SET output = $1, settled_seq = $2
                     WHERE run_id = $3 AND call_id = $4 AND settled_seq IS NULL",
                )
                .await?,
            release: client
                .prepare(
                    "DELETE FROM spool_claims WHERE run_id = $1 AND call_id = $2 AND settled_seq IS NULL",
                )
                .await?,
            claim_get: client
                .prepare(
                    "SELECT run_id, call_id, output, settled_seq FROM spool_claims
                     WHERE tool = $1 AND key = $2 FOR UPDATE",
                )
                .await?,
            claim_take: client
                .prepare(
                    "INSERT INTO spool_claims (tool, key, run_id, call_id) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tool, key) DO NOTHING",
                )
                .await?,
            events: client
                .prepare(
                    "INSERT INTO spool_events (run_id, seq, body, hash)
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bytea[])",
                )
                .await?,
            heads_put: client
                .prepare(&format!(
                    "WITH heads AS (
                         INSERT INTO spool_runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns, written_by)
                         SELECT *, $9 FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])
                         ON CONFLICT (run_id) DO UPDATE SET next_seq = excluded.next_seq,
                             last_hash = excluded.last_hash, status = excluded.status,
                             title = excluded.title, updated_ns = excluded.updated_ns,
                             written_by = excluded.written_by
                         RETURNING run_id, next_seq, watched_until),
                     {}
                     SELECT count(*) FROM told",
                    told_sql(8)
                ))
                .await?,
            probe: client
                .prepare(
                    "INSERT INTO spool_meta (key, value) VALUES ('probed_at', $1)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )
                .await?,
            // Both locked until the batch commits: a takeover that would
            // move them waits for it, and then sees its events.
            fence_node: client
                .prepare(
                    "SELECT expires_at > clock_timestamp() FROM spool_nodes WHERE id = $1 FOR SHARE",
                )
                .await?,
            fence_leases: client
                .prepare(
                    "SELECT l.run_id, l.node, n.address FROM spool_leases l
                     LEFT JOIN spool_nodes n ON n.id = l.node
                     WHERE l.run_id = ANY($1::text[]) FOR SHARE OF l",
                )
                .await?,
            lease_take: client
                .prepare(
                    "INSERT INTO spool_leases (run_id, node) SELECT unnest($1::text[]), $2
                     ON CONFLICT (run_id) DO NOTHING",
                )
                .await?,
            // A run the batch creates must not be a deleted one: one probe
            // of the tombstones per created run; a deleted id sends the
            // batch the usual way, which refuses it.
            known: client
                .prepare(&known_sql(
                    "NOT EXISTS (SELECT 1 FROM spool_tombstones WHERE run_id = ANY($14::text[]))",
                    "",
                ))
                .await?,
            // The node alive and holding the lease of every run but those
            // the batch creates ($15), decided once for the statement, with
            // the rows locked as the usual fencing reads lock them (a
            // takeover waits for this commit); the runs created take their
            // leases. The leases are found by run alone: a condition on the
            // node could let the planner walk every lease the node holds.
            known_fenced: client
                .prepare(&known_sql(
                    "EXISTS (SELECT 1 FROM spool_nodes
                             WHERE id = $14 AND expires_at > clock_timestamp() FOR SHARE)
                     AND (SELECT count(*) FILTER (WHERE l.node = $14) FROM
                             (SELECT node FROM spool_leases
                              WHERE run_id = ANY($5::text[]) FOR SHARE) AS l)
                         = cardinality($5::text[]) - cardinality($15::text[])
                     AND NOT EXISTS (SELECT 1 FROM spool_tombstones WHERE run_id = ANY($15::text[]))",
                    "taken AS (
                         INSERT INTO spool_leases (run_id, node)
                         SELECT r, $14 FROM unnest($15::text[]) AS r, fence WHERE fence.ok
                         ON CONFLICT (run_id) DO NOTHING
                         RETURNING 1),",
                ))
                .await?,
        })
    }
}

/// The statement that writes a batch planned from known heads: the rows,
/// the heads and the notification of watched runs (and `more`, further common table
/// expressions, each ending in a comma), each only when `fence` holds
/// (decided once), and how many rows and heads it wrote. A row already at
/// its position (the head known was stale, or a run it creates exists)
/// fails it with a unique violation.
pub(super) fn known_sql(fence: &str, more: &str) -> String {
    format!(
        "WITH fence AS (SELECT {fence} AS ok),
         {more}
         written AS (
             INSERT INTO spool_events (run_id, seq, body, hash)
             SELECT e.run_id, e.seq, e.body, e.hash
             FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bytea[])
                  AS e(run_id, seq, body, hash), fence
             WHERE fence.ok
             RETURNING 1),
         heads AS (
             INSERT INTO spool_runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns, written_by)
             SELECT h.run_id, h.next_seq, h.last_hash, h.status, h.title, h.created_ns, h.updated_ns, $13
             FROM unnest($5::text[], $6::bigint[], $7::bytea[], $8::text[], $9::text[], $10::bigint[], $11::bigint[])
                  AS h(run_id, next_seq, last_hash, status, title, created_ns, updated_ns), fence
             WHERE fence.ok
             ON CONFLICT (run_id) DO UPDATE SET next_seq = excluded.next_seq,
                 last_hash = excluded.last_hash, status = excluded.status,
                 title = excluded.title, updated_ns = excluded.updated_ns,
                 written_by = excluded.written_by
             RETURNING run_id, next_seq, watched_until),
         {told}
         SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM heads), (SELECT count(*) FROM told)",
        told = told_sql(12)
    )
}

/// The common table expression `told`, reading the upsert `heads`
/// (`run_id, next_seq, watched_until`): a notification on the channel in
/// parameter `channel` for the runs some process watches, a line per run
/// (its next position and id, as [`crate::listen`] parses them), 40 lines at
/// most per notification (a line is at most 150 bytes; the server takes
/// 8 000). A commit to runs nobody watches sends none, and so never waits
/// for the database-wide lock under which notifying transactions commit
/// one at a time. `watched_until` comes back from the row as the upsert
/// locked it, so a watch registered meanwhile is seen: see
/// [`crate::listen`] for why no commit goes unannounced.
pub(super) fn told_sql(channel: u32) -> String {
    format!(
        "told AS (
             SELECT pg_notify(${channel}, string_agg(w.next_seq || ' ' || w.run_id, E'\\n'))
             FROM (SELECT run_id, next_seq, (row_number() OVER () - 1) / 40 AS part
                   FROM heads WHERE watched_until > clock_timestamp()) AS w
             GROUP BY w.part)"
    )
}

/// The columns of the rows and heads a batch writes, as arrays.
#[derive(Default)]
pub(super) struct Columns {
    pub(super) run_ids: Vec<String>,
    pub(super) seqs: Vec<i64>,
    pub(super) bodies: Vec<Vec<u8>>,
    pub(super) hashes: Vec<Vec<u8>>,
}

impl Columns {
    /// An append's rows, after those already in.
    pub(super) fn push(&mut self, run: &RunId, rows: Vec<spool_journal::store::Row>) {
        for row in rows {
            self.run_ids.push(run.as_str().to_owned());
            self.seqs.push(seq_sql(row.seq).unwrap_or(i64::MAX));
            self.bodies.push(row.bytes);
            self.hashes.push(row.hash.to_vec());
        }
    }
}

/// What a writer's upsert of heads records and announces with: the store
/// that wrote them, and the channel on which a commit announces the runs
/// another store watches.
pub(crate) struct Announce {
    pub(super) channel: String,
    pub(super) store: i64,
}

/// What a writer is started with.
pub(crate) struct Setup {
    pub(crate) counters: Arc<Counters>,
    pub(crate) target: Target,
    pub(crate) fence: Option<Fence>,
    /// The notification channel.
    pub(crate) channel: String,
    /// The store's number, recorded with each head its writers write.
    pub(crate) store: i64,
    pub(crate) watchers: Arc<Watchers>,
    pub(crate) clock: Clock,
    pub(crate) max_batch: usize,
    pub(crate) queue: usize,
}
