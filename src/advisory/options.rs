//! The advisory lock's options: [`LockOptions`], the one options type of the lock-shaped
//! primitives, of which the advisory lock honours two fields: `wait` (how long a blocking
//! acquisition waits, PostgreSQL's `lock_timeout`) and `heartbeat` (how often a session guard
//! checks its connection). The others (`max_tries`, `max_backoff`, `watchdog`, `max_hold`,
//! `replica_ack`, `waiter_timeout`) are refused with
//! [`Error::Unsupported`](crate::Error::Unsupported): the server queues the waiter and nothing
//! retries, and a session lock has no lease.

use std::time::Duration;

use crate::error::{ConfigError, Error};
use crate::lease::options::Field;
pub use crate::lease::options::{
    LockOptions, LockOptionsBuilder, DEFAULT_HEARTBEAT, MAX_HEARTBEAT, MIN_HEARTBEAT,
};

/// The longest bounded wait: PostgreSQL's `lock_timeout` is an `int` of milliseconds.
pub const MAX_WAIT: Duration = Duration::from_millis(i32::MAX as u64);

/// The former name of [`LockOptions`], kept so existing code compiles.
pub type AdvisoryOptions = LockOptions;
/// The former name of [`LockOptionsBuilder`], kept so existing code compiles.
pub type AdvisoryOptionsBuilder = LockOptionsBuilder;

/// Checks `opts` for an advisory call: only `wait` (1 ms ..= [`MAX_WAIT`]) and `heartbeat`.
///
/// # Errors
/// [`Error::Unsupported`] naming a field the advisory lock cannot honour; a [`ConfigError`]
/// naming `wait` when it is outside 1 ms ..= [`MAX_WAIT`].
pub(crate) fn check(opts: &LockOptions) -> Result<(), Error> {
    opts.refuse_others("the advisory lock", &[Field::Heartbeat])?;
    if let Some(wait) = opts.wait() {
        if wait < Duration::from_millis(1) || wait > MAX_WAIT {
            return Err(Error::Config(ConfigError::invalid(
                "wait",
                format!(
                    "{wait:?} is out of range: 1ms ..= {MAX_WAIT:?} (PostgreSQL's lock_timeout \
                     in ms); use try_acquire for no wait"
                ),
            )));
        }
    }
    Ok(())
}

/// `wait` as a `lock_timeout` value: whole milliseconds, rounded up, at least 1 (`0` would mean
/// "no timeout" to PostgreSQL).
pub(crate) fn lock_timeout(opts: &LockOptions) -> Option<String> {
    opts.wait().map(|w| {
        let ms = w.as_nanos().div_ceil(1_000_000).max(1);
        format!("{ms}ms")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_named() {
        let o = LockOptions::builder().build().unwrap();
        assert_eq!(lock_timeout(&o), None);
        assert_eq!(o.heartbeat(), DEFAULT_HEARTBEAT);
        let o = LockOptions::builder()
            .wait(Duration::from_micros(1500))
            .heartbeat(Duration::from_millis(250))
            .build()
            .unwrap();
        assert_eq!(lock_timeout(&o).as_deref(), Some("2ms"));
        assert_eq!(o.heartbeat(), Duration::from_millis(250));
        assert!(check(&o).is_ok());
        for (o, field) in [
            (LockOptions::builder().wait(Duration::ZERO), "wait"),
            (
                LockOptions::builder().wait(MAX_WAIT + Duration::from_millis(1)),
                "wait",
            ),
        ] {
            let err = check(&o.build().unwrap()).unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
        let err = LockOptions::builder()
            .heartbeat(Duration::from_millis(1))
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("`heartbeat`"), "{err}");
        let o = LockOptions::builder().max_tries(2).build().unwrap();
        assert_eq!(check(&o).unwrap_err().kind(), crate::ErrorKind::Unsupported);
    }
}
