//! The lease kernel: what every lease-holding primitive (the failover coordinator, the mutex, the
//! fair lock, leader election, Redlock, run-or-enqueue) shares, so each gets it right once, and
//! no wire protocol: the lock store's operations are methods of the store seam's `Backend`
//! (`backend::locks`), their scripts and statements in each backend's folder.
//!
//! - **Deadlines at send time.** A lease granted or extended by a request sent at `t` cannot end
//!   on the server before `t + ttl`; measured on this host's monotonic clock from `t`, minus a
//!   margin of max(1 %, 2 ms) for clock-rate differences, a deadline errs early, never late
//!   ([`deadline`]).
//! - **Fencing tokens** that never go back ([`next_fence`], DESIGN.md §3), and the fence's
//!   retention ([`lock::fence_ttl`]).
//! - **Bounds** every lease-holding primitive checks the same way ([`check_ttl`],
//!   [`check_waiting`]).
//! - **After an acquisition**, whether a lost reply may have left a lock behind
//!   ([`lock::orphaned`]), and the token-checked release that then runs in the background
//!   ([`pending`]).
//! - **Holding**: the guard types ([`guard`], [`held`]) and the keepalive ([`watchdog`]), whose
//!   one extension per round is the store's compare-and-extend: it checks that the lease still
//!   holds this holder's value (and a guard key the value the primitive expects), and only then
//!   extends it; when it refuses it returns what it read, for the primitive's own pure decision
//!   to explain.
//!
//! The loss signal itself (event, future, `CancellationToken`) is raised by the primitive's
//! holder loop when [`deadline`] passes without a confirmed extension, whatever a request in
//! flight is doing.

pub(crate) mod acquire;
pub(crate) mod guard;
pub(crate) mod held;
pub(crate) mod keepalive;
pub(crate) mod lock;
pub(crate) mod options;
pub(crate) mod pending;
pub mod prelude;
pub(crate) mod store;
pub(crate) mod watchdog;

use std::time::Duration;

use tokio::time::Instant;

// A lease extension's request, defined in the leaves so a backend can read it.
use crate::error::ConfigError;
pub(crate) use crate::util::lock_replies::Extend;
use crate::util::time::after;

// What a lock store answers, defined in the leaves so a backend can build it (see there).
pub use crate::util::lock_replies::Extension;
// The lock table's cleanup, for the model checker's test that the statement re-checks what
// it deletes: `model_api` may name the lease kernel, never a backend.
#[cfg(all(test, feature = "postgres"))]
pub(crate) use crate::backend::locks::PG_LOCKS_CLEANUP;

/// The shortest lease a lease-holding primitive accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease a lease-holding primitive accepts: one day.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// Checks a lease's TTL: [`MIN_LEASE`] ..= [`MAX_LEASE`]. Below 10 ms a round trip eats the lease;
/// above a day a crashed holder blocks the lock for longer than anyone would wait. One check
/// for every primitive, so they accept and word the same range.
///
/// # Errors
/// A [`ConfigError`] naming `field` when `ttl` is out of range.
pub(crate) fn check_ttl(field: &'static str, ttl: Duration) -> Result<(), ConfigError> {
    if !(MIN_LEASE..=MAX_LEASE).contains(&ttl) {
        return Err(ConfigError::invalid(
            field,
            format!("{ttl:?} is outside 10ms ..= 1 day"),
        ));
    }
    Ok(())
}

/// Ten years: far beyond any sane wait or hold, and small enough that `now + d` stays
/// representable as a monotonic instant.
const MAX_SPAN: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Checks how a lease-holding primitive's `acquire` waits and holds, the same for each
/// options builder: `wait` at most 10 years, `max_tries` at least 1, `max_backoff` 1 ms ..= 1
/// min, `max_hold` 1 ms ..= 10 years.
///
/// # Errors
/// A [`ConfigError`] naming the first field out of range.
pub(crate) fn check_waiting(
    wait: Option<Duration>,
    max_tries: Option<u32>,
    max_backoff: Duration,
    max_hold: Option<Duration>,
) -> Result<(), ConfigError> {
    if wait.is_some_and(|w| w > MAX_SPAN) {
        return Err(ConfigError::invalid("wait", "is above 10 years"));
    }
    if max_tries == Some(0) {
        return Err(ConfigError::invalid("max_tries", "must be at least 1"));
    }
    if max_backoff < Duration::from_millis(1) || max_backoff > Duration::from_secs(60) {
        return Err(ConfigError::invalid(
            "max_backoff",
            format!("{max_backoff:?} is outside 1ms ..= 1 min"),
        ));
    }
    if let Some(h) = max_hold {
        if h.is_zero() || h > MAX_SPAN {
            return Err(ConfigError::invalid(
                "max_hold",
                format!("{h:?} is outside 1ms ..= 10 years"),
            ));
        }
    }
    Ok(())
}

/// `from + ttl − max(1 %, 2 ms)`: when a lease granted or extended by a request sent at `from`
/// can end at the earliest, as this host's monotonic clock measures it.
pub(crate) fn deadline(from: Instant, ttl: Duration) -> Instant {
    let early = (ttl / 100).max(Duration::from_millis(2));
    after(from, ttl.saturating_sub(early))
}

/// The next fencing token: above the stored one, above any this holder was granted, and at least
/// the server's time in µs, so it keeps growing even after the fence key is deleted or expires.
/// It only goes back if the server's clock does.
pub(crate) fn next_fence(stored: u64, now_us: u64, last_fence: u64) -> u64 {
    stored
        .saturating_add(1)
        .max(now_us)
        .max(last_fence.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_err_early_by_a_margin() {
        let t = Instant::now();
        assert_eq!(
            deadline(t, Duration::from_secs(10)),
            t + Duration::from_millis(9_900)
        );
        assert_eq!(
            deadline(t, Duration::from_millis(100)),
            t + Duration::from_millis(98)
        );
        assert_eq!(deadline(t, Duration::ZERO), t);
    }

    #[test]
    fn ttls_are_bounded_and_the_field_is_named() {
        assert!(check_ttl("ttl", MIN_LEASE).is_ok());
        assert!(check_ttl("ttl", MAX_LEASE).is_ok());
        assert!(check_ttl("ttl", Duration::from_millis(9)).is_err());
        let e = check_ttl("lease", MAX_LEASE + Duration::from_millis(1)).unwrap_err();
        assert!(e.to_string().contains("`lease`"), "{e}");
    }

    #[test]
    fn fencing_tokens_never_go_back() {
        assert_eq!(next_fence(10, 5, 0), 11);
        assert_eq!(next_fence(0, 1_000_000, 0), 1_000_000);
        // The fence key was deleted, and the server clock is behind our last token.
        assert_eq!(next_fence(0, 5, 900), 901);
        assert_eq!(next_fence(u64::MAX, 0, 0), u64::MAX);
    }
}
