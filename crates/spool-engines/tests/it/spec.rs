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
    assert!(
        matches!(&error, SpecError::MissingKey(v) if v == "OPENAI_API_KEY"),
        "{error}"
    );
    let error = build_with_env(
        &definition("[agent]\nengine = \"anthropic/claude\""),
        Path::new("."),
        &env(&[]),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&error, SpecError::MissingKey(v) if v == "ANTHROPIC_API_KEY"),
        "{error}"
    );
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
    assert!(matches!(
        build_with_env(&definition(&named), Path::new("."), &env(&[])).err(),
        Some(SpecError::MissingKey(v)) if v == "MY_KEY"
    ));
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
fn provider_settings_are_checked_by_the_engines_crate_naming_the_key() {
    let build = |toml: &str| {
        build_with_env(&definition(toml), Path::new("."), &env(&[]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let bad = build("[provider]\nrequest_timeout_seconds = 0");
    assert!(bad.contains("provider.request_timeout_seconds"), "{bad}");
    let unknown = build("[provider]\napi_key = \"sk-...\"");
    assert!(unknown.contains("api_key"), "{unknown}");
    let tokens = build("[provider]\nmax_tokens = 0");
    assert!(tokens.contains("max_tokens"), "{tokens}");
    // The runtime keeps the table as it is: the definition loads.
    assert!(AgentDefinition::from_toml("[provider]\napi_key = \"sk-...\"").is_ok());
}

#[test]
fn a_spec_prints_as_it_parses_and_says_whether_it_reads_files() {
    for text in [
        "echo",
        "scripted:a.jsonl",
        "openai/gpt-4o-mini",
        "anthropic/claude",
        "command:my-llm --fast 'two words'",
    ] {
        let spec: Spec = text.parse().unwrap();
        assert_eq!(spec.to_string().parse::<Spec>().unwrap(), spec, "{text}");
    }
    assert!("scripted:a.jsonl".parse::<Spec>().unwrap().reads_files());
    assert!("command:x".parse::<Spec>().unwrap().reads_files());
    assert!(!"openai/m".parse::<Spec>().unwrap().reads_files());
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
    assert!(matches!(error, SpecError::Script(_)));
    // The script's own error is kept as the source.
    assert!(
        std::error::Error::source(&error).is_some() || error.to_string().contains("missing.jsonl")
    );
}

/// A TOML text as the JSON a schema validator reads.
fn as_json(text: &str) -> serde_json::Value {
    serde_json::to_value(toml::from_str::<toml::Value>(text).unwrap()).unwrap()
}

#[test]
fn the_spool_toml_schema_accepts_the_definitions_spool_loads_and_refuses_unknown_keys() {
    let schema = spool_engines::agent_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let approval = include_str!("../../../../examples/approval/spool.toml");
    // The module doc's full example, every section and key.
    let documented: String = include_str!("../../../spool-runtime/src/agent.rs")
        .lines()
        .skip_while(|line| !line.starts_with("//! ```toml"))
        .skip(1)
        .take_while(|line| !line.starts_with("//! ```"))
        .map(|line| {
            let line = line
                .trim_start_matches("//!")
                .strip_prefix(' ')
                .unwrap_or("");
            // The doc's comments follow values on the same line.
            match line.find("  #") {
                Some(at) => format!("{}\n", &line[..at]),
                None => format!("{line}\n"),
            }
        })
        .collect();
    for section in [
        "[agent]",
        "[[tool]]",
        "[budgets]",
        "[pricing]",
        "[[schedule]]",
        "[provider]",
    ] {
        assert!(
            documented.contains(section),
            "the doc's example has {section}"
        );
    }
    for text in [approval, documented.as_str()] {
        assert!(AgentDefinition::from_toml(text).is_ok(), "{text}");
        let errors: Vec<String> = validator
            .iter_errors(&as_json(text))
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{errors:?}\n{text}");
    }
    for wrong in [
        "[agent]\nmodle = \"x\"",
        "[provider]\napi_key = \"sk-...\"",
        "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"x\"]\neffect = \"sometimes\"",
        "[[schedule]]\nname = \"s\"\ncron = \"* * * * *\"\ntext = \"hi\"\noverlap = \"maybe\"",
        "[budgets]\ntokens = \"many\"",
    ] {
        assert!(
            !validator.is_valid(&as_json(wrong)),
            "the schema accepts {wrong:?}"
        );
    }
}
