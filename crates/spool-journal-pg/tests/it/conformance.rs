//! Every conformance check, each in a schema of its own.

use std::sync::Arc;

use spool_journal::Journal;
use spool_journal::conformance::CHECKS;

async fn check(name: &str) {
    let Some(url) = crate::server() else { return };
    let journal = crate::journal(&url, &crate::fresh_schema()).await;
    let (_, check) = CHECKS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no conformance check {name}"));
    check(journal as Arc<dyn Journal>).await;
}

macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        const LISTED: &[&str] = &[$(stringify!($name)),+];
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                check(stringify!($name)).await;
            }
        )+
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

#[test]
fn every_conformance_check_runs_against_postgres() {
    let checks: Vec<&str> = CHECKS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        checks, LISTED,
        "list each check in the conformance! call above"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_survive_reconnecting() {
    let Some(url) = crate::server() else { return };
    let schema = crate::fresh_schema();
    let handle = tokio::runtime::Handle::current();
    spool_journal::conformance::acknowledged_appends_survive_reopening(move || {
        let (url, schema) = (url.clone(), schema.clone());
        // `open` is synchronous; connecting is not.
        tokio::task::block_in_place(|| {
            handle.block_on(async { crate::journal(&url, &schema).await as Arc<dyn Journal> })
        })
    })
    .await;
}
