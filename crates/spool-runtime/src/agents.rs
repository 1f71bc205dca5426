//! The agents runs run on, one per definition: its engine, tools, system
//! prompt, budgets, pricing and limits. A run runs on the definition it
//! was created with (`run_created.agent`), or the last it moved to
//! (`agent_changed`), whatever the server loaded since: a reload gives new
//! runs the new definition and leaves runs in flight on theirs, unless an
//! `upgrade = "next_turn"` moves them when their next turn starts.
//!
//! The runtime holds its current agent, and the others only while a run in
//! memory holds them: a definition no cached run uses is dropped, and
//! built again from the journal's copy (through the [`AgentFactory`] the
//! host gave) when a run that needs it is next read, after a restart as
//! after an eviction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use serde_json::Value;
use spool_journal::{Envelope, Event, Journal, JournalError};
use spool_wire::run::Upgrade;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::agent::{Budgets, Limits, Loaded, Pricing};
use crate::engine::{CallContext, Deltas, Engine, EngineError, ModelRequest, ModelResponse};
use crate::tool::LiveTools;

/// What a run's turns run with: an agent definition made runnable. Built
/// by the host ([`AgentSpec::from_loaded`]), handed to
/// [`RuntimeBuilder::agent_spec`](crate::RuntimeBuilder::agent_spec),
/// [`Runtime::load_agent`](crate::Runtime::load_agent) or returned by an
/// [`AgentFactory`].
pub struct AgentSpec {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) tools: LiveTools,
    pub(crate) system: Option<Arc<str>>,
    pub(crate) budgets: Budgets,
    pub(crate) pricing: Option<Pricing>,
    pub(crate) limits: Limits,
    pub(crate) upgrade: Upgrade,
    pub(crate) definition: Option<(String, Value)>,
}

impl std::fmt::Debug for AgentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSpec")
            .field(
                "digest",
                &self.definition.as_ref().map(|(digest, _)| digest),
            )
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl AgentSpec {
    /// An agent of `engine` and `tools` with no definition behind it (an
    /// embedder's): no prompt, budgets or pricing, the default limits,
    /// pinned. Runs record no digest for it.
    #[must_use]
    pub fn new(engine: Arc<dyn Engine>, tools: LiveTools) -> Self {
        Self {
            engine,
            tools,
            system: None,
            budgets: Budgets::default(),
            pricing: None,
            limits: Limits::default(),
            upgrade: Upgrade::Pinned,
            definition: None,
        }
    }

    /// The agent `loaded` defines, with its engine and tools built by the
    /// host (the engines and MCP servers are other crates'): the system
    /// prompt, budgets, pricing, limits and upgrade policy are the
    /// definition's, and runs record its digest.
    #[must_use]
    pub fn from_loaded(loaded: &Loaded, engine: Arc<dyn Engine>, tools: LiveTools) -> Self {
        let definition = &loaded.definition;
        Self {
            engine,
            tools,
            system: definition.agent.system_prompt.as_deref().map(Arc::from),
            budgets: definition.budgets,
            pricing: definition.pricing,
            limits: definition.limits,
            upgrade: definition.agent.upgrade,
            definition: Some((loaded.digest(), loaded.document.clone())),
        }
    }

    /// The digest runs record, when the agent has a definition.
    #[must_use]
    pub fn digest(&self) -> Option<&str> {
        self.definition.as_ref().map(|(digest, _)| digest.as_str())
    }
}

/// Builds the agent of a definition the journal keeps, for a run that
/// started on it when the runtime runs another: what lets a run parked
/// for a week resume with the tools it was started with after the file
/// changed. The host implements it, as it builds engines and tools.
pub trait AgentFactory: Send + Sync + 'static {
    /// The agent of `document`, whose digest is `digest`.
    ///
    /// # Errors
    ///
    /// Why it cannot be built (a key this release refuses, an engine
    /// whose credentials are gone): the run's turns then fail with it.
    fn build<'a>(
        &'a self,
        digest: &'a str,
        document: &'a Value,
    ) -> BoxFuture<'a, Result<AgentSpec, String>>;
}

/// One agent in memory: the host's spec, and whether the journal keeps
/// its definition yet (once per process).
pub(crate) struct Agent {
    spec: AgentSpec,
    kept: tokio::sync::OnceCell<()>,
}

impl std::ops::Deref for Agent {
    type Target = AgentSpec;

    fn deref(&self) -> &AgentSpec {
        &self.spec
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.spec.fmt(f)
    }
}

impl From<AgentSpec> for Agent {
    fn from(spec: AgentSpec) -> Self {
        Self {
            spec,
            kept: tokio::sync::OnceCell::new(),
        }
    }
}

impl Agent {
    /// The digest runs record for it.
    pub(crate) fn digest(&self) -> Option<&str> {
        self.spec.digest()
    }

    /// The agent of a definition that cannot be built: its runs can be
    /// read, answered and deleted, and every model call fails saying why.
    fn unavailable(digest: &str, reason: String) -> Self {
        let mut spec = AgentSpec::new(
            Arc::new(Unavailable {
                digest: digest.to_owned(),
                reason,
            }),
            LiveTools::default(),
        );
        // Named by the digest its runs name; never current, so its
        // document is never kept.
        spec.definition = Some((digest.to_owned(), Value::Null));
        spec.into()
    }
}

/// The engine of an agent whose definition cannot be built.
struct Unavailable {
    digest: String,
    reason: String,
}

impl Engine for Unavailable {
    fn call<'a>(
        &'a self,
        _: &'a CallContext,
        _: &'a ModelRequest,
        _: Deltas<'a>,
        _: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ModelResponse, EngineError>> {
        let message = format!(
            "the agent definition {} this run runs on cannot be built: {} (`spool agent diff {} spool.toml` shows what changed since)",
            self.digest, self.reason, self.digest
        );
        Box::pin(async move { Err(EngineError::Provider(message)) })
    }
}

/// The current agent, and the others runs in memory hold.
pub(crate) struct Agents {
    current: RwLock<Arc<Agent>>,
    /// Every agent built, by digest, while something holds it.
    loaded: Mutex<HashMap<String, Weak<Agent>>>,
    factory: Option<Arc<dyn AgentFactory>>,
    /// One build at a time: two runs read at once on the same old
    /// definition build it once.
    building: tokio::sync::Mutex<()>,
}

impl Agents {
    pub(crate) fn new(current: Agent, factory: Option<Arc<dyn AgentFactory>>) -> Self {
        let current = Arc::new(current);
        let agents = Self {
            current: RwLock::new(Arc::clone(&current)),
            loaded: Mutex::default(),
            factory,
            building: tokio::sync::Mutex::new(()),
        };
        agents.remember(&current);
        agents
    }

    /// The agent new runs get.
    pub(crate) fn current(&self) -> Arc<Agent> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// [`Agents::current`], once the journal keeps its definition: the
    /// first run or move to it keeps it (a write the journal makes once
    /// per digest), the rest only name it.
    pub(crate) async fn current_kept(
        &self,
        journal: &dyn Journal,
    ) -> Result<Arc<Agent>, JournalError> {
        let agent = self.current();
        if let Some((digest, document)) = &agent.definition {
            agent
                .kept
                .get_or_try_init(|| journal.keep_definition(digest, document))
                .await?;
        }
        Ok(agent)
    }

    /// Makes `agent` the one new runs get; the digest it replaces.
    pub(crate) fn replace(&self, agent: Agent) -> Option<String> {
        let agent = Arc::new(agent);
        self.remember(&agent);
        let previous = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(PoisonError::into_inner),
            agent,
        );
        previous.digest().map(str::to_owned)
    }

    /// The digests of the agents in memory, the current one first.
    pub(crate) fn in_memory(&self) -> Vec<String> {
        let current = self.current().digest().map(str::to_owned);
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        loaded.retain(|_, agent| agent.strong_count() > 0);
        let mut digests: Vec<String> = loaded
            .keys()
            .filter(|digest| Some(*digest) != current.as_ref())
            .cloned()
            .collect();
        digests.sort_unstable();
        digests.splice(0..0, current);
        digests
    }

    fn remember(&self, agent: &Arc<Agent>) {
        if let Some(digest) = agent.digest() {
            let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
            loaded.retain(|_, agent| agent.strong_count() > 0);
            loaded.insert(digest.to_owned(), Arc::downgrade(agent));
        }
    }

    fn in_memory_as(&self, digest: &str) -> Option<Arc<Agent>> {
        let current = self.current();
        if current.digest() == Some(digest) {
            return Some(current);
        }
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(digest)
            .and_then(Weak::upgrade)
    }

    /// The agent of `digest`: in memory, or built from the journal's copy
    /// of its definition. Without a factory (an embedder that runs one
    /// agent) the current agent stands in; a definition that cannot be
    /// built gives an agent whose model calls fail saying why.
    ///
    /// # Errors
    ///
    /// When the journal cannot be read.
    pub(crate) async fn resolve(
        &self,
        journal: &dyn Journal,
        digest: &str,
    ) -> Result<Arc<Agent>, JournalError> {
        if let Some(agent) = self.in_memory_as(digest) {
            return Ok(agent);
        }
        let Some(factory) = &self.factory else {
            return Ok(self.current());
        };
        let _one = self.building.lock().await;
        if let Some(agent) = self.in_memory_as(digest) {
            return Ok(agent);
        }
        let agent = match journal.definition(digest).await? {
            None => Agent::unavailable(digest, "the journal does not keep it".into()),
            Some(document) => match factory.build(digest, &document).await {
                Ok(mut spec) => {
                    // The run names this digest, whatever the host's
                    // rebuilt document would hash to.
                    spec.definition = Some((digest.to_owned(), document));
                    Agent::from(spec)
                }
                Err(reason) => {
                    tracing::error!(agent = %digest, %reason, "an agent definition runs still use cannot be built; their model calls fail");
                    Agent::unavailable(digest, reason)
                }
            },
        };
        let agent = Arc::new(agent);
        self.remember(&agent);
        Ok(agent)
    }

    /// Every agent `events` name (a run's creation, a move), resolved and
    /// held while they are folded.
    pub(crate) async fn named<'e>(
        &self,
        journal: &dyn Journal,
        events: impl Iterator<Item = &'e Event>,
    ) -> Result<Named, JournalError> {
        let mut named = Named::default();
        for event in events {
            let digest = match event {
                Event::RunCreated(created) => created.agent.as_deref(),
                Event::AgentChanged(changed) => Some(changed.to.as_str()),
                _ => None,
            };
            if let Some(digest) = digest
                && named.get(digest).is_none()
            {
                let agent = self.resolve(journal, digest).await?;
                named.0.push((digest.to_owned(), agent));
            }
        }
        Ok(named)
    }
}

/// The agents some events name, by the digest they name (an agent that
/// stands in for another keeps its own).
#[derive(Default)]
pub(crate) struct Named(Vec<(String, Arc<Agent>)>);

impl Named {
    /// The agent `digest` names.
    pub(crate) fn get(&self, digest: &str) -> Option<&Arc<Agent>> {
        self.0
            .iter()
            .find(|(named, _)| named == digest)
            .map(|(_, agent)| agent)
    }
}

/// The events of `envelopes`, for [`Agents::named`].
pub(crate) fn events(envelopes: &[Envelope]) -> impl Iterator<Item = &Event> {
    envelopes.iter().map(|envelope| &envelope.event)
}
