//! How hosts plug in: an [`Authenticator`] that every transport calls, and
//! a [`Channel`] handle that maps a host's own conversations (a Slack
//! thread, a web session) to runs through addresses in its own namespace.

use spool_journal::event::AddressBinding;
use spool_journal::{Address, Event, Principal, RunId};

use crate::BoxFuture;
use crate::error::RuntimeError;
use crate::runtime::{Accepted, MessageRequest, Runtime, StartRequest};
use crate::view::RunView;

/// What a transport shows an authenticator about a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Request headers (or their equivalent), names lowercased.
    pub headers: Vec<(String, String)>,
    /// The peer, when the transport knows it (an address, a Unix uid).
    pub peer: Option<String>,
}

impl Credentials {
    /// The first value of a header, by lowercase name.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The token of an `Authorization: Bearer <token>` header.
    #[must_use]
    pub fn bearer(&self) -> Option<&str> {
        let value = self.header("authorization")?;
        let (scheme, token) = value.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    }
}

/// Why authentication did not admit a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No valid credentials: answered 401 `unauthenticated`.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The authenticator itself failed: answered 500, detail to the log.
    #[error("authentication failed: {0}")]
    Failed(String),
}

/// Proves who is calling. `Ok(None)` admits an unattributed caller.
pub trait Authenticator: Send + Sync + 'static {
    /// Checks a request's credentials.
    fn authenticate<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Option<Principal>, AuthError>>;
}

/// A host's channel: its namespace of addresses, mapped to runs.
#[derive(Clone, Debug)]
pub struct Channel {
    runtime: Runtime,
    namespace: String,
}

impl Runtime {
    /// A handle for the channel `namespace` (lowercase letters, digits and
    /// `-`).
    ///
    /// # Errors
    ///
    /// `BadRequest` for an empty or malformed namespace.
    pub fn channel(&self, namespace: &str) -> Result<Channel, RuntimeError> {
        let valid = !namespace.is_empty()
            && namespace.len() <= 64
            && namespace
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(RuntimeError::BadRequest(format!(
                "channel namespace `{namespace}` must be 1 to 64 lowercase letters, digits or -"
            )));
        }
        Ok(Channel {
            runtime: self.clone(),
            namespace: namespace.to_owned(),
        })
    }
}

impl Channel {
    /// The channel's namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The address `name` in this channel.
    #[must_use]
    pub fn address(&self, name: &str) -> Address {
        Address::new(self.namespace.clone(), name)
    }

    /// A message from the conversation `name`: its run gets it (a new run
    /// on first use).
    ///
    /// # Errors
    ///
    /// As [`Runtime::start`].
    pub async fn from(
        &self,
        name: &str,
        message: MessageRequest,
        principal: Option<Principal>,
    ) -> Result<Accepted, RuntimeError> {
        self.runtime
            .start(StartRequest {
                text: message.text,
                address: Some(self.address(name)),
                principal,
                context: message.context,
                policy: message.policy,
                ..StartRequest::default()
            })
            .await
    }

    /// Binds the conversation `name` to an existing run.
    ///
    /// # Errors
    ///
    /// `RunNotFound`; a journal error when the name is bound to another run.
    pub async fn attach(&self, name: &str, run: &RunId) -> Result<RunView, RuntimeError> {
        // The run must exist before a name may lead to it.
        self.runtime.get(run).await?;
        let bound = Event::AddressBound(AddressBinding {
            address: self.address(name),
        });
        self.runtime.inner.append(run, vec![bound]).await?;
        self.runtime.get(run).await
    }

    /// The run of the conversation `name`, without creating one.
    ///
    /// # Errors
    ///
    /// `RunNotFound` when the name is not bound.
    pub async fn lookup(&self, name: &str) -> Result<RunView, RuntimeError> {
        self.runtime.lookup(&self.address(name)).await
    }
}
