//! Helpers: runtimes over a memory journal with a script, counting tools,
//! and waits that fail the test instead of hanging it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use spool_journal::event::Effect;
use spool_journal::store::faulty::Faulty;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Journal, RunId, TurnId};
use spool_runtime::engine::ToolSpec;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{BoxFuture, RunView, Runtime, Tool, ToolOutcome, Tools};
use tokio_util::sync::CancellationToken;

/// How long any wait may take before the test fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) fn runtime_with(journal: Arc<dyn Journal>, script: &str, tools: Tools) -> Runtime {
    Runtime::builder(journal)
        .engine(Arc::new(ScriptedEngine::from_jsonl(script).unwrap()))
        .tools(tools)
        .build()
}

pub(crate) fn scripted(script: &str) -> Runtime {
    runtime_with(Arc::new(MemoryJournal::new()), script, Tools::builtin())
}

/// Waits for the turn to reach a boundary, failing the test after
/// [`PATIENCE`].
pub(crate) async fn settle(runtime: &Runtime, run: &RunId, turn: &TurnId) -> RunView {
    tokio::time::timeout(PATIENCE, runtime.wait_for(run, turn))
        .await
        .expect("the turn reaches a boundary in time")
        .unwrap()
}

/// A tool of the given effect that counts its executions and answers
/// `{"ran": n}`.
pub(crate) struct Counting {
    pub(crate) name: &'static str,
    pub(crate) effect: Effect,
    pub(crate) runs: Arc<AtomicUsize>,
}

impl Counting {
    pub(crate) fn new(name: &'static str, effect: Effect) -> (Arc<Self>, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        (
            Arc::new(Self {
                name,
                effect,
                runs: Arc::clone(&runs),
            }),
            runs,
        )
    }
}

impl Tool for Counting {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: "counts".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        self.effect
    }

    fn idempotency_key(&self, input: &Value) -> Option<String> {
        input.get("key").and_then(Value::as_str).map(str::to_owned)
    }

    fn call<'a>(
        &'a self,
        _input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            ToolOutcome::Output(json!({"ran": n}))
        })
    }
}

/// A tool that blocks until its gate opens (or the turn is cancelled),
/// counting how often it started.
pub(crate) struct Gated {
    pub(crate) effect: Effect,
    pub(crate) started: Arc<AtomicUsize>,
    pub(crate) entered: Arc<tokio::sync::Notify>,
    pub(crate) gate: Arc<tokio::sync::Notify>,
}

impl Tool for Gated {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "gated".into(),
            description: "waits".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        self.effect
    }

    fn call<'a>(
        &'a self,
        _input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            self.started.fetch_add(1, Ordering::SeqCst);
            self.entered.notify_one();
            tokio::select! {
                () = self.gate.notified() => ToolOutcome::Output(json!("opened")),
                () = cancel.cancelled() => ToolOutcome::Error("cancelled".into()),
            }
        })
    }
}

/// An echo engine whose calls wait until its gate opens: a turn stays in
/// a model call for as long as a test needs. `entered` says a call began.
pub(crate) struct Held {
    open: tokio::sync::watch::Receiver<bool>,
    pub(crate) entered: Arc<tokio::sync::Notify>,
}

/// Opens a [`Held`] engine's gate, for every call from then on.
pub(crate) struct Gate(tokio::sync::watch::Sender<bool>, Arc<tokio::sync::Notify>);

impl Held {
    pub(crate) fn new() -> (Arc<Self>, Gate) {
        let (open, opened) = tokio::sync::watch::channel(false);
        let entered = Arc::new(tokio::sync::Notify::new());
        (
            Arc::new(Self {
                open: opened,
                entered: Arc::clone(&entered),
            }),
            Gate(open, entered),
        )
    }
}

impl Gate {
    pub(crate) fn open(&self) {
        self.0.send_replace(true);
    }

    /// Waits until a call has begun, failing the test after [`PATIENCE`].
    pub(crate) async fn entered(&self) {
        tokio::time::timeout(PATIENCE, self.1.notified())
            .await
            .expect("a model call begins in time");
    }
}

impl spool_runtime::Engine for Held {
    fn call<'a>(
        &'a self,
        context: &'a spool_runtime::engine::CallContext,
        request: &'a spool_runtime::ModelRequest,
        deltas: spool_runtime::engine::Deltas<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<spool_runtime::ModelResponse, spool_runtime::engine::EngineError>>
    {
        let mut open = self.open.clone();
        // A permit, so a test that waits after the call began still sees it.
        self.entered.notify_one();
        Box::pin(async move {
            if open.wait_for(|open| *open).await.is_err() {
                return Err(spool_runtime::engine::EngineError::Cancelled);
            }
            spool_runtime::engines::EchoEngine
                .call(context, request, deltas, cancel)
                .await
        })
    }
}

pub(crate) fn tools_with(extra: Vec<Arc<dyn Tool>>) -> Tools {
    let mut tools = Tools::builtin();
    for tool in extra {
        tools.add(tool).unwrap();
    }
    tools
}

/// The kinds of a run's events, in order.
pub(crate) async fn kinds(journal: &Arc<dyn Journal>, run: &RunId) -> Vec<&'static str> {
    journal
        .read(run, spool_journal::Seq(0))
        .await
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect()
}

/// Waits until the run's view satisfies `done`, woken by the run's own
/// events; fails the test after [`PATIENCE`].
pub(crate) async fn until(
    runtime: &Runtime,
    run: &RunId,
    done: impl Fn(&RunView) -> bool,
) -> RunView {
    tokio::time::timeout(PATIENCE, async {
        let mut stream = runtime.subscribe(run, None).await.unwrap();
        loop {
            let view = runtime.get(run).await.unwrap();
            if done(&view) {
                return view;
            }
            stream
                .next()
                .await
                .expect("the run's stream stays open while it has work");
        }
    })
    .await
    .expect("the run reaches the expected state in time")
}

/// Starts a run with `text` and returns its run and first turn.
pub(crate) async fn begin(runtime: &Runtime, text: &str) -> (RunId, TurnId) {
    let request = spool_runtime::StartRequest {
        text: text.into(),
        ..spool_runtime::StartRequest::default()
    };
    match runtime.start(request).await.unwrap() {
        spool_runtime::Accepted::Started { run, turn } => (run, turn),
        other => panic!("a new run starts a turn, got {other:?}"),
    }
}

/// A memory journal that counts reads of a log from its start and from
/// anywhere else, whose reads, once held, wait until let go (saying when
/// one has begun), and whose writes fail as on a full disk while set full
/// (`inner.set_full`).
#[derive(Default)]
pub(crate) struct Instrumented {
    pub(crate) inner: Faulty<MemoryJournal>,
    pub(crate) reads_from_start: AtomicUsize,
    pub(crate) reads_from_later: AtomicUsize,
    pub(crate) holding: std::sync::atomic::AtomicBool,
    /// When not empty, only these runs' reads are held.
    pub(crate) only: std::sync::Mutex<Vec<RunId>>,
    pub(crate) entered: tokio::sync::Notify,
    pub(crate) go: tokio::sync::watch::Sender<bool>,
}

impl Journal for Instrumented {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: spool_journal::Seq,
        events: Vec<spool_journal::Event>,
    ) -> BoxFuture<'a, Result<Vec<spool_journal::Envelope>, spool_journal::JournalError>> {
        self.inner.append(run, expected, events)
    }

    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: spool_journal::Seq,
    ) -> BoxFuture<'a, Result<Vec<spool_journal::Envelope>, spool_journal::JournalError>> {
        if from == spool_journal::Seq(0) {
            self.reads_from_start.fetch_add(1, Ordering::SeqCst);
        } else {
            self.reads_from_later.fetch_add(1, Ordering::SeqCst);
        }
        Box::pin(async move {
            let held = {
                let only = self.only.lock().unwrap();
                only.is_empty() || only.contains(run)
            };
            if held && self.holding.load(Ordering::SeqCst) {
                self.entered.notify_one();
                let mut go = self.go.subscribe();
                if go.wait_for(|go| *go).await.is_err() {
                    return Err(spool_journal::JournalError::Closed);
                }
            }
            self.inner.read(run, from).await
        })
    }

    fn runs(
        &self,
    ) -> BoxFuture<'_, Result<Vec<spool_journal::store::RunSummary>, spool_journal::JournalError>>
    {
        self.inner.runs()
    }

    spool_journal::forward_journal_lifecycle!(inner);

    fn addresses(
        &self,
    ) -> BoxFuture<'_, Result<Vec<(spool_journal::Address, RunId)>, spool_journal::JournalError>>
    {
        self.inner.addresses()
    }

    fn find_address<'a>(
        &'a self,
        address: &'a spool_journal::Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, spool_journal::JournalError>> {
        self.inner.find_address(address)
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a spool_journal::Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, spool_journal::JournalError>> {
        self.inner.find_operation(principal, operation_id)
    }

    fn claim<'a>(
        &'a self,
        key: &'a spool_journal::store::ClaimKey,
        holder: &'a spool_journal::store::CallRef,
    ) -> BoxFuture<'a, Result<spool_journal::store::Claim, spool_journal::JournalError>> {
        self.inner.claim(key, holder)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), spool_journal::JournalError>> {
        self.inner.probe()
    }

    fn subscribe<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<
        'a,
        Result<tokio::sync::watch::Receiver<spool_journal::Seq>, spool_journal::JournalError>,
    > {
        self.inner.subscribe(run)
    }
}

/// Sends `text` to an idle run and waits for the turn it starts.
pub(crate) async fn next_turn(runtime: &Runtime, run: &RunId, text: &str) -> RunView {
    let message = spool_runtime::MessageRequest {
        text: text.into(),
        ..spool_runtime::MessageRequest::default()
    };
    let spool_runtime::Accepted::Started { turn, .. } = runtime.send(run, message).await.unwrap()
    else {
        panic!("an idle run starts a turn");
    };
    settle(runtime, run, &turn).await
}
