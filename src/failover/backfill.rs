//! Backfill: running the past occurrences of a schedule that have no terminal outcome, each
//! once across the fleet, oldest first ([`Failover::backfill_plan`], [`Failover::backfill`]),
//! and the catch-up of the long-running form at its start ([`CatchUp`]).
//!
//! A plan looks at each tick of a window (capped at the server's clock: a tick not yet due is
//! not backfilled) and reads what the store knows of it: the schedule's record (repaired from
//! the occurrences' own jobs, [`Failover::schedule_history`]) and, for a tick the record does
//! not settle, its occurrence's own job. A tick is *settled* when either says done, exhausted
//! or replaced; every other tick (no entry, missed, failed, skipped, running) is to run (a
//! running one is joined as a backup: its job decides).
//!
//! What the store can vouch for is bounded: the record keeps the newest `history`
//! occurrences (older ones may have been trimmed) and knows nothing before it first saw the
//! schedule, and an occurrence's job forgets its outcome once its retention passes. A window
//! that reaches a tick neither vouches for is refused, naming the oldest tick that is safe: a
//! backfill never reruns a tick whose outcome may have been forgotten. An occurrence run by a
//! backfill keeps its outcome for the record's lifetime ([`record_lifetime`], at least 30
//! days), so neither a lost record write nor a passed retention lets a second backfill run it
//! again.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::config::FailoverConfig;
use super::record::{check_history, record_lifetime, RecordOptions, RecordedOutcome};
use super::run::{Attempt, RunOutcome};
use super::scheduled::{
    read_pause, record_paused, CatchUp, OccurrenceOutcome, OccurrenceReport, Reports,
    ScheduleOptions, Scheduled,
};
use super::{Failover, JobState};
use crate::error::{ConfigError, Error};
use crate::schedule::{Occurrence, Schedule};
use crate::util::schedule_record::rfc3339;

/// The most ticks one plan looks at: each may cost a read of its job, and a window of a
/// one-second schedule over a month holds millions. A longer window is refused (backfill it
/// in parts).
pub const MAX_BACKFILL_TICKS: usize = 10_000;

/// The longest retention the coordinator accepts (ten years): a backfilled occurrence's
/// outcome is kept at most that long.
const MAX_RETENTION: Duration = crate::schedule::MAX_PERIOD;

/// What a backfill of a window would do ([`Failover::backfill_plan`]), each list oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackfillPlan {
    /// The occurrences to run: no terminal outcome on record nor in their own job.
    pub run: Vec<Occurrence>,
    /// The occurrences already settled, with their outcome (done, exhausted or replaced).
    pub settled: Vec<(Occurrence, RecordedOutcome)>,
    /// Those of [`BackfillPlan::run`] that the record says were skipped while the schedule
    /// was paused: a backfill runs them (an operator asked for the window), a catch-up does
    /// not (a pause is an operator's decision).
    pub paused: Vec<Occurrence>,
    /// The oldest tick the store vouches for: the record (its history horizon, or when it
    /// first saw the schedule) or the occurrences' own jobs (their retention not passed).
    pub oldest_safe: SystemTime,
}

impl BackfillPlan {
    /// The newest tick the plan looked at (run, settled or paused), if any: where the
    /// long-running form's tick loop goes on from after a catch-up.
    pub fn newest_tick(&self) -> Option<SystemTime> {
        let run = self.run.iter().map(Occurrence::tick);
        let settled = self.settled.iter().map(|(o, _)| o.tick());
        let paused = self.paused.iter().map(Occurrence::tick);
        run.chain(settled).chain(paused).max()
    }

    /// The plan without the ticks recorded skipped (paused): what a catch-up runs.
    pub fn without_paused(mut self) -> BackfillPlan {
        let paused: Vec<SystemTime> = self.paused.iter().map(Occurrence::tick).collect();
        self.run.retain(|o| !paused.contains(&o.tick()));
        self
    }
}

impl FailoverConfig {
    /// This configuration for the job of `occurrence` run by a backfill: as
    /// [`FailoverConfig::for_occurrence`], with its outcome kept for the schedule record's
    /// lifetime ([`record_lifetime`] of its gap, at least 30 days; at most ten years), or
    /// `retention` when longer. A backfill runs a tick the record vouches for; once run, its
    /// own job vouches for it as long as the record would, so a lost record write never lets
    /// a second backfill run it again.
    ///
    /// # Errors
    /// As [`FailoverConfig::for_occurrence`].
    pub fn for_backfill(
        &self,
        occurrence: &Occurrence,
        retention: Option<Duration>,
    ) -> Result<FailoverConfig, ConfigError> {
        let gap = occurrence
            .next_tick()
            .and_then(|n| n.duration_since(occurrence.tick()).ok());
        let keep = record_lifetime(gap)
            .max(retention.unwrap_or(Duration::ZERO))
            .min(MAX_RETENTION);
        let (config, _) = self.occurrence_config(occurrence, Some(keep))?;
        Ok(config)
    }
}

impl Failover {
    /// The plan of a backfill of `schedule` on `config`'s key over the ticks in
    /// `[from, to]` (`to` capped at the server's clock: a tick not yet due is not
    /// backfilled), oldest first: which ticks to run and which are settled (module docs).
    /// `history` is the history size the schedule's hosts record (default 50): with the
    /// record's own, it tells whether older entries may have been trimmed.
    ///
    /// Cost: a read of the record and of its history (each entry left running or failed
    /// repaired by a read of its job), and a read of the job of each tick the record does
    /// not settle.
    ///
    /// # Errors
    /// [`Error::Config`]: `from` older than the oldest tick the store vouches for (the
    /// message names it: [`BackfillPlan::oldest_safe`]), `to` before `from`, a window of more
    /// than [`MAX_BACKFILL_TICKS`] ticks, a `history` outside 1 ..= 1000, an invalid key;
    /// connection errors.
    pub async fn backfill_plan(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        from: SystemTime,
        to: SystemTime,
        history: u32,
    ) -> Result<BackfillPlan, Error> {
        self.plan_window(schedule, config, from, to, history, false)
            .await
    }

    /// What the long-running form catches up at its start ([`CatchUp`]), by the server's
    /// clock: nothing for [`CatchUp::None`]; the latest past tick for [`CatchUp::Last`]; the
    /// ticks of the last `window` for [`CatchUp::All`], from the oldest tick the store
    /// vouches for when the window reaches further (said in a warning). Either way a tick
    /// recorded skipped (paused) is not run ([`BackfillPlan::paused`]): a pause is an
    /// operator's decision, and `baton backfill` runs such ticks when asked.
    /// [`Failover::schedule`] and `baton schedule --catch-up` use it.
    ///
    /// # Errors
    /// As [`Failover::backfill_plan`], except that a window reaching past what the store
    /// vouches for is shortened rather than refused.
    pub async fn catch_up_plan(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        catch_up: CatchUp,
        history: u32,
    ) -> Result<BackfillPlan, Error> {
        let now = self.server_time(config.key()).await?;
        let (from, to) = match catch_up {
            CatchUp::None => {
                return Ok(BackfillPlan {
                    run: vec![],
                    settled: vec![],
                    paused: vec![],
                    oldest_safe: now,
                })
            }
            CatchUp::Last => match schedule.latest_at_or_before(now) {
                Some(latest) => (latest, latest),
                None => (now, now),
            },
            CatchUp::All { window } => (now.checked_sub(window).unwrap_or(now), now),
        };
        let plan = self
            .plan_window(schedule, config, from, to, history, true)
            .await?;
        Ok(plan.without_paused())
    }

    /// Runs the occurrences of `plan` ([`Failover::backfill_plan`]) one after another, oldest
    /// first, each as a job of its own through [`Failover::run`] (attempts, backups, fencing;
    /// [`FailoverConfig::for_backfill`] makes its configuration, with
    /// [`ScheduleOptions::retention`] when longer), and reports one [`OccurrenceReport`] per
    /// occurrence, as [`Failover::schedule`] does; the stream ends after the last. Run it on
    /// several servers at once if you like: each occurrence still runs once.
    ///
    /// Each occurrence goes through the path of a tick: the schedule's pause is read just
    /// before it runs (paused: reported [`OccurrenceOutcome::Paused`], recorded
    /// `skipped_paused`, not run), then [`ScheduleOptions::overlap`]'s fleet-wide rule
    /// ([`Failover::overlap_decision`]), and its attempts are recorded in the schedule's
    /// record. No jitter applies. The settled occurrences of the plan are not reported (the plan lists
    /// them). Dropping the stream, or [`Scheduled::stop`], stops it: the occurrence running
    /// here is failed (a backup takes over) and reported stopped.
    pub fn backfill<F, Fut, T, E>(
        &self,
        schedule: Schedule,
        config: FailoverConfig,
        plan: BackfillPlan,
        options: ScheduleOptions,
        work: F,
    ) -> Scheduled<T, E>
    where
        F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let capacity = options.report_capacity;
        Scheduled::spawn(self, capacity, |reports, stop| {
            in_order(
                self.clone(),
                schedule,
                config,
                options,
                plan.run,
                work,
                reports,
                stop,
            )
        })
    }

    /// The plan of `[from, to]`; with `clamp`, a window reaching past what the store vouches
    /// for starts at the oldest safe tick instead of being refused.
    async fn plan_window(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        from: SystemTime,
        to: SystemTime,
        history: u32,
        clamp: bool,
    ) -> Result<BackfillPlan, Error> {
        check_history(history)?;
        if to < from {
            return Err(Error::Config(ConfigError::invalid(
                "to",
                "is before `from`: the window is empty",
            )));
        }
        let now = self.server_time(config.key()).await?;
        let (entries, horizon) = self.vouched_by_record(schedule, config, history).await?;
        let oldest_safe = oldest_safe(schedule, horizon, now);
        let mut from = from;
        if clamp && from < oldest_safe {
            tracing::warn!(
                key = %config.key,
                from = %rfc3339::text(from),
                oldest_safe = %rfc3339::text(oldest_safe),
                "the catch-up window reaches past what the schedule's record vouches for: \
                 caught up from its oldest safe tick"
            );
            from = oldest_safe;
        }
        let ticks = ticks_in(schedule, from, to.min(now))?;
        if let Some(first) = ticks.first().filter(|o| o.tick() < oldest_safe) {
            return Err(Error::Config(ConfigError::invalid(
                "from",
                format!(
                    "the window starts at {}, before what the store vouches for: the oldest \
                     tick the record vouches for is {} (a backfill never reruns a tick whose \
                     outcome may have been forgotten)",
                    first.id(),
                    rfc3339::text(oldest_safe)
                ),
            )));
        }
        let mut plan = BackfillPlan {
            run: vec![],
            settled: vec![],
            paused: vec![],
            oldest_safe,
        };
        for occurrence in ticks {
            let recorded = entries.get(occurrence.id()).copied();
            if let Some(outcome) = recorded.filter(|o| o.is_terminal()) {
                plan.settled.push((occurrence, outcome));
                continue;
            }
            let job = FailoverConfig::builder(occurrence.job_key(&config.key))
                .prefix(config.prefix.clone())
                .build()?;
            match self.job_state(job).await? {
                JobState::Done => plan.settled.push((occurrence, RecordedOutcome::Done)),
                JobState::Exhausted => {
                    plan.settled.push((occurrence, RecordedOutcome::Exhausted));
                }
                _ => {
                    if recorded == Some(RecordedOutcome::SkippedPaused) {
                        plan.paused.push(occurrence.clone());
                    }
                    plan.run.push(occurrence);
                }
            }
        }
        Ok(plan)
    }

    /// The outcome on record of each tick (by id, repaired) and the record's horizon: the
    /// oldest tick on record when its history is full (older entries may have been trimmed),
    /// else the earlier of that tick and when the record first saw the schedule. `None`
    /// when there is no record of the schedule's digest (or the backend keeps none).
    async fn vouched_by_record(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        history: u32,
    ) -> Result<(HashMap<String, RecordedOutcome>, Option<SystemTime>), Error> {
        let records = match self.schedule_records(config.clone()).await {
            Ok(r) => r,
            Err(Error::Unsupported { .. }) => return Ok((HashMap::new(), None)),
            Err(e) => return Err(e),
        };
        let Some(record) = records.into_iter().find(|r| r.digest == schedule.digest()) else {
            return Ok((HashMap::new(), None));
        };
        // Hosts may record different sizes during a rolling change: read the larger, and
        // count the history full at the smaller (the one that may have trimmed).
        let kept = history.min(record.spec.history).max(1);
        let read = history.max(record.spec.history);
        let entries = self
            .schedule_history(config.clone(), schedule.digest(), read as usize)
            .await?;
        let oldest = entries.iter().map(|e| e.tick).min();
        let horizon = match oldest {
            Some(oldest) if entries.len() >= kept as usize => oldest,
            Some(oldest) => oldest.min(record.first_seen),
            None => record.first_seen,
        };
        let outcomes = entries.into_iter().map(|e| (e.id, e.outcome)).collect();
        Ok((outcomes, Some(horizon)))
    }
}

/// The oldest tick the store vouches for at `now`: the first tick at or after the record's
/// `horizon`, or the oldest past tick whose job still keeps its outcome whatever retention
/// its hosts used (`tick + retention floor > now`, [`Occurrence::retention_floor`]), whichever
/// is older; the next tick when neither vouches for any past one. Pure, for the unit tests.
pub(crate) fn oldest_safe(
    schedule: &Schedule,
    horizon: Option<SystemTime>,
    now: SystemTime,
) -> SystemTime {
    let mut by_jobs = None;
    let mut t = schedule.latest_at_or_before(now);
    // The floor is about one gap: only the last tick or two qualify; bounded all the same.
    for _ in 0..16 {
        let Some(tick) = t else { break };
        let Some(occurrence) = schedule.occurrence_of_tick(tick) else {
            break;
        };
        let keeps = tick
            .checked_add(occurrence.retention_floor())
            .map_or(true, |until| until > now);
        if !keeps {
            break;
        }
        by_jobs = Some(tick);
        t = tick
            .checked_sub(Duration::from_millis(1))
            .and_then(|before| schedule.latest_at_or_before(before));
    }
    let by_record = horizon.and_then(|h| {
        if schedule.occurrence_of_tick(h).is_some() {
            Some(h)
        } else {
            schedule.next_after(h)
        }
    });
    match (by_record, by_jobs) {
        (Some(r), Some(j)) => r.min(j),
        (Some(r), None) => r,
        (None, Some(j)) => j,
        (None, None) => schedule.next_after(now).unwrap_or(now),
    }
}

/// The occurrences of the ticks in `[from, to]`, oldest first.
fn ticks_in(
    schedule: &Schedule,
    from: SystemTime,
    to: SystemTime,
) -> Result<Vec<Occurrence>, Error> {
    let mut out = Vec::new();
    let first = match schedule.occurrence_of_tick(from) {
        Some(_) => Some(from),
        None => schedule.next_after(from),
    };
    let mut t = first;
    while let Some(tick) = t.filter(|t| *t <= to) {
        if out.len() >= MAX_BACKFILL_TICKS {
            return Err(Error::Config(ConfigError::invalid(
                "to",
                format!(
                    "the window holds more than {MAX_BACKFILL_TICKS} ticks of {schedule}: \
                     backfill it in parts"
                ),
            )));
        }
        if let Some(occurrence) = schedule.occurrence_of_tick(tick) {
            out.push(occurrence);
        }
        t = schedule.next_after(tick);
    }
    Ok(out)
}

impl Failover {
    /// Runs `occurrences` one after another, oldest first, reporting each, in a task of its
    /// own (`None` when there is nothing to run): the long-running form's catch-up of
    /// [`CatchUp::All`]. Stopped by `stop`: the occurrence running then is dropped (its
    /// worker fails an attempt it holds) and reported stopped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_in_order<F, Fut, T, E>(
        &self,
        schedule: Schedule,
        base: FailoverConfig,
        options: ScheduleOptions,
        occurrences: Vec<Occurrence>,
        work: F,
        reports: Reports<T, E>,
        stop: CancellationToken,
    ) -> Option<AbortOnDropHandle<()>>
    where
        F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        if occurrences.is_empty() {
            return None;
        }
        let task = self.backend.tracker().spawn(in_order(
            self.clone(),
            schedule,
            base,
            options,
            occurrences,
            work,
            reports,
            stop,
        ));
        Some(AbortOnDropHandle::new(task))
    }
}

/// [`Failover::backfill`]'s driver and [`Failover::run_in_order`]'s task.
#[allow(clippy::too_many_arguments)]
async fn in_order<F, Fut, T, E>(
    failover: Failover,
    schedule: Schedule,
    base: FailoverConfig,
    options: ScheduleOptions,
    occurrences: Vec<Occurrence>,
    work: F,
    mut reports: Reports<T, E>,
    stop: CancellationToken,
) where
    F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let record = RecordOptions::default()
        .history(options.history)
        .jitter(options.jitter);
    for occurrence in occurrences {
        if stop.is_cancelled() {
            break;
        }
        let job_key = occurrence.job_key(&base.key);
        let one = run_one(
            &failover,
            &schedule,
            &base,
            &options,
            &record,
            occurrence.clone(),
            work.clone(),
        );
        let (outcome, stopped) = tokio::select! {
            () = stop.cancelled() => (OccurrenceOutcome::Ran(RunOutcome::Stopped), true),
            outcome = one => (outcome, false),
        };
        reports.send(OccurrenceReport {
            occurrence,
            job_key,
            outcome,
        });
        if stopped {
            break;
        }
    }
}

/// One backfilled occurrence: its pause read, then its run (recorded).
async fn run_one<F, Fut, T, E>(
    failover: &Failover,
    schedule: &Schedule,
    base: &FailoverConfig,
    options: &ScheduleOptions,
    record: &RecordOptions,
    occurrence: Occurrence,
    work: F,
) -> OccurrenceOutcome<T, E>
where
    F: FnMut(Occurrence, Attempt) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let config = match base.for_backfill(&occurrence, options.retention) {
        Ok(c) => c.with_record(&base.key, schedule, occurrence.tick(), record.clone()),
        Err(e) => return OccurrenceOutcome::Error(Error::Config(e)),
    };
    match read_pause(failover, base).await {
        Err(e) => OccurrenceOutcome::Error(e),
        Ok(Some(pause)) => {
            record_paused(failover, schedule, record, base, &occurrence, &pause).await;
            OccurrenceOutcome::Paused(pause)
        }
        // The overlap rule, fleet-wide, as for any tick (overlap.rs), then the job.
        Ok(None) => match super::overlap::run_occurrence(
            failover,
            options.overlap,
            (schedule, base, record),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        SystemTime::from(s.parse::<jiff::Timestamp>().unwrap())
    }

    fn minute() -> Schedule {
        Schedule::every(Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn the_record_vouches_from_its_horizon_and_the_jobs_for_the_last_tick() {
        let s = minute();
        let now = at("2026-11-26T02:10:40Z");
        // No record: only the latest past tick's job still keeps its outcome.
        assert_eq!(oldest_safe(&s, None, now), at("2026-11-26T02:10:00Z"));
        // Just after a tick, the one before is still within its floor (gap + E + margin: 95 s).
        let early = at("2026-11-26T02:10:10Z");
        assert_eq!(oldest_safe(&s, None, early), at("2026-11-26T02:09:00Z"));
        // A record first seen between ticks vouches from the next tick.
        let seen = at("2026-11-26T02:03:20Z");
        assert_eq!(oldest_safe(&s, Some(seen), now), at("2026-11-26T02:04:00Z"));
        // An entry's tick is a tick.
        let oldest = at("2026-11-26T02:02:00Z");
        assert_eq!(oldest_safe(&s, Some(oldest), now), oldest);
    }

    #[test]
    fn the_ticks_of_a_window_include_both_ends_and_are_bounded() {
        let s = minute();
        let ticks = ticks_in(&s, at("2026-11-26T02:00:00Z"), at("2026-11-26T02:05:00Z")).unwrap();
        assert_eq!(ticks.len(), 6);
        assert_eq!(ticks[0].id(), "2026-11-26T02:00:00Z");
        let ticks = ticks_in(&s, at("2026-11-26T02:00:01Z"), at("2026-11-26T02:01:59Z")).unwrap();
        assert_eq!(ticks.len(), 1);
        let second = Schedule::every(Duration::from_secs(1)).unwrap();
        let err = ticks_in(
            &second,
            at("2026-11-26T00:00:00Z"),
            at("2026-11-27T00:00:00Z"),
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::Config(ConfigError::Invalid { field: "to", .. })),
            "{err:?}"
        );
    }

    #[test]
    fn a_backfilled_occurrence_keeps_its_outcome_for_the_records_lifetime() {
        let s = minute();
        let occ = s.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
        let base = FailoverConfig::builder("report").build().unwrap();
        let job = base.for_backfill(&occ, None).unwrap();
        assert_eq!(job.key(), occ.job_key("report"));
        assert_eq!(
            job.retention(),
            record_lifetime(Some(Duration::from_secs(60)))
        );
        assert!(job.retention() >= Duration::from_secs(30 * 24 * 3600));
    }

    #[test]
    fn a_catch_up_leaves_out_the_paused_ticks() {
        let s = minute();
        let a = s.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
        let b = s.occurrence_of_tick(at("2026-11-26T02:01:00Z")).unwrap();
        let plan = BackfillPlan {
            run: vec![a.clone(), b.clone()],
            settled: vec![],
            paused: vec![b.clone()],
            oldest_safe: a.tick(),
        };
        assert_eq!(plan.newest_tick(), Some(b.tick()));
        let caught = plan.without_paused();
        assert_eq!(caught.run, vec![a]);
        assert_eq!(
            caught.newest_tick(),
            Some(b.tick()),
            "the paused tick was looked at"
        );
    }
}
