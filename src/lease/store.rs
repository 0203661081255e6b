//! The lock store: what a lease-holding primitive does to a held lock on any [`Backend`] (take
//! it, extend it, release it by token, read it back, notify its waiters), as methods of the
//! seam's [`Backend`] and [`WeakBackend`] (the enums and their shared dispatch live in
//! `crate::backend`; the operations live here because their Redis forms are this kernel's
//! fence-step scripts). Each primitive's
//! acquisition is its own (it decides what a grant writes); what happens to a grant afterwards
//! is the same on every backend, and the decisions around it ([`after_extension`],
//! [`deadline`], [`next_fence`], [`orphaned`]) are shared, not copied.
//!
//! - **Redis**: the scripts of [`super::lock`] and [`super::extend`], on the node that serves
//!   the lock's key.
//! - **PostgreSQL** (feature `postgres`): one row of `baton_locks`
//!   ([`crate::backend::postgres::locks`]), one statement per operation.
//!
//! [`after_extension`]: super::watchdog::after_extension
//! [`deadline`]: super::deadline
//! [`next_fence`]: super::next_fence
//! [`orphaned`]: super::lock::orphaned

use tokio::time::Instant;

use super::lock::{Acquire, Grant, Stored};
use super::{Extend, Extension};
use crate::backend::{Backend, WeakBackend};
use crate::error::Error;

impl Backend {
    /// Takes `req.lock` if free: one round trip that gives up at `limit`. On Redis the kernel's
    /// fenced script ([`super::lock::acquire`]); on PostgreSQL the lock row's statement
    /// ([`crate::backend::postgres::locks::acquire`]), whose abandoned grant is released behind it on its own
    /// connection, with `channel` notified.
    ///
    /// # Errors
    /// As [`super::lock::acquire`]: an indeterminate error ([`Error::is_indeterminate`]) may
    /// have taken the lock, so the caller releases by token.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn acquire(
        &self,
        req: &Acquire<'_>,
        channel: &str,
        limit: Instant,
    ) -> Result<Grant, Error> {
        match self {
            Backend::Redis(t) => {
                let node = t.node(req.lock).await?;
                super::lock::acquire(&mut node.conn(), req, limit).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                crate::backend::postgres::locks::acquire(
                    t,
                    req.lock,
                    channel,
                    req.token,
                    req.ttl,
                    super::lock::fence_ttl(req.ttl),
                    limit,
                )
                .await
            }
        }
    }

    /// [`Backend::acquire`], grouped with other tasks' lock calls to the same node when they
    /// overlap (see [`super::batch`]): on a Redis client whose keys all live on one node; alone
    /// elsewhere (a cluster, PostgreSQL). `pending` is the caller's release by token, disarmed
    /// here only when the call never left (its caller dropped it while it was queued).
    ///
    /// # Errors
    /// As [`Backend::acquire`].
    pub(crate) async fn acquire_grouped<K: super::batch::BatchKeys>(
        &self,
        keys: &std::sync::Arc<K>,
        req: &Acquire<'_>,
        limit: Instant,
        pending: &mut dyn crate::util::drop_guard::Disarm,
    ) -> Result<Grant, Error> {
        match self {
            Backend::Redis(t) if t.router.one_node() => {
                let node = t.node(req.lock).await?;
                super::batch::acquire(&node, keys, req, limit, pending, &t.tracker).await
            }
            _ => self.acquire(req, keys.channel(), limit).await,
        }
    }

    /// Sends `message` on `channel`, bounded by `limit`, as a future for a task the caller runs
    /// anyway; best effort: a failure is only logged. `lock` names the key whose node serves the
    /// channel (Redis Cluster).
    pub(crate) fn notification(
        &self,
        lock: &str,
        channel: &str,
        message: &'static str,
        limit: Instant,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let backend = self.clone();
        let (lock, channel) = (lock.to_string(), channel.to_string());
        async move {
            let sent = match &backend {
                Backend::Redis(t) => {
                    let sent = async {
                        let mut conn = t.node(&lock).await?.conn();
                        let publish = conn.publish();
                        redis::cmd(publish)
                            .arg(&channel)
                            .arg(message)
                            .query_async::<redis::Value>(&mut conn)
                            .await
                            .map_err(Error::from)
                    };
                    tokio::time::timeout_at(limit, sent).await
                }
                #[cfg(feature = "postgres")]
                Backend::Postgres(t) => tokio::time::timeout_at(
                    limit,
                    crate::backend::postgres::locks::notify(t, &channel, message),
                )
                .await
                .map(|r| r.map(|()| redis::Value::Nil)),
            };
            if !matches!(sent, Ok(Ok(_))) {
                tracing::debug!(
                    channel,
                    message,
                    "a notification was not sent; readers re-read on a timer"
                );
            }
        }
    }

    /// The lock `lock` as stored: its holder's value, its fence (`fence` is the fence key on
    /// Redis; on PostgreSQL the fence is the row's) and the lease's remaining time, read
    /// atomically in one round trip (at most `response_timeout`).
    ///
    /// # Errors
    /// Connection errors, timeouts, and a server error for a key of another type.
    pub(crate) async fn read(&self, lock: &str, fence: &str) -> Result<Stored, Error> {
        match self {
            Backend::Redis(t) => super::lock::read(t, lock, fence).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => crate::backend::postgres::locks::read(t, lock).await,
        }
    }

    /// Extends the lease if it still holds this holder's value; one round trip, giving up at
    /// `limit` (see [`WeakBackend::extend`]).
    pub(crate) async fn extend(
        &self,
        req: &Extend<'_>,
        limit: Instant,
    ) -> Result<Extension, Error> {
        self.downgrade().extend(req, limit).await
    }

    /// Releases `lock` if it still holds `token`, waking waiters on `channel` (a Redis channel,
    /// or the topic of a PostgreSQL notification); one round trip, giving up at `limit`.
    /// `Ok(false)`: it was no longer ours, nothing was written.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit` (the release may have applied); connection and server
    /// errors.
    pub(crate) async fn release(
        &self,
        lock: &str,
        channel: &str,
        token: &str,
        limit: Instant,
    ) -> Result<bool, Error> {
        match self {
            // Grouped with other tasks' lock calls to the node when they overlap.
            Backend::Redis(t) if t.router.one_node() => {
                let node = t.node(lock).await?;
                super::batch::release(&node, lock, channel, token, limit, &t.tracker).await
            }
            Backend::Redis(t) => {
                let mut conn = t.node(lock).await?.conn();
                super::lock::release(&mut conn, lock, channel, token, limit).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                crate::backend::postgres::locks::release(t, lock, channel, token, limit).await
            }
        }
    }
}

impl WeakBackend {
    /// Extends the lease `req.lease` if it still holds `req.value` (and, on Redis, the guard
    /// its value), in one round trip that gives up at `limit`.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit` (the extension may have applied); connection and server
    /// errors; [`Error::Stopped`] once the client is gone; on PostgreSQL,
    /// [`Error::Unsupported`] for a guard other than the lease itself.
    pub(crate) async fn extend(
        &self,
        req: &Extend<'_>,
        limit: Instant,
    ) -> Result<Extension, Error> {
        match self {
            WeakBackend::Redis(router) => {
                let mut conn = router.node(req.lease).await?.conn();
                super::extend(&mut conn, req, limit).await
            }
            #[cfg(feature = "postgres")]
            WeakBackend::Postgres(weak) => {
                let Some(t) = weak.upgrade() else {
                    return Err(Error::Stopped);
                };
                if req.guard != req.lease || req.guard_value != req.value {
                    return Err(Error::Unsupported {
                        what: "a lease extension guarded by another key",
                        backend: "PostgreSQL",
                        why: "a lock row is its own guard",
                    });
                }
                crate::backend::postgres::locks::extend(
                    &t,
                    req.lease,
                    req.value,
                    req.ttl,
                    req.retention,
                    limit,
                )
                .await
            }
        }
    }
}

/// What an operator took from a hung holder with `force_release` (on [`Locks`],
/// [`FairLocks`] and [`Leaders`]).
///
/// [`Locks`]: crate::Locks
/// [`FairLocks`]: crate::FairLocks
/// [`Leaders`]: crate::Leaders
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Taken {
    /// The fencing token (a leader's term) of the grant taken: every later grant's is higher,
    /// since a release never moves the fence back. `None` when the fence was unreadable.
    pub fencing_token: Option<u64>,
    /// Who held it: a leader's name, or the first characters of a lock holder's token (tokens
    /// are never shown in full).
    pub holder: String,
}

impl Backend {
    /// Takes lock `lock` (its fence `fence`, its waiters woken on `channel`) from whoever holds
    /// it: reads the holder's value, then releases by that value, so a holder that changed in
    /// between is never released blindly (it is read again). `holder` makes the value
    /// printable. `None` when nothing held it.
    ///
    /// # Errors
    /// Connection errors; [`Error::Timeout`] when the holder kept changing through every try.
    pub(crate) async fn take(
        &self,
        lock: &str,
        fence: &str,
        channel: &str,
        holder: fn(&str) -> String,
    ) -> Result<Option<Taken>, Error> {
        for _ in 0..20 {
            let stored = self.read(lock, fence).await?;
            let Some(value) = stored.value else {
                return Ok(None);
            };
            let limit = Instant::now() + self.response_timeout();
            if self.release(lock, channel, &value, limit).await? {
                return Ok(Some(Taken {
                    fencing_token: stored.fence.and_then(|f| f.parse().ok()),
                    holder: holder(&value),
                }));
            }
        }
        Err(Error::Timeout {
            during: "taking a lock whose holder kept changing",
        })
    }
}
