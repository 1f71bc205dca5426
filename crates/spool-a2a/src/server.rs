//! The A2A operations, whatever the binding: a message to a context (a
//! Spool run) becomes a task (one turn), recorded under the message's id
//! so a resent message is answered with the same task; a task is read,
//! listed, cancelled and watched from the run's journal.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use spool_journal::event::Answer;
use spool_journal::{Address, Principal, RunId};
use spool_runtime::{MessageRequest, RunAccess, Runtime, RuntimeError};
use spool_wire::a2a::{
    self, AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Error, ErrorKind,
    ListTasksRequest, ListTasksResponse, Message, Role, SendMessageRequest, Task, TaskRequest,
    TaskState,
};
use tokio::sync::watch;

use crate::config::A2aSection;
use crate::push::Pusher;
use crate::task::{TaskRef, Tracker, Watch, run_tasks};

/// The address namespace of the runs A2A messages start.
pub const NAMESPACE: &str = "a2a";

/// Spool's A2A server over one runtime.
#[derive(Clone)]
pub struct A2aServer {
    pub(crate) runtime: Runtime,
    pub(crate) access: RunAccess,
    pub(crate) card: Arc<A2aSection>,
    pub(crate) agent_name: Option<String>,
    /// Whether callers present tokens: the card says so, and the
    /// extended card is offered.
    pub(crate) authenticated: bool,
    /// `http` or `https`: how the card's URLs are reached when `[a2a]
    /// url` does not say.
    pub(crate) scheme: &'static str,
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) pusher: Pusher,
}

impl std::fmt::Debug for A2aServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aServer")
            .field("access", &self.access)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

/// A message's text, or why it has none Spool can read.
fn text_of(message: &Message) -> Result<String, Error> {
    if message.parts.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidParams,
            "`message.parts` is empty: at least one part is needed",
        ));
    }
    if let Some(part) = message
        .parts
        .iter()
        .find(|part| part.text.is_none() && part.data.is_none())
    {
        let kind = part
            .media_type
            .clone()
            .unwrap_or_else(|| "a file part".to_owned());
        return Err(Error::new(
            ErrorKind::ContentTypeNotSupported,
            format!("this agent reads text and data parts, not {kind}"),
        )
        .with("mediaType", kind));
    }
    Ok(message.text())
}

/// An approval's verdict in a message: a data part `{"approved": bool}`,
/// or the text `yes`/`no` (`approve`/`reject`).
fn verdict(message: &Message) -> Option<bool> {
    for part in &message.parts {
        if let Some(approved) = part
            .data
            .as_ref()
            .and_then(|d| d.get("approved"))
            .and_then(serde_json::Value::as_bool)
        {
            return Some(approved);
        }
    }
    match message.text().trim().to_ascii_lowercase().as_str() {
        "yes" | "approve" | "approved" | "true" => Some(true),
        "no" | "reject" | "rejected" | "false" => Some(false),
        _ => None,
    }
}

fn internal(error: &RuntimeError) -> Error {
    Error::new(ErrorKind::Internal, error.to_string())
}

/// A history length from a request: none below zero.
pub(crate) fn history_length(length: Option<i64>) -> Result<Option<u32>, Error> {
    length
        .map(|n| {
            u32::try_from(n).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidParams,
                    format!("`historyLength` must be a non-negative integer, not {n}"),
                )
            })
        })
        .transpose()
}

/// What a send made: the task, and whether the caller waits for it to
/// rest.
#[derive(Debug)]
pub struct Sent {
    /// The task.
    pub task: TaskRef,
    /// Answer at once.
    pub return_immediately: bool,
    /// How much history the answer carries.
    pub history_length: Option<u32>,
    /// The turn the message started, its id and its text, when it
    /// started one at once (not queued, not a replay, not an answer): the
    /// task's answer can then be read from the run's state instead of its
    /// journal.
    started: Option<(spool_journal::TurnId, String, String)>,
}

impl A2aServer {
    /// The server over `runtime`, reaching runs as `access` allows;
    /// `closing` turning true ends its streams and waits.
    #[must_use]
    pub fn new(runtime: Runtime, access: RunAccess, closing: watch::Receiver<bool>) -> Self {
        Self {
            pusher: Pusher::new(runtime.clone(), closing.clone(), false),
            runtime,
            access,
            card: Arc::default(),
            agent_name: None,
            authenticated: false,
            scheme: "http",
            closing,
        }
    }

    /// Starts delivering the push notifications a restart left unsent;
    /// how many configs it resumed.
    ///
    /// # Errors
    ///
    /// When the journal cannot be read.
    pub async fn resume_push(&self) -> Result<usize, RuntimeError> {
        self.pusher.resume().await
    }

    /// With the first retry's wait of a failed push (tests shorten it).
    #[must_use]
    pub fn with_push_backoff(mut self, backoff: std::time::Duration) -> Self {
        self.pusher = self.pusher.with_backoff(backoff);
        self
    }

    /// The runtime it serves.
    #[must_use]
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The listener serves TLS: the card's default URLs say `https`.
    #[must_use]
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.scheme = if tls { "https" } else { "http" };
        self
    }

    /// With `[a2a]` and `[agent] name` for the card.
    #[must_use]
    pub fn with_card(mut self, section: A2aSection, agent_name: Option<String>) -> Self {
        self.pusher = Pusher::new(
            self.runtime.clone(),
            self.closing.clone(),
            section.push_private_networks,
        );
        self.card = Arc::new(section);
        self.agent_name = agent_name;
        self
    }

    /// Callers authenticate with bearer tokens: the card declares the
    /// scheme, and `GetExtendedAgentCard` is offered.
    #[must_use]
    pub fn with_tokens(mut self, on: bool) -> Self {
        self.authenticated = on;
        self
    }

    /// The agent card, its interfaces under `base` (`http://host:port`)
    /// unless `[a2a] url` names the public one.
    #[must_use]
    pub fn card(&self, base: &str) -> AgentCard {
        let section = &self.card;
        let base = section.url.as_deref().unwrap_or(base).trim_end_matches('/');
        let url = format!("{base}/a2a");
        let name = section
            .name
            .clone()
            .or_else(|| self.agent_name.clone())
            .unwrap_or_else(|| "spool".to_owned());
        let description = section.description.clone().unwrap_or_else(|| {
            "A Spool agent: durable runs whose tasks survive a crash without repeating a side effect"
                .to_owned()
        });
        let skills = if section.skills.is_empty() {
            vec![AgentSkill {
                id: "chat".into(),
                name: name.clone(),
                description: description.clone(),
                tags: vec!["chat".into()],
                examples: Vec::new(),
            }]
        } else {
            section
                .skills
                .iter()
                .map(|skill| AgentSkill {
                    id: skill.id.clone(),
                    name: skill.name.clone(),
                    description: skill.description.clone(),
                    tags: skill.tags.clone(),
                    examples: skill.examples.clone(),
                })
                .collect()
        };
        let interface = |binding: &str| AgentInterface {
            url: url.clone(),
            protocol_binding: binding.to_owned(),
            protocol_version: a2a::PROTOCOL_VERSION.to_owned(),
            tenant: None,
        };
        let mut card = AgentCard {
            name,
            description,
            supported_interfaces: vec![interface("JSONRPC"), interface("HTTP+JSON")],
            version: section
                .version
                .clone()
                .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
            documentation_url: section.documentation_url.clone(),
            capabilities: AgentCapabilities {
                streaming: Some(true),
                push_notifications: Some(true),
                extended_agent_card: Some(self.authenticated),
            },
            security_schemes: std::collections::BTreeMap::new(),
            security_requirements: Vec::new(),
            default_input_modes: vec!["text/plain".into(), "application/json".into()],
            default_output_modes: vec!["text/plain".into()],
            skills,
        };
        if self.authenticated {
            card.security_schemes.insert(
                "bearer".into(),
                serde_json::json!({"httpAuthSecurityScheme": {"scheme": "Bearer"}}),
            );
            card.security_requirements
                .push(serde_json::json!({"schemes": {"bearer": {"list": []}}}));
        }
        card
    }

    /// The run `id` names as a context, when the caller may reach it.
    async fn context(&self, caller: Option<&Principal>, id: &str) -> Result<RunId, Error> {
        let unknown = || {
            Error::new(
                ErrorKind::InvalidParams,
                format!("`contextId` `{id}` names no conversation this agent has with you"),
            )
            .with("contextId", id)
        };
        let run = RunId::new(id).map_err(|_| unknown())?;
        match self.access.check(&self.runtime, caller, &run).await {
            Ok(()) => {}
            Err(e) if e.kind() == spool_runtime::ErrorKind::RunNotFound => return Err(unknown()),
            Err(e) => return Err(internal(&e)),
        }
        // Under `Any`, existence is checked here.
        self.runtime.get(&run).await.map_err(|_| unknown())?;
        Ok(run)
    }

    /// The task `id` names, read up to now, when the caller may reach it:
    /// another principal's task is one that does not exist.
    pub(crate) async fn open(&self, caller: Option<&Principal>, id: &str) -> Result<Watch, Error> {
        let at = TaskRef::parse(id).ok_or_else(|| Error::task_not_found(id))?;
        match self.access.check(&self.runtime, caller, &at.run).await {
            Ok(()) => {}
            Err(e) if e.kind() == spool_runtime::ErrorKind::RunNotFound => {
                return Err(Error::task_not_found(id));
            }
            Err(e) => return Err(internal(&e)),
        }
        Watch::open(&self.runtime, at).await
    }

    /// `SendMessage`: records the message as a task (or answers the task
    /// it continues), and says how to answer.
    ///
    /// # Errors
    ///
    /// The specification's errors, as the module says.
    pub async fn send(
        &self,
        caller: Option<&Principal>,
        request: SendMessageRequest,
    ) -> Result<Sent, Error> {
        let configuration = request.configuration.unwrap_or_default();
        let history_length = history_length(configuration.history_length)?;
        let return_immediately =
            configuration.return_immediately || configuration.blocking == Some(false);
        let message = request.message;
        if message.message_id.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                "`message.messageId` is required",
            ));
        }
        if message.role != Role::User {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                "`message.role` must be ROLE_USER: an agent's messages come from the agent",
            ));
        }
        let text = text_of(&message)?;
        if let Some(push) = &configuration.task_push_notification_config {
            // Checked before the message is recorded: a URL refused then
            // would leave a task without the notifications it asked for.
            crate::client::check(&push.url, self.pusher.reach())
                .await
                .map_err(|e| {
                    Error::new(ErrorKind::InvalidParams, format!("push config `url`: {e}"))
                })?;
        }
        let (task, started) = match &message.task_id {
            Some(task_id) => (
                self.continue_task(caller, task_id, message.context_id.as_deref(), &message)
                    .await?,
                None,
            ),
            None => {
                let (task, turn) = self.new_task(caller, &message, text.clone()).await?;
                (
                    task,
                    turn.map(|turn| (turn, message.message_id.clone(), text)),
                )
            }
        };
        if let Some(mut push) = configuration.task_push_notification_config {
            // Named after the message when the client names it not: the
            // same message sent again keeps one config, not two.
            if push.id.as_deref().is_none_or(str::is_empty) {
                push.id = Some(format!("message:{}", message.message_id));
            }
            self.pusher.create(&task, push).await?;
        }
        Ok(Sent {
            task,
            return_immediately,
            history_length,
            started,
        })
    }

    async fn new_task(
        &self,
        caller: Option<&Principal>,
        message: &Message,
        text: String,
    ) -> Result<(TaskRef, Option<spool_journal::TurnId>), Error> {
        let request = MessageRequest {
            text,
            ..MessageRequest::default()
        };
        let (run, accepted) = match &message.context_id {
            Some(context) => {
                let run = self.context(caller, context).await?;
                let accepted = self
                    .runtime
                    .send_once(&run, &message.message_id, request)
                    .await;
                (Some(run), accepted)
            }
            None => {
                // A new conversation, made once per message id (and
                // caller): a resent message finds the run and the turn
                // the first made, even after a crash.
                let mut hash = Sha256::new();
                hash.update(caller.map(Principal::scope).unwrap_or_default());
                hash.update([0]);
                hash.update(&message.message_id);
                let name: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
                let address = Address::new(NAMESPACE, name);
                let accepted = self
                    .runtime
                    .send_once_to(
                        &address,
                        caller.cloned(),
                        Some(NAMESPACE.to_owned()),
                        &message.message_id,
                        request,
                    )
                    .await;
                (None, accepted)
            }
        };
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                let context = run.map(|run| run.to_string()).unwrap_or_default();
                return Err(match error {
                    RuntimeError::RunWaiting(_) => Error::new(
                        ErrorKind::UnsupportedOperation,
                        format!(
                            "a task in context `{context}` waits for input: answer it with a message carrying its `taskId`"
                        ),
                    )
                    .with("contextId", context),
                    RuntimeError::RunRetired(_) => Error::new(
                        ErrorKind::UnsupportedOperation,
                        format!("context `{context}` was retired and takes no more messages"),
                    )
                    .with("contextId", context),
                    e if e.kind() == spool_runtime::ErrorKind::BadRequest => {
                        Error::new(ErrorKind::InvalidParams, e.to_string())
                    }
                    e => internal(&e),
                });
            }
        };
        let run = accepted.run().clone();
        let turn = match accepted {
            spool_runtime::Accepted::Started { turn, .. } => Some(turn),
            _ => None,
        };
        let seq = self
            .runtime
            .operation_position(&run, &message.message_id)
            .await
            .map_err(|e| internal(&e))?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    "the message was accepted but its record was not found",
                )
            })?;
        Ok((TaskRef { run, seq }, turn))
    }

    /// A message to an existing task: the answer to what it asks.
    async fn continue_task(
        &self,
        caller: Option<&Principal>,
        task_id: &str,
        context: Option<&str>,
        message: &Message,
    ) -> Result<TaskRef, Error> {
        let watch = self.open(caller, task_id).await?;
        let tracker = watch.tracker();
        let at = TaskRef::parse(task_id).ok_or_else(|| Error::task_not_found(task_id))?;
        if context.is_some_and(|context| context != at.run.as_str()) {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                format!(
                    "task `{task_id}` is not in context `{}`",
                    context.unwrap_or_default()
                ),
            ));
        }
        match tracker.state() {
            TaskState::InputRequired => {}
            state if state.is_terminal() => {
                return Err(Error::new(
                    ErrorKind::UnsupportedOperation,
                    format!(
                        "task `{task_id}` is {}: a finished task takes no more messages; send a new message in its context",
                        state.as_str()
                    ),
                )
                .with("taskId", task_id));
            }
            state => {
                return Err(Error::new(
                    ErrorKind::UnsupportedOperation,
                    format!(
                        "task `{task_id}` is {}: it takes a message only while it asks for input",
                        state.as_str()
                    ),
                )
                .with("taskId", task_id));
            }
        }
        let turn = tracker.turn().cloned();
        let view = self.runtime.get(&at.run).await.map_err(|e| internal(&e))?;
        let approval = matches!(
            view.suspend.as_ref().map(|s| s.kind),
            Some(spool_wire::run::SuspendKind::Approval | spool_wire::run::SuspendKind::Budget)
        ) || view.suspend.is_none();
        let answer = if approval {
            let approved = verdict(message).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParams,
                    "this task asks for an approval: send a data part {\"approved\": true} or {\"approved\": false}",
                )
            })?;
            // The verdict is the data part; any text beside it is the
            // reason given.
            let reason: Vec<&str> = message
                .parts
                .iter()
                .filter_map(|part| part.text.as_deref())
                .collect();
            Answer {
                text: reason.join("\n"),
                approved: Some(approved),
            }
        } else {
            Answer {
                text: text_of(message)?,
                approved: None,
            }
        };
        match self
            .runtime
            .respond(&at.run, turn.as_ref(), vec![answer])
            .await
        {
            Ok(()) => Ok(at),
            Err(e @ RuntimeError::InvalidAnswer { .. }) => {
                Err(Error::new(ErrorKind::InvalidParams, e.to_string()))
            }
            // Answered meanwhile by someone else: the task goes on.
            Err(RuntimeError::RunNotWaiting { .. }) => Ok(at),
            Err(e) => Err(internal(&e)),
        }
    }

    /// The task as it stands.
    ///
    /// # Errors
    ///
    /// `TaskNotFound`.
    pub async fn get(
        &self,
        caller: Option<&Principal>,
        request: &TaskRequest,
    ) -> Result<Task, Error> {
        let length = history_length(request.history_length)?;
        let watch = self.open(caller, &request.id).await?;
        Ok(watch.tracker().task().with_history_length(length))
    }

    /// The task a send answers: at once, or once it rests. A message
    /// that started its turn is answered from the run's state where that
    /// says everything; anything else from the journal.
    ///
    /// # Errors
    ///
    /// `Internal` when the journal fails.
    pub async fn answer(&self, caller: Option<&Principal>, sent: Sent) -> Result<Task, Error> {
        let fast = match &sent.started {
            Some((turn, message_id, input)) if sent.return_immediately => Some(
                Tracker::recorded(sent.task.clone(), message_id, input, Some(turn.clone())).task(),
            ),
            Some((turn, message_id, input)) => {
                let mut closing = self.closing.clone();
                let view = tokio::select! {
                    view = self.runtime.wait_for(&sent.task.run, turn) => view.ok(),
                    _ = closing.wait_for(|closing| *closing) => None,
                };
                // The view of this turn's own boundary, not a later one.
                view.filter(|view| view.turn_id.as_ref() == Some(turn))
                    .and_then(|view| Tracker::settled(sent.task.clone(), message_id, input, &view))
                    .map(|tracker| tracker.task())
            }
            None => None,
        };
        let task = match fast {
            Some(task) => task,
            None => {
                let watch = self.open(caller, &sent.task.id()).await?;
                if sent.return_immediately {
                    watch.tracker().task()
                } else {
                    self.rested(watch).await
                }
            }
        };
        Ok(task.with_history_length(sent.history_length))
    }

    /// Waits (until shutdown) for the task to rest.
    pub(crate) async fn rested(&self, watch: Watch) -> Task {
        let mut closing = self.closing.clone();
        let fallback = watch.tracker().task();
        tokio::select! {
            task = watch.rest() => task,
            // A server going away answers the task as it was.
            _ = closing.wait_for(|closing| *closing) => fallback,
        }
    }

    /// `CancelTask`: cancels the task's turn and answers the task once
    /// the cancel is recorded.
    ///
    /// # Errors
    ///
    /// `TaskNotFound`; `TaskNotCancelable` for a finished task, or one
    /// still queued behind another turn.
    pub async fn cancel(
        &self,
        caller: Option<&Principal>,
        request: &TaskRequest,
    ) -> Result<Task, Error> {
        let id = &request.id;
        let watch = self.open(caller, id).await?;
        let tracker = watch.tracker();
        let state = tracker.state();
        let not_cancelable =
            |why: String| Error::new(ErrorKind::TaskNotCancelable, why).with("taskId", id.as_str());
        if state.is_terminal() {
            return Err(not_cancelable(format!(
                "task `{id}` is {} already",
                state.as_str()
            )));
        }
        let Some(turn) = tracker.turn().cloned() else {
            return Err(not_cancelable(format!(
                "task `{id}` waits behind another task in its context; cancel it once it is working"
            )));
        };
        let at = TaskRef::parse(id).ok_or_else(|| Error::task_not_found(id))?;
        self.runtime
            .cancel(&at.run, Some(&turn))
            .await
            .map_err(|e| internal(&e))?;
        Ok(self.rested(watch).await)
    }

    /// `ListTasks`: the caller's tasks, most recently updated first.
    ///
    /// Reads the journal of every run the caller reaches (or the one
    /// `contextId` names): a listing over many long runs costs what
    /// reading them does.
    ///
    /// # Errors
    ///
    /// `InvalidParams` for a page size outside 1 to 100, a negative
    /// history length, or a page token this server did not make.
    pub async fn list(
        &self,
        caller: Option<&Principal>,
        request: &ListTasksRequest,
    ) -> Result<ListTasksResponse, Error> {
        let page_size = request.page_size.unwrap_or(a2a::DEFAULT_PAGE_SIZE);
        if !(1..=a2a::MAX_PAGE_SIZE).contains(&page_size) {
            return Err(Error::new(
                ErrorKind::InvalidParams,
                format!(
                    "`pageSize` must be between 1 and {} inclusive, not {page_size}",
                    a2a::MAX_PAGE_SIZE
                ),
            ));
        }
        let length = history_length(request.history_length)?;
        let after = match &request.status_timestamp_after {
            Some(text) => Some(
                time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                    .map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidParams,
                        format!("`statusTimestampAfter` is not an RFC 3339 time: {e}"),
                    )
                })?,
            ),
            None => None,
        };
        let start = match request.page_token.as_deref().filter(|t| !t.is_empty()) {
            Some(token) => Some(Cursor::parse(token).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParams,
                    "`pageToken` is not one this agent gave",
                )
            })?),
            None => None,
        };
        let runs = match &request.context_id {
            Some(context) => vec![self.context(caller, context).await?],
            None => {
                let mut runs = Vec::new();
                for summary in self.runtime.list().await.map_err(|e| internal(&e))? {
                    // A run that never had a turn holds no task (a record
                    // run, an address made before its first message).
                    if summary.status == spool_journal::fold::Status::Pending {
                        continue;
                    }
                    if self
                        .access
                        .reaches(&self.runtime, caller, &summary.run_id)
                        .await
                        .unwrap_or(false)
                    {
                        runs.push(summary.run_id);
                    }
                }
                runs
            }
        };
        let mut matching: Vec<Tracker> = Vec::new();
        for run in &runs {
            let tasks = match run_tasks(&self.runtime, run).await {
                Ok(tasks) => tasks,
                // Gone between the listing and the read.
                Err(e) if e.kind() == spool_runtime::ErrorKind::RunNotFound => continue,
                Err(e) => return Err(internal(&e)),
            };
            matching.extend(tasks.into_iter().filter(|task| {
                request.status.is_none_or(|state| task.state() == state)
                    && after.is_none_or(|after| task.updated().is_some_and(|at| at > after))
            }));
        }
        matching.sort_by(|a, b| Cursor::of(b).cmp(&Cursor::of(a)));
        let total = matching.len();
        let from = start.map_or(0, |start| {
            matching.partition_point(|task| Cursor::of(task) >= start)
        });
        let size = usize::try_from(page_size).unwrap_or(usize::MAX);
        let page: Vec<&Tracker> = matching.iter().skip(from).take(size).collect();
        let next = if from + page.len() < total {
            page.last()
                .map(|t| Cursor::of(t).token())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let artifacts = request.include_artifacts.unwrap_or(false);
        Ok(ListTasksResponse {
            tasks: page
                .into_iter()
                .map(|tracker| {
                    let mut task = tracker.task().with_history_length(length);
                    if !artifacts {
                        task.artifacts = None;
                    }
                    task
                })
                .collect(),
            next_page_token: next,
            page_size,
            total_size: i64::try_from(total).unwrap_or(i64::MAX),
        })
    }
}

impl A2aServer {
    /// The task a push request names, when the caller may reach it.
    async fn push_task(&self, caller: Option<&Principal>, task_id: &str) -> Result<TaskRef, Error> {
        self.open(caller, task_id).await?;
        TaskRef::parse(task_id).ok_or_else(|| Error::task_not_found(task_id))
    }

    /// `CreateTaskPushNotificationConfig`.
    ///
    /// # Errors
    ///
    /// `TaskNotFound`; `InvalidParams` for a URL it may not reach.
    pub async fn push_create(
        &self,
        caller: Option<&Principal>,
        config: a2a::TaskPushNotificationConfig,
    ) -> Result<a2a::TaskPushNotificationConfig, Error> {
        let task_id = config.task_id.clone().unwrap_or_default();
        let at = self.push_task(caller, &task_id).await?;
        self.pusher.create(&at, config).await
    }

    /// `GetTaskPushNotificationConfig`.
    ///
    /// # Errors
    ///
    /// `TaskNotFound` for the task or the config.
    pub async fn push_get(
        &self,
        caller: Option<&Principal>,
        request: &a2a::PushConfigRequest,
    ) -> Result<a2a::TaskPushNotificationConfig, Error> {
        let at = self.push_task(caller, &request.task_id).await?;
        let id = request.id.clone().unwrap_or_default();
        self.pusher
            .list(&at)
            .await?
            .into_iter()
            .find(|config| config.id.as_deref() == Some(id.as_str()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::TaskNotFound,
                    format!("task `{}` has no push config `{id}`", request.task_id),
                )
                .with("taskId", request.task_id.as_str())
                .with("configId", id)
            })
    }

    /// `ListTaskPushNotificationConfigs`.
    ///
    /// # Errors
    ///
    /// `TaskNotFound`.
    pub async fn push_list(
        &self,
        caller: Option<&Principal>,
        request: &a2a::PushConfigRequest,
    ) -> Result<a2a::ListTaskPushNotificationConfigsResponse, Error> {
        let at = self.push_task(caller, &request.task_id).await?;
        Ok(a2a::ListTaskPushNotificationConfigsResponse {
            configs: self.pusher.list(&at).await?,
            next_page_token: String::new(),
        })
    }

    /// `DeleteTaskPushNotificationConfig`: idempotent.
    ///
    /// # Errors
    ///
    /// `TaskNotFound` for the task.
    pub async fn push_delete(
        &self,
        caller: Option<&Principal>,
        request: &a2a::PushConfigRequest,
    ) -> Result<(), Error> {
        let at = self.push_task(caller, &request.task_id).await?;
        self.pusher
            .delete(&at, request.id.as_deref().unwrap_or_default())
            .await
    }
}

/// A place in the listing's order: the status time, then the id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cursor {
    nanos: i128,
    id: String,
}

impl Cursor {
    fn of(task: &Tracker) -> Self {
        Self {
            nanos: task
                .updated()
                .map_or(0, time::OffsetDateTime::unix_timestamp_nanos),
            id: task.id().to_owned(),
        }
    }

    fn token(&self) -> String {
        format!("{}~{}", self.nanos, self.id)
    }

    fn parse(token: &str) -> Option<Self> {
        let (nanos, id) = token.split_once('~')?;
        Some(Self {
            nanos: nanos.parse().ok()?,
            id: id.to_owned(),
        })
    }
}
