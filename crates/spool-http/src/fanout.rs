//! One reader for all the streams of a run that are caught up: a driver
//! task holds one subscription, encodes each batch of lines once, and
//! hands the same bytes to every stream that joined it.
//!
//! A stream reads its catch-up through its own subscription. Once that
//! subscription rests where the run's driver rests (the same next position
//! and the same live delta: from there both deliver the same items), the
//! stream joins the driver and lets its own subscription go: a commit then
//! wakes one task per run, not one per stream, and each stream's task only
//! writes bytes already made. With no driver for the run, the first stream
//! to rest gives its subscription to a new one.
//!
//! On a plain TCP connection the driver writes a joined stream's batches
//! to its socket itself, as HTTP/1.1 chunks, when the socket takes them
//! whole (`crate::tap`): the stream's task is not woken at all. What the
//! socket does not take is queued for the stream's task, which writes it
//! as before.
//!
//! A stream that does not keep up is not cut off: once it has more than
//! [`QUEUED_BYTES`] waiting it is handed one last batch and a copy of the
//! driver's subscription as it stands after that batch
//! ([`Subscription::fork`]), and leaves. It writes what was queued, then
//! goes on at its own pace from there, its live deltas waiting in its own
//! queue as any slow subscriber's do, until it rests beside the driver
//! again. The driver ends when its last stream leaves, when the server
//! closes its streams, or when its subscription ends. A driver that fell
//! behind the live deltas ends too: each of its streams is sent the
//! `lagged` line with its own last position, as a subscriber of its own
//! that fell behind would be.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes};
use spool_journal::RunId;
use spool_runtime::hub::{Resting, StreamItem, Subscription};
use tokio::sync::{Notify, watch};

use crate::stream::{Parts, SharedLines};
use crate::tap::Tap;

/// How many bytes a stream may have waiting for its socket before it
/// leaves its run's driver to go on at its own pace. A stalled socket
/// holds the batches handed to it, shared with the other streams, up to
/// here.
pub(crate) const QUEUED_BYTES: usize = 256 * 1024;

/// The runs with a driver.
#[derive(Debug, Default)]
pub(crate) struct Fanouts {
    runs: Mutex<HashMap<RunId, Arc<Fanout>>>,
}

/// One run's driver, as its streams see it.
#[derive(Debug)]
pub(crate) struct Fanout {
    run: RunId,
    state: Mutex<State>,
    /// Wakes the driver when its last stream has left.
    emptied: Notify,
}

#[derive(Debug)]
struct State {
    /// Where the driver's subscription rests after the last batch it
    /// handed out.
    resting: Resting,
    members: Vec<Arc<Slot>>,
    /// Ended: a stream that finds it so starts another driver.
    closed: bool,
}

/// A stream's share of its run's driver: the batches waiting for its
/// socket.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The stream's socket, when the driver may write to it.
    tap: Option<Arc<Tap>>,
    inner: Mutex<Queue>,
}

#[derive(Debug)]
struct Queue {
    /// The rest of a chunk the driver began on the socket: written by the
    /// stream's task before anything else.
    raw: Bytes,
    batches: VecDeque<Bytes>,
    bytes: usize,
    /// Where the driver rested after the last batch queued here: where the
    /// stream goes on from if it leaves.
    resting: Resting,
    waker: Option<Waker>,
    end: End,
}

#[derive(Debug)]
enum End {
    /// Batches may still come.
    Open,
    /// The stream ends once what is queued is written.
    Ended,
    /// The stream ends with a `lagged` line once what is queued is written.
    Lagged,
    /// The stream goes on with this subscription once what is queued is
    /// written.
    OnItsOwn(Box<Subscription>),
}

/// What a joined stream writes next.
pub(crate) enum Take {
    /// Bytes to write.
    Bytes(Bytes),
    /// Nothing more: the stream ends.
    Ended,
    /// The stream ends with the `lagged` line: it resumes from its last
    /// position.
    Lagged(Resting),
    /// Go on with this subscription.
    OnItsOwn(Box<Subscription>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stream joined to its run's driver; leaves it when dropped.
#[derive(Debug)]
pub(crate) struct Member {
    fanout: Arc<Fanout>,
    slot: Arc<Slot>,
}

impl Member {
    /// The next bytes queued for this stream, or how it goes on.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Take> {
        let mut queue = lock(&self.slot.inner);
        while !queue.raw.is_empty() {
            let written = match &self.slot.tap {
                Some(tap) => ready!(tap.poll_write(cx, &queue.raw)),
                None => Ok(0),
            };
            match written {
                Ok(n) if n > 0 => queue.raw.advance(n),
                // The connection is gone (hyper finds so too): nothing
                // more can be written to it.
                _ => {
                    queue.raw.clear();
                    queue.batches.clear();
                    queue.bytes = 0;
                    return Poll::Ready(Take::Ended);
                }
            }
        }
        if let Some(batch) = queue.batches.pop_front() {
            queue.bytes -= batch.len();
            if let Some(tap) = &self.slot.tap {
                // hyper writes it: nothing goes past hyper until it has.
                tap.busy();
            }
            return Poll::Ready(Take::Bytes(batch));
        }
        match std::mem::replace(&mut queue.end, End::Ended) {
            End::Open => {
                queue.end = End::Open;
                if !queue
                    .waker
                    .as_ref()
                    .is_some_and(|waker| waker.will_wake(cx.waker()))
                {
                    queue.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            End::Ended => Poll::Ready(Take::Ended),
            End::Lagged => Poll::Ready(Take::Lagged(queue.resting)),
            End::OnItsOwn(subscription) => Poll::Ready(Take::OnItsOwn(subscription)),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut state = lock(&self.fanout.state);
        state.members.retain(|slot| !Arc::ptr_eq(slot, &self.slot));
        if state.members.is_empty() && !state.closed {
            state.closed = true;
            drop(state);
            self.fanout.emptied.notify_one();
        }
    }
}

impl Fanouts {
    /// Joins a stream (`stream`: its run, lines, shutdown signal and
    /// socket) whose own subscription rests to its run's driver,
    /// or makes that subscription the driver's when the run has none.
    /// Gives the subscription back when the stream cannot join yet: it
    /// has items waiting, or the driver rests elsewhere.
    pub(crate) fn join(
        self: &Arc<Self>,
        subscription: Box<Subscription>,
        stream: &Parts,
    ) -> Result<Member, Box<Subscription>> {
        let Some(resting) = subscription.resting() else {
            return Err(subscription);
        };
        let slot = Arc::new(Slot {
            tap: stream.tap.clone(),
            inner: Mutex::new(Queue {
                raw: Bytes::new(),
                batches: VecDeque::new(),
                bytes: 0,
                resting,
                waker: None,
                end: End::Open,
            }),
        });
        let run = &stream.run;
        let mut runs = lock(&self.runs);
        if let Some(fanout) = runs.get(run) {
            let mut state = lock(&fanout.state);
            if !state.closed {
                if state.resting != resting {
                    return Err(subscription);
                }
                state.members.push(Arc::clone(&slot));
                drop(state);
                return Ok(Member {
                    fanout: Arc::clone(fanout),
                    slot,
                });
            }
        }
        let fanout = Arc::new(Fanout {
            run: run.clone(),
            state: Mutex::new(State {
                resting,
                members: vec![Arc::clone(&slot)],
                closed: false,
            }),
            emptied: Notify::new(),
        });
        runs.insert(run.clone(), Arc::clone(&fanout));
        drop(runs);
        tokio::spawn(drive(
            Arc::clone(self),
            Arc::clone(&fanout),
            subscription,
            Arc::clone(&stream.shared),
            stream.closing.clone(),
        ));
        Ok(Member { fanout, slot })
    }

    /// Forgets `fanout` if it is still its run's driver.
    fn forget(&self, fanout: &Arc<Fanout>) {
        let mut runs = lock(&self.runs);
        if runs
            .get(&fanout.run)
            .is_some_and(|current| Arc::ptr_eq(current, fanout))
        {
            runs.remove(&fanout.run);
        }
    }
}

/// Why a driver stopped.
enum Stop {
    /// Its streams end (the server closes them, the journal closed, or
    /// nobody is left).
    End,
    /// It fell behind the live deltas: its streams end with `lagged`.
    Lagged,
}

/// The driver: reads the run's items once, encodes them once, and queues
/// the same bytes for every stream joined to it. A batch is handed out only
/// where the subscription rests, so every stream's place between batches
/// is one a subscription of its own can go on from.
async fn drive(
    fanouts: Arc<Fanouts>,
    fanout: Arc<Fanout>,
    mut subscription: Box<Subscription>,
    lines: Arc<SharedLines>,
    mut closing: watch::Receiver<bool>,
) {
    let mut bytes = Vec::new();
    let stop = loop {
        let item = tokio::select! {
            item = subscription.next() => item,
            _ = closing.wait_for(|closing| *closing) => break Stop::End,
            () = fanout.emptied.notified() => {
                if lock(&fanout.state).closed {
                    break Stop::End;
                }
                continue;
            }
        };
        let Some(mut item) = item else {
            // The journal closed: what was read is handed out, then the
            // streams end, as a subscription of their own would.
            if !bytes.is_empty() {
                let resting = lock(&fanout.state).resting;
                hand_out(
                    &fanout,
                    std::mem::take(&mut bytes),
                    resting,
                    &mut subscription,
                );
            }
            break Stop::End;
        };
        loop {
            match &item {
                StreamItem::Event(envelope) => bytes.extend_from_slice(&lines.event(envelope)),
                StreamItem::Delta(delta) => {
                    bytes.extend_from_slice(&lines.delta(&fanout.run, delta));
                }
                // The driver fell behind the live deltas: so did its
                // streams, which end where its last batch left them.
                StreamItem::Lagged { .. } => break,
            }
            match subscription.ready() {
                Some(next) => item = next,
                None => break,
            }
        }
        if matches!(item, StreamItem::Lagged { .. }) {
            break Stop::Lagged;
        }
        // Held back until the subscription rests (a delta read ahead of
        // the event before it is placed by the next read).
        let Some(resting) = subscription.resting() else {
            continue;
        };
        if bytes.is_empty() {
            lock(&fanout.state).resting = resting;
        } else if !hand_out(
            &fanout,
            std::mem::take(&mut bytes),
            resting,
            &mut subscription,
        ) {
            break Stop::End;
        }
    };
    fanouts.forget(&fanout);
    let members = {
        let mut state = lock(&fanout.state);
        state.closed = true;
        std::mem::take(&mut state.members)
    };
    for slot in members {
        let mut queue = lock(&slot.inner);
        queue.end = match stop {
            Stop::End => End::Ended,
            Stop::Lagged => End::Lagged,
        };
        let waker = queue.waker.take();
        drop(queue);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Queues `bytes` for every stream joined to `fanout`; `subscription`
/// rests at `resting` after them. A stream that already had more than
/// [`QUEUED_BYTES`] waiting leaves with them and a fork of `subscription`.
/// Whether any stream is still joined.
fn hand_out(
    fanout: &Fanout,
    bytes: Vec<u8>,
    resting: Resting,
    subscription: &mut Subscription,
) -> bool {
    let batch = Bytes::from(bytes);
    // Framed once, for every socket written here.
    let mut framed = None;
    let mut state = lock(&fanout.state);
    state.resting = resting;
    state.members.retain(|slot| {
        let mut queue = lock(&slot.inner);
        if let Some(tap) = &slot.tap
            && queue.raw.is_empty()
            && queue.batches.is_empty()
            && tap.flushed()
        {
            let framed = framed.get_or_insert_with(|| crate::tap::chunk(&batch));
            // Would block, or broken: the batch is queued below, and the
            // stream's task writes it or finds the connection gone.
            if let Ok(n) = tap.try_write(framed) {
                queue.resting = resting;
                if n < framed.len() {
                    queue.raw = framed.slice(n..);
                    if let Some(waker) = queue.waker.take() {
                        waker.wake();
                    }
                }
                return true;
            }
        }
        let stays = queue.bytes + queue.raw.len() <= QUEUED_BYTES;
        queue.bytes += batch.len();
        queue.batches.push_back(batch.clone());
        queue.resting = resting;
        if !stays {
            queue.end = End::OnItsOwn(Box::new(subscription.fork()));
        }
        let waker = queue.waker.take();
        drop(queue);
        if let Some(waker) = waker {
            waker.wake();
        }
        stays
    });
    if state.members.is_empty() {
        // Nobody can join an emptied driver: it is ending.
        state.closed = true;
        return false;
    }
    true
}
