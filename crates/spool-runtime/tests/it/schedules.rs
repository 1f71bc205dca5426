//! Schedules: firings on time under paused time, exactly once across a
//! crash on either side of delivery, external ids once, catch-up once.

use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use spool_journal::event::{Delivery, FireKind};
use spool_journal::store::BoxFuture;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Address, Envelope, Event, Journal, JournalError, RunId, Seq};
use spool_runtime::schedule::{Clock, ScheduleDefinition, Scheduler, Trigger};
use spool_runtime::{ErrorKind, Runtime};

use crate::support::PATIENCE;

fn definition(name: &str, cron: &str, address: Option<&str>) -> ScheduleDefinition {
    ScheduleDefinition {
        name: name.into(),
        cron: cron.into(),
        time_zone: "UTC".into(),
        text: "Check the queue.".into(),
        address: address.map(str::to_owned),
        context: Vec::new(),
        overlap: Default::default(),
        catch_up: Default::default(),
    }
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// Waits until the scheduler has recorded `n` firings.
async fn firings(scheduler: &Scheduler, n: u64) {
    let mut fired = scheduler.watch_firings();
    tokio::time::timeout(PATIENCE, fired.wait_for(|count| *count >= n))
        .await
        .expect("the firings happen in time")
        .unwrap();
}

/// The turns started in `run` whose input came from a schedule.
async fn scheduled_turns(journal: &dyn Journal, run: &RunId) -> usize {
    journal
        .read(run, Seq(0))
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(&e.event, Event::TurnStarted(t) if t.context.iter().any(|c| c.starts_with("Sent by schedule"))))
        .count()
}

async fn run_at(journal: &dyn Journal, name: &str) -> RunId {
    journal
        .find_address(&Address::new("http", name))
        .await
        .unwrap()
        .expect("the schedule's address is bound")
}

#[tokio::test(start_paused = true)]
async fn a_schedule_every_second_fires_on_time_under_paused_time() {
    let journal = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(journal.clone()).build();
    let clock = Clock::starting_at(at("2026-01-01T00:00:00.25Z"));
    let scheduler = Scheduler::start(
        &runtime,
        &[definition("tick", "* * * * * *", Some("ticker"))],
        clock,
    )
    .await
    .unwrap();
    firings(&scheduler, 3).await;
    let view = scheduler.get("tick").await.unwrap();
    let due: Vec<String> = view
        .history
        .iter()
        .map(|f| {
            Timestamp::from_nanosecond(f.scheduled_at.unix_timestamp_nanos())
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        due[..3],
        [
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:02Z",
            "2026-01-01T00:00:03Z"
        ]
    );
    for firing in &view.history[..3] {
        assert_eq!(firing.kind, FireKind::Cron);
        assert_eq!(firing.fired_at, firing.scheduled_at, "fired at its instant");
        assert!(
            matches!(firing.delivery, Some(Delivery::Started { .. })),
            "{firing:?}"
        );
    }
    let run = run_at(&*journal, "ticker").await;
    assert!(scheduled_turns(&*journal, &run).await >= 3);
    assert!(view.next_fire_at.is_some());
}

// A current-thread runtime runs the schedule's own task only when the test
// yields, so the listing here comes before it, as a request can on a busy
// server.
#[tokio::test(start_paused = true)]
async fn a_schedule_listed_at_once_after_start_says_its_next_firing() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let clock = Clock::starting_at(at("2026-12-01T02:40:00Z"));
    let scheduler = Scheduler::start(&runtime, &[definition("nightly", "0 3 * * *", None)], clock)
        .await
        .unwrap();
    let view = scheduler.get("nightly").await.unwrap();
    let next = view
        .next_fire_at
        .expect("the next firing is known at start");
    assert_eq!(
        Timestamp::from_nanosecond(next.unix_timestamp_nanos())
            .unwrap()
            .to_string(),
        "2026-12-01T03:00:00Z"
    );
}

/// A journal that refuses the first append `refuse` picks, once: what a
/// process killed just before that write leaves behind.
struct Crashing {
    inner: Arc<MemoryJournal>,
    refuse: Mutex<Option<Refuse>>,
}

/// Picks the append a [`Crashing`] journal dies on.
type Refuse = Box<dyn Fn(&[Event]) -> bool + Send>;

impl Crashing {
    fn new(inner: Arc<MemoryJournal>, refuse: impl Fn(&[Event]) -> bool + Send + 'static) -> Self {
        Self {
            inner,
            refuse: Mutex::new(Some(Box::new(refuse))),
        }
    }
}

impl Journal for Crashing {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        let mut refuse = self.refuse.lock().unwrap();
        if refuse.as_ref().is_some_and(|f| f(&events)) {
            *refuse = None;
            return Box::pin(async { Err(JournalError::storage("killed here")) });
        }
        self.inner.append(run, expected, events)
    }

    fn claim<'a>(
        &'a self,
        key: &'a spool_journal::store::ClaimKey,
        holder: &'a spool_journal::store::CallRef,
    ) -> BoxFuture<'a, Result<spool_journal::store::Claim, JournalError>> {
        self.inner.claim(key, holder)
    }

    spool_journal::forward_journal_reads!(inner);
}

/// Fires `inbox` by hand on a journal that dies at the write `refuse`
/// picks, then starts again on what it left: the scheduled turns the
/// address's run ends up with.
async fn crash_and_restart(refuse: impl Fn(&[Event]) -> bool + Send + 'static) -> usize {
    let memory = Arc::new(MemoryJournal::new());
    let schedules = [definition("inbox", "0 0 1 1 *", Some("inbox"))];
    {
        let crashing = Arc::new(Crashing::new(memory.clone(), refuse));
        let runtime = Runtime::builder(crashing).build();
        let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
            .await
            .unwrap();
        let error = scheduler
            .trigger("inbox", Trigger::Manual)
            .await
            .expect_err("the process dies during the firing");
        assert!(error.to_string().contains("killed here"), "{error}");
        // What was started runs to its end before the next process takes
        // the journal over, as recovery would drive it.
        if let Ok(run) = memory.find_address(&Address::new("http", "inbox")).await
            && let Some(run) = run
        {
            let view = runtime.get(&run).await.unwrap();
            if let Some(turn) = view.turn_id {
                crate::support::settle(&runtime, &run, &turn).await;
            }
        }
    }
    for _ in 0..2 {
        let runtime = Runtime::builder(memory.clone()).build();
        runtime.recover().await.unwrap();
        let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
            .await
            .unwrap();
        let view = scheduler.get("inbox").await.unwrap();
        let firing = view.history.last().expect("the firing was recorded");
        assert_eq!(firing.kind, FireKind::Manual);
        let Some(Delivery::Started { run_id, turn_id }) = &firing.delivery else {
            panic!("settled at restart as started: {firing:?}");
        };
        if let Some(turn) = turn_id {
            crate::support::settle(&runtime, run_id, turn).await;
        }
    }
    let run = run_at(&*memory, "inbox").await;
    scheduled_turns(&*memory, &run).await
}

#[tokio::test]
async fn a_firing_recorded_but_not_delivered_before_a_crash_is_delivered_once_at_restart() {
    // The process dies on the message's write, after the firing's record.
    let turns =
        crash_and_restart(|events| events.iter().any(|e| matches!(e, Event::TurnStarted(_)))).await;
    assert_eq!(turns, 1);
}

#[tokio::test]
async fn a_firing_delivered_before_a_crash_is_not_delivered_again_at_restart() {
    // The process dies on the outcome's record, after the message's write.
    let turns = crash_and_restart(|events| {
        events
            .iter()
            .any(|e| matches!(e, Event::ScheduleDelivered(_)))
    })
    .await;
    assert_eq!(turns, 1);
}

#[tokio::test]
async fn a_firing_the_journal_refused_to_deliver_is_delivered_before_the_next_one() {
    let memory = Arc::new(MemoryJournal::new());
    let crashing = Arc::new(Crashing::new(memory.clone(), |events| {
        events.iter().any(|e| matches!(e, Event::TurnStarted(_)))
    }));
    let runtime = Runtime::builder(crashing).build();
    let schedules = [definition("inbox", "0 0 1 1 *", Some("inbox"))];
    let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    let refused = scheduler.trigger("inbox", Trigger::Manual).await;
    assert!(refused.is_err());
    let in_doubt = scheduler.get("inbox").await.unwrap().history;
    assert_eq!(in_doubt.len(), 1);
    assert!(in_doubt[0].delivery.is_none(), "in doubt until settled");
    scheduler.trigger("inbox", Trigger::Manual).await.unwrap();
    let history = scheduler.get("inbox").await.unwrap().history;
    assert_eq!(history[0].fire_id, in_doubt[0].fire_id);
    assert!(
        matches!(history[0].delivery, Some(Delivery::Started { .. })),
        "the refused firing was delivered first: {history:?}"
    );
    // The second met the first's turn (overlap = skip) or came after it.
    assert!(history[1].delivery.is_some(), "{history:?}");
    let run = run_at(&*memory, "inbox").await;
    assert!(scheduled_turns(&*memory, &run).await >= 1);
}

#[tokio::test]
async fn a_fresh_run_firing_in_doubt_is_found_by_its_operation_id() {
    let memory = Arc::new(MemoryJournal::new());
    let schedules = [definition("report", "0 0 1 1 *", None)];
    {
        let crashing = Arc::new(Crashing::new(memory.clone(), |events| {
            events
                .iter()
                .any(|e| matches!(e, Event::ScheduleDelivered(_)))
        }));
        let runtime = Runtime::builder(crashing).build();
        let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
            .await
            .unwrap();
        scheduler
            .trigger("report", Trigger::Manual)
            .await
            .expect_err("the process dies during the firing");
    }
    let runtime = Runtime::builder(memory.clone()).build();
    runtime.recover().await.unwrap();
    let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    let view = scheduler.get("report").await.unwrap();
    let Some(Delivery::Started { run_id, .. }) = &view.history[0].delivery else {
        panic!("{view:?}");
    };
    // One run was created for the firing, and it is the one recorded.
    let scheduled: Vec<_> = memory
        .runs()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.title.as_deref().is_some_and(|t| t.starts_with("report ")))
        .collect();
    assert_eq!(scheduled.len(), 1);
    assert_eq!(&scheduled[0].run_id, run_id);
}

#[tokio::test]
async fn a_duplicate_external_trigger_id_fires_once() {
    let journal = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(journal.clone()).build();
    let schedules = [definition("sync", "0 0 1 1 *", Some("sync"))];
    let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    let external = || Trigger::External {
        id: "job-7".into(),
        scheduled_at: time::macros::datetime!(2026-11-30 07:00 UTC),
    };
    let first = scheduler.trigger("sync", external()).await.unwrap();
    assert!(!first.replayed);
    let again = scheduler.trigger("sync", external()).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.firing.fire_id, first.firing.fire_id);
    // And after a restart, from the record run.
    drop(scheduler);
    let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    assert!(
        scheduler
            .trigger("sync", external())
            .await
            .unwrap()
            .replayed
    );
    let run = run_at(&*journal, "sync").await;
    assert_eq!(scheduled_turns(&*journal, &run).await, 1);
}

#[tokio::test(start_paused = true)]
async fn occurrences_missed_while_down_fire_once_at_start_unless_catch_up_is_skip() {
    let journal = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(journal.clone()).build();
    let minutely = [definition("minutely", "0 * * * * *", Some("minutely"))];
    {
        let clock = Clock::starting_at(at("2026-01-01T00:00:50Z"));
        let scheduler = Scheduler::start(&runtime, &minutely, clock).await.unwrap();
        firings(&scheduler, 1).await;
    }
    // Down from 00:01 to 00:10:30: nine occurrences missed.
    let clock = Clock::starting_at(at("2026-01-01T00:10:30Z"));
    let scheduler = Scheduler::start(&runtime, &minutely, clock).await.unwrap();
    let view = scheduler.get("minutely").await.unwrap();
    let kinds: Vec<_> = view.history.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FireKind::Cron, FireKind::CatchUp]);
    assert_eq!(
        view.history[1].fire_id, "cron:2026-01-01T00:10:00Z",
        "the latest missed occurrence"
    );
    drop(scheduler);

    let mut skipping = minutely.clone();
    skipping[0].catch_up = spool_runtime::schedule::CatchUp::Skip;
    let clock = Clock::starting_at(at("2026-01-01T00:20:30Z"));
    let scheduler = Scheduler::start(&runtime, &skipping, clock).await.unwrap();
    assert_eq!(scheduler.get("minutely").await.unwrap().history.len(), 2);
}

#[tokio::test]
async fn a_busy_address_skips_a_firing_when_overlap_is_skip() {
    let journal = Arc::new(MemoryJournal::new());
    // The model asks a person: the run waits, so a firing cannot start.
    let runtime = crate::support::runtime_with(
        journal.clone(),
        r#"{"tool_calls":[{"id":"q","name":"ask_human","arguments":{"prompt":"Which region?"}}]}"#,
        spool_runtime::Tools::builtin(),
    );
    let schedules = [definition("poke", "0 0 1 1 *", Some("poke"))];
    let scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    let first = scheduler.trigger("poke", Trigger::Manual).await.unwrap();
    let Some(Delivery::Started {
        run_id,
        turn_id: Some(turn),
    }) = first.firing.delivery
    else {
        panic!("{first:?}");
    };
    crate::support::settle(&runtime, &run_id, &turn).await;
    let second = scheduler.trigger("poke", Trigger::Manual).await.unwrap();
    assert!(
        matches!(&second.firing.delivery, Some(Delivery::Skipped { reason }) if reason.contains("in progress")),
        "{second:?}"
    );
}

#[tokio::test]
async fn a_schedules_record_run_is_reached_by_no_caller() {
    let journal = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(journal.clone()).build();
    let schedules = [definition("quiet", "0 0 1 1 *", None)];
    let _scheduler = Scheduler::start(&runtime, &schedules, Clock::system())
        .await
        .unwrap();
    let record = journal
        .find_address(&Address::new(
            spool_runtime::schedule::RECORD_NAMESPACE,
            "quiet",
        ))
        .await
        .unwrap()
        .unwrap();
    let sent = runtime
        .send(
            &record,
            spool_runtime::MessageRequest {
                text: "hello".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(sent.kind(), ErrorKind::RunNotFound);
    assert_eq!(
        runtime.get(&record).await.unwrap_err().kind(),
        ErrorKind::RunNotFound
    );
}

#[test]
fn a_definition_with_a_bad_cron_zone_or_name_is_refused_naming_it() {
    let check = |d: ScheduleDefinition| {
        spool_runtime::schedule::check(&[d])
            .unwrap_err()
            .to_string()
    };
    assert!(check(definition("x", "61 * * * *", None)).contains("cron expression"));
    let mut zone = definition("x", "* * * * *", None);
    zone.time_zone = "Mars/Olympus".into();
    assert!(check(zone).contains("time zone `Mars/Olympus`"));
    assert!(check(definition("no spaces", "* * * * *", None)).contains("schedule name"));
    let twice = [
        definition("a", "* * * * *", None),
        definition("a", "* * * * *", None),
    ];
    assert!(
        spool_runtime::schedule::check(&twice)
            .unwrap_err()
            .to_string()
            .contains("two schedules")
    );
    let toml = "[[schedule]]\nname = \"a\"\ncron = \"* * * * *\"\ntext = \"hi\"\nevery = 5\n";
    let error = spool_runtime::agent::AgentDefinition::from_toml(toml)
        .unwrap_err()
        .to_string();
    assert!(error.contains("every"), "{error}");
}
