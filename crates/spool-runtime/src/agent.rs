//! The agent definition, `spool.toml`: the agent's name and system prompt,
//! its engine, which built-in tools are on, command tools, and budgets.
//!
//! ```toml
//! [agent]
//! name = "reviewer"
//! system_prompt = "You review deployment plans."
//! engine = "echo"                      # or "scripted:script.jsonl"
//! builtin_tools = ["ask_human", "request_approval", "sleep"]
//! upgrade = "pinned"                   # or "next_turn": runs on older definitions move here at their next turn
//!
//! [[tool]]
//! name = "deploy"
//! description = "Deploy to an environment."
//! command = ["./deploy.sh"]            # gets the input as JSON on stdin
//! effect = "write"                     # read | idempotent | write
//! timeout_seconds = 60
//! input_schema = { type = "object", properties = { env = { type = "string" } }, required = ["env"] }
//!
//! [budgets]
//! steps_per_turn = 20                  # model calls in one turn
//! tokens = 200000                      # input + output tokens of one turn
//! wall_seconds = 900                   # one turn's time from its start
//! cost_usd = 0.50                      # one turn's cost, priced below
//!
//! [pricing]                            # USD per million tokens of the engine's model
//! input_per_million = 3.0
//! output_per_million = 15.0
//!
//! [[schedule]]                         # a message sent on a cron expression
//! name = "standup"
//! cron = "0 9 * * MON-FRI"             # five fields, or six with seconds first
//! time_zone = "Europe/Paris"           # IANA name; UTC by default
//! text = "Summarize yesterday's deployments."
//! address = "standup"                  # the HTTP address's run; absent, a fresh run per firing
//! overlap = "skip"                     # skip | queue, while the last firing's turn runs
//! catch_up = "latest"                  # latest | skip, for occurrences missed while down
//!
//! [provider]                           # for `openai/…`, `anthropic/…`, `command:…` engines
//! base_url = "http://127.0.0.1:8080"   # else OPENAI_BASE_URL / ANTHROPIC_BASE_URL, else the vendor's
//! api_key_env = "MY_KEY"               # else OPENAI_API_KEY / ANTHROPIC_API_KEY
//! max_tokens = 4096                    # the answer's cap (Anthropic requires one)
//! request_timeout_seconds = 600        # the whole call, first byte to last
//! idle_timeout_seconds = 60            # the longest silence inside a streamed answer
//! max_retries = 4                      # 429, 5xx and resets, before the first byte
//!
//! [bus]                                # the bus v1 (seed 000); `spool-bus` reads it
//! instance = "reviewer"
//! peers = ["worker"]
//! delegate = true                      # the `delegate {instance, prompt}` tool
//!
//! [[mcp]]                              # an MCP server's tools; `spool-mcp` reads it
//! name = "notes"
//! command = ["uvx", "some-mcp-server"]
//!
//! [a2a]                                # the A2A agent card; `spool-a2a` reads it
//! description = "Reviews pull requests"
//!
//! [telemetry]                          # OTLP export; `spool-otel` reads it
//! endpoint = "http://127.0.0.1:4318"   # or the OTEL_EXPORTER_OTLP_* variables
//! ```
//!
//! Unknown keys are errors that name the key: a misspelt budget must not
//! silently mean "no budget".

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use spool_journal::event::Effect;

use crate::tool::Tools;
use crate::tools::command::CommandTool;

/// The file looked for when no path is given.
pub const DEFAULT_FILE: &str = "spool.toml";

/// A parsed agent definition.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// The agent itself.
    #[serde(default)]
    pub agent: AgentSection,
    /// Command tools.
    #[serde(default, rename = "tool")]
    pub tools: Vec<CommandToolDefinition>,
    /// Budgets, checked before each model call.
    #[serde(default)]
    pub budgets: Budgets,
    /// What the engine's model costs, for the cost budget.
    #[serde(default)]
    pub pricing: Option<Pricing>,
    /// `[provider]`: how a provider engine reaches its model. The runtime
    /// does not read it: the crate that builds engines (`spool-engines`)
    /// does, and refuses a key it does not know.
    #[serde(default)]
    #[schemars(schema_with = "any_table")]
    pub provider: toml::Table,
    /// `[limits]`: how large one run's history may grow.
    #[serde(default)]
    pub limits: Limits,
    /// `[retention]`: how long runs that ended are kept; absent, for ever.
    #[serde(default)]
    pub retention: crate::retention::Retention,
    /// Messages sent on a cron expression (`[[schedule]]`).
    #[serde(default, rename = "schedule")]
    pub schedules: Vec<crate::schedule::ScheduleDefinition>,
    /// `[bus]`: this instance on the bus (seed 000), and the `delegate`
    /// tool. The runtime does not read it: `spool-bus` does, and refuses a
    /// key it does not know.
    #[serde(default)]
    #[schemars(schema_with = "any_table")]
    pub bus: Option<toml::Table>,
    /// `[telemetry]`: where traces, logs and metrics go (OTLP). The
    /// runtime does not read it: `spool-otel` does, and refuses a key it
    /// does not know.
    #[serde(default)]
    #[schemars(schema_with = "any_table")]
    pub telemetry: Option<toml::Table>,
    /// `[[mcp]]`: MCP servers whose tools the agent may call. The runtime
    /// does not read them: `spool-mcp` does, and refuses a key it does not
    /// know.
    #[serde(default)]
    #[schemars(schema_with = "any_tables")]
    pub mcp: Vec<toml::Table>,
    /// `[a2a]`: how the agent describes itself to A2A clients (its agent
    /// card). The runtime does not read it: `spool-a2a` does, and refuses
    /// a key it does not know.
    #[serde(default)]
    #[schemars(schema_with = "any_table")]
    pub a2a: Option<toml::Table>,
    /// `[server]`: what the network transports serve to browsers (allowed
    /// origins and host names). The runtime does not read it: `spool-http`
    /// does, and refuses a key it does not know.
    #[serde(default)]
    #[schemars(schema_with = "any_table")]
    pub server: Option<toml::Table>,
}

/// `[pricing]`: USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// Per million input tokens.
    pub input_per_million: f64,
    /// Per million output tokens.
    pub output_per_million: f64,
}

impl Pricing {
    /// The cost of `usage` in micro-dollars, rounded up: budgets compare
    /// integers, so a recorded crossing is exact.
    #[must_use]
    pub fn micro_usd(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        // Per million tokens in USD is per token in micro-USD.
        let cost = input_tokens as f64 * self.input_per_million
            + output_tokens as f64 * self.output_per_million;
        cost.ceil().max(0.0) as u64
    }
}

/// `[agent]`.
#[derive(Clone, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The agent's name, shown by `/info`.
    #[serde(default)]
    pub name: Option<String>,
    /// The system prompt.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// The engine spec: `echo`, `scripted:<file>`, or a provider
    /// (`openai/<model>`, `anthropic/<model>`, `command:<argv>`), which the
    /// `spool-engines` crate builds.
    #[serde(default = "echo")]
    pub engine: String,
    /// The built-in tools that are on; all of them when absent.
    #[serde(default)]
    pub builtin_tools: Option<Vec<String>>,
    /// Whether runs started on an earlier definition move to this one at
    /// their next turn (`next_turn`) or keep theirs (`pinned`, the
    /// default) when this definition is loaded in their place (a reload,
    /// or a restart with a changed file). A run created with its own
    /// `upgrade` follows that instead.
    #[serde(default = "pinned")]
    #[schemars(schema_with = "upgrade_schema")]
    pub upgrade: spool_wire::run::Upgrade,
}

/// `[provider]` as the runtime sees it: a table another crate reads (the
/// full file's schema fills it in: `spool_engines::agent_schema`).
fn any_table(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object"})
}

fn any_tables(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "object"}})
}

/// `effect`'s three words.
fn effect_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": ["read", "idempotent", "write"]})
}

/// `upgrade`'s two words.
fn upgrade_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": ["pinned", "next_turn"]})
}

fn pinned() -> spool_wire::run::Upgrade {
    spool_wire::run::Upgrade::Pinned
}

fn echo() -> String {
    "echo".to_owned()
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            name: None,
            system_prompt: None,
            engine: echo(),
            builtin_tools: None,
            upgrade: pinned(),
        }
    }
}

/// `[[tool]]`: a tool run as a child process.
#[derive(Clone, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandToolDefinition {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The program and its arguments. A relative program path with a `/` is
    /// taken from the definition file's directory.
    pub command: Vec<String>,
    /// What it may do to the world.
    #[schemars(schema_with = "effect_schema")]
    pub effect: Effect,
    /// How long one call may take.
    #[serde(default = "sixty")]
    pub timeout_seconds: f64,
    /// The JSON Schema of its input.
    #[serde(default = "any_object")]
    pub input_schema: Value,
    /// How many times a failed call is tried in all (never more than once
    /// for a `write`).
    #[serde(default = "one")]
    pub attempts: u32,
    /// For `idempotent` tools: the JSON Pointer into the input of the
    /// idempotency key (`/order_id`).
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

fn sixty() -> f64 {
    60.0
}

fn any_object() -> Value {
    json!({"type": "object"})
}

fn one() -> u32 {
    1
}

/// `[budgets]`. Each is off when absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    /// Model calls in one turn.
    #[serde(default)]
    pub steps_per_turn: Option<u64>,
    /// Input and output tokens of one turn.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// One turn's time, from its start, in seconds.
    #[serde(default)]
    pub wall_seconds: Option<u64>,
    /// One turn's cost in USD, priced by `[pricing]`.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

impl Budgets {
    /// The cost budget in micro-dollars, as recorded.
    #[must_use]
    pub fn cost_micro_usd(&self) -> Option<u64> {
        self.cost_usd.map(|usd| (usd * 1e6).round().max(0.0) as u64)
    }
}

/// `[limits]`: how large one run's history may grow. Past `warn_at` of
/// either limit the run's listing row says `near_limit` and a log line
/// names the run; past a limit, new input to the run (a message, a
/// steer, a queued turn) is refused with `run_too_large`. The journal
/// keeps every event of a run for as long as the run lives, so a run
/// that talks for ever grows for ever: these bound what one run costs to
/// load, replay and store.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// The most events one run holds (100 000 by default).
    pub max_events: u64,
    /// The most bytes of journal one run holds, as its events are stored
    /// (64 MiB by default).
    pub max_bytes: u64,
    /// The share of either limit past which the run is said to be near
    /// it (0.8 by default).
    pub warn_at: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_events: 100_000,
            max_bytes: 64 << 20,
            warn_at: 0.8,
        }
    }
}

impl Limits {
    /// Whether a run of `events` events and `bytes` bytes is past a limit.
    #[must_use]
    pub fn exceeded(&self, events: u64, bytes: u64) -> bool {
        events >= self.max_events || bytes >= self.max_bytes
    }

    /// Whether it is past `warn_at` of a limit.
    #[must_use]
    pub fn near(&self, events: u64, bytes: u64) -> bool {
        let share = |used: u64, limit: u64| used as f64 >= self.warn_at * limit as f64;
        share(events, self.max_events) || share(bytes, self.max_bytes)
    }
}

/// A definition that does not load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The file named could not be read.
    #[error("reading the agent definition {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid definition; the error names the key.
    #[error("the agent definition {path} is invalid: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        source: DefinitionError,
    },
}

/// Why a definition's text is not a valid definition.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// Not TOML, or a key of the wrong type or unknown: the message names
    /// the key and its line.
    #[error("{}", .0.to_string().trim())]
    Syntax(#[from] toml::de::Error),
    /// A rule the keys break together (a cost budget without prices).
    #[error("{0}")]
    Rule(String),
    /// A tool does not register (two tools share a name, a schema does not
    /// compile).
    #[error(transparent)]
    Tool(#[from] crate::tool::ToolRegistrationError),
}

/// A definition, where it came from, and a note for the operator.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The definition.
    pub definition: AgentDefinition,
    /// The directory relative paths resolve against.
    pub base: PathBuf,
    /// Said to the operator, when worth saying (the built-in default in use).
    pub note: Option<String>,
    /// The definition as its file says it, as JSON (`{}` for the
    /// built-in default), with what the command line replaced in it
    /// ([`Loaded::set_engine`]): what [`Loaded::digest`] digests, and what
    /// the journal keeps once per digest.
    pub document: serde_json::Value,
}

/// The address namespace of the journal's records of agent definitions:
/// one run per digest, holding the definition (see
/// [`Runtime::definition`](crate::Runtime::definition)).
pub const DEFINITION_NAMESPACE: &str = "spool.agent";

impl Loaded {
    /// The definition's digest, `sha256:` and 64 hex digits of its
    /// canonical JSON (RFC 8785): the same for the same settings, however
    /// the file is laid out or commented.
    #[must_use]
    pub fn digest(&self) -> String {
        spool_wire::canonical::content_hash(&self.document)
    }

    /// A definition kept by the journal (its [`Loaded::document`]), read
    /// back: what runs started on it are driven with after a reload or a
    /// restart. Relative paths resolve against `base`.
    ///
    /// # Errors
    ///
    /// When the document is no longer a valid definition (a newer Spool
    /// refuses a key an older one took).
    pub fn from_document(
        document: &serde_json::Value,
        base: PathBuf,
    ) -> Result<Self, DefinitionError> {
        let definition = AgentDefinition::deserialize(document)
            .map_err(|error| DefinitionError::Rule(error.to_string()))?;
        definition.check().map_err(DefinitionError::Rule)?;
        Ok(Self {
            definition,
            base,
            note: None,
            document: document.clone(),
        })
    }

    /// Runs the definition with `engine` (`--model`), in the definition
    /// and in what its digest covers.
    pub fn set_engine(&mut self, engine: String) {
        if let serde_json::Value::Object(document) = &mut self.document {
            let agent = document
                .entry("agent")
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let serde_json::Value::Object(agent) = agent {
                agent.insert("engine".into(), serde_json::Value::String(engine.clone()));
            }
        }
        self.definition.agent.engine = engine;
    }
}

impl AgentDefinition {
    /// Loads `path`, or `spool.toml` in the current directory when no path
    /// is given. A missing default file is not an error: the built-in
    /// default (the echo engine and the built-in tools) is used, and the
    /// note says so. A missing named file is an error.
    ///
    /// # Errors
    ///
    /// [`AgentError::Read`] for a named file that cannot be read;
    /// [`AgentError::Invalid`] for one that does not parse.
    pub fn load(path: Option<&Path>) -> Result<Loaded, AgentError> {
        let (path, named) = match path {
            Some(path) => (path.to_owned(), true),
            None => (PathBuf::from(DEFAULT_FILE), false),
        };
        let base = path.parent().map(Path::to_owned).unwrap_or_default();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(source) if !named && source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    definition: Self::default(),
                    base,
                    note: Some(format!(
                        "no {DEFAULT_FILE} here: using the built-in agent (the echo engine and the built-in tools)"
                    )),
                    document: serde_json::Value::Object(serde_json::Map::new()),
                });
            }
            Err(source) => return Err(AgentError::Read { path, source }),
        };
        let definition = Self::from_toml(&text).map_err(|source| AgentError::Invalid {
            path: path.clone(),
            source,
        })?;
        // It parsed as a definition, so it parses as a table.
        let document = toml::from_str::<toml::Table>(&text)
            .ok()
            .and_then(|table| serde_json::to_value(table).ok())
            .unwrap_or_default();
        Ok(Loaded {
            definition,
            base,
            note: None,
            document,
        })
    }

    /// Parses a definition.
    ///
    /// # Errors
    ///
    /// A message naming the key (and line) that is wrong.
    pub fn from_toml(text: &str) -> Result<Self, DefinitionError> {
        let definition: Self = toml::from_str(text)?;
        definition.check().map_err(DefinitionError::Rule)?;
        Ok(definition)
    }

    fn check(&self) -> Result<(), String> {
        crate::schedule::check(&self.schedules).map_err(|e| e.to_string())?;
        self.retention.check()?;
        if let Some(cost) = self.budgets.cost_usd {
            if !(cost.is_finite() && cost > 0.0) {
                return Err("`budgets.cost_usd` must be a positive number".into());
            }
            if self.pricing.is_none() {
                return Err("`budgets.cost_usd` needs a `[pricing]` table to price tokens".into());
            }
        }
        if let Some(pricing) = &self.pricing
            && !(pricing.input_per_million >= 0.0 && pricing.output_per_million >= 0.0)
        {
            return Err("`pricing` rates must be zero or more".into());
        }
        for tool in &self.tools {
            if tool.command.is_empty() {
                return Err(format!(
                    "tool `{}`: `command` needs at least the program",
                    tool.name
                ));
            }
            if !(tool.timeout_seconds > 0.0 && tool.timeout_seconds.is_finite()) {
                return Err(format!(
                    "tool `{}`: `timeout_seconds` must be a positive number",
                    tool.name
                ));
            }
            if tool.idempotency_key.is_some() && tool.effect != Effect::Idempotent {
                return Err(format!(
                    "tool `{}`: `idempotency_key` is for `idempotent` tools",
                    tool.name
                ));
            }
        }
        if let Some(enabled) = &self.agent.builtin_tools {
            let known: Vec<String> = crate::tools::builtin()
                .iter()
                .map(|t| t.spec().name)
                .collect();
            if let Some(unknown) = enabled.iter().find(|name| !known.contains(name)) {
                return Err(format!(
                    "`agent.builtin_tools` names `{unknown}`; the built-in tools are {}",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// The agent's tools: the built-ins that are on, and the command tools.
    ///
    /// # Errors
    ///
    /// When two tools share a name or a schema does not compile.
    pub fn tools(&self, base: &Path) -> Result<Tools, DefinitionError> {
        let mut tools = Tools::new();
        for tool in crate::tools::builtin() {
            let on = self
                .agent
                .builtin_tools
                .as_ref()
                .is_none_or(|enabled| enabled.contains(&tool.spec().name));
            if on {
                tools.add_builtin(tool);
            }
        }
        for definition in &self.tools {
            tools.add(Arc::new(CommandTool::new(definition.clone(), base)?))?;
        }
        Ok(tools)
    }
}
