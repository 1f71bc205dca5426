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
use tracing::Instrument;

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

mod methods;
mod params;

use params::*;

/// How many envelopes a connection's outbox holds before its writers wait.
pub const OUTBOX: usize = 256;

/// How many messages of one connection are handled at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// The methods this server answers, as `getCapabilities` and `/version`
/// list them.
pub const METHODS: [&str; 12] = [
    rpc::METHOD_SUBMIT_RUN,
    "run.respond",
    "run.cancel",
    "run.fork",
    "run.delete",
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

/// One subscription of a connection: what ends it, and the channels it
/// carries now (`unsubscribe` may leave one of two).
#[derive(Clone, Debug)]
struct Following {
    token: CancellationToken,
    channels: Arc<std::sync::atomic::AtomicU8>,
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
    subscriptions: Mutex<HashMap<RunId, Following>>,
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

    /// One method call, in a span of its own (`RUST_LOG=spool=debug`),
    /// inside its connection's: the method, the request's id, and the run
    /// it names when it names one. Every framing's requests, and a host's
    /// in-process ones, come through here.
    async fn call(&self, request: Request) -> Result<Value, Failure> {
        let span = tracing::debug_span!(
            target: "spool::rpc",
            "rpc request",
            method = request.method.as_str(),
            id = %serde_json::to_string(&request.id).unwrap_or_default(),
            run_id = tracing::field::Empty,
        );
        if let Some(run) = request
            .params
            .as_ref()
            .and_then(|params| params.get("run_id"))
            .and_then(Value::as_str)
        {
            span.record("run_id", run);
        }
        self.call_in_span(request).instrument(span).await
    }

    async fn call_in_span(&self, request: Request) -> Result<Value, Failure> {
        let raw = request.params.unwrap_or(Value::Null);
        match request.method.as_str() {
            rpc::METHOD_SUBMIT_RUN => self.submit_run(params(&raw)?, None).await,
            "run.respond" => self.respond(params(&raw)?).await,
            "run.cancel" => self.cancel(params(&raw)?).await,
            "run.fork" => self.fork(params(&raw)?).await,
            "run.delete" => self.delete(params(&raw)?).await,
            "run.get" => {
                let RunParams { run_id: id } = params(&raw)?;
                let run = self.reached(&id).await?;
                let view = self.runtime().get(&run).await.map_err(runtime_error)?;
                Ok(to_value(&spool_edge::tables::reply(&view)))
            }
            "run.list" => self.list(params(&raw)?).await,
            rpc::METHOD_STATE_SNAPSHOT => {
                // The seed calls `state.snapshot()` with no params: the
                // run this connection follows, when it follows one.
                let SnapshotParams { run_id } = params(&raw)?;
                let id = match run_id {
                    Some(id) => id,
                    None => match self.subscribed_run()? {
                        Some(id) => id,
                        // Following no run: the server's state, the runs
                        // the caller may see and theirs (`run.list`).
                        None => return self.list(ListParams { limit: None }).await,
                    },
                };
                let run = self.reached(&id).await?;
                let snapshot = self.runtime().snapshot(&run).await.map_err(runtime_error)?;
                Ok(to_value(&SnapshotReply {
                    run: spool_edge::tables::reply(&snapshot.view),
                    messages: snapshot.messages,
                }))
            }
            "subscribe" => self.subscribe(params(&raw)?).await,
            "unsubscribe" => self.unsubscribe(params(&raw)?),
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

    /// `unsubscribe`: leaves the channels named (every channel when none
    /// are), and ends the subscription once it carries none.
    fn unsubscribe(&self, unsubscribe: Unsubscribe) -> Result<Value, Failure> {
        let run = run_id(&unsubscribe.run_id)?;
        let leaving = match &unsubscribe.channels {
            Some(names) => Channels::of(Some(names))?.bits(),
            None => u8::MAX,
        };
        let mut subscriptions = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(following) = subscriptions.get(&run) else {
            return Ok(json!({"unsubscribed": false, "channels": []}));
        };
        let before = following.channels.fetch_and(!leaving, Ordering::SeqCst);
        let left = Channels::from_bits(before & !leaving);
        if left.bits() == 0 {
            following.token.cancel();
            subscriptions.remove(&run);
        }
        Ok(json!({"unsubscribed": before & leaving != 0, "channels": left.names()}))
    }

    /// The one run this connection subscribes to: what `state.snapshot`
    /// without a `run_id` answers; `None` when it subscribes to none.
    fn subscribed_run(&self) -> Result<Option<String>, Failure> {
        let subscriptions = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut runs = subscriptions.keys();
        match (runs.next(), runs.next()) {
            (Some(run), None) => Ok(Some(run.to_string())),
            (None, _) => Ok(None),
            (Some(_), Some(_)) => Err(invalid_params(format!(
                "this connection subscribes to {} runs: name one with `run_id`",
                subscriptions.len()
            ))),
        }
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
}

/// The `getCapabilities` and `/version` document.
#[must_use]
pub fn capabilities() -> VersionDocument {
    VersionDocument::new(
        env!("CARGO_PKG_VERSION"),
        METHODS.iter().map(|m| (*m).to_owned()).collect(),
    )
}
