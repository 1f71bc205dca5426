//! Push notifications, durable: a task's configs are notes in its run's
//! journal (`noted`, namespace `a2a.push`), and so is what each was
//! delivered. Each status change of the task is POSTed to each config at
//! least once, in order, as a `StreamResponse` (`{"statusUpdate": …}`,
//! `Content-Type: application/a2a+json`, the config's token in
//! `X-A2A-Notification-Token` and its authentication in `Authorization`).
//!
//! - A failed POST (no connection, a timeout, a status other than 2xx) is
//!   tried again with backoff, [`ATTEMPTS`] times in all; then the config
//!   is given up on, and the note says why.
//! - A change is marked delivered in the journal only after its POST
//!   succeeded: a crash between the change and that mark delivers it
//!   again after the restart (at least once; a receiver may see a change
//!   twice, as the specification warns).
//! - The runs with configs still to deliver are kept as notes of a record
//!   run of their own (address `a2a:push-registry`), so a restart finds
//!   them without reading every run.
//! - A URL a client gives must resolve to public addresses unless `[a2a]
//!   push_private_networks` allows private ones; it is checked when the
//!   config is made and again at each delivery.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spool_journal::event::Note;
use spool_journal::{Address, RunId};
use spool_runtime::{Runtime, RuntimeError};
use spool_wire::a2a::{self, Error, ErrorKind, StreamResponse, TaskPushNotificationConfig};
use tokio::sync::watch;

use crate::client::{self, Reach};
use crate::task::{TaskRef, Watch};

/// The note namespace of a task's configs.
pub const NAMESPACE: &str = "a2a.push";
/// The note namespace of the registry's runs.
const REGISTRY_NAMESPACE: &str = "a2a.push.runs";
/// The record run's address name, in [`crate::server::NAMESPACE`].
const REGISTRY: &str = "push-registry";
/// POSTs to one change before the config is given up on.
pub const ATTEMPTS: u32 = 8;
/// How long one POST may take.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The most configs one task takes.
pub const MAX_CONFIGS: usize = 16;

/// A config as kept in the journal: the client's, and what became of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Stored {
    config: TaskPushNotificationConfig,
    /// The journal position of the last change delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivered: Option<u64>,
    /// Every change up to the task's end was delivered.
    #[serde(default)]
    done: bool,
    /// Why it was given up on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    given_up: Option<String>,
}

/// The deliverer: one task per config with changes still to send.
#[derive(Clone)]
pub struct Pusher {
    runtime: Runtime,
    closing: watch::Receiver<bool>,
    reach: Reach,
    /// The first retry's wait; each next one doubles, up to 30 s.
    backoff: Duration,
    running: Arc<Mutex<HashSet<(RunId, String)>>>,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("reach", &self.reach)
            .finish_non_exhaustive()
    }
}

fn internal(error: &RuntimeError) -> Error {
    Error::new(ErrorKind::Internal, error.to_string())
}

fn made_id() -> String {
    format!(
        "push-{}",
        spool_runtime::IdSource::run_id(&spool_runtime::UniqueIds)
            .as_str()
            .trim_start_matches("run_")
    )
}

impl Pusher {
    /// A deliverer on `runtime`; `private_networks` lets configs reach
    /// loopback and private addresses.
    #[must_use]
    pub fn new(runtime: Runtime, closing: watch::Receiver<bool>, private_networks: bool) -> Self {
        Self {
            runtime,
            closing,
            reach: if private_networks {
                Reach::Any
            } else {
                Reach::Public
            },
            backoff: Duration::from_secs(1),
            running: Arc::default(),
        }
    }

    /// Where configs' URLs may point.
    #[must_use]
    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// With `backoff` as the first retry's wait (tests shorten it).
    #[must_use]
    pub fn with_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    async fn registry(&self) -> Result<RunId, RuntimeError> {
        let address = Address::new(crate::server::NAMESPACE, REGISTRY);
        Ok(self.runtime.ensure(&address).await?.run_id)
    }

    async fn register(&self, run: &RunId, on: bool) -> Result<(), RuntimeError> {
        let registry = self.registry().await?;
        self.runtime
            .note(
                &registry,
                Note {
                    namespace: REGISTRY_NAMESPACE.into(),
                    key: run.to_string(),
                    value: if on { Value::Bool(true) } else { Value::Null },
                },
            )
            .await
    }

    async fn stored(&self, run: &RunId) -> Result<Vec<(String, Stored)>, RuntimeError> {
        Ok(self
            .runtime
            .notes(run, NAMESPACE)
            .await?
            .into_iter()
            .filter_map(|(id, value)| Some((id, serde_json::from_value(value).ok()?)))
            .collect())
    }

    async fn keep(
        &self,
        run: &RunId,
        id: &str,
        stored: Option<&Stored>,
    ) -> Result<(), RuntimeError> {
        self.runtime
            .note(
                run,
                Note {
                    namespace: NAMESPACE.into(),
                    key: id.to_owned(),
                    value: stored.map_or(Value::Null, |s| {
                        serde_json::to_value(s).expect("a config is plain JSON")
                    }),
                },
            )
            .await
    }

    /// Starts delivering to every config a restart left with changes to
    /// send.
    ///
    /// # Errors
    ///
    /// When the journal cannot be read.
    pub async fn resume(&self) -> Result<usize, RuntimeError> {
        // Looked up, never made here: a server that never had a push
        // config keeps no record run for them.
        let address = Address::new(crate::server::NAMESPACE, REGISTRY);
        let Some(registry) = self.runtime.find_address(&address).await? else {
            return Ok(0);
        };
        let mut started = 0;
        for run in self
            .runtime
            .notes(&registry, REGISTRY_NAMESPACE)
            .await?
            .into_keys()
        {
            let Ok(run) = RunId::new(run) else { continue };
            let stored = match self.stored(&run).await {
                Ok(stored) => stored,
                Err(e) if e.kind() == spool_runtime::ErrorKind::RunNotFound => continue,
                Err(e) => return Err(e),
            };
            for (id, stored) in stored {
                if !stored.done && stored.given_up.is_none() {
                    self.spawn(run.clone(), id);
                    started += 1;
                }
            }
        }
        Ok(started)
    }

    /// Records `config` for the task at `at` and starts delivering to it.
    ///
    /// # Errors
    ///
    /// `InvalidParams` for a URL it may not reach; `Internal` when the
    /// journal fails.
    pub async fn create(
        &self,
        at: &TaskRef,
        mut config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, Error> {
        client::check(&config.url, self.reach)
            .await
            .map_err(|e| Error::new(ErrorKind::InvalidParams, format!("push config `url`: {e}")))?;
        let id = config
            .id
            .clone()
            .filter(|id| !id.is_empty())
            .unwrap_or_else(made_id);
        let existing = self.stored(&at.run).await.map_err(|e| internal(&e))?;
        let task_id = at.id();
        let on_task = existing
            .iter()
            .filter(|(other, s)| {
                s.config.task_id.as_deref() == Some(task_id.as_str()) && *other != id
            })
            .count();
        if on_task >= MAX_CONFIGS {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                format!("task `{task_id}` has {MAX_CONFIGS} push configs, the most it takes"),
            ));
        }
        if existing
            .iter()
            .any(|(other, s)| *other == id && s.config.task_id.as_deref() != Some(task_id.as_str()))
        {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                format!("push config id `{id}` belongs to another task"),
            ));
        }
        config.id = Some(id.clone());
        config.task_id = Some(task_id);
        config.tenant = None;
        let stored = Stored {
            config: config.clone(),
            delivered: None,
            done: false,
            given_up: None,
        };
        // Registered first: a crash after the config is kept finds it.
        self.register(&at.run, true)
            .await
            .map_err(|e| internal(&e))?;
        self.keep(&at.run, &id, Some(&stored))
            .await
            .map_err(|e| internal(&e))?;
        self.spawn(at.run.clone(), id);
        Ok(config)
    }

    /// The task's configs.
    ///
    /// # Errors
    ///
    /// `Internal` when the journal fails.
    pub async fn list(&self, at: &TaskRef) -> Result<Vec<TaskPushNotificationConfig>, Error> {
        let task_id = at.id();
        Ok(self
            .stored(&at.run)
            .await
            .map_err(|e| internal(&e))?
            .into_iter()
            .map(|(_, s)| s.config)
            .filter(|c| c.task_id.as_deref() == Some(task_id.as_str()))
            .collect())
    }

    /// Withdraws a config; nothing more is sent to it. Withdrawing one
    /// that does not exist is not an error (the operation is idempotent).
    ///
    /// # Errors
    ///
    /// `Internal` when the journal fails.
    pub async fn delete(&self, at: &TaskRef, id: &str) -> Result<(), Error> {
        if self
            .list(at)
            .await?
            .iter()
            .any(|c| c.id.as_deref() == Some(id))
        {
            self.keep(&at.run, id, None)
                .await
                .map_err(|e| internal(&e))?;
        }
        Ok(())
    }

    fn spawn(&self, run: RunId, id: String) {
        let key = (run.clone(), id.clone());
        if !self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone())
        {
            return;
        }
        let pusher = self.clone();
        tokio::spawn(async move {
            let mut closing = pusher.closing.clone();
            tokio::select! {
                outcome = pusher.deliver(&run, &id) => {
                    if let Err(error) = outcome {
                        tracing::warn!(target: "spool::a2a", run_id = %run, config = %id, %error, "push delivery stopped; it resumes at the next start");
                    }
                }
                _ = closing.wait_for(|closing| *closing) => {}
            }
            pusher
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
        });
    }

    /// Delivers every change of the config's task not yet delivered, in
    /// order, until the task ends.
    async fn deliver(&self, run: &RunId, id: &str) -> Result<(), RuntimeError> {
        let current = |pusher: &Self| {
            let run = run.clone();
            let pusher = pusher.clone();
            let id = id.to_owned();
            async move {
                Ok::<_, RuntimeError>(
                    pusher
                        .stored(&run)
                        .await?
                        .into_iter()
                        .find(|(other, _)| *other == id)
                        .map(|(_, s)| s),
                )
            }
        };
        let Some(stored) = current(self).await? else {
            return Ok(());
        };
        if stored.done || stored.given_up.is_some() {
            return Ok(());
        }
        let Some(at) = stored.config.task_id.as_deref().and_then(TaskRef::parse) else {
            return Ok(());
        };
        let mut watch = match Watch::replaying(&self.runtime, at).await {
            Ok(watch) => watch,
            Err(_) => return Ok(()),
        };
        let delivered = stored.delivered.unwrap_or(0);
        loop {
            let Some((position, item)) = watch.next_at().await else {
                break;
            };
            let (Some(position), StreamResponse::StatusUpdate(update)) = (position, &item) else {
                continue;
            };
            if position.0 <= delivered && stored.delivered.is_some() {
                continue;
            }
            // Withdrawn meanwhile: nothing more is sent to it.
            let Some(mut now) = current(self).await? else {
                return Ok(());
            };
            let terminal = update.status.state.is_terminal();
            match self.post(&now.config, &item).await {
                Ok(()) => {
                    now.delivered = Some(position.0);
                    now.done = terminal;
                    self.keep(run, id, Some(&now)).await?;
                }
                Err(why) => {
                    tracing::warn!(target: "spool::a2a", run_id = %run, config = %id, %why, "a push receiver was given up on");
                    now.given_up = Some(why);
                    self.keep(run, id, Some(&now)).await?;
                    break;
                }
            }
            if terminal {
                break;
            }
        }
        self.unregister_if_idle(run).await
    }

    async fn unregister_if_idle(&self, run: &RunId) -> Result<(), RuntimeError> {
        let open = self
            .stored(run)
            .await?
            .iter()
            .any(|(_, s)| !s.done && s.given_up.is_none());
        if !open {
            self.register(run, false).await?;
        }
        Ok(())
    }

    /// POSTs `item` to the config's URL, trying [`ATTEMPTS`] times with
    /// backoff; the last failure's reason when every try failed.
    async fn post(
        &self,
        config: &TaskPushNotificationConfig,
        item: &StreamResponse,
    ) -> Result<(), String> {
        let body = serde_json::to_value(item).expect("A2A types are plain JSON");
        let mut headers = Vec::new();
        if let Some(token) = &config.token {
            headers.push((a2a::NOTIFICATION_TOKEN_HEADER, token.clone()));
        }
        if let Some(auth) = &config.authentication {
            let value = match &auth.credentials {
                Some(credentials) => format!("{} {credentials}", auth.scheme),
                None => auth.scheme.clone(),
            };
            headers.push(("authorization", value));
        }
        let mut wait = self.backoff;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            match client::post(&config.url, &headers, &body, self.reach, POST_TIMEOUT).await {
                Ok(status) if (200..300).contains(&status) => return Ok(()),
                Ok(status) => last = format!("{} answered {status}", config.url),
                Err(error) => {
                    last = error.to_string();
                    // An address it may not reach stays one.
                    if matches!(&error, client::ClientError::Private { .. }) {
                        break;
                    }
                }
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        }
        Err(format!("after {ATTEMPTS} tries: {last}"))
    }
}
