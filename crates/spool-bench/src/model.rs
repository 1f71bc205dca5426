//! A stand-in for an OpenAI-compatible model server, in the benchmark's
//! process: `POST /v1/chat/completions` answered as a chat-completion SSE
//! stream, by a function of the request, with no model behind it. What
//! `spool serve` calls through its `openai` engine in the rows that need a
//! model that can hang, ask for a tool or pace its tokens. It answers
//! Anthropic's `POST /v1/messages` too (text answers only, streamed when
//! the request says `stream`), for the runtimes measured beside Spool that
//! speak only that.
//!
//! One connection per request, closed after the answer, as Spool's engine
//! makes them: the answer needs no length or chunked framing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the stand-in answers one request.
pub(crate) enum Reply {
    /// Never: the connection stays open until the client closes it (a
    /// model call in flight when the caller dies).
    Hang,
    /// A text answer, one chunk per word, `gap` apart.
    Text { words: Vec<String>, gap: Duration },
    /// One tool call.
    Call {
        name: &'static str,
        arguments: Value,
    },
}

impl Reply {
    /// A text answer sent at once.
    pub(crate) fn text(text: &str) -> Self {
        Self::Text {
            words: vec![text.to_owned()],
            gap: Duration::ZERO,
        }
    }
}

/// What a request asks, as the stand-in reads it.
pub(crate) struct Asked {
    /// The last message's role (`user`, `tool`).
    pub(crate) role: String,
    /// The last user message's text.
    pub(crate) text: String,
}

/// The stand-in's answers, decided per request.
pub(crate) type Answer = Arc<dyn Fn(&Asked) -> Reply + Send + Sync>;

/// Serves `answer` on a free loopback port until the process ends; its
/// base URL (`http://127.0.0.1:PORT/v1`).
pub(crate) async fn start(answer: Answer) -> anyhow::Result<String> {
    // A backlog as deep as the kernel allows: a restarted server re-asks
    // thousands of calls at once, and a refused SYN is retried a second
    // later, which would be measured as Spool's delay.
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener: TcpListener = socket.listen(8192)?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                // A connection the client dropped ends here; nothing to say.
                let _ = serve(stream, &answer).await;
            });
        }
    });
    Ok(url)
}

/// An answer's head: a stream, its end the connection's.
const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

async fn serve(stream: TcpStream, answer: &Answer) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let mut stream = BufReader::new(stream);
    let mut length = 0;
    let mut line = String::new();
    anyhow::ensure!(
        stream.read_line(&mut line).await? > 0,
        "closed before a request"
    );
    let messages_api = line
        .split_whitespace()
        .nth(1)
        .is_some_and(|path| path.ends_with("/messages"));
    loop {
        line.clear();
        anyhow::ensure!(stream.read_line(&mut line).await? > 0, "closed in the head");
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse()?;
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    let request: Value = serde_json::from_slice(&body).context("a request that is not JSON")?;
    let reply = answer(&asked(&request));
    let mut stream = stream.into_inner();
    if messages_api {
        return anthropic(&mut stream, reply, request["stream"] == true).await;
    }
    match reply {
        Reply::Hang => {
            // Held until the client goes: a read returns 0 then.
            let mut rest = [0u8; 64];
            while stream.read(&mut rest).await? > 0 {}
            return Ok(());
        }
        Reply::Text { words, gap } => {
            stream.write_all(SSE_HEAD).await?;
            for (i, word) in words.iter().enumerate() {
                if i > 0 && !gap.is_zero() {
                    tokio::time::sleep(gap).await;
                }
                chunk(&mut stream, &json!({"content": word}), None).await?;
            }
            chunk(&mut stream, &json!({}), Some("stop")).await?;
        }
        Reply::Call { name, arguments } => {
            stream.write_all(SSE_HEAD).await?;
            let call = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}}]});
            chunk(&mut stream, &call, None).await?;
            chunk(&mut stream, &json!({}), Some("tool_calls")).await?;
        }
    }
    stream.write_all(b"data: [DONE]\n\n").await?;
    stream.shutdown().await?;
    Ok(())
}

/// Answers an Anthropic Messages request with a text reply: one JSON
/// message, or, when `streamed`, the events that make it up.
async fn anthropic(stream: &mut TcpStream, reply: Reply, streamed: bool) -> anyhow::Result<()> {
    let Reply::Text { words, gap } = reply else {
        anyhow::bail!("the stand-in answers the Messages API with text only");
    };
    let usage = json!({"input_tokens": 1, "output_tokens": words.len()});
    if !streamed {
        let body = json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "stand-in", "content": [{"type": "text", "text": words.concat()}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": usage})
        .to_string();
        stream
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
        stream.shutdown().await?;
        return Ok(());
    }
    stream.write_all(SSE_HEAD).await?;
    let event = |kind: &str, data: Value| format!("event: {kind}\ndata: {data}\n\n");
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "stand-in", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 0}}}),
    ) + &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
    );
    stream.write_all(start.as_bytes()).await?;
    for (i, word) in words.iter().enumerate() {
        if i > 0 && !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let delta = event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": word}}),
        );
        stream.write_all(delta.as_bytes()).await?;
    }
    let end = event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ) + &event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
            "stop_sequence": null}, "usage": {"output_tokens": words.len()}}),
    ) + &event("message_stop", json!({"type": "message_stop"}));
    stream.write_all(end.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

/// Writes one SSE chunk holding `delta`.
async fn chunk(stream: &mut TcpStream, delta: &Value, finish: Option<&str>) -> anyhow::Result<()> {
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "stand-in",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    stream
        .write_all(format!("data: {chunk}\n\n").as_bytes())
        .await?;
    Ok(())
}

fn asked(request: &Value) -> Asked {
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let role = messages
        .last()
        .and_then(|m| m["role"].as_str())
        .unwrap_or_default()
        .to_owned();
    let text = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            // Content parts: the text ones, joined.
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
            _ => String::new(),
        })
        .unwrap_or_default();
    Asked { role, text }
}

/// A `spool.toml` whose agent calls the stand-in at `url`.
pub(crate) fn definition(url: &str) -> String {
    format!(
        "[agent]\nengine = \"openai/stand-in\"\n\n[provider]\nbase_url = \"{url}\"\nmax_retries = 0\n"
    )
}
