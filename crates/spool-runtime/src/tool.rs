//! The `Tool` trait, what a call can come to ([`ToolOutcome`]), and the
//! registry that checks input against each tool's JSON Schema before the
//! tool runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use spool_journal::event::Effect;
use spool_journal::{Principal, RunId, TurnId};
use spool_wire::run::SuspendKind;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::engine::ToolSpec;

/// What a tool call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutcome {
    /// A result for the model.
    Output(Value),
    /// Park the run until someone answers.
    Suspend(Suspension),
    /// Park the run until an instant.
    Sleep(OffsetDateTime),
    /// The call failed; the message is recorded in full and the model sees it.
    Error(String),
}

/// What a suspended tool waits for.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspension {
    /// Why the run waits (`question`, `approval`, `custom`, `signal`).
    pub kind: SuspendKind,
    /// What to show whoever answers.
    pub prompt: String,
    /// Choices, when there are some.
    pub options: Option<Vec<String>>,
    /// The JSON Schema each answer (`{"text", "approved"?}`) must satisfy.
    pub answer_schema: Value,
}

/// A tool the model may call.
///
/// A host adds its own next to the built-in ones; the runtime checks each
/// call's input against `spec().input_schema` before `call` runs, and
/// journals the call before and its output after (`examples/embed` is a
/// whole host app around one):
///
/// ```
/// use std::sync::Arc;
///
/// use serde_json::{Value, json};
/// use spool_journal::event::Effect;
/// use spool_runtime::engine::ToolSpec;
/// use spool_runtime::{BoxFuture, Tool, ToolOutcome, Tools};
/// use tokio_util::sync::CancellationToken;
///
/// /// Adds two numbers: no effect on the world, so safe to run again.
/// struct Add;
///
/// impl Tool for Add {
///     fn spec(&self) -> ToolSpec {
///         ToolSpec {
///             name: "add".into(),
///             description: "Add two numbers.".into(),
///             input_schema: json!({
///                 "type": "object",
///                 "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
///                 "required": ["a", "b"]
///             }),
///         }
///     }
///
///     fn effect(&self) -> Effect {
///         Effect::Read
///     }
///
///     fn call<'a>(&'a self, input: Value, _cancel: &'a CancellationToken) -> BoxFuture<'a, ToolOutcome> {
///         let sum = input["a"].as_f64().unwrap_or(0.0) + input["b"].as_f64().unwrap_or(0.0);
///         Box::pin(async move { ToolOutcome::Output(json!(sum)) })
///     }
/// }
///
/// let mut tools = Tools::builtin();
/// tools.add(Arc::new(Add)).unwrap();
/// // A second tool of the same name is refused.
/// assert!(tools.add(Arc::new(Add)).is_err());
/// assert!(tools.get("add").is_some());
/// ```
pub trait Tool: Send + Sync + 'static {
    /// Its name, description and input schema.
    fn spec(&self) -> ToolSpec;

    /// What it may do to the world; decides recovery and retries.
    fn effect(&self) -> Effect;

    /// How many times a failed call is tried in all. Ignored for `write`
    /// tools, which run once.
    fn attempts(&self) -> u32 {
        1
    }

    /// The idempotency key of a call with `input`, for keyed tools.
    fn idempotency_key(&self, input: &Value) -> Option<String> {
        let _ = input;
        None
    }

    /// Whether an `idempotent` call must carry a key
    /// ([`Tool::idempotency_key`] finds one in its input). A call without
    /// one is refused as `invalid_input`, never run unclaimed: without its
    /// key a retry after a crash could run it twice.
    fn keyed(&self) -> bool {
        false
    }

    /// Runs the call. `cancel` fires when the turn is cancelled.
    fn call<'a>(
        &'a self,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome>;

    /// The question to ask a person before the call runs, when this call
    /// needs their approval first (an MCP tool that may change the world).
    /// The runtime parks the run through the same approval suspension as
    /// `request_approval`, recorded as a call of its own (`CALL.approval`);
    /// only `approved: true` lets the call run, and any other answer goes
    /// to the model as the call's result instead.
    fn approval(&self, input: &Value) -> Option<String> {
        let _ = input;
        None
    }

    /// Runs the call knowing where it is: the run, its turn, the call's id
    /// and who created the run. The runtime calls this one; by default it
    /// is [`Tool::call`]. A tool whose effect reaches past the process
    /// (another instance, a service with its own idempotency keys) derives
    /// a key from the run and call id, which a recovered call gets again.
    fn call_in<'a>(
        &'a self,
        context: &'a ToolContext,
        input: Value,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        let _ = context;
        self.call(input, cancel)
    }
}

/// Where a tool call runs: the same on every execution of the call, a
/// recovered one included.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ToolContext {
    /// The run.
    pub run: RunId,
    /// The turn.
    pub turn: TurnId,
    /// The call's id, as the model gave it (unique within the run).
    pub call_id: String,
    /// Who created the run, when that was proven.
    pub principal: Option<Principal>,
    /// Where [`ToolContext::progress`] goes.
    progress: ProgressSink,
}

/// Where a call's progress goes: the run's live stream, as a
/// [`crate::engine::Delta::ToolProgress`].
#[derive(Clone, Default)]
pub(crate) struct ProgressSink(Option<Arc<dyn Fn(String) + Send + Sync>>);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProgressSink"
        } else {
            "None"
        })
    }
}

/// Two contexts of the same call are the same whether or not either can
/// report progress.
impl PartialEq for ProgressSink {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl ToolContext {
    /// The context of call `call_id` in `run`'s turn `turn`.
    #[must_use]
    pub fn new(run: RunId, turn: TurnId, call_id: impl Into<String>) -> Self {
        Self {
            run,
            turn,
            call_id: call_id.into(),
            principal: None,
            progress: ProgressSink::default(),
        }
    }

    /// Reports the call's progress on the run's live streams (live only:
    /// nothing is recorded). A context made outside the runtime reports
    /// nowhere.
    pub fn progress(&self, message: impl Into<String>) {
        if let Some(sink) = &self.progress.0 {
            sink(message.into());
        }
    }

    /// An id for what this call sends out (`PREFIX_` and 32 hex digits),
    /// made from its run, turn and call id: the same on every execution
    /// of the call, a recovered one's included, and another for a call of
    /// another turn even when a model reuses call ids from turn to turn.
    /// A tool whose receiver keeps such ids (the bus's delegation id, an
    /// A2A `messageId`) sends the same id again after a crash, and the
    /// receiver answers with its first outcome instead of acting twice.
    #[must_use]
    pub fn stable_id(&self, prefix: &str) -> String {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        for part in [self.run.as_str(), self.turn.as_str(), self.call_id.as_str()] {
            digest.update(part.as_bytes());
            digest.update([0]);
        }
        let hex: String = digest
            .finalize()
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{prefix}_{hex}")
    }

    /// With progress going to `sink`.
    pub(crate) fn with_progress(mut self, sink: Arc<dyn Fn(String) + Send + Sync>) -> Self {
        self.progress = ProgressSink(Some(sink));
        self
    }

    /// With the run's creator.
    #[must_use]
    pub fn with_principal(mut self, principal: Option<Principal>) -> Self {
        self.principal = principal;
        self
    }
}

/// The tools of an agent, with their compiled input validators.
#[derive(Clone, Default)]
pub struct Tools {
    tools: BTreeMap<String, Entry>,
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    /// Compiled when the tool is added, or, for the built-in tools (whose
    /// schemas are known good), at their first call: a process that never
    /// calls them never compiles them.
    validator: Arc<std::sync::OnceLock<jsonschema::Validator>>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

/// A tool that cannot be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRegistrationError {
    /// Two tools share a name.
    #[error("two tools are named `{0}`")]
    Duplicate(String),
    /// The input schema is not a valid JSON Schema.
    #[error("tool `{name}` has an invalid input schema: {reason}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// Why.
        reason: String,
    },
}

impl Tools {
    /// No tools.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool.
    ///
    /// # Errors
    ///
    /// When the name is taken or the input schema does not compile.
    pub fn add(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolRegistrationError> {
        let spec = tool.spec();
        if self.tools.contains_key(&spec.name) {
            return Err(ToolRegistrationError::Duplicate(spec.name));
        }
        let validator = jsonschema::validator_for(&spec.input_schema).map_err(|e| {
            ToolRegistrationError::InvalidSchema {
                name: spec.name.clone(),
                reason: e.to_string(),
            }
        })?;
        self.tools.insert(
            spec.name,
            Entry {
                tool,
                validator: Arc::new(std::sync::OnceLock::from(validator)),
            },
        );
        Ok(())
    }

    /// The built-in tools: `ask_human` and `request_approval`. Their
    /// schemas are compiled at their first call (a test checks that they
    /// compile).
    #[must_use]
    pub fn builtin() -> Self {
        let mut tools = Self::new();
        for tool in crate::tools::builtin() {
            tools.add_builtin(tool);
        }
        tools
    }

    /// Adds one of [`crate::tools::builtin`], its schema compiled at its
    /// first call.
    pub(crate) fn add_builtin(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(
            tool.spec().name,
            Entry {
                tool,
                validator: Arc::default(),
            },
        );
    }

    /// The specs the model is told of, in name order.
    #[must_use]
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|e| e.tool.spec()).collect()
    }

    /// The tool named `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|e| &e.tool)
    }

    /// Checks `input` against the tool's schema: every problem, joined.
    pub(crate) fn check_input(&self, name: &str, input: &Value) -> Result<(), String> {
        let Some(entry) = self.tools.get(name) else {
            return Err(format!("no tool is named `{name}`"));
        };
        let validator = match entry.validator.get() {
            Some(validator) => validator,
            None => {
                let schema = entry.tool.spec().input_schema;
                let compiled = jsonschema::validator_for(&schema)
                    .map_err(|e| format!("the tool's input schema is invalid: {e}"))?;
                entry.validator.get_or_init(|| compiled)
            }
        };
        let problems: Vec<String> = validator
            .iter_errors(input)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("{at}: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// An agent's tools as the runtime reads them, replaceable whole while runs
/// go on (an MCP server that changes its tool list): turns started after a
/// replacement are told of the new set. A turn keeps the set it started
/// with, found again by its recorded requests if it parks and resumes
/// after a replacement, among the last [`LiveTools::KEPT`] sets. Clones
/// share one set.
#[derive(Clone)]
pub struct LiveTools(Arc<std::sync::RwLock<Sets>>);

/// The current set, then the ones it replaced, newest first.
struct Sets {
    current: Arc<Catalog>,
    earlier: std::collections::VecDeque<Arc<Catalog>>,
}

/// One set of tools with what every model request repeats of it, made once
/// per set rather than per request.
pub(crate) struct Catalog {
    pub(crate) tools: Tools,
    /// What the model is told of the tools.
    pub(crate) specs: Arc<[ToolSpec]>,
    /// The last link of every request hash (see `RequestHasher`).
    pub(crate) digest: [u8; 32],
}

impl Catalog {
    fn new(tools: Tools) -> Self {
        let specs: Arc<[ToolSpec]> = tools.specs().into();
        Self {
            digest: crate::engine::tools_digest(&specs),
            specs,
            tools,
        }
    }
}

impl LiveTools {
    /// How many replaced sets are kept for turns that started with them.
    pub const KEPT: usize = 8;

    /// `tools`, until replaced.
    #[must_use]
    pub fn new(tools: Tools) -> Self {
        Self(Arc::new(std::sync::RwLock::new(Sets {
            current: Arc::new(Catalog::new(tools)),
            earlier: std::collections::VecDeque::new(),
        })))
    }

    /// Puts `tools` in place of the current set, for turns started from
    /// now on.
    pub fn replace(&self, tools: Tools) {
        let catalog = Arc::new(Catalog::new(tools));
        let mut sets = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let replaced = std::mem::replace(&mut sets.current, catalog);
        sets.earlier.push_front(replaced);
        sets.earlier.truncate(Self::KEPT);
    }

    /// The current set.
    #[must_use]
    pub fn current(&self) -> Tools {
        self.catalog().tools.clone()
    }

    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .current,
        )
    }

    /// The sets replaced, newest first.
    pub(crate) fn earlier(&self) -> Vec<Arc<Catalog>> {
        let sets = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sets.earlier.iter().cloned().collect()
    }
}

impl Default for LiveTools {
    fn default() -> Self {
        Self::new(Tools::default())
    }
}

impl std::fmt::Debug for LiveTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.catalog().tools.fmt(f)
    }
}

/// Checks one answer against a suspension's answer schema.
pub(crate) fn check_answer(schema: &Value, answer: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the recorded answer schema is invalid: {e}"))?;
    let problems: Vec<String> = validator
        .iter_errors(answer)
        .map(|e| e.to_string())
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_built_in_tools_input_schema_compiles() {
        for tool in crate::tools::builtin() {
            let spec = tool.spec();
            assert!(
                jsonschema::validator_for(&spec.input_schema).is_ok(),
                "{}",
                spec.name
            );
        }
    }
}
