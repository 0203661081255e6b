//! What crosses the fair line's store seam (`backend::fair`): the keys of one fair lock
//! ([`QueueKeys`]), an acquire-or-enqueue's request ([`Enqueue`]) and what it found ([`Turn`]).
//! Leaves, below the backends, because both sides name them: the fair lock builds the keys and
//! the requests and reads the turns, and the Redis backend's scripts read and build them.

use std::time::Duration;

use tokio::time::Instant;

/// The keys of one queued lock (all with the same `{K}` hash tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueKeys {
    /// The lock: the holder's id, with the lock's TTL.
    pub lock: String,
    /// The last fencing token granted.
    pub fence: String,
    /// Waiter ids by arrival (a sorted set).
    pub queue: String,
    /// Waiter ids by the server time (ms) at which they count as dead (a sorted set).
    pub alive: String,
    /// The priority reservation: the reserver's id, with the reservation's lifetime.
    pub reserved: String,
    /// A waiter's wake channel is this followed by its channel name (see `util::parked`), or
    /// by its id when the id has no `.`.
    pub wake_prefix: String,
}

impl QueueKeys {
    /// The wake channel named `id` (a channel name, or a waiter id without `.`).
    pub(crate) fn wake(&self, id: &str) -> String {
        format!("{}{id}", self.wake_prefix)
    }

    /// The channel on which a force release tells the holder its grant was taken
    /// (`taken:<fencing token>`), which its watchdog listens on.
    pub(crate) fn taken_channel(&self) -> String {
        format!("{}:taken", self.lock)
    }
}

/// What one acquire-or-enqueue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Granted, with this fencing token; `sent` is when the request left.
    Granted { fence: u64, sent: Instant },
    /// Not granted; the caller is queued (or, for the reserver, still holds its reservation).
    Waiting {
        /// The lock's PTTL (`None`: free, or no TTL).
        pttl: Option<Duration>,
        /// The caller's 0-based place in the queue (`None` for the reserver).
        rank: Option<u64>,
        /// The PTTL of a reservation (`None`: none).
        reserved: Option<Duration>,
    },
    /// The caller's reservation is gone (it expired, or was taken over): it cannot go next.
    ReservationGone,
}

/// One acquire-or-enqueue's inputs.
pub(crate) struct Enqueue<'a> {
    /// The waiter's id (also the lock token it is granted with).
    pub id: &'a str,
    /// The lock's TTL.
    pub ttl: Duration,
    /// How long the waiter counts as alive after this call (for the reserver: the
    /// reservation's lifetime, renewed).
    pub liveness: Duration,
    /// Whether the caller is the reserver.
    pub reserver: bool,
}
