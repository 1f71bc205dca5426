//! What every network transport of Spool shares, so that no transport
//! stands on another: the serve loop and its listeners (TCP, TLS, 0600
//! Unix sockets) with graceful shutdown, capped and timed bodies and the
//! JSON error body (hyper's own refusals included), the origin, host and
//! content-type guard, bearer-token files and the sessions a revocation
//! ends, the server's TLS certificate files, the shared line cache, the
//! LogRecord table of a run's activity, the one outbound path with its
//! trust policy, and the reply and error tables transports answer in.
//!
//! What this crate deliberately does not do: route. It holds no channel,
//! no protocol and no store; the HTTP channel, JSON-RPC and the bus build
//! their routes on it and call the runtime.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod body;
pub mod guard;
pub mod lines;
pub mod outbound;
pub mod records;
mod refusals;
pub mod server;
pub mod session;
pub mod tables;
pub mod tap;
pub mod tls;
pub mod token;

pub use server::{Handler, Listener, serve};
pub use token::TokenFile;
