//! A semaphore with leased, fenced permits: at most `limit` holders of one semaphore name at a
//! time, each holding one numbered slot (0 to `limit − 1`) with a lease of its own and a fencing
//! token that only grows per slot. On Redis (single server, Valkey, Sentinel, Cluster) and
//! PostgreSQL (table `baton_semaphores`, each held slot a row of `baton_locks`).
//!
//! - [`keys`]: the key layout (`baton:sem:{K}`, `…:<slot>`, `…:released`).
//! - [`Semaphores`]: the handle ([`Client::semaphores`](crate::Client::semaphores)):
//!   [`Semaphores::try_acquire`], [`Semaphores::acquire`], [`Semaphores::with_permit`],
//!   [`Semaphores::set_limit`], and the operator's [`Semaphores::force_release`].
//! - [`PermitGuard`]: the held permit: its slot, token, fencing token, lease deadline,
//!   `release`, `extend`, the watchdog and its loss signal (the same traits as the mutex's
//!   guard).
//!
//! A held slot is a lock: its extension, release and watchdog are the lease kernel's, through
//! the lock store seam, exactly as the mutex's. Only the try differs (one script over the
//! semaphore's record and slots, `backend::semaphores`), and waiting is the kernel's
//! acquisition engine with the semaphore's wake-one channel.
//!
//! # Guarantees
//! - A grant is one atomic step (a script on Redis, a transaction under the semaphore's row
//!   lock on PostgreSQL): it reads every slot, refuses when as many are held as the
//!   limit (counting slots above a lowered limit), else takes the **lowest** free slot below
//!   the limit with a lease and steps that slot's fence to `max(old + 1, server time in µs)`.
//!   Fencing tokens therefore strictly increase per (semaphore, slot), also after the record
//!   was lost, unless the server's clock goes back.
//! - A permit's lease ends by the server's clock: a crashed holder's slot frees itself.
//! - The limit is stored in the semaphore's record with its fences; the record expires
//!   max(24 h, 2 × lease) after the last try, grant or extension (on PostgreSQL: try or grant,
//!   and the row stays while a slot is held), never kept forever. A call
//!   with another limit meanwhile is refused ([`ErrorKind::Config`](crate::ErrorKind::Config),
//!   naming both values); [`Semaphores::set_limit`] changes it. Lowering it keeps the permits
//!   held and grants nothing until fewer are held than the new limit.
//! - A release wakes one waiter per client (the semaphore's `released` channel). By default
//!   waiting is not FIFO across clients (a free permit goes to whichever try comes first);
//!   within one client waiters go in the order they asked.
//! - **Fair waiting** ([`LockOptionsBuilder::fair`](crate::LockOptionsBuilder::fair)): a
//!   waiter takes a place in the semaphore's line at its first try (Redis: the sorted sets
//!   `…:queue` and `…:alive`; PostgreSQL: `baton_semaphore_waiters`), refreshed by every try
//!   (at least every third of [`LockOptions::waiter_timeout`]). A try is granted only if
//!   fewer permits are held than the limit minus the live waiters ahead of it, so permits go
//!   in the order the server first saw the waiters, across every client, and a try outside the
//!   line (a `try_acquire`, an unfair `acquire`) waits behind the whole line. A waiter that
//!   gives up or is dropped leaves the line at once (through a task of the client); a dead
//!   one's place ends after its `waiter_timeout`, so it delays the line by at most that. A
//!   release wakes one waiter per client; the line's head, if not woken (its client woke
//!   another), tries again within a third of its `waiter_timeout`.

pub mod keys;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::lease::acquire::{self, Tried, TryAcquire};
use crate::lease::guard::{sealed, Fenced, HeldLease, LeaseCore, LeaseGuard};
use crate::lease::held::{HeldLock, LockGuard};
use crate::lease::lock::fence_ttl;
use crate::lease::lock::{FencedValue, FencedWrite};
use crate::lease::options::{Field, LockOptions};
use crate::lease::store::take_expected;
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::drop_guard::Armed;
use crate::util::metrics::{primitive, transition, Labels};
use crate::util::permits::{PermitGrant, PermitRequest};
use crate::util::time::after;
use crate::util::token::{new_token, short};
use crate::util::wake::WakeOne;

use keys::{PermitKeys, SemKeys};

/// The largest limit a semaphore accepts: every try reads each slot.
pub const MAX_PERMITS: u32 = crate::util::permits::MAX_SLOTS;

/// The semaphore on one client's connections. Get it from
/// [`Client::semaphores`](crate::Client::semaphores); cheap to clone.
#[derive(Clone)]
pub struct Semaphores {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Semaphores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphores")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn check_limit(limit: u32) -> Result<(), ConfigError> {
    if !(1..=MAX_PERMITS).contains(&limit) {
        return Err(ConfigError::invalid(
            "limit",
            format!("{limit} is outside 1 ..= {MAX_PERMITS}"),
        ));
    }
    Ok(())
}

impl Semaphores {
    /// The semaphore on `backend` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Semaphores {
            backend,
            prefix: Arc::from(crate::util::names::DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}sem:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Semaphores, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Semaphores {
            backend: self.backend.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn keys(&self, key: &str, limit: u32, lease: Duration) -> Result<Arc<SemKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        check_limit(limit)?;
        crate::lease::check_ttl("lease", lease)?;
        Ok(Arc::new(SemKeys::new(&self.prefix, key)))
    }

    /// Creates the semaphore's tables if missing: on PostgreSQL `baton_semaphores` and the lock
    /// table `baton_locks` its held slots live in; on Redis nothing. Part of
    /// [`Client::migrate`](crate::Client::migrate).
    ///
    /// # Errors
    /// Connection errors; [`ErrorKind::Permission`](crate::ErrorKind::Permission) for a role
    /// that may not create them; [`ErrorKind::Busy`](crate::ErrorKind::Busy) when other
    /// transactions kept a table locked through every try.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.backend.migrate_semaphores().await
    }

    /// Sets semaphore `key`'s limit to `limit`, whatever was stored: the explicit way to change
    /// it. Permits held above the new limit stay held; nothing is granted until fewer than
    /// `limit` are held. Returns the limit it replaced, if one was stored. The record is kept
    /// at least 24 h.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a limit outside 1 ..= [`MAX_PERMITS`];
    /// [`Error::Timeout`] (it may have applied); connection errors; [`Error::Unsupported`] on
    /// PostgreSQL.
    pub async fn set_limit(&self, key: &str, limit: u32) -> Result<Option<u32>, Error> {
        let keys = self.keys(key, limit, crate::lease::MIN_LEASE)?;
        self.backend
            .set_semaphore_limit(
                &keys.meta,
                &keys.slots,
                limit,
                fence_ttl(crate::lease::MIN_LEASE),
            )
            .await
    }

    /// Takes slot `slot` of semaphore `key` from its holder, as an operator does with a hung
    /// one, but only the grant `expected` names (the slot's fencing token as shown, or its
    /// holder; [`Expected::Any`] for whatever holds the slot): the slot's holder and its fence
    /// are read together and the release is by that holder, so a grant made after the
    /// operator looked is left alone ([`ForceRelease::HeldByAnother`]). The slot is named
    /// because each slot steps its own fence: two slots can show the same token.
    ///
    /// The permit returns to the pool and one waiter per client is woken, as by a release; the
    /// holder hears it at once on the semaphore's channel when it listens there (its watchdog
    /// does), at its next extension otherwise, and reports the loss. The slot's fence stays,
    /// so the slot's next fencing token is higher than the one taken. The same method as
    /// [`Locks::force_release`](crate::Locks::force_release) and
    /// [`RwLocks::force_release`](crate::RwLocks::force_release).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name, a slot at or above [`MAX_PERMITS`] or
    /// [`Expected::Attempt`]; connection errors; [`Error::Timeout`] when, with
    /// [`Expected::Any`], the holder kept changing through every try.
    pub async fn force_release(
        &self,
        key: &str,
        slot: u32,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        crate::util::names::check_name("key", key)?;
        if slot >= MAX_PERMITS {
            return Err(ConfigError::invalid(
                "slot",
                format!("{slot} is outside 0 ..= {}", MAX_PERMITS - 1),
            )
            .into());
        }
        let keys = SemKeys::new(&self.prefix, key);
        let slot_key = keys.slot(slot);
        let backend = &self.backend;
        let (meta, lock, channel) = (keys.meta.as_str(), slot_key.as_str(), keys.channel.as_str());
        let (outcome, _) = take_expected(
            expected,
            move || async move {
                let stored = backend.read_permit(meta, lock, slot).await?;
                Ok(stored.value.map(|value| {
                    let taken = Taken {
                        fencing_token: stored.fence.and_then(|f| f.parse().ok()),
                        holder: short(&value).to_string(),
                    };
                    (value, taken)
                }))
            },
            move |value| async move {
                let limit = Instant::now() + backend.response_timeout();
                backend.release(lock, channel, &value, limit).await
            },
        )
        .await?;
        backend.tell_taken(&slot_key, &keys.channel, &outcome).await;
        Ok(outcome)
    }

    /// Tries once to take a permit of semaphore `key` (of `limit` permits) for `lease`, in one
    /// round trip. All permits held is `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name, a limit outside 1 ..= [`MAX_PERMITS`], a lease
    /// outside 10 ms ..= 1 day, or a limit other than the one stored (naming both);
    /// [`Error::CorruptState`] for a record baton never writes; connection errors and timeouts
    /// (the permit is then released by token in the background, in case the script did run).
    ///
    /// # Cancel safety
    /// Dropping the future after the script was sent releases by token through a task of the
    /// client.
    pub async fn try_acquire(
        &self,
        key: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Option<PermitGuard>, Error> {
        let keys = self.keys(key, limit, lease)?;
        let mut one = PermitTry {
            sems: self,
            keys,
            key,
            limit,
            lease,
            place: None,
        };
        match one.try_once(false, Instant::now()).await? {
            Tried::Granted(guard) => Ok(Some(guard)),
            Tried::Held { .. } => Ok(None),
        }
    }

    /// Takes a permit of semaphore `key` (of `limit` permits) for `lease`, waiting while all
    /// are held: the mutex's wait ([`Locks::acquire`](crate::Locks::acquire)), woken early by
    /// a release on the semaphore's channel (one waiter per client per release), never past
    /// the shortest remaining lease among the holders. Gives up after
    /// [`LockOptions::max_tries`] tries or [`LockOptions::wait`].
    ///
    /// # Errors
    /// [`Error::NotAcquired`] when the bound ran out with every permit held; as
    /// [`Semaphores::try_acquire`] otherwise; [`Error::Unsupported`] for an option the
    /// semaphore does not use (`replica_ack`, `holder_name`, `heartbeat`, and
    /// `waiter_timeout` without `fair`).
    ///
    /// # Cancel safety
    /// As [`Semaphores::try_acquire`].
    pub async fn acquire(
        &self,
        key: &str,
        limit: u32,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<PermitGuard, Error> {
        let keys = self.keys(key, limit, lease)?;
        opts.refuse_others(
            "the semaphore",
            &[
                Field::MaxTries,
                Field::MaxBackoff,
                Field::Watchdog,
                Field::MaxHold,
                Field::Fair,
                Field::WaiterTimeout,
            ],
        )?;
        if opts.waiter_timeout.is_some() && !opts.fair {
            return Err(Error::Unsupported {
                what: "the option `waiter_timeout` without `fair`",
                backend: "the semaphore",
                why: "only a fair waiter keeps a place in the semaphore's line; set `fair(true)` \
                      or leave it unset",
            });
        }
        let place = opts.fair.then(|| {
            let (backend, keys, waiter) = (self.backend.clone(), keys.clone(), new_token());
            let leave: Armed<Box<dyn FnOnce() + Send + Sync>> = {
                let waiter = waiter.clone();
                Armed::new(Box::new(move || {
                    backend.leave_semaphore_line_in_background(
                        &keys.meta,
                        &keys.queue,
                        &keys.alive,
                        &keys.channel,
                        waiter,
                    )
                }))
            };
            Place {
                waiter,
                liveness: opts.waiter_timeout(),
                leave,
            }
        });
        let mut acq = PermitTry {
            sems: self,
            keys,
            key,
            limit,
            lease,
            place,
        };
        let mut guard = acquire::acquire(&mut acq, key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }

    /// Runs `work` holding a permit of semaphore `key`: acquires as [`Semaphores::acquire`]
    /// (the watchdog always on), cancels `work` if the permit is lost, and always releases, as
    /// [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// # Errors
    /// As [`Semaphores::acquire`]; [`Error::LeaseLost`] when the permit was lost during `work`
    /// or the release found it held by another token.
    pub async fn with_permit<F, Fut>(
        &self,
        key: &str,
        limit: u32,
        lease: Duration,
        opts: &LockOptions,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(&PermitGuard) -> Fut,
        Fut: Future,
    {
        let opts = opts.clone().with_watchdog();
        let guard = self.acquire(key, limit, lease, &opts).await?;
        acquire::with_lock(guard, work).await
    }

    /// The resource side of fencing for a permit: [`Locks::write_fenced`](crate::Locks::write_fenced)
    /// on the Redis hash `{resource}:{slot}`. Tokens are ordered per slot, so each slot has its
    /// own resource key: a paused holder of slot `slot` is refused once its slot was granted
    /// again and the new holder wrote.
    ///
    /// # Errors
    /// As [`Locks::write_fenced`](crate::Locks::write_fenced).
    pub async fn write_fenced(
        &self,
        resource: &str,
        slot: u32,
        fencing_token: u64,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        self.backend
            .write_fenced(
                &slot_resource(resource, slot),
                fencing_token,
                value.as_ref(),
            )
            .await
    }

    /// The read side of [`Semaphores::write_fenced`]: what `{resource}:{slot}` holds.
    ///
    /// # Errors
    /// As [`Locks::read_fenced`](crate::Locks::read_fenced).
    pub async fn read_fenced(
        &self,
        resource: &str,
        slot: u32,
    ) -> Result<Option<FencedValue>, Error> {
        self.backend
            .read_fenced(&slot_resource(resource, slot))
            .await
    }
}

/// The resource key of slot `slot`: fencing tokens are ordered per slot.
fn slot_resource(resource: &str, slot: u32) -> String {
    format!("{resource}:{slot}")
}

/// One try of the semaphore, as the acquisition engine drives it.
struct PermitTry<'a> {
    sems: &'a Semaphores,
    keys: Arc<SemKeys>,
    key: &'a str,
    limit: u32,
    lease: Duration,
    /// A fair waiter's place in the line; `None` outside it.
    place: Option<Place>,
}

/// A fair waiter's place in the semaphore's line.
struct Place {
    /// Its id in the line, the same for every try of one wait.
    waiter: String,
    /// How long the place lasts without a try refreshing it.
    liveness: Duration,
    /// Leaves the line on any exit but a grant (an error, the bound, a dropped future), through
    /// a task of the client.
    leave: Armed<Box<dyn FnOnce() + Send + Sync>>,
}

impl TryAcquire for PermitTry<'_> {
    type Guard = PermitGuard;
    type Channel = WakeOne;

    /// One script call: the guard, or the shortest remaining lease among the holders.
    async fn try_once(
        &mut self,
        takeover: bool,
        asked: Instant,
    ) -> Result<Tried<PermitGuard>, Error> {
        let token = new_token();
        let backend = self.sems.backend.clone();
        // Armed before the request leaves: an error, a timeout or a drop from here on releases
        // whichever slot this token took, unless disarmed once the reply is known.
        let mut pending = {
            let (b, k, t) = (backend.clone(), self.keys.clone(), token.clone());
            Armed::new(move || b.release_permit_in_background(&k.meta, &k.slots, &k.channel, t))
        };
        let limit = after(Instant::now(), backend.response_timeout());
        let req = PermitRequest {
            meta: &self.keys.meta,
            slots: &self.keys.slots,
            token: &token,
            ttl: self.lease,
            limit: self.limit,
            queue: &self.keys.queue,
            alive: &self.keys.alive,
            place: self.place.as_ref().map(|p| (p.waiter.as_str(), p.liveness)),
        };
        let grant = backend.acquire_permit(&req, limit).await;
        if !matches!(&grant, Err(e) if e.is_indeterminate()) {
            pending.disarm();
        }
        match grant? {
            PermitGrant::Granted { slot, fence, sent } => {
                // The grant took this waiter out of the line in the same step.
                if let Some(p) = self.place.as_mut() {
                    p.leave.disarm();
                }
                let labels = Labels::new(primitive::SEMAPHORE, backend.label());
                labels.transition(transition::GRANT, sent);
                labels.granted(takeover, asked);
                let key = self.key;
                tracing::info!(key, slot, token = short(&token), fence, "permit acquired");
                let at = Arc::new(PermitKeys {
                    slot_key: self.keys.slot(slot),
                    meta: self.keys.meta.clone(),
                    channel: self.keys.channel.clone(),
                });
                let held = HeldLock::new(backend, at, key, token, fence, self.lease, sent);
                Ok(Tried::Granted(PermitGuard {
                    inner: LockGuard::new(held),
                    slot,
                }))
            }
            PermitGrant::Full { pttl } => Ok(Tried::Held { remaining: pttl }),
            PermitGrant::Mismatch { stored } => Err(Error::Config(ConfigError::invalid(
                "limit",
                format!(
                    "semaphore `{}` is stored with limit {stored}, this call gives {}; \
                     change it with Semaphores::set_limit",
                    self.key, self.limit
                ),
            ))),
        }
    }

    /// A fair waiter tries again at least every third of its place's liveness, so two refreshes
    /// may fail and a third still keeps the place; otherwise the kernel's nap.
    fn held_nap(
        &mut self,
        remaining: Option<Duration>,
        backoff: &mut crate::util::backoff::Backoff,
    ) -> Duration {
        let nap = backoff.next_delay();
        let nap = match remaining {
            Some(p) => nap.min(p.max(Duration::from_millis(1))),
            None => nap,
        };
        match &self.place {
            Some(p) => nap.min((p.liveness / 3).max(Duration::from_millis(1))),
            None => nap,
        }
    }

    /// Behind this client's waiters, as the mutex's waiters queue.
    fn waiting(&mut self) -> (Option<WakeOne>, bool) {
        (self.sems.backend.waiting(&self.keys.channel), true)
    }

    /// This client's waiters on the semaphore: one shared subscription, one waiter woken per
    /// release. Best effort: without it the engine polls with backoff, never past the shortest
    /// remaining lease.
    async fn subscribe(&mut self) -> Option<WakeOne> {
        let limit = self.sems.backend.connect_timeout();
        let backend = self.sems.backend.clone();
        match tokio::time::timeout(limit, backend.wake_one(&self.keys.channel)).await {
            Ok(Ok(g)) => Some(g),
            _ => None,
        }
    }
}

/// A held permit: one slot of a semaphore. Release it with [`PermitGuard::release`]; dropping
/// it releases in the background. It answers [`HeldLease`], [`Fenced`] (the slot's fencing
/// token) and [`LeaseGuard`] as the mutex's [`LockGuard`] does.
#[derive(Debug)]
pub struct PermitGuard {
    inner: LockGuard,
    slot: u32,
}

impl PermitGuard {
    /// The slot this permit holds, 0 ..= limit − 1: the lowest that was free at the grant.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// This holder's random 128-bit token (hex), as stored in the slot's key.
    pub fn token(&self) -> &str {
        self.inner.token()
    }

    /// Starts the watchdog (once), as [`LockGuard::start_watchdog`].
    pub fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        self.inner.start_watchdog(max_hold);
    }

    /// Extends the permit to `lease` from now if the slot still holds this guard's token, as
    /// [`LockGuard::extend`] (it also keeps the semaphore's record alive).
    ///
    /// # Errors
    /// As [`LockGuard::extend`].
    pub async fn extend(&mut self, lease: Duration) -> Result<bool, Error> {
        self.inner.extend(lease).await
    }

    /// Releases the permit if the slot still holds this guard's token, and wakes a waiter.
    /// `Ok(false)`: it was no longer ours; nothing was deleted.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<bool, Error> {
        self.inner.release().await
    }

    /// Writes `value` to the Redis hash `{resource}:{slot}` with this permit's fencing token
    /// ([`Semaphores::write_fenced`]).
    ///
    /// # Errors
    /// As [`Semaphores::write_fenced`].
    pub async fn write_fenced(
        &self,
        resource: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        self.inner
            .write_fenced(&slot_resource(resource, self.slot), value)
            .await
    }

    /// Reads the Redis hash `{resource}:{slot}` ([`Semaphores::read_fenced`]).
    ///
    /// # Errors
    /// As [`Semaphores::read_fenced`].
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        self.inner
            .read_fenced(&slot_resource(resource, self.slot))
            .await
    }
}

impl sealed::Sealed for PermitGuard {
    fn core(&self) -> &LeaseCore {
        sealed::Sealed::core(&self.inner)
    }
}

/// The loss signal fires as the mutex guard's does.
impl HeldLease for PermitGuard {}

impl Fenced for PermitGuard {}

impl LeaseGuard for PermitGuard {
    fn extend(&mut self, lease: Duration) -> impl Future<Output = Result<bool, Error>> + Send {
        PermitGuard::extend(self, lease)
    }
    fn release(self) -> impl Future<Output = Result<bool, Error>> + Send {
        PermitGuard::release(self)
    }
    fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        PermitGuard::start_watchdog(self, max_hold)
    }
}
