//! Runs every conformance check against both stores, each as its own test.

use std::sync::Arc;

use spool_journal::Journal;
use spool_journal::conformance::CHECKS;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::store::sqlite::{Options, SqliteJournal};

async fn check(name: &str, journal: Arc<dyn Journal>) {
    let (_, check) = CHECKS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no conformance check {name}"));
    check(journal).await;
}

macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        const LISTED: &[&str] = &[$(stringify!($name)),+];

        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::check(stringify!($name), std::sync::Arc::new(super::MemoryJournal::new())).await;
                }
            )+
        }

        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let journal = super::SqliteJournal::open(dir.path(), super::Options::default()).unwrap();
                    super::check(stringify!($name), std::sync::Arc::new(journal)).await;
                }
            )+
        }
    };
}

conformance!(
    appends_get_contiguous_seqs_from_zero,
    a_stale_expected_seq_is_a_conflict_and_records_nothing,
    a_run_starts_with_run_created_and_only_there,
    reads_start_where_asked_and_unknown_runs_read_empty,
    concurrent_appends_to_many_runs_all_land_in_order,
    racing_appends_to_one_run_admit_exactly_one_per_seq,
    addresses_bind_once_and_free_on_unbind_and_retire,
    operation_ids_are_scoped_by_principal,
    one_racing_claimant_wins_and_the_rest_see_it_in_flight_then_settled,
    an_abandoned_claim_is_released,
    a_subscriber_is_told_only_after_the_events_are_readable,
    the_run_listing_follows_the_fold,
    runs_by_status_are_the_listings_runs_of_that_status,
    a_probe_of_a_writable_store_succeeds_and_records_no_run,
    a_definition_is_kept_once_per_digest,
    a_deleted_run_leaves_only_its_tombstone_and_the_others_still_verify,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_serves_acknowledged_appends_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    spool_journal::conformance::acknowledged_appends_survive_reopening(move || {
        Arc::new(SqliteJournal::open(&path, Options::default()).unwrap()) as Arc<dyn Journal>
    })
    .await;
}

#[test]
fn every_conformance_check_runs_against_every_store() {
    let checks: Vec<&str> = CHECKS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        checks, LISTED,
        "list each check in the conformance! call above"
    );
}

#[tokio::test]
async fn the_memory_store_reports_a_tampered_row_instead_of_serving_it() {
    use spool_journal::{JournalError, Seq};
    let journal = MemoryJournal::new();
    let r = crate::support::run("tamper");
    journal
        .append(
            &r,
            Seq(0),
            vec![
                crate::support::created(),
                crate::support::started("t1", "x"),
                crate::support::turn_done("t1", "y"),
            ],
        )
        .await
        .unwrap();
    let original = journal.read(&r, Seq(1)).await.unwrap();
    let mut forged = original[0].clone();
    forged.event = crate::support::started("t1", "something else");
    journal.tamper(&r, Seq(1), serde_json::to_vec(&forged).unwrap());
    match journal.read(&r, Seq(0)).await {
        Err(JournalError::TamperEvident(e)) => assert_eq!(e.seq, Seq(1)),
        other => panic!("a tampered row must be reported, got {other:?}"),
    }
}
