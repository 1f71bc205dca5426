//! The runtime's in-memory runs: a command never reads a cached run's log
//! from the start, the cache stays within its bound, an evicted run is
//! read once and goes on where it was, and a turn recorded by an earlier
//! Spool (version-1 request hashes) replays without a divergence; a
//! one-turn run on a durable journal reads nothing back; and a model
//! call's journaled request holds what is new, not the whole prompt.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;
use spool_journal::event::{ModelCallRequested, RunCreated, TurnStarted};
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Address, Event, Journal, RunId, Seq};
use spool_runtime::{Accepted, MessageRequest, Runtime, StartRequest, Tools};
use spool_wire::run::TurnPolicy;

use crate::support::{Instrumented, begin, next_turn, settle};

#[tokio::test]
async fn no_command_reads_a_cached_runs_log_from_the_start() {
    let journal = Arc::new(Instrumented::default());
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>).build();
    let (run, first) = begin(&runtime, "hello 0").await;
    settle(&runtime, &run, &first).await;
    for n in 1..40 {
        let view = next_turn(&runtime, &run, &format!("hello {n}")).await;
        assert_eq!(
            view.response.as_deref(),
            Some(format!("echo: hello {n}").as_str())
        );
        runtime.get(&run).await.unwrap();
    }
    runtime.clear(&run).await.unwrap();
    let view = next_turn(&runtime, &run, "after the clear").await;
    assert_eq!(view.response.as_deref(), Some("echo: after the clear"));
    assert_eq!(
        journal.reads_from_start.load(Ordering::SeqCst),
        0,
        "a run this process created and kept cached is never read from its start"
    );
}

#[tokio::test]
async fn one_turn_runs_read_nothing_from_a_durable_journal() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(
        spool_journal::store::sqlite::SqliteJournal::open(dir.path(), Default::default()).unwrap(),
    );
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>).build();
    for n in 0..5 {
        let (run, turn) = begin(&runtime, &format!("hello {n}")).await;
        let view = settle(&runtime, &run, &turn).await;
        assert_eq!(
            view.response.as_deref(),
            Some(format!("echo: hello {n}").as_str())
        );
    }
    assert_eq!(
        journal.stats().reads,
        0,
        "starting a run and waiting for its turn's end read the journal"
    );
}

#[tokio::test]
async fn the_cache_holds_no_more_runs_than_its_bound_and_an_evicted_run_reads_back() {
    let journal = Arc::new(Instrumented::default());
    let runtime = Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>)
        .cached_runs(8)
        .build();
    let mut runs = Vec::new();
    // Pending runs have no driver, so nothing but this test holds them.
    for n in 0..50 {
        let view = runtime
            .ensure(&Address::new("test", format!("a{n}")))
            .await
            .unwrap();
        runs.push(view.run_id);
        assert!(
            runtime.cached_runs() <= 8,
            "{} runs cached after {n}",
            runtime.cached_runs()
        );
    }
    assert_eq!(journal.reads_from_start.load(Ordering::SeqCst), 0);
    // The first run was evicted long ago: it is read once, then cached.
    let view = runtime.get(&runs[0]).await.unwrap();
    assert_eq!(view.cursor, Some(Seq(0)));
    assert_eq!(journal.reads_from_start.load(Ordering::SeqCst), 1);
    let accepted = runtime
        .send(
            &runs[0],
            MessageRequest {
                text: "back".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    let Accepted::Started { turn, .. } = accepted else {
        panic!("a pending run starts a turn");
    };
    let view = settle(&runtime, &runs[0], &turn).await;
    assert_eq!(view.response.as_deref(), Some("echo: back"));
    assert_eq!(journal.reads_from_start.load(Ordering::SeqCst), 1);
    assert!(runtime.cached_runs() <= 8);
}

#[tokio::test]
async fn a_run_evicted_between_turns_continues_its_conversation() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runtime = Runtime::builder(Arc::clone(&journal))
        .cached_runs(1)
        .system_prompt("be brief")
        .build();
    let (run, first) = begin(&runtime, "one").await;
    settle(&runtime, &run, &first).await;
    // Another run takes the only place.
    let (other, other_turn) = begin(&runtime, "other").await;
    settle(&runtime, &other, &other_turn).await;
    let view = next_turn(&runtime, &run, "two").await;
    assert_eq!(view.response.as_deref(), Some("echo: two"));
    // The model saw the whole conversation, read back from the log: the
    // second request's hash chains over the first turn's messages.
    let log = journal.read(&run, Seq(0)).await.unwrap();
    let requests: Vec<&ModelCallRequested> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ModelCallRequested(r) => Some(r),
            _ => None,
        })
        .collect();
    let saw = spool_runtime::engine::ModelRequest::new(
        vec![
            spool_runtime::Message::System {
                content: "be brief".into(),
            },
            spool_runtime::Message::User {
                content: "one".into(),
            },
            spool_runtime::Message::Assistant {
                content: "echo: one".into(),
                tool_calls: vec![],
            },
            spool_runtime::Message::User {
                content: "two".into(),
            },
        ],
        Tools::builtin().specs(),
    );
    assert_eq!(requests[1].request_hash, saw.hash());
}

/// A run an earlier Spool left with a model call requested and not
/// answered, recorded with the version-1 request hash: the content hash of
/// the whole request's JSON, pinned here as that code computed it.
async fn older_spools_dangling_call(journal: &Arc<dyn Journal>, hash: &str) -> RunId {
    let run = RunId::new("run_from_v1").unwrap();
    let input = "hello from an older Spool";
    journal
        .append(
            &run,
            Seq(0),
            vec![
                Event::RunCreated(RunCreated::default()),
                Event::TurnStarted(TurnStarted {
                    turn_id: spool_journal::TurnId::new("turn_from_v1").unwrap(),
                    input: input.into(),
                    context: vec![],
                    policy: TurnPolicy::Steer,
                    from_queue: None,
                    operation_id: None,
                }),
                Event::ModelCallRequested(ModelCallRequested {
                    request_hash: hash.into(),
                    new_messages: vec![json!({"role": "user", "content": input})],
                }),
            ],
        )
        .await
        .unwrap();
    run
}

#[tokio::test]
async fn a_turn_recorded_with_version_1_request_hashes_resumes_without_a_divergence() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    // sha256 of `{"messages":[{"content":"hello from an older Spool","role":"user"}]}`.
    let v1 = "sha256:b0ba777bc16d7457a2dd20c2c9d087c4e91bdd17e9020b011ed23d5e04a6794c";
    let run = older_spools_dangling_call(&journal, v1).await;
    let runtime = Runtime::builder(Arc::clone(&journal))
        .tools(Tools::new())
        .build();
    assert_eq!(runtime.recover().await.unwrap().resumed, 1);
    let turn = spool_journal::TurnId::new("turn_from_v1").unwrap();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(
        view.response.as_deref(),
        Some("echo: hello from an older Spool")
    );
}

#[tokio::test]
async fn a_version_1_hash_that_does_not_match_is_still_a_divergence() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let run = older_spools_dangling_call(&journal, wrong).await;
    let runtime = Runtime::builder(Arc::clone(&journal))
        .tools(Tools::new())
        .build();
    runtime.recover().await.unwrap();
    let turn = spool_journal::TurnId::new("turn_from_v1").unwrap();
    let view = settle(&runtime, &run, &turn).await;
    assert_eq!(view.status, spool_journal::fold::Status::Failed);
    let log = journal.read(&run, Seq(0)).await.unwrap();
    let Some(Event::TurnFailed(failed)) = log.last().map(|e| &e.event) else {
        panic!("the turn fails: {log:?}");
    };
    assert!(failed.message.contains("diverged"), "{}", failed.message);
}

#[tokio::test]
async fn a_request_for_a_run_that_does_not_exist_keeps_nothing_in_memory() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    for n in 0..20 {
        let missing = RunId::new(format!("run_missing_{n}")).unwrap();
        assert!(runtime.get(&missing).await.is_err());
    }
    assert_eq!(runtime.cached_runs(), 0);
    let start = StartRequest {
        text: "real".into(),
        ..StartRequest::default()
    };
    runtime.start(start).await.unwrap();
    assert_eq!(runtime.cached_runs(), 1);
}

fn assistant_calling(id: &str, tool: &str, arguments: serde_json::Value) -> spool_runtime::Message {
    spool_runtime::Message::Assistant {
        content: String::new(),
        tool_calls: vec![spool_runtime::engine::ToolCall {
            id: id.into(),
            name: tool.into(),
            arguments,
        }],
    }
}

fn user(text: &str) -> spool_runtime::Message {
    spool_runtime::Message::User {
        content: text.into(),
    }
}

async fn request_hashes(journal: &Instrumented, run: &RunId) -> Vec<String> {
    journal
        .inner
        .read(run, Seq(0))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::ModelCallRequested(r) => Some(r.request_hash),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_parked_turn_resumes_with_its_events_read_back_from_the_turns_start_only() {
    let journal = Arc::new(Instrumented::default());
    let script = r#"{"text": "first done"}
{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}
{"text": "second done"}"#;
    let runtime = crate::support::runtime_with(
        Arc::clone(&journal) as Arc<dyn Journal>,
        script,
        Tools::builtin(),
    );
    let (run, first) = begin(&runtime, "one").await;
    settle(&runtime, &run, &first).await;
    let view = next_turn(&runtime, &run, "two").await;
    assert!(matches!(
        view.status,
        spool_journal::fold::Status::Waiting(_)
    ));
    runtime.get(&run).await.unwrap();
    assert_eq!(
        journal.reads_from_later.load(Ordering::SeqCst),
        0,
        "a parked run is answered from its state"
    );
    let turn_id = view.turn_id.unwrap();
    runtime
        .respond(
            &run,
            Some(&turn_id),
            vec![spool_journal::event::Answer {
                text: "eu".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    let view = settle(&runtime, &run, &turn_id).await;
    assert_eq!(view.response.as_deref(), Some("second done"));
    assert_eq!(journal.reads_from_start.load(Ordering::SeqCst), 0);
    assert_eq!(
        journal.reads_from_later.load(Ordering::SeqCst),
        1,
        "the answer read the parked turn back, once, from its start"
    );
    let hashes = request_hashes(&journal, &run).await;
    let resumed = spool_runtime::ModelRequest::new(
        vec![
            user("one"),
            spool_runtime::Message::Assistant {
                content: "first done".into(),
                tool_calls: vec![],
            },
            user("two"),
            assistant_calling("c1", "ask_human", json!({"prompt": "Which?"})),
            spool_runtime::Message::Tool {
                call_id: "c1".into(),
                content: "eu".into(),
            },
        ],
        Tools::builtin().specs(),
    );
    assert_eq!(
        hashes[2],
        resumed.hash(),
        "the resumed call saw the whole turn"
    );
}

#[tokio::test]
async fn a_parked_turn_cancelled_without_resuming_still_joins_the_models_history() {
    let journal = Arc::new(Instrumented::default());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}
{"text": "next done"}"#;
    let runtime = crate::support::runtime_with(
        Arc::clone(&journal) as Arc<dyn Journal>,
        script,
        Tools::builtin(),
    );
    let (run, parked) = begin(&runtime, "ask me").await;
    settle(&runtime, &run, &parked).await;
    let head = runtime.get(&run).await.unwrap().cursor;
    // Watched from the head, so the stream itself reads nothing from the start.
    let mut stream = runtime.subscribe(&run, head).await.unwrap();
    runtime.cancel(&run, Some(&parked)).await.unwrap();
    tokio::time::timeout(crate::support::PATIENCE, async {
        while runtime.get(&run).await.unwrap().status != spool_journal::fold::Status::Cancelled {
            stream.next().await.expect("the stream stays open");
        }
    })
    .await
    .expect("the parked turn ends cancelled in time");
    let view = next_turn(&runtime, &run, "next").await;
    assert_eq!(view.response.as_deref(), Some("next done"));
    let expected = spool_runtime::ModelRequest::new(
        vec![
            user("ask me"),
            assistant_calling("c1", "ask_human", json!({"prompt": "Which?"})),
            user("next"),
        ],
        Tools::builtin().specs(),
    );
    assert_eq!(request_hashes(&journal, &run).await[1], expected.hash());
    assert_eq!(
        journal.reads_from_start.load(Ordering::SeqCst),
        0,
        "the cancelled turn was read back from its start, not the run read again"
    );
}

/// Two runtimes on one journal, as two nodes of a cluster: a run one of
/// them changes reads as changed through the other, which had it cached,
/// only when the other knows the journal is shared.
#[tokio::test]
async fn a_runtime_on_a_shared_journal_never_answers_from_a_copy_another_process_outdated() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let driver = Runtime::builder(Arc::clone(&journal)).build();
    let (run, turn) = begin(&driver, "one").await;
    settle(&driver, &run, &turn).await;
    let shared = Runtime::builder(Arc::clone(&journal))
        .shared_journal(true)
        .build();
    let unshared = Runtime::builder(Arc::clone(&journal)).build();
    for reader in [&shared, &unshared] {
        let view = reader.snapshot(&run).await.unwrap().view;
        assert_eq!(view.response.as_deref(), Some("echo: one"));
    }
    next_turn(&driver, &run, "two").await;
    let view = shared.snapshot(&run).await.unwrap().view;
    assert_eq!(view.response.as_deref(), Some("echo: two"), "read again");
    // Without the setting, a runtime trusts its cache: right for a
    // journal it alone writes, and what this test contrasts.
    let view = unshared.snapshot(&run).await.unwrap().view;
    assert_eq!(view.response.as_deref(), Some("echo: one"));
}

#[tokio::test]
async fn recovering_the_interrupted_runs_reads_no_idle_runs_log() {
    let journal = Arc::new(Instrumented::default());
    let shared: Arc<dyn Journal> = Arc::clone(&journal) as Arc<dyn Journal>;
    {
        let first = Runtime::builder(Arc::clone(&shared)).build();
        for n in 0..3 {
            let (run, turn) = begin(&first, &format!("idle {n}")).await;
            settle(&first, &run, &turn).await;
        }
    }
    let v1 = "sha256:b0ba777bc16d7457a2dd20c2c9d087c4e91bdd17e9020b011ed23d5e04a6794c";
    let cut_off = older_spools_dangling_call(&shared, v1).await;
    let reads = || journal.reads_from_start.load(Ordering::SeqCst);

    let before = reads();
    let one_shot = Runtime::builder(Arc::clone(&shared))
        .tools(Tools::new())
        .build();
    assert_eq!(one_shot.recover_interrupted().await.unwrap().resumed, 1);
    let turn = spool_journal::TurnId::new("turn_from_v1").unwrap();
    settle(&one_shot, &cut_off, &turn).await;
    assert_eq!(reads() - before, 1, "only the cut-off run's log was read");
    drop(one_shot);

    // A full recovery, by contrast, reads every run that is not pending.
    let before = reads();
    let server = Runtime::builder(Arc::clone(&shared)).build();
    server.recover().await.unwrap();
    assert_eq!(reads() - before, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_calls_journaled_request_does_not_grow_with_the_runs_length() {
    // A hundred turns, each a tool call and an answer: two model calls a
    // turn, the second of each seeing the tool's result.
    let script: String = (0..100)
        .flat_map(|n| {
            [
                json!({"tool_calls": [{"id": format!("c{n}"), "name": "look", "arguments": {"n": n}}]}),
                json!({"text": format!("turn {n} done")}),
            ]
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (look, looks) = crate::support::Counting::new("look", spool_journal::event::Effect::Read);
    let runtime = crate::support::runtime_with(
        Arc::clone(&journal),
        &script,
        crate::support::tools_with(vec![look]),
    );
    let (run, first) = begin(&runtime, "turn 0").await;
    settle(&runtime, &run, &first).await;
    for n in 1..100 {
        next_turn(&runtime, &run, &format!("turn {n}")).await;
    }
    assert_eq!(looks.load(Ordering::SeqCst), 100);
    let sizes: Vec<usize> = journal
        .read(&run, Seq(0))
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(e.event, Event::ModelCallRequested(_)))
        .map(|e| e.event.to_bytes().len())
        .collect();
    assert_eq!(sizes.len(), 200);
    // Each request records only what is new since the call before (the
    // turn's message, or the tool's result): the last is no larger than
    // the early ones but for the digits of its numbers, where a request
    // recorded whole would be a hundred times larger.
    let early = *sizes[..4].iter().max().unwrap();
    let late = *sizes[196..].iter().max().unwrap();
    assert!(
        late <= early + 16,
        "a model call's journaled request grew with the run: {early} bytes early, {late} late"
    );
}
