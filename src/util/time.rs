//! Deadline arithmetic that never panics.

use std::time::Duration;

use tokio::time::Instant;

/// `from + d`, saturating at a far-future instant instead of panicking.
///
/// `Instant + Duration` panics when the sum is not representable (on some platforms already
/// for a few hundred years); a deadline that far away simply means "never", so every deadline
/// in this file goes through here.
pub(crate) fn after(from: Instant, d: Duration) -> Instant {
    // The last fallback (`from` itself, a timer that fires at once) needs a clock within a year
    // of its end of range; should it ever happen, firing early errs on the safe side (a deadline
    // reported, an attempt released), where panicking would take the worker down.
    from.checked_add(d)
        .or_else(|| from.checked_add(FAR))
        .unwrap_or(from)
}

/// "Never", for timers that must not fire: one year is longer than any lease or backoff, and
/// `after` falls back to it when a sum overflows.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365);

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) >= after(now, FAR));
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(after(now, Duration::MAX) > now);
    }
}
