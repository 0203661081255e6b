//! The schedule's record as plain data: what the store keeps of a schedule (its spec, the
//! hosts that ran it, a bounded history of its occurrences, its pause) and what a reader makes
//! of it ([`ScheduleRecord::check`], [`missed_ticks`]). A leaf: the failover coordinator
//! builds the changes, the backends store them (`backend::schedules`), and the CLI and the
//! dashboard read the records back.
//!
//! Times in the public types serialize as RFC 3339 (UTC); the stored form (the `Wire*` types,
//! crate-private) keeps milliseconds since the Unix epoch, which the Redis script and the
//! PostgreSQL statements compare and stamp with the server's clock.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The shortest lifetime of a schedule's record since its last write (30 days): `check` must
/// tell "missed for a while" from "never registered or forgotten" across a long outage of a
/// daily job.
pub const MIN_RECORD_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// The record outlives this many gaps of its schedule (a monthly or yearly schedule keeps its
/// record across several of its own gaps).
pub const RECORD_LIFETIME_GAPS: u32 = 10;
/// The most hosts a record lists (the oldest seen goes first).
pub const MAX_HOSTS: usize = 64;

/// How long a record is kept after its last write: `max(30 days, 10 gaps)`, `gap` being the
/// time from an occurrence's tick to the next.
pub fn record_lifetime(gap: Option<Duration>) -> Duration {
    gap.map_or(Duration::ZERO, |g| g.saturating_mul(RECORD_LIFETIME_GAPS))
        .max(MIN_RECORD_LIFETIME)
}

/// What an occurrence came to, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordedOutcome {
    /// An attempt holds it.
    Running,
    /// Ran to success.
    Done,
    /// An attempt failed and the occurrence has no terminal outcome yet (a backup retries).
    Failed,
    /// Every attempt failed.
    Exhausted,
    /// Not run: an earlier occurrence still ran (overlap `skip`).
    SkippedOverlap,
    /// Not run: the schedule was paused at its tick.
    SkippedPaused,
    /// Stopped for a newer occurrence.
    Replaced,
    /// Its window closed with no attempt on record.
    Missed,
}

impl RecordedOutcome {
    /// The name used in the store, the JSON output and the metrics' `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedOutcome::Running => "running",
            RecordedOutcome::Done => "done",
            RecordedOutcome::Failed => "failed",
            RecordedOutcome::Exhausted => "exhausted",
            RecordedOutcome::SkippedOverlap => "skipped_overlap",
            RecordedOutcome::SkippedPaused => "skipped_paused",
            RecordedOutcome::Replaced => "replaced",
            RecordedOutcome::Missed => "missed",
        }
    }

    /// The outcome named `s` ([`RecordedOutcome::as_str`]).
    pub fn parse(s: &str) -> Option<RecordedOutcome> {
        Some(match s {
            "running" => RecordedOutcome::Running,
            "done" => RecordedOutcome::Done,
            "failed" => RecordedOutcome::Failed,
            "exhausted" => RecordedOutcome::Exhausted,
            "skipped_overlap" => RecordedOutcome::SkippedOverlap,
            "skipped_paused" => RecordedOutcome::SkippedPaused,
            "replaced" => RecordedOutcome::Replaced,
            "missed" => RecordedOutcome::Missed,
            _ => return None,
        })
    }

    /// Whether nothing more happens to the occurrence (`done`, `exhausted`, `replaced`):
    /// a terminal outcome on record is never overwritten by `running` or `failed`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RecordedOutcome::Done | RecordedOutcome::Exhausted | RecordedOutcome::Replaced
        )
    }
}

impl std::fmt::Display for RecordedOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The attempt recorded success.
    Done,
    /// The attempt gave up (or PROGRAM failed).
    Failed,
    /// The worker lost the lease (taken over, stopped, crashed while its lease ran out).
    Lost,
}

/// PROGRAM's exit: a status, or the signal that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Exit {
    /// Exited with this status.
    Status(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Status(s) => write!(f, "exit {s}"),
            Exit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// One attempt of an occurrence, as its worker recorded it: times by the server's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// The attempt number (1, 2, …).
    pub attempt: u64,
    /// The worker's name (host and PID by default), when known.
    pub host: Option<String>,
    /// When it was granted.
    #[serde(with = "opt_rfc3339", default)]
    pub started: Option<SystemTime>,
    /// When it ended (unknown when its worker died before writing it).
    #[serde(with = "opt_rfc3339", default)]
    pub ended: Option<SystemTime>,
    /// PROGRAM's exit status or signal, when set ([`AttemptHandle::set_exit`]).
    ///
    /// [`AttemptHandle::set_exit`]: crate::AttemptHandle::set_exit
    pub exit: Option<Exit>,
    /// baton's failure message.
    pub message: Option<String>,
    /// How it ended, once it did.
    pub outcome: Option<AttemptOutcome>,
}

impl AttemptRecord {
    /// An attempt record with only its number (set the rest field by field).
    pub fn new(attempt: u64) -> Self {
        AttemptRecord {
            attempt,
            ..Default::default()
        }
    }

    /// How long it ran, when both ends are known.
    pub fn duration(&self) -> Option<Duration> {
        self.ended?.duration_since(self.started?).ok()
    }
}

/// One occurrence on record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OccurrenceRecord {
    /// The tick.
    #[serde(with = "rfc3339")]
    pub tick: SystemTime,
    /// The occurrence's id (the tick in RFC 3339, `BATON_OCCURRENCE`).
    pub id: String,
    /// What it came to.
    pub outcome: RecordedOutcome,
    /// Its attempts, by number.
    pub attempts: Vec<AttemptRecord>,
    /// A note (why it was skipped, repaired, …).
    pub note: Option<String>,
}

/// A host that ran the schedule, and when the store last saw it (server's clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HostSeen {
    /// The worker's name.
    pub host: String,
    /// Its last write to the record.
    #[serde(with = "rfc3339")]
    pub last_seen: SystemTime,
}

/// A schedule's pause: who paused it, when, until when, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Pause {
    /// Until when (`None`: until resumed).
    #[serde(with = "opt_rfc3339", default)]
    pub until: Option<SystemTime>,
    /// Who paused it (a worker name: host and PID by default).
    pub by: String,
    /// When (server's clock).
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
    /// Why.
    pub note: Option<String>,
}

/// A schedule's record: one per key and digest (two during a rolling change of the
/// expression).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleRecord {
    /// The schedule's key.
    pub key: String,
    /// The schedule's digest ([`Schedule::digest`](crate::Schedule::digest)).
    pub digest: String,
    /// The schedule as its last writer described it.
    pub spec: ScheduleSpec,
    /// The first write (server's clock).
    #[serde(with = "rfc3339")]
    pub first_seen: SystemTime,
    /// The last write.
    #[serde(with = "rfc3339")]
    pub last_seen: SystemTime,
    /// The newest tick on record.
    #[serde(with = "opt_rfc3339", default)]
    pub last_tick: Option<SystemTime>,
    /// When the newest `done` ended.
    #[serde(with = "opt_rfc3339", default)]
    pub last_success: Option<SystemTime>,
    /// The newest occurrence's outcome.
    pub last_outcome: Option<RecordedOutcome>,
    /// The hosts seen, most recent first.
    pub hosts: Vec<HostSeen>,
    /// The key's pause, when paused (by the server's clock when read).
    pub paused: Option<Pause>,
}

/// A change to one occurrence's record ([`Failover::record_occurrence`]).
///
/// [`Failover::record_occurrence`]: crate::Failover::record_occurrence
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordChange {
    /// An attempt's record merged by number as given (fields left `None` are kept).
    Attempt(AttemptRecord),
    /// An attempt was granted now (server's clock), to the writer's host.
    Started {
        /// The attempt number.
        attempt: u64,
    },
    /// An attempt ended now (server's clock).
    Ended {
        /// The attempt number.
        attempt: u64,
        /// How.
        outcome: AttemptOutcome,
        /// PROGRAM's exit, when known.
        exit: Option<Exit>,
        /// baton's message (a failure's reason).
        message: Option<String>,
    },
    /// An attempt ended now (server's clock) by completing its job without running the work,
    /// and that end settles the occurrence as `outcome` (overlap `buffer-one`: the window
    /// closed while the occurrence waited, recorded `skipped_overlap`). The settled outcome
    /// travels with the attempt, so it wins over the attempt's grant and `done` whichever of
    /// the worker's background writes lands first; it never overwrites a terminal outcome.
    Settled {
        /// The attempt number.
        attempt: u64,
        /// The occurrence's outcome.
        outcome: RecordedOutcome,
        /// Why (shown as the attempt's message).
        message: Option<String>,
    },
    /// The occurrence's outcome (a terminal one is never overwritten by `running`/`failed`).
    Outcome {
        /// The outcome.
        outcome: RecordedOutcome,
        /// A note.
        note: Option<String>,
    },
    /// These ticks' windows closed with no attempt: each is written `missed` unless it has
    /// an entry.
    Missed(Vec<SystemTime>),
}

/// `baton check`'s verdict, Nagios-style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CheckStatus {
    /// 0.
    Ok,
    /// 1.
    Warning,
    /// 2.
    Critical,
    /// 3: the record could not be judged.
    Unknown,
}

impl CheckStatus {
    /// The Nagios plugin's exit code (0, 1, 2, 3).
    pub fn code(self) -> i32 {
        match self {
            CheckStatus::Ok => 0,
            CheckStatus::Warning => 1,
            CheckStatus::Critical => 2,
            CheckStatus::Unknown => 3,
        }
    }

    /// `OK`, `WARNING`, `CRITICAL`, `UNKNOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "OK",
            CheckStatus::Warning => "WARNING",
            CheckStatus::Critical => "CRITICAL",
            CheckStatus::Unknown => "UNKNOWN",
        }
    }
}

/// What [`ScheduleRecord::check`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Check {
    /// The verdict.
    pub status: CheckStatus,
    /// One line for people (`CRITICAL: nightly: 2 missed (…)`), status word first.
    pub line: String,
    /// The missed occurrences' ids, oldest first (on record or computed).
    pub missed: Vec<String>,
    /// The failed or exhausted occurrences' ids since the last success, oldest first.
    pub failed: Vec<String>,
}

/// Milliseconds since the Unix epoch (0 before it, saturating).
pub(crate) fn to_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The time `ms` milliseconds after the Unix epoch (the epoch for a negative value).
pub(crate) fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// How many occurrences a schedule's record keeps by default
/// ([`ScheduleOptionsBuilder::history`](crate::ScheduleOptionsBuilder::history)).
pub const DEFAULT_HISTORY: u32 = 50;
/// The largest history a schedule's record keeps.
pub const MAX_HISTORY: u32 = 1000;

/// A schedule as plain data: its calendar ([`SpecKind`]), early tolerance, jitter and history
/// size, and the text people read (`cron '0 2 * * *' in Europe/Paris`). Serialized (JSON)
/// into the schedule's record; [`Schedule::spec`](crate::Schedule::spec) makes one, [`Schedule::from_spec`](crate::Schedule::from_spec) reads
/// one back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleSpec {
    /// The schedule as people read it ([`Schedule`](crate::Schedule)'s `Display`).
    pub text: String,
    /// The calendar.
    #[serde(flatten)]
    pub kind: SpecKind,
    /// The early tolerance as set ([`Schedule::early`](crate::Schedule::early)).
    #[serde(rename = "early_ms", with = "duration_ms")]
    pub early: Duration,
    /// The jitter the schedule's runs use (not part of the digest).
    #[serde(rename = "jitter_ms", with = "duration_ms", default)]
    pub jitter: Duration,
    /// How many occurrences the record keeps (not part of the digest).
    #[serde(default = "default_history")]
    pub history: u32,
}

fn default_history() -> u32 {
    DEFAULT_HISTORY
}

/// The calendar of a [`ScheduleSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SpecKind {
    /// Every `period` since the Unix epoch, shifted by `offset`.
    Every {
        /// The period.
        #[serde(rename = "every_ms", with = "duration_ms")]
        period: Duration,
        /// The offset.
        #[serde(rename = "offset_ms", with = "duration_ms", default)]
        offset: Duration,
    },
    /// A cron expression in an IANA time zone.
    Cron {
        /// The expression, whitespace collapsed.
        #[serde(rename = "cron")]
        expr: String,
        /// The IANA zone (`Europe/Paris`, `UTC`).
        zone: String,
    },
}

impl ScheduleSpec {
    /// The same spec with `jitter`.
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// The same spec with a history of `n` occurrences.
    pub fn with_history(mut self, n: u32) -> Self {
        self.history = n;
        self
    }
}

/// Durations as whole milliseconds in JSON.
pub(crate) mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

// ---------------------------------------------------------------------------------------------
// The stored form
// ---------------------------------------------------------------------------------------------

/// An occurrence's entry as stored (JSON in a Redis hash field, `jsonb` in PostgreSQL):
/// times in ms by the server's clock, attempts keyed by their number so that a change merges
/// into its attempt on both backends (Lua tables, `jsonb ||`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct WireEntry {
    pub tick: i64,
    pub id: String,
    pub outcome: String,
    #[serde(default)]
    pub attempts: BTreeMap<String, WireAttempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One attempt as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct WireAttempt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<Exit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcome>,
    /// The occurrence's outcome this attempt's end settles ([`RecordChange::Settled`]): it
    /// speaks for the occurrence instead of `outcome`, and its `done` is no success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<String>,
}

impl WireEntry {
    /// The public form; `None` for an outcome this version does not know (a newer writer's):
    /// the caller skips that entry.
    pub(crate) fn into_record(self) -> Option<OccurrenceRecord> {
        let outcome = RecordedOutcome::parse(&self.outcome)?;
        let mut attempts: Vec<AttemptRecord> = self
            .attempts
            .into_iter()
            .filter_map(|(n, a)| {
                Some(AttemptRecord {
                    attempt: n.parse().ok()?,
                    host: a.host,
                    started: a.start.map(from_ms),
                    ended: a.end.map(from_ms),
                    exit: a.exit,
                    message: a.message,
                    outcome: a.outcome,
                })
            })
            .collect();
        attempts.sort_by_key(|a| a.attempt);
        Some(OccurrenceRecord {
            tick: from_ms(self.tick),
            id: self.id,
            outcome,
            attempts,
            note: self.note,
        })
    }
}

/// What one write to a schedule's record carries across the seam (`backend::schedules`).
#[derive(Debug, Clone)]
pub(crate) struct RecordWrite {
    /// The key prefix (`baton:`).
    pub prefix: String,
    pub key: String,
    pub digest: String,
    /// The spec's JSON.
    pub spec: String,
    /// The writer's name, recorded as a host seen (and an attempt's host).
    pub host: String,
    /// How many occurrences to keep.
    pub history: u32,
    /// How long the record lives after this write.
    pub lifetime: Duration,
    /// The changes, one per occurrence.
    pub changes: Vec<WireChange>,
}

/// One occurrence's change as the stores apply it: JSON the Redis script and the PostgreSQL
/// statement both read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct WireChange {
    pub tick: i64,
    pub id: String,
    /// An attempt to merge, by number (`start`/`end` set to `-1` ask for the server's now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<WireAttempt>,
    /// The occurrence's outcome to apply by precedence (`missed` only where no entry is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A schedule's summary as a backend reads it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawRecord {
    pub digest: String,
    pub spec: String,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
    pub last_tick_ms: Option<i64>,
    pub last_success_ms: Option<i64>,
    pub last_outcome: Option<String>,
    pub hosts: Vec<(String, i64)>,
}

/// A key's pause as a backend reads it, with the server's clock at the read.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawPause {
    pub until_ms: Option<i64>,
    pub by: String,
    pub at_ms: i64,
    pub note: Option<String>,
}

impl RawPause {
    /// The pause, unless its `until` passed by `now_ms` (the server's clock).
    pub(crate) fn at(self, now_ms: i64) -> Option<Pause> {
        if self.until_ms.is_some_and(|u| u <= now_ms) {
            return None;
        }
        Some(Pause {
            until: self.until_ms.map(from_ms),
            by: self.by,
            at: from_ms(self.at_ms),
            note: self.note,
        })
    }
}

/// `SystemTime` as RFC 3339 text.
pub(crate) mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn text(t: SystemTime) -> String {
        jiff::Timestamp::try_from(t).map_or_else(|_| format!("{t:?}"), |ts| ts.to_string())
    }

    pub(crate) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(*t))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<jiff::Timestamp>()
            .map(SystemTime::from)
            .map_err(serde::de::Error::custom)
    }
}

/// `Option<SystemTime>` as RFC 3339 text or null.
pub(crate) mod opt_rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        t: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::rfc3339::text(*t)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| {
                s.parse::<jiff::Timestamp>()
                    .map(SystemTime::from)
                    .map_err(serde::de::Error::custom)
            })
            .transpose()
    }
}
