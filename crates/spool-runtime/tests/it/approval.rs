//! Tools that ask a person before they run (`Tool::approval`), and tool
//! sets replaced while runs go on (`LiveTools`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use spool_journal::Journal;
use spool_journal::event::{Answer, Effect};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::engine::{
    CallContext, Deltas, Engine, EngineError, ModelRequest, ModelResponse, ToolSpec,
};
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{BoxFuture, LiveTools, Runtime, Tool, ToolOutcome, Tools};
use spool_wire::run::SuspendKind;
use tokio_util::sync::CancellationToken;

use crate::support::*;
use crate::turns::{start, started};

/// A counting write that asks first.
struct Asking(Counting);

impl Tool for Asking {
    fn spec(&self) -> ToolSpec {
        self.0.spec()
    }

    fn effect(&self) -> Effect {
        self.0.effect()
    }

    fn approval(&self, input: &Value) -> Option<String> {
        Some(format!("run {} with {input}?", self.0.name))
    }

    fn call<'a>(
        &'a self,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        self.0.call(input, cancel)
    }
}

fn asking(runs: &Arc<AtomicUsize>) -> Tools {
    // Without `request_approval` among the agent's tools: the gate does
    // not depend on the model being offered it.
    let mut tools = Tools::new();
    tools
        .add(Arc::new(Asking(Counting {
            name: "deploy",
            effect: Effect::Write,
            runs: Arc::clone(runs),
        })))
        .unwrap();
    tools
}

const DEPLOY: &str = r#"{"tool_calls": [{"id": "c1", "name": "deploy", "arguments": {"env": "prod"}}]}
{"text": "finished"}"#;

fn verdict(approved: Option<bool>, text: &str) -> Vec<Answer> {
    vec![Answer {
        text: text.into(),
        approved,
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_asks_first_runs_once_only_after_an_approval_even_across_a_restart() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let first = runtime_with(Arc::clone(&journal), DEPLOY, asking(&runs));
    let (run, turn) = started(first.start(start("ship it")).await.unwrap());
    let parked = settle(&first, &run, &turn).await;
    assert_eq!(parked.status, Status::Waiting(SuspendKind::Approval));
    let pending = parked.suspend.expect("a pending approval");
    assert_eq!(pending.call_id.as_deref(), Some("c1.approval"));
    assert_eq!(pending.prompt, r#"run deploy with {"env":"prod"}?"#);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing ran before the verdict"
    );
    first.shutdown().await;
    drop(first);

    // A new process on the same journal: the approval is still what the
    // run waits for, and the verdict lets the call run, once.
    let second = runtime_with(Arc::clone(&journal), DEPLOY, asking(&runs));
    second.recover().await.unwrap();
    second
        .respond(&run, Some(&turn), verdict(Some(true), "go"))
        .await
        .unwrap();
    let done = settle(&second, &run, &turn).await;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let requests = crate::turns::requests(&journal, &run).await;
    assert_eq!(
        requests[1],
        [json!({"role": "tool", "call_id": "c1", "content": "{\"ran\":1}"})],
        "the model sees the call's own output, not the approval"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_or_unanswered_verdict_never_runs_the_tool_and_the_model_is_told_why() {
    for (approved, text, told) in [
        (
            Some(false),
            "not on a Friday",
            "error: the person rejected the call to `deploy`: not on a Friday",
        ),
        (
            None,
            "use staging",
            "error: the call to `deploy` was not run: the person answered without approving it: use staging",
        ),
    ] {
        let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let runtime = runtime_with(Arc::clone(&journal), DEPLOY, asking(&runs));
        let (run, turn) = started(runtime.start(start("ship it")).await.unwrap());
        settle(&runtime, &run, &turn).await;
        runtime
            .respond(&run, Some(&turn), verdict(approved, text))
            .await
            .unwrap();
        assert_eq!(
            settle(&runtime, &run, &turn).await.status,
            Status::Completed
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{text}: the tool never ran");
        let requests = crate::turns::requests(&journal, &run).await;
        assert_eq!(
            requests[1],
            [json!({"role": "tool", "call_id": "c1", "content": told})]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_tool_set_is_offered_to_later_turns_and_a_parked_turn_resumes_with_its_own() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let script = r#"{"tool_calls": [{"id": "c1", "name": "ask_human", "arguments": {"prompt": "Which?"}}]}
{"text": "first done"}
{"text": "second done"}"#;
    let live = LiveTools::new(Tools::builtin());
    let engine = Arc::new(Offered {
        script: ScriptedEngine::from_jsonl(script).unwrap(),
        offered: std::sync::Mutex::default(),
    });
    let runtime = Runtime::builder(Arc::clone(&journal))
        .engine(Arc::clone(&engine) as Arc<dyn Engine>)
        .live_tools(live.clone())
        .build();
    let (run, turn) = started(runtime.start(start("go")).await.unwrap());
    settle(&runtime, &run, &turn).await;

    // The set changes while the turn is parked; the turn's recorded
    // request was made with the old one.
    let (extra, _) = Counting::new("added", Effect::Read);
    live.replace(tools_with(vec![extra]));
    runtime
        .respond(&run, Some(&turn), verdict(None, "this one"))
        .await
        .unwrap();
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed,
        "the parked turn replayed its request under the set it began with"
    );

    let accepted = runtime
        .send(
            &run,
            crate::turns::message("again", spool_wire::run::TurnPolicy::Queue),
        )
        .await
        .unwrap();
    let turn = match accepted {
        spool_runtime::Accepted::Started { turn, .. } => turn,
        other => panic!("expected a turn, got {other:?}"),
    };
    assert_eq!(
        settle(&runtime, &run, &turn).await.status,
        Status::Completed
    );
    let offered = engine.offered.lock().unwrap().clone();
    assert_eq!(offered.len(), 3, "{offered:?}");
    assert!(!offered[0].contains(&"added".to_owned()), "{offered:?}");
    assert!(
        !offered[1].contains(&"added".to_owned()),
        "the resumed turn keeps its set: {offered:?}"
    );
    assert!(offered[2].contains(&"added".to_owned()), "{offered:?}");
}

/// The scripted engine, noting the tool names each call was offered.
struct Offered {
    script: ScriptedEngine,
    offered: std::sync::Mutex<Vec<Vec<String>>>,
}

impl Engine for Offered {
    fn call<'a>(
        &'a self,
        context: &'a CallContext,
        request: &'a ModelRequest,
        deltas: Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        let names = request.tools().iter().map(|t| t.name.clone()).collect();
        self.offered.lock().unwrap().push(names);
        self.script.call(context, request, deltas, cancel)
    }
}
