//! The turn driver: one task per run with work to do. It reads what the
//! run needs from the run's cached state and walks the current turn with
//! the journal's replay cursor, so recorded model and tool results come
//! back and only a permit from the cursor lets it act.
//!
//! `model` holds a turn's model steps, `tool_call` its tool steps. A panic
//! in an engine or a tool (a host's code) is caught where it is called and
//! fails the turn with `internal`; a panic anywhere else in a driver is
//! caught around the driver, logged, and fails the turn the same way, so no
//! run is left wedged behind a dead driver.

use std::any::Any;
use std::sync::{Arc, PoisonError};
use std::task::Poll;

use spool_journal::event::{SleepCompleted, SleepStarted, TurnCancelled, TurnFailed, TurnStarted};
use spool_journal::fold::Status;
use spool_journal::{Event, RunId, Seq, TurnId};
use spool_wire::run::FailureCode;
use tokio_util::sync::CancellationToken;

use crate::BoxFuture;
use crate::error::{ErrorKind, RuntimeError};
use crate::runtime::{Driving, Inner};

mod model;
mod tool_call;

/// What the driver should do next, from the run's state.
enum Work {
    Turn,
    EndParkedTurn(TurnId),
    StartQueued,
    Nothing,
}

impl Inner {
    /// Starts the run's driver unless one is running; a running driver is
    /// told to look again before it stops.
    pub(crate) fn ensure_driver(self: Arc<Self>, run: &RunId) {
        self.storage.unstall(run);
        // A runtime that is stopping starts nothing: the run waits in the
        // journal for the next start's recovery.
        if self.tasks.stopping() {
            return;
        }
        {
            let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = driving.get_mut(run) {
                entry.dirty = true;
                return;
            }
            driving.insert(run.clone(), Driving::default());
        }
        let (inner, driven) = (Arc::clone(&self), run.clone());
        // The driver's span carries its run: what it logs, and the journal
        // appends it waits on, can be told apart by run
        // (`RUST_LOG=spool=debug`).
        let span = tracing::debug_span!(target: "spool::runtime", "run", run_id = %run);
        let driving = async move {
            let driver = Box::pin(Arc::clone(&inner).drive(driven.clone()));
            if let Err(panic) = polled(driver).await {
                tracing::error!(run_id = %driven, %panic, "a run's driver panicked; its turn fails");
                let message = format!("the runtime's driver panicked: {panic}");
                inner.fail_turn_logged(&driven, &message).await;
                inner.stop_driving(&driven);
            }
        };
        let started = self
            .tasks
            .spawn(tracing::Instrument::instrument(driving, span));
        if !started {
            self.stop_driving(run);
        }
    }

    async fn drive(self: Arc<Self>, run: RunId) {
        loop {
            let before = match self.lock(&run).await {
                Ok(locked) => locked.cached().next(),
                Err(error) => {
                    if !self.stall_on(&run, &error) {
                        tracing::error!(run_id = %run, %error, "a run to drive cannot be read");
                        self.stop_driving(&run);
                    }
                    return;
                }
            };
            if let Err(error) = self.step(&run).await {
                if self.stall_on(&run, &error) {
                    return;
                }
                // The turn cannot go on; say so in the log when the log can
                // still be written, and stop driving this run.
                tracing::error!(run_id = %run, %error, "a turn cannot go on");
                self.fail_turn_logged(&run, &error.to_string()).await;
                self.stop_driving(&run);
                return;
            }
            let (work, next) = match self.next_work(&run).await {
                Ok(next) => next,
                Err(error) => {
                    if !self.stall_on(&run, &error) {
                        tracing::error!(run_id = %run, %error, "a driven run cannot be read");
                        self.stop_driving(&run);
                    }
                    return;
                }
            };
            // Work that recorded nothing would be done again at once, and
            // again: stop rather than spin, and say why in the log.
            if matches!(work, Work::Turn) && next == before {
                tracing::error!(run_id = %run, "a turn made no progress");
                self.fail_turn_logged(&run, "the turn made no progress")
                    .await;
                self.stop_driving(&run);
                return;
            }
            if matches!(work, Work::Nothing) && self.try_stop_driving(&run) {
                return;
            }
        }
    }

    async fn next_work(&self, run: &RunId) -> Result<(Work, Seq), RuntimeError> {
        let locked = self.lock(run).await?;
        let state = locked.state();
        let work = match (&state.status, &state.turn) {
            (Status::Running, _) => Work::Turn,
            (Status::Waiting(_), Some(turn)) if state.cancel_requested.is_some() => {
                Work::EndParkedTurn(turn.clone())
            }
            (Status::Pending | Status::Completed | Status::Failed | Status::Cancelled, _)
                if !state.queued.is_empty() =>
            {
                Work::StartQueued
            }
            _ => Work::Nothing,
        };
        Ok((work, locked.cached().next()))
    }

    async fn step(self: &Arc<Self>, run: &RunId) -> Result<(), RuntimeError> {
        let (work, _) = self.next_work(run).await?;
        match work {
            Work::Turn => self.run_turn(run).await,
            Work::EndParkedTurn(turn) => {
                self.append(
                    run,
                    vec![Event::TurnCancelled(TurnCancelled { turn_id: turn })],
                )
                .await
            }
            Work::StartQueued => {
                let current = self.current_agent().await?;
                let mut locked = self.lock(run).await?;
                let Some((seq, queued)) = locked.state().queued.front().cloned() else {
                    return Ok(());
                };
                let turn = self.ids.turn_id(run, locked.state().turns + 1);
                let started = TurnStarted {
                    turn_id: turn,
                    input: queued.input,
                    context: queued.context,
                    policy: spool_wire::run::TurnPolicy::Queue,
                    from_queue: Some(seq),
                    operation_id: None,
                };
                let events = self.starting_turn(locked.cached(), run, started, &current);
                locked.append(&*self.journal, events).await
            }
            Work::Nothing => Ok(()),
        }
    }

    /// Stops driving unless new work was signalled meanwhile.
    fn try_stop_driving(&self, run: &RunId) -> bool {
        let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
        match driving.get_mut(run) {
            Some(entry) if entry.dirty => {
                entry.dirty = false;
                false
            }
            _ => {
                driving.remove(run);
                true
            }
        }
    }

    fn stop_driving(&self, run: &RunId) {
        self.driving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run);
    }

    fn token(&self, run: &RunId) -> CancellationToken {
        let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = driving.entry(run.clone()).or_default();
        if entry.token.is_cancelled() {
            // A cancelled turn is over; the next one gets a fresh token.
            entry.token = CancellationToken::new();
        }
        entry.token.clone()
    }

    /// Ends the running turn as failed with `internal`, if one is running:
    /// the runtime itself cannot take it further.
    async fn fail_turn(&self, run: &RunId, message: &str) -> Result<(), RuntimeError> {
        let mut locked = self.lock(run).await?;
        if let (Status::Running, Some(turn)) = (&locked.state().status, &locked.state().turn) {
            let failed = Event::TurnFailed(TurnFailed {
                turn_id: turn.clone(),
                code: FailureCode::Internal,
                message: message.to_owned(),
            });
            locked.append(&*self.journal, vec![failed]).await?;
            drop(locked);
            self.hub.end_turn(run);
        }
        Ok(())
    }

    /// [`Inner::fail_turn`] where nobody waits for the answer: a failure to
    /// record the failure goes to the log, and a journal that cannot write
    /// stalls the run, which is driven again (and fails again, recorded
    /// this time) once it can.
    async fn fail_turn_logged(self: &Arc<Self>, run: &RunId, message: &str) {
        if let Err(error) = self.fail_turn(run, message).await
            && !self.stall_on(run, &error)
        {
            tracing::error!(run_id = %run, %error, "a failed turn cannot be recorded");
        }
    }

    /// When `error` is the journal's storage failing: the run stops being
    /// driven and waits for the journal (see [`crate::storage`]), which is
    /// probed until it writes. True when it stalled.
    pub(crate) fn stall_on(&self, run: &RunId, error: &RuntimeError) -> bool {
        if error.kind() != ErrorKind::Storage {
            return false;
        }
        tracing::warn!(run_id = %run, %error, "the journal cannot write; the run waits until it can");
        // Stalled before it stops being driven: a command that drives it
        // meanwhile takes it off the stalled set again.
        self.storage.stall(run, &error.to_string());
        self.stop_driving(run);
        true
    }

    /// Resumes what `run`'s log says was in progress: a turn, a cancel or
    /// queued input to act on, or a sleep to wake from. True when there
    /// was something.
    pub(crate) async fn resume(self: &Arc<Self>, run: &RunId) -> Result<bool, RuntimeError> {
        let locked = self.lock(run).await?;
        let state = locked.state();
        if let Some(sleep) = state.sleep.clone() {
            drop(locked);
            self.arm_sleep(run, sleep);
            return Ok(true);
        }
        let work = matches!(state.status, Status::Running)
            || !state.queued.is_empty()
            || state.cancel_requested.is_some();
        drop(locked);
        if work {
            Arc::clone(self).ensure_driver(run);
        }
        Ok(work)
    }

    /// Wakes a sleeping run at its instant: a timer per sleeping run, armed
    /// from the journal (on sleep and on recovery), never a scan of logs.
    pub(crate) fn arm_sleep(self: &Arc<Self>, run: &RunId, sleep: SleepStarted) {
        // Keyed by the sleep's call as well as the run: a sleep ended early
        // leaves its timer to run out harmlessly, and a later sleep of the
        // same run still gets a timer of its own.
        let key = (run.clone(), sleep.call_id.clone());
        if !self
            .sleeping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone())
        {
            return;
        }
        let inner = Arc::clone(self);
        let run = run.clone();
        self.tasks.spawn(async move {
            let wait = (sleep.wake_at - time::OffsetDateTime::now_utc()).max(time::Duration::ZERO);
            tokio::time::sleep(std::time::Duration::try_from(wait).unwrap_or_default()).await;
            inner
                .sleeping
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
            if let Err(error) = inner.wake(&run, &sleep, None).await
                && !inner.stall_on(&run, &error)
            {
                tracing::error!(run_id = %run, %error, "a sleeping run cannot be woken");
            }
        });
    }

    /// Records the end of `sleep` if the run still sleeps on it (`early`:
    /// ended before its time, at that instant), and drives the run on.
    /// `false` when the run no longer sleeps on it.
    pub(crate) async fn wake(
        self: &Arc<Self>,
        run: &RunId,
        sleep: &SleepStarted,
        early: Option<time::OffsetDateTime>,
    ) -> Result<bool, RuntimeError> {
        let mut locked = self.lock(run).await?;
        let still_sleeping = locked
            .state()
            .sleep
            .as_ref()
            .is_some_and(|s| s.call_id == sleep.call_id);
        if !still_sleeping {
            return Ok(false);
        }
        let woke = Event::SleepCompleted(SleepCompleted {
            call_id: sleep.call_id.clone(),
            woken_at: early,
        });
        locked.append(&*self.journal, vec![woke]).await?;
        drop(locked);
        Arc::clone(self).ensure_driver(run);
        Ok(true)
    }
}

/// Makes a host's future and polls it to its end, turning a panic in
/// either (an `Engine::call` may panic before it returns its future) into
/// an error with the panic's message.
pub(crate) async fn caught<'a, T>(make: impl FnOnce() -> BoxFuture<'a, T>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)) {
        Ok(future) => polled(future).await,
        Err(payload) => Err(panic_message(payload.as_ref())),
    }
}

/// Polls `future` to its end, turning a panic inside it into an error with
/// the panic's message. `futures-util`'s `catch_unwind` does the same; the
/// futures here are boxed already, so std's `catch_unwind` around each poll
/// is all it takes, without that dependency. The future is never polled
/// again after it panicked.
pub(crate) async fn polled<T>(mut future: BoxFuture<'_, T>) -> Result<T, String> {
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(payload.as_ref()))),
        }
    })
    .await
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
