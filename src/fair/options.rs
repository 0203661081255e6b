//! The fair lock's options: [`LockOptions`], the one options type of the lock-shaped
//! primitives (how [`FairLocks::acquire`](super::FairLocks::acquire) waits in the queue, its
//! waiter timeout, whether the guard gets a watchdog), and the bounds of waiter timeouts and
//! reservation lifetimes.

pub(crate) use crate::lease::options::validate_timeout;
pub use crate::lease::options::{
    LockOptions, LockOptionsBuilder, DEFAULT_MAX_BACKOFF, DEFAULT_WAITER_TIMEOUT, MAX_TIMEOUT,
    MIN_TIMEOUT,
};
pub use crate::lease::{MAX_LEASE, MIN_LEASE};

/// The former name of [`LockOptions`], kept so existing code compiles.
pub type FairOptions = LockOptions;
/// The former name of [`LockOptionsBuilder`], kept so existing code compiles.
pub type FairOptionsBuilder = LockOptionsBuilder;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn leases_and_lifetimes_are_checked() {
        assert!(crate::lease::check_ttl("lease", MIN_LEASE).is_ok());
        assert!(crate::lease::check_ttl("lease", MAX_LEASE).is_ok());
        assert!(crate::lease::check_ttl("lease", Duration::from_millis(9)).is_err());
        assert!(validate_timeout("lifetime", MIN_TIMEOUT).is_ok());
        assert!(validate_timeout("lifetime", MAX_TIMEOUT + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn the_old_name_deserializes_as_before() {
        let o: FairOptions =
            serde_json::from_str(r#"{"wait_ms":10000,"waiter_timeout_ms":5000}"#).unwrap();
        assert_eq!(o.wait(), Some(Duration::from_secs(10)));
        assert_eq!(o.waiter_timeout(), Duration::from_secs(5));
        assert!(serde_json::from_str::<FairOptions>(r#"{"waiter_timeout_ms":0}"#).is_err());
    }
}
