//! The mutex's options: [`LockOptions`], the one options type of the lock-shaped primitives
//! (how [`Locks::acquire`](super::Locks::acquire) waits, whether the guard gets a watchdog,
//! the replica acknowledgement), and the lease bounds.

pub use crate::lease::options::{LockOptions, LockOptionsBuilder, DEFAULT_MAX_BACKOFF};
pub use crate::lease::{MAX_LEASE, MIN_LEASE};

/// The former name of [`LockOptions`], kept so existing code compiles.
pub type AcquireOptions = LockOptions;
/// The former name of [`LockOptionsBuilder`], kept so existing code compiles.
pub type AcquireOptionsBuilder = LockOptionsBuilder;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn leases_are_checked() {
        assert!(crate::lease::check_ttl("lease", Duration::from_millis(10)).is_ok());
        assert!(crate::lease::check_ttl("lease", MAX_LEASE).is_ok());
        assert!(crate::lease::check_ttl("lease", Duration::from_millis(9)).is_err());
        assert!(crate::lease::check_ttl("lease", MAX_LEASE + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn the_old_name_deserializes_as_before() {
        let o: AcquireOptions =
            serde_json::from_str(r#"{"wait_ms":10000,"watchdog":true}"#).unwrap();
        assert_eq!(o.wait(), Some(Duration::from_secs(10)));
        assert!(o.watchdog());
        assert_eq!(o.max_backoff(), DEFAULT_MAX_BACKOFF);
    }
}
