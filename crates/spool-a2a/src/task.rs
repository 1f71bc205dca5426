//! A task as a run's journal shows it: where it was recorded, the turn it
//! became, and its state, history and answer, folded from the run's
//! [`Activity`] (the same reading every surface makes), with the stream
//! items each change makes.
//!
//! A task is named by its run and the position of the event that recorded
//! its message (`turn_started`, or `input_queued` for a message that
//! waits behind another turn): `RUN.SEQ`. The name is known the moment
//! the message is recorded, before a queued message has a turn, and it
//! never changes.

use std::collections::VecDeque;

use spool_journal::{Envelope, RunId, Seq, TurnId};
use spool_runtime::activity::{Activity, Reader, TurnOutcome};
use spool_runtime::engine::Delta;
use spool_runtime::hub::{LiveDelta, StreamItem, Subscription};
use spool_runtime::{Runtime, RuntimeError};
use spool_wire::a2a::{
    Artifact, Error, ErrorKind, Message, Part, Role, StreamResponse, Task, TaskArtifactUpdateEvent,
    TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use time::OffsetDateTime;

/// The id of a task's one artifact, the turn's answer.
pub const ANSWER: &str = "answer";

/// Where a task was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskRef {
    /// Its run (the A2A context).
    pub run: RunId,
    /// The position of the event that recorded its message.
    pub seq: Seq,
}

impl TaskRef {
    /// `RUN.SEQ`.
    #[must_use]
    pub fn id(&self) -> String {
        format!("{}.{}", self.run, self.seq.0)
    }

    /// Reads `RUN.SEQ`; `None` for anything else.
    #[must_use]
    pub fn parse(id: &str) -> Option<Self> {
        let (run, seq) = id.rsplit_once('.')?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            run: RunId::new(run).ok()?,
            seq: Seq(seq.parse().ok()?),
        })
    }
}

/// RFC 3339 in UTC with milliseconds, as the specification's timestamps.
pub(crate) fn timestamp(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    at.format(&format).unwrap_or_default()
}

/// One task's state, folded from its run's events from where it was
/// recorded.
#[derive(Clone, Debug)]
pub struct Tracker {
    at: TaskRef,
    id: String,
    context: String,
    /// Whether the recording event was seen: a position that records no
    /// message names no task.
    found: bool,
    turn: Option<TurnId>,
    state: TaskState,
    status_message: Option<Message>,
    updated: Option<OffsetDateTime>,
    history: Vec<Message>,
    answer: Option<String>,
    /// Whether an answer chunk was streamed since the last model call
    /// began: the next chunk appends to it.
    streaming: bool,
    /// Status messages made so far, to number their ids.
    said: u32,
}

impl Tracker {
    /// A tracker for the task at `at`, before its run's events.
    #[must_use]
    pub fn new(at: TaskRef) -> Self {
        Self {
            id: at.id(),
            context: at.run.to_string(),
            at,
            found: false,
            turn: None,
            state: TaskState::Submitted,
            status_message: None,
            updated: None,
            history: Vec::new(),
            answer: None,
            streaming: false,
            said: 0,
        }
    }

    /// Whether its message was recorded where its id says.
    #[must_use]
    pub fn found(&self) -> bool {
        self.found
    }

    /// Its state.
    #[must_use]
    pub fn state(&self) -> TaskState {
        self.state
    }

    /// The turn it became, once started.
    #[must_use]
    pub fn turn(&self) -> Option<&TurnId> {
        self.turn.as_ref()
    }

    /// When its status last changed.
    #[must_use]
    pub fn updated(&self) -> Option<OffsetDateTime> {
        self.updated
    }

    /// Its id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state,
            message: self.status_message.clone(),
            timestamp: self.updated.map(timestamp),
        }
    }

    /// The task as it stands, with its artifacts and history.
    #[must_use]
    pub fn task(&self) -> Task {
        Task {
            id: self.id.clone(),
            context_id: self.context.clone(),
            status: self.status(),
            artifacts: Some(self.artifacts()),
            history: Some(self.history.clone()),
            metadata: None,
        }
    }

    fn artifacts(&self) -> Vec<Artifact> {
        self.answer
            .iter()
            .map(|answer| answer_artifact(answer.clone()))
            .collect()
    }

    fn user(&self, message_id: String, text: &str) -> Message {
        Message {
            message_id,
            context_id: Some(self.context.clone()),
            task_id: Some(self.id.clone()),
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }

    fn moved(
        &mut self,
        state: TaskState,
        said: Option<String>,
        at: OffsetDateTime,
        out: &mut Vec<StreamResponse>,
    ) {
        self.state = state;
        self.updated = Some(at);
        self.status_message = said.map(|text| {
            self.said += 1;
            Message::agent(
                format!("{}-status-{}", self.id, self.said),
                &self.context,
                &self.id,
                text,
            )
        });
        out.push(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.id.clone(),
            context_id: self.context.clone(),
            status: self.status(),
            metadata: None,
        }));
    }

    /// Folds one journal event (read through `reader`, which has seen the
    /// run's events before it), and returns the stream items it makes.
    pub fn envelope(&mut self, reader: &mut Reader, envelope: &Envelope) -> Vec<StreamResponse> {
        let mut out = Vec::new();
        let at = envelope.recorded_at;
        if envelope.seq == self.at.seq {
            // The event that records the task's message: a turn started
            // by it, or input queued behind another turn.
            for fact in reader.envelope(envelope) {
                let recorded = match fact {
                    Activity::TurnStarted { started, .. } if started.from_queue.is_none() => {
                        self.turn = Some(started.turn_id.clone());
                        Some((
                            started.operation_id.as_deref(),
                            started.input.as_str(),
                            TaskState::Working,
                        ))
                    }
                    Activity::Input {
                        input,
                        turn: None,
                        operation,
                    } => Some((operation, input, TaskState::Submitted)),
                    _ => None,
                };
                if let Some((message_id, input, state)) = recorded {
                    self.found = true;
                    let message_id =
                        message_id.map_or_else(|| format!("{}-input", self.id), str::to_owned);
                    let message = self.user(message_id, input);
                    self.history.push(message);
                    self.state = state;
                    self.updated = Some(at);
                }
            }
            return out;
        }
        if !self.found || self.state.is_terminal() {
            reader.envelope(envelope).for_each(drop);
            return out;
        }
        for fact in reader.envelope(envelope) {
            match fact {
                Activity::TurnStarted { started, .. }
                    if started.from_queue == Some(self.at.seq) =>
                {
                    self.turn = Some(started.turn_id.clone());
                    self.moved(TaskState::Working, None, at, &mut out);
                }
                Activity::ModelCallStarted { .. } => self.streaming = false,
                Activity::Suspended(suspended)
                    if Some(&suspended.turn_id) == self.turn.as_ref() =>
                {
                    self.moved(
                        TaskState::InputRequired,
                        Some(prompt_of(suspended)),
                        at,
                        &mut out,
                    );
                }
                Activity::BudgetStopped(exceeded) if self.running() => {
                    let prompt = format!(
                        "the {} budget is used up ({} of {}): answer {{\"approved\": true}} to extend it, or false to end the task",
                        exceeded.budget.as_str(),
                        exceeded.used,
                        exceeded.limit
                    );
                    self.moved(TaskState::InputRequired, Some(prompt), at, &mut out);
                }
                Activity::Resumed { turn, answers } if Some(turn) == self.turn.as_ref() => {
                    let n = self.history.len();
                    let text = spool_runtime::view::answers_output(answers);
                    let message = self.user(format!("{}-answer-{n}", self.id), &text);
                    self.history.push(message);
                    self.moved(TaskState::Working, None, at, &mut out);
                }
                Activity::TurnEnded(outcome) if Some(outcome.turn()) == self.turn.as_ref() => {
                    match outcome {
                        TurnOutcome::Completed(done) => {
                            let answer = done.response.clone().unwrap_or_default();
                            self.answer = Some(answer.clone());
                            let mut artifact = answer_artifact(answer);
                            artifact.metadata = None;
                            out.push(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                                task_id: self.id.clone(),
                                context_id: self.context.clone(),
                                artifact,
                                append: false,
                                last_chunk: true,
                                metadata: None,
                            }));
                            self.moved(TaskState::Completed, None, at, &mut out);
                        }
                        TurnOutcome::Failed(failed) => {
                            let said = format!("{}: {}", failed.code.as_str(), failed.message);
                            self.moved(TaskState::Failed, Some(said), at, &mut out);
                        }
                        TurnOutcome::Cancelled(_) => {
                            self.moved(TaskState::Canceled, None, at, &mut out);
                        }
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn running(&self) -> bool {
        self.turn.is_some() && matches!(self.state, TaskState::Working)
    }

    /// Folds a live delta: a piece of the answer, streamed as an artifact
    /// chunk. The turn's end sends the whole answer again as the last
    /// chunk, replacing the pieces: text a model wrote before calling a
    /// tool is not part of the answer.
    pub fn delta(&mut self, delta: &LiveDelta) -> Option<StreamResponse> {
        if !self.found || Some(&delta.turn) != self.turn.as_ref() || self.state.is_terminal() {
            return None;
        }
        let Delta::Text(text) = &delta.delta else {
            return None;
        };
        let append = std::mem::replace(&mut self.streaming, true);
        Some(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.id.clone(),
            context_id: self.context.clone(),
            artifact: answer_artifact(text.clone()),
            append,
            last_chunk: false,
            metadata: None,
        }))
    }
}

/// What a task waiting for input says: the question, its options, and
/// how an approval is answered.
fn prompt_of(suspended: &spool_journal::event::Suspended) -> String {
    let mut prompt = suspended.prompt.clone();
    if let Some(options) = &suspended.options {
        prompt.push_str(&format!("\n(options: {})", options.join(", ")));
    }
    if suspended.kind == spool_wire::run::SuspendKind::Approval {
        prompt
            .push_str("\n(answer with a data part {\"approved\": true} or {\"approved\": false})");
    }
    prompt
}

impl Tracker {
    /// A task whose message started its turn at once (never queued,
    /// never answered yet), as the run's view shows it at that turn's
    /// first boundary: what a blocking send answers without reading the
    /// journal back. `None` where the view cannot say all the task holds
    /// (a failure's reason, a budget's numbers, a sleep, which is no
    /// boundary for A2A): the journal is read then.
    #[must_use]
    pub fn settled(
        at: TaskRef,
        message_id: &str,
        input: &str,
        view: &spool_runtime::RunView,
    ) -> Option<Self> {
        use spool_journal::fold::Status;
        let mut tracker = Self::new(at);
        tracker.found = true;
        tracker.turn.clone_from(&view.turn_id);
        let message = tracker.user(message_id.to_owned(), input);
        tracker.history.push(message);
        let now = OffsetDateTime::now_utc();
        let mut ignored = Vec::new();
        match (view.status, &view.suspend) {
            (Status::Completed, _) => {
                tracker.answer = Some(view.response.clone().unwrap_or_default());
                tracker.moved(TaskState::Completed, None, now, &mut ignored);
            }
            (Status::Cancelled, _) => tracker.moved(TaskState::Canceled, None, now, &mut ignored),
            (Status::Waiting(_), Some(suspended))
                if Some(&suspended.turn_id) == view.turn_id.as_ref() =>
            {
                tracker.moved(
                    TaskState::InputRequired,
                    Some(prompt_of(suspended)),
                    now,
                    &mut ignored,
                );
            }
            _ => return None,
        }
        Some(tracker)
    }

    /// A task just recorded, before anything happened to it: working when
    /// its turn started, submitted when queued.
    #[must_use]
    pub fn recorded(at: TaskRef, message_id: &str, input: &str, turn: Option<TurnId>) -> Self {
        let mut tracker = Self::new(at);
        tracker.found = true;
        tracker.state = if turn.is_some() {
            TaskState::Working
        } else {
            TaskState::Submitted
        };
        tracker.turn = turn;
        tracker.updated = Some(OffsetDateTime::now_utc());
        let message = tracker.user(message_id.to_owned(), input);
        tracker.history.push(message);
        tracker
    }
}

fn answer_artifact(text: String) -> Artifact {
    Artifact {
        artifact_id: ANSWER.to_owned(),
        name: Some("answer".to_owned()),
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
    }
}

/// A task's journal read from where it was recorded, then followed live:
/// the task first, then each change, ending where the task rests
/// (terminal, or waiting for input).
pub struct Watch {
    subscription: Subscription,
    reader: Reader,
    tracker: Tracker,
    /// Items not yet taken, with the journal position of the event that
    /// made each (none for a live delta's).
    pending: VecDeque<(Option<Seq>, StreamResponse)>,
    ended: bool,
    /// Follow the task through its questions to its end, not only to
    /// where it rests.
    to_the_end: bool,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("task", &self.tracker.id)
            .finish_non_exhaustive()
    }
}

fn storage(error: &RuntimeError) -> Error {
    Error::new(ErrorKind::Internal, error.to_string())
}

impl Watch {
    /// Reads the task at `at` up to the run's last event.
    ///
    /// # Errors
    ///
    /// `TaskNotFound` when the run does not exist or no message was
    /// recorded at that position; `Internal` when the journal fails.
    pub async fn open(runtime: &Runtime, at: TaskRef) -> Result<Self, Error> {
        Self::opened(runtime, at, false).await
    }

    /// [`Watch::open`], keeping the changes already in the journal as
    /// items to take (with their positions), and following the task
    /// through its questions to its end: what a deliverer that must not
    /// miss a change reads.
    ///
    /// # Errors
    ///
    /// As [`Watch::open`].
    pub async fn replaying(runtime: &Runtime, at: TaskRef) -> Result<Self, Error> {
        Self::opened(runtime, at, true).await
    }

    async fn opened(runtime: &Runtime, at: TaskRef, replay: bool) -> Result<Self, Error> {
        let id = at.id();
        // Delivered from the task's own event on.
        let cursor = at.seq.0.checked_sub(1).map(Seq);
        let subscription = match runtime.subscribe(&at.run, cursor).await {
            Ok(subscription) => subscription,
            Err(error) if error.kind() == spool_runtime::ErrorKind::RunNotFound => {
                return Err(Error::task_not_found(&id));
            }
            Err(error) if error.kind() == spool_runtime::ErrorKind::BadRequest => {
                // A position past the run's end.
                return Err(Error::task_not_found(&id));
            }
            Err(error) => return Err(storage(&error)),
        };
        let mut watch = Self {
            subscription,
            reader: Reader::new(),
            tracker: Tracker::new(at),
            pending: VecDeque::new(),
            ended: false,
            to_the_end: replay,
        };
        while let Some(item) = watch.subscription.ready() {
            // What happened before the watch is in the task itself, not
            // sent as changes.
            watch.fold(item);
            if !replay {
                watch.pending.clear();
            }
        }
        if !watch.tracker.found {
            return Err(Error::task_not_found(&id));
        }
        Ok(watch)
    }

    fn fold(&mut self, item: StreamItem) {
        match item {
            StreamItem::Event(envelope) => {
                let items = self.tracker.envelope(&mut self.reader, &envelope);
                self.pending
                    .extend(items.into_iter().map(|item| (Some(envelope.seq), item)));
            }
            StreamItem::Delta(delta) => {
                if let Some(item) = self.tracker.delta(&delta) {
                    self.pending.push_back((None, item));
                }
            }
            StreamItem::Lagged { .. } => self.ended = true,
        }
    }

    /// The task as read so far.
    #[must_use]
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The next change; `None` once the task rests (or the journal closes,
    /// or this reader fell too far behind: a client reads the task again).
    pub async fn next(&mut self) -> Option<StreamResponse> {
        self.next_at().await.map(|(_, item)| item)
    }

    /// [`Watch::next`], with the journal position of the event that made
    /// the item (none for a piece of a streamed answer, which is live
    /// only).
    pub async fn next_at(&mut self) -> Option<(Option<Seq>, StreamResponse)> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            let rests = if self.to_the_end {
                self.tracker.state.is_terminal()
            } else {
                self.tracker.state.is_resting()
            };
            if self.ended || rests {
                return None;
            }
            match self.subscription.next().await {
                Some(item) => self.fold(item),
                None => self.ended = true,
            }
        }
    }

    /// Waits until the task rests, and returns it then.
    pub async fn rest(mut self) -> Task {
        while self.next().await.is_some() {}
        self.tracker.task()
    }
}

/// Every task of a run, in the order recorded: what `ListTasks` reads.
///
/// # Errors
///
/// As [`Runtime::subscribe`].
pub async fn run_tasks(runtime: &Runtime, run: &RunId) -> Result<Vec<Tracker>, RuntimeError> {
    let mut subscription = runtime.subscribe(run, None).await?;
    let mut reader = Reader::new();
    let mut tasks: Vec<Tracker> = Vec::new();
    while let Some(item) = subscription.ready() {
        let StreamItem::Event(envelope) = item else {
            continue;
        };
        // A task per message recorded: a turn it started, or input queued.
        let records = reader.clone().envelope(&envelope).any(|fact| match fact {
            Activity::TurnStarted { started, .. } => started.from_queue.is_none(),
            Activity::Input { turn: None, .. } => true,
            _ => false,
        });
        if records {
            tasks.push(Tracker::new(TaskRef {
                run: run.clone(),
                seq: envelope.seq,
            }));
        }
        // One reader for the run; each open task folds the facts it needs
        // from its own copy's view (a tracker reads the event through a
        // throwaway clone, so the shared reader advances once).
        let mut last = None;
        for tracker in tasks.iter_mut().filter(|t| !t.state.is_terminal()) {
            let mut copy = reader.clone();
            let _ = tracker.envelope(&mut copy, &envelope);
            last = Some(copy);
        }
        match last {
            Some(copy) => reader = copy,
            None => reader.envelope(&envelope).for_each(drop),
        }
    }
    Ok(tasks)
}
