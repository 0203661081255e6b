//! [`RedlockOptions`]: how [`Redlock::acquire`](super::Redlock::acquire) retries, and whether
//! the guard gets a watchdog. Validated by [`RedlockOptionsBuilder::build`], never coerced.

use std::time::Duration;

use crate::error::ConfigError;

/// The default cap of the backoff between tries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How [`Redlock::acquire`](super::Redlock::acquire) retries: exponential backoff with full
/// jitter (from 50 ms up to `max_backoff`), bounded by a number of tries and/or a wait, and
/// whether the guard starts with a watchdog. The default tries until it gets the lock or an
/// error, with no watchdog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedlockOptions {
    pub(crate) max_tries: Option<u32>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_backoff: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            max_tries: None,
            wait: None,
            max_backoff: DEFAULT_MAX_BACKOFF,
            watchdog: false,
            max_hold: None,
        }
    }
}

impl RedlockOptions {
    /// Starts from the defaults.
    pub fn builder() -> RedlockOptionsBuilder {
        RedlockOptionsBuilder {
            opts: RedlockOptions::default(),
        }
    }

    /// How many tries at most (`None`: no limit).
    pub fn max_tries(&self) -> Option<u32> {
        self.max_tries
    }

    /// How long to wait for the lock at most (`None`: forever).
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The cap of the exponential backoff between tries.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// Whether the guard starts with a watchdog.
    pub fn watchdog(&self) -> bool {
        self.watchdog
    }

    /// The cap on the total hold time with the watchdog (`None`: no cap).
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }
}

/// Builder of [`RedlockOptions`].
#[derive(Debug, Clone)]
pub struct RedlockOptionsBuilder {
    opts: RedlockOptions,
}

impl RedlockOptionsBuilder {
    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after this many tries
    /// (at least 1). Defaults to no limit.
    pub fn max_tries(mut self, n: u32) -> Self {
        self.opts.max_tries = Some(n);
        self
    }

    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) once `wait` has passed
    /// since the first try (`Duration::ZERO`: one try). Defaults to waiting forever.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.opts.wait = Some(wait);
        self
    }

    /// The longest sleep between two tries, 1 ms ..= 1 min. Defaults to 1 s.
    pub fn max_backoff(mut self, max_backoff: Duration) -> Self {
        self.opts.max_backoff = max_backoff;
        self
    }

    /// Starts the guard's watchdog (see
    /// [`RedlockGuard::start_watchdog`](super::RedlockGuard::start_watchdog)). Defaults to off;
    /// [`Redlock::with_lock`](super::Redlock::with_lock) always turns it on.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.opts.watchdog = on;
        self
    }

    /// With the watchdog, stops extending once the lock was held this long and fires the loss
    /// signal then. Must exceed 0. Defaults to no cap.
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.opts.max_hold = Some(d);
        self
    }

    /// Checks every value.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field out of range (`max_tries(0)` among them).
    pub fn build(self) -> Result<RedlockOptions, ConfigError> {
        let o = &self.opts;
        crate::lease::check_waiting(o.wait, o.max_tries, o.max_backoff, o.max_hold)?;
        Ok(self.opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<RedlockOptions, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(o) => panic!("accepted: {o:?}"),
        }
    }

    #[test]
    fn defaults_retry_forever_without_a_watchdog() {
        let o = RedlockOptions::builder().build().unwrap();
        assert_eq!(o, RedlockOptions::default());
        assert_eq!((o.max_tries(), o.wait(), o.max_hold()), (None, None, None));
        assert_eq!(o.max_backoff(), DEFAULT_MAX_BACKOFF);
        assert!(!o.watchdog());
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let b = RedlockOptions::builder;
        assert_eq!(field(b().max_tries(0).build()), "max_tries");
        assert_eq!(
            field(b().max_backoff(Duration::ZERO).build()),
            "max_backoff"
        );
        assert_eq!(field(b().max_hold(Duration::ZERO).build()), "max_hold");
        assert_eq!(field(b().wait(Duration::MAX).build()), "wait");
        let o = b()
            .max_tries(3)
            .watchdog(true)
            .max_hold(Duration::from_secs(5))
            .build()
            .unwrap();
        assert_eq!(o.max_tries(), Some(3));
        assert!(o.watchdog());
        assert_eq!(o.max_hold(), Some(Duration::from_secs(5)));
    }
}
