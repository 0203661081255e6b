//! What every backend's connections are configured with, and the hidden test seam each backend
//! runs before a commit. Plain data: the backends read it, the client builds it.

use std::time::Duration;

/// Connection settings of one client, shared by every kind of connection of every backend.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub max_backoff: Duration,
    pub pool_size: usize,
}

/// `WAIT replicas timeout` after a write: how many replicas must acknowledge it, and how long
/// to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

/// A hook run between round trip 1 (`WATCH` + reads) and round trip 2 (`MULTI … EXEC`) of a
/// transition, and before a lease extension, with the transition's name (`"grant"`,
/// `"exhaust"`, `"finish"`, `"extend"`). A hidden test seam (feature `testing`): tests write a
/// competing value exactly in the window a `WATCH` protects, or hold a transition there.
#[cfg(feature = "testing")]
pub type ExecHook = std::sync::Arc<
    dyn Fn(&'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

impl ConnSettings {
    /// The settings' ranges, checked before any network I/O.
    ///
    /// # Errors
    /// A [`ConfigError`](crate::error::ConfigError) naming the first setting out of its range.
    pub(crate) fn check(&self) -> Result<(), crate::error::ConfigError> {
        use crate::error::ConfigError;
        let range = |field: &'static str, d: Duration, lo: Duration, hi: Duration| {
            if d < lo || d > hi {
                Err(ConfigError::invalid(
                    field,
                    format!("{d:?} is outside {lo:?} ..= {hi:?}"),
                ))
            } else {
                Ok(())
            }
        };
        range(
            "connect_timeout",
            self.connect_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        range(
            "response_timeout",
            self.response_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        range(
            "max_backoff",
            self.max_backoff,
            Duration::from_millis(50),
            Duration::from_secs(300),
        )?;
        if self.pool_size == 0 || self.pool_size > 1024 {
            return Err(ConfigError::invalid(
                "pool_size",
                format!("{} is outside 1 ..= 1024", self.pool_size),
            ));
        }
        Ok(())
    }
}
