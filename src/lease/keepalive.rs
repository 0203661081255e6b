//! The one keepalive engine: keeps a lease alive while its holder works, and fires the loss
//! signal when it can no longer vouch for it. Each primitive supplies only one extension
//! [`Round`] (the lock store's token-checked extension, Redlock's quorum round); the timing is
//! here, once.
//!
//! Timing, and why:
//! - It extends every `ttl / 3` counted from the *send time* of the last confirmed extension
//!   (a Redlock round's start), so two extensions may fail in a row and a third still lands
//!   before the lease can end.
//! - The loss signal fires on its own timer at the deadline of the last confirmed extension
//!   (send time + ttl − margin, or a Redlock's validity), never by waiting on a request: a
//!   server paused by `SIGSTOP` or a cut link leaves the request hanging, and the holder must
//!   hear of the loss before another process can be granted the lease. A stalled holder
//!   process is covered too: the timer is checked first (`biased`) when the process runs again.
//! - A round that finds the lease taken, or fails for good, fires the signal at once.
//! - Transient failures (timeouts, reconnects, a loading server, a round without a quorum) are
//!   retried with backoff until the deadline.
//! - An optional cap on the total hold: extensions never reach past it, and the signal fires
//!   when it is reached.
//! - [`drive`] adds what ends the loop from outside: the owner's stop, the client's shutdown
//!   (the signal fires: nobody extends any more) and an operator's force release (`taken`).
//!
//! The failover holder keeps its own loop (`failover/holder.rs`): there the extension is one
//! branch of the `select!` that also serves `done()`/`fail()` and the job's channel, so that a
//! loss and a `done()` are ordered in one task (issue 35's guarantees); it shares the cadence
//! ([`Cadence`]) and the deadline computation with this engine.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::guard::{confirm, deadline_cell, DeadlineCell, LeaseCore, LossSignal};
use crate::util::backoff::Backoff;
use crate::util::metrics::{Labels, Loss};
use crate::util::time::after;

/// What a holder and its keepalive share: the lease's deadline cell and its loss signal (the
/// parts of its [`LeaseCore`]), and the metrics of the hold.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Moves forward with each confirmed extension.
    deadline: DeadlineCell,
    loss: Arc<LossSignal>,
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
            deadline: deadline_cell(deadline),
            loss: LossSignal::new(),
            labels,
            granted,
        })
    }

    /// The held-lease core of this lease on `key` (fencing token `fence`): its accessors read
    /// this state's deadline and loss signal.
    pub(crate) fn core(&self, key: impl Into<Arc<str>>, fence: Option<u64>) -> LeaseCore {
        LeaseCore::new(key, fence, self.deadline.clone(), self.loss.clone())
    }

    /// The deadline cell (shared with a view that has a loss signal of its own: a term).
    pub(crate) fn deadline_cell(&self) -> &DeadlineCell {
        &self.deadline
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
        confirm(&self.deadline, new);
    }

    /// Fires the loss signal (once; the first reason is kept, and `why` counted then).
    pub(crate) fn lose(&self, why: Loss, reason: impl Into<String>) {
        if self.loss.fire(reason) {
            // A release after the loss records nothing more (see `released`).
            self.labels.lost(why);
            self.labels.held(self.granted);
        }
    }

    /// The loss signal as a token (made now if nobody asked before).
    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.loss.token()
    }

    /// Whether the loss signal fired.
    pub(crate) fn is_lost(&self) -> bool {
        self.loss.is_lost()
    }

    /// Resolves once the loss signal fired.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn wait_lost(&self) {
        self.loss.wait().await;
    }

    /// Why the loss signal fired, once it did.
    pub(crate) fn reason(&self) -> Option<String> {
        self.loss.reason()
    }
}

/// What one extension round came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// Confirmed: the next round is due a third of a lease after `from` (the request's send
    /// time, a round's start), and the lease holds until `until`.
    Extended { from: Instant, until: Instant },
    /// Transient: retry after a backoff, until the deadline.
    Retry,
    /// The lease cannot be kept: fire the loss signal, counted as `Loss`.
    Lost(Loss, String),
}

/// One extension of a primitive's lease: all a primitive supplies to the engine.
pub(crate) trait Round: Send {
    /// Extends the lease to `ttl` from now; the request must not outlive `end` (the engine
    /// fires the loss signal there anyway). Logs and counts its own outcome.
    fn round(&mut self, ttl: Duration, end: Instant) -> impl Future<Output = Step> + Send;
}

/// How a lease is kept.
pub(crate) struct Plan {
    /// The lease's ttl.
    pub ttl: Duration,
    /// The send time of the request that granted (or last extended) the lease.
    pub from: Instant,
    /// No extension reaches past this instant; the signal fires there.
    pub hold_until: Option<Instant>,
    /// The loss reason when no extension was confirmed before the deadline.
    pub expired: &'static str,
    /// The loss reason when the client shuts down.
    pub shutdown: &'static str,
}

/// When the next extension is due: a third of a lease after the last confirmed one, or a
/// backoff after a failed one. Shared by the engine and the failover holder's loop.
pub(crate) struct Cadence {
    interval: Duration,
    backoff: Backoff,
    due: Instant,
}

impl Cadence {
    /// Every `interval`, counted from `from` (the grant's send time); failed extensions are
    /// retried after a backoff starting at `backoff`.
    pub(crate) fn new(interval: Duration, backoff: Duration, from: Instant) -> Self {
        Cadence {
            interval,
            backoff: Backoff::new(backoff),
            due: after(from, interval),
        }
    }

    /// When the next extension is due.
    pub(crate) fn due(&self) -> Instant {
        self.due
    }

    /// An extension sent at `from` was confirmed.
    pub(crate) fn confirmed(&mut self, from: Instant) {
        self.backoff.reset();
        self.due = after(from, self.interval);
    }

    /// An extension failed: the next one after a backoff, never later than `cap`.
    pub(crate) fn failed(&mut self, cap: Option<Instant>) {
        let next = after(Instant::now(), self.backoff.next_delay());
        self.due = cap.map_or(next, |c| next.min(c));
    }

    /// Due now (something suggests the lease may be gone: look at once).
    pub(crate) fn now(&mut self) {
        self.due = Instant::now();
    }
}

/// Runs `round` under `plan` until the loss signal of `state` fires, or until `stop` (the
/// owner released), `client_gone` (the signal fires: nobody extends any more) or `taken` (an
/// operator's force release: the signal fires) ends it. Must be polled to its end.
pub(crate) async fn drive<R: Round>(
    round: R,
    plan: Plan,
    state: Arc<LeaseState>,
    stop: CancellationToken,
    client_gone: CancellationToken,
    taken: impl Future<Output = ()> + Send,
) {
    let shutdown = plan.shutdown;
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        _ = client_gone.cancelled() => state.lose(Loss::Shutdown, shutdown),
        () = taken => state.lose(Loss::Taken, "taken by an operator (force_release)"),
        _ = run(round, plan, state.clone()) => {}
    }
}

/// The loop: extends every `ttl / 3`, fires the loss signal at the deadline or the hold cap.
async fn run<R: Round>(mut round: R, plan: Plan, state: Arc<LeaseState>) {
    let interval = (plan.ttl / 3).max(Duration::from_millis(1));
    let mut cadence = Cadence::new(interval, interval, plan.from);
    let held_long_enough = "held for the maximum hold time";
    loop {
        let end = state.deadline();
        if plan.hold_until.is_some_and(|cap| Instant::now() >= cap) {
            state.lose(Loss::MaxHold, held_long_enough);
            return;
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(end) => {
                state.lose(Loss::Expired, plan.expired);
                return;
            }
            _ = sleep_until_opt(plan.hold_until) => {
                state.lose(Loss::MaxHold, held_long_enough);
                return;
            }
            _ = tokio::time::sleep_until(cadence.due()) => {}
        }
        // Never extend past the cap: the last extension is shortened to end there.
        let ttl = match plan.hold_until {
            Some(cap) => plan.ttl.min(cap.saturating_duration_since(Instant::now())),
            None => plan.ttl,
        };
        if ttl < Duration::from_millis(1) {
            continue;
        }
        let step = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(end) => {
                state.lose(Loss::Expired, plan.expired);
                return;
            }
            step = round.round(ttl, end) => step,
        };
        match step {
            Step::Extended { from, until } => {
                state.confirmed(until);
                cadence.confirmed(from);
            }
            Step::Retry => cadence.failed(None),
            Step::Lost(why, reason) => {
                state.lose(why, reason);
                return;
            }
        }
    }
}

/// Sleeps until `at`; forever without one.
pub(crate) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
