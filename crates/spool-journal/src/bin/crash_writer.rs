//! Test support for the crash tests: appends to a journal from several runs
//! at once and prints `<run> <next_seq>` after each acknowledged append,
//! until it is killed. Usage: `spool-journal-crash-writer <dir> <runs>`.

use std::io::Write;
use std::process::ExitCode;

use spool_journal::event::{RunCreated, TurnStarted};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_journal::{Event, Journal, RunId, Seq, TurnId};
use spool_wire::run::TurnPolicy;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(runs)) = (
        args.first(),
        args.get(1).and_then(|n| n.parse::<usize>().ok()),
    ) else {
        let _ = writeln!(
            std::io::stderr(),
            "usage: spool-journal-crash-writer <dir> <runs>"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "crash-writer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let journal = match SqliteJournal::open(dir, Options::default()) {
        Ok(journal) => std::sync::Arc::new(journal),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "crash-writer: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for i in 0..runs {
            let journal = std::sync::Arc::clone(&journal);
            tasks.push(tokio::spawn(async move {
                let run = RunId::new(format!("crash-{i}")).expect("crash-N is a valid run id");
                let mut next = Seq(0);
                loop {
                    let events = if next == Seq(0) {
                        vec![Event::RunCreated(RunCreated::default())]
                    } else {
                        // Batches of one to three events, so commits hold
                        // appends of several sizes.
                        (0..=(next.0 % 3))
                            .map(|k| {
                                Event::TurnStarted(TurnStarted {
                                    turn_id: TurnId::new(format!("t{}-{k}", next.0))
                                        .expect("a valid turn id"),
                                    input: "x".repeat(64),
                                    context: Vec::new(),
                                    policy: TurnPolicy::Steer,
                                    from_queue: None,
                                    operation_id: None,
                                })
                            })
                            .collect()
                    };
                    match journal.append(&run, next, events).await {
                        Ok(appended) => {
                            next = appended.last().map_or(next, |e| e.seq.next());
                            let mut out = std::io::stdout().lock();
                            if writeln!(out, "{run} {next}")
                                .and_then(|()| out.flush())
                                .is_err()
                            {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = writeln!(std::io::stderr(), "crash-writer: append failed: {e}");
                            return;
                        }
                    }
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
    });
    ExitCode::FAILURE
}
