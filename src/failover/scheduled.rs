//! Scheduled jobs: each occurrence of a [`Schedule`] run exactly once across the fleet, as a
//! job of its own (`KEY@DIGEST@TICK`) with the coordinator's attempts, backups and fencing.
//!
//! - [`Failover::occurrence`] binds a run to its occurrence by the **server's** clock, and
//!   [`Failover::wait_until_due`] waits for a tick that lies ahead (no run starts early);
//!   [`Failover::wait_until`] waits for a jittered start ([`Occurrence::jittered_start`]);
//! - [`FailoverConfig::for_occurrence`] makes the occurrence's job configuration;
//! - [`Failover::schedule`] is the long-running form: one run per tick (at the tick, or at
//!   the tick plus its jitter with [`ScheduleOptionsBuilder::jitter`]), reported as a stream;
//!   each occurrence is recorded in the schedule's record and skipped while the schedule is
//!   paused ([`Failover::pause_schedule`]); the key's pending triggers
//!   ([`Failover::trigger_schedule`]) are read every
//!   [`ScheduleOptionsBuilder::trigger_poll`] and run as manual occurrences.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::config::FailoverConfig;
use super::run::{Attempt, RunOutcome};
use super::Failover;
use super::JobState;
use crate::error::{ConfigError, Error};
use crate::schedule::{Occurrence, Schedule};
use crate::util::mailbox;

/// The longest sleep between two readings of the server's clock while waiting for a tick:
/// the local clock's drift over it stays far below a millisecond.
const MAX_NAP: Duration = Duration::from_secs(300);
/// How long the long-running form waits before reading the clock again after an error.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
/// How many reports [`Scheduled`] keeps unread by default
/// ([`ScheduleOptionsBuilder::report_capacity`]): an hour of a one-minute schedule.
const DEFAULT_REPORT_CAPACITY: usize = 64;
/// The largest report capacity: like a worker's event capacity.
const MAX_REPORT_CAPACITY: usize = 65_536;
/// The shortest trigger poll ([`ScheduleOptionsBuilder::trigger_poll`]).
const MIN_TRIGGER_POLL: Duration = Duration::from_millis(10);

impl FailoverConfig {
    /// This configuration for the job that runs `occurrence`: the key becomes
    /// `KEY@DIGEST@TICK` ([`Occurrence::job_key`]), and the retention of its `DONE`/`EXHAUSTED`
    /// `retention`, or by default [`Occurrence::default_retention`] (two periods, at least ten
    /// minutes and twice the lease). Everything else is kept.
    ///
    /// The retention is never below [`Occurrence::retention_floor`] (the gap to the next tick
    /// plus its early tolerance and a margin): a run can still bind to the tick until then,
    /// and would run the occurrence again once its outcome expired. A shorter `retention` is
    /// raised to the floor with a warning (`tracing`, each call).
    ///
    /// # Errors
    /// [`ConfigError`] when the occurrence's key is too long, or `retention` breaks the
    /// coordinator's rules (below twice the lease) even before it is raised.
    pub fn for_occurrence(
        &self,
        occurrence: &Occurrence,
        retention: Option<Duration>,
    ) -> Result<FailoverConfig, ConfigError> {
        let (config, raised) = self.occurrence_config(occurrence, retention)?;
        if let Some(given) = raised {
            warn_raised(&config, given);
        }
        Ok(config)
    }

    /// [`FailoverConfig::for_occurrence`] without its warning: the configuration, and the
    /// given retention when the floor raised it (for the caller to say once).
    pub(crate) fn occurrence_config(
        &self,
        occurrence: &Occurrence,
        retention: Option<Duration>,
    ) -> Result<(FailoverConfig, Option<Duration>), ConfigError> {
        let mut builder = FailoverConfig::builder(occurrence.job_key(&self.key))
            .prefix(self.prefix.clone())
            .lease(self.lease)
            .max_attempts(self.max_attempts)
            .watchdog(self.watchdog)
            .retry_delay(self.retry_delay)
            .rejoin_after_fail(self.rejoin_after_fail)
            .status_level(self.status_level)
            .event_capacity(self.event_capacity)
            .max_hold(self.max_hold);
        if let Some(name) = &self.worker_name {
            builder = builder.worker_name(name.clone());
        }
        if let Some(w) = self.replica_ack {
            builder = builder.replica_ack(w.replicas, w.timeout);
        }
        let raised = match retention {
            // Checked as given first: a value the coordinator refuses stays a mistake to
            // report, not one the floor hides.
            Some(given) if given < occurrence.retention_floor() => {
                builder.clone().retention(given).build()?;
                Some(given)
            }
            _ => None,
        };
        let config = builder
            .retention(occurrence.retention(retention, self.lease))
            .build()?;
        Ok((config, raised))
    }
}

/// The warning of a retention raised to its occurrence's floor.
fn warn_raised(config: &FailoverConfig, given: Duration) {
    tracing::warn!(
        key = %config.key,
        given = ?given,
        kept = ?config.retention,
        "the retention is shorter than a run can still bind to the occurrence's tick: \
         its outcome is kept longer, so a late run does not run it again"
    );
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
        self.wait_until(key, occurrence.tick()).await
    }

    /// Waits until `at` has come by the server's clock (at once when it has), as
    /// [`Failover::wait_until_due`] waits for a tick: for a jittered start,
    /// `failover.wait_until(key, occurrence.jittered_start(key, jitter, lease))`
    /// ([`Occurrence::jittered_start`]). `key` picks the server whose clock is read (on a
    /// Redis Cluster, the node that serves it), as for [`Failover::occurrence`].
    ///
    /// # Errors
    /// Connection errors and timeouts.
    pub async fn wait_until(&self, key: &str, at: SystemTime) -> Result<(), Error> {
        loop {
            let t = self.backend.server_time(key).await?;
            let left = at.duration_since(t.now).unwrap_or(Duration::ZERO);
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
    /// It looks at a tick until the next one comes, and the occurrence's retention outlasts
    /// that ([`Occurrence::retention_floor`]): an occurrence run to `Done` is never read as
    /// `Absent` and run again.
    ///
    /// # Errors
    /// Connection errors and timeouts; [`Error::Config`] when `retention` does not suit the
    /// occurrence's job ([`FailoverConfig::for_occurrence`], whose warning this does not
    /// repeat).
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
        let (job, _) = config.occurrence_config(&occurrence, retention)?;
        let state = self.job_state(job).await?;
        Ok(Some((occurrence, state)))
    }

    /// Runs `work` at every tick of `schedule`, each occurrence as a job of its own through
    /// [`Failover::run`] (attempts, backups, watchdog and fencing as for any job; `config`
    /// names the key and the settings, [`FailoverConfig::for_occurrence`] makes each
    /// occurrence's job), and reports one [`OccurrenceReport`] per occurrence as the stream's
    /// items. Run it on every server: each occurrence runs once across the fleet.
    ///
    /// It waits for the next tick (by the server's clock), unless
    /// [`CatchUp::Last`] first runs the latest past tick that is neither done nor exhausted.
    /// With [`ScheduleOptionsBuilder::jitter`], each occurrence starts at its tick plus its
    /// jitter ([`Occurrence::jittered_start`], the same on every server; `config`'s lease caps
    /// it), by the server's clock; one found later (caught up) starts at once. A jitter longer
    /// than the schedule's period ([`Schedule::check_jitter`]) makes every occurrence report
    /// [`OccurrenceOutcome::Error`] with that [`Error::Config`], unrun.
    /// An occurrence still running when the next tick comes does not block it (each has its
    /// own job), unless [`ScheduleOptionsBuilder::overlap`] says otherwise: the rule looks at
    /// the whole fleet ([`Failover::overlap_decision`], after the pause is read):
    /// [`Overlap::Skip`] reports the new one [`OccurrenceOutcome::Skipped`] while any earlier
    /// occurrence runs anywhere, and [`Overlap::BufferOne`] makes it wait behind one (its
    /// holder waits before `work` starts; skipped if its window closes first).
    ///
    /// Each occurrence is recorded in the schedule's record ([`FailoverConfig::with_record`],
    /// with [`ScheduleOptionsBuilder::history`]). Just before it runs (after its jittered
    /// start), the schedule's pause is read once ([`Failover::schedule_pause`]): paused, the
    /// occurrence is reported [`OccurrenceOutcome::Paused`], recorded `skipped_paused` and not
    /// run; the next tick is waited for as always (the cadence is kept, paused ticks are not
    /// caught up).
    ///
    /// Every [`ScheduleOptionsBuilder::trigger_poll`] (5 s by default; one read per poll) it
    /// reads the key's pending triggers ([`Failover::trigger_schedule`], `baton trigger`) and
    /// starts each it has not started yet as a manual occurrence ([`Occurrence::manual`]), by
    /// the same path as a tick (the pause, the record; no jitter; started beside running
    /// occurrences whatever the overlap rule), reported like one; a run of it that ends
    /// final ([`RunOutcome::is_final`]) or paused clears the trigger.
    ///
    /// `work` gets the occurrence and the attempt (whose `key` is the occurrence's job).
    /// Dropping the stream stops it: occurrences this worker holds are failed (a backup takes
    /// over) and their work aborted; [`Scheduled::stop`] does the same and lets the stream
    /// report them before it ends.
    ///
    /// Reports wait for the caller in a bounded queue
    /// ([`ScheduleOptionsBuilder::report_capacity`], 64 by default): ticks never wait for the
    /// caller, and once that many reports wait unread the oldest is dropped for each new one,
    /// counted by [`Scheduled::dropped_reports`] (and logged as the count reaches each power
    /// of two). A caller that keeps the stream without polling it holds at most that many.
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
    /// while let Some(report) = runs.next_event().await {
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
        // Checked once, by this host's clock: only a cron expression's gaps depend on when.
        let jitter_error = schedule
            .check_jitter(options.jitter, SystemTime::now())
            .err();
        let capacity = options.report_capacity;
        Scheduled::spawn(self, capacity, |reports, stop| {
            Driver {
                failover: self.clone(),
                schedule,
                config,
                reports,
                options,
                work,
                stop,
                running: HashMap::new(),
                warned_retention: false,
                jitter_error,
                triggers: super::trigger::TriggerPoll::new(),
                next_poll: Instant::now(),
            }
            .drive()
        })
    }
}

/// Waits until `start` by the server's clock ([`Failover::wait_until`]), reading it again
/// every [`RETRY_AFTER_ERROR`] while it cannot be read (said once): the occurrence's job waits
/// for the server anyway, and a run stopped meanwhile is aborted with its task.
async fn wait_for_start(failover: &Failover, key: &str, start: SystemTime) {
    let mut said = false;
    loop {
        match failover.wait_until(key, start).await {
            Ok(()) => return,
            Err(error) => {
                if !said {
                    tracing::warn!(
                        key,
                        error = %error,
                        "the server's clock could not be read to wait for the jittered start; \
                         trying again"
                    );
                    said = true;
                }
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
            }
        }
    }
}

/// The schedule's pause as the occurrence is about to run (one read: [`Failover::schedule_pause`]),
/// read again every [`RETRY_AFTER_ERROR`] while it cannot be (said once), as
/// [`wait_for_start`] reads the clock: the occurrence's job needs the server anyway, and
/// running it unchecked could run a paused schedule. A configuration error is final.
pub(super) async fn read_pause(
    failover: &Failover,
    base: &FailoverConfig,
) -> Result<Option<super::record::Pause>, Error> {
    let mut said = false;
    loop {
        match failover.schedule_pause(base.clone()).await {
            Ok(pause) => return Ok(pause),
            // A backend that cannot keep the schedule's record cannot keep a pause either.
            Err(Error::Unsupported { .. }) => return Ok(None),
            Err(error @ Error::Config(_)) => return Err(error),
            Err(error) => {
                if !said {
                    tracing::warn!(
                        key = %base.key,
                        error = %error,
                        "the schedule's pause could not be read; trying again"
                    );
                    said = true;
                }
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
            }
        }
    }
}

/// Records `occurrence` skipped by `pause` in the schedule's record, best effort (a failed
/// write is a warning, as the workers' own record writes are): the tick is skipped either way.
pub(super) async fn record_paused(
    failover: &Failover,
    schedule: &Schedule,
    record: &super::record::RecordOptions,
    base: &FailoverConfig,
    occurrence: &Occurrence,
    pause: &super::record::Pause,
) {
    tracing::info!(
        key = %occurrence.job_key(&base.key),
        "the schedule is paused: this occurrence is skipped"
    );
    let change = super::record::RecordChange::Outcome {
        outcome: super::record::RecordedOutcome::SkippedPaused,
        note: pause.note.clone(),
    };
    let written = failover
        .record_occurrence_of(schedule, record, base.clone(), occurrence, change)
        .await;
    if let Err(error) = written {
        tracing::warn!(
            key = %base.key,
            occurrence = occurrence.id(),
            error = %error,
            "the paused occurrence could not be recorded in the schedule's record"
        );
    }
}

/// An instant no poll waits for (a year from now).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
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
    /// down then), unless the record says it was skipped while the schedule was paused.
    Last,
    /// First run every past tick of the last `window` that has no terminal outcome on
    /// record nor in its own job, oldest first, one after another, while the tick loop goes
    /// on ([`Failover::catch_up_plan`]; each kept as a backfilled occurrence is,
    /// [`FailoverConfig::for_backfill`]). Ticks recorded skipped (paused) are not caught up
    /// (a pause is an operator's decision: `baton backfill` runs them); a window reaching
    /// past what the schedule's record vouches for starts at its oldest safe tick.
    All {
        /// How far back to look, from the server's clock at start.
        window: Duration,
    },
}

pub use super::overlap::Overlap;

/// Options of [`Failover::schedule`]; `ScheduleOptions::default()` or the builder.
#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    pub(crate) catch_up: CatchUp,
    pub(crate) overlap: Overlap,
    pub(crate) retention: Option<Duration>,
    pub(crate) report_capacity: usize,
    /// How many occurrences the schedule's record keeps.
    pub(crate) history: u32,
    pub(crate) jitter: Duration,
    /// How often the driver reads the key's pending triggers.
    pub(crate) trigger_poll: Duration,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            catch_up: CatchUp::default(),
            overlap: Overlap::default(),
            retention: None,
            report_capacity: DEFAULT_REPORT_CAPACITY,
            history: crate::schedule::DEFAULT_HISTORY,
            jitter: Duration::ZERO,
            trigger_poll: super::trigger::DEFAULT_TRIGGER_POLL,
        }
    }
}

impl ScheduleOptions {
    /// Starts from the defaults: no catch-up, overlapping occurrences allowed, each
    /// occurrence's retention by [`Occurrence::default_retention`], 64 reports kept unread,
    /// no jitter.
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
    /// How many reports wait unread before the oldest is dropped.
    pub fn report_capacity(&self) -> usize {
        self.report_capacity
    }
    /// How many occurrences the schedule's record keeps (default 50).
    pub fn history(&self) -> u32 {
        self.history
    }
    /// The jitter `D`: each occurrence starts at its tick plus `j` in `[0, D)`
    /// ([`Occurrence::jitter`]); zero (the default) starts it at the tick.
    pub fn jitter(&self) -> Duration {
        self.jitter
    }
    /// How often the pending triggers are read ([`ScheduleOptionsBuilder::trigger_poll`]).
    pub fn trigger_poll(&self) -> Duration {
        self.trigger_poll
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
    /// What to do with a tick while an earlier occurrence runs anywhere in the fleet (default
    /// [`Overlap::Allow`], which reads nothing; the others cost about two reads per
    /// occurrence: [`Failover::live_occurrences`]).
    pub fn overlap(mut self, o: Overlap) -> Self {
        self.opts.overlap = o;
        self
    }
    /// How long each occurrence's `DONE`/`EXHAUSTED` is kept (default: two periods, at least
    /// ten minutes). Never less than the occurrence's [`Occurrence::retention_floor`]: a
    /// shorter one is raised to it, with a warning (`tracing`) at the first occurrence raised.
    pub fn retention(mut self, d: Duration) -> Self {
        self.opts.retention = Some(d);
        self
    }
    /// How many [`OccurrenceReport`]s wait unread in [`Scheduled`] before the oldest is
    /// dropped (and counted: [`Scheduled::dropped_reports`]). Defaults to 64.
    pub fn report_capacity(mut self, n: usize) -> Self {
        self.opts.report_capacity = n;
        self
    }
    /// How many occurrences the schedule's record keeps (its history, newest kept): 1 ..=
    /// 1000, default 50. Not part of the schedule's digest: a rolling change of it never
    /// splits a tick into two jobs.
    pub fn history(mut self, n: u32) -> Self {
        self.opts.history = n;
        self
    }
    /// Spreads the starts of occurrences over `d`: each starts at its tick plus
    /// `j(key, digest, tick)` in `[0, d)` ([`Occurrence::jitter`]), the same on every server,
    /// by the server's clock, so schedules that tick at the same instant do not all start at
    /// once. `j` is capped so the attempt's lease ends before the next tick's window opens
    /// ([`Occurrence::jitter_room`]). Not part of the schedule's digest: servers with
    /// different jitters still run each tick once, as one job (the one that comes first
    /// starts it). Default: none. At most the schedule's period ([`Schedule::check_jitter`]).
    pub fn jitter(mut self, d: Duration) -> Self {
        self.opts.jitter = d;
        self
    }
    /// How often the driver reads the key's pending triggers ([`Failover::trigger_schedule`],
    /// `baton trigger`) and starts the manual occurrences it has not started yet: default 5 s,
    /// at least 10 ms. The cost is one read per poll per driver (a `HGETALL` and `TIME` on
    /// Redis, one `SELECT` on PostgreSQL), whether or not a trigger is pending.
    pub fn trigger_poll(mut self, d: Duration) -> Self {
        self.opts.trigger_poll = d;
        self
    }
    /// The options (the retention is checked against each occurrence's configuration by
    /// [`FailoverConfig::for_occurrence`], the jitter against the schedule by
    /// [`Failover::schedule`]).
    ///
    /// # Errors
    /// `report_capacity`: outside 1 ..= 65536; `jitter`: above ten years (the longest period);
    /// `history`: outside 1 ..= 1000; `trigger_poll`: below 10 ms.
    pub fn build(self) -> Result<ScheduleOptions, ConfigError> {
        if self.opts.jitter > crate::schedule::MAX_PERIOD {
            return Err(ConfigError::invalid(
                "jitter",
                format!(
                    "{:?} is longer than the longest period (ten years)",
                    self.opts.jitter
                ),
            ));
        }
        super::record::check_history(self.opts.history)?;
        if self.opts.trigger_poll < MIN_TRIGGER_POLL {
            return Err(ConfigError::invalid(
                "trigger_poll",
                format!("{:?} is shorter than 10 ms", self.opts.trigger_poll),
            ));
        }
        let n = self.opts.report_capacity;
        if n == 0 || n > MAX_REPORT_CAPACITY {
            return Err(ConfigError::invalid(
                "report_capacity",
                format!("{n} is outside 1 ..= {MAX_REPORT_CAPACITY}"),
            ));
        }
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
    /// Not run, recorded `skipped_overlap`: [`Overlap::Skip`] found an earlier occurrence
    /// running in the fleet, or [`Overlap::BufferOne`] found two, or its window closed while it
    /// waited behind one (then its job is completed without running, so no backup runs it).
    Skipped,
    /// The schedule was paused ([`Failover::pause_schedule`]) when this worker came to run
    /// the occurrence: not run here, recorded `skipped_paused` in the schedule's record. The
    /// cadence is kept: the next tick runs if the pause has ended by then, and paused ticks
    /// are never caught up.
    Paused(super::record::Pause),
    /// Baton could not coordinate it (its job's error: connection, corrupt state, …).
    Error(Error),
}

/// The stream of [`Failover::schedule`]: one [`OccurrenceReport`] per occurrence, until
/// stopped. Dropping it stops everything it runs.
///
/// At most [`ScheduleOptions::report_capacity`] reports (64 by default) wait unread: past
/// that the oldest is dropped for each new one, and counted ([`Scheduled::dropped_reports`]).
pub struct Scheduled<T, E = String> {
    pub(super) rx: mailbox::Receiver<OccurrenceReport<T, E>>,
    pub(super) dropped: Arc<AtomicU64>,
    pub(super) stop: CancellationToken,
    /// The driver: aborted when the handle is dropped.
    pub(super) _task: AbortOnDropHandle<()>,
}

impl<T, E> std::fmt::Debug for Scheduled<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduled")
            .field("stopped", &self.stop.is_cancelled())
            .field("dropped_reports", &self.dropped_reports())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static, E: Send + 'static> Scheduled<T, E> {
    /// The stream of the driver `make` builds from its end of the report queue (bounded by
    /// `capacity`) and its stop token (a child of the client's), spawned on the client's
    /// tracker and aborted when the stream is dropped: what [`Failover::schedule`] and
    /// [`Failover::backfill`] return.
    pub(super) fn spawn<D>(
        failover: &Failover,
        capacity: usize,
        make: impl FnOnce(Reports<T, E>, CancellationToken) -> D,
    ) -> Self
    where
        D: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mailbox::unbounded();
        let dropped = Arc::new(AtomicU64::new(0));
        let stop = failover.backend.cancel().child_token();
        let reports = Reports {
            tx,
            capacity,
            dropped: dropped.clone(),
        };
        let task = failover
            .backend
            .tracker()
            .spawn(make(reports, stop.clone()));
        Scheduled {
            rx,
            dropped,
            stop,
            _task: AbortOnDropHandle::new(task),
        }
    }
}

impl<T, E> Scheduled<T, E> {
    /// Stops waiting for ticks and stops the occurrences running here (their attempts are
    /// failed, so backups take over); the stream reports them, then ends.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The next occurrence's report, or `None` once the schedule stopped (and every report
    /// was read). The same as the `Stream` implementation's `next`.
    ///
    /// # Cancel safety
    /// Cancel safe: a report not yet returned stays queued.
    pub async fn next_event(&mut self) -> Option<OccurrenceReport<T, E>> {
        self.rx.recv().await
    }

    /// How many reports were dropped unread since the start, because
    /// [`ScheduleOptions::report_capacity`] of them were already waiting (the oldest goes).
    pub fn dropped_reports(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl<T, E> tokio_stream::Stream for Scheduled<T, E> {
    type Item = OccurrenceReport<T, E>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The driver's end of the reports: a bounded queue that drops the oldest, counted.
pub(super) struct Reports<T, E> {
    pub(super) tx: mailbox::Sender<OccurrenceReport<T, E>>,
    pub(super) capacity: usize,
    /// Shared with [`Scheduled::dropped_reports`].
    pub(super) dropped: Arc<AtomicU64>,
}

// By hand: the reports need not be `Clone` for their queue's sender to be.
impl<T, E> Clone for Reports<T, E> {
    fn clone(&self) -> Self {
        Reports {
            tx: self.tx.clone(),
            capacity: self.capacity,
            dropped: self.dropped.clone(),
        }
    }
}

impl<T, E> Reports<T, E> {
    pub(super) fn send(&mut self, report: OccurrenceReport<T, E>) {
        // A full queue takes out the oldest: the ticks never wait for the caller, and the
        // newest reports are the ones worth reading late.
        let Ok(evicted) = self.tx.send_evicting(report, self.capacity) else {
            // The caller is gone: nobody reads any more, nothing to count.
            return;
        };
        if evicted.is_empty() {
            return;
        }
        let before = self
            .dropped
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        let total = before + evicted.len() as u64;
        // Logged when the count reaches a power of two: a stream nobody polls logs a few
        // dozen lines over its life, not one per tick.
        if (before + 1..=total).any(u64::is_power_of_two) {
            tracing::warn!(
                capacity = self.capacity,
                dropped = total,
                "reports of the schedule are not being read: the oldest are dropped"
            );
        }
    }
}

struct Driver<F, T, E> {
    failover: Failover,
    schedule: Schedule,
    config: FailoverConfig,
    options: ScheduleOptions,
    work: F,
    reports: Reports<T, E>,
    stop: CancellationToken,
    /// The occurrence of each running task, to report one that did not finish by itself.
    running: HashMap<tokio::task::Id, Occurrence>,
    /// Whether a retention raised to an occurrence's floor was logged (once per stream).
    warned_retention: bool,
    /// A jitter the schedule refuses ([`Schedule::check_jitter`]): every occurrence reports it.
    jitter_error: Option<ConfigError>,
    /// The triggers this driver started (each once), and when to read them next.
    triggers: super::trigger::TriggerPoll,
    next_poll: Instant,
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
        // The catch-up of `CatchUp::All`, run in order beside the tick loop; stopped with it.
        let mut catching_up: Option<AbortOnDropHandle<()>> = None;
        if self.options.catch_up != CatchUp::None {
            // Tried until it can be checked: a server unreachable at start is when catching
            // up matters most (every server may have been down at the tick). A configuration
            // error would fail every try, and each occurrence reports it anyway.
            loop {
                match self.catch_up(&mut runs, &mut catching_up).await {
                    Ok(newest) => {
                        last = newest;
                        break;
                    }
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
            self.reports.send(report);
        }
        // The catch-up heard the stop too: it reports its occurrence stopped and ends.
        if let Some(task) = catching_up {
            let _ = task.await;
        }
    }

    /// Catches up at start ([`Failover::catch_up_plan`]): the latest past tick as any tick
    /// ([`CatchUp::Last`]), or the window's ticks one after another in a task of their own
    /// ([`CatchUp::All`], returned); `Ok(last)` is the newest tick looked at.
    async fn catch_up(
        &mut self,
        runs: &mut JoinSet<Finished<T, E>>,
        catching_up: &mut Option<AbortOnDropHandle<()>>,
    ) -> Result<Option<SystemTime>, Error> {
        let plan = self
            .failover
            .catch_up_plan(
                &self.schedule,
                &self.config,
                self.options.catch_up,
                self.options.history,
            )
            .await?;
        let last = plan.newest_tick();
        if matches!(self.options.catch_up, CatchUp::All { .. }) {
            *catching_up = self.failover.run_in_order(
                self.schedule.clone(),
                self.config.clone(),
                self.options.clone(),
                plan.run,
                self.work.clone(),
                self.reports.clone(),
                self.stop.clone(),
            );
        } else {
            for occurrence in plan.run {
                self.start(runs, occurrence);
            }
        }
        Ok(last)
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
                    () = tokio::time::sleep_until(self.next_poll) => {
                        self.poll_triggers(runs).await;
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
        self.reports.send(report);
    }

    /// Reads the key's pending triggers and starts the manual occurrences not started here
    /// yet, as a tick is started (pause, record; no jitter); a failed read is a warning and
    /// the next poll tries again.
    async fn poll_triggers(&mut self, runs: &mut JoinSet<Finished<T, E>>) {
        self.next_poll = Instant::now() + self.options.trigger_poll;
        match self.failover.triggers(self.config.clone()).await {
            Ok(pending) => {
                for occurrence in self.triggers.take_new(&pending) {
                    tracing::info!(key = %self.config.key, id = occurrence.id(), "manual occurrence triggered");
                    self.start(runs, occurrence);
                }
            }
            // A backend without the record has no triggers either.
            Err(Error::Unsupported { .. }) => self.next_poll = far_future(),
            Err(error) => {
                tracing::warn!(key = %self.config.key, %error, "the schedule's triggers could not be read");
            }
        }
    }

    fn start(&mut self, runs: &mut JoinSet<Finished<T, E>>, occurrence: Occurrence) {
        let failover = self.failover.clone();
        let work = self.work.clone();
        let job_key = occurrence.job_key(&self.config.key);
        let config = match self.jitter_error.clone().map_or_else(
            || {
                self.config
                    .occurrence_config(&occurrence, self.options.retention)
            },
            Err,
        ) {
            Ok((config, raised)) => {
                // Said once per stream: the floor raises the retention of every occurrence
                // alike (or of the long gaps of an irregular cron), tick after tick.
                if let Some(given) = raised.filter(|_| !self.warned_retention) {
                    self.warned_retention = true;
                    warn_raised(&config, given);
                }
                let record = super::record::RecordOptions::default()
                    .history(self.options.history)
                    .jitter(self.options.jitter);
                Ok(config.with_occurrence_record(
                    &self.config.key,
                    &self.schedule,
                    &occurrence,
                    record,
                ))
            }
            Err(e) => Err(e),
        };
        let tick = occurrence.clone();
        let key = self.config.key.clone();
        let base = self.config.clone();
        let schedule = self.schedule.clone();
        let record = super::record::RecordOptions::default()
            .history(self.options.history)
            .jitter(self.options.jitter);
        let start = occurrence.jittered_start(&key, self.options.jitter, self.config.lease);
        let overlap = self.options.overlap;
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
            let manual = occurrence.is_manual().then(|| occurrence.id().to_string());
            let outcome = match config {
                Err(e) => OccurrenceOutcome::Error(Error::Config(e)),
                Ok(config) => {
                    if start > occurrence.tick() {
                        wait_for_start(&failover, &key, start).await;
                    }
                    match read_pause(&failover, &base).await {
                        Err(e) => OccurrenceOutcome::Error(e),
                        Ok(Some(pause)) => {
                            record_paused(
                                &failover,
                                &schedule,
                                &record,
                                &base,
                                &occurrence,
                                &pause,
                            )
                            .await;
                            OccurrenceOutcome::Paused(pause)
                        }
                        // The overlap rule, fleet-wide (overlap.rs), then the job.
                        Ok(None) => match super::overlap::run_occurrence(
                            &failover,
                            overlap,
                            (&schedule, &base, &record),
                            config,
                            &occurrence,
                            work,
                        )
                        .await
                        {
                            Ok(Some(outcome)) => OccurrenceOutcome::Ran(outcome),
                            Ok(None) => OccurrenceOutcome::Skipped,
                            Err(e) => OccurrenceOutcome::Error(e),
                        },
                    }
                }
            };
            if let Some(id) = manual.filter(|_| super::trigger::settles(&outcome)) {
                super::trigger::clear(&failover, &base, &id).await;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::RETENTION_CLOCK_MARGIN;

    fn at(s: &str) -> SystemTime {
        SystemTime::from(s.parse::<jiff::Timestamp>().unwrap())
    }

    fn base(lease: Duration) -> FailoverConfig {
        FailoverConfig::builder("report")
            .lease(lease)
            .build()
            .unwrap()
    }

    /// `baton run --every 10s --retention 1s --lease 500ms`: the occurrence's job keeps
    /// its outcome past the last run that can bind to its tick, not 1 s.
    #[test]
    fn a_retention_shorter_than_the_binding_window_is_raised_to_the_floor() {
        let every = Schedule::every(Duration::from_secs(10)).unwrap();
        let occ = every.occurrence_at(at("2026-11-26T02:00:00.2Z")).unwrap();
        let config = base(Duration::from_millis(500));
        let job = config
            .for_occurrence(&occ, Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(job.key(), occ.job_key("report"));
        assert_eq!(
            job.retention(),
            Duration::from_secs(10 + 5) + RETENTION_CLOCK_MARGIN
        );
        let (_, raised) = config
            .occurrence_config(&occ, Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(raised, Some(Duration::from_secs(1)));
        // Long enough already: kept as given, nothing to say.
        let (job, raised) = config
            .occurrence_config(&occ, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!((job.retention(), raised), (Duration::from_secs(60), None));
        assert_eq!(
            config.for_occurrence(&occ, None).unwrap().retention(),
            Duration::from_secs(600)
        );
    }

    /// `0 2,3 * * *`: the 02:00 occurrence's floor is about the 1 h gap, the 03:00 one's about
    /// the 23 h gap; a 2 h retention is kept for the first and raised for the second.
    #[test]
    fn each_occurrence_of_an_irregular_cron_gets_the_floor_of_its_own_gap() {
        let cron = Schedule::cron("0 2,3 * * *").unwrap();
        let config = base(Duration::from_secs(30));
        let two_hours = Some(Duration::from_secs(7200));
        let two = cron.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
        let three = cron.occurrence_of_tick(at("2026-11-26T03:00:00Z")).unwrap();
        let job = config.for_occurrence(&two, two_hours).unwrap();
        assert_eq!(job.retention(), Duration::from_secs(7200));
        let job = config.for_occurrence(&three, two_hours).unwrap();
        assert_eq!(
            job.retention(),
            Duration::from_secs(23 * 3600 + 60) + RETENTION_CLOCK_MARGIN
        );
    }

    /// A retention the coordinator refuses (below twice the lease) is still refused, not
    /// hidden by the floor.
    #[test]
    fn a_retention_below_twice_the_lease_is_still_an_error() {
        let every = Schedule::every(Duration::from_secs(10)).unwrap();
        let occ = every.occurrence_at(at("2026-11-26T02:00:00Z")).unwrap();
        let err = base(Duration::from_secs(10))
            .for_occurrence(&occ, Some(Duration::from_secs(1)))
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    field: "retention",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// The longest period's default retention (two periods, twenty years) is capped at the
    /// coordinator's ten years instead of refused.
    #[test]
    fn the_longest_period_gets_a_retention_the_coordinator_accepts() {
        let every = Schedule::every(crate::schedule::MAX_PERIOD).unwrap();
        let occ = every.occurrence_at(at("2026-11-26T02:00:00Z")).unwrap();
        let job = base(Duration::from_secs(30))
            .for_occurrence(&occ, None)
            .unwrap();
        assert_eq!(job.retention(), crate::schedule::MAX_PERIOD);
    }

    #[test]
    fn the_report_capacity_is_64_by_default_and_checked() {
        assert_eq!(ScheduleOptions::default().report_capacity(), 64);
        assert_eq!(
            ScheduleOptions::builder()
                .build()
                .unwrap()
                .report_capacity(),
            64
        );
        for n in [0, MAX_REPORT_CAPACITY + 1] {
            let err = ScheduleOptions::builder()
                .report_capacity(n)
                .build()
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ConfigError::Invalid {
                        field: "report_capacity",
                        ..
                    }
                ),
                "{n}: {err:?}"
            );
        }
    }
}
