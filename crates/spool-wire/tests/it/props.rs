//! Property tests: encode → decode is the identity for every family, and no
//! decoder panics on any input.

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value};
use spool_wire::validate::{Kind, validate};
use spool_wire::{bus, canonical, http, line, pod, rpc, sentinel};

/// A known code, or an unknown one that cannot collide with a known one.
fn code<T: Clone + std::fmt::Debug + 'static>(
    known: &'static [T],
    unknown: fn(String) -> T,
) -> impl Strategy<Value = T> {
    prop_oneof![
        proptest::sample::select(known),
        "[a-z_]{1,12}".prop_map(move |s| unknown(format!("x_{s}"))),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{0,16}", "\\PC{0,8}"]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e15..1.0e15f64).prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    btree_map(text(), json_value(), 0..4).prop_map(|m| m.into_iter().collect())
}

fn capabilities() -> impl Strategy<Value = Option<Vec<bus::Capability>>> {
    option::of(vec(
        code(bus::Capability::KNOWN, bus::Capability::Unknown),
        0..4,
    ))
}

fn bus_request() -> impl Strategy<Value = bus::BusRequest> {
    (
        "[a-z]{1,8}",
        text(),
        any::<u64>(),
        option::of(Just(1u64)),
        capabilities(),
        option::of(json_object()),
    )
        .prop_map(
            |(from_instance, prompt, depth, protocol_version, capabilities, ext)| bus::BusRequest {
                from_instance,
                prompt,
                depth,
                protocol_version,
                capabilities,
                ext,
            },
        )
}

fn bus_response() -> impl Strategy<Value = bus::BusResponse> {
    (
        any::<bool>(),
        option::of(text()),
        option::of(text()),
        option::of(code(bus::ErrorCode::KNOWN, bus::ErrorCode::Unknown)),
        option::of(any::<bool>()),
        option::of(any::<u64>()),
        option::of(Just(1u64)),
        capabilities(),
        btree_map("y_[a-z]{1,6}", json_value(), 0..3),
    )
        .prop_map(
            |(
                success,
                text,
                error,
                error_code,
                retryable,
                duration_ms,
                protocol_version,
                capabilities,
                extra,
            )| {
                bus::BusResponse {
                    success,
                    text,
                    from_instance: Some("worker".into()),
                    error,
                    error_code,
                    retryable,
                    duration_ms,
                    protocol_version,
                    capabilities,
                    extra: extra.into_iter().collect(),
                }
            },
        )
}

fn id() -> impl Strategy<Value = rpc::Id> {
    prop_oneof![
        any::<i64>().prop_map(rpc::Id::from),
        text().prop_map(rpc::Id::String),
        Just(rpc::Id::Null),
    ]
}

fn params() -> impl Strategy<Value = Option<Value>> {
    option::of(prop_oneof![
        json_object().prop_map(Value::Object),
        vec(json_value(), 0..4).prop_map(Value::Array),
    ])
}

fn envelope() -> impl Strategy<Value = rpc::Envelope> {
    prop_oneof![
        (id(), text(), params()).prop_map(|(id, method, params)| rpc::Envelope::Request(
            rpc::Request { id, method, params }
        )),
        (text(), params()).prop_map(|(method, params)| rpc::Envelope::notification(method, params)),
        (id(), json_value())
            .prop_map(|(id, result)| rpc::Envelope::Response(rpc::Response::result(id, result))),
        (id(), any::<i64>(), text(), option::of(json_value())).prop_map(
            |(id, code, message, data)| {
                rpc::Envelope::Response(rpc::Response::error(
                    id,
                    rpc::ErrorObject {
                        code,
                        message,
                        data,
                    },
                ))
            }
        ),
    ]
}

fn wire_event() -> impl Strategy<Value = rpc::WireEvent> {
    (
        any::<u64>(),
        1u8..=24,
        option::of(text()),
        text(),
        json_object(),
        text(),
        option::of(text()),
        text(),
    )
        .prop_map(
            |(
                time_unix_nano,
                severity,
                severity_text,
                body,
                attributes,
                trace_id,
                span_id,
                kind,
            )| rpc::WireEvent {
                time_unix_nano,
                severity_number: rpc::Severity::new(severity).unwrap(),
                severity_text,
                body,
                attributes,
                trace_id,
                span_id,
                kind,
            },
        )
}

fn pod_method() -> impl Strategy<Value = pod::Method> {
    prop_oneof![
        text().prop_map(|input| pod::Method::Run { input }),
        Just(pod::Method::Resume { answer: None }),
        (text(), proptest::option::of(any::<bool>())).prop_map(|(text, approved)| {
            pod::Method::Resume {
                answer: Some(pod::ResumeAnswer { text, approved }),
            }
        }),
        Just(pod::Method::Cancel),
        Just(pod::Method::GetStatus),
        Just(pod::Method::GetHistory),
    ]
}

fn pod_event() -> impl Strategy<Value = pod::Event> {
    use pod::*;
    prop_oneof![
        any::<u64>().prop_map(|turn| Event::TurnStart(TurnStart { turn })),
        (any::<u64>(), code(TurnResult::KNOWN, TurnResult::Unknown))
            .prop_map(|(turn, result)| Event::TurnEnd(TurnEnd { turn, result })),
        text().prop_map(|text| Event::TextDelta(TextData { text })),
        text().prop_map(|text| Event::ThinkingDone(TextData { text })),
        (text(), text(), text()).prop_map(|(id, name, arguments)| Event::ToolCallDone(
            ToolCallDone {
                id,
                name,
                arguments
            }
        )),
        (text(), text(), any::<bool>()).prop_map(|(id, output, is_error)| Event::ToolResult(
            ToolResult {
                id,
                output,
                is_error
            }
        )),
        (code(PodState::KNOWN, PodState::Unknown), text(), text()).prop_map(
            |(state, session_id, pod_name)| Event::Status(Status {
                state,
                session_id,
                pod_name
            })
        ),
        (any::<u64>(), any::<u64>()).prop_map(|(input_tokens, output_tokens)| Event::Usage(
            Usage {
                input_tokens,
                output_tokens
            }
        )),
        (code(ErrorCode::KNOWN, ErrorCode::Unknown), text())
            .prop_map(|(code, message)| Event::error(code, message)),
        vec((text(), text()), 0..3).prop_map(|calls| Event::History(History {
            items: calls
                .into_iter()
                .map(|(call_id, output)| HistoryItem::ToolResult {
                    id: None,
                    call_id,
                    output
                })
                .collect(),
        })),
        ("x_[a-z]{1,8}", json_value()).prop_map(|(event, data)| Event::Unknown { event, data }),
    ]
}

fn sentinel_value() -> impl Strategy<Value = sentinel::Sentinel> {
    use sentinel::*;
    prop_oneof![
        (
            text(),
            json_value(),
            // Only known kinds: an unknown one is malformed, not a
            // suspension (`an_unknown_suspension_kind_is_malformed_…`).
            option::of(proptest::sample::select(SuspensionKind::KNOWN))
        )
            .prop_map(
                |(reason, input_schema, kind)| Sentinel::Suspend(Suspension {
                    reason,
                    input_schema,
                    kind
                })
            ),
        (-62_135_596_800i64..253_402_300_799i64).prop_map(|secs| {
            Sentinel::Sleep(Sleep::until(
                time::OffsetDateTime::from_unix_timestamp(secs).unwrap(),
            ))
        }),
        (
            code(FailureKind::KNOWN, FailureKind::Unknown),
            text(),
            any::<u32>()
        )
            .prop_map(|(kind, message, attempts)| Sentinel::Failure(ToolFailure {
                kind,
                message,
                attempts
            })),
    ]
}

fn start_run() -> impl Strategy<Value = http::StartRun> {
    (
        text(),
        option::of("[a-z0-9/-]{1,12}"),
        option::of(text()),
        option::of(text()),
        option::of(vec(text(), 0..3)),
        option::of(prop_oneof![
            Just(http::TurnPolicy::Steer),
            Just(http::TurnPolicy::Queue)
        ]),
    )
        .prop_map(
            |(text, address, title, kind, context, turn_policy)| http::StartRun {
                text,
                address,
                operation_id: None,
                title,
                kind,
                context,
                turn_policy,
                auth: None,
                upgrade: None,
            },
        )
}

fn run_reply() -> impl Strategy<Value = http::RunReply> {
    (
        text(),
        code(http::RunState::KNOWN, http::RunState::Unknown),
        option::of(text()),
        option::of(any::<u64>()),
        option::of(text()),
        option::of((
            code(http::SuspendKind::KNOWN, http::SuspendKind::Unknown),
            text(),
            option::of(vec(text(), 0..3)),
        )),
        option::of((any::<u64>(), any::<u64>())),
    )
        .prop_map(
            |(run_id, state, turn_id, cursor, response, suspend, usage)| http::RunReply {
                run_id,
                state,
                turn_id: turn_id.clone(),
                cursor,
                response,
                suspend: suspend.map(|(kind, prompt, options)| http::Suspend {
                    kind,
                    prompt,
                    options,
                    tool_call_id: None,
                    turn_id,
                }),
                usage: usage.map(|(input_tokens, output_tokens)| http::Usage {
                    input_tokens,
                    output_tokens,
                }),
            },
        )
}

fn stream_event() -> impl Strategy<Value = http::StreamEvent> {
    (
        text(),
        any::<u64>(),
        code(http::StreamEventType::KNOWN, http::StreamEventType::Unknown),
        0i64..4_102_444_800,
        0u32..1_000_000_000,
        option::of(text()),
        option::of(
            json_value().prop_filter("null data reads as absent, as Go decodes it", |v| {
                !v.is_null()
            }),
        ),
    )
        .prop_map(
            |(run_id, seq, kind, secs, nanos, text, data)| http::StreamEvent {
                run_id,
                seq,
                kind,
                time: time::OffsetDateTime::from_unix_timestamp(secs).unwrap()
                    + time::Duration::nanoseconds(i64::from(nanos)),
                turn_id: None,
                text,
                state: None,
                data,
            },
        )
}

/// A member's value: one a message or a sentinel would carry, or anything.
fn member_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::from("2.0")),
        Just(serde_json::json!({"code": -32000, "message": "failed"})),
        Just(Value::from("2026-08-14T09:00:00Z")),
        Just(Value::from(true)),
        Just(Value::from(false)),
        Just(Value::Null),
        Just(Value::from(2)),
        Just(Value::from(2.0)),
        Just(Value::from(-1)),
        Just(Value::from(5_000_000_000u64)),
        json_value(),
    ]
}

/// Objects over the names the direct readers know (and one they do not),
/// as text; sometimes with a name repeated, which only a `Value` resolves.
fn object_text(names: &'static [&'static str]) -> impl Strategy<Value = String> {
    (
        btree_map(proptest::sample::select(names), member_value(), 0..5),
        option::of((proptest::sample::select(names), member_value())),
    )
        .prop_map(|(members, repeated)| {
            let body = Value::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            )
            .to_string();
            match repeated {
                Some((name, value)) if body.len() > 2 => {
                    format!("{{{}:{value},{}", Value::from(name), &body[1..])
                }
                Some((name, value)) => format!("{{{}:{value}}}", Value::from(name)),
                None => body,
            }
        })
}

/// Calls as a client or a server usually sends them (`jsonrpc` "2.0" and
/// a string `method` first), with other members after: known, unknown or
/// repeated. The quickest reading takes the plain ones and must refuse
/// the rest to the general one.
fn call_text() -> impl Strategy<Value = String> {
    (
        text(),
        object_text(&[
            "jsonrpc", "id", "method", "params", "result", "error", "other",
        ]),
    )
        .prop_map(|(method, rest)| {
            let head = format!(r#"{{"jsonrpc":"2.0","method":{}"#, Value::from(method));
            match rest.strip_prefix('{') {
                Some("}") | None => format!("{head}}}"),
                Some(members) => format!("{head},{members}"),
            }
        })
}

/// A sentinel's text, whole or with its body changed: a member dropped,
/// replaced or added, or the body an array or another value.
fn sentinel_text() -> impl Strategy<Value = String> {
    const KEYS: &[&str] = &[
        sentinel::SUSPEND_KEY,
        sentinel::SLEEP_KEY,
        sentinel::ERROR_KEY,
        "rows",
    ];
    const FIELDS: &[&str] = &[
        "reason",
        "input_schema",
        "kind",
        "wake_at",
        "is_error",
        "message",
        "attempts",
        "other",
    ];
    prop_oneof![
        sentinel_value().prop_map(|s| s.encode().to_string()),
        (
            sentinel_value(),
            proptest::sample::select(FIELDS),
            option::of(member_value())
        )
            .prop_map(|(s, field, value)| {
                let mut encoded = s.encode();
                let body = encoded
                    .as_object_mut()
                    .unwrap()
                    .values_mut()
                    .next()
                    .unwrap();
                let body = body.as_object_mut().unwrap();
                match value {
                    Some(value) => body.insert(field.to_owned(), value),
                    None => body.remove(field),
                };
                encoded.to_string()
            }),
        (proptest::sample::select(KEYS), member_value())
            .prop_map(|(key, body)| serde_json::json!({ key: body }).to_string()),
        (proptest::sample::select(KEYS), vec(member_value(), 0..5))
            .prop_map(|(key, fields)| serde_json::json!({ key: fields }).to_string()),
        object_text(KEYS),
        json_value().prop_map(|v| v.to_string()),
    ]
}

/// Encodes with serde, validates as `kind`, and decodes Spool's re-encoding.
fn through<T: serde::Serialize + serde::de::DeserializeOwned>(kind: Kind, message: &T) -> T {
    let encoded = serde_json::to_string(message).unwrap();
    let reencoded = validate(kind, &encoded).unwrap_or_else(|e| panic!("{encoded} refused: {e:?}"));
    serde_json::from_str(&reencoded).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bus_requests_round_trip(request in bus_request()) {
        prop_assert_eq!(through(Kind::BusRequest, &request), request);
    }

    #[test]
    fn bus_responses_round_trip(response in bus_response()) {
        prop_assert_eq!(through(Kind::BusResponse, &response), response);
    }

    #[test]
    fn rpc_envelopes_round_trip_through_every_framing(envelope in envelope(), seq in option::of(any::<u64>())) {
        prop_assert_eq!(rpc::decode(&rpc::encode_ws(&envelope)).unwrap(), rpc::Frame::Single(envelope.clone()));
        let line = rpc::encode_ndjson(&envelope);
        prop_assert_eq!(rpc::decode(line.trim_end_matches('\n')).unwrap(), rpc::Frame::Single(envelope.clone()));
        let frame = rpc::SseFrame::parse(&rpc::encode_sse(&envelope, seq));
        prop_assert_eq!(frame.id, seq.map(|s| s.to_string()));
        prop_assert_eq!(rpc::decode(&frame.data).unwrap(), rpc::Frame::Single(envelope));
    }

    #[test]
    fn rpc_batches_round_trip(envelopes in vec(envelope(), 1..5)) {
        let rpc::Frame::Batch(entries) = rpc::decode(&rpc::encode_batch(&envelopes)).unwrap() else {
            return Err(TestCaseError::fail("a batch"));
        };
        let decoded: Vec<rpc::Envelope> = entries.into_iter().map(Result::unwrap).collect();
        prop_assert_eq!(decoded, envelopes);
    }

    #[test]
    fn wire_events_round_trip(event in wire_event()) {
        prop_assert_eq!(through(Kind::WireEvent, &event), event);
    }

    #[test]
    fn pod_methods_round_trip(method in pod_method()) {
        prop_assert_eq!(pod::Method::decode(&method.encode_line()).unwrap(), method);
    }

    #[test]
    fn pod_events_round_trip(event in pod_event()) {
        prop_assert_eq!(pod::Event::decode(&event.encode_line()).unwrap(), event);
    }

    #[test]
    fn sentinels_round_trip(sentinel in sentinel_value()) {
        prop_assert_eq!(sentinel::Sentinel::decode(&sentinel.encode()).unwrap(), Some(sentinel));
    }

    #[test]
    fn http_bodies_round_trip(start in start_run(), reply in run_reply(), event in stream_event()) {
        prop_assert_eq!(through(Kind::HttpStart, &start), start);
        prop_assert_eq!(through(Kind::HttpReply, &reply), reply);
        prop_assert_eq!(through(Kind::HttpEvent, &event), event);
    }

    #[test]
    fn the_content_hash_ignores_key_order(map in btree_map(text(), json_value(), 0..6)) {
        let forward: Map<String, Value> = map.clone().into_iter().collect();
        let reversed: Map<String, Value> = map.into_iter().rev().collect();
        prop_assert_eq!(
            canonical::content_hash(&Value::Object(forward)),
            canonical::content_hash(&Value::Object(reversed))
        );
    }

    #[test]
    fn no_decoder_panics_on_arbitrary_text(input in prop_oneof!["\\PC{0,64}", json_value().prop_map(|v| v.to_string())]) {
        for (kind, _) in Kind::ALL {
            let _ = validate(kind, &input);
        }
        let _ = sentinel::Sentinel::decode(&serde_json::from_str(&input).unwrap_or(Value::Null));
        let _ = sentinel::Recorded::decode(&input);
        let _ = rpc::decode_client(&input);
    }

    #[test]
    fn the_line_codec_splits_any_chunking_the_same_and_never_buffers_past_its_cap(
        lines in vec("[ -~]{0,40}", 0..8),
        cuts in vec(0usize..400, 0..6),
        max in 1usize..48,
        unterminated in any::<bool>(),
    ) {
        let mut stream: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if unterminated {
            // The last line arrives without its newline and is read by `finish`.
            stream.pop();
        }
        let mut whole = line::LineCodec::new(max);
        let mut expected = whole.push(stream.as_bytes());
        expected.extend(whole.finish());
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
        cuts.sort_unstable();
        let mut pieces = line::LineCodec::new(max);
        let mut got = Vec::new();
        let mut at = 0;
        for cut in cuts.into_iter().chain([stream.len()]) {
            got.extend(pieces.push(&stream.as_bytes()[at..cut]));
            at = cut;
        }
        got.extend(pieces.finish());
        prop_assert_eq!(&got, &expected);
        for (line, read) in lines.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (l, expected.iter().find(|r| r.number == i as u64 + 1))) {
            let read = read.unwrap();
            if line.len() > max {
                prop_assert_eq!(&read.text, &Err(line::LineError::TooLong { max }));
            } else {
                prop_assert_eq!(&read.text, &Ok(line.trim().to_owned()));
            }
        }
    }
}

proptest! {
    // Many cases: each divergence between the direct reading and the parsed
    // one hides in a narrow corner (a `false`, a float count, an array body).
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn an_rpc_message_read_from_its_text_decodes_as_its_parsed_value_does(
        text in prop_oneof![
            object_text(&["jsonrpc", "id", "method", "params", "result", "error", "other"]),
            call_text(),
            envelope().prop_map(|e| rpc::encode_ws(&e)),
            vec(member_value(), 1..4).prop_map(|v| Value::Array(v).to_string()),
            member_value().prop_map(|v| v.to_string()),
        ]
    ) {
        // The reference: the specification's reading of the parsed value.
        let expected = match serde_json::from_str::<Value>(&text).unwrap() {
            Value::Array(entries) if entries.is_empty() => rpc::decode("[]"),
            Value::Array(entries) => Ok(rpc::Frame::Batch(entries.into_iter().map(rpc::Envelope::from_owned).collect())),
            single => rpc::Envelope::from_owned(single).map(rpc::Frame::Single),
        };
        prop_assert_eq!(rpc::decode(&text), expected);
    }

    #[test]
    fn a_completion_read_from_its_text_decodes_as_its_parsed_value_does(text in sentinel_text()) {
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let expected = match sentinel::Sentinel::decode(&parsed) {
            Ok(Some(sentinel)) => Ok(sentinel::Recorded::Sentinel(sentinel)),
            Ok(None) => Ok(sentinel::Recorded::Output(parsed)),
            Err(malformed) => Err(sentinel::RecordedError::Malformed(malformed)),
        };
        prop_assert_eq!(sentinel::Recorded::decode(&text), expected);
    }
}
