//! The SQLite store's own guarantees: its file, schema versioning, tamper
//! evidence, read-only access beside a writer, reopening, and its layout
//! (events in arrival order, indexed behind; version 1 migrated).

use rusqlite::Connection;
use spool_journal::store::sqlite::{FILE_NAME, Options, SqliteJournal};
use spool_journal::{Journal, JournalError, Seq};

use crate::layout::{interleaved, listed_heads, log_lengths, reads_match};
use crate::support::*;

pub(crate) async fn three_events(dir: &std::path::Path) -> SqliteJournal {
    let journal = SqliteJournal::open(dir, Options::default()).unwrap();
    journal
        .append(
            &run("r"),
            Seq(0),
            vec![created(), started("t1", "hello"), turn_done("t1", "hi")],
        )
        .await
        .unwrap();
    journal
}

#[tokio::test]
async fn the_journal_lives_in_one_file_named_journal_db_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let journal = three_events(&dir.path().join("nested")).await;
    assert_eq!(journal.path(), dir.path().join("nested").join(FILE_NAME));
    assert!(journal.path().exists());
}

#[tokio::test]
async fn a_closed_journal_leaves_its_write_ahead_log_empty() {
    let dir = tempfile::tempdir().unwrap();
    let journal = three_events(dir.path()).await;
    // A reader open beside the writer, as a server's are.
    journal.read(&run("r"), Seq(0)).await.unwrap();
    for turn in 0..50 {
        let seq = Seq(3 + turn * 2);
        journal
            .append(
                &run("r"),
                seq,
                vec![
                    started(&format!("t{turn}x"), "again"),
                    turn_done(&format!("t{turn}x"), "done"),
                ],
            )
            .await
            .unwrap();
    }
    let wal = dir.path().join(format!("{FILE_NAME}-wal"));
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) > 0,
        "the log holds the appends while the journal is open"
    );
    drop(journal);
    assert_eq!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()),
        0,
        "emptied at close"
    );
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(reopened.read(&run("r"), Seq(0)).await.unwrap().len(), 103);
}

#[tokio::test]
async fn acknowledged_appends_are_there_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let before = three_events(dir.path())
        .await
        .read(&run("r"), Seq(0))
        .await
        .unwrap();
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(reopened.read(&run("r"), Seq(0)).await.unwrap(), before);
    reopened
        .append(&run("r"), Seq(3), vec![started("t2", "again")])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_journal_from_a_newer_schema_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(three_events(dir.path()).await);
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let error = SqliteJournal::open(dir.path(), Options::default()).unwrap_err();
    assert!(
        matches!(
            error,
            JournalError::NewerSchema {
                found: 2,
                supported: 1
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("upgrade Spool"), "{error}");
    let read_only = SqliteJournal::open_read_only(dir.path());
    assert!(
        matches!(read_only, Err(JournalError::NewerSchema { .. })),
        "{:?}",
        read_only.err()
    );
}

#[tokio::test]
async fn a_newer_schema_is_named_by_a_read_only_open_even_with_a_write_ahead_log_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    drop(three_events(dir.path()).await);
    // A writer still has the file open: its write-ahead log is not empty.
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;")
        .unwrap();
    conn.execute(
        "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    let wal = dir.path().join(format!("{FILE_NAME}-wal"));
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    let read_only = SqliteJournal::open_read_only(dir.path());
    assert!(
        matches!(read_only, Err(JournalError::NewerSchema { found: 2, .. })),
        "{:?}",
        read_only.err()
    );
    drop(conn);
}

#[tokio::test]
async fn a_changed_or_missing_row_is_reported_as_tamper_evident_not_served() {
    let dir = tempfile::tempdir().unwrap();
    drop(three_events(dir.path()).await);
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE events SET body = replace(body, 'hello', 'HELLO') WHERE run_id = 'r' AND seq = 1",
        [],
    )
    .unwrap();
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    match journal.read(&run("r"), Seq(0)).await {
        Err(JournalError::TamperEvident(e)) => assert_eq!(e.seq, Seq(1)),
        other => panic!("a changed row must be reported, got {other:?}"),
    }
    match journal.read(&run("r"), Seq(1)).await {
        Err(JournalError::TamperEvident(e)) => {
            assert_eq!(e.seq, Seq(1), "a read from the bad row reports it too")
        }
        other => panic!("a changed row must be reported, got {other:?}"),
    }
    conn.execute("DELETE FROM events WHERE run_id = 'r' AND seq = 1", [])
        .unwrap();
    match journal.read(&run("r"), Seq(0)).await {
        Err(JournalError::TamperEvident(e)) => {
            assert_eq!(e.seq, Seq(1), "a gap is reported where it starts")
        }
        other => panic!("a missing row must be reported, got {other:?}"),
    }
}

#[tokio::test]
async fn a_read_only_journal_reads_beside_a_writer_and_refuses_appends() {
    let dir = tempfile::tempdir().unwrap();
    let writer = three_events(dir.path()).await;
    let reader = SqliteJournal::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.read(&run("r"), Seq(0)).await.unwrap().len(), 3);
    writer
        .append(&run("r"), Seq(3), vec![started("t2", "more")])
        .await
        .unwrap();
    assert_eq!(
        reader.read(&run("r"), Seq(0)).await.unwrap().len(),
        4,
        "the reader sees the writer's commits"
    );
    assert_eq!(reader.runs().await.unwrap().len(), 1);
    assert!(matches!(
        reader
            .append(&run("r"), Seq(4), vec![started("t3", "x")])
            .await,
        Err(JournalError::ReadOnly)
    ));
}

#[tokio::test]
async fn opening_a_directory_without_a_journal_read_only_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let error = SqliteJournal::open_read_only(dir.path()).unwrap_err();
    assert!(error.to_string().contains("no journal"), "{error}");
}

#[tokio::test]
async fn a_file_that_is_not_a_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    conn.execute_batch("CREATE TABLE something_else (x INTEGER)")
        .unwrap();
    drop(conn);
    assert!(SqliteJournal::open_read_only(dir.path()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let journal = std::sync::Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    let mut tasks = Vec::new();
    for i in 0..64 {
        let journal = std::sync::Arc::clone(&journal);
        tasks.push(tokio::spawn(async move {
            let r = run(&format!("group-{i}"));
            journal.append(&r, Seq(0), vec![created()]).await.unwrap();
            for n in 1..20 {
                journal
                    .append(&r, Seq(n), vec![started("t", "x")])
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stats = journal.stats();
    assert_eq!(stats.operations, 64 * 20, "every append was one operation");
    // While one commit syncs, the other appenders' next appends queue up
    // and go into the following commits, which the next sync makes
    // durable together: what appends share is the sync.
    assert!(stats.syncs >= 1, "appends were synced: {stats:?}");
    assert!(
        stats.operations >= 2 * stats.syncs,
        "appends from 64 runs shared syncs: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_on_the_same_file_does_not_fork_a_runs_chain() {
    let dir = tempfile::tempdir().unwrap();
    let first = three_events(dir.path()).await;
    let second = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    second
        .append(
            &run("r"),
            Seq(3),
            vec![started("t2", "from the second writer")],
        )
        .await
        .unwrap();
    // The first writer cached the run's head at seq 3; it must notice the
    // other commit rather than write a second seq 3 or a forked chain.
    assert!(matches!(
        first
            .append(&run("r"), Seq(3), vec![started("t2", "stale")])
            .await,
        Err(JournalError::Conflict { actual: Seq(4), .. })
    ));
    first
        .append(
            &run("r"),
            Seq(4),
            vec![started("t3", "from the first writer")],
        )
        .await
        .unwrap();
    let log = second.read(&run("r"), Seq(0)).await.unwrap();
    assert_eq!(
        log.len(),
        5,
        "both writers' events are in one verified chain"
    );
    // Each writer writes the heads of what it appended when it indexes;
    // the second, stopping last, must not put back the head it knew.
    drop(first);
    drop(second);
    assert_eq!(stored_next_seqs(dir.path()), vec![("r".to_owned(), 5)]);
    let listed = SqliteJournal::open_read_only(dir.path())
        .unwrap()
        .runs()
        .await
        .unwrap();
    assert_eq!(listed[0].next_seq, Seq(5));
}

#[tokio::test]
async fn a_read_after_the_index_mark_finds_the_events_another_writer_appended_since() {
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let second = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    // The first writer brings run x into the tail: its reads of x now
    // scan from x's first event there, and of any other run from past
    // its own last event.
    let mut x = first
        .append(&run("x"), Seq(0), vec![created()])
        .await
        .unwrap();
    // The second writer appends after it, to x and to a run y of its own,
    // and the first writer commits nothing meanwhile.
    x.extend(
        second
            .append(&run("x"), Seq(1), vec![started("t1", "from the second")])
            .await
            .unwrap(),
    );
    let y = second
        .append(&run("y"), Seq(0), vec![created(), started("t1", "y")])
        .await
        .unwrap();
    for journal in [&first, &second] {
        assert_eq!(journal.read(&run("x"), Seq(0)).await.unwrap(), x);
        assert_eq!(journal.read(&run("x"), Seq(1)).await.unwrap(), x[1..]);
        assert_eq!(journal.read(&run("y"), Seq(0)).await.unwrap(), y);
    }
    // Once the first writer commits again it has seen the other's
    // commits, and its reads scan from the mark until its next index.
    x.extend(
        first
            .append(&run("x"), Seq(2), vec![started("t2", "from the first")])
            .await
            .unwrap(),
    );
    for journal in [&first, &second] {
        assert_eq!(journal.read(&run("x"), Seq(0)).await.unwrap(), x);
        assert_eq!(journal.read(&run("y"), Seq(1)).await.unwrap(), y[1..]);
    }
}

/// Each run's `next_seq` as its row in `runs` holds it, read beside the
/// store, by run.
pub(crate) fn stored_next_seqs(dir: &std::path::Path) -> Vec<(String, u64)> {
    Connection::open(dir.join(FILE_NAME))
        .unwrap()
        .prepare("SELECT run_id, next_seq FROM runs ORDER BY run_id")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn an_owner_claim_refuses_a_second_claim_naming_the_holder_until_dropped() {
    use spool_journal::store::sqlite::Owner;
    let dir = tempfile::tempdir().unwrap();
    let first = Owner::claim(dir.path()).unwrap();
    match Owner::claim(dir.path()) {
        Err(JournalError::InUse { dir: held, holder }) => {
            assert_eq!(held, dir.path());
            assert_eq!(holder, Some(std::process::id()));
        }
        other => panic!("a second claim was not refused: {other:?}"),
    }
    drop(first);
    Owner::claim(dir.path()).expect("the claim is free once dropped");
}

#[test]
fn an_owner_claim_over_a_longer_holders_id_leaves_only_its_own() {
    use spool_journal::store::sqlite::{OWNER_FILE, Owner};
    let dir = tempfile::tempdir().unwrap();
    // A process before this one, with an id longer than any this one has.
    std::fs::write(dir.path().join(OWNER_FILE), "123456789012345678901234").unwrap();
    let claim = Owner::claim(dir.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join(OWNER_FILE)).unwrap(),
        std::process::id().to_string()
    );
    drop(claim);
}

/// A journal opened as a one-shot process opens it: small logs are left at
/// close.
fn keeping_small_logs() -> Options {
    Options {
        keep_wal_below: spool_journal::store::sqlite::KEEP_WAL_BELOW,
        ..Options::default()
    }
}

#[tokio::test]
async fn a_journal_that_keeps_small_logs_leaves_its_log_at_close_and_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join(format!("{FILE_NAME}-wal"));
    let journal = SqliteJournal::open(dir.path(), keeping_small_logs()).unwrap();
    journal
        .append(&run("r"), Seq(0), vec![created(), started("t1", "hello")])
        .await
        .unwrap();
    // Readers open beside the writer close after it: none may empty the
    // log either.
    journal.read(&run("r"), Seq(0)).await.unwrap();
    drop(journal);
    let left = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(left > 0, "the log is left at close");
    let reopened = SqliteJournal::open(dir.path(), keeping_small_logs()).unwrap();
    assert_eq!(reopened.read(&run("r"), Seq(0)).await.unwrap().len(), 2);
    reopened
        .append(&run("r"), Seq(2), vec![turn_done("t1", "hi")])
        .await
        .unwrap();
    drop(reopened);
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) > left,
        "the next process appended to the log"
    );
    let read_only = SqliteJournal::open_read_only(dir.path()).unwrap();
    assert_eq!(read_only.read(&run("r"), Seq(0)).await.unwrap().len(), 3);
}

#[tokio::test]
async fn a_log_that_reached_the_size_kept_is_emptied_at_close_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join(format!("{FILE_NAME}-wal"));
    let options = Options {
        keep_wal_below: 4096,
        ..Options::default()
    };
    let journal = SqliteJournal::open(dir.path(), options).unwrap();
    journal
        .append(&run("r"), Seq(0), vec![created(), started("t1", "hello")])
        .await
        .unwrap();
    journal.read(&run("r"), Seq(0)).await.unwrap();
    assert!(std::fs::metadata(&wal).unwrap().len() >= 4096);
    drop(journal);
    assert_eq!(std::fs::metadata(&wal).map_or(0, |m| m.len()), 0);
    let reopened = SqliteJournal::open_read_only(dir.path()).unwrap();
    assert_eq!(reopened.read(&run("r"), Seq(0)).await.unwrap().len(), 2);
}

/// Copies the journal's files, as a crash would leave them, into `to`:
/// the database, and those of its log and index that `keep` names.
pub(crate) fn copy_as_crashed(from: &std::path::Path, to: &std::path::Path, keep: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for suffix in std::iter::once("").chain(keep.iter().copied()) {
        let name = format!("{FILE_NAME}{suffix}");
        std::fs::copy(from.join(&name), to.join(&name)).unwrap();
    }
}

#[tokio::test]
async fn a_journal_whose_wal_went_missing_after_a_crash_is_refused_rather_than_opened_older() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let journal = three_events(&live).await;
    let expected = journal.read(&run("r"), Seq(0)).await.unwrap();

    // Everything a crash leaves: opens, with every acknowledged event.
    let whole = dir.path().join("whole");
    copy_as_crashed(&live, &whole, &["-wal", "-shm"]);
    let reopened = SqliteJournal::open(&whole, Options::default()).unwrap();
    assert_eq!(reopened.read(&run("r"), Seq(0)).await.unwrap(), expected);

    // The log deleted by hand, its index left: refused, by the writer and
    // by a reader, saying which file and what to do.
    let deleted = dir.path().join("deleted");
    copy_as_crashed(&live, &deleted, &["-shm"]);
    for error in [
        SqliteJournal::open(&deleted, Options::default()).unwrap_err(),
        SqliteJournal::open_read_only(&deleted).unwrap_err(),
    ] {
        assert!(
            matches!(error, JournalError::WalMissing { found: 0, .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("journal.db-wal is missing") && message.contains("Put the file back"),
            "{message}"
        );
    }

    // The log cut short of its committed frames (its file may run on past
    // them, written ahead): refused too.
    let cut = dir.path().join("cut");
    copy_as_crashed(&live, &cut, &["-wal", "-shm"]);
    let wal = cut.join(format!("{FILE_NAME}-wal"));
    let short = committed_wal_end(&cut) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(short)
        .unwrap();
    let error = SqliteJournal::open(&cut, Options::default()).unwrap_err();
    assert!(
        matches!(error, JournalError::WalMissing { found, .. } if found == short),
        "{error:?}"
    );
    drop(journal);
}

/// Where the log's committed frames end, by its index's header (the
/// layout SQLite documents: frames at byte 16, page size at 14).
pub(crate) fn committed_wal_end(dir: &std::path::Path) -> u64 {
    let header = std::fs::read(dir.join(format!("{FILE_NAME}-shm"))).unwrap();
    let frames = u64::from(u32::from_ne_bytes(header[16..20].try_into().unwrap()));
    let page = u64::from(u16::from_ne_bytes(header[14..16].try_into().unwrap()));
    32 + frames * (24 + page)
}

#[tokio::test]
async fn a_servers_log_file_is_written_ahead_of_its_frames_and_a_crash_there_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let journal = SqliteJournal::open(&live, Options::default()).unwrap();
    let logs = interleaved(&journal, PAST_ONE_INDEX).await;
    let wal = live.join(format!("{FILE_NAME}-wal"));
    let (len, end) = (
        std::fs::metadata(&wal).unwrap().len(),
        committed_wal_end(&live),
    );
    assert!(
        len >= end + 512 * 1024,
        "the file runs {len} bytes, its frames {end}: written ahead"
    );
    // A kill now leaves zeros past the last frame: no frame to SQLite.
    let crashed = dir.path().join("crashed");
    copy_as_crashed(&live, &crashed, &["-wal", "-shm"]);
    drop(journal);
    std::fs::remove_file(crashed.join(format!("{FILE_NAME}-shm"))).unwrap();
    let read_only = SqliteJournal::open_read_only(&crashed).unwrap();
    reads_match(&read_only, &logs).await;
    drop(read_only);
    let reopened = SqliteJournal::open(&crashed, Options::default()).unwrap();
    reads_match(&reopened, &logs).await;
    assert_eq!(listed_heads(&reopened).await, log_lengths(&logs));
}

#[tokio::test]
async fn a_journal_that_keeps_small_logs_writes_no_log_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path(), keeping_small_logs()).unwrap();
    interleaved(&journal, 4).await;
    let len = std::fs::metadata(dir.path().join(format!("{FILE_NAME}-wal")))
        .unwrap()
        .len();
    assert_eq!(
        len,
        committed_wal_end(dir.path()),
        "its size says whether the next process empties it"
    );
}

#[test]
fn a_storage_error_keeps_sqlites_own_error_as_its_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(spool_journal::store::sqlite::FILE_NAME),
        vec![0x42; 8192],
    )
    .unwrap();
    let error = spool_journal::store::sqlite::SqliteJournal::open(
        dir.path(),
        spool_journal::store::sqlite::Options::default(),
    )
    .unwrap_err();
    let spool_journal::JournalError::Storage { message, .. } = &error else {
        panic!("a file that is not a database is a storage error: {error}");
    };
    let source = std::error::Error::source(&error).expect("the engine's error is the source");
    assert!(
        source.downcast_ref::<rusqlite::Error>().is_some(),
        "{source:?}"
    );
    assert!(
        message.contains(&source.to_string()),
        "the message says it too: {message}"
    );
}

/// Rounds of [`interleaved`] that make more events (1 440) than one batch
/// of the index written behind (1 024), so part of each run is indexed and
/// part is still in the tail.
pub(crate) const PAST_ONE_INDEX: u64 = 48;
