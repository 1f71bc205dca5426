//! `spool cluster nodes`: the members of a cluster as its PostgreSQL
//! journal holds them, read without joining (safe beside the nodes).

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;
use time::format_description::well_known::Rfc3339;

use crate::journal::JournalAt;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// One line per node: number, name, whether its lease runs, the runs
    /// it holds, its address and when it joined. A lapsed node is listed
    /// until a live one takes its runs over.
    Nodes {
        /// Print one JSON object per node instead (NDJSON): `id`, `name`,
        /// `alive`, `lease_left_ms`, `runs`, `address`, `joined_at`.
        #[arg(long)]
        json: bool,
        /// The cluster's journal: a postgres:// URL.
        #[arg(long, env = "SPOOL_JOURNAL")]
        journal: JournalAt,
    },
}

pub(crate) fn run(command: ClusterCommand) -> anyhow::Result<ExitCode> {
    let ClusterCommand::Nodes { json, journal } = command;
    let JournalAt::Postgres(url) = &journal else {
        bail!("{journal} is a SQLite journal: a cluster's journal is a postgres:// URL");
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let members = runtime
        .block_on(spool_journal_pg::cluster::members(url, None))
        .with_context(|| format!("reading the cluster at {journal}"))?;
    let mut out = std::io::stdout().lock();
    for member in &members {
        let joined = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(member.joined_at_ms) * 1_000_000,
        )
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_default();
        if json {
            let line = serde_json::json!({
                "id": member.id,
                "name": member.name,
                "alive": member.alive(),
                "lease_left_ms": member.lease_left_ms,
                "runs": member.runs,
                "address": member.address,
                "joined_at": joined,
            });
            writeln!(out, "{line}")?;
            continue;
        }
        let seconds = member.lease_left_ms as f64 / 1e3;
        let state = if member.alive() {
            format!("alive ({seconds:.1} s left)")
        } else {
            format!("lapsed {:.1} s ago", -seconds)
        };
        writeln!(
            out,
            "{:>4}  {:16}  {:22}  {:>6} runs  {:28}  joined {joined}",
            member.id,
            member.name,
            state,
            member.runs,
            member.address.as_deref().unwrap_or("-"),
        )?;
    }
    if members.is_empty() && !json {
        writeln!(
            out,
            "no nodes: no `spool serve --cluster` has joined this journal"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
