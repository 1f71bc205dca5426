//! `mcp-tool-call`: one call of an MCP server's tool over stdio (the
//! server started once, kept running) against one call of a command tool
//! doing the same work (a process per call), in the same run. Both are
//! this binary echoing its input: `spool-bench mcp-echo` is an MCP server
//! (the official Rust SDK's server role) with one tool, `echo`, and
//! `spool-bench echo-tool` copies stdin to stdout.

use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use spool_runtime::agent::AgentDefinition;
use spool_runtime::{ToolOutcome, Tools};
use tokio_util::sync::CancellationToken;

use crate::Scale;
use crate::report::Row;

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy();
    let calls = scale.pick(300, 20);
    let definition: AgentDefinition = toml::from_str(&format!(
        "[[tool]]\nname = \"echo\"\ndescription = \"Echoes.\"\ncommand = [{exe:?}, \"echo-tool\"]\neffect = \"read\"\n\n[[mcp]]\nname = \"bench\"\ncommand = [{exe:?}, \"mcp-echo\"]\napproval = \"never\"\n"
    ))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let command_tools = definition.tools(std::path::Path::new(""))?;
        let servers = spool_mcp::McpServers::from_definition(&definition, std::path::Path::new(""))
            .map_err(anyhow::Error::msg)?;
        let mcp_tools = servers.start(Tools::new()).await.current();
        let input = json!({"text": "the same work on both sides"});
        let mcp = median_ms(&mcp_tools, "bench__echo", &input, calls).await?;
        let command = median_ms(&command_tools, "echo", &input, calls).await?;
        servers.stop().await;
        Ok(vec![
            Row::new(
                "mcp-tool-call (stdio)",
                mcp,
                "ms",
                "command tool, same work",
                command,
            )
            .lower_is_better()
            .at_most_times_baseline(1.5),
        ])
    })
}

/// The median time of `calls` calls of `name` (after a few to warm up).
async fn median_ms(
    tools: &Tools,
    name: &str,
    input: &serde_json::Value,
    calls: usize,
) -> anyhow::Result<f64> {
    let tool = tools
        .get(name)
        .ok_or_else(|| anyhow::anyhow!("no tool `{name}`"))?;
    let cancel = CancellationToken::new();
    let mut times = Vec::with_capacity(calls);
    for round in 0..calls + 5 {
        let started = Instant::now();
        let outcome = tool.call(input.clone(), &cancel).await;
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(
            matches!(outcome, ToolOutcome::Output(_)),
            "`{name}` failed: {outcome:?}"
        );
        if round >= 5 {
            times.push(elapsed);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `spool-bench echo-tool`: stdin to stdout, as a command tool.
pub(crate) fn echo_tool() -> anyhow::Result<()> {
    std::io::copy(&mut std::io::stdin().lock(), &mut std::io::stdout().lock())?;
    Ok(())
}

/// `spool-bench mcp-echo`: an MCP server on stdio with one tool, `echo`,
/// answering its arguments.
pub(crate) fn mcp_echo() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let running = Echo
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        running.waiting().await?;
        Ok(())
    })
}

#[derive(Clone, Copy)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("spool-bench-echo", "1"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), json!("object"));
        let tool = Tool::new(
            "echo",
            "Answers its arguments.",
            std::sync::Arc::new(schema),
        )
        .annotate(rmcp::model::ToolAnnotations::new().read_only(true));
        Ok(ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let echoed = serde_json::Value::Object(request.arguments.unwrap_or_default());
        Ok(CallToolResult::structured(echoed).into())
    }
}
