//! The SQLite store on a disk that fills up, made real with the process's
//! file-size limit (`RLIMIT_FSIZE`): a write past it fails as it would on
//! a full filesystem. The limit is the whole process's, so this is a test
//! binary of its own with one test in it.

// Test code: a helper that unwraps fails the test on the line that broke.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Journal, JournalError, Seq};

use support::*;

/// Sets this process's file-size limit with util-linux's `prlimit`. A
/// write past it then fails with EFBIG, as on a full filesystem, once
/// SIGXFSZ (which would end the process) is caught: see [`catch_sigxfsz`].
fn limit_file_size(bytes: Option<u64>) {
    let soft = bytes.map_or_else(|| "unlimited".to_owned(), |b| b.to_string());
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--fsize={soft}:unlimited"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit failed: {status}");
}

/// Installs a handler for SIGXFSZ, so a write past the limit fails instead
/// of ending the process. The stream must be kept for the handler to stay.
fn catch_sigxfsz() -> tokio::signal::unix::Signal {
    const SIGXFSZ: i32 = 25;
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(SIGXFSZ)).unwrap()
}

fn files_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_commit_that_meets_a_full_disk_records_nothing_and_the_store_writes_again_once_there_is_room()
 {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let r = run("r");
    journal
        .append(&r, Seq(0), vec![created(), started("t1", "hello")])
        .await
        .unwrap();
    journal
        .probe()
        .await
        .expect("a store with room probes fine");

    // Room for a few small commits more, not for a large one: larger than
    // what the writer keeps written ahead of the log's frames, too.
    let _caught = catch_sigxfsz();
    limit_file_size(Some(files_size(dir.path()) + 64 * 1024));
    let big = "x".repeat(4 * 1024 * 1024);
    let refused = journal
        .append(&r, Seq(2), vec![turn_done("t1", &big)])
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, JournalError::Storage { message, .. } if message.contains("nothing was recorded")),
        "{refused:?}"
    );
    assert_eq!(
        journal.read(&r, Seq(0)).await.unwrap().len(),
        2,
        "the failed commit recorded nothing"
    );

    limit_file_size(None);
    journal.probe().await.expect("the store writes again");
    journal
        .append(&r, Seq(2), vec![turn_done("t1", &big)])
        .await
        .expect("the same append, once there is room");
    drop(journal);
    let reopened = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    let log = reopened.read(&r, Seq(0)).await.unwrap();
    assert_eq!(
        log.len(),
        3,
        "the log verifies and holds every acknowledged event"
    );
}
