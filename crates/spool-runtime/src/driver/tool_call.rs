//! A turn's tool steps: each call matched against the record, replayed
//! from its one completion (which may be a sentinel), or run live under a
//! permit with its intent written ahead; a dangling write parks the run
//! for an operator instead of running blind.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use spool_journal::Event;
use spool_journal::cursor::{SleepStep, SuspendStep, ToolStep};
use spool_journal::event::{
    Answer, Effect, SleepStarted, Suspended, ToolCallAbandoned, ToolCallCompleted,
    ToolCallRequested, TurnFailed,
};
use spool_journal::store::{CallRef, Claim, ClaimKey};
use spool_wire::run::{FailureCode, SuspendKind};
use spool_wire::sentinel::{self, FailureKind, Sentinel, ToolFailure};
use tracing::Instrument;

use super::caught;
use super::model::TurnCtx;
use crate::engine::ToolCall;
use crate::error::RuntimeError;
use crate::runtime::Inner;
use crate::tool::{Tool, ToolContext, ToolOutcome};

/// What a tool step came to.
pub(super) enum Step {
    /// A result for the model.
    Result(String),
    /// A person's answers, the model's result.
    Answered(Vec<Answer>),
    /// The run parked.
    Parked,
    /// The turn ended.
    Ended,
}

/// A live call's one completion, the events that follow it, and what the
/// turn does next; or the tool panicked, and nobody knows what it did.
enum Executed {
    Done(Value, Vec<Event>, Step),
    Panicked(String),
}

impl Inner {
    pub(super) async fn tool_step(
        self: &Arc<Self>,
        ctx: &mut TurnCtx,
        call: &ToolCall,
    ) -> Result<Step, RuntimeError> {
        let tool = ctx.tools.tools.get(&call.name).cloned();
        if let Some(prompt) = tool.as_ref().and_then(|t| t.approval(&call.arguments)) {
            // The approval is a call of its own, before this one, through
            // the built-in tool, whatever tools the agent turned on: a
            // replay meets it first and goes on only past a `true`.
            let gate = ToolCall {
                id: format!("{}.approval", call.id),
                name: "request_approval".into(),
                arguments: serde_json::json!({ "prompt": prompt }),
            };
            let approval: Arc<dyn Tool> = Arc::new(crate::tools::RequestApproval);
            match self.step_with(ctx, &gate, Some(approval), false).await? {
                Step::Answered(answers)
                    if !answers.is_empty() && answers.iter().all(|a| a.approved == Some(true)) => {}
                Step::Answered(answers) => return Ok(Step::Result(refused(call, &answers))),
                other => return Ok(other),
            }
        }
        self.step_with(ctx, call, tool, true).await
    }

    /// One call of `tool` (none: no tool has the call's name), its input
    /// checked against the tool's schema when `checked`.
    async fn step_with(
        self: &Arc<Self>,
        ctx: &mut TurnCtx,
        call: &ToolCall,
        tool: Option<Arc<dyn Tool>>,
        checked: bool,
    ) -> Result<Step, RuntimeError> {
        let request = ToolCallRequested {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.arguments.clone(),
            effect: tool.as_ref().map_or(Effect::Read, |t| t.effect()),
            idempotency_key: tool
                .as_ref()
                .and_then(|t| t.idempotency_key(&call.arguments)),
        };
        let step = ctx
            .cursor
            .tool_call(&request)
            .map_err(|d| RuntimeError::corrupt(&ctx.run, d.to_string()))?;
        match step {
            ToolStep::Replayed(output) => self.replayed_output(ctx, call, &output),
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
                    turn_id: ctx.turn.clone(),
                    code: FailureCode::ToolAbandoned,
                    message,
                });
                ctx.release();
                self.end_turn(&ctx.run, failed).await?;
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
                        turn_id: ctx.turn.clone(),
                        kind: SuspendKind::Reconciliation,
                        prompt,
                        call_id: Some(call.id.clone()),
                        input_schema: None,
                        options: None,
                    });
                    self.append(&ctx.run, vec![event]).await?;
                }
                Ok(Step::Parked)
            }
            ToolStep::Live(permit) | ToolStep::Retry { permit, .. } => {
                if !permit.intent_recorded() {
                    self.append(&ctx.run, vec![Event::ToolCallRequested(request.clone())])
                        .await?;
                }
                let span = tracing::info_span!(
                    "tool_call",
                    tool = %call.name,
                    call_id = %call.id,
                    outcome = tracing::field::Empty,
                    duration_ms = tracing::field::Empty,
                );
                let started = Instant::now();
                // Progress is placed as a model's delta is: at the run's
                // head when it is made.
                let progress: Arc<dyn Fn(String) + Send + Sync> = {
                    let inner = Arc::clone(self);
                    let (run, turn, head) = (ctx.run.clone(), ctx.turn.clone(), ctx.head());
                    let id = call.id.clone();
                    Arc::new(move |message| {
                        let at =
                            spool_journal::Seq(head.load(std::sync::atomic::Ordering::Acquire));
                        let delta = crate::engine::Delta::ToolProgress {
                            id: id.clone(),
                            message,
                        };
                        inner.hub.publish(&run, &turn, at, delta);
                    })
                };
                let executed = self
                    .execute(ctx, tool.as_ref(), &request, checked, progress)
                    .instrument(span.clone())
                    .await;
                span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
                match executed {
                    Executed::Done(output, extra, step) => {
                        span.record("outcome", outcome_name(&output, &step));
                        self.complete(ctx, call, output, extra, step).await
                    }
                    Executed::Panicked(panic) => {
                        span.record("outcome", "panicked");
                        tracing::error!(parent: &span, run_id = %ctx.run, %panic, "a tool panicked; its turn fails");
                        // What the call did is unknown: the turn fails
                        // rather than guess, and the call is given up, which
                        // also releases an idempotency claim it won, so the
                        // key is not held in flight for ever.
                        let events = vec![
                            Event::ToolCallAbandoned(ToolCallAbandoned {
                                call_id: call.id.clone(),
                                reason: Some("the tool panicked".into()),
                                operator: None,
                            }),
                            Event::TurnFailed(TurnFailed {
                                turn_id: ctx.turn.clone(),
                                code: FailureCode::Internal,
                                message: format!("tool `{}` panicked: {panic}", call.name),
                            }),
                        ];
                        ctx.release();
                        self.append(&ctx.run, events).await?;
                        self.hub.end_turn(&ctx.run);
                        Ok(Step::Ended)
                    }
                }
            }
        }
    }

    /// Records a live call's one completion and what follows it.
    async fn complete(
        self: &Arc<Self>,
        ctx: &TurnCtx,
        call: &ToolCall,
        output: Value,
        extra: Vec<Event>,
        step: Step,
    ) -> Result<Step, RuntimeError> {
        let mut events = vec![Event::ToolCallCompleted(ToolCallCompleted {
            call_id: call.id.clone(),
            output: output.into(),
        })];
        let sleep = extra.iter().find_map(|e| match e {
            Event::SleepStarted(s) => Some(s.clone()),
            _ => None,
        });
        events.extend(extra);
        self.append(&ctx.run, events).await?;
        if let Some(sleep) = sleep {
            self.arm_sleep(&ctx.run, sleep);
        }
        Ok(step)
    }

    /// Runs a tool call and lays out its one completion, the events that
    /// follow it, and what the turn does next.
    async fn execute(
        &self,
        ctx: &TurnCtx,
        tool: Option<&Arc<dyn Tool>>,
        request: &ToolCallRequested,
        checked: bool,
        progress: Arc<dyn Fn(String) + Send + Sync>,
    ) -> Executed {
        let failed = |kind, message: String, attempts| {
            let content = format!("error: {message}");
            Executed::Done(
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
        if let (true, Err(problems)) = (
            checked,
            ctx.tools.tools.check_input(&request.tool, &request.input),
        ) {
            return failed(
                FailureKind::InvalidInput,
                format!("invalid input for `{}`: {problems}", request.tool),
                0,
            );
        }
        if request.effect == Effect::Idempotent && tool.keyed() && request.idempotency_key.is_none()
        {
            return failed(
                FailureKind::InvalidInput,
                format!(
                    "`{}` needs an idempotency key in its input, and this call has none",
                    request.tool
                ),
                0,
            );
        }
        if let (Effect::Idempotent, Some(key)) = (request.effect, &request.idempotency_key) {
            let claim_key = ClaimKey {
                tool: request.tool.clone(),
                key: key.clone(),
            };
            let holder = CallRef {
                run: ctx.run.clone(),
                call_id: request.call_id.clone(),
            };
            match self.journal.claim(&claim_key, &holder).await {
                Ok(Claim::Won) => {}
                Ok(Claim::Settled { output, .. }) => {
                    let content = sentinel::content_string(&output);
                    return Executed::Done(output, Vec::new(), Step::Result(content));
                }
                Err(error) => return failed(FailureKind::Handler, error.to_string(), 0),
            }
        }
        let attempts = if request.effect == Effect::Write {
            1
        } else {
            tool.attempts().max(1)
        };
        let context = ToolContext::new(ctx.run.clone(), ctx.turn.clone(), &request.call_id)
            .with_principal(ctx.principal.clone())
            .with_progress(progress);
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            let outcome =
                match caught(|| tool.call_in(&context, request.input.clone(), &ctx.token)).await {
                    Ok(outcome) => outcome,
                    Err(panic) => return Executed::Panicked(panic),
                };
            if matches!(outcome, ToolOutcome::Error(_))
                && attempt < attempts
                && !ctx.token.is_cancelled()
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
                Executed::Done(value, Vec::new(), Step::Result(content))
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
                    turn_id: ctx.turn.clone(),
                    kind: suspension.kind,
                    prompt: suspension.prompt,
                    call_id: Some(request.call_id.clone()),
                    input_schema: Some(suspension.answer_schema.into()),
                    options: suspension.options,
                });
                Executed::Done(
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
                Executed::Done(Sentinel::Sleep(sleep).encode(), vec![event], Step::Parked)
            }
        }
    }

    /// Continues from a recorded tool output, which may be a sentinel.
    fn replayed_output(
        self: &Arc<Self>,
        ctx: &mut TurnCtx,
        call: &ToolCall,
        output: &Value,
    ) -> Result<Step, RuntimeError> {
        let corrupt = |reason: String| RuntimeError::corrupt(&ctx.run, reason);
        match Sentinel::decode(output).map_err(|e| corrupt(e.to_string()))? {
            None => Ok(Step::Result(sentinel::content_string(output))),
            Some(Sentinel::Failure(failure)) => {
                Ok(Step::Result(format!("error: {}", failure.message)))
            }
            Some(Sentinel::Suspend(parked)) => {
                let recorded = ctx
                    .cursor
                    .peek_suspension()
                    .filter(|s| s.call_id.as_deref() == Some(call.id.as_str()))
                    .cloned()
                    .ok_or_else(|| {
                        corrupt(format!(
                            "call {} parked, but no suspension follows it",
                            call.id
                        ))
                    })?;
                // The completion and the suspension say one wait: a signal
                // for both, or a person's for both.
                let on_signal = parked.kind == Some(sentinel::SuspensionKind::Signal);
                if on_signal != (recorded.kind == SuspendKind::Signal) {
                    return Err(corrupt(format!(
                        "call {} parked on {}, but its suspension waits for {}",
                        call.id,
                        if on_signal { "a signal" } else { "a person" },
                        recorded.kind.as_str()
                    )));
                }
                match ctx
                    .cursor
                    .suspend(&recorded)
                    .map_err(|d| corrupt(d.to_string()))?
                {
                    SuspendStep::Replayed(resumed) => Ok(Step::Answered(resumed.answers)),
                    SuspendStep::Parked => Ok(Step::Parked),
                    SuspendStep::Live(_) => Err(corrupt("a recorded suspension vanished".into())),
                }
            }
            Some(Sentinel::Sleep(sleep)) => {
                match ctx
                    .cursor
                    .sleep(&call.id)
                    .map_err(|d| corrupt(d.to_string()))?
                {
                    SleepStep::Woke { early } => Ok(Step::Result(sentinel::content_string(
                        &sentinel::slept_output(early.unwrap_or(sleep.wake_at)),
                    ))),
                    SleepStep::Sleeping(started) => {
                        self.arm_sleep(&ctx.run, started);
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
}

/// What the model is told of a call a person did not approve.
fn refused(call: &ToolCall, answers: &[Answer]) -> String {
    let said: Vec<&str> = answers
        .iter()
        .map(|a| a.text.trim())
        .filter(|t| !t.is_empty())
        .collect();
    let said = if said.is_empty() {
        String::new()
    } else {
        format!(": {}", said.join("; "))
    };
    if answers.iter().any(|a| a.approved == Some(false)) {
        format!(
            "error: the person rejected the call to `{}`{said}",
            call.name
        )
    } else {
        format!(
            "error: the call to `{}` was not run: the person answered without approving it{said}",
            call.name
        )
    }
}

/// A short name for what a live call came to, for its span.
fn outcome_name(output: &Value, step: &Step) -> &'static str {
    match (step, Sentinel::is_reserved(output)) {
        (Step::Parked, _) => "parked",
        (_, true) => "failed",
        _ => "output",
    }
}
