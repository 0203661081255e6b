//! Leaves shared by every layer: backoff, deadline arithmetic, tokens, and the mailbox that
//! carries events, holder commands and wake-ups, and Redis Cluster's slot function. Nothing here
//! talks to Redis or knows a primitive; the types that cross the store seams are here, since
//! both the primitives and the backends name them.

pub(crate) mod backoff;
pub(crate) mod drop_guard;
pub(crate) mod durability;
pub(crate) mod inspect;
// What the failover coordinator's job store holds and answers; built by the backends' job
// stores. `pub` for `model_api` only (through `failover::protocol`), as `lock_replies` is.
#[cfg_attr(feature = "model", allow(missing_docs))]
pub(crate) mod jobs;
// What crosses the fair line's store seam (`backend::fair`).
pub(crate) mod fair_line;
// What crosses the lock store's seam (`backend::locks`); read by the lease kernel, built by the
// backends' lock stores. `pub` for `model_api` only, as the lease kernel's decisions are (see
// `lib.rs`).
#[cfg_attr(feature = "model", allow(missing_docs))]
pub(crate) mod lock_replies;
pub(crate) mod mailbox;
// The metric names, labels and per-event helpers (the library records, never installs).
pub(crate) mod metrics;
pub(crate) mod names;
pub(crate) mod parked;
pub(crate) mod permits;
pub(crate) mod pubsub;
// What crosses run-or-enqueue's store seam (`backend::queue`).
pub(crate) mod queue_items;
pub(crate) mod redact;
// What crosses the read-write lock's seam (`backend::rwlocks`).
pub(crate) mod rw_replies;
// What crosses the schedule record's seam (`backend::schedules`), and the record's public types.
pub(crate) mod schedule_record;
pub(crate) mod settings;
// Used by the cluster routing and the cluster test fixture.
#[cfg_attr(not(any(feature = "cluster", feature = "testing")), allow(dead_code))]
pub(crate) mod slot;
pub(crate) mod time;
// TLS material and rustls setup, for both backends (`rediss://`, `sslmode=require`).
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod token;
pub(crate) mod wake;

/// What a panic said, for a report: its message when it was a string.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into());
    format!("the work panicked: {text}")
}

/// Locks a std mutex, ignoring poisoning: the data behind these mutexes (an `Option`) stays
/// consistent even if a panic happened while it was held.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
