//! A fair, fenced Redis lock: waiters queue in the order the server saw them, a release wakes
//! only the next one, and a priority reservation ("I go next") cannot be jumped.
//!
//! - [`keys`]: the key layout (`baton:fair:{K}`, `…:queue`, `…:alive`, `…:reserved`, …).
//! - [`options`]: [`FairOptions`] (validated, serde).
//! - [`FairLocks`]: the handle ([`Client::fair_locks`](crate::Client::fair_locks)):
//!   [`FairLocks::try_acquire`], [`FairLocks::acquire`], [`FairLocks::with_lock`],
//!   [`FairLocks::reserve`].
//! - [`LockGuard`]: the held lock, the mutex's guard type (token, fencing token, lease
//!   deadline, `release`, `extend`, the watchdog and its loss signal); its `release` leaves the
//!   queue and wakes the next waiter.
//! - [`Reservation`]: a held priority reservation; [`Reservation::acquire`] goes next.
//!
//! The scripts live in the lease kernel (`lease::queue`), with the fence step shared with the
//! mutex's acquisition.
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
//!   [`FairOptions::waiter_timeout`]); a waiter that stops (a crash, a forgotten future without
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

use crate::backend::redis::{Subscription, Transport};
use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::fair::queue::{self as kernel, Enqueue, QueueKeys, Turn};
use crate::lease::guard::hold_while;
pub use crate::lease::held::LockGuard;
use crate::lease::held::{HeldKeys, HeldLock, ReleaseFuture};
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::backoff::Backoff;
use crate::util::drop_guard::Armed;
use crate::util::time::after;
use crate::util::token::{new_token, short};

pub use keys::DEFAULT_PREFIX;
pub use options::{FairOptions, FairOptionsBuilder};

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
    /// The Redis transport: the fair lock exists on Redis only.
    fn transport(&self) -> Result<&Arc<Transport>, Error> {
        self.backend.redis(
            "the fair lock",
            "its queue, wake-ups and reservation are Redis scripts and channels; on PostgreSQL use `locks()` or `advisory_locks()`",
        )
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
        let transport = self
            .backend
            .redis("the fair lock", "it exists on Redis only")?;
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
                    let mut conn = transport.node(&keys.lock).await?.conn();
                    let limit = Instant::now() + transport.settings.response_timeout;
                    kernel::leave(&mut conn, &keys, &id, limit).await
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

    /// Takes fair lock `key` for `ttl`, queueing behind earlier waiters.
    ///
    /// The first try grants at once when the lock is free, nobody queues and nobody reserved
    /// it. Otherwise this waiter is queued (in the server's order) and sleeps on its wake
    /// channel: one of this lock's that the client keeps subscribed between waits, or, when
    /// none is idle, a new one it subscribes to and then tries once more (a release in between
    /// is not missed). It sleeps until woken by a release (only the head is), until its
    /// liveness refresh (a third of [`FairOptions::waiter_timeout`]), or, as the head, until
    /// the holder's lease or a reservation can run out. Transient errors are retried with backoff within the same
    /// bound.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a ttl outside 10 ms ..= 1 day;
    /// [`Error::NotAcquired`] when [`FairOptions::wait`] ran out (this waiter then leaves the
    /// queue); the last transient error when the bound ran out on one;
    /// [`Error::CorruptState`] when the fence holds something baton never writes; other
    /// non-retryable errors at once.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the queue at once through a task of the client (which also
    /// releases the lock if a lost reply had granted it, and wakes the next waiter). Without a
    /// runtime or client, the waiter timeout (and the ttl) are the backstop.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        opts: &FairOptions,
    ) -> Result<LockGuard, Error> {
        let keys = self.keys(key)?;
        crate::lease::check_ttl("ttl", ttl)?;
        self.wait_turn(keys, key, new_token(), ttl, Turns::Wait(opts), None)
            .await?
            .ok_or_else(|| Error::NotAcquired {
                // `Turns::Wait` returns a guard or an error; kept typed all the same.
                key: key.to_string(),
                tries: 0,
                waited: Duration::ZERO,
            })
    }

    /// Tries once to take fair lock `key` for `ttl`, in one round trip: granted only if the
    /// lock is free, nobody queues ahead and nobody reserved it, so a try never jumps the
    /// queue. Contention is `Ok(None)` (the try's place in the queue is given up at once,
    /// through a task of the client).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a ttl outside 10 ms ..= 1 day;
    /// [`Error::CorruptState`] when the fence holds something baton never writes; connection
    /// errors and timeouts (the place, and a lock a lost reply may have granted, are given up
    /// in the background).
    ///
    /// # Cancel safety
    /// Dropping the future gives up the place (and a lock a lost reply may have granted)
    /// through a task of the client.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>, Error> {
        let keys = self.keys(key)?;
        crate::lease::check_ttl("ttl", ttl)?;
        self.wait_turn(keys, key, new_token(), ttl, Turns::Once, None)
            .await
    }

    /// Runs `work` holding fair lock `key`: acquires as [`FairLocks::acquire`] does (with
    /// `opts`, the watchdog always on), passes the fencing token to `work`, cancels `work` if
    /// the lock is lost, and always releases (waking the next waiter).
    ///
    /// # Errors
    /// As [`FairLocks::acquire`]; [`Error::LeaseLost`] when the loss signal fired during
    /// `work` (which was dropped at that point) or when the release found the lock held by
    /// another token (mutual exclusion may then have been broken, so `work`'s output is not
    /// returned). A release that fails on the network is only logged: `work` finished in time
    /// and the lock expires by its ttl.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases in the background.
    pub async fn with_lock<F, Fut, T>(
        &self,
        key: &str,
        ttl: Duration,
        opts: &FairOptions,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut opts = opts.clone();
        opts.watchdog = true;
        let guard = self.acquire(key, ttl, &opts).await?;
        let token = crate::lease::guard::Fenced::fencing_token(&guard);
        hold_while(guard, work(token)).await
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
        let node = self.transport()?.node(&keys.reserved).await?;
        let limit = after(Instant::now(), self.transport()?.settings.response_timeout);
        match kernel::reserve(&mut node.conn(), &keys, &pending.token, lifetime, limit).await {
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

    /// The queue loop shared by waiters and the reserver (`lifetime` set).
    async fn wait_turn(
        &self,
        keys: Arc<QueueKeys>,
        key: &str,
        id: String,
        ttl: Duration,
        turns: Turns<'_>,
        lifetime: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        let transport = self.transport()?.clone();
        // A waiter (not a single try, not the reserver, whose id is its reservation's) is woken
        // on a channel kept subscribed between waits: an idle one of this lock if there is
        // one, so this wait neither subscribes nor tries twice. Its id names the channel after
        // the last `.` (the leave script publishes there).
        let mut wake = Wake {
            parked: &transport.hub.parked,
            lock: &keys.lock,
            name: None,
            sub: None,
        };
        let id = if matches!(turns, Turns::Wait(_)) && lifetime.is_none() {
            let name = match transport.hub.parked.take(&keys.lock) {
                Some(c) => {
                    wake.sub = Some(c.sub);
                    c.name
                }
                None => new_token(),
            };
            let id = format!("{id}.{name}");
            wake.name = Some(name);
            id
        } else {
            id
        };
        // Armed for the whole wait: any exit but a grant (an error, the bound, a dropped
        // future, a single try that found the lock taken) leaves the queue, releases a lock a
        // lost reply may have granted, and drops the reservation, through a task of the client.
        let mut queued = {
            let (transport, keys, id) = (self.transport()?.clone(), keys.clone(), id.clone());
            Armed::new(move || leave_in_background(&transport, &keys, id))
        };
        let defaults;
        let opts = match turns {
            Turns::Wait(o) => o,
            Turns::Once => {
                defaults = FairOptions::default();
                &defaults
            }
        };
        let once = matches!(turns, Turns::Once);
        let reserver = lifetime.is_some();
        let liveness = lifetime.unwrap_or(opts.waiter_timeout);
        // Refresh a third of the way, so two refreshes may fail and a third still lands.
        let refresh = (liveness / 3).max(Duration::from_millis(1));
        let start = Instant::now();
        let give_up = opts.wait.map(|w| after(start, w));
        let mut backoff = Backoff::new(opts.max_backoff);
        let sub = &mut wake.sub;
        let mut tries: u32 = 0;
        loop {
            // Wakes that arrived before this try are answered by it (on a kept channel, also
            // any left over from its last wait).
            if let Some(s) = sub.as_mut() {
                while s.rx.try_recv().is_some() {}
            }
            tries = tries.saturating_add(1);
            let req = Enqueue {
                id: &id,
                ttl,
                liveness,
                reserver,
            };
            let outcome = match self.transport()?.node(&keys.lock).await {
                Ok(node) => {
                    let limit = after(Instant::now(), self.transport()?.settings.response_timeout);
                    kernel::acquire_or_enqueue(&mut node.conn(), &keys, &req, limit).await
                }
                Err(e) => Err(e),
            };
            let now = Instant::now();
            let (nap, last_error) = match outcome {
                Ok(Turn::Granted { fence, sent }) => {
                    queued.disarm();
                    // The grant script does not tell a handoff from a holder that expired:
                    // counted as `takeover="false"` (docs/operating.md says so).
                    let labels = crate::util::metrics::Labels::new(
                        crate::util::metrics::primitive::FAIR,
                        crate::util::metrics::backend::REDIS,
                    );
                    labels.transition(crate::util::metrics::transition::GRANT, sent);
                    labels.granted(false, start);
                    tracing::info!(key, token = short(&id), fence, tries, "fair lock acquired");
                    let mut guard = LockGuard::new(HeldLock::new(
                        Backend::Redis(self.transport()?.clone()),
                        keys.clone(),
                        key,
                        id,
                        fence,
                        ttl,
                        sent,
                    ));
                    if opts.watchdog {
                        guard.start_watchdog(opts.max_hold);
                    }
                    return Ok(Some(guard));
                }
                Ok(Turn::ReservationGone) => {
                    return Err(Error::Reserved {
                        key: keys.reserved.clone(),
                        reason: "this reservation ended (its lifetime ran out, or another \
                                 contender reserved after it) before the lock was granted to it"
                            .into(),
                    })
                }
                // One try only: `queued` gives the place up on the way out.
                Ok(Turn::Waiting { .. }) if once => return Ok(None),
                Ok(Turn::Waiting {
                    pttl,
                    rank,
                    reserved,
                }) => {
                    backoff.reset();
                    if sub.is_none() {
                        // Best effort: without pub/sub we still wake on our timers.
                        let limit = transport.settings.connect_timeout;
                        let channel = keys.wake(wake.name.as_deref().unwrap_or(&id));
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(limit, transport.hub.subscribe(&channel)).await
                        {
                            *sub = Some(s);
                            // A release between the try above and the subscription published
                            // to nobody: try again now that we listen.
                            continue;
                        }
                    }
                    (waiting_nap(refresh, reserver, pttl, rank, reserved), None)
                }
                Err(e) if e.is_retryable() && !once => {
                    tracing::debug!(key, error = %e, "fair acquire failed; retrying");
                    (backoff.next_delay().min(refresh), Some(e))
                }
                Err(e) => return Err(e),
            };
            if give_up.is_some_and(|g| now >= g) {
                return Err(last_error.unwrap_or_else(|| Error::NotAcquired {
                    key: key.to_string(),
                    tries,
                    waited: now.saturating_duration_since(start),
                }));
            }
            let nap = match give_up {
                Some(g) => nap.min(g.saturating_duration_since(now)),
                None => nap,
            };
            match sub.as_mut() {
                Some(s) => {
                    if let Ok(None) = tokio::time::timeout(nap, s.rx.recv()).await {
                        // The hub is gone (client shutting down): fall back to timers.
                        *sub = None;
                    }
                }
                None => tokio::time::sleep(nap).await,
            }
        }
    }
}

/// A waiter's wake channel: its name (a waiter's, not the reserver's) and subscription, given
/// back to the client's idle channels when the wait ends, however it ends.
struct Wake<'a> {
    parked: &'a crate::util::parked::Parked,
    lock: &'a str,
    name: Option<String>,
    sub: Option<Subscription>,
}

impl Drop for Wake<'_> {
    fn drop(&mut self) {
        if let (Some(name), Some(sub)) = (self.name.take(), self.sub.take()) {
            self.parked
                .give_back(self.lock, crate::util::parked::Channel { name, sub });
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

/// How long [`FairLocks::wait_turn`] waits: as the options say, or one try.
#[derive(Clone, Copy)]
enum Turns<'a> {
    Wait(&'a FairOptions),
    Once,
}

/// Spawns the leave script (release, leave the queue, drop the reservation, wake the next) on
/// the client's tracker; never blocks. Without a runtime or a client that shut down, the
/// waiter timeout, the reservation lifetime and the lock's ttl are the backstops.
fn leave_in_background(transport: &Arc<Transport>, keys: &Arc<QueueKeys>, id: String) {
    let keys = keys.clone();
    crate::lease::pending::spawn_cleanup(
        transport,
        keys.lock.clone(),
        "left the fair lock",
        move |mut conn, at| async move {
            let ours = kernel::leave(&mut conn, &keys, &id, at).await?;
            Ok(format!("{} (held it: {ours})", short(&id)))
        },
    );
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

    /// Takes the lock for `ttl` ahead of every queued waiter: at once if it is free, else as
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
    pub async fn acquire(mut self, ttl: Duration, opts: &FairOptions) -> Result<LockGuard, Error> {
        crate::lease::check_ttl("ttl", ttl)?;
        // From here the wait's own leave-on-exit covers the reservation (same id).
        self.armed.disarm();
        let keys = self.keys.clone();
        let id = std::mem::take(&mut self.token);
        self.locks
            .wait_turn(
                keys,
                &self.key,
                id,
                ttl,
                Turns::Wait(opts),
                Some(self.lifetime),
            )
            .await?
            .ok_or_else(|| Error::NotAcquired {
                // `Turns::Wait` returns a guard or an error; kept typed all the same.
                key: self.key.clone(),
                tries: 0,
                waited: Duration::ZERO,
            })
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
        Box::pin(async move {
            let transport = backend.redis("the fair lock", "it exists on Redis only")?;
            let mut conn = transport.node(&self.lock).await?.conn();
            kernel::leave(&mut conn, self, token, limit).await
        })
    }

    fn release_in_background(self: Arc<Self>, backend: &Backend, token: String) {
        if let Ok(t) = backend.redis("the fair lock", "it exists on Redis only") {
            leave_in_background(t, &self, token);
        }
    }

    fn taken_channel(&self) -> String {
        QueueKeys::taken_channel(self)
    }
}
