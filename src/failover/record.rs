//! The schedule's record: what the store keeps of each schedule (its spec, the hosts that ran
//! it, a bounded history of its occurrences, its pause), written by the workers that run its
//! occurrences and read by operators (`baton status`, `baton check`, the dashboard).
//!
//! The record is a **second write** after the transition a worker already makes (a spawned,
//! best-effort task, never awaited by the worker's protocol loop): a failed write is a
//! `tracing` warning and a count in `baton_schedule_record_errors_total`, and never changes the
//! job. Readers repair it from the occurrences' own keys: an entry left `running` (its worker
//! died after its grant) reads as the occurrence's real state. The backends' forms live in
//! `backend::schedules`; the types are leaves (`util::schedule_record`).

use std::time::{Duration, SystemTime};

use super::run::IntoJob;
use super::Failover;
use crate::error::{ConfigError, Error};
pub use crate::schedule::missed_ticks;
use crate::schedule::{Schedule, DEFAULT_HISTORY, MAX_HISTORY};
pub use crate::util::schedule_record::{
    record_lifetime, AttemptOutcome, AttemptRecord, Check, CheckStatus, Exit, HostSeen,
    OccurrenceRecord, Pause, RecordChange, RecordedOutcome, ScheduleRecord,
};

/// How a schedule's record is written ([`Failover::record_occurrence`]): the history size and
/// the jitter it describes. The key prefix and the writer's name come from the job's
/// [`FailoverConfig`](crate::FailoverConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordOptions {
    /// How many occurrences the record keeps (1 ..= 1000, default 50).
    pub history: u32,
    /// The jitter the schedule's runs use (recorded in the spec).
    pub jitter: Duration,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            history: DEFAULT_HISTORY,
            jitter: Duration::ZERO,
        }
    }
}

impl RecordOptions {
    /// With a history of `n` occurrences.
    pub fn history(mut self, n: u32) -> Self {
        self.history = n;
        self
    }

    /// With `jitter`.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Checks the history size.
    ///
    /// # Errors
    /// `history`: outside 1 ..= 1000.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_history(self.history)
    }
}

/// Checks a history size (1 ..= [`MAX_HISTORY`]).
pub(crate) fn check_history(n: u32) -> Result<(), ConfigError> {
    if n == 0 || n > MAX_HISTORY {
        return Err(ConfigError::invalid(
            "history",
            format!("{n} is outside 1 ..= {MAX_HISTORY}"),
        ));
    }
    Ok(())
}

fn not_built(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        backend: "this build",
        why: "not built yet",
    }
}

impl Failover {
    /// Every record of the schedule on `key` (one per digest: two during a rolling change of
    /// the expression), each with the key's pause (read by the server's clock).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; connection errors; an unreadable record.
    pub async fn schedule_records(&self, key: impl IntoJob) -> Result<Vec<ScheduleRecord>, Error> {
        let _ = key.into_job()?;
        Err(not_built("schedule records"))
    }

    /// The newest `limit` occurrences on record of the schedule on `key` with `digest`,
    /// newest first, each repaired from its occurrence's own job (an entry left `running` by
    /// a worker that died reads as the job's state).
    ///
    /// # Errors
    /// As [`Failover::schedule_records`].
    pub async fn schedule_history(
        &self,
        key: impl IntoJob,
        digest: &str,
        limit: usize,
    ) -> Result<Vec<OccurrenceRecord>, Error> {
        let _ = (key.into_job()?, digest, limit);
        Err(not_built("schedule history"))
    }

    /// Pauses the schedule on `key` (every digest) until `until` (`None`: until resumed),
    /// recording who (the configuration's worker name, else host and PID), when (the server's
    /// clock) and `note`. A key may be paused before any host registered it. Runs that bind to
    /// an occurrence while it is paused skip it and record it `skipped_paused`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key or an `until` already past by the server's clock;
    /// connection errors.
    pub async fn pause_schedule(
        &self,
        key: impl IntoJob,
        until: Option<SystemTime>,
        note: Option<&str>,
    ) -> Result<(), Error> {
        let _ = (key.into_job()?, until, note);
        Err(not_built("pausing a schedule"))
    }

    /// Resumes the schedule on `key`: whether it was paused.
    ///
    /// # Errors
    /// As [`Failover::pause_schedule`].
    pub async fn resume_schedule(&self, key: impl IntoJob) -> Result<bool, Error> {
        let _ = key.into_job()?;
        Err(not_built("resuming a schedule"))
    }

    /// The pause of the schedule on `key`, if paused now by the server's clock (an `until` in
    /// the past reads as not paused). One read.
    ///
    /// # Errors
    /// As [`Failover::pause_schedule`].
    pub async fn schedule_pause(&self, key: impl IntoJob) -> Result<Option<Pause>, Error> {
        let _ = key.into_job()?;
        Err(not_built("reading a schedule's pause"))
    }

    /// Writes `change` into the record of `schedule` on `key` for the occurrence of `tick`
    /// (registering the schedule and the writer as a host seen): what the workers write on
    /// each grant and attempt end, public for applications and the CLI that record what the
    /// worker does not see (an occurrence skipped by overlap or by a pause). One round trip;
    /// times come from the server's clock.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key or history size, or a `tick` that is not one of
    /// the schedule's; connection errors.
    pub async fn record_occurrence(
        &self,
        schedule: &Schedule,
        options: &RecordOptions,
        key: impl IntoJob,
        tick: SystemTime,
        change: RecordChange,
    ) -> Result<(), Error> {
        options.validate()?;
        let _ = (schedule, key.into_job()?, tick, change);
        Err(not_built("recording an occurrence"))
    }
}
