//! A schedule as `spool.toml` defines it (`[[schedule]]`), its overlap
//! and catch-up policies, and the checks a set of definitions must pass.

use super::*;

/// `[[schedule]]` in `spool.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDefinition {
    /// Its name: letters, digits, `-`, `_` and `.`, up to 64.
    pub name: String,
    /// A cron expression: five fields, or six with seconds first
    /// (`0 9 * * MON-FRI`, `*/30 * * * * *`).
    pub cron: String,
    /// The IANA time zone the expression is read in (`UTC` by default).
    #[serde(default = "utc")]
    pub time_zone: String,
    /// The message each firing sends.
    pub text: String,
    /// The HTTP address whose run each firing messages (created on first
    /// use); absent, each firing starts a fresh run.
    #[serde(default)]
    pub address: Option<String>,
    /// One-turn context sent with each firing's message.
    #[serde(default)]
    pub context: Vec<String>,
    /// What a firing does while the previous one's turn is in progress.
    #[serde(default)]
    pub overlap: Overlap,
    /// What a start does about occurrences missed while the server was
    /// down.
    #[serde(default)]
    pub catch_up: CatchUp,
}

pub(super) fn utc() -> String {
    "UTC".into()
}

/// What a firing does while the target's turn is in progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Nothing: the firing is recorded as skipped (the default).
    #[default]
    Skip,
    /// To an address: the message is queued behind the running turn. For
    /// a fresh run per firing: the firing starts its own run anyway.
    Queue,
}

/// What a start does about occurrences missed while the server was down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Fire once, for the latest missed occurrence (the default).
    #[default]
    Latest,
    /// Fire none of them.
    Skip,
}

impl Overlap {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Queue => "queue",
        }
    }
}

impl CatchUp {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Latest => "latest",
            Self::Skip => "skip",
        }
    }
}

/// A definition, checked: its expression parsed, its zone found.
#[derive(Clone, Debug)]
pub(super) struct Parsed {
    pub(super) definition: ScheduleDefinition,
    pub(super) cron: Cron,
    pub(super) zone: TimeZone,
}

impl ScheduleDefinition {
    pub(super) fn parse(&self) -> Result<Parsed, String> {
        let name = &self.name;
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid_name {
            return Err(format!(
                "schedule name `{name}`: use 1 to 64 letters, digits, `-`, `_` or `.`"
            ));
        }
        let cron = Cron::from_str(&self.cron)
            .map_err(|e| format!("schedule `{name}`: cron expression `{}`: {e}", self.cron))?;
        let zone = TimeZone::get(&self.time_zone)
            .map_err(|e| format!("schedule `{name}`: time zone `{}`: {e}", self.time_zone))?;
        if self.text.trim().is_empty() {
            return Err(format!("schedule `{name}`: `text` is empty"));
        }
        if self.address.as_deref().is_some_and(str::is_empty) {
            return Err(format!(
                "schedule `{name}`: `address` is empty (leave it out for a fresh run per firing)"
            ));
        }
        Ok(Parsed {
            definition: self.clone(),
            cron,
            zone,
        })
    }
}

/// Checks a configuration's schedules: each parses, and no two share a
/// name.
///
/// # Errors
///
/// [`ScheduleError::Invalid`], naming the schedule and what is wrong.
pub fn check(definitions: &[ScheduleDefinition]) -> Result<(), ScheduleError> {
    let mut names = std::collections::HashSet::new();
    for definition in definitions {
        definition.parse().map_err(ScheduleError::Invalid)?;
        if !names.insert(&definition.name) {
            return Err(ScheduleError::Invalid(format!(
                "two schedules are named `{}`",
                definition.name
            )));
        }
    }
    Ok(())
}
