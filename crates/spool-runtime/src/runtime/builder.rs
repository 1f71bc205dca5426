//! `RuntimeBuilder`: what a runtime is made of, with the defaults an
//! embedder gets by saying nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use spool_journal::Journal;

use super::{Inner, Runtime};
use crate::engine::Engine;
use crate::hub::Hub;
use crate::runs::{DEFAULT_CACHED_RUNS, Runs};
use crate::storage::{Storage, Watched};
use crate::tool::{LiveTools, Tools};

/// Builds a runtime.
pub struct RuntimeBuilder {
    journal: Arc<dyn Journal>,
    engine: Arc<dyn Engine>,
    tools: LiveTools,
    system_prompt: Option<String>,
    budgets: crate::agent::Budgets,
    pricing: Option<crate::agent::Pricing>,
    ids: Arc<dyn crate::ids::IdSource>,
    cached_runs: usize,
    shared_journal: bool,
    limits: crate::agent::Limits,
    upgrade: spool_wire::run::Upgrade,
    definition: Option<(String, serde_json::Value)>,
    factory: Option<Arc<dyn crate::agents::AgentFactory>>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder").finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    pub(super) fn new(journal: Arc<dyn Journal>) -> Self {
        Self {
            journal,
            engine: Arc::new(crate::engines::EchoEngine),
            tools: LiveTools::new(Tools::builtin()),
            system_prompt: None,
            budgets: crate::agent::Budgets::default(),
            pricing: None,
            ids: Arc::new(crate::ids::UniqueIds),
            cached_runs: DEFAULT_CACHED_RUNS,
            shared_journal: false,
            limits: crate::agent::Limits::default(),
            upgrade: spool_wire::run::Upgrade::Pinned,
            definition: None,
            factory: None,
        }
    }

    /// The model engine (the echo engine by default).
    #[must_use]
    pub fn engine(mut self, engine: Arc<dyn Engine>) -> Self {
        self.engine = engine;
        self
    }

    /// The tools (the built-ins by default).
    #[must_use]
    pub fn tools(mut self, tools: Tools) -> Self {
        self.tools = LiveTools::new(tools);
        self
    }

    /// Tools that may be replaced while the runtime runs (see
    /// [`LiveTools`]), in place of [`RuntimeBuilder::tools`].
    #[must_use]
    pub fn live_tools(mut self, tools: LiveTools) -> Self {
        self.tools = tools;
        self
    }

    /// The system prompt.
    #[must_use]
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// The budgets checked before each model call (none by default).
    #[must_use]
    pub fn budgets(mut self, budgets: crate::agent::Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// What the engine's model costs, for the cost budget.
    #[must_use]
    pub fn pricing(mut self, pricing: crate::agent::Pricing) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// How many runs stay in memory between commands (1,024 by default):
    /// a cached run is answered and driven without reading its log; an
    /// evicted one has its log read once when it is next touched.
    #[must_use]
    pub fn cached_runs(mut self, runs: usize) -> Self {
        self.cached_runs = runs;
        self
    }

    /// Whether other processes append to this journal too (the nodes of a
    /// cluster): a cached run is then checked against its log, one read
    /// of what is past its head, before each use, so a run another node
    /// drives is never answered from an old copy. Off by default: a
    /// journal one process owns changes only through it.
    #[must_use]
    pub fn shared_journal(mut self, shared: bool) -> Self {
        self.shared_journal = shared;
        self
    }

    /// How large one run's history may grow (`[limits]`; the defaults of
    /// [`Limits`](crate::agent::Limits) otherwise).
    #[must_use]
    pub fn limits(mut self, limits: crate::agent::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What an agent definition says of the runtime: system prompt, tools,
    /// budgets, pricing, limits. Its engine spec is built by the crate that owns
    /// the engines (`spool_engines::build`) and set with
    /// [`RuntimeBuilder::engine`]; the echo engine stays until then.
    ///
    /// # Errors
    ///
    /// When the tools do not register.
    pub fn agent(
        mut self,
        loaded: &crate::agent::Loaded,
    ) -> Result<Self, crate::agent::DefinitionError> {
        let definition = &loaded.definition;
        self.system_prompt
            .clone_from(&definition.agent.system_prompt);
        self.tools = LiveTools::new(definition.tools(&loaded.base)?);
        self.budgets = definition.budgets;
        self.pricing = definition.pricing;
        self.limits = definition.limits;
        self.upgrade = definition.agent.upgrade;
        self.definition = Some((loaded.digest(), loaded.document.clone()));
        Ok(self)
    }

    /// The whole agent at once, built by the host (its engine and tools
    /// included), in place of what [`RuntimeBuilder::agent`],
    /// [`engine`](RuntimeBuilder::engine), [`tools`](RuntimeBuilder::tools)
    /// and the rest set.
    #[must_use]
    pub fn agent_spec(mut self, spec: crate::AgentSpec) -> Self {
        self.engine = spec.engine;
        self.tools = spec.tools;
        self.system_prompt = spec.system.map(|system| system.to_string());
        self.budgets = spec.budgets;
        self.pricing = spec.pricing;
        self.limits = spec.limits;
        self.upgrade = spec.upgrade;
        self.definition = spec.definition;
        self
    }

    /// Builds the agent of a definition runs started on when it is not
    /// the current one (after a reload, or a restart with a changed
    /// file): without a factory such runs run on the current agent.
    #[must_use]
    pub fn agent_factory(mut self, factory: Arc<dyn crate::AgentFactory>) -> Self {
        self.factory = Some(factory);
        self
    }

    /// Where run and turn ids come from (unique, time-ordered ids by
    /// default).
    #[must_use]
    pub fn ids(mut self, ids: Arc<dyn crate::ids::IdSource>) -> Self {
        self.ids = ids;
        self
    }

    /// The runtime, with nothing running yet: call [`Runtime::recover`].
    #[must_use]
    pub fn build(self) -> Runtime {
        let storage = Arc::new(Storage::default());
        let agent = crate::agents::AgentSpec {
            engine: self.engine,
            tools: self.tools,
            system: self.system_prompt.map(Arc::from),
            budgets: self.budgets,
            pricing: self.pricing,
            limits: self.limits,
            upgrade: self.upgrade,
            definition: self.definition,
        };
        let agents = Arc::new(crate::agents::Agents::new(agent.into(), self.factory));
        Runtime {
            inner: Arc::new_cyclic(|runtime| {
                storage.attach(runtime.clone());
                Inner {
                    journal: Arc::new(Watched {
                        journal: self.journal,
                        storage: Arc::clone(&storage),
                    }),
                    storage,
                    ids: self.ids,
                    hub: Hub::default(),
                    driving: Mutex::new(HashMap::new()),
                    runs: Runs::new(self.cached_runs, agents).shared(self.shared_journal),
                    sleeping: Mutex::new(HashSet::new()),
                    tasks: crate::tasks::Tasks::default(),
                    held: Mutex::default(),
                }
            }),
        }
    }
}
