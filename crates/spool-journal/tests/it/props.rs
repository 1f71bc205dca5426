//! Property tests: any interleaving of appends from many runs leaves each
//! run's log, and so its folded state, exactly as appending its events on
//! their own would.

use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::json;
use spool_journal::event::*;
use spool_journal::fold::fold;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Address, Event, Journal, Seq};
use spool_wire::run::SuspendKind;

use crate::support::*;

fn event(run: usize) -> impl Strategy<Value = Event> {
    prop_oneof![
        "[a-z ]{0,12}".prop_map(|input| started("t", &input)),
        (0u64..1000).prop_map(|n| model_completed(json!({"n": n}), n)),
        Just(Event::ToolCallRequested(tool_call("c", Effect::Read, None))),
        (0u64..9).prop_map(|n| tool_done("c", json!(n))),
        Just(Event::Suspended(suspended(
            "t",
            SuspendKind::Question,
            "why?"
        ))),
        Just(Event::Resumed(Resumed {
            turn_id: turn("t"),
            answers: vec![Answer::default()]
        })),
        Just(turn_done("t", "ok")),
        Just(Event::ContextCleared(ContextCleared {})),
        Just(Event::AddressBound(AddressBinding {
            address: Address::new("http", format!("a-{run}"))
        })),
        Just(Event::AddressUnbound(AddressBinding {
            address: Address::new("http", format!("a-{run}"))
        })),
    ]
}

/// Each run's events, cut into batches.
fn runs() -> impl Strategy<Value = Vec<Vec<Vec<Event>>>> {
    (1usize..5).prop_flat_map(|n| {
        (0..n)
            .map(|run| vec(vec(event(run), 1..4), 0..6))
            .collect::<Vec<_>>()
    })
}

fn fixed_clock() -> spool_journal::store::Clock {
    Arc::new(|| time::macros::datetime!(2026-11-29 10:00 UTC))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn interleaved_appends_fold_to_the_same_state_as_appending_each_run_alone(
        runs in runs(),
        order in vec(0usize..5, 0..64),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let ids: Vec<_> = (0..runs.len()).map(|i| run(&format!("run-{i}"))).collect();
            // Interleaved: batches go in in the order drawn (each run's own
            // batches keep their order), then whatever is left.
            let interleaved = MemoryJournal::with_clock(fixed_clock());
            let mut next: Vec<usize> = vec![0; runs.len()];
            let mut seqs: Vec<Seq> = vec![Seq(0); runs.len()];
            for (i, id) in ids.iter().enumerate() {
                interleaved.append(id, Seq(0), vec![created()]).await.unwrap();
                seqs[i] = Seq(1);
            }
            let picks = order.iter().map(|o| o % runs.len()).chain((0..runs.len()).flat_map(|i| std::iter::repeat_n(i, runs[i].len())));
            for i in picks {
                if let Some(batch) = runs[i].get(next[i]) {
                    let appended = interleaved.append(&ids[i], seqs[i], batch.clone()).await.unwrap();
                    seqs[i] = appended.last().unwrap().seq.next();
                    next[i] += 1;
                }
            }
            // Alone: each run into its own journal, one event at a time.
            for (i, id) in ids.iter().enumerate() {
                let alone = MemoryJournal::with_clock(fixed_clock());
                let mut seq = Seq(0);
                for event in std::iter::once(created()).chain(runs[i].iter().flatten().cloned()) {
                    alone.append(id, seq, vec![event]).await.unwrap();
                    seq = seq.next();
                }
                let together = interleaved.read(id, Seq(0)).await.unwrap();
                let by_itself = alone.read(id, Seq(0)).await.unwrap();
                prop_assert_eq!(&together, &by_itself);
                prop_assert_eq!(fold(&together), fold(&by_itself));
            }
            Ok(())
        })?;
    }
}
