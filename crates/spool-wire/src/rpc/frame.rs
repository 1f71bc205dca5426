//! Byte-exact framings of an envelope for the three streaming transports:
//! WebSocket (one compact JSON text per message), Server-Sent Events and
//! NDJSON.

use super::Envelope;

/// One WebSocket text message: the compact JSON envelope.
///
/// ```
/// use spool_wire::rpc::{Envelope, encode_ws};
/// assert_eq!(
///     encode_ws(&Envelope::request(1, "state.snapshot", None)),
///     r#"{"jsonrpc":"2.0","id":1,"method":"state.snapshot"}"#,
/// );
/// ```
#[must_use]
pub fn encode_ws(envelope: &Envelope) -> String {
    serde_json::to_string(envelope)
        .expect("an envelope is a map of JSON values and always serializes")
}

/// One SSE event: `id: <seq>` when the event has a journal position (so a
/// reconnecting client can send `Last-Event-ID`), `data: <envelope>`, and
/// the blank line that ends the event. Compact JSON never contains a raw
/// newline, so one `data:` line always suffices.
///
/// ```
/// use spool_wire::rpc::{Envelope, encode_sse};
/// let ping = Envelope::notification("events.append", Some(serde_json::json!({})));
/// assert_eq!(encode_sse(&ping, Some(7)), "id: 7\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"events.append\",\"params\":{}}\n\n");
/// assert_eq!(encode_sse(&ping, None), "data: {\"jsonrpc\":\"2.0\",\"method\":\"events.append\",\"params\":{}}\n\n");
/// ```
#[must_use]
pub fn encode_sse(envelope: &Envelope, seq: Option<u64>) -> String {
    let json = encode_ws(envelope);
    match seq {
        Some(seq) => format!("id: {seq}\ndata: {json}\n\n"),
        None => format!("data: {json}\n\n"),
    }
}

/// One NDJSON line: the compact envelope and a newline.
#[must_use]
pub fn encode_ndjson(envelope: &Envelope) -> String {
    let mut line = encode_ws(envelope);
    line.push('\n');
    line
}

/// A batch as one compact JSON array.
#[must_use]
pub fn encode_batch(envelopes: &[Envelope]) -> String {
    serde_json::to_string(envelopes)
        .expect("envelopes are maps of JSON values and always serialize")
}

/// One SSE event read back: its `id` and its data, with multi-line data
/// joined by newlines as the SSE specification says. Comment lines (`:`)
/// and unknown fields are skipped.
///
/// ```
/// use spool_wire::rpc::SseFrame;
/// let frame = SseFrame::parse("id: 3\ndata: {\"a\":1}\n\n");
/// assert_eq!(frame.id.as_deref(), Some("3"));
/// assert_eq!(frame.data, "{\"a\":1}");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseFrame {
    /// The `id` field, when present.
    pub id: Option<String>,
    /// The `event` field, when present.
    pub event: Option<String>,
    /// The data lines, joined by `\n`.
    pub data: String,
}

impl SseFrame {
    /// Parses the text of one event (up to and including its blank line).
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut frame = Self::default();
        let mut data: Vec<&str> = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line, ""),
            };
            match field {
                "id" => frame.id = Some(value.to_owned()),
                "event" => frame.event = Some(value.to_owned()),
                "data" => data.push(value),
                _ => {}
            }
        }
        frame.data = data.join("\n");
        frame
    }
}
