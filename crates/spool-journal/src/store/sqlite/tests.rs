//! The SQLite store's own tests: its layout, migrations, writer and
//! pool, beside the conformance suite every store passes.

use super::*;

/// Records `run`'s creation.
async fn create(journal: &SqliteJournal, run: &RunId) {
    journal
        .append(
            run,
            Seq(0),
            vec![Event::RunCreated(crate::event::RunCreated::default())],
        )
        .await
        .unwrap();
}

/// What a journal on a read-only filesystem is read through, tried
/// where the filesystem is writable (a test cannot mount one): a
/// stopped journal in a directory whose name needs escaping in a URI
/// reads the same through the immutable pool as through a plain one.
#[test]
fn a_stopped_journal_reads_the_same_opened_immutable_under_any_directory_name() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("a?b#c%d é");
    let tokio = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let run = RunId::new("r").unwrap();
    tokio.block_on(async {
        let journal = SqliteJournal::open(&dir, Options::default()).unwrap();
        create(&journal, &run).await;
    });
    let path = dir.join(FILE_NAME);
    // As a writer that stopped cleanly leaves it: everything in the
    // file, the write-ahead log empty.
    Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let mut pool = ReadPool::new(path.clone(), true);
    pool.immutable = true;
    let conn = pool.take().unwrap();
    let layout = check_schema(&conn).unwrap();
    let immutable = list_runs(&conn, layout).unwrap();
    let plain = list_runs(&ReadPool::new(path, true).take().unwrap(), layout).unwrap();
    assert_eq!(immutable.len(), 1);
    assert_eq!(immutable, plain);
}

/// How long a test waits for what it expects before it fails.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// A sync the test controls: it passes at once until `hold` is set,
/// then says it began and waits to be let go; with `fail` set it
/// fails as a disk would.
struct Gate {
    hold: Arc<std::sync::atomic::AtomicBool>,
    fail: Arc<std::sync::atomic::AtomicBool>,
    began: std::sync::mpsc::Receiver<()>,
    go: std::sync::mpsc::Sender<()>,
}

impl Gate {
    fn wait_until_a_sync_began(&self) {
        self.began
            .recv_timeout(PATIENCE)
            .expect("a sync began in time");
    }

    fn let_one_sync_go(&self) {
        self.go.send(()).unwrap();
    }
}

fn gated(dir: &Path, options: Options) -> (SqliteJournal, Gate) {
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (began_sender, began) = std::sync::mpsc::channel();
    let (go, go_receiver) = std::sync::mpsc::channel::<()>();
    let counters = Arc::new(Counters::default());
    let sync: SyncFn = Box::new({
        let (hold, fail) = (Arc::clone(&hold), Arc::clone(&fail));
        move || {
            if fail.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("the disk is gone"));
            }
            if hold.load(Ordering::SeqCst) {
                let _ = began_sender.send(());
                let _ = go_receiver.recv();
            }
            Ok(())
        }
    });
    let journal =
        SqliteJournal::open_syncing(&dir.join(FILE_NAME), options, counters, sync).unwrap();
    let gate = Gate {
        hold,
        fail,
        began,
        go,
    };
    (journal, gate)
}

fn started(n: u64) -> Event {
    Event::TurnStarted(crate::event::TurnStarted {
        turn_id: crate::id::TurnId::new(format!("t{n}")).unwrap(),
        input: "hello".into(),
        context: Vec::new(),
        policy: spool_wire::run::TurnPolicy::Steer,
        from_queue: None,
        operation_id: None,
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An event SQLite has committed is not read, nor announced, until
/// the sync that makes it durable returns: a power loss before then
/// could take it back, and a stream that had shown it would then
/// contradict the run recovered after it.
#[test]
fn an_event_is_read_and_announced_only_once_its_commit_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, gate) = gated(dir.path(), Options::default());
    let journal = Arc::new(journal);
    // Dropped before the journal, should the test fail: a held sync
    // then goes on, and the journal's threads can stop.
    let gate = gate;
    let run = RunId::new("r").unwrap();
    runtime().block_on(async {
        create(&journal, &run).await;
        let mut announced = journal.subscribe(&run).await.unwrap();
        assert_eq!(*announced.borrow_and_update(), Seq(1));
        gate.hold.store(true, Ordering::SeqCst);
        let append = tokio::spawn({
            let (journal, run) = (Arc::clone(&journal), run.clone());
            async move { journal.append(&run, Seq(1), vec![started(1)]).await }
        });
        gate.wait_until_a_sync_began();
        // Committed: the file holds the row for any SQLite reader.
        let rows: i64 = Connection::open(dir.path().join(FILE_NAME))
            .unwrap()
            .query_row(
                "SELECT count(*) FROM events WHERE run_id = 'r'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(rows, 2, "the commit is in the file before its sync");
        let read = journal.read(&run, Seq(0)).await.unwrap();
        assert_eq!(read.len(), 1, "only the synced event is read");
        assert!(journal.read(&run, Seq(1)).await.unwrap().is_empty());
        assert!(!announced.has_changed().unwrap(), "nothing announced yet");
        gate.hold.store(false, Ordering::SeqCst);
        gate.let_one_sync_go();
        let envelopes = append.await.unwrap().unwrap();
        assert_eq!(envelopes[0].seq, Seq(1));
        tokio::time::timeout(PATIENCE, announced.wait_for(|next| *next == Seq(2)))
            .await
            .expect("announced once synced")
            .unwrap();
        assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 2);
    });
}

/// What the journal held when it was opened is durable: its events
/// are read while the first commit of this process syncs.
#[test]
fn events_from_before_the_open_are_read_while_the_first_commit_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let old = RunId::new("old").unwrap();
    runtime().block_on(async {
        let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
        create(&journal, &old).await;
    });
    let (journal, gate) = gated(dir.path(), Options::default());
    let journal = Arc::new(journal);
    let gate = gate;
    runtime().block_on(async {
        gate.hold.store(true, Ordering::SeqCst);
        let append = tokio::spawn({
            let journal = Arc::clone(&journal);
            async move { create(&journal, &RunId::new("new").unwrap()).await }
        });
        gate.wait_until_a_sync_began();
        assert_eq!(journal.read(&old, Seq(0)).await.unwrap().len(), 1);
        gate.hold.store(false, Ordering::SeqCst);
        gate.let_one_sync_go();
        append.await.unwrap();
    });
}

/// While the syncer syncs one commit, the writer makes the next: a
/// commit costs the larger of SQLite's work and the sync, not both.
#[test]
fn the_writer_commits_while_the_commit_before_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        max_batch: 1,
        ..Options::default()
    };
    let (journal, gate) = gated(dir.path(), options);
    let journal = Arc::new(journal);
    // Dropped before the journal, should the test fail: a held sync
    // then goes on, and the journal's threads can stop.
    let gate = gate;
    let runs: Vec<RunId> = (0..3)
        .map(|i| RunId::new(format!("r{i}")).unwrap())
        .collect();
    runtime().block_on(async {
        for run in &runs {
            create(&journal, run).await;
        }
        let before = journal.stats();
        gate.hold.store(true, Ordering::SeqCst);
        let append = |run: &RunId| {
            let (journal, run) = (Arc::clone(&journal), run.clone());
            tokio::spawn(async move { journal.append(&run, Seq(1), vec![started(1)]).await })
        };
        // Alone, the first is synced by the writer itself, which holds
        // the next two in its queue meanwhile.
        let first = append(&runs[0]);
        gate.wait_until_a_sync_began();
        let queued = [append(&runs[1]), append(&runs[2])];
        let writer = journal.writer.as_ref().unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        while writer.max_capacity() - writer.capacity() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "both appends queued in time"
            );
            tokio::task::yield_now().await;
        }
        gate.let_one_sync_go();
        first.await.unwrap().unwrap();
        // The second, with the third waiting behind it, goes to the
        // syncer, whose sync is held; the writer commits the third.
        gate.wait_until_a_sync_began();
        while journal.stats().commits - before.commits < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the third append committed while the second's sync was held: {:?}",
                journal.stats()
            );
            tokio::task::yield_now().await;
        }
        for task in &queued {
            assert!(!task.is_finished(), "no caller answered before its sync");
        }
        gate.hold.store(false, Ordering::SeqCst);
        gate.let_one_sync_go();
        for task in queued {
            task.await.unwrap().unwrap();
        }
    });
}

/// A sync that fails leaves SQLite's pages and the disk possibly
/// apart: its callers are told their events may not be durable, and
/// the journal refuses every write after it, saying why, until it is
/// opened again; reads still skip what was never synced.
#[test]
fn a_failed_sync_fails_its_callers_and_every_write_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, gate) = gated(dir.path(), Options::default());
    let run = RunId::new("r").unwrap();
    runtime().block_on(async {
        create(&journal, &run).await;
        gate.fail.store(true, Ordering::SeqCst);
        let failed = journal.append(&run, Seq(1), vec![started(1)]).await;
        let message = failed.unwrap_err().to_string();
        assert!(
            message.contains("syncing the write-ahead log failed")
                && message.contains("the disk is gone"),
            "{message}"
        );
        gate.fail.store(false, Ordering::SeqCst);
        let after = journal.append(&run, Seq(2), vec![started(2)]).await;
        assert!(
            after
                .unwrap_err()
                .to_string()
                .contains("writes nothing more until it is opened again")
        );
        assert!(journal.probe().await.is_err());
        assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 1);
    });
    drop(journal);
    // Opened again, SQLite recovers from what the disk holds.
    let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
    runtime().block_on(async {
        let next = journal.subscribe(&run).await.unwrap();
        let next = *next.borrow();
        let appended = journal.append(&run, next, vec![started(3)]).await;
        assert!(appended.is_ok(), "{appended:?}");
    });
}

/// Reading many runs reuses each read query's plan: no statement is
/// parsed and planned again because a new run was bound to it.
#[test]
fn reading_many_runs_plans_each_read_query_once() {
    let dir = tempfile::tempdir().unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let journal = SqliteJournal::open(dir.path(), Options::default()).unwrap();
        for i in 0..5 {
            let run = RunId::new(format!("r{i}")).unwrap();
            create(&journal, &run).await;
            assert_eq!(journal.read(&run, Seq(0)).await.unwrap().len(), 1);
        }
        // Reads one after another share one pooled connection.
        let conn = journal.readers.take().unwrap();
        for sql in [READ_INDEXED, READ_TAIL] {
            let statement = conn.prepare_cached(sql).unwrap();
            assert!(
                statement.get_status(rusqlite::StatementStatus::VmStep) > 0,
                "the pooled connection ran {sql}"
            );
            assert_eq!(
                statement.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "{sql} was planned again"
            );
        }
    });
}
