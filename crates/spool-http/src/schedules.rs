//! The schedule routes: `GET /schedules`, `GET /schedules/{name}` and,
//! only with a trigger authorizer, `POST /schedules/{name}/trigger`.

use std::sync::Arc;

use http::{HeaderValue, Response, StatusCode};
use spool_journal::Principal;
use spool_journal::event::Delivery;
use spool_runtime::schedule::{Firing, ScheduleError, ScheduleView, Scheduler, Trigger, Triggered};
use spool_wire::http::{
    self as wire, ErrorCode, FiringReply, ScheduleList, ScheduleReply, TriggerKind, TriggerRequest,
};

use crate::body::{self, Body};

/// Decides whether a caller may trigger schedules: the seed's separate
/// trigger authorizer, beside the channel's authenticator. It gets the
/// principal the authenticator proved (`None` without one).
pub type TriggerAuthorizer = Arc<dyn Fn(Option<&Principal>) -> bool + Send + Sync>;

/// `GET /schedules`, with whether `principal` may trigger them.
pub(crate) async fn list(
    scheduler: Option<&Scheduler>,
    authorizer: Option<&TriggerAuthorizer>,
    principal: Option<&Principal>,
) -> Response<Body> {
    let schedules = match scheduler {
        Some(scheduler) => scheduler.list().await.iter().map(reply).collect(),
        None => Vec::new(),
    };
    let can_trigger = authorizer.is_some_and(|authorizer| authorizer(principal));
    body::json(
        StatusCode::OK,
        &ScheduleList {
            schedules,
            can_trigger,
        },
    )
}

/// `GET /schedules/{name}`.
pub(crate) async fn get(scheduler: Option<&Scheduler>, name: &str) -> Response<Body> {
    let Some(scheduler) = scheduler else {
        return not_found(name);
    };
    match scheduler.get(name).await {
        Ok(view) => body::json(StatusCode::OK, &reply(&view)),
        Err(error) => schedule_error(&error),
    }
}

/// `POST /schedules/{name}/trigger`: 202 with the firing, or 200 with the
/// earlier firing (marked replayed) for an external id seen before.
pub(crate) async fn trigger(
    scheduler: Option<&Scheduler>,
    authorizer: Option<&TriggerAuthorizer>,
    principal: Option<&Principal>,
    name: &str,
    text: &str,
) -> Response<Body> {
    let Some(authorizer) = authorizer else {
        return body::error(
            ErrorCode::RunNotFound,
            "schedule triggers are not enabled on this server (they need a trigger authorizer: `spool serve` takes tokens marked `trigger` in its token file)",
        );
    };
    if !authorizer(principal) {
        return body::error(
            ErrorCode::Forbidden,
            "this caller may not trigger schedules",
        );
    }
    let Some(scheduler) = scheduler else {
        return not_found(name);
    };
    let request: TriggerRequest = match wire::decode_body(text) {
        Ok(request) => request,
        Err(rejection) => return body::error(rejection.code, rejection.message),
    };
    let trigger = match request.check() {
        Ok(TriggerKind::Manual) => Trigger::Manual,
        Ok(TriggerKind::External { id, scheduled_at }) => Trigger::External { id, scheduled_at },
        Err(rejection) => return body::error(rejection.code, rejection.message),
    };
    match scheduler.trigger(name, trigger).await {
        Ok(Triggered { firing, replayed }) => {
            let status = if replayed {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            let mut reply = body::json(status, &firing_reply(&firing));
            if replayed {
                reply.headers_mut().insert(
                    crate::channel::IDEMPOTENT_REPLAYED,
                    HeaderValue::from_static("true"),
                );
            }
            reply
        }
        Err(error) => schedule_error(&error),
    }
}

pub(crate) fn not_found(name: &str) -> Response<Body> {
    body::error(
        ErrorCode::ScheduleNotFound,
        format!("no schedule named `{name}`"),
    )
}

pub(crate) fn schedule_error(error: &ScheduleError) -> Response<Body> {
    match error {
        ScheduleError::NotFound(name) => not_found(name),
        ScheduleError::Runtime(error) => crate::channel::runtime_error(error),
        // A definition is checked before the server starts: not a
        // request's fault, and its detail is for the log.
        other => {
            tracing::error!(target: "spool::http", error = %other, "schedule error");
            body::error(ErrorCode::Internal, "internal error")
        }
    }
}

fn reply(view: &ScheduleView) -> ScheduleReply {
    let definition = &view.definition;
    ScheduleReply {
        name: definition.name.clone(),
        cron: definition.cron.clone(),
        time_zone: definition.time_zone.clone(),
        text: definition.text.clone(),
        address: definition.address.clone(),
        context: definition.context.clone(),
        overlap: definition.overlap.as_str().into(),
        catch_up: definition.catch_up.as_str().into(),
        next_fire_at: view.next_fire_at,
        history: view.history.iter().map(firing_reply).collect(),
    }
}

fn firing_reply(firing: &Firing) -> FiringReply {
    let (status, run_id, turn_id, reason) = match &firing.delivery {
        None => ("in_doubt", None, None, None),
        Some(Delivery::Started { run_id, turn_id }) => (
            "started",
            Some(run_id.to_string()),
            turn_id.as_ref().map(ToString::to_string),
            None,
        ),
        Some(Delivery::Queued { run_id }) => ("queued", Some(run_id.to_string()), None, None),
        Some(Delivery::Skipped { reason }) => ("skipped", None, None, Some(reason.clone())),
        Some(Delivery::Failed { error }) => ("failed", None, None, Some(error.clone())),
    };
    FiringReply {
        fire_id: firing.fire_id.clone(),
        kind: firing.kind.as_str().into(),
        scheduled_at: firing.scheduled_at,
        fired_at: firing.fired_at,
        status: status.into(),
        run_id,
        turn_id,
        reason,
    }
}
