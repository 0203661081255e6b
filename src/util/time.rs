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

/// A duration for people, in messages and status text (`250 ms`, `4.0 s`, `2.5 min`, `3.0 h`),
/// where `Debug` would print `4.006396222s`.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.1} s")
    } else if secs < 7_200.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3_600.0)
    }
}

/// Whole milliseconds, saturating.
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

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_micros(1_500)), "1 ms");
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
        assert_eq!(human(Duration::from_nanos(4_006_396_222)), "4.0 s");
        assert_eq!(human(Duration::from_secs(90)), "90.0 s");
        assert_eq!(human(Duration::from_secs(150)), "2.5 min");
        assert_eq!(human(Duration::from_secs(3 * 3_600)), "3.0 h");
    }
}
