//! The HTTP channel under `/spool/v1`, clause by clause as the channel's
//! document describes it (`docs/protocol/http.md`).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use spool_journal::event::Answer;
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
use tracing::Instrument;

use crate::body::{self, Body};

use crate::stream::{OpenStream, Parts, StreamBody};

mod params;
mod replies;
mod route;
mod runs;

use params::*;
pub(crate) use replies::runtime_error;
use replies::*;
pub use replies::{IDEMPOTENT_REPLAYED, PREFERENCE_APPLIED};
use runs::Asked;

/// The namespace HTTP addresses live in.
pub use spool_edge::tables::HTTP_NAMESPACE as NAMESPACE;
pub use spool_edge::tables::{WS_BEARER_PREFIX, WS_PROTOCOL};

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
    /// Whether the web console is served at `/`.
    console: bool,
    /// Exact paths answered before authentication (discovery documents).
    public: Vec<(String, crate::server::Handler)>,
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
    /// The host's reload of its agent definition, for `POST /agent/reload`.
    reload: Option<Reload>,
}

/// Reloads the host's agent definition (`POST /agent/reload`): what new
/// runs start on now, or why the definition it read cannot be used (the
/// old one then stays).
pub type Reload = Arc<
    dyn Fn() -> spool_runtime::BoxFuture<'static, Result<wire::AgentReloaded, String>>
        + Send
        + Sync,
>;

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
    ("DELETE", "/runs/{id}"),
    ("GET", "/runs/{id}/snapshot"),
    ("GET", "/runs/{id}/stream"),
    ("GET", "/runs/{id}/events"),
    ("GET", "/runs/{id}/summary"),
    ("POST", "/runs/{id}/respond"),
    ("POST", "/runs/{id}/cancel"),
    ("POST", "/runs/{id}/reset"),
    ("POST", "/runs/{id}/clear"),
    ("POST", "/runs/{id}/compact"),
    ("POST", "/runs/{id}/fork"),
    ("GET", "/schedules"),
    ("GET", "/schedules/{name}"),
    ("POST", "/schedules/{name}/trigger"),
    ("POST", "/agent/reload"),
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
            public: Vec::new(),
            console: false,
            lines: Arc::default(),
            fanouts: Arc::default(),
            streams: Arc::new(watch::channel(0).0),
            access: RunAccess::Any,
            schedules: None,
            trigger: None,
            placement: None,
            node_secret: None,
            guard: Arc::default(),
            reload: None,
        }
    }

    /// Answers `POST /agent/reload` for administrators with `reload`;
    /// without it the route does not exist.
    #[must_use]
    pub fn with_reload(mut self, reload: Reload) -> Self {
        self.reload = Some(reload);
        self
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

    /// Serves the web console at `/` (its files under `/console/`,
    /// `crate::console`). Its files are answered without credentials, as
    /// they hold no data; what the page reads it reads through the API,
    /// with the token it is given.
    #[must_use]
    pub fn with_console(mut self) -> Self {
        self.console = true;
        self
    }

    /// Mounts a public document at exactly `path`: answered without
    /// credentials, as discovery comes before them (an A2A agent card at
    /// `/.well-known/agent-card.json`). The origin and host rules still
    /// apply; anything a caller should not see without credentials does
    /// not belong here.
    ///
    /// # Errors
    ///
    /// [`MountError`] as for [`HttpChannel::mount`].
    pub fn mount_public(
        mut self,
        path: &str,
        handler: crate::server::Handler,
    ) -> Result<Self, MountError> {
        if !path.starts_with('/') || path == "/" || path.starts_with("/spool/") {
            return Err(MountError(path.to_owned()));
        }
        self.public.push((path.to_owned(), handler));
        Ok(self)
    }

    /// The channel as a server handler, logging each request (method,
    /// path, status, time taken) through `tracing`.
    #[must_use]
    pub fn handler(self) -> crate::server::Handler {
        let channel = Arc::new(self);
        Arc::new(move |request| {
            let channel = Arc::clone(&channel);
            // A span per request, in its connection's: the route records
            // the run it names (`RUST_LOG=spool=debug` shows them).
            let span = tracing::debug_span!(
                target: "spool::http",
                "request",
                method = %request.method(),
                path = request.uri().path(),
                run_id = tracing::field::Empty,
            );
            Box::pin(
                async move {
                    let mut log = RequestLog {
                        method: request.method().clone(),
                        path: request.uri().path().to_owned(),
                        started: std::time::Instant::now(),
                        status: None,
                    };
                    let reply = channel.handle(request).await;
                    log.status = Some(reply.status().as_u16());
                    reply
                }
                .instrument(span),
            )
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
            // A mounted route (JSON-RPC's, MCP's, A2A's, a host's) says
            // for itself which method it takes; each one any of them
            // takes is named (MCP ends a session and A2A withdraws a push
            // config with DELETE).
            return vec![Method::GET, Method::POST, Method::DELETE];
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
}

/// A route of the channel, with what its path names.
enum Route {
    Info,
    Runs,
    Address(String),
    Run(String),
    RunAction(String, String),
    Schedules,
    ReloadAgent,
    Schedule(String),
    Trigger(String),
}
