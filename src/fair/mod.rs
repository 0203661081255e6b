//! A fair, fenced Redis lock: waiters queue in the order the server saw them, a release wakes
//! only the next one, and a priority reservation ("I go next") cannot be jumped.
//!
//! - [`keys`]: the key layout (`baton:fair:{K}`, `…:queue`, `…:alive`, `…:reserved`, …).
//! - [`options`]: [`LockOptions`], the options of every lock-shaped primitive (validated,
//!   serde), with the fair lock's `waiter_timeout`.
//! - [`FairLocks`]: the handle ([`Client::fair_locks`](crate::Client::fair_locks)):
//!   [`FairLocks::try_acquire`], [`FairLocks::acquire`], [`FairLocks::with_lock`],
//!   [`FairLocks::reserve`].
//! - [`LockGuard`]: the held lock, the mutex's guard type (token, fencing token, lease
//!   deadline, `release`, `extend`, the watchdog and its loss signal); its `release` leaves the
//!   queue and wakes the next waiter.
//! - [`Reservation`]: a held priority reservation; [`Reservation::acquire`] goes next.
//!
//! Waiting is the lease kernel's acquisition engine (`lease::acquire`), shared with the other
//! lock-shaped primitives: this module gives it one try (grant or queue, and refresh the place),
//! the waiter's wake channel and the queue's own nap between tries.
//!
//! The scripts live in the Redis backend, behind the fair line's store seam (`backend::fair`),
//! with the fence step shared with the mutex's acquisition.
//!
//! # Guarantees
//! - **Order.** Each try is one script that grants iff the lock is free and the caller heads
//!   the queue (or holds the reservation); otherwise it queues the caller once, numbered after
//!   the current tail. Waiters are therefore granted in the order in which the server first
//!   ran their tries. A waiter that leaves (a dropped or timed-out `acquire`) is removed at
//!   once through a task of the client.
//! - **No thundering herd.** A release (and a leave while the lock is free) publishes on the
//!   channel of the next waiter only (the reserver, else the live head). The others sleep until
//!   their own liveness refresh (a third of their waiter timeout). A handoff costs the release
//!   and the head's grant, whatever the queue's length: from the release being sent to the
//!   head holding the lock is the release's round trip, the message's one-way delivery and
//!   the head's one try (2½ round trips). Liveness refreshes are one try per waiter per third
//!   of its timeout, apart from handoffs.
//! - **Dead waiters.** Each waiter's place lives as long as it refreshes it (every third of
//!   [`LockOptions::waiter_timeout`]); a waiter that stops (a crash, a forgotten future without
//!   a runtime) is evicted after its timeout by the next queued try, or by a grant or release
//!   once it heads the queue, so it delays the queue by at
//!   most its timeout plus the next waiter's refresh period. A crashed holder publishes
//!   nothing: a head that learned it was the head (its last try said so) sleeps at most the
//!   lock's PTTL; one that became the head by the grant of the waiter before it, without a
//!   try since, sleeps until its refresh (a third of its waiter timeout), as the model
//!   checker shows (`src/model/fair.rs`).
//! - **Reservation.** [`FairLocks::reserve`] is one `SET NX PX`: a second concurrent
//!   reservation fails with [`Error::Reserved`]. While one exists, no grant goes to anyone else
//!   (checked in the granting script itself, not before it). It ends when its owner is granted
//!   (consumed in the same script), is dropped, or fails; a dead owner's reservation expires
//!   after its lifetime (renewed while its owner waits in [`Reservation::acquire`]).
//! - **Fencing** as the mutex: `max(old + 1, server time in µs)`, strictly increasing per lock
//!   name unless the server's clock goes back.
//! - Waiting needs pub/sub only for speed: a waiter whose message is lost tries again on its
//!   own timer.

pub mod keys;
pub mod options;
pub(crate) mod queue;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::fair::queue::{Enqueue, QueueKeys, Turn};
use crate::lease::acquire::{self, Tried, TryAcquire, WaitChannel};
pub use crate::lease::held::LockGuard;
use crate::lease::held::{HeldKeys, HeldLock, ReleaseFuture};
use crate::lease::options::Field;
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::backoff::Backoff;
use crate::util::drop_guard::Armed;
use crate::util::pubsub::Subscription;
use crate::util::token::{new_token, short};

pub use keys::DEFAULT_PREFIX;
use options::DEFAULT_WAITER_TIMEOUT;
pub use options::{FairOptions, FairOptionsBuilder, LockOptions, LockOptionsBuilder};

/// The fair lock on one client's connections. Get it from
/// [`Client::fair_locks`](crate::Client::fair_locks); cheap to clone.
#[derive(Clone)]
pub struct FairLocks {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for FairLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairLocks")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl FairLocks {
    /// The backend, once it is one the fair line lives on (Redis only).
    fn transport(&self) -> Result<&Backend, Error> {
        self.backend.fair_line()?;
        Ok(&self.backend)
    }

    /// The fair lock on `transport` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        FairLocks {
            backend,
            prefix: Arc::from(DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}fair:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<FairLocks, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(FairLocks {
            backend: self.backend.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Takes fair lock `key` from its holder, as an operator does with a hung one (the next waiter is woken), but only
    /// the grant `expected` names (its fencing token as shown, or its holder where no token is
    /// shown; [`Expected::Any`] for whatever holds it): the holder value and the fence are
    /// read together and the release is by that value, so a grant made after the operator
    /// looked is left alone ([`ForceRelease::HeldByAnother`]). The holder hears it at once on
    /// its lock's `taken` channel when it listens there (its watchdog does), at its next extension otherwise, and
    /// reports the loss; the fence stays, so the next holder's fencing token is higher than the one taken. One
    /// method, the same on the mutex, the fair lock and elections:
    /// [`Locks::force_release`](crate::Locks::force_release),
    /// [`FairLocks::force_release`](crate::FairLocks::force_release),
    /// [`Leaders::force_release`](crate::Leaders::force_release).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or [`Expected::Attempt`]; [`Error::Unsupported`] on PostgreSQL; connection errors;
    /// [`Error::Timeout`] when, with [`Expected::Any`], the holder kept changing through every
    /// try.
    pub async fn force_release(
        &self,
        key: &str,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        let keys = self.keys(key)?;
        let transport = self.transport()?;
        let (outcome, _) = crate::lease::store::take_expected(
            expected,
            || async {
                let stored = self.backend.read(&keys.lock, &keys.fence).await?;
                Ok(stored.value.map(|id| {
                    let taken = Taken {
                        fencing_token: stored.fence.and_then(|f| f.parse().ok()),
                        holder: short(&id).to_string(),
                    };
                    (id, taken)
                }))
            },
            |id| {
                let keys = keys.clone();
                async move {
                    // Leaving as the holder's id releases the lock and wakes the next waiter,
                    // in the script every release of a fair lock goes through.
                    let limit = Instant::now() + transport.response_timeout();
                    transport.fair_leave(&keys, &id, limit).await
                }
            },
        )
        .await?;
        self.backend
            .tell_taken(&keys.lock, &keys.taken_channel(), &outcome)
            .await;
        Ok(outcome)
    }

    fn keys(&self, key: &str) -> Result<Arc<QueueKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        Ok(Arc::new(keys::fair_keys(&self.prefix, key)))
    }

    /// Takes fair lock `key` for `lease`, queueing behind earlier waiters.
    ///
    /// The first try grants at once when the lock is free, nobody queues and nobody reserved
    /// it. Otherwise this waiter is queued (in the server's order) and sleeps on its wake
    /// channel: one of this lock's that the client keeps subscribed between waits, or, when
    /// none is idle, a new one it subscribes to and then tries once more (a release in between
    /// is not missed). It sleeps until woken by a release (only the head is), until its
    /// liveness refresh (a third of [`LockOptions::waiter_timeout`]), or, as the head, until
    /// the holder's lease or a reservation can run out. Transient errors are retried with
    /// backoff within the same bounds.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a lease outside 10 ms ..= 1 day;
    /// [`Error::NotAcquired`] when [`LockOptions::wait`] or [`LockOptions::max_tries`] ran out
    /// (this waiter then leaves the queue); the last transient error when the bound ran out on
    /// one; [`Error::Unsupported`] for an option the fair lock does not use (`replica_ack`,
    /// `heartbeat`); [`Error::CorruptState`] when the fence holds something baton never writes;
    /// other non-retryable errors at once.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the queue at once through a task of the client (which also
    /// releases the lock if a lost reply had granted it, and wakes the next waiter). Without a
    /// runtime or client, the waiter timeout (and the lease) are the backstop.
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let keys = self.keys(key)?;
        crate::lease::check_ttl("lease", lease)?;
        refuse_unused(opts)?;
        let mut acq = self.turn(keys, key, new_token(), lease, opts.waiter_timeout(), false)?;
        acq.park();
        let mut guard = acquire::acquire(&mut acq, key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }

    /// Tries once to take fair lock `key` for `lease`, in one round trip: granted only if the
    /// lock is free, nobody queues ahead and nobody reserved it, so a try never jumps the
    /// queue. Contention is `Ok(None)` (the try's place in the queue is given up at once,
    /// through a task of the client).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a lease outside 10 ms ..= 1 day;
    /// [`Error::CorruptState`] when the fence holds something baton never writes; connection
    /// errors and timeouts (the place, and a lock a lost reply may have granted, are given up
    /// in the background).
    ///
    /// # Cancel safety
    /// Dropping the future gives up the place (and a lock a lost reply may have granted)
    /// through a task of the client.
    pub async fn try_acquire(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        let keys = self.keys(key)?;
        crate::lease::check_ttl("lease", lease)?;
        let mut one = self.turn(keys, key, new_token(), lease, DEFAULT_WAITER_TIMEOUT, false)?;
        // One try only: dropping `one` gives the place up.
        match one.try_once(false, Instant::now()).await? {
            Tried::Granted(guard) => Ok(Some(guard)),
            Tried::Held { .. } => Ok(None),
        }
    }

    /// Runs `work` holding fair lock `key`: acquires as [`FairLocks::acquire`] does (with
    /// `opts`, the watchdog always on), calls `work` with the guard (read its
    /// [`fencing_token`](crate::Fenced::fencing_token) into the future `work` returns), cancels that
    /// future if the lock is lost, and always releases (waking the next waiter).
    ///
    /// # Errors
    /// As [`FairLocks::acquire`]; [`Error::LeaseLost`] when the loss signal fired during
    /// `work` (which was dropped at that point) or when the release found the lock held by
    /// another token (mutual exclusion may then have been broken, so `work`'s output is not
    /// returned). A release that fails on the network is only logged: `work` finished in time
    /// and the lock expires by its lease.
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

    /// Takes the priority reservation of fair lock `key` for `lifetime` (one `SET NX PX`): the
    /// next grant goes to [`Reservation::acquire`], ahead of every queued waiter and of anyone
    /// arriving later. It ends when that acquisition is granted or fails, when the
    /// [`Reservation`] is dropped, or after `lifetime` (renewed while
    /// [`Reservation::acquire`] waits), so a dead reserver blocks the lock for at most that.
    ///
    /// # Errors
    /// [`Error::Reserved`] when another reservation of this lock exists; [`Error::Config`] for
    /// an invalid name or a lifetime outside 30 ms ..= 1 h; connection errors and timeouts (the
    /// reservation, if it was taken, is dropped in the background).
    pub async fn reserve(&self, key: &str, lifetime: Duration) -> Result<Reservation, Error> {
        let keys = self.keys(key)?;
        options::validate_timeout("lifetime", lifetime)?;
        let token = new_token();
        let armed: Armed<Box<dyn FnOnce() + Send + Sync>> = {
            let (transport, keys, token) = (self.transport()?.clone(), keys.clone(), token.clone());
            Armed::new(Box::new(move || {
                leave_in_background(&transport, &keys, token)
            }))
        };
        let mut pending = Reservation {
            armed,
            locks: self.clone(),
            keys: keys.clone(),
            key: key.to_string(),
            token,
            lifetime,
        };
        match self
            .transport()?
            .fair_reserve(&keys, &pending.token, lifetime)
            .await
        {
            Ok(true) => {
                tracing::info!(key, token = short(&pending.token), "fair lock reserved");
                Ok(pending)
            }
            Ok(false) => {
                pending.armed.disarm();
                Err(Error::Reserved {
                    key: keys.reserved.clone(),
                    reason: "another contender holds the priority reservation".into(),
                })
            }
            Err(e) => {
                if !e.is_indeterminate() {
                    pending.armed.disarm();
                }
                Err(e)
            }
        }
    }

    /// One waiter's (or the reserver's, `reserver`) turns at the queue, for the acquisition
    /// engine. `liveness` is how long its place lasts without a refresh (the reserver's: its
    /// reservation's lifetime).
    fn turn(
        &self,
        keys: Arc<QueueKeys>,
        key: &str,
        id: String,
        lease: Duration,
        liveness: Duration,
        reserver: bool,
    ) -> Result<FairTry, Error> {
        let transport = self.transport()?.clone();
        // Armed for the whole wait: any exit but a grant (an error, the bound, a dropped
        // future, a single try that found the lock taken) leaves the queue, releases a lock a
        // lost reply may have granted, and drops the reservation, through a task of the client.
        let queued: Armed<Box<dyn FnOnce() + Send + Sync>> = {
            let (transport, keys, id) = (transport.clone(), keys.clone(), id.clone());
            Armed::new(Box::new(move || leave_in_background(&transport, &keys, id)))
        };
        Ok(FairTry {
            transport,
            keys,
            key: key.to_string(),
            id,
            lease,
            liveness,
            // Refresh a third of the way, so two refreshes may fail and a third still lands.
            refresh: (liveness / 3).max(Duration::from_millis(1)),
            reserver,
            name: None,
            parked: None,
            queued,
            tries: 0,
            last: (None, None),
        })
    }
}

/// The options the fair lock honours; any other set is refused by name.
fn refuse_unused(opts: &LockOptions) -> Result<(), Error> {
    opts.refuse_others(
        "the fair lock",
        &[
            Field::MaxTries,
            Field::MaxBackoff,
            Field::Watchdog,
            Field::MaxHold,
            Field::WaiterTimeout,
        ],
    )
}

/// A waiter's (or the reserver's) turns at the queue, as the acquisition engine drives them:
/// each try is one script that grants or queues (once) and refreshes the place.
struct FairTry {
    transport: Backend,
    keys: Arc<QueueKeys>,
    key: String,
    /// The waiter's id in the queue; a waiter's names its wake channel after the last `.`.
    id: String,
    lease: Duration,
    liveness: Duration,
    refresh: Duration,
    reserver: bool,
    /// A waiter's wake channel name (the reserver's channel is named by its id).
    name: Option<String>,
    /// An idle subscription of this lock's the client kept, taken for this wait.
    parked: Option<Subscription>,
    /// Leaves the queue on any exit but a grant.
    queued: Armed<Box<dyn FnOnce() + Send + Sync>>,
    tries: u32,
    /// What the last try said about the queue: this waiter's rank and a reservation's PTTL.
    last: (Option<u64>, Option<Duration>),
}

impl FairTry {
    /// A waiter (not a single try, not the reserver, whose id is its reservation's) is woken on
    /// a channel kept subscribed between waits: an idle one of this lock if there is one, so
    /// this wait neither subscribes nor tries twice. Its id names the channel after the last
    /// `.` (the leave script publishes there).
    fn park(&mut self) {
        let taken = self
            .transport
            .fair_parked()
            .ok()
            .and_then(|p| p.take(&self.keys.lock));
        let name = match taken {
            Some(c) => {
                self.parked = Some(c.sub);
                c.name
            }
            None => new_token(),
        };
        self.id = format!("{}.{name}", self.id);
        self.name = Some(name);
        // The leave on exit names the waiter by its full id.
        self.queued.disarm();
        let (transport, keys, id) = (self.transport.clone(), self.keys.clone(), self.id.clone());
        self.queued = Armed::new(Box::new(move || leave_in_background(&transport, &keys, id)));
    }

    fn channel(&mut self, sub: Subscription) -> FairWake {
        FairWake {
            transport: self.transport.clone(),
            lock: self.keys.lock.clone(),
            name: self.name.clone(),
            sub: Some(sub),
            closed: false,
        }
    }
}

impl TryAcquire for FairTry {
    type Guard = LockGuard;
    type Channel = FairWake;

    async fn try_once(
        &mut self,
        _takeover: bool,
        asked: Instant,
    ) -> Result<Tried<LockGuard>, Error> {
        self.tries = self.tries.saturating_add(1);
        let req = Enqueue {
            id: &self.id,
            ttl: self.lease,
            liveness: self.liveness,
            reserver: self.reserver,
        };
        match self.transport.fair_acquire(&self.keys, &req).await? {
            Turn::Granted { fence, sent } => {
                self.queued.disarm();
                // The grant script does not tell a handoff from a holder that expired: counted
                // as `takeover="false"` (docs/operating.md says so).
                let labels = crate::util::metrics::Labels::new(
                    crate::util::metrics::primitive::FAIR,
                    crate::util::metrics::backend::REDIS,
                );
                labels.transition(crate::util::metrics::transition::GRANT, sent);
                labels.granted(false, asked);
                let (key, tries) = (self.key.as_str(), self.tries);
                tracing::info!(
                    key,
                    token = short(&self.id),
                    fence,
                    tries,
                    "fair lock acquired"
                );
                Ok(Tried::Granted(LockGuard::new(HeldLock::new(
                    self.transport.clone(),
                    self.keys.clone(),
                    &self.key,
                    self.id.clone(),
                    fence,
                    self.lease,
                    sent,
                ))))
            }
            Turn::ReservationGone => Err(Error::Reserved {
                key: self.keys.reserved.clone(),
                reason: "this reservation ended (its lifetime ran out, or another contender \
                         reserved after it) before the lock was granted to it"
                    .into(),
            }),
            Turn::Waiting {
                pttl,
                rank,
                reserved,
            } => {
                self.last = (rank, reserved);
                Ok(Tried::Held { remaining: pttl })
            }
        }
    }

    fn waiting(&mut self) -> (Option<FairWake>, bool) {
        let parked = self.parked.take();
        (parked.map(|s| self.channel(s)), false)
    }

    /// Best effort: without pub/sub the waiter still wakes on its timers.
    async fn subscribe(&mut self) -> Option<FairWake> {
        let limit = self.transport.connect_timeout();
        let channel = self.keys.wake(self.name.as_deref().unwrap_or(&self.id));
        match tokio::time::timeout(limit, self.transport.subscribe(&channel)).await {
            Ok(Ok(s)) => Some(self.channel(s)),
            _ => None,
        }
    }

    /// Contention needs no backoff (a release wakes the next waiter): the queue's own nap.
    fn held_nap(&mut self, remaining: Option<Duration>, backoff: &mut Backoff) -> Duration {
        backoff.reset();
        let (rank, reserved) = self.last;
        waiting_nap(self.refresh, self.reserver, remaining, rank, reserved)
    }

    /// Backoff after a transient error, but never past the place's refresh.
    fn error_nap(&mut self, backoff: &mut Backoff) -> Duration {
        backoff.next_delay().min(self.refresh)
    }
}

/// A waiter's wake channel: its name (a waiter's, not the reserver's) and subscription, given
/// back to the client's idle channels when the wait ends, however it ends.
struct FairWake {
    transport: Backend,
    lock: String,
    name: Option<String>,
    sub: Option<Subscription>,
    closed: bool,
}

impl WaitChannel for FairWake {
    type Wake = ();

    /// Wakes that arrived before this try are answered by it (on a kept channel, also any left
    /// over from its last wait).
    fn take_stored(&mut self) -> Option<()> {
        if let Some(s) = self.sub.as_mut() {
            while s.rx.try_recv().is_some() {}
        }
        None
    }

    fn closed(&self) -> bool {
        self.closed
    }

    async fn wait(&mut self, nap: Duration, _until: Option<Instant>) -> Option<()> {
        let s = self.sub.as_mut()?;
        match tokio::time::timeout(nap, s.rx.recv()).await {
            Ok(Some(_)) => Some(()),
            // The hub is gone (client shutting down): fall back to timers.
            Ok(None) => {
                self.closed = true;
                None
            }
            Err(_) => None,
        }
    }

    fn used(_: ()) {}
}

impl Drop for FairWake {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let (Some(name), Some(sub)) = (self.name.take(), self.sub.take()) {
            if let Ok(parked) = self.transport.fair_parked() {
                parked.give_back(&self.lock, crate::util::parked::Channel { name, sub });
            }
        }
    }
}

/// How long a waiter sleeps after a [`Turn::Waiting`] reply (unless a wake message comes
/// first): its liveness `refresh`, shortened, for the one who goes next (the reserver, or the
/// queue's head), to the holder's lease `pttl` (a crashed holder publishes nothing) and, for the
/// head, to a reservation's PTTL (a reservation may run out). Never below 1 ms. The model
/// checker (`src/model/fair.rs`) runs the same function.
pub(crate) fn waiting_nap(
    refresh: Duration,
    reserver: bool,
    pttl: Option<Duration>,
    rank: Option<u64>,
    reserved: Option<Duration>,
) -> Duration {
    let mut nap = refresh;
    if reserver || rank == Some(0) {
        if let Some(p) = pttl {
            nap = nap.min(p.max(Duration::from_millis(1)));
        }
        if let (false, Some(r)) = (reserver, reserved) {
            nap = nap.min(r.max(Duration::from_millis(1)));
        }
    }
    nap
}

/// Leaves the line as `id` (release, leave the queue, drop the reservation, wake the next)
/// through a task of the client; never blocks. Without a runtime or a client that shut down,
/// the waiter timeout, the reservation lifetime and the lock's ttl are the backstops.
fn leave_in_background(backend: &Backend, keys: &Arc<QueueKeys>, id: String) {
    backend.fair_leave_in_background(keys, id);
}

/// A held priority reservation of one fair lock: the next grant is for
/// [`Reservation::acquire`]. Dropping it gives the reservation up (in the background) and wakes
/// the next waiter.
pub struct Reservation {
    /// Gives the reservation up when dropped, while it is this value's to give up.
    armed: Armed<Box<dyn FnOnce() + Send + Sync>>,
    locks: FairLocks,
    keys: Arc<QueueKeys>,
    key: String,
    token: String,
    lifetime: Duration,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .field("token", &short(&self.token))
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// The lock's name, as given to reserve.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The reservation's lifetime (renewed while [`Reservation::acquire`] waits).
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Takes the lock for `lease` ahead of every queued waiter: at once if it is free, else as
    /// soon as its holder releases it (the release wakes this reserver) or its lease runs out.
    /// The reservation is consumed by the grant, in the same script.
    ///
    /// # Errors
    /// [`Error::Reserved`] when the reservation ended before the grant (its lifetime ran out);
    /// otherwise as [`FairLocks::acquire`]. On every error the reservation is given up.
    ///
    /// # Cancel safety
    /// Dropping the future gives the reservation up (and leaves, releasing a lock a lost reply
    /// may have granted) through a task of the client.
    pub async fn acquire(
        mut self,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<LockGuard, Error> {
        crate::lease::check_ttl("lease", lease)?;
        refuse_unused(opts)?;
        // From here the wait's own leave-on-exit covers the reservation (same id).
        self.armed.disarm();
        let id = std::mem::take(&mut self.token);
        let mut acq =
            self.locks
                .turn(self.keys.clone(), &self.key, id, lease, self.lifetime, true)?;
        let mut guard = acquire::acquire(&mut acq, &self.key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }
}

/// The fair lock's release: leave the queue (releasing the lock if this token holds it) and
/// wake the next waiter, in one script.
impl HeldKeys for QueueKeys {
    fn what(&self) -> &'static str {
        "fair lock"
    }

    fn primitive(&self) -> crate::util::metrics::Primitive {
        crate::util::metrics::primitive::FAIR
    }

    fn release<'a>(
        &'a self,
        backend: &'a Backend,
        token: &'a str,
        limit: Instant,
    ) -> ReleaseFuture<'a> {
        Box::pin(async move { backend.fair_leave(self, token, limit).await })
    }

    fn release_in_background(self: Arc<Self>, backend: &Backend, token: String) {
        leave_in_background(backend, &self, token);
    }

    fn taken_channel(&self) -> String {
        QueueKeys::taken_channel(self)
    }
}
