//! Exponential backoff with full jitter, shared by every retry loop.

use std::time::Duration;

/// Exponential backoff with full jitter, from 50 ms up to a cap.
///
/// Kept in whole milliseconds (8 bytes, not 32): every waiting failover backup keeps one in its
/// task, and the cap is never below the 50 ms base, so nothing finer is ever needed.
pub(crate) struct Backoff {
    next_ms: u32,
    max_ms: u32,
}

impl Backoff {
    const BASE_MS: u32 = 50;

    pub(crate) fn new(max: Duration) -> Self {
        let max_ms = u32::try_from(max.as_millis()).unwrap_or(u32::MAX);
        Backoff {
            next_ms: Self::BASE_MS,
            max_ms: max_ms.max(Self::BASE_MS),
        }
    }

    /// The next delay: uniformly in [d/2, d), where d doubles up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = Duration::from_millis(u64::from(self.next_ms));
        self.next_ms = self.next_ms.saturating_mul(2).min(self.max_ms);
        let half = d / 2;
        let nanos = half.as_nanos().max(1) as u64;
        half + Duration::from_nanos(super::token::random_u64() % nanos)
    }

    pub(crate) fn reset(&mut self) {
        self.next_ms = Self::BASE_MS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(400));
        let d: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(25) && d[0] < Duration::from_millis(50));
        assert!(d[7] >= Duration::from_millis(200) && d[7] < Duration::from_millis(400));
        b.reset();
        assert!(b.next_delay() < Duration::from_millis(50));
    }
}
