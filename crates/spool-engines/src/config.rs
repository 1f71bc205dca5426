//! What a provider engine needs to reach its model (base URL, key,
//! timeouts, retries), resolved from `[provider]` and the environment the
//! official SDKs read.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::SpecError;

/// `[provider]` in `spool.toml`: where and how a provider engine
/// (`openai/…`, `anthropic/…`, `command:…`) calls its model. Every key is
/// optional; the defaults and the environment fill the rest
/// ([`Settings::resolve`]). The runtime keeps the table unread; this crate
/// reads it, and refuses a key it does not know.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// The API's base URL, e.g. `http://127.0.0.1:8080` for a local server.
    pub base_url: Option<String>,
    /// The environment variable holding the API key. The key itself never
    /// goes in this file.
    pub api_key_env: Option<String>,
    /// The most tokens one answer may have.
    pub max_tokens: Option<u32>,
    /// The longest one call may take, from sending it to its last byte.
    pub request_timeout_seconds: Option<f64>,
    /// The longest silence inside a streamed answer.
    pub idle_timeout_seconds: Option<f64>,
    /// Retries of a call refused before its answer began.
    pub max_retries: Option<u32>,
}

impl ProviderSection {
    /// Reads and checks the `[provider]` table of an agent definition.
    ///
    /// # Errors
    ///
    /// [`SpecError::Provider`] naming the key that is unknown, of the
    /// wrong type, or out of range.
    pub fn from_table(table: &toml::Table) -> Result<Self, SpecError> {
        let section = Self::deserialize(toml::Value::Table(table.clone()))
            .map_err(|e| SpecError::Provider(e.to_string().trim().to_owned()))?;
        for (key, value) in [
            ("request_timeout_seconds", section.request_timeout_seconds),
            ("idle_timeout_seconds", section.idle_timeout_seconds),
        ] {
            if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                return Err(SpecError::Provider(format!(
                    "`provider.{key}` must be a positive number"
                )));
            }
        }
        if section.max_tokens == Some(0) {
            return Err(SpecError::Provider(
                "`provider.max_tokens` must be at least 1".into(),
            ));
        }
        Ok(section)
    }
}
use crate::retry::RetryPolicy;

/// The default limit on one call, first byte sent to last byte read.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// The default limit on silence inside a streamed answer.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Anthropic's API requires a cap on each answer; this is Spool's.
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;

/// A provider API whose defaults Spool knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// OpenAI's chat completions, or any endpoint that speaks them.
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

impl Vendor {
    /// The vendor's own API, used when nothing else is set.
    #[must_use]
    pub fn default_base_url(self) -> &'static str {
        match self {
            // The OpenAI SDKs' base URL includes the version segment.
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com",
        }
    }

    /// The variable the official SDKs read for the base URL.
    #[must_use]
    pub fn base_url_variable(self) -> &'static str {
        match self {
            Self::OpenAi => "OPENAI_BASE_URL",
            Self::Anthropic => "ANTHROPIC_BASE_URL",
        }
    }

    /// The variable the official SDKs read for the key.
    #[must_use]
    pub fn api_key_variable(self) -> &'static str {
        match self {
            Self::OpenAi => "OPENAI_API_KEY",
            Self::Anthropic => "ANTHROPIC_API_KEY",
        }
    }
}

/// An API key. It prints as `ApiKey(…)` so a `Debug` of anything holding it
/// cannot leak it; only the request header sees its text.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced, for provider
    /// messages that might echo it back.
    pub(crate) fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

/// How a provider engine calls its model.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The API's base URL.
    pub base_url: String,
    /// The key, when the endpoint needs one (local servers often do not).
    pub api_key: Option<ApiKey>,
    /// The most tokens one answer may have; `None` leaves it to the
    /// provider where the API allows.
    pub max_tokens: Option<u32>,
    /// The limit on one call, retries included.
    pub request_timeout: Duration,
    /// The limit on silence inside a streamed answer.
    pub idle_timeout: Duration,
    /// When and how often a refused call is tried again.
    pub retry: RetryPolicy,
    /// Certificates (PEM) trusted beside the webpki roots, for `https`.
    pub ca_file: Option<PathBuf>,
    /// The `http://` proxy calls go through, if any.
    pub proxy: Option<String>,
}

impl Settings {
    /// Settings for `base_url` with Spool's defaults and no key.
    #[must_use]
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            max_tokens: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            retry: RetryPolicy::default(),
            ca_file: None,
            proxy: None,
        }
    }

    /// Resolves `[provider]` for `vendor`: the base URL from the definition,
    /// else the vendor's variable, else the vendor's API; the key from the
    /// variable the definition names, else the vendor's; extra trusted
    /// certificates from `SSL_CERT_FILE`; the proxy from `HTTPS_PROXY` or
    /// `HTTP_PROXY` unless `NO_PROXY` names the host.
    ///
    /// # Errors
    ///
    /// [`SpecError::MissingKey`] when the variable the definition names is
    /// unset, or when the vendor's own API is used without a key.
    pub fn resolve(
        vendor: Vendor,
        provider: &ProviderSection,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SpecError> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let base_url = provider
            .base_url
            .clone()
            .or_else(|| set(vendor.base_url_variable()))
            .unwrap_or_else(|| vendor.default_base_url().to_owned());
        let key_variable = provider
            .api_key_env
            .as_deref()
            .unwrap_or(vendor.api_key_variable());
        let api_key = set(key_variable).map(ApiKey::new);
        // A local server needs no key; the vendor's API, or a variable the
        // operator named, does: better refused now than on the first turn.
        if api_key.is_none()
            && (provider.api_key_env.is_some() || base_url == vendor.default_base_url())
        {
            return Err(SpecError::MissingKey(key_variable.to_owned()));
        }
        let mut retry = RetryPolicy::default();
        if let Some(max) = provider.max_retries {
            retry.max_retries = max;
        }
        Ok(Self {
            api_key,
            max_tokens: provider.max_tokens,
            request_timeout: request_timeout(provider),
            idle_timeout: provider
                .idle_timeout_seconds
                .map_or(DEFAULT_IDLE_TIMEOUT, Duration::from_secs_f64),
            retry,
            ca_file: set(crate::transport::EXTRA_ROOTS_VARIABLE).map(PathBuf::from),
            proxy: crate::proxy::from_env(&base_url, env),
            base_url,
        })
    }
}

/// `[provider].request_timeout_seconds`, or the default.
pub(crate) fn request_timeout(provider: &ProviderSection) -> Duration {
    provider
        .request_timeout_seconds
        .map_or(DEFAULT_REQUEST_TIMEOUT, Duration::from_secs_f64)
}
