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
        message: impl Into<String>,
        limit: Instant,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let backend = self.clone();
        let (lock, channel) = (lock.to_string(), channel.to_string());
        let message: String = message.into();
        async move {
            let sent = match &backend {
                Backend::Redis(t) => {
                    let sent = async {
                        let mut conn = t.node(&lock).await?.conn();
                        let publish = conn.publish();
                        redis::cmd(publish)
                            .arg(&channel)
                            .arg(&message)
                            .query_async::<redis::Value>(&mut conn)
                            .await
                            .map_err(Error::from)
                    };
                    tokio::time::timeout_at(limit, sent).await
                }
                #[cfg(feature = "postgres")]
                Backend::Postgres(t) => tokio::time::timeout_at(
                    limit,
                    crate::backend::postgres::locks::notify(t, &channel, &message),
                )
                .await
                .map(|r| r.map(|()| redis::Value::Nil)),
            };
            if !matches!(sent, Ok(Ok(_))) {
                tracing::debug!(
                    channel,
                    message = %message,
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
/// [`FairLocks`] and [`Leaders`]), or who holds it instead.
///
/// [`Locks`]: crate::Locks
/// [`FairLocks`]: crate::FairLocks
/// [`Leaders`]: crate::Leaders
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Taken {
    /// The fencing token (a leader's term) of the grant: every later grant's is higher, since
    /// a release never moves the fence back. `None` when the fence was unreadable.
    pub fencing_token: Option<u64>,
    /// Who held it: a leader's name, or the first characters of a lock holder's token (tokens
    /// are never shown in full).
    pub holder: String,
}

/// Which grant an operator's command may act on: the one it was shown (by
/// [`Inspector::find`](crate::Inspector::find), `baton status` or `baton unlock`), so that a
/// grant made after it was shown is never taken by mistake.
///
/// A lock, fair lock or election is named by [`Expected::Token`] (its fencing token, a
/// leader's term) or, where no fencing token is shown, by [`Expected::Holder`]; a job's attempt
/// by [`Expected::Attempt`]. [`Expected::Any`] is the old behaviour, for callers that mean
/// "whatever holds it now".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum Expected {
    /// The grant with this fencing token (a leader's term).
    Token(u64),
    /// The grant whose holder is shown as this: a leader's name, or the first characters of a
    /// lock holder's token ([`Taken::holder`], `Entry::holder`).
    Holder(String),
    /// A job's attempt with this number.
    Attempt(u64),
    /// Whatever holds it when the command runs.
    Any,
}

impl Expected {
    /// Whether a lock-shaped grant shown as `taken` is the one meant.
    ///
    /// # Errors
    /// [`ConfigError`](crate::ConfigError) for [`Expected::Attempt`]: a lock has no attempts.
    fn matches_grant(&self, taken: &Taken) -> Result<bool, crate::error::ConfigError> {
        match self {
            Expected::Token(t) => Ok(taken.fencing_token == Some(*t)),
            Expected::Holder(h) => Ok(*h == taken.holder),
            Expected::Any => Ok(true),
            Expected::Attempt(_) => Err(crate::error::ConfigError::invalid(
                "expected",
                "a fencing token, a holder or any (a lock has no attempts)",
            )),
        }
    }
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::Token(t) => write!(f, "fencing token {t}"),
            Expected::Holder(h) => write!(f, "holder {h}"),
            Expected::Attempt(n) => write!(f, "attempt {n}"),
            Expected::Any => f.write_str("whatever holds it"),
        }
    }
}

/// What `force_release` did (on [`Locks`], [`FairLocks`] and [`Leaders`]).
///
/// [`Locks`]: crate::Locks
/// [`FairLocks`]: crate::FairLocks
/// [`Leaders`]: crate::Leaders
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ForceRelease {
    /// The expected grant was released: this one.
    Released(Taken),
    /// Nothing holds it; nothing was done.
    Free,
    /// Another grant holds it now (this one); nothing was done.
    HeldByAnother(Taken),
}

/// The message a force release publishes on the holder's channel once it released the grant
/// of fencing token `fence`: what a holder listening there loses its lease on at once.
pub(crate) fn taken_message(fence: u64) -> String {
    format!("taken:{fence}")
}

/// Whether `message` says the grant of fencing token `fence` was taken (see [`taken_message`]).
pub(crate) fn is_taken(message: &str, fence: u64) -> bool {
    message
        .strip_prefix("taken:")
        .and_then(|f| f.parse::<u64>().ok())
        == Some(fence)
}

/// A force release's loop: reads the grant with `read` (`None`: free), compares it with
/// `expected`, and releases it with `release` (by the value read, so a grant that changed in
/// between is never released blindly: it is read and compared again). On a release, `taken`
/// tells the holder.
///
/// # Errors
/// As `read` and `release`; [`Error::Config`] for an expectation a lock cannot meet;
/// [`Error::Timeout`] when the holder kept changing through every try (only with
/// [`Expected::Any`]: any other changes at most once to a grant it does not match).
pub(crate) async fn take_expected<R, RF, L, LF>(
    expected: &Expected,
    mut read: R,
    mut release: L,
) -> Result<(ForceRelease, Option<String>), Error>
where
    R: FnMut() -> RF,
    RF: std::future::Future<Output = Result<Option<(String, Taken)>, Error>>,
    L: FnMut(String) -> LF,
    LF: std::future::Future<Output = Result<bool, Error>>,
{
    for _ in 0..20 {
        let Some((value, taken)) = read().await? else {
            return Ok((ForceRelease::Free, None));
        };
        if !expected.matches_grant(&taken)? {
            return Ok((ForceRelease::HeldByAnother(taken), None));
        }
        if release(value.clone()).await? {
            return Ok((ForceRelease::Released(taken), Some(value)));
        }
    }
    Err(Error::Timeout {
        during: "taking a lock whose holder kept changing",
    })
}

impl Backend {
    /// Takes lock `lock` (its fence `fence`, its waiters woken on `channel`) from its holder
    /// if that is the grant `expected` names: reads the holder's value and fence atomically,
    /// compares, then releases by that value. `holder` makes the value printable. A released
    /// grant's holder is told on `channel` ([`taken_message`]).
    ///
    /// # Errors
    /// Connection errors; [`Error::Timeout`] when the holder kept changing through every try.
    pub(crate) async fn take(
        &self,
        lock: &str,
        fence: &str,
        channel: &str,
        holder: fn(&str) -> String,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        let (outcome, _) = take_expected(
            expected,
            || async {
                let stored = self.read(lock, fence).await?;
                Ok(stored.value.map(|value| {
                    let taken = Taken {
                        fencing_token: stored.fence.and_then(|f| f.parse().ok()),
                        holder: holder(&value),
                    };
                    (value, taken)
                }))
            },
            |value| async move {
                let limit = Instant::now() + self.response_timeout();
                self.release(lock, channel, &value, limit).await
            },
        )
        .await?;
        self.tell_taken(lock, channel, &outcome).await;
        Ok(outcome)
    }

    /// Tells the holder of a released grant, on `channel` (best effort: a holder that misses
    /// it learns at its next extension).
    pub(crate) async fn tell_taken(&self, lock: &str, channel: &str, outcome: &ForceRelease) {
        if let ForceRelease::Released(Taken {
            fencing_token: Some(f),
            ..
        }) = outcome
        {
            let limit = Instant::now() + self.response_timeout();
            let message = taken_message(*f);
            self.notification(lock, channel, message, limit).await;
        }
    }
}
