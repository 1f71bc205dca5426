//! The NDJSON stream's body: the lines of one run (mapped in
//! [`crate::events`]) written to one client.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use spool_journal::{Envelope, RunId, Seq};
use spool_runtime::hub::{LiveDelta, StreamItem, Subscription};
use spool_wire::http::StreamEvent;
use tokio::sync::watch;
use tokio_util::sync::ReusableBoxFuture;

use crate::events::{delta_line, event_lines, lagged_line};
use crate::fanout::{Fanouts, Member, Take};
use crate::lines::LineCache;

/// Lines already read are written together up to this many bytes: one
/// wake and one write for a burst, not one per line.
pub const STREAM_BATCH_BYTES: usize = 16 * 1024;

/// Appends `lines` as NDJSON to `bytes`.
fn write_lines(bytes: &mut Vec<u8>, lines: &[StreamEvent]) {
    for line in lines {
        serde_json::to_writer(&mut *bytes, line).expect("stream lines are plain JSON");
        bytes.push(b'\n');
    }
}

/// A run's stream as a response body, polled by the connection's own
/// task. Until it has caught up it reads its own subscription: an append
/// wakes the task, which reads the new lines and writes them. Once caught
/// up it joins the run's driver (`crate::fanout`), which reads and encodes
/// each batch once for every stream joined to it, and the task only
/// writes the bytes it is handed.
///
/// A reader that stops reading holds little here: the connection stops
/// polling the body once the socket and hyper's bounded write buffer are
/// full; a joined stream keeps up to `fanout::QUEUED_BYTES` of batches
/// (shared with the other streams) and then leaves the driver, and durable
/// events wait in the journal until it reads again. Only live deltas
/// cannot wait: a reader that falls more than the hub's `DELTA_QUEUE`
/// behind them is sent a `lagged` line with the cursor to resume from, and
/// the stream ends. It never sees a silent close. The stream also ends
/// when the client goes (the connection drops the body) or when `closing`
/// turns true.
pub(crate) struct StreamBody {
    mode: Mode,
    /// Resolves when the caller's session ends before the stream does (its
    /// token revoked); absent where it cannot.
    ending: Option<ReusableBoxFuture<'static, ()>>,
    /// The connection's socket, when the run's driver may write to it:
    /// marked busy whenever a frame goes to hyper, so that nothing the
    /// driver writes overtakes it.
    tap: Option<Arc<spool_edge::tap::Tap>>,
}

enum Mode {
    /// Reading its own subscription.
    OnItsOwn(ReusableBoxFuture<'static, Next>),
    /// Writing what its run's driver hands it.
    Joined(Parts, Member),
    Ended,
}

/// What a stream's own read comes to.
enum Next {
    /// Bytes to write, and the stream to read on.
    Bytes(Lines, Bytes),
    /// The stream joined its run's driver.
    Joined(Parts, Member),
    /// The stream has ended.
    End,
}

impl StreamBody {
    pub(crate) fn new(parts: Parts, subscription: Subscription) -> Self {
        let tap = parts.tap.clone();
        let lines = Lines {
            parts,
            subscription: Box::new(subscription),
        };
        Self {
            mode: Mode::OnItsOwn(ReusableBoxFuture::new(lines.next())),
            ending: None,
            tap,
        }
    }

    /// The same stream, ended when `ending` turns true.
    pub(crate) fn ending(mut self, mut ending: watch::Receiver<bool>) -> Self {
        self.ending = Some(ReusableBoxFuture::new(async move {
            let _ = ending.wait_for(|ending| *ending).await;
        }));
        self
    }

    /// `bytes` as the next frame for hyper to write.
    fn frame(&self, bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(tap) = &self.tap {
            tap.busy();
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(ending) = &mut self.ending
            && ending.poll(cx).is_ready()
        {
            // Leaving the run's driver (dropping the member) before the
            // body ends: nothing more is written for this stream.
            self.ending = None;
            self.mode = Mode::Ended;
            return Poll::Ready(None);
        }
        loop {
            match &mut self.mode {
                Mode::Ended => return Poll::Ready(None),
                Mode::OnItsOwn(next) => match std::task::ready!(next.poll(cx)) {
                    Next::Bytes(lines, bytes) => {
                        // The same future's layout: the box is reused.
                        next.set(lines.next());
                        return self.frame(bytes);
                    }
                    Next::Joined(parts, member) => self.mode = Mode::Joined(parts, member),
                    Next::End => self.mode = Mode::Ended,
                },
                Mode::Joined(_, member) => match std::task::ready!(member.poll_take(cx)) {
                    // Marked busy as it was taken.
                    Take::Bytes(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                    Take::Ended => self.mode = Mode::Ended,
                    Take::Lagged(resting) => {
                        let Mode::Joined(parts, _) = std::mem::replace(&mut self.mode, Mode::Ended)
                        else {
                            unreachable!("matched as joined just above")
                        };
                        let last = resting.next.0.checked_sub(1).map(Seq);
                        let mut line = Vec::new();
                        write_lines(&mut line, &[lagged_line(&parts.run, last)]);
                        return self.frame(Bytes::from(line));
                    }
                    Take::OnItsOwn(subscription) => {
                        let Mode::Joined(parts, member) =
                            std::mem::replace(&mut self.mode, Mode::Ended)
                        else {
                            unreachable!("matched as joined just above")
                        };
                        drop(member);
                        let lines = Lines {
                            parts,
                            subscription,
                        };
                        self.mode = Mode::OnItsOwn(ReusableBoxFuture::new(lines.next()));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.mode, Mode::Ended)
    }
}

/// The encoded lines every stream of a run shares: a journal event's, by
/// its position, and a live delta's, by its number. When a commit or a
/// delta wakes a thousand streams, the first encodes the line and the rest
/// copy its bytes.
#[derive(Debug, Default)]
pub(crate) struct SharedLines {
    events: LineCache,
    deltas: LineCache,
}

impl SharedLines {
    pub(crate) fn event(&self, envelope: &Envelope) -> Bytes {
        self.events.line(envelope, |envelope| {
            let mut line = Vec::new();
            write_lines(&mut line, &event_lines(envelope));
            Bytes::from(line)
        })
    }

    /// A delta's line, with the time the first stream wrote it. Its `seq`
    /// is the last position before it (`after - 1`), the same on every
    /// stream: a delta is delivered just after the events before its place
    /// and before the rest.
    pub(crate) fn delta(&self, run: &RunId, delta: &LiveDelta) -> Bytes {
        // A delta's number names it within its run.
        self.deltas.get_or_encode(run, Seq(delta.n), || {
            let last = delta.after.0.checked_sub(1).map(Seq);
            let mut line = Vec::new();
            write_lines(
                &mut line,
                &[delta_line(run, last, &delta.turn, &delta.delta)],
            );
            Bytes::from(line)
        })
    }
}

/// What a stream needs whichever way it reads.
pub(crate) struct Parts {
    pub(crate) run: RunId,
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) shared: Arc<SharedLines>,
    pub(crate) fanouts: Arc<Fanouts>,
    /// The connection's socket, when its run's driver may write to it.
    pub(crate) tap: Option<Arc<spool_edge::tap::Tap>>,
    /// Counts the stream as open while it lives.
    pub(crate) _open: OpenStream,
}

/// A stream reading its own subscription; moved into each read.
struct Lines {
    parts: Parts,
    subscription: Box<Subscription>,
}

impl Lines {
    /// The next bytes to write: every line already read, up to
    /// `STREAM_BATCH_BYTES`, so a subscriber catching up after a burst is
    /// written to once. Once caught up where its run's driver rests, the
    /// stream joins it instead.
    async fn next(mut self) -> Next {
        loop {
            match self.parts.fanouts.join(self.subscription, &self.parts) {
                Ok(member) => return Next::Joined(self.parts, member),
                Err(subscription) => self.subscription = subscription,
            }
            let item = tokio::select! {
                item = self.subscription.next() => item,
                _ = self.parts.closing.wait_for(|closing| *closing) => None,
            };
            let Some(mut item) = item else {
                return Next::End;
            };
            let mut bytes = Vec::new();
            loop {
                match &item {
                    StreamItem::Event(envelope) => {
                        bytes.extend_from_slice(&self.parts.shared.event(envelope));
                    }
                    StreamItem::Delta(delta) => {
                        bytes.extend_from_slice(&self.parts.shared.delta(&self.parts.run, delta));
                    }
                    // The subscription has ended: `next` then answers
                    // `None`.
                    StreamItem::Lagged { last } => {
                        write_lines(&mut bytes, &[lagged_line(&self.parts.run, *last)]);
                    }
                }
                if bytes.len() >= STREAM_BATCH_BYTES {
                    break;
                }
                match self.subscription.ready() {
                    Some(next) => item = next,
                    None => break,
                }
            }
            // An event that reaches no client (a model call) writes nothing.
            if !bytes.is_empty() {
                return Next::Bytes(self, Bytes::from(bytes));
            }
        }
    }
}

/// One open stream, counted in [`HttpChannel::open_streams`](crate::HttpChannel::open_streams)
/// while it lives.
pub(crate) struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    pub(crate) fn new(streams: &Arc<watch::Sender<usize>>) -> Self {
        streams.send_modify(|open| *open += 1);
        Self(Arc::clone(streams))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}
