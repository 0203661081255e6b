//! The one acquisition engine of the lock-shaped primitives (the mutex, the fair lock, Redlock,
//! the advisory lock): each says how to make **one try** ([`TryAcquire::try_once`]) and, if it
//! has one, which channel announces a release; the engine owns the wait loop around it
//! ([`acquire`]: backoff with full jitter, wake-one waiting, the `wait` and `max_tries` bounds,
//! retrying transient errors) and [`with_lock`] on top, so the four primitives are short callers
//! and keep one meaning for each option.
//!
//! The shape follows tokio's locks over one `batch_semaphore` and DistributedLock's one
//! required `TryAcquire`: what differs between primitives is the try and the channel, never the
//! loop. A primitive with its own waiting rule (the fair lock sleeps until its queue refresh,
//! not a backoff) overrides [`TryAcquire::held_nap`]; one whose failures are not worth retrying
//! (Redlock's quorum rounds, the advisory lock's server-side wait) overrides
//! [`TryAcquire::retries`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;
use crate::lease::guard::LeaseGuard;
use crate::lease::options::LockOptions;
use crate::util::backoff::Backoff;
use crate::util::time::after;

/// What one try found.
pub(crate) enum Tried<G> {
    /// The lock is ours.
    Granted(G),
    /// Held by someone else (or, for the fair lock, by the queue ahead): try again later. The
    /// holder's remaining lease when the try learned it: a crashed holder publishes nothing,
    /// so no wait outlasts it.
    Held { remaining: Option<Duration> },
}

/// The channel a waiter listens on between tries: a release (or the holder's leave) arrives
/// there, so the next try is made at once instead of after the nap.
pub(crate) trait WaitChannel: Send {
    /// A wake taken by this waiter; [`WaitChannel::used`] once the try it prompted was made
    /// (a wake dropped unused is passed on to another waiter, where the channel does that).
    type Wake: Send;

    /// A wake that arrived while this waiter was trying (answered by the coming try).
    fn take_stored(&mut self) -> Option<Self::Wake>;

    /// Whether the channel is gone for good (the client shut down): waiting would only time out.
    fn closed(&self) -> bool;

    /// Waits at most `nap` (and not past `until`) for a wake.
    fn wait(
        &mut self,
        nap: Duration,
        until: Option<Instant>,
    ) -> impl Future<Output = Option<Self::Wake>> + Send;

    /// The try a wake prompted was made.
    fn used(wake: Self::Wake);

    /// A grant others waiting may share was made: leave, waking the next local waiter.
    /// Defaults to leaving (channels without an order of waiters).
    fn wake_next(self)
    where
        Self: Sized,
    {
    }
}

/// No channel: the primitive polls on its timer (Redlock; the advisory lock's server waits).
pub(crate) enum NoChannel {}

impl WaitChannel for NoChannel {
    type Wake = NoChannel;
    fn take_stored(&mut self) -> Option<NoChannel> {
        match *self {}
    }
    fn closed(&self) -> bool {
        match *self {}
    }
    #[allow(clippy::manual_async_fn)] // `impl Future + Send` as the trait asks.
    fn wait(
        &mut self,
        _: Duration,
        _: Option<Instant>,
    ) -> impl Future<Output = Option<NoChannel>> + Send {
        async move { match *self {} }
    }
    fn used(wake: NoChannel) {
        match wake {}
    }
}

/// One lock-shaped primitive's acquisition, as the engine drives it. The only required method
/// is [`TryAcquire::try_once`]; the others say how this primitive waits between tries.
pub(crate) trait TryAcquire: Send {
    /// What a grant returns.
    type Guard: Send;
    /// Where releases are announced ([`NoChannel`] for none).
    type Channel: WaitChannel;

    /// One try. `takeover`: the wait before it slept out the holder's remaining lease with no
    /// release heard, so a grant now takes over an expired lease (for the metrics). `asked`:
    /// when the caller asked. A try that may have taken the lock and then failed gives it back
    /// itself (by token, in the background).
    fn try_once(
        &mut self,
        takeover: bool,
        asked: Instant,
    ) -> impl Future<Output = Result<Tried<Self::Guard>, Error>> + Send;

    /// A channel at hand before the first try, and whether to wait behind the waiters already
    /// on it before trying (the mutex: within one client the lock goes round in the order its
    /// tasks asked). Defaults to none.
    fn waiting(&mut self) -> (Option<Self::Channel>, bool) {
        (None, false)
    }

    /// Subscribes to the channel after a try found the lock held (best effort: `None` leaves
    /// the waiter polling on its timers). When it succeeds the engine tries again at once, since
    /// a release between that try and the subscription was announced to nobody. Defaults to
    /// none.
    fn subscribe(&mut self) -> impl Future<Output = Option<Self::Channel>> + Send {
        async { None }
    }

    /// Asked after each refused try made from a line joined by [`TryAcquire::waiting`]:
    /// whether to leave that line now and [`TryAcquire::subscribe`] to another (a read-write
    /// lock's writer queues behind the local readers for its first try, then waits in the
    /// writers' line). Defaults to no.
    fn leave_first_line(&mut self) -> bool {
        false
    }

    /// Whether a grant may be shared with other waiters (a read): the engine then wakes the
    /// next local waiter at once, which would otherwise wait for a release. Defaults to no.
    fn shared(&self) -> bool {
        false
    }

    /// How long to sleep after a try found the lock held (unless a wake comes first): by
    /// default the next backoff delay, not past the holder's `remaining` lease.
    fn held_nap(&mut self, remaining: Option<Duration>, backoff: &mut Backoff) -> Duration {
        let nap = backoff.next_delay();
        match remaining {
            Some(p) => nap.min(p.max(Duration::from_millis(1))),
            None => nap,
        }
    }

    /// How long to sleep after a transient error. Defaults to the next backoff delay.
    fn error_nap(&mut self, backoff: &mut Backoff) -> Duration {
        backoff.next_delay()
    }

    /// Whether a failed try is retried within the bounds (as contention is) rather than
    /// returned. Defaults to [`Error::is_retryable`].
    fn retries(&self, e: &Error) -> bool {
        e.is_retryable()
    }
}

/// Takes the lock `key` through `acq`, waiting as `opts` says: tries, and while the lock is
/// held sleeps [`TryAcquire::held_nap`] (a backoff with full jitter capped by `max_backoff` and
/// the holder's remaining lease), woken early by a release on the primitive's channel. Gives up
/// after `max_tries` tries or `wait`.
///
/// # Errors
/// [`Error::NotAcquired`] when a bound ran out with the lock held elsewhere; the last retried
/// error when a bound ran out on one; other errors at once.
pub(crate) async fn acquire<A: TryAcquire>(
    acq: &mut A,
    key: &str,
    opts: &LockOptions,
) -> Result<A::Guard, Error> {
    let start = Instant::now();
    let give_up = opts.wait.map(|w| after(start, w));
    let mut backoff = Backoff::new(opts.max_backoff());
    let (mut channel, mut queued) = acq.waiting();
    queued &= channel.is_some();
    // The wake that prompted the coming try, passed on if this future is dropped first.
    let mut woken: Option<<A::Channel as WaitChannel>::Wake> = None;
    let mut tries: u32 = 0;
    // Whether the last wait slept out the holder's remaining lease with no release heard.
    let mut slept_out = false;
    let bound_hit = |tries: u32, now: Instant| {
        opts.max_tries.is_some_and(|m| tries >= m) || give_up.is_some_and(|g| now >= g)
    };
    loop {
        // A release that arrived while nobody waited says nothing this try will not see.
        if let Some(stored) = channel.as_mut().and_then(WaitChannel::take_stored) {
            match woken {
                None => woken = Some(stored),
                Some(_) => A::Channel::used(stored),
            }
        }
        if std::mem::take(&mut queued) && woken.is_none() {
            if let Some(waiters) = channel.as_mut() {
                // Its turn comes as a wake; the nap bounds the wait as after a failed try (a
                // lease that runs out publishes nothing).
                let mut nap = backoff.next_delay();
                if let Some(g) = give_up {
                    nap = nap.min(g.saturating_duration_since(Instant::now()));
                }
                tracing::trace!(key, "waiting for a release (behind this client's waiters)");
                woken = waiters.wait(nap, give_up).await;
            }
        }
        tries = tries.saturating_add(1);
        let outcome = acq.try_once(slept_out && woken.is_none(), start).await;
        if let Some(w) = woken.take() {
            A::Channel::used(w);
        }
        let remaining = match outcome {
            Ok(Tried::Granted(guard)) => {
                // Readers share: the next local waiter may get in beside this one, and no
                // release will announce it.
                if acq.shared() {
                    if let Some(c) = channel.take() {
                        c.wake_next();
                    }
                }
                return Ok(guard);
            }
            Ok(Tried::Held { remaining }) => remaining,
            // A transient failure (a reconnect, a restarting server, a lost reply, whose lock
            // the try gives back) is retried like contention, within the same bounds; when
            // they run out the error itself is returned, never `NotAcquired`, which means the
            // lock was held.
            Err(e) if acq.retries(&e) => {
                let now = Instant::now();
                if bound_hit(tries, now) {
                    return Err(e);
                }
                tracing::debug!(key, error = %e, "acquire failed; retrying");
                let mut wake = after(now, acq.error_nap(&mut backoff));
                if let Some(g) = give_up {
                    wake = wake.min(g);
                }
                tokio::time::sleep_until(wake).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if bound_hit(tries, now) {
            return Err(Error::NotAcquired {
                key: key.to_string(),
                tries,
                waited: now.saturating_duration_since(start),
            });
        }
        if channel.is_some() && acq.leave_first_line() {
            // Its membership ends with the drop; a kept wake is passed on.
            channel = None;
        }
        if channel.is_none() {
            if let Some(c) = acq.subscribe().await {
                channel = Some(c);
                // A release between the try above and the subscription would be missed: try
                // again at once now that we listen.
                continue;
            }
        }
        // Sleep, but not past our own bound.
        let mut nap = acq.held_nap(remaining, &mut backoff);
        if let Some(g) = give_up {
            nap = nap.min(g.saturating_duration_since(now));
        }
        slept_out = remaining.is_some_and(|p| nap >= p);
        match channel.as_mut() {
            // The client is shutting down: fall back to sleeping.
            Some(c) if c.closed() => {
                channel = None;
                tokio::time::sleep(nap).await;
            }
            Some(c) => {
                tracing::trace!(key, "waiting for a release");
                woken = c.wait(nap, give_up).await;
            }
            None => tokio::time::sleep(nap).await,
        }
    }
}

/// Runs `work` while `guard` holds its lease (the watchdog already started), then releases: the
/// one `with_lock` of every lease-holding primitive. `work` is called with the guard (to read
/// its fencing token, deadline or loss token into the future it returns), and that future is
/// dropped as soon as the loss signal fires (checked first, so a loss and a finish that arrive
/// together count as a loss).
///
/// # Errors
/// [`Error::LeaseLost`] when the loss signal fired during `work`, or when the release found the
/// lease no longer ours (mutual exclusion may then have been broken, so `work`'s output is not
/// returned). A release that fails on the network is only logged: `work` finished in time and
/// the lease ends by its ttl.
pub(crate) async fn with_lock<G, F, Fut>(guard: G, work: F) -> Result<Fut::Output, Error>
where
    G: LeaseGuard,
    F: FnOnce(&G) -> Fut,
    Fut: Future,
{
    let out = {
        let work = work(&guard);
        tokio::select! {
            biased;
            _ = guard.lost() => None,
            out = work => Some(out),
        }
    };
    let key = guard.key().to_string();
    let fence = crate::lease::guard::sealed::Sealed::core(&guard).fence();
    let reason = guard.loss_reason();
    match (out, guard.release().await) {
        (Some(out), Ok(true)) => Ok(out),
        (Some(out), Err(e)) => {
            tracing::warn!(key, error = %e, "release after the work failed; the lock expires by its lease");
            Ok(out)
        }
        (Some(_), Ok(false)) => Err(Error::lock_lost(
            key,
            fence,
            "the release found the lock held by another token",
        )),
        (None, _) => Err(Error::lock_lost(
            key,
            fence,
            reason.unwrap_or_else(|| "lost".into()),
        )),
    }
}

/// The mutex's channel: this client's waiters on one lock share a subscription, and a release
/// wakes one of them (see `util::wake`).
impl WaitChannel for crate::util::wake::WakeOne {
    type Wake = crate::util::wake::Woken;

    fn take_stored(&mut self) -> Option<Self::Wake> {
        crate::util::wake::WakeOne::take_stored(self)
    }

    fn closed(&self) -> bool {
        crate::util::wake::WakeOne::closed(self)
    }

    #[allow(clippy::manual_async_fn)] // `impl Future + Send` as the trait asks.
    fn wait(
        &mut self,
        nap: Duration,
        until: Option<Instant>,
    ) -> impl Future<Output = Option<Self::Wake>> + Send {
        async move { crate::util::wake::WakeOne::wait(self, nap, until).await }
    }

    fn used(wake: Self::Wake) {
        wake.used();
    }

    fn wake_next(self) {
        crate::util::wake::WakeOne::wake_next(self);
    }
}
