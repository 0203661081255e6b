//! The attempt-counted failover coordinator: the core of baton.
//!
//! - [`config`]: [`FailoverConfig`] and its builder (validated, serde).
//! - `protocol`: the pure decisions of every transition (unit-tested row by row).
//! - `worker`: the task that does the I/O around them; `backup` and `holder` are its two sides.
//! - [`events`]: the [`Event`] stream, [`Acquired`] and [`AttemptHandle`].
//! - `run`: the closure form, [`Failover::run`].
//! - `scheduled`: scheduled jobs, one job per occurrence of a [`Schedule`](crate::Schedule):
//!   [`Failover::schedule`], [`Failover::occurrence`], [`FailoverConfig::for_occurrence`].
//! - `admin`: operator tools: [`Failover::job_status`], `watch_job`, `fail_attempt`,
//!   `reset_job`.

pub(crate) mod admin;
mod backup;
pub mod config;
pub mod events;
mod holder;
pub(crate) mod keys;
mod named;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
// `pub` items for the hidden `crate::model_api` only (the model checker's crate).
#[cfg_attr(feature = "model", allow(missing_docs))]
pub(crate) mod protocol;
mod run;
mod scheduled;
pub(crate) mod status;
pub(crate) mod store;
pub(crate) mod worker;

use std::sync::Arc;

use crate::backend::redis::Transport;
use crate::backend::Backend;

pub use admin::{FailAttempt, JobChange, JobWatch, ResetJob};
pub use config::{FailoverConfig, FailoverConfigBuilder, StatusLevel};
pub use events::{Acquired, AttemptHandle, Event, Worker};
pub use run::{Attempt, IntoJob, RunOutcome};
pub use scheduled::{
    CatchUp, OccurrenceOutcome, OccurrenceReport, Overlap, ScheduleOptions, ScheduleOptionsBuilder,
    Scheduled,
};
pub use status::{JobState, JobStatus};

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

    /// The Redis transport (the Redis forms of the operator tools).
    pub(crate) fn transport(&self) -> Result<&Arc<Transport>, crate::Error> {
        self.backend
            .redis("this failover operation", "it has no PostgreSQL form")
    }

    /// Starts a worker for one job and returns its event stream.
    ///
    /// The worker competes for the job as described in the [crate docs](crate): it either wins an
    /// attempt (`Acquired`), waits as a backup (`Locked`), or finds the job ended. Read the stream
    /// to the end; dropping it stops the worker and fails an attempt it holds.
    pub fn start(&self, config: FailoverConfig) -> Worker {
        match &self.backend {
            Backend::Redis(transport) => worker::spawn(transport.clone(), config),
            #[cfg(feature = "postgres")]
            Backend::Postgres(transport) => {
                if config.replica_ack.is_some() {
                    return events::refused(config, pg::replica_ack_unsupported());
                }
                if config.key.contains('\0') || config.prefix.contains('\0') {
                    return events::refused(config, pg::nul_unsupported());
                }
                let keys = keys::JobKeys::new(&config.prefix, &config.key);
                let store = pg::PgStore {
                    transport: transport.clone(),
                    key: keys.state().to_string(),
                    name: worker::worker_name(&config),
                    lock_timeout: config.lock_timeout,
                    retention: config.retention,
                };
                worker::spawn_on(store, &transport.cancel, &transport.tracker, config)
            }
        }
    }

    /// Creates what the coordinator stores in its backend, if missing: on PostgreSQL the table
    /// `baton_jobs` and its index (docs/operating.md, "PostgreSQL roles and `baton migrate`"); on Redis nothing (keys need no
    /// schema). Workers create a missing table themselves on first use where their role may;
    /// call it at deploy time to create the schema with a role that may, and run the workers
    /// with one that may not. Idempotent, and takes no lock when everything exists; DDL waits
    /// for locks only briefly, and is tried again a few times.
    ///
    /// # Errors
    /// Connection and permission errors; [`ErrorKind::Busy`](crate::ErrorKind::Busy) when
    /// other transactions kept the table locked through every try.
    pub async fn migrate(&self) -> Result<(), crate::Error> {
        match &self.backend {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                t.migrate_schema(pg::SCHEMA).await?;
                pg::ensure_schema(t).await
            }
        }
    }

    /// Reads a job's state (plain reads, no transaction), as an operator would with
    /// `redis-cli GET 'baton:{msg:42}'`. [`Failover::job_status`] tells more.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for an invalid job name; connection errors.
    pub async fn job_state(&self, job: impl IntoJob) -> Result<JobState, crate::Error> {
        Ok(self.job_status(job).await?.state)
    }
}
