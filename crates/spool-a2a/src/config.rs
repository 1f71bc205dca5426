//! `[a2a]` in `spool.toml`: how the agent describes itself on its A2A
//! agent card. Every key is optional; the card's name comes from
//! `[agent] name` when `[a2a]` gives none.
//!
//! ```toml
//! [a2a]
//! name = "reviewer"                      # default: [agent] name, else "spool"
//! description = "Reviews pull requests"  # default: one line saying what Spool is
//! version = "2.1.0"                      # the agent's own version (default: Spool's)
//! url = "https://agents.example.com"     # the public base URL (default: the request's Host)
//! documentation_url = "https://example.com/docs"
//! push_private_networks = false         # let push URLs reach loopback and private addresses
//!
//! [[a2a.skills]]                         # default: one skill, the agent itself
//! id = "review"
//! name = "Code review"
//! description = "Reads a diff and says what is wrong with it"
//! tags = ["code", "review"]
//! examples = ["Review https://example.com/pr/1"]
//!
//! [[a2a.peers]]                          # an A2A agent the `a2a_send` tool reaches
//! name = "translator"
//! url = "https://translate.example.com"  # where its agent card is (/.well-known/agent-card.json)
//! token_file = "translator.token"        # sent as `Authorization: Bearer …` (optional)
//! timeout_seconds = 300                  # one send's wait for the task to rest
//! ```

use serde::Deserialize;
use spool_runtime::agent::AgentDefinition;

/// The `[a2a]` table.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct A2aSection {
    /// The agent's name on its card.
    #[serde(default)]
    pub name: Option<String>,
    /// What the agent does.
    #[serde(default)]
    pub description: Option<String>,
    /// The agent's version.
    #[serde(default)]
    pub version: Option<String>,
    /// The public base URL (`https://host[:port]`) the card's interfaces
    /// are under; absent, the scheme and `Host` of the request for the
    /// card.
    #[serde(default)]
    pub url: Option<String>,
    /// Where the agent's documentation is.
    #[serde(default)]
    pub documentation_url: Option<String>,
    /// The skills the card lists.
    #[serde(default)]
    pub skills: Vec<SkillSection>,
    /// A2A agents this agent may send messages to (the `a2a_send` tool).
    #[serde(default)]
    pub peers: Vec<PeerSection>,
    /// Let push notification URLs reach loopback and private addresses
    /// (off by default: a client could otherwise make the server POST
    /// into the network it sits in).
    #[serde(default)]
    pub push_private_networks: bool,
}

/// One `[[a2a.peers]]` entry.
#[derive(Clone, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// The name the model uses for it.
    pub name: String,
    /// Its base URL: its card is at `URL/.well-known/agent-card.json`.
    pub url: String,
    /// A file (relative to the definition's directory) whose contents are
    /// sent as `Authorization: Bearer …`, read at each send.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// How long one send waits for the peer's task to rest.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
}

fn default_timeout() -> u64 {
    300
}

/// One `[[a2a.skills]]` entry.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillSection {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Words it is found by.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example prompts.
    #[serde(default)]
    pub examples: Vec<String>,
}

impl A2aSection {
    /// Reads `[a2a]`, refusing a key it does not know.
    ///
    /// # Errors
    ///
    /// What is wrong with the table, naming the key.
    pub fn from_definition(definition: &AgentDefinition) -> Result<Self, String> {
        let Some(table) = &definition.a2a else {
            return Ok(Self::default());
        };
        let section = Self::deserialize(toml::Value::Table(table.clone()))
            .map_err(|e| format!("[a2a]: {e}"))?;
        if let Some(url) = &section.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!(
                "[a2a] url must start with http:// or https://, not `{url}`"
            ));
        }
        for (n, peer) in section.peers.iter().enumerate() {
            if peer.name.is_empty() || section.peers[..n].iter().any(|p| p.name == peer.name) {
                return Err(format!(
                    "[[a2a.peers]] number {}: each peer needs a name of its own (`{}`)",
                    n + 1,
                    peer.name
                ));
            }
            if !(peer.url.starts_with("http://") || peer.url.starts_with("https://")) {
                return Err(format!(
                    "a2a peer `{}`: url must start with http:// or https://, not `{}`",
                    peer.name, peer.url
                ));
            }
            if peer.timeout_seconds == 0 {
                return Err(format!(
                    "a2a peer `{}`: timeout_seconds must be at least 1",
                    peer.name
                ));
            }
        }
        Ok(section)
    }
}

/// `[a2a]`'s JSON Schema, for `spool agent schema`.
#[must_use]
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(A2aSection)).unwrap_or_default()
}
