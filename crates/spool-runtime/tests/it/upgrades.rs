//! Agents that change under running runs: a reload gives new runs the new
//! definition while runs in flight keep theirs (pinned) or move at their
//! next turn (`upgrade = "next_turn"`, recorded as `agent_changed`); a run
//! parked across a restart resumes on its own definition, built from the
//! journal's copy; a definition no run in memory holds is dropped.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use spool_journal::event::Answer;
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, RunId, Seq};
use spool_runtime::agent::Loaded;
use spool_runtime::engine::{
    CallContext, Deltas, EngineError, Message, ModelRequest, ModelResponse, ToolCall,
};
use spool_runtime::{
    AgentFactory, AgentSpec, BoxFuture, Engine, LiveTools, MessageRequest, Runtime, StartRequest,
};
use spool_wire::run::{SuspendKind, Upgrade};
use tokio_util::sync::CancellationToken;

use crate::support::{begin, next_turn, settle, until};

/// An engine that says which system prompt it was shown: "ask" makes it
/// ask the person, an answer ends the turn.
struct Says;

impl Engine for Says {
    fn call<'a>(
        &'a self,
        _: &'a CallContext,
        request: &'a ModelRequest,
        _: Deltas<'a>,
        _: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        let system = match request.messages().next() {
            Some(Message::System { content }) => content.clone(),
            _ => "no prompt".to_owned(),
        };
        let asking = matches!(request.messages().last(), Some(Message::User { content }) if content == "ask");
        let response = if asking {
            ModelResponse {
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "ask_human".into(),
                    arguments: json!({"prompt": "which?"}),
                }],
                ..ModelResponse::default()
            }
        } else {
            ModelResponse {
                text: format!("{system} answers"),
                ..ModelResponse::default()
            }
        };
        Box::pin(async move { Ok(response) })
    }
}

fn definition(prompt: &str, upgrade: &str) -> Loaded {
    let document = json!({"agent": {"system_prompt": prompt, "upgrade": upgrade}});
    Loaded::from_document(&document, PathBuf::new()).expect("a valid definition")
}

fn spec(loaded: &Loaded) -> AgentSpec {
    let tools = loaded.definition.tools(&loaded.base).expect("tools");
    AgentSpec::from_loaded(loaded, Arc::new(Says), LiveTools::new(tools))
}

/// Builds agents from the journal's copies, and says which it built.
#[derive(Default)]
struct Factory {
    built: Mutex<Vec<String>>,
}

impl AgentFactory for Factory {
    fn build<'a>(
        &'a self,
        digest: &'a str,
        document: &'a Value,
    ) -> BoxFuture<'a, Result<AgentSpec, String>> {
        Box::pin(async move {
            self.built.lock().unwrap().push(digest.to_owned());
            let loaded =
                Loaded::from_document(document, PathBuf::new()).map_err(|e| e.to_string())?;
            Ok(spec(&loaded))
        })
    }
}

fn runtime(journal: &Arc<dyn Journal>, agent: &Loaded, factory: &Arc<Factory>) -> Runtime {
    Runtime::builder(Arc::clone(journal))
        .agent_spec(spec(agent))
        .agent_factory(Arc::clone(factory) as Arc<dyn AgentFactory>)
        .build()
}

async fn kinds_after(journal: &Arc<dyn Journal>, run: &RunId, from: Seq) -> Vec<&'static str> {
    journal
        .read(run, from)
        .await
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reload_new_runs_start_on_the_new_definition_and_pinned_runs_keep_theirs() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (old, new) = (definition("old", "pinned"), definition("new", "pinned"));
    let factory = Arc::new(Factory::default());
    let runtime = runtime(&journal, &old, &factory);
    let (pinned, turn) = begin(&runtime, "hello").await;
    assert_eq!(
        settle(&runtime, &pinned, &turn).await.response.as_deref(),
        Some("old answers")
    );

    let previous = runtime.load_agent(spec(&new));
    assert_eq!(previous, Some(old.digest()));
    assert_eq!(runtime.agent_digest_now(), Some(new.digest()));
    assert_eq!(
        runtime.agents_in_memory(),
        vec![new.digest(), old.digest()],
        "the old definition stays while a run in memory runs on it"
    );

    let (fresh, turn) = begin(&runtime, "hello").await;
    assert_eq!(
        settle(&runtime, &fresh, &turn).await.response.as_deref(),
        Some("new answers")
    );
    let before = journal.read(&pinned, Seq(0)).await.unwrap().len();
    let view = next_turn(&runtime, &pinned, "again").await;
    assert_eq!(
        view.response.as_deref(),
        Some("old answers"),
        "a pinned run's next turn runs on the definition it started with"
    );
    assert!(
        !kinds_after(&journal, &pinned, Seq(before as u64))
            .await
            .contains(&"agent_changed")
    );
    assert_eq!(
        runtime.detail(&pinned).await.unwrap().agent,
        Some(old.digest())
    );
    assert_eq!(
        runtime.detail(&fresh).await.unwrap().agent,
        Some(new.digest())
    );
    assert!(
        factory.built.lock().unwrap().is_empty(),
        "both definitions were in memory: nothing was built again"
    );

    // Once no run in memory holds the old definition, it is dropped. The
    // drivers are stopped first: one that just ended a turn still holds
    // its run for a moment.
    runtime.shutdown().await;
    assert_eq!(runtime.agents_in_memory().len(), 2);
    runtime
        .delete(&pinned, spool_runtime::DeleteRequest::default())
        .await
        .unwrap();
    assert_eq!(runtime.agents_in_memory(), vec![new.digest()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_follows_upgrades_moves_at_its_next_turn_and_its_journal_says_so() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (old, new) = (definition("old", "pinned"), definition("new", "next_turn"));
    let factory = Arc::new(Factory::default());
    let runtime = runtime(&journal, &old, &factory);
    let (run, turn) = begin(&runtime, "hello").await;
    settle(&runtime, &run, &turn).await;
    // Its own word holds over the new definition's.
    let own = runtime
        .start(StartRequest {
            text: "hello".into(),
            upgrade: Some(Upgrade::Pinned),
            ..StartRequest::default()
        })
        .await
        .unwrap();
    let spool_runtime::Accepted::Started { run: own, turn } = own else {
        panic!("a new run starts a turn");
    };
    settle(&runtime, &own, &turn).await;

    runtime.load_agent(spec(&new));
    let before = journal.read(&run, Seq(0)).await.unwrap().len() as u64;
    let view = next_turn(&runtime, &run, "again").await;
    assert_eq!(
        view.response.as_deref(),
        Some("new answers"),
        "the model was shown the new definition's prompt"
    );
    let log = journal.read(&run, Seq(before)).await.unwrap();
    assert_eq!(log[0].event.kind(), "agent_changed");
    assert_eq!(log[1].event.kind(), "turn_started");
    let Event::AgentChanged(changed) = &log[0].event else {
        unreachable!()
    };
    assert_eq!(changed.from, Some(old.digest()));
    assert_eq!(changed.to, new.digest());
    assert_eq!(
        runtime.detail(&run).await.unwrap().agent,
        Some(new.digest())
    );
    // The conversation carried over: the request holds the first turn's
    // messages under the new prompt.
    let requested: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ModelCallRequested(r) => Some(r),
            _ => None,
        })
        .collect();
    let saw = ModelRequest::new(
        vec![
            Message::System {
                content: "new".into(),
            },
            Message::User {
                content: "hello".into(),
            },
            Message::Assistant {
                content: "old answers".into(),
                tool_calls: vec![],
            },
            Message::User {
                content: "again".into(),
            },
        ],
        new.definition.tools(&new.base).unwrap().specs(),
    );
    assert_eq!(requested.len(), 1);
    assert_eq!(requested[0].request_hash, saw.hash());

    let view = next_turn(&runtime, &own, "again").await;
    assert_eq!(
        view.response.as_deref(),
        Some("old answers"),
        "a run created pinned keeps its definition whatever the new one says"
    );

    // Read back from its log alone, the moved run is on the new definition.
    let restarted = runtime_after_restart(&journal, &new, &factory);
    let view = next_turn(&restarted, &run, "once more").await;
    assert_eq!(view.response.as_deref(), Some("new answers"));
}

fn runtime_after_restart(
    journal: &Arc<dyn Journal>,
    current: &Loaded,
    factory: &Arc<Factory>,
) -> Runtime {
    runtime(journal, current, factory)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_flight_on_two_definitions_resume_each_on_its_own_after_a_restart() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (first, second, third) = (
        definition("first", "pinned"),
        definition("second", "pinned"),
        definition("third", "pinned"),
    );
    let factory = Arc::new(Factory::default());
    let before = runtime(&journal, &first, &factory);
    let (on_first, turn) = begin(&before, "ask").await;
    let parked = settle(&before, &on_first, &turn).await;
    assert_eq!(parked.status, Status::Waiting(SuspendKind::Question));
    before.load_agent(spec(&second));
    let (on_second, turn) = begin(&before, "ask").await;
    settle(&before, &on_second, &turn).await;
    // The process ends with both runs parked; it restarts on a third.
    before.shutdown().await;
    drop(before);

    let after = runtime(&journal, &third, &factory);
    after.recover().await.unwrap();
    for (run, prompt) in [(&on_first, "first"), (&on_second, "second")] {
        let turn = after.get(run).await.unwrap().turn_id.unwrap();
        after
            .respond(
                run,
                Some(&turn),
                vec![Answer {
                    text: "this one".into(),
                    approved: None,
                }],
            )
            .await
            .unwrap();
        let view = until(&after, run, |view| view.status == Status::Completed).await;
        assert_eq!(
            view.response.as_deref(),
            Some(format!("{prompt} answers").as_str()),
            "the run resumed on the definition it started with"
        );
    }
    let mut built = factory.built.lock().unwrap().clone();
    built.sort();
    let mut expected = vec![first.digest(), second.digest()];
    expected.sort();
    assert_eq!(
        built, expected,
        "each old definition was built once, from the journal's copy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_definition_cannot_be_built_fails_its_turn_saying_why_and_stays_readable() {
    struct Refusing;
    impl AgentFactory for Refusing {
        fn build<'a>(
            &'a self,
            _: &'a str,
            _: &'a Value,
        ) -> BoxFuture<'a, Result<AgentSpec, String>> {
            Box::pin(async { Err("the engine's key is gone".to_owned()) })
        }
    }
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let (old, new) = (definition("old", "pinned"), definition("new", "pinned"));
    let factory = Arc::new(Factory::default());
    let before = runtime(&journal, &old, &factory);
    let (run, turn) = begin(&before, "hello").await;
    settle(&before, &run, &turn).await;
    drop(before);

    let after = Runtime::builder(Arc::clone(&journal))
        .agent_spec(spec(&new))
        .agent_factory(Arc::new(Refusing))
        .build();
    assert_eq!(after.detail(&run).await.unwrap().agent, Some(old.digest()));
    after
        .send(
            &run,
            MessageRequest {
                text: "again".into(),
                ..MessageRequest::default()
            },
        )
        .await
        .unwrap();
    let view = until(&after, &run, |view| view.status == Status::Failed).await;
    let detail = after.detail(&run).await.unwrap();
    let failure = detail.failure.expect("the turn failed");
    assert!(
        failure.message.contains(&old.digest())
            && failure.message.contains("the engine's key is gone"),
        "{failure:?}"
    );
    assert_eq!(view.status, Status::Failed);
}
