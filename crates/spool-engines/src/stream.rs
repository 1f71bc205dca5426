//! The call every HTTP provider shares: send the request, classify a
//! refusal by its status and the provider's error type, retry while no part
//! of the answer has reached the turn, read the SSE stream under an idle
//! timeout, and hand each event to the provider's decoder.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use spool_runtime::engine::{
    CallContext, Delta, Deltas, EngineError, Message, ModelRequest, ModelResponse,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{ApiKey, Settings};
use crate::retry::retry_after;
use crate::transport::Endpoint;
use crate::{SpecError, sse};

/// The most of a refusal's body read, for its error type.
const MAX_REFUSAL_BYTES: usize = 64 * 1024;

/// Declares a public engine over [`HttpEngine`] with `dialect`: the
/// provider engines differ only in their dialect.
macro_rules! http_engine {
    ($(#[$doc:meta])* $name:ident, $dialect:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name($crate::stream::HttpEngine<$dialect>);

        impl $name {
            /// An engine calling `model` as `settings` say.
            ///
            /// # Errors
            ///
            /// [`SpecError::BadUrl`](crate::SpecError::BadUrl) when the base
            /// URL is not one.
            pub fn new(
                model: impl Into<String>,
                settings: $crate::Settings,
            ) -> Result<Self, $crate::SpecError> {
                let dialect = $dialect { model: model.into() };
                Ok(Self($crate::stream::HttpEngine::new(dialect, settings)?))
            }
        }

        impl spool_runtime::Engine for $name {
            fn call<'a>(
                &'a self,
                context: &'a spool_runtime::engine::CallContext,
                request: &'a spool_runtime::engine::ModelRequest,
                deltas: spool_runtime::engine::Deltas<'a>,
                cancel: &'a tokio_util::sync::CancellationToken,
            ) -> spool_runtime::BoxFuture<
                'a,
                Result<spool_runtime::ModelResponse, spool_runtime::engine::EngineError>,
            > {
                Box::pin(self.0.call(context, request, deltas, cancel))
            }

            fn compact<'a>(
                &'a self,
                messages: &'a [spool_runtime::engine::Message],
            ) -> spool_runtime::BoxFuture<'a, Result<String, spool_runtime::engine::EngineError>>
            {
                Box::pin(self.0.summarize(messages))
            }
        }
    };
}

pub(crate) use http_engine;

/// What a provider's API looks like on the wire.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The name logs give the provider.
    const NAME: &'static str;
    /// The path under the base URL.
    const PATH: &'static str;
    /// Reads one call's stream.
    type Decoder: Decoder + Send;

    /// The model the calls name.
    fn model(&self) -> &str;

    /// The JSON body for `request`.
    fn body(&self, request: &ModelRequest, settings: &Settings) -> Value;

    /// The headers beyond the content type, the key's among them.
    fn authorize(
        &self,
        request: http::request::Builder,
        key: Option<&ApiKey>,
    ) -> http::request::Builder;

    /// A decoder for one attempt.
    fn decoder(&self, context: &CallContext) -> Self::Decoder;

    /// The provider's structured error type in an error body.
    fn error_kind(body: &Value) -> Option<String>;

    /// Whether that type means a spent quota, which waiting will not mend.
    fn is_quota(kind: &str) -> bool;
}

/// What a decoder says after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    More,
    Done,
}

/// Reads one attempt's events into deltas and an answer.
pub(crate) trait Decoder {
    /// One event; deltas it completes go in `out`.
    fn event(&mut self, event: &sse::Event, out: &mut Vec<Delta>) -> Result<Progress, Failure>;

    /// The answer, once the stream said it was done; the deltas that close
    /// it (completed tool calls) go in `out`.
    fn finish(self, out: &mut Vec<Delta>) -> Result<ModelResponse, EngineError>;
}

/// A failed attempt: the error the turn records if it is the last, and
/// whether another attempt may follow.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: EngineError,
    pub(crate) retryable: bool,
    pub(crate) after: Option<Duration>,
}

impl Failure {
    pub(crate) fn fatal(error: EngineError) -> Self {
        Self {
            error,
            retryable: false,
            after: None,
        }
    }

    pub(crate) fn retry(error: EngineError) -> Self {
        Self {
            error,
            retryable: true,
            after: None,
        }
    }
}

/// An engine over an HTTP provider API.
#[derive(Debug)]
pub(crate) struct HttpEngine<D> {
    dialect: D,
    endpoint: Endpoint,
    settings: Settings,
}

impl<D: Dialect> HttpEngine<D> {
    pub(crate) fn new(dialect: D, settings: Settings) -> Result<Self, SpecError> {
        // A bad URL or certificate file is refused now, not on the first turn.
        let endpoint = Endpoint::parse(
            &settings.base_url,
            D::PATH,
            settings.ca_file.as_deref(),
            settings.proxy.as_deref(),
        )
        .map_err(|reason| match reason.strip_prefix("TLS: ") {
            Some(tls) => SpecError::Tls(tls.to_owned()),
            None => SpecError::BadUrl {
                url: settings.base_url.clone(),
                reason,
            },
        })?;
        Ok(Self {
            dialect,
            endpoint,
            settings,
        })
    }

    /// One model call, retried while nothing of its answer has streamed.
    pub(crate) async fn call(
        &self,
        context: &CallContext,
        request: &ModelRequest,
        deltas: Deltas<'_>,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, EngineError> {
        let timeout = self.settings.request_timeout;
        let deadline = Instant::now() + timeout;
        let body = Bytes::from(
            serde_json::to_vec(&self.dialect.body(request, &self.settings))
                .expect("a provider request is plain JSON"),
        );
        let mut attempt = 1;
        loop {
            tracing::info!(
                target: "spool::engine",
                provider = D::NAME,
                model = self.dialect.model(),
                url = %self.endpoint.uri(),
                run = %context.run,
                call = context.ordinal,
                attempt,
                "calling the model"
            );
            let failure = tokio::select! {
                () = cancel.cancelled() => return Err(EngineError::Cancelled),
                outcome = tokio::time::timeout_at(deadline, self.attempt(context, body.clone(), deltas)) => {
                    match outcome {
                        Ok(Ok(response)) => return Ok(response),
                        Ok(Err(failure)) => failure,
                        Err(_) => return Err(EngineError::Timeout(format!(
                            "no complete answer within {}s", timeout.as_secs_f64()
                        ))),
                    }
                }
            };
            let retries = attempt - 1;
            let delay = failure
                .after
                .unwrap_or_else(|| self.settings.retry.backoff(retries));
            let give_up = !failure.retryable
                || retries >= self.settings.retry.max_retries
                || Instant::now() + delay >= deadline;
            tracing::warn!(
                target: "spool::engine",
                provider = D::NAME,
                run = %context.run,
                attempt,
                code = %failure.error.code(),
                error = %failure.error,
                delay_ms = (!give_up).then(|| u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
                from_provider = failure.after.is_some(),
                "{}",
                if give_up {
                    "model call failed"
                } else {
                    "model call refused before its answer began; retrying"
                }
            );
            if give_up {
                return Err(failure.error);
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(EngineError::Cancelled),
                () = tokio::time::sleep(delay) => {}
            }
            attempt += 1;
        }
    }

    async fn attempt(
        &self,
        context: &CallContext,
        body: Bytes,
        deltas: Deltas<'_>,
    ) -> Result<ModelResponse, Failure> {
        let mut builder = Request::post(self.endpoint.target());
        if let Some(authorization) = self.endpoint.proxy_authorization() {
            builder = builder.header(header::PROXY_AUTHORIZATION, authorization);
        }
        let request = self
            .dialect
            .authorize(
                builder
                    .header(header::HOST, self.endpoint.authority())
                    .header(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )
                    .header(
                        header::ACCEPT,
                        HeaderValue::from_static("text/event-stream"),
                    )
                    .header(
                        header::USER_AGENT,
                        concat!("spool/", env!("CARGO_PKG_VERSION")),
                    ),
                self.settings.api_key.as_ref(),
            )
            .body(Full::new(body))
            .map_err(|e| Failure::fatal(EngineError::Provider(format!("bad request: {e}"))))?;
        let response = self.endpoint.send(request).await.map_err(|e| Failure {
            retryable: e.retryable(),
            error: if e.proxy_status() == Some(407) {
                EngineError::Auth(e.to_string())
            } else {
                EngineError::Provider(e.to_string())
            },
            after: None,
        })?;
        let status = response.status();
        if !status.is_success() {
            let after = retry_after(response.headers(), SystemTime::now());
            let body = self.refusal_body(response.into_body()).await;
            let mut failure = self.refusal(status, &body);
            failure.after = after;
            return Err(failure);
        }
        // A server that ignored `stream: true` answers with one JSON body;
        // reading it as events would find none and retry in vain.
        if let Some(kind) = response.headers().get(header::CONTENT_TYPE)
            && !kind.as_bytes().starts_with(b"text/event-stream")
        {
            return Err(Failure::fatal(EngineError::Provider(format!(
                "the provider answered with `{}`, not an event stream",
                String::from_utf8_lossy(kind.as_bytes())
            ))));
        }
        let mut body = response.into_body();
        let mut events = sse::Reader::default();
        let mut decoder = self.dialect.decoder(context);
        let mut out = Vec::new();
        let mut emitted = false;
        let idle = self.settings.idle_timeout;
        // Once a byte of the answer has reached the turn, a retry would show
        // the person the same words twice: every failure after is final.
        let after_first = |emitted: bool, mut failure: Failure| {
            failure.retryable &= !emitted;
            failure
        };
        loop {
            let chunk = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => {
                    return Err(Failure::fatal(EngineError::Timeout(format!(
                        "the answer stalled for {}s",
                        idle.as_secs_f64()
                    ))));
                }
                Ok(None) => None,
                Ok(Some(Err(error))) => {
                    return Err(after_first(
                        emitted,
                        Failure::retry(EngineError::Provider(format!(
                            "the answer's stream broke: {error}"
                        ))),
                    ));
                }
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Some(data),
                    Err(_) => continue,
                },
            };
            let read = match &chunk {
                Some(data) => events.push(data),
                None => events.finish(),
            }
            .map_err(|e| Failure::fatal(EngineError::Provider(e.to_string())))?;
            for event in &read {
                let progress = decoder
                    .event(event, &mut out)
                    .map_err(|failure| after_first(emitted, failure))?;
                emitted |= !out.is_empty();
                out.drain(..).for_each(deltas);
                if progress == Progress::Done {
                    let response = decoder.finish(&mut out).map_err(Failure::fatal)?;
                    out.drain(..).for_each(deltas);
                    return Ok(response);
                }
            }
            if chunk.is_none() {
                return Err(after_first(
                    emitted,
                    Failure::retry(EngineError::Provider(
                        "the answer's stream ended before the answer did".into(),
                    )),
                ));
            }
        }
    }

    /// Up to [`MAX_REFUSAL_BYTES`] of a refusal's body; what cannot be
    /// read in time is left unread.
    async fn refusal_body(&self, mut body: Incoming) -> Vec<u8> {
        let mut kept = Vec::new();
        while kept.len() < MAX_REFUSAL_BYTES {
            match tokio::time::timeout(self.settings.idle_timeout, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let room = MAX_REFUSAL_BYTES - kept.len();
                        kept.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                _ => break,
            }
        }
        kept
    }

    /// Classifies a refusal by status and the provider's error type, never
    /// by its message, which goes to the log only (key redacted; never for
    /// a credentials refusal, whose message may quote part of the key).
    fn refusal(&self, status: StatusCode, body: &[u8]) -> Failure {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let kind = parsed.as_ref().and_then(D::error_kind);
        let code = status.as_u16();
        let what = match &kind {
            Some(kind) => format!("HTTP {code} ({kind})"),
            None => format!("HTTP {code}"),
        };
        if !matches!(code, 401 | 403 | 407)
            && let Some(message) = parsed
                .as_ref()
                .and_then(|v| v.pointer("/error/message"))
                .and_then(Value::as_str)
        {
            let message = match &self.settings.api_key {
                Some(key) => key.redact(message),
                None => message.to_owned(),
            };
            tracing::warn!(target: "spool::engine", provider = D::NAME, status = code, kind = ?kind, %message, "the provider refused the call");
        }
        match code {
            // 407: the proxy in between wants credentials.
            401 | 403 | 407 => Failure::fatal(EngineError::Auth(what)),
            402 => Failure::fatal(EngineError::Budget(what)),
            429 if kind.as_deref().is_some_and(D::is_quota) => {
                Failure::fatal(EngineError::Budget(what))
            }
            429 => Failure::retry(EngineError::Budget(what)),
            408 | 500..=599 => Failure::retry(EngineError::Provider(what)),
            _ => Failure::fatal(EngineError::Provider(what)),
        }
    }

    /// Summarizes `messages` with one unstreamed call: what compaction
    /// keeps of a conversation.
    pub(crate) async fn summarize(&self, messages: &[Message]) -> Result<String, EngineError> {
        let request = summary_request(messages);
        let context = CallContext {
            run: spool_journal::RunId::new("compaction").expect("a plain word is a valid run id"),
            ordinal: 0,
        };
        let response = self
            .call(&context, &request, &|_| {}, &CancellationToken::new())
            .await?;
        Ok(response.text)
    }
}

/// The request that asks a model to summarize a conversation.
fn summary_request(messages: &[Message]) -> ModelRequest {
    let mut transcript = String::new();
    for message in messages {
        let (role, text) = match message {
            Message::System { content } => ("system", content.as_str()),
            Message::User { content } => ("user", content.as_str()),
            Message::Assistant { content, .. } => ("assistant", content.as_str()),
            Message::Tool { content, .. } => ("tool", content.as_str()),
        };
        transcript.push_str(role);
        transcript.push_str(": ");
        transcript.push_str(text);
        transcript.push('\n');
    }
    ModelRequest::new(
        vec![
            Message::System {
                content: "Summarize the conversation you are given so it can continue from the summary alone: keep every fact, decision, open question and commitment; drop pleasantries.".into(),
            },
            Message::User { content: transcript },
        ],
        Vec::new(),
    )
}
