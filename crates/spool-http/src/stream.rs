//! The NDJSON stream: what each journal event and live delta becomes as
//! stream lines, and the body that writes them to one client.
//!
//! Every line type is a [`StreamEventType`] variant. Journal events are
//! mapped explicitly: the ones a client acts on become the seed's types
//! (with a `run_state` line on every state transition), the others Spool's
//! own types, and the runtime's internal records (model calls, with their
//! full requests) become nothing. Recorded sentinels never reach a client:
//! a tool's result is what the model was shown.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use spool_journal::{Envelope, Event, RunId, Seq};
use spool_runtime::engine::Delta;
use spool_runtime::hub::{LiveDelta, StreamItem, Subscription};
use spool_wire::http::data::{self, to_data};
use spool_wire::http::{RunState, StreamEvent, StreamEventType};
use spool_wire::sentinel::{self, Sentinel};
use tokio::sync::watch;
use tokio_util::sync::ReusableBoxFuture;

use crate::fanout::{Fanouts, Member, Take};
use crate::lines::LineCache;

/// Lines already read are written together up to this many bytes: one
/// wake and one write for a burst, not one per line.
pub const STREAM_BATCH_BYTES: usize = 16 * 1024;

/// One item of a run's subscription as stream lines (none, one or two).
/// `last` is the last journal position written so far (the cursor a
/// reader resumes after); journal events move it, live deltas carry it.
///
/// Public so an in-process client shows a run exactly as the stream does,
/// and other transports can map events the same way.
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
fn lagged_line(run: &RunId, last: Option<Seq>) -> StreamEvent {
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
fn event_lines(envelope: &Envelope) -> Vec<StreamEvent> {
    let event = &envelope.event;
    let line = |kind: StreamEventType, turn: Option<String>, text: Option<String>| StreamEvent {
        run_id: envelope.run_id.to_string(),
        seq: envelope.seq.0,
        kind,
        time: envelope.recorded_at,
        turn_id: turn,
        text,
        state: None,
        data: None,
    };
    let mut primary = match event {
        Event::RunCreated(created) => {
            // Who made it stays out: a principal is not the stream's to show.
            let mut line = line(StreamEventType::RunCreated, None, None);
            line.state = Some(RunState::Pending);
            line.data = Some(to_data(&data::RunCreatedData {
                title: created.title.clone(),
                kind: created.kind.clone(),
                address: created.address.as_ref().map(ToString::to_string),
            }));
            Some(line)
        }
        Event::TurnStarted(started) => {
            let mut line = line(
                StreamEventType::RunTurn,
                Some(started.turn_id.to_string()),
                Some(started.input.clone()),
            );
            // The input is the line's text; the rest of the record is
            // the turn's policy and its one-turn context.
            line.data = Some(to_data(&data::RunTurnData {
                policy: started.policy.as_str().to_owned(),
                context: started.context.clone(),
            }));
            Some(line)
        }
        Event::InputSteered(steered) => {
            let mut line = line(
                StreamEventType::RunInput,
                Some(steered.turn_id.to_string()),
                Some(steered.input.clone()),
            );
            line.data = Some(to_data(&data::RunInputData {
                policy: "steer".into(),
            }));
            Some(line)
        }
        Event::InputQueued(queued) => {
            let mut line = line(StreamEventType::RunInput, None, Some(queued.input.clone()));
            line.data = Some(to_data(&data::RunInputData {
                policy: "queue".into(),
            }));
            Some(line)
        }
        // The runtime's own records: a model call's request carries the
        // whole conversation, and its answer reaches clients as deltas and
        // as the turn's response.
        Event::ModelCallRequested(_) | Event::ModelCallCompleted(_) => None,
        // A schedule's record run is not the channel's to stream (it is
        // never reachable through it); its firings show in the schedule
        // routes.
        Event::ScheduleFired(_) | Event::ScheduleDelivered(_) => None,
        Event::ToolCallRequested(call) => {
            let mut line = line(StreamEventType::ToolCall, None, None);
            line.data = Some(to_data(&data::ToolCallData {
                call_id: call.call_id.clone(),
                name: call.tool.clone(),
                input: call.input.clone(),
                effect: call.effect.as_str().to_owned(),
            }));
            Some(line)
        }
        Event::ToolCallCompleted(done) => match Sentinel::decode(&done.output) {
            Ok(None) => {
                let mut line = line(
                    StreamEventType::ToolResult,
                    None,
                    Some(sentinel::content_string(&done.output)),
                );
                line.data = Some(to_data(&data::ToolResultData {
                    call_id: done.call_id.clone(),
                    ..Default::default()
                }));
                Some(line)
            }
            Ok(Some(Sentinel::Failure(failure))) => {
                let mut line = line(
                    StreamEventType::ToolResult,
                    None,
                    Some(format!("error: {}", failure.message)),
                );
                line.data = Some(to_data(&data::ToolResultData {
                    call_id: done.call_id.clone(),
                    error: Some(failure.message.clone()),
                    ..Default::default()
                }));
                Some(line)
            }
            // A suspension or a sleep: its own lines say so.
            Ok(Some(_)) | Err(_) => None,
        },
        Event::ToolCallResolved(resolved) => {
            let mut line = line(
                StreamEventType::ToolResult,
                None,
                Some(sentinel::content_string(&resolved.output)),
            );
            line.data = Some(to_data(&data::ToolResultData {
                call_id: resolved.call_id.clone(),
                resolved: true,
                ..Default::default()
            }));
            Some(line)
        }
        Event::ToolCallAbandoned(abandoned) => {
            let mut line = line(StreamEventType::ToolResult, None, None);
            line.data = Some(to_data(&data::ToolResultData {
                call_id: abandoned.call_id.clone(),
                abandoned: true,
                ..Default::default()
            }));
            Some(line)
        }
        Event::Suspended(suspended) => {
            let mut line = line(
                StreamEventType::RunSuspend,
                Some(suspended.turn_id.to_string()),
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
            Some(line)
        }
        Event::BudgetExceeded(exceeded) => {
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
            Some(line)
        }
        Event::Resumed(resumed) => {
            let mut line = line(
                StreamEventType::RunResume,
                Some(resumed.turn_id.to_string()),
                None,
            );
            line.data = Some(to_data(&data::RunResumeData {
                turn_id: resumed.turn_id.to_string(),
                answers: resumed
                    .answers
                    .iter()
                    .map(|answer| data::AnswerData {
                        text: answer.text.clone(),
                        approved: answer.approved,
                    })
                    .collect(),
            }));
            Some(line)
        }
        Event::CancelRequested(cancel) => Some(line(
            StreamEventType::RunCancelRequested,
            cancel.turn_id.as_ref().map(ToString::to_string),
            None,
        )),
        Event::TurnCompleted(completed) => {
            let mut line = line(
                StreamEventType::RunResponse,
                Some(completed.turn_id.to_string()),
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
            Some(line)
        }
        Event::ContextCleared(_) | Event::Compacted(_) => {
            let change = if matches!(event, Event::Compacted(_)) {
                "compacted"
            } else {
                "cleared"
            };
            let mut line = line(StreamEventType::RunContext, None, None);
            line.data = Some(to_data(&data::RunContextData {
                change: change.into(),
            }));
            Some(line)
        }
        Event::AddressBound(binding) | Event::AddressUnbound(binding) => {
            let mut line = line(StreamEventType::RunAddress, None, None);
            line.data = Some(to_data(&data::RunAddressData {
                address: binding.address.to_string(),
                bound: matches!(event, Event::AddressBound(_)),
            }));
            Some(line)
        }
        // Transitions only: the run_state line below is all they say.
        Event::SleepStarted(_)
        | Event::SleepCompleted(_)
        | Event::TurnFailed(_)
        | Event::TurnCancelled(_)
        | Event::RunRetired(_) => None,
    };
    // Every state transition also has its run_state line, after the line
    // that caused it.
    let state = state_after(event).map(|state| {
        let turn = match event {
            Event::TurnFailed(f) => Some(f.turn_id.to_string()),
            Event::TurnCancelled(c) => Some(c.turn_id.to_string()),
            _ => primary.as_ref().and_then(|p| p.turn_id.clone()),
        };
        let text = match event {
            Event::TurnFailed(f) => Some(f.message.clone()),
            _ => None,
        };
        let mut line = line(StreamEventType::RunState, turn, text);
        line.state = Some(state);
        line.data = match event {
            Event::TurnFailed(failed) => Some(data::RunStateData::Failed(data::FailedData {
                turn_id: failed.turn_id.to_string(),
                code: failed.code.as_str().to_owned(),
                message: failed.message.clone(),
            })),
            Event::SleepStarted(sleep) => Some(data::RunStateData::Sleeping(data::SleepData {
                call_id: sleep.call_id.clone(),
                wake_at: sleep.wake_at,
            })),
            Event::RunRetired(retired) => Some(data::RunStateData::Retired(data::RetiredData {
                reason: retired.reason.clone(),
                namespace: retired.namespace.clone(),
            })),
            _ => None,
        }
        .as_ref()
        .map(to_data);
        line
    });
    if let (Some(primary), Some(state)) = (primary.as_mut(), &state) {
        primary.state = state.state.clone();
    }
    primary.into_iter().chain(state).collect()
}

/// The run's state after `event`, when `event` moves it.
fn state_after(event: &Event) -> Option<RunState> {
    spool_journal::fold::moved_to(event).map(|status| status.state().into())
}

/// A live delta as a stream line. Its `seq` is the last journal position
/// before it: a delta is not a position of its own.
fn delta_line(
    run: &RunId,
    last: Option<Seq>,
    turn: &spool_journal::TurnId,
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

/// Appends `lines` as NDJSON to `bytes`.
fn write_lines(bytes: &mut Vec<u8>, lines: &[StreamEvent]) {
    for line in lines {
        serde_json::to_writer(&mut *bytes, line).expect("stream lines are plain JSON");
        bytes.push(b'\n');
    }
}

/// A run's stream as a response body, polled by the connection's own
/// task. Until it has caught up it reads its own subscription: an append
/// wakes the task, which reads the new lines and writes them. Once caught
/// up it joins the run's driver (`crate::fanout`), which reads and encodes
/// each batch once for every stream joined to it, and the task only
/// writes the bytes it is handed.
///
/// A reader that stops reading holds little here: the connection stops
/// polling the body once the socket and hyper's bounded write buffer are
/// full; a joined stream keeps up to `fanout::QUEUED_BYTES` of batches
/// (shared with the other streams) and then leaves the driver, and durable
/// events wait in the journal until it reads again. Only live deltas
/// cannot wait: a reader that falls more than the hub's `DELTA_QUEUE`
/// behind them is sent a `lagged` line with the cursor to resume from, and
/// the stream ends. It never sees a silent close. The stream also ends
/// when the client goes (the connection drops the body) or when `closing`
/// turns true.
pub(crate) struct StreamBody {
    mode: Mode,
    /// Resolves when the caller's session ends before the stream does (its
    /// token revoked); absent where it cannot.
    ending: Option<ReusableBoxFuture<'static, ()>>,
    /// The connection's socket, when the run's driver may write to it:
    /// marked busy whenever a frame goes to hyper, so that nothing the
    /// driver writes overtakes it.
    tap: Option<Arc<spool_edge::tap::Tap>>,
}

enum Mode {
    /// Reading its own subscription.
    OnItsOwn(ReusableBoxFuture<'static, Next>),
    /// Writing what its run's driver hands it.
    Joined(Parts, Member),
    Ended,
}

/// What a stream's own read comes to.
enum Next {
    /// Bytes to write, and the stream to read on.
    Bytes(Lines, Bytes),
    /// The stream joined its run's driver.
    Joined(Parts, Member),
    /// The stream has ended.
    End,
}

impl StreamBody {
    pub(crate) fn new(parts: Parts, subscription: Subscription) -> Self {
        let tap = parts.tap.clone();
        let lines = Lines {
            parts,
            subscription: Box::new(subscription),
        };
        Self {
            mode: Mode::OnItsOwn(ReusableBoxFuture::new(lines.next())),
            ending: None,
            tap,
        }
    }

    /// The same stream, ended when `ending` turns true.
    pub(crate) fn ending(mut self, mut ending: watch::Receiver<bool>) -> Self {
        self.ending = Some(ReusableBoxFuture::new(async move {
            let _ = ending.wait_for(|ending| *ending).await;
        }));
        self
    }

    /// `bytes` as the next frame for hyper to write.
    fn frame(&self, bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(tap) = &self.tap {
            tap.busy();
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(ending) = &mut self.ending
            && ending.poll(cx).is_ready()
        {
            // Leaving the run's driver (dropping the member) before the
            // body ends: nothing more is written for this stream.
            self.ending = None;
            self.mode = Mode::Ended;
            return Poll::Ready(None);
        }
        loop {
            match &mut self.mode {
                Mode::Ended => return Poll::Ready(None),
                Mode::OnItsOwn(next) => match std::task::ready!(next.poll(cx)) {
                    Next::Bytes(lines, bytes) => {
                        // The same future's layout: the box is reused.
                        next.set(lines.next());
                        return self.frame(bytes);
                    }
                    Next::Joined(parts, member) => self.mode = Mode::Joined(parts, member),
                    Next::End => self.mode = Mode::Ended,
                },
                Mode::Joined(_, member) => match std::task::ready!(member.poll_take(cx)) {
                    // Marked busy as it was taken.
                    Take::Bytes(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                    Take::Ended => self.mode = Mode::Ended,
                    Take::Lagged(resting) => {
                        let Mode::Joined(parts, _) = std::mem::replace(&mut self.mode, Mode::Ended)
                        else {
                            unreachable!("matched as joined just above")
                        };
                        let last = resting.next.0.checked_sub(1).map(Seq);
                        let mut line = Vec::new();
                        write_lines(&mut line, &[lagged_line(&parts.run, last)]);
                        return self.frame(Bytes::from(line));
                    }
                    Take::OnItsOwn(subscription) => {
                        let Mode::Joined(parts, member) =
                            std::mem::replace(&mut self.mode, Mode::Ended)
                        else {
                            unreachable!("matched as joined just above")
                        };
                        drop(member);
                        let lines = Lines {
                            parts,
                            subscription,
                        };
                        self.mode = Mode::OnItsOwn(ReusableBoxFuture::new(lines.next()));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.mode, Mode::Ended)
    }
}

/// The encoded lines every stream of a run shares: a journal event's, by
/// its position, and a live delta's, by its number. When a commit or a
/// delta wakes a thousand streams, the first encodes the line and the rest
/// copy its bytes.
#[derive(Debug, Default)]
pub(crate) struct SharedLines {
    events: LineCache,
    deltas: LineCache,
}

impl SharedLines {
    pub(crate) fn event(&self, envelope: &Envelope) -> Bytes {
        self.events.line(envelope, |envelope| {
            let mut line = Vec::new();
            write_lines(&mut line, &event_lines(envelope));
            Bytes::from(line)
        })
    }

    /// A delta's line, with the time the first stream wrote it. Its `seq`
    /// is the last position before it (`after - 1`), the same on every
    /// stream: a delta is delivered just after the events before its place
    /// and before the rest.
    pub(crate) fn delta(&self, run: &RunId, delta: &LiveDelta) -> Bytes {
        // A delta's number names it within its run.
        self.deltas.get_or_encode(run, Seq(delta.n), || {
            let last = delta.after.0.checked_sub(1).map(Seq);
            let mut line = Vec::new();
            write_lines(
                &mut line,
                &[delta_line(run, last, &delta.turn, &delta.delta)],
            );
            Bytes::from(line)
        })
    }
}

/// What a stream needs whichever way it reads.
pub(crate) struct Parts {
    pub(crate) run: RunId,
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) shared: Arc<SharedLines>,
    pub(crate) fanouts: Arc<Fanouts>,
    /// The connection's socket, when its run's driver may write to it.
    pub(crate) tap: Option<Arc<spool_edge::tap::Tap>>,
    /// Counts the stream as open while it lives.
    pub(crate) _open: OpenStream,
}

/// A stream reading its own subscription; moved into each read.
struct Lines {
    parts: Parts,
    subscription: Box<Subscription>,
}

impl Lines {
    /// The next bytes to write: every line already read, up to
    /// `STREAM_BATCH_BYTES`, so a subscriber catching up after a burst is
    /// written to once. Once caught up where its run's driver rests, the
    /// stream joins it instead.
    async fn next(mut self) -> Next {
        loop {
            match self.parts.fanouts.join(self.subscription, &self.parts) {
                Ok(member) => return Next::Joined(self.parts, member),
                Err(subscription) => self.subscription = subscription,
            }
            let item = tokio::select! {
                item = self.subscription.next() => item,
                _ = self.parts.closing.wait_for(|closing| *closing) => None,
            };
            let Some(mut item) = item else {
                return Next::End;
            };
            let mut bytes = Vec::new();
            loop {
                match &item {
                    StreamItem::Event(envelope) => {
                        bytes.extend_from_slice(&self.parts.shared.event(envelope));
                    }
                    StreamItem::Delta(delta) => {
                        bytes.extend_from_slice(&self.parts.shared.delta(&self.parts.run, delta));
                    }
                    // The subscription has ended: `next` then answers
                    // `None`.
                    StreamItem::Lagged { last } => {
                        write_lines(&mut bytes, &[lagged_line(&self.parts.run, *last)]);
                    }
                }
                if bytes.len() >= STREAM_BATCH_BYTES {
                    break;
                }
                match self.subscription.ready() {
                    Some(next) => item = next,
                    None => break,
                }
            }
            // An event that reaches no client (a model call) writes nothing.
            if !bytes.is_empty() {
                return Next::Bytes(self, Bytes::from(bytes));
            }
        }
    }
}

/// One open stream, counted in [`HttpChannel::open_streams`](crate::HttpChannel::open_streams)
/// while it lives.
pub(crate) struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    pub(crate) fn new(streams: &Arc<watch::Sender<usize>>) -> Self {
        streams.send_modify(|open| *open += 1);
        Self(Arc::clone(streams))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_journal::event::{ModelCallRequested, TurnCompleted};

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
            turn_id: spool_journal::TurnId::new("t1").unwrap(),
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
}
