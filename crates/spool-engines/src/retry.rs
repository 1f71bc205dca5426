//! When a refused call is tried again: exponential backoff with jitter, or
//! the wait the provider asked for in `Retry-After`.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// How often, and after how long, a call refused before its answer began
/// is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries after the first; 0 never retries.
    pub max_retries: u32,
    /// The first backoff; each retry doubles it.
    pub base: Duration,
    /// The longest backoff.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (from 0): half of the doubled
    /// backoff fixed, half random, so many clients refused together do not
    /// come back together, yet none comes back at once.
    #[must_use]
    pub fn backoff(&self, retry: u32) -> Duration {
        let doubled = self
            .base
            .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .min(self.cap);
        let half = doubled / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// The wait a refusal asks for: `retry-after-ms` (OpenAI's), else
/// `Retry-After` as seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 29 Nov 2026 18:00:00 GMT").unwrap();
        let wait = |pairs| retry_after(&headers(pairs), now);
        assert_eq!(wait(&[("retry-after", "3")]), Some(Duration::from_secs(3)));
        assert_eq!(
            wait(&[("retry-after-ms", "250")]),
            Some(Duration::from_millis(250))
        );
        // The millisecond header is the more precise; it wins.
        assert_eq!(
            wait(&[("retry-after", "3"), ("retry-after-ms", "250")]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            wait(&[("retry-after", "Sun, 29 Nov 2026 18:00:07 GMT")]),
            Some(Duration::from_secs(7))
        );
        // A date already past means "now".
        assert_eq!(
            wait(&[("retry-after", "Sun, 29 Nov 2026 17:00:00 GMT")]),
            Some(Duration::ZERO)
        );
        assert_eq!(wait(&[("retry-after", "soon")]), None);
        assert_eq!(wait(&[("retry-after", "-1")]), None);
        assert_eq!(wait(&[]), None);
    }

    #[test]
    fn backoff_doubles_within_jitter_and_stops_at_the_cap() {
        let policy = RetryPolicy {
            max_retries: 10,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        for retry in 0..12 {
            let full = (Duration::from_millis(100) * 2u32.pow(retry.min(20))).min(policy.cap);
            for _ in 0..50 {
                let wait = policy.backoff(retry);
                assert!(wait >= full / 2 && wait <= full, "retry {retry}: {wait:?}");
            }
        }
        assert!(policy.backoff(40) <= policy.cap);
    }
}
