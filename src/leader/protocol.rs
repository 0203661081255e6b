//! The pure decisions of leader election (shared with the model checker): what a candidate
//! does after a try, when a term's work must stop, and what to do with work told to stop.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// What a candidate does after one try ([`Election::try_once`]); shared with the model checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CampaignStep {
    /// Granted: it leads.
    Elected,
    /// Someone leads: wait for the lease's PTTL (or a resignation's message).
    Standby { pttl: Option<Duration> },
    /// A transient error: try again after a backoff (a grant whose reply was lost is released
    /// by token meanwhile).
    Retry,
    /// An error retrying cannot fix.
    Fail,
}

/// The campaign's decision on one try's outcome.
pub(crate) fn after_try<T>(outcome: &Result<Result<T, Option<Duration>>, Error>) -> CampaignStep {
    match outcome {
        Ok(Ok(_)) => CampaignStep::Elected,
        Ok(Err(pttl)) => CampaignStep::Standby { pttl: *pttl },
        Err(e) if e.is_retryable() => CampaignStep::Retry,
        Err(_) => CampaignStep::Fail,
    }
}

/// When a term's work is told to stop unless a renewal moves `deadline` first: `stop_timeout`
/// before the lease can end.
pub(crate) fn stop_at(deadline: Instant, stop_timeout: Duration) -> Instant {
    deadline.checked_sub(stop_timeout).unwrap_or(deadline)
}

/// Whether a term's work must stop at `now`, the lease's deadline being `deadline` (the term's
/// supervisor asks when its timer fires; the model checker at each point of a holder's clock).
pub(crate) fn must_stop(now: Instant, deadline: Instant, stop_timeout: Duration) -> bool {
    now >= stop_at(deadline, stop_timeout)
}

/// What the worker does with a term's work it told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handover {
    /// Still running, and the lease is still ours: wait for it (until the deadline).
    Wait,
    /// It stopped: let the lease go.
    Release,
    /// Still running at the lease's end: another candidate may lead now. Report it loudly,
    /// abort it, then let go.
    Overdue,
}

/// The worker's decision on a told-to-stop work at `now`.
pub(crate) fn handover(work_finished: bool, now: Instant, deadline: Instant) -> Handover {
    if work_finished {
        Handover::Release
    } else if now < deadline {
        Handover::Wait
    } else {
        Handover::Overdue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_is_told_to_stop_before_the_lease_can_end_and_waited_for_until_then() {
        let d = Instant::now() + Duration::from_secs(10);
        let stop = Duration::from_secs(2);
        assert_eq!(stop_at(d, stop), d - stop);
        assert!(!must_stop(d - stop - Duration::from_millis(1), d, stop));
        assert!(must_stop(d - stop, d, stop));
        assert!(must_stop(d + stop, d, stop));
        assert_eq!(handover(true, d + stop, d), Handover::Release);
        assert_eq!(handover(false, d - stop, d), Handover::Wait);
        assert_eq!(handover(false, d, d), Handover::Overdue);
        let held: Result<Result<(), Option<Duration>>, Error> = Ok(Err(None));
        assert_eq!(after_try(&held), CampaignStep::Standby { pttl: None });
        let lost: Result<Result<(), Option<Duration>>, Error> = Err(Error::Timeout { during: "x" });
        assert_eq!(after_try(&lost), CampaignStep::Retry);
    }
}
