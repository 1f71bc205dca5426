//! A turn's model steps: the conversation taken from the run's cached
//! history, steered input picked up before each call, budgets checked
//! before a new intent, the intent written ahead of the call, the answer
//! recorded after it.

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use spool_journal::cursor::{ModelStep, ReplayCursor};
use spool_journal::event::{
    ModelCallCompleted, ModelCallRequested, TurnCancelled, TurnCompleted, TurnFailed, TurnStarted,
    Usage,
};
use spool_journal::fold::Status;
use spool_journal::{Event, RunId, Seq, TurnId};
use spool_wire::run::FailureCode;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::caught;
use super::tool_call::Step;
use crate::budget::{self, Verdict};
use crate::engine::{
    CallContext, EngineError, Message, ModelRequest, ModelResponse, REQUEST_HASH_PREFIX,
    RequestHasher,
};
use crate::error::RuntimeError;
use crate::runs::{Cached, Locked};
use crate::runtime::Inner;
use crate::tool::Catalog;

/// One turn being driven: where it is, and the conversation it builds.
pub(super) struct TurnCtx {
    pub(super) run: RunId,
    pub(super) turn: TurnId,
    pub(super) token: CancellationToken,
    pub(super) cursor: ReplayCursor,
    /// Who created the run, for the tools' context.
    pub(super) principal: Option<spool_journal::Principal>,
    /// The agent the run's turns run on (its engine, budgets, tools).
    pub(super) agent: Arc<crate::agents::Agent>,
    /// The tools this turn runs with: the agent's set current when it
    /// began, or the earlier one its recorded requests were made with.
    pub(super) tools: Arc<Catalog>,
    /// The conversation before this turn, shared with the run's cache.
    earlier: Arc<Vec<Message>>,
    /// The hash chain over `earlier` and `answered`.
    hasher: RequestHasher,
    /// This turn's messages the model has already answered, with its
    /// answers.
    answered: Vec<Message>,
    /// The turn's context, shown before the newest messages only.
    context: Option<Message>,
    /// Messages for the next call: the input, steered input, tool results.
    pub(super) pending: Vec<Message>,
    /// The run's model calls before the next one.
    ordinal: u64,
    /// Where steered input not yet picked up starts.
    steer_from: Seq,
    /// The run's head as appends move it (the run's cache keeps it): where
    /// a live delta made now is placed.
    head: Arc<std::sync::atomic::AtomicU64>,
    usage: Usage,
}

/// What a model step came to.
enum ModelOutcome {
    Answered(ModelResponse),
    /// A live answer that calls no tool, not yet recorded: recorded with
    /// the turn's end, when it ends the turn (see `complete_unless_steered`).
    Final(ModelResponse, Box<Event>),
    /// The turn ended or parked; the driver looks at the run again.
    Stopped,
}

impl TurnCtx {
    /// The turn the cache shows in progress.
    fn begin(
        locked: &Locked,
        turn: TurnId,
        token: CancellationToken,
    ) -> Result<Self, RuntimeError> {
        let cached = locked.cached();
        let agent = Arc::clone(&cached.agent);
        let run = locked.run().clone();
        let turn_log = cached.turn_log();
        let start = match turn_log.first().map(|e| (e.seq, &e.event)) {
            Some((seq, Event::TurnStarted(start))) if start.turn_id == turn => (seq, start),
            _ => {
                return Err(RuntimeError::corrupt(
                    &run,
                    format!("turn {turn} has no turn_started"),
                ));
            }
        };
        let (started_at, start) = start;
        Ok(Self {
            cursor: ReplayCursor::new(turn_log[1..].to_vec(), cached.next()),
            principal: locked
                .state()
                .created
                .as_ref()
                .and_then(|created| created.principal.clone()),
            earlier: Arc::clone(cached.history.messages()),
            hasher: cached.history.hasher().clone(),
            answered: Vec::new(),
            context: context_message(start),
            pending: vec![input_message(start)],
            ordinal: cached.calls_before_turn,
            steer_from: started_at.next(),
            head: cached.head(),
            usage: Usage::default(),
            tools: agent.tools.catalog(),
            agent,
            run,
            turn,
            token,
        })
    }

    /// The run's head as appends move it.
    pub(super) fn head(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.head)
    }

    /// Whether the cache still shows this turn running: a reset or a
    /// racing end may have closed it.
    fn is_current(&self, cached: &Cached) -> bool {
        cached.state.status == Status::Running && cached.state.turn.as_ref() == Some(&self.turn)
    }

    /// Picks up input steered into this turn before the next recorded
    /// action (all of it, live).
    fn take_steered(&mut self, cached: &Cached) {
        let boundary = self.cursor.next_action_seq().unwrap_or(Seq(u64::MAX));
        let turn_log = cached.turn_log();
        let Some(base) = turn_log.first().map(|e| e.seq) else {
            return;
        };
        // The turn's log is contiguous from its `turn_started`.
        let skip = usize::try_from(self.steer_from.0.saturating_sub(base.0)).unwrap_or(usize::MAX);
        for envelope in turn_log.iter().skip(skip) {
            if envelope.seq >= boundary {
                break;
            }
            if let Event::InputSteered(steered) = &envelope.event
                && steered.turn_id == self.turn
            {
                self.pending.push(Message::User {
                    content: steered.input.clone(),
                });
            }
        }
        self.steer_from = boundary.min(cached.next());
    }

    /// This turn's messages for the next call, after the shared history.
    fn recent(&self) -> Vec<Message> {
        let mut recent = self.answered.clone();
        recent.extend(self.context.clone());
        recent.extend(self.pending.iter().cloned());
        recent
    }

    /// The next request's hash, in the form the record at this step was
    /// made with: a turn recorded by an earlier Spool replays against the
    /// version-1 hash of the whole request.
    fn hash(&self, request: &ModelRequest, tools_digest: &[u8; 32]) -> String {
        let recorded_v1 = self
            .cursor
            .peek_model_call()
            .is_some_and(|recorded| !recorded.request_hash.starts_with(REQUEST_HASH_PREFIX));
        if recorded_v1 {
            return request.hash_v1();
        }
        request_hash(
            &self.hasher,
            self.context.as_ref(),
            &self.pending,
            tools_digest,
        )
    }

    /// The model answered: what was pending and the answer join the
    /// conversation.
    fn answered(&mut self, response: &ModelResponse) {
        for message in self.pending.drain(..) {
            self.hasher.push(&message);
            self.answered.push(message);
        }
        let message = response.message();
        self.hasher.push(&message);
        self.answered.push(message);
        self.ordinal += 1;
        if let Some(used) = response.usage {
            self.usage += used;
        }
    }

    /// Lets the shared history go before the turn ends, so the cache folds
    /// the turn into it in place rather than copying it.
    pub(super) fn release(&mut self) {
        self.earlier = Arc::default();
    }
}

/// The turn's context, shown to the model before its newest messages.
fn context_message(start: &TurnStarted) -> Option<Message> {
    (!start.context.is_empty()).then(|| Message::User {
        content: format!("Context for this turn only:\n{}", start.context.join("\n")),
    })
}

/// The turn's input, the first message its first call sends.
fn input_message(start: &TurnStarted) -> Message {
    Message::User {
        content: start.input.clone(),
    }
}

/// A request's hash (the current form): the chain over the history,
/// extended by the turn's context and the messages pending for the call.
fn request_hash(
    history: &RequestHasher,
    context: Option<&Message>,
    pending: &[Message],
    tools_digest: &[u8; 32],
) -> String {
    let mut hasher = history.clone();
    for message in context.into_iter().chain(pending) {
        hasher.push(message);
    }
    hasher.finish(tools_digest)
}

/// A model call's intent: its request's hash and the messages it adds.
fn intent(request_hash: String, pending: &[Message]) -> Event {
    Event::ModelCallRequested(ModelCallRequested {
        request_hash,
        new_messages: pending
            .iter()
            .map(|m| serde_json::to_value(m).expect("messages are plain JSON"))
            .collect(),
    })
}

/// The move a run makes to `current` as its next turn starts: when it
/// runs on another definition, and it (else `current`) says
/// `upgrade = "next_turn"`.
fn moving(
    cached: &Cached,
    current: &crate::agents::Agent,
) -> Option<spool_journal::event::AgentChanged> {
    let to = current.digest()?;
    if cached.agent.digest() == Some(to) {
        return None;
    }
    let upgrade = cached
        .state
        .created
        .as_ref()
        .and_then(|created| created.upgrade)
        .unwrap_or(current.upgrade);
    (upgrade == spool_wire::run::Upgrade::NextTurn).then(|| spool_journal::event::AgentChanged {
        from: cached.agent.digest().map(str::to_owned),
        to: to.to_owned(),
    })
}

impl Inner {
    /// The events that start a turn: its `turn_started`, and with it the
    /// intent of its first model call. Nothing can come between the two
    /// (input steered into the turn lands after its start, and so after
    /// this intent), so the request is the one the driver would make
    /// first. The driver finds it recorded and makes the call, as it makes
    /// a dangling call after a restart, and a turn commits once less. The
    /// start alone when a budget stops the call before it is asked for:
    /// the driver then records that, as before.
    ///
    /// A run that follows upgrades (`upgrade = "next_turn"`, its own or
    /// else `current`'s) and runs on another definition than `current`
    /// moves to it first: an `agent_changed` comes before the start, and
    /// the driver asks for the first call itself, on the new agent.
    pub(crate) fn starting_turn(
        &self,
        cached: &Cached,
        run: &RunId,
        start: TurnStarted,
        current: &crate::agents::Agent,
    ) -> Vec<Event> {
        if let Some(changed) = moving(cached, current) {
            return vec![Event::AgentChanged(changed), Event::TurnStarted(start)];
        }
        let agent = &cached.agent;
        let context = context_message(&start);
        let pending = [input_message(&start)];
        let turn = start.turn_id.clone();
        // The turn's log as it will read once the start is recorded.
        let started = spool_journal::Envelope {
            run_id: run.clone(),
            seq: cached.next(),
            recorded_at: time::OffsetDateTime::now_utc(),
            event: Event::TurnStarted(start),
        };
        let within = matches!(
            budget::verdict(
                &agent.budgets,
                agent.pricing.as_ref(),
                std::slice::from_ref(&started),
                &turn
            ),
            Verdict::Within
        );
        let mut events = vec![started.event];
        if within {
            // Hashed only for a call that will be asked for.
            let hash = request_hash(
                cached.history.hasher(),
                context.as_ref(),
                &pending,
                &agent.tools.catalog().digest,
            );
            events.push(intent(hash, &pending));
        }
        events
    }

    pub(super) async fn run_turn(self: &Arc<Self>, run: &RunId) -> Result<(), RuntimeError> {
        // The token first, then the state: a cancel between the two is seen
        // either as its recorded request or on this token. Taken after the
        // read, a token cancelled meanwhile would pass for the last turn's
        // and be replaced, and the cancel lost.
        let token = self.token(run);
        let locked = self.lock(run).await?;
        let state = locked.state();
        let Some(turn) = state.turn.clone() else {
            return Err(RuntimeError::corrupt(
                run,
                "a running run has no turn".into(),
            ));
        };
        let span = tracing::info_span!("turn", run_id = %run, turn_id = %turn);
        if state.cancel_requested.is_some() || token.is_cancelled() {
            drop(locked);
            return self.cancelled(run, &turn).instrument(span).await;
        }
        let ctx = TurnCtx::begin(&locked, turn, token)?;
        drop(locked);
        self.walk(ctx).instrument(span).await
    }

    /// Model step, tool steps, and again, until the turn ends or parks.
    async fn walk(self: &Arc<Self>, mut ctx: TurnCtx) -> Result<(), RuntimeError> {
        loop {
            if ctx.token.is_cancelled() {
                ctx.release();
                return self.cancelled(&ctx.run, &ctx.turn).await;
            }
            let (response, unrecorded) = match self.model_step(&mut ctx).await? {
                ModelOutcome::Answered(response) => (response, None),
                ModelOutcome::Final(response, answer) => (response, Some(*answer)),
                ModelOutcome::Stopped => return Ok(()),
            };
            ctx.answered(&response);
            if response.tool_calls.is_empty() {
                if self
                    .complete_unless_steered(&mut ctx, response.text, unrecorded)
                    .await?
                {
                    return Ok(());
                }
                // Input steered in while the model answered: call it again.
                continue;
            }
            for call in &response.tool_calls {
                match self.tool_step(&mut ctx, call).await? {
                    Step::Result(content) => ctx.pending.push(Message::Tool {
                        call_id: call.id.clone(),
                        content,
                    }),
                    Step::Answered(answers) => ctx.pending.push(Message::Tool {
                        call_id: call.id.clone(),
                        content: crate::view::answers_output(&answers),
                    }),
                    Step::Parked => {
                        self.hub.end_turn(&ctx.run);
                        return Ok(());
                    }
                    Step::Ended => return Ok(()),
                }
            }
        }
    }

    /// Ends the turn with `text` unless input was steered into it while
    /// the model answered, which the model has not seen: then that input
    /// is pending and the turn goes on (`false`). Checked and ended under
    /// one lock, so no steered input lands between the two and is left
    /// recorded but never read. A replay finds the same input before the
    /// next recorded model call and goes on the same way.
    ///
    /// `answer` is the live model answer not yet recorded: it goes in the
    /// same append as the turn's end, so a one-turn run commits once less
    /// (its answer needs no commit of its own: a crash before the append
    /// leaves the call's intent dangling, and it is made again, as after
    /// a crash before any answer). Otherwise it is recorded alone, first.
    async fn complete_unless_steered(
        &self,
        ctx: &mut TurnCtx,
        text: String,
        answer: Option<Event>,
    ) -> Result<bool, RuntimeError> {
        let mut locked = self.lock(&ctx.run).await?;
        let current = ctx.is_current(locked.cached());
        if current {
            ctx.take_steered(locked.cached());
        }
        if !current || !ctx.pending.is_empty() {
            // The turn does not end here: the answer is recorded alone.
            if let Some(answer) = answer {
                locked.append(&*self.journal, vec![answer]).await?;
            }
            return Ok(!current);
        }
        let done = Event::TurnCompleted(TurnCompleted {
            turn_id: ctx.turn.clone(),
            response: Some(text),
            usage: Some(ctx.usage),
        });
        ctx.release();
        let events = answer.into_iter().chain([done]).collect();
        locked.append(&*self.journal, events).await?;
        drop(locked);
        self.hub.end_turn(&ctx.run);
        Ok(true)
    }

    /// The next model request with the turn's tools, its hash, and what the
    /// record holds for it. A recorded request made with a set of tools
    /// since replaced (the turn began, or parked, before an MCP server
    /// changed its list) is matched with that set, which the turn then
    /// keeps.
    fn matched_request(
        &self,
        ctx: &mut TurnCtx,
    ) -> Result<(ModelRequest, String, ModelStep), RuntimeError> {
        let build = |ctx: &TurnCtx, tools: &Catalog| {
            let request = ModelRequest::shared(
                Arc::clone(&ctx.earlier),
                ctx.recent(),
                Arc::clone(&tools.specs),
            );
            let hash = ctx.hash(&request, &tools.digest);
            (request, hash)
        };
        let (request, hash) = build(ctx, &ctx.tools);
        let divergence = match ctx.cursor.model_call(&hash) {
            Ok(step) => return Ok((request, hash, step)),
            Err(divergence) => divergence,
        };
        for tools in ctx.agent.tools.earlier() {
            if tools.digest == ctx.tools.digest {
                continue;
            }
            let (request, hash) = build(ctx, &tools);
            if let Ok(step) = ctx.cursor.model_call(&hash) {
                ctx.tools = tools;
                return Ok((request, hash, step));
            }
        }
        Err(RuntimeError::corrupt(&ctx.run, divergence.to_string()))
    }

    /// One model call: replayed from the record, or made live with its
    /// intent written ahead.
    async fn model_step(&self, ctx: &mut TurnCtx) -> Result<ModelOutcome, RuntimeError> {
        // Live, the intent is written under the run's lock together with
        // the steered input read for it, so a replay finds exactly the
        // input that request carried.
        let live = ctx.cursor.is_exhausted();
        let locked = self.lock(&ctx.run).await?;
        if !ctx.is_current(locked.cached()) {
            return Ok(ModelOutcome::Stopped);
        }
        ctx.take_steered(locked.cached());
        let mut locked = live.then_some(locked);
        let (request, hash, step) = self.matched_request(ctx)?;
        let permit = match step {
            ModelStep::Replayed(done) => {
                drop(locked);
                let response = ModelResponse::deserialize(&*done.message).map_err(|e| {
                    RuntimeError::corrupt(
                        &ctx.run,
                        format!("a recorded model answer does not decode: {e}"),
                    )
                })?;
                return Ok(ModelOutcome::Answered(response));
            }
            ModelStep::Live(permit) => permit,
        };
        if let (false, Some(held)) = (permit.intent_recorded(), locked.as_mut()) {
            // Budgets are checked from recorded data, and only before a new
            // intent: a replayed call, or a dangling one being made again,
            // passed them when it was recorded.
            match budget::verdict(
                &ctx.agent.budgets,
                ctx.agent.pricing.as_ref(),
                held.cached().turn_log(),
                &ctx.turn,
            ) {
                Verdict::Within => {}
                Verdict::Exceeded(exceeded) => {
                    held.append(&*self.journal, vec![Event::BudgetExceeded(exceeded)])
                        .await?;
                    drop(locked);
                    self.hub.end_turn(&ctx.run);
                    return Ok(ModelOutcome::Stopped);
                }
                Verdict::Refused(message) => {
                    drop(locked);
                    ctx.release();
                    let failed = Event::TurnFailed(TurnFailed {
                        turn_id: ctx.turn.clone(),
                        code: FailureCode::Budget,
                        message,
                    });
                    self.end_turn(&ctx.run, failed).await?;
                    return Ok(ModelOutcome::Stopped);
                }
            }
            let intent = intent(hash, &ctx.pending);
            held.append(&*self.journal, vec![intent]).await?;
            ctx.steer_from = held.cached().next();
        } else if let Some(recorded) = permit.intent_seq() {
            // Made under an intent already recorded (with the turn's start,
            // or before a restart): its deltas follow that intent, as a
            // live call's follow the one it appends.
            ctx.steer_from = ctx.steer_from.max(recorded.next());
        }
        drop(locked);
        let answer = self.call_engine(ctx, &request).await;
        drop(request);
        match answer {
            Ok(response) => {
                let event = Event::ModelCallCompleted(ModelCallCompleted {
                    message: serde_json::to_value(&response)
                        .expect("a model answer is plain JSON")
                        .into(),
                    usage: response.usage,
                    finish_reason: response.finish_reason.clone(),
                });
                if response.tool_calls.is_empty() {
                    return Ok(ModelOutcome::Final(response, Box::new(event)));
                }
                self.append(&ctx.run, vec![event]).await?;
                Ok(ModelOutcome::Answered(response))
            }
            Err(CallFailed::Engine(EngineError::Cancelled)) => {
                ctx.release();
                self.cancelled(&ctx.run, &ctx.turn).await?;
                Ok(ModelOutcome::Stopped)
            }
            Err(failure) => {
                ctx.release();
                let (code, message) = match failure {
                    CallFailed::Engine(error) => (error.code(), error.to_string()),
                    CallFailed::Panicked(panic) => (
                        FailureCode::Internal,
                        format!("the engine panicked: {panic}"),
                    ),
                };
                let failed = Event::TurnFailed(TurnFailed {
                    turn_id: ctx.turn.clone(),
                    code,
                    message,
                });
                self.end_turn(&ctx.run, failed).await?;
                Ok(ModelOutcome::Stopped)
            }
        }
    }

    /// Calls the engine in a span of its own, deltas going to the hub; a
    /// panic in the engine is an answer too.
    async fn call_engine(
        &self,
        ctx: &TurnCtx,
        request: &ModelRequest,
    ) -> Result<ModelResponse, CallFailed> {
        let context = CallContext {
            run: ctx.run.clone(),
            ordinal: ctx.ordinal,
        };
        let (hub, run, turn, after) = (&self.hub, &ctx.run, &ctx.turn, ctx.steer_from);
        // A delta's place is the run's head when it is made, not when the
        // call began: input steered in (or any event appended) while the
        // model streams comes between the text before it and the text after
        // it, and a viewer past that event still gets the rest.
        let head = &ctx.head;
        let publish = |delta| {
            let now = Seq(head.load(std::sync::atomic::Ordering::Acquire));
            hub.publish(run, turn, after.max(now), delta);
        };
        let span = tracing::info_span!(
            "model_call",
            ordinal = ctx.ordinal,
            messages = request.message_count(),
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let started = Instant::now();
        let engine = &ctx.agent.engine;
        let answer = caught(|| engine.call(&context, request, &publish, &ctx.token))
            .instrument(span.clone())
            .await;
        let answer = match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(CallFailed::Engine(error)),
            Err(panic) => Err(CallFailed::Panicked(panic)),
        };
        span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
        match &answer {
            Ok(_) => span.record("outcome", "answered"),
            Err(CallFailed::Engine(error)) => span.record("outcome", error.code().as_str()),
            Err(CallFailed::Panicked(_)) => span.record("outcome", "panicked"),
        };
        if let Err(CallFailed::Panicked(panic)) = &answer {
            tracing::error!(parent: &span, run_id = %run, %panic, "the engine panicked");
        }
        answer
    }

    pub(super) async fn cancelled(&self, run: &RunId, turn: &TurnId) -> Result<(), RuntimeError> {
        let event = Event::TurnCancelled(TurnCancelled {
            turn_id: turn.clone(),
        });
        self.end_turn(run, event).await
    }

    /// Records the turn's last event and closes its live deltas.
    pub(super) async fn end_turn(&self, run: &RunId, event: Event) -> Result<(), RuntimeError> {
        self.append(run, vec![event]).await?;
        self.hub.end_turn(run);
        Ok(())
    }
}

/// Why a model call gave no answer.
enum CallFailed {
    Engine(EngineError),
    Panicked(String),
}
