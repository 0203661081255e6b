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

use std::time::SystemTime;

use super::config::FailoverConfig;
pub use super::record_options::RecordOptions;
pub(crate) use super::record_options::{check_history, OccurrenceContext};
use super::run::IntoJob;
use super::{Failover, JobState};
use crate::error::{ConfigError, Error};
pub use crate::schedule::missed_ticks;
use crate::schedule::Schedule;
use crate::util::schedule_record::{
    from_ms, to_ms, RawRecord, RecordWrite, WireAttempt, WireChange,
};
pub use crate::util::schedule_record::{
    record_lifetime, AttemptOutcome, AttemptRecord, Check, CheckStatus, Exit, HostSeen,
    OccurrenceRecord, Pause, RecordChange, RecordedOutcome, ScheduleRecord,
};

impl Failover {
    /// Every record of the schedule on `key` (one per digest: two during a rolling change of
    /// the expression), each with the key's pause (read by the server's clock). The summary's
    /// last outcome is repaired from the newest occurrence's own job (see
    /// [`Failover::schedule_history`]).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; connection errors.
    pub async fn schedule_records(&self, key: impl IntoJob) -> Result<Vec<ScheduleRecord>, Error> {
        let config = key.into_job()?;
        let (raws, pause, now) = self
            .backend
            .schedule_records(&config.prefix, &config.key)
            .await?;
        let paused = pause.and_then(|p| p.at(now));
        let mut out = Vec::with_capacity(raws.len());
        for raw in raws {
            let Some(mut record) = into_record(&config.key, raw, paused.clone()) else {
                continue;
            };
            if record.last_outcome.is_some_and(|o| !o.is_terminal()) {
                if let Some(newest) = self
                    .schedule_history(config.clone(), &record.digest, 1)
                    .await?
                    .into_iter()
                    .next()
                {
                    record.last_outcome = Some(newest.outcome);
                }
            }
            out.push(record);
        }
        Ok(out)
    }

    /// The newest `limit` occurrences on record of the schedule on `key` with `digest`,
    /// newest first, each repaired from its occurrence's own job: an entry left `running` or
    /// `failed` (its worker died between its transition and its record write), or recorded
    /// `missed` or `skipped_paused` by another host while every record write of the host that
    /// ran it was lost, whose job reads `Done`, `Exhausted`, or an attempt, reads as that
    /// state (an attempt whose end was never written shows with an unknown end). An
    /// occurrence whose job has expired keeps what its record says.
    ///
    /// # Errors
    /// As [`Failover::schedule_records`].
    pub async fn schedule_history(
        &self,
        key: impl IntoJob,
        digest: &str,
        limit: usize,
    ) -> Result<Vec<OccurrenceRecord>, Error> {
        let config = key.into_job()?;
        let entries = self
            .backend
            .schedule_history(&config.prefix, &config.key, digest, limit)
            .await?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let Some(mut record) = entry.into_record() else {
                continue;
            };
            // `missed` and `skipped_paused` too: a host whose every record write for the
            // occurrence was lost may still have run it (its job says so), while another host
            // recorded the tick missed or skipped. `skipped_overlap` is left as written: an
            // occurrence settled without running keeps a `DONE` job.
            if matches!(
                record.outcome,
                RecordedOutcome::Running
                    | RecordedOutcome::Failed
                    | RecordedOutcome::Missed
                    | RecordedOutcome::SkippedPaused
            ) {
                // A manual occurrence's job is digest-free (`KEY@manual@ID`).
                let of = if record.manual {
                    crate::schedule::MANUAL_DIGEST
                } else {
                    digest
                };
                let job = format!("{}@{of}@{}", config.key, record.id);
                let job = FailoverConfig::builder(job)
                    .prefix(config.prefix.clone())
                    .build()?;
                let status = self.job_status(job).await?;
                let live = status.is_live();
                repair(&mut record, &status.state, live);
            }
            fill_attempts(&mut record);
            out.push(record);
        }
        Ok(out)
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
        let config = key.into_job()?;
        let by = writer_name(&config);
        let (paused, _) = self
            .backend
            .pause_schedule(&config.prefix, &config.key, until.map(to_ms), &by, note)
            .await?;
        if !paused {
            return Err(Error::Config(ConfigError::invalid(
                "until",
                "is already past by the server's clock",
            )));
        }
        Ok(())
    }

    /// Resumes the schedule on `key`: whether a pause was stored (even one whose `until` had
    /// passed).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid key; connection errors.
    pub async fn resume_schedule(&self, key: impl IntoJob) -> Result<bool, Error> {
        let config = key.into_job()?;
        self.backend
            .resume_schedule(&config.prefix, &config.key)
            .await
    }

    /// The pause of the schedule on `key`, if paused now by the server's clock (an `until` in
    /// the past reads as not paused). One round trip.
    ///
    /// # Errors
    /// As [`Failover::resume_schedule`].
    pub async fn schedule_pause(&self, key: impl IntoJob) -> Result<Option<Pause>, Error> {
        let config = key.into_job()?;
        let (pause, now) = self.backend.read_pause(&config.prefix, &config.key).await?;
        Ok(pause.and_then(|p| p.at(now)))
    }

    /// Writes `change` into the record of `schedule` on `key` for the occurrence of `tick`
    /// (registering the schedule and the writer, the configuration's worker name, as a host
    /// seen): what the workers write on each grant and attempt end, public for applications
    /// and the CLI that record what the worker does not see (an occurrence skipped by overlap
    /// or by a pause). One round trip; `Started`/`Ended` times come from the server's clock.
    /// The record lives [`record_lifetime`] after the write. When `tick` is newer than every
    /// tick on record, the ticks between them that nobody recorded are then recorded `missed`
    /// (unless their own job says they ran), as a worker's grant does: one more write, and a
    /// job read per such tick.
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
        let config = key.into_job()?;
        self.record_change(schedule, options, &config, tick, None, change)
            .await
    }

    /// [`Failover::record_occurrence`] for `occurrence`, a tick of `schedule` or a manual
    /// occurrence ([`Occurrence::manual`](crate::Occurrence::manual)): a manual one is
    /// recorded in the history of `schedule`'s digest (the host's), keyed by its id, scored by
    /// its time, marked [`OccurrenceRecord::manual`] with its trigger's note; it never moves
    /// the record's newest tick (missed ticks are counted from calendar ticks).
    ///
    /// # Errors
    /// As [`Failover::record_occurrence`].
    pub async fn record_occurrence_of(
        &self,
        schedule: &Schedule,
        options: &RecordOptions,
        key: impl IntoJob,
        occurrence: &crate::schedule::Occurrence,
        change: RecordChange,
    ) -> Result<(), Error> {
        let config = key.into_job()?;
        let manual = occurrence.is_manual().then_some(occurrence);
        self.record_change(
            schedule,
            options,
            &config,
            occurrence.tick(),
            manual,
            change,
        )
        .await
    }

    /// The write of both: `change` for `tick` (or the manual occurrence), then the missed
    /// ticks before a calendar tick newer than every tick on record.
    async fn record_change(
        &self,
        schedule: &Schedule,
        options: &RecordOptions,
        config: &FailoverConfig,
        tick: SystemTime,
        manual: Option<&crate::schedule::Occurrence>,
        change: RecordChange,
    ) -> Result<(), Error> {
        options.validate()?;
        let host = writer_name(config);
        let gap = manual.is_none() && !matches!(change, RecordChange::Missed(_));
        let write = record_write(
            schedule,
            options,
            (&config.prefix, &config.key, &host),
            tick,
            manual,
            change,
        )?;
        let prev = self.backend.record_write(&write).await?;
        // A tick skipped (paused, overlap) moves the newest tick on record as a grant does:
        // the ticks before it that nobody recorded are missed, found here as a grant's write
        // finds them, or the next grant would never see them.
        if gap {
            let recorder = Recorder {
                backend: self.backend.clone(),
                prefix: config.prefix.clone(),
                host,
                ctx: OccurrenceContext {
                    key: config.key.clone(),
                    schedule: schedule.clone(),
                    tick,
                    options: options.clone(),
                    manual: None,
                },
            };
            recorder.fill_gap(prev).await;
        }
        Ok(())
    }
}

impl Failover {
    /// [`Failover::record_occurrence_of`] in the background, best effort (a failure is a warning
    /// and a count in `baton_schedule_record_errors_total`): what the schedule's driver
    /// records of the ticks it does not run (skipped by overlap or by a pause).
    pub(crate) fn record_in_background(
        &self,
        config: &FailoverConfig,
        schedule: &Schedule,
        options: RecordOptions,
        occurrence: &crate::schedule::Occurrence,
        change: RecordChange,
    ) {
        let (this, config, schedule) = (self.clone(), config.clone(), schedule.clone());
        let occurrence = occurrence.clone();
        self.backend.tracker().spawn(async move {
            let key = config.key.clone();
            if let Err(error) = this
                .record_occurrence_of(&schedule, &options, config, &occurrence, change)
                .await
            {
                crate::util::metrics::count(
                    crate::util::metrics::Count::ScheduleRecordErrors,
                    this.backend.label(),
                );
                tracing::warn!(%key, %error, "the schedule's record could not be written");
            }
        });
    }
}

/// The write of `change` for `tick` (checked to be a tick of `schedule`), or for the manual
/// occurrence `manual` (its own id and time, `tick` ignored).
pub(crate) fn record_write(
    schedule: &Schedule,
    options: &RecordOptions,
    (prefix, key, host): (&str, &str, &str),
    tick: SystemTime,
    manual: Option<&crate::schedule::Occurrence>,
    change: RecordChange,
) -> Result<RecordWrite, Error> {
    let occurrence = match manual {
        Some(m) => m.clone(),
        None => schedule.occurrence_of_tick(tick).ok_or_else(|| {
            Error::Config(ConfigError::invalid(
                "tick",
                format!("{tick:?} is not a tick of {schedule}"),
            ))
        })?,
    };
    let tick = occurrence.tick();
    let gap = occurrence
        .next_tick()
        .and_then(|n| n.duration_since(tick).ok());
    let host = host.to_string();
    let spec = schedule
        .spec()
        .with_history(options.history)
        .with_jitter(options.jitter);
    let spec = serde_json::to_string(&spec).map_err(|e| {
        Error::Config(ConfigError::invalid(
            "schedule",
            format!("unserializable: {e}"),
        ))
    })?;
    let id = occurrence.id().to_string();
    let base = WireChange {
        tick: to_ms(tick),
        id: id.clone(),
        manual: manual.is_some(),
        ..Default::default()
    };
    let changes = match change {
        RecordChange::Attempt(a) => vec![WireChange {
            n: Some(a.attempt),
            attempt: Some(WireAttempt {
                host: a.host,
                start: a.started.map(to_ms),
                end: a.ended.map(to_ms),
                exit: a.exit,
                message: a.message,
                outcome: a.outcome,
                settle: None,
            }),
            ..base
        }],
        RecordChange::Started { attempt } => vec![WireChange {
            n: Some(attempt),
            attempt: Some(WireAttempt {
                host: Some(host.clone()),
                start: Some(-1),
                ..Default::default()
            }),
            ..base
        }],
        RecordChange::Ended {
            attempt,
            outcome,
            exit,
            message,
        } => vec![WireChange {
            n: Some(attempt),
            attempt: Some(WireAttempt {
                end: Some(-1),
                exit,
                message,
                outcome: Some(outcome),
                ..Default::default()
            }),
            ..base
        }],
        RecordChange::Settled {
            attempt,
            outcome,
            message,
        } => vec![WireChange {
            n: Some(attempt),
            attempt: Some(WireAttempt {
                end: Some(-1),
                message,
                outcome: Some(AttemptOutcome::Done),
                settle: Some(outcome.as_str().to_string()),
                ..Default::default()
            }),
            ..base
        }],
        RecordChange::Outcome { outcome, note } => vec![WireChange {
            outcome: Some(outcome.as_str().to_string()),
            note,
            ..base
        }],
        // Missed ticks are the calendar's: nothing to write for a manual occurrence.
        RecordChange::Missed(_) if manual.is_some() => vec![],
        RecordChange::Missed(ticks) => ticks
            .into_iter()
            .filter_map(|t| schedule.occurrence_of_tick(t))
            .map(|o| WireChange {
                tick: to_ms(o.tick()),
                id: o.id().to_string(),
                outcome: Some(RecordedOutcome::Missed.as_str().to_string()),
                ..Default::default()
            })
            .collect(),
    };
    let mut changes = changes;
    if let Some(note) = manual.and_then(|m| m.note()) {
        // The trigger's note, unless the change brings its own.
        for c in &mut changes {
            c.note.get_or_insert_with(|| note.to_string());
        }
    }
    Ok(RecordWrite {
        prefix: prefix.to_string(),
        key: key.to_string(),
        digest: schedule.digest().to_string(),
        spec,
        host,
        history: options.history,
        lifetime: record_lifetime(gap),
        changes,
    })
}

fn into_record(key: &str, raw: RawRecord, paused: Option<Pause>) -> Option<ScheduleRecord> {
    let spec = serde_json::from_str(&raw.spec).ok()?;
    Some(ScheduleRecord {
        key: key.to_string(),
        digest: raw.digest,
        spec,
        first_seen: from_ms(raw.first_seen_ms),
        last_seen: from_ms(raw.last_seen_ms),
        last_tick: raw.last_tick_ms.map(from_ms),
        last_success: raw.last_success_ms.map(from_ms),
        last_outcome: raw.last_outcome.as_deref().and_then(RecordedOutcome::parse),
        hosts: raw
            .hosts
            .into_iter()
            .map(|(host, ms)| HostSeen {
                host,
                last_seen: from_ms(ms),
            })
            .collect(),
        paused,
    })
}

/// Repairs an entry left `running`/`failed` (or recorded `missed`/`skipped_paused` by
/// another host) from its occurrence's job: `state` as read, and
/// whether a lease is live. Pure, for the unit tests.
pub(crate) fn repair(record: &mut OccurrenceRecord, state: &JobState, live: bool) {
    let repaired = match state {
        JobState::Done => RecordedOutcome::Done,
        JobState::Exhausted => RecordedOutcome::Exhausted,
        JobState::Attempt { .. } if live => RecordedOutcome::Running,
        JobState::Attempt { .. } => RecordedOutcome::Failed,
        // Gone (expired, reset) or unknown: the record is all there is.
        _ => return,
    };
    let unseen = match state {
        JobState::Attempt { number, .. } => !record.attempts.iter().any(|a| a.attempt == *number),
        _ => false,
    };
    if repaired == record.outcome && !unseen {
        return;
    }
    record.outcome = repaired;
    let note = "repaired from the occurrence's own state: its worker's record write is missing";
    record.note.get_or_insert_with(|| note.to_string());
    if let JobState::Attempt { number, .. } = state {
        if !record.attempts.iter().any(|a| a.attempt == *number) {
            record.attempts.push(AttemptRecord::new(*number));
            record.attempts.sort_by_key(|a| a.attempt);
        }
    }
    // An attempt that never wrote its end, now that a later state exists, ended unknown.
    let last = record.attempts.iter().map(|a| a.attempt).max();
    for a in &mut record.attempts {
        let superseded = Some(a.attempt) != last || repaired.is_terminal() || !live;
        if a.outcome.is_none() && superseded {
            a.outcome = Some(
                if repaired == RecordedOutcome::Done && Some(a.attempt) == last {
                    AttemptOutcome::Done
                } else {
                    AttemptOutcome::Lost
                },
            );
        }
    }
}

/// Shows the attempts below the newest on record whose every write was lost (a worker killed
/// right after its grant, before its grant's write landed): attempts are numbered from 1 with
/// no gap, so a missing number ran on a host unknown, its end unknown. Pure, for the tests.
pub(crate) fn fill_attempts(record: &mut OccurrenceRecord) {
    let Some(last) = record.attempts.iter().map(|a| a.attempt).max() else {
        return;
    };
    // Bounded: a corrupt number must not make a huge list (attempts are at most thousands).
    let first = last.saturating_sub(1000).max(1);
    let missing: Vec<u64> = (first..last)
        .filter(|n| !record.attempts.iter().any(|a| a.attempt == *n))
        .collect();
    if missing.is_empty() {
        return;
    }
    for n in missing {
        let mut a = AttemptRecord::new(n);
        a.outcome = Some(AttemptOutcome::Lost);
        record.attempts.push(a);
    }
    record.attempts.sort_by_key(|a| a.attempt);
}

/// A worker's writer of its occurrence's record: each change is a spawned best-effort task
/// on the client's tracker, never awaited by the worker's loop.
pub(crate) struct Recorder {
    backend: crate::backend::Backend,
    prefix: String,
    host: std::sync::Arc<str>,
    ctx: OccurrenceContext,
}

impl Recorder {
    /// The recorder of `config`'s occurrence, if it has one.
    pub(crate) fn of(
        backend: &crate::backend::Backend,
        config: &FailoverConfig,
    ) -> Option<std::sync::Arc<Recorder>> {
        let ctx = config.occurrence.as_deref()?.clone();
        Some(std::sync::Arc::new(Recorder {
            backend: backend.clone(),
            prefix: config.prefix.clone(),
            host: writer_name(config),
            ctx,
        }))
    }

    /// Writes `change` in the background.
    pub(crate) fn spawn(self: &std::sync::Arc<Self>, change: RecordChange) {
        let this = self.clone();
        self.backend
            .tracker()
            .spawn(async move { this.write(change).await });
    }

    /// Writes `change` now (best effort, as [`spawn`](Self::spawn)'s: a failure is a warning
    /// and a count, never an error).
    pub(crate) async fn write_now(&self, change: RecordChange) {
        self.write(change).await;
    }

    async fn write(&self, change: RecordChange) {
        let grant = matches!(change, RecordChange::Started { .. });
        let prev = match self.apply(change).await {
            Ok(prev) => prev,
            Err(error) => {
                crate::util::metrics::count(
                    crate::util::metrics::Count::ScheduleRecordErrors,
                    self.backend.label(),
                );
                tracing::warn!(
                    key = %self.ctx.key,
                    occurrence = %crate::util::schedule_record::rfc3339::text(self.ctx.tick),
                    %error,
                    "the schedule's record could not be written (the job is not affected)"
                );
                return;
            }
        };
        if grant {
            self.fill_gap(prev).await;
        }
    }

    /// Records the ticks between `prev` (the newest tick on record before this occurrence's
    /// write, as the write returned it) and this occurrence's: their windows closed with
    /// nobody on record, so they were missed, unless their own job says they ran (the script
    /// keeps any entry they have). Best effort: failures are warnings and counts. A manual
    /// occurrence is no calendar tick: it says nothing of missed ones.
    async fn fill_gap(&self, prev: Option<i64>) {
        if self.ctx.manual.is_some() {
            return;
        }
        let Some(prev) = prev.map(from_ms) else {
            return;
        };
        let missed = ticks_between(
            &self.ctx.schedule,
            prev,
            self.ctx.tick,
            self.ctx.options.history,
        );
        // A tick with no entry may still have run, on a host whose baton writes no record
        // (an older version): its occurrence's own job says so. Such ticks are written with
        // what their job reads, never `missed`.
        let mut truly_missed = Vec::with_capacity(missed.len());
        for tick in missed {
            match self.ran_unrecorded(tick).await {
                Some(change) => {
                    if let Err(error) = self.apply_at(tick, change).await {
                        crate::util::metrics::count(
                            crate::util::metrics::Count::ScheduleRecordErrors,
                            self.backend.label(),
                        );
                        tracing::warn!(key = %self.ctx.key, %error, "an unrecorded occurrence could not be recorded");
                    }
                }
                None => truly_missed.push(tick),
            }
        }
        let missed = truly_missed;
        if !missed.is_empty() {
            if let Err(error) = self.apply(RecordChange::Missed(missed)).await {
                crate::util::metrics::count(
                    crate::util::metrics::Count::ScheduleRecordErrors,
                    self.backend.label(),
                );
                tracing::warn!(key = %self.ctx.key, %error, "missed ticks could not be recorded");
            }
        }
    }

    async fn apply(&self, change: RecordChange) -> Result<Option<i64>, Error> {
        self.apply_at(self.ctx.tick, change).await
    }

    async fn apply_at(&self, tick: SystemTime, change: RecordChange) -> Result<Option<i64>, Error> {
        let manual = self.ctx.manual.as_ref().filter(|_| tick == self.ctx.tick);
        let write = record_write(
            &self.ctx.schedule,
            &self.ctx.options,
            (&self.prefix, &self.ctx.key, &self.host),
            tick,
            manual,
            change,
        )?;
        self.backend.record_write(&write).await
    }

    /// What the job of the occurrence of `tick` says happened, when it exists: the outcome to
    /// record for an occurrence a host ran without writing the record. `None` when it has no
    /// job (never run, or its retention passed) or the read failed: then it was missed as far
    /// as anyone can tell.
    async fn ran_unrecorded(&self, tick: SystemTime) -> Option<RecordChange> {
        let occurrence = self.ctx.schedule.occurrence_of_tick(tick)?;
        let name = occurrence.job_key(&self.ctx.key);
        let keys = super::keys::JobKeys::new(&self.prefix, &name);
        let status = self.backend.job_status(&keys, name).await.ok()?;
        let outcome = match status.state {
            JobState::Done => RecordedOutcome::Done,
            JobState::Exhausted => RecordedOutcome::Exhausted,
            JobState::Attempt { .. } if status.is_live() => RecordedOutcome::Running,
            JobState::Attempt { .. } => RecordedOutcome::Failed,
            _ => return None,
        };
        Some(RecordChange::Outcome {
            outcome,
            note: Some(UNRECORDED.to_string()),
        })
    }
}

/// The note on an occurrence a host ran without writing the record (an older baton).
const UNRECORDED: &str =
    "run by a host that writes no record (an older baton): outcome read from its job";

/// The ticks strictly between `after` and `before`, the newest `limit` of them.
pub(crate) fn ticks_between(
    schedule: &Schedule,
    after: SystemTime,
    before: SystemTime,
    limit: u32,
) -> Vec<SystemTime> {
    let mut out = std::collections::VecDeque::new();
    let mut t = schedule.next_after(after);
    // Bounded walk: a schedule of one second left alone for a month has millions of ticks;
    // the history keeps `limit` anyway.
    let mut steps = 0u32;
    while let Some(tick) = t {
        if tick >= before || steps >= 100_000 {
            break;
        }
        steps += 1;
        out.push_back(tick);
        if out.len() > limit as usize {
            out.pop_front();
        }
        t = schedule.next_after(tick);
    }
    out.into()
}

impl FailoverConfig {
    /// This occurrence job's configuration, recording its attempts in the record of
    /// `schedule` on `key` (the schedule's key, as given to
    /// [`FailoverConfig::for_occurrence`]'s configuration) for the tick `tick`: each grant,
    /// attempt end and exhaustion is written in the background by the worker, best effort.
    /// [`Failover::schedule`] and `baton run --every/--cron` use it.
    pub fn with_record(
        mut self,
        key: &str,
        schedule: &Schedule,
        tick: SystemTime,
        options: RecordOptions,
    ) -> FailoverConfig {
        self.occurrence = Some(std::sync::Arc::new(OccurrenceContext {
            key: key.to_string(),
            schedule: schedule.clone(),
            tick,
            options,
            manual: None,
        }));
        self
    }

    /// [`FailoverConfig::with_record`] for `occurrence`: a tick of `schedule`, or a manual
    /// occurrence ([`Occurrence::manual`](crate::Occurrence::manual)), recorded in the history
    /// of `schedule`'s digest under its own id ([`Failover::record_occurrence_of`]). What both
    /// schedule drivers and `baton run` use.
    pub fn with_occurrence_record(
        mut self,
        key: &str,
        schedule: &Schedule,
        occurrence: &crate::schedule::Occurrence,
        options: RecordOptions,
    ) -> FailoverConfig {
        self.occurrence = Some(std::sync::Arc::new(OccurrenceContext {
            key: key.to_string(),
            schedule: schedule.clone(),
            tick: occurrence.tick(),
            options,
            manual: occurrence.is_manual().then(|| occurrence.clone()),
        }));
        self
    }
}

/// The writer's name: the configuration's worker name, else host and PID (as a worker's).
pub(crate) fn writer_name(config: &FailoverConfig) -> std::sync::Arc<str> {
    config
        .worker_name
        .as_deref()
        .map_or_else(crate::util::token::default_worker_name, Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(attempts: &[u64]) -> OccurrenceRecord {
        OccurrenceRecord {
            tick: SystemTime::UNIX_EPOCH,
            id: "t".into(),
            outcome: RecordedOutcome::Running,
            attempts: attempts.iter().map(|n| AttemptRecord::new(*n)).collect(),
            note: None,
            manual: false,
        }
    }

    fn attempt(number: u64) -> JobState {
        JobState::Attempt {
            number,
            holder: None,
            lease_remaining_ms: None,
        }
    }

    #[test]
    fn an_entry_left_running_reads_as_its_jobs_state() {
        // Its worker ended the job done and died before writing the end.
        let mut r = running(&[1]);
        repair(&mut r, &JobState::Done, false);
        assert_eq!(r.outcome, RecordedOutcome::Done);
        assert_eq!(r.attempts[0].outcome, Some(AttemptOutcome::Done));
        assert_eq!(r.attempts[0].ended, None, "its end is unknown");
        assert!(r.note.is_some());
        // Killed after its grant: the attempt has no live lease.
        let mut r = running(&[1]);
        repair(&mut r, &attempt(1), false);
        assert_eq!(r.outcome, RecordedOutcome::Failed);
        assert_eq!(r.attempts[0].outcome, Some(AttemptOutcome::Lost));
        // A later attempt, granted by a host whose write is missing, shows with no host.
        let mut r = running(&[1]);
        repair(&mut r, &JobState::Exhausted, false);
        assert_eq!(r.outcome, RecordedOutcome::Exhausted);
        let mut r = running(&[1]);
        repair(&mut r, &attempt(2), true);
        assert_eq!(r.outcome, RecordedOutcome::Running);
        assert_eq!(r.attempts.len(), 2);
        assert_eq!(r.attempts[0].outcome, Some(AttemptOutcome::Lost));
        assert_eq!(r.attempts[1].outcome, None, "still running");
        // Still running with a live lease: nothing to repair.
        let mut r = running(&[1]);
        repair(&mut r, &attempt(1), true);
        assert_eq!(r, running(&[1]));
        // Recorded missed by a later grant while the host that ran it lost every write.
        let mut r = running(&[]);
        r.outcome = RecordedOutcome::Missed;
        repair(&mut r, &JobState::Done, false);
        assert_eq!(r.outcome, RecordedOutcome::Done);
        assert!(r.note.is_some());
        // A job gone (expired): the record is all there is.
        let mut r = running(&[1]);
        repair(&mut r, &JobState::Absent, false);
        assert_eq!(r, running(&[1]));
    }

    #[test]
    fn an_attempt_whose_writes_were_lost_shows_with_no_host() {
        let mut r = running(&[1, 3]);
        fill_attempts(&mut r);
        let numbers: Vec<u64> = r.attempts.iter().map(|a| a.attempt).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(r.attempts[1].host, None);
        assert_eq!(r.attempts[1].outcome, Some(AttemptOutcome::Lost));
        // Nothing to fill.
        let mut r = running(&[1, 2]);
        fill_attempts(&mut r);
        assert_eq!(r, running(&[1, 2]));
        let mut r = running(&[]);
        fill_attempts(&mut r);
        assert!(r.attempts.is_empty());
    }

    #[test]
    fn the_ticks_between_two_are_the_newest_limit() {
        let s = Schedule::every(std::time::Duration::from_secs(60)).unwrap();
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60 * 1000);
        let min = std::time::Duration::from_secs(60);
        assert_eq!(
            ticks_between(&s, t0, t0 + min * 5, 10),
            [t0 + min, t0 + min * 2, t0 + min * 3, t0 + min * 4]
        );
        assert_eq!(
            ticks_between(&s, t0, t0 + min * 5, 2),
            [t0 + min * 3, t0 + min * 4]
        );
        assert!(ticks_between(&s, t0, t0 + min, 10).is_empty());
    }
}
