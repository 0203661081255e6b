//! The lease kernel's keepalive for a lease kept in a lock store (the mutex, the fair lock,
//! the leader's lease, the queue's hold): [`LeaseState`] (what a holder and its keepalive
//! share), the store's extension round, and the pure decision on one extension's outcome
//! ([`after_extension`], read by the model checker). The loop that drives the rounds, with its
//! timing, is the one keepalive engine of every primitive ([`keepalive`](super::keepalive)).
//!
//! A force release fires the loss signal at once, not at the next extension: the watchdog
//! listens on the lock's channel (the client's one pub/sub connection, shared by every
//! subscriber of that channel on the client) for `taken:<its fencing token>`, which
//! `force_release` publishes once it released exactly that grant. Best effort by design: a
//! message missed (sent before the subscription was confirmed, or while the pub/sub connection
//! was down) leaves the next extension to find the loss, as before.
//!
//! The task has one owner (the guard, through `stop`) and also ends with the client.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// What a holder and its keepalive share, named here for the primitives that hold a lease in
// a lock store.
pub(crate) use super::keepalive::LeaseState;
use super::keepalive::{self, Plan, Round, Step};
use super::{deadline, Extend, Extension};
use crate::backend::{Backend, WeakBackend};
use crate::util::metrics::{ExtendOutcome, Labels, Loss};

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
    /// The channel a force release announces on, and how it names this grant: the signal
    /// fires at once on `taken:<token>` (or `taken:h:<holder>`) there. `None`: not listened
    /// for (a queue).
    pub taken: Option<(String, TakenBy)>,
}

/// How a force release names a grant on its channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TakenBy {
    /// By its fencing token (`taken:<token>`): a token only this grant holds.
    Fence(u64),
    /// By its holder as shown (`taken:h:<holder>`): the grant's fencing token is shared (a
    /// read-write lock's readers all carry the last write's).
    Holder(String),
}

impl TakenBy {
    fn matches(&self, message: &str) -> bool {
        match self {
            TakenBy::Fence(f) => super::store::is_taken(message, *f),
            TakenBy::Holder(h) => super::store::is_taken_holder(message, h),
        }
    }
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
    // In the span of whoever holds the lease (a guard's, an elector's): a spawned task would
    // otherwise log outside it.
    backend
        .tracker()
        .spawn(tracing::Instrument::in_current_span(task(
            backend, watch, state, stop,
        )));
}

/// The watchdog [`spawn`] starts, as a future for a task its owner runs anyway (a leader's
/// term runs it beside its supervisor, in one task). It must be polled to its end: a watchdog
/// not running extends nothing and fires no loss signal.
pub(crate) fn task(
    backend: &Backend,
    watch: Watch,
    state: Arc<LeaseState>,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let response = backend.response_timeout();
    let listen = watch.taken.clone().map(|(channel, by)| {
        // Bounded by the first extension: by then the client's pub/sub connection is
        // overloaded or down, and the extensions tell as they always did.
        let within = (watch.ttl / 3).max(response);
        listen_taken(backend.clone(), channel, by, within)
    });
    let plan = Plan {
        ttl: watch.ttl,
        from: watch.sent,
        hold_until: watch.hold_until,
        expired: "no extension was confirmed before the lease could end",
        shutdown: "the client shut down; the lease is no longer extended",
    };
    let lease = watch.lease.clone();
    let round = StoreRound {
        // Weakly (on Redis the router, not the transport): the watchdog must not keep the
        // client alive.
        backend: backend.downgrade(),
        labels: state.labels(),
        response,
        watch,
    };
    keepalive::drive(
        round,
        plan,
        state,
        stop,
        backend.cancel().clone(),
        async move {
            taken(listen).await;
            tracing::warn!(key = %lease, "lease taken by an operator");
        },
    )
}

/// One extension of a lease kept in a lock store: the token-checked extension script (or
/// statement), which also refreshes the primitive's other keys.
struct StoreRound {
    backend: WeakBackend,
    labels: Labels,
    response: Duration,
    watch: Watch,
}

impl Round for StoreRound {
    async fn round(&mut self, ttl: Duration, end: Instant) -> Step {
        let watch = &self.watch;
        let refresh: Vec<&str> = watch.refresh.iter().map(String::as_str).collect();
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
        // engine's timer must fire on time; `extend` gives up there too).
        let limit = crate::util::time::after(Instant::now(), self.response).min(end);
        let outcome = self.backend.extend(&req, limit).await;
        let counted = match &outcome {
            Ok(Extension::Confirmed { sent }) => (ExtendOutcome::Ok, *sent),
            Ok(Extension::Refused) => (ExtendOutcome::Refused, Instant::now()),
            Err(_) => (ExtendOutcome::Error, Instant::now()),
        };
        self.labels.extended(counted.0, counted.1);
        match after_extension(&outcome) {
            WatchStep::Extended { sent } => {
                tracing::debug!(key = %watch.lease, "lease extended");
                Step::Extended {
                    from: sent,
                    until: deadline(sent, ttl),
                }
            }
            WatchStep::Retry => {
                if let Err(e) = &outcome {
                    tracing::debug!(key = %watch.lease, error = %e, "extension failed; retrying");
                }
                Step::Retry
            }
            WatchStep::Lost(reason) => {
                tracing::warn!(key = %watch.lease, %reason, "lease lost");
                let why = match outcome {
                    Ok(_) => Loss::Taken,
                    Err(_) => Loss::Error,
                };
                Step::Lost(why, reason)
            }
        }
    }
}

/// Resolves once a force release announced this grant taken; never when nothing listens.
async fn taken(listen: Option<impl std::future::Future<Output = bool>>) {
    let heard = match listen {
        Some(l) => l.await,
        None => false,
    };
    if !heard {
        std::future::pending::<()>().await;
    }
}

/// Subscribes to `channel` and resolves `true` on the message naming this grant there (`by`);
/// `false` when the
/// subscription could not be made `within` (a third of the lease: the first extension) or the
/// client went away: extensions then find the loss, as before. The strong `backend` is held
/// only until the subscription is confirmed (milliseconds, normally), so the watchdog does not
/// keep the client alive beyond that bound.
async fn listen_taken(backend: Backend, channel: String, by: TakenBy, within: Duration) -> bool {
    let sub = tokio::time::timeout(within, backend.subscribe(&channel)).await;
    drop(backend);
    let Ok(Ok(mut sub)) = sub else {
        tracing::debug!(
            channel,
            "not listening for a force release; extensions will tell"
        );
        return false;
    };
    loop {
        match sub.rx.recv().await {
            Some(crate::util::pubsub::HubMsg::Message(m)) if by.matches(&m) => return true,
            Some(_) => {}
            None => return false,
        }
    }
}

/// What the watchdog does after an extension (its own timer at the lease deadline aside).
#[derive(Debug, PartialEq, Eq)]
pub enum WatchStep {
    /// Extended: the new deadline counts from `sent`.
    Extended { sent: Instant },
    /// A transient failure: try again after a backoff, until the deadline.
    Retry,
    /// The lease cannot be kept: fire the loss signal.
    Lost(String),
}

/// The watchdog's decision on one extension's outcome (shared with the model checker).
pub fn after_extension(outcome: &Result<Extension, crate::error::Error>) -> WatchStep {
    match outcome {
        Ok(Extension::Confirmed { sent }) => WatchStep::Extended { sent: *sent },
        Ok(Extension::Refused) => {
            WatchStep::Lost("an extension found the lock held by another token (or gone)".into())
        }
        Err(e) if e.is_retryable() => WatchStep::Retry,
        Err(e) => WatchStep::Lost(format!("an extension failed: {e}")),
    }
}
