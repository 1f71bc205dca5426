//! `journal-sweep`: appends per second while the retention sweeper
//! deletes old runs from the same SQLite journal, beside the same appends
//! with no sweeper, measured before and after it in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spool_journal::event::{RunCreated, TurnCompleted};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Event, Journal, RunId, Seq, TurnId};
use spool_runtime::retention::Retention;

use crate::Scale;
use crate::journal::{runtime, typical_event};
use crate::report::Row;

/// The runs appending, as in `journal-append`'s largest row.
const LIVE: usize = 64;

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let duration = scale.pick(Duration::from_secs(4), Duration::from_millis(300));
    // More ended runs than a sweep can delete in the time measured, so
    // the sweeper works through the whole of it.
    let ended = scale.pick(20_000, 2_000);
    let dir = tempfile::tempdir()?;
    let journal = Arc::new(SqliteJournal::open(dir.path(), Options::default())?);
    runtime()?.block_on(async {
        create_ended(&journal, ended).await?;
        for i in 0..LIVE {
            journal
                .append(
                    &live(i),
                    Seq(0),
                    vec![Event::RunCreated(RunCreated::default())],
                )
                .await?;
        }
        let mut next = vec![Seq(1); LIVE];
        let before = appends(&journal, &mut next, duration).await?;
        let sweeping = Arc::new(AtomicBool::new(true));
        let deleted = Arc::new(AtomicU64::new(0));
        let sweeper = {
            let runtime =
                spool_runtime::Runtime::builder(Arc::clone(&journal) as Arc<dyn Journal>).build();
            let (sweeping, deleted) = (Arc::clone(&sweeping), Arc::clone(&deleted));
            tokio::spawn(async move {
                let retention = Retention {
                    completed: Some(Duration::from_secs(1)),
                    ..Retention::default()
                };
                let later = time::OffsetDateTime::now_utc() + Duration::from_secs(86_400);
                // As `spool serve` sweeps: batches of 256, again at once
                // while a batch was full.
                while sweeping.load(Ordering::Relaxed) {
                    let swept = runtime.sweep(&retention, later, 256).await?;
                    deleted.fetch_add(swept.deleted as u64, Ordering::Relaxed);
                    if swept.deleted == 0 {
                        break;
                    }
                }
                anyhow::Ok(())
            })
        };
        let during = appends(&journal, &mut next, duration).await?;
        sweeping.store(false, Ordering::Relaxed);
        let still = !sweeper.is_finished();
        sweeper.await??;
        let after = appends(&journal, &mut next, duration).await?;
        let baseline = f64::midpoint(before, after);
        let deleted = deleted.load(Ordering::Relaxed);
        anyhow::ensure!(
            still,
            "the sweeper ran out of runs to delete ({deleted}) before the appends were timed"
        );
        Ok(vec![
            Row::new(
                format!("journal-sweep/{LIVE} runs appending while {deleted} runs are deleted"),
                during,
                "events/s",
                "the same appends with no sweeper (mean of before and after)",
                baseline,
            )
            .ratio_at_least(0.9),
        ])
    })
}

fn live(i: usize) -> RunId {
    RunId::new(format!("live-{i}")).expect("live-N is a valid id")
}

/// `count` runs that completed a turn, created by 64 tasks at once.
async fn create_ended(journal: &Arc<SqliteJournal>, count: usize) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for lane in 0..64 {
        let journal = Arc::clone(journal);
        tasks.push(tokio::spawn(async move {
            for i in (lane..count).step_by(64) {
                let run = RunId::new(format!("ended-{i}"))?;
                let turn = TurnId::new("t1")?;
                journal
                    .append(
                        &run,
                        Seq(0),
                        vec![
                            Event::RunCreated(RunCreated::default()),
                            typical_event(1),
                            Event::TurnCompleted(TurnCompleted {
                                turn_id: turn,
                                response: Some("Done.".into()),
                                usage: None,
                            }),
                        ],
                    )
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Appends per second from the live runs, each a task of its own, for
/// `duration`, carrying on from `next`.
async fn appends(
    journal: &Arc<SqliteJournal>,
    next: &mut [Seq],
    duration: Duration,
) -> anyhow::Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for (i, at) in next.iter().enumerate() {
        let journal = Arc::clone(journal);
        let count = Arc::clone(&count);
        let mut at = *at;
        tasks.push(tokio::spawn(async move {
            let run = live(i);
            while Instant::now() < deadline {
                journal.append(&run, at, vec![typical_event(at.0)]).await?;
                at = at.next();
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(at)
        }));
    }
    for (slot, task) in next.iter_mut().zip(tasks) {
        *slot = task.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}
