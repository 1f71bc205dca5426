//! The readers' connections: a small pool of read-only connections with
//! their statement caches, so reads never wait on the writer.

use super::*;

/// A few read connections, reused.
pub(super) struct ReadPool {
    pub(super) path: PathBuf,
    pub(super) read_only: bool,
    /// Where the events are.
    pub(super) layout: Layout,
    /// Open the file as one nothing changes (a journal on a read-only
    /// filesystem): SQLite then needs no `-shm` file beside it.
    pub(super) immutable: bool,
    /// The writer's progress, for reads to skip events not yet synced;
    /// a read-only journal's stays empty (it cannot know another
    /// process's).
    pub(super) durable: Arc<Durable>,
    /// Where the writer put each run's events after the index's mark; a
    /// read-only journal's knows none.
    pub(super) tail: Arc<tail::Tail>,
    pub(super) idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    const MAX_IDLE: usize = 4;

    pub(super) fn new(path: PathBuf, read_only: bool) -> Self {
        Self {
            path,
            read_only,
            layout: Layout::InArrivalOrder,
            immutable: false,
            durable: Arc::default(),
            tail: Arc::default(),
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn take(&self) -> Result<Connection, JournalError> {
        if let Some(conn) = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Ok(conn);
        }
        let mut flags = OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        flags |= if self.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
        };
        let conn = if self.immutable {
            Connection::open_with_flags(immutable_uri(&self.path), flags)
        } else {
            Connection::open_with_flags(&self.path, flags)
        }
        .map_err(storage)?;
        plan_once(&conn)?;
        conn.execute_batch("PRAGMA busy_timeout=10000; PRAGMA query_only=ON;")
            .map_err(storage)?;
        Ok(conn)
    }

    pub(super) fn give(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < Self::MAX_IDLE {
            idle.push(conn);
        }
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        // The writer closed first and left the log: the last of these
        // connections to close would checkpoint and delete it.
        if self.durable.wal_kept.load(Ordering::Acquire) {
            let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
            for conn in idle.iter() {
                let _ = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
            }
        }
    }
}

/// Prepares and plans each of the store's statements once per connection.
///
/// Without the query planner stability guarantee, SQLite (3.54, as
/// rusqlite bundles it) marked the read queries, which compare bound
/// parameters with indexed columns, to be planned again whenever a
/// parameter was bound to a new value: every read of a run parsed and
/// planned its query anew (`sqlite3Reprepare` was a sixth of the CPU of
/// opening a journal of 10 k runs). The store's queries have one right
/// plan whatever the values. The cache holds every statement the store
/// has (fewer than forty), so none is evicted and parsed again.
pub(super) fn plan_once(conn: &Connection) -> Result<(), JournalError> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(storage)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
    Ok(())
}

/// Statements kept prepared per connection: more than the store has.
pub(super) const STATEMENTS_CACHED: usize = 64;
