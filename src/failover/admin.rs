//! Operator tools on a job: read its full status, follow its changes, release a hung holder's
//! attempt, forget the job. The `baton` command's `status`, `watch`, `fail` and `reset` are thin
//! wrappers around these.

use serde::Serialize;

use super::keys::JobKeys;
use super::named::attempt_matches;
pub use super::named::{FailAttempt, ResetJob};
use super::protocol::{parse_attempt, parse_lease, parse_state, Lease, State};
use super::status::{job_state, JobStatus};
use super::Failover;
use super::IntoJob;
use crate::backend::redis::{Expect, HubMsg, Subscription};
use crate::backend::Backend;
use crate::error::Error;
pub use crate::lease::store::Expected;

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
/// [`JobWatch::next`]) that ends once the job is `DONE` or `EXHAUSTED` (or the client stops).
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
    pub async fn next(&mut self) -> Option<Result<JobChange, Error>> {
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

/// `GET` and `PTTL` of the state, then of the lease: what `job_status` and `fail_attempt` read
/// first.
fn state_and_lease_reads(p: &mut redis::Pipeline, keys: &JobKeys) {
    p.cmd("GET")
        .arg(keys.state())
        .cmd("PTTL")
        .arg(keys.state())
        .cmd("GET")
        .arg(keys.lease())
        .cmd("PTTL")
        .arg(keys.lease());
}

/// The reads of [`Failover::job_status`] (six replies: state, its PTTL, lease, its PTTL, fence,
/// failure), appended to `p`: also what the listing of everything under a prefix pipelines for
/// a batch of jobs.
pub(crate) fn status_reads(p: &mut redis::Pipeline, keys: &JobKeys) {
    state_and_lease_reads(p, keys);
    p.cmd("GET")
        .arg(keys.fence())
        .cmd("GET")
        .arg(keys.failure());
}

/// How many replies [`status_reads`] adds.
pub(crate) const STATUS_READS: usize = 6;

/// Job `key`'s status from the replies of [`status_reads`].
///
/// # Errors
/// [`Error::UnexpectedReply`] for another number of replies or an unreadable one.
pub(crate) fn status_from_replies(
    key: String,
    values: &[redis::Value],
) -> Result<JobStatus, Error> {
    let [state, state_ttl, lease, lease_ttl, fence, failure] = values else {
        return Err(Error::UnexpectedReply {
            context: "reading a job's status",
            reply: format!("{} replies instead of {STATUS_READS}", values.len()),
        });
    };
    let state = job_state(parse_state(state)?, parse_lease(lease, lease_ttl)?);
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    Ok(JobStatus {
        key,
        state,
        state_ttl_ms: match state_ttl {
            redis::Value::Int(n) if *n >= 0 => Some(*n as u64),
            _ => None,
        },
        fencing_token: text(fence).and_then(|f| parse_attempt(f.as_bytes())),
        last_failure: text(failure),
    })
}

impl Failover {
    /// Reads everything stored about a job (plain reads on the shared connection).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn job_status(&self, job: impl IntoJob) -> Result<JobStatus, Error> {
        let config = job.into_job()?;
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(t) = &self.backend {
            return super::pg::job_status(t, config).await;
        }
        let keys = JobKeys::new(&config.prefix, &config.key);
        let mut conn = self.transport()?.node(keys.state()).await?.conn();
        let mut p = redis::pipe();
        p.ignore_errors();
        status_reads(&mut p, &keys);
        let values: Vec<redis::Value> = p.query_async(&mut conn).await?;
        status_from_replies(config.key, &values)
    }

    /// Follows a job's changes (grants, done, failures) through its pub/sub channel.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors while subscribing.
    pub async fn watch_job(&self, job: impl IntoJob) -> Result<JobWatch, Error> {
        let config = job.into_job()?;
        let keys = JobKeys::new(&config.prefix, &config.key);
        let sub = match &self.backend {
            Backend::Redis(t) => t.hub.subscribe(keys.channel()).await?,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.subscribe(keys.state()).await?,
        };
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
        attempt_matches(expected, 0)?;
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(t) = &self.backend {
            return super::pg::fail_attempt(t, config, expected, reason).await;
        }
        let keys = JobKeys::new(&config.prefix, &config.key);
        for _ in 0..20 {
            let deadline =
                tokio::time::Instant::now() + self.transport()?.settings.response_timeout * 10;
            let node = self.transport()?.node(keys.state()).await?;
            let mut conn = node.pool.get(deadline).await?;
            let values = conn
                .watch_read(&[keys.state(), keys.lease()], |p| {
                    state_and_lease_reads(p, &keys)
                })
                .await?;
            let [state, state_ttl, lease, lease_ttl] = values.as_slice() else {
                conn.defer_unwatch();
                return Err(Error::UnexpectedReply {
                    context: "reading a job before releasing it",
                    reply: format!("{} replies instead of 4", values.len()),
                });
            };
            let parsed = (parse_state(state), parse_lease(lease, lease_ttl));
            let attempt = match parsed {
                (Ok(State::Attempt(n)), Ok(Lease::Held { .. })) => n,
                (Ok(State::Corrupt(value)), _) => {
                    conn.defer_unwatch();
                    return Err(Error::CorruptState {
                        key: keys.state().to_string(),
                        value,
                    });
                }
                (Err(e), _) | (_, Err(e)) => {
                    conn.defer_unwatch();
                    return Err(e);
                }
                _ => {
                    conn.defer_unwatch();
                    return Ok(FailAttempt::NotLive);
                }
            };
            if !attempt_matches(expected, attempt)? {
                conn.defer_unwatch();
                return Ok(FailAttempt::Another(attempt));
            }
            // Keep the failure note as long as the state itself.
            let ttl = match state_ttl {
                redis::Value::Int(n) if *n > 0 => *n as u64,
                _ => config.retention.as_millis() as u64,
            };
            let mut tx = conn.transaction();
            tx.cmd("DEL")
                .arg(keys.lease())
                .cmd("SET")
                .arg(keys.failure())
                .arg(format!(
                    "attempt {attempt} released by an operator: {reason}"
                ))
                .arg("PX")
                .arg(ttl)
                .cmd(node.publish)
                .arg(keys.channel())
                .arg("failed");
            match conn.exec(tx).await? {
                None => {
                    continue;
                }
                Some(replies) => {
                    // Every sub-reply: a command can fail inside a transaction that still
                    // applies the others.
                    crate::backend::redis::check_replies(
                        "releasing an attempt",
                        &replies,
                        &[Expect::Int, Expect::Ok, Expect::Int],
                    )?;
                    return Ok(FailAttempt::Released(attempt));
                }
            }
        }
        Err(Error::Timeout {
            during: "releasing an attempt under constant contention",
        })
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
        if let Some(e) = live {
            attempt_matches(e, 0)?;
        }
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(t) = &self.backend {
            return super::pg::reset_job(t, config, live).await;
        }
        let keys = JobKeys::new(&config.prefix, &config.key);
        for _ in 0..20 {
            let deadline =
                tokio::time::Instant::now() + self.transport()?.settings.response_timeout * 10;
            let node = self.transport()?.node(keys.state()).await?;
            let mut conn = node.pool.get(deadline).await?;
            let values = conn
                .watch_read(&[keys.state(), keys.lease()], |p| {
                    state_and_lease_reads(p, &keys)
                })
                .await?;
            let [state, _, lease, lease_ttl] = values.as_slice() else {
                conn.defer_unwatch();
                return Err(Error::UnexpectedReply {
                    context: "reading a job before resetting it",
                    reply: format!("{} replies instead of 4", values.len()),
                });
            };
            // A corrupt state is reset all the same: forgetting it is the way out.
            if let (Ok(State::Attempt(n)), Ok(Lease::Held { .. })) =
                (parse_state(state), parse_lease(lease, lease_ttl))
            {
                let named = match live {
                    Some(e) => attempt_matches(e, n)?,
                    None => false,
                };
                if !named {
                    conn.defer_unwatch();
                    return Ok(ResetJob::Live(n));
                }
            }
            let mut tx = conn.transaction();
            tx.cmd("DEL")
                .arg(keys.state())
                .arg(keys.lease())
                .arg(keys.fence())
                .arg(keys.failure());
            match conn.exec(tx).await? {
                None => continue,
                Some(replies) => {
                    crate::backend::redis::check_replies(
                        "resetting a job",
                        &replies,
                        &[Expect::Int],
                    )?;
                    return Ok(ResetJob::Reset);
                }
            }
        }
        Err(Error::Timeout {
            during: "resetting a job under constant contention",
        })
    }
}
