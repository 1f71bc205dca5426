//! The store's tables, created and migrated on open from numbered steps.
//!
//! Every table is prefixed `spool_` so a journal can live in a schema that
//! holds other things. `spool_meta` records two versions: `store_version`,
//! how far this file's steps have run (the layout), and `schema_version`,
//! the event vocabulary's version (the same number SQLite records). A
//! database newer than this build in either is refused, never altered.

use spool_journal::JournalError;
use spool_journal::event::SCHEMA_VERSION;
use tokio_postgres::Client;

use crate::storage;

/// The layout steps, in order: step `n` takes the store from version `n`
/// to `n + 1`. A new step is appended; a released one never changes.
/// Step 2 adds the cluster's nodes and run leases; step 3 which store
/// wrote a run's head last and until when another watches it
/// (`crate::listen`: a commit notifies only for runs watched elsewhere);
/// step 4 drops the index of run heads by update time and leaves room
/// in their pages, so a commit's head updates are heap-only (no index
/// entry written, the old version pruned in place); the listing, the
/// index's one reader, reads every head and sorts them itself; step 5
/// keeps the tombstones of deleted runs, finds a run's operation ids
/// without a scan, for deletion, and keeps agent definitions by digest.
const STEPS: &[&str] = &[
    "
CREATE TABLE spool_events (
    run_id TEXT COLLATE \"C\" NOT NULL,
    seq BIGINT NOT NULL,
    body BYTEA NOT NULL,
    hash BYTEA NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE spool_runs (
    run_id TEXT COLLATE \"C\" PRIMARY KEY,
    next_seq BIGINT NOT NULL,
    last_hash BYTEA NOT NULL,
    status TEXT NOT NULL,
    title TEXT,
    created_ns BIGINT NOT NULL,
    updated_ns BIGINT NOT NULL
);
CREATE INDEX spool_runs_updated ON spool_runs (updated_ns);
CREATE TABLE spool_addresses (
    namespace TEXT COLLATE \"C\" NOT NULL,
    name TEXT COLLATE \"C\" NOT NULL,
    run_id TEXT COLLATE \"C\" NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX spool_addresses_run ON spool_addresses (run_id);
CREATE TABLE spool_operations (
    scope TEXT COLLATE \"C\" NOT NULL,
    operation_id TEXT COLLATE \"C\" NOT NULL,
    run_id TEXT COLLATE \"C\" NOT NULL,
    PRIMARY KEY (scope, operation_id)
);
CREATE TABLE spool_claims (
    tool TEXT COLLATE \"C\" NOT NULL,
    key TEXT COLLATE \"C\" NOT NULL,
    run_id TEXT COLLATE \"C\" NOT NULL,
    call_id TEXT COLLATE \"C\" NOT NULL,
    output TEXT,
    settled_seq BIGINT,
    PRIMARY KEY (tool, key)
);
CREATE UNIQUE INDEX spool_claims_holder ON spool_claims (run_id, call_id);
",
    "
CREATE SEQUENCE spool_node_ids;
CREATE TABLE spool_nodes (
    id BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    address TEXT,
    joined_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE spool_leases (
    run_id TEXT COLLATE \"C\" PRIMARY KEY,
    node BIGINT NOT NULL
);
CREATE INDEX spool_leases_node ON spool_leases (node);
",
    "
ALTER TABLE spool_runs ADD COLUMN watched_until TIMESTAMPTZ, ADD COLUMN written_by BIGINT;
",
    "
DROP INDEX IF EXISTS spool_runs_updated;
ALTER TABLE spool_runs SET (fillfactor = 70);
",
    "
CREATE TABLE spool_tombstones (
    run_id TEXT COLLATE \"C\" PRIMARY KEY,
    deleted_ns BIGINT NOT NULL,
    deleted_by TEXT NOT NULL,
    reason TEXT,
    events BIGINT NOT NULL
);
CREATE INDEX spool_operations_run ON spool_operations (run_id);
CREATE TABLE spool_definitions (
    digest TEXT COLLATE \"C\" PRIMARY KEY,
    document TEXT NOT NULL
);
",
];

/// The layout version this build writes.
pub(crate) const STORE_VERSION: u32 = STEPS.len() as u32;

/// The advisory lock class of every lock this store takes (`spoo` in
/// ASCII), so its keys do not meet another application's.
pub(crate) const LOCK_CLASS: i32 = 0x7370_6f6f;

/// The key, within [`LOCK_CLASS`], that serializes migrations: nodes
/// starting together migrate one after another.
const MIGRATION_KEY: i32 = 0;

/// Creates the tables in an empty schema, runs the steps a database
/// written by an older build lacks, and checks both versions.
pub(crate) async fn migrate(client: &Client) -> Result<(), JournalError> {
    client
        .batch_execute(&format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock({LOCK_CLASS}, {MIGRATION_KEY});
             CREATE TABLE IF NOT EXISTS spool_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        ))
        .await
        .map_err(storage)?;
    let result = steps(client).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await.map_err(storage)?;
    result
}

/// Checks that the schema holds a journal this build reads, changing
/// nothing: for opening read-only.
pub(crate) async fn check(client: &Client) -> Result<(), JournalError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('spool_meta') IS NOT NULL", &[])
        .await
        .map_err(storage)?
        .get(0);
    if !exists {
        return Err(JournalError::storage(
            "there is no Spool journal in this database and schema (no spool_meta table)",
        ));
    }
    check_versions(client).await.map(|_| ())
}

/// The stored layout version, refusing a database newer than this build.
async fn check_versions(client: &Client) -> Result<u32, JournalError> {
    let store = version(client, "store_version").await?.unwrap_or(0);
    if store > STORE_VERSION {
        return Err(JournalError::NewerSchema {
            found: store,
            supported: STORE_VERSION,
        });
    }
    if let Some(events) = version(client, "schema_version").await?
        && events > SCHEMA_VERSION
    {
        return Err(JournalError::NewerSchema {
            found: events,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(store)
}

async fn steps(client: &Client) -> Result<(), JournalError> {
    let store = check_versions(client).await?;
    for (done, step) in STEPS.iter().enumerate().skip(store as usize) {
        client.batch_execute(step).await.map_err(|e| {
            JournalError::storage(format!(
                "migrating the journal to version {}: {e}",
                done + 1
            ))
        })?;
    }
    for (key, value) in [
        ("store_version", STORE_VERSION),
        ("schema_version", SCHEMA_VERSION),
    ] {
        client
            .execute(
                "INSERT INTO spool_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&key, &value.to_string()],
            )
            .await
            .map_err(storage)?;
    }
    Ok(())
}

async fn version(client: &Client, key: &str) -> Result<Option<u32>, JournalError> {
    let row = client
        .query_opt("SELECT value FROM spool_meta WHERE key = $1", &[&key])
        .await
        .map_err(storage)?;
    row.map(|row| {
        let text: String = row.get(0);
        text.parse()
            .map_err(|_| JournalError::storage(format!("unreadable {key} `{text}`")))
    })
    .transpose()
}
