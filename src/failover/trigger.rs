//! Manual occurrences of a schedule: `baton trigger` and [`Failover::trigger_schedule`] ask
//! the fleet to run one occurrence now, outside the calendar.
//!
//! A trigger is stored per schedule **key** (not per digest, like the pause): during a rolling
//! change of the expression, hosts of both digests see it, and its occurrence's job is
//! digest-free (`KEY@manual@ID`, [`Occurrence::manual`]), so they run one job between them.
//! Its id is `manual-<RFC 3339 of the server's time, ms>`, unique per key. It stays pending
//! until a host's run of it ends terminal (done here or elsewhere, exhausted, skipped while
//! paused), which clears it, or for [`TRIGGER_LIFETIME`] (a day); the occurrence's job keeps
//! its outcome an hour longer ([`MANUAL_RETENTION`](crate::schedule::MANUAL_RETENTION)), so a
//! host that sees the trigger late joins the job, finds it done, and never runs it twice.
//!
//! The schedule drivers ([`Failover::schedule`], `baton schedule`) read the pending triggers
//! every [`ScheduleOptionsBuilder::trigger_poll`](crate::ScheduleOptionsBuilder::trigger_poll)
//! (one read per poll per driver) and start each one they have not started yet
//! ([`TriggerPoll`]), through the same path as a tick (pause, record), without jitter; no
//! overlap policy holds one back ([`Failover::overlap_decision`]).

use std::collections::HashSet;
use std::time::Duration;

use super::run::{IntoJob, RunOutcome};
use super::Failover;
use crate::error::Error;
use crate::schedule::Occurrence;
pub use crate::util::schedule_record::{Trigger, TRIGGER_LIFETIME};

/// How often a schedule's driver reads its pending triggers by default: 5 s.
pub const DEFAULT_TRIGGER_POLL: Duration = Duration::from_secs(5);

impl Failover {
    /// Asks the fleet running the schedule on `key` to run one manual occurrence now: stores
    /// a trigger stamped with the server's clock, made by the configuration's worker name
    /// (else host and PID) with `note`. Every [`Failover::schedule`] and `baton schedule` of
    /// the key starts it within its trigger poll; the occurrence runs once across the fleet
    /// (its own job, `KEY@manual@ID`, with the coordinator's attempts, backups and fencing).
    /// One round trip.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; connection errors.
    pub async fn trigger_schedule(
        &self,
        key: impl IntoJob,
        note: Option<&str>,
    ) -> Result<Trigger, Error> {
        let config = key.into_job()?;
        let by = config
            .worker_name
            .as_deref()
            .map_or_else(crate::util::token::default_worker_name, Into::into);
        let raw = self
            .backend
            .add_trigger(&config.prefix, &config.key, &by, note, TRIGGER_LIFETIME)
            .await?;
        Ok(raw.into_trigger())
    }

    /// The pending triggers of the schedule on `key`, oldest first: those made less than
    /// [`TRIGGER_LIFETIME`] ago by the server's clock (older ones are deleted by this read).
    /// One round trip (two when it deletes).
    ///
    /// # Errors
    /// As [`Failover::trigger_schedule`].
    pub async fn triggers(&self, key: impl IntoJob) -> Result<Vec<Trigger>, Error> {
        let config = key.into_job()?;
        let raws = self
            .backend
            .triggers(&config.prefix, &config.key, TRIGGER_LIFETIME)
            .await?;
        Ok(raws.into_iter().map(|r| r.into_trigger()).collect())
    }

    /// Deletes the trigger `id` of the schedule on `key`: whether it was pending. Idempotent:
    /// every host whose run of the manual occurrence ended terminal clears it.
    ///
    /// # Errors
    /// As [`Failover::trigger_schedule`].
    pub async fn clear_trigger(&self, key: impl IntoJob, id: &str) -> Result<bool, Error> {
        let config = key.into_job()?;
        self.backend
            .clear_trigger(&config.prefix, &config.key, id)
            .await
    }
}

impl<T, E> RunOutcome<T, E> {
    /// Whether the job is settled for good as far as this run saw: done (here or elsewhere)
    /// or exhausted. A manual occurrence's run that ends so clears its trigger; any other end
    /// (this attempt failed: a backup retries; lost; stopped) leaves it to the hosts still
    /// running it.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            RunOutcome::Done(_) | RunOutcome::CompletedElsewhere | RunOutcome::Exhausted { .. }
        )
    }
}

/// Whether a run of a manual occurrence that ended `outcome` here settles it: final
/// ([`RunOutcome::is_final`]) or skipped while paused. Then its trigger is cleared.
pub(crate) fn settles<T, E>(outcome: &super::OccurrenceOutcome<T, E>) -> bool {
    match outcome {
        super::OccurrenceOutcome::Ran(o) => o.is_final(),
        // Skipped by the overlap rule: answered, and on record.
        super::OccurrenceOutcome::Paused(_) | super::OccurrenceOutcome::Skipped => true,
        _ => false,
    }
}

/// Clears trigger `id` of `base`'s key, best effort (a failure is a warning: the trigger
/// stays pending, and a host that runs it later finds its job settled).
pub(crate) async fn clear(failover: &Failover, base: &super::FailoverConfig, id: &str) {
    if let Err(error) = failover.clear_trigger(base.clone(), id).await {
        tracing::warn!(key = %base.key, id, %error, "the trigger could not be cleared");
    }
}

/// A schedule driver's view of the pending triggers: which ones it started already (so each
/// is started once per driver), forgotten once the trigger is gone from the store. Used by
/// [`Failover::schedule`] and `baton schedule`.
#[derive(Debug, Default, Clone)]
pub struct TriggerPoll {
    started: HashSet<String>,
}

impl TriggerPoll {
    /// A driver that started none yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The manual occurrences of `pending` (a [`Failover::triggers`] read) that this driver
    /// has not started yet, oldest first, now counted as started; ids no longer pending are
    /// forgotten.
    pub fn take_new(&mut self, pending: &[Trigger]) -> Vec<Occurrence> {
        self.started
            .retain(|id| pending.iter().any(|t| &t.id == id));
        pending
            .iter()
            .filter(|t| self.started.insert(t.id.clone()))
            .map(Trigger::occurrence)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn trigger(id: &str) -> Trigger {
        Trigger {
            id: id.to_string(),
            at: SystemTime::UNIX_EPOCH,
            by: "h".into(),
            note: None,
        }
    }

    #[test]
    fn each_pending_trigger_is_started_once_and_forgotten_once_gone() {
        let mut poll = TriggerPoll::new();
        let (a, b) = (trigger("manual-a"), trigger("manual-b"));
        let got = poll.take_new(std::slice::from_ref(&a));
        assert_eq!(got.len(), 1);
        assert!(got[0].is_manual());
        assert_eq!(got[0].id(), "manual-a");
        assert_eq!(got[0].job_key("k"), "k@manual@manual-a");
        assert!(poll.take_new(std::slice::from_ref(&a)).is_empty());
        let got = poll.take_new(&[a.clone(), b]);
        assert_eq!(
            got.iter().map(Occurrence::id).collect::<Vec<_>>(),
            ["manual-b"]
        );
        // Gone, then back (the same id cannot come back in practice): started again.
        assert!(poll.take_new(&[]).is_empty());
        assert_eq!(poll.take_new(&[a]).len(), 1);
    }
}
