//! One pod in process: a named agent with one session (the run bound to
//! the address `pod/NAME`), its listeners, and its methods. The socket
//! daemon ([`crate::daemon`]) is a listener per connection over this.
//!
//! Every event goes to every listener (the seed's broadcast). A listener
//! has a bounded queue; one that falls [`QUEUE`] events behind is
//! disconnected with a last `error` saying so, and never slows the others
//! or the turn.

use std::sync::{Arc, Mutex, PoisonError};

use spool_journal::event::Answer;
use spool_journal::fold::Status as RunStatus;
use spool_journal::{Address, RunId};
use spool_runtime::hub::StreamItem;
use spool_runtime::{ErrorKind, MessageRequest, Runtime, RuntimeError};
use spool_wire::pod::{ErrorCode, Event, History, Method, PodState, ResumeAnswer};
use spool_wire::run::{SuspendKind, TurnPolicy};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::{Translator, pod_state};

/// The namespace of pods' addresses: pod `NAME`'s session is the run bound
/// to `pod/NAME`.
pub const NAMESPACE: &str = "pod";

/// How many events a listener may have waiting before it is disconnected.
pub const QUEUE: usize = 1024;

/// A pod: cheap to clone, every clone the same pod.
#[derive(Clone, Debug)]
pub struct Pod {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    runtime: Runtime,
    address: Address,
    shared: Mutex<Shared>,
    /// The session; the watcher follows it when it changes.
    session: watch::Sender<RunId>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Debug)]
struct Shared {
    translator: Translator,
    listeners: Vec<(u64, mpsc::Sender<Event>)>,
    next_listener: u64,
    /// The turn in progress's events from the journal: what a listener
    /// connecting mid-turn receives first, so it can render the present.
    turn_events: Vec<Event>,
}

/// Why a pod could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodError {
    /// The name is not a valid pod name.
    #[error("`{0}` is not a pod name: 1 to 64 of letters, digits, `-`, `_` and `.`")]
    BadName(String),
    /// The runtime refused.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// One listener: the pod's events, in order, from when it was registered.
/// Dropping it unregisters it.
#[derive(Debug)]
pub struct Listener {
    id: u64,
    pod: Pod,
    events: mpsc::Receiver<Event>,
}

impl Listener {
    /// The next event; `None` once the listener was disconnected (it fell
    /// behind, and its last event says so) or the pod closed.
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Whether every event sent to this listener so far was received.
    pub(crate) fn is_drained(&self) -> bool {
        self.events.is_empty()
    }

    /// This listener's id, for [`Pod::tell`].
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.pod.shared().listeners.retain(|(id, _)| *id != self.id);
    }
}

/// Whether `name` can name a pod (and a directory).
#[must_use]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Pod {
    /// Opens pod `name` on `runtime`: its session is the run bound to
    /// `pod/NAME`, made (pending, no turn) when there is none. Returns once
    /// the pod knows its session's state, so the first listener's `status`
    /// is the present one.
    ///
    /// # Errors
    ///
    /// [`PodError::BadName`], or the runtime's refusal.
    pub async fn open(runtime: Runtime, name: &str) -> Result<Self, PodError> {
        if !valid_name(name) {
            return Err(PodError::BadName(name.to_owned()));
        }
        let address = Address::new(NAMESPACE, name);
        let session = runtime.ensure(&address).await?.run_id;
        let head = runtime.get(&session).await?.cursor;
        let mut items = runtime.subscribe(&session, None).await?;
        // What the session holds already is folded, not sent: a listener
        // hears of the present, not of the past.
        let mut translator = Translator::new(name, session.as_str());
        let mut turn_events = Vec::new();
        if let Some(head) = head {
            while let Some(item) = items.next().await {
                if let StreamItem::Event(envelope) = &item {
                    let events = translator.journal(envelope);
                    keep_turn_events(&mut turn_events, &translator, events);
                    if envelope.seq >= head {
                        break;
                    }
                }
            }
        }
        let (session_tx, _) = watch::channel(session);
        let pod = Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                runtime,
                address,
                shared: Mutex::new(Shared {
                    translator,
                    listeners: Vec::new(),
                    next_listener: 0,
                    turn_events,
                }),
                session: session_tx,
                stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
            }),
        };
        let watcher = pod.clone();
        pod.inner
            .tasks
            .spawn(async move { watcher.watch(Some(items)).await });
        Ok(pod)
    }

    /// The pod's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The session's run id.
    #[must_use]
    pub fn session(&self) -> RunId {
        self.inner.session.borrow().clone()
    }

    /// The pod's state as its events have shown it.
    #[must_use]
    pub fn state(&self) -> PodState {
        self.shared().translator.state()
    }

    /// Whether the pod rests: no turn runs, in the runtime or in the
    /// events sent so far (the state moves, and its events are sent, under
    /// one lock: once it says so, a turn's last events are in every
    /// listener's queue).
    pub(crate) async fn rests(&self) -> bool {
        let running = matches!(
            self.inner.runtime.get(&self.session()).await,
            Ok(view) if view.status == RunStatus::Running
        );
        !running && self.state() != PodState::Running
    }

    /// Registers a listener. Its first events are a `status` and, during a
    /// turn, the turn's events so far.
    #[must_use]
    pub fn listen(&self) -> Listener {
        let mut shared = self.shared();
        let (sender, events) = mpsc::channel(QUEUE + shared.turn_events.len() + 1);
        let _ = sender.try_send(shared.translator.status());
        for event in &shared.turn_events {
            let _ = sender.try_send(event.clone());
        }
        shared.next_listener += 1;
        let id = shared.next_listener;
        shared.listeners.push((id, sender));
        Listener {
            id,
            pod: self.clone(),
            events,
        }
    }

    /// Registers `callback` as a listener: called with each event, in
    /// order, on a task of its own, until it returns `false`, the listener
    /// falls behind (its last call is the `error` saying so) or the pod
    /// closes. A callback that blocks holds up only itself.
    pub fn listen_with(&self, mut callback: impl FnMut(Event) -> bool + Send + 'static) {
        let mut listener = self.listen();
        self.inner.tasks.spawn(async move {
            while let Some(event) = listener.recv().await {
                if !callback(event) {
                    break;
                }
            }
        });
    }

    /// Sends `event` to one listener alone (the reply to a line that does
    /// not decode goes to its sender only).
    pub fn tell(&self, listener: u64, event: Event) {
        let mut shared = self.shared();
        if let Some(at) = shared.listeners.iter().position(|(id, _)| *id == listener)
            && !deliver(&shared.listeners[at].1, event)
        {
            shared.listeners.remove(at);
        }
    }

    /// Calls a method. What it answers, and every failure, is an event to
    /// every listener.
    pub async fn call(&self, method: Method) {
        let span = tracing::debug_span!(
            target: "spool::pod",
            "pod method",
            method = method.name(),
            run_id = %self.session(),
        );
        tracing::Instrument::instrument(self.call_in_span(method), span).await;
    }

    async fn call_in_span(&self, method: Method) {
        let outcome = match method {
            Method::Run { input } => self.run(input).await,
            Method::Resume { answer } => self.resume(answer).await,
            Method::Cancel => self.cancel().await,
            Method::GetStatus => {
                let status = self.shared().translator.status();
                self.broadcast(&status);
                Ok(())
            }
            Method::GetHistory => self.history().await,
        };
        if let Err(error) = outcome {
            self.broadcast(&error);
        }
    }

    /// Stops following the session and disconnects every listener.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        // Listeners first: a callback's task ends when its events do.
        self.shared().listeners.clear();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn broadcast(&self, event: &Event) {
        broadcast(&mut self.shared(), event);
    }

    /// `run`: a turn, only if none is in progress (first wins).
    async fn run(&self, input: String) -> Result<(), Event> {
        let runtime = &self.inner.runtime;
        let message = || MessageRequest {
            text: input.clone(),
            context: Vec::new(),
            policy: Some(TurnPolicy::IfIdle),
        };
        match runtime.send(&self.session(), message()).await {
            Ok(_) => Ok(()),
            // A retired session is replaced by a fresh one.
            Err(RuntimeError::RunRetired(_)) => {
                let session = runtime
                    .ensure(&self.inner.address)
                    .await
                    .map_err(internal)?
                    .run_id;
                self.inner.session.send_replace(session.clone());
                runtime
                    .send(&session, message())
                    .await
                    .map(|_| ())
                    .map_err(|e| self.refusal(e))
            }
            Err(error) => Err(self.refusal(error)),
        }
    }

    /// `resume`: continues a paused turn, with the answer the pause asks
    /// for when it asks one.
    async fn resume(&self, answer: Option<ResumeAnswer>) -> Result<(), Event> {
        let runtime = &self.inner.runtime;
        let session = self.session();
        let view = runtime.get(&session).await.map_err(internal)?;
        let RunStatus::Waiting(kind) = view.status else {
            return Err(Event::error(
                ErrorCode::NotPaused,
                format!(
                    "pod {} is {}, not paused",
                    self.name(),
                    pod_state(&view.status).as_str()
                ),
            ));
        };
        let answer = match (kind, answer) {
            // A budget is approved by resuming; an answer may reject it.
            (SuspendKind::Budget, answer) => Answer {
                text: answer.as_ref().map(|a| a.text.clone()).unwrap_or_default(),
                approved: Some(answer.and_then(|a| a.approved).unwrap_or(true)),
            },
            // A durable sleep needs no answer: resuming wakes it now.
            (SuspendKind::Sleep, _) => {
                return runtime.wake(&session).await.map_err(|e| self.refusal(e));
            }
            (SuspendKind::Reconciliation, _) => {
                return Err(Event::error(
                    ErrorCode::InvalidRequest,
                    "the pod waits for an operator to settle a tool call that may have run: resolve or abandon it over HTTP",
                ));
            }
            (_, None) => {
                let prompt = view.suspend.map(|s| s.prompt).unwrap_or_default();
                return Err(Event::error(
                    ErrorCode::InvalidRequest,
                    format!(
                        "the pod asks `{prompt}`: resume with params {{\"text\", \"approved\"?}}"
                    ),
                ));
            }
            (_, Some(answer)) => Answer {
                text: answer.text,
                approved: answer.approved,
            },
        };
        runtime
            .respond(&session, view.turn_id.as_ref(), vec![answer])
            .await
            .map_err(|e| self.refusal(e))
    }

    /// `cancel`: ends a running or paused turn.
    async fn cancel(&self) -> Result<(), Event> {
        match self.inner.runtime.cancel(&self.session(), None).await {
            Ok(spool_runtime::CancelOutcome::Requested(_)) => Ok(()),
            Ok(_) => Err(Event::error(
                ErrorCode::NotRunning,
                format!("pod {} has no turn to cancel", self.name()),
            )),
            Err(error) => Err(self.refusal(error)),
        }
    }

    /// `get_history`: the session's conversation as items.
    async fn history(&self) -> Result<(), Event> {
        let snapshot = self
            .inner
            .runtime
            .snapshot(&self.session())
            .await
            .map_err(internal)?;
        self.broadcast(&Event::History(History {
            items: crate::history::items(&snapshot.messages),
        }));
        Ok(())
    }

    /// A runtime refusal as the pod's error event.
    fn refusal(&self, error: RuntimeError) -> Event {
        match error.kind() {
            ErrorKind::TurnInProgress => Event::error(
                ErrorCode::AlreadyRunning,
                format!("pod {} is already running a turn", self.name()),
            ),
            ErrorKind::RunWaiting | ErrorKind::RunNotWaiting => {
                Event::error(ErrorCode::NotPaused, error.to_string())
            }
            ErrorKind::InvalidAnswer | ErrorKind::BadRequest => {
                Event::error(ErrorCode::InvalidRequest, error.to_string())
            }
            _ => internal(error),
        }
    }

    /// Follows the session: its journal events and live deltas become the
    /// pod's events. `items`: the session's stream, already past what
    /// [`Pod::open`] folded.
    async fn watch(self, mut items: Option<spool_runtime::hub::Subscription>) {
        let mut session = self.inner.session.subscribe();
        loop {
            let current = session.borrow_and_update().clone();
            let mut stream = match items.take() {
                Some(stream) => stream,
                None => {
                    // A new session: everything in it is news.
                    {
                        let mut shared = self.shared();
                        shared.translator = Translator::new(self.name(), current.as_str());
                        shared.turn_events.clear();
                    }
                    match self.inner.runtime.subscribe(&current, None).await {
                        Ok(stream) => stream,
                        Err(error) => {
                            tracing::error!(target: "spool::pod", pod = self.name(), %error, "the session cannot be followed");
                            tokio::select! {
                                () = self.inner.stop.cancelled() => return,
                                _ = session.changed() => continue,
                            }
                        }
                    }
                }
            };
            loop {
                let item = tokio::select! {
                    () = self.inner.stop.cancelled() => return,
                    changed = session.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    item = stream.next() => item,
                };
                match item {
                    Some(StreamItem::Event(envelope)) => {
                        let mut shared = self.shared();
                        let events = shared.translator.journal(&envelope);
                        for event in &events {
                            broadcast(&mut shared, event);
                        }
                        let Shared {
                            translator,
                            turn_events,
                            ..
                        } = &mut *shared;
                        keep_turn_events(turn_events, translator, events);
                    }
                    Some(StreamItem::Delta(delta)) => {
                        let mut shared = self.shared();
                        if let Some(event) = shared.translator.delta(&delta.delta) {
                            broadcast(&mut shared, &event);
                        }
                    }
                    // The hub ends a stream that fell behind: pick it up
                    // again from the journal, where the translator is.
                    Some(StreamItem::Lagged { last }) => {
                        match self.inner.runtime.subscribe(&current, last).await {
                            Ok(again) => stream = again,
                            Err(_) => return,
                        }
                    }
                    None => return,
                }
            }
        }
    }
}

/// Keeps what a listener connecting mid-turn needs: the turn's events from
/// its start, forgotten when the pod is idle again.
fn keep_turn_events(turn_events: &mut Vec<Event>, translator: &Translator, events: Vec<Event>) {
    // A new turn's events start over (a paused turn going on keeps what it
    // had: its `turn_start` repeats the number).
    if events
        .iter()
        .any(|e| matches!(e, Event::TurnStart(start) if start.turn != turn_of(turn_events)))
    {
        turn_events.clear();
    }
    if translator.state() == PodState::Idle {
        turn_events.clear();
    } else {
        turn_events.extend(
            events
                .into_iter()
                .filter(|e| !matches!(e, Event::Status(_))),
        );
    }
}

/// The turn the kept events are of: their `turn_start`'s number, 0 when
/// none is kept.
fn turn_of(turn_events: &[Event]) -> u64 {
    turn_events
        .iter()
        .find_map(|e| match e {
            Event::TurnStart(start) => Some(start.turn),
            _ => None,
        })
        .unwrap_or(0)
}

/// Sends `event` to every listener; one whose queue is full is told so
/// and dropped.
fn broadcast(shared: &mut Shared, event: &Event) {
    shared
        .listeners
        .retain(|(_, sender)| deliver(sender, event.clone()));
}

/// Queues `event` for one listener; `false` when the listener is gone or
/// was just disconnected for falling behind (its last slot carries why).
fn deliver(sender: &mpsc::Sender<Event>, event: Event) -> bool {
    if sender.capacity() <= 1 {
        let _ = sender.try_send(Event::error(
            ErrorCode::Internal,
            format!("this listener fell {QUEUE} events behind and was disconnected"),
        ));
        return false;
    }
    sender.try_send(event).is_ok()
}

fn internal(error: RuntimeError) -> Event {
    Event::error(ErrorCode::Internal, error.to_string())
}
