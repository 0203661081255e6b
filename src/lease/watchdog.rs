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
//! - An operator's force release fires the signal at once, not at the next extension: the
//!   watchdog listens on the lock's channel (the client's one pub/sub connection, shared by
//!   every subscriber of that channel on the client) for `taken:<its fencing token>`, which
//!   `force_release` publishes once it released exactly that grant. Best effort by design: a
//!   message missed (sent before the subscription was confirmed, or while the pub/sub
//!   connection was down) leaves the next extension to find the loss, as before.
//!
//! The task has one owner (the guard, through `stop`) and also ends with the client.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{deadline, Extend, Extension};
use crate::backend::{Backend, WeakBackend};
use crate::util::backoff::Backoff;
use crate::util::lock;
use crate::util::metrics::{ExtendOutcome, Labels, Loss};

/// What a holder and its watchdog share: the lease's current deadline and the loss signal.
///
/// The loss signal's `CancellationToken` is made only when someone asks for it: most guards
/// are released without anyone holding their token, and a token is a heap node of its own per
/// guard. The flag and the `Notify` carry the signal meanwhile (`lost()` futures and
/// `is_lost` need no token).
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Moves forward with each confirmed extension; watchers (a leader's renewal events and its
    /// work's stop timer) see each move.
    deadline: tokio::sync::watch::Sender<Instant>,
    /// Set once, when the signal fires.
    lost: AtomicBool,
    /// Wakes the `wait_lost` futures when the signal fires.
    fired: tokio::sync::Notify,
    /// The signal as a token, made on first request (cancelled at once if it already fired).
    token: OnceLock<CancellationToken>,
    reason: Mutex<Option<String>>,
    /// The metrics' labels of the primitive holding this lease.
    labels: Labels,
    /// When the lease was granted: a loss ends the hold there.
    granted: Instant,
}

impl LeaseState {
    /// The state of a lease granted at `granted` (the granting request's send time), held by
    /// the primitive of `labels`, that can end at `deadline`.
    pub(crate) fn new(deadline: Instant, labels: Labels, granted: Instant) -> Arc<Self> {
        Arc::new(LeaseState {
            deadline: tokio::sync::watch::Sender::new(deadline),
            lost: AtomicBool::new(false),
            fired: tokio::sync::Notify::new(),
            token: OnceLock::new(),
            reason: Mutex::new(None),
            labels,
            granted,
        })
    }

    /// The metrics' labels of the primitive holding this lease.
    pub(crate) fn labels(&self) -> Labels {
        self.labels
    }

    /// The hold ended by a release: recorded unless a loss already ended it.
    pub(crate) fn released(&self) {
        if !self.is_lost() {
            self.labels.held(self.granted);
        }
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

    /// Fires the loss signal (once; the first reason is kept, and `why` counted then).
    pub(crate) fn lose(&self, why: Loss, reason: impl Into<String>) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() {
                *r = Some(reason.into());
                // A release after the loss records nothing more (see `released`).
                self.labels.lost(why);
                self.labels.held(self.granted);
            }
        }
        self.lost.store(true, Ordering::SeqCst);
        // Pairs with the fence in `lost`: either that side sees the flag, or this side sees
        // the token it made; never neither (a token that stays uncancelled).
        fence(Ordering::SeqCst);
        self.fired.notify_waiters();
        if let Some(t) = self.token.get() {
            t.cancel();
        }
    }

    /// The loss signal as a token (made now if nobody asked before).
    pub(crate) fn lost(&self) -> &CancellationToken {
        let t = self.token.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            t.cancel();
        }
        t
    }

    /// The loss signal as an owned token.
    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.lost().clone()
    }

    /// Whether the loss signal fired.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Resolves once the loss signal fired.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn wait_lost(&self) {
        loop {
            // Registered before the flag is read, so a `lose` in between still wakes it.
            let fired = self.fired.notified();
            tokio::pin!(fired);
            fired.as_mut().enable();
            if self.is_lost() {
                return;
            }
            fired.await;
        }
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
    /// The channel a force release announces on, and this grant's fencing token: the signal
    /// fires at once on `taken:<token>` there. `None`: not listened for (a queue).
    pub taken: Option<(String, u64)>,
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
    // Weakly (on Redis the router, not the transport): the watchdog must not keep the client
    // alive.
    let weak = backend.downgrade();
    let client_gone = backend.cancel().clone();
    let response = backend.response_timeout();
    let listen = watch.taken.clone().map(|(channel, fence)| {
        // Bounded by the first extension: by then the client's pub/sub connection is
        // overloaded or down, and the extensions tell as they always did.
        let within = (watch.ttl / 3).max(response);
        listen_taken(backend.clone(), channel, fence, within)
    });
    let lease = watch.lease.clone();
    async move {
        tokio::select! {
            biased;
            _ = stop.cancelled() => {}
            _ = client_gone.cancelled() => state.lose(Loss::Shutdown, "the client shut down; the lease is no longer extended"),
            () = taken(listen) => {
                tracing::warn!(key = %lease, "lease taken by an operator");
                state.lose(Loss::Taken, "taken by an operator (force_release)");
            }
            _ = run(weak, watch, state.clone(), response) => {}
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

/// Subscribes to `channel` and resolves `true` on `taken:<fence>` there; `false` when the
/// subscription could not be made `within` (a third of the lease: the first extension) or the
/// client went away: extensions then find the loss, as before. The strong `backend` is held
/// only until the subscription is confirmed (milliseconds, normally), so the watchdog does not
/// keep the client alive beyond that bound.
async fn listen_taken(backend: Backend, channel: String, fence: u64, within: Duration) -> bool {
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
            Some(crate::util::pubsub::HubMsg::Message(m)) if super::store::is_taken(&m, fence) => {
                return true
            }
            Some(_) => {}
            None => return false,
        }
    }
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
                state.lose(Loss::MaxHold, "held for the maximum hold time");
                return;
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(end) => {
                state.lose(Loss::Expired, "no extension was confirmed before the lease could end");
                return;
            }
            _ = sleep_until_opt(watch.hold_until) => {
                state.lose(Loss::MaxHold, "held for the maximum hold time");
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
                state.lose(Loss::Expired, "no extension was confirmed before the lease could end");
                return;
            }
            r = backend.extend(&req, limit) => r,
        };
        let counted = match &outcome {
            Ok(Extension::Confirmed { sent }) => (ExtendOutcome::Ok, *sent),
            Ok(Extension::Refused) => (ExtendOutcome::Refused, Instant::now()),
            Err(_) => (ExtendOutcome::Error, Instant::now()),
        };
        state.labels().extended(counted.0, counted.1);
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
                let why = match outcome {
                    Ok(_) => Loss::Taken,
                    Err(_) => Loss::Error,
                };
                state.lose(why, reason);
                return;
            }
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

pub(crate) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_LABELS: Labels = Labels::new(
        crate::util::metrics::primitive::MUTEX,
        crate::util::metrics::backend::REDIS,
    );

    #[tokio::test]
    async fn the_loss_signal_reaches_tokens_made_before_and_after_it_fired() {
        let s = LeaseState::new(Instant::now(), TEST_LABELS, Instant::now());
        let early = s.lost_token();
        assert!(!s.is_lost() && !early.is_cancelled());
        s.lose(Loss::Taken, "first");
        s.lose(Loss::Taken, "second");
        assert!(s.is_lost() && early.is_cancelled());
        assert!(
            s.lost_token().is_cancelled(),
            "a token made after the loss is cancelled"
        );
        assert_eq!(s.reason().as_deref(), Some("first"));
        // Resolves at once once fired, and for a waiter registered before.
        s.wait_lost().await;
        let s2 = LeaseState::new(Instant::now(), TEST_LABELS, Instant::now());
        let waiter = {
            let s2 = s2.clone();
            tokio::spawn(async move { s2.wait_lost().await })
        };
        tokio::task::yield_now().await;
        s2.lose(Loss::Taken, "late");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("no panic");
    }
}
