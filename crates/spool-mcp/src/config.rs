//! `[[mcp]]` in `spool.toml`: one MCP server whose tools the agent may
//! call, how to start it, which of its tools to offer, when a person must
//! approve a call first, and what a call may do to the world.
//!
//! ```toml
//! [[mcp]]
//! name = "notes"                       # letters, digits, `-`, `_`; the tools' prefix
//! command = ["python3", "server.py"]   # started with its stdin and stdout as the channel
//! env = { NOTES_DIR = "/srv/notes" }   # added to the inherited environment
//! cwd = "tools"                        # relative to the definition's directory
//! tools = ["search", "append"]         # offer only these (default: every tool)
//! approval = "destructive"             # never | always | destructive (default)
//! timeout_seconds = 60                 # one call's limit
//! effect = { append = "write" }        # per tool: overrides the server's hints
//!
//! [[mcp]]
//! name = "search"
//! url = "https://mcp.example.com/mcp"  # Streamable HTTP, instead of `command`
//! headers = { "X-Team" = "infra" }     # sent with every request
//! token_file = "search.token"          # its contents sent as `Authorization: Bearer …`
//! ```
//!
//! The runtime keeps each table as it came (`AgentDefinition::mcp`); this
//! module reads them and refuses a key it does not know, naming it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use spool_journal::event::Effect;
use spool_runtime::agent::AgentDefinition;

/// One `[[mcp]]` table.
#[derive(Clone, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpSection {
    /// The server's name: the prefix of its tools' names (`NAME__TOOL`).
    pub name: String,
    /// The program and its arguments, started with stdin and stdout as
    /// the MCP channel (stdio transport).
    #[serde(default)]
    pub command: Vec<String>,
    /// Variables added to the program's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The program's working directory, relative to the definition's.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// A Streamable HTTP server's URL (`http://` or `https://`), instead
    /// of `command`.
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent with every request to `url`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A file (relative to the definition's directory) whose contents, read
    /// at each connection, are sent as `Authorization: Bearer …` to `url`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The tools to offer, by the server's names; absent, all of them.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// When a person approves a call before it is sent.
    #[serde(default)]
    pub approval: Approval,
    /// One call's limit; past it the call is cancelled and fails.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// What a tool may do to the world, by the server's tool name: wins
    /// over the tool's own annotations.
    #[serde(default)]
    #[schemars(schema_with = "effects_schema")]
    pub effect: BTreeMap<String, Effect>,
}

/// When a person approves an MCP call before it is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Never: every call is sent as the model makes it.
    Never,
    /// Before every call.
    Always,
    /// Before a call to a tool that may change the world: one whose
    /// effect (the operator's `effect`, or else its annotations) is not
    /// `read`.
    #[default]
    Destructive,
}

fn default_timeout() -> f64 {
    60.0
}

fn effects_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "string", "enum": ["read", "idempotent", "write"]}
    })
}

/// Where a server's name may not go: it prefixes tool names, which every
/// provider limits to these characters, and `__` separates the two.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 32
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || name.contains("__")
    {
        return Err(format!(
            "`mcp.name` `{name}` must be 1 to 32 letters, digits, `-` or `_`, without `__`"
        ));
    }
    Ok(())
}

impl McpSection {
    /// Every `[[mcp]]` table of `definition`, read and checked.
    ///
    /// # Errors
    ///
    /// A message naming the table and what is wrong: an unknown key, two
    /// servers of one name, neither or both of `command` and `url`, a bad
    /// timeout.
    pub fn from_definition(definition: &AgentDefinition) -> Result<Vec<Self>, String> {
        let mut sections: Vec<Self> = Vec::new();
        for (index, table) in definition.mcp.iter().enumerate() {
            let section = Self::deserialize(toml::Value::Table(table.clone()))
                .map_err(|e| format!("[[mcp]] number {}: {e}", index + 1))?;
            check_name(&section.name)?;
            if sections.iter().any(|s| s.name == section.name) {
                return Err(format!("two [[mcp]] servers are named `{}`", section.name));
            }
            match (section.command.is_empty(), &section.url) {
                (false, None) => {
                    if !section.headers.is_empty() || section.token_file.is_some() {
                        return Err(format!(
                            "mcp server `{}`: `headers` and `token_file` are for a `url` server",
                            section.name
                        ));
                    }
                }
                (true, Some(url)) => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(format!(
                            "mcp server `{}`: `url` must start with http:// or https://, not `{url}`",
                            section.name
                        ));
                    }
                    for (name, value) in &section.headers {
                        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                            || http::HeaderValue::from_str(value).is_err()
                        {
                            return Err(format!(
                                "mcp server `{}`: header `{name}` is not a valid HTTP header",
                                section.name
                            ));
                        }
                    }
                    if !section.env.is_empty() || section.cwd.is_some() {
                        return Err(format!(
                            "mcp server `{}`: `env` and `cwd` are for a `command` server",
                            section.name
                        ));
                    }
                }
                (true, None) => {
                    return Err(format!(
                        "mcp server `{}` needs `command`, the program and its arguments",
                        section.name
                    ));
                }
                (false, Some(_)) => {
                    return Err(format!(
                        "mcp server `{}` has both `command` and `url`; give one",
                        section.name
                    ));
                }
            }
            if !(section.timeout_seconds.is_finite() && section.timeout_seconds > 0.0) {
                return Err(format!(
                    "mcp server `{}`: `timeout_seconds` must be a positive number",
                    section.name
                ));
            }
            sections.push(section);
        }
        Ok(sections)
    }
}

/// The JSON Schema of one `[[mcp]]` table, for `spool agent schema`.
#[must_use]
pub fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "items": schemars::schema_for!(McpSection)
    })
}
