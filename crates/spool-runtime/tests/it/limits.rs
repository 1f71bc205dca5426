//! `[limits]`: how large one run's history may grow, what it costs per
//! turn, and what happens near and past a limit.

use std::sync::Arc;

use spool_journal::event::Effect;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::agent::Limits;
use spool_runtime::{ErrorKind, MessageRequest, Runtime};

use crate::support::*;

fn message(text: &str) -> MessageRequest {
    MessageRequest {
        text: text.into(),
        ..MessageRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_event_limit_refuses_new_input_with_run_too_large_after_saying_it_was_near()
{
    let limits = Limits {
        max_events: 20,
        max_bytes: u64::MAX,
        warn_at: 0.5,
    };
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .limits(limits)
        .build();
    let (run, turn) = begin(&runtime, "hello").await;
    settle(&runtime, &run, &turn).await;
    let mut was_near = false;
    for i in 0..20 {
        let before = runtime.detail(&run).await.unwrap();
        match runtime.send(&run, message(&format!("turn {i}"))).await {
            Ok(accepted) => {
                assert!(
                    before.events < 20,
                    "a run at {} events took input",
                    before.events
                );
                was_near |= before.near_limit;
                assert_eq!(
                    before.near_limit,
                    before.events >= 10,
                    "near_limit says so past half the limit ({} events)",
                    before.events
                );
                let spool_runtime::Accepted::Started { turn, .. } = accepted else {
                    panic!("an idle run starts a turn");
                };
                settle(&runtime, &run, &turn).await;
            }
            Err(refused) => {
                assert_eq!(refused.kind(), ErrorKind::RunTooLarge);
                assert!(before.events >= 20, "refused at {} events", before.events);
                assert!(was_near, "the run was said to be near its limit first");
                let message = refused.to_string();
                assert!(
                    message.contains("fork"),
                    "the refusal says what to do: {message}"
                );
                return;
            }
        }
    }
    panic!("the run never reached its limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_byte_limit_refuses_new_input_too() {
    let limits = Limits {
        max_events: u64::MAX,
        max_bytes: 4_000,
        warn_at: 0.8,
    };
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new()))
        .limits(limits)
        .build();
    let (run, turn) = begin(&runtime, &"x".repeat(5_000)).await;
    settle(&runtime, &run, &turn).await;
    let detail = runtime.detail(&run).await.unwrap();
    assert!(
        detail.bytes > 5_000 && detail.near_limit,
        "{} bytes",
        detail.bytes
    );
    let refused = runtime.send(&run, message("more")).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::RunTooLarge);
}

/// A script of `turns` turns, each a tool call and an answer.
fn tool_turns(turns: usize) -> String {
    let mut script = String::new();
    for turn in 0..turns {
        script.push_str(&format!(
            "{{\"tool_calls\": [{{\"id\": \"c{turn}\", \"name\": \"lookup\", \"arguments\": {{\"q\": \"question {turn}\"}}}}], \"usage\": {{\"input_tokens\": 900, \"output_tokens\": 40}}}}\n"
        ));
        script.push_str(&format!(
            "{{\"text\": \"The answer to question {turn} is in the record.\", \"usage\": {{\"input_tokens\": 950, \"output_tokens\": 30}}}}\n"
        ));
    }
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_turns_with_tools_grow_the_journal_by_the_same_bytes_each_turn() {
    const TURNS: usize = 1_000;
    let (lookup, _) = Counting::new("lookup", Effect::Read);
    let runtime = runtime_with(
        Arc::new(MemoryJournal::new()),
        &tool_turns(TURNS),
        tools_with(vec![lookup]),
    );
    let (run, turn) = begin(&runtime, "question 0").await;
    settle(&runtime, &run, &turn).await;
    let first = runtime.detail(&run).await.unwrap().bytes;
    let mut at_tenth = 0;
    for i in 1..TURNS {
        let view = next_turn(&runtime, &run, &format!("question {i}")).await;
        assert_eq!(
            view.response.as_deref(),
            Some(format!("The answer to question {i} is in the record.").as_str())
        );
        if i == TURNS / 10 {
            at_tenth = runtime.detail(&run).await.unwrap().bytes;
        }
    }
    let detail = runtime.detail(&run).await.unwrap();
    let per_turn_early = (at_tenth - first) / (TURNS as u64 / 10 - 1);
    let per_turn_late = (detail.bytes - at_tenth) / (TURNS as u64 - TURNS as u64 / 10);
    println!(
        "a {TURNS}-turn run with a tool call per turn: {} events, {} bytes of journal ({} per turn early, {} per turn late)",
        detail.events, detail.bytes, per_turn_early, per_turn_late
    );
    // What a turn adds does not grow with the run: no model call stores
    // the conversation again (the digits of longer ids and positions
    // aside).
    assert!(
        per_turn_late <= per_turn_early + per_turn_early / 10,
        "a late turn adds {per_turn_late} bytes, an early one {per_turn_early}"
    );
}
