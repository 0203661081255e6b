//! [`AdvisoryOptions`]: how long a blocking acquisition waits, and how often a session guard
//! checks its connection.

use std::time::Duration;

use crate::error::ConfigError;

/// The default interval of a session guard's heartbeat (`SELECT 1` on its connection).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// The shortest heartbeat interval accepted.
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// The longest heartbeat interval accepted.
pub const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);
/// The longest bounded wait: PostgreSQL's `lock_timeout` is an `int` of milliseconds.
pub const MAX_WAIT: Duration = Duration::from_millis(i32::MAX as u64);

/// How the blocking forms wait and how a session guard watches its connection. Build with
/// [`AdvisoryOptions::builder`]; [`Default`] waits without bound and beats every second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvisoryOptions {
    wait: Option<Duration>,
    heartbeat: Duration,
}

impl Default for AdvisoryOptions {
    fn default() -> Self {
        AdvisoryOptions {
            wait: None,
            heartbeat: DEFAULT_HEARTBEAT,
        }
    }
}

impl AdvisoryOptions {
    /// A builder starting from the defaults.
    pub fn builder() -> AdvisoryOptionsBuilder {
        AdvisoryOptionsBuilder {
            options: AdvisoryOptions::default(),
        }
    }

    /// How long a blocking acquisition waits for the lock (PostgreSQL's `lock_timeout`, set for
    /// that one statement); `None`: until it is granted.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The interval of a session guard's heartbeat.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// `wait` as a `lock_timeout` value: whole milliseconds, rounded up, at least 1 (`0` would
    /// mean "no timeout" to PostgreSQL).
    pub(crate) fn lock_timeout(&self) -> Option<String> {
        self.wait.map(|w| {
            let ms = w.as_nanos().div_ceil(1_000_000).max(1);
            format!("{ms}ms")
        })
    }
}

/// Builds [`AdvisoryOptions`]; [`build`](Self::build) checks the ranges.
#[derive(Clone, Debug)]
pub struct AdvisoryOptionsBuilder {
    options: AdvisoryOptions,
}

impl AdvisoryOptionsBuilder {
    /// Bounds the blocking forms' wait (1 ms ..= [`MAX_WAIT`]); past it they return
    /// [`Error::NotAcquired`](crate::Error::NotAcquired). The server itself gives up
    /// (`lock_timeout`) and wakes the waiter when the lock is freed: nothing polls.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// The session guard's heartbeat interval ([`MIN_HEARTBEAT`] ..= [`MAX_HEARTBEAT`],
    /// default [`DEFAULT_HEARTBEAT`]).
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.options.heartbeat = heartbeat;
        self
    }

    /// The options, or the first setting out of range.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `wait` or `heartbeat`.
    pub fn build(self) -> Result<AdvisoryOptions, ConfigError> {
        let o = self.options;
        if let Some(wait) = o.wait {
            if wait < Duration::from_millis(1) || wait > MAX_WAIT {
                return Err(ConfigError::invalid(
                    "wait",
                    format!(
                        "{wait:?} is out of range: 1ms ..= {MAX_WAIT:?} (PostgreSQL's lock_timeout \
                         in ms); use try_acquire for no wait"
                    ),
                ));
            }
        }
        if o.heartbeat < MIN_HEARTBEAT || o.heartbeat > MAX_HEARTBEAT {
            return Err(ConfigError::invalid(
                "heartbeat",
                format!(
                    "{:?} is out of range: {MIN_HEARTBEAT:?} ..= {MAX_HEARTBEAT:?}",
                    o.heartbeat
                ),
            ));
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_named() {
        let o = AdvisoryOptions::builder().build().unwrap();
        assert_eq!(o, AdvisoryOptions::default());
        assert_eq!(o.lock_timeout(), None);
        let o = AdvisoryOptions::builder()
            .wait(Duration::from_micros(1500))
            .heartbeat(Duration::from_millis(250))
            .build()
            .unwrap();
        assert_eq!(o.lock_timeout().as_deref(), Some("2ms"));
        assert_eq!(o.heartbeat(), Duration::from_millis(250));
        for (b, field) in [
            (AdvisoryOptions::builder().wait(Duration::ZERO), "wait"),
            (
                AdvisoryOptions::builder().wait(MAX_WAIT + Duration::from_millis(1)),
                "wait",
            ),
            (
                AdvisoryOptions::builder().heartbeat(Duration::from_millis(1)),
                "heartbeat",
            ),
            (
                AdvisoryOptions::builder().heartbeat(MAX_HEARTBEAT * 2),
                "heartbeat",
            ),
        ] {
            let err = b.build().unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
    }
}
