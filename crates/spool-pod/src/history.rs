//! `get_history`: the session's conversation (the HTTP snapshot's
//! `messages`) as the protocol's items: user and assistant messages,
//! tool calls, tool results and reasoning, in the order they happened.
//! An answered question is its tool call's result, as the live
//! `tool_result` event said.

use serde_json::Value;
use spool_journal::event::Answer;
use spool_runtime::view::answers_output;
use spool_wire::pod::{ContentPart, HistoryItem, ItemStatus, Role};

/// The items of a conversation for display (`{"role", "content": [parts]}`
/// messages). A part of a type this version does not know is left out, so
/// one new kind of content never hides the rest of the history.
#[must_use]
pub fn items(messages: &[Value]) -> Vec<HistoryItem> {
    let mut items = Vec::new();
    for message in messages {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let parts = message
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match role {
            // A person's answer to a tool call's question is that call's
            // result, as the `tool_result` event said when it came.
            "user" if message.get("tool_call_id").is_some() => {
                let answers: Vec<Answer> = message
                    .get("answers")
                    .and_then(|answers| serde_json::from_value(answers.clone()).ok())
                    .unwrap_or_default();
                items.push(HistoryItem::ToolResult {
                    id: None,
                    call_id: string(message, "tool_call_id"),
                    output: answers_output(&answers),
                });
            }
            "user" | "assistant" => {
                let role = if role == "user" {
                    Role::User
                } else {
                    Role::Assistant
                };
                let mut texts = Vec::new();
                for part in parts {
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => texts.push(ContentPart::Text {
                            text: string(part, "text"),
                        }),
                        Some("thinking") => items.push(HistoryItem::Reasoning {
                            id: None,
                            text: string(part, "thinking"),
                            status: Some(ItemStatus::Completed),
                        }),
                        Some("tool_call") => {
                            // The message's text comes before its calls.
                            flush(&mut items, role.clone(), &mut texts);
                            items.push(HistoryItem::ToolCall {
                                id: None,
                                call_id: string(part, "id"),
                                name: string(part, "name"),
                                arguments: part
                                    .get("arguments")
                                    .map(Value::to_string)
                                    .unwrap_or_else(|| "{}".into()),
                                status: Some(ItemStatus::Completed),
                            });
                        }
                        _ => {}
                    }
                }
                flush(&mut items, role, &mut texts);
            }
            "tool" => {
                for part in parts {
                    if part.get("type").and_then(Value::as_str) == Some("tool_result") {
                        items.push(HistoryItem::ToolResult {
                            id: None,
                            call_id: string(part, "tool_call_id"),
                            output: string(part, "content"),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    items
}

/// The text parts gathered so far, as one message item.
fn flush(items: &mut Vec<HistoryItem>, role: Role, texts: &mut Vec<ContentPart>) {
    if texts.is_empty() {
        return;
    }
    items.push(HistoryItem::Message {
        id: None,
        role,
        content: std::mem::take(texts),
        status: Some(ItemStatus::Completed),
    });
}

fn string(part: &Value, key: &str) -> String {
    match part.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}
