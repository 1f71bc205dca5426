//! `one-shot-run`: `spool run hello` as a whole process (start, open the
//! journal, one durable echo turn, exit), against the same binary doing
//! nothing (`spool --version`): what a one-shot run costs beyond starting
//! the program. Needs the `spool` binary in `SPOOL_BIN` (`cargo xtask
//! bench` builds it); without it the rows are skipped, said.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::Scale;
use crate::report::Row;

/// The `spool` binary from `SPOOL_BIN`, as an absolute path (its servers
/// run in directories of their own); `None`, said, when it is not set.
pub(crate) fn spool_bin(bench: &str) -> anyhow::Result<Option<String>> {
    let Ok(spool) = std::env::var("SPOOL_BIN") else {
        crate::http::say(&format!(
            "{bench}: skipped, SPOOL_BIN is not set (cargo xtask bench builds spool and sets it)"
        ))?;
        return Ok(None);
    };
    Ok(Some(
        std::fs::canonicalize(&spool)
            .with_context(|| format!("SPOOL_BIN {spool}"))?
            .to_string_lossy()
            .into_owned(),
    ))
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = spool_bin("one-shot-run")? else {
        return Ok(Vec::new());
    };
    let times = scale.pick(40, 3);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let journal = journal.to_str().context("a temporary path that is UTF-8")?;
    // A journal that already holds runs, as a user's does.
    timed(&spool, &["run", "warm up", "--journal", journal], 3)?;
    let (bare_wall, bare_cpu) = timed(&spool, &["--version"], times)?;
    let (wall, cpu) = timed(&spool, &["run", "hello", "--journal", journal], times)?;
    Ok(vec![
        Row::new(
            "one-shot-run wall",
            wall,
            "ms",
            "spool --version wall",
            bare_wall,
        )
        .lower_is_better()
        .figure_at_most(6.0),
        Row::new(
            "one-shot-run CPU",
            cpu,
            "ms",
            "spool --version CPU",
            bare_cpu,
        )
        .lower_is_better(),
    ])
}

/// The median wall time and the mean CPU time (user and system, from
/// this process's waited-for children) of `times` runs, in milliseconds.
fn timed(program: &str, args: &[&str], times: usize) -> anyhow::Result<(f64, f64)> {
    let cpu_before = children_cpu()?;
    let mut walls = Vec::with_capacity(times);
    for _ in 0..times {
        let started = Instant::now();
        let status = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("starting {program}"))?;
        walls.push(started.elapsed().as_secs_f64() * 1e3);
        if !status.success() {
            bail!("{program} {} failed ({status})", args.join(" "));
        }
    }
    walls.sort_by(f64::total_cmp);
    let cpu = (children_cpu()? - cpu_before) / times as f64;
    Ok((crate::http::percentile(&walls, 0.5), cpu))
}

/// The CPU time of this process's waited-for children so far, in
/// milliseconds (`cutime` and `cstime`).
fn children_cpu() -> anyhow::Result<f64> {
    cpu_ms("self", 16)
}

/// Two CPU times of `/proc/PID/stat` from field `first` on (14: the
/// process's own user and system time; 16: its waited-for children's), in
/// milliseconds: ticks of 10 ms, so a mean over many runs is what is read.
pub(crate) fn cpu_ms(pid: &str, first: usize) -> anyhow::Result<f64> {
    let ticks = |n: usize| -> anyhow::Result<f64> { Ok(stat_field(pid, n)?.parse::<f64>()?) };
    Ok((ticks(first)? + ticks(first + 1)?) * 10.0)
}

/// Field `n` of `/proc/PID/stat`, counted from 1 as `proc(5)` counts them
/// (4: the parent's pid; 14: user time).
pub(crate) fn stat_field(pid: &str, n: usize) -> anyhow::Result<String> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The fields after the command's name, which is in parentheses (and
    // may hold spaces); 2 fields came before the part read here.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after
        .split_whitespace()
        .nth(
            n.checked_sub(3)
                .context("fields 1 and 2 are not read here")?,
        )
        .map(str::to_owned)
        .with_context(|| format!("a short {path}"))
}
