//! [`LeaseGuard`]: what every held lease answers, whichever primitive granted it, so code that
//! only needs "a lock I hold" (stop when it is lost, extend it, release it) is written once.
//!
//! Implemented by [`LockGuard`](crate::LockGuard) (the mutex and the fair lock) and
//! [`RedlockGuard`](crate::RedlockGuard). The fencing primitives add [`Fenced`]. Sealed: the
//! guarantees behind these methods (an early deadline, a loss signal that fires on its own
//! timer) are baton's to keep, so no type outside the crate implements them.
//!
//! An [`AdvisoryGuard`](crate::AdvisoryGuard) is not a lease: a PostgreSQL advisory lock lives
//! as long as its session, with no deadline and nothing to extend, so it has the loss and
//! release methods with the same names but not this trait.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

pub(crate) mod sealed {
    /// Only baton's guards implement [`LeaseGuard`](super::LeaseGuard).
    pub trait Sealed {
        /// The fencing token, for the errors that report a lost lease (`None`: the primitive
        /// has none).
        fn fence_of(&self) -> Option<u64>;
    }
}

/// A held lease: the same accessors on every lease-holding primitive's guard.
///
/// Each guard also has these as inherent methods (no import needed); the trait is for code
/// generic over the primitive:
///
/// ```no_run
/// use baton::LeaseGuard;
///
/// async fn work_while_held(guard: impl LeaseGuard) -> Result<bool, baton::Error> {
///     tokio::select! {
///         _ = guard.lost() => {}
///         _ = tokio::time::sleep_until(guard.lease_deadline()) => {}
///     }
///     guard.release().await
/// }
/// ```
pub trait LeaseGuard: sealed::Sealed + Send + Sync {
    /// The lock's name, as given to acquire.
    fn key(&self) -> &str;

    /// When the lease can end at the earliest, on this host's monotonic clock (it errs early,
    /// never late). Moves with each confirmed extension.
    fn lease_deadline(&self) -> Instant;

    /// Resolves when the loss signal fires (see [`LeaseGuard::lost_token`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    fn lost(&self) -> impl Future<Output = ()> + Send + '_;

    /// The loss signal as a token: cancelled when an extension found the lease held by someone
    /// else or gone, when the watchdog could not confirm an extension before
    /// [`LeaseGuard::lease_deadline`], or at the watchdog's hold cap. Without the watchdog it
    /// only fires on a refused extension: watch the deadline yourself.
    fn lost_token(&self) -> CancellationToken;

    /// Why the loss signal fired, once it did.
    fn loss_reason(&self) -> Option<String>;

    /// Whether the loss signal fired.
    fn is_lost(&self) -> bool;

    /// Extends the lease to `ttl` from now if it is still this guard's. `Ok(false)`: it was no
    /// longer ours; nothing was written, and the loss signal fires (or, for Redlock, the round
    /// was too slow to leave validity).
    ///
    /// # Errors
    /// [`Error::Config`] for a ttl outside 10 ms ..= 1 day; timeouts and connection errors (the
    /// deadline does not move).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped extension leaves the deadline where it was.
    fn extend(&mut self, ttl: Duration) -> impl Future<Output = Result<bool, Error>> + Send;

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
    /// and fires the loss signal as [`LeaseGuard::lost_token`] describes. With `max_hold`, it
    /// stops extending once the lease was held that long and fires the loss signal then.
    fn start_watchdog(&mut self, max_hold: Option<Duration>);
}

/// A held lease with a fencing token: the mutex's and the fair lock's guards. (Redlock has
/// none: see [`RedlockGuard`](crate::RedlockGuard).)
pub trait Fenced: LeaseGuard {
    /// The fencing token of this grant: larger than any earlier grant's on the same lock name.
    /// Pass it to the resource you write to and let it reject smaller ones.
    fn fencing_token(&self) -> u64;
}
