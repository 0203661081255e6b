//! A fair, fenced Redis lock: waiters queue in the order the server saw them, a release wakes
//! only the next one, and a priority reservation ("I go next") cannot be jumped.
//!
//! - [`keys`]: the key layout (`baton:fair:{K}`, `…:queue`, `…:alive`, `…:reserved`, …).
//! - [`options`]: [`FairOptions`] (validated, serde).
//! - [`FairLocks`]: the handle ([`Client::fair_locks`](crate::Client::fair_locks)):
//!   [`FairLocks::acquire`], [`FairLocks::reserve`].
//! - [`FairGuard`]: the held lock (token, fencing token, lease deadline, `release`, `extend`,
//!   the watchdog and its loss signal), as the mutex's guard.
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
//!   a runtime) is evicted by the next script after its timeout, so it delays the queue by at
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

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::redis::{Subscription, Transport};
use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::fair::queue::{self as kernel, Enqueue, QueueKeys, Turn};
use crate::lease::held::HeldLock;
use crate::util::backoff::Backoff;
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

    fn keys(&self, key: &str) -> Result<Arc<QueueKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        Ok(Arc::new(keys::fair_keys(&self.prefix, key)))
    }

    /// Takes fair lock `key` for `ttl`, queueing behind earlier waiters.
    ///
    /// The first try grants at once when the lock is free, nobody queues and nobody reserved
    /// it. Otherwise this waiter is queued (in the server's order), subscribes to its own wake
    /// channel, tries once more (a release in between is not missed), and then sleeps until
    /// woken by a release (only the head is), until its liveness refresh (a third of
    /// [`FairOptions::waiter_timeout`]), or, as the head, until the holder's lease or a
    /// reservation can run out. Transient errors are retried with backoff within the same
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
    ) -> Result<FairGuard, Error> {
        let keys = self.keys(key)?;
        options::validate_ttl(ttl)?;
        self.wait_turn(keys, key, new_token(), ttl, opts, None)
            .await
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
        let mut pending = Reservation {
            armed: Some(self.transport()?.clone()),
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
                pending.armed = None;
                Err(Error::Reserved {
                    key: keys.reserved.clone(),
                    reason: "another contender holds the priority reservation".into(),
                })
            }
            Err(e) => {
                if !e.is_indeterminate() {
                    pending.armed = None;
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
        opts: &FairOptions,
        lifetime: Option<Duration>,
    ) -> Result<FairGuard, Error> {
        // Armed for the whole wait: any exit but a grant (an error, the bound, a dropped
        // future) leaves the queue, releases a lock a lost reply may have granted, and drops
        // the reservation, through a task of the client.
        let mut queued = Queued {
            transport: Some(self.transport()?.clone()),
            keys: keys.clone(),
            id: id.clone(),
        };
        let reserver = lifetime.is_some();
        let liveness = lifetime.unwrap_or(opts.waiter_timeout);
        // Refresh a third of the way, so two refreshes may fail and a third still lands.
        let refresh = (liveness / 3).max(Duration::from_millis(1));
        let start = Instant::now();
        let give_up = opts.wait.map(|w| after(start, w));
        let mut backoff = Backoff::new(opts.max_backoff);
        let mut sub: Option<Subscription> = None;
        let mut tries: u32 = 0;
        loop {
            // Wakes that arrived before this try are answered by it.
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
                    tracing::info!(key, token = short(&id), fence, tries, "fair lock acquired");
                    let mut guard = FairGuard {
                        held: Some(HeldLock::new(
                            Backend::Redis(self.transport()?.clone()),
                            keys,
                            key,
                            id,
                            fence,
                            ttl,
                            sent,
                        )),
                    };
                    if opts.watchdog {
                        guard.start_watchdog(opts.max_hold);
                    }
                    return Ok(guard);
                }
                Ok(Turn::ReservationGone) => {
                    return Err(Error::Reserved {
                        key: keys.reserved.clone(),
                        reason: "this reservation ended (its lifetime ran out, or another \
                                 contender reserved after it) before the lock was granted to it"
                            .into(),
                    })
                }
                Ok(Turn::Waiting {
                    pttl,
                    rank,
                    reserved,
                }) => {
                    backoff.reset();
                    if sub.is_none() {
                        // Best effort: without pub/sub we still wake on our timers.
                        let limit = self.transport()?.settings.connect_timeout;
                        let channel = keys.wake(&id);
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(limit, self.transport()?.hub.subscribe(&channel))
                                .await
                        {
                            sub = Some(s);
                            // A release between the try above and the subscription published
                            // to nobody: try again now that we listen.
                            continue;
                        }
                    }
                    (waiting_nap(refresh, reserver, pttl, rank, reserved), None)
                }
                Err(e) if e.is_retryable() => {
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
                        sub = None;
                    }
                }
                None => tokio::time::sleep(nap).await,
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

/// Leaves the queue by id, through a task of the client, unless disarmed (by a grant).
struct Queued {
    transport: Option<Arc<Transport>>,
    keys: Arc<QueueKeys>,
    id: String,
}

impl Queued {
    fn disarm(&mut self) {
        self.transport = None;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(t) = self.transport.take() {
            leave_in_background(&t, &self.keys, std::mem::take(&mut self.id));
        }
    }
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
    /// Set while the reservation is this value's to give up.
    armed: Option<Arc<Transport>>,
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
    pub async fn acquire(mut self, ttl: Duration, opts: &FairOptions) -> Result<FairGuard, Error> {
        options::validate_ttl(ttl)?;
        // From here the wait's own leave-on-exit covers the reservation (same id).
        self.armed = None;
        let keys = self.keys.clone();
        let id = std::mem::take(&mut self.token);
        self.locks
            .wait_turn(keys, &self.key, id, ttl, opts, Some(self.lifetime))
            .await
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(t) = self.armed.take() {
            leave_in_background(&t, &self.keys, std::mem::take(&mut self.token));
        }
    }
}

/// A held fair lock. Release it with [`FairGuard::release`] (which wakes the next waiter);
/// dropping it releases in the background.
///
/// The fencing token ([`FairGuard::fencing_token`]) is what the protected resource should
/// check: a lease alone cannot stop a paused holder from writing after its lease ended.
pub struct FairGuard {
    held: Option<Held>,
}

type Held = HeldLock<QueueKeys>;

impl std::fmt::Debug for FairGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the full token: it is what a holder proves itself with.
        let mut d = f.debug_struct("FairGuard");
        if let Some(h) = &self.held {
            d.field("key", &h.key)
                .field("token", &short(&h.token))
                .field("fencing_token", &h.fence);
        }
        d.finish_non_exhaustive()
    }
}

impl FairGuard {
    // `held` is `Some` for the guard's whole life: only `release(self)` and `Drop` take it.
    fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }

    /// The lock's name, as given to acquire.
    pub fn key(&self) -> &str {
        self.held().map(|h| h.key.as_str()).unwrap_or_default()
    }

    /// This holder's random 128-bit token (hex), as stored in the lock key.
    pub fn token(&self) -> &str {
        self.held().map(|h| h.token.as_str()).unwrap_or_default()
    }

    /// The fencing token of this grant: larger than any earlier grant's on the same lock name.
    pub fn fencing_token(&self) -> u64 {
        self.held().map(|h| h.fence).unwrap_or_default()
    }

    /// When the lease can end at the earliest, on this host's monotonic clock: send time of the
    /// granting (or last confirmed extending) request + ttl − max(1 %, 2 ms).
    pub fn lease_deadline(&self) -> Instant {
        self.held()
            .map(|h| h.state.deadline())
            .unwrap_or_else(Instant::now)
    }

    /// The loss signal as a token: cancelled when an extension found another token, when the
    /// watchdog could not confirm an extension before [`FairGuard::lease_deadline`], or at the
    /// watchdog's hold cap. Without the watchdog it only fires on a refused extension.
    pub fn lost_token(&self) -> CancellationToken {
        self.held()
            .map(|h| h.state.lost().clone())
            .unwrap_or_default()
    }

    /// Resolves when the loss signal fires (see [`FairGuard::lost_token`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        if let Some(h) = self.held() {
            h.state.lost().cancelled().await;
        }
    }

    /// Why the loss signal fired, once it did.
    pub fn loss_reason(&self) -> Option<String> {
        self.held().and_then(|h| h.state.reason())
    }

    /// Starts the watchdog (once; later calls do nothing): it extends the lock every `ttl / 3`
    /// and fires the loss signal as [`FairGuard::lost_token`] describes. With `max_hold`, it
    /// stops extending once the lock was held that long and fires the loss signal then.
    pub fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        if let Some(h) = self.held.as_mut() {
            h.start_watchdog(max_hold);
        }
    }

    /// Extends the lock to `ttl` from now if it still holds this guard's token. `Ok(false)`: it
    /// was no longer ours; nothing was written, and the loss signal fires.
    ///
    /// # Errors
    /// [`Error::Config`] for a ttl outside 10 ms ..= 1 day; [`Error::Timeout`] (the extension
    /// may or may not have applied; the deadline does not move) and connection errors.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped extension leaves the deadline where it was.
    pub async fn extend(&mut self, ttl: Duration) -> Result<bool, Error> {
        options::validate_ttl(ttl)?;
        match self.held.as_mut() {
            Some(h) => h.extend(ttl).await,
            None => Ok(false),
        }
    }

    /// Releases the lock if it still holds this guard's token and wakes the next waiter (the
    /// reserver, else the queue's live head), in one script. `Ok(false)`: it was no longer
    /// ours; nothing was deleted.
    ///
    /// # Errors
    /// [`Error::Timeout`] and connection errors: the release may or may not have applied; the
    /// lock's ttl is the backstop.
    ///
    /// # Cancel safety
    /// Dropping the future after the guard was moved in leaves the outcome unknown; the ttl is
    /// the backstop.
    pub async fn release(mut self) -> Result<bool, Error> {
        let Some(h) = self.held.take() else {
            return Ok(false);
        };
        h.stop_watchdog();
        let transport = h
            .backend
            .redis("the fair lock", "it exists on Redis only")?;
        let mut conn = transport.node(&h.keys.lock).await?.conn();
        let limit = after(Instant::now(), transport.settings.response_timeout);
        let ours = kernel::leave(&mut conn, &h.keys, &h.token, limit).await?;
        tracing::info!(key = %h.key, token = short(&h.token), ours, "fair lock released");
        Ok(ours)
    }
}

impl Drop for FairGuard {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            h.stop_watchdog();
            if let Ok(t) = h.backend.redis("the fair lock", "it exists on Redis only") {
                leave_in_background(t, &h.keys, h.token);
            }
        }
    }
}
