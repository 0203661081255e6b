//! [`AcquireOptions`]: how [`Locks::acquire`](super::Locks::acquire) waits, and whether the
//! guard gets a watchdog. Validated by [`AcquireOptionsBuilder::build`] and by deserialization
//! alike, never coerced.

use crate::util::lock_replies::ReplicaWait;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

pub use crate::lease::{MAX_TTL, MIN_TTL};
/// The default cap of the backoff between tries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How [`Locks::acquire`](super::Locks::acquire) waits for a held lock, and what the guard does
/// while held.
///
/// Build it with [`AcquireOptions::builder`] or deserialize it (durations in milliseconds, e.g.
/// `{"wait_ms":10000,"watchdog":true}`); both run the same validation. The default waits
/// forever, with no watchdog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawOptions", into = "RawOptions")]
pub struct AcquireOptions {
    pub(crate) wait: Option<Duration>,
    pub(crate) max_tries: Option<u32>,
    pub(crate) max_backoff: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) replica_ack: Option<ReplicaWait>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            wait: None,
            max_tries: None,
            max_backoff: DEFAULT_MAX_BACKOFF,
            watchdog: false,
            max_hold: None,
            replica_ack: None,
        }
    }
}

impl AcquireOptions {
    /// Starts from the defaults.
    pub fn builder() -> AcquireOptionsBuilder {
        AcquireOptionsBuilder {
            raw: RawOptions::from(AcquireOptions::default()),
        }
    }

    /// How long to wait for the lock at most (`None`: forever).
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// How many tries at most (`None`: no limit).
    pub fn max_tries(&self) -> Option<u32> {
        self.max_tries
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

    /// The replica acknowledgement each grant waits for: `(replicas, timeout)`.
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.replica_ack.map(|w| (w.replicas, w.timeout))
    }

    pub(crate) fn with_watchdog(mut self) -> Self {
        self.watchdog = true;
        self
    }
}

/// The serialized shape of [`AcquireOptions`]: plain fields with defaults, durations in ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawOptions {
    wait_ms: Option<u64>,
    max_tries: Option<u32>,
    max_backoff_ms: u64,
    watchdog: bool,
    max_hold_ms: Option<u64>,
    /// 0: no replica acknowledgement.
    replica_ack: u32,
    replica_ack_timeout_ms: u64,
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions::from(AcquireOptions::default())
    }
}

impl From<AcquireOptions> for RawOptions {
    fn from(o: AcquireOptions) -> Self {
        RawOptions {
            wait_ms: o.wait.map(crate::util::time::ms),
            max_tries: o.max_tries,
            max_backoff_ms: crate::util::time::ms(o.max_backoff),
            watchdog: o.watchdog,
            max_hold_ms: o.max_hold.map(crate::util::time::ms),
            replica_ack: o.replica_ack.map_or(0, |w| w.replicas),
            replica_ack_timeout_ms: o
                .replica_ack
                .map_or(1000, |w| crate::util::time::ms(w.timeout)),
        }
    }
}

impl TryFrom<RawOptions> for AcquireOptions {
    type Error = ConfigError;
    fn try_from(raw: RawOptions) -> Result<Self, ConfigError> {
        AcquireOptionsBuilder { raw }.build()
    }
}

/// Builder of [`AcquireOptions`].
#[derive(Debug, Clone)]
pub struct AcquireOptionsBuilder {
    raw: RawOptions,
}

impl AcquireOptionsBuilder {
    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after waiting this long
    /// (`Duration::ZERO`: one try). Defaults to waiting forever.
    pub fn wait(mut self, d: Duration) -> Self {
        self.raw.wait_ms = Some(crate::util::time::ms(d));
        self
    }

    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after this many tries
    /// (1 ..= 2^32−1). Defaults to no limit.
    pub fn max_tries(mut self, n: u32) -> Self {
        self.raw.max_tries = Some(n);
        self
    }

    /// The cap of the exponential backoff (with full jitter) between tries, 1 ms ..= 1 min; a
    /// release or the holder's lease running out wakes a waiter earlier. Defaults to 1 s.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.raw.max_backoff_ms = crate::util::time::ms(d);
        self
    }

    /// Starts the guard's watchdog (see [`LockGuard::start_watchdog`](super::LockGuard::start_watchdog)).
    /// Defaults to off; [`Locks::with_lock`](super::Locks::with_lock) always turns it on.
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

    /// Replica acknowledgement: each acquisition's script is followed, on the same dedicated
    /// connection and in the same round trip, by `WAIT replicas timeout`. `replicas` 0 switches
    /// it off (the default); 1 ..= 100 replicas, timeout 1 ms ..= 1 min, and at most half the
    /// lock's ttl (checked when acquiring) and three quarters of the client's response timeout
    /// (applied when sent).
    ///
    /// A grant fewer replicas acknowledged is never returned: the lock is released by token
    /// and the acquisition fails with [`Error::NotReplicated`](crate::Error::NotReplicated)
    /// (not retried). `WAIT` narrows the window in which a granted lock can be lost to a
    /// failover; it does not close it (replication stays asynchronous).
    ///
    /// Redis only: on a PostgreSQL client an acquisition with it is
    /// [`Error::Unsupported`](crate::Error::Unsupported) (configure synchronous replication on
    /// the server instead).
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.raw.replica_ack = replicas;
        self.raw.replica_ack_timeout_ms = crate::util::time::ms(timeout);
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field out of range.
    pub fn build(self) -> Result<AcquireOptions, ConfigError> {
        let r = self.raw;
        let wait = r.wait_ms.map(Duration::from_millis);
        let max_backoff = Duration::from_millis(r.max_backoff_ms);
        let max_hold = r.max_hold_ms.map(Duration::from_millis);
        crate::lease::check_waiting(wait, r.max_tries, max_backoff, max_hold)?;
        let replica_ack = match r.replica_ack {
            0 => None,
            n if n > 100 => {
                return Err(ConfigError::invalid(
                    "replica_ack",
                    format!("{n} replicas is outside 0 ..= 100"),
                ))
            }
            replicas => {
                let timeout = Duration::from_millis(r.replica_ack_timeout_ms);
                if timeout.is_zero() || timeout > Duration::from_secs(60) {
                    return Err(ConfigError::invalid(
                        "replica_ack",
                        format!("a timeout of {timeout:?} is outside 1ms ..= 1 min"),
                    ));
                }
                Some(ReplicaWait { replicas, timeout })
            }
        };
        Ok(AcquireOptions {
            wait,
            max_tries: r.max_tries,
            max_backoff,
            watchdog: r.watchdog,
            max_hold,
            replica_ack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<AcquireOptions, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(o) => panic!("accepted: {o:?}"),
        }
    }

    #[test]
    fn defaults_wait_forever_without_a_watchdog() {
        let o = AcquireOptions::builder().build().unwrap();
        assert_eq!(o, AcquireOptions::default());
        assert_eq!(o.wait(), None);
        assert_eq!(o.max_tries(), None);
        assert_eq!(o.max_backoff(), DEFAULT_MAX_BACKOFF);
        assert!(!o.watchdog());
        assert_eq!(o.max_hold(), None);
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let b = AcquireOptions::builder;
        assert_eq!(field(b().max_tries(0).build()), "max_tries");
        assert_eq!(
            field(b().max_backoff(Duration::ZERO).build()),
            "max_backoff"
        );
        assert_eq!(
            field(b().max_backoff(Duration::from_secs(61)).build()),
            "max_backoff"
        );
        assert_eq!(field(b().max_hold(Duration::ZERO).build()), "max_hold");
        assert_eq!(field(b().wait(Duration::MAX).build()), "wait");
        assert!(b().wait(Duration::ZERO).max_tries(1).build().is_ok());
    }

    #[test]
    fn ttls_are_checked() {
        assert!(crate::lease::check_ttl("ttl", Duration::from_millis(10)).is_ok());
        assert!(crate::lease::check_ttl("ttl", MAX_TTL).is_ok());
        assert!(crate::lease::check_ttl("ttl", Duration::from_millis(9)).is_err());
        assert!(crate::lease::check_ttl("ttl", MAX_TTL + Duration::from_millis(1)).is_err());
    }

    #[test]
    fn deserialization_validates_too() {
        let o: AcquireOptions =
            serde_json::from_str(r#"{"wait_ms":10000,"watchdog":true}"#).unwrap();
        assert_eq!(o.wait(), Some(Duration::from_secs(10)));
        assert!(o.watchdog());
        assert!(serde_json::from_str::<AcquireOptions>(r#"{"max_tries":0}"#).is_err());
        assert!(serde_json::from_str::<AcquireOptions>(r#"{"wait":5}"#).is_err());
        let back: AcquireOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }
}
