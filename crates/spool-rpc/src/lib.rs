//! Spool's JSON-RPC 2.0 transport (seed 001): envelopes in, answers and
//! OpenTelemetry-LogRecord events out.
//!
//! One [`Dispatcher`] serves every framing: a framing reads text, hands it
//! to its [`Connection`], and writes what comes out of the connection's
//! outbox. [`stdio`] is one framing (`spool rpc --stdio`); [`http`] mounts
//! `/version`, `/events` (SSE), `/stream` (NDJSON) and `/ws` ([`ws`],
//! WebSocket) beside the HTTP channel (`spool serve`). The methods:
//!
//! | method | what |
//! | --- | --- |
//! | `submit.run` | the HTTP channel's start fields (`text`, `address?`, `operation_id?`, `title?`, `kind?`, `context?`, `turn_policy?`) plus `run_id?` to continue a run; streams `events.append` for the turn, then answers with the HTTP channel's run reply |
//! | `run.respond` | `{run_id, turn_id?, responses: [{text, approved?}]}` |
//! | `run.cancel` | `{run_id, turn_id?}`: `{status, run_id?, turn_id?}` as over HTTP |
//! | `run.get` | `{run_id}`: the run reply |
//! | `run.list` | `{limit?}`: `{runs: [{id, state, title, updated}]}` |
//! | `state.snapshot` | `{run_id}`: the HTTP snapshot |
//! | `subscribe` / `unsubscribe` | `{run_id, cursor?, channels?}`: `events.append` (`spool:events`, the default) and/or `state.patch` (`spool:state`, RFC 6902 patches of the snapshot, [`state`]) from after `cursor`, journal first, then live |
//! | `getCapabilities` | the `/version` document |
//!
//! Errors use the seed's codes: −32700 … −32603, −32002 for an unknown run,
//! −32000 for a refusal of the runtime, whose `data` carries the HTTP
//! channel's `code` (`run_waiting`, `journal_unavailable`, …).
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod dispatch;
/// The LogRecords a run's activity becomes, shared with the OTLP exporter.
pub use spool_edge::records as events;
pub mod http;
pub mod state;
pub mod stdio;
pub mod ws;

pub use dispatch::{
    Connection, Dispatcher, MAX_CHANNELS, MAX_IN_FLIGHT, METHODS, OUTBOX, Outgoing, capabilities,
};
