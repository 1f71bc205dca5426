//! The bus server: `POST /api/talk` runs a delegated prompt as a run of
//! its own and answers with its outcome; `GET /api/health` says who
//! answers, so a caller checks it before sending its secret.
//!
//! Checks, in order, each answered with a v1 envelope and its status: a
//! body over 256 KiB (counted while reading) is 413 `request_too_large`; a
//! bus that is not enabled 403 `bus_disabled`; a bearer that is not the
//! secret (compared in constant time) 401 `auth_failed`; a body that is not
//! the request's schema 400 `invalid_request`; a caller not among the peers
//! 403 `peer_not_allowed`; `depth` at the maximum 429
//! `max_depth_exceeded`. What the delegation itself ends in is 200, with
//! `success` and the code; a panic is 500 `internal_error`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use spool_edge::body::{self, Body};
use spool_edge::guard::{Guard, Refusal, Verdict};
use spool_edge::server::Handler;
use spool_journal::fold::Status;
use spool_journal::{Principal, RunId, Seq};
use spool_runtime::activity::{Activity, Reader, TurnOutcome};
use spool_runtime::hub::StreamItem;
use spool_runtime::{Accepted, Runtime, RuntimeError, StartRequest};
use spool_wire::bus::{
    BusRequest, BusResponse, ErrorCode, HEALTH_PATH, MAX_REQUEST_BYTES, PROTOCOL_VERSION, TALK_PATH,
};
use spool_wire::run::FailureCode;

use crate::budget::Ledger;

/// How long a request's body may take to arrive.
const BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The authenticator of a delegated run's principal
/// (`bus/instance/<fromInstance>`).
pub const AUTHENTICATOR: &str = "bus";

/// The principal attribute carrying a delegated run's depth, so a
/// delegation it makes in turn goes one hop deeper.
pub const DEPTH_ATTRIBUTE: &str = "depth";

/// The key in `ext.spool` naming a delegation: a retry under the same one
/// gets the first one's outcome, and the prompt runs once.
pub const DELEGATION_ID: &str = "delegation_id";

/// A bus server's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This instance's name (`fromInstance` on every reply).
    pub instance: String,
    /// The instances allowed to delegate here (`*`: any); none, and the
    /// bus is off (`bus_disabled`), as in the seed's reference.
    pub peers: Vec<String>,
    /// Requests arriving at this depth or deeper are refused.
    pub max_depth: u64,
    /// The bearer a caller must send.
    pub secret: String,
    /// The instance budget, when there is one.
    pub budget: Option<Arc<Ledger>>,
}

/// The bus server over a runtime (or disabled, answering every talk
/// `bus_disabled`).
#[derive(Clone, Debug)]
pub struct BusServer {
    inner: Arc<Inner>,
}

#[derive(Clone, Debug)]
struct Inner {
    instance: String,
    settings: Option<Settings>,
    runtime: Option<Runtime>,
    /// The origin, host and content-type rules; the bus allows no
    /// foreign origin (it serves instances, not pages).
    guard: Guard,
}

impl BusServer {
    /// A server delegating to `runtime`.
    #[must_use]
    pub fn new(runtime: Runtime, settings: Settings) -> Self {
        Self {
            inner: Arc::new(Inner {
                instance: settings.instance.clone(),
                settings: Some(settings),
                runtime: Some(runtime),
                guard: Guard::new(),
            }),
        }
    }

    /// A server for an instance whose bus is off: it answers health, and
    /// every talk `bus_disabled`.
    #[must_use]
    pub fn disabled(instance: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                instance: instance.into(),
                settings: None,
                runtime: None,
                guard: Guard::new(),
            }),
        }
    }

    /// The same server with `guard`'s origin, host and content-type rules
    /// (set how its listener is reached: [`Guard::for_listener`]). By
    /// default the strictest: a loopback listener, no foreign origin.
    #[must_use]
    pub fn with_guard(self, guard: Guard) -> Self {
        let inner = Arc::unwrap_or_clone(self.inner);
        Self {
            inner: Arc::new(Inner { guard, ..inner }),
        }
    }

    /// The routes, to serve with `spool_edge::serve`.
    #[must_use]
    pub fn handler(&self) -> Handler {
        let server = self.clone();
        Arc::new(move |request: Request<Incoming>| {
            let server = server.clone();
            // A span per request, in its connection's; a delegation
            // records its run.
            let span = tracing::debug_span!(
                target: "spool::bus",
                "bus request",
                path = request.uri().path(),
                run_id = tracing::field::Empty,
            );
            Box::pin(tracing::Instrument::instrument(
                async move { server.route(request).await },
                span,
            ))
        })
    }

    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        match self.inner.guard.check(request.method(), request.headers()) {
            Verdict::Pass(_) => {}
            // The bus allows no foreign origin, so a preflight that passed
            // came from the server's own.
            Verdict::Preflight(origin) => {
                return spool_edge::guard::preflight(&origin, &[Method::GET, Method::POST]);
            }
            Verdict::Refuse(refusal) => {
                let code = match &refusal {
                    Refusal::Origin(_) => ErrorCode::OriginNotAllowed,
                    Refusal::Host(_) => ErrorCode::HostNotAllowed,
                    Refusal::MediaType(_) | Refusal::Upload(_) => ErrorCode::UnsupportedMediaType,
                };
                return envelope(&self.failure(code, refusal.message(), started));
            }
        }
        match (request.method(), request.uri().path()) {
            (&Method::GET, HEALTH_PATH) => body::json(
                StatusCode::OK,
                &json!({
                    "status": "ok",
                    "kind": "spool",
                    "instance": self.inner.instance,
                    "protocolVersion": PROTOCOL_VERSION,
                }),
            ),
            (&Method::POST, CANCEL_PATH) => match self.cancel(request, started).await {
                Ok(response) => body::json(StatusCode::OK, &response),
                Err(response) => envelope(&response),
            },
            (&Method::POST, TALK_PATH) => match self.talk(request, started).await {
                // What the delegation came to, its failures included, is
                // the handler's answer: 200 (bus.md's check order, step 7).
                Ok(response) => body::json(StatusCode::OK, &response),
                // A check refused it: the code's own status.
                Err(response) => envelope(&response),
            },
            // Every reply is an envelope, an unknown route's too.
            _ => body::json(
                StatusCode::NOT_FOUND,
                &self.failure(
                    ErrorCode::InvalidRequest,
                    format!("the bus answers POST {TALK_PATH} and GET {HEALTH_PATH}"),
                    started,
                ),
            ),
        }
    }

    fn failure(
        &self,
        code: ErrorCode,
        message: impl Into<String>,
        started: Instant,
    ) -> BusResponse {
        BusResponse::failure(&self.inner.instance, code, message, elapsed(started))
    }

    /// The checks every request to the bus passes first, in order: its
    /// size, the bus enabled, the secret. The body, and what answers it.
    async fn admit(
        &self,
        request: Request<Incoming>,
        started: Instant,
    ) -> Result<(bytes::Bytes, &Settings, &Runtime), BusResponse> {
        let (parts, incoming) = request.into_parts();
        let bytes = body::read_capped(incoming, MAX_REQUEST_BYTES, BODY_DEADLINE)
            .await
            .map_err(|reply| {
                if reply.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    self.failure(
                        ErrorCode::RequestTooLarge,
                        format!("the request is over {MAX_REQUEST_BYTES} bytes"),
                        started,
                    )
                } else {
                    self.failure(
                        ErrorCode::InvalidRequest,
                        "the request's body could not be read",
                        started,
                    )
                }
            })?;
        // No peers is a bus nobody may use: off, as in the seed's reference.
        let enabled = self
            .inner
            .settings
            .as_ref()
            .filter(|settings| !settings.peers.is_empty())
            .zip(self.inner.runtime.as_ref());
        let Some((settings, runtime)) = enabled else {
            return Err(self.failure(
                ErrorCode::BusDisabled,
                format!("the bus is not enabled on instance {}", self.inner.instance),
                started,
            ));
        };
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !same_secret(bearer, &settings.secret) {
            return Err(self.failure(
                ErrorCode::AuthFailed,
                "the bearer is not this bus's secret",
                started,
            ));
        }
        Ok((bytes, settings, runtime))
    }

    /// `POST /api/cancel` (a Spool extension): the caller's delegation,
    /// named by its id, has its turn cancelled, as when the caller's own
    /// turn is. Answered `text: "requested"` (a turn was running or
    /// parked), `"not_active"` (nothing runs: done already, or not here).
    async fn cancel(
        &self,
        request: Request<Incoming>,
        started: Instant,
    ) -> Result<BusResponse, BusResponse> {
        let (bytes, settings, runtime) = self.admit(request, started).await?;
        let invalid = |message: String| self.failure(ErrorCode::InvalidRequest, message, started);
        let cancel: CancelRequest = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(format!(
                "a cancel is {{\"fromInstance\", \"delegationId\"}}: {e}"
            ))
        })?;
        if !settings
            .peers
            .iter()
            .any(|peer| peer == "*" || *peer == cancel.from_instance)
        {
            return Err(self.failure(
                ErrorCode::PeerNotAllowed,
                format!(
                    "instance `{}` is not a peer of {}",
                    cancel.from_instance, self.inner.instance
                ),
                started,
            ));
        }
        let principal = Principal {
            authenticator: AUTHENTICATOR.into(),
            kind: "instance".into(),
            id: cancel.from_instance.clone(),
            ..Principal::default()
        };
        let failed = |error: RuntimeError| {
            self.failure(ErrorCode::InternalError, error.to_string(), started)
        };
        let outcome = match runtime
            .operation(&principal, &cancel.delegation_id)
            .await
            .map_err(failed)?
        {
            None => "not_active",
            Some(run) => match runtime.cancel(&run, None).await.map_err(failed)? {
                spool_runtime::CancelOutcome::Requested { .. } => {
                    tracing::info!(from = %cancel.from_instance, run_id = %run, "bus: delegation cancelled by its caller");
                    "requested"
                }
                _ => "not_active",
            },
        };
        Ok(BusResponse::success(
            &self.inner.instance,
            outcome.to_owned(),
            elapsed(started),
        ))
    }

    /// The checks in order, then the delegation.
    async fn talk(
        &self,
        request: Request<Incoming>,
        started: Instant,
    ) -> Result<BusResponse, BusResponse> {
        let (bytes, settings, runtime) = self.admit(request, started).await?;
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            self.failure(
                ErrorCode::InvalidRequest,
                "the request is not UTF-8",
                started,
            )
        })?;
        let request = BusRequest::decode(text).map_err(|rejection| {
            self.failure(ErrorCode::InvalidRequest, rejection.message, started)
        })?;
        if !settings
            .peers
            .iter()
            .any(|peer| peer == "*" || *peer == request.from_instance)
        {
            return Err(self.failure(
                ErrorCode::PeerNotAllowed,
                format!(
                    "instance `{}` is not a peer of {}",
                    request.from_instance, self.inner.instance
                ),
                started,
            ));
        }
        if request.depth >= settings.max_depth {
            return Err(self.failure(
                ErrorCode::MaxDepthExceeded,
                format!(
                    "depth {} reaches this instance's maximum of {}",
                    request.depth, settings.max_depth
                ),
                started,
            ));
        }
        // A panic in the delegation is the caller's 500, not a dropped
        // connection.
        let identified = delegation_id(&request).is_some();
        // In the request's span: the delegation records its run there.
        let delegation = tokio::spawn(tracing::Instrument::instrument(
            delegate(runtime.clone(), settings.budget.clone(), request),
            tracing::Span::current(),
        ));
        match delegation.await {
            Ok(Ok(text)) => Ok(BusResponse::success(
                &self.inner.instance,
                text,
                elapsed(started),
            )),
            // Malformed (a delegation id over its limit): a check, not an
            // outcome.
            Ok(Err((ErrorCode::InvalidRequest, message))) => {
                Err(self.failure(ErrorCode::InvalidRequest, message, started))
            }
            Ok(Err((code, message))) => {
                let mut failure = self.failure(code, message, started);
                // Sent again under the same delegation id, it would be
                // answered the same run's same failure: not worth a retry.
                // A retry under a new id (or none) is a new delegation.
                if identified {
                    failure.retryable = Some(false);
                }
                Ok(failure)
            }
            Err(_) => Err(self.failure(
                ErrorCode::InternalError,
                "the delegation failed unexpectedly",
                started,
            )),
        }
    }
}

/// The reply to a talk: the envelope, with the status its code has (200
/// for what the delegation ended in).
fn envelope(response: &BusResponse) -> Response<Body> {
    let status = response
        .code()
        .and_then(|code| code.http_status())
        .and_then(|status| StatusCode::from_u16(status).ok())
        .unwrap_or(StatusCode::OK);
    body::json(status, response)
}

fn elapsed(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Compares a bearer with the secret in time that depends on neither:
/// their digests, as the HTTP channel compares its tokens.
fn same_secret(bearer: &str, secret: &str) -> bool {
    spool_edge::token::constant_time_eq(
        &Sha256::digest(bearer.as_bytes()).into(),
        &Sha256::digest(secret.as_bytes()).into(),
    )
}

/// Runs a delegation: a fresh run, made once per delegation id (the
/// caller's, from `ext.spool.delegation_id`, or one of its own), whose
/// first turn's outcome is the answer.
async fn delegate(
    runtime: Runtime,
    budget: Option<Arc<Ledger>>,
    request: BusRequest,
) -> Result<String, (ErrorCode, String)> {
    // A request the runtime refuses as malformed (a delegation id over its
    // length limit) is the caller's to fix, not worth a retry; anything
    // else is the target's failure.
    let internal = |error: RuntimeError| {
        let code = match error.kind() {
            spool_runtime::ErrorKind::BadRequest
            | spool_runtime::ErrorKind::AddressTooLong
            | spool_runtime::ErrorKind::TitleTooLong
            | spool_runtime::ErrorKind::OperationIdTooLong => ErrorCode::InvalidRequest,
            _ => ErrorCode::InternalError,
        };
        (code, error.to_string())
    };
    let delegation = delegation_id(&request).map(str::to_owned);
    let principal = Principal {
        authenticator: AUTHENTICATOR.into(),
        kind: "instance".into(),
        id: request.from_instance.clone(),
        // Not part of the operation's scope: a retry at any depth is the
        // same delegation.
        attributes: [(DEPTH_ATTRIBUTE.to_owned(), request.depth.to_string())].into(),
    };
    // A delegation seen before is answered from its run, whatever the
    // budget says now; a new one holds its turn's most first.
    let seen = match &delegation {
        Some(id) => runtime.operation(&principal, id).await.map_err(internal)?,
        None => None,
    };
    let reservation = match (&budget, &seen) {
        (Some(ledger), None) => Some(
            ledger
                .reserve()
                .map_err(|why| (ErrorCode::BudgetExhausted, why))?,
        ),
        _ => None,
    };
    let start = StartRequest {
        text: request.prompt.clone(),
        operation_id: delegation.clone(),
        principal: Some(principal),
        title: Some(format!("delegated by {}", request.from_instance)),
        kind: Some("bus".into()),
        ..StartRequest::default()
    };
    let accepted = runtime.start(start).await.map_err(internal)?;
    // A delegation id sent again is the same delegation: its run's
    // outcome, whatever the prompt says now (one rule on every surface;
    // the runtime logs a prompt that differs).
    if !matches!(
        accepted,
        Accepted::Started { .. } | Accepted::Replayed { .. }
    ) {
        return Err((
            ErrorCode::InternalError,
            format!("a delegation made no turn of its own: {accepted:?}"),
        ));
    }
    let run = accepted.run().clone();
    tracing::info!(
        from = %request.from_instance,
        depth = request.depth,
        run_id = %run,
        "bus: delegation accepted"
    );
    tracing::Span::current().record("run_id", run.as_str());
    let view = runtime.settle(&accepted).await.map_err(internal)?;
    // An operator finds a delegated run by who sent it and under which id:
    // the address `bus/<fromInstance>/<delegation id>`, bound once its turn
    // first rests (a binding appended while the model streams would move
    // the run past the place of the live text its viewers are reading).
    if let Some(id) = &delegation {
        bind_address(&runtime, &request.from_instance, id, &run).await;
    }
    if let Some(ledger) = &budget {
        let usage = runtime.usage(&run).await.map_err(internal)?;
        match reservation {
            Some(reservation) => reservation.settle(&run, usage),
            None => ledger.record(&run, usage),
        }
    }
    match view.status {
        Status::Completed => Ok(view.response.unwrap_or_default()),
        Status::Waiting(kind) => {
            let prompt = view.suspend.map(|s| s.prompt).unwrap_or_default();
            Err((
                ErrorCode::WorkflowState,
                format!(
                    "delegated run {run} waits for a {} ({prompt}): answer it on this instance, then send the same delegation again",
                    kind.as_str()
                ),
            ))
        }
        Status::Failed => {
            let (code, message) = failure_of(&runtime, &run, view.cursor).await;
            Err((code, message))
        }
        // Cancelled or retired on this instance: a state the delegation
        // cannot leave by being sent again.
        other => Err((
            ErrorCode::SessionState,
            format!("delegated run {run} ended {}", other.state().as_str()),
        )),
    }
}

/// Binds a delegated run to `bus/<from>/<id>` unless it is bound already
/// (a retry of the delegation); a failure is logged, never the
/// delegation's.
async fn bind_address(runtime: &Runtime, from: &str, id: &str, run: &RunId) {
    let name = format!("{from}/{id}");
    let bound = match runtime.channel(NAMESPACE) {
        Ok(channel) => match channel.lookup(&name).await {
            Ok(_) => Ok(()),
            Err(_) => channel.attach(&name, run).await.map(|_| ()),
        },
        Err(error) => Err(error),
    };
    if let Err(error) = bound {
        tracing::warn!(run_id = %run, %error, "bus: the delegated run's address could not be bound");
    }
}

/// The caller's `ext.spool.delegation_id`, when it sent one.
fn delegation_id(request: &BusRequest) -> Option<&str> {
    request
        .ext
        .as_ref()
        .and_then(|ext| ext.get("spool"))
        .and_then(|spool| spool.get(DELEGATION_ID))
        .and_then(Value::as_str)
}

/// Where a caller cancels a delegation it made (a Spool extension of bus
/// v1; an instance without it answers 404, and the delegation runs on).
pub const CANCEL_PATH: &str = "/api/cancel";

/// A cancel's body.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CancelRequest {
    from_instance: String,
    delegation_id: String,
}

/// The namespace of delegated runs' addresses: `bus/<fromInstance>/<delegation id>`.
pub const NAMESPACE: &str = "bus";

/// The bus code and message of a run's failed turn: its last event.
async fn failure_of(runtime: &Runtime, run: &RunId, cursor: Option<Seq>) -> (ErrorCode, String) {
    let unknown = || {
        (
            ErrorCode::InternalError,
            format!("delegated run {run} failed"),
        )
    };
    let Some(cursor) = cursor else {
        return unknown();
    };
    let after = cursor.0.checked_sub(1).map(Seq);
    let Ok(mut items) = runtime.subscribe(run, after).await else {
        return unknown();
    };
    // The turn's end, read as every surface reads a run.
    let mut reader = Reader::stateless();
    while let Some(item) = items.next().await {
        if let StreamItem::Event(envelope) = item {
            for fact in reader.envelope(&envelope) {
                if let Activity::TurnEnded(TurnOutcome::Failed(failed)) = fact {
                    let code = match failed.code {
                        FailureCode::Auth => ErrorCode::Auth,
                        FailureCode::Timeout => ErrorCode::Timeout,
                        FailureCode::ProviderError | FailureCode::EngineCli => ErrorCode::EngineCli,
                        FailureCode::Budget => ErrorCode::BudgetExhausted,
                        _ => ErrorCode::InternalError,
                    };
                    return (code, failed.message.clone());
                }
            }
            if envelope.seq >= cursor {
                break;
            }
        }
    }
    unknown()
}
