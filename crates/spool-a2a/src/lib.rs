//! Spool as an A2A (Agent2Agent protocol v1.0) agent: durable tasks over
//! the JSON-RPC and HTTP+JSON bindings, mounted at `/a2a` on `spool
//! serve` behind the same origin, host, token and ownership rules as
//! every other surface, with the agent card at
//! `/.well-known/agent-card.json`.
//!
//! The mapping (`docs/protocol/a2a.md` has it in full):
//!
//! - a **context** is a Spool run; a message without a `contextId`
//!   starts one, and its id is the answer's `contextId`;
//! - a **task** is one turn of it, named `RUN.SEQ` after the journal
//!   position that recorded its message ([`task::TaskRef`]);
//! - a message's **`messageId`** is recorded with it: the same message
//!   sent again (a client retrying after a timeout or a crash) is
//!   answered with the same task, never a second turn;
//! - a task's state is read from the run's journal through the activity
//!   layer, so a task interrupted by a crash is the same task once the
//!   runtime resumes its turn.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod peer;
pub mod push;
mod rest;
mod rpc;
pub mod server;
mod stream;
pub mod task;

use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use spool_edge::body::{self, Body};
use spool_edge::server::Handler;
use spool_edge::tables::Authenticated;
use spool_journal::Principal;
use spool_wire::a2a::{self, AgentCard, Error, ErrorKind};

pub use config::A2aSection;
pub use server::A2aServer;
pub use task::TaskRef;

/// Where the bindings are mounted.
pub const PREFIX: &str = "/a2a";

/// The largest request body taken.
const MAX_BODY: usize = spool_wire::http::MAX_BODY_BYTES;

/// The version a request asked for (`A2A-Version`, as a header or a query
/// parameter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    /// None given: the method's own version (a v1.0 name is v1.0, a v0.3
    /// name v0.3).
    Unstated,
    /// 1.0.
    Current,
    /// 0.3.
    Legacy,
    /// Another, refused.
    Other(String),
}

impl Version {
    fn of(headers: &HeaderMap, query: Option<&str>) -> Self {
        let stated = headers
            .get(a2a::VERSION_HEADER)
            .map(|v| v.to_str().unwrap_or("?").trim().to_owned())
            .or_else(|| {
                query?
                    .split('&')
                    .filter_map(|pair| pair.split_once('='))
                    .find(|(name, _)| name.eq_ignore_ascii_case("A2A-Version"))
                    .map(|(_, value)| value.to_owned())
            });
        match stated.as_deref() {
            None | Some("") => Self::Unstated,
            Some(version) => {
                // Patch numbers do not count (specification §3.6).
                let major_minor: Vec<&str> = version.split('.').take(2).collect();
                match major_minor.as_slice() {
                    ["1", "0"] | ["1"] => Self::Current,
                    ["0", "3"] => Self::Legacy,
                    _ => Self::Other(version.to_owned()),
                }
            }
        }
    }

    /// Refuses a version this interface does not speak: v1.0 for every
    /// method, v0.3 for the v0.3 names (`legacy`).
    pub(crate) fn check(&self, legacy: bool) -> Result<(), Error> {
        let refuse = |version: &str| {
            Err(Error::new(
                ErrorKind::VersionNotSupported,
                format!(
                    "A2A version {version} is not supported here: this interface speaks {}{}",
                    a2a::PROTOCOL_VERSION,
                    if legacy { " and 0.3" } else { "" }
                ),
            )
            .with("requestedVersion", version)
            .with("supportedVersions", if legacy { "1.0,0.3" } else { "1.0" }))
        };
        match self {
            Self::Unstated | Self::Current => Ok(()),
            Self::Legacy if legacy => Ok(()),
            Self::Legacy => refuse("0.3"),
            Self::Other(version) => refuse(version),
        }
    }
}

/// The caller the channel's authenticator proved.
fn caller(request: &Request<Incoming>) -> Option<Principal> {
    request
        .extensions()
        .get::<Authenticated>()
        .and_then(|caller| caller.0.clone())
}

/// The base URL the request reached: its scheme and `Host`.
fn base(server: &A2aServer, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("{}://{host}", server.scheme)
}

impl A2aServer {
    /// `GetExtendedAgentCard`: the card, for an authenticated caller.
    ///
    /// # Errors
    ///
    /// `UnsupportedOperation` when callers do not authenticate here (the
    /// card says `extendedAgentCard: false`).
    pub fn extended_card(
        &self,
        caller: Option<&Principal>,
        base: &str,
    ) -> Result<AgentCard, Error> {
        if !self.authenticated || caller.is_none() {
            return Err(Error::new(
                ErrorKind::UnsupportedOperation,
                "this agent has no extended card: callers do not authenticate here",
            ));
        }
        Ok(self.card(base))
    }

    /// The handler for `/a2a` and everything under it: both bindings.
    #[must_use]
    pub fn route(&self) -> Handler {
        let server = self.clone();
        Arc::new(move |request: Request<Incoming>| {
            let mut server = server.clone();
            Box::pin(async move {
                // A revoked token's streams end within the token file's
                // reload period, as the other surfaces' do.
                if let Some(session) = request.extensions().get::<spool_edge::session::Session>() {
                    server.closing = session.ending();
                }
                server.handle(request).await
            })
        })
    }

    /// The handler for the public card paths: no credentials needed, as
    /// discovery comes before them.
    #[must_use]
    pub fn card_route(&self) -> Handler {
        let server = self.clone();
        Arc::new(move |request: Request<Incoming>| {
            let server = server.clone();
            Box::pin(async move {
                if request.method() != Method::GET {
                    return body::error(
                        spool_wire::http::ErrorCode::MethodNotAllowed,
                        "the agent card takes GET",
                    );
                }
                let card = server.card(&base(&server, request.headers()));
                let mut reply = body::json(StatusCode::OK, &card);
                reply.headers_mut().insert(
                    header::CACHE_CONTROL,
                    http::HeaderValue::from_static("max-age=300"),
                );
                reply
            })
        })
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let version = Version::of(request.headers(), request.uri().query());
        let caller = caller(&request);
        let base = base(self, request.headers());
        if path == PREFIX || path == "/a2a/" {
            if request.method() != Method::POST {
                return body::error(
                    spool_wire::http::ErrorCode::MethodNotAllowed,
                    "`/a2a` takes JSON-RPC requests by POST; the HTTP+JSON binding is under `/a2a/`",
                );
            }
            let bytes =
                match body::read_capped(request.into_body(), MAX_BODY, body::BODY_READ_TIMEOUT)
                    .await
                {
                    Ok(bytes) => bytes,
                    Err(reply) => return *reply,
                };
            return rpc::answer(self, caller.as_ref(), version, &base, &bytes).await;
        }
        rest::answer(self, caller.as_ref(), version, &base, request).await
    }
}
