//! Engine specs: parsing, and building an engine from a definition and an
//! environment.

use std::path::Path;

use spool_engines::{Spec, SpecError, build_with_env};
use spool_runtime::agent::AgentDefinition;

fn definition(toml: &str) -> AgentDefinition {
    AgentDefinition::from_toml(toml).unwrap()
}

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[test]
fn specs_parse_into_their_engines() {
    assert_eq!("echo".parse::<Spec>().unwrap(), Spec::Echo);
    assert_eq!(
        "scripted:s.jsonl".parse::<Spec>().unwrap(),
        Spec::Scripted("s.jsonl".into())
    );
    assert_eq!(
        "anthropic/claude-sonnet-4-5".parse::<Spec>().unwrap(),
        Spec::Anthropic {
            model: "claude-sonnet-4-5".into()
        }
    );
    // Model names keep their own slashes (OpenRouter's `vendor/model`).
    assert_eq!(
        "openai/meta-llama/llama-3.1-8b".parse::<Spec>().unwrap(),
        Spec::OpenAi {
            model: "meta-llama/llama-3.1-8b".into()
        }
    );
    assert_eq!(
        "command:my-cli --json 'a b'".parse::<Spec>().unwrap(),
        Spec::Command {
            argv: vec!["my-cli".into(), "--json".into(), "a b".into()]
        }
    );
    assert!(matches!(
        "openai/".parse::<Spec>(),
        Err(SpecError::NoModel(_))
    ));
    assert!(matches!(
        "command:".parse::<Spec>(),
        Err(SpecError::BadCommand(_))
    ));
    assert!(matches!(
        "command:cli 'open".parse::<Spec>(),
        Err(SpecError::BadCommand(_))
    ));
    assert!(matches!(
        "gpt-4".parse::<Spec>(),
        Err(SpecError::Unknown(_))
    ));
}

#[test]
fn the_vendors_api_without_a_key_is_refused_before_any_turn() {
    let error = build_with_env(
        &definition("[agent]\nengine = \"openai/gpt-4o-mini\""),
        Path::new("."),
        &env(&[]),
    )
    .err()
    .unwrap();
    assert_eq!(error, SpecError::MissingKey("OPENAI_API_KEY".into()));
    let error = build_with_env(
        &definition("[agent]\nengine = \"anthropic/claude\""),
        Path::new("."),
        &env(&[]),
    )
    .err()
    .unwrap();
    assert_eq!(error, SpecError::MissingKey("ANTHROPIC_API_KEY".into()));
}

#[test]
fn a_local_server_needs_no_key_and_a_named_key_variable_must_be_set() {
    let local =
        "[agent]\nengine = \"openai/smollm2\"\n[provider]\nbase_url = \"http://127.0.0.1:8080/v1\"";
    assert!(build_with_env(&definition(local), Path::new("."), &env(&[])).is_ok());
    // The base URL may come from the SDKs' variable instead.
    let from_env = env(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")]);
    assert!(
        build_with_env(
            &definition("[agent]\nengine = \"openai/m\""),
            Path::new("."),
            &from_env
        )
        .is_ok()
    );
    let named = format!("{local}\napi_key_env = \"MY_KEY\"");
    assert_eq!(
        build_with_env(&definition(&named), Path::new("."), &env(&[])).err(),
        Some(SpecError::MissingKey("MY_KEY".into()))
    );
    assert!(
        build_with_env(
            &definition(&named),
            Path::new("."),
            &env(&[("MY_KEY", "k")])
        )
        .is_ok()
    );
}

#[test]
fn a_base_url_that_is_not_http_is_named_in_the_error() {
    let toml = "[agent]\nengine = \"anthropic/m\"\n[provider]\nbase_url = \"localhost:8080\"";
    let error = build_with_env(
        &definition(toml),
        Path::new("."),
        &env(&[("ANTHROPIC_API_KEY", "k")]),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&error, SpecError::BadUrl { url, .. } if url == "localhost:8080"),
        "{error}"
    );
}

#[test]
fn provider_settings_are_checked_when_the_definition_loads() {
    let bad = "[provider]\nrequest_timeout_seconds = 0";
    assert!(
        AgentDefinition::from_toml(bad)
            .unwrap_err()
            .contains("provider.request_timeout_seconds")
    );
    let unknown = "[provider]\napi_key = \"sk-...\"";
    assert!(
        AgentDefinition::from_toml(unknown)
            .unwrap_err()
            .contains("api_key")
    );
}

#[test]
fn builtin_specs_still_build() {
    assert!(
        build_with_env(
            &definition("[agent]\nengine = \"echo\""),
            Path::new("."),
            &env(&[])
        )
        .is_ok()
    );
    let error = build_with_env(
        &definition("[agent]\nengine = \"scripted:missing.jsonl\""),
        Path::new("."),
        &env(&[]),
    )
    .err()
    .unwrap();
    assert!(matches!(error, SpecError::Builtin(_)));
}
