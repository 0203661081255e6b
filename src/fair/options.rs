//! [`FairOptions`]: how [`FairLocks::acquire`](super::FairLocks::acquire) waits in the queue,
//! and whether the guard gets a watchdog. Validated by [`FairOptionsBuilder::build`] and by
//! deserialization alike, never coerced.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

pub use crate::lease::{MAX_TTL, MIN_TTL};
/// The shortest waiter timeout and reservation lifetime.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(30);
/// The longest waiter timeout and reservation lifetime.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The default waiter timeout.
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default cap of the backoff after a transient error.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Ten years: far beyond any sane wait or hold.
const MAX_SPAN: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Checks a waiter timeout or a reservation lifetime: 30 ms ..= 1 h.
pub(crate) fn validate_timeout(field: &'static str, d: Duration) -> Result<(), ConfigError> {
    if d < MIN_TIMEOUT || d > MAX_TIMEOUT {
        return Err(ConfigError::invalid(
            field,
            format!("{d:?} is outside 30ms ..= 1 h"),
        ));
    }
    Ok(())
}

/// How [`FairLocks::acquire`](super::FairLocks::acquire) waits, and what the guard does while
/// held.
///
/// Build it with [`FairOptions::builder`] or deserialize it (durations in milliseconds, e.g.
/// `{"wait_ms":10000,"waiter_timeout_ms":5000}`); both run the same validation. The default
/// waits forever with a 10 s waiter timeout and no watchdog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawOptions", into = "RawOptions")]
pub struct FairOptions {
    pub(crate) wait: Option<Duration>,
    pub(crate) waiter_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
}

impl Default for FairOptions {
    fn default() -> Self {
        FairOptions {
            wait: None,
            waiter_timeout: DEFAULT_WAITER_TIMEOUT,
            max_backoff: DEFAULT_MAX_BACKOFF,
            watchdog: false,
            max_hold: None,
        }
    }
}

impl FairOptions {
    /// Starts from the defaults.
    pub fn builder() -> FairOptionsBuilder {
        FairOptionsBuilder {
            raw: RawOptions::from(FairOptions::default()),
        }
    }

    /// How long to wait for the lock at most (`None`: forever).
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// How long a waiter that stops refreshing its place (a dead process) keeps it.
    pub fn waiter_timeout(&self) -> Duration {
        self.waiter_timeout
    }

    /// The cap of the backoff after a transient error.
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

/// The serialized shape of [`FairOptions`]: plain fields with defaults, durations in ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawOptions {
    wait_ms: Option<u64>,
    waiter_timeout_ms: u64,
    max_backoff_ms: u64,
    watchdog: bool,
    max_hold_ms: Option<u64>,
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions::from(FairOptions::default())
    }
}

impl From<FairOptions> for RawOptions {
    fn from(o: FairOptions) -> Self {
        use crate::util::time::ms;
        RawOptions {
            wait_ms: o.wait.map(ms),
            waiter_timeout_ms: ms(o.waiter_timeout),
            max_backoff_ms: ms(o.max_backoff),
            watchdog: o.watchdog,
            max_hold_ms: o.max_hold.map(ms),
        }
    }
}

impl TryFrom<RawOptions> for FairOptions {
    type Error = ConfigError;
    fn try_from(raw: RawOptions) -> Result<Self, ConfigError> {
        FairOptionsBuilder { raw }.build()
    }
}

/// Builder of [`FairOptions`].
#[derive(Debug, Clone)]
pub struct FairOptionsBuilder {
    raw: RawOptions,
}

impl FairOptionsBuilder {
    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after waiting this long
    /// (leaving the queue). Defaults to waiting forever.
    pub fn wait(mut self, d: Duration) -> Self {
        self.raw.wait_ms = Some(crate::util::time::ms(d));
        self
    }

    /// How long this waiter keeps its place without refreshing it, 30 ms ..= 1 h: it refreshes
    /// every third of it while it waits, so only a dead (or stalled) waiter loses its place,
    /// and a dead head delays the queue by at most this much. Defaults to 10 s.
    pub fn waiter_timeout(mut self, d: Duration) -> Self {
        self.raw.waiter_timeout_ms = crate::util::time::ms(d);
        self
    }

    /// The cap of the exponential backoff (with full jitter) after a transient error, 1 ms ..=
    /// 1 min. Contention needs no backoff: a release wakes the next waiter. Defaults to 1 s.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.raw.max_backoff_ms = crate::util::time::ms(d);
        self
    }

    /// Starts the guard's watchdog (see [`LockGuard::start_watchdog`](super::LockGuard::start_watchdog)).
    /// Defaults to off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.raw.watchdog = on;
        self
    }

    /// With the watchdog, stops extending once the lock was held this long and fires the loss
    /// signal then. Must exceed 0. Defaults to no cap.
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.raw.max_hold_ms = Some(crate::util::time::ms(d));
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field out of range.
    pub fn build(self) -> Result<FairOptions, ConfigError> {
        let r = self.raw;
        let wait = r.wait_ms.map(Duration::from_millis);
        if wait.is_some_and(|w| w > MAX_SPAN) {
            return Err(ConfigError::invalid("wait", "is above 10 years"));
        }
        let waiter_timeout = Duration::from_millis(r.waiter_timeout_ms);
        validate_timeout("waiter_timeout", waiter_timeout)?;
        let max_backoff = Duration::from_millis(r.max_backoff_ms);
        if max_backoff < Duration::from_millis(1) || max_backoff > Duration::from_secs(60) {
            return Err(ConfigError::invalid(
                "max_backoff",
                format!("{max_backoff:?} is outside 1ms ..= 1 min"),
            ));
        }
        let max_hold = r.max_hold_ms.map(Duration::from_millis);
        if let Some(h) = max_hold {
            if h.is_zero() || h > MAX_SPAN {
                return Err(ConfigError::invalid(
                    "max_hold",
                    format!("{h:?} is outside 1ms ..= 10 years"),
                ));
            }
        }
        Ok(FairOptions {
            wait,
            waiter_timeout,
            max_backoff,
            watchdog: r.watchdog,
            max_hold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<FairOptions, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(o) => panic!("accepted: {o:?}"),
        }
    }

    #[test]
    fn defaults_wait_forever_with_a_ten_second_waiter_timeout() {
        let o = FairOptions::builder().build().unwrap();
        assert_eq!(o, FairOptions::default());
        assert_eq!(o.wait(), None);
        assert_eq!(o.waiter_timeout(), DEFAULT_WAITER_TIMEOUT);
        assert_eq!(o.max_backoff(), DEFAULT_MAX_BACKOFF);
        assert!(!o.watchdog());
        assert_eq!(o.max_hold(), None);
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let b = FairOptions::builder;
        assert_eq!(
            field(b().waiter_timeout(Duration::from_millis(29)).build()),
            "waiter_timeout"
        );
        assert_eq!(
            field(b().waiter_timeout(Duration::from_secs(3601)).build()),
            "waiter_timeout"
        );
        assert_eq!(
            field(b().max_backoff(Duration::ZERO).build()),
            "max_backoff"
        );
        assert_eq!(field(b().max_hold(Duration::ZERO).build()), "max_hold");
        assert_eq!(field(b().wait(Duration::MAX).build()), "wait");
        assert!(b().wait(Duration::ZERO).build().is_ok());
    }

    #[test]
    fn ttls_and_lifetimes_are_checked() {
        assert!(crate::lease::check_ttl("ttl", MIN_TTL).is_ok());
        assert!(crate::lease::check_ttl("ttl", MAX_TTL).is_ok());
        assert!(crate::lease::check_ttl("ttl", Duration::from_millis(9)).is_err());
        assert!(validate_timeout("lifetime", MIN_TIMEOUT).is_ok());
        assert!(validate_timeout("lifetime", MAX_TIMEOUT + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn deserialization_validates_too() {
        let o: FairOptions =
            serde_json::from_str(r#"{"wait_ms":10000,"waiter_timeout_ms":5000}"#).unwrap();
        assert_eq!(o.wait(), Some(Duration::from_secs(10)));
        assert_eq!(o.waiter_timeout(), Duration::from_secs(5));
        assert!(serde_json::from_str::<FairOptions>(r#"{"waiter_timeout_ms":0}"#).is_err());
        assert!(serde_json::from_str::<FairOptions>(r#"{"wait":5}"#).is_err());
        let back: FairOptions = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }
}
