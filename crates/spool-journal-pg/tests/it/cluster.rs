//! Leases and fencing between nodes on one journal. A node "paused past
//! its lease" is made so by moving its expiry into the past in the
//! database, which is exactly what the passing of the lease time does.

use std::sync::Arc;
use std::time::Duration;

use spool_journal::conformance::{created, run, started};
use spool_journal::{Journal, JournalError, Seq};
use spool_journal_pg::{Cluster, ClusterOptions, Options, PgJournal, Renewal};

async fn node(url: &str, schema: &str, name: &str) -> (Cluster, Arc<PgJournal>) {
    let cluster = Cluster::join(
        url,
        ClusterOptions {
            schema: Some(schema.to_owned()),
            name: name.to_owned(),
            address: Some(format!("{name}:8080")),
            lease: Duration::from_secs(10),
        },
    )
    .await
    .unwrap();
    let options = Options {
        schema: Some(schema.to_owned()),
        fence: Some(cluster.fence()),
        ..Options::default()
    };
    let journal = Arc::new(PgJournal::connect(url, options).await.unwrap());
    (cluster, journal)
}

/// What the lease time passing without a renewal does to `node`.
async fn lapse(url: &str, schema: &str, node: i64) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let updated = client
        .execute(
            &format!(
                "UPDATE \"{schema}\".spool_nodes SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1"
            ),
            &[&node],
        )
        .await
        .unwrap();
    assert_eq!(updated, 1);
}

fn lost(result: Result<Vec<spool_journal::Envelope>, JournalError>) -> String {
    match result {
        Err(JournalError::LeaseLost { reason, .. }) => reason,
        other => panic!("expected the lease to be lost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_lease_cannot_append_and_a_live_node_takes_its_runs_over() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let (a, journal_a) = node(&url, &schema, "a").await;
    let (b, journal_b) = node(&url, &schema, "b").await;
    let r = run("driven");
    journal_a
        .append(&r, Seq(0), vec![created(), started("t1", "hi")])
        .await
        .unwrap();
    // Created in one trip, its lease taken in the same statement.
    assert_eq!(journal_a.commits_from_known_heads(), 1);
    // A created it, so A holds it: B may not write to it.
    let refused = lost(journal_b.append(&r, Seq(2), vec![started("t2", "x")]).await);
    assert!(
        refused.contains(&format!("node {} at a:8080", a.node())),
        "the refusal says where the run is driven: {refused}"
    );
    assert_eq!(b.holder(&r).await.unwrap().map(|(n, _)| n), Some(a.node()));
    // Nothing moves while A is alive.
    assert!(b.take_over().await.unwrap().is_empty());

    lapse(&url, &schema, a.node()).await;
    // A woke up: its append is refused before anything is written.
    match journal_a.append(&r, Seq(2), vec![started("t2", "x")]).await {
        Err(JournalError::Lapsed { run, node }) => assert_eq!((run, node), (r.clone(), a.node())),
        other => panic!("expected this node's lease to have lapsed, got {other:?}"),
    }
    assert_eq!(journal_a.read(&r, Seq(0)).await.unwrap().len(), 2);
    // Nor can it create a run: the one-trip creation's fence does not
    // hold, and the usual way says why.
    let late = run("late");
    match journal_a.append(&late, Seq(0), vec![created()]).await {
        Err(JournalError::Lapsed { node, .. }) => assert_eq!(node, a.node()),
        other => panic!("expected this node's lease to have lapsed, got {other:?}"),
    }
    assert!(journal_a.read(&late, Seq(0)).await.unwrap().is_empty());
    assert_eq!(journal_a.commits_from_known_heads(), 1);

    assert_eq!(b.take_over().await.unwrap(), vec![r.clone()]);
    assert!(b.take_over().await.unwrap().is_empty(), "taken over once");
    journal_b
        .append(&r, Seq(2), vec![started("t2", "x")])
        .await
        .expect("the run is B's now");

    // A renews, finds its lease gone, and joins again as a new node that
    // still does not hold the run.
    let was = a.node();
    let Renewal::Rejoined { was: old, now } = a.renew().await.unwrap() else {
        panic!("A's lease had lapsed");
    };
    assert_eq!((old, now > was), (was, true));
    let refused = lost(journal_a.append(&r, Seq(3), vec![started("t3", "x")]).await);
    assert!(refused.contains(&format!("node {}", b.node())), "{refused}");
    assert_eq!(b.renew().await.unwrap(), Renewal::Renewed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_runs_from_before_the_cluster_are_taken_over_once() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let plain = crate::journal(&url, &schema).await;
    let running = run("running");
    plain
        .append(&running, Seq(0), vec![created(), started("t1", "hi")])
        .await
        .unwrap();
    // Never started: nothing to recover.
    plain
        .append(&run("pending"), Seq(0), vec![created()])
        .await
        .unwrap();
    let (a, journal_a) = node(&url, &schema, "a").await;
    let (b, _) = node(&url, &schema, "b").await;
    assert_eq!(a.take_over().await.unwrap(), vec![running.clone()]);
    assert!(b.take_over().await.unwrap().is_empty());
    journal_a
        .append(&running, Seq(2), vec![started("t2", "x")])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_leaves_has_its_runs_taken_over_at_once() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let (a, journal_a) = node(&url, &schema, "a").await;
    let (b, _) = node(&url, &schema, "b").await;
    let r = run("handed");
    journal_a
        .append(&r, Seq(0), vec![created(), started("t1", "hi")])
        .await
        .unwrap();
    a.leave().await.unwrap();
    assert_eq!(b.take_over().await.unwrap(), vec![r]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_run_moved_cannot_append_from_the_head_it_wrote_last() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let (a, journal_a) = node(&url, &schema, "a").await;
    let (b, _journal_b) = node(&url, &schema, "b").await;
    let r = run("moved");
    journal_a.append(&r, Seq(0), vec![created()]).await.unwrap();
    journal_a
        .append(&r, Seq(1), vec![started("t1", "hi")])
        .await
        .unwrap();
    assert_eq!(journal_a.commits_from_known_heads(), 2);
    // A lapses, B takes the run over without writing to it, and A joins
    // again: alive, and the head it knows is still the stored one, but
    // the run's lease is B's.
    lapse(&url, &schema, a.node()).await;
    assert_eq!(b.take_over().await.unwrap(), vec![r.clone()]);
    assert!(matches!(a.renew().await.unwrap(), Renewal::Rejoined { .. }));
    let refused = lost(journal_a.append(&r, Seq(2), vec![started("t2", "x")]).await);
    assert!(refused.contains(&format!("node {}", b.node())), "{refused}");
    assert_eq!(journal_a.commits_from_known_heads(), 2);
    assert_eq!(journal_a.read(&r, Seq(0)).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_held_to_the_head_goes_ahead_on_any_node_and_the_holder_then_finds_the_tombstone()
 {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let (a, journal_a) = node(&url, &schema, "a").await;
    let (b, journal_b) = node(&url, &schema, "b").await;
    let r = run("ended");
    journal_b
        .append(&r, Seq(0), vec![created(), started("t1", "hi")])
        .await
        .unwrap();
    // The lowest live node sweeps: A joined first.
    assert!(a.sweeps().await.unwrap());
    assert!(!b.sweeps().await.unwrap());
    let deletion = |expected| spool_journal::store::Deletion {
        by: "retention".into(),
        reason: None,
        expected,
    };
    // A command without a head is for the node that drives the run.
    match journal_a.delete(&r, deletion(None)).await {
        Err(JournalError::LeaseLost { .. }) => {}
        other => panic!("expected the lease to be B's, got {other:?}"),
    }
    // Held to a head the run has moved past: left.
    assert!(matches!(
        journal_a.delete(&r, deletion(Some(Seq(1)))).await,
        Err(JournalError::Conflict { .. })
    ));
    let tombstone = journal_a.delete(&r, deletion(Some(Seq(2)))).await.unwrap();
    assert_eq!(tombstone.events, 2);
    // B, which cached it to its head, learns it is gone when it reads on.
    assert!(matches!(
        journal_b.read(&r, Seq(2)).await,
        Err(JournalError::RunDeleted { .. })
    ));
    assert!(journal_b.read(&r, Seq(0)).await.unwrap().is_empty());
    // And finds it gone at its next append.
    match journal_b.append(&r, Seq(2), vec![started("t2", "x")]).await {
        Err(JournalError::RunDeleted { .. }) => {}
        other => panic!("expected the run to be deleted, got {other:?}"),
    }
    drop(b);
}
