//! Spool's runtime: runs that survive a crash.
//!
//! A [`Runtime`] turns calls (start, message, respond, cancel, reset,
//! clear, compact) into journal events and drives each run's turns in a
//! task of its own, detached from the caller: a client that goes away does
//! not stop its turn. Every model and tool call goes through the journal's
//! replay cursor, write-ahead: the intent is durable before the call, the
//! completion before anyone is told. On start, [`Runtime::recover`] resumes
//! what was in progress; recorded results are replayed, never re-run, and a
//! write that may or may not have happened waits for an operator.
//!
//! What this crate deliberately does not know: any transport. HTTP, JSON-RPC,
//! Pod and the bus call this API and subscribe to its event hub.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod access;
pub mod activity;
pub mod agent;
mod agents;
mod budget;
pub mod channel;
pub mod dirs;
mod driver;
pub mod engine;
pub mod engines;
pub mod error;
mod history;
pub mod hub;
pub mod ids;
pub mod process;
pub mod retention;
mod runs;
mod runtime;
pub mod schedule;
mod storage;
mod tasks;
pub mod tool;
pub mod tools;
pub mod view;

pub use access::RunAccess;
pub use agents::{AgentFactory, AgentSpec};
pub use channel::{AuthError, Authenticator, Channel, Credentials};
pub use engine::{Engine, Message, ModelRequest, ModelResponse};
pub use error::{ErrorKind, Limited, RuntimeError};
pub use ids::{IdSource, SequentialIds, UniqueIds};
pub use runs::DEFAULT_CACHED_RUNS;
pub use runtime::{
    Accepted, CancelOutcome, DeleteRequest, ForkRequest, MAX_ANSWERS, MessageRequest, Recovery,
    RecoveryPlan, Runtime, RuntimeBuilder, StartRequest,
};
pub use schedule::{ScheduleDefinition, Scheduler};
pub use spool_journal::store::BoxFuture;
pub use storage::{JournalHealth, PROBE_FIRST, PROBE_MAX, RESUME_MAX};
pub use tool::{LiveTools, Tool, ToolContext, ToolOutcome, Tools};
pub use view::{RunDetail, RunView, Snapshot};
