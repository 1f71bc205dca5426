//! The channel's routing: a request that passed the guard, authenticated,
//! matched to its route and answered; a schedule's firing relayed by
//! another node; readiness.

use super::*;

impl HttpChannel {
    /// Answers one request that passed the guard.
    pub(super) async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        // Liveness and readiness are public, as a load balancer asks them.
        // Every other path, known or not, meets the authenticator first:
        // without valid credentials a caller learns nothing, not even
        // which routes exist.
        match path.strip_prefix(wire::BASE_PATH) {
            Some("/health") if method == Method::GET => {
                return body::json(StatusCode::OK, &wire::Health::ready());
            }
            Some("/ready") if method == Method::GET => return self.ready(),
            Some("/health" | "/ready") => {
                return method_not_allowed(&method, &path, &[Method::GET]);
            }
            _ => {}
        }
        if self.console && crate::console::paths().any(|asset| asset == path) {
            return crate::console::reply(&method, &path);
        }
        if let Some((_, handler)) = self.public.iter().find(|(public, _)| *public == path) {
            return handler(request).await;
        }
        // A firing handed over by another node proves itself with the
        // cluster's secret, not a client's credentials; to anyone else
        // the route does not exist.
        if method == Method::POST
            && let (Some(secret), Some(name)) = (
                self.node_secret.as_deref(),
                crate::forward::relayed_delivery(&path),
            )
            && crate::forward::shows_secret(request.headers(), secret)
        {
            let name = name.to_owned();
            return self.deliver_relayed(&name, request).await;
        }
        let caller = match self.authenticate(&request).await {
            Ok(caller) => caller,
            Err(reply) => return *reply,
        };
        let Some(rest) = path.strip_prefix(wire::BASE_PATH) else {
            let mounted = self
                .mounted
                .iter()
                .filter(|(prefix, _)| path == *prefix || path.starts_with(&format!("{prefix}/")))
                .max_by_key(|(prefix, _)| prefix.len());
            if let Some((_, handler)) = mounted {
                let mut request = request;
                let principal = caller.proven().cloned();
                request.extensions_mut().insert(Authenticated(principal));
                request.extensions_mut().insert(caller.session);
                return handler(request).await;
            }
            return body::error(ErrorCode::RunNotFound, format!("no route {path}"));
        };
        let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let route: (&[Method], Route) = match segments.as_slice() {
            ["info"] => (&[Method::GET], Route::Info),
            ["runs"] => (&[Method::GET, Method::POST], Route::Runs),
            ["addresses", address] => (
                &[Method::GET, Method::POST],
                Route::Address((*address).to_owned()),
            ),
            // `/runs/` names no run: no such route, not a malformed id.
            ["runs", ""] => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
            ["runs", id] => (
                &[Method::GET, Method::POST, Method::DELETE],
                Route::Run((*id).to_owned()),
            ),
            ["runs", id, action] => {
                let allowed: &[Method] = match *action {
                    "snapshot" | "stream" | "events" | "summary" => &[Method::GET],
                    "respond" | "cancel" | "reset" | "clear" | "compact" | "fork" => {
                        &[Method::POST]
                    }
                    _ => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
                };
                (
                    allowed,
                    Route::RunAction((*id).to_owned(), (*action).to_owned()),
                )
            }
            ["schedules"] => (&[Method::GET], Route::Schedules),
            ["agent", "reload"] if self.reload.is_some() => (&[Method::POST], Route::ReloadAgent),
            ["schedules", name] if !name.is_empty() => {
                (&[Method::GET], Route::Schedule((*name).to_owned()))
            }
            ["schedules", name, "trigger"] if !name.is_empty() => {
                (&[Method::POST], Route::Trigger((*name).to_owned()))
            }
            _ => return body::error(ErrorCode::RunNotFound, format!("no route {path}")),
        };
        let (allowed, route) = route;
        if !allowed.contains(&method) {
            return method_not_allowed(&method, &path, allowed);
        }
        // A run the caller may not reach does not exist for it: answered
        // before its body is read, the same as an unknown run.
        if let Route::Run(id) | Route::RunAction(id, _) = &route {
            let run = match run_id(id) {
                Ok(run) => run,
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            };
            tracing::Span::current().record("run_id", run.as_str());
            let unknown = match self.reaches(&caller, &run).await {
                Ok(reached) => !reached,
                Err(RuntimeError::RunNotFound(_)) => true,
                Err(error) => return runtime_error(&error),
            };
            if unknown {
                // As for any unknown run: cancel is a harmless no-op.
                if matches!(&route, Route::RunAction(_, action) if action == "cancel") {
                    return cancel_reply(CancelStatus::NotActive, None, None);
                }
                return runtime_error(&RuntimeError::RunNotFound(run));
            }
        }
        let query = request.uri().query().map(str::to_owned);
        let (parts, incoming) = request.into_parts();
        // A stream's driver may write a plain HTTP/1.1 GET's chunks to its
        // socket itself (`crate::tap`).
        let tap = parts
            .extensions
            .get::<Arc<spool_edge::tap::Tap>>()
            .filter(|_| parts.version == http::Version::HTTP_11 && method == Method::GET)
            .cloned();
        let bytes = if method == Method::POST {
            match body::read_capped(incoming, wire::MAX_BODY_BYTES, self.body_timeout).await {
                Ok(bytes) => bytes,
                Err(reply) => return *reply,
            }
        } else {
            Bytes::new()
        };
        if (method == Method::POST || method == Method::DELETE)
            && let Some(placement) = &self.placement
            && !crate::forward::forwarded(&parts.headers)
            && let Some(run) = self.commanded_run(&route, &bytes).await
            && let Some(address) = crate::forward::holder(placement.as_ref(), &run).await
        {
            return crate::forward::forward(placement.as_ref(), &run, &address, &parts, bytes)
                .await;
        }
        // Bytes that are not UTF-8 are refused, never replaced: what is
        // recorded is what the client sent.
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            Err(error) => {
                return body::error(
                    ErrorCode::BadRequest,
                    format!(
                        "the body is not UTF-8 (an invalid byte at offset {})",
                        error.valid_up_to()
                    ),
                );
            }
        };
        let respond_async = prefers_async(&parts.headers);
        let result = match (route, method) {
            (Route::Info, _) => Ok(body::json(
                StatusCode::OK,
                &Info {
                    agent: self.agent.clone(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    // This channel, and the host's own mounted beside it.
                    channels: std::iter::once(NAMESPACE.to_owned())
                        .chain(self.mounted.iter().map(|(prefix, _)| prefix.clone()))
                        .collect(),
                },
            )),
            (Route::Schedules, _) => {
                return crate::schedules::list(
                    self.schedules.as_ref(),
                    self.trigger.as_ref(),
                    caller.proven(),
                )
                .await;
            }
            (Route::ReloadAgent, _) => return self.reload_agent(caller.proven()).await,
            (Route::Schedule(name), _) => {
                return crate::schedules::get(self.schedules.as_ref(), &name).await;
            }
            (Route::Trigger(name), _) => {
                return crate::schedules::trigger(
                    self.schedules.as_ref(),
                    self.trigger.as_ref(),
                    caller.proven(),
                    &name,
                    text,
                )
                .await;
            }
            (Route::Runs, Method::GET) => self.list(query.as_deref(), &caller).await,
            (Route::Runs, _) => self.start(text, caller, respond_async).await,
            (Route::Address(address), Method::GET) => self.address(&address, false, &caller).await,
            (Route::Address(address), _) => self.address(&address, true, &caller).await,
            (Route::Run(id), Method::GET) => match run_id(&id) {
                Ok(run) => self
                    .runtime
                    .get(&run)
                    .await
                    .map(|view| body::json(StatusCode::OK, &reply(&view))),
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
            (Route::Run(id), Method::DELETE) => match run_id(&id) {
                Ok(run) => self.delete(&run, query.as_deref(), &caller).await,
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
            (Route::Run(id), _) => match run_id(&id) {
                Ok(run) => self.message(&run, text, caller, respond_async).await,
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
            (Route::RunAction(id, action), _) => match run_id(&id) {
                Ok(run) => {
                    self.action(
                        &run,
                        &action,
                        Asked {
                            text,
                            query: query.as_deref(),
                            tap,
                            session: &caller.session,
                            respond_async,
                            principal: caller.proven(),
                        },
                    )
                    .await
                }
                Err(message) => return body::error(ErrorCode::InvalidRunId, message),
            },
        };
        result.unwrap_or_else(|error| runtime_error(&error))
    }

    /// `POST /schedules/{name}/deliver` from another node: the firing it
    /// recorded, delivered here, where its address's run is driven; the
    /// reply is what became of it.
    pub(super) async fn deliver_relayed(
        &self,
        name: &str,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let Some(scheduler) = &self.schedules else {
            return crate::schedules::not_found(name);
        };
        let bytes =
            match body::read_capped(request.into_body(), wire::MAX_BODY_BYTES, self.body_timeout)
                .await
            {
                Ok(bytes) => bytes,
                Err(reply) => return *reply,
            };
        let firing: spool_journal::event::ScheduleFired = match serde_json::from_slice(&bytes) {
            Ok(firing) => firing,
            Err(error) => {
                return body::error(
                    ErrorCode::BadRequest,
                    format!("not a schedule's firing: {error}"),
                );
            }
        };
        match scheduler.deliver_relayed(name, &firing).await {
            Ok(delivery) => body::json(StatusCode::OK, &delivery),
            // A schedule without an address here: the nodes' spool.toml
            // differ, which the sender is told.
            Err(spool_runtime::schedule::ScheduleError::Invalid(message)) => {
                body::error(ErrorCode::BadRequest, message)
            }
            Err(other) => crate::schedules::schedule_error(&other),
        }
    }

    /// The run a command (a `POST`) changes, which its driving node must
    /// answer: a message or an action to a run, a message through an
    /// address already bound, a schedule's trigger (its record run).
    /// Starting a run or binding an address is done here.
    pub(super) async fn commanded_run(&self, route: &Route, body: &[u8]) -> Option<RunId> {
        match route {
            Route::Run(id) | Route::RunAction(id, _) => run_id(id).ok(),
            Route::Trigger(name) => self.schedules.as_ref()?.record_run(name),
            // A message through an address goes to the node driving the
            // address's run, as one through the run's id does. A body that
            // does not decode, or an address bound to no run yet, is this
            // node's to answer (with the refusal, or by creating the run).
            Route::Runs => {
                #[derive(serde::Deserialize)]
                struct Addressed {
                    address: Option<String>,
                }
                let address = serde_json::from_slice::<Addressed>(body).ok()?.address?;
                let address = Address::new(NAMESPACE, address);
                match self.runtime.find_address(&address).await {
                    Ok(run) => run,
                    Err(error) => {
                        tracing::warn!(target: "spool::http", %error, "could not read which run an address is bound to; answering here");
                        None
                    }
                }
            }
            _ => None,
        }
    }

    /// Whether `caller` may reach `run` under the channel's [`RunAccess`].
    pub(super) async fn reaches(&self, caller: &Caller, run: &RunId) -> Result<bool, RuntimeError> {
        self.access
            .reaches(&self.runtime, caller.proven(), run)
            .await
    }

    /// `GET /ready`: 503 `journal_unavailable` while the journal cannot
    /// write, with a `Retry-After`.
    pub(super) fn ready(&self) -> Response<Body> {
        match self.runtime.journal_health() {
            spool_runtime::JournalHealth::Writable => body::json(
                StatusCode::OK,
                &wire::Readiness {
                    ok: true,
                    status: "ready".into(),
                    stalled_runs: None,
                },
            ),
            spool_runtime::JournalHealth::Unavailable { stalled_runs, .. } => {
                let mut reply = body::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &wire::Readiness {
                        ok: false,
                        status: ErrorCode::JournalUnavailable.as_str().into(),
                        stalled_runs: Some(stalled_runs as u64),
                    },
                );
                reply.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(JOURNAL_RETRY_AFTER_SECONDS),
                );
                reply
            }
        }
    }

    pub(super) async fn authenticate(
        &self,
        request: &Request<Incoming>,
    ) -> Result<Caller, Box<Response<Body>>> {
        let Some(authenticator) = &self.authenticator else {
            return Ok(Caller {
                principal: None,
                verified: false,
                session: crate::session::Session::new(
                    None,
                    Credentials::default(),
                    self.closing.clone(),
                ),
            });
        };
        let credentials = credentials(request.headers());
        match authenticator.authenticate(&credentials).await {
            Ok(principal) => Ok(Caller {
                principal,
                verified: true,
                session: crate::session::Session::new(
                    Some(Arc::clone(authenticator)),
                    credentials,
                    self.closing.clone(),
                ),
            }),
            Err(spool_runtime::AuthError::Unauthenticated) => {
                let mut reply =
                    body::error(ErrorCode::Unauthenticated, "valid credentials are required");
                reply
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                Err(Box::new(reply))
            }
            // Internal details go to the log, not the reply.
            Err(failed) => {
                tracing::error!(target: "spool::http", error = %failed, "the authenticator failed");
                Err(Box::new(body::error(ErrorCode::Internal, "internal error")))
            }
        }
    }
}

impl HttpChannel {
    /// `POST /agent/reload`: an administrator's, as it changes what every
    /// new run runs on.
    async fn reload_agent(&self, caller: Option<&spool_journal::Principal>) -> Response<Body> {
        let Some(reload) = &self.reload else {
            return body::error(ErrorCode::RunNotFound, "no route /agent/reload");
        };
        if !caller.is_some_and(spool_runtime::access::is_admin) {
            return body::error(
                ErrorCode::Forbidden,
                "reloading the agent definition takes an administrator's token (`spool token new NAME --admin`); a server without tokens reloads on SIGHUP",
            );
        }
        match reload().await {
            Ok(reloaded) => body::json(StatusCode::OK, &reloaded),
            Err(error) => body::error(ErrorCode::AgentInvalid, error),
        }
    }
}
