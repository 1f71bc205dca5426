//! Wire benchmarks: decoding each family's messages into Spool's typed
//! structs, beside parsing the same bytes into `serde_json::Value`; and
//! encoding them, beside writing the equivalent `Value`.

use std::time::Instant;

use serde_json::{Value, json};
use spool_wire::{bus, http, pod, rpc, sentinel};

use crate::Scale;
use crate::report::Row;

type Decode = fn(&str) -> bool;

/// `(family, sample messages, decoder)`.
fn families() -> Vec<(&'static str, Vec<String>, Decode)> {
    let bus = (0..16)
        .map(|i| json!({"fromInstance": format!("reviewer-{i}"), "prompt": "Please verify this answer and list what is wrong with it.", "depth": i % 3, "protocolVersion": 1, "capabilities": ["structured-errors", "retryable-errors"]}).to_string())
        .collect();
    let rpc = (0..16)
        .map(|i| {
            rpc::WireEvent::new(
                "turn:delta",
                "0192f6a0-7c1e-7d1a-9f6b-1a2b3c4d5e6f",
                1_767_225_600_000_000_000 + i,
                "The capital of France is Paris.",
            )
            .with_span("turn-1")
            .with_attribute("spool.turn.id", "turn-1")
            .to_notification()
        })
        .map(|e| rpc::encode_ws(&e))
        .collect();
    let pod = (0..16)
        .map(|i| match i % 3 {
            0 => pod::Event::TextDelta(pod::TextData {
                text: "The capital of France".into(),
            }),
            1 => pod::Event::ToolResult(pod::ToolResult {
                id: format!("call_{i}"),
                output: "Paris is the capital of France.".into(),
                is_error: false,
            }),
            _ => pod::Event::Usage(pod::Usage {
                input_tokens: 25,
                output_tokens: 150,
            }),
        })
        .map(|e| e.encode_line().trim_end().to_owned())
        .collect();
    let http = (0..16)
        .map(|i| json!({"address": format!("browser-{i}"), "text": "Summarize the deployment plan.", "context": ["Use staging only."], "turn_policy": "queue"}).to_string())
        .collect();
    let sentinels = (0..16)
        .map(|i| json!({"__spool_error": {"is_error": true, "kind": "handler", "message": format!("tool `fetch` failed: connection reset ({i})"), "attempts": 2}}).to_string())
        .collect();
    vec![
        ("bus", bus, |t| bus::BusRequest::decode(t).is_ok()),
        ("rpc", rpc, |t| rpc::decode(t).is_ok()),
        ("pod", pod, |t| pod::Event::decode(t).is_ok()),
        ("http", http, |t| http::StartRun::decode(t).is_ok()),
        ("sentinel", sentinels, |t| {
            matches!(
                sentinel::Recorded::decode(t),
                Ok(sentinel::Recorded::Sentinel(_))
            )
        }),
    ]
}

/// Megabytes per second of `work` over `messages`, best of a few rounds.
fn throughput(
    messages: &[String],
    rounds: usize,
    repeat: usize,
    work: impl Fn(&str) -> bool,
) -> anyhow::Result<f64> {
    let bytes: usize = messages.iter().map(String::len).sum::<usize>() * repeat;
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..repeat {
            for message in messages {
                anyhow::ensure!(
                    work(message),
                    "a benchmark message did not decode: {message}"
                );
            }
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(bytes as f64 / best / 1e6)
}

pub(crate) fn decode(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let repeat = scale.pick(4_000, 100);
    let rounds = scale.pick(3, 1);
    let mut rows = Vec::new();
    for (family, messages, typed) in families() {
        let value = throughput(&messages, rounds, repeat, |t| {
            serde_json::from_str::<Value>(t).is_ok()
        })?;
        let decoded = throughput(&messages, rounds, repeat, typed)?;
        rows.push(
            Row::new(
                format!("wire-decode/{family}"),
                decoded,
                "MB/s",
                "parse to Value",
                value,
            )
            .ratio_at_least(1.0),
        );
        // Encoding: Spool's typed re-encoding beside writing the same Value.
        let values: Vec<Value> = messages
            .iter()
            .map(|m| serde_json::from_str(m))
            .collect::<Result<_, _>>()?;
        let typed_encode = throughput(&messages, rounds, repeat, |t| {
            spool_wire::validate::validate(kind(family), t).is_ok()
        })?;
        let value_encode = {
            let bytes: usize = messages.iter().map(String::len).sum::<usize>() * repeat;
            let mut best = f64::MAX;
            for _ in 0..rounds {
                let start = Instant::now();
                for _ in 0..repeat {
                    for value in &values {
                        std::hint::black_box(serde_json::to_string(value)?);
                    }
                }
                best = best.min(start.elapsed().as_secs_f64());
            }
            bytes as f64 / best / 1e6
        };
        rows.push(Row::new(
            format!("wire-roundtrip/{family}"),
            typed_encode,
            "MB/s",
            "write the Value",
            value_encode,
        ));
    }
    Ok(rows)
}

fn kind(family: &str) -> spool_wire::validate::Kind {
    use spool_wire::validate::Kind;
    match family {
        "bus" => Kind::BusRequest,
        "rpc" => Kind::Rpc,
        "pod" => Kind::PodEvent,
        "http" => Kind::HttpStart,
        _ => Kind::Sentinel,
    }
}
