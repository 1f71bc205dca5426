//! Spool's bus v1 (seed 000): one instance delegating a prompt to another
//! over loopback HTTP. [`server::BusServer`] answers `POST /api/talk` and
//! `GET /api/health`; a delegation is a run of its own, made once per
//! delegation id. [`client::talk`] sends one, checking the other side's
//! health first and retrying what may be retried under the same id. See
//! `docs/protocol/bus.md`.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod budget;
pub mod client;
pub mod config;
pub mod registry;
pub mod server;
pub mod tool;

pub use server::{AUTHENTICATOR, BusServer, DELEGATION_ID, DEPTH_ATTRIBUTE, Settings};
