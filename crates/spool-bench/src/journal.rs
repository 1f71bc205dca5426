//! Journal benchmarks: durable appends beside the disk's own limit and a
//! naive store, folding a large log, and opening a large journal.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use spool_journal::event::{
    Effect, ModelCallCompleted, ModelCallRequested, RunCreated, ToolCallCompleted,
    ToolCallRequested, TurnCompleted, TurnStarted, Usage,
};
use spool_journal::fold::fold as fold_log;
use spool_journal::store::sqlite::{Durability, Options, SqliteJournal, WriterStats};
use spool_journal::{Envelope, Event, Journal, RunId, Seq, TurnId};
use spool_wire::run::TurnPolicy;

use crate::Scale;
use crate::report::Row;

/// An event of a typical size (an envelope of about 250 bytes).
pub(crate) fn typical_event(n: u64) -> Event {
    Event::TurnStarted(TurnStarted {
        turn_id: TurnId::new(format!("turn-{n}")).expect("turn-N is a valid id"),
        input: "Summarize the deployment plan and list the risks.".repeat(2),
        context: Vec::new(),
        policy: TurnPolicy::Steer,
        from_queue: None,
        operation_id: None,
    })
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Appends per second from `runs` concurrent runs, one event per append;
/// with the average appends per sync and the envelope size seen.
fn spool_appends(
    runs: usize,
    duration: Duration,
    durability: Durability,
) -> anyhow::Result<(f64, f64, usize)> {
    let dir = tempfile::tempdir()?;
    let options = Options {
        durability,
        ..Options::default()
    };
    let journal = Arc::new(SqliteJournal::open(dir.path(), options)?);
    let (rate, group) =
        runtime()?.block_on(timed_appends(journal, SqliteJournal::stats, runs, duration))?;
    Ok((rate, group, typical_bytes()?))
}

/// An envelope of [`typical_event`]'s size, in bytes.
pub(crate) fn typical_bytes() -> anyhow::Result<usize> {
    Ok(serde_json::to_vec(&Envelope {
        run_id: RunId::new("run-00")?,
        seq: Seq(1),
        recorded_at: time::OffsetDateTime::now_utc(),
        event: typical_event(1),
    })?
    .len())
}

/// `runs` runs created in `journal`, then each appended to by a task of
/// its own, one event per append, until `duration` has passed: appends per
/// second, and the average number of appends each sync made durable, by
/// `stats`.
pub(crate) async fn timed_appends<J: Journal>(
    journal: Arc<J>,
    stats: fn(&J) -> WriterStats,
    runs: usize,
    duration: Duration,
) -> anyhow::Result<(f64, f64)> {
    // Create the runs first, so only steady-state appends are timed.
    for i in 0..runs {
        let run = RunId::new(format!("run-{i}"))?;
        journal
            .append(&run, Seq(0), vec![Event::RunCreated(RunCreated::default())])
            .await?;
    }
    let count = Arc::new(AtomicU64::new(0));
    let before = stats(&journal);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for i in 0..runs {
        let journal = Arc::clone(&journal);
        let count = Arc::clone(&count);
        tasks.push(tokio::spawn(async move {
            let run = RunId::new(format!("run-{i}")).expect("run-N is a valid id");
            let mut next = Seq(1);
            while Instant::now() < deadline {
                journal
                    .append(&run, next, vec![typical_event(next.0)])
                    .await?;
                next = next.next();
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    let after = stats(&journal);
    // Operations per sync: what the disk's floor is measured at. Without
    // syncs (a store told not to), per commit.
    let syncs = match after.syncs - before.syncs {
        0 => after.commits - before.commits,
        syncs => syncs,
    };
    let group = (after.operations - before.operations) as f64 / syncs.max(1) as f64;
    Ok((
        count.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        group,
    ))
}

/// One transaction per event on plain SQLite (WAL, synchronous=FULL).
fn naive_appends(duration: Duration, bytes: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let conn = rusqlite::Connection::open(dir.path().join("naive.db"))?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (run_id, seq))",
    )?;
    let body = vec![b'x'; bytes];
    let start = Instant::now();
    let mut n: i64 = 0;
    while start.elapsed() < duration {
        conn.execute(
            "INSERT INTO events VALUES ('run-0', ?1, ?2)",
            rusqlite::params![n, body],
        )?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// How the events of a commit are laid out in a plain SQLite table.
#[derive(Clone, Copy)]
enum Layout {
    /// Clustered by `(run_id, seq)`, as Spool's `events` table.
    ByRun,
    /// In arrival order, with a `(run_id, seq)` index for a run's reads.
    ArrivalIndexed,
    /// In arrival order, nothing else.
    Arrival,
}

/// Plain SQLite at Spool's batch size, one thread, `synchronous=FULL`:
/// `batch` events of 64 runs in turn per transaction, in `layout`. What
/// SQLite itself allows for each layout, without Spool's work around it.
fn plain_sqlite_appends(
    duration: Duration,
    batch: usize,
    bytes: usize,
    layout: Layout,
) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut conn = rusqlite::Connection::open(dir.path().join("plain.db"))?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=10000;",
    )?;
    conn.execute_batch(match layout {
        Layout::ByRun => {
            "CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
                                  hash BLOB NOT NULL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID;"
        }
        Layout::ArrivalIndexed => {
            "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL,
                                  body BLOB NOT NULL, hash BLOB NOT NULL);
             CREATE UNIQUE INDEX events_run ON events (run_id, seq);"
        }
        Layout::Arrival => {
            "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL,
                                  body BLOB NOT NULL, hash BLOB NOT NULL);"
        }
    })?;
    let body = vec![b'x'; bytes];
    let hash = [7u8; 32];
    let runs: Vec<String> = (0..64).map(|i| format!("run-{i}")).collect();
    let mut seqs = [0i64; 64];
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < duration {
        let transaction = conn.transaction()?;
        {
            let mut insert = transaction.prepare_cached(
                "INSERT INTO events (run_id, seq, body, hash) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for _ in 0..batch {
                let run = n % runs.len();
                seqs[run] += 1;
                insert.execute(rusqlite::params![runs[run], seqs[run], body, hash])?;
                n += 1;
            }
        }
        transaction.commit()?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// How large a file the raw floor writes over when its blocks are written
/// beforehand, as a log is that starts over at its beginning.
const RAW_RING: usize = 16 * 1024 * 1024;

/// The raw floors' file in `dir`: `over_written`, [`RAW_RING`] bytes
/// written and synced beforehand, for records written over them; else
/// empty, to grow.
fn raw_log(dir: &tempfile::TempDir, over_written: bool) -> std::io::Result<std::fs::File> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.path().join("raw.log"))?;
    if over_written {
        file.write_all(&vec![0_u8; RAW_RING])?;
        file.sync_all()?;
    }
    Ok(file)
}

/// Records per second appended to a raw file in batches of `batch`, each
/// batch made durable with `fdatasync`: the disk's floor. `over_written`:
/// into blocks written (and synced) beforehand, wrapping around, so a sync
/// writes the records alone; otherwise at the end of a file that grows, so
/// every sync also writes the file's size.
fn raw_file_appends(
    duration: Duration,
    batch: usize,
    bytes: usize,
    over_written: bool,
) -> anyhow::Result<f64> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let file = raw_log(&dir, over_written)?;
    let mut chunk = Vec::with_capacity(batch * (bytes + 8));
    for _ in 0..batch {
        chunk.extend_from_slice(&(bytes as u64).to_le_bytes());
        chunk.extend(std::iter::repeat_n(b'x', bytes));
    }
    let start = Instant::now();
    let mut records = 0usize;
    let mut at = 0_usize;
    while start.elapsed() < duration {
        if at + chunk.len() > RAW_RING && over_written {
            at = 0;
        }
        file.write_all_at(&chunk, at as u64)?;
        file.sync_data()?;
        at += chunk.len();
        records += batch;
    }
    Ok(records as f64 / start.elapsed().as_secs_f64())
}

/// A caller's record and where it is told its record is durable.
type Waiting = tokio::sync::oneshot::Sender<()>;

/// Records per second from `runs` tasks, each sending one record of
/// `bytes` and waiting until it is durable before sending the next, as
/// the store's callers do, around a group commit in the store's shape: a
/// writer thread writes every record queued, over blocks written
/// beforehand (as [`raw_file_appends`] does), and hands the batch to a
/// syncer thread, which syncs (`fdatasync`) once for every batch handed
/// over meanwhile and answers their callers, while the writer writes the
/// next. The disk's floor for callers that wait on their syncs, on the
/// same two cores: only the queue, the sync and the callers' wake-ups,
/// no SQLite, no encoding, no hashing. With the average records per sync.
fn raw_group_commits(runs: usize, duration: Duration, bytes: usize) -> anyhow::Result<(f64, f64)> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let file = Arc::new(raw_log(&dir, true)?);
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<(Vec<u8>, Waiting)>(runs.max(1));
    // As the store's syncer queue: a few batches, then the writer waits.
    let (hand_over, mut handed) = tokio::sync::mpsc::channel::<Vec<Waiting>>(4);
    let syncs = Arc::new(AtomicU64::new(0));
    let syncer = {
        let syncs = Arc::clone(&syncs);
        let file = Arc::clone(&file);
        std::thread::spawn(move || -> std::io::Result<()> {
            while let Some(mut waiting) = handed.blocking_recv() {
                while let Ok(more) = handed.try_recv() {
                    waiting.extend(more);
                }
                file.sync_data()?;
                syncs.fetch_add(1, Ordering::Relaxed);
                for reply in waiting {
                    let _ = reply.send(());
                }
            }
            Ok(())
        })
    };
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut chunk = Vec::new();
        let mut at = 0_usize;
        while let Some(first) = receiver.blocking_recv() {
            let mut waiting = Vec::new();
            let mut next = Some(first);
            while let Some((record, reply)) = next {
                chunk.extend_from_slice(&(record.len() as u64).to_le_bytes());
                chunk.extend_from_slice(&record);
                waiting.push(reply);
                next = receiver.try_recv().ok();
            }
            if at + chunk.len() > RAW_RING {
                at = 0;
            }
            file.write_all_at(&chunk, at as u64)?;
            at += chunk.len();
            chunk.clear();
            if hand_over.blocking_send(waiting).is_err() {
                break;
            }
        }
        Ok(())
    });
    let (rate, records) = runtime()?.block_on(async {
        let count = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let deadline = start + duration;
        let mut tasks = Vec::new();
        for _ in 0..runs {
            let sender = sender.clone();
            let count = Arc::clone(&count);
            tasks.push(tokio::spawn(async move {
                let record = vec![b'x'; bytes];
                while Instant::now() < deadline {
                    let (reply, durable) = tokio::sync::oneshot::channel();
                    sender.send((record.clone(), reply)).await?;
                    durable.await?;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        let records = count.load(Ordering::Relaxed);
        anyhow::Ok((records as f64 / start.elapsed().as_secs_f64(), records))
    })?;
    // The writer ends when every sender is gone, and the syncer after it.
    drop(sender);
    for (thread, name) in [(writer, "writer"), (syncer, "syncer")] {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("the group-commit floor's {name} panicked"))??;
    }
    let group = records as f64 / syncs.load(Ordering::Relaxed).max(1) as f64;
    Ok((rate, group))
}

pub(crate) fn append(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let duration = scale.pick(Duration::from_secs(4), Duration::from_millis(300));
    let mut rows = Vec::new();
    let mut naive = None;
    for runs in [1, 8, 64] {
        let (spool, group, bytes) = spool_appends(runs, duration, Durability::Full)?;
        let naive = match naive {
            Some(n) => n,
            None => *naive.insert(naive_appends(duration, bytes)?),
        };
        let batch = group.round().max(1.0) as usize;
        // The store writes its log over blocks written before (`ahead.rs`
        // in spool-journal), so the floor does too; a growing file's
        // floor is kept beside it.
        let raw = raw_file_appends(duration, batch, bytes, true)?;
        let growing = raw_file_appends(duration, batch, bytes, false)?;
        let name = format!("journal-append/{runs} runs");
        let vs_raw = Row::new(
            &name,
            spool,
            "events/s",
            format!("raw fdatasync over written blocks, batch {group:.1}"),
            raw,
        );
        let vs_growing = Row::new(
            &name,
            spool,
            "events/s",
            format!("raw fdatasync at a growing file's end, batch {group:.1}"),
            growing,
        );
        let vs_naive = Row::new(&name, spool, "events/s", "sqlite 1 txn/event", naive);
        if runs == 64 {
            rows.push(vs_raw.ratio_at_least(0.8));
            rows.push(vs_growing);
            // The same callers, each waiting on its sync, around a group
            // commit that does nothing but write and sync: how much of
            // the gap to the raw file is the waiting itself.
            let (waited, waited_group) = raw_group_commits(runs, duration, bytes)?;
            rows.push(Row::new(
                &name,
                spool,
                "events/s",
                format!(
                    "raw group commit, {runs} callers waiting on their syncs, batch {waited_group:.1}"
                ),
                waited,
            ));
            rows.push(vs_naive.ratio_at_least(50.0));
            // The same without an fsync per commit: what SQLite's own work
            // allows on this machine, whatever the disk.
            let (unsynced, _, _) =
                spool_appends(runs, duration, Durability::LoseRecentCommitsOnPowerLoss)?;
            rows.push(Row::new(
                format!("journal-append/{runs} runs, synchronous=NORMAL"),
                unsynced,
                "events/s",
                format!("raw fdatasync over written blocks, batch {group:.1}"),
                raw,
            ));
            for (layout, label) in [
                (Layout::ByRun, "by run"),
                (Layout::ArrivalIndexed, "in arrival order, indexed"),
                (Layout::Arrival, "in arrival order"),
            ] {
                rows.push(Row::new(
                    format!("journal-append/{runs} runs, plain SQLite {label}"),
                    plain_sqlite_appends(duration, batch, bytes, layout)?,
                    "events/s",
                    format!("raw fdatasync over written blocks, batch {group:.1}"),
                    raw,
                ));
            }
        } else {
            rows.push(vs_raw);
            rows.push(vs_growing);
            rows.push(vs_naive);
        }
    }
    Ok(rows)
}

/// A run of `turns` turns, each: start, model call, tool call, model call,
/// completion (7 events).
fn synthetic_run(run: &RunId, turns: u64) -> Vec<Envelope> {
    let mut events = vec![Event::RunCreated(RunCreated::default())];
    for t in 0..turns {
        let turn = TurnId::new(format!("t{t}")).expect("tN is a valid id");
        events.push(Event::TurnStarted(TurnStarted {
            turn_id: turn.clone(),
            input: "check the deploy".into(),
            context: Vec::new(),
            policy: TurnPolicy::Steer,
            from_queue: None,
            operation_id: None,
        }));
        events.push(Event::ModelCallRequested(ModelCallRequested {
            request_hash: format!("sha256:{t:064x}"),
            new_messages: vec![json!({"role": "user", "content": "check the deploy"})],
        }));
        events.push(Event::ModelCallCompleted(ModelCallCompleted {
            message: json!({"role": "assistant", "tool_calls": [{"id": "c", "name": "status"}]})
                .into(),
            usage: Some(Usage {
                input_tokens: 100,
                output_tokens: 20,
            }),
            finish_reason: Some("tool_use".into()),
        }));
        events.push(Event::ToolCallRequested(ToolCallRequested {
            call_id: format!("c{t}"),
            tool: "status".into(),
            input: json!({}),
            effect: Effect::Read,
            idempotency_key: None,
        }));
        events.push(Event::ToolCallCompleted(ToolCallCompleted {
            call_id: format!("c{t}"),
            output: json!({"ok": true}).into(),
        }));
        events.push(Event::ModelCallCompleted(ModelCallCompleted {
            message: json!({"role": "assistant", "content": "all good"}).into(),
            usage: Some(Usage {
                input_tokens: 130,
                output_tokens: 5,
            }),
            finish_reason: Some("stop".into()),
        }));
        events.push(Event::TurnCompleted(TurnCompleted {
            turn_id: turn,
            response: Some("all good".into()),
            usage: None,
        }));
    }
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Envelope {
            run_id: run.clone(),
            seq: Seq(i as u64),
            recorded_at: time::OffsetDateTime::UNIX_EPOCH,
            event,
        })
        .collect()
}

pub(crate) fn fold(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let runs = scale.pick(10_000u64, 1_000);
    let logs: Vec<Vec<Envelope>> = (0..runs)
        .map(|i| {
            synthetic_run(
                &RunId::new(format!("run-{i}")).expect("run-N is a valid id"),
                14,
            )
        })
        .collect();
    let events: usize = logs.iter().map(Vec::len).sum();
    let mut best_fold = f64::MAX;
    let mut best_touch = f64::MAX;
    for _ in 0..scale.pick(3, 1) {
        // As the runtime replays: the log just read stays with the caller,
        // and the fold copies what the state keeps. Building and dropping
        // each state is timed.
        let start = Instant::now();
        let mut checksum = 0u64;
        for log in &logs {
            checksum = checksum.wrapping_add(fold_log(log).usage.input_tokens);
        }
        best_fold = best_fold.min(start.elapsed().as_secs_f64());
        std::hint::black_box(checksum);
        // The floor: touching every event without folding it.
        let start = Instant::now();
        let mut touched = 0usize;
        for log in &logs {
            for envelope in log {
                touched = touched.wrapping_add(envelope.event.kind().len());
            }
        }
        best_touch = best_touch.min(start.elapsed().as_secs_f64());
        std::hint::black_box(touched);
    }
    let rate = events as f64 / best_fold;
    Ok(vec![
        Row::new(
            format!("replay-fold/{events} events"),
            rate,
            "events/s",
            "touch each event",
            events as f64 / best_touch,
        )
        .figure_at_least(5_000_000.0),
    ])
}

/// Runs read at once while a journal is opened: one per core and one more
/// each, so a read waiting on SQLite leaves a core to another.
const READS_IN_FLIGHT: usize = 4;

pub(crate) fn open(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let runs = scale.pick(10_000u64, 500);
    let dir = tempfile::tempdir()?;
    // Written fast (not power-safe), in large appends: only the open is timed.
    {
        let options = Options {
            durability: Durability::LoseRecentCommitsOnPowerLoss,
            ..Options::default()
        };
        let journal = Arc::new(SqliteJournal::open(dir.path(), options)?);
        let runtime = runtime()?;
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for worker in 0..8 {
                let journal = Arc::clone(&journal);
                tasks.push(tokio::spawn(async move {
                    for i in (worker..runs).step_by(8) {
                        let run = RunId::new(format!("run-{i}"))?;
                        let mut log = synthetic_run(&run, 14);
                        log.truncate(log.len() - 3); // leave each run mid-turn, as a crash would
                        let events: Vec<Event> = log.into_iter().map(|e| e.event).collect();
                        journal.append(&run, Seq(0), events).await?;
                    }
                    anyhow::Ok(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            anyhow::Ok(())
        })?;
    }
    let file = dir.path().join(spool_journal::store::sqlite::FILE_NAME);
    // Baseline: reading the file's bytes, the I/O floor of any open.
    let start = Instant::now();
    let bytes = std::fs::read(&file)?.len();
    std::hint::black_box(bytes);
    let read_floor = start.elapsed().as_secs_f64();
    // Open, list every run, and read and fold each one that was running,
    // a few at a time as recovering drivers do: everything a server would
    // read before its interrupted runs are all replayed.
    let runtime = runtime()?;
    let start = Instant::now();
    let (events, running) = runtime.block_on(async {
        let journal = Arc::new(SqliteJournal::open(dir.path(), Options::default())?);
        let mut events = 0usize;
        let mut running = 0usize;
        let mut reads = tokio::task::JoinSet::new();
        for summary in journal.runs().await? {
            if !summary.status.is_active() {
                continue;
            }
            if reads.len() == READS_IN_FLIGHT
                && let Some(read) = reads.join_next().await
            {
                let (n, active) = read??;
                events += n;
                running += usize::from(active);
            }
            let journal = Arc::clone(&journal);
            reads.spawn(async move {
                let log = journal.read(&summary.run_id, Seq(0)).await?;
                anyhow::Ok((log.len(), fold_log(&log).status.is_active()))
            });
        }
        while let Some(read) = reads.join_next().await {
            let (n, active) = read??;
            events += n;
            running += usize::from(active);
        }
        anyhow::Ok((events, running))
    })?;
    let open = start.elapsed().as_secs_f64();
    anyhow::ensure!(running as u64 == runs, "every run was found mid-turn");
    let serving = crate::http::until_serving(dir.path())?;
    Ok(vec![
        Row::new(
            format!("journal-open/{runs} runs, {events} events"),
            open,
            "s",
            "read the file once",
            read_floor,
        )
        .lower_is_better()
        .figure_at_most(2.0),
        Row::new(
            format!("journal-open/{runs} runs until serving"),
            serving,
            "s",
            "read the file once",
            read_floor,
        )
        .lower_is_better()
        .figure_at_most(2.0),
    ])
}
