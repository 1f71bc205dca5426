//! When telemetry is on and where it goes: the standard `OTEL_*`
//! variables, or `[telemetry]` in `spool.toml` for what they leave unset.
//!
//! ```toml
//! [telemetry]
//! endpoint = "http://127.0.0.1:4318"   # OTLP/HTTP; each signal's path is added
//! protocol = "http/protobuf"           # or "http/json"
//! headers = { "x-honeycomb-team" = "…" }
//! service_name = "reviewer"
//! capture_content = false              # tool inputs and outputs on spans
//! signals = ["traces", "logs", "metrics"]
//! ```
//!
//! Telemetry is off unless an endpoint is named (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! a per-signal `OTEL_EXPORTER_OTLP_{TRACES,LOGS,METRICS}_ENDPOINT`, or
//! `endpoint` here); `OTEL_SDK_DISABLED=true` turns it off whatever else
//! says, and `OTEL_{TRACES,LOGS,METRICS}_EXPORTER=none` turns one signal
//! off. gRPC is not spoken: OTLP over HTTP only, through Spool's own HTTP
//! client.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `[telemetry]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The collector's OTLP/HTTP base URL; `/v1/traces`, `/v1/logs` and
    /// `/v1/metrics` are added.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `http/json`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Headers sent with every export (an API key).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The resource's `service.name`; `spool` by default.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Record tool inputs and outputs on their spans.
    #[serde(default)]
    pub capture_content: bool,
    /// The signals exported; all three by default.
    #[serde(default)]
    pub signals: Option<Vec<Signal>>,
}

/// A kind of telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    /// Spans.
    Traces,
    /// LogRecords.
    Logs,
    /// Counters and histograms.
    Metrics,
}

impl TelemetrySection {
    /// The `[telemetry]` table of `definition`, read; `None` when it has
    /// none.
    ///
    /// # Errors
    ///
    /// A message naming the key that is wrong.
    pub fn from_definition(
        definition: &spool_runtime::agent::AgentDefinition,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(table) = &definition.telemetry else {
            return Ok(None);
        };
        Self::deserialize(toml::Value::Table(table.clone()))
            .map(Some)
            .map_err(|e| ConfigError(format!("`[telemetry]`: {}", e.to_string().trim())))
    }
}

/// The JSON Schema of `[telemetry]`, to place in the whole file's.
#[must_use]
pub fn schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(TelemetrySection).to_value();
    if let Some(object) = schema.as_object_mut() {
        // A sub-schema, not a document of its own.
        object.remove("$schema");
    }
    schema
}

impl Signal {
    /// The word in the variables' names (`TRACES`).
    #[must_use]
    pub fn env_word(self) -> &'static str {
        match self {
            Self::Traces => "TRACES",
            Self::Logs => "LOGS",
            Self::Metrics => "METRICS",
        }
    }

    /// The path under the base endpoint (`/v1/traces`).
    #[must_use]
    pub fn path(self) -> &'static str {
        match self {
            Self::Traces => "/v1/traces",
            Self::Logs => "/v1/logs",
            Self::Metrics => "/v1/metrics",
        }
    }

    /// All three.
    pub const ALL: [Self; 3] = [Self::Traces, Self::Logs, Self::Metrics];
}

/// The OTLP encodings spoken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`.
    Protobuf,
    /// `http/json`.
    Json,
}

/// What is wrong with the settings.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct ConfigError(pub String);

/// One signal's resolved settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalSettings {
    /// The full URL exports go to; `None` lets the exporter read the
    /// standard variables (which named one).
    pub endpoint: Option<String>,
    /// The encoding.
    pub protocol: Protocol,
}

/// Everything resolved: which signals go where.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Traces, when exported.
    pub traces: Option<SignalSettings>,
    /// Logs, when exported.
    pub logs: Option<SignalSettings>,
    /// Metrics, when exported.
    pub metrics: Option<SignalSettings>,
    /// Headers from `[telemetry]` (the variables' own are read by the
    /// exporter).
    pub headers: BTreeMap<String, String>,
    /// `service.name`; `None` when `OTEL_SERVICE_NAME` or
    /// `OTEL_RESOURCE_ATTRIBUTES` names it (the variables win).
    pub service_name: Option<String>,
    /// Tool inputs and outputs on spans.
    pub capture_content: bool,
}

impl Settings {
    /// The settings `section` and the variables `env` reads give, or
    /// `None` when telemetry is off.
    ///
    /// # Errors
    ///
    /// A protocol this build does not speak (`grpc`), a `signals` entry
    /// twice, an endpoint that is not HTTP.
    pub fn resolve(
        section: Option<&TelemetrySection>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let section = section.cloned().unwrap_or_default();
        if let Some(endpoint) = &section.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(ConfigError(format!(
                "`telemetry.endpoint` must be an http:// or https:// URL, not `{endpoint}`"
            )));
        }
        let chosen = section
            .signals
            .clone()
            .unwrap_or_else(|| Signal::ALL.to_vec());
        let generic = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let resolve = |signal: Signal| -> Result<Option<SignalSettings>, ConfigError> {
            let word = signal.env_word();
            if !chosen.contains(&signal)
                || var(&format!("OTEL_{word}_EXPORTER")).is_some_and(|v| v.trim() == "none")
            {
                return Ok(None);
            }
            let own = var(&format!("OTEL_EXPORTER_OTLP_{word}_ENDPOINT"));
            // The variables name the endpoint: the exporter reads them
            // (and adds the path to the generic one, as the spec says).
            let endpoint = if own.is_some() || generic.is_some() {
                None
            } else {
                match &section.endpoint {
                    Some(base) => Some(format!("{}{}", base.trim_end_matches('/'), signal.path())),
                    None => return Ok(None),
                }
            };
            let protocol = var(&format!("OTEL_EXPORTER_OTLP_{word}_PROTOCOL"))
                .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
                .or_else(|| section.protocol.clone());
            let protocol = match protocol.as_deref().map(str::trim) {
                None | Some("http/protobuf") => Protocol::Protobuf,
                Some("http/json") => Protocol::Json,
                Some(other) => {
                    return Err(ConfigError(format!(
                        "protocol `{other}` is not spoken: Spool exports OTLP over HTTP, `http/protobuf` or `http/json` (a collector takes both on port 4318)"
                    )));
                }
            };
            Ok(Some(SignalSettings { endpoint, protocol }))
        };
        let settings = Self {
            traces: resolve(Signal::Traces)?,
            logs: resolve(Signal::Logs)?,
            metrics: resolve(Signal::Metrics)?,
            headers: section.headers.clone(),
            service_name: {
                let named = var("OTEL_SERVICE_NAME").is_some()
                    || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
                        attributes
                            .split(',')
                            .any(|pair| pair.trim_start().starts_with("service.name="))
                    });
                (!named).then(|| {
                    section
                        .service_name
                        .clone()
                        .unwrap_or_else(|| "spool".into())
                })
            },
            capture_content: section.capture_content,
        };
        if settings.traces.is_none() && settings.logs.is_none() && settings.metrics.is_none() {
            return Ok(None);
        }
        Ok(Some(settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn telemetry_is_off_until_an_endpoint_is_named_and_off_when_the_sdk_is_disabled() {
        assert_eq!(Settings::resolve(None, &env(&[])).unwrap(), None);
        let on = Settings::resolve(
            None,
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            on.traces,
            Some(SignalSettings {
                endpoint: None,
                protocol: Protocol::Protobuf
            }),
            "the exporter reads the variable itself"
        );
        let disabled = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert_eq!(Settings::resolve(None, &disabled).unwrap(), None);
    }

    #[test]
    fn the_file_names_an_endpoint_per_signal_and_the_variables_turn_signals_off() {
        let section = TelemetrySection {
            endpoint: Some("http://127.0.0.1:4318/".into()),
            protocol: Some("http/json".into()),
            ..TelemetrySection::default()
        };
        let settings = Settings::resolve(Some(&section), &env(&[("OTEL_LOGS_EXPORTER", "none")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            settings.traces.unwrap().endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(settings.metrics.unwrap().protocol, Protocol::Json);
        assert_eq!(settings.logs, None);
    }

    #[test]
    fn a_misspelt_telemetry_key_or_an_endpoint_that_is_not_http_is_refused_by_name() {
        let definition = spool_runtime::agent::AgentDefinition::from_toml(
            "[telemetry]\nendpont = \"http://c\"\n",
        )
        .unwrap();
        let error = TelemetrySection::from_definition(&definition).unwrap_err();
        assert!(error.to_string().contains("endpont"), "{error}");
        let section = TelemetrySection {
            endpoint: Some("127.0.0.1:4318".into()),
            ..TelemetrySection::default()
        };
        let error = Settings::resolve(Some(&section), &|_| None).unwrap_err();
        assert!(error.to_string().contains("http://"), "{error}");
    }

    #[test]
    fn grpc_is_refused_naming_what_is_spoken() {
        let error = Settings::resolve(
            None,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
        )
        .unwrap_err();
        assert!(error.to_string().contains("http/protobuf"), "{error}");
    }
}
