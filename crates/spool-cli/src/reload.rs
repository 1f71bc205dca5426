//! Agents built from definitions while Spool runs: the one a process
//! starts with, the one a reload loads (`SIGHUP`, `POST
//! /spool/v1/agent/reload`), and the older ones runs still run on, built
//! again from the journal's copy (the runtime's [`AgentFactory`]).
//!
//! A reload changes what a run's turns run with: the engine and
//! `[provider]`, the system prompt, the tools (`[[tool]]`, `[[mcp]]`, the
//! built-ins), `[budgets]`, `[pricing]`, `[limits]`. The sections that
//! configure the server itself are read once, at its start, and a reload
//! that changes them says so.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use serde_json::Value;
use spool_runtime::agent::Loaded;
use spool_runtime::{AgentFactory, AgentSpec, BoxFuture, LiveTools, Runtime};

use crate::bus::BusArgs;
use crate::serve::{Agent, built, load_agent_as, tools_of};

/// The sections a reload does not apply: the server's listeners and
/// guard, its schedules and sweeper, its telemetry, its bus listener and
/// A2A card are set up once, at the start.
const RESTART_SECTIONS: &[&str] = &["server", "schedule", "retention", "telemetry", "bus", "a2a"];

/// Builds the runtime's agents from definitions, as `spool serve` (or a
/// one-shot command) was started: relative paths against the first
/// definition's directory, the bus flags applied to each `[bus]`.
pub(crate) struct Builder {
    base: PathBuf,
    instance: Option<String>,
    /// `spool serve`'s bus flags.
    bus: Option<BusArgs>,
    /// The MCP servers started, by the `[[mcp]]` tables that describe
    /// them: definitions with the same tables share their processes.
    mcp: Mutex<HashMap<String, spool_mcp::McpServers>>,
}

impl Builder {
    pub(crate) fn new(base: PathBuf, instance: Option<String>, bus: Option<BusArgs>) -> Arc<Self> {
        Arc::new(Self {
            base,
            instance,
            bus,
            mcp: Mutex::default(),
        })
    }

    /// The runtime's agent for `agent` (its engine built): its tools with
    /// those of its MCP servers, listed before the first turn (a server
    /// that does not answer yet is listed again in the background).
    pub(crate) async fn spec(&self, agent: &Agent) -> anyhow::Result<AgentSpec> {
        let tools = tools_of(&agent.loaded, agent.bus.as_ref())?;
        let live = if agent.loaded.definition.mcp.is_empty() {
            LiveTools::new(tools)
        } else {
            self.servers(&agent.loaded)?.start(tools).await
        };
        Ok(AgentSpec::from_loaded(
            &agent.loaded,
            Arc::clone(&agent.engine),
            live,
        ))
    }

    /// The MCP servers `loaded`'s `[[mcp]]` tables describe: the ones
    /// started for the same tables, or new ones.
    fn servers(&self, loaded: &Loaded) -> anyhow::Result<spool_mcp::McpServers> {
        let key = serde_json::to_string(&loaded.definition.mcp)?;
        let mut started = self.mcp.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(servers) = started.get(&key) {
            return Ok(servers.clone());
        }
        let servers = spool_mcp::McpServers::from_definition(&loaded.definition, &loaded.base)
            .map_err(anyhow::Error::msg)?;
        started.insert(key, servers.clone());
        Ok(servers)
    }

    /// The agent a kept definition describes, its engine built.
    fn agent_of(&self, document: &Value) -> anyhow::Result<Agent> {
        let loaded = Loaded::from_document(document, self.base.clone())?;
        let engine = &loaded.definition.agent.engine;
        let spec: spool_engines::Spec = engine
            .parse()
            .with_context(|| format!("engine `{engine}`"))?;
        let mut agent = built(loaded, &spec, self.instance.as_deref())?;
        if let Some(flags) = &self.bus {
            flags.apply(&mut agent.bus)?;
        }
        Ok(agent)
    }
}

impl AgentFactory for Builder {
    fn build<'a>(
        &'a self,
        _digest: &'a str,
        document: &'a Value,
    ) -> BoxFuture<'a, Result<AgentSpec, String>> {
        Box::pin(async move {
            let agent = self
                .agent_of(document)
                .map_err(|error| format!("{error:#}"))?;
            self.spec(&agent)
                .await
                .map_err(|error| format!("{error:#}"))
        })
    }
}

/// `spool serve`'s reload: the definition read again from where it was
/// read at the start, with the same command-line flags.
pub(crate) struct Reloader {
    path: Option<PathBuf>,
    model: Option<spool_engines::Spec>,
    instance: Option<String>,
    bus: BusArgs,
    runtime: Runtime,
    builder: Arc<Builder>,
    /// The definition loaded last; held across a reload, so two reloads
    /// at once apply one after the other.
    document: tokio::sync::Mutex<Value>,
}

impl Reloader {
    pub(crate) fn new(
        args: &crate::serve::ServeArgs,
        agent: &Agent,
        runtime: Runtime,
        builder: Arc<Builder>,
    ) -> Arc<Self> {
        Arc::new(Self {
            path: args.agent.clone(),
            model: args.model.clone(),
            instance: args.bus.instance().map(str::to_owned),
            bus: args.bus.clone(),
            runtime,
            builder,
            document: tokio::sync::Mutex::new(agent.loaded.document.clone()),
        })
    }

    /// Reads the definition again and, when it changed, makes it the one
    /// new runs start on.
    ///
    /// # Errors
    ///
    /// When the file cannot be read, does not parse, or names an engine
    /// or tools that cannot be built: the definition in use stays.
    pub(crate) async fn reload(&self) -> anyhow::Result<spool_wire::http::AgentReloaded> {
        let mut current = self.document.lock().await;
        let mut agent = load_agent_as(
            self.path.as_deref(),
            self.model.as_ref(),
            self.instance.as_deref(),
        )?;
        self.bus.apply(&mut agent.bus)?;
        let digest = agent.loaded.digest();
        let mut restart_required: Vec<String> = RESTART_SECTIONS
            .iter()
            .filter(|section| current.get(**section) != agent.loaded.document.get(**section))
            .map(|section| (*section).to_owned())
            .collect();
        // The name `/info` and the A2A card show is read at the start.
        let name = |document: &Value| {
            document
                .get("agent")
                .and_then(|agent| agent.get("name"))
                .cloned()
        };
        if name(&current) != name(&agent.loaded.document) {
            restart_required.push("agent.name".into());
        }
        let changed = self.runtime.agent_digest_now().as_deref() != Some(digest.as_str());
        let previous = if changed {
            let spec = self.builder.spec(&agent).await?;
            self.runtime.load_agent(spec)
        } else {
            None
        };
        current.clone_from(&agent.loaded.document);
        Ok(spool_wire::http::AgentReloaded {
            agent: digest,
            previous,
            changed,
            restart_required,
            in_memory: self.runtime.agents_in_memory(),
        })
    }

    /// [`Reloader::reload`], said to the operator.
    pub(crate) async fn reload_and_say(
        &self,
        cause: &str,
    ) -> Result<spool_wire::http::AgentReloaded, String> {
        match self.reload().await {
            Ok(reloaded) => {
                let line = if reloaded.changed {
                    format!(
                        "spool: {cause}: new runs start on agent {}; runs in flight keep theirs unless they follow upgrades",
                        reloaded.agent
                    )
                } else {
                    format!(
                        "spool: {cause}: the agent definition did not change ({})",
                        reloaded.agent
                    )
                };
                crate::serve::say(&line);
                if !reloaded.restart_required.is_empty() {
                    crate::serve::say(&format!(
                        "spool: {cause}: [{}] changed and takes effect at the next start",
                        reloaded.restart_required.join("], [")
                    ));
                }
                Ok(reloaded)
            }
            Err(error) => {
                let message = format!("{error:#}");
                crate::serve::say(&format!(
                    "spool: {cause}: refused, the agent definition in use stays: {message}"
                ));
                Err(message)
            }
        }
    }

    /// Reloads on each `SIGHUP` until the process ends.
    pub(crate) fn on_hangup(self: &Arc<Self>) -> anyhow::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).context("catching SIGHUP")?;
        let reloader = Arc::clone(self);
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let _ = reloader.reload_and_say("SIGHUP").await;
            }
        });
        Ok(())
    }

    /// The HTTP channel's `POST /agent/reload`.
    pub(crate) fn route(self: &Arc<Self>) -> spool_http::channel::Reload {
        let reloader = Arc::clone(self);
        Arc::new(move || {
            let reloader = Arc::clone(&reloader);
            Box::pin(async move { reloader.reload_and_say("POST /agent/reload").await })
        })
    }
}
