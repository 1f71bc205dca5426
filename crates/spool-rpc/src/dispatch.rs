//! The dispatcher: one JSON-RPC connection's requests, turned into runtime
//! calls, answered (and streamed) through the connection's outbox. Every
//! framing (stdio, and the HTTP listener's) feeds text in and writes what
//! comes out; the same request gets the same answer whatever carried it.
//!
//! Each request is handled in a task of its own, so a `submit.run` waiting
//! for its turn does not hold up the `run.respond` that answers the
//! question the turn asked. The outbox is bounded: a client that stops
//! reading slows its own subscriptions, which then lag on the runtime's
//! hub and end with a notification saying so, rather than growing memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use spool_edge::lines::LineCache;
use spool_journal::event::Answer;
use spool_journal::{Address, Principal, RunId, Seq, TurnId};
use spool_runtime::hub::{LiveDelta, StreamItem};
use spool_runtime::{
    Accepted, CancelOutcome, ErrorKind, MessageRequest, RunAccess, RunView, Runtime, RuntimeError,
    StartRequest,
};
use spool_wire::http::{self as wire, CancelReply, CancelStatus, SnapshotReply};
use spool_wire::rpc::{
    self, ClientFrame, Envelope, ErrorObject, Frame, Id, Notification, Request, Response,
    VersionDocument, codes,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::Mapper;
use crate::state::Patcher;

/// How many envelopes a connection's outbox holds before its writers wait.
pub const OUTBOX: usize = 256;

/// How many messages of one connection are handled at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// The methods this server answers, as `getCapabilities` and `/version`
/// list them.
pub const METHODS: [&str; 10] = [
    rpc::METHOD_SUBMIT_RUN,
    "run.respond",
    "run.cancel",
    "run.get",
    "run.list",
    rpc::METHOD_STATE_SNAPSHOT,
    "subscribe",
    "unsubscribe",
    "getCapabilities",
    "ping",
];

/// What goes out on a connection: one envelope, a run's event with its
/// journal position, or a batch's answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Outgoing {
    /// One response or notification.
    One(Envelope),
    /// A run's notification (`events.append`, `state.patch`), encoded,
    /// with the last journal position it reflects: what a reconnecting
    /// client resumes after (SSE's `id`). Encoded once and shared by every
    /// subscriber it goes to.
    Event {
        /// The position.
        cursor: u64,
        /// The notification as compact JSON.
        text: Bytes,
    },
    /// The answers to a batch, in order.
    Batch(Vec<Envelope>),
    /// A legacy server message (`{"t":"event"|"result"|"error", "id", …}`),
    /// for a legacy `{"t":"run"}` request.
    Legacy(Value),
}

impl Outgoing {
    /// The text of the message, compact JSON (framings add their own
    /// delimiters).
    #[must_use]
    pub fn to_json(&self) -> String {
        match self {
            Self::One(envelope) => rpc::encode_ws(envelope),
            Self::Event { text, .. } => String::from_utf8_lossy(text).into_owned(),
            Self::Batch(envelopes) => rpc::encode_batch(envelopes),
            Self::Legacy(message) => message.to_string(),
        }
    }

    /// [`Outgoing::to_json`] as bytes, shared rather than copied for a
    /// run's notification.
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Self::Event { text, .. } => text.clone(),
            other => Bytes::from(other.to_json()),
        }
    }

    /// A run's notification at `cursor`.
    fn event(cursor: u64, method: &str, params: Value) -> Self {
        let envelope = Envelope::Notification(Notification {
            method: method.to_owned(),
            params: Some(params),
        });
        Self::Event {
            cursor,
            text: Bytes::from(rpc::encode_ws(&envelope)),
        }
    }
}

/// The runtime, as every connection of a server shares it.
#[derive(Clone, Debug)]
pub struct Dispatcher {
    runtime: Runtime,
    encoded: Arc<Encoded>,
    access: RunAccess,
}

/// Notifications encoded once for every subscription of a run: a journal
/// event's `events.append` depend on the run's log up to it alone (every
/// subscription reads the log from its start), a live delta's on the delta.
#[derive(Debug, Default)]
struct Encoded {
    events: LineCache<Arc<[Outgoing]>>,
    /// By the delta's number.
    deltas: LineCache<Option<Outgoing>>,
}

impl Dispatcher {
    /// A dispatcher over `runtime`.
    #[must_use]
    pub fn new(runtime: Runtime) -> Self {
        Self {
            runtime,
            encoded: Arc::default(),
            access: RunAccess::Any,
        }
    }

    /// Who may reach a run ([`RunAccess::Any`] by default): under
    /// [`RunAccess::Owner`] every method, subscription and listing
    /// answers another principal's run as one that does not exist, as the
    /// HTTP channel does.
    #[must_use]
    pub fn with_run_access(mut self, access: RunAccess) -> Self {
        self.access = access;
        self
    }

    /// A connection for a caller the transport authenticated as `principal`
    /// (`None`: unattributed), with the receiver of what it sends.
    #[must_use]
    pub fn connect(&self, principal: Option<Principal>) -> (Connection, mpsc::Receiver<Outgoing>) {
        let (outbox, outgoing) = mpsc::channel(OUTBOX);
        let connection = Connection {
            inner: Arc::new(ConnectionInner {
                runtime: self.runtime.clone(),
                encoded: Arc::clone(&self.encoded),
                principal,
                access: self.access,
                outbox,
                subscriptions: Mutex::new(HashMap::new()),
                requests: TaskTracker::new(),
                streams: TaskTracker::new(),
                in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
                closed: CancellationToken::new(),
                legacy_ids: AtomicU64::new(0),
            }),
        };
        (connection, outgoing)
    }
}

/// One client's connection: its requests, its subscriptions, its outbox.
#[derive(Clone, Debug)]
pub struct Connection {
    inner: Arc<ConnectionInner>,
}

#[derive(Debug)]
struct ConnectionInner {
    runtime: Runtime,
    encoded: Arc<Encoded>,
    principal: Option<Principal>,
    /// Who may reach a run.
    access: RunAccess,
    outbox: mpsc::Sender<Outgoing>,
    /// Subscriptions by run, each ended by its token.
    subscriptions: Mutex<HashMap<RunId, CancellationToken>>,
    /// Requests being answered: they end by themselves.
    requests: TaskTracker,
    /// Subscriptions being served: they end when told.
    streams: TaskTracker,
    /// Places for messages in progress.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Fired when the connection ends: its subscriptions stop.
    closed: CancellationToken,
    /// Legacy requests taken so far: each gets its own id.
    legacy_ids: AtomicU64,
}

/// The most entries a `channels` list may have: there are two channels,
/// and a client may name each under its seed alias too.
pub const MAX_CHANNELS: usize = 8;

/// Why a method failed, as JSON-RPC says it.
struct Failure(ErrorObject);

impl Connection {
    /// Takes one message of text (an envelope or a batch) from the client.
    /// Requests are answered through the outbox, in tasks of their own;
    /// notifications are acted on and never answered; responses from the
    /// client are ignored. At most [`MAX_IN_FLIGHT`] messages are in
    /// progress at once: past that this waits, so a client that floods
    /// requests is read no faster than they are answered.
    pub async fn receive(&self, text: &str) {
        let Ok(permit) = Arc::clone(&self.inner.in_flight).acquire_owned().await else {
            return;
        };
        let frame = match rpc::decode_client_frame(text) {
            Ok(ClientFrame::Rpc(frame)) => frame,
            Ok(ClientFrame::Legacy(request)) => {
                self.spawn_legacy(request, permit);
                return;
            }
            Err(refusal) => {
                self.send(Outgoing::One(Envelope::Response(refusal))).await;
                return;
            }
        };
        let connection = self.clone();
        self.inner.requests.spawn(async move {
            let _permit = permit;
            match frame {
                Frame::Single(envelope) => {
                    if let Some(response) = connection.handle(envelope).await {
                        connection
                            .send(Outgoing::One(Envelope::Response(response)))
                            .await;
                    }
                }
                // A batch's entries are answered one after another, in one
                // task: a batch costs one place among those in flight.
                Frame::Batch(entries) => {
                    let mut replies = Vec::with_capacity(entries.len());
                    for entry in entries {
                        replies.push(match entry {
                            Ok(envelope) => connection.handle(envelope).await,
                            Err(refusal) => Some(refusal),
                        });
                    }
                    if let Some(replies) = rpc::batch_reply(replies) {
                        let envelopes = replies.into_iter().map(Envelope::Response).collect();
                        connection.send(Outgoing::Batch(envelopes)).await;
                    }
                }
            }
        });
    }

    /// Runs a legacy `{"t":"run"}` request under an id of its own
    /// (`legacy-N`, counted per connection), and sends what it produces in
    /// the legacy shape.
    fn spawn_legacy(&self, mut request: Request, permit: tokio::sync::OwnedSemaphorePermit) {
        let n = self.inner.legacy_ids.fetch_add(1, Ordering::Relaxed) + 1;
        let id = Id::from(format!("legacy-{n}").as_str());
        request.id = id.clone();
        let connection = self.clone();
        self.inner.requests.spawn(async move {
            let _permit = permit;
            let raw = request.params.unwrap_or(Value::Null);
            let outcome = match params(&raw) {
                Ok(submit) => connection.submit_run(submit, Some(&id)).await,
                Err(failure) => Err(failure),
            };
            let response = match outcome {
                Ok(result) => Response::result(id.clone(), result),
                Err(Failure(error)) => Response::error(id.clone(), error),
            };
            if let Some(message) = rpc::server_to_legacy(&Envelope::Response(response), &id) {
                connection.send(Outgoing::Legacy(message)).await;
            }
        });
    }

    /// Queues a refusal a framing made itself (a line over the cap).
    pub fn receive_refusal(&self, refusal: Outgoing) {
        self.spawn_send(refusal);
    }

    /// Ends the connection: no more requests are taken; the ones in
    /// progress are answered; subscriptions stop. Returns when every task
    /// of the connection has finished.
    pub async fn close(&self) {
        // Requests end by themselves; subscriptions only when told, after
        // the requests (a `submit.run` still streaming is a request).
        self.inner.requests.close();
        self.inner.requests.wait().await;
        self.inner.closed.cancel();
        self.inner.streams.close();
        self.inner.streams.wait().await;
    }

    fn spawn_send(&self, outgoing: Outgoing) {
        let connection = self.clone();
        self.inner
            .requests
            .spawn(async move { connection.send(outgoing).await });
    }

    /// Queues `outgoing`, waiting while the outbox is full. A client that
    /// went away drops it.
    async fn send(&self, outgoing: Outgoing) {
        let _ = self.inner.outbox.send(outgoing).await;
    }

    async fn notify(&self, method: &str, params: Value) {
        self.send(Outgoing::One(Envelope::Notification(Notification {
            method: method.to_owned(),
            params: Some(params),
        })))
        .await;
    }

    /// Sends `events.append`, or for a legacy request (`legacy`: its id)
    /// the legacy `{"t":"event"}`.
    async fn notify_event(
        &self,
        cursor: u64,
        event: &spool_wire::rpc::WireEvent,
        legacy: Option<&Id>,
    ) {
        match legacy {
            None => {
                self.notify_at(cursor, rpc::METHOD_EVENTS_APPEND, to_value(event))
                    .await;
            }
            Some(id) => {
                let envelope = Envelope::Notification(Notification {
                    method: rpc::METHOD_EVENTS_APPEND.to_owned(),
                    params: Some(to_value(event)),
                });
                if let Some(message) = rpc::server_to_legacy(&envelope, id) {
                    self.send(Outgoing::Legacy(message)).await;
                }
            }
        }
    }

    /// Sends a run's notification with the journal position it reflects.
    async fn notify_at(&self, cursor: u64, method: &str, params: Value) {
        self.send(Outgoing::event(cursor, method, params)).await;
    }

    /// Calls `method` with `params` in-process, as a request would: how a
    /// framing that takes its request from a URL (`/events?run_id=…`)
    /// subscribes its connection.
    ///
    /// # Errors
    ///
    /// The error object the request would have been answered with.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, ErrorObject> {
        self.call(Request {
            id: Id::Null,
            method: method.to_owned(),
            params: Some(params),
        })
        .await
        .map_err(|Failure(error)| error)
    }

    /// One envelope: a request's response, `None` for anything else.
    async fn handle(&self, envelope: Envelope) -> Option<Response> {
        match envelope {
            Envelope::Request(request) => {
                let id = request.id.clone();
                Some(match self.call(request).await {
                    Ok(result) => Response::result(id, result),
                    Err(Failure(error)) => Response::error(id, error),
                })
            }
            Envelope::Notification(notification) => {
                // A notification asks for no answer, and gets none, even
                // when it fails.
                let request = Request {
                    id: Id::Null,
                    method: notification.method,
                    params: notification.params,
                };
                let _ = self.call(request).await;
                None
            }
            Envelope::Response(_) => None,
        }
    }

    async fn call(&self, request: Request) -> Result<Value, Failure> {
        let raw = request.params.unwrap_or(Value::Null);
        match request.method.as_str() {
            rpc::METHOD_SUBMIT_RUN => self.submit_run(params(&raw)?, None).await,
            "run.respond" => self.respond(params(&raw)?).await,
            "run.cancel" => self.cancel(params(&raw)?).await,
            "run.get" => {
                let RunParams { run_id: id } = params(&raw)?;
                let run = self.reached(&id).await?;
                let view = self.runtime().get(&run).await.map_err(runtime_error)?;
                Ok(to_value(&spool_edge::tables::reply(&view)))
            }
            "run.list" => self.list(params(&raw)?).await,
            rpc::METHOD_STATE_SNAPSHOT => {
                let RunParams { run_id: id } = params(&raw)?;
                let run = self.reached(&id).await?;
                let snapshot = self.runtime().snapshot(&run).await.map_err(runtime_error)?;
                Ok(to_value(&SnapshotReply {
                    run: spool_edge::tables::reply(&snapshot.view),
                    messages: snapshot.messages,
                }))
            }
            "subscribe" => self.subscribe(params(&raw)?).await,
            "unsubscribe" => {
                let RunParams { run_id: id } = params(&raw)?;
                let run = run_id(&id)?;
                let ended = self
                    .inner
                    .subscriptions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&run);
                if let Some(token) = &ended {
                    token.cancel();
                }
                Ok(json!({"unsubscribed": ended.is_some()}))
            }
            "getCapabilities" => Ok(to_value(&capabilities())),
            "ping" => Ok(json!("pong")),
            other => Err(Failure(ErrorObject::with_reason(
                codes::METHOD_NOT_FOUND,
                format!(
                    "no method `{other}`; the methods are {}",
                    METHODS.join(", ")
                ),
            ))),
        }
    }

    fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The run named `id`, when this connection's caller may reach it:
    /// another principal's run is "not found", as an unknown one is.
    async fn reached(&self, id: &str) -> Result<RunId, Failure> {
        let run = run_id(id)?;
        self.inner
            .access
            .check(self.runtime(), self.inner.principal.as_ref(), &run)
            .await
            .map_err(runtime_error)?;
        Ok(run)
    }

    /// `submit.run`: starts a run (or a turn of `run_id`), streams the
    /// turn's `events.append` on this connection, and answers with the
    /// turn's reply once it reaches a boundary.
    /// `legacy`: the id of the legacy request this is, whose events go out
    /// in the legacy shape.
    async fn submit_run(&self, submit: SubmitRun, legacy: Option<&Id>) -> Result<Value, Failure> {
        let runtime = self.runtime();
        let policy = submit
            .turn_policy
            .as_ref()
            .map(spool_wire::run::TurnPolicy::try_from)
            .transpose()
            .map_err(|unknown| invalid_params(unknown.to_string()))?;
        // Where the stream starts: after everything the run held before.
        let (before, accepted) = match &submit.run_id {
            Some(id) => {
                let run = self.reached(id).await?;
                let before = runtime.get(&run).await.map_err(runtime_error)?.cursor;
                let message = MessageRequest {
                    text: submit.text,
                    context: submit.context.unwrap_or_default(),
                    policy,
                };
                (
                    before,
                    runtime.send(&run, message).await.map_err(runtime_error)?,
                )
            }
            None => {
                if submit.operation_id.is_some() && self.inner.principal.is_none() {
                    return Err(invalid_params(
                        "`operation_id` needs an authenticated caller",
                    ));
                }
                let address = submit
                    .address
                    .as_ref()
                    .map(|name| Address::new(spool_edge::tables::HTTP_NAMESPACE, name.clone()));
                let before = match &address {
                    Some(address) => match runtime.lookup(address).await {
                        // A message through an address bound to another's
                        // run is refused as for an unknown address.
                        Ok(view)
                            if !self
                                .inner
                                .access
                                .reaches(runtime, self.inner.principal.as_ref(), &view.run_id)
                                .await
                                .map_err(runtime_error)? =>
                        {
                            return Err(runtime_error(RuntimeError::AddressNotFound(
                                address.clone(),
                            )));
                        }
                        Ok(view) => view.cursor,
                        Err(_) => None,
                    },
                    None => None,
                };
                let request = StartRequest {
                    text: submit.text,
                    address,
                    operation_id: submit.operation_id,
                    principal: self.inner.principal.clone(),
                    title: submit.title,
                    kind: submit.kind,
                    context: submit.context.unwrap_or_default(),
                    policy,
                };
                (before, runtime.start(request).await.map_err(runtime_error)?)
            }
        };
        let view = match &accepted {
            Accepted::Started { run, turn } | Accepted::Steered { run, turn } => {
                self.stream_turn(run, turn, before, legacy).await?
            }
            Accepted::Queued { run, queued } => runtime
                .wait_for_queued(run, *queued)
                .await
                .map_err(runtime_error)?,
            Accepted::Replayed { run, .. } => runtime.get(run).await.map_err(runtime_error)?,
        };
        Ok(to_value(&spool_edge::tables::reply(&view)))
    }

    /// Sends `turn`'s events (from after `before`) until the turn reaches a
    /// boundary, and returns the run then.
    async fn stream_turn(
        &self,
        run: &RunId,
        turn: &TurnId,
        before: Option<Seq>,
        legacy: Option<&Id>,
    ) -> Result<RunView, Failure> {
        let runtime = self.runtime();
        let mut items = runtime
            .subscribe(run, before)
            .await
            .map_err(runtime_error)?;
        let mut mapper = Mapper::new(run);
        // The last journal position sent.
        let mut sent = before;
        let boundary = runtime.wait_for(run, turn);
        tokio::pin!(boundary);
        let view = loop {
            tokio::select! {
                // Events first: everything up to the boundary goes out
                // before the answer.
                biased;
                item = items.next() => match item {
                    Some(item) => {
                        if let StreamItem::Event(envelope) = &item {
                            sent = Some(envelope.seq);
                        }
                        if self.forward(run, &mut mapper, item, legacy).await.is_break() {
                            // Lagged: the answer still comes.
                            return boundary.await.map_err(runtime_error);
                        }
                    }
                    None => return boundary.await.map_err(runtime_error),
                },
                view = &mut boundary => break view.map_err(runtime_error)?,
            }
        };
        // The boundary is known before its events reach the subscription:
        // what the journal holds up to it goes out before the answer.
        let Some(last) = view.cursor else {
            return Ok(view);
        };
        while sent.is_none_or(|sent| sent < last) {
            let Some(item) = items.next().await else {
                break;
            };
            if let StreamItem::Event(envelope) = &item {
                sent = Some(envelope.seq);
            }
            if self
                .forward(run, &mut mapper, item, legacy)
                .await
                .is_break()
            {
                break;
            }
        }
        Ok(view)
    }

    /// A journal event's `events.append` notifications for a subscription,
    /// encoded by the first subscription of the run to reach it.
    fn encoded_events(
        &self,
        mapper: &mut Mapper,
        envelope: &spool_journal::Envelope,
    ) -> Arc<[Outgoing]> {
        let mut mapped = false;
        let encoded = self.inner.encoded.events.line(envelope, |envelope| {
            mapped = true;
            mapper
                .envelope(envelope)
                .iter()
                .map(|event| {
                    Outgoing::event(envelope.seq.0, rpc::METHOD_EVENTS_APPEND, to_value(event))
                })
                .collect()
        });
        if !mapped {
            mapper.advance(envelope);
        }
        encoded
    }

    /// A live delta's `events.append`, encoded once for the run's
    /// subscriptions (with the time the first of them sent it).
    fn encoded_delta(&self, run: &RunId, mapper: &Mapper, delta: &LiveDelta) -> Option<Outgoing> {
        let encode = || {
            let event = mapper.delta(delta, now_nanos())?;
            // Live only: a client resuming from here gets what the journal
            // holds after the last durable position.
            Some(Outgoing::event(
                delta.after.0.saturating_sub(1),
                rpc::METHOD_EVENTS_APPEND,
                to_value(&event),
            ))
        };
        // A delta's number names it within its run.
        self.inner
            .encoded
            .deltas
            .get_or_encode(run, Seq(delta.n), encode)
    }

    /// Sends a journal event's `events.append` notifications.
    async fn send_events(
        &self,
        mapper: &mut Mapper,
        envelope: &spool_journal::Envelope,
        legacy: Option<&Id>,
    ) {
        for event in mapper.envelope(envelope) {
            self.notify_event(envelope.seq.0, &event, legacy).await;
        }
    }

    /// Sends one hub item as `events.append`; `Break` when the subscriber
    /// fell behind (it was told, with the cursor to resume after).
    async fn forward(
        &self,
        run: &RunId,
        mapper: &mut Mapper,
        item: StreamItem,
        legacy: Option<&Id>,
    ) -> std::ops::ControlFlow<()> {
        match item {
            StreamItem::Event(envelope) => self.send_events(mapper, &envelope, legacy).await,
            StreamItem::Delta(delta) => {
                let nanos = now_nanos();
                if let Some(event) = mapper.delta(&delta, nanos) {
                    // Live only: a client resuming from here gets what the
                    // journal holds after the last durable position.
                    self.notify_event(delta.after.0.saturating_sub(1), &event, legacy)
                        .await;
                }
            }
            StreamItem::Lagged { last } => {
                self.notify(
                    "subscription.lagged",
                    json!({"run_id": run.as_str(), "cursor": last.map(|s| s.0)}),
                )
                .await;
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    /// `subscribe`: `events.append` (channel `spool:events`) and/or
    /// `state.patch` (channel `spool:state`) for a run from a cursor,
    /// journal first, then live, until `unsubscribe`, the connection's end,
    /// or the subscriber falling behind.
    async fn subscribe(&self, subscribe: Subscribe) -> Result<Value, Failure> {
        let run = self.reached(&subscribe.run_id).await?;
        let channels = Channels::of(subscribe.channels.as_deref())?;
        let cursor = subscribe.cursor;
        let last = self
            .runtime()
            .get(&run)
            .await
            .map_err(runtime_error)?
            .cursor;
        if let Some(cursor) = cursor
            && last.is_none_or(|last| cursor > last.0)
        {
            return Err(invalid_params(format!(
                "cursor {cursor} is past run {run}'s last position"
            )));
        }
        // From the start, so the mapper knows the model call a resumed
        // stream is in the middle of (its span) and the patcher the
        // document at the cursor; what is at or before the cursor is not
        // sent.
        let items = self
            .runtime()
            .subscribe(&run, None)
            .await
            .map_err(runtime_error)?;
        let token = self.inner.closed.child_token();
        if let Some(previous) = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.clone(), token.clone())
        {
            // One subscription per run and connection: the new one wins.
            previous.cancel();
        }
        let connection = self.clone();
        let subscribed = run.clone();
        self.inner.streams.spawn(async move {
            let mut items = items;
            let mut mapper = Mapper::new(&subscribed);
            let mut patcher = channels.state.then(|| Patcher::new(&subscribed));
            loop {
                let item = tokio::select! {
                    () = token.cancelled() => break,
                    // Nobody reads the connection any more (a host dropped
                    // it without closing it): the subscription ends.
                    () = connection.inner.outbox.closed() => break,
                    item = items.next() => item,
                };
                let Some(item) = item else { break };
                if let StreamItem::Event(envelope) = &item
                    && cursor.is_some_and(|cursor| envelope.seq.0 <= cursor)
                {
                    mapper.advance(envelope);
                    if let Some(patcher) = &mut patcher {
                        patcher.skip(envelope);
                    }
                    continue;
                }
                let flow = match item {
                    StreamItem::Event(envelope) => {
                        // A position's events go out before its patch: a
                        // client resuming after it has both.
                        if channels.events {
                            for event in connection.encoded_events(&mut mapper, &envelope).iter() {
                                connection.send(event.clone()).await;
                            }
                        } else {
                            mapper.advance(&envelope);
                        }
                        if let Some(patch) = patcher.as_mut().and_then(|p| p.apply(&envelope)) {
                            connection
                                .notify_at(
                                    envelope.seq.0,
                                    rpc::METHOD_STATE_PATCH,
                                    patch.params(&subscribed),
                                )
                                .await;
                        }
                        std::ops::ControlFlow::Continue(())
                    }
                    StreamItem::Delta(_) if !channels.events => std::ops::ControlFlow::Continue(()),
                    StreamItem::Delta(delta) => {
                        if let Some(event) = connection.encoded_delta(&subscribed, &mapper, &delta)
                        {
                            connection.send(event).await;
                        }
                        std::ops::ControlFlow::Continue(())
                    }
                    item => {
                        connection
                            .forward(&subscribed, &mut mapper, item, None)
                            .await
                    }
                };
                if flow.is_break() {
                    break;
                }
            }
            let mut subscriptions = connection
                .inner
                .subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if subscriptions
                .get(&subscribed)
                .is_some_and(|t| t.is_cancelled() || t == &token)
            {
                subscriptions.remove(&subscribed);
            }
        });
        Ok(json!({"subscribed": run.as_str(), "channels": channels.names()}))
    }

    async fn respond(&self, respond: RespondParams) -> Result<Value, Failure> {
        let run = self.reached(&respond.run_id).await?;
        let turn = respond
            .turn_id
            .as_deref()
            .map(TurnId::new)
            .transpose()
            .map_err(|e| invalid_params(format!("`turn_id`: {e}")))?;
        if respond.responses.is_empty() {
            return Err(invalid_params("`responses` needs at least one answer"));
        }
        let answers = respond
            .responses
            .into_iter()
            .map(|answer| Answer {
                text: answer.text,
                approved: answer.approved,
            })
            .collect();
        self.runtime()
            .respond(&run, turn.as_ref(), answers)
            .await
            .map_err(runtime_error)?;
        let view = self.runtime().get(&run).await.map_err(runtime_error)?;
        Ok(to_value(&spool_edge::tables::reply(&view)))
    }

    async fn cancel(&self, cancel: CancelParams) -> Result<Value, Failure> {
        let run = run_id(&cancel.run_id)?;
        // Another principal's run is cancelled as an unknown one is: a
        // harmless `not_active`.
        let reached = self
            .inner
            .access
            .reaches(self.runtime(), self.inner.principal.as_ref(), &run)
            .await;
        match reached {
            Ok(true) => {}
            Ok(false) | Err(RuntimeError::RunNotFound(_)) => {
                return Ok(to_value(&CancelReply {
                    status: CancelStatus::NotActive,
                    run_id: None,
                    turn_id: None,
                }));
            }
            Err(error) => return Err(runtime_error(error)),
        }
        let turn = cancel
            .turn_id
            .as_deref()
            .map(TurnId::new)
            .transpose()
            .map_err(|e| invalid_params(format!("`turn_id`: {e}")))?;
        let reply = match self.runtime().cancel(&run, turn.as_ref()).await {
            Ok(CancelOutcome::Requested(turn)) => CancelReply {
                status: CancelStatus::Requested,
                run_id: Some(run.to_string()),
                turn_id: Some(turn.to_string()),
            },
            Ok(CancelOutcome::Stale { current }) => CancelReply {
                status: CancelStatus::Stale,
                run_id: Some(run.to_string()),
                turn_id: current.map(|t| t.to_string()),
            },
            // As over HTTP: cancelling an unknown or idle run is harmless.
            Ok(CancelOutcome::NotActive) | Err(RuntimeError::RunNotFound(_)) => CancelReply {
                status: CancelStatus::NotActive,
                run_id: None,
                turn_id: None,
            },
            Err(error) => return Err(runtime_error(error)),
        };
        Ok(to_value(&reply))
    }

    async fn list(&self, list: ListParams) -> Result<Value, Failure> {
        let limit = list.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(invalid_params("`limit` must be 1 to 1000"));
        }
        let all = self.runtime().list().await.map_err(runtime_error)?;
        // Under owner access a page holds the caller's runs only.
        let mut listed = Vec::with_capacity(limit.min(all.len()));
        for summary in all {
            if listed.len() == limit {
                break;
            }
            let reached = self
                .inner
                .access
                .reaches(
                    self.runtime(),
                    self.inner.principal.as_ref(),
                    &summary.run_id,
                )
                .await;
            match reached {
                Ok(true) => listed.push(summary),
                // Gone since it was listed, or another's.
                Ok(false) | Err(RuntimeError::RunNotFound(_)) => {}
                Err(error) => return Err(runtime_error(error)),
            }
        }
        let runs: Vec<Value> = listed
            .into_iter()
            .map(|summary| {
                json!({
                    "id": summary.run_id.as_str(),
                    "state": summary.status.state().as_str(),
                    "title": summary.title,
                    "updated": summary.updated_at.unix_timestamp(),
                })
            })
            .collect();
        Ok(json!({"runs": runs}))
    }
}

/// The `getCapabilities` and `/version` document.
#[must_use]
pub fn capabilities() -> VersionDocument {
    VersionDocument::new(
        env!("CARGO_PKG_VERSION"),
        METHODS.iter().map(|m| (*m).to_owned()).collect(),
    )
}

/// `submit.run`'s params: the HTTP channel's start fields, and `run_id` to
/// continue a run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRun {
    text: String,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    operation_id: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    context: Option<Vec<String>>,
    #[serde(default)]
    turn_policy: Option<wire::TurnPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunParams {
    run_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondParams {
    run_id: String,
    #[serde(default)]
    turn_id: Option<String>,
    responses: Vec<AnswerParams>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerParams {
    #[serde(default)]
    text: String,
    #[serde(default)]
    approved: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelParams {
    run_id: String,
    #[serde(default)]
    turn_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Subscribe {
    run_id: String,
    #[serde(default)]
    cursor: Option<u64>,
    #[serde(default)]
    channels: Option<Vec<String>>,
}

/// The channels a subscription carries.
#[derive(Clone, Copy, Debug)]
struct Channels {
    events: bool,
    state: bool,
}

impl Channels {
    /// The channels asked for: `spool:events` when none are named.
    fn of(names: Option<&[String]>) -> Result<Self, Failure> {
        let Some(names) = names else {
            return Ok(Self {
                events: true,
                state: false,
            });
        };
        let mut channels = Self {
            events: false,
            state: false,
        };
        if names.len() > MAX_CHANNELS {
            return Err(invalid_params(format!(
                "`channels` names at most {MAX_CHANNELS} channels"
            )));
        }
        for name in names {
            match name.as_str() {
                rpc::CHANNEL_EVENTS => channels.events = true,
                rpc::CHANNEL_STATE => channels.state = true,
                other => {
                    return Err(invalid_params(format!(
                        "channel `{other}` cannot be subscribed to; `{}` and `{}` can",
                        rpc::CHANNEL_EVENTS,
                        rpc::CHANNEL_STATE
                    )));
                }
            }
        }
        if !(channels.events || channels.state) {
            return Err(invalid_params("`channels` names no channel"));
        }
        Ok(channels)
    }

    fn names(self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.events {
            names.push(rpc::CHANNEL_EVENTS);
        }
        if self.state {
            names.push(rpc::CHANNEL_STATE);
        }
        names
    }
}

/// Decodes a method's params; absent params read as `{}`.
fn params<T: DeserializeOwned>(value: &Value) -> Result<T, Failure> {
    let value = if value.is_null() { &json!({}) } else { value };
    T::deserialize(value).map_err(|e| invalid_params(e.to_string()))
}

fn run_id(raw: &str) -> Result<RunId, Failure> {
    RunId::new(raw).map_err(|e| invalid_params(format!("`run_id`: {e}")))
}

fn invalid_params(reason: impl Into<String>) -> Failure {
    Failure(ErrorObject::with_reason(codes::INVALID_PARAMS, reason))
}

fn internal() -> ErrorObject {
    ErrorObject::with_reason(codes::INTERNAL_ERROR, "internal error")
}

/// A runtime error as JSON-RPC says it: the code by kind, and `data` with
/// the runtime's kind and the HTTP channel's code, so a client of both
/// branches on one vocabulary. Internal details go to the log.
fn runtime_error(error: RuntimeError) -> Failure {
    let kind = error.kind();
    let http = spool_edge::tables::error_code(kind);
    let code = match kind {
        ErrorKind::RunNotFound | ErrorKind::AddressNotFound => codes::RUN_NOT_FOUND,
        ErrorKind::BadRequest
        | ErrorKind::InvalidAnswer
        | ErrorKind::AddressTooLong
        | ErrorKind::TitleTooLong
        | ErrorKind::OperationIdTooLong => codes::INVALID_PARAMS,
        ErrorKind::Internal => codes::INTERNAL_ERROR,
        _ => codes::USER_ERROR,
    };
    if code == codes::INTERNAL_ERROR {
        tracing::error!(target: "spool::rpc", error = %error, "internal error");
        return Failure(internal());
    }
    let mut object = ErrorObject::with_reason(code, error.to_string());
    object.data = Some(json!({"reason": error.to_string(), "code": http.as_str()}));
    Failure(object)
}

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("replies are plain JSON values")
}

fn now_nanos() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(0)
}
