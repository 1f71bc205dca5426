//! The SQLite store's layout: events in arrival order with their index
//! written behind, runs' heads, a crash's unindexed tail, and the
//! migrations from earlier layouts.

use crate::sqlite::{
    PAST_ONE_INDEX, committed_wal_end, copy_as_crashed, stored_next_seqs, three_events,
};
use crate::support::*;
use rusqlite::Connection;
use spool_journal::store::sqlite::{FILE_NAME, Options, SqliteJournal};
use spool_journal::{Envelope, Journal, JournalError, RunId, Seq};

/// Appends `rounds` appends of ten events to each of three runs, the runs
/// taking turns, and returns every run's envelopes as acknowledged.
pub(crate) async fn interleaved(
    journal: &SqliteJournal,
    rounds: u64,
) -> Vec<(RunId, Vec<Envelope>)> {
    let mut logs: Vec<(RunId, Vec<Envelope>)> = ["a", "b", "c"]
        .iter()
        .map(|r| (run(r), Vec::new()))
        .collect();
    for round in 0..rounds {
        for (run, log) in &mut logs {
            let events = (0..10)
                .map(|k| {
                    if round == 0 && k == 0 {
                        created()
                    } else {
                        started(&format!("t{round}-{k}"), "x")
                    }
                })
                .collect();
            let appended = journal
                .append(run, Seq(log.len() as u64), events)
                .await
                .unwrap();
            log.extend(appended);
        }
    }
    logs
}

/// The index's mark and the last event's position, read beside the store.
fn index_mark(dir: &std::path::Path) -> (i64, i64) {
    let conn = Connection::open(dir.join(FILE_NAME)).unwrap();
    conn.query_row(
        "SELECT (SELECT through FROM indexed), (SELECT max(pos) FROM events)",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .unwrap()
}

/// Reads each run whole and from positions on both sides of the index's
/// mark, against what its appends returned.
pub(crate) async fn reads_match(journal: &SqliteJournal, logs: &[(RunId, Vec<Envelope>)]) {
    for (run, log) in logs {
        for from in [0, 1, 150, 345, 420, log.len() - 1, log.len()] {
            let read = journal.read(run, Seq(from as u64)).await.unwrap();
            assert_eq!(read, log[from..], "run {run} read from {from}");
        }
    }
}

#[tokio::test]
async fn runs_read_whole_across_the_index_written_behind_and_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let logs = interleaved(&journal, PAST_ONE_INDEX).await;
    let (through, last) = index_mark(dir.path());
    assert!(
        0 < through && through < last,
        "the index lags the commits: indexed through {through} of {last}"
    );
    reads_match(&journal, &logs).await;
    drop(journal);
    assert_eq!(
        index_mark(dir.path()),
        (last, last),
        "a clean stop indexes the tail"
    );
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    reads_match(&reopened, &logs).await;
}

#[tokio::test]
async fn an_unindexed_tail_left_by_a_crash_is_indexed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let logs = interleaved(
        &SqliteJournal::open(dir.path(), Options::default()).unwrap(),
        PAST_ONE_INDEX,
    )
    .await;
    // As a kill between a commit and its indexing leaves the file.
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute_batch(
        "DELETE FROM event_index WHERE pos > 200; UPDATE indexed SET through = 200;",
    )
    .unwrap();
    let read_only = SqliteJournal::open_read_only(dir.path()).unwrap();
    reads_match(&read_only, &logs).await;
    drop(read_only);
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let (through, last) = index_mark(dir.path());
    assert_eq!(through, last, "opening indexes the tail");
    let indexed: i64 = conn
        .query_row("SELECT count(*) FROM event_index", [], |row| row.get(0))
        .unwrap();
    assert_eq!(indexed, last);
    reads_match(&reopened, &logs).await;
}

/// The journal's layout version, read beside the store.
fn store_version(dir: &std::path::Path) -> String {
    Connection::open(dir.join(FILE_NAME))
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'store_version'",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

/// Appends one event to `run` where its acknowledged `log` ends, and
/// keeps it in `log`.
async fn append_after(journal: &SqliteJournal, run: &RunId, log: &mut Vec<Envelope>) {
    let appended = journal
        .append(run, Seq(log.len() as u64), vec![started("after", "x")])
        .await
        .unwrap();
    log.extend(appended);
}

/// Each run's next position as the log says: `logs`' lengths, by run.
pub(crate) fn log_lengths(logs: &[(RunId, Vec<Envelope>)]) -> Vec<(String, u64)> {
    logs.iter()
        .map(|(run, log)| (run.as_str().to_owned(), log.len() as u64))
        .collect()
}

/// What `journal` lists and subscribes at, by run, as `(run, next_seq)`.
pub(crate) async fn listed_heads(journal: &SqliteJournal) -> Vec<(String, u64)> {
    let mut listed: Vec<(String, u64)> = journal
        .runs()
        .await
        .unwrap()
        .into_iter()
        .map(|summary| (summary.run_id.as_str().to_owned(), summary.next_seq.0))
        .collect();
    listed.sort();
    for (run_id, next) in &listed {
        let positions = journal.subscribe(&run(run_id)).await.unwrap();
        assert_eq!(*positions.borrow(), Seq(*next), "run {run_id} subscribed");
    }
    listed
}

#[tokio::test]
async fn a_runs_head_is_written_behind_with_the_index_and_read_from_its_row_and_the_logs_tail() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let logs = interleaved(&journal, PAST_ONE_INDEX).await;
    let (through, last) = index_mark(dir.path());
    assert!(0 < through && through < last, "part of the log is a tail");
    let stored = stored_next_seqs(dir.path());
    let expected = log_lengths(&logs);
    assert!(
        stored.iter().zip(&expected).all(|(row, log)| row.1 < log.1),
        "the rows are as of the index's mark, behind the logs: {stored:?} against {expected:?}"
    );
    assert_eq!(
        listed_heads(&journal).await,
        expected,
        "the writing process"
    );
    let read_only = SqliteJournal::open_read_only(dir.path()).unwrap();
    assert_eq!(listed_heads(&read_only).await, expected, "another reader");
    let status = read_only.runs().await.unwrap()[0].status;
    assert_eq!(
        read_only.runs_with_status(status).await.unwrap().len(),
        3,
        "a listing by status reads the tail too"
    );
    drop(read_only);
    drop(journal);
    assert_eq!(
        stored_next_seqs(dir.path()),
        expected,
        "a clean stop writes the heads"
    );
}

#[tokio::test]
async fn heads_a_crash_left_behind_are_moved_on_from_the_log_at_open_and_appends_go_on_after_them()
{
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let journal = SqliteJournal::open(&live, Options::default()).unwrap();
    let mut logs = interleaved(&journal, PAST_ONE_INDEX).await;
    // The files as a kill now would leave them: heads as of the mark.
    let crashed = dir.path().join("crashed");
    copy_as_crashed(&live, &crashed, &["-wal", "-shm"]);
    drop(journal);
    let expected = log_lengths(&logs);
    assert_ne!(stored_next_seqs(&crashed), expected);

    let reopened = SqliteJournal::open(&crashed, Options::default()).unwrap();
    assert_eq!(
        stored_next_seqs(&crashed),
        expected,
        "opening writes the tail's heads"
    );
    assert_eq!(listed_heads(&reopened).await, expected);
    for (run, log) in &mut logs {
        append_after(&reopened, run, log).await;
    }
    reads_match(&reopened, &logs).await;
}

/// The first event after the index's mark that has a later one of its run
/// after it too: `(run_id, seq)`.
fn a_tail_event_with_a_successor(dir: &std::path::Path) -> (String, i64) {
    Connection::open(dir.join(FILE_NAME))
        .unwrap()
        .query_row(
            "SELECT run_id, seq FROM events e WHERE pos > (SELECT through FROM indexed)
                 AND EXISTS (SELECT 1 FROM events l WHERE l.run_id = e.run_id AND l.pos > e.pos)
             ORDER BY pos LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
}

#[tokio::test]
async fn a_changed_or_missing_event_in_the_tail_a_crash_left_is_refused_at_open_not_folded_into_a_head()
 {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let journal = SqliteJournal::open(&live, Options::default()).unwrap();
    interleaved(&journal, PAST_ONE_INDEX).await;
    let changed = dir.path().join("changed");
    let missing = dir.path().join("missing");
    copy_as_crashed(&live, &changed, &["-wal", "-shm"]);
    copy_as_crashed(&live, &missing, &["-wal", "-shm"]);
    drop(journal);

    let (run_id, seq) = a_tail_event_with_a_successor(&changed);
    Connection::open(changed.join(FILE_NAME))
        .unwrap()
        .execute(
            "UPDATE events SET body = replace(body, '\"x\"', '\"y\"') WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![run_id, seq],
        )
        .unwrap();
    match SqliteJournal::open(&changed, Options::default()) {
        Err(JournalError::TamperEvident(e)) => {
            assert_eq!((e.run.as_str(), e.seq), (run_id.as_str(), Seq(seq as u64)));
        }
        other => panic!(
            "a changed tail event must be refused, got {:?}",
            other.err()
        ),
    }

    let (run_id, seq) = a_tail_event_with_a_successor(&missing);
    Connection::open(missing.join(FILE_NAME))
        .unwrap()
        .execute(
            "DELETE FROM events WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![run_id, seq],
        )
        .unwrap();
    match SqliteJournal::open(&missing, Options::default()) {
        Err(JournalError::Corrupt { run, seq: at, .. }) => {
            assert_eq!((run.as_str(), at), (run_id.as_str(), Seq(seq as u64 + 1)));
        }
        other => panic!("a gap in the tail must be refused, got {:?}", other.err()),
    }
}

/// Puts a journal of this layout back in version 2's: the same tables, but
/// every row counting the tail too (version 2 wrote heads with each commit).
fn to_layout_2(dir: &std::path::Path, through: i64) {
    Connection::open(dir.join(FILE_NAME))
        .unwrap()
        .execute(
            "UPDATE meta SET value = '2' WHERE key = 'store_version'",
            [],
        )
        .unwrap();
    Connection::open(dir.join(FILE_NAME))
        .unwrap()
        .execute_batch(&format!(
            "DELETE FROM event_index WHERE pos > {through}; UPDATE indexed SET through = {through};"
        ))
        .unwrap();
}

#[tokio::test]
async fn a_version_2_journal_whose_rows_count_its_tail_is_read_as_it_is_and_migrated_to_version_3()
{
    let dir = tempfile::tempdir().unwrap();
    let mut logs = interleaved(
        &SqliteJournal::open(dir.path(), Options::default()).unwrap(),
        PAST_ONE_INDEX,
    )
    .await;
    to_layout_2(dir.path(), 200);
    let expected = log_lengths(&logs);
    assert_eq!(stored_next_seqs(dir.path()), expected);
    let read_only = SqliteJournal::open_read_only(dir.path()).unwrap();
    assert_eq!(listed_heads(&read_only).await, expected);
    reads_match(&read_only, &logs).await;
    drop(read_only);

    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store_version(dir.path()), "3");
    assert_eq!(listed_heads(&journal).await, expected);
    let (run, log) = &mut logs[2];
    append_after(&journal, run, log).await;
    reads_match(&journal, &logs).await;
}

/// Puts a journal back in the layout of version 1: events in one
/// `(run_id, seq)` B-tree, and no `store_version`.
fn to_layout_1(dir: &std::path::Path) {
    let conn = Connection::open(dir.join(FILE_NAME)).unwrap();
    conn.execute_batch(
        "BEGIN;
         CREATE TABLE events_v1 (
             run_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             body BLOB NOT NULL,
             hash BLOB NOT NULL,
             PRIMARY KEY (run_id, seq)
         ) WITHOUT ROWID;
         INSERT INTO events_v1 SELECT run_id, seq, body, hash FROM events;
         DROP TABLE events; DROP TABLE event_index; DROP TABLE indexed;
         ALTER TABLE events_v1 RENAME TO events;
         DELETE FROM meta WHERE key = 'store_version';
         COMMIT;",
    )
    .unwrap();
}

#[tokio::test]
async fn a_version_1_journal_is_read_as_it_is_read_only_and_migrated_when_opened_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut logs = interleaved(
        &SqliteJournal::open(dir.path(), Options::default()).unwrap(),
        PAST_ONE_INDEX,
    )
    .await;
    to_layout_1(dir.path());
    let read_only = SqliteJournal::open_read_only(dir.path()).unwrap();
    reads_match(&read_only, &logs).await;
    drop(read_only);

    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store_version(dir.path()), "3");
    reads_match(&journal, &logs).await;
    // The chains go on where they stopped.
    let (run, log) = &mut logs[1];
    append_after(&journal, run, log).await;
    reads_match(&journal, &logs).await;
}

#[tokio::test]
async fn subscribing_to_a_run_this_process_wrote_reads_nothing_and_another_run_reads_its_head() {
    let dir = tempfile::tempdir().unwrap();
    drop(three_events(dir.path()).await);
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    journal
        .append(&run("new"), Seq(0), vec![created()])
        .await
        .unwrap();
    let before = journal.stats().reads;
    let positions = journal.subscribe(&run("new")).await.unwrap();
    assert_eq!(*positions.borrow(), Seq(1));
    assert_eq!(journal.stats().reads, before, "its head is known");
    // Written before this open: its head is read.
    let positions = journal.subscribe(&run("r")).await.unwrap();
    assert_eq!(*positions.borrow(), Seq(3));
    assert_eq!(journal.stats().reads, before + 1);
}

#[tokio::test]
async fn a_journal_of_a_newer_layout_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    drop(three_events(dir.path()).await);
    Connection::open(dir.path().join(FILE_NAME))
        .unwrap()
        .execute(
            "UPDATE meta SET value = '4' WHERE key = 'store_version'",
            [],
        )
        .unwrap();
    let error = SqliteJournal::open(dir.path(), Options::default()).unwrap_err();
    assert!(
        matches!(
            error,
            JournalError::NewerSchema {
                found: 4,
                supported: 3
            }
        ),
        "{error}"
    );
    assert!(
        matches!(
            SqliteJournal::open_read_only(dir.path()),
            Err(JournalError::NewerSchema { found: 4, .. })
        ),
        "a read-only open refuses it too"
    );
    assert_eq!(store_version(dir.path()), "4", "nothing was migrated");
}

/// The runs were once kept in update order by an index every commit
/// rewrote; a journal that has it loses it when opened for writing, and
/// the listing is still newest first.
#[tokio::test]
async fn a_journal_with_the_old_update_order_index_drops_it_and_still_lists_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    for name in ["a", "b", "c"] {
        journal
            .append(&run(name), Seq(0), vec![created()])
            .await
            .unwrap();
    }
    // `a` is the latest updated.
    journal
        .append(&run("a"), Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    drop(journal);
    let index_exists = |dir: &std::path::Path| -> bool {
        Connection::open(dir.join(FILE_NAME))
            .unwrap()
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'runs_updated'",
                [],
                |row| row.get(0),
            )
            .unwrap()
    };
    assert!(!index_exists(dir.path()), "a new journal has no such index");
    Connection::open(dir.path().join(FILE_NAME))
        .unwrap()
        .execute_batch("CREATE INDEX runs_updated ON runs (updated_ns)")
        .unwrap();

    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert!(!index_exists(dir.path()), "the open dropped it");
    let listed: Vec<String> = journal
        .runs()
        .await
        .unwrap()
        .into_iter()
        .map(|summary| summary.run_id.to_string())
        .collect();
    assert_eq!(listed[0], "a", "{listed:?}");
    assert_eq!(listed.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_log_is_copied_into_the_database_behind_the_writer_and_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        durability: spool_journal::store::sqlite::Durability::LoseRecentCommitsOnPowerLoss,
        ..Options::default()
    };
    let journal = SqliteJournal::open(dir.path(), options).unwrap();
    // Events of two pages each, so the log passes the checkpoint window
    // (10 000 pages) in a few thousand appends.
    let text = "x".repeat(8_000);
    let mut logs: Vec<(RunId, Vec<Envelope>)> = Vec::new();
    let mut longest = 0;
    let mut started_over = false;
    for n in 0..40_000_u64 {
        let r = run(&format!("long-{}", n % 8));
        let at = n / 8;
        let event = if at == 0 {
            created()
        } else {
            started(&format!("t{at}"), &text)
        };
        let appended = journal.append(&r, Seq(at), vec![event]).await.unwrap();
        match logs.iter_mut().find(|(id, _)| *id == r) {
            Some((_, log)) => log.extend(appended),
            None => logs.push((r, appended)),
        }
        let end = committed_wal_end(dir.path());
        if end < longest {
            started_over = true;
            break;
        }
        longest = end;
    }
    assert!(
        started_over,
        "the log started over after reaching {longest} bytes"
    );
    let stats = journal.stats();
    assert!(
        stats.checkpoints >= 1,
        "the checkpointer's thread copied the log: {stats:?}"
    );
    // The writer copies only what the thread has not yet: the log ends
    // near the window, well under the size a log is cut back to.
    assert!(
        longest < 64 * 1024 * 1024,
        "the log reached {longest} bytes"
    );
    drop(journal);
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    for (run, log) in &logs {
        assert_eq!(&reopened.read(run, Seq(0)).await.unwrap(), log, "run {run}");
    }
}
