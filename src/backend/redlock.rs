//! Redlock's store seam: what Redlock asks of each of its masters (take with `SET NX PX`,
//! extend, release by token, and the master's endpoint for messages) as methods of
//! [`Backend`]. Redlock's masters are independent Redis servers: on another backend each
//! method is [`Error::Unsupported`] (the client's `Redlock::new` refuses one before that). The
//! commands are `redis::redlock`.

use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::lock_replies::Extension;

/// What Redlock names in a refusal on another backend, and why.
const WHAT: &str = "Redlock";
const WHY: &str = "its masters are independent Redis servers";

impl Backend {
    /// Where this backend connects, for messages and to reject a master counted twice: never
    /// credentials.
    pub(crate) fn endpoint(&self) -> &str {
        match self {
            Backend::Redis(t) => &t.endpoint,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => &t.endpoint,
        }
    }

    /// `SET lock token NX PX ttl` on this master, giving up at `limit`: `true` if it set.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit`; connection and server errors; [`Error::Unsupported`] off
    /// Redis.
    pub(crate) async fn redlock_set(
        &self,
        lock: &str,
        token: &str,
        ttl: Duration,
        limit: Instant,
    ) -> Result<bool, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::redlock::set_nx(t, lock, token, ttl, limit).await
    }

    /// Extends `lock` to `ttl` on this master if it still holds `token`, giving up at `limit`.
    ///
    /// # Errors
    /// As [`Backend::redlock_set`].
    pub(crate) async fn redlock_extend(
        &self,
        lock: &str,
        token: &str,
        ttl: Duration,
        limit: Instant,
    ) -> Result<Extension, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::redlock::extend_on(t, lock, token, ttl, limit).await
    }

    /// Deletes `lock` on this master if it still holds `token`, waking `channel`, giving up at
    /// `limit`: whether it held the token.
    ///
    /// # Errors
    /// As [`Backend::redlock_set`].
    pub(crate) async fn redlock_release(
        &self,
        lock: &str,
        channel: &str,
        token: &str,
        limit: Instant,
    ) -> Result<bool, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::redlock::release_on(t, lock, channel, token, limit).await
    }
}
