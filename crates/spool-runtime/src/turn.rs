//! The turn driver: one task per run with work to do. It folds the log to
//! see what the run needs, and walks the current turn with the journal's
//! replay cursor, so recorded model and tool results come back and only a
//! permit from the cursor lets it act.

use std::sync::{Arc, PoisonError};

use serde::Deserialize;
use serde_json::{Value, json};
use spool_journal::cursor::{ModelStep, ReplayCursor, SleepStep, SuspendStep, ToolStep};
use spool_journal::event::{
    Answer, Effect, ModelCallCompleted, ModelCallRequested, SleepCompleted, SleepStarted,
    Suspended, ToolCallCompleted, ToolCallRequested, TurnCancelled, TurnCompleted, TurnFailed,
    TurnStarted, Usage,
};
use spool_journal::fold::{Status, fold};
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_wire::http::SuspendKind;
use spool_wire::sentinel::{self, FailureKind, Sentinel, ToolFailure};
use tokio_util::sync::CancellationToken;

use crate::engine::{CallContext, EngineError, Message, ModelRequest, ModelResponse, ToolCall};
use crate::error::RuntimeError;
use crate::runtime::Inner;
use crate::tool::{Tool, ToolOutcome};

/// The conversation a model sees, rebuilt from a log: the system prompt,
/// then every recorded request's new messages and every recorded answer,
/// after clears and compactions.
pub(crate) fn history(log: &[Envelope], system: Option<&str>) -> Vec<Message> {
    let base: Vec<Message> = system
        .map(|s| Message::System {
            content: s.to_owned(),
        })
        .into_iter()
        .collect();
    let mut messages = base.clone();
    for envelope in log {
        match &envelope.event {
            Event::ModelCallRequested(requested) => {
                messages.extend(
                    requested
                        .new_messages
                        .iter()
                        .filter_map(|m| Message::deserialize(m).ok()),
                );
            }
            Event::ModelCallCompleted(completed) => {
                if let Ok(response) = ModelResponse::deserialize(&*completed.message) {
                    messages.push(response.message());
                }
            }
            Event::ContextCleared(_) => messages.clone_from(&base),
            Event::Compacted(compacted) => {
                messages.clone_from(&base);
                messages.push(Message::User {
                    content: format!("Summary of the conversation so far: {}", compacted.summary),
                });
            }
            _ => {}
        }
    }
    messages
}

/// How many turns a log has started.
pub(crate) fn turns(log: &[Envelope]) -> u64 {
    log.iter()
        .filter(|e| matches!(e.event, Event::TurnStarted(_)))
        .count() as u64
}

/// Whether `turn` has reached a boundary: completed, failed, cancelled,
/// parked, or overtaken by a later turn.
pub(crate) fn reached_boundary(log: &[Envelope], turn: &TurnId) -> bool {
    let state = fold(log);
    if state.turn.as_ref() != Some(turn) {
        return log
            .iter()
            .any(|e| matches!(&e.event, Event::TurnStarted(s) if &s.turn_id == turn));
    }
    matches!(
        state.status,
        Status::Completed
            | Status::Failed
            | Status::Cancelled
            | Status::Waiting(_)
            | Status::Retired
    )
}

/// What a tool step came to.
enum Step {
    /// A result for the model.
    Result(String),
    /// The run parked.
    Parked,
    /// The turn ended.
    Ended,
}

/// What the driver should do next, from the run's state.
enum Work {
    Turn,
    EndParkedTurn(TurnId),
    StartQueued,
    Nothing,
}

impl Inner {
    /// Starts the run's driver unless one is running; a running driver is
    /// told to look again before it stops.
    pub(crate) fn ensure_driver(self: Arc<Self>, run: &RunId) {
        {
            let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = driving.get_mut(run) {
                entry.dirty = true;
                return;
            }
            driving.insert(run.clone(), crate::runtime::Driving::default());
        }
        let run = run.clone();
        tokio::spawn(async move { self.drive(run).await });
    }

    async fn drive(self: Arc<Self>, run: RunId) {
        loop {
            let before = self
                .journal
                .subscribe(&run)
                .await
                .map(|p| *p.borrow())
                .unwrap_or_default();
            if let Err(error) = self.step(&run).await {
                // The turn cannot go on; say so in the log when the log can
                // still be written, and stop driving this run.
                let _ = self.fail_turn(&run, "internal", &error.to_string()).await;
                self.stop_driving(&run);
                return;
            }
            let (work, log) = match self.next_work(&run).await {
                Ok(next) => next,
                Err(_) => {
                    self.stop_driving(&run);
                    return;
                }
            };
            // Work that recorded nothing would be done again at once, and
            // again: stop rather than spin, and say why in the log.
            if matches!(work, Work::Turn) && Seq(log.len() as u64) == before {
                let _ = self
                    .fail_turn(&run, "internal", "the turn made no progress")
                    .await;
                self.stop_driving(&run);
                return;
            }
            if matches!(work, Work::Nothing) && self.try_stop_driving(&run) {
                return;
            }
        }
    }

    async fn next_work(&self, run: &RunId) -> Result<(Work, Vec<Envelope>), RuntimeError> {
        let (log, state) = self.load(run).await?;
        let work = match &state.status {
            Status::Running => Work::Turn,
            Status::Waiting(_) if state.cancel_requested.is_some() => {
                Work::EndParkedTurn(state.turn.clone().expect("a waiting run has a turn"))
            }
            Status::Pending | Status::Completed | Status::Failed | Status::Cancelled
                if !state.queued.is_empty() =>
            {
                Work::StartQueued
            }
            _ => Work::Nothing,
        };
        Ok((work, log))
    }

    async fn step(self: &Arc<Self>, run: &RunId) -> Result<(), RuntimeError> {
        let (work, _) = self.next_work(run).await?;
        match work {
            Work::Turn => self.run_turn(run).await,
            Work::EndParkedTurn(turn) => {
                self.append(
                    run,
                    vec![Event::TurnCancelled(TurnCancelled { turn_id: turn })],
                )
                .await?;
                Ok(())
            }
            Work::StartQueued => {
                let (log, state) = self.load(run).await?;
                if let Some((seq, queued)) = state.queued.front().cloned() {
                    let turn = self.ids.turn_id(run, turns(&log) + 1);
                    self.append(
                        run,
                        vec![Event::TurnStarted(TurnStarted {
                            turn_id: turn,
                            input: queued.input,
                            context: queued.context,
                            policy: spool_wire::http::TurnPolicy::Queue,
                            from_queue: Some(seq),
                        })],
                    )
                    .await?;
                }
                Ok(())
            }
            Work::Nothing => Ok(()),
        }
    }

    /// Stops driving unless new work was signalled meanwhile.
    fn try_stop_driving(&self, run: &RunId) -> bool {
        let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
        match driving.get_mut(run) {
            Some(entry) if entry.dirty => {
                entry.dirty = false;
                false
            }
            _ => {
                driving.remove(run);
                true
            }
        }
    }

    fn stop_driving(&self, run: &RunId) {
        self.driving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run);
    }

    fn token(&self, run: &RunId) -> CancellationToken {
        let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = driving.entry(run.clone()).or_default();
        if entry.token.is_cancelled() {
            // A cancelled turn is over; the next one gets a fresh token.
            entry.token = CancellationToken::new();
        }
        entry.token.clone()
    }

    async fn fail_turn(&self, run: &RunId, code: &str, message: &str) -> Result<(), RuntimeError> {
        let (_, state) = self.load(run).await?;
        if let (Status::Running, Some(turn)) = (&state.status, state.turn) {
            self.append(
                run,
                vec![Event::TurnFailed(TurnFailed {
                    turn_id: turn,
                    code: code.to_owned(),
                    message: message.to_owned(),
                })],
            )
            .await?;
        }
        Ok(())
    }

    async fn run_turn(self: &Arc<Self>, run: &RunId) -> Result<(), RuntimeError> {
        // The token first, then the log: a cancel between the two is seen
        // either as its recorded request or on this token. Taken after the
        // read, a token cancelled meanwhile would pass for the last turn's
        // and be replaced, and the cancel lost.
        let token = self.token(run);
        let (log, state) = self.load(run).await?;
        let turn = state.turn.clone().expect("a running run has a turn");
        if state.cancel_requested.is_some() || token.is_cancelled() {
            return self.cancelled(run, &turn).await;
        }
        let corrupt = |reason: String| RuntimeError::ConversationCorrupt {
            run: run.clone(),
            reason,
        };
        let started = log
            .iter()
            .rposition(|e| matches!(&e.event, Event::TurnStarted(s) if s.turn_id == turn))
            .ok_or_else(|| corrupt(format!("turn {turn} has no turn_started")))?;
        let Event::TurnStarted(start) = &log[started].event else {
            unreachable!("rposition found a turn_started")
        };
        let mut conversation = history(&log[..started], self.system_prompt.as_deref());
        let context = (!start.context.is_empty()).then(|| Message::User {
            content: format!("Context for this turn only:\n{}", start.context.join("\n")),
        });
        let mut pending = vec![Message::User {
            content: start.input.clone(),
        }];
        let mut cursor = ReplayCursor::new(log[started + 1..].to_vec(), Seq(log.len() as u64));
        let mut ordinal = log[..started]
            .iter()
            .filter(|e| matches!(e.event, Event::ModelCallRequested(_)))
            .count() as u64;
        let mut steer_from = log[started].seq.next();
        let mut usage = Usage::default();
        let diverged = |d: spool_journal::cursor::Divergence| corrupt(d.to_string());
        loop {
            if token.is_cancelled() {
                return self.cancelled(run, &turn).await;
            }
            // Live, the intent is written under the run's lock together with
            // the steered input read for it, so a replay finds exactly the
            // input that request carried.
            let live = cursor.is_exhausted();
            let lock = self.lock(run);
            let guard = if live { Some(lock.lock().await) } else { None };
            let log = self.journal.read(run, Seq(0)).await?;
            let boundary = cursor.next_action_seq().unwrap_or(Seq(u64::MAX));
            for envelope in log
                .iter()
                .filter(|e| e.seq >= steer_from && e.seq < boundary)
            {
                if let Event::InputSteered(steered) = &envelope.event
                    && steered.turn_id == turn
                {
                    pending.push(Message::User {
                        content: steered.input.clone(),
                    });
                }
            }
            steer_from = boundary.min(Seq(log.len() as u64));
            let mut messages = conversation.clone();
            messages.extend(context.clone());
            messages.extend(pending.iter().cloned());
            let request = ModelRequest {
                messages,
                tools: self.tools.specs(),
            };
            let hash = request.hash();
            let response = match cursor.model_call(&hash).map_err(diverged)? {
                ModelStep::Replayed(done) => {
                    drop(guard);
                    ModelResponse::deserialize(&*done.message).map_err(|e| {
                        corrupt(format!("a recorded model answer does not decode: {e}"))
                    })?
                }
                ModelStep::Live(permit) => {
                    if !permit.intent_recorded() {
                        // Budgets are checked from recorded data, and only
                        // before a new intent: a replayed call, or a dangling
                        // one being made again, passed them when it was
                        // recorded.
                        match budget_verdict(
                            &self.budgets,
                            self.pricing.as_ref(),
                            &log[started..],
                            &turn,
                        ) {
                            Verdict::Within => {}
                            Verdict::Exceeded(exceeded) => {
                                self.journal
                                    .append(
                                        run,
                                        Seq(log.len() as u64),
                                        vec![Event::BudgetExceeded(exceeded)],
                                    )
                                    .await?;
                                drop(guard);
                                self.hub.end_turn(run);
                                return Ok(());
                            }
                            Verdict::Refused(message) => {
                                drop(guard);
                                let failed = Event::TurnFailed(TurnFailed {
                                    turn_id: turn.clone(),
                                    code: "budget".into(),
                                    message,
                                });
                                return self.end_turn(run, &turn, failed).await;
                            }
                        }
                        let new_messages = pending
                            .iter()
                            .map(|m| serde_json::to_value(m).expect("messages are plain JSON"))
                            .collect();
                        let event = Event::ModelCallRequested(ModelCallRequested {
                            request_hash: hash.clone(),
                            new_messages,
                        });
                        self.journal
                            .append(run, Seq(log.len() as u64), vec![event])
                            .await?;
                        steer_from = Seq(log.len() as u64 + 1);
                    }
                    drop(guard);
                    let context = CallContext {
                        run: run.clone(),
                        ordinal,
                    };
                    let after = steer_from;
                    let hub = &self.hub;
                    let publish = |delta| hub.publish(run, &turn, after, delta);
                    match self.engine.call(&context, &request, &publish, &token).await {
                        Ok(response) => {
                            let event = Event::ModelCallCompleted(ModelCallCompleted {
                                message: serde_json::to_value(&response)
                                    .expect("a model answer is plain JSON")
                                    .into(),
                                usage: response.usage,
                                finish_reason: response.finish_reason.clone(),
                            });
                            self.append(run, vec![event]).await?;
                            response
                        }
                        Err(EngineError::Cancelled) => {
                            return self.cancelled(run, &turn).await;
                        }
                        Err(error) => {
                            let failed = Event::TurnFailed(TurnFailed {
                                turn_id: turn.clone(),
                                code: error.code().into(),
                                message: error.to_string(),
                            });
                            return self.end_turn(run, &turn, failed).await;
                        }
                    }
                }
            };
            ordinal += 1;
            if let Some(used) = response.usage {
                usage += used;
            }
            conversation.append(&mut pending);
            conversation.push(response.message());
            if response.tool_calls.is_empty() {
                let done = Event::TurnCompleted(TurnCompleted {
                    turn_id: turn.clone(),
                    response: Some(response.text),
                    usage: Some(usage),
                });
                return self.end_turn(run, &turn, done).await;
            }
            for call in &response.tool_calls {
                match self
                    .tool_step(run, &turn, &token, &mut cursor, call)
                    .await?
                {
                    Step::Result(content) => pending.push(Message::Tool {
                        call_id: call.id.clone(),
                        content,
                    }),
                    Step::Parked => {
                        self.hub.end_turn(run);
                        return Ok(());
                    }
                    Step::Ended => return Ok(()),
                }
            }
        }
    }

    async fn cancelled(&self, run: &RunId, turn: &TurnId) -> Result<(), RuntimeError> {
        let event = Event::TurnCancelled(TurnCancelled {
            turn_id: turn.clone(),
        });
        self.end_turn(run, turn, event).await
    }

    async fn end_turn(
        &self,
        run: &RunId,
        _turn: &TurnId,
        event: Event,
    ) -> Result<(), RuntimeError> {
        self.append(run, vec![event]).await?;
        self.hub.end_turn(run);
        Ok(())
    }

    async fn tool_step(
        self: &Arc<Self>,
        run: &RunId,
        turn: &TurnId,
        token: &CancellationToken,
        cursor: &mut ReplayCursor,
        call: &ToolCall,
    ) -> Result<Step, RuntimeError> {
        let corrupt = |reason: String| RuntimeError::ConversationCorrupt {
            run: run.clone(),
            reason,
        };
        let tool = self.tools.get(&call.name).cloned();
        let request = ToolCallRequested {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.arguments.clone(),
            effect: tool.as_ref().map_or(Effect::Read, |t| t.effect()),
            idempotency_key: tool
                .as_ref()
                .and_then(|t| t.idempotency_key(&call.arguments)),
        };
        match cursor
            .tool_call(&request)
            .map_err(|d| corrupt(d.to_string()))?
        {
            ToolStep::Replayed(output) => self.replayed_output(run, cursor, call, &output).await,
            ToolStep::Abandoned(abandoned) => {
                let message = format!(
                    "tool call {} ({}) was abandoned by an operator{}",
                    call.id,
                    call.name,
                    abandoned
                        .reason
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
                let failed = Event::TurnFailed(TurnFailed {
                    turn_id: turn.clone(),
                    code: "tool_abandoned".into(),
                    message,
                });
                self.end_turn(run, turn, failed).await?;
                Ok(Step::Ended)
            }
            ToolStep::NeedsReconciliation {
                seq,
                evidence,
                parked,
            } => {
                if !parked {
                    let prompt = format!(
                        "tool `{}` (a write) was started at seq {seq} and may or may not have run; resolve it with its output, or abandon it",
                        evidence.tool
                    );
                    let event = Event::Suspended(Suspended {
                        turn_id: turn.clone(),
                        kind: SuspendKind::Reconciliation,
                        prompt,
                        call_id: Some(call.id.clone()),
                        input_schema: None,
                        options: None,
                    });
                    self.append(run, vec![event]).await?;
                }
                Ok(Step::Parked)
            }
            ToolStep::Live(permit) | ToolStep::Retry { permit, .. } => {
                if !permit.intent_recorded() {
                    self.append(run, vec![Event::ToolCallRequested(request.clone())])
                        .await?;
                }
                let (output, extra, step) = self
                    .execute(run, turn, token, tool.as_ref(), &request)
                    .await;
                let mut events = vec![Event::ToolCallCompleted(ToolCallCompleted {
                    call_id: call.id.clone(),
                    output: output.into(),
                })];
                let sleep = extra.iter().find_map(|e| match e {
                    Event::SleepStarted(s) => Some(s.clone()),
                    _ => None,
                });
                events.extend(extra);
                self.append(run, events).await?;
                if let Some(sleep) = sleep {
                    self.arm_sleep(run, sleep);
                }
                Ok(step)
            }
        }
    }

    /// Runs a tool call and lays out its one completion, the events that
    /// follow it, and what the turn does next.
    async fn execute(
        &self,
        run: &RunId,
        turn: &TurnId,
        token: &CancellationToken,
        tool: Option<&Arc<dyn Tool>>,
        request: &ToolCallRequested,
    ) -> (Value, Vec<Event>, Step) {
        let failed = |kind, message: String, attempts| {
            let content = format!("error: {message}");
            (
                Sentinel::Failure(ToolFailure {
                    kind,
                    message,
                    attempts,
                })
                .encode(),
                Vec::new(),
                Step::Result(content),
            )
        };
        let Some(tool) = tool else {
            return failed(
                FailureKind::InvalidInput,
                format!("no tool is named `{}`", request.tool),
                0,
            );
        };
        if let Err(problems) = self.tools.check_input(&request.tool, &request.input) {
            return failed(
                FailureKind::InvalidInput,
                format!("invalid input for `{}`: {problems}", request.tool),
                0,
            );
        }
        if let (Effect::Idempotent, Some(key)) = (request.effect, &request.idempotency_key) {
            let claim_key = spool_journal::store::ClaimKey {
                tool: request.tool.clone(),
                key: key.clone(),
            };
            let holder = spool_journal::store::CallRef {
                run: run.clone(),
                call_id: request.call_id.clone(),
            };
            match self.journal.claim(&claim_key, &holder).await {
                Ok(spool_journal::store::Claim::Won) => {}
                Ok(spool_journal::store::Claim::Settled { output, .. }) => {
                    let content = sentinel::content_string(&output);
                    return (output, Vec::new(), Step::Result(content));
                }
                Err(error) => return failed(FailureKind::Handler, error.to_string(), 0),
            }
        }
        let attempts = if request.effect == Effect::Write {
            1
        } else {
            tool.attempts().max(1)
        };
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            let outcome = tool.call(request.input.clone(), token).await;
            if matches!(outcome, ToolOutcome::Error(_))
                && attempt < attempts
                && !token.is_cancelled()
            {
                continue;
            }
            break outcome;
        };
        match outcome {
            ToolOutcome::Output(value) if Sentinel::is_reserved(&value) => failed(
                FailureKind::OutputSerialization,
                format!(
                    "tool `{}` returned a one-key object under a reserved sentinel name",
                    request.tool
                ),
                attempt,
            ),
            ToolOutcome::Output(value) => {
                let content = sentinel::content_string(&value);
                (value, Vec::new(), Step::Result(content))
            }
            ToolOutcome::Error(message) => failed(FailureKind::Handler, message, attempt),
            ToolOutcome::Suspend(suspension) => {
                let mut recorded = sentinel::Suspension::new(
                    suspension.prompt.clone(),
                    suspension.answer_schema.clone(),
                );
                if suspension.kind == SuspendKind::Signal {
                    recorded = recorded.on_signal();
                }
                let event = Event::Suspended(Suspended {
                    turn_id: turn.clone(),
                    kind: suspension.kind,
                    prompt: suspension.prompt,
                    call_id: Some(request.call_id.clone()),
                    input_schema: Some(suspension.answer_schema),
                    options: suspension.options,
                });
                (
                    Sentinel::Suspend(recorded).encode(),
                    vec![event],
                    Step::Parked,
                )
            }
            ToolOutcome::Sleep(until) => {
                let sleep = sentinel::Sleep::until(until);
                let event = Event::SleepStarted(SleepStarted {
                    call_id: request.call_id.clone(),
                    wake_at: sleep.wake_at,
                });
                (Sentinel::Sleep(sleep).encode(), vec![event], Step::Parked)
            }
        }
    }

    /// Continues from a recorded tool output, which may be a sentinel.
    async fn replayed_output(
        self: &Arc<Self>,
        run: &RunId,
        cursor: &mut ReplayCursor,
        call: &ToolCall,
        output: &Value,
    ) -> Result<Step, RuntimeError> {
        let corrupt = |reason: String| RuntimeError::ConversationCorrupt {
            run: run.clone(),
            reason,
        };
        match Sentinel::decode(output).map_err(|e| corrupt(e.to_string()))? {
            None => Ok(Step::Result(sentinel::content_string(output))),
            Some(Sentinel::Failure(failure)) => {
                Ok(Step::Result(format!("error: {}", failure.message)))
            }
            Some(Sentinel::Suspend(_)) => {
                let recorded = cursor
                    .peek_suspension()
                    .filter(|s| s.call_id.as_deref() == Some(call.id.as_str()))
                    .cloned()
                    .ok_or_else(|| {
                        corrupt(format!(
                            "call {} parked, but no suspension follows it",
                            call.id
                        ))
                    })?;
                match cursor
                    .suspend(&recorded)
                    .map_err(|d| corrupt(d.to_string()))?
                {
                    SuspendStep::Replayed(resumed) => {
                        Ok(Step::Result(render_answers(&resumed.answers)))
                    }
                    SuspendStep::Parked => Ok(Step::Parked),
                    SuspendStep::Live(_) => Err(corrupt("a recorded suspension vanished".into())),
                }
            }
            Some(Sentinel::Sleep(sleep)) => {
                match cursor.sleep(&call.id).map_err(|d| corrupt(d.to_string()))? {
                    SleepStep::Woke => Ok(Step::Result(sentinel::content_string(
                        &sentinel::slept_output(sleep.wake_at),
                    ))),
                    SleepStep::Sleeping(started) => {
                        self.arm_sleep(run, started);
                        Ok(Step::Parked)
                    }
                    SleepStep::Live(_) => Err(corrupt(format!(
                        "call {} slept, but no sleep follows it",
                        call.id
                    ))),
                }
            }
        }
    }

    /// Wakes a sleeping run at its instant: a timer per sleeping run, armed
    /// from the journal (on sleep and on recovery), never a scan of logs.
    pub(crate) fn arm_sleep(self: &Arc<Self>, run: &RunId, sleep: SleepStarted) {
        if !self
            .sleeping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.clone())
        {
            return;
        }
        let inner = Arc::clone(self);
        let run = run.clone();
        tokio::spawn(async move {
            let wait = (sleep.wake_at - time::OffsetDateTime::now_utc()).max(time::Duration::ZERO);
            tokio::time::sleep(std::time::Duration::try_from(wait).unwrap_or_default()).await;
            inner
                .sleeping
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&run);
            let still_sleeping = inner.load(&run).await.is_ok_and(|(_, state)| {
                state
                    .sleep
                    .as_ref()
                    .is_some_and(|s| s.call_id == sleep.call_id)
            });
            if still_sleeping
                && inner
                    .append(
                        &run,
                        vec![Event::SleepCompleted(SleepCompleted {
                            call_id: sleep.call_id.clone(),
                        })],
                    )
                    .await
                    .is_ok()
            {
                inner.clone().ensure_driver(&run);
            }
        });
    }
}

/// Answers as the model sees them: one plain answer as its text; a verdict
/// or several answers as canonical JSON.
fn render_answers(answers: &[Answer]) -> String {
    match answers {
        [
            Answer {
                text,
                approved: None,
            },
        ] => text.clone(),
        [one] => sentinel::content_string(&json!({"approved": one.approved, "text": one.text})),
        many => {
            sentinel::content_string(&serde_json::to_value(many).expect("answers are plain JSON"))
        }
    }
}

/// What the budgets say about one more model call.
enum Verdict {
    Within,
    /// A budget is used up: park the run.
    Exceeded(spool_journal::event::BudgetExceeded),
    /// An operator refused to extend a used-up budget: end the turn.
    Refused(String),
}

/// Checks the budgets against the current turn's recorded events (from its
/// `turn_started` on). An approving answer to a `budget_exceeded` raises
/// that budget to what was used plus its limit again; a rejecting one
/// refuses.
fn budget_verdict(
    budgets: &crate::agent::Budgets,
    pricing: Option<&crate::agent::Pricing>,
    turn_log: &[Envelope],
    turn: &TurnId,
) -> Verdict {
    let mut limits = [
        ("steps_per_turn", budgets.steps_per_turn),
        ("tokens", budgets.tokens),
        ("wall_seconds", budgets.wall_seconds),
        ("cost_micro_usd", budgets.cost_micro_usd()),
    ];
    let mut last: Option<&spool_journal::event::BudgetExceeded> = None;
    for envelope in turn_log {
        match &envelope.event {
            Event::BudgetExceeded(exceeded) => last = Some(exceeded),
            Event::Resumed(resumed) if &resumed.turn_id == turn => {
                if let Some(exceeded) = last.take() {
                    if resumed.answers.iter().any(|a| a.approved == Some(false)) {
                        return Verdict::Refused(format!(
                            "the {} budget ({}) was used up and an operator declined to extend it",
                            exceeded.budget, exceeded.limit
                        ));
                    }
                    for (name, limit) in &mut limits {
                        if *name == exceeded.budget {
                            let base = limit.unwrap_or(exceeded.limit);
                            *limit = Some(exceeded.used.saturating_add(base));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let Some(start) = turn_log.first() else {
        return Verdict::Within;
    };
    let steps = turn_log
        .iter()
        .filter(|e| matches!(e.event, Event::ModelCallRequested(_)))
        .count() as u64;
    let mut spent = Usage::default();
    for envelope in turn_log {
        if let Event::ModelCallCompleted(done) = &envelope.event
            && let Some(usage) = done.usage
        {
            spent += usage;
        }
    }
    let tokens = spent.input_tokens + spent.output_tokens;
    let cost = pricing.map_or(0, |p| p.micro_usd(spent.input_tokens, spent.output_tokens));
    let elapsed = (time::OffsetDateTime::now_utc() - start.recorded_at)
        .whole_seconds()
        .max(0) as u64;
    for (name, limit) in limits {
        let used = match name {
            "steps_per_turn" => steps,
            "tokens" => tokens,
            "cost_micro_usd" => cost,
            _ => elapsed,
        };
        if let Some(limit) = limit
            && used >= limit
        {
            return Verdict::Exceeded(spool_journal::event::BudgetExceeded {
                budget: name.to_owned(),
                limit,
                used,
            });
        }
    }
    Verdict::Within
}
