//! Overlap policies, fleet-wide: what a run of an occurrence does while earlier occurrences of
//! its schedule still run, anywhere in the fleet.
//!
//! - [`Failover::live_occurrences`] is the fleet-wide view: the earlier occurrences whose job
//!   has a live lease, found from the schedule's record (its newest entries that are not
//!   terminal) and from the previous tick's own job (read directly, so a lost record write
//!   never hides the occurrence just before);
//! - [`Overlap::decide`] is the rule, a pure function of the policy and that view;
//! - [`Failover::overlap_decision`] reads the view and applies the rule: what both schedule
//!   drivers (`Failover::schedule` and `baton schedule`) and `baton run --every/--cron` call
//!   before they acquire an occurrence's job;
//! - [`Failover::wait_out_occurrence`] is `buffer-one`'s wait: the buffered occurrence's holder
//!   waits, before its work starts, until the earlier one's job has no live lease or its own
//!   window closes;
//! - [`Failover::replace_occurrences`] is `replace`'s stop: the earlier occurrences' attempts
//!   are stopped wherever they run ([`Failover::replace_attempt`], a fenced stop request their
//!   holders act on), their occurrences end `replaced`, and the new one runs once their
//!   holders acknowledged or their leases ran out.
//!
//! Cost of the view: one history read (the newest [`LIVE_SCAN`] entries) plus one job read per
//! entry that is not terminal, plus one job read of the previous tick when the record does not
//! name it: typically two round trips per occurrence. `allow` reads nothing.

use std::future::Future;
use std::time::{Duration, SystemTime};

use super::config::FailoverConfig;
use super::keys::JobKeys;
use super::{Failover, JobStatus};
use crate::error::Error;
use crate::schedule::{Occurrence, Schedule};
use crate::util::schedule_record::RecordedOutcome;

/// How many of the record's newest entries the view looks at. Under `skip` and `buffer-one`
/// at most two occurrences are live at once, so a few entries suffice; under `allow` the
/// view is never read.
pub const LIVE_SCAN: usize = 8;

/// The longest pause between two reads of the earlier occurrence's job while a buffered one
/// waits (shorter with a short lease: a quarter of it).
const BUFFER_POLL: Duration = Duration::from_secs(1);

/// How long an earlier occurrence between two attempts (its last attempt failed or its
/// holder's lease ran out, attempts are left) is given for a backup to take it over before it
/// counts as ended: a backup takes over within its retry delay of the failure, or of the
/// lease's end, so an occurrence still between attempts past this has no backup left.
const TAKEOVER_GRACE: Duration = Duration::from_secs(1);

/// Whether `status` is between two attempts: not finished, no live lease, attempts left (a
/// backup may take it over at any moment).
fn between_attempts(status: &JobStatus, max_attempts: u64) -> bool {
    matches!(status.state, super::JobState::Attempt { number, .. } if number < max_attempts)
        && !status.is_live()
}

/// The grace a job between attempts gets before it counts as ended ([`TAKEOVER_GRACE`], and
/// the retry delay the backups wait).
fn takeover_grace(config: &FailoverConfig) -> Duration {
    TAKEOVER_GRACE.min(config.lease) + config.retry_delay
}

/// What a run does with an occurrence whose tick comes while earlier occurrences of the
/// schedule still run (anywhere in the fleet, by their jobs' live leases):
/// [`ScheduleOptionsBuilder::overlap`](crate::ScheduleOptionsBuilder::overlap),
/// `baton schedule --overlap`, `baton run --every/--cron --overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// Run it: each occurrence has its own job and holder (the default). Reads nothing.
    #[default]
    Allow,
    /// While any earlier occurrence runs anywhere, this one is not run: recorded
    /// `skipped_overlap` and reported skipped.
    Skip,
    /// While one earlier occurrence runs, this one waits (its job held by whichever host
    /// binds to it first, the others its backups) until that one ends, then runs; if its own
    /// window closes first (the next tick's window opens), it is settled without running:
    /// its job completed (so no backup runs it) and recorded `skipped_overlap`. While two run
    /// (one running, one waiting), it is skipped and recorded.
    BufferOne,
    /// Stop the earlier occurrences that run and run this one: each earlier attempt is stopped
    /// wherever it runs by a fenced stop request its holder acts on at once
    /// ([`Failover::replace_attempt`]); its occurrence ends `replaced` (its job completed, so
    /// no backup retries it), and this one runs once every stopped holder acknowledged, or,
    /// for one that cannot be reached, once its lease ran out by the server's clock (a holder
    /// stops its work by then). A manual occurrence (`baton trigger`) is stopped like any.
    Replace,
}

/// One earlier occurrence whose job has a live lease: [`Failover::live_occurrences`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveOccurrence {
    /// Its id: the tick in RFC 3339 (as [`Occurrence::id`]), or a manual occurrence's id.
    pub id: String,
    /// Its job's key (`KEY@DIGEST@TICK`).
    pub job_key: String,
    /// Its tick.
    pub tick: SystemTime,
    /// Its job's status as read (a live lease).
    pub status: JobStatus,
}

/// What [`Overlap::decide`] makes of an occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverlapDecision {
    /// Run it as usual.
    Run,
    /// Do not run it: record it `skipped_overlap` (`live` earlier occurrences run).
    Skip {
        /// How many earlier occurrences were live.
        live: usize,
    },
    /// Acquire its job as usual; as holder, wait for `behind` to end before running the work
    /// ([`Failover::wait_out_occurrence`]).
    Buffer {
        /// The earlier occurrence it waits for.
        behind: LiveOccurrence,
    },
    /// Stop the `live` earlier occurrences ([`Failover::replace_occurrences`]), then run it as
    /// usual.
    Replace {
        /// The earlier occurrences to stop, newest first.
        live: Vec<LiveOccurrence>,
    },
}

impl Overlap {
    /// The rule, given the live earlier occurrences (`live`, newest first): `allow` runs;
    /// `skip` skips when any is live; `buffer-one` runs when none is, waits behind one, and
    /// skips when two or more are (a buffered occurrence is live while its holder waits, so a
    /// third tick sees two).
    pub fn decide(self, live: &[LiveOccurrence]) -> OverlapDecision {
        match (self, live) {
            (Overlap::Allow, _) | (_, []) => OverlapDecision::Run,
            (Overlap::Skip, _) => OverlapDecision::Skip { live: live.len() },
            (Overlap::BufferOne, [one]) => OverlapDecision::Buffer {
                behind: one.clone(),
            },
            (Overlap::BufferOne, _) => OverlapDecision::Skip { live: live.len() },
            (Overlap::Replace, _) => OverlapDecision::Replace {
                live: live.to_vec(),
            },
        }
    }

    /// Whether the rule looks at the fleet (reads [`Failover::live_occurrences`]).
    pub fn reads_fleet(self) -> bool {
        !matches!(self, Overlap::Allow)
    }

    /// The policy's name as the CLI spells it (`allow`, `skip`, `buffer-one`).
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer-one",
            Overlap::Replace => "replace",
        }
    }
}

/// How [`Failover::wait_out_occurrence`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitedOut {
    /// The earlier occurrence's job has no live lease any more: run the work.
    Ended,
    /// The buffered occurrence's window closed first: settle it without running
    /// ([`AttemptHandle::done_settled`](crate::AttemptHandle::done_settled) with
    /// [`RecordedOutcome::SkippedOverlap`]).
    WindowClosed,
}

/// When the window of `occurrence` closes: its next tick minus that tick's early tolerance
/// (a run starting then binds to the next tick). `None` for the calendar's last tick. A
/// manual occurrence's window is its trigger's lifetime
/// ([`TRIGGER_LIFETIME`](crate::util::schedule_record::TRIGGER_LIFETIME)): it has no next
/// tick, and an operator asked for it.
pub fn window_close(occurrence: &Occurrence) -> Option<SystemTime> {
    if occurrence.is_manual() {
        return Some(occurrence.tick() + crate::util::schedule_record::TRIGGER_LIFETIME);
    }
    // `jitter_room` with no lease is the window's length, from the tick to its close.
    let room = occurrence.jitter_room(Duration::ZERO);
    (room != Duration::MAX).then(|| occurrence.tick() + room)
}

impl Failover {
    /// The other occurrences of `schedule` on `config`'s key than `occurrence` whose job has a
    /// live lease anywhere in the fleet, newest first: the record's newest [`LIVE_SCAN`]
    /// entries that are not terminal (`running`, `failed`), the tick before `occurrence`'s and
    /// the latest tick by this host's clock, and the pending manual occurrences
    /// ([`Failover::triggers`]), each checked against its own job, read directly (a record
    /// write not landed yet, or lost, must not hide an occurrence that runs). A job caught
    /// between two attempts (no live lease, attempts left) is read again after a short grace
    /// (min(1 s, the lease) plus the retry delay): live then if a backup took it over. Cost:
    /// one history read, one trigger read, and one job read per candidate (typically two or
    /// three; two reads for one between attempts).
    ///
    /// Two occurrences that decide at the same instant (a manual one triggered just as a tick
    /// comes) may each read the other's job before it was acquired and both run: the overlap
    /// rules are a fleet-wide view, not a lock.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; connection errors.
    pub async fn live_occurrences(
        &self,
        schedule: &Schedule,
        config: &FailoverConfig,
        occurrence: &Occurrence,
    ) -> Result<Vec<LiveOccurrence>, Error> {
        let key = &config.key;
        let digest = schedule.digest();
        let entries = match self
            .backend
            .schedule_history(&config.prefix, key, digest, LIVE_SCAN)
            .await
        {
            Ok(entries) => entries,
            // A backend without the record: the ticks' own jobs are all there is to read.
            Err(Error::Unsupported { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut candidates: Vec<(String, String, SystemTime)> = Vec::new();
        let mut add = |id: String, job_key: String, tick: SystemTime| {
            if id != occurrence.id() && !candidates.iter().any(|(i, _, _)| *i == id) {
                candidates.push((id, job_key, tick));
            }
        };
        for entry in entries {
            let Some(record) = entry.into_record() else {
                continue;
            };
            if !matches!(
                record.outcome,
                RecordedOutcome::Running | RecordedOutcome::Failed
            ) {
                continue;
            }
            // A manual occurrence's job is digest-free (`KEY@manual@ID`).
            let of = if record.manual {
                crate::schedule::MANUAL_DIGEST
            } else {
                digest
            };
            let job_key = occurrence_job_key(key, of, &record.id);
            add(record.id, job_key, record.tick);
        }
        // The tick before this one, and the latest by this host's clock (a manual occurrence
        // runs after its trigger's time, when later ticks may have come).
        let ticks = [
            occurrence.tick().checked_sub(Duration::from_millis(1)),
            Some(SystemTime::now().max(occurrence.tick())),
        ];
        for t in ticks.into_iter().flatten() {
            if let Some(o) = schedule
                .latest_at_or_before(t)
                .and_then(|t| schedule.occurrence_of_tick(t))
            {
                add(o.id().to_string(), o.job_key(key), o.tick());
            }
        }
        let pending = match self.triggers(config.clone()).await {
            Ok(pending) => pending,
            Err(Error::Unsupported { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        for t in pending {
            let o = t.occurrence();
            add(o.id().to_string(), o.job_key(key), o.tick());
        }
        let mut live = Vec::new();
        for (id, job_key, tick) in candidates {
            let keys = JobKeys::new(&config.prefix, &job_key);
            let mut status = self.backend.job_status(&keys, job_key.clone()).await?;
            if between_attempts(&status, config.max_attempts) {
                // A backup may be taking it over right now: counting it ended would run this
                // occurrence beside the earlier one's next attempt.
                tokio::time::sleep(takeover_grace(config)).await;
                status = self.backend.job_status(&keys, job_key.clone()).await?;
            }
            if status.is_live() {
                live.push(LiveOccurrence {
                    id,
                    job_key,
                    tick,
                    status,
                });
            }
        }
        live.sort_by_key(|l| std::cmp::Reverse(l.tick));
        Ok(live)
    }

    /// What `policy` makes of `occurrence` ([`Overlap::decide`] over
    /// [`Failover::live_occurrences`] before its tick): the one decision both schedule drivers
    /// and `baton run --every/--cron` make before acquiring an occurrence's job. `allow`
    /// reads nothing. A manual occurrence ([`Occurrence::manual`], `baton trigger`) is judged
    /// as a tick at its trigger's time ([`window_close`] gives it the trigger's lifetime to
    /// wait in under `buffer-one`).
    ///
    /// # Errors
    /// As [`Failover::live_occurrences`].
    pub async fn overlap_decision(
        &self,
        policy: Overlap,
        schedule: &Schedule,
        config: &FailoverConfig,
        occurrence: &Occurrence,
    ) -> Result<OverlapDecision, Error> {
        if !policy.reads_fleet() {
            return Ok(OverlapDecision::Run);
        }
        let live = self.live_occurrences(schedule, config, occurrence).await?;
        Ok(policy.decide(&live))
    }

    /// `buffer-one`'s wait, for the holder of `occurrence` before its work starts: reads
    /// `behind`'s job every min(1 s, `lease`/4) until it has ended ([`WaitedOut::Ended`]:
    /// finished, or no live lease with no attempt left, or between attempts for longer than a
    /// backup takes to take it over: min(1 s, the lease) plus the retry delay) or `occurrence`'s window closes by the server's clock
    /// ([`WaitedOut::WindowClosed`], [`window_close`]). The holder's watchdog keeps its own
    /// lease meanwhile. Read errors are retried until the window closes (said once).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key. Connection errors are retried, never returned.
    pub async fn wait_out_occurrence(
        &self,
        config: &FailoverConfig,
        occurrence: &Occurrence,
        behind: &LiveOccurrence,
    ) -> Result<WaitedOut, Error> {
        let poll = BUFFER_POLL
            .min(config.lease / 4)
            .max(Duration::from_millis(10));
        let keys = JobKeys::new(&config.prefix, &behind.job_key);
        // The window's close as a local instant, from one reading of the server's clock
        // (read again while it cannot be read: the close is only known by it).
        let close = window_close(occurrence);
        let deadline = loop {
            let Some(close) = close else { break None };
            match self.backend.server_time(&config.key).await {
                Ok(t) => break Some(t.received + close.duration_since(t.now).unwrap_or_default()),
                Err(e @ Error::Config(_)) => return Err(e),
                Err(error) => {
                    tracing::warn!(key = %config.key, %error, "the server's clock could not be read; trying again");
                    tokio::time::sleep(poll).await;
                }
            }
        };
        let mut said = false;
        // Since when the earlier job was seen between attempts (no live lease, attempts left).
        let mut between_since: Option<tokio::time::Instant> = None;
        let grace = takeover_grace(config);
        loop {
            // Read before the deadline is looked at: an earlier occurrence that ended just as
            // the window closed still lets this one run.
            let closed = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            match self.backend.job_status(&keys, behind.job_key.clone()).await {
                Ok(status) if between_attempts(&status, config.max_attempts) => {
                    let since = *between_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= grace {
                        return Ok(WaitedOut::Ended);
                    }
                }
                Ok(status) if !status.is_live() => return Ok(WaitedOut::Ended),
                Ok(_) => between_since = None,
                Err(e @ Error::Config(_)) => return Err(e),
                Err(error) => {
                    if !said {
                        tracing::warn!(
                            key = %behind.job_key,
                            %error,
                            "the earlier occurrence's job could not be read; trying again"
                        );
                        said = true;
                    }
                }
            }
            if closed {
                return Ok(WaitedOut::WindowClosed);
            }
            let nap = tokio::time::Instant::now() + poll;
            tokio::time::sleep_until(deadline.map_or(nap, |d| d.min(nap))).await;
        }
    }
}

impl Failover {
    /// `replace`'s stop, before `occurrence` is acquired: each of the `live` other
    /// occurrences of `schedule` (ticks and manual ones) is stopped where it runs ([`Failover::replace_attempt`] of the attempt seen, by this writer for
    /// `occurrence`: its holder hears `replaced by …` and stops its work at once, its backups
    /// end without retrying, and it is recorded `replaced` with `record`'s options), then
    /// waited out ([`Failover::wait_out_stop`]: until its holder acknowledged, or its lease's
    /// time ran out by the server's clock). Several hosts binding to `occurrence` at once each
    /// try; the first stops it, the others find it stopped and wait the same. Returns how
    /// many were stopped here.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key or retention; connection errors (call again: a
    /// stop already made is found made).
    pub async fn replace_occurrences(
        &self,
        schedule: &Schedule,
        base: &FailoverConfig,
        record: &super::record::RecordOptions,
        occurrence: &Occurrence,
        live: &[LiveOccurrence],
    ) -> Result<usize, Error> {
        let by = format!(
            "{} for occurrence {}",
            super::record::writer_name(base),
            occurrence.id()
        );
        let mut stopped = 0;
        for earlier in live {
            let old = if earlier.id.starts_with("manual-") {
                // A manual occurrence (`baton trigger`): stopped like any.
                Occurrence::manual(&earlier.id, earlier.tick, None)
            } else {
                match schedule.occurrence_of_tick(earlier.tick) {
                    Some(o) => o,
                    None => continue,
                }
            };
            let super::JobState::Attempt { number, .. } = earlier.status.state else {
                continue;
            };
            let job = base.for_occurrence(&old, None)?.with_occurrence_record(
                &base.key,
                schedule,
                &old,
                record.clone(),
            );
            let expected = crate::lease::store::Expected::Attempt(number);
            if let super::Replaced::Stopped { .. } =
                self.replace_attempt(job.clone(), &expected, &by).await?
            {
                tracing::info!(
                    key = %earlier.job_key,
                    attempt = number,
                    by = %by,
                    "the earlier occurrence's attempt is stopped (overlap replace)"
                );
                stopped += 1;
            }
            self.wait_out_stop(job).await?;
        }
        Ok(stopped)
    }
}

/// A run's value under `buffer-one`: the work's, or none when the window closed first.
enum Gated<T> {
    Ran(T),
    Settled,
}

/// The long-running form's run of `occurrence` under `policy` (after its pause was read):
/// the decision ([`Failover::overlap_decision`], read again every second while it cannot be,
/// said once), then the job through [`Failover::run`], gated behind the earlier occurrence
/// for `buffer-one`: `None` when it was skipped (recorded `skipped_overlap`, best effort, or
/// settled so by its holder), else how its run ended here.
pub(crate) async fn run_occurrence<F, Fut, T, E>(
    failover: &Failover,
    policy: Overlap,
    (schedule, base, record): (&Schedule, &FailoverConfig, &super::record::RecordOptions),
    config: FailoverConfig,
    occurrence: &Occurrence,
    work: F,
) -> Result<Option<super::run::RunOutcome<T, E>>, Error>
where
    F: FnMut(Occurrence, super::run::Attempt) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    use super::run::RunOutcome;
    let mut said = false;
    let decision = loop {
        match failover
            .overlap_decision(policy, schedule, base, occurrence)
            .await
        {
            Ok(d) => break d,
            Err(e @ Error::Config(_)) => return Err(e),
            Err(error) => {
                if !said {
                    tracing::warn!(key = %base.key, %error, "the earlier occurrences could not be read; trying again");
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let behind = match decision {
        OverlapDecision::Run => None,
        OverlapDecision::Skip { live } => {
            tracing::info!(
                key = %occurrence.job_key(&base.key),
                live,
                "earlier occurrences still run: this one is skipped (overlap {})",
                policy.as_str()
            );
            failover.record_in_background(
                base,
                schedule,
                record.clone(),
                occurrence,
                super::record::RecordChange::Outcome {
                    outcome: RecordedOutcome::SkippedOverlap,
                    note: Some(format!("{live} earlier occurrence(s) still ran")),
                },
            );
            return Ok(None);
        }
        OverlapDecision::Buffer { behind } => Some(behind),
        OverlapDecision::Replace { live } => {
            // Stopped and waited out before this one is acquired, tried again while the
            // server cannot be reached (a stop already made is found made).
            let mut said = false;
            loop {
                match failover
                    .replace_occurrences(schedule, base, record, occurrence, &live)
                    .await
                {
                    Ok(_) => break,
                    Err(e @ Error::Config(_)) => return Err(e),
                    Err(error) => {
                        if !said {
                            tracing::warn!(key = %base.key, %error, "the earlier occurrences could not be stopped; trying again");
                            said = true;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            None
        }
    };
    let (waiter, o, job) = (failover.clone(), occurrence.clone(), config.clone());
    let gated = move |attempt: super::run::Attempt| {
        let (waiter, o, job) = (waiter.clone(), o.clone(), job.clone());
        let (behind, mut work) = (behind.clone(), work.clone());
        async move {
            if let Some(behind) = behind {
                match waiter.wait_out_occurrence(&job, &o, &behind).await {
                    Ok(WaitedOut::WindowClosed) => return Ok(Gated::Settled),
                    Ok(WaitedOut::Ended) => {}
                    Err(error) => tracing::warn!(
                        %error,
                        "the earlier occurrence could not be waited for: running this one"
                    ),
                }
            }
            work(o, attempt).await.map(Gated::Ran)
        }
    };
    let settle =
        |g: &Gated<T>| matches!(g, Gated::Settled).then_some(RecordedOutcome::SkippedOverlap);
    let outcome = failover.run_settling(config, gated, settle).await?;
    Ok(match outcome {
        RunOutcome::Done(Gated::Settled)
        | RunOutcome::NotRecorded {
            value: Gated::Settled,
            ..
        }
        | RunOutcome::DoneUnconfirmed {
            value: Gated::Settled,
            ..
        } => None,
        RunOutcome::Done(Gated::Ran(v)) => Some(RunOutcome::Done(v)),
        RunOutcome::NotRecorded {
            attempt,
            value: Gated::Ran(value),
            reason,
        } => Some(RunOutcome::NotRecorded {
            attempt,
            value,
            reason,
        }),
        RunOutcome::DoneUnconfirmed {
            attempt,
            value: Gated::Ran(value),
            kind,
            reason,
        } => Some(RunOutcome::DoneUnconfirmed {
            attempt,
            value,
            kind,
            reason,
        }),
        RunOutcome::CompletedElsewhere => Some(RunOutcome::CompletedElsewhere),
        RunOutcome::Failed {
            attempt,
            reason,
            panicked,
            error,
        } => Some(RunOutcome::Failed {
            attempt,
            reason,
            panicked,
            error,
        }),
        RunOutcome::Exhausted { attempts } => Some(RunOutcome::Exhausted { attempts }),
        RunOutcome::LeaseLost { attempt, reason } => {
            Some(RunOutcome::LeaseLost { attempt, reason })
        }
        RunOutcome::Stopped => Some(RunOutcome::Stopped),
    })
}

/// The job key of the occurrence `id` on record for `key` and `digest`. A manual occurrence
/// (id `manual-…`, `baton trigger`) runs as the digest-free `KEY@manual@ID`; a scheduled one
/// as `KEY@DIGEST@TICK`.
fn occurrence_job_key(key: &str, digest: &str, id: &str) -> String {
    if id.starts_with("manual-") {
        format!("{key}@manual@{id}")
    } else {
        format!("{key}@{digest}@{id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobState;

    fn live(id: &str) -> LiveOccurrence {
        LiveOccurrence {
            id: id.into(),
            job_key: format!("k@d@{id}"),
            tick: SystemTime::UNIX_EPOCH,
            status: JobStatus {
                key: format!("k@d@{id}"),
                state: JobState::Absent,
                state_ttl_ms: None,
                fencing_token: None,
                last_failure: None,
            },
        }
    }

    #[test]
    fn each_policy_decides_by_how_many_earlier_occurrences_are_live() {
        let (none, one, two) = (vec![], vec![live("a")], vec![live("b"), live("a")]);
        for l in [&none, &one, &two] {
            assert_eq!(Overlap::Allow.decide(l), OverlapDecision::Run);
        }
        assert_eq!(Overlap::Skip.decide(&none), OverlapDecision::Run);
        assert_eq!(
            Overlap::Skip.decide(&one),
            OverlapDecision::Skip { live: 1 }
        );
        assert_eq!(Overlap::BufferOne.decide(&none), OverlapDecision::Run);
        assert_eq!(
            Overlap::BufferOne.decide(&one),
            OverlapDecision::Buffer { behind: live("a") }
        );
        assert_eq!(
            Overlap::BufferOne.decide(&two),
            OverlapDecision::Skip { live: 2 }
        );
        assert!(!Overlap::Allow.reads_fleet());
    }

    #[test]
    fn the_window_closes_where_the_next_tick_binds() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let tick = SystemTime::UNIX_EPOCH + Duration::from_secs(60 * 1000);
        let occ = every.occurrence_of_tick(tick).unwrap();
        let close = window_close(&occ).unwrap();
        let next = every
            .occurrence_of_tick(tick + Duration::from_secs(60))
            .unwrap();
        assert_eq!(close, next.tick() - next.early_tolerance());
        assert!(close > tick);
    }

    #[test]
    fn manual_occurrences_run_under_a_digest_free_key() {
        assert_eq!(
            occurrence_job_key("k", "d1", "2026-01-01T00:00:00Z"),
            "k@d1@2026-01-01T00:00:00Z"
        );
        assert_eq!(
            occurrence_job_key("k", "d1", "manual-2026-01-01T00:00:00.001Z"),
            "k@manual@manual-2026-01-01T00:00:00.001Z"
        );
    }
}
