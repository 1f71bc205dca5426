//! Spool's runs as an MCP server: tools to start, message, answer, read,
//! list and cancel runs, and each run's transcript and journal as
//! resources (`spool://runs/{id}`, `spool://runs/{id}/events`), over stdio
//! (`spool mcp serve --stdio`) or Streamable HTTP (`/mcp` on `spool
//! serve`, behind the same origin, host, token and ownership rules as
//! every other surface).
//!
//! A turn longer than [`Patience`] is answered with what it is (running,
//! waiting) and the run's id, never with a timeout error; `get_run` reads
//! it later. While a turn runs, a host that asked for progress receives
//! the streamed answer as progress messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskResult, Implementation, InputRequest, JsonObject,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceUpdatedNotification, ResourceUpdatedNotificationParam,
    ServerCapabilities, ServerConfig, ServerNotification, SubscribeRequestParams,
    SubscriptionFilter, Task, TaskPayload, Tool, ToolAnnotations, UnsubscribeRequestParams,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use spool_journal::event::Answer;
use spool_journal::{Principal, RunId, Seq, TurnId};
use spool_runtime::activity::{Activity, Reader};
use spool_runtime::{
    Accepted, MessageRequest, RunAccess, RunView, Runtime, RuntimeError, StartRequest,
};
use spool_wire::run::RunState;

/// How long a tool waits for the turn it started or answered before it
/// answers with the run as it is.
#[derive(Clone, Copy, Debug)]
pub struct Patience(pub Duration);

impl Default for Patience {
    fn default() -> Self {
        Self(Duration::from_secs(25))
    }
}

/// How long a tool's answer waits for its progress stream to catch up.
const PROGRESS_DRAIN: Duration = Duration::from_secs(2);

/// The MCP server over one runtime; a connection's own copy knows its
/// caller.
#[derive(Clone)]
pub struct RunsServer {
    runtime: Runtime,
    access: RunAccess,
    patience: Patience,
    /// The connection's resource subscriptions, by URI.
    watching: Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>,
}

impl std::fmt::Debug for RunsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsServer")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Drop for RunsServer {
    fn drop(&mut self) {
        // The last copy of a connection's server ends its subscriptions.
        if Arc::strong_count(&self.watching) == 1 {
            for (_, task) in self
                .watching
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .drain()
            {
                task.abort();
            }
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StartInput {
    /// The first message.
    text: String,
    /// A stable name for the run: the run already at this address gets the
    /// message instead of a new run being made.
    #[serde(default)]
    address: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SendInput {
    run_id: String,
    text: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RespondInput {
    run_id: String,
    /// The waiting turn (from `pending.turn_id`).
    turn_id: String,
    /// The answer's text.
    #[serde(default)]
    text: Option<String>,
    /// For an approval: true approves, false rejects.
    #[serde(default)]
    approved: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunInput {
    run_id: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListInput {
    /// Only runs in this state (`running`, `waiting`, `completed`, …).
    #[serde(default)]
    state: Option<String>,
    /// At most this many, most recently updated first (default 50).
    #[serde(default)]
    limit: Option<usize>,
}

/// A run as every tool answers it.
#[derive(Serialize, JsonSchema)]
struct RunOutput {
    run_id: String,
    /// `pending`, `running`, `waiting`, `completed`, `failed`, `cancelled`
    /// or `retired`.
    state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<String>,
    /// The last turn's answer, once it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<String>,
    /// What a waiting run waits for; answer it with `respond`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<PendingOutput>,
}

#[derive(Serialize, JsonSchema)]
struct PendingOutput {
    /// `question`, `approval`, `reconciliation`, `budget`, …
    kind: String,
    prompt: String,
    turn_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<Vec<String>>,
}

#[derive(Serialize, JsonSchema)]
struct ListOutput {
    runs: Vec<RunOutput>,
}

fn object_schema<T: JsonSchema>() -> Arc<JsonObject> {
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    Arc::new(match schema {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    })
}

/// The six tools, with their input and output schemas.
fn tools() -> Vec<Tool> {
    let run = object_schema::<RunOutput>();
    let read = ToolAnnotations::new().read_only(true);
    let tool = |name: &'static str, description: &'static str, input: Arc<JsonObject>| {
        Tool::new(name, description, input).with_raw_output_schema(Arc::clone(&run))
    };
    vec![
        tool(
            "start_run",
            "Start a durable Spool run with a first message (or send it to the run at `address`), and wait a while for the turn's answer.",
            object_schema::<StartInput>(),
        ),
        tool(
            "send_message",
            "Send a message to a run and wait a while for the turn's answer.",
            object_schema::<SendInput>(),
        ),
        tool(
            "respond",
            "Answer what a waiting run asks (a question, an approval), and wait a while for the turn to go on.",
            object_schema::<RespondInput>(),
        ),
        tool(
            "get_run",
            "A run's state, answer and what it waits for.",
            object_schema::<RunInput>(),
        )
        .annotate(read.clone()),
        Tool::new(
            "list_runs",
            "The runs, most recently updated first.",
            object_schema::<ListInput>(),
        )
        .with_raw_output_schema(object_schema::<ListOutput>())
        .annotate(read),
        tool(
            "cancel_run",
            "Cancel a run's turn in progress (the run stays, and takes later messages).",
            object_schema::<RunInput>(),
        ),
    ]
}

/// The caller an HTTP request proved (the edge's authenticator puts it in
/// the request's extensions); none on stdio, where the caller is the
/// operator's own process, as on `spool rpc --stdio`.
fn caller(context: &RequestContext<RoleServer>) -> Option<Principal> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<spool_edge::tables::Authenticated>())
        .and_then(|authenticated| authenticated.0.clone())
}

fn output(view: &RunView) -> RunOutput {
    RunOutput {
        run_id: view.run_id.to_string(),
        state: view.status.state().as_str().to_owned(),
        turn_id: view.turn_id.as_ref().map(ToString::to_string),
        response: view.response.clone(),
        pending: view.suspend.as_ref().map(|s| PendingOutput {
            kind: s.kind.as_str().to_owned(),
            prompt: s.prompt.clone(),
            turn_id: s.turn_id.to_string(),
            options: s.options.clone(),
        }),
    }
}

/// A tool's failure as the host shows it: a result flagged as an error,
/// with a stable code and the reason.
fn refused(error: &RuntimeError) -> CallToolResult {
    CallToolResult::structured_error(json!({
        "code": spool_edge::tables::error_code(error.kind()).as_str(),
        "message": error.to_string(),
    }))
}

fn bad_input(message: String) -> CallToolResult {
    CallToolResult::structured_error(json!({"code": "bad_request", "message": message}))
}

fn parse<T: for<'de> Deserialize<'de>>(arguments: Option<JsonObject>) -> Result<T, CallToolResult> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| bad_input(format!("invalid arguments: {e}")))
}

/// An MCP host's address for a run, in a namespace of its own.
fn address(name: String) -> Result<spool_journal::Address, CallToolResult> {
    if name.is_empty() || name.len() > spool_wire::run::MAX_ADDRESS_BYTES {
        return Err(bad_input(format!(
            "`address` must be 1 to {} bytes",
            spool_wire::run::MAX_ADDRESS_BYTES
        )));
    }
    Ok(spool_journal::Address::new("mcp", name))
}

fn run_id(id: &str) -> Result<RunId, CallToolResult> {
    RunId::new(id).map_err(|e| bad_input(format!("`run_id`: {e}")))
}

impl RunsServer {
    /// The server over `runtime`, reaching runs as `access` allows.
    #[must_use]
    pub fn new(runtime: Runtime, access: RunAccess) -> Self {
        Self {
            runtime,
            access,
            patience: Patience::default(),
            watching: Arc::default(),
        }
    }

    /// How long a tool waits for a turn before answering with the run as
    /// it is.
    #[must_use]
    pub fn with_patience(mut self, patience: Patience) -> Self {
        self.patience = patience;
        self
    }

    /// A copy for a new connection, with no subscriptions.
    #[must_use]
    pub fn connection(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            access: self.access,
            patience: self.patience,
            watching: Arc::default(),
        }
    }

    async fn reach(&self, caller: Option<&Principal>, run: &RunId) -> Result<(), CallToolResult> {
        self.access
            .check(&self.runtime, caller, run)
            .await
            .map_err(|e| refused(&e))
    }

    /// Waits up to the patience for `accepted`'s turn to rest, streaming
    /// its answer as progress when the host asked, then answers the run as
    /// it is.
    async fn settled(
        &self,
        accepted: &Accepted,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        self.waited(accepted.run(), self.runtime.settle(accepted), context)
            .await
    }

    /// Waits up to the patience for `rest` (the turn reaching a
    /// boundary), streaming the run's answer as progress when the host
    /// asked, then answers the run as it is.
    async fn waited(
        &self,
        run: &RunId,
        rest: impl std::future::Future<Output = Result<RunView, RuntimeError>>,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let run = run.clone();
        let (stop, until) = tokio::sync::watch::channel(None);
        let progress = context.meta.get_progress_token().map(|token| {
            let runtime = self.runtime.clone();
            let peer = context.peer.clone();
            let run = run.clone();
            tokio::spawn(async move { stream_progress(runtime, peer, run, token, until).await })
        });
        let waited = tokio::time::timeout(self.patience.0, rest).await;
        let view = match waited {
            Ok(Ok(view)) => Ok(view),
            // Past the host's patience the run is answered as it is.
            Ok(Err(_)) | Err(_) => self.runtime.get(&run).await,
        };
        if let Some(progress) = progress {
            // The answer's last pieces go out before the result does: the
            // stream ends once it has passed the position answered.
            let _ = stop.send(Some(
                view.as_ref().ok().and_then(|v| v.cursor).unwrap_or(Seq(0)),
            ));
            let abort = progress.abort_handle();
            if tokio::time::timeout(PROGRESS_DRAIN, progress)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let view = match view {
            Ok(view) => view,
            Err(error) => return refused(&error).into(),
        };
        // A host that speaks the tasks extension gets a turn that has not
        // ended as a task, which it polls; any other host gets the run as
        // it is, and reads it later with `get_run`.
        let tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        if let (true, Some(turn)) = (tasks && !ended(&view), view.turn_id.clone()) {
            let id = TaskId {
                run: view.run_id.clone(),
                turn,
                created: time::OffsetDateTime::now_utc(),
            };
            let task = self.detailed(&id, &view).await.task;
            return CallToolResponse::Task(CreateTaskResult::new(task));
        }
        structured(&output(&view)).into()
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let caller = caller(context);
        let caller = caller.as_ref();
        match self.tool(&request, caller, context).await {
            Ok(response) => response,
            Err(result) => result.into(),
        }
    }

    async fn tool(
        &self,
        request: &CallToolRequestParams,
        caller: Option<&Principal>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, CallToolResult> {
        let arguments = request.arguments.clone();
        Ok(match request.name.as_ref() {
            "start_run" => {
                let input: StartInput = parse(arguments)?;
                let address = input.address.map(address).transpose()?;
                if let Some(address) = &address
                    && let Some(run) = self
                        .runtime
                        .find_address(address)
                        .await
                        .map_err(|e| refused(&e))?
                {
                    self.reach(caller, &run).await?;
                }
                let accepted = self
                    .runtime
                    .start(StartRequest {
                        text: input.text,
                        address,
                        principal: caller.cloned(),
                        kind: Some("mcp".into()),
                        ..StartRequest::default()
                    })
                    .await
                    .map_err(|e| refused(&e))?;
                self.settled(&accepted, context).await
            }
            "send_message" => {
                let input: SendInput = parse(arguments)?;
                let run = run_id(&input.run_id)?;
                self.reach(caller, &run).await?;
                let accepted = self
                    .runtime
                    .send(
                        &run,
                        MessageRequest {
                            text: input.text,
                            context: Vec::new(),
                            policy: None,
                        },
                    )
                    .await
                    .map_err(|e| refused(&e))?;
                self.settled(&accepted, context).await
            }
            "respond" => {
                let input: RespondInput = parse(arguments)?;
                let run = run_id(&input.run_id)?;
                let turn = TurnId::new(&input.turn_id)
                    .map_err(|e| bad_input(format!("`turn_id`: {e}")))?;
                self.reach(caller, &run).await?;
                self.runtime
                    .respond(
                        &run,
                        Some(&turn),
                        vec![Answer {
                            text: input.text.unwrap_or_default(),
                            approved: input.approved,
                        }],
                    )
                    .await
                    .map_err(|e| refused(&e))?;
                self.waited(&run, self.runtime.wait_for(&run, &turn), context)
                    .await
            }
            "get_run" => {
                let input: RunInput = parse(arguments)?;
                let run = run_id(&input.run_id)?;
                self.reach(caller, &run).await?;
                let view = self.runtime.get(&run).await.map_err(|e| refused(&e))?;
                structured(&output(&view)).into()
            }
            "list_runs" => {
                let input: ListInput = parse(arguments)?;
                let limit = input.limit.unwrap_or(50).min(1000);
                let mut runs = Vec::new();
                for summary in self.runtime.list().await.map_err(|e| refused(&e))? {
                    if runs.len() >= limit {
                        break;
                    }
                    if input
                        .state
                        .as_deref()
                        .is_some_and(|state| state != summary.status.state().as_str())
                    {
                        continue;
                    }
                    if !self
                        .access
                        .reaches(&self.runtime, caller, &summary.run_id)
                        .await
                        .unwrap_or(false)
                    {
                        continue;
                    }
                    if let Ok(view) = self.runtime.get(&summary.run_id).await {
                        runs.push(output(&view));
                    }
                }
                structured(&ListOutput { runs }).into()
            }
            "cancel_run" => {
                let input: RunInput = parse(arguments)?;
                let run = run_id(&input.run_id)?;
                self.reach(caller, &run).await?;
                self.runtime
                    .cancel(&run, None)
                    .await
                    .map_err(|e| refused(&e))?;
                let view = self.runtime.get(&run).await.map_err(|e| refused(&e))?;
                structured(&output(&view)).into()
            }
            other => bad_input(format!("no tool is named `{other}`")).into(),
        })
    }

    /// The run a resource URI names, and whether it is the events one.
    fn resource(uri: &str) -> Option<(RunId, bool)> {
        let rest = uri.strip_prefix("spool://runs/")?;
        let (id, events) = match rest.strip_suffix("/events") {
            Some(id) => (id, true),
            None => (rest, false),
        };
        RunId::new(id).ok().map(|run| (run, events))
    }

    /// The task `id` names, when the caller may reach its run: another's
    /// task is one that does not exist.
    async fn task_of(
        &self,
        id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(TaskId, RunView), McpError> {
        let task = TaskId::parse(id).ok_or_else(|| no_task(id))?;
        let caller = caller(context);
        if self
            .access
            .check(&self.runtime, caller.as_ref(), &task.run)
            .await
            .is_err()
        {
            return Err(no_task(id));
        }
        let view = self.runtime.get(&task.run).await.map_err(|_| no_task(id))?;
        Ok((task, view))
    }

    /// The task as it stands: working while its turn runs, waiting for
    /// input while the turn waits (one form, `answer`), and completed with
    /// the run as `get_run` shows it once the turn is over (a failed turn
    /// is a completed call whose run says `failed`), or cancelled.
    async fn detailed(&self, id: &TaskId, view: &RunView) -> DetailedTask {
        let current = view.turn_id.as_ref() == Some(&id.turn);
        let payload = match (current, view.status.state(), &view.suspend) {
            (true, RunState::Pending | RunState::Running, _) => TaskPayload::Working,
            (true, RunState::Waiting, Some(suspend)) => {
                match serde_json::from_value::<InputRequest>(elicitation(suspend)) {
                    Ok(request) => TaskPayload::InputRequired {
                        input_requests: [(ANSWER_KEY.to_owned(), request)].into(),
                    },
                    Err(_) => TaskPayload::Working,
                }
            }
            (true, RunState::Cancelled, _) => TaskPayload::Cancelled,
            // Over: ended, or overtaken by a later turn.
            _ => {
                let result = serde_json::to_value(structured(&output(view))).unwrap_or_default();
                TaskPayload::Completed {
                    result: match result {
                        Value::Object(map) => map,
                        _ => JsonObject::new(),
                    },
                }
            }
        };
        let updated = self.last_update(view).await.unwrap_or(id.created);
        let task = Task::new(
            id.to_string(),
            payload.status(),
            rfc3339(id.created),
            rfc3339(updated.max(id.created)),
        )
        .with_poll_interval_ms(POLL_INTERVAL_MS);
        DetailedTask::new(task, payload)
    }

    /// When the run last recorded an event: its last event's time, read
    /// alone.
    async fn last_update(&self, view: &RunView) -> Option<time::OffsetDateTime> {
        let last = view.cursor?;
        let before = last.0.checked_sub(1).map(Seq);
        let mut subscription = self.runtime.subscribe(&view.run_id, before).await.ok()?;
        loop {
            match subscription.next().await? {
                spool_runtime::hub::StreamItem::Event(envelope) => {
                    return Some(envelope.recorded_at);
                }
                spool_runtime::hub::StreamItem::Lagged { .. } => return None,
                spool_runtime::hub::StreamItem::Delta(_) => {}
            }
        }
    }

    /// The run `uri` names and whether it is its events, when the caller
    /// may reach it: another's run is a resource that does not exist.
    async fn reachable(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(RunId, bool), McpError> {
        let (run, events) = Self::resource(uri).ok_or_else(|| resource_not_found(uri))?;
        let caller = caller(context);
        match self
            .access
            .check(&self.runtime, caller.as_ref(), &run)
            .await
        {
            Ok(()) => Ok((run, events)),
            Err(_) => Err(resource_not_found(uri)),
        }
    }

    async fn read(&self, run: &RunId, events: bool) -> Result<ResourceContents, RuntimeError> {
        if events {
            let last = self.runtime.get(run).await?.cursor;
            let mut subscription = self.runtime.subscribe(run, None).await?;
            let mut lines = Vec::new();
            if let Some(last) = last {
                while let Some(item) = subscription.next().await {
                    if let spool_runtime::hub::StreamItem::Event(envelope) = item {
                        let seq = envelope.seq;
                        lines.push(serde_json::to_value(&*envelope).unwrap_or(Value::Null));
                        if seq >= last {
                            break;
                        }
                    }
                }
            }
            let text = serde_json::to_string(&lines).unwrap_or_default();
            return Ok(ResourceContents::TextResourceContents {
                uri: format!("spool://runs/{run}/events"),
                mime_type: Some("application/json".into()),
                text,
                meta: None,
            });
        }
        let snapshot = self.runtime.snapshot(run).await?;
        let mut text = String::new();
        for message in &snapshot.messages {
            let role = message["role"].as_str().unwrap_or("?");
            text.push_str(&format!(
                "{role}: {}\n",
                transcript_line(&message["content"])
            ));
        }
        Ok(ResourceContents::TextResourceContents {
            uri: format!("spool://runs/{run}"),
            mime_type: Some("text/plain".into()),
            text,
            meta: None,
        })
    }
}

/// One message's content as a transcript line: its text parts, and each
/// tool call or result in brackets.
fn transcript_line(content: &Value) -> String {
    let Value::Array(parts) = content else {
        return match content {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
    };
    let shown: Vec<String> = parts
        .iter()
        .map(|part| match part["type"].as_str() {
            Some("text") => part["text"].as_str().unwrap_or_default().to_owned(),
            Some("tool_call") => format!(
                "[calls {} {}]",
                part["name"].as_str().unwrap_or("?"),
                part["arguments"]
            ),
            _ => part.to_string(),
        })
        .collect();
    shown.join(" ")
}

/// A turn as an MCP task. Its id names the run, the turn, and when the
/// task was made (`RUN/TURN/UNIX_MS`): any Spool on the journal answers
/// for it, before a restart or after.
struct TaskId {
    run: RunId,
    turn: TurnId,
    created: time::OffsetDateTime,
}

impl TaskId {
    fn parse(id: &str) -> Option<Self> {
        let mut parts = id.splitn(3, '/');
        let run = RunId::new(parts.next()?).ok()?;
        let turn = TurnId::new(parts.next()?).ok()?;
        let millis: i128 = parts.next()?.parse().ok()?;
        let created =
            time::OffsetDateTime::from_unix_timestamp_nanos(millis.checked_mul(1_000_000)?).ok()?;
        Some(Self { run, turn, created })
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let millis = self.created.unix_timestamp_nanos() / 1_000_000;
        write!(f, "{}/{}/{millis}", self.run, self.turn)
    }
}

/// The one input request a waiting turn's task carries.
const ANSWER_KEY: &str = "answer";

/// How often a host is told to poll a task.
const POLL_INTERVAL_MS: u64 = 1000;

/// Whether the run's last turn is over (nothing more will happen to it).
fn ended(view: &RunView) -> bool {
    !matches!(
        view.status.state(),
        RunState::Pending | RunState::Running | RunState::Waiting
    )
}

fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The form a waiting turn asks its host to fill in: a verdict for an
/// approval or a budget, an answer (one of the options, when there are
/// some) otherwise.
fn elicitation(suspend: &spool_journal::event::Suspended) -> Value {
    use spool_wire::run::SuspendKind;
    let schema = match suspend.kind {
        SuspendKind::Approval | SuspendKind::Budget => json!({
            "type": "object",
            "properties": {
                "approved": {"type": "boolean", "title": "Approve"},
                "text": {"type": "string", "title": "Comment"}
            },
            "required": ["approved"]
        }),
        _ => {
            let mut text = json!({"type": "string", "title": "Answer"});
            if let Some(options) = &suspend.options {
                text["enum"] = json!(options);
            }
            json!({"type": "object", "properties": {"text": text}, "required": ["text"]})
        }
    };
    json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": suspend.prompt, "requestedSchema": schema}
    })
}

fn no_task(id: &str) -> McpError {
    McpError::invalid_params(format!("no task `{id}`"), None)
}

fn resource_not_found(uri: &str) -> McpError {
    McpError::resource_not_found(format!("no resource `{uri}`"), None)
}

fn structured<T: Serialize>(value: &T) -> CallToolResult {
    CallToolResult::structured(serde_json::to_value(value).unwrap_or(Value::Null))
}

/// Sends the turn's streamed text as progress messages until aborted.
/// Sends the turn's streamed text as progress messages, until the stream
/// has passed the position `until` names (the position the tool answers
/// with), or the subscription ends.
async fn stream_progress(
    runtime: Runtime,
    peer: rmcp::Peer<RoleServer>,
    run: RunId,
    token: rmcp::model::ProgressToken,
    mut until: tokio::sync::watch::Receiver<Option<Seq>>,
) {
    let from = runtime.get(&run).await.ok().and_then(|v| v.cursor);
    let Ok(mut subscription) = runtime.subscribe(&run, from).await else {
        return;
    };
    let reader = Reader::stateless();
    let mut seen = from;
    let mut sent = 0.0;
    let passed = |seen: Option<Seq>, until: Option<Seq>| match (seen, until) {
        (_, None) => false,
        (Some(seen), Some(until)) => seen >= until,
        (None, Some(until)) => until == Seq(0),
    };
    loop {
        if passed(seen, *until.borrow()) {
            return;
        }
        let item = tokio::select! {
            item = subscription.next() => item,
            changed = until.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let text = match item {
            None | Some(spool_runtime::hub::StreamItem::Lagged { .. }) => return,
            Some(spool_runtime::hub::StreamItem::Event(envelope)) => {
                seen = Some(envelope.seq);
                continue;
            }
            // The answer's text, as the activity layer reads a delta.
            Some(spool_runtime::hub::StreamItem::Delta(delta)) => match reader.delta(&delta) {
                Activity::ModelStreamed {
                    delta: spool_runtime::engine::Delta::Text(text),
                    ..
                } => text.clone(),
                _ => continue,
            },
        };
        sent += 1.0;
        let notification = ProgressNotificationParam::new(token.clone(), sent).with_message(text);
        if peer.notify_progress(notification).await.is_err() {
            return;
        }
    }
}

impl ServerHandler for RunsServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("spool", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Spool runs durable agent runs. start_run begins one; a turn that outlasts the wait is returned as running or waiting with its run_id: read it later with get_run, and answer a waiting run with respond.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        Ok(self.call(request, &context).await)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let caller = caller(&context);
        let summaries = self
            .runtime
            .list()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let mut resources = Vec::new();
        for summary in summaries.iter().take(500) {
            if !self
                .access
                .reaches(&self.runtime, caller.as_ref(), &summary.run_id)
                .await
                .unwrap_or(false)
            {
                continue;
            }
            let id = &summary.run_id;
            let title = summary.title.clone().unwrap_or_else(|| id.to_string());
            resources.push(
                Resource::new(format!("spool://runs/{id}"), format!("{id}"))
                    .with_title(format!("{title}: transcript"))
                    .with_mime_type("text/plain"),
            );
            resources.push(
                Resource::new(format!("spool://runs/{id}/events"), format!("{id}/events"))
                    .with_title(format!("{title}: journal"))
                    .with_mime_type("application/json"),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let (run, events) = self.reachable(&request.uri, &context).await?;
        match self.read(&run, events).await {
            Ok(contents) => Ok(ReadResourceResult::new(vec![contents]).into()),
            Err(error) if error.kind() == spool_runtime::ErrorKind::RunNotFound => {
                Err(resource_not_found(&request.uri))
            }
            Err(error) => Err(McpError::internal_error(error.to_string(), None)),
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Changes to runs' resources; a URI that names no run is left out
        // of what is acknowledged. Tool and resource lists do not change.
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| Self::resource(uri).is_some())
            .cloned()
            .collect();
        Some(
            SubscriptionFilter::builder()
                .resource_subscriptions(uris)
                .build(),
        )
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        // One task per run the caller may reach, each ending with the
        // subscription; another's run is left silent, as if it did not exist.
        let mut watching = tokio::task::JoinSet::new();
        for uri in context.accepted().resource_subscriptions.iter().flatten() {
            let Ok((run, _)) = self.reachable(uri, context.request_context()).await else {
                continue;
            };
            let from = self.runtime.get(&run).await.ok().and_then(|v| v.cursor);
            let Ok(mut subscription) = self.runtime.subscribe(&run, from).await else {
                continue;
            };
            let sink = context.sink().clone();
            let uri = uri.clone();
            watching.spawn(async move {
                while let Some(item) = subscription.next().await {
                    if !matches!(item, spool_runtime::hub::StreamItem::Event(_)) {
                        continue;
                    }
                    let updated = ServerNotification::ResourceUpdatedNotification(
                        ResourceUpdatedNotification::new(ResourceUpdatedNotificationParam::new(
                            uri.clone(),
                        )),
                    );
                    if sink.send(updated).await.is_err() {
                        return;
                    }
                }
            });
        }
        context.cancelled().await;
        watching.abort_all();
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (task, view) = self.task_of(&request.task_id, &context).await?;
        Ok(GetTaskResult::new(self.detailed(&task, &view).await))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (task, view) = self.task_of(&request.task_id, &context).await?;
        let waits = view.turn_id.as_ref() == Some(&task.turn) && view.suspend.is_some();
        let Some(suspend) = view.suspend.as_ref().filter(|_| waits) else {
            return Err(McpError::invalid_params(
                format!("task `{}` does not wait for input", request.task_id),
                None,
            ));
        };
        let response = request.input_responses.get(ANSWER_KEY).ok_or_else(|| {
            McpError::invalid_params(format!("`inputResponses` needs `{ANSWER_KEY}`"), None)
        })?;
        let content = &response["content"];
        let answer = match response["action"].as_str() {
            Some("accept") => Answer {
                text: content["text"].as_str().unwrap_or_default().to_owned(),
                approved: content["approved"].as_bool(),
            },
            // Declining a verdict is a rejection; a question is answered
            // or its task cancelled.
            Some("decline" | "cancel")
                if matches!(
                    suspend.kind,
                    spool_wire::run::SuspendKind::Approval | spool_wire::run::SuspendKind::Budget
                ) =>
            {
                Answer {
                    text: "declined".into(),
                    approved: Some(false),
                }
            }
            _ => {
                return Err(McpError::invalid_params(
                    "the answer must accept the form (a question is answered, or its task cancelled)",
                    None,
                ));
            }
        };
        self.runtime
            .respond(&task.run, Some(&task.turn), vec![answer])
            .await
            .map_err(|e| McpError::invalid_params(e.to_string(), None))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (task, _) = self.task_of(&request.task_id, &context).await?;
        self.runtime
            .cancel(&task.run, Some(&task.turn))
            .await
            .map(|_| ())
            .map_err(|e| McpError::invalid_params(e.to_string(), None))
    }

    #[allow(
        deprecated,
        reason = "resources/subscribe is how hosts before 2026-07-28 subscribe"
    )]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (run, _) = self.reachable(&request.uri, &context).await?;
        let from = self
            .runtime
            .get(&run)
            .await
            .map_err(|_| resource_not_found(&request.uri))?
            .cursor;
        let mut subscription = self
            .runtime
            .subscribe(&run, from)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let peer = context.peer.clone();
        let uri = request.uri.clone();
        let task = tokio::spawn(async move {
            while let Some(item) = subscription.next().await {
                if matches!(item, spool_runtime::hub::StreamItem::Event(_))
                    && peer
                        .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri.clone()))
                        .await
                        .is_err()
                {
                    return;
                }
            }
        });
        if let Some(old) = self
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(request.uri, task)
        {
            old.abort();
        }
        Ok(())
    }

    #[allow(
        deprecated,
        reason = "resources/unsubscribe pairs with resources/subscribe"
    )]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if let Some(task) = self
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&request.uri)
        {
            task.abort();
        }
        Ok(())
    }
}

/// Serves `server` on this process's stdin and stdout until the host
/// closes them.
///
/// # Errors
///
/// When the handshake fails.
pub async fn serve_stdio(server: RunsServer) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| e.to_string())?;
    running.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// `/mcp` for `spool serve` (Streamable HTTP), a handler to mount on the
/// HTTP channel: the channel's guard and authenticator have admitted the
/// request before it gets here, and its proven caller rides in the
/// request's extensions.
#[must_use]
pub fn route(
    server: &RunsServer,
    closing: &tokio::sync::watch::Receiver<bool>,
) -> spool_edge::server::Handler {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    {
        let cancel = cancel.clone();
        let mut closing = closing.clone();
        tokio::spawn(async move {
            let _ = closing.wait_for(|closing| *closing).await;
            cancel.cancel();
        });
    }
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = cancel;
    // The edge checks Host and Origin for every surface, by the server's
    // own rules; the SDK's loopback-only default would refuse the names
    // an operator allowed.
    config.allowed_hosts = Vec::new();
    config.allowed_origins = Vec::new();
    config.max_request_body_bytes = spool_wire::http::MAX_BODY_BYTES;
    let factory = server.clone();
    let service = Arc::new(StreamableHttpService::new(
        move || Ok(factory.connection()),
        Arc::new(LocalSessionManager::default()),
        config,
    ));
    Arc::new(move |request: http::Request<hyper::body::Incoming>| {
        let service = Arc::clone(&service);
        Box::pin(async move {
            let delete = request.method() == http::Method::DELETE;
            let mut response = service.handle(request).await;
            // ending a session has no body to wait for: 204, which hosts
            // expect (the SDK answers 202, which the Python client logs as
            // a failed termination).
            if delete && response.status() == http::StatusCode::ACCEPTED {
                *response.status_mut() = http::StatusCode::NO_CONTENT;
            }
            response
        })
    })
}
