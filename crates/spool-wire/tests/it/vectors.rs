//! Every JSON example in the five seeds decodes and re-encodes to the same
//! JSON value.

use serde_json::Value;
use spool_wire::validate::{Kind, validate};

const SEEDS: &str = include_str!("../vectors/seeds.jsonl");

fn vectors() -> Vec<(usize, Kind, String, Value)> {
    SEEDS
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let vector: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("vector line {}: {e}", index + 1));
            let kind = Kind::from_name(vector["kind"].as_str().unwrap()).unwrap();
            let note = format!(
                "seed {} line {}: {}",
                vector["seed"],
                index + 1,
                vector["note"]
            );
            (index + 1, kind, note, vector["value"].clone())
        })
        .collect()
}

#[test]
fn every_seed_example_decodes_and_re_encodes_to_the_same_json_value() {
    let vectors = vectors();
    for (_, kind, note, value) in &vectors {
        let encoded = validate(*kind, &value.to_string())
            .unwrap_or_else(|e| panic!("{note}: refused: {e:?}"));
        let back: Value = serde_json::from_str(&encoded).unwrap();
        assert_eq!(&back, value, "{note}: re-encoding changed the value");
    }
}

#[test]
fn the_vectors_cover_all_five_seeds_and_every_pod_method_and_documented_event() {
    let vectors = vectors();
    for seed in ["000", "001", "002", "003", "004"] {
        assert!(
            vectors
                .iter()
                .any(|(_, _, note, _)| note.contains(&format!("seed \"{seed}\""))),
            "seed {seed} has no vector"
        );
    }
    let names: Vec<String> = vectors
        .iter()
        .filter_map(|(_, _, _, v)| {
            v.get("event")
                .or_else(|| v.get("method"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    // The document lists five methods and fourteen events; `run_end` (the
    // fifteenth) comes from the protocol's implementation, not its document.
    for name in spool_wire::pod::Event::NAMES
        .iter()
        .filter(|n| **n != "run_end")
    {
        assert!(
            names.iter().any(|n| n == name),
            "no vector for pod event {name}"
        );
    }
    for name in ["run", "resume", "cancel", "get_status", "get_history"] {
        assert!(
            names.iter().any(|n| n == name),
            "no vector for pod method {name}"
        );
    }
}

#[test]
fn seed_examples_in_json_rpc_shape_encode_byte_for_byte_as_the_seed_prints_them() {
    // The seed prints envelopes with `jsonrpc` first; Spool writes them that
    // way, so a transcript compared as text matches.
    let cases = [
        r#"{"jsonrpc":"2.0","id":1,"method":"state.snapshot"}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#,
    ];
    for case in cases {
        assert_eq!(validate(Kind::Rpc, case).unwrap(), case);
    }
}
