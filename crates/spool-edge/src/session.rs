//! A caller's session: what ends a long-lived response (an NDJSON or SSE
//! stream, a WebSocket) besides the client going away. The server's
//! graceful shutdown ends every session; a revoked credential ends the
//! sessions it opened, when the authenticator says what it admits changed
//! ([`Authenticator::changes`]) and the credentials no longer pass.

use std::sync::Arc;

use spool_runtime::{AuthError, Authenticator, Credentials};
use tokio::sync::watch;

/// A request's session, put in a mounted handler's request extensions by
/// the HTTP channel, so a transport mounted beside it (JSON-RPC's streams
/// and WebSocket) ends its sessions when the channel's do.
#[derive(Clone)]
pub struct Session {
    authenticator: Option<Arc<dyn Authenticator>>,
    credentials: Credentials,
    closing: watch::Receiver<bool>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Credentials stay out of logs.
        f.debug_struct("Session")
            .field("authenticated", &self.authenticator.is_some())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session of a caller who presented `credentials` to
    /// `authenticator` (none: nothing to revoke), on a server whose
    /// `closing` turns true when it shuts down.
    #[must_use]
    pub fn new(
        authenticator: Option<Arc<dyn Authenticator>>,
        credentials: Credentials,
        closing: watch::Receiver<bool>,
    ) -> Self {
        Self {
            authenticator,
            credentials,
            closing,
        }
    }

    /// Whether the session can end before the server does: its
    /// authenticator can change what it admits.
    #[must_use]
    pub fn revocable(&self) -> bool {
        self.authenticator
            .as_ref()
            .is_some_and(|a| a.changes().is_some())
    }

    /// Turns true when the server shuts down or the session's credentials
    /// stop passing. A revocable session watches its authenticator's
    /// changes in a task of its own while the receiver lives; any other
    /// is the server's own signal, at no cost.
    #[must_use]
    pub fn ending(&self) -> watch::Receiver<bool> {
        let changes = self.authenticator.as_ref().and_then(|a| a.changes());
        let (Some(authenticator), Some(mut changes)) = (self.authenticator.clone(), changes) else {
            return self.closing.clone();
        };
        // Checked once at the start too: a revocation read between the
        // request's authentication and this subscription is not missed.
        changes.mark_changed();
        let (sender, ending) = watch::channel(*self.closing.borrow());
        let credentials = self.credentials.clone();
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            loop {
                // The select's output holds no guard across the awaits
                // below (a watch's guard is not `Send`).
                let changed = tokio::select! {
                    // Nobody holds the session any more.
                    () = sender.closed() => return,
                    ended = closing.wait_for(|closing| *closing) => {
                        let _ = ended.map(|_| ());
                        break;
                    }
                    changed = changes.changed() => changed.is_ok(),
                };
                if !changed {
                    // The authenticator is gone: nothing changes now.
                    return sender.closed().await;
                }
                // A failing authenticator is not a revocation: the next
                // change asks again.
                if let Err(AuthError::Unauthenticated) =
                    authenticator.authenticate(&credentials).await
                {
                    tracing::info!(target: "spool::http", "a session's credentials were revoked; it ends");
                    break;
                }
            }
            let _ = sender.send(true);
        });
        ending
    }
}
