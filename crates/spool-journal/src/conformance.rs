//! The store conformance suite: what every `Journal` implementation must
//! do, written once. Enable the `conformance` feature and call each check
//! with a fresh store; [`CHECKS`] lists them by name so a store's tests can
//! run each as its own test.
//!
//! Every check panics with a sentence naming what was broken.

// A check fails by panicking, like any test; unwrapping is how it says
// "this step had to succeed".
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use spool_wire::run::{SuspendKind, TurnPolicy};

use crate::event::{
    AddressBinding, Effect, Event, RunCreated, RunRetired, Suspended, ToolCallAbandoned,
    ToolCallCompleted, ToolCallRequested, TurnCompleted, TurnStarted,
};
use crate::fold::{Status, fold};
use crate::id::{Address, Principal, RunId, Seq, TurnId};
use crate::store::{CallRef, Claim, ClaimKey, Deletion, Journal, JournalError};

/// A boxed check.
pub type Check = fn(Arc<dyn Journal>) -> crate::store::BoxFuture<'static, ()>;

/// Every check, by name.
pub const CHECKS: &[(&str, Check)] = &[
    ("appends_get_contiguous_seqs_from_zero", |j| {
        Box::pin(appends_get_contiguous_seqs_from_zero(j))
    }),
    (
        "a_stale_expected_seq_is_a_conflict_and_records_nothing",
        |j| Box::pin(a_stale_expected_seq_is_a_conflict_and_records_nothing(j)),
    ),
    ("a_run_starts_with_run_created_and_only_there", |j| {
        Box::pin(a_run_starts_with_run_created_and_only_there(j))
    }),
    ("reads_start_where_asked_and_unknown_runs_read_empty", |j| {
        Box::pin(reads_start_where_asked_and_unknown_runs_read_empty(j))
    }),
    ("concurrent_appends_to_many_runs_all_land_in_order", |j| {
        Box::pin(concurrent_appends_to_many_runs_all_land_in_order(j))
    }),
    ("racing_appends_to_one_run_admit_exactly_one_per_seq", |j| {
        Box::pin(racing_appends_to_one_run_admit_exactly_one_per_seq(j))
    }),
    ("addresses_bind_once_and_free_on_unbind_and_retire", |j| {
        Box::pin(addresses_bind_once_and_free_on_unbind_and_retire(j))
    }),
    ("operation_ids_are_scoped_by_principal", |j| {
        Box::pin(operation_ids_are_scoped_by_principal(j))
    }),
    (
        "one_racing_claimant_wins_and_the_rest_see_it_in_flight_then_settled",
        |j| Box::pin(one_racing_claimant_wins_and_the_rest_see_it_in_flight_then_settled(j)),
    ),
    ("an_abandoned_claim_is_released", |j| {
        Box::pin(an_abandoned_claim_is_released(j))
    }),
    (
        "a_subscriber_is_told_only_after_the_events_are_readable",
        |j| Box::pin(a_subscriber_is_told_only_after_the_events_are_readable(j)),
    ),
    ("the_run_listing_follows_the_fold", |j| {
        Box::pin(the_run_listing_follows_the_fold(j))
    }),
    ("runs_by_status_are_the_listings_runs_of_that_status", |j| {
        Box::pin(runs_by_status_are_the_listings_runs_of_that_status(j))
    }),
    (
        "a_probe_of_a_writable_store_succeeds_and_records_no_run",
        |j| Box::pin(a_probe_of_a_writable_store_succeeds_and_records_no_run(j)),
    ),
    ("a_definition_is_kept_once_per_digest", |j| {
        Box::pin(a_definition_is_kept_once_per_digest(j))
    }),
    (
        "a_deleted_run_leaves_only_its_tombstone_and_the_others_still_verify",
        |j| Box::pin(a_deleted_run_leaves_only_its_tombstone_and_the_others_still_verify(j)),
    ),
];

/// For durable stores: what was acknowledged before the store was dropped
/// is there, chain-verified, after `open` makes a new one on the same
/// storage, and appends carry on where they left off. `open` is called
/// twice.
pub async fn acknowledged_appends_survive_reopening(open: impl Fn() -> Arc<dyn Journal>) {
    let r = run("reopen");
    let before = {
        let journal = open();
        journal
            .append(&r, Seq(0), vec![created(), started("t1", "hi")])
            .await
            .unwrap();
        journal
            .append(&r, Seq(2), vec![completed("t1")])
            .await
            .unwrap();
        journal.read(&r, Seq(0)).await.unwrap()
    };
    let journal = open();
    assert_eq!(
        journal.read(&r, Seq(0)).await.unwrap(),
        before,
        "a reopened store serves what it acknowledged"
    );
    journal
        .append(&r, Seq(3), vec![started("t2", "again")])
        .await
        .expect("appends carry on at the reopened run's next position");
    let listed = journal.runs().await.unwrap();
    assert_eq!(
        listed.iter().find(|s| s.run_id == r).map(|s| s.next_seq),
        Some(Seq(4))
    );
}

/// A run id for checks.
#[must_use]
pub fn run(name: &str) -> RunId {
    RunId::new(name).expect("check run names are valid ids")
}

fn turn(name: &str) -> TurnId {
    TurnId::new(name).expect("check turn names are valid ids")
}

/// A `run_created` with nothing else.
#[must_use]
pub fn created() -> Event {
    Event::RunCreated(RunCreated::default())
}

/// A `turn_started` with `input`.
#[must_use]
pub fn started(turn_id: &str, input: &str) -> Event {
    Event::TurnStarted(TurnStarted {
        turn_id: turn(turn_id),
        input: input.into(),
        context: Vec::new(),
        policy: TurnPolicy::Steer,
        from_queue: None,
        operation_id: None,
    })
}

fn completed(turn_id: &str) -> Event {
    Event::TurnCompleted(TurnCompleted {
        turn_id: turn(turn_id),
        response: Some("done".into()),
        usage: None,
    })
}

async fn appends_get_contiguous_seqs_from_zero(journal: Arc<dyn Journal>) {
    let r = run("contiguous");
    let first = journal
        .append(&r, Seq(0), vec![created(), started("t1", "hi")])
        .await
        .unwrap();
    let second = journal
        .append(&r, Seq(2), vec![completed("t1")])
        .await
        .unwrap();
    let seqs: Vec<u64> = first.iter().chain(&second).map(|e| e.seq.0).collect();
    assert_eq!(
        seqs,
        [0, 1, 2],
        "appended events get contiguous positions from 0"
    );
    let read = journal.read(&r, Seq(0)).await.unwrap();
    assert_eq!(
        read,
        [first, second].concat(),
        "what was appended reads back identically"
    );
}

async fn a_stale_expected_seq_is_a_conflict_and_records_nothing(journal: Arc<dyn Journal>) {
    let r = run("conflict");
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    for stale in [Seq(0), Seq(2)] {
        match journal.append(&r, stale, vec![started("t1", "x")]).await {
            Err(JournalError::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!(
                    (expected, actual),
                    (stale, Seq(1)),
                    "the conflict names both positions"
                );
            }
            other => {
                panic!("an append at {stale} when the log is at 1 must conflict, got {other:?}")
            }
        }
    }
    assert_eq!(
        journal.read(&r, Seq(0)).await.unwrap().len(),
        1,
        "a refused append records nothing"
    );
}

async fn a_run_starts_with_run_created_and_only_there(journal: Arc<dyn Journal>) {
    let r = run("shape");
    assert!(
        matches!(
            journal.append(&r, Seq(0), vec![started("t1", "x")]).await,
            Err(JournalError::InvalidAppend { .. })
        ),
        "a run's first event must be run_created"
    );
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    assert!(
        matches!(
            journal.append(&r, Seq(1), vec![created()]).await,
            Err(JournalError::InvalidAppend { .. })
        ),
        "run_created may not appear twice"
    );
    assert!(
        matches!(
            journal.append(&r, Seq(1), vec![]).await,
            Err(JournalError::InvalidAppend { .. })
        ),
        "an empty append is refused"
    );
    assert!(
        matches!(
            journal
                .append(&r, Seq(1), vec![started("t1", "ok"), created()])
                .await,
            Err(JournalError::InvalidAppend { .. })
        ),
        "a batch with one bad event is refused whole"
    );
    assert_eq!(
        journal.read(&r, Seq(0)).await.unwrap().len(),
        1,
        "refused appends record nothing"
    );
}

async fn reads_start_where_asked_and_unknown_runs_read_empty(journal: Arc<dyn Journal>) {
    let r = run("reads");
    journal
        .append(
            &r,
            Seq(0),
            vec![created(), started("t1", "a"), completed("t1")],
        )
        .await
        .unwrap();
    let tail = journal.read(&r, Seq(1)).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        [1, 2],
        "a read from 1 starts at 1"
    );
    assert!(
        journal.read(&r, Seq(3)).await.unwrap().is_empty(),
        "a read past the end is empty"
    );
    assert!(
        journal.read(&r, Seq(99)).await.unwrap().is_empty(),
        "a read far past the end is empty"
    );
    assert!(
        journal
            .read(&run("nobody"), Seq(0))
            .await
            .unwrap()
            .is_empty(),
        "an unknown run reads as empty"
    );
}

async fn concurrent_appends_to_many_runs_all_land_in_order(journal: Arc<dyn Journal>) {
    const RUNS: usize = 16;
    const APPENDS: u64 = 8;
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        let journal = Arc::clone(&journal);
        tasks.push(tokio::spawn(async move {
            let r = run(&format!("many-{i}"));
            journal.append(&r, Seq(0), vec![created()]).await.unwrap();
            for n in 1..=APPENDS {
                journal
                    .append(&r, Seq(n), vec![started(&format!("t{n}"), "x")])
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.expect("an appending task panicked");
    }
    for i in 0..RUNS {
        let log = journal
            .read(&run(&format!("many-{i}")), Seq(0))
            .await
            .unwrap();
        let seqs: Vec<u64> = log.iter().map(|e| e.seq.0).collect();
        assert_eq!(
            seqs,
            (0..=APPENDS).collect::<Vec<_>>(),
            "run many-{i} has every append, in order"
        );
    }
}

async fn racing_appends_to_one_run_admit_exactly_one_per_seq(journal: Arc<dyn Journal>) {
    let r = run("race");
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let journal = Arc::clone(&journal);
        let r = r.clone();
        tasks.push(tokio::spawn(async move {
            journal
                .append(&r, Seq(1), vec![started(&format!("t{i}"), "x")])
                .await
        }));
    }
    let mut won = 0;
    for task in tasks {
        match task.await.expect("a racing task panicked") {
            Ok(_) => won += 1,
            Err(JournalError::Conflict { .. }) => {}
            Err(other) => panic!("a losing racer must see a conflict, got {other}"),
        }
    }
    assert_eq!(won, 1, "exactly one racer appends at seq 1");
    assert_eq!(journal.read(&r, Seq(0)).await.unwrap().len(), 2);
}

async fn addresses_bind_once_and_free_on_unbind_and_retire(journal: Arc<dyn Journal>) {
    let address = Address::new("http", "browser/42");
    let (a, b) = (run("addr-a"), run("addr-b"));
    let bound = Event::RunCreated(RunCreated {
        address: Some(address.clone()),
        ..RunCreated::default()
    });
    journal
        .append(&a, Seq(0), vec![bound.clone()])
        .await
        .unwrap();
    assert_eq!(
        journal.find_address(&address).await.unwrap(),
        Some(a.clone()),
        "the address finds its run"
    );
    assert_eq!(
        journal.addresses().await.unwrap(),
        vec![(address.clone(), a.clone())],
        "the listing of addresses holds the binding"
    );
    match journal.append(&b, Seq(0), vec![bound.clone()]).await {
        Err(JournalError::AddressTaken { run, .. }) => {
            assert_eq!(run, a, "the refusal names the holder")
        }
        other => panic!("a taken address must be refused, got {other:?}"),
    }
    assert!(
        journal.read(&b, Seq(0)).await.unwrap().is_empty(),
        "the refused run was not created"
    );
    journal
        .append(
            &a,
            Seq(1),
            vec![Event::AddressUnbound(AddressBinding {
                address: address.clone(),
            })],
        )
        .await
        .unwrap();
    assert_eq!(
        journal.find_address(&address).await.unwrap(),
        None,
        "unbinding frees the address"
    );
    assert!(
        journal.addresses().await.unwrap().is_empty(),
        "and takes it off the listing of addresses"
    );
    journal.append(&b, Seq(0), vec![bound]).await.unwrap();
    journal
        .append(
            &b,
            Seq(1),
            vec![Event::RunRetired(RunRetired {
                reason: Some("reset".into()),
                namespace: None,
            })],
        )
        .await
        .unwrap();
    assert_eq!(
        journal.find_address(&address).await.unwrap(),
        None,
        "retiring frees the run's addresses"
    );
    journal
        .append(
            &a,
            Seq(2),
            vec![Event::AddressBound(AddressBinding {
                address: address.clone(),
            })],
        )
        .await
        .unwrap();
    assert_eq!(
        journal.find_address(&address).await.unwrap(),
        Some(a),
        "a freed address can be bound again"
    );
    // Retiring within one namespace frees that namespace's addresses only.
    let (web, pod) = (Address::new("http", "desk"), Address::new("pod", "desk"));
    let c = run("addr-c");
    journal
        .append(
            &c,
            Seq(0),
            vec![
                Event::RunCreated(RunCreated {
                    address: Some(web.clone()),
                    ..RunCreated::default()
                }),
                Event::AddressBound(AddressBinding {
                    address: pod.clone(),
                }),
                Event::RunRetired(RunRetired {
                    reason: None,
                    namespace: Some("http".into()),
                }),
            ],
        )
        .await
        .unwrap();
    assert_eq!(journal.find_address(&web).await.unwrap(), None);
    assert_eq!(
        journal.find_address(&pod).await.unwrap(),
        Some(c),
        "an address in another namespace stays bound"
    );
}

async fn operation_ids_are_scoped_by_principal(journal: Arc<dyn Journal>) {
    let alice = Principal {
        authenticator: "token".into(),
        kind: "token".into(),
        id: "alice".into(),
        ..Principal::default()
    };
    let bob = Principal {
        id: "bob".into(),
        ..alice.clone()
    };
    let under = |principal: &Principal| {
        Event::RunCreated(RunCreated {
            operation_id: Some("deploy-42".into()),
            principal: Some(principal.clone()),
            ..RunCreated::default()
        })
    };
    journal
        .append(&run("op-a"), Seq(0), vec![under(&alice)])
        .await
        .unwrap();
    journal
        .append(&run("op-b"), Seq(0), vec![under(&bob)])
        .await
        .unwrap();
    assert_eq!(
        journal.find_operation(&alice, "deploy-42").await.unwrap(),
        Some(run("op-a"))
    );
    assert_eq!(
        journal.find_operation(&bob, "deploy-42").await.unwrap(),
        Some(run("op-b")),
        "another principal's key is another operation"
    );
    assert_eq!(journal.find_operation(&alice, "other").await.unwrap(), None);
    assert!(
        matches!(
            journal
                .append(&run("op-c"), Seq(0), vec![under(&alice)])
                .await,
            Err(JournalError::OperationTaken { .. })
        ),
        "a second run under the same principal and key is refused"
    );
}

fn request(call_id: &str) -> Event {
    Event::ToolCallRequested(ToolCallRequested {
        call_id: call_id.into(),
        tool: "charge".into(),
        input: json!({"amount": 5}),
        effect: Effect::Idempotent,
        idempotency_key: Some("order-7".into()),
    })
}

async fn one_racing_claimant_wins_and_the_rest_see_it_in_flight_then_settled(
    journal: Arc<dyn Journal>,
) {
    let key = ClaimKey {
        tool: "charge".into(),
        key: "order-7".into(),
    };
    let mut tasks = Vec::new();
    for i in 0..8 {
        let journal = Arc::clone(&journal);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let holder = CallRef {
                run: run(&format!("claim-{i}")),
                call_id: "c1".into(),
            };
            (holder.clone(), journal.claim(&key, &holder).await)
        }));
    }
    let mut winner = None;
    for task in tasks {
        let (holder, outcome) = task.await.expect("a claiming task panicked");
        match outcome {
            Ok(Claim::Won) => assert!(
                winner.replace(holder).is_none(),
                "only one racer may win a claim"
            ),
            Err(JournalError::CallInFlight { .. }) => {}
            other => panic!("a losing racer must see the call in flight, got {other:?}"),
        }
    }
    let winner = winner.expect("one racer wins the claim");
    assert_eq!(
        journal.claim(&key, &winner).await.unwrap(),
        Claim::Won,
        "the winner asking again still holds it"
    );
    journal
        .append(
            &winner.run,
            Seq(0),
            vec![created(), started("t1", "pay"), request("c1")],
        )
        .await
        .unwrap();
    let done = journal
        .append(
            &winner.run,
            Seq(3),
            vec![Event::ToolCallCompleted(ToolCallCompleted {
                call_id: "c1".into(),
                output: json!({"receipt": "r-1"}).into(),
            })],
        )
        .await
        .unwrap();
    let latecomer = CallRef {
        run: run("claim-late"),
        call_id: "c9".into(),
    };
    assert_eq!(
        journal.claim(&key, &latecomer).await.unwrap(),
        Claim::Settled {
            output: json!({"receipt": "r-1"}),
            by: winner,
            seq: done[0].seq,
        },
        "after the completion, a claimant gets the recorded output and where it came from"
    );
}

async fn an_abandoned_claim_is_released(journal: Arc<dyn Journal>) {
    let key = ClaimKey {
        tool: "charge".into(),
        key: "order-8".into(),
    };
    let first = CallRef {
        run: run("abandon-a"),
        call_id: "c1".into(),
    };
    assert_eq!(journal.claim(&key, &first).await.unwrap(), Claim::Won);
    journal
        .append(
            &first.run,
            Seq(0),
            vec![
                created(),
                started("t1", "pay"),
                request("c1"),
                Event::ToolCallAbandoned(ToolCallAbandoned {
                    call_id: "c1".into(),
                    reason: Some("operator: it never ran".into()),
                    operator: None,
                }),
            ],
        )
        .await
        .unwrap();
    let second = CallRef {
        run: run("abandon-b"),
        call_id: "c1".into(),
    };
    assert_eq!(
        journal.claim(&key, &second).await.unwrap(),
        Claim::Won,
        "an abandoned claim can be taken again"
    );
}

async fn a_subscriber_is_told_only_after_the_events_are_readable(journal: Arc<dyn Journal>) {
    let r = run("subscribe");
    let mut watching = journal.subscribe(&r).await.unwrap();
    assert_eq!(
        *watching.borrow(),
        Seq(0),
        "an unknown run's next position is 0"
    );
    let writer = {
        let journal = Arc::clone(&journal);
        let r = r.clone();
        tokio::spawn(async move {
            journal.append(&r, Seq(0), vec![created()]).await.unwrap();
            journal
                .append(&r, Seq(1), vec![started("t1", "x"), completed("t1")])
                .await
                .unwrap();
        })
    };
    let mut seen = Seq(0);
    while seen < Seq(3) {
        tokio::time::timeout(Duration::from_secs(10), watching.changed())
            .await
            .expect("a subscriber is told of an append within 10 s")
            .expect("the journal keeps the channel open");
        let next = *watching.borrow_and_update();
        let fresh = journal.read(&r, seen).await.unwrap();
        // More may have landed since the notice; what it announced must be
        // readable already.
        let readable = fresh.last().map_or(seen, |e| e.seq.next());
        assert!(
            readable >= next,
            "every position a subscriber is told of is already readable: told {next}, read up to {readable}"
        );
        seen = next;
    }
    writer.await.expect("the writer task panicked");
    let late = journal.subscribe(&r).await.unwrap();
    assert_eq!(
        *late.borrow(),
        Seq(3),
        "a late subscriber starts at the run's current end"
    );
}

async fn a_probe_of_a_writable_store_succeeds_and_records_no_run(journal: Arc<dyn Journal>) {
    let r = run("probed");
    journal.append(&r, Seq(0), vec![created()]).await.unwrap();
    let before = journal.runs().await.unwrap();
    journal
        .probe()
        .await
        .expect("a store that can write probes fine");
    journal.probe().await.expect("and again");
    assert_eq!(journal.runs().await.unwrap(), before);
    assert_eq!(journal.read(&r, Seq(0)).await.unwrap().len(), 1);
    journal
        .append(&r, Seq(1), vec![started("t1", "after a probe")])
        .await
        .expect("appends go on after a probe");
}

async fn the_run_listing_follows_the_fold(journal: Arc<dyn Journal>) {
    let waiting = run("list-waiting");
    journal
        .append(
            &waiting,
            Seq(0),
            vec![
                Event::RunCreated(RunCreated {
                    title: Some("Deploy".into()),
                    ..RunCreated::default()
                }),
                started("t1", "deploy"),
                Event::Suspended(Suspended {
                    turn_id: turn("t1"),
                    kind: SuspendKind::Approval,
                    prompt: "Deploy?".into(),
                    call_id: None,
                    input_schema: None,
                    options: None,
                }),
            ],
        )
        .await
        .unwrap();
    let retired = run("list-retired");
    journal
        .append(
            &retired,
            Seq(0),
            vec![
                created(),
                Event::RunRetired(RunRetired::default()),
                started("t2", "x"),
            ],
        )
        .await
        .unwrap();
    let runs = journal.runs().await.unwrap();
    for r in [&waiting, &retired] {
        let summary = runs
            .iter()
            .find(|s| &s.run_id == r)
            .expect("every run is listed");
        let log = journal.read(r, Seq(0)).await.unwrap();
        assert_eq!(
            summary.status,
            fold(&log).status,
            "the listing's state for {r} is the fold's"
        );
        assert_eq!(summary.next_seq, Seq(log.len() as u64));
    }
    let summary = runs.iter().find(|s| s.run_id == waiting).unwrap();
    assert_eq!(summary.status, Status::Waiting(SuspendKind::Approval));
    assert_eq!(summary.title.as_deref(), Some("Deploy"));
    assert_eq!(
        runs.iter().find(|s| s.run_id == retired).unwrap().status,
        Status::Retired,
        "retirement is permanent"
    );
}

/// The runs of one status are the listing's runs of that status, no more
/// and no fewer, whatever way the store finds them.
pub async fn runs_by_status_are_the_listings_runs_of_that_status(journal: Arc<dyn Journal>) {
    let (pending, running, completed_run) = (run("pending"), run("running"), run("done"));
    journal
        .append(&pending, Seq(0), vec![created()])
        .await
        .unwrap();
    for r in [&running, &completed_run] {
        journal
            .append(r, Seq(0), vec![created(), started("t1", "go")])
            .await
            .unwrap();
    }
    journal
        .append(&completed_run, Seq(2), vec![completed("t1")])
        .await
        .unwrap();
    let listed = journal.runs().await.unwrap();
    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
    ] {
        let mut by_status: Vec<_> = journal.runs_with_status(status).await.unwrap();
        let mut expected: Vec<_> = listed
            .iter()
            .filter(|s| s.status == status)
            .cloned()
            .collect();
        by_status.sort_by(|a, b| a.run_id.as_str().cmp(b.run_id.as_str()));
        expected.sort_by(|a, b| a.run_id.as_str().cmp(b.run_id.as_str()));
        assert_eq!(by_status, expected, "the runs whose status is {status:?}");
    }
    let running_only: Vec<_> = journal
        .runs_with_status(Status::Running)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    assert_eq!(running_only, [running]);
}

async fn a_deleted_run_leaves_only_its_tombstone_and_the_others_still_verify(
    journal: Arc<dyn Journal>,
) {
    let (gone, kept) = (run("delete-gone"), run("delete-kept"));
    let address = Address::new("http", "delete/desk");
    let alice = Principal {
        authenticator: "token".into(),
        kind: "user".into(),
        id: "alice".into(),
        attributes: std::collections::BTreeMap::new(),
    };
    let key = ClaimKey {
        tool: "charge".into(),
        key: "delete-order".into(),
    };
    journal
        .append(
            &gone,
            Seq(0),
            vec![
                Event::RunCreated(RunCreated {
                    address: Some(address.clone()),
                    principal: Some(alice.clone()),
                    operation_id: Some("op-delete".into()),
                    ..RunCreated::default()
                }),
                started("t1", "a secret"),
                request("c1"),
            ],
        )
        .await
        .unwrap();
    let holder = CallRef {
        run: gone.clone(),
        call_id: "c1".into(),
    };
    assert_eq!(journal.claim(&key, &holder).await.unwrap(), Claim::Won);
    journal
        .append(
            &gone,
            Seq(3),
            vec![Event::ToolCallCompleted(ToolCallCompleted {
                call_id: "c1".into(),
                output: json!({"receipt": "secret"}).into(),
            })],
        )
        .await
        .unwrap();
    journal
        .append(&kept, Seq(0), vec![created(), started("t1", "kept")])
        .await
        .unwrap();
    let mut watching = journal.subscribe(&gone).await.unwrap();

    match journal
        .delete(
            &gone,
            Deletion {
                by: "sweeper".into(),
                expected: Some(Seq(2)),
                ..Deletion::default()
            },
        )
        .await
    {
        Err(JournalError::Conflict { actual, .. }) => {
            assert_eq!(actual, Seq(4), "the refusal says where the run is");
        }
        other => panic!("a deletion of a run that moved must be refused, got {other:?}"),
    }
    assert_eq!(
        journal.read(&gone, Seq(0)).await.unwrap().len(),
        4,
        "a refused deletion removes nothing"
    );

    let tombstone = journal
        .delete(
            &gone,
            Deletion {
                by: "alice".into(),
                reason: Some("asked to".into()),
                expected: Some(Seq(4)),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (
            tombstone.run_id.clone(),
            tombstone.by.as_str(),
            tombstone.reason.as_deref(),
            tombstone.events
        ),
        (gone.clone(), "alice", Some("asked to"), 4),
        "the tombstone says which run, who, why and how many events went"
    );
    assert!(
        journal.read(&gone, Seq(0)).await.unwrap().is_empty(),
        "a deleted run's events are gone"
    );
    assert!(
        !journal
            .runs()
            .await
            .unwrap()
            .iter()
            .any(|summary| summary.run_id == gone),
        "a deleted run is not listed"
    );
    assert_eq!(
        journal.find_address(&address).await.unwrap(),
        None,
        "its address is free"
    );
    assert_eq!(
        journal.find_operation(&alice, "op-delete").await.unwrap(),
        None,
        "its operation id is forgotten"
    );
    let later = CallRef {
        run: kept.clone(),
        call_id: "c9".into(),
    };
    assert_eq!(
        journal.claim(&key, &later).await.unwrap(),
        Claim::Won,
        "its claims, and the output they kept, are gone"
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while watching.changed().await.is_ok() {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "a subscriber of a deleted run sees it close"
    );
    assert_eq!(
        journal.tombstone(&gone).await.unwrap(),
        Some(tombstone.clone()),
        "the tombstone is kept"
    );
    assert_eq!(journal.tombstone(&kept).await.unwrap(), None);
    assert_eq!(
        journal.delete(&gone, Deletion::default()).await.unwrap(),
        tombstone,
        "deleting again answers the same tombstone"
    );
    match journal.append(&gone, Seq(0), vec![created()]).await {
        Err(JournalError::RunDeleted { run }) => assert_eq!(run, gone),
        other => panic!("a deleted run's id must not be used again, got {other:?}"),
    }
    match journal
        .delete(&run("delete-never"), Deletion::default())
        .await
    {
        Err(JournalError::NoSuchRun { .. }) => {}
        other => panic!("deleting a run that never was must say so, got {other:?}"),
    }
    let events = journal.read(&kept, Seq(0)).await.unwrap();
    assert_eq!(
        events.len(),
        2,
        "the other run is whole and its chain verifies"
    );
    journal
        .append(&kept, Seq(2), vec![completed("t1")])
        .await
        .expect("the other run goes on");
}

async fn a_definition_is_kept_once_per_digest(journal: Arc<dyn Journal>) {
    let first = json!({"agent": {"engine": "echo", "system_prompt": "Be brief."}});
    let second = json!({"agent": {"engine": "echo"}});
    assert_eq!(journal.definition("sha256:aa").await.unwrap(), None);
    journal.keep_definition("sha256:aa", &first).await.unwrap();
    journal.keep_definition("sha256:aa", &second).await.unwrap();
    journal.keep_definition("sha256:bb", &second).await.unwrap();
    assert_eq!(
        journal.definition("sha256:aa").await.unwrap(),
        Some(first),
        "a digest keeps the document it was first kept with"
    );
    assert_eq!(journal.definition("sha256:bb").await.unwrap(), Some(second));
}
