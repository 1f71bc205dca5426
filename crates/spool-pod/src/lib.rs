//! Spool's Pod protocol (seed 003): one named agent with one session,
//! driven with JSONL methods (`run`, `resume`, `cancel`, `get_status`,
//! `get_history`) and watched through events broadcast to every listener.
//!
//! [`Pod`] is the in-process API (a Rust host registers a [`Listener`] and
//! calls methods directly); [`daemon::serve`] puts a pod on a Unix socket,
//! in the runtime directory [`dir::PodDir`] sets up. The mapping from a
//! run's journal and deltas to pod events is [`events::Translator`]; the
//! history's is [`history::items`]. See `docs/protocol/pod.md`.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod daemon;
pub mod dir;
pub mod events;
pub mod history;
mod pod;

pub use pod::{Listener, NAMESPACE, Pod, PodError, QUEUE, valid_name};
