//! Two stores on one database, as two nodes would have: their writers
//! race, their subscribers hear each other, and the schema refuses a build
//! older than it.

use std::sync::Arc;
use std::time::Duration;

use spool_journal::conformance::{created, run, started};
use spool_journal::event::{Event, RunCreated};
use spool_journal::{Address, Journal, JournalError, Seq};
use spool_journal_pg::PgJournal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_racing_on_one_run_admit_exactly_one_append_per_seq_and_the_chain_verifies() {
    let Some((_, _, a, b)) = two_stores().await else {
        return;
    };
    let r = run("shared");
    a.append(&r, Seq(0), vec![created()]).await.unwrap();
    for round in 1..=20_u64 {
        let (left, right) = tokio::join!(
            a.append(&r, Seq(round), vec![started(&format!("a{round}"), "x")]),
            b.append(&r, Seq(round), vec![started(&format!("b{round}"), "x")]),
        );
        let won = [&left, &right].iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: exactly one store appends at a seq");
        for lost in [left, right].into_iter().filter_map(Result::err) {
            assert!(
                matches!(lost, JournalError::Conflict { .. }),
                "the loser sees a conflict, got {lost}"
            );
        }
    }
    // Both read the same verified chain of 21 events.
    let through_a = a.read(&r, Seq(0)).await.unwrap();
    assert_eq!(through_a.len(), 21);
    assert_eq!(b.read(&r, Seq(0)).await.unwrap(), through_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_continuing_the_heads_a_writer_wrote_commit_from_them_and_the_chain_holds() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let journal = crate::journal(&url, &schema).await;
    let r = run("known");
    // The creation is planned from no head; every append after it
    // continues the head this writer wrote.
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    assert_eq!(journal.commits_from_known_heads(), 1);
    for n in 1..=20_u64 {
        journal
            .append(&r, Seq(n), vec![started(&format!("t{n}"), "x")])
            .await
            .unwrap();
    }
    assert_eq!(journal.commits_from_known_heads(), 21);
    // Read back through another store: the rows and the stored head are
    // what the usual way writes (the read verifies the hash chain).
    let other = crate::journal(&url, &schema).await;
    assert_eq!(other.read(&r, Seq(0)).await.unwrap().len(), 21);
    other
        .append(&r, Seq(21), vec![started("t21", "x")])
        .await
        .expect("the stored head is at 21");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_run_another_store_created_is_caught_and_answered_as_a_conflict() {
    let Some((_, _, a, b)) = two_stores().await else {
        return;
    };
    let r = run("twice");
    b.append(&r, Seq(0), vec![created(), started("t1", "x")])
        .await
        .unwrap();
    // A does not know the run: its creation is tried from no head, meets
    // the row B wrote at 0, and is decided from the stored head.
    match a.append(&r, Seq(0), vec![created()]).await {
        Err(JournalError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (Seq(0), Seq(2))),
        other => panic!("expected a conflict at 2, got {other:?}"),
    }
    assert_eq!(a.commits_from_known_heads(), 0);
    assert_eq!(a.read(&r, Seq(0)).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_another_store_moved_is_caught_and_the_append_answered_from_the_stored_one() {
    let Some((_, _, a, b)) = two_stores().await else {
        return;
    };
    let r = run("moved");
    a.append(&r, Seq(0), vec![created(), started("t1", "x")])
        .await
        .unwrap();
    // B appends at 2: the head A knows (2) is stale now.
    b.append(&r, Seq(2), vec![started("b2", "x")])
        .await
        .unwrap();
    // A's append at 2 continues its known head, so it is tried from it;
    // the row at 2 exists, and the append is decided from the stored
    // head instead: a conflict, as without known heads.
    match a.append(&r, Seq(2), vec![started("a2", "x")]).await {
        Err(JournalError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (Seq(2), Seq(3))),
        other => panic!("expected a conflict at 3, got {other:?}"),
    }
    // The creation was the one commit from a head planned (none).
    assert_eq!(a.commits_from_known_heads(), 1);
    a.append(&r, Seq(3), vec![started("a3", "x")])
        .await
        .unwrap();
    a.append(&r, Seq(4), vec![started("a4", "x")])
        .await
        .unwrap();
    assert_eq!(
        a.commits_from_known_heads(),
        2,
        "known again after the stored head was read"
    );
    let log = b.read(&r, Seq(0)).await.unwrap();
    assert_eq!(log.len(), 5);
    assert_eq!(a.read(&r, Seq(0)).await.unwrap(), log);
}

/// One thread: the test's two appends are queued before the writer runs,
/// so they share one batch.
#[tokio::test(flavor = "current_thread")]
async fn an_append_batched_with_one_from_a_stale_head_is_written_whole_the_usual_way() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    // One writer, so both runs' appends meet in its batch.
    let a = Arc::new(
        PgJournal::connect(
            &url,
            spool_journal_pg::Options {
                schema: Some(schema.clone()),
                writers: 1,
                ..spool_journal_pg::Options::default()
            },
        )
        .await
        .unwrap(),
    );
    let b = crate::journal(&url, &schema).await;
    let (stale, fresh) = (run("stale"), run("fresh"));
    a.append(&stale, Seq(0), vec![created()]).await.unwrap();
    a.append(&fresh, Seq(0), vec![created()]).await.unwrap();
    // B moves one head A knows.
    b.append(&stale, Seq(1), vec![started("b1", "x")])
        .await
        .unwrap();
    let known_before = a.commits_from_known_heads();
    let (from_stale, from_fresh) = tokio::join!(
        a.append(&stale, Seq(1), vec![started("a1", "x")]),
        a.append(&fresh, Seq(1), vec![started("f1", "x"), started("f2", "x")]),
    );
    assert!(
        matches!(from_stale, Err(JournalError::Conflict { .. })),
        "{from_stale:?}"
    );
    let written = from_fresh.expect("the other append is written");
    assert_eq!(written.len(), 2);
    assert_eq!(
        a.commits_from_known_heads(),
        known_before,
        "the batch failed from known heads and was written the usual way"
    );
    // Every event acknowledged is stored, read back (and verified)
    // through the other store.
    let log = b.read(&fresh, Seq(0)).await.unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(&log[1..], written.as_slice());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_created_by_two_stores_at_once_is_created_once() {
    let Some((_, _, a, b)) = two_stores().await else {
        return;
    };
    for n in 0..20 {
        let r = run(&format!("new-{n}"));
        let (left, right) = tokio::join!(
            a.append(&r, Seq(0), vec![created()]),
            b.append(&r, Seq(0), vec![created()]),
        );
        assert_eq!(
            usize::from(left.is_ok()) + usize::from(right.is_ok()),
            1,
            "run {n}: one creation wins ({left:?} / {right:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_taken_through_one_store_is_refused_through_the_other() {
    let Some((_, _, a, b)) = two_stores().await else {
        return;
    };
    let address = Address::new("chat", "alice");
    let with_address = || {
        Event::RunCreated(RunCreated {
            address: Some(address.clone()),
            ..RunCreated::default()
        })
    };
    a.append(&run("first"), Seq(0), vec![with_address()])
        .await
        .unwrap();
    let refused = b
        .append(&run("second"), Seq(0), vec![with_address()])
        .await
        .unwrap_err();
    assert!(
        matches!(refused, JournalError::AddressTaken { ref run, .. } if run.as_str() == "first"),
        "got {refused}"
    );
    // The refused creation left nothing behind, and the other store's
    // batch goes on.
    assert!(b.read(&run("second"), Seq(0)).await.unwrap().is_empty());
    b.append(&run("third"), Seq(0), vec![created()])
        .await
        .unwrap();
    assert_eq!(
        b.find_address(&address)
            .await
            .unwrap()
            .map(|r| r.to_string()),
        Some("first".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_one_store_is_told_of_an_append_through_the_other() {
    let Some((_, _, writer, reader)) = two_stores().await else {
        return;
    };
    let r = run("watched");
    writer.append(&r, Seq(0), vec![created()]).await.unwrap();
    let mut watch = reader.subscribe(&r).await.unwrap();
    assert_eq!(*watch.borrow_and_update(), Seq(1));
    writer
        .append(&r, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    told(
        &mut watch,
        Seq(2),
        "the other store's commit reaches this subscriber",
    )
    .await;
    assert_eq!(reader.read(&r, Seq(1)).await.unwrap().len(), 1);
}

/// Two stores on a schema of their own, as two nodes would have, with
/// the server's URL and the schema; `None` (said) without a server.
async fn two_stores() -> Option<(String, String, Arc<PgJournal>, Arc<PgJournal>)> {
    let url = crate::server()?;
    let schema = crate::fresh_schema();
    let first = crate::journal(&url, &schema).await;
    let second = crate::journal(&url, &schema).await;
    Some((url, schema, first, second))
}

/// Waits until `watch` announces `next`, failing with `why` after ten
/// seconds.
async fn told(watch: &mut spool_journal::store::SeqWatch, next: Seq, why: &str) {
    tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|at| *at == next))
        .await
        .expect(why)
        .unwrap();
}

/// A connection of the test's own listening on `schema`'s channel (it
/// listens while the client is kept), and the payloads it hears.
async fn overhear(
    url: &str,
    schema: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (sender, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(note) = message {
                let _ = sender.send(note.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN \"spool_journal.{schema}\""))
        .await
        .unwrap();
    (client, heard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_notifies_other_processes_only_of_the_runs_somebody_watches() {
    let Some((url, schema, writer, reader)) = two_stores().await else {
        return;
    };
    let (_listening, mut heard) = overhear(&url, &schema).await;
    let (quiet, watched) = (run("nobody-watches"), run("somebody-watches"));
    writer
        .append(&quiet, Seq(0), vec![created()])
        .await
        .unwrap();
    writer
        .append(&watched, Seq(0), vec![created()])
        .await
        .unwrap();
    let mut watch = reader.subscribe(&watched).await.unwrap();
    writer
        .append(&quiet, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    writer
        .append(&watched, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    // Notifications arrive in commit order: the first heard is the last
    // commit's, so none was sent for the unwatched run's commits.
    let first = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the watched run's commit is announced")
        .unwrap();
    assert_eq!(first, format!("2 {}", watched.as_str()));
    told(
        &mut watch,
        Seq(2),
        "the subscriber on the other store is told",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_the_store_writing_a_run_is_told_in_process_and_no_commit_notifies() {
    let Some((url, schema, journal, other)) = two_stores().await else {
        return;
    };
    let (_listening, mut heard) = overhear(&url, &schema).await;
    let (own, elsewhere) = (run("written-here"), run("watched-elsewhere"));
    journal.append(&own, Seq(0), vec![created()]).await.unwrap();
    journal
        .append(&elsewhere, Seq(0), vec![created()])
        .await
        .unwrap();
    let mut watch = journal.subscribe(&own).await.unwrap();
    journal
        .append(&own, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    assert_eq!(*watch.borrow_and_update(), Seq(2), "told by its own writer");
    // A commit watched by another store, after: the first notification
    // heard is its, so the run watched where it is written sent none.
    let _watched = other.subscribe(&elsewhere).await.unwrap();
    journal
        .append(&elsewhere, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the commit watched elsewhere is announced")
        .unwrap();
    assert_eq!(first, format!("2 {}", elsewhere.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_another_store_takes_over_is_announced_to_the_first_stores_subscriber() {
    let Some((_, _, first, taker)) = two_stores().await else {
        return;
    };
    let r = run("taken-over");
    first.append(&r, Seq(0), vec![created()]).await.unwrap();
    // Written here, so watched without a watch in the database.
    let mut watch = first.subscribe(&r).await.unwrap();
    assert_eq!(*watch.borrow_and_update(), Seq(1));
    taker
        .append(&r, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    told(
        &mut watch,
        Seq(2),
        "the listener's next tick finds the run written elsewhere",
    )
    .await;
    // From then on it is watched, and each commit announced.
    taker
        .append(&r, Seq(2), vec![started("t2", "again")])
        .await
        .unwrap();
    told(&mut watch, Seq(3), "the next commit elsewhere is announced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_racing_their_runs_appends_through_another_store_each_hear_the_last() {
    let Some((_, _, writer, reader)) = two_stores().await else {
        return;
    };
    let runs: Vec<_> = (0..64).map(|n| run(&format!("raced-{n}"))).collect();
    for r in &runs {
        writer.append(r, Seq(0), vec![created()]).await.unwrap();
    }
    // Each run's last append and its first subscriber elsewhere at once:
    // whichever commits first, the subscriber ends knowing the append.
    let raced = runs.iter().map(|r| {
        let (writer, reader) = (&writer, &reader);
        async move {
            let (appended, watch) = tokio::join!(
                writer.append(r, Seq(1), vec![started("t1", "hello")]),
                reader.subscribe(r),
            );
            appended.unwrap();
            let mut watch = watch.unwrap();
            tokio::time::timeout(
                Duration::from_secs(10),
                watch.wait_for(|next| *next == Seq(2)),
            )
            .await
            .unwrap_or_else(|_| panic!("{r} raced with its subscriber and went unannounced"))
            .unwrap();
        }
    });
    futures_util::future::join_all(raced).await;
}

/// Waits until `n` sessions wait for locks session `holder` holds (or for
/// sessions waiting on it), asking
/// on a connection of its own (a transaction sees one snapshot of
/// `pg_stat_activity`).
async fn until_waiting_on(url: &str, holder: i32, n: i64) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let waiting: i64 = client
                .query_one(
                    // Directly, or behind a session that waits directly
                    // (a row's second waiter waits for its first).
                    "WITH first AS (SELECT pid FROM pg_stat_activity
                                    WHERE $1 = ANY(pg_blocking_pids(pid)))
                     SELECT count(*) FROM pg_stat_activity
                     WHERE pg_blocking_pids(pid) && (SELECT $1 || array_agg(pid) FROM first)",
                    &[&holder],
                )
                .await
                .unwrap()
                .get(0);
            if waiting >= n {
                return;
            }
        }
    })
    .await
    .expect("the sessions reach the held row in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_committed_after_an_appends_statement_began_is_seen_by_that_append() {
    let Some((url, schema, writer, reader)) = two_stores().await else {
        return;
    };
    let r = run("held");
    writer.append(&r, Seq(0), vec![created()]).await.unwrap();
    let (holder, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM \"{schema}\".spool_runs WHERE run_id = '{}' FOR UPDATE",
            r.as_str()
        ))
        .await
        .unwrap();
    // The watch asks for the run's row first, then the append, whose
    // statement (and snapshot) has begun: once the row is let go the
    // watch commits first, and the append must still see it, or the
    // subscriber, whose head was read before the append, never hears.
    let subscribing = tokio::spawn({
        let (reader, r) = (Arc::clone(&reader), r.clone());
        async move { reader.subscribe(&r).await }
    });
    until_waiting_on(&url, pid, 1).await;
    let appending = tokio::spawn({
        let (writer, r) = (Arc::clone(&writer), r.clone());
        async move {
            writer
                .append(&r, Seq(1), vec![started("t1", "hello")])
                .await
        }
    });
    until_waiting_on(&url, pid, 2).await;
    holder.batch_execute("COMMIT").await.unwrap();
    appending.await.unwrap().unwrap();
    let mut watch = subscribing.await.unwrap().unwrap();
    told(
        &mut watch,
        Seq(2),
        "the append committed after the watch announces itself",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_to_a_run_not_yet_created_hears_of_its_creation_through_another_store() {
    let Some((_, _, writer, reader)) = two_stores().await else {
        return;
    };
    let r = run("not-yet");
    let mut watch = reader.subscribe(&r).await.unwrap();
    assert_eq!(*watch.borrow_and_update(), Seq(0));
    writer.append(&r, Seq(0), vec![created()]).await.unwrap();
    told(
        &mut watch,
        Seq(1),
        "the creation reaches the subscriber by the listener's next tick",
    )
    .await;
    // From then on its watch is registered and each commit announced.
    writer
        .append(&r, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    told(&mut watch, Seq(2), "the next commit reaches the subscriber").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_of_many_watched_runs_with_long_ids_is_announced_within_the_servers_limit() {
    let Some((_, _, writer, reader)) = two_stores().await else {
        return;
    };
    // 128 bytes, the longest id: 40 lines are about 5.3 kB, under the
    // server's 8 000 bytes a notification may carry.
    let runs: Vec<_> = (0..300).map(|n| run(&format!("{n:0>128}"))).collect();
    futures_util::future::join_all(
        runs.iter()
            .map(|r| writer.append(r, Seq(0), vec![created()])),
    )
    .await
    .into_iter()
    .for_each(|created| {
        created.unwrap();
    });
    let mut watches = Vec::new();
    for r in &runs {
        watches.push(reader.subscribe(r).await.unwrap());
    }
    let commits = writer.stats().commits;
    futures_util::future::join_all(
        runs.iter()
            .map(|r| writer.append(r, Seq(1), vec![started("t1", "hello")])),
    )
    .await
    .into_iter()
    .for_each(|appended| {
        appended.unwrap();
    });
    assert!(
        writer.stats().commits - commits < runs.len() as u64,
        "some commits carried many runs"
    );
    for watch in &mut watches {
        told(watch, Seq(2), "every watched run's commit is announced").await;
    }
}

/// A journal in `schema` holding `runs`, each created in that order, then
/// set back to an older layout by `sql` (`{schema}` in it names the
/// schema), closed; and a client on the database to look at it with.
async fn an_older_layout(
    url: &str,
    schema: &str,
    runs: &[&spool_journal::RunId],
    sql: &str,
) -> tokio_postgres::Client {
    let before = crate::journal(url, schema).await;
    for r in runs {
        before.append(r, Seq(0), vec![created()]).await.unwrap();
    }
    drop(before);
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&sql.replace("{schema}", schema))
        .await
        .unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_of_the_layout_before_watches_is_migrated_on_open_and_keeps_its_runs() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let r = run("kept");
    // The layout of version 2, as a build before watches left it.
    let client = an_older_layout(
        &url,
        &schema,
        &[&r],
        "ALTER TABLE \"{schema}\".spool_runs DROP COLUMN watched_until, DROP COLUMN written_by;
         CREATE INDEX spool_runs_updated ON \"{schema}\".spool_runs (updated_ns);
         DROP TABLE \"{schema}\".spool_tombstones, \"{schema}\".spool_definitions; DROP INDEX \"{schema}\".spool_operations_run;
         UPDATE \"{schema}\".spool_meta SET value = '2' WHERE key = 'store_version'",
    )
    .await;
    let writer = crate::journal(&url, &schema).await;
    let reader = crate::journal(&url, &schema).await;
    let version: String = client
        .query_one(
            &format!("SELECT value FROM \"{schema}\".spool_meta WHERE key = 'store_version'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, "5");
    let mut watch = reader.subscribe(&r).await.unwrap();
    assert_eq!(*watch.borrow_and_update(), Seq(1));
    writer
        .append(&r, Seq(1), vec![started("t1", "hello")])
        .await
        .unwrap();
    told(
        &mut watch,
        Seq(2),
        "the migrated journal announces a watched run's commit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_indexed_by_update_time_lose_the_index_on_open_and_still_list_the_latest_first() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let (older, newer) = (run("older"), run("newer"));
    // The layout of version 3: run heads indexed by their update time,
    // which made every head a commit moved a new index entry.
    let client = an_older_layout(
        &url,
        &schema,
        &[&older, &newer],
        "CREATE INDEX IF NOT EXISTS spool_runs_updated ON \"{schema}\".spool_runs (updated_ns);
         ALTER TABLE \"{schema}\".spool_runs RESET (fillfactor);
         DROP TABLE \"{schema}\".spool_tombstones, \"{schema}\".spool_definitions; DROP INDEX \"{schema}\".spool_operations_run;
         UPDATE \"{schema}\".spool_meta SET value = '3' WHERE key = 'store_version'",
    )
    .await;
    let journal = crate::journal(&url, &schema).await;
    let indexes: Vec<String> = client
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND tablename = 'spool_runs'",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        indexes,
        ["spool_runs_pkey"],
        "a head is found by its run alone"
    );
    let options: Option<Vec<String>> = client
        .query_one(
            "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = 'spool_runs'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(options.unwrap_or_default(), ["fillfactor=70"]);
    // The older run moves last, so it lists first.
    journal
        .append(&older, Seq(1), vec![started("t1", "again")])
        .await
        .unwrap();
    let listed: Vec<String> = journal
        .runs()
        .await
        .unwrap()
        .into_iter()
        .map(|summary| summary.run_id.to_string())
        .collect();
    assert_eq!(listed, ["older", "newer"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_written_by_a_newer_spool_is_refused_and_left_alone() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    drop(crate::journal(&url, &schema).await);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".spool_meta SET value = '999' WHERE key = 'store_version'"
        ))
        .await
        .unwrap();
    let options = spool_journal_pg::Options {
        schema: Some(schema.clone()),
        ..spool_journal_pg::Options::default()
    };
    let refused = spool_journal_pg::PgJournal::connect(&url, options)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, JournalError::NewerSchema { found: 999, .. }),
        "got {refused}"
    );
    let kept: String = client
        .query_one(
            &format!("SELECT value FROM \"{schema}\".spool_meta WHERE key = 'store_version'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, "999");
}

/// Ends every other connection to the test's database, as a database
/// restart does from the clients' side.
async fn cut_connections(url: &str) -> u64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap()
        .len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_under_load_are_made_again_and_no_acknowledged_event_is_lost() {
    let Some(server) = crate::server() else {
        return;
    };
    let url = crate::fresh_database(&server).await;
    let cutting = url.clone();
    let cut = appends_through(&url, async move {
        // Twice, a few rounds apart.
        let mut cut = cut_connections(&cutting).await;
        tokio::task::yield_now().await;
        cut += cut_connections(&cutting).await;
        assert!(cut > 0, "the test cut the store's connections");
    })
    .await;
    assert!(cut.failed < cut.tried, "appends went on after the cuts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the server: `cargo xtask ci` runs it on a server of its own"]
async fn the_database_restarted_under_load_is_reconnected_and_no_acknowledged_event_is_lost() {
    let Some(server) = crate::server() else {
        return;
    };
    let restart = std::env::var("JOURNAL_PG_RESTART")
        .expect("JOURNAL_PG_RESTART names the command that restarts the test server (cargo xtask pg sets it)");
    let url = crate::fresh_database(&server).await;
    let restarted = appends_through(&url, async move {
        let status = tokio::task::spawn_blocking(move || {
            std::process::Command::new("sh")
                .args(["-c", &restart])
                .status()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(status.success(), "restarting the server: {status}");
    })
    .await;
    assert!(
        restarted.failed > 0,
        "appends were refused while the server was down"
    );
}

/// What [`appends_through`] saw.
struct Load {
    tried: u64,
    failed: u64,
}

/// Appends rounds to 8 runs through one store while `disturb` runs
/// (started at round 15), and 25 rounds past its end; after every round,
/// each run's log must hold at least every event acknowledged, and a
/// subscriber on a second store hears a commit made after it all.
async fn appends_through(url: &str, disturb: impl Future<Output = ()> + Send + 'static) -> Load {
    let schema = crate::fresh_schema();
    let writer = crate::journal(url, &schema).await;
    let watcher = crate::journal(url, &schema).await;
    let runs: Vec<_> = (0..8).map(|n| run(&format!("load-{n}"))).collect();
    let mut acknowledged = vec![0_u64; runs.len()];
    for (r, acked) in runs.iter().zip(&mut acknowledged) {
        writer.append(r, Seq(0), vec![created()]).await.unwrap();
        *acked = 1;
    }
    let mut watch = watcher.subscribe(&runs[0]).await.unwrap();
    let mut load = Load {
        tried: 0,
        failed: 0,
    };
    let mut disturb = Some(disturb);
    let mut disturbing: Option<tokio::task::JoinHandle<()>> = None;
    let mut after = 0;
    for round in 0_u64.. {
        if round == 15 {
            disturbing = disturb.take().map(tokio::spawn);
        }
        if disturbing
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
        {
            after += 1;
            if after == 25 {
                break;
            }
        }
        let appends = runs.iter().zip(&acknowledged).map(|(r, &next)| {
            let writer = Arc::clone(&writer);
            async move {
                writer
                    .append(r, Seq(next), vec![started(&format!("t{round}"), "x")])
                    .await
            }
        });
        for (outcome, acked) in futures_util::future::join_all(appends)
            .await
            .into_iter()
            .zip(&mut acknowledged)
        {
            load.tried += 1;
            match outcome {
                Ok(envelopes) => *acked += envelopes.len() as u64,
                // Refused while the connection was being made again (or
                // behind an append whose outcome was unknown); whether it
                // landed is read back below.
                Err(JournalError::Storage { .. } | JournalError::Conflict { .. }) => {
                    load.failed += 1;
                }
                Err(other) => panic!("an append failed otherwise: {other}"),
            }
        }
        // A batch whose outcome was unknown may have landed: go on from
        // what the log holds, never below what was acknowledged. While
        // the server is away the log cannot be read; the next round tries.
        for (r, acked) in runs.iter().zip(&mut acknowledged) {
            if let Ok(log) = writer.read(r, Seq(0)).await {
                let held = log.len() as u64;
                assert!(
                    held >= *acked,
                    "run {r} holds {held} events, {acked} were acknowledged"
                );
                *acked = held;
            }
        }
    }
    disturbing.unwrap().await.unwrap();
    // A subscriber on the other store still hears commits after its
    // listening connection was lost and made again.
    let last = acknowledged[0];
    writer
        .append(&runs[0], Seq(last), vec![started("after", "x")])
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(15),
        watch.wait_for(|next| *next == Seq(last + 1)),
    )
    .await
    .expect("the subscriber hears the commit after the disturbance")
    .unwrap();
    load
}
