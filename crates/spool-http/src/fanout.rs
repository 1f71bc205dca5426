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
//! A batch goes out in one sweep over the streams ([`sweep`]) that looks
//! for lines read meanwhile every few streams and sends them with it to
//! the streams after: a turn's two or three batches reach most streams
//! in one write, and the last stream about one pass after they were made.
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
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes};
use spool_journal::RunId;
use spool_runtime::hub::{Resting, StreamItem, Subscription};
use tokio::sync::{Notify, watch};

use crate::stream::{Parts, SharedLines};
use spool_edge::tap::Tap;

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

impl Slot {
    /// A stream's empty share, joining where the driver rests.
    fn new(tap: Option<Arc<Tap>>, resting: Resting) -> Arc<Self> {
        Arc::new(Self {
            tap,
            inner: Mutex::new(Queue {
                raw: Bytes::new(),
                batches: VecDeque::new(),
                bytes: 0,
                resting,
                waker: None,
                end: End::Open,
            }),
        })
    }
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
        let slot = Slot::new(stream.tap.clone(), resting);
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
#[derive(Clone, Copy)]
enum Stop {
    /// Its streams end (the server closes them, the journal closed, or
    /// nobody is left).
    End,
    /// It fell behind the live deltas: its streams end with `lagged`.
    Lagged,
}

/// How many streams a sweep writes between two looks at its run for
/// lines read since it began.
const PICK_UP_EVERY: usize = 16;

/// How many passes over its streams a sweep looks for new lines in; the
/// passes after only bring the streams passed before a pick-up up to
/// date, so a run that never stops sending holds its streams' joins and
/// leaves back for a bounded time.
const PICKING_PASSES: usize = 2;

/// Lines read and encoded once, handed out together: the subscription
/// rests at `resting` after them.
struct Batch {
    bytes: Bytes,
    resting: Resting,
}

/// The driver's side of its run: one subscription, its lines encoded
/// once. A read in progress lives here between polls, so a sweep can look
/// for new lines between two sockets without waiting and without losing a
/// read it began.
struct Reader {
    subscription: Arc<tokio::sync::Mutex<Subscription>>,
    reading: Option<Pin<Box<dyn Future<Output = Option<StreamItem>> + Send>>>,
    run: RunId,
    lines: Arc<SharedLines>,
    /// Lines read since the subscription last rested: handed out with the
    /// batch that ends where it rests again.
    bytes: Vec<u8>,
    /// Set once the subscription has ended.
    stopped: Option<Stop>,
}

impl Reader {
    fn new(subscription: Subscription, run: RunId, lines: Arc<SharedLines>) -> Self {
        Self {
            subscription: Arc::new(tokio::sync::Mutex::new(subscription)),
            reading: None,
            run,
            lines,
            bytes: Vec::new(),
            stopped: None,
        }
    }

    /// The subscription's next item, its read kept across polls.
    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        let reading = self.reading.get_or_insert_with(|| {
            let subscription = Arc::clone(&self.subscription);
            Box::pin(async move { subscription.lock_owned().await.next().await })
        });
        let item = ready!(reading.as_mut().poll(cx));
        self.reading = None;
        Poll::Ready(item)
    }

    /// Encodes `item` and the items ready behind it: the batch they
    /// complete, once the subscription rests (its bytes empty when they
    /// made no line).
    fn read(&mut self, item: Option<StreamItem>) -> Option<Batch> {
        let Some(item) = item else {
            self.stopped = Some(Stop::End);
            return None;
        };
        if !self.encode(&item) {
            return None;
        }
        // No read is in progress (the one that gave `item` let go); were
        // one, the items ready behind would wait for the next read.
        let subscription = Arc::clone(&self.subscription);
        let mut subscription = subscription.try_lock().ok()?;
        while let Some(item) = subscription.ready() {
            if !self.encode(&item) {
                return None;
            }
        }
        // Held back until the subscription rests (a delta read ahead of
        // the event before it is placed by the next read).
        let resting = subscription.resting()?;
        Some(Batch {
            bytes: Bytes::from(std::mem::take(&mut self.bytes)),
            resting,
        })
    }

    /// Adds `item`'s line; false once the subscription fell behind the
    /// live deltas.
    fn encode(&mut self, item: &StreamItem) -> bool {
        match item {
            StreamItem::Event(envelope) => {
                self.bytes.extend_from_slice(&self.lines.event(envelope));
            }
            StreamItem::Delta(delta) => {
                self.bytes
                    .extend_from_slice(&self.lines.delta(&self.run, delta));
            }
            // The driver fell behind the live deltas: so did its streams,
            // which end where its last batch left them.
            StreamItem::Lagged { .. } => {
                self.stopped = Some(Stop::Lagged);
                return false;
            }
        }
        true
    }

    /// The batch read since the last look, without waiting.
    fn pick_up(&mut self) -> Option<Batch> {
        if self.stopped.is_some() {
            return None;
        }
        // Outside the task's budget: a sweep looks many times before it
        // yields, and a look refused for the budget would find nothing.
        let mut look = std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(
            |cx| self.poll_item(cx)
        )));
        match look.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(item) => self.read(item),
            Poll::Pending => None,
        }
    }

    /// A copy of the subscription where it rests, for a stream that goes
    /// on at its own pace; `None` while lines read are not handed out yet
    /// or the subscription does not rest. A read in progress is given up
    /// (`Subscription::next` loses nothing to that).
    fn fork(&mut self) -> Option<Box<Subscription>> {
        if !self.bytes.is_empty() || self.stopped.is_some() {
            return None;
        }
        self.reading = None;
        let mut subscription = self.subscription.try_lock().ok()?;
        subscription.resting()?;
        Some(Box::new(subscription.fork()))
    }
}

/// The driver: reads the run's items once, encodes them once, and hands
/// the same bytes to every stream joined to it. A batch is handed out only
/// where the subscription rests, so every stream's place between batches
/// is one a subscription of its own can go on from.
async fn drive(
    fanouts: Arc<Fanouts>,
    fanout: Arc<Fanout>,
    subscription: Box<Subscription>,
    lines: Arc<SharedLines>,
    mut closing: watch::Receiver<bool>,
) {
    let mut reader = Reader::new(*subscription, fanout.run.clone(), lines);
    let stop = loop {
        let item = tokio::select! {
            item = std::future::poll_fn(|cx| reader.poll_item(cx)) => item,
            _ = closing.wait_for(|closing| *closing) => break Stop::End,
            () = fanout.emptied.notified() => {
                if lock(&fanout.state).closed {
                    break Stop::End;
                }
                continue;
            }
        };
        let joined = match reader.read(item) {
            Some(batch) if batch.bytes.is_empty() => {
                lock(&fanout.state).resting = batch.resting;
                true
            }
            Some(batch) => sweep(&fanout, batch, &mut reader),
            None => true,
        };
        if !joined {
            break Stop::End;
        }
        match reader.stopped {
            None => {}
            Some(Stop::Lagged) => break Stop::Lagged,
            Some(Stop::End) => {
                // The journal closed: what was read is handed out, then
                // the streams end, as a subscription of their own would.
                if !reader.bytes.is_empty() {
                    let resting = lock(&fanout.state).resting;
                    let bytes = Bytes::from(std::mem::take(&mut reader.bytes));
                    sweep(&fanout, Batch { bytes, resting }, &mut reader);
                }
                break Stop::End;
            }
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

/// Hands `first` to every stream joined to `fanout`, in one pass over
/// them, and the batches read while it goes: every few streams it looks
/// for lines read since it began, and the streams after that get them in
/// the same write; a later pass brings the streams before up to date. A
/// turn's lines thus reach the last stream about one pass after they were
/// made, where a pass per batch would add up the passes. Whether any
/// stream is still joined.
fn sweep(fanout: &Fanout, first: Batch, reader: &mut Reader) -> bool {
    let mut resting = first.resting;
    let mut batches = vec![first];
    // Per place in `batches`: the chunk of everything from there, framed
    // once for every socket written from there.
    let mut framed: Vec<Option<Bytes>> = vec![None];
    let mut state = lock(&fanout.state);
    let count = state.members.len();
    // Per stream: how many of `batches` it was handed, and whether it left.
    let mut given = vec![0; count];
    let mut left = vec![false; count];
    // Streams already over their share are handed `first` before anything
    // else is read: the subscription rests right after it, so they leave
    // here with an exact fork. (One that goes over during the sweep may
    // find the subscription between two places and wait for the next.)
    for (index, slot) in state.members.iter().enumerate() {
        let over = {
            let queue = lock(&slot.inner);
            queue.bytes + queue.raw.len() > QUEUED_BYTES
        };
        if over {
            left[index] = !give(slot, &batches, &mut framed[0], reader);
            given[index] = 1;
        }
    }
    let mut passes = 0;
    loop {
        let picking = passes < PICKING_PASSES;
        for index in 0..count {
            if picking
                && index % PICK_UP_EVERY == PICK_UP_EVERY - 1
                && let Some(batch) = reader.pick_up()
            {
                resting = batch.resting;
                if !batch.bytes.is_empty() {
                    batches.push(batch);
                    framed.clear();
                    framed.resize(batches.len(), None);
                }
            }
            let from = given[index];
            if left[index] || from == batches.len() {
                continue;
            }
            let stays = give(
                &state.members[index],
                &batches[from..],
                &mut framed[from],
                reader,
            );
            left[index] = !stays;
            given[index] = batches.len();
        }
        passes += 1;
        if (0..count).all(|index| left[index] || given[index] == batches.len()) {
            break;
        }
    }
    state.resting = resting;
    let mut index = 0;
    state.members.retain(|_| {
        index += 1;
        !left[index - 1]
    });
    if state.members.is_empty() {
        // Nobody can join an emptied driver: it is ending.
        state.closed = true;
        return false;
    }
    true
}

/// Hands `batches` to one stream: written to its socket at once when the
/// driver may, else queued for its task. A stream that already had more
/// than [`QUEUED_BYTES`] waiting leaves with them and a fork of the
/// driver's subscription when the subscription rests right after them
/// (always so at the start of a sweep). Whether the stream stays.
fn give(slot: &Slot, batches: &[Batch], framed: &mut Option<Bytes>, reader: &mut Reader) -> bool {
    let Some(last) = batches.last() else {
        return true;
    };
    let mut queue = lock(&slot.inner);
    if let Some(tap) = &slot.tap
        && queue.raw.is_empty()
        && queue.batches.is_empty()
        && tap.flushed()
    {
        let framed = framed.get_or_insert_with(|| {
            spool_edge::tap::chunk(batches.iter().map(|batch| &batch.bytes[..]))
        });
        // Would block, or broken: the batches are queued below, and the
        // stream's task writes them or finds the connection gone.
        if let Ok(n) = tap.try_write(framed) {
            queue.resting = last.resting;
            if n < framed.len() {
                queue.raw = framed.slice(n..);
                if let Some(waker) = queue.waker.take() {
                    waker.wake();
                }
            }
            return true;
        }
    }
    let over = queue.bytes + queue.raw.len() > QUEUED_BYTES;
    for batch in batches {
        queue.bytes += batch.bytes.len();
        queue.batches.push_back(batch.bytes.clone());
    }
    queue.resting = last.resting;
    // A stream over its share waits, queued, for the next hand-out where
    // the subscription rests right after what it was given.
    let leaves = over
        && reader.fork().is_some_and(|fork| {
            queue.end = End::OnItsOwn(fork);
            true
        });
    let waker = queue.waker.take();
    drop(queue);
    if let Some(waker) = waker {
        waker.wake();
    }
    !leaves
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_edge::tap::{SharedTcp, chunk};
    use spool_journal::store::memory::MemoryJournal;
    use spool_runtime::{Accepted, MessageRequest, Runtime, StartRequest};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// How long a test waits for bytes that should already be on the wire.
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

    /// Slots whose sockets the driver may write (hyper has flushed), resting
    /// at `resting`; the client end of each, and the server ends as hyper
    /// holds them.
    async fn tapped(
        count: usize,
        resting: Resting,
    ) -> (Vec<Arc<Slot>>, Vec<TcpStream>, Vec<SharedTcp>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut slots, mut clients, mut servers) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..count {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (mut shared, tap) = SharedTcp::new(listener.accept().await.unwrap().0);
            shared.flush().await.unwrap();
            servers.push(shared);
            slots.push(Slot::new(Some(tap), resting));
        }
        (slots, clients, servers)
    }

    async fn turn(runtime: &Runtime, run: Option<&RunId>, text: &str) -> RunId {
        let accepted = match run {
            None => {
                let start = StartRequest {
                    text: text.into(),
                    ..StartRequest::default()
                };
                runtime.start(start).await
            }
            Some(run) => {
                let message = MessageRequest {
                    text: text.into(),
                    ..MessageRequest::default()
                };
                runtime.send(run, message).await
            }
        }
        .unwrap();
        let Accepted::Started { run, turn } = accepted else {
            panic!("a turn of an idle run starts: {accepted:?}")
        };
        runtime.wait_for(&run, &turn).await.unwrap();
        run
    }

    async fn read_exactly(client: &mut TcpStream, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        tokio::time::timeout(PATIENCE, client.read_exact(&mut bytes))
            .await
            .expect("the driver wrote the bytes")
            .unwrap();
        bytes
    }

    #[tokio::test]
    async fn lines_read_during_a_sweep_reach_the_streams_after_it_in_the_same_write() {
        let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
        let run = turn(&runtime, None, "one").await;
        let mut reader = Reader::new(
            runtime.subscribe(&run, None).await.unwrap(),
            run.clone(),
            Arc::default(),
        );
        let item = std::future::poll_fn(|cx| reader.poll_item(cx)).await;
        let first = reader.read(item).expect("a finished turn rests");
        // Durable before the sweep begins: its first look finds it.
        turn(&runtime, Some(&run), "two").await;
        let streams = 2 * PICK_UP_EVERY;
        let (slots, mut clients, _servers) = tapped(streams, first.resting).await;
        let fanout = Fanout {
            run: run.clone(),
            state: Mutex::new(State {
                resting: first.resting,
                members: slots.clone(),
                closed: false,
            }),
            emptied: Notify::new(),
        };
        let first_bytes = first.bytes.clone();
        assert!(sweep(&fanout, first, &mut reader));

        // The stream where the sweep first looked, and every one after it,
        // got both turns in one chunk.
        let looked = PICK_UP_EVERY - 1;
        let mut second = None;
        for client in &mut clients[looked..] {
            let head = read_exactly(client, 64).await;
            let size_end = head.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&head[..size_end]).unwrap(), 16).unwrap();
            let mut framed = head;
            framed.extend(read_exactly(client, size_end + 2 + size + 2 - framed.len()).await);
            let payload = &framed[size_end + 2..framed.len() - 2];
            assert!(
                payload.starts_with(&first_bytes),
                "the first turn's lines come first"
            );
            let rest = Bytes::copy_from_slice(&payload[first_bytes.len()..]);
            assert!(
                String::from_utf8_lossy(&rest).contains("two"),
                "the second turn's lines follow in the same chunk"
            );
            assert_eq!(*second.get_or_insert_with(|| rest.clone()), rest);
        }
        // The streams before it got the first turn, then the second turn
        // in the next pass: the same bytes, in two chunks.
        let second = second.unwrap();
        let expected = [
            chunk([&first_bytes[..]].into_iter()),
            chunk([&second[..]].into_iter()),
        ]
        .concat();
        for client in &mut clients[..looked] {
            assert_eq!(read_exactly(client, expected.len()).await, expected);
        }
        // Every stream, and the driver, rest after the second turn. (A
        // look that found nothing left its read waiting.)
        reader.reading = None;
        let resting = reader.subscription.try_lock().unwrap().resting().unwrap();
        assert_eq!(lock(&fanout.state).resting, resting);
        for slot in &slots {
            assert_eq!(lock(&slot.inner).resting, resting);
        }
    }
}
