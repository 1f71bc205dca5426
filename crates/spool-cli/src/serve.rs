//! `spool serve` and `spool token`: build the layers from flags and config,
//! and start them. No protocol or run logic lives here.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::journal::{Claim, JournalAt, Process};
use anyhow::Context;
use clap::{Args, Subcommand};
use spool_http::{HttpChannel, Listener, TokenFile};
use spool_runtime::agent::{AgentDefinition, Loaded};
use spool_runtime::{Engine, Runtime};

use crate::reload::{Builder, Reloader};

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The TCP address to listen on. Anything but loopback needs
    /// `--token-file`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// Listen on a Unix socket (created 0600) instead of TCP.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Serve HTTPS (and WSS) on `--addr` with this PEM certificate chain
    /// (the server's certificate first, then its intermediates). Renewed
    /// files are served from the next connection on, without a restart.
    #[arg(
        long,
        env = "SPOOL_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "unix"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(
        long,
        env = "SPOOL_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// The journal: a directory (SQLite) or a postgres:// URL.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: JournalAt,
    /// The agent definition; `./spool.toml`, or the built-in echo agent.
    #[arg(long)]
    pub(crate) agent: Option<PathBuf>,
    /// Require bearer tokens from this file (see `spool token new`).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[arg(long, value_name = "SPEC", help = spool_engines::MODEL_HELP)]
    pub(crate) model: Option<spool_engines::Spec>,
    /// How many runs the runtime keeps in memory between requests (a run
    /// out of it has its log read once when next touched).
    #[arg(long, env = "SPOOL_CACHED_RUNS", default_value_t = spool_runtime::DEFAULT_CACHED_RUNS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    cached_runs: u64,
    /// Who may read or drive a run: `any` caller the token file admits
    /// (the default), or only its `owner` (the token that created it) and
    /// tokens made with `spool token new --admin`. `owner` needs
    /// `--token-file`.
    #[arg(long, value_enum, default_value = "any")]
    run_access: RunAccessArg,
    /// Let pages on this origin (`scheme://host[:port]`) use the API from
    /// a browser, with CORS answers; repeatable, added to `[server]
    /// allow_origins`. Without it only the server's own origin is served
    /// to a browser.
    #[arg(long = "allow-origin", value_name = "URL")]
    allow_origins: Vec<String>,
    /// Serve requests whose `Host` is NAME; repeatable, added to
    /// `[server] allow_hosts`. On loopback, only loopback names are served
    /// besides these; elsewhere, these alone when any are given.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// Also serve pod NAME (seed 003) on a Unix socket in its runtime
    /// directory; repeatable.
    #[arg(long = "pod", value_name = "NAME")]
    pods: Vec<String>,
    /// The root of the pods' runtime directories
    /// (default: $XDG_RUNTIME_DIR/spool/pods).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// Do not serve the web console at `/` (the API is served either way).
    #[arg(long)]
    no_console: bool,
    #[command(flatten)]
    pub(crate) bus: crate::bus::BusArgs,
    #[command(flatten)]
    cluster: crate::journal::ClusterArgs,
}

/// `--run-access`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum RunAccessArg {
    Any,
    Owner,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a token named NAME, add its hash to the token file, and print
    /// the token (the only time it is shown).
    New {
        /// The token's name (the principal's id).
        name: String,
        /// An administrator's token: it reaches every run under
        /// `spool serve --run-access owner`.
        #[arg(long)]
        admin: bool,
        /// A token that may trigger schedules (`POST
        /// /spool/v1/schedules/NAME/trigger`).
        #[arg(long)]
        trigger: bool,
        /// The token file.
        #[arg(long, default_value = ".spool/tokens")]
        token_file: PathBuf,
    },
    /// List the tokens in the file: names, scopes and fingerprints (never
    /// a token).
    List {
        /// The token file.
        #[arg(long, default_value = ".spool/tokens")]
        token_file: PathBuf,
    },
    /// Remove the token named NAME. A server using the file refuses it
    /// within a second, and ends the streams and WebSockets it opened.
    Revoke {
        /// The token's name.
        name: String,
        /// The token file.
        #[arg(long, default_value = ".spool/tokens")]
        token_file: PathBuf,
    },
}

pub(crate) fn token(command: TokenCommand) -> anyhow::Result<ExitCode> {
    let (name, admin, trigger, token_file) = match command {
        TokenCommand::New {
            name,
            admin,
            trigger,
            token_file,
        } => (name, admin, trigger, token_file),
        TokenCommand::List { token_file } => {
            let mut out = std::io::stdout().lock();
            for token in TokenFile::list(&token_file)? {
                let scopes = if token.scopes.is_empty() {
                    "-".to_owned()
                } else {
                    token.scopes.join(",")
                };
                writeln!(out, "{}\t{}\t{scopes}", token.name, token.fingerprint)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        TokenCommand::Revoke { name, token_file } => {
            if TokenFile::revoke(&token_file, &name)? {
                say(&format!(
                    "spool: token `{name}` revoked in {}",
                    token_file.display()
                ));
                return Ok(ExitCode::SUCCESS);
            }
            say(&format!(
                "spool: no token `{name}` in {}",
                token_file.display()
            ));
            return Ok(ExitCode::from(1));
        }
    };
    if let Some(dir) = token_file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let scopes: Vec<&str> = [
        (admin, spool_http::token::ADMIN_ATTRIBUTE),
        (trigger, spool_http::token::TRIGGER_ATTRIBUTE),
    ]
    .into_iter()
    .filter_map(|(on, scope)| on.then_some(scope))
    .collect();
    let token = TokenFile::issue_scoped(&token_file, &name, &scopes)?;
    writeln!(std::io::stdout(), "{token}")?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if matches!(args.run_access, RunAccessArg::Owner) && args.token_file.is_none() {
        // Without an authenticator no caller is proven, and every run
        // would be out of everyone's reach.
        say(
            "spool: --run-access owner needs --token-file: runs belong to the tokens that create them",
        );
        return Ok(ExitCode::from(2));
    }
    let mut agent = load_agent_as(
        args.agent.as_deref(),
        args.model.as_ref(),
        args.bus.instance(),
    )?;
    args.bus.apply(&mut agent.bus)?;
    let guard = guard(
        &agent.loaded.definition,
        &args.allow_origins,
        &args.allow_hosts,
    )?;
    let tokens = match &args.token_file {
        Some(path) => {
            let tokens = TokenFile::load(path)?;
            // Read again as it changes: a revoked token is refused, and
            // its sessions end, without a restart.
            tokens.watch(spool_http::token::RELOAD_PERIOD);
            Some(Arc::new(tokens))
        }
        None => None,
    };
    let listener = match &args.unix {
        Some(path) => {
            Listener::unix(path).with_context(|| format!("binding {}", path.display()))?
        }
        None => {
            let addr: SocketAddr = args
                .addr
                .parse()
                .with_context(|| format!("`{}` is not an address", args.addr))?;
            // Checked before anything is opened; the channel checks again.
            spool_http::server::check_exposure(addr, tokens.is_some())?;
            let bound = match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => {
                    let config = spool_http::tls::CertificateFiles::load(cert, key)
                        .context("--tls-cert and --tls-key")?
                        .server_config()?;
                    Listener::tls(&args.addr, config).await
                }
                _ => Listener::tcp(&args.addr).await,
            };
            bound.with_context(|| format!("binding {}", args.addr))?
        }
    };
    let scheme = match &listener {
        Listener::Tls(..) => "https",
        _ => "http",
    };
    let cached_runs = usize::try_from(args.cached_runs).unwrap_or(usize::MAX);
    // Every agent this server runs is built alike: the one it starts
    // with, a reload's, and the older ones runs still run on.
    let agents = Builder::new(
        agent.loaded.base.clone(),
        args.bus.instance().map(str::to_owned),
        Some(args.bus.clone()),
    );
    // On a cluster, the scheduler learns of schedules whose record run
    // this node takes over; it starts after the first takeover.
    let scheduler_slot = Arc::new(std::sync::OnceLock::new());
    let mut taken = Vec::new();
    // A single server lists its journal before it listens and recovers
    // its runs once it accepts requests (see `Runtime::recovery`).
    let mut recovery = None;
    let (runtime, owner, resumed) = if args.cluster.cluster {
        // A node drives only the runs it holds leases on: recovery is a
        // takeover of the runs of nodes that died, repeated as long as it
        // serves.
        let advertised = args.cluster.advertised(&listener.describe(), scheme)?;
        let (store, node) =
            crate::journal::open_node(&args.journal, &args.cluster, &advertised).await?;
        let runtime =
            build_runtime(store, &agent, Some(cached_runs), true, Arc::clone(&agents)).await?;
        let (first, resumed) =
            crate::journal::keep_node(node.clone(), runtime.clone(), scheduler_slot.clone())
                .await?;
        taken = first;
        (runtime, Claim::Node(node), resumed)
    } else {
        let (runtime, owner) = open_runtime_with(
            &args.journal,
            &agent,
            Some(cached_runs),
            Process::Serving,
            Arc::clone(&agents),
        )
        .await?;
        let plan = runtime.recovery().await?;
        let interrupted = plan.interrupted();
        recovery = Some(plan);
        (runtime, owner, interrupted)
    };
    // A firing in doubt is settled against each run's log as the crash
    // left it: its input recorded (queued or started) is delivered, and
    // recovery starts a queued one whichever reads the run first.
    let schedules = &agent.loaded.definition.schedules;
    let scheduler = spool_runtime::Scheduler::start(
        &runtime,
        schedules,
        spool_runtime::schedule::Clock::system(),
    )
    .await
    .context("starting the schedules")?;
    if let Claim::Node(node) = &owner {
        // A firing for an address whose run another node drives is
        // delivered by that node; set before the takeover below fires.
        scheduler.relay_through(Arc::new(spool_http::forward::HttpRelay::new(
            Arc::new(crate::journal::Placement(node.clone())),
            node.secret(),
        )));
    }
    if !taken.is_empty() {
        scheduler
            .taken_over(&taken)
            .await
            .context("settling the schedules of the runs taken over")?;
    }
    let _ = scheduler_slot.set(scheduler.clone());
    let (stop, closing) = tokio::sync::watch::channel(false);
    // On a cluster one node sweeps: the live node with the lowest number.
    let sweeps_here = match &owner {
        Claim::Node(node) => Some(Arc::clone(node)),
        _ => None,
    };
    let sweeper = sweep(
        &runtime,
        &agent.loaded.definition.retention,
        sweeps_here,
        &closing,
    );
    let pods =
        crate::pod::serve_pods(&runtime, &args.pods, args.runtime_dir.as_deref(), &closing).await?;
    let bus = crate::bus::serve_bus(&agent, &runtime, &args.journal, &closing).await?;
    // JSON-RPC (seed 001) on the same listener, behind the same
    // authenticator: /version, /events (SSE), /stream (NDJSON).
    let access = match args.run_access {
        RunAccessArg::Any => spool_runtime::RunAccess::Any,
        RunAccessArg::Owner => spool_runtime::RunAccess::Owner,
    };
    let rpc = spool_rpc::Dispatcher::new(runtime.clone()).with_run_access(access);
    // MCP's Streamable HTTP (`/mcp`), behind the same guard and tokens.
    let mcp = spool_mcp::serve::route(
        &spool_mcp::serve::RunsServer::new(runtime.clone(), access),
        &closing,
    );
    // A2A (both bindings at `/a2a`, the card at the well-known paths),
    // behind the same guard, tokens and ownership rules.
    let a2a_section = spool_a2a::A2aSection::from_definition(&agent.loaded.definition)
        .map_err(anyhow::Error::msg)?;
    let a2a = spool_a2a::A2aServer::new(runtime.clone(), access, closing.clone())
        .with_card(a2a_section, agent.loaded.definition.agent.name.clone())
        .with_tokens(tokens.is_some())
        .with_tls(scheme == "https");
    // Push notifications a restart left undelivered go out again. A
    // journal that cannot say which (a cluster node whose registry run
    // another node drives) does not stop the server.
    match a2a.resume_push().await {
        Ok(0) => {}
        Ok(resumed) => say(&format!(
            "spool: resuming {resumed} A2A push notification configs"
        )),
        Err(error) => say(&format!(
            "spool: A2A push notifications left undelivered by the last run are not resumed here: {error}"
        )),
    }
    // The agent definition is read again on SIGHUP and on an
    // administrator's `POST /agent/reload`.
    let reloader = Reloader::new(&args, &agent, runtime.clone(), agents);
    reloader.on_hangup()?;
    // Kept to stop the runtime's own tasks once nothing takes requests.
    let lifecycle = runtime.clone();
    let mut channel = HttpChannel::new(runtime, closing.clone())
        .with_run_access(access)
        .with_guard(guard)
        .with_agent(agent.loaded.definition.agent.name.clone())
        .with_schedules(scheduler)
        .with_reload(reloader.route());
    if !args.no_console {
        channel = channel.with_console();
    }
    for (prefix, handler) in spool_rpc::http::routes(&rpc, &closing) {
        channel = channel.mount(prefix, handler)?;
    }
    channel = channel
        .mount("/mcp", mcp)?
        .mount(spool_a2a::PREFIX, a2a.route())?
        .mount_public(spool_wire::a2a::CARD_PATH, a2a.card_route())?
        .mount_public(spool_wire::a2a::LEGACY_CARD_PATH, a2a.card_route())?;
    if let Some(tokens) = tokens {
        // Triggers need a proven caller: tokens with the `trigger` scope
        // (or an administrator's).
        channel = channel
            .with_authenticator(tokens)
            .with_trigger_authorizer(spool_http::token::trigger_authorizer());
    }
    if !schedules.is_empty() {
        let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
        say(&format!("spool: schedules: {}", names.join(", ")));
    }
    if let Claim::Node(node) = &owner {
        // A command for a run another node drives is answered by that
        // node, and a firing for a run this node drives is delivered here.
        channel = channel
            .with_placement(Arc::new(crate::journal::Placement(node.clone())))
            .with_cluster_secret(node.secret());
    }
    let signals = Signals::install();
    let tls = if scheme == "https" { " over TLS" } else { "" };
    say(&format!(
        "spool: listening on {}{tls} (journal {}, {resumed} runs resumed)",
        listener.describe(),
        args.journal
    ));
    if let Listener::Tcp(_) | Listener::Tls(..) = &listener {
        let auth = if args.token_file.is_some() {
            " -H 'Authorization: Bearer <token>'"
        } else {
            ""
        };
        let (place, named) = match &listener {
            // The certificate is for names, which this line cannot know.
            Listener::Tls(tcp, _) => (
                tcp.local_addr()
                    .map_or_else(|_| "HOST".into(), |a| format!("HOST:{}", a.port())),
                " (HOST: a name the certificate is for)",
            ),
            _ => (listener.describe(), ""),
        };
        say(&format!(
            "spool: try: curl -s {scheme}://{place}/spool/v1/runs{auth} -H 'Content-Type: application/json' -d '{{\"text\": \"hello\"}}'{named}",
        ));
        if !args.no_console {
            say(&format!("spool: console: {scheme}://{place}/{named}"));
        }
    }
    // Held to the end of this function, past the graceful drain; the
    // shutdown future only watches it.
    let owner = Arc::new(owner);
    let watched = Arc::clone(&owner);
    let shutdown = async move {
        let owner = watched;
        tokio::select! {
            () = signals.received() => {
                say("spool: shutting down; runs stay durable in the journal");
            }
            // Another process may take the journal now: driving its runs
            // from here too could run a tool twice.
            () = owner.lost() => {
                say("spool: the claim on the journal was lost (its database connection ended); shutting down");
            }
        }
        if let Claim::Node(node) = &*owner {
            // The other nodes take this one's runs over at once, not
            // after the lease.
            if let Err(error) = node.leave().await {
                say(&format!("spool: leaving the cluster: {error}"));
            }
        }
        stop.send_replace(true);
    };
    if let Some(plan) = recovery {
        // Started here, just before the channel accepts: the accept loop
        // is armed before the drivers queue up. A stop ends the reading
        // where it is; the next start reads again.
        let mut closing = closing.clone();
        tokio::spawn(async move {
            let interrupted = plan.interrupted();
            tokio::select! {
                recovery = plan.run() => {
                    if let Ok(resumed) = report(recovery)
                        && resumed > interrupted
                    {
                        say(&format!(
                            "spool: recovery read the journal: {} more runs resumed (sleeps re-armed, cancels applied, queued input started)",
                            resumed - interrupted
                        ));
                    }
                }
                _ = closing.wait_for(|closing| *closing) => {}
            }
        });
    }
    channel.serve(listener, shutdown).await?;
    pods.close();
    pods.wait().await;
    if let Some(bus) = bus {
        let _ = bus.await;
    }
    if let Some(sweeper) = sweeper {
        let _ = sweeper.await;
    }
    // Drivers, timers and schedules stop where they are (the journal keeps
    // them for the next start); the journal closes as the last handle
    // goes, and the SQLite store empties its write-ahead log then.
    lifecycle.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// How many runs one sweep deletes before the sweeper looks at the
/// clock again; a sweep that deleted this many sweeps again at once.
const SWEEP_BATCH: usize = 256;

/// The retention sweeper: every [`Retention::period`] (a tenth of the
/// shortest retention, between 1 s and 1 min), the runs past their
/// retention are deleted, in batches, until `closing` says stop; `None`
/// when `[retention]` deletes nothing.
///
/// [`Retention::period`]: spool_runtime::retention::Retention::period
fn sweep(
    runtime: &spool_runtime::Runtime,
    retention: &spool_runtime::retention::Retention,
    node: Option<Arc<spool_journal_pg::cluster::Cluster>>,
    closing: &tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let period = retention.period()?;
    say(&format!(
        "spool: retention: runs that ended are deleted once past [retention] (checked every {} s{})",
        period.as_secs(),
        if node.is_some() {
            ", by one node of the cluster at a time"
        } else {
            ""
        }
    ));
    let (runtime, retention, mut closing) = (runtime.clone(), retention.clone(), closing.clone());
    Some(tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
            if let Some(node) = &node {
                match node.sweeps().await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(error) => {
                        tracing::warn!(target: "spool::retention", %error, "whether this node sweeps cannot be read; it asks again");
                        continue;
                    }
                }
            }
            loop {
                let now = time::OffsetDateTime::now_utc();
                match runtime.sweep(&retention, now, SWEEP_BATCH).await {
                    Ok(swept) => {
                        if swept.deleted > 0 {
                            tracing::info!(target: "spool::retention", deleted = swept.deleted, left = swept.left, "runs past their retention deleted");
                        }
                        if swept.deleted < SWEEP_BATCH || *closing.borrow() {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(target: "spool::retention", %error, "the retention sweep could not list the runs; it tries again");
                        break;
                    }
                }
            }
        }
    }))
}

/// The origin, host and content-type rules every HTTP surface applies:
/// `[server]`'s lists, and the flags' added to them.
fn guard(
    definition: &AgentDefinition,
    origins: &[String],
    hosts: &[String],
) -> anyhow::Result<spool_http::guard::Guard> {
    let (mut all_origins, mut all_hosts) = (Vec::new(), Vec::new());
    for (key, value) in definition.server.iter().flatten() {
        let list = match key.as_str() {
            "allow_origins" => &mut all_origins,
            "allow_hosts" => &mut all_hosts,
            other => anyhow::bail!(
                "unknown key `server.{other}`: [server] takes allow_origins and allow_hosts"
            ),
        };
        let items = value
            .as_array()
            .with_context(|| format!("`server.{key}` must be a list of strings"))?;
        for item in items {
            let item = item
                .as_str()
                .with_context(|| format!("`server.{key}` must be a list of strings"))?;
            list.push(item.to_owned());
        }
    }
    all_origins.extend(origins.iter().cloned());
    all_hosts.extend(hosts.iter().cloned());
    let mut guard = spool_http::guard::Guard::new();
    for origin in &all_origins {
        guard = guard.allow_origin(origin)?;
    }
    for host in &all_hosts {
        guard = guard.allow_host(host)?;
    }
    Ok(guard)
}

/// An agent definition, the engine it names, built, and its `[bus]`.
pub(crate) struct Agent {
    pub(crate) loaded: Loaded,
    pub(crate) engine: Arc<dyn Engine>,
    /// `[bus]`, with `spool serve`'s bus flags applied.
    pub(crate) bus: Option<spool_bus::config::BusSection>,
}

/// An agent's tools: the definition's, and `delegate` when `[bus]` turns
/// it on.
pub(crate) fn tools_of(
    loaded: &Loaded,
    bus: Option<&spool_bus::config::BusSection>,
) -> anyhow::Result<spool_runtime::Tools> {
    let mut tools = loaded.definition.tools(&loaded.base)?;
    if let Some(bus) = bus.filter(|bus| bus.delegate) {
        tools.add(Arc::new(spool_bus::tool::Delegate::new(bus)))?;
    }
    let a2a =
        spool_a2a::A2aSection::from_definition(&loaded.definition).map_err(anyhow::Error::msg)?;
    if let Some(send) = spool_a2a::peer::tool(&a2a, &loaded.base) {
        tools.add(send)?;
    }
    Ok(tools)
}

/// The agent definition (`path`, `./spool.toml`, or the built-in echo
/// agent) with `--model` in place of its engine, and that engine built:
/// a missing key or a bad base URL is refused here, before any turn. The
/// spec is parsed once, here, by `spool_engines`' own type.
pub(crate) fn load_agent(
    path: Option<&Path>,
    model: Option<&spool_engines::Spec>,
) -> anyhow::Result<Agent> {
    load_agent_as(path, model, None)
}

/// [`load_agent`], with `instance` (`--instance`) as the bus instance's
/// name: a `[bus]` table may leave its name to the flag.
pub(crate) fn load_agent_as(
    path: Option<&Path>,
    model: Option<&spool_engines::Spec>,
    instance: Option<&str>,
) -> anyhow::Result<Agent> {
    let mut loaded = AgentDefinition::load(path)?;
    let spec = match model {
        Some(model) => {
            loaded.set_engine(model.to_string());
            // A script or program named on the command line is found from
            // here, not from the definition's directory.
            if model.reads_files() {
                loaded.base = std::env::current_dir().context("reading the current directory")?;
            }
            model.clone()
        }
        None => loaded
            .definition
            .agent
            .engine
            .parse()
            .with_context(|| format!("engine `{}`", loaded.definition.agent.engine))?,
    };
    if let Some(note) = &loaded.note {
        match model {
            // The note names the echo engine; `--model` replaced it.
            Some(model) => say(&format!(
                "spool: no {} here: using the built-in tools with the engine `{model}`",
                spool_runtime::agent::DEFAULT_FILE
            )),
            None => say(&format!("spool: {note}")),
        }
    }
    built(loaded, &spec, instance)
}

/// The agent `loaded` defines, with its engine (`spec`) built and its
/// `[bus]` read (`instance` naming the bus instance a table leaves to the
/// flag): what a start, a reload and a run's older definition all make.
pub(crate) fn built(
    loaded: Loaded,
    spec: &spool_engines::Spec,
    instance: Option<&str>,
) -> anyhow::Result<Agent> {
    let engine =
        spool_engines::build_spec(spec, &loaded.definition.provider, &loaded.base, &|name| {
            std::env::var(name).ok()
        })
        .with_context(|| format!("engine `{spec}`"))?;
    let bus = spool_bus::config::BusSection::from_definition_as(&loaded.definition, instance)
        .map_err(anyhow::Error::msg)?;
    Ok(Agent {
        loaded,
        engine,
        bus,
    })
}

/// The runtime on the journal at `journal`, running `agent`, and this
/// process's claim on the journal: hold it as long as the runtime runs,
/// so no second process resumes the same turns.
pub(crate) async fn open_runtime(
    journal: &JournalAt,
    agent: &Agent,
    cached_runs: Option<usize>,
    process: Process,
) -> anyhow::Result<(Runtime, Claim)> {
    let builder = Builder::new(agent.loaded.base.clone(), None, None);
    open_runtime_with(journal, agent, cached_runs, process, builder).await
}

/// [`open_runtime`], building agents with `builder`.
async fn open_runtime_with(
    journal: &JournalAt,
    agent: &Agent,
    cached_runs: Option<usize>,
    process: Process,
    builder: Arc<Builder>,
) -> anyhow::Result<(Runtime, Claim)> {
    let (store, owner) = crate::journal::open_owned(journal, process).await?;
    Ok((
        build_runtime(store, agent, cached_runs, false, builder).await?,
        owner,
    ))
}

/// The runtime on `store`, running `agent`; `shared` when other nodes
/// append to the journal too. Runs started on other definitions run on
/// theirs, built by `agents` from the journal's copy.
async fn build_runtime(
    store: Arc<dyn spool_journal::Journal>,
    agent: &Agent,
    cached_runs: Option<usize>,
    shared: bool,
    agents: Arc<Builder>,
) -> anyhow::Result<Runtime> {
    let store = crate::telemetry::observe(&agent.loaded, store)?;
    // The `[[mcp]]` servers are started and listed before the first turn;
    // one that does not answer yet is tried again in the background.
    let spec = agents.spec(agent).await?;
    let mut builder = Runtime::builder(store)
        .agent_spec(spec)
        .agent_factory(agents)
        .shared_journal(shared);
    if let Some(runs) = cached_runs {
        builder = builder.cached_runs(runs);
    }
    let runtime = builder.build();
    crate::telemetry::watch(&runtime);
    Ok(runtime)
}

/// Resumes the journal's interrupted runs; says which runs could not be
/// read (they answer `conversation_corrupt`; `spool runs show` tells why).
pub(crate) async fn recover(runtime: &Runtime) -> anyhow::Result<usize> {
    report(runtime.recover().await?)
}

/// Resumes the journal's runs cut off mid-turn only (see
/// `Runtime::recover_interrupted`); says which could not be read.
pub(crate) async fn recover_interrupted(runtime: &Runtime) -> anyhow::Result<usize> {
    report(runtime.recover_interrupted().await?)
}

/// Says which runs could not be read; the number resumed.
fn report(recovery: spool_runtime::Recovery) -> anyhow::Result<usize> {
    for (run, error) in &recovery.unreadable {
        say(&format!(
            "spool: run {run} cannot be read and is left as it is: {error}"
        ));
    }
    Ok(recovery.resumed)
}

/// SIGINT and SIGTERM, caught from the moment [`Signals::install`] is
/// called: a server installs them before it says it listens, so a stop
/// sent the instant it is up (an orchestrator's, a test's) is a graceful
/// one, not the default action's kill.
pub(crate) struct Signals(Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>);

impl Signals {
    pub(crate) fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(interrupt), Ok(terminate)) => Self(Some((interrupt, terminate))),
            // Without signal handlers the server still serves; it stops
            // when killed.
            _ => Self(None),
        }
    }

    /// Waits for either signal.
    pub(crate) async fn received(self) {
        let Some((mut interrupt, mut terminate)) = self.0 else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
}

#[allow(
    clippy::print_stderr,
    reason = "the server's progress lines for its operator"
)]
pub(crate) fn say(line: &str) {
    eprintln!("{line}");
}
