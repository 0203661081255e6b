//! The lock store seam: what a lease-holding primitive does to a held lock on any [`Backend`]
//! (take it, with or without replicas' acknowledgement; extend it; release it by token, now or
//! in the background; read it back; notify its waiters; take it from a hung holder), as
//! methods of [`Backend`] and [`WeakBackend`], written once with one arm per backend, each arm
//! one call into that backend's folder:
//!
//! - **Redis**: the scripts of `redis::locks` (and their grouping, `redis::batch`), on the node
//!   that serves the lock's key;
//! - **PostgreSQL** (feature `postgres`): one row of `baton_locks` (`postgres::locks`), one
//!   statement per operation.
//!
//! What crosses it (the requests, [`Grant`], [`Stored`], [`Extension`], the fenced resource's
//! types) is defined in the leaves (`util::lock_replies`), which both sides name. Each
//! primitive's acquisition decides what a grant writes; what happens to a grant afterwards is
//! the same on every backend, and the decisions around it (the lease kernel's deadlines, fences
//! and `orphaned`) are shared, not copied.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Backend, WeakBackend};
use crate::error::Error;
use crate::util::drop_guard::Disarm;
pub(crate) use crate::util::lock_replies::BatchKeys;
use crate::util::lock_replies::{
    Acquire, Extend, Extension, FencedValue, FencedWrite, Grant, ReplicaWait, Stored,
};

// The lock table's cleanup, for the model checker's test that the statement re-checks what
// it deletes (through the lease kernel: `model_api` names no backend).
#[cfg(all(test, feature = "postgres"))]
pub(crate) use super::postgres::locks::CLEANUP as PG_LOCKS_CLEANUP;

/// Why fenced resources are Redis-only, and what to do on PostgreSQL instead.
const FENCED_ON_POSTGRES: &str = "the resource is a Redis hash; for a resource in \
     PostgreSQL, check the fencing token in the resource's own statement (docs/mutex.md, \
     \"The resource's side of fencing\": one INSERT … ON CONFLICT … WHERE fencing_token <= the \
     new token)";

/// `replica_ack` on PostgreSQL: a grant is committed by the server that took it; replication
/// is PostgreSQL's own (`synchronous_commit`, `synchronous_standby_names`).
#[cfg(feature = "postgres")]
fn replica_ack_unsupported() -> Error {
    Error::Unsupported {
        what: "replica_ack",
        backend: "PostgreSQL",
        why: "a grant is a committed row; for grants that survive a failover, configure \
              synchronous replication (synchronous_standby_names, synchronous_commit) on the \
              server instead",
    }
}

impl Backend {
    /// Creates what the lock store keeps in the backend, if missing: on PostgreSQL the table
    /// `baton_locks` and its index; on Redis nothing. Idempotent.
    ///
    /// # Errors
    /// Connection and permission errors; [`Error::Busy`] when other transactions kept the
    /// table locked through every try.
    pub(crate) async fn migrate_locks(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::locks::migrate(t).await,
        }
    }

    /// Takes `req.lock` if free: one round trip that gives up at `limit`. On Redis the fenced
    /// script on the node serving the lock; on PostgreSQL the lock row's statement, whose
    /// abandoned grant is released behind it on its own connection, with `channel` notified.
    ///
    /// # Errors
    /// [`Error::CorruptState`] when the fence holds something baton never writes; an
    /// indeterminate error ([`Error::is_indeterminate`]) may have taken the lock, so the caller
    /// releases by token; connection and server errors.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn acquire(
        &self,
        req: &Acquire<'_>,
        channel: &str,
        limit: Instant,
    ) -> Result<Grant, Error> {
        match self {
            Backend::Redis(t) => super::redis::locks::acquire_on(t, req, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::locks::acquire_request(t, req, channel, limit).await
            }
        }
    }

    /// [`Backend::acquire`], grouped with other tasks' lock calls to the same node when they
    /// overlap: on a Redis client whose keys all live on one node; alone elsewhere (a cluster,
    /// PostgreSQL). `pending` is the caller's release by token, disarmed here only when the
    /// call never left (its caller dropped it while it was queued).
    ///
    /// # Errors
    /// As [`Backend::acquire`].
    pub(crate) async fn acquire_grouped<K: BatchKeys>(
        &self,
        keys: &Arc<K>,
        req: &Acquire<'_>,
        limit: Instant,
        pending: &mut dyn Disarm,
    ) -> Result<Grant, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::batch::acquire_grouped(t, keys, req, limit, pending).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::locks::acquire_request(t, req, keys.channel(), limit).await
            }
        }
    }

    /// Refuses `replica_ack` on a backend that cannot wait for replicas (PostgreSQL: a grant is
    /// a committed row, replication is the server's own).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on PostgreSQL.
    pub(crate) fn check_replica_ack(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Err(replica_ack_unsupported()),
        }
    }

    /// [`Backend::acquire`] on a dedicated connection with `WAIT` right after it: the grant and
    /// how many replicas acknowledged it. `pending` is disarmed when nothing was sent.
    ///
    /// # Errors
    /// As [`Backend::acquire`]; [`Error::Unsupported`] on PostgreSQL (nothing sent).
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn acquire_replicated(
        &self,
        req: &Acquire<'_>,
        wait: ReplicaWait,
        limit: Instant,
        pending: &mut dyn Disarm,
    ) -> Result<(Grant, u64), Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::locks::acquire_replicated(t, req, wait, limit, pending).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => {
                pending.disarm();
                Err(replica_ack_unsupported())
            }
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
            #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
            let send = async {
                match &backend {
                    Backend::Redis(t) => {
                        super::redis::locks::publish(t, &lock, &channel, &message).await
                    }
                    #[cfg(feature = "postgres")]
                    Backend::Postgres(t) => {
                        super::postgres::locks::notify(t, &channel, &message).await
                    }
                }
            };
            let sent = tokio::time::timeout_at(limit, send).await;
            if !matches!(sent, Ok(Ok(()))) {
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
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn read(&self, lock: &str, fence: &str) -> Result<Stored, Error> {
        match self {
            Backend::Redis(t) => super::redis::locks::read(t, lock, fence).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::locks::read(t, lock).await,
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
    /// or the topic of a PostgreSQL notification); one round trip, giving up at `limit`,
    /// grouped on Redis with other tasks' lock calls to the node when they overlap.
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
            Backend::Redis(t) => {
                super::redis::batch::release_on(t, lock, channel, token, limit).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::locks::release(t, lock, channel, token, limit).await
            }
        }
    }

    /// Releases `lock` if it still holds `token` (waking `channel`) through a task of the
    /// client; never blocks, and logs the outcome. Without a runtime (a holder dropped after
    /// it ended) or a client that shut down it does nothing: the lock's ttl is the backstop.
    pub(crate) fn release_in_background(&self, lock: &str, channel: &str, token: String) {
        match self {
            Backend::Redis(t) => {
                super::redis::locks::release_in_background(t, lock, channel, token)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::locks::release_in_background(t, lock, channel, token)
            }
        }
    }

    /// Writes `value` to the Redis hash `resource` only if `fencing_token` is at least the
    /// highest token it has accepted, recording the token; one round trip, atomic, bounded by
    /// the response timeout.
    ///
    /// # Errors
    /// [`Error::CorruptState`] when the stored token is not one baton writes; [`Error::Timeout`]
    /// (the write may have applied); connection and server errors; [`Error::Unsupported`] on
    /// PostgreSQL.
    pub(crate) async fn write_fenced(
        &self,
        resource: &str,
        fencing_token: u64,
        value: &[u8],
    ) -> Result<FencedWrite, Error> {
        let t = self.redis("write_fenced", FENCED_ON_POSTGRES)?;
        super::redis::locks::fenced_write_on(t, resource, fencing_token, value).await
    }

    /// Reads a fenced resource (the value and its token, in one script), bounded by the
    /// response timeout: `None` when nothing was written.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a token baton never writes, or one without a value;
    /// [`Error::Timeout`]; connection and server errors; [`Error::Unsupported`] on PostgreSQL.
    pub(crate) async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        let t = self.redis("read_fenced", FENCED_ON_POSTGRES)?;
        super::redis::locks::fenced_read_on(t, resource).await
    }

    /// [`Backend::read_fenced`] by a reader holding `fencing_token` (a read-write lock's: the
    /// last write's): the resource records it first, and refuses writes at or below it from
    /// then on. A token of 0 (no write yet) is a plain read.
    ///
    /// # Errors
    /// As [`Backend::read_fenced`].
    pub(crate) async fn read_fenced_at(
        &self,
        resource: &str,
        fencing_token: u64,
    ) -> Result<Option<FencedValue>, Error> {
        let t = self.redis("read_fenced", FENCED_ON_POSTGRES)?;
        if fencing_token == 0 {
            return super::redis::locks::fenced_read_on(t, resource).await;
        }
        super::redis::locks::fenced_read_at_on(t, resource, fencing_token).await
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
            WeakBackend::Redis(router) => super::redis::locks::extend_on(router, req, limit).await,
            #[cfg(feature = "postgres")]
            WeakBackend::Postgres(weak) => {
                super::postgres::locks::extend_request(weak, req, limit).await
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

/// The message a force release publishes once it released the grant of holder `holder` (the
/// short form of its token, as shown), for grants whose fencing token several holders share
/// (a read-write lock's readers all carry the last write's).
pub(crate) fn taken_holder_message(holder: &str) -> String {
    format!("taken:h:{holder}")
}

/// Whether `message` says holder `holder`'s grant was taken (see [`taken_holder_message`]).
pub(crate) fn is_taken_holder(message: &str, holder: &str) -> bool {
    message.strip_prefix("taken:h:") == Some(holder)
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

    /// Tells holder `holder` (as shown) of a released grant on `channel`, for grants whose
    /// fencing token several holders share (best effort, as [`Backend::tell_taken`]).
    pub(crate) async fn tell_taken_holder(&self, lock: &str, channel: &str, holder: &str) {
        let limit = Instant::now() + self.response_timeout();
        let message = taken_holder_message(holder);
        self.notification(lock, channel, message, limit).await;
    }
}
