//! The run routes' handlers: listing, starting, messaging, answering at a
//! turn's boundary, addresses, the actions on a run, and its stream.

use super::*;

impl HttpChannel {
    /// `GET /runs?limit=N&after=NEXT`: a page of runs, most recently
    /// updated first (`order=oldest`: updated longest ago first), kept by
    /// `state`, `kind` and `q` (see [`Filter`]), with how many match in
    /// all. `next` names where the following page starts; it is a
    /// position in the order (updated time, then id), so a walk neither
    /// repeats nor skips a run that stays unchanged during it, and a run
    /// updated meanwhile moves to the front.
    pub(super) async fn list(
        &self,
        query: Option<&str>,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let (page, filter) = match Page::parse(query).and_then(|p| Ok((p, Filter::parse(query)?))) {
            Ok(parsed) => parsed,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let mut all = self.runtime.list().await?;
        // A search matches a run whose title, id or one of whose
        // addresses (`namespace:name`) contains it, ignoring case.
        let addressed: std::collections::HashSet<RunId> = match &filter.search {
            Some(q) => self
                .runtime
                .addresses()
                .await?
                .into_iter()
                .filter(|(address, _)| {
                    format!("{}:{}", address.namespace, address.name)
                        .to_lowercase()
                        .contains(q.as_str())
                })
                .map(|(_, run)| run)
                .collect(),
            None => std::collections::HashSet::new(),
        };
        all.retain(|run| {
            filter.admits(&run.status)
                && filter.search.as_ref().is_none_or(|q| {
                    addressed.contains(&run.run_id)
                        || run.run_id.as_str().to_lowercase().contains(q.as_str())
                        || run
                            .title
                            .as_ref()
                            .is_some_and(|title| title.to_lowercase().contains(q.as_str()))
                })
        });
        // The journals list newest first already; sorting again keeps
        // paging right over a journal an embedder wrote, and gives the
        // oldest-first order.
        let oldest_first = filter.oldest_first;
        all.sort_by(|a, b| {
            let by_time = if oldest_first {
                a.updated_at.cmp(&b.updated_at)
            } else {
                b.updated_at.cmp(&a.updated_at)
            };
            by_time.then_with(|| a.run_id.cmp(&b.run_id))
        });
        let after = |run: &spool_journal::store::RunSummary| {
            page.after.as_ref().is_none_or(|(updated, id)| {
                let at = run.updated_at.unix_timestamp_nanos();
                let later = if oldest_first {
                    at > *updated
                } else {
                    at < *updated
                };
                later || (at == *updated && run.run_id.as_str() > id.as_str())
            })
        };
        // Under owner access the count and the page hold the caller's
        // runs only, found by reading each run's creator (an
        // administrator reaches every run, so nothing is read for one).
        let checked = self.access == RunAccess::Owner
            && !caller.proven().is_some_and(spool_runtime::access::is_admin);
        let mut total = 0u64;
        let mut listed = Vec::with_capacity(page.limit);
        let mut more = false;
        for run in all {
            if checked && !self.reaches(caller, &run.run_id).await? {
                continue;
            }
            total += 1;
            if !after(&run) {
                continue;
            }
            if listed.len() == page.limit {
                more = true;
            } else {
                listed.push(run);
            }
        }
        let next = match (more, listed.last()) {
            (true, Some(last)) => Some(format!(
                "{}.{}",
                last.updated_at.unix_timestamp_nanos(),
                last.run_id
            )),
            _ => None,
        };
        let mut runs = Vec::with_capacity(listed.len());
        for run in listed {
            // A run deleted since the listing was read is left out.
            match self.row(run).await {
                Ok(row) => runs.push(row),
                Err(RuntimeError::RunDeleted(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(body::json(
            StatusCode::OK,
            &wire::RunList { runs, next, total },
        ))
    }

    /// A listed run's row: its journal row with what its state adds. A
    /// run the runtime keeps to itself (a schedule's record) shows its
    /// journal row alone.
    async fn row(
        &self,
        run: spool_journal::store::RunSummary,
    ) -> Result<wire::RunRow, RuntimeError> {
        match self.runtime.detail(&run.run_id).await {
            Ok(detail) => Ok(row_of(detail)),
            Err(RuntimeError::RunNotFound(_)) => Ok(wire::RunRow {
                id: run.run_id.to_string(),
                state: run.status.state().into(),
                title: run.title.clone(),
                updated: rfc3339(Some(run.updated_at)),
                created: rfc3339(Some(run.created_at)),
                address: None,
                turns: 0,
                usage: wire::Usage::default(),
                cost_usd: None,
                failure: None,
                suspend: None,
                call: None,
                cursor: run.next_seq.0.checked_sub(1),
                forked_from: None,
                events: run.next_seq.0,
                bytes: None,
                near_limit: false,
                agent: None,
            }),
            Err(error) => Err(error),
        }
    }

    pub(super) async fn start(
        &self,
        text: &str,
        caller: Caller,
        respond_async: bool,
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
            upgrade: start.upgrade,
        };
        let accepted = self.runtime.start(request).await?;
        self.answer(accepted, respond_async).await
    }

    pub(super) async fn message(
        &self,
        run: &RunId,
        text: &str,
        _caller: Caller,
        respond_async: bool,
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
        self.answer(accepted, respond_async).await
    }

    /// Replies once the turn reaches a boundary; the turn itself runs
    /// detached, so a client that leaves does not stop it. With
    /// `respond_async` (the request said `Prefer: respond-async`, RFC
    /// 7240) it replies 202 at once with the run as it is, for a client
    /// that follows the turn on the run's stream instead.
    ///
    /// A turn whose input was recorded but whose progress cannot be (the
    /// journal stopped writing) is answered 202 with the run as it is,
    /// `running`: the request was taken and must not be sent again; the
    /// turn goes on by itself once the journal writes.
    pub(super) async fn answer(
        &self,
        accepted: Accepted,
        respond_async: bool,
    ) -> Result<Response<Body>, RuntimeError> {
        let mut reply = if respond_async {
            let view = self.runtime.get(accepted.run()).await?;
            let mut reply = body::json(StatusCode::ACCEPTED, &reply(&view));
            reply.headers_mut().insert(
                PREFERENCE_APPLIED,
                HeaderValue::from_static("respond-async"),
            );
            reply
        } else {
            self.answer_at_boundary(&accepted).await?
        };
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

    /// `DELETE /runs/{id}[?force=true]`: the run's events and what is
    /// derived from them go, its tombstone stays; a turn in progress is
    /// refused with `run_active` unless `force` (then cancelled first).
    pub(super) async fn delete(
        &self,
        run: &RunId,
        query: Option<&str>,
        caller: &Caller,
    ) -> Result<Response<Body>, RuntimeError> {
        let force = match query_value(query, "force") {
            Ok(None) => false,
            Ok(Some(value)) if value == "true" => true,
            Ok(Some(value)) if value == "false" => false,
            Ok(Some(value)) => {
                return Ok(body::error(
                    ErrorCode::BadRequest,
                    format!("`force` is `true` or `false`, not `{value}`"),
                ));
            }
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let tombstone = self
            .runtime
            .delete(
                run,
                spool_runtime::DeleteRequest {
                    by: spool_edge::tables::deleter(caller.proven()),
                    reason: None,
                    force,
                    expected: None,
                },
            )
            .await?;
        Ok(body::json(
            StatusCode::OK,
            &spool_edge::tables::deleted(&tombstone),
        ))
    }

    pub(super) async fn action(
        &self,
        run: &RunId,
        action: &str,
        asked: Asked<'_>,
    ) -> Result<Response<Body>, RuntimeError> {
        let Asked {
            text,
            query,
            tap,
            session,
            respond_async,
            principal,
        } = asked;
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
            "events" => self.events(run, query).await,
            "fork" => {
                let fork: wire::Fork = match wire::decode_body(text) {
                    Ok(fork) => fork,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                let (turn, after) = match fork.cut() {
                    Ok(cut) => cut,
                    Err(rejection) => return Ok(body::error(rejection.code, rejection.message)),
                };
                let turn = match spool_journal::TurnId::new(turn) {
                    Ok(turn) => turn,
                    Err(e) => {
                        return Ok(body::error(
                            ErrorCode::BadRequest,
                            format!("the turn is not a turn id: {e}"),
                        ));
                    }
                };
                let view = self
                    .runtime
                    .fork(
                        run,
                        spool_runtime::ForkRequest {
                            turn,
                            cut: if after {
                                spool_journal::event::ForkCut::After
                            } else {
                                spool_journal::event::ForkCut::Before
                            },
                            title: fork.title,
                            principal: principal.cloned(),
                        },
                    )
                    .await?;
                Ok(body::json(StatusCode::CREATED, &reply(&view)))
            }
            "summary" => {
                let detail = self.runtime.detail(run).await?;
                Ok(body::json(StatusCode::OK, &row_of(detail)))
            }
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
                if respond_async {
                    let mut reply = body::json(StatusCode::ACCEPTED, &reply(&view));
                    reply.headers_mut().insert(
                        PREFERENCE_APPLIED,
                        HeaderValue::from_static("respond-async"),
                    );
                    return Ok(reply);
                }
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

    /// `GET /runs/{id}/events?after=SEQ&limit=N`: the run's journal,
    /// oldest first, each event with its time, the turn it belongs to,
    /// and for a model or tool call's completion how long the call took
    /// (and a model call's tokens and cost). The whole log is read to
    /// time the calls whose requests lie on earlier pages.
    async fn events(
        &self,
        run: &RunId,
        query: Option<&str>,
    ) -> Result<Response<Body>, RuntimeError> {
        const DEFAULT: usize = 200;
        const MAX: usize = 1000;
        let parsed =
            position(query, "after").and_then(|after| Ok((after, limit(query, DEFAULT, MAX)?)));
        let (after, limit) = match parsed {
            Ok(parsed) => parsed,
            Err(message) => return Ok(body::error(ErrorCode::BadRequest, message)),
        };
        let (page, more) = self.runtime.journal(run, after, limit).await?;
        let next = page.last().filter(|_| more).map(|last| last.envelope.seq.0);
        let events = page.into_iter().map(crate::journal::entry).collect();
        let mut reply = body::json(StatusCode::OK, &wire::JournalPage { events, next });
        reply
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(reply)
    }
}

/// A run's row, as `GET /runs` lists it and `GET /runs/{id}/summary`
/// gives it.
fn row_of(detail: spool_runtime::RunDetail) -> wire::RunRow {
    let reply = reply(&detail.view);
    let address = detail
        .addresses
        .iter()
        .find(|address| address.namespace == NAMESPACE)
        .map(|address| address.name.clone())
        .or_else(|| {
            detail
                .addresses
                .first()
                .map(|address| format!("{}:{}", address.namespace, address.name))
        });
    wire::RunRow {
        id: reply.run_id,
        state: reply.state,
        title: detail.view.title.clone(),
        updated: rfc3339(detail.updated_at),
        created: rfc3339(detail.created_at),
        address,
        turns: detail.turns,
        usage: wire::Usage {
            input_tokens: detail.usage.input_tokens,
            output_tokens: detail.usage.output_tokens,
        },
        cost_usd: detail.cost_micro_usd.map(crate::journal::usd),
        failure: detail.failure.map(|failed| wire::Failure {
            code: failed.code.to_string(),
            message: failed.message,
        }),
        suspend: reply.suspend,
        call: detail.suspended_call.map(|call| wire::ParkedCall {
            id: call.call_id,
            name: call.tool,
            arguments: call.input,
        }),
        cursor: reply.cursor,
        forked_from: detail.forked_from.map(|link| wire::ForkedFrom {
            run_id: link.run.to_string(),
            turn_id: link.turn_id.to_string(),
            cut: match link.cut {
                spool_journal::event::ForkCut::After => "after".into(),
                spool_journal::event::ForkCut::Before => "before".into(),
            },
        }),
        events: detail.events,
        bytes: Some(detail.bytes),
        near_limit: detail.near_limit,
        agent: detail.agent,
    }
}

/// A time as RFC 3339.
fn rfc3339(at: Option<time::OffsetDateTime>) -> Option<String> {
    at?.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// What an action on a run reads of its request besides the run.
pub(super) struct Asked<'a> {
    /// The body, as UTF-8.
    pub(super) text: &'a str,
    pub(super) query: Option<&'a str>,
    /// The connection's socket, for a stream that writes it itself.
    pub(super) tap: Option<Arc<spool_edge::tap::Tap>>,
    pub(super) session: &'a crate::session::Session,
    /// The request said `Prefer: respond-async`.
    pub(super) respond_async: bool,
    /// Who the authenticator proved the caller is.
    pub(super) principal: Option<&'a Principal>,
}
