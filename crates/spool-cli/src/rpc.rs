//! `spool rpc --stdio`: the JSON-RPC dispatcher over stdin and stdout, one
//! envelope per line, in-process on the local journal (how editors and
//! agent hosts run a tool server). Logs go to stderr only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::journal::Process;
use crate::serve::{load_agent, open_runtime, recover};

#[derive(Debug, Args)]
pub(crate) struct RpcArgs {
    /// Serve on stdin and stdout (the one framing this command has; the
    /// HTTP ones come with `spool serve`).
    #[arg(long, required = true)]
    stdio: bool,
    #[command(flatten)]
    local: Local,
}

/// The journal and agent a stdio server (`spool rpc`, `spool mcp serve`)
/// runs in process.
#[derive(Debug, Args)]
pub(crate) struct Local {
    /// The journal: a directory (SQLite) or a postgres:// URL.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: crate::journal::JournalAt,
    /// The agent definition; `./spool.toml`, or the built-in echo agent.
    #[arg(long)]
    agent: Option<PathBuf>,
    #[arg(long, value_name = "SPEC", help = spool_engines::MODEL_HELP)]
    model: Option<spool_engines::Spec>,
}

impl Local {
    /// The runtime, its interrupted runs resumed, and the claim on the
    /// journal to hold while it serves.
    pub(crate) async fn open(
        &self,
    ) -> anyhow::Result<(spool_runtime::Runtime, crate::journal::Claim)> {
        let agent = load_agent(self.agent.as_deref(), self.model.as_ref())?;
        let (runtime, owner) = open_runtime(&self.journal, &agent, None, Process::Serving).await?;
        recover(&runtime).await?;
        Ok((runtime, owner))
    }
}

pub(crate) fn run(args: RpcArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::block_on(serve(args))
}

async fn serve(args: RpcArgs) -> anyhow::Result<ExitCode> {
    let (runtime, _owner) = args.local.open().await?;
    let dispatcher = spool_rpc::Dispatcher::new(runtime);
    spool_rpc::stdio::serve(&dispatcher, tokio::io::stdin(), tokio::io::stdout())
        .await
        .context("serving JSON-RPC on stdio")?;
    Ok(ExitCode::SUCCESS)
}
