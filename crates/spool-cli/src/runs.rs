//! `spool runs …`: read a journal directly, even while a server has it
//! open (read-only: `list` and `show` change nothing), and fork or delete
//! runs, through a server (`--url`) or on a journal no server holds.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;
use spool_journal::fold::{Status, fold};
use spool_journal::{Journal, RunId, Seq};

use crate::journal::{JournalAt, open_read_only};
use time::format_description::well_known::Rfc3339;

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// One line per run: id, state, last update, the agent definition's
    /// digest (its first 12 hex digits), title; newest first.
    List {
        /// Print one JSON object per run instead (NDJSON): `run_id`,
        /// `state`, `waiting_for` (when waiting), `title`, `created_at`,
        /// `updated_at`, `events`, `agent` (the definition's digest).
        #[arg(long)]
        json: bool,
        /// The journal: a directory (SQLite) or a postgres:// URL.
        #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
        journal: JournalAt,
    },
    /// A run's folded state and its whole event log.
    Show {
        /// The run: its id, or an address leading to it (`NAMESPACE/NAME`,
        /// such as `http/desk` or a delegated run's `bus/FROM/ID`).
        run: String,
        /// Print the envelopes as NDJSON instead.
        #[arg(long)]
        json: bool,
        /// The journal: a directory (SQLite) or a postgres:// URL.
        #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
        journal: JournalAt,
    },
    /// A new run holding RUN's history through a turn's end (`--after`)
    /// or up to its start (`--before`); prints the fork's id. Nothing of
    /// RUN runs again.
    Fork {
        /// The run to fork.
        run: String,
        /// Through this turn's end.
        #[arg(long, conflicts_with = "before", required_unless_present = "before")]
        after: Option<String>,
        /// Up to this turn's start.
        #[arg(long)]
        before: Option<String>,
        /// The fork's title; the source's by default.
        #[arg(long)]
        title: Option<String>,
        #[command(flatten)]
        through: Through,
    },
    /// Deletes runs: those named, and with `--older-than` every run in a
    /// state of `--state` whose last event is older than that. Each
    /// leaves a tombstone; its events are gone for good. Prints a line
    /// per run.
    Delete {
        /// Runs to delete, by id.
        runs: Vec<String>,
        /// Also every run last updated longer ago than this: `30d`, `12h`,
        /// `15m`, `2s`, `1w`.
        #[arg(long, value_parser = spool_runtime::retention::parse_age)]
        older_than: Option<std::time::Duration>,
        /// With `--older-than`: the states deleted, comma-separated
        /// (`completed,failed,cancelled` by default; also `retired`,
        /// `idle`).
        #[arg(long, value_delimiter = ',', requires = "older_than")]
        state: Vec<String>,
        /// Print what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Cancel a turn in progress first, rather than leave its run.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        through: Through,
    },
}

/// Where a command that changes runs is carried out: through a server,
/// or on a journal no server holds.
#[derive(Debug, clap::Args)]
pub(crate) struct Through {
    /// A server's URL: work through it (its journal is its own). Without
    /// it, the journal is opened here, and must not be a running server's.
    #[arg(long, env = "SPOOL_URL")]
    url: Option<String>,
    /// A bearer token for the server.
    #[arg(long, env = "SPOOL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The journal (without `--url`): a directory (SQLite) or a
    /// postgres:// URL.
    #[arg(long, env = "SPOOL_JOURNAL", default_value = ".spool")]
    journal: JournalAt,
}

impl Through {
    /// A client of the server, when one was named.
    fn client(&self) -> anyhow::Result<Option<spool_http::Client>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let mut client = spool_http::Client::new(url)?;
        if let Some(token) = &self.token {
            client = client.with_token(token.clone());
        }
        Ok(Some(client))
    }
}

pub(crate) fn run(command: RunsCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        match command {
            RunsCommand::List { json, journal } => {
                list(&*open_read_only(&journal).await?, json).await
            }
            RunsCommand::Show { run, json, journal } => {
                show(&*open_read_only(&journal).await?, &journal, &run, json).await
            }
            RunsCommand::Fork {
                run,
                after,
                before,
                title,
                through,
            } => {
                let fork = spool_wire::http::Fork {
                    after,
                    before,
                    title,
                };
                fork_run(&run, fork, &through).await
            }
            RunsCommand::Delete {
                runs,
                older_than,
                state,
                dry_run,
                force,
                through,
            } => {
                if runs.is_empty() && older_than.is_none() {
                    bail!("name the runs to delete, or give --older-than");
                }
                let states = if state.is_empty() {
                    vec!["completed".into(), "failed".into(), "cancelled".into()]
                } else {
                    state
                };
                let asked = Deleting {
                    runs,
                    older_than,
                    states,
                    dry_run,
                    force,
                };
                match through.client()? {
                    Some(client) => delete_through(&client, asked).await,
                    None => delete_here(&through.journal, asked).await,
                }
            }
        }
    })
}

/// What `spool runs delete` was asked.
struct Deleting {
    runs: Vec<String>,
    older_than: Option<std::time::Duration>,
    states: Vec<String>,
    dry_run: bool,
    force: bool,
}

impl Deleting {
    /// Whether a run in `state`, last updated at `updated`, is past
    /// `--older-than`.
    fn old(&self, state: &str, updated: time::OffsetDateTime) -> bool {
        self.older_than.is_some_and(|age| {
            self.states.iter().any(|s| s == state)
                && time::OffsetDateTime::now_utc() - updated >= age
        })
    }
}

/// Prints one run's outcome; whether it went.
fn report(run: &str, outcome: Result<Option<u64>, String>) -> bool {
    // A closed stdout or stderr loses a line, not the deletions.
    let _ = match &outcome {
        Ok(Some(events)) => writeln!(
            std::io::stdout().lock(),
            "{run}  deleted  ({events} events)"
        ),
        Ok(None) => writeln!(std::io::stdout().lock(), "{run}  would be deleted"),
        Err(error) => writeln!(std::io::stderr().lock(), "{run}  not deleted: {error}"),
    };
    outcome.is_ok()
}

/// `spool runs delete --url`: the runs listed by the server, deleted
/// through it (ownership as the token has it).
async fn delete_through(client: &spool_http::Client, asked: Deleting) -> anyhow::Result<ExitCode> {
    let mut chosen = asked.runs.clone();
    if asked.older_than.is_some() {
        let mut after: Option<String> = None;
        loop {
            let page = match &after {
                Some(after) => format!("/runs?order=oldest&limit=1000&after={after}"),
                None => "/runs?order=oldest&limit=1000".to_owned(),
            };
            let list: spool_wire::http::RunList = client.get(&page).await?;
            for row in &list.runs {
                let updated = row
                    .updated
                    .as_deref()
                    .and_then(|at| time::OffsetDateTime::parse(at, &Rfc3339).ok());
                if updated.is_some_and(|at| asked.old(row.state.as_str(), at))
                    && !chosen.contains(&row.id)
                {
                    chosen.push(row.id.clone());
                }
            }
            match list.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    let mut all = true;
    for run in &chosen {
        let outcome = if asked.dry_run {
            Ok(None)
        } else {
            client
                .delete(run, asked.force)
                .await
                .map(|gone| Some(gone.events))
                .map_err(|e| e.to_string())
        };
        all &= report(run, outcome);
    }
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `spool runs delete` on a journal no server holds.
async fn delete_here(journal: &JournalAt, asked: Deleting) -> anyhow::Result<ExitCode> {
    let (store, _owner) =
        crate::journal::open_owned(journal, crate::journal::Process::OneShot).await?;
    let mut chosen: Vec<String> = asked.runs.clone();
    if asked.older_than.is_some() {
        let mut listed = store.runs().await?;
        listed.reverse();
        for run in listed {
            if asked.old(run.status.state().as_str(), run.updated_at)
                && !chosen.iter().any(|id| id == run.run_id.as_str())
            {
                chosen.push(run.run_id.to_string());
            }
        }
    }
    // A deletion calls no model and no tool: the runtime needs the
    // journal alone.
    let runtime = spool_runtime::Runtime::builder(store).build();
    let mut all = true;
    for run in &chosen {
        let outcome = match RunId::new(run) {
            Err(error) => Err(error.to_string()),
            Ok(_) if asked.dry_run => Ok(None),
            Ok(id) => runtime
                .delete(
                    &id,
                    spool_runtime::DeleteRequest {
                        by: "operator".into(),
                        reason: None,
                        force: asked.force,
                        expected: None,
                    },
                )
                .await
                .map(|gone| Some(gone.events))
                .map_err(|e| e.to_string()),
        };
        all &= report(run, outcome);
    }
    runtime.shutdown().await;
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The digest of the agent definition `run` runs on: the last it moved to
/// (`agent_changed`), else the one its `run_created` names (the run's log
/// is read for it).
async fn agent_of(journal: &dyn Journal, run: &RunId) -> anyhow::Result<Option<String>> {
    Ok(journal
        .read(run, Seq(0))
        .await?
        .into_iter()
        .filter_map(|envelope| match envelope.event {
            spool_journal::Event::RunCreated(created) => created.agent,
            spool_journal::Event::AgentChanged(changed) => Some(changed.to),
            _ => None,
        })
        .last())
}

/// A digest as the list shows it: its first 12 hex digits.
fn short(digest: Option<&str>) -> &str {
    digest.map_or("-", |digest| {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        hex.get(..12).unwrap_or(hex)
    })
}

async fn list(journal: &dyn Journal, json: bool) -> anyhow::Result<ExitCode> {
    let runs = journal.runs().await?;
    let mut out = std::io::stdout().lock();
    if json {
        for run in runs {
            let agent = agent_of(journal, &run.run_id).await?;
            let mut line = serde_json::json!({
                "run_id": run.run_id.as_str(),
                "state": run.status.state().as_str(),
                "created_at": run.created_at.format(&Rfc3339)?,
                "updated_at": run.updated_at.format(&Rfc3339)?,
                "events": run.next_seq.0,
            });
            if let Status::Waiting(kind) = &run.status {
                line["waiting_for"] = kind.as_str().into();
            }
            if let Some(title) = run.title {
                line["title"] = title.into();
            }
            if let Some(agent) = agent {
                line["agent"] = agent.into();
            }
            writeln!(out, "{line}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let width = runs
        .iter()
        .map(|r| r.run_id.as_str().len())
        .max()
        .unwrap_or(0)
        .max(3);
    for run in runs {
        let agent = agent_of(journal, &run.run_id).await?;
        writeln!(
            out,
            "{:width$}  {:24}  {:20}  {:12}  {}",
            run.run_id.as_str(),
            describe(&run.status),
            run.updated_at.format(&Rfc3339).unwrap_or_default(),
            short(agent.as_deref()),
            run.title.unwrap_or_default(),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(
    journal: &dyn Journal,
    at: &JournalAt,
    run: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // A run id, or an address (`NAMESPACE/NAME`: `http/desk`,
    // `bus/reviewer/d-42` for a delegated run) leading to one.
    let run = match run.split_once('/') {
        Some((namespace, name)) => {
            let address = spool_journal::Address::new(namespace, name);
            journal
                .find_address(&address)
                .await?
                .with_context(|| format!("no run at the address {address} in {at}"))?
        }
        None => RunId::new(run)?,
    };
    // A log whose chain does not verify is refused here with the run and
    // the first bad position, and the command fails.
    let log = journal.read(&run, Seq(0)).await?;
    if log.is_empty() {
        bail!("no run {run} in {at}");
    }
    let mut out = std::io::stdout().lock();
    if json {
        for envelope in &log {
            writeln!(out, "{}", serde_json::to_string(envelope)?)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let state = fold(&log);
    writeln!(out, "run        {run}")?;
    writeln!(out, "state      {}", describe(&state.status))?;
    if let Some(title) = state.title() {
        writeln!(out, "title      {title}")?;
    }
    if let Some(turn) = &state.turn {
        writeln!(out, "turn       {turn}")?;
    }
    if let Some(suspension) = &state.suspension {
        writeln!(out, "waiting    {}: {}", suspension.kind, suspension.prompt)?;
    }
    if let Some(response) = &state.response {
        writeln!(out, "response   {}", clip(response, 100))?;
    }
    writeln!(
        out,
        "usage      {} in / {} out",
        state.usage.input_tokens, state.usage.output_tokens
    )?;
    for (seq, call) in state.dangling_writes() {
        writeln!(
            out,
            "dangling   write {} ({}) at seq {seq}: needs an operator",
            call.call_id, call.tool
        )?;
    }
    writeln!(out, "events     {}", log.len())?;
    writeln!(out)?;
    for envelope in &log {
        let payload = serde_json::to_value(&envelope.event)?
            .get("payload")
            .map(ToString::to_string)
            .unwrap_or_default();
        writeln!(
            out,
            "{:>6}  {}  {:22}  {}",
            envelope.seq,
            envelope.recorded_at.format(&Rfc3339).unwrap_or_default(),
            envelope.event.kind(),
            clip(&payload, 100),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(status: &Status) -> String {
    match status {
        Status::Waiting(kind) => format!("waiting ({kind})"),
        other => other.state().to_string(),
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max).collect();
    clipped.push('…');
    clipped
}

/// `spool runs fork`: through the server at `url`, or on the journal.
async fn fork_run(
    run: &str,
    fork: spool_wire::http::Fork,
    through: &Through,
) -> anyhow::Result<ExitCode> {
    let reply = match through.client()? {
        Some(client) => client.fork(run, &fork).await?,
        None => {
            let (turn, after) = fork.cut().map_err(|r| anyhow::anyhow!(r.message))?;
            let request = spool_runtime::ForkRequest {
                turn: spool_journal::TurnId::new(turn)?,
                cut: if after {
                    spool_journal::event::ForkCut::After
                } else {
                    spool_journal::event::ForkCut::Before
                },
                title: fork.title.clone(),
                principal: None,
            };
            let (store, _owner) =
                crate::journal::open_owned(&through.journal, crate::journal::Process::OneShot)
                    .await?;
            // A fork calls no model and no tool: the runtime needs the
            // journal alone.
            let runtime = spool_runtime::Runtime::builder(store).build();
            let view = runtime.fork(&RunId::new(run)?, request).await?;
            runtime.shutdown().await;
            spool_http::channel::reply(&view)
        }
    };
    writeln!(std::io::stdout().lock(), "{}", reply.run_id)?;
    Ok(ExitCode::SUCCESS)
}
