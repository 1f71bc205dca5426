//! Spool's bus v1 (seed 000): one instance delegating a prompt to another
//! over loopback HTTP. [`server::BusServer`] answers `POST /api/talk` and
//! `GET /api/health`; a delegation is a run of its own, made once per
//! delegation id. See `docs/protocol/bus.md`.

#![warn(missing_docs)]

pub mod server;

pub use server::{BusServer, DELEGATION_ID, Settings};
