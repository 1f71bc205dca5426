//! The bus client: delegates a prompt to another instance. Local checks
//! first (the target is on loopback), then `GET /api/health` (500 ms) whose
//! fingerprint must name the instance before the secret is sent, then
//! `POST /api/talk`. What fails on the way is a failure envelope with the
//! seed's code (`timeout`, `instance_unavailable`, `invalid_response`), and
//! a retryable failure is tried again, with backoff, under the same
//! delegation id, so the other side runs the prompt once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use spool_edge::outbound;
use spool_wire::bus::{BusRequest, BusResponse, ErrorCode, HEALTH_PATH, TALK_PATH};

use crate::server::{CANCEL_PATH, DELEGATION_ID};

/// How long the health check may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_millis(500);

/// Where a delegation goes.
#[derive(Clone, Debug)]
pub struct Target {
    /// The instance's bus address; loopback only.
    pub addr: SocketAddr,
    /// Its name, as its health check must say it.
    pub instance: String,
    /// Its bus secret.
    pub secret: String,
}

/// How to reach an instance.
#[derive(Clone, Debug)]
pub enum Route {
    /// A known address and secret.
    Direct(Target),
    /// By name in a registry file, looked up again on every attempt, so an
    /// instance restarted on another port is found there.
    Registry {
        /// The registry file.
        path: PathBuf,
        /// The instance's name.
        instance: String,
    },
}

impl Route {
    /// The instance's name.
    #[must_use]
    pub fn instance(&self) -> &str {
        match self {
            Self::Direct(target) => &target.instance,
            Self::Registry { instance, .. } => instance,
        }
    }

    /// Where the instance is now.
    ///
    /// # Errors
    ///
    /// `instance_unavailable` when the registry cannot be read or does not
    /// name it (retryable: it may be starting).
    pub fn locate(&self) -> Result<Target, (ErrorCode, String)> {
        let (path, instance) = match self {
            Self::Direct(target) => return Ok(target.clone()),
            Self::Registry { path, instance } => (path, instance),
        };
        let instances = crate::registry::read(path).map_err(|e| {
            (
                ErrorCode::InstanceUnavailable,
                format!("reading {}: {e}", path.display()),
            )
        })?;
        let entry = instances.get(instance).ok_or_else(|| {
            (
                ErrorCode::InstanceUnavailable,
                format!(
                    "no instance {instance} in {} (`spool bus list` shows them)",
                    path.display()
                ),
            )
        })?;
        Ok(Target {
            addr: SocketAddr::from(([127, 0, 0, 1], entry.port)),
            instance: instance.clone(),
            secret: entry.secret.clone(),
        })
    }
}

/// How a delegation is sent.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long one attempt may wait for the answer.
    pub timeout: Duration,
    /// Attempts in all, retryable failures being tried again.
    pub attempts: u32,
    /// The first retry's wait; each next one doubles, up to 5 s.
    pub backoff: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            attempts: 3,
            backoff: Duration::from_millis(200),
        }
    }
}

/// Delegates `prompt` from instance `from` to the instance `route`
/// reaches. `depth`: the hops so far, counting this one (the caller
/// increments it). `delegation`: the delegation's id (made here when
/// `None`), sent on every attempt.
pub async fn talk(
    from: &str,
    route: &Route,
    prompt: &str,
    depth: u64,
    delegation: Option<String>,
    options: &Options,
) -> BusResponse {
    let started = Instant::now();
    let local = |code: ErrorCode, message: String| {
        BusResponse::failure(
            route.instance(),
            code,
            message,
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        )
    };
    let delegation = match delegation {
        Some(id) => id,
        None => match spool_edge::token::fresh_token() {
            Ok(hex) => format!("delegation_{hex}"),
            Err(error) => {
                return local(
                    ErrorCode::InternalError,
                    format!("making a delegation id: {error}"),
                );
            }
        },
    };
    let mut request = BusRequest::new(from, prompt, depth);
    let mut ext = serde_json::Map::new();
    ext.insert("spool".into(), json!({ DELEGATION_ID: delegation }));
    request.ext = Some(ext);
    let mut wait = options.backoff;
    let mut attempt = 1;
    loop {
        let response = match attempt_once(route, &request, options.timeout).await {
            Ok(response) => response,
            Err((code, message)) => local(code, message),
        };
        if response.success || !response.is_retryable() || attempt >= options.attempts.max(1) {
            return response;
        }
        attempt += 1;
        // Up to half the wait again at random, so callers retrying
        // together spread out.
        let jitter = wait.mul_f64(fastrand::f64() / 2.0);
        tokio::time::sleep(wait + jitter).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// Asks the instance `route` leads to to cancel the delegation `delegation`
/// that `from` made (`POST /api/cancel`, a Spool extension): what the
/// `delegate` tool does when its own turn is cancelled. Best effort: an
/// instance without the route answers 404 and its delegation runs on.
///
/// # Errors
///
/// The instance could not be reached or refused the request; the code
/// and why.
pub async fn cancel(
    from: &str,
    route: &Route,
    delegation: &str,
    timeout: Duration,
) -> Result<String, (ErrorCode, String)> {
    let target = &route.locate()?;
    if !target.addr.ip().is_loopback() {
        return Err((
            ErrorCode::InvalidRequest,
            format!("the bus is loopback-only; {} is not", target.addr),
        ));
    }
    check_health(target.addr, &target.instance).await?;
    let body = Bytes::from(
        serde_json::to_vec(&json!({"fromInstance": from, "delegationId": delegation}))
            .expect("a cancel is plain JSON"),
    );
    let (status, answer) = tokio::time::timeout(
        timeout,
        exchange(
            target,
            Method::POST,
            CANCEL_PATH,
            Some(&target.secret),
            body,
        ),
    )
    .await
    .map_err(|_| {
        (
            ErrorCode::Timeout,
            format!("{} did not answer within {timeout:?}", target.instance),
        )
    })??;
    let response = decode_answer(&answer)?;
    if status == 200 && response.success {
        Ok(response.text().to_owned())
    } else {
        Err((
            response.code().unwrap_or(ErrorCode::Unclassified),
            response
                .error
                .unwrap_or_else(|| format!("{} answered {status}", target.instance)),
        ))
    }
}

/// What a health check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The instance answered as itself.
    Itself,
    /// Nobody listens there, or somebody else answers: the entry is stale.
    Elsewhere(String),
    /// No answer in time: it may be busy; nothing can be said.
    Silent(String),
}

/// Asks `addr` who it is: its health check's fingerprint (`status:
/// "ok"`, the instance's name, and a `kind` naming the program, Spool's
/// `"spool"` or a reference implementation's own), within
/// [`HEALTH_TIMEOUT`]. The name is what keeps the secret from a stranger
/// holding the port; the kind is not held to Spool's, so an instance of
/// the seed's reference implementation is reached too (mixed old and new
/// processes, as the seed wants).
pub async fn probe(addr: SocketAddr, instance: &str) -> Probe {
    let target = Target {
        addr,
        instance: instance.to_owned(),
        secret: String::new(),
    };
    let answer = tokio::time::timeout(
        HEALTH_TIMEOUT,
        exchange(&target, Method::GET, HEALTH_PATH, None, Bytes::new()),
    )
    .await;
    let (status, health) = match answer {
        Err(_) => return Probe::Silent(format!("{addr} did not answer its health check in time")),
        Ok(Err((_, why))) => return Probe::Elsewhere(why),
        Ok(Ok(answer)) => answer,
    };
    let fingerprint: Value = serde_json::from_slice(&health).unwrap_or(Value::Null);
    if status == 200
        && fingerprint["kind"]
            .as_str()
            .is_some_and(|kind| !kind.is_empty())
        && fingerprint["status"] == "ok"
        && fingerprint["instance"] == instance
    {
        Probe::Itself
    } else {
        Probe::Elsewhere(format!(
            "{addr} is not instance {instance} (its health check says {fingerprint})"
        ))
    }
}

/// Checks that `addr` answers as instance `instance` ([`probe`]).
///
/// # Errors
///
/// `instance_unavailable`, saying why; the secret is not sent.
pub async fn check_health(addr: SocketAddr, instance: &str) -> Result<(), (ErrorCode, String)> {
    match probe(addr, instance).await {
        Probe::Itself => Ok(()),
        Probe::Elsewhere(why) => Err((
            ErrorCode::InstanceUnavailable,
            format!("{why}; the secret was not sent"),
        )),
        Probe::Silent(why) => Err((ErrorCode::InstanceUnavailable, why)),
    }
}

/// One attempt: where the instance is, its health check, then the talk.
async fn attempt_once(
    route: &Route,
    request: &BusRequest,
    timeout: Duration,
) -> Result<BusResponse, (ErrorCode, String)> {
    let target = &route.locate()?;
    if !target.addr.ip().is_loopback() {
        return Err((
            ErrorCode::InvalidRequest,
            format!("the bus is loopback-only; {} is not", target.addr),
        ));
    }
    check_health(target.addr, &target.instance).await?;
    let body = Bytes::from(serde_json::to_vec(request).expect("a request is plain JSON"));
    let (_, answer) = tokio::time::timeout(
        timeout,
        exchange(target, Method::POST, TALK_PATH, Some(&target.secret), body),
    )
    .await
    .map_err(|_| {
        (
            ErrorCode::Timeout,
            format!("{} did not answer within {timeout:?}", target.instance),
        )
    })??;
    decode_answer(&answer)
}

/// An answer's body as a bus envelope.
fn decode_answer(answer: &[u8]) -> Result<BusResponse, (ErrorCode, String)> {
    let text = std::str::from_utf8(answer).map_err(|_| {
        (
            ErrorCode::InvalidResponse,
            "the answer is not UTF-8".to_owned(),
        )
    })?;
    BusResponse::decode(text).map_err(|rejection| (ErrorCode::InvalidResponse, rejection.message))
}

/// One HTTP/1.1 exchange on a fresh connection: the status and the body.
async fn exchange(
    target: &Target,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    body: Bytes,
) -> Result<(u16, Bytes), (ErrorCode, String)> {
    let unavailable = |why: String| (ErrorCode::InstanceUnavailable, why);
    // Spool's one outbound path: its connect deadline, hyper's connection.
    let stream = outbound::connect(tokio::net::TcpStream::connect(target.addr))
        .await
        .map_err(|e| unavailable(format!("connecting to {}: {e}", target.addr)))?;
    let mut sender = outbound::handshake(stream)
        .await
        .map_err(|e| unavailable(format!("talking to {}: {e}", target.addr)))?;
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, target.addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(bearer) = bearer {
        request = request.header(header::AUTHORIZATION, format!("Bearer {bearer}"));
    }
    let request = request
        .body(Full::new(body))
        .map_err(|e| (ErrorCode::InternalError, e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unavailable(format!("{} dropped the request: {e}", target.addr)))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unavailable(format!("{} dropped the answer: {e}", target.addr)))?
        .to_bytes();
    Ok((status, body))
}
