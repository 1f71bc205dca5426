//! The run routes' handlers: listing, starting, messaging, answering at a
//! turn's boundary, addresses, the actions on a run, and its stream.

use super::*;

impl HttpChannel {
    /// `GET /runs?limit=N&after=NEXT`: a page of runs, most recently
    /// updated first. `next` names where the following page starts; it is
    /// a position in the order (updated time, then id), so a walk neither
    /// repeats nor skips a run that stays unchanged during it, and a run
    /// updated meanwhile moves to the front.
    pub(super) async fn list(
        &self,
        query: Option<&str>,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let page = match Page::parse(query) {
            Ok(page) => page,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let mut all = self.runtime.list().await?;
        // The journals list in this order already; sorting again keeps
        // paging right over a journal an embedder wrote.
        all.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.run_id.cmp(&b.run_id))
        });
        let mut runs = all.into_iter().filter(|run| {
            page.after.as_ref().is_none_or(|(updated, id)| {
                let at = run.updated_at.unix_timestamp_nanos();
                at < *updated || (at == *updated && run.run_id.as_str() > id.as_str())
            })
        });
        // Under owner access a page holds the caller's runs only, found by
        // reading each listed run's creator.
        let mut listed = Vec::with_capacity(page.limit);
        let mut more = None;
        for run in runs.by_ref() {
            if !self.reaches(caller, &run.run_id).await? {
                continue;
            }
            if listed.len() == page.limit {
                more = Some(run);
                break;
            }
            listed.push(run);
        }
        let next = match (more, listed.last()) {
            (Some(_), Some(last)) => Some(format!(
                "{}.{}",
                last.updated_at.unix_timestamp_nanos(),
                last.run_id
            )),
            _ => None,
        };
        let runs: Vec<Value> = listed
            .into_iter()
            .map(|run| {
                json!({
                    "id": run.run_id,
                    "state": wire::RunState::from(run.status.state()),
                    "title": run.title,
                    "updated": run.updated_at.format(&time::format_description::well_known::Rfc3339).ok(),
                })
            })
            .collect();
        let mut reply = json!({ "runs": runs });
        if let Some(next) = next {
            reply["next"] = Value::String(next);
        }
        Ok(body::json(StatusCode::OK, &reply))
    }

    pub(super) async fn start(
        &self,
        text: &str,
        caller: Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let start = match StartRun::decode(text) {
            Ok(start) => start,
            Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
        };
        // A message through an address bound to another's run is refused
        // as for an unknown run: the caller learns nothing of the run
        // behind it (addresses are one namespace, so it cannot take the
        // address either).
        if self.access == RunAccess::Owner
            && let Some(address) = &start.address
        {
            let address = Address::new(NAMESPACE, address.clone());
            match self.runtime.lookup(&address).await {
                Ok(view) if !self.reaches(&caller, &view.run_id).await? => {
                    return Err(RuntimeError::AddressNotFound(address));
                }
                Err(error) if error.kind() != ErrorKind::AddressNotFound => return Err(error),
                _ => {}
            }
        }
        // With an authenticator, identity is what it proved; without one a
        // body principal is self-asserted, and never enough for an
        // operation id.
        let (principal, verified) = if caller.verified {
            let verified = caller.principal.is_some();
            (caller.principal, verified)
        } else {
            (start.auth.clone().map(principal_of), false)
        };
        if start.operation_id.is_some() && !verified {
            return Ok(body::error(
                ErrorCode::BadRequest,
                "`operation_id` needs a verified principal",
            ));
        }
        let request = StartRequest {
            text: start.text.clone(),
            address: start
                .address
                .as_ref()
                .map(|a| Address::new(NAMESPACE, a.clone())),
            operation_id: start.operation_id.clone(),
            principal,
            title: start.title.clone(),
            kind: start.kind.clone(),
            context: start.context.clone().unwrap_or_default(),
            policy: turn_policy(start.turn_policy.as_ref())?,
        };
        let accepted = self.runtime.start(request).await?;
        self.answer(accepted).await
    }

    pub(super) async fn message(
        &self,
        run: &RunId,
        text: &str,
        _caller: Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let message = match MessageRun::decode(text) {
            Ok(message) => message,
            Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
        };
        let request = MessageRequest {
            text: message.text,
            context: message.context.unwrap_or_default(),
            policy: turn_policy(message.turn_policy.as_ref())?,
        };
        let accepted = self.runtime.send(run, request).await?;
        self.answer(accepted).await
    }

    /// Replies once the turn reaches a boundary; the turn itself runs
    /// detached, so a client that leaves does not stop it.
    ///
    /// A turn whose input was recorded but whose progress cannot be (the
    /// journal stopped writing) is answered 202 with the run as it is,
    /// `running`: the request was taken and must not be sent again; the
    /// turn goes on by itself once the journal writes.
    pub(super) async fn answer(&self, accepted: Accepted) -> Result<Response<Body>, RuntimeError> {
        let mut reply = self.answer_at_boundary(&accepted).await?;
        // The seed: a retry's changed text does not change the admitted
        // operation (the runtime logs one that differs); every replay is
        // marked.
        if matches!(accepted, Accepted::Replayed { .. }) {
            reply
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        Ok(reply)
    }

    pub(super) async fn answer_at_boundary(
        &self,
        accepted: &Accepted,
    ) -> Result<Response<Body>, RuntimeError> {
        match self.runtime.settle(accepted).await {
            Ok(view) => Ok(body::json(StatusCode::OK, &reply(&view))),
            Err(error) if error.kind() == ErrorKind::Storage => {
                let run = accepted.run();
                tracing::warn!(target: "spool::http", run_id = %run, %error, "a turn was taken and waits for the journal");
                let view = self.runtime.get(run).await?;
                Ok(body::json(StatusCode::ACCEPTED, &reply(&view)))
            }
            Err(error) => Err(error),
        }
    }

    pub(super) async fn address(
        &self,
        raw: &str,
        ensure: bool,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let name = match segment(raw, "address") {
            Ok(name) => name,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        if name.is_empty() {
            return Ok(body::error(ErrorCode::BadRequest, "the address is empty"));
        }
        spool_runtime::Limited::Address.check(&name)?;
        let address = Address::new(NAMESPACE, name);
        let view = if ensure {
            // A run made here belongs to the caller, when it was proven.
            let creator = caller.proven().cloned();
            self.runtime.ensure_as(&address, creator).await?
        } else {
            self.runtime.lookup(&address).await?
        };
        if !self.reaches(caller, &view.run_id).await? {
            return Err(RuntimeError::AddressNotFound(address));
        }
        Ok(body::json(
            StatusCode::OK,
            &AddressReply {
                run_id: view.run_id.to_string(),
                cursor: view.cursor.map(|s| s.0),
            },
        ))
    }

    pub(super) async fn action(
        &self,
        run: &RunId,
        action: &str,
        text: &str,
        query: Option<&str>,
        tap: Option<Arc<spool_edge::tap::Tap>>,
        session: &crate::session::Session,
    ) -> Result<Response<Body>, RuntimeError> {
        match action {
            "snapshot" => {
                let snapshot = self.runtime.snapshot(run).await?;
                let mut reply = body::json(
                    StatusCode::OK,
                    &SnapshotReply {
                        run: reply(&snapshot.view),
                        messages: snapshot.messages,
                    },
                );
                reply
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                Ok(reply)
            }
            "stream" => self.stream(run, query, tap, session).await,
            "respond" => {
                let respond = match Respond::decode(text) {
                    Ok(respond) => respond,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                // Every answer that names a turn must name the same one: a
                // respond is one reply to one suspension.
                let mut named = respond
                    .responses
                    .iter()
                    .filter_map(|a| a.turn_id.as_deref());
                let turn = match named.next() {
                    Some(first) => {
                        if let Some(other) = named.find(|t| *t != first) {
                            return Ok(body::error(
                                ErrorCode::BadRequest,
                                format!(
                                    "the answers name different turns, `{first}` and `{other}`: answer one turn at a time"
                                ),
                            ));
                        }
                        match spool_journal::TurnId::new(first) {
                            Ok(turn) => Some(turn),
                            Err(e) => {
                                return Ok(body::error(
                                    ErrorCode::BadRequest,
                                    format!("`turn_id` is not a turn id: {e}"),
                                ));
                            }
                        }
                    }
                    None => None,
                };
                let answers = respond
                    .responses
                    .into_iter()
                    .map(|a| Answer {
                        text: a.text,
                        approved: a.approved,
                    })
                    .collect();
                self.runtime.respond(run, turn.as_ref(), answers).await?;
                let view = self.runtime.get(run).await?;
                let turn = view.turn_id.clone();
                let view = match turn {
                    Some(turn) => self.runtime.wait_for(run, &turn).await?,
                    None => view,
                };
                Ok(body::json(StatusCode::OK, &reply(&view)))
            }
            "cancel" => {
                let cancel: wire::Cancel = match wire::decode_body(text) {
                    Ok(cancel) => cancel,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                // A turn id that cannot be one is a mistake to report, not
                // a reason to cancel whatever turn runs now.
                let turn = match cancel.turn_id.map(spool_journal::TurnId::new).transpose() {
                    Ok(turn) => turn,
                    Err(e) => {
                        return Ok(body::error(
                            ErrorCode::BadRequest,
                            format!("`turn_id` is not a turn id: {e}"),
                        ));
                    }
                };
                let outcome = match self.runtime.cancel(run, turn.as_ref()).await {
                    Ok(outcome) => outcome,
                    // Cancel on an unknown run is a harmless no-op.
                    Err(RuntimeError::RunNotFound(_)) => spool_runtime::CancelOutcome::NotActive,
                    Err(other) => return Err(other),
                };
                let (status, turn_id) = match outcome {
                    spool_runtime::CancelOutcome::Requested(turn) => {
                        (CancelStatus::Requested, Some(turn.to_string()))
                    }
                    spool_runtime::CancelOutcome::NotActive => (CancelStatus::NotActive, None),
                    spool_runtime::CancelOutcome::Stale { current } => {
                        (CancelStatus::Stale, current.map(|t| t.to_string()))
                    }
                };
                Ok(cancel_reply(status, Some(run), turn_id))
            }
            "reset" => {
                let reset: wire::Reset = match wire::decode_body(text) {
                    Ok(reset) => reset,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                self.runtime.reset_in(run, reset.reason, NAMESPACE).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
            "clear" => {
                self.runtime.clear(run).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
            _ => {
                self.runtime.compact(run).await?;
                Ok(body::empty(StatusCode::NO_CONTENT))
            }
        }
    }

    /// `application/x-ndjson`, headers at once, the journal after the
    /// cursor and then live events, open across waiting states.
    pub(super) async fn stream(
        &self,
        run: &RunId,
        query: Option<&str>,
        tap: Option<Arc<spool_edge::tap::Tap>>,
        session: &crate::session::Session,
    ) -> Result<Response<Body>, RuntimeError> {
        let cursor = match cursor(query) {
            Ok(cursor) => cursor,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let subscription = self.runtime.subscribe(run, cursor).await?;
        let body = StreamBody::new(
            Parts {
                run: run.clone(),
                closing: self.closing.clone(),
                shared: Arc::clone(&self.lines),
                fanouts: Arc::clone(&self.fanouts),
                tap: tap.clone(),
                _open: OpenStream::new(&self.streams),
            },
            subscription,
        );
        // A revoked token ends the streams it opened.
        let body = if session.revocable() {
            body.ending(session.ending())
        } else {
            body
        };
        if let Some(tap) = &tap {
            // The response's head goes first: nothing is written to the
            // socket past hyper until it has flushed it.
            tap.busy();
        }
        let mut response = Response::new(http_body_util::BodyExt::boxed(body));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(wire::NDJSON_CONTENT_TYPE),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(response)
    }
}
