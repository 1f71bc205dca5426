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
#[non_exhaustive]
pub enum AuthError {
    /// No valid credentials: answered 401 `unauthenticated`.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The authenticator itself failed: answered 500, detail to the log.
    #[error("authentication failed: {0}")]
    Failed(String),
}

/// Proves who is calling. `Ok(None)` admits an unattributed caller.
///
/// Every transport calls the one it is given before any route (the HTTP
/// channel's `with_authenticator`); the principal it proves is what
/// operation ids, run ownership and schedule triggers are held to:
///
/// ```
/// use spool_journal::Principal;
/// use spool_runtime::{AuthError, Authenticator, BoxFuture, Credentials};
///
/// /// One shared secret, as a host with a single caller might have.
/// struct Secret(String);
///
/// impl Authenticator for Secret {
///     fn authenticate<'a>(
///         &'a self,
///         credentials: &'a Credentials,
///     ) -> BoxFuture<'a, Result<Option<Principal>, AuthError>> {
///         Box::pin(async move {
///             // A real one compares in constant time (see spool_http::TokenFile).
///             if credentials.bearer() != Some(self.0.as_str()) {
///                 return Err(AuthError::Unauthenticated);
///             }
///             Ok(Some(Principal {
///                 authenticator: "secret".into(),
///                 kind: "app".into(),
///                 id: "operations".into(),
///                 ..Principal::default()
///             }))
///         })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let secret = Secret("s3cret".into());
/// let with = Credentials {
///     headers: vec![("authorization".into(), "Bearer s3cret".into())],
///     peer: None,
/// };
/// assert_eq!(secret.authenticate(&with).await.unwrap().unwrap().id, "operations");
/// let without = Credentials::default();
/// assert_eq!(secret.authenticate(&without).await, Err(AuthError::Unauthenticated));
/// # });
/// ```
pub trait Authenticator: Send + Sync + 'static {
    /// Checks a request's credentials.
    fn authenticate<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Option<Principal>, AuthError>>;

    /// Changes whenever what this authenticator admits may have changed
    /// (a token file reloaded after a revocation): a transport holding a
    /// long-lived session (a stream, a WebSocket) checks its credentials
    /// again then, and ends the session when they no longer pass. `None`
    /// (the default): what it admits never changes.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// A host's channel: its namespace of addresses, mapped to runs. A chat
/// user, a Slack thread or a web session is a name in it; its first
/// message makes a run, later ones go to the same run
/// (`examples/custom-channel` is a whole TCP chat around one):
///
/// ```
/// use std::sync::Arc;
///
/// use spool_journal::store::memory::MemoryJournal;
/// use spool_runtime::{MessageRequest, Runtime};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
/// let chat = runtime.channel("chat").unwrap();
/// let hello = |text: &str| MessageRequest { text: text.into(), ..Default::default() };
/// let first = chat.from("alice", hello("Hi"), None).await.unwrap();
/// let turn = runtime.get(first.run()).await.unwrap().turn_id.unwrap();
/// runtime.wait_for(first.run(), &turn).await.unwrap();
/// let second = chat.from("alice", hello("Again"), None).await.unwrap();
/// assert_eq!(first.run(), second.run(), "one run per conversation");
/// assert_eq!(&chat.lookup("alice").await.unwrap().run_id, first.run());
/// assert!(chat.lookup("bob").await.is_err(), "a name with no messages has no run");
/// # });
/// ```
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
