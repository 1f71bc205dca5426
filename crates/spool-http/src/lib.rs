//! Spool's HTTP channel, `/spool/v1`: its routes, its NDJSON streams and
//! their fan-out, its client, and forwarding on a cluster. The serve loop,
//! bodies, the origin and host guard, tokens and TLS it stands on are
//! `spool-edge`'s, re-exported here under their old paths.
//!
//! What this crate deliberately does not do: touch a store. It calls the
//! runtime's API and subscribes to its event hub, as every transport does.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod channel;
pub mod client;
pub mod console;
pub mod events;
mod fanout;
pub mod forward;
mod journal;
pub mod schedules;
pub mod stream;

pub use channel::HttpChannel;
pub use client::{Client, ClientError};
pub use events::stream_lines;
pub use forward::Placement;
pub use spool_edge::{Listener, TokenFile, body, guard, lines, serve, server, session, tls};

/// The built-in authenticator (`spool_edge::token`), and the trigger
/// authorizer `spool serve` uses with it.
pub mod token {
    pub use spool_edge::token::*;

    /// The trigger authorizer `spool serve` uses with a token file: a
    /// token with the `trigger` scope, or an administrator's.
    #[must_use]
    pub fn trigger_authorizer() -> crate::schedules::TriggerAuthorizer {
        std::sync::Arc::new(|principal| {
            principal.is_some_and(|p| {
                [TRIGGER_ATTRIBUTE, ADMIN_ATTRIBUTE]
                    .iter()
                    .any(|scope| p.attributes.get(*scope).is_some_and(|v| v == "true"))
            })
        })
    }
}
