//! Spool's model providers: the runtime's [`Engine`] for real models.
//!
//! - [`OpenAiEngine`]: any OpenAI-compatible chat-completions endpoint
//!   (OpenAI, Ollama, vLLM, llama.cpp's `llama-server`, LM Studio,
//!   OpenRouter), streamed over SSE.
//! - [`AnthropicEngine`]: the Anthropic Messages API, streamed over SSE.
//! - [`CommandEngine`]: a provider CLI run as a child process.
//!
//! [`build`] turns an agent definition's engine spec into one of them:
//! `openai/<model>`, `anthropic/<model>`, `command:<argv>`, or the runtime's
//! own `scripted:<file>` and `echo`.
//!
//! ```
//! use spool_engines::Spec;
//!
//! let spec: Spec = "openai/gpt-4o-mini".parse().unwrap();
//! assert_eq!(spec, Spec::OpenAi { model: "gpt-4o-mini".into() });
//! assert!("mystery/model".parse::<Spec>().is_err());
//! ```
//!
//! Every call retries what a provider refused before its answer began (429,
//! 5xx, a reset connection), honouring `Retry-After`, and never once a byte
//! of the answer has reached the turn. Failures are classified by status and
//! by the provider's structured error type into the runtime's stable codes
//! (`auth`, `budget`, `timeout`, `provider_error`, `engine_cli`). The API key
//! goes in one request header and nowhere else: not in a log line, an error
//! or a journal event.
//!
#![doc = include_str!("../README.md")]

mod anthropic;
mod command;
mod config;
mod openai;
mod proxy;
mod retry;
mod sse;
mod stream;
mod transport;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use spool_runtime::Engine;
use spool_runtime::agent::AgentDefinition;

pub use anthropic::AnthropicEngine;
pub use command::CommandEngine;
pub use config::{
    ApiKey, DEFAULT_ANTHROPIC_MAX_TOKENS, DEFAULT_IDLE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
    ProviderSection, Settings, Vendor,
};

/// The engine specs there are, in words: one list for every help text
/// and error that names them.
macro_rules! specs {
    () => {
        "`echo`, `scripted:<file>`, `openai/<model>`, `anthropic/<model>` or `command:<argv>`"
    };
}

/// The engine specs there are, for errors and docs.
pub const SPECS: &str = specs!();

/// The help text of a `--model` option.
pub const MODEL_HELP: &str = concat!(
    "The engine, instead of the agent definition's: ",
    specs!(),
    "."
);
pub use openai::OpenAiEngine;
pub use retry::RetryPolicy;

/// An engine spec, as `spool.toml`'s `agent.engine` or `--model` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `echo`: answers with its input (the embedded default).
    Echo,
    /// `scripted:<file>`: replays a JSONL script.
    Scripted(String),
    /// `openai/<model>`.
    OpenAi {
        /// The model name the endpoint knows.
        model: String,
    },
    /// `anthropic/<model>`.
    Anthropic {
        /// The model name the API knows.
        model: String,
    },
    /// `command:<argv>`, split as a shell would.
    Command {
        /// The program and its arguments.
        argv: Vec<String>,
    },
}

impl Spec {
    /// Whether the spec names a file or program, which a definition's
    /// relative path finds from the definition's directory and a command
    /// line's from the current one.
    #[must_use]
    pub fn reads_files(&self) -> bool {
        matches!(self, Self::Scripted(_) | Self::Command { .. })
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Echo => f.write_str("echo"),
            Self::Scripted(file) => write!(f, "scripted:{file}"),
            Self::OpenAi { model } => write!(f, "openai/{model}"),
            Self::Anthropic { model } => write!(f, "anthropic/{model}"),
            Self::Command { argv } => write!(
                f,
                "command:{}",
                shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_default()
            ),
        }
    }
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The spec names no engine Spool has.
    #[error("unknown engine `{0}`: use {specs}", specs = SPECS)]
    Unknown(String),
    /// `openai/` or `anthropic/` without a model.
    #[error("engine `{0}` names no model (e.g. `openai/gpt-4o-mini`)")]
    NoModel(String),
    /// `command:` without a program, or with unbalanced quotes.
    #[error("engine `{0}` names no program, or its quotes do not balance")]
    BadCommand(String),
    /// The key's variable is not set where a key is needed.
    #[error("the API key variable `{0}` is not set")]
    MissingKey(String),
    /// The base URL is not an `http://` or `https://` URL.
    #[error("base URL `{url}`: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS trust store could not be built (a bad `SSL_CERT_FILE`).
    #[error("TLS: {0}")]
    Tls(String),
    /// `[provider]` has a key this crate does not know, of the wrong type,
    /// or out of range.
    #[error("{0}")]
    Provider(String),
    /// A `scripted:` file did not load.
    #[error(transparent)]
    Script(#[from] spool_runtime::engines::ScriptError),
}

impl FromStr for Spec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        let spec = spec.trim();
        if spec == "echo" {
            return Ok(Self::Echo);
        }
        if let Some(file) = spec.strip_prefix("scripted:") {
            return Ok(Self::Scripted(file.to_owned()));
        }
        if let Some(line) = spec.strip_prefix("command:") {
            return match shlex::split(line) {
                Some(argv) if !argv.is_empty() => Ok(Self::Command { argv }),
                _ => Err(SpecError::BadCommand(spec.to_owned())),
            };
        }
        let model = |rest: &str| {
            if rest.trim().is_empty() {
                Err(SpecError::NoModel(spec.to_owned()))
            } else {
                Ok(rest.to_owned())
            }
        };
        if let Some(rest) = spec.strip_prefix("openai/") {
            return Ok(Self::OpenAi {
                model: model(rest)?,
            });
        }
        if let Some(rest) = spec.strip_prefix("anthropic/") {
            return Ok(Self::Anthropic {
                model: model(rest)?,
            });
        }
        Err(SpecError::Unknown(spec.to_owned()))
    }
}

/// The JSON Schema of a whole `spool.toml`: the runtime's definition, with
/// `[provider]` as this crate reads it. Editors given it (taplo, Even Better
/// TOML, a `#:schema` line) complete keys and flag unknown ones; the file
/// is still checked by loading it, with errors that name the key.
#[must_use]
pub fn agent_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(AgentDefinition).to_value();
    let provider = schemars::schema_for!(ProviderSection).to_value();
    let mut provider = provider;
    if let Some(object) = provider.as_object_mut() {
        // A sub-schema, not a document of its own.
        object.remove("$schema");
    }
    schema["properties"]["provider"] = provider;
    schema["title"] = "spool.toml".into();
    schema
}

/// Builds the engine `definition` names, reading keys and base URLs from
/// the process environment; relative paths resolve against `base`.
///
/// # Errors
///
/// [`SpecError`] naming what is wrong.
pub fn build(definition: &AgentDefinition, base: &Path) -> Result<Arc<dyn Engine>, SpecError> {
    build_with_env(definition, base, &|name| std::env::var(name).ok())
}

/// [`build`] with the environment given, so a caller (or a test) decides
/// what the variables hold.
///
/// # Errors
///
/// [`SpecError`] naming what is wrong.
pub fn build_with_env(
    definition: &AgentDefinition,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Engine>, SpecError> {
    let spec = definition.agent.engine.parse::<Spec>()?;
    build_spec(&spec, &definition.provider, base, env)
}

/// Builds the engine `spec` names, with the agent definition's
/// `[provider]` table: the one place a spec becomes an engine, for
/// `spool.toml` and `--model` alike.
///
/// # Errors
///
/// [`SpecError`] naming what is wrong.
pub fn build_spec(
    spec: &Spec,
    provider: &toml::Table,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Engine>, SpecError> {
    let provider = ProviderSection::from_table(provider)?;
    Ok(match spec {
        Spec::Echo => Arc::new(spool_runtime::engines::EchoEngine),
        Spec::Scripted(file) => Arc::new(spool_runtime::engines::ScriptedEngine::from_file(
            base.join(file),
        )?),
        Spec::OpenAi { model } => Arc::new(OpenAiEngine::new(
            model.clone(),
            Settings::resolve(Vendor::OpenAi, &provider, env)?,
        )?),
        Spec::Anthropic { model } => Arc::new(AnthropicEngine::new(
            model.clone(),
            Settings::resolve(Vendor::Anthropic, &provider, env)?,
        )?),
        Spec::Command { argv } => Arc::new(CommandEngine::new(
            argv.clone(),
            base,
            config::request_timeout(&provider),
        )?),
    })
}
