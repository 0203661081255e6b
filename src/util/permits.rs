//! What crosses the semaphore store seam (`backend::semaphores`): the request for one permit
//! and the store's answer. A leaf, so the seam's arms and the primitive name the same types.

use std::time::Duration;

use tokio::time::Instant;

/// The most permits a semaphore may have: its slots are read in one step, so they are bounded.
pub(crate) const MAX_SLOTS: u32 = 1024;

/// One try for a permit of a semaphore.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PermitRequest<'a> {
    /// The semaphore's record (its limit and its slots' fences); its hash tag routes the call.
    pub meta: &'a str,
    /// What every slot's key starts with: slot `i` is `slots` followed by `i`.
    pub slots: &'a str,
    /// The holder's random token, stored in the slot it is granted.
    pub token: &'a str,
    /// The permit's lease.
    pub ttl: Duration,
    /// The limit the caller gives; must match the stored one.
    pub limit: u32,
    /// The semaphore's line of fair waiters (Redis: a sorted set by arrival; PostgreSQL keeps
    /// it in a table keyed by `meta`), which every try respects: a permit goes to nobody else
    /// while a live waiter of the line is owed it.
    pub queue: &'a str,
    /// The line's liveness (Redis: a sorted set of each waiter's deadline).
    pub alive: &'a str,
    /// A fair waiter's place: its id in the line and how long the place lasts unrefreshed.
    /// `None`: a try outside the line.
    pub place: Option<(&'a str, Duration)>,
}

/// What one try for a permit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermitGrant {
    /// Slot `slot` is ours, with fencing token `fence`; `sent` is when the request left.
    Granted {
        slot: u32,
        fence: u64,
        sent: Instant,
    },
    /// As many permits as the limit are held; `pttl` is the shortest remaining lease among
    /// them, when known (no wait outlasts it: a crashed holder publishes nothing).
    Full { pttl: Option<Duration> },
    /// The semaphore is stored with another limit: nothing was written.
    Mismatch { stored: u32 },
}
