//! The JSON-RPC binding: `POST /a2a` with the v1.0 method names and the
//! v0.3 ones as aliases (answered in v0.3's shapes), streaming methods as
//! Server-Sent Events whose `data` is a JSON-RPC response per item.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use spool_edge::body::{self, Body};
use spool_journal::Principal;
use spool_wire::a2a::{self, Error, ErrorKind, ListTasksRequest, SendMessageResponse, TaskRequest};

use crate::server::A2aServer;
use crate::{Version, stream};

/// The methods, by name: the operation, and whether the v0.3 shapes
/// answer it.
fn method(name: &str) -> Option<(Operation, bool)> {
    Some(match name {
        "SendMessage" => (Operation::Send, false),
        "SendStreamingMessage" => (Operation::Stream, false),
        "GetTask" => (Operation::Get, false),
        "ListTasks" => (Operation::List, false),
        "CancelTask" => (Operation::Cancel, false),
        "SubscribeToTask" => (Operation::Subscribe, false),
        "CreateTaskPushNotificationConfig" => (Operation::PushCreate, false),
        "GetTaskPushNotificationConfig" => (Operation::PushGet, false),
        "ListTaskPushNotificationConfigs" => (Operation::PushList, false),
        "DeleteTaskPushNotificationConfig" => (Operation::PushDelete, false),
        "GetExtendedAgentCard" => (Operation::ExtendedCard, false),
        "message/send" => (Operation::Send, true),
        "message/stream" => (Operation::Stream, true),
        "tasks/get" => (Operation::Get, true),
        "tasks/list" => (Operation::List, true),
        "tasks/cancel" => (Operation::Cancel, true),
        "tasks/resubscribe" => (Operation::Subscribe, true),
        "tasks/pushNotificationConfig/set" => (Operation::PushCreate, true),
        "tasks/pushNotificationConfig/get" => (Operation::PushGet, true),
        "tasks/pushNotificationConfig/list" => (Operation::PushList, true),
        "tasks/pushNotificationConfig/delete" => (Operation::PushDelete, true),
        "agent/getAuthenticatedExtendedCard" => (Operation::ExtendedCard, true),
        _ => return None,
    })
}

#[derive(Clone, Copy, Debug)]
enum Operation {
    Send,
    Stream,
    Get,
    List,
    Cancel,
    Subscribe,
    PushCreate,
    PushGet,
    PushList,
    PushDelete,
    ExtendedCard,
}

fn reply(id: &Value, outcome: Result<Value, Error>) -> Response<Body> {
    let envelope = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error.rpc()}),
    };
    body::json(StatusCode::OK, &envelope)
}

fn params<T: DeserializeOwned>(params: Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        Error::new(
            ErrorKind::InvalidParams,
            format!("invalid params at `{path}`: {}", e.into_inner()),
        )
        .with("field", path)
    })
}

/// Answers one JSON-RPC request body.
pub(crate) async fn answer(
    server: &A2aServer,
    caller: Option<&Principal>,
    version: Version,
    base: &str,
    bytes: &Bytes,
) -> Response<Body> {
    let request: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(e) => {
            return reply(
                &Value::Null,
                Err(Error::new(
                    ErrorKind::Parse,
                    format!("the body is not JSON: {e}"),
                )),
            );
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let valid_id = matches!(id, Value::String(_) | Value::Number(_));
    let name = request.get("method").and_then(Value::as_str);
    let (Some(name), true, Some("2.0")) = (
        name,
        valid_id,
        request.get("jsonrpc").and_then(Value::as_str),
    ) else {
        return reply(
            &id,
            Err(Error::new(
                ErrorKind::InvalidRequest,
                "a request is an object with `jsonrpc: \"2.0\"`, a string or number `id` and a `method` (notifications and batches are not taken)",
            )),
        );
    };
    let Some((operation, legacy)) = method(name) else {
        return reply(
            &id,
            Err(Error::new(
                ErrorKind::MethodNotFound,
                format!("no method `{name}`"),
            )),
        );
    };
    if let Err(error) = version.check(legacy) {
        return reply(&id, Err(error));
    }
    let shape = |value: Value| {
        if legacy {
            a2a::v0_3::item(value)
        } else {
            value
        }
    };
    let input = request.get("params").cloned().unwrap_or_else(|| json!({}));
    let outcome = match operation {
        Operation::Send => match params(input) {
            Ok(request) => match server.send(caller, request).await {
                Ok(sent) => server
                    .answer(caller, sent)
                    .await
                    .map(|task| shape(to_value(&SendMessageResponse::Task(task)))),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        },
        Operation::Stream => {
            let opened = match params(input) {
                Ok(request) => match server.send(caller, request).await {
                    Ok(sent) => server.open(caller, &sent.task.id()).await,
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
            return match opened {
                Ok(watch) => stream::sse(server, watch, Some((id, legacy))),
                Err(error) => reply(&id, Err(error)),
            };
        }
        Operation::Subscribe => {
            let opened = match params::<TaskRequest>(input) {
                Ok(request) => stream::subscribe(server, caller, &request.id).await,
                Err(error) => Err(error),
            };
            return match opened {
                Ok(watch) => stream::sse(server, watch, Some((id, legacy))),
                Err(error) => reply(&id, Err(error)),
            };
        }
        Operation::Get => match params::<TaskRequest>(input) {
            Ok(request) => server
                .get(caller, &request)
                .await
                .map(|task| shape(json!({"task": task}))),
            Err(error) => Err(error),
        }
        .map(|value| unwrap_task(value, legacy)),
        Operation::Cancel => match params::<TaskRequest>(input) {
            Ok(request) => server
                .cancel(caller, &request)
                .await
                .map(|task| shape(json!({"task": task}))),
            Err(error) => Err(error),
        }
        .map(|value| unwrap_task(value, legacy)),
        Operation::List => match params::<ListTasksRequest>(input) {
            Ok(request) => server.list(caller, &request).await.map(|page| {
                let mut value = to_value(&page);
                if legacy && let Some(Value::Array(tasks)) = value.get_mut("tasks") {
                    for task in tasks.iter_mut() {
                        *task = a2a::v0_3::task(task.take());
                    }
                }
                value
            }),
            Err(error) => Err(error),
        },
        Operation::PushCreate => {
            match params::<a2a::TaskPushNotificationConfig>(legacy_push(input, legacy)) {
                Ok(config) => server
                    .push_create(caller, config)
                    .await
                    .map(|config| to_value(&config)),
                Err(error) => Err(error),
            }
        }
        Operation::PushGet => match params::<a2a::PushConfigRequest>(legacy_push(input, legacy)) {
            Ok(request) => server
                .push_get(caller, &request)
                .await
                .map(|config| to_value(&config)),
            Err(error) => Err(error),
        },
        Operation::PushList => match params::<a2a::PushConfigRequest>(legacy_push(input, legacy)) {
            Ok(request) => server.push_list(caller, &request).await.map(|page| {
                if legacy {
                    // v0.3 answered the list itself.
                    to_value(&page.configs)
                } else {
                    to_value(&page)
                }
            }),
            Err(error) => Err(error),
        },
        Operation::PushDelete => {
            match params::<a2a::PushConfigRequest>(legacy_push(input, legacy)) {
                Ok(request) => server
                    .push_delete(caller, &request)
                    .await
                    .map(|()| if legacy { Value::Null } else { json!({}) }),
                Err(error) => Err(error),
            }
        }
        Operation::ExtendedCard => server
            .extended_card(caller, base)
            .map(|card| to_value(&card)),
    };
    reply(&id, outcome)
}

/// v0.3's push params (`{"taskId", "pushNotificationConfig": {…}}` to
/// set, `{"id": TASK, "pushNotificationConfigId"}` to get or delete) in
/// v1.0's flat shape.
fn legacy_push(params: Value, legacy: bool) -> Value {
    if !legacy {
        return params;
    }
    let Value::Object(mut object) = params else {
        return params;
    };
    if let Some(Value::Object(config)) = object.remove("pushNotificationConfig") {
        for (key, value) in config {
            object.entry(key).or_insert(value);
        }
    }
    if !object.contains_key("taskId")
        && let Some(task) = object.remove("id")
    {
        object.insert("taskId".into(), task);
    }
    if let Some(config) = object.remove("pushNotificationConfigId") {
        object.insert("id".into(), config);
    }
    if let Some(Value::Object(auth)) = object.get_mut("authentication")
        && let Some(Value::Array(schemes)) = auth.remove("schemes")
    {
        let scheme = schemes.into_iter().next().unwrap_or(Value::Null);
        auth.insert("scheme".into(), scheme);
    }
    Value::Object(object)
}

/// `GetTask` and `CancelTask` answer the task itself, not wrapped.
fn unwrap_task(value: Value, legacy: bool) -> Value {
    if legacy {
        // v0.3's item() already unwrapped it.
        return value;
    }
    match value {
        Value::Object(mut object) => object.remove("task").unwrap_or(Value::Null),
        other => other,
    }
}

pub(crate) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("A2A types are plain JSON")
}
