//! The store's tables and their layouts, and the migrations that bring a
//! journal written by an earlier version to this one.

use super::*;

/// The event tables of a new journal (layout version `STORE_VERSION`).
///
/// Events sit in arrival order (`pos`, the rowid), so a group commit's
/// events are written side by side at the end of one B-tree instead of
/// each in its own run's place: keeping a `(run_id, seq)` B-tree in the
/// commit cost three quarters of SQLite's appends/s at 64 runs, because
/// every run's rows dirtied their own leaf pages (see docs/performance.md).
/// The per-run index, `event_index`, is written behind the commits in
/// batches (`INDEX_BATCH` events, without an fsync of its own), and
/// `indexed.through` says how far it reaches: a read takes the indexed
/// part through it and scans the short tail of events after it, and
/// opening the journal indexes whatever tail a crash left.
pub(super) const EVENT_TABLES: &str = "
CREATE TABLE events (
    pos INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    hash BLOB NOT NULL
);
CREATE TABLE event_index (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    pos INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE indexed (through INTEGER NOT NULL);
INSERT INTO indexed (through) VALUES (0);
";

/// The rest of a journal's tables: run heads and the indexes commands
/// check (addresses, operation ids, idempotency claims).
///
/// A run's row in `runs` is its head as of the index's mark
/// (`indexed.through`), written with the index in its batches, not by
/// every commit: rewriting the heads of the runs a commit touched dirtied
/// pages of their own all over the table (a fifth of appends/s at 64
/// runs, see docs/performance.md). A head is its row moved on by the run's
/// events after the mark (`load_head`), and opening the journal writes the
/// heads of whatever tail a crash left.
pub(super) const SCHEMA: &str = "
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL,
    last_hash BLOB NOT NULL,
    status TEXT NOT NULL,
    title TEXT,
    created_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE addresses (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
CREATE INDEX addresses_run ON addresses (run_id);
CREATE TABLE operations (
    scope TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (scope, operation_id)
) WITHOUT ROWID;
CREATE TABLE claims (
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    output TEXT,
    settled_seq INTEGER,
    PRIMARY KEY (tool, key)
) WITHOUT ROWID;
CREATE UNIQUE INDEX claims_holder ON claims (run_id, call_id);
";

/// What deletion and agent versions need, made in any journal opened for
/// writing (a journal from before gains them at its first such open): the
/// tombstones of deleted runs, the operation ids by run (so a deletion
/// finds its run's without a scan), and the agent definitions runs name
/// by digest.
pub(super) const LIFECYCLE: &str = "
CREATE TABLE IF NOT EXISTS definitions (
    digest TEXT PRIMARY KEY,
    document TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tombstones (
    run_id TEXT PRIMARY KEY,
    deleted_ns INTEGER NOT NULL,
    deleted_by TEXT NOT NULL,
    reason TEXT,
    events INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS operations_run ON operations (run_id);
";

/// The journal's layout, recorded as `store_version` in `meta` (apart from
/// `schema_version`, the events' vocabulary). Version 1 (no
/// `store_version`) kept events in a `(run_id, seq)` B-tree; opening such
/// a journal for writing migrates it, and a read-only open reads it as it
/// is. Version 2 wrote every run's head with each commit; version 3 keeps
/// the same tables and writes heads behind, with the index, so a build
/// that reads heads from their rows alone must not open it (it would
/// append after a stale head).
pub(super) const STORE_VERSION: u32 = 3;

/// How many events the writer lets go unindexed before it indexes them in
/// a transaction of their own. The larger, the fewer index pages each
/// event costs (64 runs appending: each run's leaf page written once per
/// batch, not once per commit); the smaller, the shorter the tail a
/// listing of runs, or a read from another process, scans and decodes
/// (about 100 µs for a full one). A read in this process scans only from
/// its run's first event in the tail (`tail.rs`), and the writer reads no
/// tail at all. 4 096 was tried: no more appends per second on this
/// project's disk (three interleaved runs), and a listing four times the
/// work.
pub(super) const INDEX_BATCH: usize = 1_024;

/// A commit's one statement per event.
pub(super) const INSERT_EVENT: &str =
    "INSERT INTO events (run_id, seq, body, hash) VALUES (?1, ?2, ?3, ?4)";

/// Takes the unindexed tail into `event_index` and moves the mark; the
/// same statement serves the writer's batches, an open after a crash and
/// a migration, and it indexes what any writer of the file appended.
pub(super) const INDEX_TAIL: &str = "
INSERT OR IGNORE INTO event_index (run_id, seq, pos)
    SELECT run_id, seq, pos FROM events WHERE pos > (SELECT through FROM indexed) ORDER BY pos;
UPDATE indexed SET through = (SELECT coalesce(max(pos), 0) FROM events);
";

/// How far the per-run index reaches: the last event position it holds.
pub(super) fn index_mark(conn: &Connection) -> Result<i64, JournalError> {
    conn.prepare_cached("SELECT through FROM indexed")
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
        .map_err(storage)
}

/// A version-1 journal's events (in a table renamed `events_by_run`),
/// moved into the arrival-order table in run order, so `pos` grows with
/// `seq` within each run as reads need.
pub(super) const MOVE_BY_RUN: &str = "
INSERT INTO events (run_id, seq, body, hash)
    SELECT run_id, seq, body, hash FROM events_by_run ORDER BY run_id, seq;
DROP TABLE events_by_run;
";

/// Where a journal's events are, as its reads need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Version 1: one `(run_id, seq)` B-tree (read-only opens of a journal
    /// no writer has migrated yet).
    ByRun,
    /// Versions 2 and 3: arrival order, indexed behind (and, in version 3,
    /// heads written behind with the index).
    InArrivalOrder,
}

/// WAL pages at which the writer copies what the checkpointer's thread
/// has not yet into the database file, so the log starts over
/// (`checkpoint.rs`). SQLite's default (1 000) checkpoints every dozen
/// commits when many runs append at once, and each checkpoint rewrites the
/// same hot B-tree pages and syncs the file; ten times the window writes
/// each hot page once per hundred commits: +16 % appends/s at 64 runs
/// with `synchronous=FULL`, +28 % with `NORMAL` (`cargo xtask bench
/// --only journal-append`, three runs each). Unless a long read holds a
/// checkpoint back, the WAL stays under about 40 MiB.
pub(super) const WAL_CHECKPOINT_PAGES: u32 = 10_000;

/// What a WAL file is cut back to after a checkpoint empties it, should a
/// long read have let it grow past the checkpoint window.
pub(super) const WAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// Creates the schema in a new file, or checks an existing file's versions
/// and migrates its layout to this build's.
pub(super) fn migrate(conn: &Connection) -> Result<(), JournalError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    )
    .map_err(storage)?;
    if stored_version(conn, "schema_version")?.is_none() {
        return in_transaction(conn, "creating the journal", |conn| {
            conn.execute_batch(&format!(
                "{SCHEMA} {EVENT_TABLES} {LIFECYCLE}
                 INSERT INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
                 INSERT INTO meta (key, value) VALUES ('store_version', '{STORE_VERSION}');"
            ))
            .map_err(storage)
        });
    }
    if check_schema(conn)? == Layout::ByRun {
        tracing::info!(target: "spool::journal", "moving the journal's events into arrival order (layout version 1 to 3), once");
        in_transaction(conn, "migrating the journal to layout version 3", |conn| {
            conn.execute_batch(&format!(
                "ALTER TABLE events RENAME TO events_by_run; {EVENT_TABLES} {MOVE_BY_RUN} {INDEX_TAIL}
                 INSERT INTO meta (key, value) VALUES ('store_version', '{STORE_VERSION}')
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value;"
            ))
            .map_err(storage)
        })?;
    }
    // A version-2 journal's rows hold every run's head, its tail's too:
    // they are already what version 3 keeps, so only the number changes.
    if stored_version(conn, "store_version")? == Some(2) {
        in_transaction(conn, "migrating the journal to layout version 3", |conn| {
            exec(
                conn,
                "UPDATE meta SET value = ?1 WHERE key = 'store_version'",
                params![STORE_VERSION.to_string()],
            )
            .map(drop)
            .map_err(storage)
        })?;
    }
    let lifecycle: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'definitions'",
            [],
            |row| row.get(0),
        )
        .map_err(storage)?;
    if !lifecycle {
        in_transaction(
            conn,
            "adding the tables of deletion and definitions",
            |conn| conn.execute_batch(LIFECYCLE).map_err(storage),
        )?;
    }
    // Journals made before 2026-12-01 kept the runs in update order in an
    // index every commit rewrote (a tenth of appends/s with 64 runs
    // appending); a listing reads every run anyway, and sorts them.
    let by_update: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'index' AND name = 'runs_updated'",
            [],
            |row| row.get(0),
        )
        .map_err(storage)?;
    if by_update {
        in_transaction(conn, "dropping the index of runs by update time", |conn| {
            conn.execute_batch("DROP INDEX runs_updated")
                .map_err(storage)
        })?;
    }
    // What a crash left unindexed; an open with nothing to index commits
    // nothing (a one-shot `spool run` would pay an fsync for it).
    let behind: bool = conn
        .query_row(
            "SELECT coalesce(max(pos), 0) > (SELECT through FROM indexed) FROM events",
            [],
            |row| row.get(0),
        )
        .map_err(storage)?;
    if !behind {
        return Ok(());
    }
    in_transaction(conn, "indexing the journal's last events", |conn| {
        catch_up(conn, None)
    })
}

/// Runs `work` in one write transaction, rolled back if any of it fails.
pub(super) fn in_transaction(
    conn: &Connection,
    doing: &str,
    work: impl FnOnce(&Connection) -> Result<(), JournalError>,
) -> Result<(), JournalError> {
    let result = conn
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(storage)
        .and_then(|()| work(conn))
        .and_then(|()| conn.execute_batch("COMMIT").map_err(storage));
    result.map_err(|error| {
        if !conn.is_autocommit()
            && let Err(rollback) = conn.execute_batch("ROLLBACK")
        {
            tracing::debug!(error = %rollback, "rollback after a failed transaction");
        }
        match error {
            JournalError::Storage { message, source } => JournalError::Storage {
                message: format!("{doing}: {message}"),
                source,
            },
            // A corrupt or tampered log says so in its own terms.
            other => other,
        }
    })
}

/// Checks that this build reads the journal, and says where its events are.
pub(super) fn check_schema(conn: &Connection) -> Result<Layout, JournalError> {
    let Some(events) = stored_version(conn, "schema_version")? else {
        return Err(JournalError::storage(
            "the file is not a Spool journal (no schema version)",
        ));
    };
    if events > SCHEMA_VERSION {
        return Err(JournalError::NewerSchema {
            found: events,
            supported: SCHEMA_VERSION,
        });
    }
    match stored_version(conn, "store_version")?.unwrap_or(1) {
        1 => Ok(Layout::ByRun),
        2 | STORE_VERSION => Ok(Layout::InArrivalOrder),
        found => Err(JournalError::NewerSchema {
            found,
            supported: STORE_VERSION,
        }),
    }
}

pub(super) fn stored_version(conn: &Connection, key: &str) -> Result<Option<u32>, JournalError> {
    let text: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
            row.get(0)
        })
        .optional()
        .or_else(|e| match e {
            // A read-only open of a file with no meta table: not a journal.
            rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.contains("no such table") => {
                Ok(None)
            }
            other => Err(other),
        })
        .map_err(storage)?;
    text.map(|t| {
        t.parse()
            .map_err(|_| JournalError::storage(format!("unreadable {key} `{t}`")))
    })
    .transpose()
}
