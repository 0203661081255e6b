//! The pure arithmetic of Redlock: quorum, per-master timeout, clock drift, validity, and the
//! decision an acquisition's replies lead to. No I/O, a test per rule.

use std::time::Duration;

/// The quorum of `masters`: a strict majority, `masters / 2 + 1`.
pub(crate) fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// The clock drift allowed for a lock of `ttl`: `ttl / 100 + 2 ms` (the rate difference of the
/// clocks involved, plus a small constant for timer granularity).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long one master may take to answer: far below the TTL so that a master that is down
/// cannot eat the validity, `min(response_timeout, ttl / 10)`, at least 5 ms.
pub(crate) fn node_timeout(response_timeout: Duration, ttl: Duration) -> Duration {
    response_timeout.min(ttl / 10).max(Duration::from_millis(5))
}

/// How long the lock stays valid after a round that took `elapsed` (measured from before the
/// first request left): `ttl − elapsed − drift`, or `None` when nothing is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|v| v.checked_sub(drift(ttl)))
        .filter(|v| !v.is_zero())
}

/// What one round over every master (an acquisition or an extension) comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A quorum said yes within the validity: held for `validity` from the round's start.
    Held { validity: Duration },
    /// Enough masters answered, but not a quorum of yeses (the lock is held elsewhere): not an
    /// error.
    Contended,
    /// A quorum said yes, but the round took so long that no validity is left.
    Expired,
    /// Too many masters failed for a quorum to be possible at all.
    Unavailable { needed: usize, reachable: usize },
}

/// The decision for a round over `masters` masters where `yes` said yes and `failed` did not
/// answer (an error or a timeout), that took `elapsed` of a `ttl`.
pub(crate) fn decide(
    masters: usize,
    yes: usize,
    failed: usize,
    ttl: Duration,
    elapsed: Duration,
) -> Decision {
    let needed = quorum(masters);
    if yes >= needed {
        return match validity(ttl, elapsed) {
            Some(validity) => Decision::Held { validity },
            None => Decision::Expired,
        };
    }
    let reachable = masters.saturating_sub(failed);
    if reachable < needed {
        Decision::Unavailable { needed, reachable }
    } else {
        Decision::Contended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), 102 * MS);
        assert_eq!(drift(10 * MS), Duration::from_micros(2_100));
    }

    #[test]
    fn node_timeouts_stay_far_below_the_ttl_but_at_least_5_ms() {
        let rt = Duration::from_secs(2);
        assert_eq!(
            node_timeout(rt, Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(node_timeout(rt, Duration::from_secs(60)), rt);
        assert_eq!(node_timeout(rt, 20 * MS), 5 * MS);
    }

    #[test]
    fn validity_is_ttl_minus_elapsed_minus_drift_and_never_underflows() {
        let ttl = Duration::from_secs(10);
        assert_eq!(validity(ttl, 50 * MS), Some(ttl - 50 * MS - 102 * MS));
        assert_eq!(validity(ttl, ttl - 102 * MS), None);
        assert_eq!(validity(ttl, ttl), None);
        assert_eq!(validity(ttl, ttl * 3), None);
        assert_eq!(
            validity(10 * MS, Duration::ZERO),
            Some(Duration::from_micros(7_900))
        );
    }

    #[test]
    fn decisions_tell_contended_from_unavailable() {
        let ttl = Duration::from_secs(10);
        let e = 10 * MS;
        let v = ttl - e - drift(ttl);
        // 5 masters: 3 yes is a quorum, whatever the other two did.
        assert_eq!(decide(5, 3, 2, ttl, e), Decision::Held { validity: v });
        assert_eq!(decide(5, 5, 0, ttl, e), Decision::Held { validity: v });
        // A quorum of yes that took the whole ttl is no lock.
        assert_eq!(decide(5, 3, 0, ttl, ttl), Decision::Expired);
        // Everyone answered, two yes: held elsewhere.
        assert_eq!(decide(5, 2, 0, ttl, e), Decision::Contended);
        assert_eq!(decide(5, 0, 0, ttl, e), Decision::Contended);
        // Two failed, three answered but only two yes: still contention (a quorum could
        // have been reached had the lock been free).
        assert_eq!(decide(5, 2, 2, ttl, e), Decision::Contended);
        // Three failed: a quorum was impossible, whatever the others said.
        assert_eq!(
            decide(5, 2, 3, ttl, e),
            Decision::Unavailable {
                needed: 3,
                reachable: 2
            }
        );
        assert_eq!(
            decide(5, 0, 5, ttl, e),
            Decision::Unavailable {
                needed: 3,
                reachable: 0
            }
        );
        assert_eq!(
            decide(3, 1, 2, ttl, e),
            Decision::Unavailable {
                needed: 2,
                reachable: 1
            }
        );
    }
}
