//! What a lock store answers the lease kernel, whichever backend holds the lock: an
//! acquisition's [`Grant`], a read's [`Stored`] lock, an extension's [`Extension`].
//!
//! They are leaves, below the backends, because both sides name them: the lease kernel and the
//! primitives read them, and a backend's statements build them (the lock row's statements in
//! `backend::postgres::locks`), which may not import the lease kernel above them. The lease
//! kernel re-exports them where they were first defined (`lease::lock::{Grant, Stored}`,
//! `lease::Extension`).

use std::time::Duration;

use tokio::time::Instant;

/// What an acquisition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Ours, with this fencing token; `sent` is when the request left (the lease's deadline
    /// counts from it).
    Granted { fence: u64, sent: Instant },
    /// Held by someone else; the lock's PTTL (`None` if it has no TTL or vanished meanwhile).
    Held { pttl: Option<Duration> },
}

/// A lock as stored, read in one round trip (the Redis kernel's `lease::lock::read`, or the PostgreSQL row's read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// The holder's value (`None`: free).
    pub value: Option<String>,
    /// The last fencing token granted, as stored (`None`: never granted, or the fence is gone).
    pub fence: Option<String>,
    /// The lease's remaining time (`None`: free, or a value without expiry).
    pub pttl: Option<Duration>,
}

/// What an extension found.
#[derive(Debug)]
pub enum Extension {
    /// Extended; `sent` is when the request left (the new lease's deadline counts from it).
    Confirmed { sent: Instant },
    /// Not ours any more: what the guard, the lease and the lease's PTTL read.
    Refused {
        guard: redis::Value,
        lease: redis::Value,
        pttl: redis::Value,
    },
}
