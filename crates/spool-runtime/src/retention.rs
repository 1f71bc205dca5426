//! Retention: how long runs that ended are kept (`[retention]` in
//! spool.toml), and the sweep that deletes those past it. A host calls
//! [`Runtime::sweep`] every [`Retention::period`] with the time now; the
//! clock is the caller's, so a test moves it.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use spool_journal::fold::Status;
use spool_journal::store::RunSummary;
use spool_journal::{Address, Event, RunId, Seq};
use time::OffsetDateTime;

use crate::error::RuntimeError;
use crate::runtime::Runtime;

/// `[retention]`: how long a run that ended is kept after its last event,
/// by how it ended; absent, for ever.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Runs whose last turn completed: `"30d"`, `"12h"`, `"15m"`, `"2s"`.
    #[serde(default, deserialize_with = "age")]
    #[schemars(with = "Option<String>")]
    pub completed: Option<Duration>,
    /// Runs whose last turn failed.
    #[serde(default, deserialize_with = "age")]
    #[schemars(with = "Option<String>")]
    pub failed: Option<Duration>,
    /// Runs whose last turn was cancelled.
    #[serde(default, deserialize_with = "age")]
    #[schemars(with = "Option<String>")]
    pub cancelled: Option<Duration>,
    /// Runs retired (reset) for good.
    #[serde(default, deserialize_with = "age")]
    #[schemars(with = "Option<String>")]
    pub retired: Option<Duration>,
    /// How many runs to keep per address, whatever their age: the run
    /// that holds the address now and the newest it replaced (a reset
    /// retires a run and frees its address for the next); older retired
    /// runs of the address are deleted. At least 1.
    #[serde(default)]
    pub keep_latest: Option<usize>,
}

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Runs deleted.
    pub deleted: usize,
    /// Runs due that were left: they moved since the listing (a new
    /// turn), another node drives them, or the deletion failed (logged).
    pub left: usize,
}

/// The least time between two deletions of a sweep: at most 250 runs a
/// second, so the journal's writer spends nearly all its time on appends
/// while a backlog is swept (`cargo xtask bench --only journal-sweep`:
/// deleting as fast as the writer took them, 1,470 runs a second, cost
/// 64 appending runs 16 % of their appends).
pub const SWEEP_PACE: Duration = Duration::from_millis(4);

/// The fewest and most time between sweeps.
const PERIOD_MIN: Duration = Duration::from_secs(1);
const PERIOD_MAX: Duration = Duration::from_secs(60);

/// How often to sweep for `keep_latest` alone: a retired run past the
/// count goes within this of the reset that pushed it out.
const PERIOD_KEEP_LATEST: Duration = Duration::from_secs(10);

impl Retention {
    /// Whether any run is ever deleted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules().all(|(_, keep)| keep.is_none()) && self.keep_latest.is_none()
    }

    /// Whether the settings hold together.
    ///
    /// # Errors
    ///
    /// A sentence naming the key.
    pub fn check(&self) -> Result<(), String> {
        if self.keep_latest == Some(0) {
            return Err(
                "`retention.keep_latest` must be at least 1: an address's current run is always kept"
                    .into(),
            );
        }
        Ok(())
    }

    fn rules(&self) -> impl Iterator<Item = (&'static str, Option<Duration>)> {
        [
            ("completed", self.completed),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
            ("retired", self.retired),
        ]
        .into_iter()
    }

    /// How often to sweep: a tenth of the shortest retention, between
    /// one second and a minute, so a run goes within seconds of its
    /// expiry when retentions are short and within a minute when they are
    /// days; every 10 s when `keep_latest` is the only rule; `None` when
    /// nothing is ever deleted.
    #[must_use]
    pub fn period(&self) -> Option<Duration> {
        let by_age = self
            .rules()
            .filter_map(|(_, keep)| keep)
            .min()
            .map(|shortest| (shortest / 10).clamp(PERIOD_MIN, PERIOD_MAX));
        let by_count = self.keep_latest.map(|_| PERIOD_KEEP_LATEST);
        by_age.into_iter().chain(by_count).min()
    }

    /// The rule `run` is past at `now`, in words (`completed 30d`), or
    /// `None` while it is kept. Only runs that ended are ever due: a run
    /// running or waiting is kept whatever its age.
    #[must_use]
    pub fn due(&self, run: &RunSummary, now: OffsetDateTime) -> Option<String> {
        let (name, keep) = match run.status {
            Status::Completed => ("completed", self.completed),
            Status::Failed => ("failed", self.failed),
            Status::Cancelled => ("cancelled", self.cancelled),
            Status::Retired => ("retired", self.retired),
            _ => return None,
        };
        let keep = keep?;
        let age = now - run.updated_at;
        (age >= keep).then(|| format!("retention: {name} {}", show(keep)))
    }
}

impl Runtime {
    /// Deletes the runs `retention` says are past their time at `now`,
    /// until `batch` are deleted (the oldest first), one at a time and at
    /// most one every [`SWEEP_PACE`]: the journal's writer takes appends
    /// between any two, so a sweep never holds appends up for more than
    /// one run's deletion. Each deletion is held to the run's head as
    /// listed: a run that moved since the listing (a new message) is
    /// left. On a shared journal the deletion goes ahead whichever node
    /// drives the run (the head check makes it safe), so one node may
    /// sweep for all (`spool serve --cluster` sweeps on one).
    ///
    /// # Errors
    ///
    /// When the journal cannot be listed; a run whose deletion fails is
    /// logged and counted in [`Swept::left`].
    pub async fn sweep(
        &self,
        retention: &Retention,
        now: OffsetDateTime,
        batch: usize,
    ) -> Result<Swept, RuntimeError> {
        let mut swept = Swept::default();
        if retention.is_empty() {
            return Ok(swept);
        }
        // Only the states with a retention are listed, each filtered where
        // the rows are (SQLite and PostgreSQL read no other run's row).
        let mut due: Vec<(RunSummary, String)> = Vec::new();
        for (status, keep) in [
            (Status::Completed, retention.completed),
            (Status::Failed, retention.failed),
            (Status::Cancelled, retention.cancelled),
            (Status::Retired, retention.retired),
        ] {
            if keep.is_none() {
                continue;
            }
            let listed = self.inner.journal.runs_with_status(status).await?;
            due.extend(
                listed
                    .into_iter()
                    .filter_map(|run| retention.due(&run, now).map(|why| (run, why))),
            );
        }
        if let Some(keep) = retention.keep_latest {
            due.extend(self.past_latest(keep).await?);
        }
        due.sort_by_key(|(run, _)| run.updated_at);
        // A run due by two rules is deleted once.
        let mut seen = std::collections::HashSet::new();
        due.retain(|(run, _)| seen.insert(run.run_id.clone()));
        let mut pace = tokio::time::interval(SWEEP_PACE);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for (run, why) in due {
            if swept.deleted >= batch.max(1) {
                break;
            }
            pace.tick().await;
            // Straight to the journal: the listing said the run ended, and
            // `expected` holds the deletion to the run as listed (one that
            // took input since is left), so its log need not be read.
            let deletion = spool_journal::store::Deletion {
                by: "retention".into(),
                reason: Some(why),
                expected: Some(run.next_seq),
            };
            match self.inner.journal.delete(&run.run_id, deletion).await {
                Ok(_) => {
                    self.inner.forget(&run.run_id);
                    swept.deleted += 1;
                }
                Err(error) => {
                    swept.left += 1;
                    let error = RuntimeError::from(error);
                    if !matches!(
                        error.kind(),
                        crate::ErrorKind::OwnedElsewhere | crate::ErrorKind::RunNotFound
                    ) {
                        tracing::warn!(run_id = %run.run_id, %error, "retention could not delete a run; the next sweep tries again");
                    }
                }
            }
        }
        Ok(swept)
    }
}

impl Runtime {
    /// The retired runs past the `keep` latest of an address they held:
    /// an address's runs are the one holding it now (it counts, and is
    /// never deleted here) and the retired runs that held it, newest
    /// retired first. A retired run's addresses are read from its log
    /// once per process (a retired run never changes).
    async fn past_latest(&self, keep: usize) -> Result<Vec<(RunSummary, String)>, RuntimeError> {
        let retired = self.inner.journal.runs_with_status(Status::Retired).await?;
        let mut by_address: HashMap<Address, Vec<&RunSummary>> = HashMap::new();
        for run in &retired {
            for address in self.held(&run.run_id).await?.iter().cloned() {
                by_address.entry(address).or_default().push(run);
            }
        }
        let mut due = Vec::new();
        for (address, mut runs) in by_address {
            if runs.len() < keep {
                continue;
            }
            // The run that holds the address now (live, or a retired run
            // that kept it) counts among the latest and is never deleted
            // here.
            let holder = self.inner.journal.find_address(&address).await?;
            runs.retain(|run| Some(&run.run_id) != holder.as_ref());
            let kept = keep - usize::from(holder.is_some());
            runs.sort_by_key(|run| std::cmp::Reverse(run.updated_at));
            for run in runs.into_iter().skip(kept) {
                let why = format!(
                    "retention: keep_latest {keep} of {}:{}",
                    address.namespace, address.name
                );
                due.push((run.clone(), why));
            }
        }
        Ok(due)
    }

    /// Every address a retired run held: the one it was created through
    /// and those bound to it since.
    async fn held(&self, run: &RunId) -> Result<Arc<[Address]>, RuntimeError> {
        if let Some(held) = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run)
        {
            return Ok(Arc::clone(held));
        }
        let mut held: Vec<Address> = Vec::new();
        for envelope in self.inner.journal.read(run, Seq(0)).await? {
            let address = match envelope.event {
                Event::RunCreated(created) => created.address,
                Event::AddressBound(bound) => Some(bound.address),
                _ => None,
            };
            if let Some(address) = address
                && !held.contains(&address)
            {
                held.push(address);
            }
        }
        let held: Arc<[Address]> = held.into();
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.clone(), Arc::clone(&held));
        Ok(held)
    }
}

/// Reads an age: a whole number and a unit, `s`, `m`, `h`, `d` or `w`
/// (`"30d"`, `"2s"`).
///
/// # Errors
///
/// A sentence naming what is wrong.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: write `30d`, `12h`, `15m`, `2s` or `1w`"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        other => {
            return Err(format!(
                "`{other}` in `{text}` is not a unit: use s, m, h, d or w"
            ));
        }
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// An age as [`parse_age`] reads it, in its largest whole unit.
fn show(age: Duration) -> String {
    let seconds = age.as_secs();
    [(604_800, "w"), (86_400, "d"), (3_600, "h"), (60, "m")]
        .into_iter()
        .find(|(unit, _)| seconds >= *unit && seconds.is_multiple_of(*unit))
        .map_or_else(
            || format!("{seconds}s"),
            |(unit, name)| format!("{}{name}", seconds / unit),
        )
}

fn age<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(deserializer)?;
    text.map(|text| parse_age(&text).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_every_unit_and_a_bad_one_is_refused_by_name() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_age("1w"), Ok(Duration::from_secs(604_800)));
        assert!(parse_age("30").unwrap_err().contains("no unit"));
        assert!(parse_age("3y").unwrap_err().contains("not a unit"));
        assert!(parse_age("d").unwrap_err().contains("whole number"));
        assert_eq!(show(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(show(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn the_sweep_period_follows_the_shortest_retention_within_a_second_and_a_minute() {
        let retention = |completed: u64, failed: Option<u64>| Retention {
            completed: Some(Duration::from_secs(completed)),
            failed: failed.map(Duration::from_secs),
            ..Retention::default()
        };
        assert_eq!(Retention::default().period(), None);
        assert_eq!(retention(2, None).period(), Some(PERIOD_MIN));
        assert_eq!(
            retention(300, Some(100)).period(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(retention(30 * 86_400, None).period(), Some(PERIOD_MAX));
        let counted = Retention {
            keep_latest: Some(3),
            ..Retention::default()
        };
        assert_eq!(counted.period(), Some(PERIOD_KEEP_LATEST));
        assert!(!counted.is_empty());
        let both = Retention {
            keep_latest: Some(3),
            ..retention(20, None)
        };
        assert_eq!(both.period(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn keep_latest_of_zero_is_refused_by_name() {
        let none = Retention {
            keep_latest: Some(0),
            ..Retention::default()
        };
        assert!(none.check().unwrap_err().contains("keep_latest"));
        let one = Retention {
            keep_latest: Some(1),
            ..Retention::default()
        };
        assert_eq!(one.check(), Ok(()));
    }
}
