//! A run's activity as NDJSON stream lines: the HTTP channel's table over
//! [`spool_runtime::activity`].
//!
//! Every line type is a [`StreamEventType`] variant. The facts a client
//! acts on become the seed's types (with a `run_state` line after the line
//! of every state change), the others Spool's own types, and the model
//! call's records (with their full requests) become nothing: its answer
//! reaches clients as deltas and as the turn's response. Recorded sentinels
//! never reach a client: a tool's result is what the model was shown, a
//! malformed record a failed result.
//!
//! A journal event's lines are encoded once and shared by every stream of
//! its run, so they are read with [`Reader::stateless`]: a line says only
//! what its event says.

use spool_journal::{Envelope, RunId, Seq, TurnId};
use spool_runtime::activity::{Activity, Reader, ToolOutcome, TurnOutcome};
use spool_runtime::engine::Delta;
use spool_runtime::hub::StreamItem;
use spool_wire::http::data::{self, to_data};
use spool_wire::http::{RunState, StreamEvent, StreamEventType};

/// One item of a run's subscription as stream lines (none, one or two).
/// `last` is the last journal position written so far (the cursor a
/// reader resumes after); journal events move it, live deltas carry it.
///
/// Public so an in-process client shows a run exactly as the stream does.
pub fn stream_lines(run: &RunId, last: &mut Option<Seq>, item: &StreamItem) -> Vec<StreamEvent> {
    match item {
        StreamItem::Event(envelope) => {
            *last = Some(envelope.seq);
            event_lines(envelope)
        }
        StreamItem::Delta(delta) => vec![delta_line(run, *last, &delta.turn, &delta.delta)],
        // The reader fell behind the live hub: the line tells it where to
        // resume, and the stream ends.
        StreamItem::Lagged { last } => vec![lagged_line(run, *last)],
    }
}

/// The `lagged` line: the stream ends here; resume after `last`.
pub(crate) fn lagged_line(run: &RunId, last: Option<Seq>) -> StreamEvent {
    StreamEvent {
        run_id: run.to_string(),
        seq: last.map_or(0, |s| s.0),
        kind: StreamEventType::Lagged,
        time: time::OffsetDateTime::now_utc(),
        turn_id: None,
        text: None,
        state: None,
        data: None,
    }
}

/// The lines a journal event becomes.
pub(crate) fn event_lines(envelope: &Envelope) -> Vec<StreamEvent> {
    let line = |kind: StreamEventType, turn: Option<&TurnId>, text: Option<String>| StreamEvent {
        run_id: envelope.run_id.to_string(),
        seq: envelope.seq.0,
        kind,
        time: envelope.recorded_at,
        turn_id: turn.map(ToString::to_string),
        text,
        state: None,
        data: None,
    };
    let mut primary: Option<StreamEvent> = None;
    // What the run_state line of this event says beyond the state.
    let mut state_turn: Option<&TurnId> = None;
    let mut state_text = None;
    let mut state_data = None;
    let mut lines = Vec::new();
    for fact in Reader::stateless().envelope(envelope) {
        match fact {
            Activity::Created(created) => {
                // Who made it stays out: a principal is not the stream's
                // to show.
                let mut line = line(StreamEventType::RunCreated, None, None);
                line.state = Some(RunState::Pending);
                line.data = Some(to_data(&data::RunCreatedData {
                    title: created.title.clone(),
                    kind: created.kind.clone(),
                    address: created.address.as_ref().map(ToString::to_string),
                }));
                primary = Some(line);
            }
            Activity::TurnStarted { started, .. } => {
                // The input is the line's text; the rest of the record is
                // the turn's policy and its one-turn context.
                let mut line = line(
                    StreamEventType::RunTurn,
                    Some(&started.turn_id),
                    Some(started.input.clone()),
                );
                line.data = Some(to_data(&data::RunTurnData {
                    policy: started.policy.as_str().to_owned(),
                    context: started.context.clone(),
                }));
                primary = Some(line);
            }
            Activity::Input { input, turn, .. } => {
                let mut line = line(StreamEventType::RunInput, turn, Some(input.to_owned()));
                line.data = Some(to_data(&data::RunInputData {
                    policy: if turn.is_some() { "steer" } else { "queue" }.into(),
                }));
                primary = Some(line);
            }
            Activity::ToolCallStarted(call) => {
                let mut line = line(StreamEventType::ToolCall, None, None);
                line.data = Some(to_data(&data::ToolCallData {
                    call_id: call.call_id.clone(),
                    name: call.tool.clone(),
                    input: call.input.clone(),
                    effect: call.effect.as_str().to_owned(),
                }));
                primary = Some(line);
            }
            Activity::ToolCallEnded {
                call_id, outcome, ..
            } => primary = tool_result(&line, &call_id, &outcome),
            Activity::Suspended(suspended) => {
                let mut line = line(
                    StreamEventType::RunSuspend,
                    Some(&suspended.turn_id),
                    Some(suspended.prompt.clone()),
                );
                line.data = Some(to_data(&data::RunSuspendData::Suspended(
                    data::SuspendData {
                        turn_id: suspended.turn_id.to_string(),
                        kind: spool_wire::http::SuspendKind::parse(suspended.kind.as_str()),
                        prompt: suspended.prompt.clone(),
                        call_id: suspended.call_id.clone(),
                        input_schema: suspended.input_schema.as_deref().cloned(),
                        options: suspended.options.clone(),
                    },
                )));
                primary = Some(line);
            }
            Activity::BudgetStopped(exceeded) => {
                let mut line = line(
                    StreamEventType::RunSuspend,
                    None,
                    Some(format!(
                        "the {} budget is used up ({} of {})",
                        exceeded.budget, exceeded.used, exceeded.limit
                    )),
                );
                line.data = Some(to_data(&data::RunSuspendData::Budget(data::BudgetData {
                    budget: exceeded.budget.as_str().to_owned(),
                    limit: exceeded.limit,
                    used: exceeded.used,
                })));
                primary = Some(line);
            }
            Activity::Resumed { turn, answers } => {
                let mut line = line(StreamEventType::RunResume, Some(turn), None);
                line.data = Some(to_data(&data::RunResumeData {
                    turn_id: turn.to_string(),
                    answers: answers
                        .iter()
                        .map(|answer| data::AnswerData {
                            text: answer.text.clone(),
                            approved: answer.approved,
                        })
                        .collect(),
                }));
                primary = Some(line);
            }
            Activity::CancelRequested(cancel) => {
                primary = Some(line(
                    StreamEventType::RunCancelRequested,
                    cancel.turn_id.as_ref(),
                    None,
                ));
            }
            Activity::TurnEnded(TurnOutcome::Completed(completed)) => {
                let mut line = line(
                    StreamEventType::RunResponse,
                    Some(&completed.turn_id),
                    completed.response.clone(),
                );
                line.data = Some(to_data(&data::RunResponseData {
                    turn_id: completed.turn_id.to_string(),
                    response: completed.response.clone(),
                    usage: completed.usage.map(|usage| spool_wire::http::Usage {
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                    }),
                }));
                primary = Some(line);
            }
            // A failure and a cancellation are their run_state line.
            Activity::TurnEnded(TurnOutcome::Failed(failed)) => {
                state_turn = Some(&failed.turn_id);
                state_text = Some(failed.message.clone());
                state_data = Some(data::RunStateData::Failed(data::FailedData {
                    turn_id: failed.turn_id.to_string(),
                    code: failed.code.as_str().to_owned(),
                    message: failed.message.clone(),
                }));
            }
            Activity::TurnEnded(TurnOutcome::Cancelled(cancelled)) => {
                state_turn = Some(&cancelled.turn_id);
            }
            Activity::SleepStarted(sleep) => {
                state_data = Some(data::RunStateData::Sleeping(data::SleepData {
                    call_id: sleep.call_id.clone(),
                    wake_at: sleep.wake_at,
                }));
            }
            Activity::Retired(retired) => {
                state_data = Some(data::RunStateData::Retired(data::RetiredData {
                    reason: retired.reason.clone(),
                    namespace: retired.namespace.clone(),
                }));
            }
            Activity::ContextChanged { cleared } => {
                let mut line = line(StreamEventType::RunContext, None, None);
                line.data = Some(to_data(&data::RunContextData {
                    change: if cleared { "cleared" } else { "compacted" }.into(),
                }));
                primary = Some(line);
            }
            Activity::AddressChanged { address, bound } => {
                let mut line = line(StreamEventType::RunAddress, None, None);
                line.data = Some(to_data(&data::RunAddressData {
                    address: address.to_string(),
                    bound,
                }));
                primary = Some(line);
            }
            // Every state change has its run_state line, after the line
            // that caused it, which carries the new state too.
            Activity::StateChanged(status) => {
                let state: RunState = status.state().into();
                let mut state_line = line(StreamEventType::RunState, state_turn, state_text.take());
                if state_turn.is_none() {
                    state_line.turn_id = primary.as_ref().and_then(|p| p.turn_id.clone());
                }
                state_line.state = Some(state.clone());
                state_line.data = state_data.take().as_ref().map(to_data);
                if let Some(mut primary) = primary.take() {
                    primary.state = Some(state);
                    lines.push(primary);
                }
                lines.push(state_line);
            }
            // The model call's records, and a tool call parking (its
            // suspension or sleep says so).
            _ => {}
        }
    }
    lines.extend(primary);
    lines
}

/// A tool call's `tool_result` line: its result as the model saw it, or
/// the failure; none for the ends a stateless reading does not show (a
/// sleep's waking is its run_state line).
fn tool_result(
    line: &impl Fn(StreamEventType, Option<&TurnId>, Option<String>) -> StreamEvent,
    call_id: &str,
    outcome: &ToolOutcome<'_>,
) -> Option<StreamEvent> {
    let mut result = data::ToolResultData {
        call_id: call_id.to_owned(),
        ..Default::default()
    };
    let text = match outcome {
        ToolOutcome::Output(_) | ToolOutcome::Resolved(_) => {
            result.resolved = matches!(outcome, ToolOutcome::Resolved(_));
            Some(outcome.text())
        }
        ToolOutcome::Failed(failure) => {
            result.error = Some(failure.message.clone());
            Some(outcome.text())
        }
        ToolOutcome::Malformed(malformed) => {
            result.error = Some(format!("malformed recorded output: {malformed}"));
            Some(outcome.text())
        }
        ToolOutcome::Abandoned(_) => {
            result.abandoned = true;
            None
        }
        ToolOutcome::Answered(_) | ToolOutcome::Woke { .. } | ToolOutcome::Interrupted => {
            return None;
        }
    };
    let mut line = line(StreamEventType::ToolResult, None, text);
    line.data = Some(to_data(&result));
    Some(line)
}

/// A live delta as a stream line. Its `seq` is the last journal position
/// before it: a delta is not a position of its own.
pub(crate) fn delta_line(
    run: &RunId,
    last: Option<Seq>,
    turn: &TurnId,
    delta: &Delta,
) -> StreamEvent {
    let (kind, text, data) = match delta {
        Delta::Text(text) => (StreamEventType::TextDelta, Some(text.clone()), None),
        Delta::Thinking(text) => (StreamEventType::ThinkingDelta, Some(text.clone()), None),
        Delta::ToolCallStart { id, name } => (
            StreamEventType::ToolCallStart,
            None,
            Some(to_data(&data::ToolCallStartData {
                id: id.clone(),
                name: name.clone(),
            })),
        ),
        Delta::ToolCallArguments { id, fragment } => (
            StreamEventType::ToolCallArgsDelta,
            None,
            Some(to_data(&data::ToolCallArgsDeltaData {
                id: id.clone(),
                json: fragment.clone(),
            })),
        ),
        Delta::ToolCallDone {
            id,
            name,
            arguments,
        } => (
            StreamEventType::ToolCallDone,
            None,
            Some(to_data(&data::ToolCallDoneData {
                id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            })),
        ),
        Delta::ToolProgress { id, message } => (
            StreamEventType::ToolProgress,
            Some(message.clone()),
            Some(to_data(&data::ToolProgressData {
                id: id.clone(),
                message: message.clone(),
            })),
        ),
    };
    StreamEvent {
        run_id: run.to_string(),
        seq: last.map_or(0, |s| s.0),
        kind,
        time: time::OffsetDateTime::now_utc(),
        turn_id: Some(turn.to_string()),
        text,
        state: None,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_journal::Event;
    use spool_journal::event::{ModelCallRequested, ToolCallCompleted, TurnCompleted};

    fn envelope(event: Event) -> Envelope {
        Envelope {
            run_id: RunId::new("r").unwrap(),
            seq: Seq(3),
            recorded_at: time::OffsetDateTime::UNIX_EPOCH,
            event,
        }
    }

    #[test]
    fn a_model_call_reaches_no_client_and_a_response_carries_its_run_state() {
        let request = envelope(Event::ModelCallRequested(ModelCallRequested {
            request_hash: "sha256:aa".into(),
            new_messages: vec![serde_json::json!({"role": "user", "content": "a secret plan"})],
        }));
        assert!(event_lines(&request).is_empty());
        let done = envelope(Event::TurnCompleted(TurnCompleted {
            turn_id: TurnId::new("t1").unwrap(),
            response: Some("hi".into()),
            usage: None,
        }));
        let lines = event_lines(&done);
        let kinds: Vec<_> = lines.iter().map(|l| l.kind.clone()).collect();
        assert_eq!(
            kinds,
            [StreamEventType::RunResponse, StreamEventType::RunState]
        );
        assert!(lines.iter().all(|l| l.state == Some(RunState::Completed)));
    }

    #[test]
    fn a_malformed_recorded_output_is_a_failed_tool_result_line() {
        let done = envelope(Event::ToolCallCompleted(ToolCallCompleted {
            call_id: "c1".into(),
            output: std::sync::Arc::new(serde_json::json!({"__spool_sleep": 3})),
        }));
        let lines = event_lines(&done);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].kind, StreamEventType::ToolResult);
        let data = lines[0].data.as_ref().expect("a result's data");
        let error = data["error"].as_str().expect("an error");
        assert!(error.starts_with("malformed recorded output"), "{error}");
    }
}
