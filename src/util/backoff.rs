//! Exponential backoff with full jitter, shared by every retry loop.

use std::time::Duration;

/// Exponential backoff with full jitter, from 50 ms up to a cap.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(50);

    pub(crate) fn new(max: Duration) -> Self {
        Backoff {
            next: Self::BASE,
            max: max.max(Self::BASE),
        }
    }

    /// The next delay: uniformly in [d/2, d), where d doubles up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = d / 2;
        let nanos = half.as_nanos().max(1) as u64;
        half + Duration::from_nanos(super::token::random_u64() % nanos)
    }

    pub(crate) fn reset(&mut self) {
        self.next = Self::BASE;
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
