//! `spool agent …`: check an agent definition before running it, compare
//! two, and have a running server reload its own.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use spool_runtime::agent::AgentDefinition;

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// Load an agent definition and print what it resolves to: engine,
    /// tools and budgets. Exits 1 with the error (naming the key) when it
    /// does not load.
    Check {
        /// The definition; `spool.toml` in this directory by default.
        path: Option<PathBuf>,
    },
    /// Print the JSON Schema of `spool.toml`, for editors that complete
    /// and check TOML against one (a `#:schema ./spool.schema.json` line).
    Schema,
    /// What changed from one agent definition to another: a line per
    /// setting added (`+`), removed (`-`) or changed (`~`). Each side is a
    /// digest the journal keeps (`sha256:…`, as `spool runs list --json`
    /// and `GET /runs` show a run's) or a spool.toml file. Exits 0 when
    /// they are the same, 1 when they differ, as diff(1) does.
    Diff {
        /// The first definition: a digest or a file.
        from: String,
        /// The second.
        to: String,
        /// The journal that keeps the digests: a directory (SQLite) or a
        /// postgres:// URL.
        #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
        journal: crate::journal::JournalAt,
    },
    /// Have a running `spool serve` read its spool.toml again (as
    /// `SIGHUP` does): new runs start on the new definition, runs in
    /// flight keep theirs or move at their next turn. Needs an
    /// administrator's token; exits 1 when the server refuses the
    /// definition (it keeps the one it had).
    Reload {
        /// The server's URL.
        #[arg(long, env = "SPOOL_URL")]
        url: String,
        /// An administrator's bearer token.
        #[arg(long, env = "SPOOL_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

pub(crate) fn run(command: AgentCommand) -> anyhow::Result<ExitCode> {
    let path = match command {
        AgentCommand::Check { path } => path,
        AgentCommand::Reload { url, token } => return reload(&url, token),
        AgentCommand::Diff { from, to, journal } => return diff(&from, &to, &journal),
        AgentCommand::Schema => {
            let mut schema = spool_engines::agent_schema();
            schema["properties"]["bus"] = spool_bus::config::schema();
            schema["properties"]["telemetry"] = spool_otel::config::schema();
            schema["properties"]["mcp"] = spool_mcp::config::schema();
            schema["properties"]["a2a"] = spool_a2a::config::schema();
            let schema = serde_json::to_string_pretty(&schema)?;
            writeln!(std::io::stdout(), "{schema}")?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    let loaded = AgentDefinition::load(path.as_deref())?;
    let definition = &loaded.definition;
    let bus =
        spool_bus::config::BusSection::from_definition(definition).map_err(anyhow::Error::msg)?;
    let tools = crate::serve::tools_of(&loaded, bus.as_ref())?;
    let telemetry = spool_otel::TelemetrySection::from_definition(definition)?;
    spool_a2a::A2aSection::from_definition(definition).map_err(anyhow::Error::msg)?;
    let servers = spool_mcp::McpServers::from_definition(definition, &loaded.base)
        .map_err(anyhow::Error::msg)?;
    // Building the engine checks what a first turn would otherwise find:
    // a missing key, a bad base URL, a script that does not load.
    spool_engines::build(definition, &loaded.base)
        .with_context(|| format!("engine `{}`", definition.agent.engine))?;
    let mut out = std::io::stdout().lock();
    if let Some(note) = &loaded.note {
        writeln!(out, "note     {note}")?;
    }
    writeln!(
        out,
        "agent    {}",
        definition.agent.name.as_deref().unwrap_or("(unnamed)")
    )?;
    writeln!(out, "digest   {}", loaded.digest())?;
    writeln!(out, "engine   {}", definition.agent.engine)?;
    for spec in tools.specs() {
        let effect = tools
            .get(&spec.name)
            .map(|t| format!("{:?}", t.effect()).to_lowercase())
            .unwrap_or_default();
        writeln!(out, "tool     {} ({effect})", spec.name)?;
    }
    if let Some(bus) = &bus {
        let peers = if bus.peers.is_empty() {
            "none: the bus is off".to_owned()
        } else {
            bus.peers.join(", ")
        };
        writeln!(
            out,
            "bus      {} (listen {}; peers {peers}; max depth {})",
            bus.instance,
            bus.listen.as_deref().unwrap_or("off"),
            bus.max_depth
        )?;
    }
    if let Some(telemetry) = &telemetry {
        writeln!(
            out,
            "telemetry {}",
            telemetry
                .endpoint
                .as_deref()
                .unwrap_or("(the OTEL_EXPORTER_OTLP_* variables)")
        )?;
    }
    // Each MCP server is started and listed: a server that does not start
    // fails the check, as it would leave its tools out of every turn.
    let mut servers_ok = true;
    if !servers.is_empty() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        servers_ok = runtime.block_on(crate::mcp::report(&servers, &mut out))?;
        runtime.block_on(servers.stop());
    }
    let budgets = &definition.budgets;
    for (name, value) in [
        (
            "steps_per_turn",
            budgets.steps_per_turn.map(|v| v.to_string()),
        ),
        ("tokens", budgets.tokens.map(|v| v.to_string())),
        ("wall_seconds", budgets.wall_seconds.map(|v| v.to_string())),
        ("cost_usd", budgets.cost_usd.map(|v| v.to_string())),
    ] {
        if let Some(value) = value {
            writeln!(out, "budget   {name} = {value}")?;
        }
    }
    Ok(if servers_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `spool agent diff`.
fn diff(from: &str, to: &str, journal: &crate::journal::JournalAt) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (before, after) = runtime.block_on(async {
        anyhow::Ok((document(from, journal).await?, document(to, journal).await?))
    })?;
    let mut changes = Vec::new();
    compare("", &before, &after, &mut changes);
    let mut out = std::io::stdout().lock();
    for change in &changes {
        writeln!(out, "{change}")?;
    }
    Ok(if changes.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A definition by digest, from the journal, or from a spool.toml file.
async fn document(
    side: &str,
    journal: &crate::journal::JournalAt,
) -> anyhow::Result<serde_json::Value> {
    if side.starts_with("sha256:") {
        let store = crate::journal::open_read_only(journal).await?;
        return store
            .definition(side)
            .await?
            .with_context(|| format!("the journal {journal} keeps no agent definition {side}"));
    }
    Ok(AgentDefinition::load(Some(std::path::Path::new(side)))?.document)
}

/// Appends a line per difference between `before` and `after` at `path`.
fn compare(
    path: &str,
    before: &serde_json::Value,
    after: &serde_json::Value,
    changes: &mut Vec<String>,
) {
    use serde_json::Value;
    let at = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (before, after) {
        (Value::Object(old), Value::Object(new)) => {
            let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for key in keys {
                match (old.get(key), new.get(key)) {
                    (Some(a), Some(b)) => compare(&at(key), a, b, changes),
                    (Some(a), None) => changes.push(format!("- {} = {a}", at(key))),
                    (None, Some(b)) => changes.push(format!("+ {} = {b}", at(key))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(old), Value::Array(new)) => {
            for i in 0..old.len().max(new.len()) {
                let here = format!("{path}[{i}]");
                match (old.get(i), new.get(i)) {
                    (Some(a), Some(b)) => compare(&here, a, b, changes),
                    (Some(a), None) => changes.push(format!("- {here} = {a}")),
                    (None, Some(b)) => changes.push(format!("+ {here} = {b}")),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => changes.push(format!("~ {path}: {a} -> {b}")),
        _ => {}
    }
}

/// `spool agent reload`: the server's answer, a line a fact.
fn reload(url: &str, token: Option<String>) -> anyhow::Result<ExitCode> {
    let mut client = spool_http::Client::new(url)?;
    if let Some(token) = token {
        client = client.with_token(token);
    }
    let reloaded = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(client.reload_agent());
    let mut out = std::io::stdout().lock();
    let reloaded = match reloaded {
        Ok(reloaded) => reloaded,
        Err(error) => {
            writeln!(std::io::stderr(), "spool agent reload: {error}")?;
            return Ok(ExitCode::FAILURE);
        }
    };
    writeln!(out, "agent     {}", reloaded.agent)?;
    match &reloaded.previous {
        Some(previous) => writeln!(out, "previous  {previous}")?,
        None => writeln!(out, "previous  (unchanged)")?,
    }
    for section in &reloaded.restart_required {
        writeln!(
            out,
            "restart   [{section}] changed: it takes effect at the next start"
        )?;
    }
    for digest in reloaded.in_memory.iter().skip(1) {
        writeln!(out, "held      {digest} (runs in memory still run on it)")?;
    }
    Ok(ExitCode::SUCCESS)
}
