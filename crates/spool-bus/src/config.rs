//! `[bus]` in `spool.toml`: this instance's name on the bus, where it
//! listens, who may delegate to it (and whom its `delegate` tool may
//! delegate to), the depth limit, the secret, the registry, and a USD
//! budget across every turn delegated here.
//!
//! ```toml
//! [bus]
//! instance = "reviewer"          # this instance's name on the bus
//! listen = "127.0.0.1:7700"      # serve the bus here (loopback only); absent: do not serve
//! peers = ["worker"]             # "*" or true: any; false, [] or absent: the bus is off
//! max_depth = 3                  # delegations this many hops deep are refused
//! secret_file = "bus.secret"     # 0600; absent: made and kept in JOURNAL/bus.secret
//! registry = "/run/user/1000/spool/bus-registry.json"   # default: $XDG_RUNTIME_DIR/spool/
//! budget_usd = 5.0               # every delegated turn's cost together; needs [pricing] and budgets.cost_usd
//! delegate = true                # the `delegate` tool is on
//! timeout_seconds = 60           # one delegation's wait for its answer
//! attempts = 3                   # tries of a retryable failure, under one delegation id
//! ```
//!
//! The runtime keeps the table as it came
//! (`AgentDefinition::bus`); this module reads it and refuses a key it does
//! not know, naming it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use spool_runtime::agent::AgentDefinition;
use spool_wire::bus::DEFAULT_MAX_DEPTH;

/// `[bus]`.
#[derive(Clone, Debug, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BusSection {
    /// This instance's name on the bus.
    pub instance: String,
    /// The loopback address to serve the bus on; absent, the bus is not
    /// served (the `delegate` tool may still delegate elsewhere).
    #[serde(default)]
    pub listen: Option<String>,
    /// Who may delegate here, and whom `delegate` may delegate to: a list
    /// of names, `"*"` or `true` for any, `false` or `[]` for none (the
    /// bus is then off).
    #[serde(default, deserialize_with = "peers")]
    #[schemars(schema_with = "peers_schema")]
    pub peers: Vec<String>,
    /// Delegations arriving this many hops deep are refused, and the
    /// `delegate` tool does not send one that deep.
    #[serde(default = "max_depth")]
    pub max_depth: u64,
    /// The bus secret's file (0600), relative to the definition's
    /// directory; absent, one is made and kept beside the journal.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The registry file instances find each other in.
    #[serde(default)]
    pub registry: Option<PathBuf>,
    /// A cap, in USD, on what every turn delegated here costs together
    /// (priced by `[pricing]`). Each delegated turn reserves
    /// `budgets.cost_usd` before it starts, so concurrent delegations
    /// cannot overshoot it together.
    #[serde(default)]
    pub budget_usd: Option<f64>,
    /// Whether the agent has the `delegate` tool.
    #[serde(default)]
    pub delegate: bool,
    /// How long one delegation waits for its answer, in seconds.
    #[serde(default = "sixty")]
    pub timeout_seconds: f64,
    /// Attempts in all for a delegation whose failure is retryable, each
    /// under the same delegation id.
    #[serde(default = "three")]
    pub attempts: u32,
}

fn max_depth() -> u64 {
    DEFAULT_MAX_DEPTH
}

fn sixty() -> f64 {
    60.0
}

fn three() -> u32 {
    3
}

/// `peers` as the seed's reference reads it: a list, `"*"`, `true` or
/// `false`; `"*"` anywhere admits anyone.
fn peers<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Peers {
        All(bool),
        Star(String),
        Named(Vec<String>),
    }
    Ok(match Peers::deserialize(deserializer)? {
        Peers::All(true) => vec!["*".to_owned()],
        Peers::All(false) => Vec::new(),
        Peers::Star(star) if star == "*" => vec![star],
        Peers::Star(other) => {
            return Err(serde::de::Error::custom(format!(
                "`peers` is a list of names, \"*\" or a boolean, not \"{other}\""
            )));
        }
        Peers::Named(names) => names,
    })
}

fn peers_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "anyOf": [
            {"type": "array", "items": {"type": "string", "minLength": 1}},
            {"const": "*"},
            {"type": "boolean"}
        ]
    })
}

/// The JSON Schema of `[bus]`, to place in the whole file's.
#[must_use]
pub fn schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(BusSection).to_value();
    if let Some(object) = schema.as_object_mut() {
        // A sub-schema, not a document of its own.
        object.remove("$schema");
    }
    schema
}

impl BusSection {
    /// A section for `instance` with every other key at its default.
    #[must_use]
    pub fn new(instance: impl Into<String>) -> Self {
        Self {
            instance: instance.into(),
            listen: None,
            peers: Vec::new(),
            max_depth: max_depth(),
            secret_file: None,
            registry: None,
            budget_usd: None,
            delegate: false,
            timeout_seconds: sixty(),
            attempts: three(),
        }
    }

    /// The `[bus]` table of `definition`, read and checked; `None` when it
    /// has none.
    ///
    /// # Errors
    ///
    /// A message naming the key that is wrong.
    pub fn from_definition(definition: &AgentDefinition) -> Result<Option<Self>, String> {
        Self::from_definition_as(definition, None)
    }

    /// [`BusSection::from_definition`], with `instance` (a command line's
    /// `--instance`) in place of the table's own: a `[bus]` table may
    /// leave its name to the flag.
    ///
    /// # Errors
    ///
    /// A message naming the key that is wrong.
    pub fn from_definition_as(
        definition: &AgentDefinition,
        instance: Option<&str>,
    ) -> Result<Option<Self>, String> {
        let Some(table) = &definition.bus else {
            return Ok(None);
        };
        let mut table = table.clone();
        if let Some(instance) = instance {
            table.insert("instance".into(), toml::Value::String(instance.into()));
        }
        let section = Self::deserialize(toml::Value::Table(table))
            .map_err(|e| format!("`[bus]`: {}", e.to_string().trim()))?;
        section.check(definition)?;
        Ok(Some(section))
    }

    fn check(&self, definition: &AgentDefinition) -> Result<(), String> {
        if self.instance.is_empty() {
            return Err("`bus.instance` must not be empty".into());
        }
        if self.peers.iter().any(String::is_empty) {
            return Err("`bus.peers` names must not be empty".into());
        }
        if !(self.timeout_seconds > 0.0 && self.timeout_seconds.is_finite()) {
            return Err("`bus.timeout_seconds` must be a positive number".into());
        }
        if self.attempts == 0 {
            return Err("`bus.attempts` must be at least 1".into());
        }
        if let Some(budget) = self.budget_usd {
            if !(budget.is_finite() && budget > 0.0) {
                return Err("`bus.budget_usd` must be a positive number".into());
            }
            // Each delegated turn reserves the most it may cost before it
            // starts; without a turn's cap there is nothing to reserve.
            if definition.budgets.cost_usd.is_none() {
                return Err(
                    "`bus.budget_usd` needs `budgets.cost_usd`: each delegated turn reserves that much before it starts"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// The secret file, resolved against the definition's directory.
    #[must_use]
    pub fn secret_path(&self, base: &Path) -> Option<PathBuf> {
        self.secret_file.as_ref().map(|file| base.join(file))
    }

    /// The registry file: the one named, or the default.
    #[must_use]
    pub fn registry_path(&self) -> PathBuf {
        self.registry
            .clone()
            .unwrap_or_else(crate::registry::default_path)
    }

    /// How the `delegate` tool sends.
    #[must_use]
    pub fn options(&self) -> crate::client::Options {
        crate::client::Options {
            timeout: Duration::from_secs_f64(self.timeout_seconds),
            attempts: self.attempts,
            ..crate::client::Options::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml: &str) -> Result<Option<BusSection>, String> {
        let definition = AgentDefinition::from_toml(toml).map_err(|e| e.to_string())?;
        BusSection::from_definition(&definition)
    }

    #[test]
    fn a_bus_table_without_instance_takes_the_flags_name_and_is_refused_without_one() {
        let definition = AgentDefinition::from_toml("[bus]\npeers = [\"worker\"]\n").unwrap();
        assert!(BusSection::from_definition(&definition).is_err());
        let named = BusSection::from_definition_as(&definition, Some("reviewer"))
            .unwrap()
            .unwrap();
        assert_eq!(named.instance, "reviewer");
        assert_eq!(named.peers, ["worker"]);
        // The flag overrides the table's own name, as each flag overrides
        // its key.
        let definition = AgentDefinition::from_toml("[bus]\ninstance = \"a\"\n").unwrap();
        let named = BusSection::from_definition_as(&definition, Some("b"))
            .unwrap()
            .unwrap();
        assert_eq!(named.instance, "b");
    }

    #[test]
    fn peers_read_as_the_seeds_reference_reads_them() {
        for (peers, expected) in [
            ("[\"worker\"]", vec!["worker"]),
            ("\"*\"", vec!["*"]),
            ("true", vec!["*"]),
            ("false", vec![]),
            ("[]", vec![]),
        ] {
            let read = section(&format!("[bus]\ninstance = \"a\"\npeers = {peers}\n"))
                .unwrap()
                .unwrap();
            assert_eq!(read.peers, expected, "{peers}");
        }
        assert_eq!(
            section("[bus]\ninstance = \"a\"\n").unwrap().unwrap().peers,
            Vec::<String>::new(),
            "absent: none"
        );
        assert!(section("[bus]\ninstance = \"a\"\npeers = \"worker\"\n").is_err());
    }

    #[test]
    fn an_unknown_key_or_a_budget_without_a_turns_cap_is_refused_by_name() {
        let unknown = section("[bus]\ninstance = \"a\"\nmax_dept = 2\n").unwrap_err();
        assert!(unknown.contains("max_dept"), "{unknown}");
        let budget = section("[bus]\ninstance = \"a\"\nbudget_usd = 5.0\n").unwrap_err();
        assert!(budget.contains("budgets.cost_usd"), "{budget}");
        let priced = "[pricing]\ninput_per_million = 1.0\noutput_per_million = 1.0\n[budgets]\ncost_usd = 0.5\n[bus]\ninstance = \"a\"\nbudget_usd = 5.0\n";
        assert_eq!(section(priced).unwrap().unwrap().budget_usd, Some(5.0));
        assert!(section("[agent]\nname = \"x\"\n").unwrap().is_none());
    }
}
