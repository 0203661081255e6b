//! A schedule as plain data ([`ScheduleSpec`]): what the schedule's record in the store keeps
//! of it, so that a reader on any host (`baton status`, `baton check`, the dashboard) can
//! rebuild the calendar with [`Schedule::from_spec`] without the program's flags; and what a
//! reader makes of a record, from the calendar alone: [`missed_ticks`] and
//! [`ScheduleRecord::check`] (pure: the record is read elsewhere).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::{Kind, Schedule};
use crate::error::ConfigError;
use crate::util::schedule_record::{
    rfc3339, Check, CheckStatus, OccurrenceRecord, RecordedOutcome, ScheduleRecord,
};
pub use crate::util::schedule_record::{ScheduleSpec, SpecKind, DEFAULT_HISTORY, MAX_HISTORY};

/// The most missed ticks [`missed_ticks`] returns (the newest), and the most steps it walks.
const MAX_MISSED: usize = 1000;
const MAX_STEPS: usize = 100_000;

impl Schedule {
    /// This schedule as plain data (for its record): jitter zero and the default history
    /// ([`DEFAULT_HISTORY`]) until set with [`ScheduleSpec::with_jitter`] /
    /// [`ScheduleSpec::with_history`].
    pub fn spec(&self) -> ScheduleSpec {
        let kind = match &self.kind {
            Kind::Every { period, offset } => SpecKind::Every {
                period: *period,
                offset: *offset,
            },
            Kind::Cron {
                expr, zone_name, ..
            } => SpecKind::Cron {
                expr: expr.clone(),
                zone: zone_name.clone(),
            },
        };
        ScheduleSpec {
            text: self.to_string(),
            kind,
            early: self.early,
            jitter: Duration::ZERO,
            history: DEFAULT_HISTORY,
        }
    }

    /// The schedule a [`ScheduleSpec`] describes (its calendar and early tolerance; the
    /// jitter and history are the record's, not the calendar's).
    ///
    /// # Errors
    /// As [`Schedule::every`], [`Schedule::offset`] and [`Schedule::cron_in`]: a spec written
    /// by another version may name what this one refuses.
    pub fn from_spec(spec: &ScheduleSpec) -> Result<Schedule, ConfigError> {
        let schedule = match &spec.kind {
            SpecKind::Every { period, offset } => {
                let every = Schedule::every(*period)?;
                if offset.is_zero() {
                    every
                } else {
                    every.offset(*offset)?
                }
            }
            SpecKind::Cron { expr, zone } => Schedule::cron_in(expr, zone)?,
        };
        Ok(schedule.early(spec.early))
    }
}

impl super::Occurrence {
    /// When runs stop binding to this tick: the next tick less its early tolerance (`None`
    /// past the calendar's end). A tick whose window closed with no attempt on record was
    /// missed.
    pub fn binds_until(&self) -> Option<std::time::SystemTime> {
        self.next?.checked_sub(self.next_early?)
    }
}

impl ScheduleRecord {
    /// Judges the record with its `history` (newest first or in any order) at `now` (the
    /// server's clock): missed occurrences (on record, or computed by [`missed_ticks`]: not
    /// counting ticks while paused), and exhausted ones after the last success are
    /// CRITICAL, as is a last success older than `max_age` (or none, for a schedule first
    /// seen longer ago than that). A failed attempt whose occurrence is still the newest (a
    /// backup may retry it) is a WARNING; a failed occurrence that is not the newest is
    /// CRITICAL. A spec this version cannot read is UNKNOWN. A host running an older baton
    /// that writes no record leaves ticks without entries: they read as missed once their
    /// window closed.
    pub fn check(
        &self,
        history: &[OccurrenceRecord],
        now: SystemTime,
        max_age: Option<Duration>,
    ) -> Check {
        let name = &self.key;
        let schedule = match Schedule::from_spec(&self.spec) {
            Ok(s) => s,
            Err(e) => {
                return Check {
                    status: CheckStatus::Unknown,
                    line: format!("UNKNOWN: {name}: its recorded schedule is unreadable: {e}"),
                    missed: vec![],
                    failed: vec![],
                }
            }
        };
        let mut sorted: Vec<&OccurrenceRecord> = history.iter().collect();
        sorted.sort_by_key(|o| o.tick);
        let last_done = sorted
            .iter()
            .rposition(|o| o.outcome == RecordedOutcome::Done);
        let since = last_done.map_or(0, |i| i + 1);
        let newest = sorted.len().checked_sub(1);
        let mut missed: Vec<SystemTime> = vec![];
        let mut failed = vec![];
        let mut warning = vec![];
        for (i, o) in sorted.iter().enumerate().skip(since) {
            match o.outcome {
                RecordedOutcome::Missed => missed.push(o.tick),
                RecordedOutcome::Exhausted => failed.push(o.id.clone()),
                RecordedOutcome::Failed if Some(i) == newest => warning.push(o.id.clone()),
                RecordedOutcome::Failed => failed.push(o.id.clone()),
                _ => {}
            }
        }
        let paused_at = self.paused.as_ref().map(|p| p.at);
        // Missed ticks are forgiven up to the newest tick done, not a manual run's time.
        let floor = sorted
            .iter()
            .rev()
            .find(|o| o.outcome == RecordedOutcome::Done && !o.manual)
            .map(|o| o.tick);
        missed.extend(
            missed_ticks(&schedule, history, now)
                .into_iter()
                .filter(|t| paused_at.map_or(true, |at| *t < at))
                .filter(|t| floor.map_or(true, |f| *t > f)),
        );
        missed.sort();
        missed.dedup();
        let missed: Vec<String> = missed.into_iter().map(rfc3339::text).collect();
        let mut problems = vec![];
        let mut status = CheckStatus::Ok;
        if !missed.is_empty() {
            status = CheckStatus::Critical;
            problems.push(format!("{} missed ({})", missed.len(), list(&missed)));
        }
        if !failed.is_empty() {
            status = CheckStatus::Critical;
            problems.push(format!("{} failed ({})", failed.len(), list(&failed)));
        }
        if let Some(max) = max_age {
            let reference = self.last_success.unwrap_or(self.first_seen);
            let age = now.duration_since(reference).unwrap_or(Duration::ZERO);
            if age > max {
                status = CheckStatus::Critical;
                problems.push(match self.last_success {
                    Some(_) => format!("last success {} ago, more than {}", short(age), short(max)),
                    None => format!("no success in {} on record", short(age)),
                });
            }
        }
        if !warning.is_empty() && status == CheckStatus::Ok {
            status = CheckStatus::Warning;
        }
        if !warning.is_empty() {
            problems.push(format!("attempt failed on {} (retrying)", list(&warning)));
        }
        let mut line = format!("{}: {name} ({})", status.as_str(), self.spec.text);
        if problems.is_empty() {
            match self.last_success {
                Some(t) => line.push_str(&format!(
                    ": last success {} ago",
                    short(now.duration_since(t).unwrap_or(Duration::ZERO))
                )),
                None => line.push_str(": no success on record yet"),
            }
        } else {
            line.push_str(": ");
            line.push_str(&problems.join("; "));
        }
        if let Some(p) = &self.paused {
            line.push_str(&match p.until {
                Some(u) => format!("; paused until {}", rfc3339::text(u)),
                None => "; paused".to_string(),
            });
        }
        Check {
            status,
            line,
            missed,
            failed,
        }
    }
}

fn list(ids: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut s = ids
        .iter()
        .rev()
        .take(SHOWN)
        .rev()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > SHOWN {
        s = format!("…, {s}");
    }
    s
}

fn short(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 2 * 86_400 {
        format!("{}d", s / 86_400)
    } else if s >= 7200 {
        format!("{}h", s / 3600)
    } else if s >= 120 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// The ticks of `schedule` after the oldest in `history` whose binding window (the tick until
/// the next tick less its early tolerance) closed by `now` with no entry in `history`: the
/// occurrences nobody ran, oldest first. Computed from the record alone, so it holds when
/// every worker is down. At most the newest 1 000 (and no further back than 100 000 ticks).
/// An empty history vouches for nothing: no ticks. Manual occurrences
/// ([`OccurrenceRecord::manual`]) are ignored: they are not ticks of the calendar.
pub fn missed_ticks(
    schedule: &Schedule,
    history: &[OccurrenceRecord],
    now: SystemTime,
) -> Vec<SystemTime> {
    // Manual occurrences are not ticks of the calendar: they neither vouch for a tick nor
    // stand in for one.
    let ticks = || history.iter().filter(|o| !o.manual).map(|o| o.tick);
    let Some(oldest) = ticks().min() else {
        return vec![];
    };
    let seen: HashSet<SystemTime> = ticks().collect();
    let mut out = vec![];
    let mut t = schedule.latest_at_or_before(now);
    let mut steps = 0;
    while let Some(tick) = t {
        if tick <= oldest || out.len() >= MAX_MISSED || steps >= MAX_STEPS {
            break;
        }
        steps += 1;
        let closed = schedule
            .occurrence_of_tick(tick)
            .and_then(|o| o.binds_until())
            .is_some_and(|close| close <= now);
        if closed && !seen.contains(&tick) {
            out.push(tick);
        }
        t = tick
            .checked_sub(Duration::from_nanos(1))
            .and_then(|b| schedule.latest_at_or_before(b));
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::schedule_record::Pause;

    #[test]
    fn a_spec_reads_back_as_the_same_schedule() {
        let cron = Schedule::cron_in("0  2 * * *", "Europe/Paris")
            .unwrap()
            .early(Duration::from_secs(30));
        let every = Schedule::every(Duration::from_secs(3600))
            .unwrap()
            .offset(Duration::from_secs(120))
            .unwrap();
        for s in [cron, every] {
            let spec = s.spec().with_history(7).with_jitter(Duration::from_secs(5));
            let json = serde_json::to_string(&spec).unwrap();
            let back: ScheduleSpec = serde_json::from_str(&json).unwrap();
            assert_eq!(back, spec, "{json}");
            assert_eq!(Schedule::from_spec(&back).unwrap(), s);
            assert_eq!(back.text, s.to_string());
        }
    }

    #[test]
    fn the_wire_names_are_the_documented_ones() {
        let s = Schedule::cron_in("0 2 * * *", "UTC").unwrap();
        let v = serde_json::to_value(s.spec()).unwrap();
        assert_eq!(v["kind"], "cron");
        assert_eq!(v["cron"], "0 2 * * *");
        assert_eq!(v["zone"], "UTC");
        assert_eq!(v["early_ms"], 60_000);
        assert_eq!(v["history"], 50);
        let e =
            serde_json::to_value(Schedule::every(Duration::from_secs(60)).unwrap().spec()).unwrap();
        assert_eq!(
            (e["kind"].as_str(), e["every_ms"].as_u64()),
            (Some("every"), Some(60_000))
        );
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const MINUTE: Duration = Duration::from_secs(60);

    fn hourly() -> Schedule {
        Schedule::every(HOUR).unwrap()
    }

    /// An hour-aligned tick, `n` hours after a fixed origin.
    fn at(n: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + HOUR * (500_000 + n as u32)
    }

    fn entry(n: u64, outcome: RecordedOutcome) -> OccurrenceRecord {
        let s = hourly();
        let o = s.occurrence_of_tick(at(n)).unwrap();
        OccurrenceRecord {
            tick: at(n),
            id: o.id().to_string(),
            outcome,
            attempts: vec![],
            note: None,
            manual: false,
        }
    }

    fn record(history: u32) -> ScheduleRecord {
        ScheduleRecord {
            key: "nightly".into(),
            digest: hourly().digest().to_string(),
            spec: hourly().spec().with_history(history),
            first_seen: at(0),
            last_seen: at(0),
            last_tick: None,
            last_success: None,
            last_outcome: None,
            hosts: vec![],
            paused: None,
        }
    }

    #[test]
    fn missed_ticks_are_the_closed_windows_with_no_entry_after_the_oldest() {
        let s = hourly();
        // Nothing on record vouches for nothing.
        assert!(missed_ticks(&s, &[], at(10)).is_empty());
        let h = [
            entry(0, RecordedOutcome::Done),
            entry(2, RecordedOutcome::Done),
        ];
        // At 3h + 30 min: tick 1's window closed empty; tick 3's is open (until 4h - 60 s).
        assert_eq!(missed_ticks(&s, &h, at(3) + MINUTE * 30), [at(1)]);
        // The window closes at the next tick less the early tolerance, inclusive.
        assert_eq!(missed_ticks(&s, &h, at(4) - MINUTE), [at(1), at(3)]);
        assert_eq!(
            missed_ticks(&s, &h, at(4) - MINUTE - Duration::from_millis(1)),
            [at(1)]
        );
        // Nothing before the oldest on record.
        assert_eq!(missed_ticks(&s, &h[1..], at(3)), Vec::<SystemTime>::new());
        // Any entry counts: a skipped or failed tick was not missed.
        let h = [
            entry(0, RecordedOutcome::Done),
            entry(1, RecordedOutcome::SkippedPaused),
            entry(2, RecordedOutcome::Failed),
        ];
        assert!(missed_ticks(&s, &h, at(3)).is_empty());
    }

    #[test]
    fn missed_ticks_are_bounded() {
        let s = Schedule::every(Duration::from_secs(1)).unwrap();
        let first = SystemTime::UNIX_EPOCH + HOUR * 500_000;
        let o = s.occurrence_of_tick(first).unwrap();
        let h = [OccurrenceRecord {
            tick: first,
            id: o.id().to_string(),
            outcome: RecordedOutcome::Done,
            attempts: vec![],
            note: None,
            manual: false,
        }];
        // A day of one-second ticks left alone: the newest 1 000 only.
        let got = missed_ticks(&s, &h, first + HOUR * 24);
        assert_eq!(got.len(), MAX_MISSED);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn check_reads_the_newest_occurrences_since_the_last_success() {
        let r = record(50);
        let now = at(3) + MINUTE * 10;
        let done = |n| entry(n, RecordedOutcome::Done);
        // Every tick done: OK.
        let c = r.check(&[done(0), done(1), done(2), done(3)], now, None);
        assert_eq!(c.status, CheckStatus::Ok, "{}", c.line);
        assert!(c.line.starts_with("OK: nightly (every 1h"), "{}", c.line);
        // A missed tick on record, and one computed (tick 2 has no entry): CRITICAL, both named.
        let c = r.check(
            &[done(0), entry(1, RecordedOutcome::Missed), done(3)],
            now,
            None,
        );
        assert_eq!(
            c.status,
            CheckStatus::Ok,
            "a success after them: {}",
            c.line
        );
        let c = r.check(&[done(0), entry(1, RecordedOutcome::Missed)], now, None);
        assert_eq!(c.status, CheckStatus::Critical, "{}", c.line);
        assert_eq!(c.missed.len(), 2, "{:?}", c.missed);
        assert!(c.line.contains("2 missed"), "{}", c.line);
        // The newest attempt failed (a backup may retry it): WARNING; an older failure or an
        // exhaustion since the last success: CRITICAL.
        let c = r.check(&[done(2), entry(3, RecordedOutcome::Failed)], now, None);
        assert_eq!(c.status, CheckStatus::Warning, "{}", c.line);
        let c = r.check(
            &[
                entry(2, RecordedOutcome::Failed),
                entry(3, RecordedOutcome::Running),
            ],
            now,
            None,
        );
        assert_eq!(
            (c.status, c.failed.len()),
            (CheckStatus::Critical, 1),
            "{}",
            c.line
        );
        let c = r.check(&[done(2), entry(3, RecordedOutcome::Exhausted)], now, None);
        assert_eq!(c.status, CheckStatus::Critical, "{}", c.line);
        // A last success older than the maximum age.
        let mut old = r.clone();
        old.last_success = Some(at(1));
        let h = [done(1), entry(2, RecordedOutcome::SkippedOverlap)];
        let c = old.check(&h, now, Some(HOUR));
        assert_eq!(c.status, CheckStatus::Critical, "{}", c.line);
        assert!(c.line.contains("last success"), "{}", c.line);
        assert_eq!(old.check(&h, now, Some(HOUR * 3)).status, CheckStatus::Ok);
    }

    #[test]
    fn check_skips_ticks_while_paused_and_reads_an_unreadable_spec_as_unknown() {
        let now = at(4) + MINUTE * 10;
        let mut r = record(50);
        r.paused = Some(Pause {
            until: None,
            by: "ops".into(),
            at: at(1) + MINUTE,
            note: None,
        });
        // Ticks 2 and 3 had no entry, but closed after the pause began.
        let c = r.check(&[entry(0, RecordedOutcome::Done)], now, None);
        assert_eq!(c.missed.len(), 1, "tick 1 only: {:?}", c.missed);
        assert!(c.line.ends_with("; paused"), "{}", c.line);
        let mut bad = record(50);
        bad.spec.kind = crate::util::schedule_record::SpecKind::Cron {
            expr: "not cron".into(),
            zone: "UTC".into(),
        };
        let c = bad.check(&[], now, None);
        assert_eq!(c.status, CheckStatus::Unknown, "{}", c.line);
    }

    #[test]
    fn gaps_an_older_host_leaves_read_as_missed_until_a_later_success() {
        // An older baton runs tick 1 and writes nothing: no entry. Before any later success
        // it reads as missed (CRITICAL); once tick 2 is done on record it no longer counts.
        let r = record(50);
        let h = [entry(0, RecordedOutcome::Done)];
        let c = r.check(&h, at(2) + MINUTE, None);
        assert_eq!((c.status, c.missed.len()), (CheckStatus::Critical, 1));
        let h = [
            entry(0, RecordedOutcome::Done),
            entry(2, RecordedOutcome::Done),
        ];
        assert_eq!(r.check(&h, at(2) + MINUTE, None).status, CheckStatus::Ok);
    }
}
