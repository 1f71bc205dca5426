//! The HTTP channel under `/spool/v1`, clause by clause as the channel's
//! document describes it (`docs/protocol/http.md`).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::{Value, json};
use spool_journal::event::Answer;
use spool_journal::fold::Status;
use spool_journal::{Address, Principal, RunId, Seq};
use spool_runtime::{
    Accepted, Authenticator, Credentials, ErrorKind, MessageRequest, Runtime, RuntimeError,
    StartRequest,
};
use spool_wire::http::{
    self as wire, AddressReply, CancelReply, CancelStatus, ErrorCode, Info, MessageRun, Respond,
    SnapshotReply, StartRun,
};
use tokio::sync::watch;

use crate::body::{self, Body};

use crate::stream::{OpenStream, Parts, StreamBody};
/// The namespace HTTP addresses live in.
pub use spool_edge::tables::HTTP_NAMESPACE as NAMESPACE;

/// The HTTP channel: a runtime, an optional authenticator, and what
/// `/info` says.
#[derive(Clone)]
pub struct HttpChannel {
    runtime: Runtime,
    authenticator: Option<Arc<dyn Authenticator>>,
    agent: Option<String>,
    closing: watch::Receiver<bool>,
    /// How long a request's body may take to arrive.
    body_timeout: std::time::Duration,
    mounted: Vec<(String, crate::server::Handler)>,
    /// Stream lines encoded once for every stream of a run.
    lines: Arc<crate::stream::SharedLines>,
    /// The runs whose caught-up streams share one reader.
    fanouts: Arc<crate::fanout::Fanouts>,
    /// How many streams are open.
    streams: Arc<watch::Sender<usize>>,
    /// Who may reach a run.
    access: RunAccess,
    /// The runtime's schedules, for the schedule routes.
    schedules: Option<spool_runtime::Scheduler>,
    /// Who may trigger a schedule; without one the route is refused.
    trigger: Option<crate::schedules::TriggerAuthorizer>,
    /// Which node drives a run, on a cluster: commands for runs driven
    /// elsewhere are forwarded there.
    placement: Option<Arc<dyn crate::forward::Placement>>,
    /// The cluster's secret: a node showing it may hand this one a
    /// schedule's firing to deliver.
    node_secret: Option<String>,
    /// The origin, host and content-type rules, checked before anything
    /// else on every request.
    guard: Arc<crate::guard::Guard>,
}

/// Who may read or drive a run: the runtime's one check, which every
/// surface calls.
pub use spool_runtime::RunAccess;

/// Every route the channel serves, as `(method, path)` under
/// [`wire::BASE_PATH`]: what `docs/openapi.json` must list.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/info"),
    ("GET", "/runs"),
    ("POST", "/runs"),
    ("GET", "/addresses/{address}"),
    ("POST", "/addresses/{address}"),
    ("GET", "/runs/{id}"),
    ("POST", "/runs/{id}"),
    ("GET", "/runs/{id}/snapshot"),
    ("GET", "/runs/{id}/stream"),
    ("POST", "/runs/{id}/respond"),
    ("POST", "/runs/{id}/cancel"),
    ("POST", "/runs/{id}/reset"),
    ("POST", "/runs/{id}/clear"),
    ("POST", "/runs/{id}/compact"),
    ("GET", "/schedules"),
    ("GET", "/schedules/{name}"),
    ("POST", "/schedules/{name}/trigger"),
];

/// A host route that cannot be mounted.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot mount `{0}`: a host route starts with `/` and stays outside the reserved `/spool/` namespace"
)]
pub struct MountError(pub String);

impl std::fmt::Debug for HttpChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpChannel")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

pub use spool_edge::tables::{Authenticated, error_code, reply};

/// What a route needs to know about the caller.
struct Caller {
    principal: Option<Principal>,
    verified: bool,
    /// What ends the caller's long-lived responses.
    session: crate::session::Session,
}

impl Caller {
    /// The principal an authenticator proved, if any: what ownership is
    /// checked against.
    fn proven(&self) -> Option<&Principal> {
        self.principal.as_ref().filter(|_| self.verified)
    }
}

impl HttpChannel {
    /// A channel over `runtime`. `closing` turning true ends open streams
    /// (a server's graceful shutdown).
    #[must_use]
    pub fn new(runtime: Runtime, closing: watch::Receiver<bool>) -> Self {
        Self {
            runtime,
            authenticator: None,
            agent: None,
            closing,
            body_timeout: body::BODY_READ_TIMEOUT,
            mounted: Vec::new(),
            lines: Arc::default(),
            fanouts: Arc::default(),
            streams: Arc::new(watch::channel(0).0),
            access: RunAccess::Any,
            schedules: None,
            trigger: None,
            placement: None,
            node_secret: None,
            guard: Arc::default(),
        }
    }

    /// Forwards each command (a message, an answer, a cancel, reset,
    /// clear, compact, a schedule's trigger) for a run another node drives
    /// to that node, as `placement` tells, and answers with that node's
    /// reply: on a cluster every node answers every route as the run's
    /// own node would. Reads are answered here, from the shared journal.
    #[must_use]
    pub fn with_placement(mut self, placement: Arc<dyn crate::forward::Placement>) -> Self {
        self.placement = Some(placement);
        self
    }

    /// Accepts schedule firings handed over by other nodes of a cluster
    /// that show `secret` (the cluster's, from
    /// `spool_journal_pg::Cluster::secret`), for the runs this node
    /// drives: the other side of [`crate::forward::HttpRelay`]. Without
    /// it the route does not exist.
    #[must_use]
    pub fn with_cluster_secret(mut self, secret: impl Into<String>) -> Self {
        self.node_secret = Some(secret.into());
        self
    }

    /// Serves `scheduler`'s schedules under `/schedules`.
    #[must_use]
    pub fn with_schedules(mut self, scheduler: spool_runtime::Scheduler) -> Self {
        self.schedules = Some(scheduler);
        self
    }

    /// Accepts `POST /schedules/{name}/trigger` from the callers
    /// `authorizer` admits (given the principal the authenticator proved);
    /// without one the route answers 404, as the seed mounts it only with
    /// a trigger authorizer.
    #[must_use]
    pub fn with_trigger_authorizer(
        mut self,
        authorizer: crate::schedules::TriggerAuthorizer,
    ) -> Self {
        self.trigger = Some(authorizer);
        self
    }

    /// Who may reach a run ([`RunAccess::Any`] by default). With
    /// [`RunAccess::Owner`], set an authenticator too: without one no
    /// caller is proven, so only runs nobody owns would be reachable, by
    /// nobody.
    #[must_use]
    pub fn with_run_access(mut self, access: RunAccess) -> Self {
        self.access = access;
        self
    }

    /// How many streams are open, as it changes: each `GET …/stream` is
    /// open until its client goes, the run's stream ends or the server
    /// shuts down.
    #[must_use]
    pub fn open_streams(&self) -> watch::Receiver<usize> {
        self.streams.subscribe()
    }

    /// How long a request's body may take to arrive, from the end of its
    /// headers ([`body::BODY_READ_TIMEOUT`] by default); past it the
    /// request is answered `request_timeout`.
    #[must_use]
    pub fn with_body_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Serves this channel on `listener` until `shutdown` completes, then
    /// shuts down gracefully, as [`crate::serve`] does.
    ///
    /// # Errors
    ///
    /// [`crate::server::Exposed`] (as an `io::Error` of kind
    /// `PermissionDenied`) for a TCP listener other machines can reach
    /// when the channel has no authenticator; errors of the listener.
    pub async fn serve(
        self,
        listener: crate::Listener,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        listener
            .check_exposure(self.authenticator.is_some())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        let guard = (*self.guard).clone().for_listener(&listener);
        crate::serve(listener, self.with_guard(guard).handler(), shutdown).await
    }

    /// The origin, host and content-type rules ([`crate::guard::Guard`]):
    /// the strictest by default (a loopback listener, no foreign origin,
    /// loopback names only). [`HttpChannel::serve`] sets how its listener
    /// is reached; a host serving [`HttpChannel::handler`] on its own
    /// listener says so here ([`crate::guard::Guard::reached`]).
    #[must_use]
    pub fn with_guard(mut self, guard: crate::guard::Guard) -> Self {
        self.guard = Arc::new(guard);
        self
    }

    /// Requires every route but `/health` and `/ready` to pass
    /// `authenticator`; body `auth` is then ignored.
    #[must_use]
    pub fn with_authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Self {
        self.authenticator = Some(authenticator);
        self
    }

    /// The agent's name, for `/info`.
    #[must_use]
    pub fn with_agent(mut self, agent: Option<String>) -> Self {
        self.agent = agent;
        self
    }

    /// Mounts a host's own routes (a Slack webhook, a web app) under
    /// `prefix`, beside Spool's. The channel's authenticator covers them too.
    ///
    /// # Errors
    ///
    /// [`MountError`] for a prefix that does not start with `/` or lies
    /// under `/spool/`.
    pub fn mount(
        mut self,
        prefix: &str,
        handler: crate::server::Handler,
    ) -> Result<Self, MountError> {
        if !prefix.starts_with('/')
            || prefix == "/"
            || prefix.starts_with("/spool/")
            || prefix == "/spool"
        {
            return Err(MountError(prefix.to_owned()));
        }
        self.mounted
            .push((prefix.trim_end_matches('/').to_owned(), handler));
        Ok(self)
    }

    /// The channel as a server handler, logging each request (method,
    /// path, status, time taken) through `tracing`.
    #[must_use]
    pub fn handler(self) -> crate::server::Handler {
        let channel = Arc::new(self);
        Arc::new(move |request| {
            let channel = Arc::clone(&channel);
            Box::pin(async move {
                let mut log = RequestLog {
                    method: request.method().clone(),
                    path: request.uri().path().to_owned(),
                    started: std::time::Instant::now(),
                    status: None,
                };
                let reply = channel.handle(request).await;
                log.status = Some(reply.status().as_u16());
                reply
            })
        })
    }

    /// Answers one request: the origin, host and content-type rules
    /// first, then its route.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let pass = match self.guard.check(request.method(), request.headers()) {
            crate::guard::Verdict::Pass(pass) => pass,
            crate::guard::Verdict::Preflight(origin) => {
                let methods = self.methods(request.uri().path());
                return crate::guard::preflight(&origin, &methods);
            }
            crate::guard::Verdict::Refuse(refusal) => return refused(&refusal),
        };
        let mut reply = self.route(request).await;
        pass.decorate(&mut reply);
        reply
    }

    /// The methods the route at `path` takes, for a CORS preflight.
    fn methods(&self, path: &str) -> Vec<Method> {
        let Some(rest) = path.strip_prefix(wire::BASE_PATH) else {
            // A mounted route (JSON-RPC's, a host's) says for itself which
            // method it takes; both are named.
            return vec![Method::GET, Method::POST];
        };
        let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let matches = |template: &str| {
            let template: Vec<&str> = template.trim_start_matches('/').split('/').collect();
            template.len() == segments.len()
                && template
                    .iter()
                    .zip(&segments)
                    .all(|(want, have)| want == have || (want.starts_with('{') && !have.is_empty()))
        };
        ROUTES
            .iter()
            .filter(|(_, template)| matches(template))
            .filter_map(|(method, _)| Method::from_bytes(method.as_bytes()).ok())
            .collect()
    }

    /// Answers one request that passed the guard.
    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        // Liveness and readiness are public, as a load balancer asks them.
        // Every other path, known or not, meets the authenticator first:
        // without valid credentials a caller learns nothing, not even
        // which routes exist.
        match path.strip_prefix(wire::BASE_PATH) {
            Some("/health") if method == Method::GET => {
                return body::json(StatusCode::OK, &wire::Health::ready());
            }
            Some("/ready") if method == Method::GET => return self.ready(),
            Some("/health" | "/ready") => {
                return method_not_allowed(&method, &path, &[Method::GET]);
            }
            _ => {}
        }
        // A firing handed over by another node proves itself with the
        // cluster's secret, not a client's credentials; to anyone else
        // the route does not exist.
        if method == Method::POST
            && let (Some(secret), Some(name)) = (
                self.node_secret.as_deref(),
                crate::forward::relayed_delivery(&path),
            )
            && crate::forward::shows_secret(request.headers(), secret)
        {
            let name = name.to_owned();
            return self.deliver_relayed(&name, request).await;
        }
        let caller = match self.authenticate(&request).await {
            Ok(caller) => caller,
            Err(reply) => return *reply,
        };
        let Some(rest) = path.strip_prefix(wire::BASE_PATH) else {
            let mounted = self
                .mounted
                .iter()
                .filter(|(prefix, _)| path == *prefix || path.starts_with(&format!("{prefix}/")))
                .max_by_key(|(prefix, _)| prefix.len());
            if let Some((_, handler)) = mounted {
                let mut request = request;
                let principal = caller.proven().cloned();
                request.extensions_mut().insert(Authenticated(principal));
                request.extensions_mut().insert(caller.session);
                return handler(request).await;
            }
            return body::error(ErrorCode::RunNotFound, format!("no route {path}"));
        };
        let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let route: (&[Method], Route) = match segments.as_slice() {
            ["info"] => (&[Method::GET], Route::Info),
            ["runs"] => (&[Method::GET, Method::POST], Route::Runs),
            ["addresses", address] => (
                &[Method::GET, Method::POST],
                Route::Address((*address).to_owned()),
            ),
            // `/runs/` names no run: no such route, not a malformed id.
            ["runs", ""] => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
            ["runs", id] => (&[Method::GET, Method::POST], Route::Run((*id).to_owned())),
            ["runs", id, action] => {
                let allowed: &[Method] = match *action {
                    "snapshot" | "stream" => &[Method::GET],
                    "respond" | "cancel" | "reset" | "clear" | "compact" => &[Method::POST],
                    _ => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
                };
                (
                    allowed,
                    Route::RunAction((*id).to_owned(), (*action).to_owned()),
                )
            }
            ["schedules"] => (&[Method::GET], Route::Schedules),
            ["schedules", name] if !name.is_empty() => {
                (&[Method::GET], Route::Schedule((*name).to_owned()))
            }
            ["schedules", name, "trigger"] if !name.is_empty() => {
                (&[Method::POST], Route::Trigger((*name).to_owned()))
            }
            _ => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
        };
        let (allowed, route) = route;
        if !allowed.contains(&method) {
            return method_not_allowed(&method, &path, allowed);
        }
        // A run the caller may not reach does not exist for it: answered
        // before its body is read, the same as an unknown run.
        if let Route::Run(id) | Route::RunAction(id, _) = &route {
            let run = match run_id(id) {
                Ok(run) => run,
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            };
            let unknown = match self.reaches(&caller, &run).await {
                Ok(reached) => !reached,
                Err(RuntimeError::RunNotFound(_)) => true,
                Err(error) => return runtime_error(&error),
            };
            if unknown {
                // As for any unknown run: cancel is a harmless no-op.
                if matches!(&route, Route::RunAction(_, action) if action == "cancel") {
                    return cancel_reply(CancelStatus::NotActive, None, None);
                }
                return runtime_error(&RuntimeError::RunNotFound(run));
            }
        }
        let query = request.uri().query().map(str::to_owned);
        let (parts, incoming) = request.into_parts();
        // A stream's driver may write a plain HTTP/1.1 GET's chunks to its
        // socket itself (`crate::tap`).
        let tap = parts
            .extensions
            .get::<Arc<spool_edge::tap::Tap>>()
            .filter(|_| parts.version == http::Version::HTTP_11 && method == Method::GET)
            .cloned();
        let bytes = if method == Method::POST {
            match body::read_capped(incoming, wire::MAX_BODY_BYTES, self.body_timeout).await {
                Ok(bytes) => bytes,
                Err(reply) => return *reply,
            }
        } else {
            Bytes::new()
        };
        if method == Method::POST
            && let Some(placement) = &self.placement
            && !crate::forward::forwarded(&parts.headers)
            && let Some(run) = self.commanded_run(&route, &bytes).await
            && let Some(address) = crate::forward::holder(placement.as_ref(), &run).await
        {
            return crate::forward::forward(placement.as_ref(), &run, &address, &parts, bytes)
                .await;
        }
        // Bytes that are not UTF-8 are refused, never replaced: what is
        // recorded is what the client sent.
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            Err(error) => {
                return body::error(
                    ErrorCode::BadRequest,
                    format!(
                        "the body is not UTF-8 (an invalid byte at offset {})",
                        error.valid_up_to()
                    ),
                );
            }
        };
        let result = match (route, method) {
            (Route::Info, _) => Ok(body::json(
                StatusCode::OK,
                &Info {
                    agent: self.agent.clone(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    // This channel, and the host's own mounted beside it.
                    channels: std::iter::once(NAMESPACE.to_owned())
                        .chain(self.mounted.iter().map(|(prefix, _)| prefix.clone()))
                        .collect(),
                },
            )),
            (Route::Schedules, _) => {
                return crate::schedules::list(self.schedules.as_ref()).await;
            }
            (Route::Schedule(name), _) => {
                return crate::schedules::get(self.schedules.as_ref(), &name).await;
            }
            (Route::Trigger(name), _) => {
                return crate::schedules::trigger(
                    self.schedules.as_ref(),
                    self.trigger.as_ref(),
                    caller.proven(),
                    &name,
                    text,
                )
                .await;
            }
            (Route::Runs, Method::GET) => self.list(query.as_deref(), &caller).await,
            (Route::Runs, _) => self.start(text, caller).await,
            (Route::Address(address), Method::GET) => self.address(&address, false, &caller).await,
            (Route::Address(address), _) => self.address(&address, true, &caller).await,
            (Route::Run(id), Method::GET) => match run_id(&id) {
                Ok(run) => self
                    .runtime
                    .get(&run)
                    .await
                    .map(|view| body::json(StatusCode::OK, &reply(&view))),
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
            (Route::Run(id), _) => match run_id(&id) {
                Ok(run) => self.message(&run, text, caller).await,
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
            (Route::RunAction(id, action), _) => match run_id(&id) {
                Ok(run) => {
                    self.action(&run, &action, text, query.as_deref(), tap, &caller.session)
                        .await
                }
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
        };
        result.unwrap_or_else(|error| runtime_error(&error))
    }

    /// `POST /schedules/{name}/deliver` from another node: the firing it
    /// recorded, delivered here, where its address's run is driven; the
    /// reply is what became of it.
    async fn deliver_relayed(&self, name: &str, request: Request<Incoming>) -> Response<Body> {
        let Some(scheduler) = &self.schedules else {
            return crate::schedules::not_found(name);
        };
        let bytes =
            match body::read_capped(request.into_body(), wire::MAX_BODY_BYTES, self.body_timeout)
                .await
            {
                Ok(bytes) => bytes,
                Err(reply) => return *reply,
            };
        let firing: spool_journal::event::ScheduleFired = match serde_json::from_slice(&bytes) {
            Ok(firing) => firing,
            Err(error) => {
                return body::error(
                    ErrorCode::BadRequest,
                    format!("not a schedule's firing: {error}"),
                );
            }
        };
        match scheduler.deliver_relayed(name, &firing).await {
            Ok(delivery) => body::json(StatusCode::OK, &delivery),
            // A schedule without an address here: the nodes' spool.toml
            // differ, which the sender is told.
            Err(spool_runtime::schedule::ScheduleError::Invalid(message)) => {
                body::error(ErrorCode::BadRequest, message)
            }
            Err(other) => crate::schedules::schedule_error(&other),
        }
    }

    /// The run a command (a `POST`) changes, which its driving node must
    /// answer: a message or an action to a run, a message through an
    /// address already bound, a schedule's trigger (its record run).
    /// Starting a run or binding an address is done here.
    async fn commanded_run(&self, route: &Route, body: &[u8]) -> Option<RunId> {
        match route {
            Route::Run(id) | Route::RunAction(id, _) => run_id(id).ok(),
            Route::Trigger(name) => self.schedules.as_ref()?.record_run(name),
            // A message through an address goes to the node driving the
            // address's run, as one through the run's id does. A body that
            // does not decode, or an address bound to no run yet, is this
            // node's to answer (with the refusal, or by creating the run).
            Route::Runs => {
                #[derive(serde::Deserialize)]
                struct Addressed {
                    address: Option<String>,
                }
                let address = serde_json::from_slice::<Addressed>(body).ok()?.address?;
                let address = Address::new(NAMESPACE, address);
                match self.runtime.find_address(&address).await {
                    Ok(run) => run,
                    Err(error) => {
                        tracing::warn!(target: "spool::http", %error, "could not read which run an address is bound to; answering here");
                        None
                    }
                }
            }
            _ => None,
        }
    }

    /// Whether `caller` may reach `run` under the channel's [`RunAccess`].
    async fn reaches(&self, caller: &Caller, run: &RunId) -> Result<bool, RuntimeError> {
        self.access
            .reaches(&self.runtime, caller.proven(), run)
            .await
    }

    /// `GET /ready`: 503 `journal_unavailable` while the journal cannot
    /// write, with a `Retry-After`.
    fn ready(&self) -> Response<Body> {
        match self.runtime.journal_health() {
            spool_runtime::JournalHealth::Writable => body::json(
                StatusCode::OK,
                &wire::Readiness {
                    ok: true,
                    status: "ready".into(),
                    stalled_runs: None,
                },
            ),
            spool_runtime::JournalHealth::Unavailable { stalled_runs, .. } => {
                let mut reply = body::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &wire::Readiness {
                        ok: false,
                        status: ErrorCode::JournalUnavailable.as_str().into(),
                        stalled_runs: Some(stalled_runs as u64),
                    },
                );
                reply.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(JOURNAL_RETRY_AFTER_SECONDS),
                );
                reply
            }
        }
    }

    async fn authenticate(
        &self,
        request: &Request<Incoming>,
    ) -> Result<Caller, Box<Response<Body>>> {
        let Some(authenticator) = &self.authenticator else {
            return Ok(Caller {
                principal: None,
                verified: false,
                session: crate::session::Session::new(
                    None,
                    Credentials::default(),
                    self.closing.clone(),
                ),
            });
        };
        let credentials = credentials(request.headers());
        match authenticator.authenticate(&credentials).await {
            Ok(principal) => Ok(Caller {
                principal,
                verified: true,
                session: crate::session::Session::new(
                    Some(Arc::clone(authenticator)),
                    credentials,
                    self.closing.clone(),
                ),
            }),
            Err(spool_runtime::AuthError::Unauthenticated) => {
                let mut reply =
                    body::error(ErrorCode::Unauthenticated, "valid credentials are required");
                reply
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                Err(Box::new(reply))
            }
            // Internal details go to the log, not the reply.
            Err(failed) => {
                tracing::error!(target: "spool::http", error = %failed, "the authenticator failed");
                Err(Box::new(body::error(ErrorCode::Internal, "internal error")))
            }
        }
    }

    /// `GET /runs?limit=N&after=NEXT`: a page of runs, most recently
    /// updated first. `next` names where the following page starts; it is
    /// a position in the order (updated time, then id), so a walk neither
    /// repeats nor skips a run that stays unchanged during it, and a run
    /// updated meanwhile moves to the front.
    async fn list(
        &self,
        query: Option<&str>,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let page = match Page::parse(query) {
            Ok(page) => page,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let mut all = self.runtime.list().await?;
        // The journals list in this order already; sorting again keeps
        // paging right over a journal an embedder wrote.
        all.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.run_id.cmp(&b.run_id))
        });
        let mut runs = all.into_iter().filter(|run| {
            page.after.as_ref().is_none_or(|(updated, id)| {
                let at = run.updated_at.unix_timestamp_nanos();
                at < *updated || (at == *updated && run.run_id.as_str() > id.as_str())
            })
        });
        // Under owner access a page holds the caller's runs only, found by
        // reading each listed run's creator.
        let mut listed = Vec::with_capacity(page.limit);
        let mut more = None;
        for run in runs.by_ref() {
            if !self.reaches(caller, &run.run_id).await? {
                continue;
            }
            if listed.len() == page.limit {
                more = Some(run);
                break;
            }
            listed.push(run);
        }
        let next = match (more, listed.last()) {
            (Some(_), Some(last)) => Some(format!(
                "{}.{}",
                last.updated_at.unix_timestamp_nanos(),
                last.run_id
            )),
            _ => None,
        };
        let runs: Vec<Value> = listed
            .into_iter()
            .map(|run| {
                json!({
                    "id": run.run_id,
                    "state": wire::RunState::from(run.status.state()),
                    "title": run.title,
                    "updated": run.updated_at.format(&time::format_description::well_known::Rfc3339).ok(),
                })
            })
            .collect();
        let mut reply = json!({ "runs": runs });
        if let Some(next) = next {
            reply["next"] = Value::String(next);
        }
        Ok(body::json(StatusCode::OK, &reply))
    }

    async fn start(&self, text: &str, caller: Caller) -> Result<Response<Body>, RuntimeError> {
        let start = match StartRun::decode(text) {
            Ok(start) => start,
            Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
        };
        // A message through an address bound to another's run is refused
        // as for an unknown run: the caller learns nothing of the run
        // behind it (addresses are one namespace, so it cannot take the
        // address either).
        if self.access == RunAccess::Owner
            && let Some(address) = &start.address
        {
            let address = Address::new(NAMESPACE, address.clone());
            match self.runtime.lookup(&address).await {
                Ok(view) if !self.reaches(&caller, &view.run_id).await? => {
                    return Err(RuntimeError::AddressNotFound(address));
                }
                Err(error) if error.kind() != ErrorKind::AddressNotFound => return Err(error),
                _ => {}
            }
        }
        // With an authenticator, identity is what it proved; without one a
        // body principal is self-asserted, and never enough for an
        // operation id.
        let (principal, verified) = if caller.verified {
            let verified = caller.principal.is_some();
            (caller.principal, verified)
        } else {
            (start.auth.clone().map(principal_of), false)
        };
        if start.operation_id.is_some() && !verified {
            return Ok(body::error(
                ErrorCode::BadRequest,
                "`operation_id` needs a verified principal",
            ));
        }
        let request = StartRequest {
            text: start.text.clone(),
            address: start
                .address
                .as_ref()
                .map(|a| Address::new(NAMESPACE, a.clone())),
            operation_id: start.operation_id.clone(),
            principal,
            title: start.title.clone(),
            kind: start.kind.clone(),
            context: start.context.clone().unwrap_or_default(),
            policy: turn_policy(start.turn_policy.as_ref())?,
        };
        let accepted = self.runtime.start(request).await?;
        self.answer(accepted).await
    }

    async fn message(
        &self,
        run: &RunId,
        text: &str,
        _caller: Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let message = match MessageRun::decode(text) {
            Ok(message) => message,
            Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
        };
        let request = MessageRequest {
            text: message.text,
            context: message.context.unwrap_or_default(),
            policy: turn_policy(message.turn_policy.as_ref())?,
        };
        let accepted = self.runtime.send(run, request).await?;
        self.answer(accepted).await
    }

    /// Replies once the turn reaches a boundary; the turn itself runs
    /// detached, so a client that leaves does not stop it.
    ///
    /// A turn whose input was recorded but whose progress cannot be (the
    /// journal stopped writing) is answered 202 with the run as it is,
    /// `running`: the request was taken and must not be sent again; the
    /// turn goes on by itself once the journal writes.
    async fn answer(&self, accepted: Accepted) -> Result<Response<Body>, RuntimeError> {
        let mut reply = self.answer_at_boundary(&accepted).await?;
        if let Accepted::Replayed { run, differs } = &accepted {
            // The seed: a retry's changed text does not change the admitted
            // operation. Said in the log, and every replay is marked.
            if *differs {
                tracing::warn!(target: "spool::http", run_id = %run, "an operation id was retried with a different request; its saved run is returned unchanged");
            }
            reply
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        Ok(reply)
    }

    async fn answer_at_boundary(
        &self,
        accepted: &Accepted,
    ) -> Result<Response<Body>, RuntimeError> {
        let (run, turn) = match accepted {
            Accepted::Started { run, turn } | Accepted::Steered { run, turn } => {
                (run, turn.clone())
            }
            // As the seed's reference does: the reply is the queued turn's,
            // once it has run.
            Accepted::Queued { run, queued } => {
                let view = self.runtime.wait_for_queued(run, *queued).await?;
                return Ok(body::json(StatusCode::OK, &reply(&view)));
            }
            // The first request for the operation answers at its turn's
            // boundary; a replay racing it answers the same way.
            Accepted::Replayed { run, .. } => {
                let view = self.runtime.get(run).await?;
                match (&view.status, &view.turn_id) {
                    (Status::Running, Some(turn)) => (run, turn.clone()),
                    _ => return Ok(body::json(StatusCode::OK, &reply(&view))),
                }
            }
        };
        match self.runtime.wait_for(run, &turn).await {
            Ok(view) => Ok(body::json(StatusCode::OK, &reply(&view))),
            Err(error) if error.kind() == ErrorKind::Storage => {
                tracing::warn!(target: "spool::http", run_id = %run, %error, "a turn was taken and waits for the journal");
                let view = self.runtime.get(run).await?;
                Ok(body::json(StatusCode::ACCEPTED, &reply(&view)))
            }
            Err(error) => Err(error),
        }
    }

    async fn address(
        &self,
        raw: &str,
        ensure: bool,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let name = match segment(raw, "address") {
            Ok(name) => name,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        if name.is_empty() {
            return Ok(body::error(ErrorCode::BadRequest, "the address is empty"));
        }
        spool_runtime::Limited::Address.check(&name)?;
        let address = Address::new(NAMESPACE, name);
        let view = if ensure {
            // A run made here belongs to the caller, when it was proven.
            let creator = caller.proven().cloned();
            self.runtime.ensure_as(&address, creator).await?
        } else {
            self.runtime.lookup(&address).await?
        };
        if !self.reaches(caller, &view.run_id).await? {
            return Err(RuntimeError::AddressNotFound(address));
        }
        Ok(body::json(
            StatusCode::OK,
            &AddressReply {
                run_id: view.run_id.to_string(),
                cursor: view.cursor.map(|s| s.0),
            },
        ))
    }

    async fn action(
        &self,
        run: &RunId,
        action: &str,
        text: &str,
        query: Option<&str>,
        tap: Option<Arc<spool_edge::tap::Tap>>,
        session: &crate::session::Session,
    ) -> Result<Response<Body>, RuntimeError> {
        match action {
            "snapshot" => {
                let snapshot = self.runtime.snapshot(run).await?;
                let mut reply = body::json(
                    StatusCode::OK,
                    &SnapshotReply {
                        run: reply(&snapshot.view),
                        messages: snapshot.messages,
                    },
                );
                reply
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                Ok(reply)
            }
            "stream" => self.stream(run, query, tap, session).await,
            "respond" => {
                let respond = match Respond::decode(text) {
                    Ok(respond) => respond,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                // Every answer that names a turn must name the same one: a
                // respond is one reply to one suspension.
                let mut named = respond
                    .responses
                    .iter()
                    .filter_map(|a| a.turn_id.as_deref());
                let turn = match named.next() {
                    Some(first) => {
                        if let Some(other) = named.find(|t| *t != first) {
                            return Ok(body::error(
                                ErrorCode::BadRequest,
                                format!(
                                    "the answers name different turns, `{first}` and `{other}`: answer one turn at a time"
                                ),
                            ));
                        }
                        match spool_journal::TurnId::new(first) {
                            Ok(turn) => Some(turn),
                            Err(e) => {
                                return Ok(body::error(
                                    ErrorCode::BadRequest,
                                    format!("`turn_id` is not a turn id: {e}"),
                                ));
                            }
                        }
                    }
                    None => None,
                };
                let answers = respond
                    .responses
                    .into_iter()
                    .map(|a| Answer {
                        text: a.text,
                        approved: a.approved,
                    })
                    .collect();
                self.runtime.respond(run, turn.as_ref(), answers).await?;
                let view = self.runtime.get(run).await?;
                let turn = view.turn_id.clone();
                let view = match turn {
                    Some(turn) => self.runtime.wait_for(run, &turn).await?,
                    None => view,
                };
                Ok(body::json(StatusCode::OK, &reply(&view)))
            }
            "cancel" => {
                let cancel: wire::Cancel = match wire::decode_body(text) {
                    Ok(cancel) => cancel,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                // A turn id that cannot be one is a mistake to report, not
                // a reason to cancel whatever turn runs now.
                let turn = match cancel.turn_id.map(spool_journal::TurnId::new).transpose() {
                    Ok(turn) => turn,
                    Err(e) => {
                        return Ok(body::error(
                            ErrorCode::BadRequest,
                            format!("`turn_id` is not a turn id: {e}"),
                        ));
                    }
                };
                let outcome = match self.runtime.cancel(run, turn.as_ref()).await {
                    Ok(outcome) => outcome,
                    // Cancel on an unknown run is a harmless no-op.
                    Err(RuntimeError::RunNotFound(_)) => spool_runtime::CancelOutcome::NotActive,
                    Err(other) => return Err(other),
                };
                let (status, turn_id) = match outcome {
                    spool_runtime::CancelOutcome::Requested(turn) => {
                        (CancelStatus::Requested, Some(turn.to_string()))
                    }
                    spool_runtime::CancelOutcome::NotActive => (CancelStatus::NotActive, None),
                    spool_runtime::CancelOutcome::Stale { current } => {
                        (CancelStatus::Stale, current.map(|t| t.to_string()))
                    }
                };
                Ok(cancel_reply(status, Some(run), turn_id))
            }
            "reset" => {
                let reset: wire::Reset = match wire::decode_body(text) {
                    Ok(reset) => reset,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                self.runtime.reset_in(run, reset.reason, NAMESPACE).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
            "clear" => {
                self.runtime.clear(run).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
            _ => {
                self.runtime.compact(run).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
        }
    }

    /// `application/x-ndjson`, headers at once, the journal after the
    /// cursor and then live events, open across waiting states.
    async fn stream(
        &self,
        run: &RunId,
        query: Option<&str>,
        tap: Option<Arc<spool_edge::tap::Tap>>,
        session: &crate::session::Session,
    ) -> Result<Response<Body>, RuntimeError> {
        let cursor = match cursor(query) {
            Ok(cursor) => cursor,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let subscription = self.runtime.subscribe(run, cursor).await?;
        let body = StreamBody::new(
            Parts {
                run: run.clone(),
                closing: self.closing.clone(),
                shared: Arc::clone(&self.lines),
                fanouts: Arc::clone(&self.fanouts),
                tap: tap.clone(),
                _open: OpenStream::new(&self.streams),
            },
            subscription,
        );
        // A revoked token ends the streams it opened.
        let body = if session.revocable() {
            body.ending(session.ending())
        } else {
            body
        };
        if let Some(tap) = &tap {
            // The response's head goes first: nothing is written to the
            // socket past hyper until it has flushed it.
            tap.busy();
        }
        let mut response = Response::new(http_body_util::BodyExt::boxed(body));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(wire::NDJSON_CONTENT_TYPE),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(response)
    }
}

/// The header that marks a reply to a retried `operation_id`: the saved
/// run, not a new turn.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A cancel's reply: 202 for `requested`, 200 for the no-op outcomes.
fn cancel_reply(
    status: CancelStatus,
    run: Option<&RunId>,
    turn_id: Option<String>,
) -> Response<Body> {
    let code = StatusCode::from_u16(status.status()).unwrap_or(StatusCode::OK);
    body::json(
        code,
        &CancelReply {
            status,
            run_id: run.map(ToString::to_string),
            turn_id,
        },
    )
}

/// 405 `method_not_allowed`, with the `Allow` header listing `allowed`.
fn method_not_allowed(method: &Method, path: &str, allowed: &[Method]) -> Response<Body> {
    let mut reply = body::error(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {path}"),
    );
    let allow = allowed
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(value) = HeaderValue::from_str(&allow) {
        reply.headers_mut().insert(header::ALLOW, value);
    }
    reply
}

/// Whether `caller` is `owner`, or an administrator.
pub use spool_edge::tables::{WS_BEARER_PREFIX, WS_PROTOCOL};

/// A request's credentials: its headers, and for a WebSocket handshake
/// without `Authorization` the token of a `spool.bearer.<token>`
/// subprotocol, as an `Authorization: Bearer` header would carry it.
fn credentials(headers: &http::HeaderMap) -> Credentials {
    let mut pairs: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    if !headers.contains_key(header::AUTHORIZATION)
        && let Some(token) = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .find_map(|p| p.trim().strip_prefix(WS_BEARER_PREFIX))
    {
        pairs.push(("authorization".into(), format!("Bearer {token}")));
    }
    Credentials {
        headers: pairs,
        peer: None,
    }
}

/// A refusal of the guard, in the channel's error body. A file upload is
/// the seed's `files_unsupported`; a multipart type without its boundary
/// is not an upload at all, just a malformed header.
pub(crate) fn refused(refusal: &crate::guard::Refusal) -> Response<Body> {
    use crate::guard::Refusal;
    let code = match refusal {
        Refusal::Origin(_) => ErrorCode::OriginNotAllowed,
        Refusal::Host(_) => ErrorCode::HostNotAllowed,
        Refusal::MediaType(_) => ErrorCode::UnsupportedMediaType,
        Refusal::Upload(value) if !value.to_ascii_lowercase().contains("boundary=") => {
            return body::error(
                ErrorCode::BadRequest,
                "a multipart content type needs its boundary; runs take a JSON body",
            );
        }
        Refusal::Upload(_) => ErrorCode::FilesUnsupported,
    };
    body::error(code, refusal.message())
}

/// One request's log line, written when the request ends. A request whose
/// future is dropped before it has a reply lost its client (the server
/// drops it when the connection closes): that is logged as 499
/// `client_closed`, the seed's code for it. Its turn, detached, goes on.
struct RequestLog {
    method: Method,
    path: String,
    started: std::time::Instant,
    status: Option<u16>,
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (method, path) = (&self.method, &self.path);
        match self.status {
            Some(status) => {
                tracing::info!(target: "spool::http", %method, path, status, millis, "request");
            }
            None => tracing::info!(
                target: "spool::http",
                %method,
                path,
                status = 499,
                code = ErrorCode::ClientClosed.as_str(),
                millis,
                "request: the client left before the reply"
            ),
        }
    }
}

enum Route {
    Info,
    Runs,
    Address(String),
    Run(String),
    RunAction(String, String),
    Schedules,
    Schedule(String),
    Trigger(String),
}

/// A run id from its path segment, percent-decoded as any segment is (a
/// client may encode every byte that is not alphanumeric).
fn run_id(raw: &str) -> Result<RunId, String> {
    let decoded = segment(raw, "run id")?;
    RunId::new(decoded).map_err(|e| e.to_string())
}

/// A path segment, percent-decoded strictly: a `%` not followed by two hex
/// digits, or bytes that are not UTF-8, are refused rather than passed on
/// or replaced (a lossy decoding made `%ff%fe` and `%80%80` one address).
fn segment(raw: &str, what: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(at, byte)| {
        *byte == b'%'
            && !bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(format!("the {what} has a malformed percent-escape"));
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

/// The value of `name` in a query string, when it is there.
/// The query parameter `name`, percent-decoded. Given twice it is
/// refused: two cursors (or limits) cannot both be meant.
fn query_value(query: Option<&str>, name: &str) -> Result<Option<String>, String> {
    let mut found = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let Some(raw) = pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) else {
            continue;
        };
        if found.is_some() {
            return Err(format!("`{name}` is given more than once"));
        }
        found = Some(segment(raw, name)?);
    }
    Ok(found)
}

fn cursor(query: Option<&str>) -> Result<Option<Seq>, String> {
    query_value(query, "cursor")?
        .map(|value| {
            value
                .parse::<u64>()
                .map(Seq)
                .map_err(|_| format!("`cursor` must be a non-negative integer, not `{value}`"))
        })
        .transpose()
}

/// A page of `GET /runs`.
struct Page {
    limit: usize,
    /// The last run of the previous page: its update time (Unix
    /// nanoseconds) and id.
    after: Option<(i128, String)>,
}

impl Page {
    const DEFAULT: usize = 100;
    const MAX: usize = 1000;

    fn parse(query: Option<&str>) -> Result<Self, String> {
        let limit = match query_value(query, "limit")? {
            None => Self::DEFAULT,
            Some(value) => value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=Self::MAX).contains(n))
                .ok_or_else(|| {
                    format!(
                        "`limit` must be an integer from 1 to {}, not `{value}`",
                        Self::MAX
                    )
                })?,
        };
        let after = query_value(query, "after")?
            .map(|value| {
                value
                    .split_once('.')
                    .and_then(|(at, id)| Some((at.parse::<i128>().ok()?, id.to_owned())))
                    .ok_or_else(|| {
                        format!(
                            "`after` must be a `next` value from an earlier page, not `{value}`"
                        )
                    })
            })
            .transpose()?;
        Ok(Self { limit, after })
    }
}

fn principal_of(auth: wire::Principal) -> Principal {
    Principal {
        authenticator: auth.authenticator,
        kind: auth.kind,
        id: auth.id,
        attributes: auth.attributes,
    }
}

/// The seed's turn policy in the runtime's vocabulary. The decoders refuse
/// an unknown policy with `unknown_turn_policy` first; this refuses what
/// is left, should that check ever move.
fn turn_policy(
    policy: Option<&wire::TurnPolicy>,
) -> Result<Option<spool_wire::run::TurnPolicy>, RuntimeError> {
    policy
        .map(spool_wire::run::TurnPolicy::try_from)
        .transpose()
        .map_err(|unknown| RuntimeError::BadRequest(unknown.to_string()))
}

/// How long a client is told to wait before retrying while the journal
/// cannot write: about the runtime's longest pause between probes.
const JOURNAL_RETRY_AFTER_SECONDS: u64 = spool_runtime::PROBE_MAX.as_secs();

pub(crate) fn runtime_error(error: &RuntimeError) -> Response<Body> {
    let code = error_code(error.kind());
    match code {
        // Details go to the server's log, never the reply.
        ErrorCode::Internal => {
            tracing::error!(target: "spool::http", error = %error, "internal error");
            body::error(code, "internal error")
        }
        ErrorCode::JournalUnavailable => {
            tracing::warn!(target: "spool::http", error = %error, "the journal cannot write");
            let mut reply = body::error(
                code,
                "the journal cannot write now; nothing of this request was recorded. \
                 Runs resume by themselves once it can: retry later",
            );
            reply.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(JOURNAL_RETRY_AFTER_SECONDS),
            );
            reply
        }
        _ => body::error(code, error.to_string()),
    }
}
