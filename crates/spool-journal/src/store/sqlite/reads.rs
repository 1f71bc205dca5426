//! Reads: a run's events from any position, snapshots across runs,
//! listings, and a run's head rebuilt from its log's tail.

use super::*;

/// The events after the index's mark, of every run (`?1` null) or of one.
pub(super) const TAIL_EVENTS: &str = "SELECT run_id, seq, body, hash FROM events
     WHERE pos > (SELECT through FROM indexed) AND (?1 IS NULL OR run_id = ?1) ORDER BY pos";

/// Moves the heads of the runs with events after the index's mark on by
/// them, into `heads`; `only` narrows it to one run. A head already in
/// `heads` is taken as that run's row (the stored row is read for any
/// other), and a run the tail creates starts from its first event.
pub(super) fn fold_tail(
    conn: &Connection,
    only: Option<&RunId>,
    heads: &mut RunMap<Head>,
) -> Result<(), JournalError> {
    let mut statement = conn.prepare_cached(TAIL_EVENTS).map_err(storage)?;
    let mut rows = statement
        .query(params![only.map(RunId::as_str)])
        .map_err(storage)?;
    // Runs whose row was looked for and not found: new in the tail.
    let mut looked = std::collections::HashSet::new();
    while let Some(found) = rows.next().map_err(storage)? {
        let run = stored_run_id(&found.get::<_, String>(0).map_err(storage)?)?;
        let seq = Seq(u64::try_from(found.get::<_, i64>(1).map_err(storage)?).unwrap_or(u64::MAX));
        if !heads.contains_key(&run)
            && looked.insert(run.clone())
            && let Some(row) = stored_head(conn, &run)?
        {
            heads.insert(run.clone(), row);
        }
        let next = heads.get(&run).map_or(Seq(0), |head| head.next_seq);
        // A version-2 journal's rows already count its tail.
        if seq < next {
            continue;
        }
        let tampered = || {
            JournalError::from(crate::chain::TamperEvident {
                run: run.clone(),
                seq,
            })
        };
        if seq != next {
            return Err(JournalError::Corrupt {
                run: run.clone(),
                seq,
                reason: format!("the log's tail skips from position {} to {}", next.0, seq.0),
            });
        }
        let body = stored_bytes(found.get_ref(2).map_err(storage)?).ok_or_else(tampered)?;
        let hash = stored_bytes(found.get_ref(3).map_err(storage)?)
            .and_then(|hash| Hash::try_from(hash.as_slice()).ok())
            .ok_or_else(tampered)?;
        let envelope = decode_row(&run, seq, &body)?;
        let head = heads
            .entry(run)
            .or_insert_with(|| Head::genesis(envelope.recorded_at));
        // The next append links to this hash: it is checked, as a read
        // checks it.
        if crate::chain::link(&head.last_hash, &envelope.run_id, seq, &body) != hash {
            return Err(crate::chain::TamperEvident {
                run: envelope.run_id,
                seq,
            }
            .into());
        }
        head.advance(&envelope.event, hash, envelope.recorded_at);
    }
    Ok(())
}

/// Indexes the events after the index's mark and writes their runs'
/// heads: `known` when the writer holds the head of every run in the tail
/// (it appended them all), else each moved on from its row by the log.
pub(super) fn catch_up(
    conn: &Connection,
    known: Option<&RunMap<Head>>,
) -> Result<(), JournalError> {
    let mut folded = RunMap::default();
    let heads = match known {
        Some(heads) => heads,
        None => {
            fold_tail(conn, None, &mut folded)?;
            &folded
        }
    };
    write_heads(conn, heads)?;
    conn.execute_batch(INDEX_TAIL).map_err(storage)
}

/// A run's row in `runs`: its head as of the index's mark.
pub(super) fn stored_head(conn: &Connection, run: &RunId) -> Result<Option<Head>, JournalError> {
    let row = conn
        .prepare_cached(
            "SELECT next_seq, last_hash, status, title, created_ns, updated_ns FROM runs WHERE run_id = ?1",
        )
        .map_err(storage)?
        .query_row(params![run.as_str()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    let Some((next_seq, last_hash, status, title, created, updated)) = row else {
        return Ok(None);
    };
    let corrupt = |reason: &str| JournalError::Corrupt {
        run: run.clone(),
        seq: Seq(u64::try_from(next_seq).unwrap_or_default()),
        reason: reason.to_owned(),
    };
    Ok(Some(Head {
        next_seq: Seq(u64::try_from(next_seq).map_err(|_| corrupt("negative next_seq"))?),
        last_hash: Hash::try_from(last_hash.as_slice())
            .map_err(|_| corrupt("a head hash is not 32 bytes"))?,
        status: Status::decode(&status).ok_or_else(|| corrupt("unknown run status"))?,
        title,
        created_at: from_nanos(created),
        updated_at: from_nanos(updated),
    }))
}

pub(super) fn read_events(
    conn: &Connection,
    layout: Layout,
    durable: &Durable,
    tail: &tail::Tail,
    run: &RunId,
    from: Seq,
) -> Result<Vec<Envelope>, JournalError> {
    // One read transaction, so the predecessor's hash, the index's mark
    // and the rows come from the same snapshot.
    in_snapshot(conn, |conn| {
        read_snapshot(conn, layout, durable, tail, run, from)
    })
}

/// A run's rows from `from` on: the indexed ones in `seq` order, then the
/// unindexed tail (events after the index's mark), in arrival order,
/// which is `seq` order within a run.
/// Both skip the positions in `(?4, ?5]`, committed but not yet synced.
pub(super) const READ_INDEXED: &str =
    "SELECT e.seq, e.body, e.hash FROM event_index i CROSS JOIN events e ON e.pos = i.pos
     WHERE i.run_id = ?1 AND i.seq >= ?2 AND (e.pos <= ?4 OR e.pos > ?5) ORDER BY i.seq";
pub(super) const READ_TAIL: &str =
    "SELECT seq, body, hash FROM events WHERE pos > ?3 AND run_id = ?1 AND seq >= ?2
     AND (pos <= ?4 OR pos > ?5) ORDER BY pos";
/// The same for a version-1 journal (read only, so nothing is unsynced).
pub(super) const READ_BY_RUN: &str =
    "SELECT seq, body, hash FROM events WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq";

pub(super) fn read_snapshot(
    conn: &Connection,
    layout: Layout,
    durable: &Durable,
    tail: &tail::Tail,
    run: &RunId,
    from: Seq,
) -> Result<Vec<Envelope>, JournalError> {
    let through: i64 = match layout {
        Layout::ByRun => 0,
        Layout::InArrivalOrder => index_mark(conn)?,
    };
    // After the statement above began the snapshot: every unsynced event
    // it holds is in the range (see `Durable`).
    let bounds = Bounds {
        tail_after: tail.scan_after(through, run),
        hidden: durable.hidden(),
    };
    let prev = if from.0 == 0 {
        GENESIS
    } else {
        let before = Seq(from.0 - 1);
        let mut found = None;
        scan(conn, layout, run, before, bounds, |seq, _, hash| {
            if seq == before {
                found = Some(hash);
            }
            Ok(false)
        })?;
        match found {
            None => return Ok(Vec::new()),
            Some(hash) => Hash::try_from(hash.unwrap_or_default().as_slice()).map_err(|_| {
                crate::chain::TamperEvident {
                    run: run.clone(),
                    seq: before,
                }
            })?,
        }
    };
    let mut verifier = Verifier::new(run.clone(), from, prev);
    let mut envelopes = Vec::new();
    scan(conn, layout, run, from, bounds, |seq, bytes, hash| {
        let tampered = || crate::chain::TamperEvident {
            run: run.clone(),
            seq,
        };
        let (Some(bytes), Some(hash)) = (bytes, hash) else {
            return Err(tampered().into());
        };
        let hash = Hash::try_from(hash.as_slice()).map_err(|_| tampered())?;
        verifier.check(seq, &bytes, &hash)?;
        envelopes.push(decode_row(run, seq, &bytes)?);
        Ok(true)
    })?;
    Ok(envelopes)
}

/// Where a read's snapshot has its events: the run's events after the
/// index's mark lie past `tail_after` (the mark, or later when the writer
/// said where the run's tail begins: `tail.rs`), and `hidden` holds the
/// positions not yet synced.
#[derive(Clone, Copy)]
pub(super) struct Bounds {
    pub(super) tail_after: i64,
    pub(super) hidden: (i64, i64),
}

/// Hands `row` each of a run's rows from `from` on, in `seq` order, until
/// it answers `false`.
pub(super) fn scan(
    conn: &Connection,
    layout: Layout,
    run: &RunId,
    from: Seq,
    bounds: Bounds,
    mut row: impl FnMut(Seq, Option<Vec<u8>>, Option<Vec<u8>>) -> Result<bool, JournalError>,
) -> Result<(), JournalError> {
    let queries: &[&str] = match layout {
        Layout::ByRun => &[READ_BY_RUN],
        Layout::InArrivalOrder => &[READ_INDEXED, READ_TAIL],
    };
    let (synced, written) = bounds.hidden;
    for sql in queries {
        let mut statement = conn.prepare_cached(sql).map_err(storage)?;
        let mut rows = if *sql == READ_BY_RUN {
            statement.query(params![run.as_str(), seq_sql(from)?])
        } else {
            // Unused numbered parameters are allowed: `?3` serves the tail.
            statement.query(params![
                run.as_str(),
                seq_sql(from)?,
                bounds.tail_after,
                synced,
                written
            ])
        }
        .map_err(storage)?;
        while let Some(found) = rows.next().map_err(storage)? {
            let seq =
                Seq(u64::try_from(found.get::<_, i64>(0).map_err(storage)?).unwrap_or(u64::MAX));
            let bytes = stored_bytes(found.get_ref(1).map_err(storage)?);
            let hash = stored_bytes(found.get_ref(2).map_err(storage)?);
            if !row(seq, bytes, hash)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

pub(super) fn list_runs(
    conn: &Connection,
    layout: Layout,
) -> Result<Vec<RunSummary>, JournalError> {
    in_snapshot(conn, |conn| {
        let stored = summaries(
            conn.prepare_cached(
                "SELECT run_id, next_seq, status, title, created_ns, updated_ns FROM runs",
            )
            .map_err(storage)?,
            [],
        )?;
        // Newest first: sorted here, as the tail's runs join the rows.
        let mut runs = with_tail(conn, layout, stored)?;
        crate::store::newest_first(&mut runs);
        Ok(runs)
    })
}

/// `stored` (summaries of rows) with the runs the log's tail moved on
/// replaced by their heads, and the runs it created added.
pub(super) fn with_tail(
    conn: &Connection,
    layout: Layout,
    mut stored: Vec<RunSummary>,
) -> Result<Vec<RunSummary>, JournalError> {
    if layout == Layout::ByRun {
        return Ok(stored);
    }
    let mut moved = RunMap::default();
    fold_tail(conn, None, &mut moved)?;
    if moved.is_empty() {
        return Ok(stored);
    }
    stored.retain(|run| !moved.contains_key(&run.run_id));
    stored.extend(
        moved
            .into_iter()
            .map(|(run_id, head)| head.into_summary(run_id)),
    );
    Ok(stored)
}

/// Runs `read` in one read transaction, so everything it reads comes from
/// one snapshot (a row and the index's mark, say).
pub(super) fn in_snapshot<T>(
    conn: &Connection,
    read: impl FnOnce(&Connection) -> Result<T, JournalError>,
) -> Result<T, JournalError> {
    exec(conn, "BEGIN", []).map_err(storage)?;
    let result = read(conn);
    // Ending a read transaction cannot lose data, but a connection left
    // inside one would refuse the next BEGIN: roll back instead.
    if let Err(error) = exec(conn, "COMMIT", []) {
        tracing::warn!(%error, "ending a read transaction failed; rolling it back");
        conn.execute_batch("ROLLBACK").map_err(storage)?;
    }
    result
}

/// The summaries `statement` selects (`run_id, next_seq, status, title,
/// created_ns, updated_ns`) with `params`.
pub(super) fn summaries(
    mut statement: rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<RunSummary>, JournalError> {
    let rows = statement
        .query_map(params, |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .map_err(storage)?;
    rows.map(|row| {
        let (run, next_seq, status, title, created, updated) = row.map_err(storage)?;
        let run_id = stored_run_id(&run)?;
        Ok(RunSummary {
            status: Status::decode(&status).ok_or_else(|| JournalError::Corrupt {
                run: run_id.clone(),
                seq: Seq(0),
                reason: format!("unknown run status `{status}`"),
            })?,
            run_id,
            title,
            created_at: from_nanos(created),
            updated_at: from_nanos(updated),
            next_seq: Seq(u64::try_from(next_seq).unwrap_or_default()),
        })
    })
    .collect()
}
