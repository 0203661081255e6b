//! What every lock grant shares, whichever backend stores it: the request and answer types of
//! the lock store (defined in the leaves, `util::lock_replies`, and named here by the lease
//! kernel's users), how long a fence outlives its lock ([`fence_ttl`]), and the one decision
//! after an acquisition ([`orphaned`]: may it have left a lock nobody knows it holds?).
//!
//! The lock store's operations are methods of the store seam's `Backend` (`backend::locks`);
//! their wire forms (the fenced scripts on Redis, the lock row's statements on PostgreSQL) live
//! in each backend's folder.

use crate::error::Error;

// What a lock store answers and is asked, defined in the leaves so a backend can build it (see
// there).
pub(crate) use crate::util::lock_replies::{fence_ttl, Acquire, Stored};
pub use crate::util::lock_replies::{FencedValue, FencedWrite, Grant};

/// Whether an acquisition's outcome may have left a lock nobody knows it holds, so it must be
/// released by token: only a reply lost in a way that may have applied (a timeout, a broken
/// connection). A grant is the guard's to release; contention and refusals wrote nothing.
/// Shared by the mutex and the model checker.
pub fn orphaned(outcome: &Result<Grant, Error>) -> bool {
    matches!(outcome, Err(e) if e.is_indeterminate())
}
