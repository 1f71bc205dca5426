//! Deletion in the SQLite store: once acknowledged and the journal closed
//! cleanly, a deleted run's text is in no file of the journal, the pages
//! the oldest runs held are given back, and the other runs still verify.

use std::sync::Arc;

use spool_journal::conformance::{created, run, started};
use spool_journal::store::Deletion;
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Journal, Seq};

/// How many bytes of the journal's files hold `needle`.
fn found_in(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| {
            std::fs::read(entry.path())
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
        })
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

fn journal_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .map(|meta| meta.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_runs_text_is_in_no_journal_file_after_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    // Interleaved, as a server's runs are: the deleted runs' events share
    // pages with the kept ones'.
    let filler = "x".repeat(2_000);
    let (mut gone, mut kept) = (Vec::new(), Vec::new());
    for i in 0..150 {
        for (list, name, word) in [
            (&mut gone, "gone", "CONFIDENTIAL"),
            (&mut kept, "kept", "ordinary"),
        ] {
            let r = run(&format!("{name}-{i}"));
            journal
                .append(
                    &r,
                    Seq(0),
                    vec![created(), started("t1", &format!("{word}-{i} {filler}"))],
                )
                .await
                .unwrap();
            list.push(r);
        }
    }
    for r in &gone {
        let tombstone = journal
            .delete(
                r,
                Deletion {
                    by: "test".into(),
                    ..Deletion::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(tombstone.events, 2);
    }
    for r in &kept {
        assert_eq!(
            journal.read(r, Seq(0)).await.unwrap().len(),
            2,
            "a kept run is whole and its chain verifies"
        );
    }
    drop(journal);
    assert_eq!(
        found_in(dir.path(), b"CONFIDENTIAL"),
        Vec::<String>::new(),
        "no file of the journal holds a deleted run's text after a clean close"
    );
    assert!(
        !found_in(dir.path(), b"ordinary-149").is_empty(),
        "the search finds what is there"
    );
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(reopened.runs().await.unwrap().len(), kept.len());
    assert_eq!(
        reopened.tombstone(&gone[0]).await.unwrap().map(|t| t.by),
        Some("test".to_owned()),
        "the tombstones outlive a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_oldest_runs_gives_their_pages_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    // As retention finds them: the runs deleted are the oldest, their
    // events side by side before the newer runs'.
    let filler = "x".repeat(2_000);
    let mut old = Vec::new();
    for i in 0..300 {
        let r = run(&format!("run-{i}"));
        journal
            .append(
                &r,
                Seq(0),
                vec![created(), started("t1", &format!("{i} {filler}"))],
            )
            .await
            .unwrap();
        if i < 200 {
            old.push(r);
        }
    }
    // Closed cleanly each time: the file alone, its log emptied, so what
    // the deletions give back is measured apart from the log.
    drop(journal);
    let before = journal_bytes(dir.path());
    let journal = Arc::new(SqliteJournal::open(dir.path(), Options::default()).unwrap());
    for r in &old {
        journal.delete(r, Deletion::default()).await.unwrap();
    }
    drop(journal);
    let after = journal_bytes(dir.path());
    eprintln!(
        "journal file after clean closes: {before} bytes before deleting the oldest 200 of 300 runs, {after} after"
    );
    assert!(
        after < before / 2,
        "the pages the oldest runs held go back: {before} bytes before, {after} after"
    );
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    assert_eq!(reopened.runs().await.unwrap().len(), 100);
    assert_eq!(
        reopened.read(&run("run-299"), Seq(0)).await.unwrap().len(),
        2,
        "a kept run is whole and its chain verifies"
    );
}
