//! A fenced mutex: one holder at a time per lock name, a fencing token that only grows, and a
//! watchdog that says when the lock may have been lost. On Redis (keys and scripts) or on
//! PostgreSQL (feature `postgres`: one row of `baton_locks` per lock, see the lock store, `backend::locks`), chosen
//! by the client's URL; the API, the guards and the guarantees are the same.
//!
//! - [`keys`]: the key layout (`baton:lock:{K}`, `…:fence`, `…:released`).
//! - [`options`]: the lock options, [`LockOptions`] (validated, serde; shared by the
//!   lock-shaped primitives).
//! - [`Locks`]: the handle ([`Client::locks`](crate::Client::locks)): [`Locks::try_acquire`],
//!   [`Locks::acquire`], [`Locks::with_lock`].
//! - [`LockGuard`]: the held lock: token, fencing token, lease deadline, `release`, `extend`,
//!   the watchdog and its loss signal.
//!
//! The scripts and statements themselves (acquire with fencing, token-checked release and
//! extension) live in the lease kernel, where the later lock-shaped primitives share them; a
//! held lock reaches its backend through the one store seam (`backend`). Waiting is the lease
//! kernel's acquisition engine (`lease::acquire`), shared with the other lock-shaped
//! primitives: this module gives it one try and the lock's wake-one channel.
//!
//! On PostgreSQL each operation is one statement (one round trip): acquire an
//! `INSERT … ON CONFLICT DO UPDATE … WHERE` the lock is free (contention is a read), release an
//! `UPDATE` that clears the token and calls `pg_notify` in the same statement, extend an
//! `UPDATE … WHERE` the token is ours and the lease has not ended. Waiters are woken by the
//! notification through the client's `LISTEN` connection, one waiter per client per release.
//! [`Locks::write_fenced`] (a Redis hash) and [`LockOptionsBuilder::replica_ack`] are
//! [`Error::Unsupported`] there.
//!
//! # Guarantees
//! - Acquisition is one atomic script (on PostgreSQL one statement): `SET NX PX` with a random
//!   128-bit token, and only if it set, the fence advances to `max(old + 1, server time in µs)` in the same step. Fencing
//!   tokens therefore strictly increase per lock name, also after the fence key was lost
//!   (restart without persistence), unless the server's clock goes back. Pass the token to the
//!   resource you write to, and let it reject smaller ones: a lease alone cannot stop a paused
//!   holder from writing late.
//! - Release and extension compare the token: `false` means it was no longer ours and nothing
//!   was written. A failed extension never deletes anything.
//! - Under load, one client's lock calls to one node share script calls (group commit, up to
//!   64 per `EVALSHA`; while fewer than two calls are in flight a call goes alone, so an
//!   uncontended lock pays nothing for it).
//!   Each operation in a batch runs the lone script's own steps on its own keys: its own fence
//!   step, its own token check, the same recovery when its caller is dropped or the reply is
//!   lost. Not on a Redis Cluster (one script cannot span slots), with `replica_ack`, or on
//!   PostgreSQL: calls go alone there.
//! - [`lease_deadline`](crate::HeldLease::lease_deadline) errs early: send time of the granting (or last confirmed
//!   extending) request + lease − max(1 %, 2 ms), on this host's monotonic clock.

pub mod keys;
pub mod options;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::lease::acquire::{self, Tried, TryAcquire};
pub use crate::lease::held::LockGuard;
use crate::lease::held::{HeldKeys, HeldLock, ReleaseFuture};
use crate::lease::lock::{self as kernel, Grant};
pub use crate::lease::lock::{FencedValue, FencedWrite};
use crate::lease::options::Field;
use crate::lease::pending::{release_in_background, Pending};
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::lock_replies::ReplicaWait;
use crate::util::metrics::{primitive, transition, Labels};
use crate::util::time::after;
use crate::util::token::{new_token, short};
use crate::util::wake::WakeOne;

use keys::LockKeys;
pub use keys::DEFAULT_PREFIX;
pub use options::{
    AcquireOptions, AcquireOptionsBuilder, LockOptions, LockOptionsBuilder, MAX_LEASE, MIN_LEASE,
};

/// The mutex on one client's connections. Get it from [`Client::locks`](crate::Client::locks);
/// cheap to clone.
#[derive(Clone)]
pub struct Locks {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locks")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Locks {
    /// How long a subscription to release notifications may take to confirm.
    fn connect_timeout(&self) -> Duration {
        self.backend.connect_timeout()
    }

    /// The mutex on `transport` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Locks {
            backend,
            prefix: Arc::from(DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}lock:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Locks, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Locks {
            backend: self.backend.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// Creates what the mutex stores in its backend, if missing: on PostgreSQL the table
    /// `baton_locks` and its index (docs/operating.md, "PostgreSQL roles and `baton migrate`"); on Redis nothing. Acquisitions
    /// create a missing table themselves on first use where their role may. Idempotent, as
    /// [`Failover::migrate`](crate::Failover::migrate).
    ///
    /// # Errors
    /// Connection and permission errors; [`ErrorKind::Busy`](crate::ErrorKind::Busy) when
    /// other transactions kept the table locked through every try.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.backend.migrate_locks().await
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Takes lock `key` from its holder, as an operator does with a hung one, but only
    /// the grant `expected` names (its fencing token as shown, or its holder where no token is
    /// shown; [`Expected::Any`] for whatever holds it): the holder value and the fence are
    /// read together and the release is by that value, so a grant made after the operator
    /// looked is left alone ([`ForceRelease::HeldByAnother`]). The holder hears it at once on
    /// its lock's channel when it listens there (its watchdog does), at its next extension otherwise, and
    /// reports the loss; the fence stays, so the next holder's fencing token is higher than the one taken. One
    /// method, the same on the mutex, the fair lock and elections:
    /// [`Locks::force_release`](crate::Locks::force_release),
    /// [`FairLocks::force_release`](crate::FairLocks::force_release),
    /// [`Leaders::force_release`](crate::Leaders::force_release).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or [`Expected::Attempt`]; connection errors;
    /// [`Error::Timeout`] when, with [`Expected::Any`], the holder kept changing through every
    /// try.
    pub async fn force_release(
        &self,
        key: &str,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        crate::util::names::check_name("key", key)?;
        let keys = LockKeys::new(&self.prefix, key);
        self.backend
            .take(
                keys.lock(),
                keys.fence(),
                keys.channel(),
                |v| short(v).to_string(),
                expected,
            )
            .await
    }

    /// The resource side of fencing, for a resource kept in Redis: writes `value` to the hash
    /// `resource` (fields `value` and `fencing_token`) only if `fencing_token` is at least the
    /// highest token that resource has accepted, and records it; atomically, in one round trip.
    /// A holder that paused past its lease and writes after its successor gets
    /// [`FencedWrite::Rejected`], and nothing changes. `resource` is any key of yours (not
    /// prefixed); read it with `HGET resource value`.
    ///
    /// For a resource in PostgreSQL, the same rule is one statement (docs/mutex.md, "The resource's side of fencing"); on a
    /// PostgreSQL client this method is [`Error::Unsupported`], pointing there.
    ///
    /// # Errors
    /// [`Error::CorruptState`] when the stored token is not a canonical number (nothing is
    /// written); `WrongType` when `resource` is not a hash; [`Error::Timeout`] after the response
    /// timeout (the write may have applied); connection errors.
    pub async fn write_fenced(
        &self,
        resource: &str,
        fencing_token: u64,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        self.backend
            .write_fenced(resource, fencing_token, value.as_ref())
            .await
    }

    /// The read side of [`Locks::write_fenced`]: what the Redis hash `resource` holds, the
    /// value and the fencing token it was written with (`None` when nothing was written yet),
    /// in one round trip. A read is never refused: readers need no lock, and the token says how
    /// recent the value is.
    ///
    /// On a PostgreSQL client this method is [`Error::Unsupported`], as `write_fenced`.
    ///
    /// # Errors
    /// [`Error::CorruptState`] when the stored token is not one baton writes (or a token is
    /// stored without a value); `WrongType` when `resource` is not a hash; [`Error::Timeout`]
    /// after the response timeout; connection errors.
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        self.backend.read_fenced(resource).await
    }

    fn keys(&self, key: &str, lease: Duration) -> Result<Arc<LockKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        crate::lease::check_ttl("lease", lease)?;
        Ok(Arc::new(LockKeys::new(&self.prefix, key)))
    }

    /// Tries once to take lock `key` for `lease`, in one round trip. Contention is `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a lease outside 10 ms ..= 1 day;
    /// [`Error::CorruptState`] if the fence key holds something baton never writes (nothing is
    /// written then); connection errors and timeouts (the lock is then released by token in the
    /// background, in case the script did run).
    ///
    /// # Cancel safety
    /// Dropping the future after the script was sent releases by token through a task of the
    /// client, so an abandoned acquisition never leaves a lock behind for its full lease (if the
    /// client is gone too, the lease is the backstop).
    pub async fn try_acquire(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        let keys = self.keys(key, lease)?;
        let mut one = MutexTry {
            locks: self,
            keys,
            key,
            lease,
            replica_ack: None,
            holder_name: None,
        };
        match one.try_once(false, Instant::now()).await? {
            Tried::Granted(guard) => Ok(Some(guard)),
            Tried::Held { .. } => Ok(None),
        }
    }

    /// Takes lock `key` for `lease`, waiting while someone else holds it.
    ///
    /// Tries, and while the lock is held sleeps an exponential backoff with full jitter (capped
    /// by [`LockOptions::max_backoff`] and by the holder's remaining PTTL), woken early by a
    /// release published on the lock's channel (subscribed before the second try, so a release
    /// between the first try and the subscription is not missed). A release wakes **one**
    /// waiter of this client (the longest waiting), not all of them: with many local waiters a
    /// handoff then costs one try instead of one per waiter (a thundering herd that kept the
    /// server busy refusing). Waiters of other clients and processes are woken one per client.
    /// A call made while other tasks of this client already wait for the lock does not try at
    /// once: it waits behind them, so within one client the lock goes round in the order its
    /// tasks asked (a task that releases and asks again does not take it back before the waiter
    /// its release woke). [`Locks::try_acquire`] always tries at once.
    /// Gives up after [`LockOptions::max_tries`] tries or [`LockOptions::wait`].
    ///
    /// Transient errors (see [`Error::is_retryable`]) are retried within the same bounds.
    ///
    /// # Errors
    /// [`Error::NotAcquired`] when the bound ran out with the lock held elsewhere (never a
    /// connection error in disguise); the last transient error when the bound ran out on one;
    /// [`Error::Unsupported`] for an option the mutex does not use (`waiter_timeout`,
    /// `heartbeat`); non-retryable errors at once (as [`Locks::try_acquire`]).
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`]: a dropped future never leaves its lock behind.
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let keys = self.keys(key, lease)?;
        opts.refuse_others(
            "the mutex",
            &[
                Field::MaxTries,
                Field::MaxBackoff,
                Field::Watchdog,
                Field::MaxHold,
                Field::ReplicaAck,
                Field::HolderName,
            ],
        )?;
        if let Some(w) = opts.replica_ack {
            if w.timeout > lease / 2 {
                return Err(Error::Config(ConfigError::invalid(
                    "replica_ack",
                    format!(
                        "a timeout of {:?} is above half the lease ({:?}): the wait must end \
                         well inside the lease it guards",
                        w.timeout,
                        lease / 2
                    ),
                )));
            }
        }
        if opts.replica_ack.is_some() {
            self.backend.check_replica_ack()?;
        }
        let mut acq = MutexTry {
            locks: self,
            keys,
            key,
            lease,
            replica_ack: opts.replica_ack,
            holder_name: opts.holder_name.as_deref(),
        };
        let mut guard = acquire::acquire(&mut acq, key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }

    /// Runs `work` holding lock `key`: acquires as [`Locks::acquire`] does (with `opts`, the
    /// watchdog always on), calls `work` with the guard (read its
    /// [`fencing_token`](crate::Fenced::fencing_token) or [`lost_token`](crate::HeldLease::lost_token) into
    /// the future `work` returns), cancels that future if the lock is lost, and always releases.
    ///
    /// ```no_run
    /// # async fn demo(client: baton::Client) -> Result<(), baton::Error> {
    /// use baton::prelude::*;
    /// use std::time::Duration;
    /// let locks = client.locks();
    /// let opts = baton::LockOptions::default();
    /// let token = locks
    ///     .with_lock("invoices", Duration::from_secs(10), &opts, |guard| {
    ///         let fence = guard.fencing_token();
    ///         async move { fence }
    ///     })
    ///     .await?;
    /// # let _ = token; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Locks::acquire`]; [`Error::LeaseLost`] when the watchdog fired during `work` (which
    /// was dropped at that point) or when the release found the lock held by another token
    /// (mutual exclusion may then have been broken, so `work`'s output is not returned). A
    /// release that fails on the network is only logged: `work` finished in time and the lock
    /// expires by its lease.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases in the background.
    pub async fn with_lock<F, Fut>(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(&LockGuard) -> Fut,
        Fut: Future,
    {
        let opts = opts.clone().with_watchdog();
        let guard = self.acquire(key, lease, &opts).await?;
        acquire::with_lock(guard, work).await
    }
}

/// One try of the mutex, as the acquisition engine drives it.
struct MutexTry<'a> {
    locks: &'a Locks,
    keys: Arc<LockKeys>,
    key: &'a str,
    lease: Duration,
    /// With it, the grant must be acknowledged by that many replicas (see
    /// [`LockOptionsBuilder::replica_ack`]).
    replica_ack: Option<ReplicaWait>,
    /// [`LockOptionsBuilder::holder_name`]: appended to each try's token.
    holder_name: Option<&'a str>,
}

impl TryAcquire for MutexTry<'_> {
    type Guard = LockGuard;
    type Channel = WakeOne;

    /// One script call: the guard, or the holder's PTTL.
    async fn try_once(
        &mut self,
        takeover: bool,
        asked: Instant,
    ) -> Result<Tried<LockGuard>, Error> {
        let (keys, key, lease) = (&self.keys, self.key, self.lease);
        // The token is what release and extension compare; a holder name rides after its
        // random part (`TOKEN:NAME`, as an election's lease value), which keeps it unique.
        let token = match self.holder_name {
            Some(name) => format!("{}:{name}", new_token()),
            None => new_token(),
        };
        let backend = self.locks.backend.clone();
        // Armed before the request leaves: whatever happens to this future from here on (an
        // error, a timeout, being dropped), the lock is released by token unless we disarm.
        let mut pending = Pending::arm(&backend, keys, &token);
        let limit = after(Instant::now(), backend.response_timeout());
        let req = kernel::Acquire {
            lock: keys.lock(),
            fence: keys.fence(),
            token: &token,
            ttl: lease,
        };
        let grant = match self.replica_ack {
            // Grouped with this client's other lock calls to the node when they overlap.
            None => {
                backend
                    .acquire_grouped(keys, &req, limit, &mut pending)
                    .await
            }
            Some(w) => {
                match backend
                    .acquire_replicated(&req, w, limit, &mut pending)
                    .await
                {
                    Ok((Grant::Granted { .. }, acked)) if acked < u64::from(w.replicas) => {
                        // Never handed out: `pending`, still armed, releases it by token.
                        return Err(Error::NotReplicated {
                            what: "the lock".into(),
                            key: key.to_string(),
                            acked,
                            wanted: w.replicas,
                            timeout: w.timeout,
                        });
                    }
                    other => other.map(|(g, _)| g),
                }
            }
        };
        if !kernel::orphaned(&grant) {
            pending.disarm();
        }
        match grant {
            Ok(Grant::Granted { fence, sent }) => {
                let labels = Labels::new(primitive::MUTEX, backend.label());
                labels.transition(transition::GRANT, sent);
                labels.granted(takeover, asked);
                tracing::info!(key, token = short(&token), fence, "lock acquired");
                Ok(Tried::Granted(LockGuard::new(HeldLock::new(
                    backend,
                    keys.clone(),
                    key,
                    token,
                    fence,
                    lease,
                    sent,
                ))))
            }
            Ok(Grant::Held { pttl }) => Ok(Tried::Held { remaining: pttl }),
            // An indeterminate error may have taken the lock: `pending` (still armed) releases
            // it by token on the way out.
            Err(e) => Err(e),
        }
    }

    /// When another task of this client already waits for the lock, this one queues behind it
    /// instead of trying at once: a task that releases and asks again at once would otherwise
    /// win before the waiter its release woke (barging), and some local waiters starved
    /// (fairness, Jain's index over 64 tasks, fell to 0.5).
    fn waiting(&mut self) -> (Option<WakeOne>, bool) {
        (self.locks.backend.waiting(self.keys.channel()), true)
    }

    /// This client's waiters on the lock: one shared subscription, one waiter woken per
    /// release. Best effort: without pub/sub (LISTEN) the engine still polls with backoff and
    /// the PTTL.
    async fn subscribe(&mut self) -> Option<WakeOne> {
        let limit = self.locks.connect_timeout();
        let backend = self.locks.backend.clone();
        match tokio::time::timeout(limit, backend.wake_one(self.keys.channel())).await {
            Ok(Ok(g)) => Some(g),
            _ => None,
        }
    }
}

/// The mutex's release: compare-and-delete by token, then a `released` message wakes waiters
/// (on PostgreSQL one `UPDATE` with `pg_notify`).
impl HeldKeys for LockKeys {
    fn what(&self) -> &'static str {
        "lock"
    }

    fn primitive(&self) -> crate::util::metrics::Primitive {
        crate::util::metrics::primitive::MUTEX
    }

    fn release<'a>(
        &'a self,
        backend: &'a Backend,
        token: &'a str,
        limit: Instant,
    ) -> ReleaseFuture<'a> {
        Box::pin(backend.release(self.lock(), self.channel(), token, limit))
    }

    fn release_in_background(self: Arc<Self>, backend: &Backend, token: String) {
        release_in_background(backend, &self, token);
    }

    fn taken_channel(&self) -> String {
        // The waiters' channel: one subscription per lock and client serves both.
        self.channel().to_string()
    }
}
