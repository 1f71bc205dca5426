//! The event hub: a cursor gets the journal after it, then live events,
//! with no gap and no duplicate; deltas stream before their completion.

use std::sync::Arc;

use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Seq};
use spool_runtime::engine::Delta;
use spool_runtime::hub::StreamItem;
use spool_runtime::{Accepted, MessageRequest, Runtime};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_gets_the_journal_after_it_then_live_events_with_no_gap_or_duplicate() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let (run, turn) = begin(&runtime, "one").await;
    settle(&runtime, &run, &turn).await;
    let mut stream = runtime.subscribe(&run, Some(Seq(1))).await.unwrap();
    let Accepted::Started { turn: second, .. } = runtime
        .send(
            &run,
            MessageRequest {
                text: "two".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    let mut seqs = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            if let StreamItem::Event(envelope) = item {
                seqs.push(envelope.seq.0);
                if matches!(&envelope.event, Event::TurnCompleted(done) if done.turn_id == second) {
                    break;
                }
            }
        }
    })
    .await
    .expect("the second turn's events arrive");
    let expected: Vec<u64> = (2..=seqs.last().copied().unwrap()).collect();
    assert_eq!(
        seqs, expected,
        "every event after the cursor, once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_streams_as_deltas_between_the_request_and_its_completion() {
    let runtime = scripted(r#"{"text": "Paris is the capital of France."}"#);
    let mut stream = subscribed_and_asked(&runtime, "stream-test", "capital?").await;
    let mut order = Vec::new();
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            match item {
                StreamItem::Delta(delta) => {
                    if let Delta::Text(piece) = delta.delta {
                        text.push_str(&piece);
                        order.push("delta");
                    }
                }
                StreamItem::Event(envelope) => {
                    order.push(envelope.event.kind());
                    if envelope.event.kind() == "turn_completed" {
                        break;
                    }
                }
                StreamItem::Lagged { .. } => panic!("one subscriber cannot lag this little"),
            }
        }
    })
    .await
    .expect("the turn streams and completes");
    assert_eq!(text, "Paris is the capital of France.");
    let first_delta = order.iter().position(|k| *k == "delta").unwrap();
    let requested = order
        .iter()
        .position(|k| *k == "model_call_requested")
        .unwrap();
    let completed = order
        .iter()
        .position(|k| *k == "model_call_completed")
        .unwrap();
    assert!(
        requested < first_delta && first_delta < completed,
        "{order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_is_told_it_lagged_and_resumes_from_its_cursor_without_a_gap()
 {
    // Far more deltas than a subscriber's queue holds, read only afterwards.
    let words = vec!["w"; spool_runtime::hub::DELTA_QUEUE * 3].join(" ");
    let runtime = scripted(&format!(r#"{{"text": "{words}"}}"#));
    let pending = runtime
        .ensure(&spool_journal::Address::new("http", "slow-reader"))
        .await
        .unwrap();
    let mut stream = runtime
        .subscribe(&pending.run_id, pending.cursor)
        .await
        .unwrap();
    let Accepted::Started { turn, .. } = runtime
        .send(
            &pending.run_id,
            MessageRequest {
                text: "talk".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    settle(&runtime, &pending.run_id, &turn).await;
    let mut items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            items.push(item);
        }
    })
    .await
    .expect("a lagging stream ends rather than waiting forever");
    let Some(StreamItem::Lagged { last }) = items.last().cloned() else {
        panic!("the stream ends with Lagged, got {:?}", items.last())
    };
    assert!(
        items.len() <= spool_runtime::hub::DELTA_QUEUE + 64,
        "nothing buffered past the bound: {}",
        items.len()
    );
    // Resuming from the reported cursor delivers exactly the journal's
    // events after it (there may be none left), in order, with no gap.
    let from = last.map_or(0, |s| s.0 + 1);
    let total = runtime
        .get(&pending.run_id)
        .await
        .unwrap()
        .cursor
        .unwrap()
        .0
        + 1;
    let mut resumed = runtime.subscribe(&pending.run_id, last).await.unwrap();
    let mut seqs = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while (seqs.len() as u64) < total - from {
            match resumed.next().await {
                Some(StreamItem::Event(envelope)) => seqs.push(envelope.seq.0),
                Some(_) => {}
                None => break,
            }
        }
    })
    .await
    .expect("the resumed stream delivers the rest of the journal");
    assert_eq!(
        seqs,
        (from..total).collect::<Vec<_>>(),
        "resumes right after the last event delivered, with no gap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_streams_start_arguments_and_done_deltas() {
    let runtime = scripted(
        r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Region?"}}]}"#,
    );
    let mut stream = subscribed_and_asked(&runtime, "tool-deltas", "ask").await;
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            match item {
                StreamItem::Delta(delta) => seen.push(delta.delta),
                StreamItem::Event(envelope) if envelope.event.kind() == "suspended" => break,
                _ => {}
            }
        }
    })
    .await
    .expect("the tool call streams and the run parks");
    assert_eq!(
        seen,
        [
            Delta::ToolCallStart {
                id: "c1".into(),
                name: "ask_human".into()
            },
            Delta::ToolCallArguments {
                id: "c1".into(),
                fragment: r#"{"prompt":"Region?"}"#.into()
            },
            Delta::ToolCallDone {
                id: "c1".into(),
                name: "ask_human".into(),
                arguments: r#"{"prompt":"Region?"}"#.into()
            },
        ]
    );
}

/// A journal that counts its reads and appends, to show what subscribers
/// cost it.
struct Counting {
    inner: MemoryJournal,
    reads: std::sync::atomic::AtomicUsize,
    appends: std::sync::atomic::AtomicUsize,
}

impl spool_journal::Journal for Counting {
    fn append<'a>(
        &'a self,
        run: &'a spool_journal::RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<Vec<spool_journal::Envelope>, spool_journal::JournalError>,
    > {
        self.appends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.append(run, expected, events)
    }

    fn read<'a>(
        &'a self,
        run: &'a spool_journal::RunId,
        from: Seq,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<Vec<spool_journal::Envelope>, spool_journal::JournalError>,
    > {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.read(run, from)
    }

    fn runs(
        &self,
    ) -> spool_runtime::BoxFuture<
        '_,
        Result<Vec<spool_journal::store::RunSummary>, spool_journal::JournalError>,
    > {
        self.inner.runs()
    }

    spool_journal::forward_journal_lifecycle!(inner);

    fn addresses(
        &self,
    ) -> spool_runtime::BoxFuture<
        '_,
        Result<Vec<(spool_journal::Address, spool_journal::RunId)>, spool_journal::JournalError>,
    > {
        self.inner.addresses()
    }

    fn find_address<'a>(
        &'a self,
        address: &'a spool_journal::Address,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<Option<spool_journal::RunId>, spool_journal::JournalError>,
    > {
        self.inner.find_address(address)
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a spool_journal::Principal,
        operation_id: &'a str,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<Option<spool_journal::RunId>, spool_journal::JournalError>,
    > {
        self.inner.find_operation(principal, operation_id)
    }

    fn claim<'a>(
        &'a self,
        key: &'a spool_journal::store::ClaimKey,
        holder: &'a spool_journal::store::CallRef,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<spool_journal::store::Claim, spool_journal::JournalError>,
    > {
        self.inner.claim(key, holder)
    }

    fn subscribe<'a>(
        &'a self,
        run: &'a spool_journal::RunId,
    ) -> spool_runtime::BoxFuture<
        'a,
        Result<tokio::sync::watch::Receiver<Seq>, spool_journal::JournalError>,
    > {
        self.inner.subscribe(run)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_subscribers_share_one_journal_read_per_append_and_each_gets_every_event_in_order() {
    use std::sync::atomic::Ordering::SeqCst;
    const SUBSCRIBERS: usize = 50;
    let journal = Arc::new(Counting {
        inner: MemoryJournal::new(),
        reads: 0.into(),
        appends: 0.into(),
    });
    let runtime = runtime_with(
        journal.clone(),
        r#"{"text": "a shared answer"}"#,
        spool_runtime::Tools::builtin(),
    );
    let pending = runtime
        .ensure(&spool_journal::Address::new("http", "crowd"))
        .await
        .unwrap();
    let mut readers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut stream = runtime
            .subscribe(&pending.run_id, pending.cursor)
            .await
            .unwrap();
        readers.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            while let Some(item) = stream.next().await {
                if let StreamItem::Event(envelope) = item {
                    seqs.push(envelope.seq.0);
                    if matches!(envelope.event, Event::TurnCompleted(_)) {
                        return seqs;
                    }
                }
            }
            seqs
        }));
    }
    let (reads, appends) = (journal.reads.load(SeqCst), journal.appends.load(SeqCst));
    runtime
        .send(
            &pending.run_id,
            MessageRequest {
                text: "go".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    let mut orders = Vec::new();
    for reader in readers {
        orders.push(
            tokio::time::timeout(PATIENCE, reader)
                .await
                .expect("every subscriber sees the turn complete")
                .unwrap(),
        );
    }
    let first = pending.cursor.map_or(0, |c| c.0 + 1);
    let expected: Vec<u64> = (first..=*orders[0].last().unwrap()).collect();
    for order in &orders {
        assert_eq!(order, &expected, "every event once, in order");
    }
    let appended = journal.appends.load(SeqCst) - appends;
    let read = journal.reads.load(SeqCst) - reads;
    // The turn driver reads the run itself; subscribers add about one read
    // per append between them, not one each.
    assert!(
        read < SUBSCRIBERS,
        "{read} journal reads for {appended} appends and {SUBSCRIBERS} subscribers"
    );
}

/// What `stream` delivers up to and including the turn's completion, as
/// event positions and delta numbers in order.
async fn through_completion(stream: &mut spool_runtime::hub::Subscription) -> Vec<String> {
    let mut items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            match item {
                StreamItem::Delta(delta) => items.push(format!("delta {}", delta.n)),
                StreamItem::Event(envelope) => {
                    items.push(format!("event {}", envelope.seq.0));
                    if envelope.event.kind() == "turn_completed" {
                        return;
                    }
                }
                StreamItem::Lagged { .. } => panic!("one subscriber cannot lag this little"),
            }
        }
        panic!("the stream ended before the turn did");
    })
    .await
    .expect("the turn streams and completes");
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_taken_mid_answer_delivers_what_its_origin_does_from_there() {
    let runtime = scripted(r#"{"text": "one two three four five six seven eight"}"#);
    let mut origin = subscribed_and_asked(&runtime, "fork-test", "count").await;
    // Forked once the answer has begun: deltas already sent and not yet
    // taken by the origin are the fork's too.
    tokio::time::timeout(PATIENCE, async {
        while !matches!(origin.next().await, Some(StreamItem::Delta(_))) {}
    })
    .await
    .expect("the answer streams");
    let mut fork = origin.fork();
    let from_origin = through_completion(&mut origin).await;
    let from_fork = through_completion(&mut fork).await;
    assert!(
        from_origin.iter().any(|item| item.starts_with("delta")),
        "{from_origin:?}"
    );
    assert_eq!(
        from_fork, from_origin,
        "the same items, once each, in order"
    );
}

/// A subscription to the run at `address`, from its position now, and
/// then `text` sent to it.
async fn subscribed_and_asked(
    runtime: &Runtime,
    address: &str,
    text: &str,
) -> spool_runtime::hub::Subscription {
    let address = spool_journal::Address::new("http", address);
    let pending = runtime.ensure(&address).await.unwrap();
    let stream = runtime
        .subscribe(&pending.run_id, pending.cursor)
        .await
        .unwrap();
    runtime
        .send(
            &pending.run_id,
            MessageRequest {
                text: text.into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_steered_while_the_model_streams_leaves_the_rest_of_its_text_to_the_viewers() {
    // An event appended during a model call (here steered input) comes
    // after the place of that call's live text: the text streamed after it
    // still reaches a subscriber.
    let runtime = scripted(
        r#"{"text": "one two three four five six seven eight", "delay_ms": 20}
{"text": "and the steer"}"#,
    );
    let mut stream = subscribed_and_asked(&runtime, "steer-stream", "count").await;
    let mut text = String::new();
    let mut steered = false;
    let mut after_steer = 0;
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            match item {
                StreamItem::Delta(delta) => {
                    if let Delta::Text(piece) = delta.delta {
                        text.push_str(&piece);
                        if steered {
                            after_steer += 1;
                        } else {
                            steered = true;
                            runtime
                                .send(
                                    &delta_run(&runtime).await,
                                    MessageRequest {
                                        text: "and quickly".into(),
                                        policy: Some(spool_wire::run::TurnPolicy::Steer),
                                        ..MessageRequest::default()
                                    },
                                )
                                .await
                                .unwrap();
                        }
                    }
                }
                StreamItem::Event(envelope) => {
                    if envelope.event.kind() == "model_call_completed" {
                        break;
                    }
                }
                StreamItem::Lagged { .. } => panic!("one subscriber cannot lag this little"),
            }
        }
    })
    .await
    .expect("the model call streams and completes");
    assert!(
        after_steer > 0,
        "text after the steered input reached the viewer"
    );
    assert_eq!(text, "one two three four five six seven eight");
}

/// The one run of a runtime.
async fn delta_run(runtime: &Runtime) -> spool_journal::RunId {
    runtime.list().await.unwrap()[0].run_id.clone()
}
