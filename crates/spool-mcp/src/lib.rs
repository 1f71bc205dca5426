//! Spool and the Model Context Protocol, both ways: the tools of MCP
//! servers (`[[mcp]]` in `spool.toml`) offered to the agent as durable
//! Spool tools, and Spool's runs served to MCP hosts ([`serve`]).
//!
//! Each server is started over stdio with the official Rust SDK (`rmcp`),
//! its tools listed and named `SERVER__TOOL`. A call's effect comes from
//! the operator's `effect`, else the tool's annotations, else it is a
//! write: after a crash between a write's call and its result the call is
//! never sent again, and the run parks for reconciliation. A server that
//! exits is started again for the next call; one that changes its tool
//! list is listed again, for turns started from then on.
//!
//! ```no_run
//! # async fn demo(loaded: &spool_runtime::agent::Loaded) -> Result<(), String> {
//! let servers = spool_mcp::McpServers::from_definition(&loaded.definition, &loaded.base)?;
//! let live = servers.start(spool_runtime::Tools::builtin()).await;
//! // Give `live` to `RuntimeBuilder::live_tools`.
//! # let _ = live; Ok(()) }
//! ```
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod serve;
pub mod tool;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spool_runtime::agent::AgentDefinition;
use spool_runtime::{LiveTools, Tool, Tools};

pub use client::{Server, ServerError};
pub use config::{Approval, McpSection};
pub use tool::McpTool;

/// How long starting waits for the servers' first listing.
const STARTUP_WAIT: Duration = Duration::from_secs(10);

/// The longest wait between attempts to list a server that failed.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Every configured MCP server, and the tools each listed last.
#[derive(Debug, Clone)]
pub struct McpServers {
    servers: Vec<Arc<Server>>,
    listed: Arc<Mutex<Vec<Vec<Arc<McpTool>>>>>,
}

/// What one server offered when listed.
#[derive(Debug)]
pub struct Listing {
    /// The server.
    pub server: String,
    /// Its tools as the model sees them, or why it could not be listed.
    pub tools: Result<Vec<Arc<McpTool>>, ServerError>,
    /// Tools left out, each with why.
    pub skipped: Vec<String>,
}

impl McpServers {
    /// The servers `definition`'s `[[mcp]]` tables describe, none started.
    ///
    /// # Errors
    ///
    /// A message naming the table that does not read.
    pub fn from_definition(definition: &AgentDefinition, base: &Path) -> Result<Self, String> {
        let servers: Vec<Arc<Server>> = config::McpSection::from_definition(definition)?
            .into_iter()
            .map(|section| Arc::new(Server::new(section, base)))
            .collect();
        Ok(Self {
            listed: Arc::new(Mutex::new(vec![Vec::new(); servers.len()])),
            servers,
        })
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Starts and lists every server, at once.
    pub async fn list(&self) -> Vec<Listing> {
        let mut tasks = tokio::task::JoinSet::new();
        for (index, server) in self.servers.iter().enumerate() {
            let server = Arc::clone(server);
            tasks.spawn(async move { (index, listing(&server).await) });
        }
        let mut listings: Vec<Option<Listing>> = (0..self.servers.len()).map(|_| None).collect();
        while let Some(done) = tasks.join_next().await {
            if let Ok((index, listing)) = done {
                listings[index] = Some(listing);
            }
        }
        listings.into_iter().flatten().collect()
    }

    /// Starts and lists every server, and gives `base` with their tools as
    /// live tools: a server that changes its list, or that could not be
    /// listed now and is later, replaces the set for later turns. A server
    /// that cannot be listed is logged and tried again in the background.
    pub async fn start(&self, base: Tools) -> LiveTools {
        // A server slow to start (a package manager fetching it) does not
        // hold the others, or the first turn, for longer than this: it is
        // listed in the background and offered from then on.
        let listings = match tokio::time::timeout(STARTUP_WAIT, self.list()).await {
            Ok(listings) => listings,
            Err(_) => {
                tracing::warn!(
                    "the MCP servers were not all listed within {} s; they are listed in the background",
                    STARTUP_WAIT.as_secs()
                );
                Vec::new()
            }
        };
        let mut listed = vec![false; self.servers.len()];
        for listing in &listings {
            // Names are unique: the definition refuses two alike.
            if let Some(index) = self
                .servers
                .iter()
                .position(|s| s.section().name == listing.server)
            {
                self.note(index, listing);
                listed[index] = listing.tools.is_ok();
            }
        }
        let live = LiveTools::new(self.tools(&base));
        for (index, server) in self.servers.iter().enumerate() {
            let listed = listed[index];
            let this = self.clone();
            let server = Arc::clone(server);
            let base = base.clone();
            let live = live.clone();
            tokio::spawn(async move {
                this.watch(index, &server, listed, &base, &live).await;
            });
        }
        live
    }

    /// Stops every server.
    pub async fn stop(&self) {
        for server in &self.servers {
            server.stop().await;
        }
    }

    /// Keeps one server's tools current: lists it until it answers, then
    /// again each time it says its tools changed.
    async fn watch(
        &self,
        index: usize,
        server: &Arc<Server>,
        mut listed: bool,
        base: &Tools,
        live: &LiveTools,
    ) {
        let changed = server.changed();
        let mut wait = Duration::from_secs(1);
        loop {
            if listed {
                changed.notified().await;
            } else {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_RETRY);
            }
            let listing = listing(server).await;
            listed = listing.tools.is_ok();
            if listed {
                wait = Duration::from_secs(1);
                self.note(index, &listing);
                live.replace(self.tools(base));
                tracing::info!(server = %listing.server, "the MCP server's tools were listed again");
            }
        }
    }

    /// Keeps what a listing found, and logs what it did not.
    fn note(&self, index: usize, listing: &Listing) {
        for skipped in &listing.skipped {
            tracing::warn!(server = %listing.server, "{skipped}");
        }
        match &listing.tools {
            Ok(tools) => {
                self.listed.lock().unwrap_or_else(PoisonError::into_inner)[index] = tools.clone();
            }
            Err(error) => {
                tracing::warn!(%error, "an MCP server's tools are not offered until it answers")
            }
        }
    }

    /// `base` and every server's tools last listed; a name taken twice is
    /// offered once, the first, and logged.
    fn tools(&self, base: &Tools) -> Tools {
        let mut tools = base.clone();
        let listed = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        for tool in listed.iter().flatten() {
            if let Err(error) = tools.add(Arc::clone(tool) as Arc<dyn Tool>) {
                tracing::warn!(%error, "an MCP tool is not offered");
            }
        }
        tools
    }
}

/// Lists `server`'s tools, keeping those its `tools` allows and whose
/// input schema compiles.
async fn listing(server: &Arc<Server>) -> Listing {
    let section = server.section();
    let mut skipped = Vec::new();
    let tools = server.list_tools().await.map(|tools| {
        let mut kept: Vec<Arc<McpTool>> = Vec::new();
        for tool in &tools {
            if let Some(allowed) = &section.tools
                && !allowed.iter().any(|a| a == tool.name.as_ref())
            {
                continue;
            }
            let made = Arc::new(McpTool::new(Arc::clone(server), tool));
            let name = made.spec().name;
            if kept.iter().any(|k| k.spec().name == name) {
                skipped.push(format!(
                    "tool `{}` is left out: its name as the model sees it, `{name}`, is taken",
                    tool.name
                ));
                continue;
            }
            if let Err(error) = jsonschema::validator_for(&made.spec().input_schema) {
                skipped.push(format!(
                    "tool `{}` is left out: its input schema does not compile: {error}",
                    tool.name
                ));
                continue;
            }
            kept.push(made);
        }
        if let Some(allowed) = &section.tools {
            for name in allowed {
                if !tools.iter().any(|t| t.name.as_ref() == name.as_str()) {
                    skipped.push(format!(
                        "`tools` names `{name}`, which the server does not list"
                    ));
                }
            }
        }
        kept
    });
    Listing {
        server: section.name.clone(),
        tools,
        skipped,
    }
}
