//! The Redlock watchdog: its one extension round (compare-and-`PEXPIRE` on every master, a
//! quorum decides), driven by the lease kernel's keepalive engine
//! ([`crate::lease::keepalive`]), which fires the loss signal when it can no longer vouch for
//! the lock.
//!
//! Timing is the engine's: a round every `ttl / 3` counted from the start of the last
//! confirmed round; the signal fires on its own timer at the validity deadline of the last
//! confirmed round, never by waiting on a request; a round that finds no quorum still holding
//! the token fires it at once; transient failures are retried with backoff until the deadline;
//! non-retryable errors fire it once they alone make a quorum impossible.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::keys::RedlockKeys;
use super::quorum::{decide, quorum, Decision};
use super::{extend_round, summary, Masters};
use crate::lease::keepalive::{self, Plan, Round, Step};
use crate::lease::watchdog::LeaseState;
use crate::lease::Extension;
use crate::util::metrics::{ExtendOutcome, Labels, Loss};
use crate::util::time::after;
use crate::util::token::short;

/// What the watchdog keeps alive.
pub(super) struct Watch {
    pub masters: Masters,
    pub keys: Arc<RedlockKeys>,
    pub key: String,
    pub token: String,
    pub ttl: Duration,
    /// When the granting (or last confirmed extending) round started.
    pub round_start: Instant,
    /// No extension reaches past this instant; the signal fires there.
    pub hold_until: Option<Instant>,
}

/// Starts the watchdog on the tracker of the first master whose client is not shut down; it
/// ends when `stop` fires, when that client shuts down (the loss signal fires), or once it
/// fired the loss signal.
pub(super) fn spawn(watch: Watch, state: Arc<LeaseState>, stop: CancellationToken) {
    let Some(host) = watch
        .masters
        .iter()
        .find(|t| !t.cancel().is_cancelled())
        .cloned()
    else {
        state.lose(
            Loss::Shutdown,
            "every master's client is shut down; the lock is not extended",
        );
        return;
    };
    if tokio::runtime::Handle::try_current().is_err() {
        state.lose(
            Loss::Error,
            "no async runtime to run the watchdog; the lock is not extended",
        );
        return;
    }
    let plan = Plan {
        ttl: watch.ttl,
        from: watch.round_start,
        hold_until: watch.hold_until,
        expired: "no quorum extension was confirmed before the lock's validity ended",
        shutdown: "the client shut down; the lock is no longer extended",
    };
    let round = QuorumRound {
        labels: state.labels(),
        watch,
    };
    host.tracker().spawn(keepalive::drive(
        round,
        plan,
        state,
        stop,
        host.cancel().clone(),
        std::future::pending(),
    ));
}

/// One quorum extension round.
struct QuorumRound {
    labels: Labels,
    watch: Watch,
}

impl Round for QuorumRound {
    async fn round(&mut self, ttl: Duration, _end: Instant) -> Step {
        // Each master's request is bounded by its client's response timeout, far below ttl.
        let watch = &self.watch;
        let (start, replies) = extend_round(&watch.masters, &watch.keys, &watch.token, ttl).await;
        let yes = replies
            .iter()
            .filter(|r| matches!(r, Ok(Extension::Confirmed { .. })))
            .count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let fatal = replies
            .iter()
            .filter(|r| matches!(r, Err(e) if !e.is_retryable()))
            .count();
        let step = after_round(
            watch.masters.len(),
            yes,
            failed,
            fatal,
            ttl,
            start.elapsed(),
        );
        // A round is one extension: confirmed by a quorum, refused when a quorum cannot be
        // had any more, an error when it is to be retried.
        let outcome = match &step {
            RoundStep::Extended { .. } => ExtendOutcome::Ok,
            RoundStep::Retry => ExtendOutcome::Error,
            RoundStep::Lost(_) => ExtendOutcome::Refused,
        };
        self.labels.extended(outcome, start);
        match step {
            RoundStep::Extended { validity } => {
                tracing::debug!(key = %watch.key, yes, "Redlock extended by quorum");
                Step::Extended {
                    from: start,
                    until: after(start, validity),
                }
            }
            RoundStep::Retry => {
                tracing::debug!(key = %watch.key, yes, failed, errors = %summary(&watch.masters, &replies), "Redlock extension round without a quorum; retrying");
                Step::Retry
            }
            RoundStep::Lost(reason) => {
                tracing::warn!(key = %watch.key, token = short(&watch.token), %reason, errors = %summary(&watch.masters, &replies), "Redlock lost");
                Step::Lost(Loss::Error, reason)
            }
        }
    }
}

/// What the watchdog does after one extension round.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RoundStep {
    /// A quorum confirmed: valid for `validity` from the round's start.
    Extended { validity: Duration },
    /// Transient: too many masters failed to tell, or the round was too slow. Retry until the
    /// validity deadline.
    Retry,
    /// The lock cannot be kept.
    Lost(String),
}

/// The watchdog's decision on a round over `masters` where `yes` confirmed, `failed` gave an
/// error (`fatal` of them a non-retryable one) and that took `elapsed` of `ttl`.
pub(super) fn after_round(
    masters: usize,
    yes: usize,
    failed: usize,
    fatal: usize,
    ttl: Duration,
    elapsed: Duration,
) -> RoundStep {
    let needed = quorum(masters);
    match decide(masters, yes, failed, ttl, elapsed) {
        Decision::Held { validity } => RoundStep::Extended { validity },
        Decision::Contended => RoundStep::Lost(format!(
            "an extension round found no quorum still holding the lock ({yes} of {masters} \
             masters did, {needed} needed): it is held by another token or gone"
        )),
        Decision::Unavailable { .. } if masters.saturating_sub(fatal) < needed => {
            RoundStep::Lost(format!(
                "{fatal} of {masters} masters failed with non-retryable errors: a quorum of \
                 {needed} cannot be kept"
            ))
        }
        Decision::Unavailable { .. } | Decision::Expired => RoundStep::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn rounds_extend_retry_or_lose() {
        let ttl = Duration::from_millis(300);
        assert!(matches!(
            after_round(3, 2, 1, 0, ttl, 5 * MS),
            RoundStep::Extended { .. }
        ));
        // Everyone answered, one still ours: held elsewhere or gone.
        assert!(matches!(
            after_round(3, 1, 0, 0, ttl, 5 * MS),
            RoundStep::Lost(_)
        ));
        // Two masters down: cannot tell, retry until the deadline.
        assert_eq!(after_round(3, 1, 2, 0, ttl, 5 * MS), RoundStep::Retry);
        // A quorum, but too slow: retry.
        assert_eq!(after_round(3, 3, 0, 0, ttl, ttl), RoundStep::Retry);
        // Two masters refuse the script for good (ACL): the lock cannot be kept.
        assert!(matches!(
            after_round(3, 1, 2, 2, ttl, 5 * MS),
            RoundStep::Lost(_)
        ));
        // One fatal, one transient: a quorum may come back.
        assert_eq!(after_round(3, 1, 2, 1, ttl, 5 * MS), RoundStep::Retry);
    }
}
