//! `spool serve --instance NAME --bus ADDR` or `[bus]` in `spool.toml`
//! (the bus v1 server beside the HTTP channel, through [`serve_bus`]) and
//! `spool bus talk`: one delegation to another instance, its answer
//! printed.

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use spool_bus::client::Route;
use spool_bus::config::BusSection;
use spool_runtime::Runtime;
use tokio::sync::watch;

use crate::serve::{Agent, say};

/// The bus flags of `spool serve`; each overrides its key in `[bus]`.
#[derive(Clone, Debug, Args)]
pub(crate) struct BusArgs {
    /// This instance's name on the bus (`bus.instance`).
    #[arg(long)]
    instance: Option<String>,
    /// Serve the bus (seed 000) on this loopback address (`bus.listen`).
    #[arg(long, value_name = "ADDR")]
    bus: Option<String>,
    /// An instance allowed to delegate here, and to be delegated to;
    /// repeatable, `*` for any (`bus.peers`).
    #[arg(long = "bus-peer", value_name = "NAME")]
    peers: Vec<String>,
    /// The bus secret, in a file only its owner may read (0600). Without
    /// it one is made and kept in JOURNAL/bus.secret (`bus.secret_file`).
    #[arg(long, value_name = "FILE")]
    bus_secret_file: Option<PathBuf>,
    /// Delegations arriving this many hops deep are refused
    /// (`bus.max_depth`, 3 by default).
    #[arg(long)]
    bus_max_depth: Option<u64>,
    /// The registry file instances find each other in
    /// (`bus.registry`; default: $XDG_RUNTIME_DIR/spool/bus-registry.json).
    #[arg(long, value_name = "FILE")]
    bus_registry: Option<PathBuf>,
}

impl BusArgs {
    /// Lays the flags over `[bus]` (making one when the file has none and
    /// a flag names the instance).
    /// `--instance`, when given.
    pub(crate) fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    pub(crate) fn apply(&self, section: &mut Option<BusSection>) -> anyhow::Result<()> {
        if let Some(instance) = &self.instance {
            section
                .get_or_insert_with(|| BusSection::new(instance.clone()))
                .instance
                .clone_from(instance);
        }
        let given = self.bus.is_some()
            || !self.peers.is_empty()
            || self.bus_secret_file.is_some()
            || self.bus_max_depth.is_some()
            || self.bus_registry.is_some();
        let Some(section) = section else {
            anyhow::ensure!(
                !given,
                "the bus flags need this instance's name: --instance NAME, or `instance` in [bus]"
            );
            return Ok(());
        };
        if let Some(listen) = &self.bus {
            section.listen = Some(listen.clone());
        }
        if !self.peers.is_empty() {
            section.peers.clone_from(&self.peers);
        }
        if let Some(file) = &self.bus_secret_file {
            // Relative to where the command runs, as every path flag is.
            section.secret_file = Some(std::path::absolute(file)?);
        }
        if let Some(depth) = self.bus_max_depth {
            section.max_depth = depth;
        }
        if let Some(registry) = &self.bus_registry {
            section.registry = Some(registry.clone());
        }
        Ok(())
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum BusCommand {
    /// Delegate a prompt to an instance and print its answer. Exits 0 on
    /// success, 75 on a failure worth retrying later, 1 otherwise.
    Talk(TalkArgs),
    /// The instances in the registry, each with its health.
    List {
        /// The registry file
        /// (default: $XDG_RUNTIME_DIR/spool/bus-registry.json).
        #[arg(long, value_name = "FILE")]
        bus_registry: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct TalkArgs {
    /// The instance's name, as its health check must say it.
    instance: String,
    /// The prompt.
    prompt: String,
    /// The instance's bus address (loopback); found in the registry when
    /// not given.
    #[arg(long, requires = "secret_file")]
    to: Option<SocketAddr>,
    /// The instance's bus secret, in a file; with --to.
    #[arg(long, value_name = "FILE", requires = "to")]
    secret_file: Option<PathBuf>,
    /// The registry file
    /// (default: $XDG_RUNTIME_DIR/spool/bus-registry.json).
    #[arg(long, value_name = "FILE")]
    bus_registry: Option<PathBuf>,
    /// The name this delegation comes from (a peer of the instance).
    #[arg(long, default_value = "cli")]
    from: String,
    /// Hops so far, counting this one.
    #[arg(long, default_value_t = 1)]
    depth: u64,
    /// Seconds one attempt may wait for the answer.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

pub(crate) fn run(command: BusCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match command {
        BusCommand::Talk(args) => runtime.block_on(talk(args)),
        BusCommand::List { bus_registry } => runtime.block_on(list(bus_registry)),
    }
}

async fn list(registry: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let path = registry.unwrap_or_else(spool_bus::registry::default_path);
    let instances =
        spool_bus::registry::read(&path).with_context(|| format!("reading {}", path.display()))?;
    if instances.is_empty() {
        say(&format!("spool: no instances in {}", path.display()));
    }
    for (name, entry) in instances {
        let addr = SocketAddr::from(([127, 0, 0, 1], entry.port));
        let health = match spool_bus::client::check_health(addr, &name).await {
            Ok(()) => "ok".to_owned(),
            Err((_, why)) => format!("unavailable: {why}"),
        };
        crate::talk::out(
            &format!("{name}\t{addr}\tpid {}\t{health}", entry.pid),
            true,
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn talk(args: TalkArgs) -> anyhow::Result<ExitCode> {
    let route = match (args.to, &args.secret_file) {
        (Some(addr), Some(file)) => Route::Direct(spool_bus::client::Target {
            addr,
            instance: args.instance.clone(),
            secret: read_secret(file)?,
        }),
        _ => Route::Registry {
            path: args
                .bus_registry
                .clone()
                .unwrap_or_else(spool_bus::registry::default_path),
            instance: args.instance.clone(),
        },
    };
    let options = spool_bus::client::Options {
        timeout: Duration::from_secs(args.timeout),
        ..spool_bus::client::Options::default()
    };
    let answer =
        spool_bus::client::talk(&args.from, &route, &args.prompt, args.depth, None, &options).await;
    if answer.success {
        crate::talk::out(answer.text(), true);
        return Ok(ExitCode::SUCCESS);
    }
    let code = answer
        .code()
        .map_or("unknown", |c| c.as_str().to_owned().leak());
    say(&format!(
        "spool: {code}: {}",
        answer.error.as_deref().unwrap_or("the delegation failed")
    ));
    Ok(if answer.is_retryable() {
        ExitCode::from(75)
    } else {
        ExitCode::FAILURE
    })
}

/// Starts the bus server when `[bus]` (or `--bus`) says where it
/// listens; it stops when `closing` turns true. Bound before the server
/// says it listens.
///
/// # Errors
///
/// A non-loopback address, a secret file others may read, a port taken,
/// a journal whose delegated runs cannot be read for the budget.
pub(crate) async fn serve_bus(
    agent: &Agent,
    runtime: &Runtime,
    journal: &crate::journal::JournalAt,
    closing: &watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(section) = &agent.bus else {
        return Ok(None);
    };
    let Some(addr) = &section.listen else {
        return Ok(None);
    };
    let instance = &section.instance;
    let parsed: SocketAddr = addr
        .parse()
        .with_context(|| format!("`{addr}` is not a bus address (HOST:PORT)"))?;
    anyhow::ensure!(
        parsed.ip().is_loopback(),
        "the bus is loopback-only: {addr} is not a loopback address"
    );
    let (secret, secret_path) = match section.secret_path(&agent.loaded.base) {
        Some(path) => (read_secret(&path)?, path),
        None => {
            // Beside a SQLite journal; a database has no directory to
            // keep a file in.
            let crate::journal::JournalAt::Dir(dir) = journal else {
                anyhow::bail!(
                    "with a PostgreSQL journal, name the bus secret: `[bus] secret_file`"
                );
            };
            let path = dir.join("bus.secret");
            (make_secret(&path)?, path)
        }
    };
    let budget = match section.budget_usd {
        Some(cap) => {
            let definition = &agent.loaded.definition;
            // Both are checked with `[bus]`: a budget needs a turn's cap,
            // and that cap needs prices.
            let (Some(turn), Some(pricing)) =
                (definition.budgets.cost_micro_usd(), definition.pricing)
            else {
                anyhow::bail!("`bus.budget_usd` needs `budgets.cost_usd` and `[pricing]`");
            };
            let limits = spool_bus::budget::Limits {
                cap_micro_usd: (cap * 1e6).round() as u64,
                turn_micro_usd: turn,
                pricing,
            };
            let ledger = spool_bus::budget::Ledger::load(limits, runtime)
                .await
                .context("reading what delegated runs have cost")?;
            Some(ledger)
        }
        None => None,
    };
    let listener = spool_http::Listener::tcp(addr)
        .await
        .with_context(|| format!("binding the bus on {addr}"))?;
    let settings = spool_bus::Settings {
        instance: instance.clone(),
        peers: section.peers.clone(),
        max_depth: section.max_depth,
        secret,
        budget,
    };
    say(&format!(
        "spool: bus {instance} on {} (peers: {}; secret in {})",
        listener.describe(),
        if section.peers.is_empty() {
            "none, so the bus is off".to_owned()
        } else {
            section.peers.join(", ")
        },
        secret_path.display()
    ));
    let registry = section.registry_path();
    let port = listener_port(&listener)?;
    match spool_bus::registry::prune_foreign(&registry).await {
        Ok(gone) if !gone.is_empty() => say(&format!(
            "spool: dropped from {}: {} (another service, or nothing, answers on their ports)",
            registry.display(),
            gone.join(", ")
        )),
        Ok(_) => {}
        Err(error) => say(&format!("spool: reading {}: {error}", registry.display())),
    }
    spool_bus::registry::register(&registry, instance, port, &settings.secret)
        .with_context(|| format!("registering in {}", registry.display()))?;
    // Instances call the bus, never pages: no foreign origin, loopback
    // names only (the listener is loopback), JSON bodies.
    let guard = spool_http::guard::Guard::new().for_listener(&listener);
    let handler = spool_bus::BusServer::new(runtime.clone(), settings)
        .with_guard(guard)
        .handler();
    let mut closing = closing.clone();
    let instance = instance.clone();
    Ok(Some(tokio::spawn(async move {
        let shutdown = async move {
            let _ = closing.wait_for(|closing| *closing).await;
        };
        if let Err(error) = spool_http::serve(listener, handler, shutdown).await {
            say(&format!("spool: the bus stopped: {error}"));
        }
        if let Err(error) = spool_bus::registry::deregister(&registry, &instance) {
            say(&format!("spool: leaving {}: {error}", registry.display()));
        }
    })))
}

/// The port a TCP listener is bound to.
fn listener_port(listener: &spool_http::Listener) -> anyhow::Result<u16> {
    match listener {
        spool_http::Listener::Tcp(tcp) => Ok(tcp.local_addr()?.port()),
        _ => anyhow::bail!("the bus listens on TCP"),
    }
}

/// A secret from a file only its owner may read.
fn read_secret(path: &Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        meta.permissions().mode() & 0o077 == 0,
        "{} may be read by others (mode {:o}): a bus secret must be 0600",
        path.display(),
        meta.permissions().mode() & 0o777
    );
    let secret = std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .to_owned();
    anyhow::ensure!(!secret.is_empty(), "{} holds no secret", path.display());
    Ok(secret)
}

/// The secret kept at `path`, made (random, 0600) the first time.
fn make_secret(path: &Path) -> anyhow::Result<String> {
    if path.exists() {
        return read_secret(path);
    }
    let secret = spool_http::token::fresh_token().context("making a bus secret")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut file, secret.as_bytes())?;
    Ok(secret)
}
