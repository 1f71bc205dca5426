//! Bounded queues between the journal and the collector. A record is
//! queued without waiting; a full queue drops it and counts the drop (a
//! collector that is down never slows a turn or grows memory). A task per
//! signal sends batches, retries a failed one with backoff, and on close
//! sends what is queued within the deadline it is given. A batch that
//! fails every attempt holds the signal off for a while (1 s, doubling to
//! 30 s, reset by a success): batches meanwhile are dropped unsent, so a
//! dead collector costs no encoding or connecting.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Records queued per signal before new ones are dropped.
pub const QUEUE: usize = 8192;
/// Records per export.
pub const BATCH: usize = 512;
/// How long a record may wait for a batch to fill.
pub const LINGER: Duration = Duration::from_secs(1);
/// Attempts per batch.
const ATTEMPTS: u32 = 3;
/// The first retry's wait; each next one doubles.
const BACKOFF: Duration = Duration::from_millis(500);
/// The first hold-off after a batch failed every attempt, and the longest.
const HOLD_OFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// What one signal's queue has seen.
#[derive(Debug, Default)]
pub struct Counts {
    /// Records sent and accepted.
    pub exported: AtomicU64,
    /// Records dropped: the queue full, or a batch failed every attempt.
    pub dropped: AtomicU64,
}

/// The sending side of a signal's queue.
#[derive(Debug)]
pub struct Queue<T> {
    what: &'static str,
    sender: mpsc::Sender<T>,
    counts: Arc<Counts>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            what: self.what,
            sender: self.sender.clone(),
            counts: Arc::clone(&self.counts),
        }
    }
}

impl<T> Queue<T> {
    /// A queue of `QUEUE` records and its receiving end.
    pub(crate) fn bounded(what: &'static str) -> (Self, mpsc::Receiver<T>, Arc<Counts>) {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let counts = Arc::new(Counts::default());
        let queue = Self {
            what,
            sender,
            counts: Arc::clone(&counts),
        };
        (queue, receiver, counts)
    }

    /// Queues `record`, or drops and counts it when the queue is full.
    pub(crate) fn push(&self, record: T) {
        if self.sender.try_send(record).is_err() {
            dropped(self.what, &self.counts, 1, "the queue is full");
        }
    }
}

/// Counts a drop; warns on the first and then at each power of two, so a
/// collector down for hours does not flood the log.
fn dropped(what: &str, counts: &Counts, n: u64, why: &str) {
    let before = counts.dropped.fetch_add(n, Ordering::Relaxed);
    let after = before + n;
    if before == 0 || (before + 1..=after).any(u64::is_power_of_two) {
        tracing::warn!(signal = what, dropped = after, why, "telemetry dropped");
    }
}

/// A signal's queue and the task that drains it into `export`, which
/// sends one batch. The task ends when `close` fires, after sending what
/// is queued (each remaining batch tried once).
pub(crate) fn start<T, F, Fut>(
    what: &'static str,
    export: F,
    close: CancellationToken,
) -> (Queue<T>, Arc<Counts>, tokio::task::JoinHandle<()>)
where
    T: Clone + Send + Sync + 'static,
    F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = OTelSdkResult> + Send,
{
    let (queue, mut receiver, counts) = Queue::bounded(what);
    let task_counts = Arc::clone(&counts);
    let task = tokio::spawn(async move {
        let mut hold = Hold::default();
        loop {
            let first = tokio::select! {
                record = receiver.recv() => record,
                () = close.cancelled() => None,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            let linger = tokio::time::sleep(LINGER);
            tokio::pin!(linger);
            while batch.len() < BATCH {
                tokio::select! {
                    record = receiver.recv() => match record {
                        Some(record) => batch.push(record),
                        None => break,
                    },
                    () = &mut linger => break,
                    () = close.cancelled() => break,
                }
            }
            if hold.holding() {
                dropped(
                    what,
                    &task_counts,
                    batch.len() as u64,
                    "the collector is down",
                );
                continue;
            }
            let attempts = if close.is_cancelled() { 1 } else { ATTEMPTS };
            let sent = send(what, &export, batch, attempts, &task_counts).await;
            hold.after(sent);
        }
        // Closing: what is queued goes out once, in batches.
        let mut batch = Vec::new();
        while let Ok(record) = receiver.try_recv() {
            batch.push(record);
            if batch.len() == BATCH {
                send(what, &export, std::mem::take(&mut batch), 1, &task_counts).await;
            }
        }
        if !batch.is_empty() {
            send(what, &export, batch, 1, &task_counts).await;
        }
    });
    (queue, counts, task)
}

/// Whether sending is held off, and for how long next time.
#[derive(Debug)]
struct Hold {
    until: Option<tokio::time::Instant>,
    next: Duration,
}

impl Default for Hold {
    fn default() -> Self {
        Self {
            until: None,
            next: HOLD_OFF.0,
        }
    }
}

impl Hold {
    fn holding(&self) -> bool {
        self.until
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    fn after(&mut self, sent: bool) {
        if sent {
            *self = Self::default();
        } else {
            self.until = Some(tokio::time::Instant::now() + self.next);
            self.next = (self.next * 2).min(HOLD_OFF.1);
        }
    }
}

/// Sends a batch; whether the collector took it.
async fn send<T, F, Fut>(
    what: &'static str,
    export: &F,
    batch: Vec<T>,
    attempts: u32,
    counts: &Counts,
) -> bool
where
    T: Clone,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = OTelSdkResult>,
{
    let n = batch.len() as u64;
    let mut wait = BACKOFF;
    for attempt in 1..=attempts {
        match export(batch.clone()).await {
            Ok(()) => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
                return true;
            }
            Err(error) if attempt == attempts => {
                tracing::debug!(signal = what, %error, "a telemetry batch failed");
                dropped(what, counts, n, "the collector did not take the batch");
                return false;
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
    false
}
