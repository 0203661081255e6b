//! Scheduled jobs: each occurrence of a [`Schedule`] run exactly once across the fleet, as a
//! job of its own (`KEY@DIGEST@TICK`) with the coordinator's attempts, backups and fencing.
//!
//! - [`Failover::occurrence`] binds a run to its occurrence by the **server's** clock, and
//!   [`Failover::wait_until_due`] waits for a tick that lies ahead (no run starts early);
//! - [`FailoverConfig::for_occurrence`] makes the occurrence's job configuration;
//! - [`Failover::schedule`] is the long-running form: one run per tick, reported as a stream.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::FailoverConfig;
use super::run::{Attempt, RunOutcome};
use super::status::JobState;
use super::Failover;
use crate::error::{ConfigError, Error};
use crate::schedule::{Occurrence, Schedule};

/// The longest sleep between two readings of the server's clock while waiting for a tick:
/// the local clock's drift over it stays far below a millisecond.
const MAX_NAP: Duration = Duration::from_secs(300);
/// How long the long-running form waits before reading the clock again after an error.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

impl FailoverConfig {
    /// This configuration for the job that runs `occurrence`: the key becomes
    /// `KEY@DIGEST@TICK` ([`Occurrence::job_key`]), and the retention of its `DONE`/`EXHAUSTED`
    /// `retention`, or by default [`Occurrence::default_retention`] (two periods, at least ten
    /// minutes and twice the lease). Everything else is kept.
    ///
    /// # Errors
    /// [`ConfigError`] when the occurrence's key is too long, or `retention` breaks the
    /// coordinator's rules (below twice the lease).
    pub fn for_occurrence(
        &self,
        occurrence: &Occurrence,
        retention: Option<Duration>,
    ) -> Result<FailoverConfig, ConfigError> {
        let mut builder = FailoverConfig::builder(occurrence.job_key(&self.key))
            .prefix(self.prefix.clone())
            .lease(self.lock_timeout)
            .max_attempts(self.max_attempts)
            .retention(retention.unwrap_or_else(|| occurrence.default_retention(self.lock_timeout)))
            .keepalive(self.keepalive)
            .retry_delay(self.retry_delay)
            .rejoin_after_fail(self.rejoin_after_fail)
            .status_level(self.status_level)
            .event_capacity(self.event_capacity)
            .max_run(self.max_run);
        if let Some(name) = &self.worker_name {
            builder = builder.worker_name(name.clone());
        }
        if let Some(w) = self.replica_ack {
            builder = builder.replica_ack(w.replicas, w.timeout);
        }
        builder.build()
    }
}

impl Failover {
    /// The coordination server's clock: Redis `TIME` on the node that serves job `key`, or
    /// PostgreSQL's `clock_timestamp()`. Hosts whose own clocks disagree agree on this.
    ///
    /// # Errors
    /// Connection errors and timeouts.
    pub async fn server_time(&self, key: &str) -> Result<SystemTime, Error> {
        Ok(self.backend.server_time(key).await?.now)
    }

    /// The occurrence of `schedule` that a run of job `key` starting now binds to, by the
    /// server's clock ([`Schedule::occurrence_at`]): the latest tick at or before now plus the
    /// early tolerance. Its tick may lie ahead: wait for it with [`Failover::wait_until_due`].
    ///
    /// # Errors
    /// Connection errors and timeouts; [`Error::Config`] when the server's time is outside
    /// the schedule's calendar.
    pub async fn occurrence(&self, schedule: &Schedule, key: &str) -> Result<Occurrence, Error> {
        let now = self.backend.server_time(key).await?.now;
        schedule
            .occurrence_at(now)
            .ok_or_else(|| outside_calendar(schedule, now))
    }

    /// Waits until `occurrence`'s tick has come by the server's clock (at once when it has):
    /// the clock is read again after each sleep, so a run never starts before its tick.
    ///
    /// # Errors
    /// Connection errors and timeouts.
    pub async fn wait_until_due(&self, occurrence: &Occurrence, key: &str) -> Result<(), Error> {
        loop {
            let t = self.backend.server_time(key).await?;
            let left = occurrence.until_due(t.now);
            if left.is_zero() {
                return Ok(());
            }
            // The server read its clock before its reply arrived, so sleeping `left` from
            // the arrival never wakes early by the server's clock (unless the clocks' rates
            // differ, which the next reading catches).
            tokio::time::sleep_until(t.received + left.min(MAX_NAP)).await;
        }
    }

    /// Waits for the next occurrence of `schedule` to run after the tick `last` (`None`: the
    /// first tick after now), by the server's clock ([`Failover::wait_until_due`]'s way), and
    /// returns it once due: the loop of a long-running scheduler, [`Failover::schedule`]'s
    /// and `baton schedule`'s. A caller woken past that occurrence's binding window (a
    /// stalled process, a suspended host, the clock unreadable for a while) gets the
    /// occurrence a run starting now binds to instead ([`Schedule::occurrence_at`]): running
    /// the stale tick would start it outside its window and, once its `DONE` expired, run it
    /// twice. The ticks in between are this caller's to miss; other servers ran them.
    ///
    /// # Errors
    /// Connection errors and timeouts (call again with the same `last` to go on waiting);
    /// [`Error::Config`] when the schedule has no further tick (past year 5000).
    pub async fn next_occurrence(
        &self,
        schedule: &Schedule,
        key: &str,
        last: Option<SystemTime>,
    ) -> Result<Occurrence, Error> {
        let mut target: Option<Occurrence> = None;
        loop {
            let t = self.backend.server_time(key).await?;
            let waited = match target.take() {
                Some(o) => o,
                None => schedule
                    .next_after(last.unwrap_or(t.now))
                    .and_then(|tick| schedule.occurrence_of_tick(tick))
                    .ok_or_else(|| outside_calendar(schedule, t.now))?,
            };
            let occurrence = match schedule.occurrence_at(t.now) {
                Some(bound) if bound.tick() > waited.tick() => {
                    tracing::warn!(
                        key,
                        waited = waited.id(),
                        now = bound.id(),
                        "woken past the occurrence waited for: running the one a run \
                         starting now binds to"
                    );
                    bound
                }
                _ => waited,
            };
            let left = occurrence.until_due(t.now);
            if left.is_zero() {
                return Ok(occurrence);
            }
            target = Some(occurrence);
            tokio::time::sleep_until(t.received + left.min(MAX_NAP)).await;
        }
    }

    /// The latest tick of `schedule` at or before the server's clock now, as an occurrence of
    /// `config`'s job, with that job's state: what catching up looks at (run it unless it is
    /// `Done` or `Exhausted`: every server may have been down at its tick). `None` before the
    /// schedule's first tick. [`CatchUp::Last`] and `baton schedule --catch-up last` use it.
    ///
    /// # Errors
    /// Connection errors and timeouts; [`Error::Config`] when `retention` does not suit the
    /// occurrence's job ([`FailoverConfig::for_occurrence`]).
    pub async fn latest_past_occurrence(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        retention: Option<Duration>,
    ) -> Result<Option<(Occurrence, JobState)>, Error> {
        let now = self.server_time(config.key()).await?;
        let Some(occurrence) = schedule
            .latest_at_or_before(now)
            .and_then(|t| schedule.occurrence_of_tick(t))
        else {
            return Ok(None);
        };
        let job = config.for_occurrence(&occurrence, retention)?;
        let state = self.job_state(job).await?;
        Ok(Some((occurrence, state)))
    }

    /// Runs `work` at every tick of `schedule`, each occurrence as a job of its own through
    /// [`Failover::run`] (attempts, backups, keepalive and fencing as for any job; `config`
    /// names the key and the settings, [`FailoverConfig::for_occurrence`] makes each
    /// occurrence's job), and reports one [`OccurrenceReport`] per occurrence as the stream's
    /// items. Run it on every server: each occurrence runs once across the fleet.
    ///
    /// It waits for the next tick (by the server's clock), unless
    /// [`CatchUp::Last`] first runs the latest past tick that is neither done nor exhausted.
    /// An occurrence still running when the next tick comes does not block it (each has its
    /// own job), unless [`Overlap::Skip`] reports the new one as skipped.
    ///
    /// `work` gets the occurrence and the attempt (whose `key` is the occurrence's job).
    /// Dropping the stream stops it: occurrences this worker holds are failed (a backup takes
    /// over) and their work aborted; [`Scheduled::stop`] does the same and lets the stream
    /// report them before it ends.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// use baton::{FailoverConfig, Schedule, ScheduleOptions};
    /// use tokio_stream::StreamExt;
    ///
    /// let client = baton::Client::connect("redis://127.0.0.1:6379/").await?;
    /// let nightly = Schedule::cron_in("0 2 * * *", "Europe/Paris")?;
    /// let config = FailoverConfig::builder("nightly-report").build()?;
    /// let mut runs = client.failover().schedule(
    ///     nightly,
    ///     config,
    ///     ScheduleOptions::default(),
    ///     |occurrence, attempt| async move {
    ///         println!("report for {} (fence {})", occurrence.id(), attempt.fencing_token);
    ///         Ok::<_, std::io::Error>(())
    ///     },
    /// );
    /// while let Some(report) = runs.next().await {
    ///     println!("{}: {:?}", report.occurrence.id(), report.outcome);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn schedule<F, Fut, T, E>(
        &self,
        schedule: Schedule,
        config: FailoverConfig,
        options: ScheduleOptions,
        work: F,
    ) -> Scheduled<T, E>
    where
        F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = self.backend.cancel().child_token();
        let driver = Driver {
            failover: self.clone(),
            schedule,
            config,
            options,
            work,
            tx,
            stop: stop.clone(),
            running: HashMap::new(),
        };
        let task = self.backend.tracker().spawn(driver.drive());
        Scheduled {
            rx,
            stop,
            _task: AbortOnDrop(task),
        }
    }
}

fn outside_calendar(schedule: &Schedule, now: SystemTime) -> Error {
    Error::Config(ConfigError::invalid(
        "schedule",
        format!("{schedule} has no tick around the server's time {now:?}"),
    ))
}

/// What the long-running form does with a tick whose server was down: [`ScheduleOptions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CatchUp {
    /// Wait for the next tick (the default).
    #[default]
    None,
    /// First run the latest past tick if it is neither done nor exhausted (every server was
    /// down then).
    Last,
}

/// What the long-running form does with a tick that comes while an earlier occurrence still
/// runs on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// Run it: each occurrence has its own job and holder (the default).
    #[default]
    Allow,
    /// Report it as [`OccurrenceOutcome::Skipped`] and do not run it here.
    Skip,
}

/// Options of [`Failover::schedule`]; `ScheduleOptions::default()` or the builder.
#[derive(Debug, Clone, Default)]
pub struct ScheduleOptions {
    pub(crate) catch_up: CatchUp,
    pub(crate) overlap: Overlap,
    pub(crate) retention: Option<Duration>,
}

impl ScheduleOptions {
    /// Starts from the defaults: no catch-up, overlapping occurrences allowed, each
    /// occurrence's retention by [`Occurrence::default_retention`].
    pub fn builder() -> ScheduleOptionsBuilder {
        ScheduleOptionsBuilder {
            opts: ScheduleOptions::default(),
        }
    }
    /// The catch-up rule.
    pub fn catch_up(&self) -> CatchUp {
        self.catch_up
    }
    /// The overlap rule.
    pub fn overlap(&self) -> Overlap {
        self.overlap
    }
    /// The retention of each occurrence's outcome, when set.
    pub fn retention(&self) -> Option<Duration> {
        self.retention
    }
}

/// Builds [`ScheduleOptions`].
#[derive(Debug, Clone)]
pub struct ScheduleOptionsBuilder {
    opts: ScheduleOptions,
}

impl ScheduleOptionsBuilder {
    /// What to do with the latest past tick at start (default [`CatchUp::None`]).
    pub fn catch_up(mut self, c: CatchUp) -> Self {
        self.opts.catch_up = c;
        self
    }
    /// What to do with a tick while an earlier occurrence runs (default [`Overlap::Allow`]).
    pub fn overlap(mut self, o: Overlap) -> Self {
        self.opts.overlap = o;
        self
    }
    /// How long each occurrence's `DONE`/`EXHAUSTED` is kept (default: two periods, at least
    /// ten minutes).
    pub fn retention(mut self, d: Duration) -> Self {
        self.opts.retention = Some(d);
        self
    }
    /// The options (every combination is valid; the retention is checked against each
    /// occurrence's configuration by [`FailoverConfig::for_occurrence`]).
    ///
    /// # Errors
    /// None today; the `Result` keeps the builders' one shape.
    pub fn build(self) -> Result<ScheduleOptions, ConfigError> {
        Ok(self.opts)
    }
}

/// One occurrence as [`Failover::schedule`] saw it on this worker.
#[derive(Debug)]
#[non_exhaustive]
pub struct OccurrenceReport<T, E = String> {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The job that ran it (`KEY@DIGEST@TICK`).
    pub job_key: String,
    /// How it ended here.
    pub outcome: OccurrenceOutcome<T, E>,
}

/// How one occurrence ended on this worker.
#[derive(Debug)]
#[non_exhaustive]
pub enum OccurrenceOutcome<T, E = String> {
    /// It ran as a job: [`RunOutcome::Done`] (this worker ran it), `CompletedElsewhere`
    /// (another did), `Failed` (this worker's attempt failed; a backup retries),
    /// `Exhausted`, …
    Ran(RunOutcome<T, E>),
    /// [`Overlap::Skip`]: an earlier occurrence still ran here at its tick; not run here.
    Skipped,
    /// Baton could not coordinate it (its job's error: connection, corrupt state, …).
    Error(Error),
}

/// The stream of [`Failover::schedule`]: one [`OccurrenceReport`] per occurrence, until
/// stopped. Dropping it stops everything it runs.
pub struct Scheduled<T, E = String> {
    rx: mpsc::UnboundedReceiver<OccurrenceReport<T, E>>,
    stop: CancellationToken,
    _task: AbortOnDrop,
}

impl<T, E> std::fmt::Debug for Scheduled<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduled")
            .field("stopped", &self.stop.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<T, E> Scheduled<T, E> {
    /// Stops waiting for ticks and stops the occurrences running here (their attempts are
    /// failed, so backups take over); the stream reports them, then ends.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl<T, E> tokio_stream::Stream for Scheduled<T, E> {
    type Item = OccurrenceReport<T, E>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Driver<F, T, E> {
    failover: Failover,
    schedule: Schedule,
    config: FailoverConfig,
    options: ScheduleOptions,
    work: F,
    tx: mpsc::UnboundedSender<OccurrenceReport<T, E>>,
    stop: CancellationToken,
    /// The occurrence of each running task, to report one that did not finish by itself.
    running: HashMap<tokio::task::Id, Occurrence>,
}

type Finished<T, E> = OccurrenceReport<T, E>;

impl<F, Fut, T, E> Driver<F, T, E>
where
    F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    async fn drive(mut self) {
        let key = self.config.key.clone();
        let mut runs: JoinSet<Finished<T, E>> = JoinSet::new();
        let mut last: Option<SystemTime> = None;
        if self.options.catch_up == CatchUp::Last {
            // Tried until it can be checked: a server unreachable at start is when catching
            // up matters most (every server may have been down at the tick). A configuration
            // error would fail every try, and each occurrence reports it anyway.
            loop {
                match self.catch_up().await {
                    Ok(Some((occurrence, run))) => {
                        last = Some(occurrence.tick());
                        if run {
                            self.start(&mut runs, occurrence);
                        }
                        break;
                    }
                    Ok(None) => break,
                    Err(error @ Error::Config(_)) => {
                        tracing::warn!(key, error = %error, "the latest past occurrence is not caught up");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(
                            key,
                            error = %error,
                            "the latest past occurrence could not be checked; trying again"
                        );
                        tokio::select! {
                            () = self.stop.cancelled() => break,
                            () = tokio::time::sleep(RETRY_AFTER_ERROR) => {}
                        }
                    }
                }
            }
        }
        loop {
            let Some(occurrence) = self.next_due(&key, last, &mut runs).await else {
                break;
            };
            last = Some(occurrence.tick());
            // A run that ended while the clock was read is over, even if not joined yet:
            // report it first, so it neither counts as running nor reports after this tick.
            while let Some(done) = runs.try_join_next_with_id() {
                self.finished(done);
            }
            if self.options.overlap == Overlap::Skip && !runs.is_empty() {
                let job_key = occurrence.job_key(&key);
                tracing::info!(
                    key = %job_key,
                    "an earlier occurrence still runs here: this one is skipped (overlap skip)"
                );
                let _ = self.tx.send(OccurrenceReport {
                    occurrence,
                    job_key,
                    outcome: OccurrenceOutcome::Skipped,
                });
                continue;
            }
            self.start(&mut runs, occurrence);
        }
        // Stopped: aborting a run drops its worker, which fails an attempt it holds (a
        // backup takes over); each is reported as stopped.
        runs.abort_all();
        while let Some(done) = runs.join_next_with_id().await {
            let report = match done {
                Ok((id, report)) => {
                    self.running.remove(&id);
                    report
                }
                Err(e) => match self.running.remove(&e.id()) {
                    Some(occurrence) => OccurrenceReport {
                        job_key: occurrence.job_key(&key),
                        occurrence,
                        outcome: OccurrenceOutcome::Ran(RunOutcome::Stopped),
                    },
                    None => continue,
                },
            };
            let _ = self.tx.send(report);
        }
    }

    /// The latest past tick and whether it still needs a run (neither done nor exhausted).
    async fn catch_up(&mut self) -> Result<Option<(Occurrence, bool)>, Error> {
        let found = self
            .failover
            .latest_past_occurrence(&self.schedule, &self.config, self.options.retention)
            .await?;
        Ok(found.map(|(occurrence, state)| {
            let run = !matches!(state, JobState::Done | JobState::Exhausted);
            (occurrence, run)
        }))
    }

    /// Waits for the next occurrence to run after `last` ([`Failover::next_occurrence`]),
    /// reporting runs that finish meanwhile; `None` once stopped or past the calendar's end.
    /// Clock errors are logged and retried every [`RETRY_AFTER_ERROR`].
    async fn next_due(
        &mut self,
        key: &str,
        last: Option<SystemTime>,
        runs: &mut JoinSet<Finished<T, E>>,
    ) -> Option<Occurrence> {
        let (failover, schedule, stop) = (
            self.failover.clone(),
            self.schedule.clone(),
            self.stop.clone(),
        );
        loop {
            let due = failover.next_occurrence(&schedule, key, last);
            tokio::pin!(due);
            let outcome = loop {
                tokio::select! {
                    () = stop.cancelled() => return None,
                    r = &mut due => break r,
                    Some(done) = runs.join_next_with_id(), if !runs.is_empty() => {
                        self.finished(done);
                    }
                }
            };
            match outcome {
                Ok(occurrence) => return Some(occurrence),
                Err(Error::Config(e)) => {
                    tracing::warn!(key, error = %e, "the schedule has no further tick");
                    stop.cancelled().await;
                    return None;
                }
                Err(error) => {
                    tracing::warn!(key, error = %error, "the server's clock could not be read");
                    let wake = Instant::now() + RETRY_AFTER_ERROR;
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return None,
                            () = tokio::time::sleep_until(wake) => break,
                            Some(done) = runs.join_next_with_id(), if !runs.is_empty() => {
                                self.finished(done);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Reports a run that ended (a panic in baton's run itself, which never happens by design,
    /// is contained by the task, logged, and reported as [`Error::Stopped`] for that
    /// occurrence).
    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, Finished<T, E>), tokio::task::JoinError>,
    ) {
        let report = match done {
            Ok((id, report)) => {
                self.running.remove(&id);
                report
            }
            Err(e) => match self.running.remove(&e.id()) {
                Some(occurrence) => {
                    tracing::error!(
                        occurrence = occurrence.id(),
                        error = %e,
                        "an occurrence's run ended abnormally"
                    );
                    OccurrenceReport {
                        job_key: occurrence.job_key(&self.config.key),
                        occurrence,
                        outcome: OccurrenceOutcome::Error(Error::Stopped),
                    }
                }
                None => return,
            },
        };
        let _ = self.tx.send(report);
    }

    fn start(&mut self, runs: &mut JoinSet<Finished<T, E>>, occurrence: Occurrence) {
        let failover = self.failover.clone();
        let mut work = self.work.clone();
        let job_key = occurrence.job_key(&self.config.key);
        let config = self
            .config
            .for_occurrence(&occurrence, self.options.retention);
        let tick = occurrence.clone();
        // The occurrence's span: its worker's `baton_worker` span (attempt, fencing token)
        // opens inside it.
        let span = tracing::info_span!(
            "baton_occurrence",
            key = %job_key,
            node = tracing::field::Empty,
            attempt = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        );
        let run = async move {
            let outcome = match config {
                Err(e) => OccurrenceOutcome::Error(Error::Config(e)),
                Ok(config) => {
                    let o = occurrence.clone();
                    match failover
                        .run(config, move |attempt| work(o.clone(), attempt))
                        .await
                    {
                        Ok(outcome) => OccurrenceOutcome::Ran(outcome),
                        Err(e) => OccurrenceOutcome::Error(e),
                    }
                }
            };
            OccurrenceReport {
                occurrence,
                job_key,
                outcome,
            }
        };
        let handle = runs.spawn(tracing::Instrument::instrument(run, span));
        self.running.insert(handle.id(), tick);
    }
}
