//! The conversation a model sees, kept event by event: the system prompt,
//! every recorded request's new messages and every recorded answer, after
//! clears and compactions, with the request-hash chain over it.

use std::sync::Arc;

use serde::Deserialize;
use spool_journal::{Envelope, Event};

use crate::engine::{Message, ModelResponse, RequestHasher};

/// A run's model history up to some position, and its hash chain.
#[derive(Clone, Debug)]
pub(crate) struct History {
    system: Option<Arc<str>>,
    /// Shared with the requests built on it: a request clones the `Arc`,
    /// not the messages.
    messages: Arc<Vec<Message>>,
    hasher: RequestHasher,
}

impl History {
    /// An empty conversation under `system`.
    pub(crate) fn new(system: Option<Arc<str>>) -> Self {
        let mut history = Self {
            system,
            messages: Arc::default(),
            hasher: RequestHasher::default(),
        };
        history.reset();
        history
    }

    /// Folds one more event.
    pub(crate) fn apply(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::ModelCallRequested(requested) => {
                for message in &requested.new_messages {
                    // What does not decode was written by a newer Spool
                    // with a role this one does not know: the model
                    // cannot be shown it either.
                    if let Ok(message) = Message::deserialize(message) {
                        self.push(message);
                    }
                }
            }
            Event::ModelCallCompleted(completed) => {
                if let Ok(response) = ModelResponse::deserialize(&*completed.message) {
                    self.push(response.message());
                }
            }
            Event::ContextCleared(_) => self.reset(),
            Event::Compacted(compacted) => {
                self.reset();
                self.push(Message::User {
                    content: format!("Summary of the conversation so far: {}", compacted.summary),
                });
            }
            _ => {}
        }
    }

    /// Heads the conversation with `system` in place of its prompt (a run
    /// moved to another agent definition): the messages stay, and the
    /// hash chain is taken again over them.
    pub(crate) fn set_system(&mut self, system: Option<Arc<str>>) {
        let mut messages: Vec<Message> = self.messages.iter().cloned().collect();
        if self.system.is_some() && matches!(messages.first(), Some(Message::System { .. })) {
            messages.remove(0);
        }
        self.system = system;
        self.reset();
        for message in messages {
            self.push(message);
        }
    }

    /// The messages, shared.
    pub(crate) fn messages(&self) -> &Arc<Vec<Message>> {
        &self.messages
    }

    /// The hash chain over [`History::messages`].
    pub(crate) fn hasher(&self) -> &RequestHasher {
        &self.hasher
    }

    fn push(&mut self, message: Message) {
        self.hasher.push(&message);
        // In place unless a request built on it is still alive.
        Arc::make_mut(&mut self.messages).push(message);
    }

    fn reset(&mut self) {
        self.messages = Arc::default();
        self.hasher = RequestHasher::default();
        if let Some(system) = self.system.clone() {
            self.push(Message::System {
                content: system.to_string(),
            });
        }
    }
}
