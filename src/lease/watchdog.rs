//! The watchdog: keeps a lease alive while its holder works, and raises the loss signal when it
//! can no longer vouch for it.
//!
//! Timing, and why:
//! - It extends every `ttl / 3` counted from the *send time* of the last confirmed extension,
//!   so two extensions may fail in a row and a third still lands before the lease can end.
//! - The loss signal fires on its own timer at [`deadline`](super::deadline) of the last
//!   confirmed extension (send time + ttl − margin), never by waiting on a request: a server
//!   paused by `SIGSTOP` or a cut link leaves the request hanging, and the holder must hear of
//!   the loss before another process can be granted the lock. A stalled holder process is
//!   covered too: the timer is checked first (`biased`) when the process runs again.
//! - An extension that finds another token fires the signal at once.
//! - Transient errors (timeouts, reconnects, a loading server) are retried with backoff until
//!   the deadline; a non-retryable one (ACL, wrong type) fires the signal at once, since the
//!   lease cannot be kept.
//! - An optional cap on the total hold: extensions never reach past it, and the signal fires
//!   when it is reached.
//!
//! The task has one owner (the guard, through `stop`) and also ends with the client.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{deadline, Extend, Extension};
use crate::backend::{Backend, WeakBackend};
use crate::util::backoff::Backoff;
use crate::util::lock;

/// What a holder and its watchdog share: the lease's current deadline and the loss signal.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Moves forward with each confirmed extension; watchers (a leader's renewal events and its
    /// work's stop timer) see each move.
    deadline: tokio::sync::watch::Sender<Instant>,
    lost: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl LeaseState {
    pub(crate) fn new(deadline: Instant) -> Arc<Self> {
        Arc::new(LeaseState {
            deadline: tokio::sync::watch::Sender::new(deadline),
            lost: CancellationToken::new(),
            reason: Mutex::new(None),
        })
    }

    /// When the lease can end at the earliest, as this host measures it.
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// The deadline as it moves: changes with each confirmed extension.
    pub(crate) fn watch_deadline(&self) -> tokio::sync::watch::Receiver<Instant> {
        self.deadline.subscribe()
    }

    /// Moves the deadline (after a confirmed extension); never backwards, since replies of
    /// concurrent extensions may arrive out of order.
    pub(crate) fn confirmed(&self, new: Instant) {
        self.deadline.send_if_modified(|d| {
            if new > *d {
                *d = new;
                true
            } else {
                false
            }
        });
    }

    /// Fires the loss signal (once; the first reason is kept).
    pub(crate) fn lose(&self, reason: impl Into<String>) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() {
                *r = Some(reason.into());
            }
        }
        self.lost.cancel();
    }

    /// The loss signal.
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Why the loss signal fired, once it did.
    pub(crate) fn reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }
}

/// What the watchdog keeps alive.
pub(crate) struct Watch {
    /// The lease key.
    pub lease: String,
    /// The holder's value in it.
    pub value: String,
    /// The lease's TTL.
    pub ttl: Duration,
    /// When the request that granted (or last extended) the lease was sent.
    pub sent: Instant,
    /// Keys whose TTL is refreshed to `retention` with each extension.
    pub refresh: Vec<String>,
    /// Their TTL.
    pub retention: Duration,
    /// No extension reaches past this instant; the signal fires there.
    pub hold_until: Option<Instant>,
}

/// Starts the watchdog on the client's task tracker; it ends when `stop` fires (the owner
/// released), when the client shuts down (the loss signal fires: nobody extends any more), or
/// once it fired the loss signal.
pub(crate) fn spawn(
    backend: &Backend,
    watch: Watch,
    state: Arc<LeaseState>,
    stop: CancellationToken,
) {
    // Weakly (on Redis the router, not the transport): the watchdog must not keep the client
    // alive.
    let weak = backend.downgrade();
    let client_gone = backend.cancel().clone();
    let response = backend.response_timeout();
    backend.tracker().spawn(async move {
        tokio::select! {
            biased;
            _ = stop.cancelled() => {}
            _ = client_gone.cancelled() => state.lose("the client shut down; the lease is no longer extended"),
            _ = run(weak, watch, state.clone(), response) => {}
        }
    });
}

async fn run(backend: WeakBackend, watch: Watch, state: Arc<LeaseState>, response: Duration) {
    let interval = (watch.ttl / 3).max(Duration::from_millis(1));
    let refresh: Vec<&str> = watch.refresh.iter().map(String::as_str).collect();
    let mut backoff = Backoff::new(interval);
    // The next extension is due a third of a lease after the send time of the last confirmed
    // one; the deadline passed to `state` tracks that same send time.
    let mut due = crate::util::time::after(watch.sent, interval);
    loop {
        let end = state.deadline();
        if let Some(cap) = watch.hold_until {
            if Instant::now() >= cap {
                state.lose("held for the maximum hold time");
                return;
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(end) => {
                state.lose("no extension was confirmed before the lease could end");
                return;
            }
            _ = sleep_until_opt(watch.hold_until) => {
                state.lose("held for the maximum hold time");
                return;
            }
            _ = tokio::time::sleep_until(due) => {}
        }
        // Never extend past the cap: the last extension is shortened to end there.
        let ttl = match watch.hold_until {
            Some(cap) => watch.ttl.min(cap.saturating_duration_since(Instant::now())),
            None => watch.ttl,
        };
        if ttl < Duration::from_millis(1) {
            continue;
        }
        let req = Extend {
            lease: &watch.lease,
            value: &watch.value,
            ttl,
            guard: &watch.lease,
            guard_value: &watch.value,
            refresh: &refresh,
            retention: watch.retention,
        };
        // One request may take at most a response timeout, and never past the deadline (the
        // timer above must fire on time; `extend` gives up there too).
        let limit = crate::util::time::after(Instant::now(), response).min(end);
        let outcome = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(end) => {
                state.lose("no extension was confirmed before the lease could end");
                return;
            }
            r = backend.extend(&req, limit) => r,
        };
        match after_extension(&outcome) {
            WatchStep::Extended { sent } => {
                state.confirmed(deadline(sent, ttl));
                backoff.reset();
                due = crate::util::time::after(sent, interval);
                tracing::debug!(key = %watch.lease, "lease extended");
            }
            WatchStep::Retry => {
                if let Err(e) = &outcome {
                    tracing::debug!(key = %watch.lease, error = %e, "extension failed; retrying");
                }
                due = crate::util::time::after(Instant::now(), backoff.next_delay());
            }
            WatchStep::Lost(reason) => {
                tracing::warn!(key = %watch.lease, %reason, "lease lost");
                state.lose(reason);
                return;
            }
        }
    }
}

/// What the watchdog does after an extension (its own timer at the lease deadline aside).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WatchStep {
    /// Extended: the new deadline counts from `sent`.
    Extended { sent: Instant },
    /// A transient failure: try again after a backoff, until the deadline.
    Retry,
    /// The lease cannot be kept: fire the loss signal.
    Lost(String),
}

/// The watchdog's decision on one extension's outcome (shared with the model checker).
pub(crate) fn after_extension(outcome: &Result<Extension, crate::error::Error>) -> WatchStep {
    match outcome {
        Ok(Extension::Confirmed { sent }) => WatchStep::Extended { sent: *sent },
        Ok(Extension::Refused { .. }) => {
            WatchStep::Lost("an extension found the lock held by another token (or gone)".into())
        }
        Err(e) if e.is_retryable() => WatchStep::Retry,
        Err(e) => WatchStep::Lost(format!("an extension failed: {e}")),
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
