//! The report: one row per figure, printed as a table and written as JSON.

use std::io::Write;

use serde::{Deserialize, Serialize};

/// One measured figure beside its baseline.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Row {
    /// What was measured.
    pub(crate) name: String,
    /// The figure.
    pub(crate) figure: f64,
    /// Its unit.
    pub(crate) unit: String,
    /// What the baseline is.
    pub(crate) baseline_name: String,
    /// The baseline, measured in the same run, in the same unit.
    pub(crate) baseline: f64,
    /// `figure / baseline` (for times, `baseline / figure`: higher is better).
    /// Written as `null` when there is none (JSON has no NaN).
    #[serde(deserialize_with = "null_as_nan")]
    pub(crate) ratio: f64,
    /// The target, in words (`ratio >= 50`, `figure >= 5000000`), if any.
    pub(crate) target: Option<String>,
    /// Whether the target was met; `None` without a target.
    pub(crate) met: Option<bool>,
}

fn null_as_nan<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// The rows of a report [`write`] wrote.
pub(crate) fn read(path: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    #[derive(Deserialize)]
    struct Written {
        rows: Vec<Row>,
    }
    let written: Written = serde_json::from_slice(&std::fs::read(path)?)?;
    Ok(written.rows)
}

impl Row {
    /// A row with no target.
    pub(crate) fn new(
        name: impl Into<String>,
        figure: f64,
        unit: &'static str,
        baseline_name: impl Into<String>,
        baseline: f64,
    ) -> Self {
        Self {
            name: name.into(),
            figure,
            unit: unit.to_owned(),
            baseline_name: baseline_name.into(),
            baseline,
            ratio: if baseline > 0.0 {
                figure / baseline
            } else {
                f64::NAN
            },
            target: None,
            met: None,
        }
    }

    /// The same row, where lower is better (a time): the ratio is inverted so
    /// that above 1 still means "better than the baseline".
    pub(crate) fn lower_is_better(mut self) -> Self {
        self.ratio = if self.figure > 0.0 {
            self.baseline / self.figure
        } else {
            f64::NAN
        };
        self
    }

    /// The same row with a target on the ratio.
    pub(crate) fn ratio_at_least(mut self, target: f64) -> Self {
        self.target = Some(format!("ratio >= {target}"));
        self.met = Some(self.ratio >= target);
        self
    }

    /// The same row with a ceiling on the ratio: for a figure that must
    /// stay near its baseline (a late turn beside an early one).
    pub(crate) fn ratio_at_most(mut self, target: f64) -> Self {
        self.target = Some(format!("ratio <= {target}"));
        self.met = Some(self.ratio <= target);
        self
    }

    /// The same row with a target on the figure.
    pub(crate) fn figure_at_least(mut self, target: f64) -> Self {
        self.target = Some(format!(">= {} {}", human(target), self.unit));
        self.met = Some(self.figure >= target);
        self
    }

    /// The same row with a ceiling on the figure as a multiple of its
    /// baseline: a time that must stay near the machine's floor.
    pub(crate) fn at_most_times_baseline(mut self, times: f64) -> Self {
        self.target = Some(format!("<= {times} x baseline"));
        self.met = Some(self.figure <= times * self.baseline);
        self
    }

    /// The same row with a ceiling on the figure.
    pub(crate) fn figure_at_most(mut self, target: f64) -> Self {
        self.target = Some(format!("<= {} {}", human(target), self.unit));
        self.met = Some(self.figure <= target);
        self
    }
}

pub(crate) fn print(rows: &[Row], out: &mut impl Write) -> std::io::Result<()> {
    let name_width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let base_width = rows
        .iter()
        .map(|r| r.baseline_name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    writeln!(
        out,
        "{:name_width$}  {:>12}  {:10}  {:base_width$}  {:>12}  {:>8}  {:20}  met?",
        "name", "figure", "unit", "baseline", "(baseline)", "ratio", "target"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:name_width$}  {:>12}  {:10}  {:base_width$}  {:>12}  {:>8.2}  {:20}  {}",
            row.name,
            human(row.figure),
            &row.unit,
            row.baseline_name,
            human(row.baseline),
            row.ratio,
            row.target.as_deref().unwrap_or("-"),
            match row.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            },
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Report<'a> {
    quick: bool,
    rows: &'a [Row],
}

pub(crate) fn write(
    rows: &[Row],
    scale: crate::Scale,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let report = Report {
        quick: scale.quick,
        rows,
    };
    std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}

/// A number in a short human form (1.23M, 45.6k, 0.0012).
pub(crate) fn human(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e9 {
        format!("{:.2}G", value / 1e9)
    } else if magnitude >= 1e6 {
        format!("{:.2}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.1}k", value / 1e3)
    } else if magnitude >= 10.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}
