//! The writer thread: one connection that commits many runs' appends in
//! one transaction (group commit), checks and writes the index rows and
//! heads, and answers claims.

use super::*;

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) counters: Arc<Counters>,
    pub(super) conn: Connection,
    pub(super) receiver: mpsc::Receiver<Op>,
    pub(super) clock: Clock,
    pub(super) max_batch: usize,
    /// Run heads as last committed and synced, so an append need not read
    /// its run's row back. Another process committing to the file clears
    /// it (see `data_version`).
    pub(super) heads: Arc<Heads>,
    /// Heads committed but not yet synced, with the commit that wrote
    /// them: the syncer makes them the journal's once their commit is
    /// synced, and the writer forgets them then.
    pub(super) unsynced: RunMap<(u64, Head)>,
    /// Commits so far, counted to match heads with their sync.
    pub(super) commits: u64,
    /// Where commits are made durable.
    pub(super) syncing: Arc<Syncing>,
    /// The syncer's thread, started at the first commit handed over (a
    /// process whose appends come one at a time, as `spool run`'s do,
    /// syncs each itself and never starts it), joined when the writer
    /// stops.
    pub(super) syncer_thread: Option<thread::JoinHandle<()>>,
    /// The syncer's thread could not be started: the writer syncs every
    /// commit itself.
    pub(super) syncer_failed: bool,
    pub(super) durable: Arc<Durable>,
    /// SQLite's count of commits by *other* connections, as of our last
    /// transaction (or the open): when it moves, our cached heads may be
    /// stale.
    pub(super) data_version: i64,
    /// Events committed since the index last took the tail.
    pub(super) unindexed: usize,
    /// The heads of the runs this writer appended to since the index last
    /// took the tail, which the index writes to their rows; `None` when
    /// another connection may have appended too (see `data_version`), and
    /// the index reads the tail's heads from the log instead.
    pub(super) behind: Option<RunMap<Head>>,
    /// See [`Options::keep_wal_below`].
    pub(super) keep_wal_below: u64,
    /// Written blocks kept ahead of the log's last frame (`ahead.rs`): for
    /// a journal that syncs every commit and empties its log at close;
    /// `None` for one that keeps a small log for the next process, whose
    /// size decides that, or does not sync.
    pub(super) ahead: Option<ahead::Ahead>,
    /// Writing the log ahead failed at the last try.
    pub(super) ahead_failing: bool,
    /// The write-ahead log's file.
    pub(super) wal: PathBuf,
    /// Where each run's events after the index's mark begin, for reads.
    pub(super) tail: Arc<tail::Tail>,
    /// Copies the log into the database file behind the writer.
    pub(super) checkpointer: Arc<checkpoint::Checkpointer>,
}

/// The most heads kept; past it the cache starts over, so memory stays
/// bounded however many runs a journal holds. A head saves one indexed
/// read per append, which matters for the runs appending now, not for the
/// many that finished: 4,096 covers far more runs than are in a turn at
/// once, and keeps the cache under a megabyte (at 65,536, a server that
/// served 50,000 one-turn runs held 11 MB more for heads it never used).
pub(super) const MAX_CACHED_HEADS: usize = 4_096;

/// Why an operation did not apply.
pub(super) enum Failed {
    /// Refused before it wrote anything: only its caller is told.
    Refused(JournalError),
    /// SQLite failed part-way: the whole transaction must be rolled back.
    Broken(JournalError),
}

impl Writer {
    pub(super) fn run(mut self) {
        // Ends when every sender is gone: the journal was dropped.
        while let Some(first) = self.receiver.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match self.receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        // Every commit synced and answered before the log is emptied.
        self.syncing.close();
        if let Some(thread) = self.syncer_thread.take() {
            let _ = thread.join();
        }
        if self.unindexed > 0 {
            self.index_tail();
        }
        // Whatever deletions freed goes back before the last checkpoint.
        self.vacuum(1);
        self.checkpointer.close();
        if self.keeps_wal() {
            return;
        }
        // A clean stop leaves everything in the database file and the
        // write-ahead log empty (it reached tens of MiB under load, and
        // stayed that size on disk after a stop).
        if let Err(error) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
            tracing::warn!(target: "spool::journal", %error, "the write-ahead log was not emptied at close");
        }
    }

    /// Whether the log is left as it is at close (smaller than
    /// [`Options::keep_wal_below`]): then no connection checkpoints it as
    /// it closes, which SQLite's last connection otherwise does, syncing
    /// and deleting the log. Every commit of events in it was synced; the
    /// index written just before is not, and a power loss that takes it
    /// back leaves a tail the next open indexes again.
    pub(super) fn keeps_wal(&self) -> bool {
        let small = std::fs::metadata(&self.wal)
            .is_ok_and(|file| file.len() > 0 && file.len() < self.keep_wal_below);
        if !small || self.durable.failure().is_some() {
            return false;
        }
        match self
            .conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        {
            Ok(_) => {
                self.durable.wal_kept.store(true, Ordering::Release);
                true
            }
            Err(error) => {
                tracing::warn!(target: "spool::journal", %error, "the write-ahead log is emptied at close after all");
                false
            }
        }
    }

    /// Commits `batch` in one transaction: appends, claims, probes,
    /// definitions and deletions alike, so a deletion costs appends no
    /// commit or sync of its own.
    pub(super) fn commit(&mut self, batch: Vec<Op>) {
        if let Some(failure) = self.durable.failure() {
            return fail_all(batch, &failure);
        }
        if let Err(error) = self.begin() {
            return fail_all(batch, &format!("could not begin a transaction: {error}"));
        }
        // Heads this transaction changes; they join the cache only once it
        // commits.
        // Sized once: grown append by append, it was rehashed a handful
        // of times in every commit.
        let mut pending: RunMap<Head> =
            RunMap::with_capacity_and_hasher(batch.len(), Default::default());
        let mut done = Vec::with_capacity(batch.len());
        let mut firsts = Vec::new();
        let mut appended = 0;
        // Taken from the statement cache once per commit, not per append.
        let mut insert = match self.conn.prepare_cached(INSERT_EVENT) {
            Ok(insert) => insert,
            Err(error) => {
                // Nothing was written: the transaction is let go.
                let _ = self.conn.execute_batch("ROLLBACK");
                return fail_all(
                    batch,
                    &format!("could not prepare the events' insert: {error}"),
                );
            }
        };
        let mut broken: Option<String> = None;
        // Runs this transaction deletes: forgotten by every cache once it
        // commits.
        let mut deleted: Vec<RunId> = Vec::new();
        for op in batch {
            if broken.is_some() {
                done.push(Done::refused(
                    op,
                    JournalError::storage("the batch's transaction failed"),
                ));
                continue;
            }
            let entry = match op {
                Op::Append { run, append, reply } => {
                    match self.append(&mut insert, &mut pending, &mut firsts, &run, append) {
                        Ok((envelopes, next)) => {
                            appended += envelopes.len();
                            Done::Append(reply, Ok((run, envelopes, next)))
                        }
                        Err(Failed::Refused(error)) => Done::Append(reply, Err(error)),
                        Err(Failed::Broken(error)) => {
                            broken = Some(error.to_string());
                            Done::Append(reply, Err(error))
                        }
                    }
                }
                Op::Claim { key, holder, reply } => match claim(&self.conn, &key, &holder) {
                    Ok(claim) => Done::Claim(reply, Ok(claim)),
                    Err(error @ JournalError::CallInFlight { .. }) => {
                        Done::Claim(reply, Err(error))
                    }
                    Err(error) => {
                        broken = Some(error.to_string());
                        Done::Claim(reply, Err(error))
                    }
                },
                Op::Delete {
                    run,
                    deletion,
                    reply,
                } => match self.delete(&mut pending, &run, deletion) {
                    Ok(tombstone) => {
                        deleted.push(run.clone());
                        Done::Delete(reply, run, Ok(tombstone))
                    }
                    Err(Failed::Refused(error)) => Done::Delete(reply, run, Err(error)),
                    Err(Failed::Broken(error)) => {
                        broken = Some(error.to_string());
                        Done::Delete(reply, run, Err(error))
                    }
                },
                Op::Define {
                    digest,
                    document,
                    reply,
                } => {
                    if let Err(error) = exec(
                        &self.conn,
                        "INSERT OR IGNORE INTO definitions (digest, document) VALUES (?1, ?2)",
                        params![digest, document],
                    ) {
                        broken = Some(error.to_string());
                    }
                    Done::Probe(reply)
                }
                Op::Probe { reply } => {
                    let probed_at = (self.clock)()
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default();
                    if let Err(error) = self.conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('probed_at', ?1) \
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        params![probed_at],
                    ) {
                        broken = Some(error.to_string());
                    }
                    Done::Probe(reply)
                }
            };
            done.push(entry);
        }
        // Back to the cache before the commit.
        drop(insert);
        let committing = std::time::Instant::now();
        let last_pos = if appended > 0 {
            self.conn.last_insert_rowid()
        } else {
            0
        };
        let failure = match broken {
            Some(reason) => Some(reason),
            None => {
                // Before the commit shows its events to readers: they skip
                // them until the syncer has synced them.
                self.durable.written.fetch_max(last_pos, Ordering::AcqRel);
                self.tail.commit(firsts, last_pos);
                exec(&self.conn, "COMMIT", [])
                    .err()
                    .map(|e| format!("commit failed: {e}"))
            }
        };
        if let Some(reason) = failure {
            tracing::error!(operations = done.len(), %reason, "a group commit failed; nothing of it was recorded");
            // Nothing of this batch is durable; say so to every caller, and
            // forget cached heads in case the failure left them doubtful.
            if let Err(error) = self.conn.execute_batch("ROLLBACK") {
                // SQLite rolls a failed COMMIT back itself; a ROLLBACK with
                // no transaction open is refused, and that is harmless.
                tracing::debug!(%error, "rollback after a failed commit");
            }
            self.heads.lock().clear();
            self.unsynced.clear();
            self.tail.forget();
            let message = format!("nothing was recorded: {reason}");
            for entry in done {
                entry.fail(&message);
            }
            return;
        }
        tracing::debug!(
            operations = done.len(),
            commit_ms = committing.elapsed().as_secs_f64() * 1e3,
            "group commit"
        );
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .operations
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        self.commits += 1;
        if !deleted.is_empty() {
            self.forget(&deleted);
        }
        for (run, head) in &pending {
            self.unsynced
                .insert(run.clone(), (self.commits, head.clone()));
            if let Some(behind) = &mut self.behind {
                behind.insert(run.clone(), head.clone());
            }
        }
        let committed = Committed {
            number: self.commits,
            done,
            heads: pending,
            last_pos,
        };
        let alone =
            self.receiver.is_empty() || !self.syncing.hands_over() || !self.syncer_running();
        self.syncing.submit(committed, alone);
        self.unindexed += appended;
        if self.unindexed >= INDEX_BATCH {
            self.index_tail();
        }
    }

    /// Whether the syncer's thread runs, started now if it does not yet:
    /// when it cannot start, the writer syncs on its own, slower but
    /// just as durable.
    pub(super) fn syncer_running(&mut self) -> bool {
        if self.syncer_thread.is_some() {
            return true;
        }
        if self.syncer_failed {
            return false;
        }
        let syncing = Arc::clone(&self.syncing);
        match thread::Builder::new()
            .name("spool-journal-sync".into())
            .spawn(move || syncing.run())
        {
            Ok(thread) => {
                self.syncer_thread = Some(thread);
                true
            }
            Err(error) => {
                tracing::error!(target: "spool::journal", %error, "the syncer thread did not start; the writer syncs each commit itself");
                self.syncer_failed = true;
                false
            }
        }
    }

    /// Indexes the events committed since the last time, in a transaction
    /// nobody waits on a sync for: an index a power loss takes back is
    /// rebuilt from the events at open, and the next commit's sync covers
    /// it (the log is written in order).
    pub(super) fn index_tail(&mut self) {
        let indexed = in_transaction(&self.conn, "indexing appended events", |conn| {
            // Another connection may have appended since our last commit
            // (the next `begin` forgets our heads for it): then ours may
            // be stale, and the tail's heads are read from the log.
            let known = if data_version(conn).map_err(storage)? == self.data_version {
                self.behind.as_ref()
            } else {
                None
            };
            catch_up(conn, known)
        });
        // The mark the index reached, for reads to start the tail after.
        let indexed = indexed.and_then(|()| index_mark(&self.conn));
        match indexed {
            Ok(through) => {
                self.unindexed = 0;
                self.behind = Some(RunMap::default());
                self.tail.start(through);
            }
            // Reads scan the longer tail meanwhile; the next commit tries
            // again.
            Err(error) => {
                tracing::warn!(target: "spool::journal", %error, "indexing waits for the next batch")
            }
        }
    }

    /// Begins the write transaction, forgets the unsynced heads the
    /// syncer has made the journal's, and drops cached heads if another
    /// connection has committed since our last one.
    pub(super) fn begin(&mut self) -> rusqlite::Result<()> {
        let synced = self.durable.synced_commit.load(Ordering::Acquire);
        self.unsynced.retain(|_, (commit, _)| *commit > synced);
        exec(&self.conn, "BEGIN IMMEDIATE", [])?;
        let version = data_version(&self.conn)?;
        if self.data_version != version {
            self.heads.lock().clear();
            self.unsynced.clear();
            // Another connection may have appended to these runs: until
            // the next index, their rows are moved on from the log, and
            // reads scan the whole tail.
            self.behind = None;
            self.tail.forget();
            self.data_version = version;
        }
        // Under the log's write lock: nobody else appends frames now.
        if let Some(ahead) = &mut self.ahead {
            match ahead.keep() {
                Ok(written) => {
                    if written > 0 {
                        tracing::debug!(target: "spool::journal", bytes = written, "the write-ahead log's file written ahead of its frames");
                    }
                    self.ahead_failing = false;
                }
                // Only speed is lost (SQLite grows the file itself), and
                // the next commit tries again: a full disk may have room
                // by then. Said once per spell of failures.
                Err(error) => {
                    if !self.ahead_failing {
                        tracing::warn!(target: "spool::journal", %error, "the write-ahead log could not be written ahead of its frames");
                    }
                    self.ahead_failing = true;
                }
            }
        }
        Ok(())
    }

    /// The run's head, and whether this writer already put events of it
    /// after the index's mark (the head came from this transaction, an
    /// unsynced commit or the heads kept for the index).
    pub(super) fn head(
        &self,
        pending: &RunMap<Head>,
        run: &RunId,
    ) -> Result<(Option<Head>, bool), JournalError> {
        if let Some(head) = pending.get(run) {
            return Ok((Some(head.clone()), true));
        }
        if let Some((_, head)) = self.unsynced.get(run) {
            return Ok((Some(head.clone()), true));
        }
        if let Some(head) = self.behind.as_ref().and_then(|behind| behind.get(run)) {
            return Ok((Some(head.clone()), true));
        }
        if let Some(head) = self.heads.lock().get(run) {
            return Ok((Some(head.clone()), false));
        }
        if self.behind.is_some() {
            // Every run with events after the index's mark is in `behind`
            // (this writer wrote the whole tail), so this one's row is its
            // head: no scan of the tail, which a new run's first append
            // paid for every run created.
            return Ok((stored_head(&self.conn, run)?, false));
        }
        Ok((load_head(&self.conn, Layout::InArrivalOrder, run)?, false))
    }

    pub(super) fn append(
        &self,
        insert: &mut rusqlite::CachedStatement<'_>,
        pending: &mut RunMap<Head>,
        firsts: &mut Vec<(RunId, i64)>,
        run: &RunId,
        append: Encoded,
    ) -> Result<(Vec<Envelope>, Seq), Failed> {
        let (head, in_tail) = self.head(pending, run).map_err(Failed::Broken)?;
        // A run with no head may be a deleted one, whose id is not used
        // again: one lookup per new run, in a table of deleted runs only.
        if head.is_none()
            && tombstone(&self.conn, run)
                .map_err(Failed::Broken)?
                .is_some()
        {
            return Err(Failed::Refused(JournalError::RunDeleted {
                run: run.clone(),
            }));
        }
        let plan = link(run, head.as_ref(), append).map_err(Failed::Refused)?;
        // Every refusal is decided before anything is written: an unbind only
        // releases this run's own names, so the checks do not depend on
        // their order, and earlier operations of this transaction are
        // visible to them.
        check_indexes(&self.conn, run, &plan.changes)?;
        write_plan(&self.conn, insert, run, &plan).map_err(Failed::Broken)?;
        // The run's first events after the index's mark: where reads of
        // it start scanning the tail (`tail.rs`). Without `behind` the
        // positions are forgotten until the next index anyway.
        if !in_tail && self.behind.is_some() {
            let count = i64::try_from(plan.rows.len()).unwrap_or(i64::MAX);
            firsts.push((run.clone(), self.conn.last_insert_rowid() - (count - 1)));
        }
        let next = plan.head.next_seq;
        pending.insert(run.clone(), plan.head);
        Ok((plan.envelopes, next))
    }
}

impl Writer {
    /// Deletes `run` in the open transaction: its rows go (the writer's
    /// connection has `secure_delete` on, so their bytes are overwritten
    /// in the pages that held them) and its tombstone is written. The
    /// run's head is this transaction's, an unsynced commit's or the
    /// cache's, as for an append. The caller deletes a run with no append
    /// of it in flight (the runtime holds the run's lock).
    fn delete(
        &self,
        pending: &mut RunMap<Head>,
        run: &RunId,
        deletion: Deletion,
    ) -> Result<Tombstone, Failed> {
        if let Some(tombstone) = tombstone(&self.conn, run).map_err(Failed::Broken)? {
            return Ok(tombstone);
        }
        let (head, _) = self.head(pending, run).map_err(Failed::Broken)?;
        let head =
            head.ok_or_else(|| Failed::Refused(JournalError::NoSuchRun { run: run.clone() }))?;
        deletion
            .check(run, head.next_seq)
            .map_err(Failed::Refused)?;
        pending.remove(run);
        delete_run(&self.conn, run, deletion, head.next_seq, (self.clock)()).map_err(Failed::Broken)
    }

    /// After a commit that deleted `runs`: no cache holds their heads, and
    /// once enough pages are free they go back to the file system.
    fn forget(&mut self, runs: &[RunId]) {
        {
            let mut heads = self.heads.lock();
            for run in runs {
                heads.remove(run);
            }
        }
        for run in runs {
            self.unsynced.remove(run);
            if let Some(behind) = &mut self.behind {
                behind.remove(run);
            }
        }
        self.vacuum(VACUUM_PAGES);
    }

    /// Gives free pages back to the file system, `at_least` of them at a
    /// time, in a journal made with incremental vacuum (a no-op in one
    /// made before, which reuses them for new events): moving pages is
    /// the writer's time, so it waits until there are enough to be worth
    /// it. `0` gives every free page back (at close).
    pub(super) fn vacuum(&self, at_least: i64) {
        let free: i64 = self
            .conn
            .query_row("PRAGMA freelist_count", [], |row| row.get(0))
            .unwrap_or(0);
        if free == 0 || free < at_least {
            return;
        }
        // The pragma frees one page per step, each answered as a row:
        // every row is read, or only the first page goes.
        let freed = self
            .conn
            .prepare(&format!("PRAGMA incremental_vacuum({free})"))
            .and_then(|mut statement| {
                let mut rows = statement.query([])?;
                while rows.next()?.is_some() {}
                Ok(())
            });
        if let Err(error) = freed {
            tracing::warn!(target: "spool::journal", %error, "the pages deletions freed stay in the file for now");
        }
    }
}

/// Free pages (4 KiB each) at which the writer gives them back to the
/// file system: 4 MiB at a time.
const VACUUM_PAGES: i64 = 1_024;

/// Removes `run`'s rows and writes its tombstone, in the open
/// transaction.
fn delete_run(
    conn: &Connection,
    run: &RunId,
    deletion: Deletion,
    next: Seq,
    now: OffsetDateTime,
) -> Result<Tombstone, JournalError> {
    let id = run.as_str();
    for statement in [
        "DELETE FROM events WHERE pos IN (SELECT pos FROM event_index WHERE run_id = ?1)",
        "DELETE FROM events WHERE pos > (SELECT through FROM indexed) AND run_id = ?1",
        "DELETE FROM event_index WHERE run_id = ?1",
        "DELETE FROM runs WHERE run_id = ?1",
        "DELETE FROM addresses WHERE run_id = ?1",
        "DELETE FROM operations WHERE run_id = ?1",
        "DELETE FROM claims WHERE run_id = ?1",
    ] {
        exec(conn, statement, params![id]).map_err(storage)?;
    }
    let tombstone = Tombstone {
        run_id: run.clone(),
        deleted_at: now,
        by: deletion.by,
        reason: deletion.reason,
        events: next.0,
    };
    exec(
        conn,
        "INSERT INTO tombstones (run_id, deleted_ns, deleted_by, reason, events) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            id,
            nanos(now),
            tombstone.by,
            tombstone.reason,
            i64::try_from(tombstone.events).unwrap_or(i64::MAX)
        ],
    )
    .map_err(storage)?;
    Ok(tombstone)
}

/// `sql`, prepared; `None` when its table does not exist (a journal
/// from before the table, opened read-only, was never migrated).
fn prepared_if_table<'c>(
    conn: &'c Connection,
    sql: &str,
) -> Result<Option<rusqlite::CachedStatement<'c>>, JournalError> {
    match conn.prepare_cached(sql) {
        Ok(statement) => Ok(Some(statement)),
        Err(rusqlite::Error::SqliteFailure(_, Some(ref message)))
            if message.contains("no such table") =>
        {
            Ok(None)
        }
        Err(error) => Err(storage(error)),
    }
}

/// The definition kept under `digest`; `None` for any other, and in a
/// journal from before definitions, which has no such table.
pub(super) fn definition(
    conn: &Connection,
    digest: &str,
) -> Result<Option<serde_json::Value>, JournalError> {
    let Some(mut statement) =
        prepared_if_table(conn, "SELECT document FROM definitions WHERE digest = ?1")?
    else {
        return Ok(None);
    };
    let text: Option<String> = statement
        .query_row(params![digest], |row| row.get(0))
        .optional()
        .map_err(storage)?;
    text.map(|text| {
        serde_json::from_str(&text)
            .map_err(|e| JournalError::storage(format!("definition {digest} does not read: {e}")))
    })
    .transpose()
}

/// A deleted run's tombstone; `None` for any other run, and in a journal
/// from before deletion, which has no such table.
pub(super) fn tombstone(conn: &Connection, run: &RunId) -> Result<Option<Tombstone>, JournalError> {
    let Some(mut statement) = prepared_if_table(
        conn,
        "SELECT deleted_ns, deleted_by, reason, events FROM tombstones WHERE run_id = ?1",
    )?
    else {
        return Ok(None);
    };
    let row = statement
        .query_row(params![run.as_str()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, i64>(3)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    Ok(row.map(|(at, by, reason, events)| Tombstone {
        run_id: run.clone(),
        deleted_at: from_nanos(at),
        by,
        reason,
        events: u64::try_from(events).unwrap_or(0),
    }))
}

/// A number SQLite moves whenever a connection other than `conn` commits
/// to the file.
pub(super) fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |row| row.get(0))
}

pub(super) fn fail_all(batch: Vec<Op>, message: &str) {
    let message = format!("nothing was recorded: {message}");
    for op in batch {
        Done::refused(op, JournalError::storage(message.clone())).fail(&message);
    }
}

pub(super) fn check_indexes(
    conn: &Connection,
    run: &RunId,
    changes: &[IndexChange],
) -> Result<(), Failed> {
    for change in changes {
        match change {
            IndexChange::Bind(address) => {
                let owner: Option<String> = conn
                    .prepare_cached(
                        "SELECT run_id FROM addresses WHERE namespace = ?1 AND name = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![address.namespace, address.name], |row| row.get(0))
                            .optional()
                    })
                    .map_err(|e| Failed::Broken(storage(e)))?;
                if let Some(owner) = owner.filter(|o| o != run.as_str()) {
                    return Err(Failed::Refused(JournalError::AddressTaken {
                        address: address.clone(),
                        run: stored_run_id(&owner).map_err(Failed::Broken)?,
                    }));
                }
            }
            IndexChange::Operation {
                scope,
                operation_id,
            } => {
                let owner: Option<String> = conn
                    .prepare_cached(
                        "SELECT run_id FROM operations WHERE scope = ?1 AND operation_id = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![scope, operation_id], |row| row.get(0))
                            .optional()
                    })
                    .map_err(|e| Failed::Broken(storage(e)))?;
                if let Some(owner) = owner.filter(|o| o != run.as_str()) {
                    return Err(Failed::Refused(JournalError::OperationTaken {
                        operation_id: operation_id.clone(),
                        run: stored_run_id(&owner).map_err(Failed::Broken)?,
                    }));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes a checked plan's index changes and rows (not its head: heads are
/// written once per run per transaction, by `write_heads`).
pub(super) fn write_plan(
    conn: &Connection,
    insert: &mut rusqlite::CachedStatement<'_>,
    run: &RunId,
    plan: &crate::store::Plan,
) -> Result<(), JournalError> {
    for change in &plan.changes {
        match change {
            IndexChange::Bind(address) => exec(
                conn,
                "INSERT OR IGNORE INTO addresses (namespace, name, run_id) VALUES (?1, ?2, ?3)",
                params![address.namespace, address.name, run.as_str()],
            ),
            IndexChange::Unbind(address) => exec(
                conn,
                "DELETE FROM addresses WHERE namespace = ?1 AND name = ?2 AND run_id = ?3",
                params![address.namespace, address.name, run.as_str()],
            ),
            IndexChange::UnbindAll => exec(conn, "DELETE FROM addresses WHERE run_id = ?1", params![run.as_str()]),
            IndexChange::UnbindNamespace(namespace) => exec(
                conn,
                "DELETE FROM addresses WHERE run_id = ?1 AND namespace = ?2",
                params![run.as_str(), namespace],
            ),
            IndexChange::Operation { scope, operation_id } => exec(
                conn,
                "INSERT OR IGNORE INTO operations (scope, operation_id, run_id) VALUES (?1, ?2, ?3)",
                params![scope, operation_id, run.as_str()],
            ),
            IndexChange::Settle { call_id, output, seq } => exec(
                conn,
                "UPDATE claims SET output = ?1, settled_seq = ?2
                 WHERE run_id = ?3 AND call_id = ?4 AND settled_seq IS NULL",
                params![output.to_string(), seq_sql(*seq)?, run.as_str(), call_id],
            ),
            IndexChange::Release { call_id } => exec(
                conn,
                "DELETE FROM claims WHERE run_id = ?1 AND call_id = ?2 AND settled_seq IS NULL",
                params![run.as_str(), call_id],
            ),
        }
        .map_err(storage)?;
    }
    for row in &plan.rows {
        insert
            .execute(params![
                run.as_str(),
                seq_sql(row.seq)?,
                row.bytes,
                &row.hash[..]
            ])
            .map_err(storage)?;
    }
    Ok(())
}

/// Writes the heads of the runs the index's batch moves past.
pub(super) fn write_heads(conn: &Connection, heads: &RunMap<Head>) -> Result<(), JournalError> {
    let mut upsert = conn
        .prepare_cached(
            "INSERT INTO runs (run_id, next_seq, last_hash, status, title, created_ns, updated_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (run_id) DO UPDATE SET next_seq = ?2, last_hash = ?3, status = ?4, title = ?5, updated_ns = ?7",
        )
        .map_err(storage)?;
    for (run, head) in heads {
        upsert
            .execute(params![
                run.as_str(),
                seq_sql(head.next_seq)?,
                &head.last_hash[..],
                head.status.encode(),
                head.title,
                nanos(head.created_at),
                nanos(head.updated_at),
            ])
            .map_err(storage)?;
    }
    Ok(())
}

pub(super) fn claim(
    conn: &Connection,
    key: &ClaimKey,
    holder: &CallRef,
) -> Result<Claim, JournalError> {
    let existing = conn
        .query_row(
            "SELECT run_id, call_id, output, settled_seq FROM claims WHERE tool = ?1 AND key = ?2",
            params![key.tool, key.key],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                ))
            },
        )
        .optional()
        .map_err(storage)?;
    let existing = match existing {
        None => None,
        Some((run, call_id, output, settled_seq)) => {
            let settled = match (output, settled_seq) {
                (Some(output), Some(seq)) => {
                    let output: Value = serde_json::from_str(&output).map_err(|e| {
                        JournalError::storage(format!("a settled claim's output is not JSON: {e}"))
                    })?;
                    Some((output, Seq(u64::try_from(seq).unwrap_or_default())))
                }
                _ => None,
            };
            Some(ClaimRow {
                holder: CallRef {
                    run: stored_run_id(&run)?,
                    call_id,
                },
                settled,
            })
        }
    };
    match decide_claim(existing, holder) {
        ClaimDecision::Take => {
            exec(
                conn,
                "INSERT INTO claims (tool, key, run_id, call_id) VALUES (?1, ?2, ?3, ?4)",
                params![key.tool, key.key, holder.run.as_str(), holder.call_id],
            )
            .map_err(storage)?;
            Ok(Claim::Won)
        }
        ClaimDecision::Answer(answer) => answer.map_err(|by| JournalError::CallInFlight { by }),
    }
}

/// A run's head: its row, moved on by its events after the index's mark.
/// Readers call it inside one read transaction (`in_snapshot`), so the
/// row and the mark come from the same snapshot; the writer, inside its
/// own.
pub(super) fn load_head(
    conn: &Connection,
    layout: Layout,
    run: &RunId,
) -> Result<Option<Head>, JournalError> {
    let row = stored_head(conn, run)?;
    if layout == Layout::ByRun {
        return Ok(row);
    }
    let mut heads = RunMap::default();
    if let Some(row) = row {
        heads.insert(run.clone(), row);
    }
    fold_tail(conn, Some(run), &mut heads)?;
    Ok(heads.remove(run))
}
