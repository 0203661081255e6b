//! A fenced read-write lock: many readers or one writer per lock name, each holding a lease of
//! its own, with writer preference and one upgradeable reader. On Redis (one server, Valkey,
//! Sentinel, Cluster: a lock's keys share one hash tag) or on PostgreSQL (feature `postgres`:
//! a state row of `baton_rwlocks`, each holder's lease a row of `baton_locks`); the API, the
//! guards and the guarantees are the same.
//!
//! - [`keys`]: the key layout (`baton:rw:{K}`, `…:h:TOKEN`, `…:waiting`, `…:released`).
//! - [`RwLocks`]: the handle ([`Client::rw_locks`](crate::Client::rw_locks)): `read`, `write`,
//!   `upgradeable_read`, their `try_` forms, `with_read`, `with_write`, and the operator's
//!   [`RwLocks::force_release`].
//! - [`ReadGuard`], [`WriteGuard`], [`UpgradeableReadGuard`]: the held lock, with the mutex's
//!   guard traits ([`HeldLease`], [`Fenced`],
//!   [`LeaseGuard`]); the upgradeable reader can
//!   [`upgrade`](UpgradeableReadGuard::upgrade) to the writer and
//!   [`downgrade`](UpgradeableReadGuard::downgrade) back without letting go.
//!
//! This module decides what to ask and how to wait (the lease kernel's acquisition engine, with
//! the lock's wake-one channel); the scripts live in the store seam (`backend::rwlocks`), and an
//! extension is the lock store's compare-and-extend of the holder's own lease key.
//!
//! # The rule
//! - A read is granted while no writer holds the lock and no writer waits.
//! - The upgradeable read is a read that is also exclusive among upgradeable reads.
//! - A write is granted when nobody holds the lock (no writer, no upgradeable reader, no reader).
//! - Writer preference: a write that finds the lock held leaves a "writer waiting" mark with a
//!   lease of its own (`min(lease, 5 s)`), refreshed by each of its tries. While the mark lives,
//!   no new read or upgradeable read is granted; readers already holding keep their shares,
//!   and the writer gets in when the last share ends. A writer that gives up (or crashes) stops
//!   refreshing, and its mark lapses by itself. The cost: while a writer waits, a new reader
//!   waits for the current readers to finish and for that writer's whole hold, even though
//!   readers could share.
//! - An upgrading reader goes ahead of waiting writers: a writer cannot enter while an
//!   upgradeable reader holds, and the upgrade takes the mark so no new reader enters either;
//!   the upgrade is granted when the last plain reader leaves.
//!
//! # Guarantees
//! - Every holder has its own lease: a crashed reader's share ends with its lease, by the
//!   server's clock; a holder counts only while its lease key lives.
//! - A write grant (and an upgrade) carries a new fencing token, `max(last + 1, server time in
//!   µs)` as the mutex's, so it keeps growing across a restart that loses data (unless the
//!   server's clock goes back). A read grant carries the token of the last write (`0` when no
//!   write is known), so a reader can check it reads at least that version. A downgrade keeps
//!   the write's token as the read token.
//! - Release and extension compare the holder's token: `false` means it was no longer ours.
//! - Waiting: a release wakes one waiter per client (as the mutex), and a granted read wakes
//!   the next one of that client at once (readers share, and no release would announce it);
//!   other waiters retry on their backoff, never past the remaining lease of what blocks them.
//!   A waiting writer asks with one token through all its tries, so each try refreshes its
//!   mark and its grant takes the mark away.

pub mod keys;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::error::Error;
use crate::lease::acquire::{self, Tried, TryAcquire};
use crate::lease::guard::{sealed, Fenced, HeldLease, LeaseCore, LeaseGuard};
use crate::lease::held::{FencedAt, HeldKeys, HeldLock, LockGuard, ReleaseFuture};
use crate::lease::lock::{FencedValue, FencedWrite};
use crate::lease::options::{Field, LockOptions};
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::drop_guard::Armed;
use crate::util::inspect::{EntryRead, EntryRecord, HolderLease, RwRead, RwRecord};
use crate::util::metrics::{primitive, transition, Labels};
use crate::util::rw_replies::{RwAcquire, RwGrant, RwMode};
use crate::util::time::after;
use crate::util::token::{new_token, short};
use crate::util::wake::WakeOne;

use keys::RwKeys;

/// The longest a waiting writer's mark lives past its last try.
const MAX_MARK: Duration = Duration::from_secs(5);

/// How long a waiting writer's mark lives past its try, for a lock leased for `lease`.
fn mark_for(lease: Duration) -> Duration {
    lease.min(MAX_MARK)
}

/// The read-write lock on one client's connections. Get it from
/// [`Client::rw_locks`](crate::Client::rw_locks); cheap to clone.
#[derive(Clone)]
pub struct RwLocks {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for RwLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLocks")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RwLocks {
    /// The read-write lock on `backend` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        RwLocks {
            backend,
            prefix: Arc::from(crate::util::names::DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}rw:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`](crate::ConfigError) naming `prefix` unless it ends with `:`, is
    /// 1..=1024 bytes, not blank and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<RwLocks, crate::ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(RwLocks {
            backend: self.backend.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// Creates what the read-write lock stores in its backend, if missing: on PostgreSQL the
    /// tables `baton_rwlocks` (one state row per lock) and `baton_locks` (each holder's lease
    /// is a row of it); on Redis nothing. Tries create missing tables themselves on first use
    /// where their role may. Idempotent; part of [`Client::migrate`](crate::Client::migrate).
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.backend.migrate_rwlocks().await
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Takes read-write lock `key` from a hung holder, as an operator does, but only the
    /// grant `expected` names: [`Expected::Token`] names the writer by its write token (a
    /// reader's share carries the last write's token, shared by every reader, so it never
    /// names one); [`Expected::Holder`] names any holder (writer, upgradeable reader or
    /// reader) by its token's first characters as shown; [`Expected::Any`] takes one holder:
    /// the writer, else the upgradeable reader, else a reader. The holders are read, and the
    /// release is by the named holder's token, so a holder that came after the operator
    /// looked is left alone ([`ForceRelease::HeldByAnother`], naming a holder there is).
    ///
    /// The holder's share ends as by its own release (its lease and its place in the state
    /// go, waiters are woken). The holder hears it at once on the lock's channel when it
    /// listens there (its watchdog does: the message names the holder, since readers share
    /// their fencing token), at its next extension otherwise, and reports the loss. The fence stays, so the next write's token is higher than the one taken. The same
    /// method as [`Locks::force_release`](crate::Locks::force_release) and
    /// [`Semaphores::force_release`](crate::Semaphores::force_release).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or [`Expected::Attempt`]; connection errors;
    /// [`Error::CorruptState`] for a state key of another type; [`Error::Timeout`] when the
    /// holders kept changing through every try.
    pub async fn force_release(
        &self,
        key: &str,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        crate::util::names::check_name("key", key)?;
        if let Expected::Attempt(_) = expected {
            return Err(crate::ConfigError::invalid(
                "expected",
                "a fencing token, a holder or any (a lock has no attempts)",
            )
            .into());
        }
        let keys = RwKeys::new(&self.prefix, key);
        let refs = keys.refs();
        let read = RwRead {
            state: refs.state.to_string(),
            waiting: refs.waiting.to_string(),
            holder_prefix: refs.holder_prefix.to_string(),
        };
        for _ in 0..20 {
            let records = self
                .backend
                .read_entries(None, &[EntryRead::RwLock(read.clone())])
                .await?;
            let Some(EntryRecord::RwLock(record)) = records.into_iter().next() else {
                return Err(Error::UnexpectedReply {
                    context: "reading the read-write lock",
                    reply: "no record".into(),
                });
            };
            if let Some(refused) = record.refused {
                return Err(Error::CorruptState {
                    key: read.state.clone(),
                    value: refused,
                });
            }
            let Some((token, taken, writer)) = pick(&record, expected) else {
                return Ok(ForceRelease::Free);
            };
            if !pick_matches(expected, &taken, writer) {
                return Ok(ForceRelease::HeldByAnother(taken));
            }
            let limit = Instant::now() + self.backend.response_timeout();
            if self.backend.rw_release(&refs, &token, limit).await? {
                // Named by its holder: a taken message with a reader's fencing token (the last
                // write's, every reader's) would end every reader's share.
                self.backend
                    .tell_taken_holder(&keys.holder(&token), keys.channel(), &taken.holder)
                    .await;
                return Ok(ForceRelease::Released(taken));
            }
            // Its lease ended or changed hands meanwhile: read again.
        }
        Err(Error::Timeout {
            during: "taking a read-write lock whose holders kept changing",
        })
    }

    fn keys(&self, key: &str, lease: Duration) -> Result<Arc<RwKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        crate::lease::check_ttl("lease", lease)?;
        Ok(Arc::new(RwKeys::new(&self.prefix, key)))
    }

    /// One try in `mode`, in one round trip: the held lease, or `None` when the lock is busy.
    async fn try_mode(
        &self,
        key: &str,
        lease: Duration,
        mode: RwMode,
    ) -> Result<Option<LockGuard>, Error> {
        let mut one = RwTry {
            locks: self,
            keys: self.keys(key, lease)?,
            key,
            lease,
            mode,
            waits: false,
            retry_token: None,
            behind_readers: false,
        };
        match one.try_once(false, Instant::now()).await? {
            Tried::Granted(guard) => Ok(Some(guard)),
            Tried::Held { .. } => Ok(None),
        }
    }

    /// Takes the lock in `mode`, waiting as `opts` says.
    async fn acquire_mode(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
        mode: RwMode,
    ) -> Result<LockGuard, Error> {
        let keys = self.keys(key, lease)?;
        opts.refuse_others(
            "the read-write lock",
            &[
                Field::MaxTries,
                Field::MaxBackoff,
                Field::Watchdog,
                Field::MaxHold,
            ],
        )?;
        let mut acq = RwTry {
            locks: self,
            keys,
            key,
            lease,
            mode,
            waits: true,
            retry_token: None,
            behind_readers: false,
        };
        let mut guard = acquire::acquire(&mut acq, key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }

    /// Tries once to take a shared read of lock `key` for `lease`, in one round trip.
    /// `Ok(None)` while a writer holds it or waits for it.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a lease outside 10 ms ..= 1 day;
    /// [`Error::CorruptState`] when the lock's state holds a fence baton never writes;
    /// connection errors and timeouts (a grant that may
    /// have applied is then released by token in the background).
    ///
    /// # Cancel safety
    /// A dropped future never leaves its share behind (it is released by token through a task
    /// of the client; the lease is the backstop).
    pub async fn try_read(&self, key: &str, lease: Duration) -> Result<Option<ReadGuard>, Error> {
        Ok(self
            .try_mode(key, lease, RwMode::Read)
            .await?
            .map(|inner| ReadGuard { inner }))
    }

    /// Takes a shared read of lock `key` for `lease`, waiting while a writer holds it or waits
    /// for it (see the module's rule), as [`Locks::acquire`](crate::Locks::acquire) waits:
    /// `opts` may set `wait`, `max_tries`, `max_backoff`, `watchdog` and `max_hold`.
    ///
    /// # Errors
    /// As [`RwLocks::try_read`]; [`Error::NotAcquired`] when a bound ran out;
    /// [`Error::Unsupported`] for an option the read-write lock does not use.
    ///
    /// # Cancel safety
    /// As [`RwLocks::try_read`].
    pub async fn read(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<ReadGuard, Error> {
        let inner = self.acquire_mode(key, lease, opts, RwMode::Read).await?;
        Ok(ReadGuard { inner })
    }

    /// Tries once to take the write of lock `key` for `lease`. `Ok(None)` while anyone holds
    /// it. A single try does not wait, so it leaves no "writer waiting" mark: readers keep
    /// entering (use [`RwLocks::write`] to queue ahead of new readers).
    ///
    /// # Errors
    /// As [`RwLocks::try_read`].
    ///
    /// # Cancel safety
    /// As [`RwLocks::try_read`].
    pub async fn try_write(&self, key: &str, lease: Duration) -> Result<Option<WriteGuard>, Error> {
        Ok(self
            .try_mode(key, lease, RwMode::Write)
            .await?
            .map(|inner| WriteGuard { inner }))
    }

    /// Takes the write of lock `key` for `lease`, waiting while anyone holds it; its mark,
    /// refreshed by each try, keeps new readers out meanwhile (see the module's rule).
    ///
    /// # Errors
    /// As [`RwLocks::read`].
    ///
    /// # Cancel safety
    /// As [`RwLocks::try_read`].
    pub async fn write(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<WriteGuard, Error> {
        let inner = self.acquire_mode(key, lease, opts, RwMode::Write).await?;
        Ok(WriteGuard { inner })
    }

    /// Tries once to take the upgradeable read of lock `key` for `lease`: a read (shared with
    /// plain readers) of which at most one is held at a time. `Ok(None)` while a writer holds
    /// or waits, or another upgradeable reader holds.
    ///
    /// # Errors
    /// As [`RwLocks::try_read`].
    ///
    /// # Cancel safety
    /// As [`RwLocks::try_read`].
    pub async fn try_upgradeable_read(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<Option<UpgradeableReadGuard>, Error> {
        let guard = self.try_mode(key, lease, RwMode::Upgradeable).await?;
        Ok(guard.map(|inner| self.upgradeable(key, lease, inner)))
    }

    /// Takes the upgradeable read of lock `key` for `lease`, waiting as [`RwLocks::read`] does
    /// and while another upgradeable reader holds.
    ///
    /// # Errors
    /// As [`RwLocks::read`].
    ///
    /// # Cancel safety
    /// As [`RwLocks::try_read`].
    pub async fn upgradeable_read(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<UpgradeableReadGuard, Error> {
        let inner = self
            .acquire_mode(key, lease, opts, RwMode::Upgradeable)
            .await?;
        Ok(self.upgradeable(key, lease, inner))
    }

    fn upgradeable(&self, key: &str, lease: Duration, inner: LockGuard) -> UpgradeableReadGuard {
        UpgradeableReadGuard {
            inner,
            backend: self.backend.clone(),
            keys: Arc::new(RwKeys::new(&self.prefix, key)),
            lease,
            writing: false,
        }
    }

    /// Runs `work` holding a read of lock `key`: acquires as [`RwLocks::read`] (the watchdog
    /// always on), cancels `work` if the share is lost, and always releases.
    ///
    /// # Errors
    /// As [`RwLocks::read`]; [`Error::LeaseLost`] when the share was lost during `work` (which
    /// was dropped then) or the release found it gone.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases in the background.
    pub async fn with_read<F, Fut>(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(&ReadGuard) -> Fut,
        Fut: Future,
    {
        let opts = opts.clone().with_watchdog();
        let guard = self.read(key, lease, &opts).await?;
        acquire::with_lock(guard, work).await
    }

    /// Runs `work` holding the write of lock `key`, as [`RwLocks::with_read`] does for a read.
    ///
    /// # Errors
    /// As [`RwLocks::with_read`].
    ///
    /// # Cancel safety
    /// As [`RwLocks::with_read`].
    pub async fn with_write<F, Fut>(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(&WriteGuard) -> Fut,
        Fut: Future,
    {
        let opts = opts.clone().with_watchdog();
        let guard = self.write(key, lease, &opts).await?;
        acquire::with_lock(guard, work).await
    }
}

/// The local wake line of a lock's writers and upgrades (see `RwTry::waiting`).
const WRITERS: &str = "writers";

/// One try of the read-write lock, as the acquisition engine drives it.
struct RwTry<'a> {
    locks: &'a RwLocks,
    keys: Arc<RwKeys>,
    key: &'a str,
    lease: Duration,
    mode: RwMode,
    /// Whether the caller waits: only a waiting writer leaves the "writer waiting" mark.
    waits: bool,
    /// The token of the last try when it was refused for certain (nothing was granted to it,
    /// so nothing holds or releases it). A waiting writer's next try reuses it: its mark is
    /// set to that token and only a try with the same token refreshes it (or clears it when
    /// granted), so a fresh token per try would let the mark lapse while the writer still
    /// waits, readers enter in the gap, and a stale mark outlive the write (the model checker's
    /// read-write lock search finds that livelock).
    retry_token: Option<String>,
    /// A writer queued behind this client's waiting readers for its first try: it leaves their
    /// line after that try, for the writers' own.
    behind_readers: bool,
}

/// Releases `token`'s hold on `keys` through a task of the client unless disarmed: armed while
/// a grant's outcome is unknown (a lost reply, a dropped future).
fn pending(
    backend: &Backend,
    keys: &Arc<RwKeys>,
    token: &str,
) -> Armed<impl FnOnce() + Send + Sync + 'static> {
    let (backend, keys, token) = (backend.clone(), keys.clone(), token.to_string());
    Armed::new(move || backend.rw_release_in_background(&keys.refs(), token))
}

impl TryAcquire for RwTry<'_> {
    type Guard = LockGuard;
    type Channel = WakeOne;

    async fn try_once(
        &mut self,
        takeover: bool,
        asked: Instant,
    ) -> Result<Tried<LockGuard>, Error> {
        let token = self.retry_token.take().unwrap_or_else(new_token);
        let backend = self.locks.backend.clone();
        let mut armed = pending(&backend, &self.keys, &token);
        let limit = after(Instant::now(), backend.response_timeout());
        let req = RwAcquire {
            keys: self.keys.refs(),
            token: &token,
            mode: self.mode,
            lease: self.lease,
            mark: if self.waits {
                mark_for(self.lease)
            } else {
                Duration::ZERO
            },
        };
        let grant = backend.rw_try(&req, limit).await;
        if !matches!(&grant, Err(e) if e.is_indeterminate()) {
            armed.disarm();
        }
        match grant? {
            RwGrant::Granted { fence, sent } => {
                let labels = Labels::new(primitive::RWLOCK, backend.label());
                labels.transition(transition::GRANT, sent);
                labels.granted(takeover, asked);
                tracing::info!(
                    key = self.key,
                    token = short(&token),
                    fence,
                    mode = self.mode.wire(),
                    "read-write lock acquired"
                );
                let holder = Arc::new(Holder {
                    lease_key: self.keys.holder(&token),
                    keys: self.keys.clone(),
                });
                Ok(Tried::Granted(LockGuard::new(HeldLock::new(
                    backend, holder, self.key, token, fence, self.lease, sent,
                ))))
            }
            RwGrant::Busy { retry } => {
                if self.waits && self.mode == RwMode::Write {
                    self.retry_token = Some(token);
                }
                // A waiting writer refreshes its mark before it lapses.
                let retry = match self.mode {
                    RwMode::Write => Some(retry.unwrap_or(MAX_MARK).min(mark_for(self.lease) / 3)),
                    _ => retry,
                };
                Ok(Tried::Held { remaining: retry })
            }
        }
    }

    /// Writers wait in a line of their own: behind an older local reader that the writer's
    /// own mark keeps out (it holds the readers' first place, and only the first place wakes on
    /// its timer), a writer would never try, never refresh its mark, and readers would enter
    /// once it lapsed. Each release wakes one reader and one writer per client. A writer that
    /// finds no local writer waiting but local readers waiting (they waited through the last
    /// write, perhaps its own) makes its first try behind them, so they get in before its mark
    /// goes up: readers and writers take turns instead of a looping writer going first.
    fn waiting(&mut self) -> (Option<WakeOne>, bool) {
        let channel = self.keys.channel();
        let joined = match self.mode {
            RwMode::Write => match self.locks.backend.waiting_in(channel, WRITERS) {
                Some(w) => Some(w),
                None => {
                    let readers = self.locks.backend.waiting(channel);
                    self.behind_readers = readers.is_some();
                    readers
                }
            },
            RwMode::Read | RwMode::Upgradeable => self.locks.backend.waiting(channel),
        };
        (joined, true)
    }

    /// A writer that made its first try behind the readers waits in the writers' line.
    fn leave_first_line(&mut self) -> bool {
        std::mem::take(&mut self.behind_readers)
    }

    /// A read (plain or upgradeable) is shared: the next local waiter may be a reader too.
    fn shared(&self) -> bool {
        matches!(self.mode, RwMode::Read | RwMode::Upgradeable)
    }

    async fn subscribe(&mut self) -> Option<WakeOne> {
        let limit = self.locks.backend.connect_timeout();
        let backend = self.locks.backend.clone();
        let channel = self.keys.channel();
        let joined = async {
            match self.mode {
                RwMode::Write => backend.wake_one_in(channel, WRITERS).await,
                RwMode::Read | RwMode::Upgradeable => backend.wake_one(channel).await,
            }
        };
        match tokio::time::timeout(limit, joined).await {
            Ok(Ok(g)) => Some(g),
            _ => None,
        }
    }
}

/// One holder's keys, as the lease kernel's guard needs them: its own lease key (extended by
/// the lock store's compare-and-extend), the lock's state beside it (refreshed with it), and the
/// release that ends the hold whatever its mode.
struct Holder {
    keys: Arc<RwKeys>,
    lease_key: String,
}

impl FencedAt for Holder {
    fn lock_key(&self) -> &str {
        &self.lease_key
    }
    fn fence_key(&self) -> &str {
        self.keys.state()
    }
}

impl HeldKeys for Holder {
    fn what(&self) -> &'static str {
        "read-write lock"
    }

    fn primitive(&self) -> crate::util::metrics::Primitive {
        primitive::RWLOCK
    }

    fn release<'a>(
        &'a self,
        backend: &'a Backend,
        token: &'a str,
        limit: Instant,
    ) -> ReleaseFuture<'a> {
        Box::pin(async move { backend.rw_release(&self.keys.refs(), token, limit).await })
    }

    fn release_in_background(self: Arc<Self>, backend: &Backend, token: String) {
        backend.rw_release_in_background(&self.keys.refs(), token);
    }

    fn taken_channel(&self) -> String {
        self.keys.channel().to_string()
    }

    /// Readers share their fencing token (the last write's): a force release names the one
    /// it took by its holder.
    fn taken_by_holder(&self) -> bool {
        true
    }
}

/// The holder of `record` that `expected` names, else the one to show instead (the writer,
/// else the upgradeable reader, else the first reader): its full token, what is shown of it,
/// and whether it is the writer. `None` when nothing holds the lock.
fn pick(record: &RwRecord, expected: &Expected) -> Option<(String, Taken, bool)> {
    // A reader's fencing token is the last write's (0: none yet, not shown).
    let fence = record
        .fence
        .as_deref()
        .and_then(|f| f.parse::<u64>().ok())
        .filter(|f| *f > 0);
    let holders: Vec<(&HolderLease, bool)> = record
        .writer
        .iter()
        .map(|h| (h, true))
        .chain(record.upgrader.iter().map(|h| (h, false)))
        .chain(record.readers.iter().map(|h| (h, false)))
        .collect();
    let named = match expected {
        Expected::Holder(h) => holders
            .iter()
            .find(|(lease, _)| short(&lease.token) == h.as_str()),
        _ => None,
    };
    let (lease, writer) = named.or(holders.first())?;
    let taken = Taken {
        fencing_token: fence,
        holder: short(&lease.token).to_string(),
    };
    Some((lease.token.clone(), taken, *writer))
}

/// Whether the holder [`pick`] found is the grant `expected` names.
fn pick_matches(expected: &Expected, taken: &Taken, writer: bool) -> bool {
    match expected {
        Expected::Token(t) => writer && taken.fencing_token == Some(*t),
        Expected::Holder(h) => taken.holder == *h,
        Expected::Any => true,
        Expected::Attempt(_) => false,
    }
}

/// The guard traits and the common methods of the three guards, which wrap the lease kernel's
/// held lock.
macro_rules! rw_guard {
    ($guard:ident) => {
        impl std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("key", &self.key())
                    .field("token", &short(self.inner.token()))
                    .field("fencing_token", &self.fencing_token())
                    .finish_non_exhaustive()
            }
        }

        impl $guard {
            /// This holder's random 128-bit token (hex), as stored in its lease key.
            pub fn token(&self) -> &str {
                self.inner.token()
            }

            /// Extends this holder's lease to `lease` from now if it is still its own (one
            /// script). `Ok(false)`: it was not; nothing was written, and the loss signal
            /// fires.
            ///
            /// # Errors
            /// [`Error::Config`] for a lease outside 10 ms ..= 1 day; [`Error::Timeout`] (the
            /// deadline does not move) and connection errors.
            ///
            /// # Cancel safety
            /// Cancel safe: a dropped extension leaves the deadline where it was.
            pub async fn extend(&mut self, lease: Duration) -> Result<bool, Error> {
                self.inner.extend(lease).await
            }

            /// Ends this hold (in one script) and wakes a waiter. `Ok(false)`: its lease had
            /// already ended.
            ///
            /// # Errors
            /// [`Error::Timeout`] and connection errors: the release may or may not have
            /// applied; the lease is the backstop.
            pub async fn release(self) -> Result<bool, Error> {
                self.inner.release().await
            }

            /// Starts the watchdog (once), as [`LockGuard::start_watchdog`] does.
            pub fn start_watchdog(&mut self, max_hold: Option<Duration>) {
                self.inner.start_watchdog(max_hold)
            }
        }

        impl sealed::Sealed for $guard {
            fn core(&self) -> &LeaseCore {
                sealed::Sealed::core(&self.inner)
            }
        }

        /// The loss signal fires as the mutex guard's does.
        impl HeldLease for $guard {}

        impl Fenced for $guard {}

        impl LeaseGuard for $guard {
            fn extend(
                &mut self,
                lease: Duration,
            ) -> impl Future<Output = Result<bool, Error>> + Send {
                $guard::extend(self, lease)
            }
            fn release(self) -> impl Future<Output = Result<bool, Error>> + Send {
                $guard::release(self)
            }
            fn start_watchdog(&mut self, max_hold: Option<Duration>) {
                $guard::start_watchdog(self, max_hold)
            }
        }
    };
}

/// A shared read of a read-write lock. Its [`fencing_token`](Fenced::fencing_token) is the
/// last write's token (`0` when no write is known): what the reader reads is at least that
/// version. Dropping it releases in the background.
pub struct ReadGuard {
    inner: LockGuard,
}

rw_guard!(ReadGuard);

impl ReadGuard {
    /// Reads the Redis hash `resource` a fenced write keeps, as [`LockGuard::read_fenced`],
    /// after recording this read's token (the last write's) there: the value's token below it
    /// means that write never reached the resource, and from then on a write at or below it is
    /// refused, so a writer whose lease ended before it wrote cannot write beside readers that
    /// were granted after it.
    ///
    /// # Errors
    /// As [`Locks::read_fenced`](crate::Locks::read_fenced).
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        self.inner.read_fenced_marking(resource).await
    }
}

/// The write of a read-write lock, exclusive; its fencing token is new and higher than every
/// earlier write's. Dropping it releases in the background.
pub struct WriteGuard {
    inner: LockGuard,
}

rw_guard!(WriteGuard);

impl WriteGuard {
    /// Writes `value` to the Redis hash `resource` with this write's fencing token, as
    /// [`LockGuard::write_fenced`].
    ///
    /// # Errors
    /// As [`Locks::write_fenced`](crate::Locks::write_fenced).
    pub async fn write_fenced(
        &self,
        resource: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        self.inner.write_fenced(resource, value).await
    }

    /// Reads the Redis hash `resource` a fenced write keeps, as [`LockGuard::read_fenced`]
    /// (the writer's own read records nothing).
    ///
    /// # Errors
    /// As [`Locks::read_fenced`](crate::Locks::read_fenced).
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        self.inner.read_fenced(resource).await
    }
}

/// The upgradeable read of a read-write lock: shared with plain readers, at most one at a time.
/// [`upgrade`](UpgradeableReadGuard::upgrade) turns it into the writer without letting go (a
/// new fencing token); [`downgrade`](UpgradeableReadGuard::downgrade) turns it back (the write's
/// token stays its token). Dropping it releases in the background, in either state.
pub struct UpgradeableReadGuard {
    inner: LockGuard,
    backend: Backend,
    keys: Arc<RwKeys>,
    lease: Duration,
    writing: bool,
}

rw_guard!(UpgradeableReadGuard);

impl UpgradeableReadGuard {
    /// Reads the Redis hash `resource` a fenced write keeps: while reading, as
    /// [`ReadGuard::read_fenced`] (the read's token is recorded there first); after an
    /// upgrade, as [`WriteGuard::read_fenced`].
    ///
    /// # Errors
    /// As [`Locks::read_fenced`](crate::Locks::read_fenced).
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        if self.writing {
            self.inner.read_fenced(resource).await
        } else {
            self.inner.read_fenced_marking(resource).await
        }
    }

    /// Whether it holds the write now (after an upgrade, before a downgrade).
    pub fn is_writing(&self) -> bool {
        self.writing
    }

    /// Tries once to upgrade to the writer: granted when no plain reader holds. While readers
    /// remain it takes the "writer waiting" mark (ahead of waiting writers), so no new reader
    /// enters until it upgrades or its mark lapses. `Ok(true)` once it holds the write (also
    /// when it already did).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when its lease ended; [`Error::CorruptState`] for a fence baton
    /// never writes; [`Error::Timeout`] and connection errors (the upgrade may have applied:
    /// [`UpgradeableReadGuard::upgrade`] again finds out).
    pub async fn try_upgrade(&mut self) -> Result<bool, Error> {
        if self.writing {
            return Ok(true);
        }
        let mut one = UpgradeTry { guard: self };
        match one.try_once(false, Instant::now()).await? {
            Tried::Granted(fence) => {
                self.upgraded(fence);
                Ok(true)
            }
            Tried::Held { .. } => Ok(false),
        }
    }

    /// Upgrades to the writer, waiting (as `opts` says: `wait`, `max_tries`, `max_backoff`)
    /// for the plain readers to leave; no new reader enters meanwhile.
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::try_upgrade`]; [`Error::NotAcquired`] when a bound ran out
    /// (it still holds the upgradeable read).
    pub async fn upgrade(&mut self, opts: &LockOptions) -> Result<(), Error> {
        if self.writing {
            return Ok(());
        }
        opts.refuse_others(
            "the read-write lock's upgrade",
            &[Field::MaxTries, Field::MaxBackoff],
        )?;
        let key = self.key().to_string();
        let mut acq = UpgradeTry { guard: self };
        let fence = acquire::acquire(&mut acq, &key, opts).await?;
        self.upgraded(fence);
        Ok(())
    }

    fn upgraded(&mut self, fence: u64) {
        self.writing = true;
        self.inner.refence(fence);
        tracing::info!(key = %self.key(), fence, "read-write lock upgraded");
    }

    /// Turns the write back into the upgradeable read: readers may enter again, and the write's
    /// fencing token stays this guard's token. `Ok(false)`: it no longer held the write (its
    /// lease ended); nothing was written.
    ///
    /// # Errors
    /// [`Error::Timeout`] and connection errors (the downgrade may have applied).
    pub async fn downgrade(&mut self) -> Result<bool, Error> {
        if !self.writing {
            return Ok(true);
        }
        let limit = after(Instant::now(), self.backend.response_timeout());
        let done = self
            .backend
            .rw_downgrade(&self.keys.refs(), self.inner.token(), limit)
            .await?;
        if done {
            self.writing = false;
        }
        Ok(done)
    }

    /// Writes `value` to the Redis hash `resource` with this guard's fencing token, as
    /// [`LockGuard::write_fenced`] (meant for the upgraded state).
    ///
    /// # Errors
    /// As [`Locks::write_fenced`](crate::Locks::write_fenced).
    pub async fn write_fenced(
        &self,
        resource: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        self.inner.write_fenced(resource, value).await
    }
}

/// One try of an upgrade, as the acquisition engine drives it; the grant is the new fence.
struct UpgradeTry<'a> {
    guard: &'a UpgradeableReadGuard,
}

impl TryAcquire for UpgradeTry<'_> {
    type Guard = u64;
    type Channel = WakeOne;

    async fn try_once(&mut self, _takeover: bool, _asked: Instant) -> Result<Tried<u64>, Error> {
        let g = self.guard;
        let limit = after(Instant::now(), g.backend.response_timeout());
        let mark = mark_for(g.lease);
        let grant = g
            .backend
            .rw_upgrade(
                &g.keys.refs(),
                g.inner.token(),
                g.fencing_token(),
                g.lease,
                mark,
                limit,
            )
            .await?;
        match grant {
            RwGrant::Granted { fence, .. } => Ok(Tried::Granted(fence)),
            RwGrant::Busy { retry } => Ok(Tried::Held {
                remaining: Some(retry.unwrap_or(mark).min(mark / 3)),
            }),
        }
    }

    /// An upgrade waits in the writers' line (it holds the mark, as a waiting writer does).
    fn waiting(&mut self) -> (Option<WakeOne>, bool) {
        let channel = self.guard.keys.channel();
        (self.guard.backend.waiting_in(channel, WRITERS), false)
    }

    async fn subscribe(&mut self) -> Option<WakeOne> {
        let backend = self.guard.backend.clone();
        let limit = backend.connect_timeout();
        let channel = self.guard.keys.channel();
        match tokio::time::timeout(limit, backend.wake_one_in(channel, WRITERS)).await {
            Ok(Ok(g)) => Some(g),
            _ => None,
        }
    }

    fn retries(&self, e: &Error) -> bool {
        !matches!(e, Error::LeaseLost { .. }) && e.is_retryable()
    }
}
