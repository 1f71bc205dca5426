//! Where a scheduler's time comes from: the system's wall clock, or one
//! anchored to tokio's time so tests can pause and advance it.

use super::*;

/// Where a scheduler's time comes from.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// `None`: the system's wall clock. `Some`: a wall time anchored to a
    /// tokio instant, advancing with tokio's time (paused in tests).
    anchor: Option<(Timestamp, tokio::time::Instant)>,
}

impl Clock {
    /// The system's wall clock.
    #[must_use]
    pub fn system() -> Self {
        Self { anchor: None }
    }

    /// `wall` now, advancing with tokio's clock from here on: under paused
    /// time a test sees firings at exact instants.
    #[must_use]
    pub fn starting_at(wall: Timestamp) -> Self {
        Self {
            anchor: Some((wall, tokio::time::Instant::now())),
        }
    }

    /// The wall time now.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        match self.anchor {
            None => Timestamp::now(),
            Some((wall, at)) => {
                let elapsed = at.elapsed().as_nanos();
                Timestamp::from_nanosecond(wall.as_nanosecond() + elapsed as i128)
                    .unwrap_or(Timestamp::MAX)
            }
        }
    }

    /// Sleeps until the wall time `at`, looking at the wall clock again at
    /// least once a minute: a clock stepped by NTP (or an operator) moves
    /// the firing with it instead of leaving it hours off.
    pub(super) async fn sleep_until(&self, at: Timestamp) {
        const LOOK_AGAIN: u64 = 60_000_000_000;
        loop {
            let left = at.as_nanosecond() - self.now().as_nanosecond();
            let Ok(left) = u64::try_from(left) else {
                return;
            };
            if left == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_nanos(left.min(LOOK_AGAIN))).await;
        }
    }
}
