//! `spool pod serve NAME` and `spool pod list`: the Pod protocol (seed
//! 003) on a Unix socket in the pod's runtime directory, and the pods
//! found there. `spool serve --pod NAME` serves pods beside the HTTP
//! channel through [`serve_pods`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use spool_runtime::Runtime;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::serve::{load_agent, open_runtime, recover, say, shutdown_signal};

#[derive(Debug, Subcommand)]
pub(crate) enum PodCommand {
    /// Serve one pod on its Unix socket, on the local journal.
    Serve(PodServeArgs),
    /// The pods in the runtime directory, with their state.
    List {
        /// The root of the pods' runtime directories
        /// (default: $XDG_RUNTIME_DIR/spool/pods).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct PodServeArgs {
    /// The pod's name: its session is the run at the address pod/NAME.
    name: String,
    /// The journal directory.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: PathBuf,
    /// The agent definition; `./spool.toml`, or the built-in echo agent.
    #[arg(long)]
    agent: Option<PathBuf>,
    #[arg(long, value_name = "SPEC", help = spool_engines::MODEL_HELP)]
    model: Option<spool_engines::Spec>,
    /// The root of the pods' runtime directories
    /// (default: $XDG_RUNTIME_DIR/spool/pods).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
}

pub(crate) fn run(command: PodCommand) -> anyhow::Result<ExitCode> {
    match command {
        PodCommand::List { runtime_dir } => {
            let root = runtime_dir.unwrap_or_else(spool_pod::dir::default_root);
            let found = spool_pod::dir::list(&root);
            if found.is_empty() {
                say(&format!("spool: no pods in {}", root.display()));
            }
            let mut out = std::io::stdout().lock();
            for pod in found {
                let state = pod.status.as_ref().map_or("unknown", |s| s.state.as_str());
                let session = pod.status.as_ref().map_or("-", |s| s.session_id.as_str());
                let live = if pod.live { "served" } else { "not served" };
                writeln!(out, "{}\t{state}\t{live}\t{session}", pod.name)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        PodCommand::Serve(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(serve(args))
        }
    }
}

async fn serve(args: PodServeArgs) -> anyhow::Result<ExitCode> {
    let agent = load_agent(args.agent.as_deref(), args.model.as_ref())?;
    let (runtime, _owner) = open_runtime(&args.journal, &agent, None)?;
    recover(&runtime).await?;
    let (stop, closing) = watch::channel(false);
    let pods = serve_pods(
        &runtime,
        &[args.name],
        args.runtime_dir.as_deref(),
        &closing,
    )
    .await?;
    shutdown_signal().await;
    say("spool: shutting down; the pod's session stays durable in the journal");
    stop.send_replace(true);
    pods.close();
    pods.wait().await;
    Ok(ExitCode::SUCCESS)
}

/// Serves each pod of `names` in its runtime directory under `root` (the
/// default when `None`) until `closing` turns true. Every directory is set
/// up before any pod is served, so a name already served elsewhere stops
/// the start with nothing half-started.
///
/// # Errors
///
/// A bad or repeated name, a pod already served, a socket that cannot be
/// bound.
pub(crate) async fn serve_pods(
    runtime: &Runtime,
    names: &[String],
    root: Option<&Path>,
    closing: &watch::Receiver<bool>,
) -> anyhow::Result<TaskTracker> {
    let root = root.map_or_else(spool_pod::dir::default_root, Path::to_owned);
    let mut dirs = Vec::new();
    for (at, name) in names.iter().enumerate() {
        anyhow::ensure!(
            spool_pod::valid_name(name),
            "`{name}` is not a pod name: 1 to 64 of letters, digits, `-`, `_` and `.`"
        );
        anyhow::ensure!(!names[..at].contains(name), "pod `{name}` is named twice");
        dirs.push(spool_pod::dir::PodDir::create(&root, name)?);
    }
    let tasks = TaskTracker::new();
    for (name, dir) in names.iter().zip(dirs) {
        let pod = spool_pod::Pod::open(runtime.clone(), name).await?;
        say(&format!(
            "spool: pod {name} on {} (session {})",
            dir.socket().display(),
            pod.session()
        ));
        let mut closing = closing.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = closing.wait_for(|closing| *closing).await;
            };
            if let Err(error) = spool_pod::daemon::serve_in(pod.clone(), &dir, shutdown).await {
                say(&format!("spool: pod {}: {error}", pod.name()));
            }
            pod.close().await;
            drop(dir);
        });
    }
    Ok(tasks)
}
