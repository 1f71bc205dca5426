//! Every task the runtime starts (run drivers, sleep timers, the storage
//! probe, schedules), tracked so that [`Runtime::shutdown`] can stop them
//! and know that none still runs.
//!
//! Stopping drops a task at its next await, as a process that ends does:
//! what it recorded stays in the journal, and the next start's
//! [`Runtime::recover`] resumes it from there. Nothing is recorded for the
//! stop itself.
//!
//! [`Runtime::shutdown`]: crate::Runtime::shutdown
//! [`Runtime::recover`]: crate::Runtime::recover

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The runtime's tasks.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    stopping: CancellationToken,
}

impl Tasks {
    /// Starts `task` on the current Tokio runtime, to be stopped with the
    /// others. `false` (and nothing started) once the runtime is stopping,
    /// or outside a Tokio runtime.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> bool {
        if self.stopping.is_cancelled() {
            return false;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let stopping = self.stopping.clone();
        self.tracker.spawn_on(
            async move {
                tokio::select! {
                    () = stopping.cancelled() => {}
                    () = task => {}
                }
            },
            &handle,
        );
        true
    }

    /// Whether the runtime is stopping: nothing new starts.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }

    /// Stops every task and waits until the last has ended.
    pub(crate) async fn stop(&self) {
        self.stopping.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
