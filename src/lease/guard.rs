//! What every held lease answers, whichever primitive granted it, written once.
//!
//! - [`HeldLease`], the read side: the key, the lease deadline and the loss signal (`lost()`,
//!   `lost_token()`, `is_lost()`, `loss_reason()`). Implemented by every lease-holding type:
//!   [`LockGuard`](crate::LockGuard) (the mutex and the fair lock),
//!   [`RedlockGuard`](crate::RedlockGuard), the leader's [`Term`](crate::Term), the
//!   [`AdvisoryGuard`](crate::AdvisoryGuard) and the failover attempt's
//!   [`AttemptHandle`](crate::AttemptHandle). Every method has its one body here, over the
//!   held-lease core ([`LeaseCore`]) each of them keeps.
//! - [`Fenced`], the fencing token, on the types that have one (all but Redlock's guard).
//! - [`LeaseGuard`], the owner side on top (`extend`, `release`, `start_watchdog`), on the
//!   guards a user owns outright (the mutex's, the fair lock's and Redlock's).
//!
//! Sealed: the guarantees behind these methods (a deadline that errs early, a loss signal that
//! fires on its own timer) are baton's to keep, so no type outside the crate implements them.
//! Import them with `use baton::prelude::*;` (or by name from the crate root).

use std::future::Future;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::util::lock;

pub(crate) mod sealed {
    /// Only baton's lease-holding types implement [`HeldLease`](super::HeldLease).
    pub trait Sealed {
        /// The held-lease core every accessor reads.
        fn core(&self) -> &super::LeaseCore;
    }
}

/// A loss signal: set once, with the first reason given, and seen by a flag, `lost()` futures
/// and (made only when someone asks for one) a `CancellationToken`.
///
/// The token is made lazily: most guards are released without anyone holding their token, and
/// a token is a heap node of its own per guard. The flag and the `Notify` carry the signal
/// meanwhile. A signal [`linked`](Self::linked) to a parent token (the advisory guard's
/// connection) makes its token at once, as a child of that parent, so the parent's end fires it
/// without anyone calling [`fire`](Self::fire).
#[derive(Debug, Default)]
pub(crate) struct LossSignal {
    /// Set once, when the signal fires.
    lost: AtomicBool,
    /// Wakes the `wait` futures when the signal fires.
    fired: tokio::sync::Notify,
    /// The signal as a token, made on first request (cancelled at once if it already fired).
    token: OnceLock<CancellationToken>,
    /// Whether the token is a parent's child, cancelled from outside.
    linked: bool,
    reason: Mutex<Option<String>>,
    /// What [`reason`](Self::reason) says when a linked parent fired the signal before anyone
    /// recorded a reason.
    fallback: Option<&'static str>,
}

impl LossSignal {
    /// A signal nobody fired yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LossSignal::default())
    }

    /// A signal that also fires when `parent` is cancelled; `fallback` is its reason then,
    /// unless one was recorded.
    // Only the advisory lock (PostgreSQL) links its signal to its connection.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn linked(parent: &CancellationToken, fallback: &'static str) -> Arc<Self> {
        let token = OnceLock::new();
        let _ = token.set(parent.child_token());
        Arc::new(LossSignal {
            token,
            linked: true,
            fallback: Some(fallback),
            ..LossSignal::default()
        })
    }

    /// Fires the signal; `true` the first time (the reason is kept only then).
    pub(crate) fn fire(&self, reason: impl Into<String>) -> bool {
        let first = self.record(reason);
        self.lost.store(true, Ordering::SeqCst);
        // Pairs with the fence in `token`: either that side sees the flag, or this side sees
        // the token it made; never neither (a token that stays uncancelled).
        fence(Ordering::SeqCst);
        self.fired.notify_waiters();
        if let Some(t) = self.token.get() {
            t.cancel();
        }
        first
    }

    /// Records why the signal fired (or fires next) unless a reason was recorded before;
    /// `true` when this one was kept.
    pub(crate) fn record(&self, reason: impl Into<String>) -> bool {
        let mut r = lock(&self.reason);
        if r.is_some() {
            return false;
        }
        *r = Some(reason.into());
        true
    }

    /// The signal as a token (made now if nobody asked before).
    pub(crate) fn token(&self) -> CancellationToken {
        let t = self.token.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            t.cancel();
        }
        t.clone()
    }

    /// Whether the signal fired.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
            || (self.linked
                && self
                    .token
                    .get()
                    .is_some_and(CancellationToken::is_cancelled))
    }

    /// Resolves once the signal fired.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn wait(&self) {
        if self.linked {
            if let Some(t) = self.token.get() {
                return t.cancelled().await;
            }
        }
        loop {
            // Registered before the flag is read, so a `fire` in between still wakes it.
            let fired = self.fired.notified();
            tokio::pin!(fired);
            fired.as_mut().enable();
            if self.is_lost() {
                return;
            }
            fired.await;
        }
    }

    /// Why the signal fired, once it did.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.is_lost() {
            return None;
        }
        lock(&self.reason)
            .clone()
            .or_else(|| self.fallback.map(String::from))
    }
}

/// The deadline a held lease shows: moves forward with each confirmed extension; watchers (a
/// leader's renewal events, the CLI's guard process) see each move.
pub(crate) type DeadlineCell = Arc<tokio::sync::watch::Sender<Instant>>;

/// A new [`DeadlineCell`] at `at`.
pub(crate) fn deadline_cell(at: Instant) -> DeadlineCell {
    Arc::new(tokio::sync::watch::Sender::new(at))
}

/// Moves `cell` to `new` after a confirmed extension; never backwards, since replies of
/// concurrent extensions may arrive out of order.
pub(crate) fn confirm(cell: &DeadlineCell, new: Instant) {
    cell.send_if_modified(|d| {
        if new > *d {
            *d = new;
            true
        } else {
            false
        }
    });
}

/// The held-lease core: what every lease-holding type keeps and [`HeldLease`] reads. Cheap to
/// clone (its parts are shared with whoever extends the lease and fires its loss signal).
#[derive(Clone, Debug)]
pub struct LeaseCore {
    key: Arc<str>,
    fence: Option<u64>,
    deadline: DeadlineCell,
    loss: Arc<LossSignal>,
}

impl LeaseCore {
    /// The core of a lease on `key` with fencing token `fence`, whose deadline and loss
    /// signal are `deadline` and `loss` (shared with its keepalive).
    pub(crate) fn new(
        key: impl Into<Arc<str>>,
        fence: Option<u64>,
        deadline: DeadlineCell,
        loss: Arc<LossSignal>,
    ) -> Self {
        LeaseCore {
            key: key.into(),
            fence,
            deadline,
            loss,
        }
    }

    /// The loss signal.
    pub(crate) fn loss(&self) -> &Arc<LossSignal> {
        &self.loss
    }

    /// The fencing token, if the primitive has one.
    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }
}

/// A held lease, read side: the same accessors on every lease-holding type
/// ([`LockGuard`](crate::LockGuard) of the mutex and the fair lock,
/// [`RedlockGuard`](crate::RedlockGuard), the leader's [`Term`](crate::Term),
/// [`AdvisoryGuard`](crate::AdvisoryGuard), the failover attempt's
/// [`AttemptHandle`](crate::AttemptHandle) and [`Acquired`](crate::Acquired)). Written once,
/// so each answers the same way. Sealed: implemented by baton's types only.
///
/// ```no_run
/// use baton::prelude::*;
///
/// async fn work_while_held(guard: &impl HeldLease) {
///     tokio::select! {
///         _ = guard.lost() => eprintln!("lost: {:?}", guard.loss_reason()),
///         _ = tokio::time::sleep_until(guard.lease_deadline()) => {}
///     }
/// }
/// ```
pub trait HeldLease: sealed::Sealed + Send + Sync {
    /// The lease's name, as given to acquire (an advisory lock's key as text, a job's key, an
    /// election's key).
    fn key(&self) -> &str {
        &self.core().key
    }

    /// When the lease can end at the earliest, on this host's monotonic clock: the send time of
    /// the granting (or last confirmed extending) request + the lease − max(1 %, 2 ms). It errs
    /// early, never late, and moves with each confirmed extension. Each type's rustdoc says
    /// what it means there (a Redlock's validity; an advisory lock has none).
    fn lease_deadline(&self) -> Instant {
        *self.core().deadline.borrow()
    }

    /// Resolves when the loss signal fires (see [`HeldLease::lost_token`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.core().loss.wait()
    }

    /// The loss signal as a token: cancelled when the lease is lost or may be (each type's
    /// rustdoc says when: typically an extension found the lease held by someone else or gone,
    /// the keepalive could not confirm an extension before [`HeldLease::lease_deadline`], or
    /// its hold cap came). Hand it to the work (`token.run_until_cancelled(work)`).
    fn lost_token(&self) -> CancellationToken {
        self.core().loss.token()
    }

    /// Whether the loss signal fired.
    fn is_lost(&self) -> bool {
        self.core().loss.is_lost()
    }

    /// Why the loss signal fired, once it did.
    fn loss_reason(&self) -> Option<String> {
        self.core().loss.reason()
    }
}

/// A held lease with a fencing token: every lease-holding type but Redlock's guard.
///
/// A sub-trait rather than an `Option<u64>` on [`HeldLease`]: code that must pass a token to
/// the resource it writes asks for `impl Fenced`, and the compiler refuses a Redlock guard
/// (which has none: see [`RedlockGuard`](crate::RedlockGuard)) instead of a runtime `None`.
pub trait Fenced: HeldLease {
    /// The fencing token of this grant: larger than any earlier grant's on the same name.
    /// Pass it to the resource you write to and let it reject smaller ones.
    fn fencing_token(&self) -> u64 {
        // Only types with a fencing token implement `Fenced` (their core has `Some`).
        self.core().fence.unwrap_or_default()
    }
}

/// A held lease its owner extends and releases: the mutex's, the fair lock's and Redlock's
/// guards. The read side is [`HeldLease`].
///
/// ```no_run
/// use baton::prelude::*;
///
/// async fn work_while_held(guard: impl LeaseGuard) -> Result<bool, baton::Error> {
///     tokio::select! {
///         _ = guard.lost() => {}
///         _ = tokio::time::sleep_until(guard.lease_deadline()) => {}
///     }
///     guard.release().await
/// }
/// ```
pub trait LeaseGuard: HeldLease {
    /// Extends the lease to `lease` from now if it is still this guard's. `Ok(false)`: it was no
    /// longer ours; nothing was written, and the loss signal fires (or, for Redlock, the round
    /// was too slow to leave validity).
    ///
    /// # Errors
    /// [`Error::Config`] for a lease outside 10 ms ..= 1 day; timeouts and connection errors (the
    /// deadline does not move).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped extension leaves the deadline where it was.
    fn extend(&mut self, lease: Duration) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Releases the lease if it is still this guard's. `Ok(true)`: it was still ours (for
    /// Redlock: on a quorum of masters); `Ok(false)`: it was not, and nothing was deleted.
    ///
    /// # Errors
    /// Timeouts and connection errors: the release may or may not have applied; the lease's
    /// ttl is the backstop.
    ///
    /// # Cancel safety
    /// Dropping the future after the guard was moved in leaves the outcome unknown; the ttl is
    /// the backstop.
    fn release(self) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Starts the watchdog (once; later calls do nothing): it extends the lease every `ttl / 3`
    /// and fires the loss signal as [`HeldLease::lost_token`] describes. With `max_hold`, it
    /// stops extending once the lease was held that long and fires the loss signal then.
    fn start_watchdog(&mut self, max_hold: Option<Duration>);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_loss_signal_reaches_tokens_made_before_and_after_it_fired() {
        let s = LossSignal::new();
        let early = s.token();
        assert!(!s.is_lost() && !early.is_cancelled() && s.reason().is_none());
        assert!(s.fire("first"));
        assert!(!s.fire("second"));
        assert!(s.is_lost() && early.is_cancelled());
        assert!(
            s.token().is_cancelled(),
            "a token made after the loss is cancelled"
        );
        assert_eq!(s.reason().as_deref(), Some("first"));
        // Resolves at once once fired, and for a waiter registered before.
        s.wait().await;
        let s2 = LossSignal::new();
        let waiter = {
            let s2 = s2.clone();
            tokio::spawn(async move { s2.wait().await })
        };
        tokio::task::yield_now().await;
        s2.fire("late");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_linked_signal_fires_with_its_parent() {
        let parent = CancellationToken::new();
        let s = LossSignal::linked(&parent, "the parent ended");
        assert!(!s.is_lost());
        parent.cancel();
        assert!(s.is_lost() && s.token().is_cancelled());
        s.wait().await;
        assert_eq!(s.reason().as_deref(), Some("the parent ended"));
        // A reason recorded (late) wins over the fallback.
        let parent = CancellationToken::new();
        let s = LossSignal::linked(&parent, "fallback");
        parent.cancel();
        s.record("why");
        assert_eq!(s.reason().as_deref(), Some("why"));
    }
}
