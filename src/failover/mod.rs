//! The attempt-counted failover coordinator: the core of baton.
//!
//! - [`config`]: [`FailoverConfig`] and its builder (validated, serde).
//! - `protocol`: the pure decisions of every transition (unit-tested row by row).
//! - `worker`: the task that does the I/O around them; `backup` and `holder` are its two sides.
//! - [`events`]: the [`Event`] stream, [`Acquired`] and [`AttemptHandle`].
//! - `run`: the closure form, [`Failover::run`].
//! - `scheduled`: scheduled jobs, one job per occurrence of a [`Schedule`](crate::Schedule):
//!   [`Failover::schedule`], [`Failover::occurrence`], [`FailoverConfig::for_occurrence`].
//! - `record`: the schedule's record (history, hosts, pause): [`Failover::schedule_records`],
//!   [`Failover::schedule_history`], [`Failover::pause_schedule`], [`Failover::record_occurrence`].
//! - `trigger`: manual occurrences: [`Failover::trigger_schedule`], [`Failover::triggers`],
//!   [`Failover::clear_trigger`], and the drivers' [`TriggerPoll`].
//! - `backfill`: past occurrences run once each, oldest first: [`Failover::backfill_plan`],
//!   [`Failover::backfill`], and the long-running form's catch-up ([`Failover::catch_up_plan`]).
//! - `admin`: operator tools: [`Failover::job_status`], `watch_job`, `fail_attempt`,
//!   `reset_job`.
//! - `store`: the worker's view of the job store seam (`backend::jobs`), whose
//!   implementations, with their commands and statements, live in the backends' folders.

pub(crate) mod admin;
mod backfill;
mod backup;
pub mod config;
pub mod events;
mod holder;
pub(crate) mod keys;
// The job table's schema and statements, re-exported from the seam for the layers above.
#[cfg(feature = "postgres")]
pub(crate) mod pg;
// `pub` items for the hidden `crate::model_api` only (the model checker's crate).
mod overlap;
#[cfg_attr(feature = "model", allow(missing_docs))]
pub(crate) mod protocol;
pub(crate) mod record;
mod record_options;
mod run;
mod scheduled;
pub(crate) mod store;
mod trigger;
pub(crate) mod worker;

use std::sync::Arc;

use crate::backend::jobs::JobSpec;
use crate::backend::Backend;
use crate::error::Error;

pub use crate::util::jobs::{JobState, JobStatus};
pub use admin::{FailAttempt, JobChange, JobWatch, Replaced, ResetJob};
pub use backfill::{BackfillPlan, MAX_BACKFILL_TICKS};
pub use config::{FailoverConfig, FailoverConfigBuilder, StatusLevel};
pub use events::{Acquired, AttemptHandle, Event, Worker};
pub use overlap::{window_close, LiveOccurrence, OverlapDecision, WaitedOut, LIVE_SCAN};
pub use record::{
    missed_ticks, record_lifetime, AttemptOutcome, AttemptRecord, Check, CheckStatus, Exit,
    HostSeen, OccurrenceRecord, Pause, RecordChange, RecordOptions, RecordedOutcome,
    ScheduleRecord,
};
pub use run::{Attempt, IntoJob, RunOutcome};
pub use scheduled::{
    CatchUp, OccurrenceOutcome, OccurrenceReport, Overlap, ScheduleOptions, ScheduleOptionsBuilder,
    Scheduled,
};
pub use trigger::{Trigger, TriggerPoll, DEFAULT_TRIGGER_POLL, TRIGGER_LIFETIME};

/// The failover coordinator on one client's connections: starts workers, runs closures, and the
/// operator tools. Get it from [`Client::failover`](crate::Client::failover); cheap to clone.
#[derive(Clone)]
pub struct Failover {
    pub(crate) backend: Backend,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover").finish_non_exhaustive()
    }
}

impl Failover {
    /// The coordinator on `transport` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Failover { backend }
    }

    /// Starts a worker for one job and returns its event stream.
    ///
    /// The worker competes for the job as described in the [crate docs](crate): it either wins an
    /// attempt (`Acquired`), waits as a backup (`Locked`), or finds the job ended. Read the stream
    /// to the end; dropping it stops the worker and fails an attempt it holds.
    pub fn start(&self, config: FailoverConfig) -> Worker {
        let job = JobSpec {
            keys: Arc::new(keys::JobKeys::new(&config.prefix, &config.key)),
            name: worker::worker_name(&config),
            lease: config.lease,
            retention: config.retention,
            replica_ack: config.replica_ack.is_some(),
        };
        let record = record::Recorder::of(&self.backend, &config);
        match self
            .backend
            .with_job_store(job, worker::Start(config, record))
        {
            Ok(worker) => worker,
            Err((worker::Start(config, _), e)) => events::refused(config, e),
        }
    }

    /// Creates what the coordinator stores in its backend, if missing: on PostgreSQL the table
    /// `baton_jobs` and its index, and the schedules' record (`baton_schedules`,
    /// `baton_schedule_history`, `baton_schedule_control`) (docs/operating.md, "PostgreSQL roles and `baton migrate`"); on Redis nothing (keys need no
    /// schema). Workers create a missing table themselves on first use where their role may;
    /// call it at deploy time to create the schema with a role that may, and run the workers
    /// with one that may not. Idempotent, and takes no lock when everything exists; DDL waits
    /// for locks only briefly, and is tried again a few times.
    ///
    /// # Errors
    /// Connection and permission errors; [`ErrorKind::Busy`](crate::ErrorKind::Busy) when
    /// other transactions kept the table locked through every try.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.backend.migrate_jobs().await?;
        self.backend.migrate_schedules().await
    }

    /// Reads a job's state (plain reads, no transaction), as an operator would with
    /// `redis-cli GET 'baton:{msg:42}'`. [`Failover::job_status`] tells more.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn job_state(&self, job: impl IntoJob) -> Result<JobState, Error> {
        Ok(self.job_status(job).await?.state)
    }
}
