//! The job store seam: where the failover coordinator's jobs are stored, chosen once per
//! backend.
//!
//! The worker task is written once, generic over [`JobStore`] (the contract, a leaf in
//! `util::jobs` with the values it carries, so that the backends can implement it without
//! naming a primitive); each backend implements it in its own folder, with its commands or
//! statements beside it: `backend::redis::jobs` (`WATCH` + reads, `MULTI … EXEC`, the lease
//! extension script) and `backend::postgres::jobs` (one row of `baton_jobs` per job). This file
//! is the only place that matches on the backend for a job: [`Backend::with_job_store`] hands
//! the worker the store of its backend, and the operator tools (status, watch, release, reset,
//! migrate) each have one method here. A third backend adds a folder and one arm per method.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Backend;
use crate::error::Error;
pub(crate) use crate::util::jobs::{
    Extended, FailAttempt, Held, JobKeys, JobStatus, JobStore, Named, Replaced, ResetJob,
};
use crate::util::pubsub::Subscription;

/// The Redis store's type, for the worker's test of its future's size.
#[cfg(test)]
pub(crate) use super::redis::jobs::RedisStore;

/// The job table's schema and statements that other layers name: the client's schema checks,
/// the tests' interleavings (feature `postgres`).
#[cfg(feature = "postgres")]
pub(crate) mod pg {
    #[cfg(feature = "testing")]
    pub(crate) use super::super::postgres::jobs::{write_statement, Params};
    pub(crate) use super::super::postgres::jobs::{CLEANUP, SCHEMA, TABLE};
}

/// What a worker's store is built from: the job's keys, the worker's name (stored with its
/// lease) and the job's durations.
pub(crate) struct JobSpec {
    pub keys: Arc<JobKeys>,
    pub name: Arc<str>,
    pub lease: Duration,
    pub retention: Duration,
    /// Whether the job asks for replica acknowledgements (`replica_ack`), which only Redis
    /// counts.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub replica_ack: bool,
}

/// What runs on a job's store once the backend has built it (the worker task): generic over the
/// store, so that its loop is compiled once per backend and dispatches nothing per call.
pub(crate) trait OnStore {
    /// What running it returns.
    type Output;

    /// Runs on `store`, a task of `tracker` stopped by `cancel` (the client's).
    fn run<S: JobStore>(
        self,
        store: S,
        cancel: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Self::Output;
}

impl Backend {
    /// Builds `job`'s store on this backend and runs `on` with it.
    ///
    /// # Errors
    /// `on` back, with [`Error::Unsupported`] for what the backend cannot store: on
    /// PostgreSQL, `replica_ack` and a NUL byte in the job's keys.
    pub(crate) fn with_job_store<O: OnStore>(
        &self,
        job: JobSpec,
        on: O,
    ) -> Result<O::Output, (O, Error)> {
        match self {
            Backend::Redis(t) => {
                let store = super::redis::jobs::RedisStore {
                    transport: t.clone(),
                    keys: job.keys,
                    name: job.name,
                    lease: job.lease,
                    retention: job.retention,
                };
                Ok(on.run(store, &t.cancel, &t.tracker))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                use super::postgres::jobs;
                if job.replica_ack {
                    return Err((on, jobs::replica_ack_unsupported()));
                }
                if job.keys.state().contains('\0') {
                    return Err((on, jobs::nul_unsupported()));
                }
                let store = jobs::PgStore {
                    transport: t.clone(),
                    key: job.keys.state().to_string(),
                    name: job.name,
                    lease: job.lease,
                    retention: job.retention,
                };
                Ok(on.run(store, &t.cancel, &t.tracker))
            }
        }
    }

    /// Creates what the job store needs in this backend, if missing: on PostgreSQL the table
    /// `baton_jobs` and its index; on Redis nothing.
    ///
    /// # Errors
    /// Connection and permission errors; `Busy` when the table stayed locked.
    pub(crate) async fn migrate_jobs(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                t.migrate_schema(super::postgres::jobs::SCHEMA).await?;
                t.migrate_schema(super::postgres::jobs::STOPS_SCHEMA)
                    .await?;
                super::postgres::jobs::ensure_schema(t).await?;
                super::postgres::jobs::ensure_stops(t).await
            }
        }
    }

    /// Everything stored about the job named `job` whose keys are `keys` (plain reads).
    ///
    /// # Errors
    /// Connection errors; an unreadable reply.
    pub(crate) async fn job_status(&self, keys: &JobKeys, job: String) -> Result<JobStatus, Error> {
        match self {
            Backend::Redis(t) => super::redis::jobs::job_status(t, keys, job).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::jobs::job_status(t, keys.state(), job).await,
        }
    }

    /// Subscribes to the job's messages (`acquired:N`, `done`, …).
    ///
    /// # Errors
    /// Connection errors while subscribing.
    pub(crate) async fn watch_job(&self, keys: &JobKeys) -> Result<Subscription, Error> {
        match self {
            Backend::Redis(t) => t.hub.subscribe(keys.channel()).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.subscribe(keys.state()).await,
        }
    }

    /// Releases the job's live attempt if it is the one `named` (an operator's release: the
    /// lease goes, `reason` is recorded, `failed` is published), in one conditional write.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a state baton never writes; connection errors; a timeout
    /// under constant contention.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn fail_attempt(
        &self,
        keys: &JobKeys,
        named: Named,
        reason: &str,
        lease: Duration,
        retention: Duration,
    ) -> Result<FailAttempt, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::jobs::fail_attempt(t, keys, named, reason, retention).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::jobs::fail_attempt(
                    t,
                    keys.state(),
                    named,
                    reason,
                    lease,
                    retention,
                )
                .await
            }
        }
    }

    /// Replaces the job's live attempt if it is the one `named` (an operator's or a schedule's
    /// replacement: `DONE`, the lease deleted, `replaced by BY` recorded, the stop marker set
    /// for the old lease's remaining time, `replaced:N:BY` published), in one conditional write.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a state baton never writes; connection errors; a timeout
    /// under constant contention.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn replace_attempt(
        &self,
        keys: &JobKeys,
        named: Named,
        by: &str,
        lease: Duration,
        retention: Duration,
    ) -> Result<Replaced, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::jobs::replace_attempt(t, keys, named, by, retention).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::jobs::replace_attempt(t, keys.state(), named, by, lease, retention)
                    .await
            }
        }
    }

    /// Deletes the job's stop marker if it names `attempt`; `Ok(true)` when it did.
    ///
    /// # Errors
    /// Connection errors.
    pub(crate) async fn acknowledge_stop(
        &self,
        keys: &JobKeys,
        attempt: u64,
    ) -> Result<bool, Error> {
        match self {
            Backend::Redis(t) => super::redis::jobs::acknowledge_stop(t, keys, attempt).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::jobs::acknowledge_stop(t, keys.state(), attempt).await
            }
        }
    }

    /// The job's stop marker's remaining time by the server's clock; `None` once it is gone.
    ///
    /// # Errors
    /// Connection errors.
    pub(crate) async fn stop_remaining(&self, keys: &JobKeys) -> Result<Option<Duration>, Error> {
        match self {
            Backend::Redis(t) => super::redis::jobs::stop_remaining(t, keys).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::jobs::stop_remaining(t, keys.state()).await,
        }
    }

    /// Forgets the job (deletes all it stores), unless a live attempt is not the one `live`
    /// names, in one conditional write.
    ///
    /// # Errors
    /// Connection errors; a timeout under constant contention.
    pub(crate) async fn reset_job(&self, keys: &JobKeys, live: Named) -> Result<ResetJob, Error> {
        match self {
            Backend::Redis(t) => super::redis::jobs::reset_job(t, keys, live).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::jobs::reset_job(t, keys.state(), live).await,
        }
    }
}
