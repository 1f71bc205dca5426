//! `a2a-tasks`: A2A as a user's client sees it, from outside a `spool
//! serve` process. One-turn tasks by `SendMessage` (`POST
//! /a2a/message:send`, each with its own `messageId`) from 16 keep-alive
//! clients, against the HTTP channel's one-turn runs from 16 clients on
//! the same server measured straight after (target: at least 0.8 of
//! it), and against runs each made at a new address (target 0.8 too):
//! a new conversation is recorded under an address made from its
//! message id, which is what lets a resent message find its task after a
//! crash, and that index write is the floor a plain run does not pay;
//! and the server's resident memory with 1 000 `SubscribeToTask`
//! streams open on a task parked in a sleep, against the same server
//! idle. Needs the `spool` binary in `SPOOL_BIN`; without it the rows are
//! skipped, said.

use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Scale;
use crate::report::Row;
use crate::serve::{Conn, RUN, Server, closed_loop_with, status_field};

fn send_body(n: u64) -> Vec<u8> {
    format!(
        r#"{{"message":{{"messageId":"bench-{n}","role":"ROLE_USER","parts":[{{"text":"hello"}}]}}}}"#
    )
    .into_bytes()
}

fn run_body(_: u64) -> Vec<u8> {
    RUN.1.to_vec()
}

fn address_body(n: u64) -> Vec<u8> {
    format!(r#"{{"text":"hello","address":"bench-{n}"}}"#).into_bytes()
}

/// Opens a `SubscribeToTask` stream and reads up to its first event (the
/// task): the stream is open and the server holds it.
async fn subscribe(addr: &str, task: &str) -> anyhow::Result<BufReader<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    let mut stream = BufReader::new(stream);
    let request = format!(
        "POST /a2a/tasks/{task}:subscribe HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"
    );
    stream.get_mut().write_all(request.as_bytes()).await?;
    let mut line = String::new();
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            bail!("a subscription closed before its first event");
        }
        if line.starts_with("data:") {
            return Ok(stream);
        }
    }
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("a2a-tasks")? else {
        return Ok(Vec::new());
    };
    let duration = scale.pick(Duration::from_secs(6), Duration::from_millis(400));
    let tokio = crate::http::tokio()?;
    let mut rows = Vec::new();

    {
        let server = Server::start(&spool)?;
        let (tasks, runs, addressed) = tokio.block_on(async {
            let clients = 16;
            // Warm: connections, caches, the journal's first pages.
            closed_loop_with(
                &server.addr,
                "POST /a2a/message:send",
                std::sync::Arc::new(send_body),
                "TASK_STATE_COMPLETED",
                clients,
                duration / 6,
            )
            .await?;
            closed_loop_with(
                &server.addr,
                RUN.0,
                std::sync::Arc::new(run_body),
                RUN.2,
                clients,
                duration / 6,
            )
            .await?;
            let tasks = closed_loop_with(
                &server.addr,
                "POST /a2a/message:send",
                std::sync::Arc::new(send_body),
                "TASK_STATE_COMPLETED",
                clients,
                duration,
            )
            .await?;
            let runs = closed_loop_with(
                &server.addr,
                RUN.0,
                std::sync::Arc::new(run_body),
                RUN.2,
                clients,
                duration,
            )
            .await?;
            let addressed = closed_loop_with(
                &server.addr,
                RUN.0,
                std::sync::Arc::new(address_body),
                RUN.2,
                clients,
                duration,
            )
            .await?;
            anyhow::Ok((tasks, runs, addressed))
        })?;
        rows.push(
            Row::new(
                "a2a-tasks/SendMessage, 16 clients",
                tasks,
                "tasks/s",
                "HTTP channel runs/s",
                runs,
            )
            .ratio_at_least(0.8),
        );
        // Like for like: a new conversation is recorded under an address
        // made from its message id (what makes a resent message find its
        // task), so each costs what a run at a new address does.
        rows.push(
            Row::new(
                "a2a-tasks/SendMessage against runs at new addresses",
                tasks,
                "tasks/s",
                "runs/s, each at a new address",
                addressed,
            )
            .ratio_at_least(0.8),
        );
    }

    {
        // A task that stays working: its turn sleeps for an hour.
        let script =
            r#"{"tool_calls": [{"id": "c1", "name": "sleep", "arguments": {"seconds": 3600}}]}"#;
        let server = Server::start_with(
            &spool,
            &[
                (
                    "spool.toml",
                    "[agent]\nengine = \"scripted:script.jsonl\"\n",
                ),
                ("script.jsonl", script),
            ],
        )?;
        let streams = scale.pick(1_000, 50);
        let (idle, open) = tokio.block_on(async {
            let mut conn = Conn::open(&server.addr).await?;
            let (status, reply) = conn
                .request(
                    "POST /a2a/message:send",
                    br#"{"message":{"messageId":"sleeper","role":"ROLE_USER","parts":[{"text":"wait"}]},"configuration":{"returnImmediately":true}}"#,
                )
                .await?;
            anyhow::ensure!(status == 200, "the task answered {status}");
            let reply: serde_json::Value = serde_json::from_slice(&reply)?;
            let task = reply["task"]["id"].as_str().context("a task id")?.to_owned();
            let idle = status_field(server.pid(), "VmRSS:")? / 1024.0;
            let mut open = Vec::with_capacity(streams);
            for _ in 0..streams {
                open.push(subscribe(&server.addr, &task).await?);
            }
            anyhow::Ok((idle, open))
        })?;
        let with = status_field(server.pid(), "VmRSS:")? / 1024.0;
        drop(open);
        rows.push(
            Row::new(
                format!("a2a-tasks/RSS with {streams} SubscribeToTask streams"),
                with,
                "MB",
                "the server before them",
                idle,
            )
            .lower_is_better(),
        );
    }
    Ok(rows)
}
