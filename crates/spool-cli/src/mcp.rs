//! `spool mcp list`: start the agent's `[[mcp]]` servers and print the
//! tools the model sees from each, with their effect and whether a call
//! asks for approval first. `spool mcp serve --stdio`: Spool's runs as an
//! MCP server on stdin and stdout, for hosts that spawn their servers.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use spool_runtime::Tool;
use spool_runtime::agent::AgentDefinition;

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Serve Spool's runs as an MCP server (tools to start, answer and read
    /// runs; transcripts as resources) on stdin and stdout, on the local
    /// journal. `spool serve` serves the same at `/mcp`.
    Serve(ServeArgs),
    /// Start each `[[mcp]]` server of the definition and print its tools as
    /// the model sees them. Exits 1 when a server cannot be listed.
    List {
        /// The definition; `spool.toml` in this directory by default.
        path: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Serve on stdin and stdout (the HTTP transport comes with `spool
    /// serve`, at `/mcp`).
    #[arg(long, required = true)]
    stdio: bool,
    #[command(flatten)]
    local: crate::rpc::Local,
    /// How long a tool waits for a turn before answering with the run as
    /// it is (running, waiting), in seconds.
    #[arg(long, default_value_t = 25.0)]
    wait_seconds: f64,
}

pub(crate) fn run(command: McpCommand) -> anyhow::Result<ExitCode> {
    let path = match command {
        McpCommand::Serve(args) => return crate::telemetry::block_on(serve(args)),
        McpCommand::List { path } => path,
    };
    let loaded = AgentDefinition::load(path.as_deref())?;
    let servers = spool_mcp::McpServers::from_definition(&loaded.definition, &loaded.base)
        .map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = std::io::stdout().lock();
    let ok = runtime.block_on(report(&servers, &mut out))?;
    runtime.block_on(servers.stop());
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Lists every server into `out`, a line per tool; false when one could
/// not be listed.
pub(crate) async fn report(
    servers: &spool_mcp::McpServers,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut ok = true;
    for listing in servers.list().await {
        match &listing.tools {
            Ok(tools) => {
                writeln!(out, "mcp      {} ({} tools)", listing.server, tools.len())?;
                for tool in tools {
                    let approval = tool.approval(&serde_json::json!({})).is_some();
                    writeln!(
                        out,
                        "tool     {} ({}{}) = `{}` of {}",
                        tool.spec().name,
                        format!("{:?}", tool.effect()).to_lowercase(),
                        if approval { ", asks first" } else { "" },
                        tool.server_tool(),
                        listing.server
                    )?;
                }
            }
            Err(error) => {
                ok = false;
                writeln!(out, "mcp      {}: {error}", listing.server)?;
            }
        }
        for skipped in &listing.skipped {
            writeln!(out, "skipped  {skipped}")?;
        }
    }
    Ok(ok)
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let ServeArgs {
        stdio: _,
        local,
        wait_seconds,
    } = args;
    if !(wait_seconds.is_finite() && wait_seconds >= 0.0) {
        anyhow::bail!("--wait-seconds must be a non-negative number");
    }
    let (runtime, _owner) = local.open().await?;
    let server = spool_mcp::serve::RunsServer::new(runtime.clone(), spool_runtime::RunAccess::Any)
        .with_patience(spool_mcp::serve::Patience(
            std::time::Duration::from_secs_f64(wait_seconds),
        ));
    spool_mcp::serve::serve_stdio(server)
        .await
        .map_err(anyhow::Error::msg)
        .context("serving MCP on stdio")?;
    runtime.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
