//! Operator tools on a job: read its full status, follow its changes, release a hung holder's
//! attempt, replace (stop) a live attempt and wait until its holder has let go, forget the job.
//! The `baton` command's `status`, `watch`, `fail` and `reset` are thin wrappers around these.

use serde::Serialize;

use super::keys::JobKeys;
use super::Failover;
use super::IntoJob;
use crate::backend::jobs::{JobStatus, Named};
use crate::error::{ConfigError, Error};
pub use crate::lease::store::Expected;
pub use crate::util::jobs::{FailAttempt, Replaced, ResetJob};
use crate::util::pubsub::{HubMsg, Subscription};

/// One change of a followed job; see [`Failover::watch_job`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct JobChange {
    /// The channel message (`acquired:N`, `done`, `failed`, `released`, `exhausted`), or
    /// `resync` after the pub/sub connection was re-established.
    pub message: String,
    /// The job's status right after the message.
    pub status: JobStatus,
}

/// A followed job: a [`Stream`](tokio_stream::Stream) of [`JobChange`]s (or call
/// [`JobWatch::next_event`]) that ends once the job is `DONE` or `EXHAUSTED` (or the client stops).
pub struct JobWatch {
    failover: Failover,
    job: super::FailoverConfig,
    sub: Subscription,
    finished: bool,
    /// The status read for the last message, in flight.
    reading: Option<StatusRead>,
}

type StatusRead =
    std::pin::Pin<Box<dyn std::future::Future<Output = (String, Result<JobStatus, Error>)> + Send>>;

impl std::fmt::Debug for JobWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobWatch")
            .field("key", &self.job.key)
            .finish_non_exhaustive()
    }
}

impl JobWatch {
    /// The next change, or `None` once the job is `DONE` or `EXHAUSTED` (or the client stops).
    ///
    /// # Errors
    /// Connection errors while reading the status; the watch can go on after them.
    ///
    /// # Cancel safety
    /// Cancel safe: a change whose status read is under way is kept and returned by the next
    /// call.
    pub async fn next_event(&mut self) -> Option<Result<JobChange, Error>> {
        std::future::poll_fn(|cx| {
            tokio_stream::Stream::poll_next(std::pin::Pin::new(&mut *self), cx)
        })
        .await
    }
}

impl tokio_stream::Stream for JobWatch {
    type Item = Result<JobChange, Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            if let Some(read) = this.reading.as_mut() {
                let Poll::Ready((message, status)) = read.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                this.reading = None;
                return Poll::Ready(Some(status.map(|status| {
                    this.finished = status.is_finished();
                    JobChange { message, status }
                })));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            let message = match this.sub.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(HubMsg::Message(m))) => m,
                Poll::Ready(Some(HubMsg::Reconnected)) => "resync".to_string(),
            };
            let (failover, job) = (this.failover.clone(), this.job.clone());
            this.reading = Some(Box::pin(async move {
                (message, failover.job_status(job).await)
            }));
        }
    }
}

/// The live attempt `expected` names, for the store to compare with what it reads.
///
/// # Errors
/// A [`ConfigError`] for an expectation a job cannot meet (a fencing token, a holder).
fn named(expected: &Expected) -> Result<Named, ConfigError> {
    match expected {
        Expected::Attempt(n) => Ok(Named::Attempt(*n)),
        Expected::Any => Ok(Named::Any),
        _ => Err(ConfigError::invalid(
            "expected",
            "an attempt number or any (a job is named by its attempt)",
        )),
    }
}

impl Failover {
    /// Reads everything stored about a job (plain reads on the shared connection).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn job_status(&self, job: impl IntoJob) -> Result<JobStatus, Error> {
        let config = job.into_job()?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        self.backend.job_status(&keys, config.key).await
    }

    /// Follows a job's changes (grants, done, failures) through its pub/sub channel.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors while subscribing.
    pub async fn watch_job(&self, job: impl IntoJob) -> Result<JobWatch, Error> {
        let config = job.into_job()?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        let sub = self.backend.watch_job(&keys).await?;
        Ok(JobWatch {
            failover: self.clone(),
            job: config,
            sub,
            finished: false,
            reading: None,
        })
    }

    /// Releases the current attempt of a job as an operator, if it is the one `expected`
    /// names ([`Expected::Attempt`] with the attempt shown; [`Expected::Any`] for whichever
    /// is live): the lease is deleted and `failed` is published, so a backup takes over at
    /// once (the holder hears `failed` on the job's channel and stops). The reason is recorded
    /// like a holder's own. The check and the release are one transaction: an attempt granted
    /// after the operator looked is left alone.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name or an expectation other than an attempt or
    /// any; [`Error::CorruptState`] when the state is not baton's; connection errors.
    pub async fn fail_attempt(
        &self,
        job: impl IntoJob,
        expected: &Expected,
        reason: &str,
    ) -> Result<FailAttempt, Error> {
        let config = job.into_job()?;
        let named = named(expected)?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        self.backend
            .fail_attempt(&keys, named, reason, config.lease, config.retention)
            .await
    }

    /// Stops a job's live attempt wherever it runs, if it is the one `expected` names
    /// ([`Expected::Attempt`], or [`Expected::Any`]), and ends the job without a retry: in one
    /// transaction (script or statement), the job becomes `DONE` (keeping its retention, so its
    /// waiting backups end with `CompletedElsewhere` and none runs it again; an older baton
    /// reads plain `DONE`), its lease is deleted, its failure note says `replaced by BY`, a
    /// stop marker is set for the old lease's remaining time, and `replaced:N:BY` is published
    /// on the job's channel. The holder hears it and stops its work at once (its worker
    /// reports [`Event::LeaseLost`](super::Event::LeaseLost) with the reason `replaced by BY`;
    /// `baton run` stops PROGRAM as on any lost lease); once its work has stopped (its attempt
    /// handle is dropped, or `done`/`fail` called), the worker deletes the marker. A holder
    /// that cannot hear (frozen, cut off) stops by its own lease's end, when the marker
    /// expires: [`wait_out_stop`](Self::wait_out_stop) waits for either.
    ///
    /// When `job` is a scheduled occurrence's configuration
    /// ([`FailoverConfig::for_occurrence`](super::FailoverConfig::for_occurrence)), the
    /// occurrence is recorded `replaced` in the schedule's record (best effort, as every
    /// record write: if it is lost, the history shows the job's own `done`).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name or an expectation other than an attempt or
    /// any; [`Error::CorruptState`] when the state is not baton's; connection errors.
    pub async fn replace_attempt(
        &self,
        job: impl IntoJob,
        expected: &Expected,
        by: &str,
    ) -> Result<Replaced, Error> {
        let config = job.into_job()?;
        let named = named(expected)?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        // The name travels in a channel message and a note: keep it to one bounded line.
        let by: String = super::worker::truncate(by, 200)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let replaced = self
            .backend
            .replace_attempt(&keys, named, &by, config.lease, config.retention)
            .await?;
        if let (Replaced::Stopped { .. }, Some(record)) = (
            replaced,
            super::record::Recorder::of(&self.backend, &config),
        ) {
            record
                .write_now(super::record::RecordChange::Outcome {
                    outcome: super::record::RecordedOutcome::Replaced,
                    note: Some(format!("replaced by {by}")),
                })
                .await;
        }
        Ok(replaced)
    }

    /// Deletes `job`'s stop marker if it names `attempt`: what a replaced holder's worker does
    /// by itself once the attempt's work has stopped (see
    /// [`replace_attempt`](Self::replace_attempt)), for code that stops the work some other way.
    /// `Ok(true)` when a marker was deleted. One conditional delete, fenced to the attempt: a
    /// marker set for a later attempt is kept.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn acknowledge_stop(&self, job: impl IntoJob, attempt: u64) -> Result<bool, Error> {
        let config = job.into_job()?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        self.backend.acknowledge_stop(&keys, attempt).await
    }

    /// Waits until `job`'s stop marker is gone: its replaced holder acknowledged that its work
    /// stopped, or the old lease's time ran out by the server's clock (a holder stops its work
    /// by then even when it cannot be reached: no work outlives its lease). Returns at once
    /// when there is no marker. Polls the marker, at most every quarter second.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn wait_out_stop(&self, job: impl IntoJob) -> Result<(), Error> {
        let config = job.into_job()?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        while let Some(left) = self.backend.stop_remaining(&keys).await? {
            tokio::time::sleep(left.clamp(
                std::time::Duration::from_millis(1),
                std::time::Duration::from_millis(250),
            ))
            .await;
        }
        Ok(())
    }

    /// Forgets a job: deletes its state, lease, fence and failure keys, so the next worker runs
    /// it again as attempt 1. Workers still waiting on it report `StateLost`.
    ///
    /// A job with a live attempt is reset only when `live` names that attempt
    /// ([`Expected::Attempt`], or [`Expected::Any`]); with `None`, only a job with no live
    /// attempt is. Otherwise nothing is done ([`ResetJob::Live`]). The check and the deletion
    /// are one transaction.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name or an expectation other than an attempt or
    /// any; [`Error::CorruptState`] when the state is not baton's; connection errors.
    pub async fn reset_job(
        &self,
        job: impl IntoJob,
        live: Option<&Expected>,
    ) -> Result<ResetJob, Error> {
        let config = job.into_job()?;
        let live = match live {
            Some(e) => named(e)?,
            None => Named::None,
        };
        let keys = JobKeys::new(&config.prefix, &config.key);
        self.backend.reset_job(&keys, live).await
    }
}
