//! What crosses the lock store's seam (`backend::locks`), whichever backend holds the lock: an
//! acquisition's request ([`Acquire`], [`ReplicaWait`]) and its [`Grant`], a read's [`Stored`]
//! lock, an extension's request ([`Extend`]) and its [`Extension`], a fenced resource's [`FencedWrite`] and [`FencedValue`],
//! and how long a fence outlives its lock ([`fence_ttl`]).
//!
//! They are leaves, below the backends, because both sides name them: the lease kernel and the
//! primitives build requests and read answers, and each backend's lock store (the Redis scripts
//! of `backend::redis::locks`, the lock row's statements of `backend::postgres::locks`) reads
//! the requests and builds the answers, and may not import the lease kernel above it. The lease
//! kernel re-exports them where its users name them (`lease::lock::{Grant, Stored, Acquire, …}`,
//! `lease::Extension`).

use std::time::Duration;

use tokio::time::Instant;

/// One acquisition's inputs.
pub(crate) struct Acquire<'a> {
    /// The lock key.
    pub lock: &'a str,
    /// Its fence key (same hash slot).
    pub fence: &'a str,
    /// This holder's random token.
    pub token: &'a str,
    /// The lock's TTL.
    pub ttl: Duration,
}

/// How long the fence outlives a lock: long enough that a holder's successor normally finds
/// it (so tokens step by one), at least two leases. When it does expire, server time takes
/// over and the next token is still larger.
pub(crate) fn fence_ttl(ttl: Duration) -> Duration {
    (ttl.saturating_mul(2)).max(Duration::from_secs(24 * 3600))
}

// `WAIT replicas timeout` after a write: a connection setting, shared with the job store.
pub(crate) use super::settings::ReplicaWait;

/// The keys of a lock an operation may carry past its caller's frame (on Redis it may leave
/// later, grouped with other tasks' calls to the node).
pub(crate) trait BatchKeys: Send + Sync + 'static {
    /// The lock key.
    fn lock(&self) -> &str;
    /// The fence key (same hash slot); unused by a release.
    fn fence(&self) -> &str;
    /// The channel a release publishes `released` on.
    fn channel(&self) -> &str;
}

/// What an acquisition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Ours, with this fencing token; `sent` is when the request left (the lease's deadline
    /// counts from it).
    Granted { fence: u64, sent: Instant },
    /// Held by someone else; the lock's PTTL (`None` if it has no TTL or vanished meanwhile).
    Held { pttl: Option<Duration> },
}

/// A lock as stored, read in one round trip (`Backend::read`: a `MULTI` of reads on Redis, the
/// lock row on PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// The holder's value (`None`: free).
    pub value: Option<String>,
    /// The last fencing token granted, as stored (`None`: never granted, or the fence is gone).
    pub fence: Option<String>,
    /// The lease's remaining time (`None`: free, or a value without expiry).
    pub pttl: Option<Duration>,
}

/// One lease extension's inputs.
pub(crate) struct Extend<'a> {
    /// The lease key.
    pub lease: &'a str,
    /// The value this holder wrote to it.
    pub value: &'a str,
    /// The lease's TTL.
    pub ttl: Duration,
    /// A key that must hold `guard_value` too (pass the lease itself when there is none).
    pub guard: &'a str,
    /// What `guard` must hold.
    pub guard_value: &'a str,
    /// Keys whose TTL is refreshed to `retention` with the extension (the guard among them if
    /// it should be).
    pub refresh: &'a [&'a str],
    /// Their TTL.
    pub retention: Duration,
}

/// What an extension found.
#[derive(Debug)]
pub enum Extension {
    /// Extended; `sent` is when the request left (the new lease's deadline counts from it).
    Confirmed { sent: Instant },
    /// Not ours any more (held by another, or gone); nothing was written.
    Refused,
}

/// What a fenced write did. Serializes as `{"outcome":"written"}` or
/// `{"outcome":"rejected","highest":17}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FencedWrite {
    /// Written: the token was at least the highest the resource had seen.
    Written,
    /// Refused, nothing changed: the resource had seen `highest`, above the writer's token (a
    /// stale holder: someone acquired the lock after it).
    Rejected {
        /// The highest fencing token the resource has accepted.
        highest: u64,
    },
}

/// What a fenced resource holds: the last value written and the fencing token it was written
/// with (see [`Locks::read_fenced`](crate::Locks::read_fenced)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct FencedValue {
    /// The value, as written.
    pub value: Vec<u8>,
    /// The fencing token of the write that stored it: the highest the resource has accepted.
    pub fencing_token: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_outlives_the_lock() {
        assert_eq!(
            fence_ttl(Duration::from_secs(1)),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            fence_ttl(Duration::from_secs(86_400)),
            Duration::from_secs(172_800)
        );
    }

    #[test]
    fn fenced_writes_serialize_with_their_outcome() {
        assert_eq!(
            serde_json::to_string(&FencedWrite::Rejected { highest: 17 }).unwrap(),
            r#"{"outcome":"rejected","highest":17}"#
        );
        assert_eq!(
            serde_json::to_string(&FencedWrite::Written).unwrap(),
            r#"{"outcome":"written"}"#
        );
    }
}
