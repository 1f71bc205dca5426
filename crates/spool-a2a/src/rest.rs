//! The HTTP+JSON binding under `/a2a/`: `POST message:send`, `POST
//! message:stream` (SSE), `GET tasks`, `GET tasks/{id}`, `POST
//! tasks/{id}:cancel`, `tasks/{id}:subscribe` (SSE; POST as the
//! specification's prose says, GET as its proto does), the push config
//! routes, and `GET extendedAgentCard`. Errors are `google.rpc.Status`
//! bodies with an `ErrorInfo` detail, under the mapped status.

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde_json::Value;
use spool_edge::body::{self, Body};
use spool_journal::Principal;
use spool_wire::a2a::{
    self, Error, ErrorKind, ListTasksRequest, SendMessageRequest, SendMessageResponse, TaskRequest,
    TaskState,
};

use crate::rpc::to_value;
use crate::server::A2aServer;
use crate::{MAX_BODY, PREFIX, Version, stream};

fn reply(outcome: Result<Value, Error>) -> Response<Body> {
    let (status, value) = match outcome {
        Ok(value) => (StatusCode::OK, value),
        Err(error) => (
            StatusCode::from_u16(error.kind.status()).unwrap_or(StatusCode::BAD_REQUEST),
            error.http(),
        ),
    };
    let bytes = serde_json::to_vec(&value).expect("A2A replies are plain JSON");
    let mut response = Response::new(Full::new(bytes::Bytes::from(bytes)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a2a::MEDIA_TYPE),
    );
    response
}

async fn read<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, Box<Response<Body>>> {
    let bytes = body::read_capped(request.into_body(), MAX_BODY, body::BODY_READ_TIMEOUT).await?;
    let value: Value = if bytes.is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            Box::new(reply(Err(Error::new(
                ErrorKind::Parse,
                format!("the body is not JSON: {e}"),
            ))))
        })?
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        Box::new(reply(Err(Error::new(
            ErrorKind::InvalidParams,
            format!("invalid body at `{path}`: {}", e.into_inner()),
        )
        .with("field", path))))
    })
}

fn decode(segment: &str) -> Result<String, Error> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            Error::new(
                ErrorKind::InvalidParams,
                "a path segment is not UTF-8 once decoded",
            )
        })
}

/// `GET /tasks`' query: the request's fields in camelCase; unknown names
/// are ignored, as the specification asks of unrecognized fields.
fn list_query(query: Option<&str>) -> Result<ListTasksRequest, Error> {
    let mut request = ListTasksRequest::default();
    for (name, value) in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
    {
        let value = percent_encoding::percent_decode_str(&value.replace('+', " "))
            .decode_utf8()
            .map_err(|_| {
                Error::new(
                    ErrorKind::InvalidParams,
                    format!("`{name}` is not UTF-8 once decoded"),
                )
            })?
            .into_owned();
        let number = |field: &str| {
            value.parse::<i64>().map_err(|_| {
                Error::new(
                    ErrorKind::InvalidParams,
                    format!("`{field}` must be an integer, not `{value}`"),
                )
                .with("field", field)
            })
        };
        match name {
            "contextId" => request.context_id = Some(value.clone()),
            "status" => {
                request.status = Some(TaskState::parse(&value).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidParams,
                        format!(
                            "`status` `{value}` is not a task state: one of {}",
                            TaskState::ALL.map(TaskState::as_str).join(", ")
                        ),
                    )
                    .with("field", "status")
                })?);
            }
            "pageSize" => request.page_size = Some(number("pageSize")?),
            "pageToken" => request.page_token = Some(value.clone()),
            "historyLength" => request.history_length = Some(number("historyLength")?),
            "statusTimestampAfter" => request.status_timestamp_after = Some(value.clone()),
            "includeArtifacts" => {
                request.include_artifacts = Some(match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidParams,
                            format!("`includeArtifacts` is true or false, not `{value}`"),
                        ));
                    }
                });
            }
            _ => {}
        }
    }
    Ok(request)
}

fn history_query(query: Option<&str>) -> Result<Option<i64>, Error> {
    Ok(list_query(query)?.history_length)
}

/// Answers one request under `/a2a/`.
pub(crate) async fn answer(
    server: &A2aServer,
    caller: Option<&Principal>,
    version: Version,
    base: &str,
    request: Request<Incoming>,
) -> Response<Body> {
    // The HTTP+JSON binding is v1.0 only: v0.3's REST routes differ.
    if let Err(error) = version.check(false) {
        return reply(Err(error));
    }
    let path = request.uri().path().to_owned();
    let rest = path
        .strip_prefix(PREFIX)
        .unwrap_or_default()
        .trim_start_matches('/')
        .to_owned();
    let method = request.method().clone();
    let query = request.uri().query().map(str::to_owned);
    let not_found = || {
        reply(Err(Error::new(
            ErrorKind::MethodNotFound,
            format!("no A2A route {method} {path}"),
        )))
    };
    let segments: Vec<&str> = rest.split('/').collect();
    match (segments.as_slice(), &method) {
        (["message:send"], &Method::POST) => {
            let input: SendMessageRequest = match read(request).await {
                Ok(input) => input,
                Err(reply) => return *reply,
            };
            let sent = match server.send(caller, input).await {
                Ok(sent) => sent,
                Err(error) => return reply(Err(error)),
            };
            reply(
                server
                    .answer(caller, sent)
                    .await
                    .map(|task| to_value(&SendMessageResponse::Task(task))),
            )
        }
        (["message:stream"], &Method::POST) => {
            let input: SendMessageRequest = match read(request).await {
                Ok(input) => input,
                Err(reply) => return *reply,
            };
            let opened = match server.send(caller, input).await {
                Ok(sent) => server.open(caller, &sent.task.id()).await,
                Err(error) => Err(error),
            };
            match opened {
                Ok(watch) => stream::sse(server, watch, None),
                Err(error) => reply(Err(error)),
            }
        }
        (["tasks"], &Method::GET) => match list_query(query.as_deref()) {
            Ok(input) => reply(
                server
                    .list(caller, &input)
                    .await
                    .map(|page| to_value(&page)),
            ),
            Err(error) => reply(Err(error)),
        },
        (["extendedAgentCard"], &Method::GET) => reply(
            server
                .extended_card(caller, base)
                .map(|card| to_value(&card)),
        ),
        (["tasks", task], _) => {
            let (id, action) = match task.rsplit_once(':') {
                Some((id, action)) => (id, Some(action)),
                None => (*task, None),
            };
            let id = match decode(id) {
                Ok(id) => id,
                Err(error) => return reply(Err(error)),
            };
            match (action, &method) {
                (None, &Method::GET) => {
                    let history_length = match history_query(query.as_deref()) {
                        Ok(length) => length,
                        Err(error) => return reply(Err(error)),
                    };
                    let input = TaskRequest {
                        id,
                        history_length,
                        tenant: None,
                        metadata: None,
                    };
                    reply(server.get(caller, &input).await.map(|task| to_value(&task)))
                }
                (Some("cancel"), &Method::POST) => {
                    let input = TaskRequest {
                        id,
                        history_length: None,
                        tenant: None,
                        metadata: None,
                    };
                    reply(
                        server
                            .cancel(caller, &input)
                            .await
                            .map(|task| to_value(&task)),
                    )
                }
                (Some("subscribe"), &Method::POST | &Method::GET) => {
                    match stream::subscribe(server, caller, &id).await {
                        Ok(watch) => stream::sse(server, watch, None),
                        Err(error) => reply(Err(error)),
                    }
                }
                _ => not_found(),
            }
        }
        (["tasks", task, "pushNotificationConfigs", rest @ ..], _) => {
            let task_id = match decode(task) {
                Ok(id) => id,
                Err(error) => return reply(Err(error)),
            };
            let config = match rest {
                [] => None,
                [config] => match decode(config) {
                    Ok(id) => Some(id),
                    Err(error) => return reply(Err(error)),
                },
                _ => return not_found(),
            };
            let named = a2a::PushConfigRequest {
                task_id: task_id.clone(),
                id: config.clone(),
                tenant: None,
            };
            match (config, &method) {
                (None, &Method::POST) => {
                    let mut input: a2a::TaskPushNotificationConfig = match read(request).await {
                        Ok(input) => input,
                        Err(reply) => return *reply,
                    };
                    input.task_id = Some(task_id);
                    reply(
                        server
                            .push_create(caller, input)
                            .await
                            .map(|config| to_value(&config)),
                    )
                }
                (None, &Method::GET) => reply(
                    server
                        .push_list(caller, &named)
                        .await
                        .map(|page| to_value(&page)),
                ),
                (Some(_), &Method::GET) => reply(
                    server
                        .push_get(caller, &named)
                        .await
                        .map(|config| to_value(&config)),
                ),
                (Some(_), &Method::DELETE) => reply(
                    server
                        .push_delete(caller, &named)
                        .await
                        .map(|()| serde_json::json!({})),
                ),
                _ => not_found(),
            }
        }
        _ => not_found(),
    }
}
