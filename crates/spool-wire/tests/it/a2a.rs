//! A2A v1.0 shapes against the specification's own examples
//! (`docs/specification.md` in `a2aproject/A2A`, sections 6 and 11): each
//! decodes into Spool's type and encodes back to the same JSON; and the
//! errors' codes, statuses and reasons against its table (section 5.4).

use serde_json::{Value, json};
use spool_wire::a2a::{
    Error, ErrorKind, ListTasksResponse, SendMessageRequest, SendMessageResponse, StreamResponse,
    Task, TaskPushNotificationConfig, TaskState,
};

/// Decodes `example` as `T` and encodes it back: the same JSON.
fn round_trips<T: serde::de::DeserializeOwned + serde::Serialize>(example: &Value) {
    let decoded: T = serde_json::from_value(example.clone())
        .unwrap_or_else(|e| panic!("{example} does not decode: {e}"));
    assert_eq!(&serde_json::to_value(&decoded).unwrap(), example);
}

#[test]
fn the_specifications_task_examples_decode_and_encode_unchanged() {
    // §6.1: a completed task with an artifact.
    round_trips::<SendMessageResponse>(&json!({"task": {
        "id": "task-uuid",
        "contextId": "context-uuid",
        "status": {"state": "TASK_STATE_COMPLETED"},
        "artifacts": [{
            "artifactId": "artifact-uuid",
            "name": "Weather Report",
            "parts": [{"text": "Today will be sunny with a high of 75°F"}]
        }]
    }}));
    // §6.5: a listing, with a status message and a timestamp.
    round_trips::<ListTasksResponse>(&json!({
        "tasks": [{
            "id": "789abc-def0-1234-5678-9abcdef01234",
            "contextId": "another-context-id",
            "status": {
                "state": "TASK_STATE_WORKING",
                "message": {
                    "role": "ROLE_AGENT",
                    "parts": [{"text": "Processing your document analysis..."}],
                    "messageId": "msg-status-update"
                },
                "timestamp": "2024-03-15T10:20:00Z"
            }
        }],
        "totalSize": 1,
        "pageSize": 20,
        "nextPageToken": ""
    }));
}

#[test]
fn the_specifications_stream_and_push_examples_decode_and_encode_unchanged() {
    // §6.2: the three items of a stream.
    for item in [
        json!({"task": {"id": "task-uuid", "contextId": "context-uuid", "status": {"state": "TASK_STATE_WORKING"}}}),
        json!({"artifactUpdate": {"taskId": "task-uuid", "contextId": "context-uuid", "artifact": {"artifactId": "a", "parts": [{"text": "# Climate Change Report\n\n"}]}}}),
        json!({"statusUpdate": {"taskId": "task-uuid", "contextId": "context-uuid", "status": {"state": "TASK_STATE_COMPLETED"}}}),
    ] {
        round_trips::<StreamResponse>(&item);
    }
    // §6.6: a send with a push config, and the webhook's payload.
    round_trips::<SendMessageRequest>(&json!({
        "message": {
            "role": "ROLE_USER",
            "parts": [{"text": "Generate the Q1 sales report. This usually takes a while. Notify me when it's ready."}],
            "messageId": "6dbc13b5-bd57-4c2b-b503-24e381b6c8d6"
        },
        "configuration": {
            "taskPushNotificationConfig": {
                "url": "https://client.example.com/webhook/a2a-notifications",
                "authentication": {"scheme": "Bearer", "credentials": "secure-client-token-for-task-aaa"}
            }
        }
    }));
    round_trips::<TaskPushNotificationConfig>(&json!({
        "url": "https://client.example.com/webhook/a2a-notifications",
        "token": "t",
        "authentication": {"scheme": "Bearer"}
    }));
}

#[test]
fn v0_3_spellings_are_read_and_an_unknown_state_is_refused_naming_the_states() {
    let task: Task = serde_json::from_value(json!({
        "kind": "task", "id": "t", "contextId": "c",
        "status": {"state": "input-required"},
        "history": [{"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}]
    }))
    .unwrap();
    assert_eq!(task.status.state, TaskState::InputRequired);
    assert_eq!(task.history.unwrap()[0].text(), "hi");
    let refused = serde_json::from_value::<TaskState>(json!("TASK_STATE_RUNNING")).unwrap_err();
    assert!(
        refused.to_string().contains("TASK_STATE_WORKING"),
        "{refused}"
    );
}

#[test]
fn every_error_has_the_specifications_code_status_and_reason() {
    // §5.4's table.
    let table = [
        (ErrorKind::TaskNotFound, -32001, 404, "TASK_NOT_FOUND"),
        (
            ErrorKind::TaskNotCancelable,
            -32002,
            400,
            "TASK_NOT_CANCELABLE",
        ),
        (
            ErrorKind::PushNotificationNotSupported,
            -32003,
            400,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
        ),
        (
            ErrorKind::UnsupportedOperation,
            -32004,
            400,
            "UNSUPPORTED_OPERATION",
        ),
        (
            ErrorKind::ContentTypeNotSupported,
            -32005,
            400,
            "CONTENT_TYPE_NOT_SUPPORTED",
        ),
        (
            ErrorKind::InvalidAgentResponse,
            -32006,
            500,
            "INVALID_AGENT_RESPONSE",
        ),
        (
            ErrorKind::ExtendedAgentCardNotConfigured,
            -32007,
            400,
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        ),
        (
            ErrorKind::ExtensionSupportRequired,
            -32008,
            400,
            "EXTENSION_SUPPORT_REQUIRED",
        ),
        (
            ErrorKind::VersionNotSupported,
            -32009,
            400,
            "VERSION_NOT_SUPPORTED",
        ),
    ];
    for (kind, code, status, reason) in table {
        assert_eq!(
            (kind.code(), kind.status(), kind.reason()),
            (code, status, reason)
        );
        assert_eq!(ErrorKind::from_code(code), Some(kind));
    }
    // §11.6's example body.
    let error = Error::task_not_found("task-123");
    assert_eq!(
        error.http(),
        json!({"error": {
            "code": 404,
            "status": "NOT_FOUND",
            "message": "task `task-123` not found",
            "details": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "TASK_NOT_FOUND",
                "domain": "a2a-protocol.org",
                "metadata": {"taskId": "task-123"}
            }]
        }})
    );
    assert_eq!(error.rpc()["code"], -32001);
}
