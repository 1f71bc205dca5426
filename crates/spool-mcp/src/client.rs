//! One configured MCP server, as Spool's client of it: started on first
//! need and again after it exits (with backoff), its tools listed (every
//! page), and calls sent with a timeout, cancelled with the turn.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientRequest,
    Implementation, ProgressToken, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::config::McpSection;

/// How much of a server's stderr is kept for the errors that name it: as
/// much as of a command tool's.
const STDERR_TAIL: usize = spool_runtime::process::STDERR_TAIL_BYTES;

/// The longest wait before a server that keeps failing is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A configured server and, while it runs, the connection to it.
pub struct Server {
    section: McpSection,
    base: std::path::PathBuf,
    connection: tokio::sync::Mutex<Connection>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// The task reading the running program's stderr, which ends when the
    /// program does.
    stderr_reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    changed: Arc<tokio::sync::Notify>,
    progress: Listening,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.section.name)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Connection {
    service: Option<RunningService<RoleClient, Handler>>,
    /// Starts that failed in a row, and when the next may be tried.
    failures: u32,
    next_start: Option<Instant>,
}

/// Where a call's progress goes.
pub type Progress = Arc<dyn Fn(String) + Send + Sync>;

/// The calls in flight that report progress, by their progress token.
type Listening = Arc<Mutex<HashMap<ProgressToken, Progress>>>;

/// What Spool tells a server about itself, and what it hears back.
#[derive(Clone)]
struct Handler {
    server: String,
    changed: Arc<tokio::sync::Notify>,
    progress: Listening,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        rmcp::model::ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("spool", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(server = %self.server, "the MCP server's tools changed");
        self.changed.notify_one();
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let sink = self
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&params.progress_token)
            .cloned();
        let Some(sink) = sink else {
            tracing::debug!(server = %self.server, "progress for no call in flight");
            return;
        };
        let numbers = match params.total {
            Some(total) => format!("{}/{total}", params.progress),
            None => format!("{}", params.progress),
        };
        sink(match params.message {
            Some(message) if !message.is_empty() => format!("{message} ({numbers})"),
            _ => numbers,
        });
    }
}

/// Why a call or a listing failed; the text is what the model reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The server could not be started or reached.
    #[error("MCP server `{server}` is not available: {reason}")]
    Unavailable {
        /// The server.
        server: String,
        /// Why, with its stderr's tail.
        reason: String,
    },
    /// The call took longer than `timeout_seconds`.
    #[error("MCP server `{server}` did not answer within {seconds} s")]
    Timeout {
        /// The server.
        server: String,
        /// The limit.
        seconds: f64,
    },
    /// The turn was cancelled while the call was in flight.
    #[error("the call was cancelled")]
    Cancelled,
    /// The server answered with a protocol error.
    #[error("MCP server `{server}` refused the call: {reason}")]
    Refused {
        /// The server.
        server: String,
        /// Its error.
        reason: String,
    },
}

impl Server {
    /// The server `section` describes; started on first need, from
    /// `base` (the definition's directory).
    #[must_use]
    pub fn new(section: McpSection, base: &Path) -> Self {
        Self {
            section,
            base: base.to_path_buf(),
            connection: tokio::sync::Mutex::default(),
            stderr: Arc::default(),
            stderr_reader: Mutex::default(),
            changed: Arc::default(),
            progress: Arc::default(),
        }
    }

    /// Its configuration.
    #[must_use]
    pub fn section(&self) -> &McpSection {
        &self.section
    }

    /// Fires when the server says its tool list changed.
    #[must_use]
    pub fn changed(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.changed)
    }

    /// Every tool the server lists, every page of them.
    ///
    /// # Errors
    ///
    /// [`ServerError`] when it cannot be started or refuses.
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, ServerError> {
        let peer = self.peer().await?;
        match peer.list_all_tools().await {
            Ok(tools) => Ok(tools),
            Err(error) => Err(self.failed(error).await),
        }
    }

    /// Sends one `tools/call` and waits for its result, the timeout, or
    /// `cancel`; a call given up is cancelled at the server
    /// (`notifications/cancelled`). The server's progress notifications
    /// for the call go to `progress`.
    ///
    /// # Errors
    ///
    /// [`ServerError`]: the server is down or exits, the call times out or
    /// is cancelled, or the server refuses it.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        cancel: &CancellationToken,
        progress: Option<Progress>,
    ) -> Result<CallToolResult, ServerError> {
        let peer = self.peer().await?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut handle = match peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(error) => return Err(self.failed(error).await),
        };
        let token = handle.progress_token.clone();
        if let Some(progress) = progress {
            self.listening().insert(token.clone(), progress);
        }
        let seconds = self.section.timeout_seconds;
        let outcome = tokio::select! {
            answer = &mut handle.rx => Some(answer),
            () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => None,
            () = cancel.cancelled() => None,
        };
        self.listening().remove(&token);
        let answer = match outcome {
            Some(answer) => answer.unwrap_or(Err(rmcp::ServiceError::TransportClosed)),
            None => {
                let cancelled = cancel.is_cancelled();
                let reason = if cancelled {
                    "the turn was cancelled"
                } else {
                    "the call timed out"
                };
                let _ = handle.cancel(Some(reason.to_owned())).await;
                return Err(if cancelled {
                    ServerError::Cancelled
                } else {
                    ServerError::Timeout {
                        server: self.section.name.clone(),
                        seconds,
                    }
                });
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(other) => Err(ServerError::Refused {
                server: self.section.name.clone(),
                reason: format!(
                    "it answered the call with something other than a tool result: {}",
                    serde_json::to_string(&other).unwrap_or_default()
                ),
            }),
            Err(error) => Err(self.failed(error).await),
        }
    }

    fn listening(&self) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, Progress>> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the server, if it runs.
    pub async fn stop(&self) {
        let service = self.connection.lock().await.service.take();
        if let Some(service) = service {
            let _ = service.cancel().await;
        }
    }

    /// The running connection's peer, starting the server when it is not
    /// running (unless it failed too recently: then the call fails now).
    async fn peer(&self) -> Result<rmcp::Peer<RoleClient>, ServerError> {
        let mut connection = self.connection.lock().await;
        if let Some(service) = &connection.service {
            if !service.is_transport_closed() {
                return Ok(service.peer().clone());
            }
            self.stderr_drained().await;
            tracing::warn!(server = %self.section.name, stderr = %self.stderr_tail(), "the MCP server exited; starting it again");
            connection.service = None;
        }
        if let Some(at) = connection.next_start {
            let now = Instant::now();
            if at > now {
                return Err(self.unavailable(format!(
                    "it failed to start; the next attempt is in {:.1} s",
                    (at - now).as_secs_f64()
                )));
            }
        }
        match self.start().await {
            Ok(service) => {
                let peer = service.peer().clone();
                connection.service = Some(service);
                connection.failures = 0;
                connection.next_start = None;
                Ok(peer)
            }
            Err(reason) => {
                connection.failures += 1;
                let wait = Duration::from_millis(500)
                    .saturating_mul(1 << connection.failures.min(6))
                    .min(MAX_BACKOFF);
                connection.next_start = Some(Instant::now() + wait);
                tracing::warn!(server = %self.section.name, %reason, "an MCP server did not start");
                Err(self.unavailable(reason))
            }
        }
    }

    /// Starts the program, or reaches the URL, and performs the
    /// protocol's handshake.
    async fn start(&self) -> Result<RunningService<RoleClient, Handler>, String> {
        let handler = Handler {
            server: self.section.name.clone(),
            changed: Arc::clone(&self.changed),
            progress: Arc::clone(&self.progress),
        };
        let limit = Duration::from_secs_f64(self.section.timeout_seconds);
        let served = match &self.section.url {
            Some(url) => {
                let transport = self.http_transport(url)?;
                tokio::time::timeout(limit, handler.serve(transport)).await
            }
            None => {
                let transport = self.child()?;
                tokio::time::timeout(limit, handler.serve(transport)).await
            }
        };
        match served {
            Ok(Ok(service)) => {
                tracing::info!(
                    server = %self.section.name,
                    protocol = ?service.peer().peer_info().map(|i| i.protocol_version.to_string()),
                    "MCP server started"
                );
                Ok(service)
            }
            Ok(Err(error)) => Err(format!(
                "the handshake failed: {error}{}",
                self.stderr_suffix()
            )),
            Err(_) => Err(format!(
                "no handshake within {} s{}",
                self.section.timeout_seconds,
                self.stderr_suffix()
            )),
        }
    }

    /// The Streamable HTTP transport to `url`, with the configured headers
    /// and the token file's token, under the edge's trust policy.
    fn http_transport(
        &self,
        url: &str,
    ) -> Result<rmcp::transport::StreamableHttpClientTransport<reqwest::Client>, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let tls = spool_edge::outbound::environment_config().map_err(|e| e.to_string())?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .connect_timeout(spool_edge::outbound::CONNECT_TIMEOUT)
            .build()
            .map_err(|e| format!("the HTTP client did not build: {e}"))?;
        let mut headers = std::collections::HashMap::new();
        for (name, value) in &self.section.headers {
            // Checked when the definition was read.
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
        let mut config =
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).custom_headers(headers);
        if let Some(file) = &self.section.token_file {
            let path = self.base.join(file);
            let token = std::fs::read_to_string(&path)
                .map_err(|e| format!("its token file {} cannot be read: {e}", path.display()))?;
            config = config.auth_header(token.trim().to_owned());
        }
        Ok(rmcp::transport::StreamableHttpClientTransport::with_client(
            client, config,
        ))
    }

    /// Starts the program with its stdin and stdout as the channel, its
    /// stderr kept.
    fn child(&self) -> Result<TokioChildProcess, String> {
        let (program, args) = self
            .section
            .command
            .split_first()
            .ok_or_else(|| "no command".to_owned())?;
        let mut command = tokio::process::Command::new(program);
        command.args(args).envs(&self.section.env);
        // The definition's directory may be given as `` (this one), which
        // `current_dir` cannot take.
        let dir = match &self.section.cwd {
            Some(cwd) => self.base.join(cwd),
            None => self.base.clone(),
        };
        if !dir.as_os_str().is_empty() {
            command.current_dir(dir);
        }
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("`{program}` did not start: {e}"))?;
        if let Some(stderr) = stderr {
            self.keep_stderr(stderr);
        }
        Ok(transport)
    }

    /// Reads the server's stderr into a bounded tail, and into the log.
    fn keep_stderr(&self, stderr: tokio::process::ChildStderr) {
        let tail = Arc::clone(&self.stderr);
        let server = self.section.name.clone();
        let reader = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(%server, %line, "MCP server stderr");
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                tail.extend(line.bytes().chain([b'\n']));
                let over = tail.len().saturating_sub(STDERR_TAIL);
                tail.drain(..over);
            }
        });
        *self
            .stderr_reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reader);
    }

    /// Waits, briefly, for an exited program's last stderr lines.
    async fn stderr_drained(&self) {
        let reader = self
            .stderr_reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(reader) = reader {
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = tail.as_slices();
        let bytes = [a, b].concat();
        String::from_utf8_lossy(&bytes).trim().to_owned()
    }

    fn stderr_suffix(&self) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends: {tail}")
        }
    }

    fn unavailable(&self, reason: String) -> ServerError {
        ServerError::Unavailable {
            server: self.section.name.clone(),
            reason,
        }
    }

    /// A failed request: a closed transport means the server exited (it
    /// is started again for the next call), anything else is its refusal.
    async fn failed(&self, error: rmcp::ServiceError) -> ServerError {
        match error {
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
                self.connection.lock().await.service = None;
                self.stderr_drained().await;
                let reason = format!("it exited during the call{}", self.stderr_suffix());
                tracing::warn!(server = %self.section.name, %reason, "an MCP server exited");
                self.unavailable(reason)
            }
            rmcp::ServiceError::McpError(error) => ServerError::Refused {
                server: self.section.name.clone(),
                reason: error.message.to_string(),
            },
            other => ServerError::Refused {
                server: self.section.name.clone(),
                reason: other.to_string(),
            },
        }
    }
}
