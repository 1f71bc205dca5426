//! Spool's HTTP channel, `/spool/v1`, and the hyper server plumbing other
//! transports reuse (listeners, capped bodies, JSON errors, graceful
//! shutdown, streaming bodies).
//!
//! What this crate deliberately does not do: touch a store. It calls the
//! runtime's API and subscribes to its event hub, as every transport does.
#![warn(missing_docs)]

pub mod body;
pub mod channel;
pub mod client;
mod fanout;
pub mod forward;
pub mod guard;
pub mod lines;
mod refusals;
pub mod schedules;
pub mod server;
pub mod session;
pub mod stream;
mod tap;
pub mod tls;
pub mod token;

pub use channel::HttpChannel;
pub use client::{Client, ClientError};
pub use forward::Placement;
pub use server::{Listener, serve};
pub use stream::stream_lines;
pub use token::TokenFile;
