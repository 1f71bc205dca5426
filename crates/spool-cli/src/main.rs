//! The `spool` binary: parses flags, builds Spool's layers and starts them.
//! No protocol or run logic lives here; each command calls into a library
//! crate.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod a2a;
mod agent;
mod bus;
mod cluster;
mod journal;
mod mcp;
mod pod;
mod reload;
mod rpc;
mod runs;
mod serve;
mod talk;
mod telemetry;
mod wire;

/// Spool: durable LLM agent runs and the wire protocols to drive them.
#[derive(Debug, Parser)]
#[command(name = "spool", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with Spool's wire messages.
    Wire {
        #[command(subcommand)]
        command: wire::WireCommand,
    },
    /// Serve the HTTP channel on the embedded defaults: ./.spool, ./spool.toml
    /// (or the built-in echo agent), 127.0.0.1:8080.
    Serve(Box<serve::ServeArgs>),
    /// Send one message and stream the answer; a question from the run is
    /// asked here and answered from the terminal. In-process on the local
    /// journal, or against a server with --url.
    Run(talk::RunArgs),
    /// A line-oriented chat with a run: streamed answers, questions
    /// answered inline, and /cancel, /clear, /new, /quit.
    Chat(talk::ChatArgs),
    /// Manage bearer tokens.
    Token {
        #[command(subcommand)]
        command: serve::TokenCommand,
    },
    /// Work with agent definitions (spool.toml).
    Agent {
        #[command(subcommand)]
        command: agent::AgentCommand,
    },
    /// Reach an A2A agent: print its card, send it a message.
    A2a {
        #[command(subcommand)]
        command: a2a::A2aCommand,
    },
    /// The agent's MCP servers (`[[mcp]]` in spool.toml).
    Mcp {
        #[command(subcommand)]
        command: mcp::McpCommand,
    },
    /// Serve JSON-RPC 2.0 (seed 001) on stdin and stdout, one envelope per
    /// line, on the local journal.
    Rpc(rpc::RpcArgs),
    /// Talk to another instance over the bus (seed 000).
    Bus {
        #[command(subcommand)]
        command: bus::BusCommand,
    },
    /// Serve a pod (seed 003) on a Unix socket, or list the pods served.
    Pod {
        #[command(subcommand)]
        command: pod::PodCommand,
    },
    /// Move a journal between stores (SQLite and PostgreSQL).
    Journal {
        #[command(subcommand)]
        command: journal::JournalCommand,
    },
    /// Read runs from a journal (read-only; safe beside a running server).
    Runs {
        #[command(subcommand)]
        command: runs::RunsCommand,
    },
    /// Look at a cluster of `spool serve --cluster` nodes (read-only).
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr; RUST_LOG filters them (`info` by default).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // The MCP SDK logs each connection's life at `info`; Spool says
        // what matters of it (a server started, exited, refused) itself.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    // The filter is the log's alone: the HTTP request spans see every
    // request line, whatever RUST_LOG lets through to stderr, and nothing
    // else (without a filter of their own every callsite, the debug spans
    // of each request and run among them, would be enabled for them).
    {
        use tracing_subscriber::prelude::*;
        let request_lines = tracing_subscriber::filter::Targets::new()
            .with_target("spool::http", tracing::Level::INFO);
        let _ = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .with(telemetry::http_spans().with_filter(request_lines))
            .try_init();
    }
    let outcome = match cli.command {
        Command::Wire { command } => wire::run(command),
        Command::Runs { command } => runs::run(command),
        Command::Cluster { command } => cluster::run(command),
        Command::Journal { command } => journal::run(command),
        Command::Rpc(args) => rpc::run(args),
        Command::Pod { command } => pod::run(command),
        Command::Bus { command } => bus::run(command),
        Command::Agent { command } => agent::run(command),
        Command::Mcp { command } => mcp::run(command),
        Command::A2a { command } => a2a::run(command),
        Command::Serve(args) => serve::run(*args),
        Command::Run(args) => talk::run(args),
        Command::Chat(args) => talk::chat(args),
        Command::Token { command } => serve::token(command),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            // A reader that went away (`| head`) is not an error worth a
            // message; anything else is reported once, with its causes.
            if error
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::from(1);
            }
            #[allow(
                clippy::print_stderr,
                reason = "the binary's one place to report a fatal error"
            )]
            {
                eprintln!("spool: {}", report(&error));
            }
            ExitCode::from(1)
        }
    }
}

/// An error and its causes, `: `-joined, leaving out a cause whose words
/// the error before it already says (a journal's storage error carries
/// SQLite's message and keeps SQLite's error as its source).
fn report(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::report;

    #[test]
    fn a_cause_the_error_already_quotes_is_reported_once() {
        let sqlite = std::io::Error::other("database or disk is full");
        let error = anyhow::Error::new(spool_journal::JournalError::storage_from(sqlite))
            .context("opening the journal in .spool");
        assert_eq!(
            report(&error),
            "opening the journal in .spool: journal storage failed: database or disk is full"
        );
    }
}
