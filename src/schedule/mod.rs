//! Schedules and their occurrences: which tick of "every 24 h at 02:00" or of
//! `0 2 * * *` in `Europe/Paris` a run belongs to, the same on every host.
//!
//! A [`Schedule`] is parsed and validated once; it is a pure calendar (no I/O). Given the
//! coordination server's time, [`Schedule::occurrence_at`] binds a run to one [`Occurrence`]:
//! **the latest tick at or before `now + E`**, where `E`, the early tolerance, is
//! [`Schedule::early`] (default 60 s) capped at half the gap between that tick and the one
//! before it. So a run that starts in `[T − E, T' − E')` (`T'` the next tick, `E'` its
//! tolerance) binds to tick `T`: a cron daemon that fires a little early binds to the coming
//! tick, one that fires late (or a systemd timer catching up after boot) to the tick that
//! passed. Capping `E` per tick rather than at half the shortest gap of the whole expression
//! gives the same guarantee (the windows of two ticks never overlap) without letting one short
//! gap of `0 2,3 * * *` shrink the tolerance of the long one.
//!
//! The occurrence names the job that runs it: `KEY@DIGEST@TICK`
//! (`nightly-report@5f0c2a81b7d4@2026-11-26T02:00:00Z`), where `DIGEST` is a short digest of
//! the schedule (its expression, zone and offset), so two schedules on one key never share an
//! occurrence. The failover coordinator binds a [`FailoverConfig`](crate::FailoverConfig) to
//! it ([`FailoverConfig::for_occurrence`](crate::FailoverConfig::for_occurrence)) and runs it
//! like any job; see
//! [`Failover::schedule`](crate::Failover::schedule) for the long-running form.
//!
//! # Jitter
//! Schedules that tick at the same instant (every hourly job of a fleet at :00) can spread
//! their starts over a jitter `D`: [`Occurrence::jittered_start`] is `tick + j`, with
//! `j = mix(FNV-1a-64(KEY, DIGEST, TICK_MS)) mod D` ([`Occurrence::jitter`]), the same on every
//! host, never before the tick, and capped so the attempt's lease still ends before the next
//! tick's window opens ([`Occurrence::jitter_room`]). The jitter is not part of the digest:
//! changing it on some hosts never splits one tick into two jobs. The binding rule does not
//! change: jitter only delays the start within the occurrence a run bound to.
//!
//! # Calendars and daylight saving
//! Cron expressions are parsed and evaluated by the [`croner`] crate (five fields, or six with
//! seconds first; `L`, `W`, `#` and the `@daily` aliases as croner documents), in an IANA time
//! zone from the [`jiff`] crate's bundled time-zone database (the same rules on every host,
//! whatever its system's tzdata). Daylight-saving transitions follow Vixie cron, as croner
//! documents them (the Open Cron Pattern Specification):
//! - **a skipped hour** (spring forward): a fixed-time job (`30 2 * * *`) runs at the first
//!   valid time after the gap (03:00 that day); an interval job's (`*/30 * * * *`) ticks in the
//!   gap do not exist;
//! - **a repeated hour** (fall back): a fixed-time job runs once, at the first pass; an interval
//!   job runs at each pass (they are distinct instants, so distinct occurrences).
//!
//! `every` schedules count real time since the Unix epoch and know no zones.

use std::fmt;
use std::time::{Duration, SystemTime};

use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use crate::error::ConfigError;

mod spec;
pub use spec::{missed_ticks, ScheduleSpec, SpecKind, DEFAULT_HISTORY, MAX_HISTORY};

/// The default early tolerance ([`Schedule::early`]).
pub const DEFAULT_EARLY: Duration = Duration::from_secs(60);
/// The shortest `every` period.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);
/// The longest `every` period (about ten years).
pub const MAX_PERIOD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The shortest retention of an occurrence's outcome by default.
pub const MIN_DEFAULT_RETENTION: Duration = Duration::from_secs(600);
/// What [`Occurrence::retention_floor`] adds for clock reads: a run reads the server's clock to
/// bind, then reaches the occurrence's job a round trip or two later, and on a Redis Cluster the
/// node that timed the binding need not be the one that stores the job (their clocks differ by
/// what NTP leaves, milliseconds). Five seconds covers both with room for a slow connection;
/// it only lengthens how long a small key is kept.
pub const RETENTION_CLOCK_MARGIN: Duration = Duration::from_secs(5);
/// The longest retention the coordinator accepts
/// ([`FailoverConfig`](crate::FailoverConfig)'s limit, ten years): the retentions computed here
/// never exceed it.
const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How many gaps of a cron expression [`Schedule::check_jitter`] looks at: a week of
/// `0 2,3 * * 1-5`'s irregular gaps, and cheap.
const JITTER_CHECK_TICKS: usize = 64;

/// A validated schedule: `every` a period (optionally offset) or a cron expression in a time
/// zone. Cheap to clone; compare with `==` (two equal schedules have equal digests).
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
    early: Duration,
    digest: String,
}

#[derive(Clone)]
enum Kind {
    Every {
        period: Duration,
        offset: Duration,
    },
    Cron {
        cron: Box<croner::Cron>,
        /// The expression as given, whitespace collapsed.
        expr: String,
        zone: TimeZone,
        zone_name: String,
    },
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest && self.early == other.early
    }
}
impl Eq for Schedule {}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("schedule", &self.to_string())
            .field("early", &self.early)
            .field("digest", &self.digest)
            .finish()
    }
}

impl fmt::Display for Schedule {
    /// `every 24h offset 2h`, `cron '0 2 * * *' in Europe/Paris`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Every { period, offset } => {
                write!(f, "every {}", human(*period))?;
                if !offset.is_zero() {
                    write!(f, " offset {}", human(*offset))?;
                }
                Ok(())
            }
            Kind::Cron {
                expr, zone_name, ..
            } => write!(f, "cron '{expr}' in {zone_name}"),
        }
    }
}

impl Schedule {
    /// Ticks at every whole multiple of `period` since the Unix epoch (`every(24h)`: midnight
    /// UTC), shifted by [`Schedule::offset`].
    ///
    /// # Errors
    /// `period`: below 1 s, above ten years, or not a whole number of milliseconds.
    pub fn every(period: Duration) -> Result<Schedule, ConfigError> {
        Self::every_offset(period, Duration::ZERO)
    }

    /// Shifts an `every` schedule's ticks by `offset` (`every(24h).offset(2h)`: 02:00 UTC).
    ///
    /// # Errors
    /// `offset`: not below the period, not whole milliseconds, or on a cron schedule (whose
    /// expression says the time).
    pub fn offset(self, offset: Duration) -> Result<Schedule, ConfigError> {
        match self.kind {
            Kind::Every { period, .. } => Ok(Self::every_offset(period, offset)?.early(self.early)),
            Kind::Cron { .. } => Err(ConfigError::invalid(
                "offset",
                "applies to `every` schedules only (a cron expression says its own time)",
            )),
        }
    }

    fn every_offset(period: Duration, offset: Duration) -> Result<Schedule, ConfigError> {
        if period < MIN_PERIOD || period > MAX_PERIOD {
            return Err(ConfigError::invalid(
                "every",
                format!("{} is outside 1s ..= 10 years", human(period)),
            ));
        }
        if period.subsec_nanos() % 1_000_000 != 0 {
            return Err(ConfigError::invalid(
                "every",
                format!("{period:?} is not a whole number of milliseconds"),
            ));
        }
        if offset >= period {
            return Err(ConfigError::invalid(
                "offset",
                format!(
                    "{} must be below the period ({})",
                    human(offset),
                    human(period)
                ),
            ));
        }
        if offset.subsec_nanos() % 1_000_000 != 0 {
            return Err(ConfigError::invalid(
                "offset",
                format!("{offset:?} is not a whole number of milliseconds"),
            ));
        }
        let digest = digest(&format!(
            "every:{}:{}",
            period.as_millis(),
            offset.as_millis()
        ));
        Ok(Schedule {
            kind: Kind::Every { period, offset },
            early: DEFAULT_EARLY,
            digest,
        })
    }

    /// A cron expression in UTC: five fields (minute, hour, day of month, month, day of week)
    /// or six with seconds first. See [`Schedule::cron_in`].
    ///
    /// # Errors
    /// As [`Schedule::cron_in`].
    pub fn cron(expr: &str) -> Result<Schedule, ConfigError> {
        Self::cron_in(expr, "UTC")
    }

    /// A cron expression evaluated in the IANA time zone `zone` (`Europe/Paris`; `UTC`).
    ///
    /// # Errors
    /// `cron`: an expression croner rejects (the message names the field, e.g. `hour: Number
    /// out of bounds.`), or one that matches no time in the next ten years (`0 0 30 2 *`);
    /// `tz`: a zone the time-zone database does not know.
    pub fn cron_in(expr: &str, zone: &str) -> Result<Schedule, ConfigError> {
        let expr = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let tz = TimeZone::get(zone).map_err(|e| {
            ConfigError::invalid(
                "tz",
                format!("{zone:?} is not an IANA time zone ({e}); e.g. Europe/Paris or UTC"),
            )
        })?;
        let cron = parser().parse(&expr).map_err(|e| cron_error(&expr, &e))?;
        // A pattern that matches nothing (30 February) would make every search fail later.
        let probe = Timestamp::now().to_zoned(tz.clone());
        match cron.find_next_occurrence(&probe, false) {
            Ok(next)
                if next.timestamp() < probe.timestamp() + SignedDuration::from_hours(87_600) => {}
            _ => {
                return Err(ConfigError::invalid(
                    "cron",
                    format!("{expr:?} matches no time in the next ten years"),
                ))
            }
        }
        let zone_name = tz.iana_name().unwrap_or(zone).to_string();
        let digest = digest(&format!("cron:{expr}:{zone_name}"));
        Ok(Schedule {
            kind: Kind::Cron {
                cron: Box::new(cron),
                expr,
                zone: tz,
                zone_name,
            },
            early: DEFAULT_EARLY,
            digest,
        })
    }

    /// Sets the early tolerance `E` (default 60 s): a run up to `E` before a tick binds to
    /// that tick (and waits for it). Each tick's tolerance is capped at half the gap from the
    /// tick before it, so the windows of two ticks never overlap.
    pub fn early(mut self, early: Duration) -> Schedule {
        self.early = early;
        self
    }

    /// The early tolerance as set (before the per-tick cap).
    pub fn early_tolerance(&self) -> Duration {
        self.early
    }

    /// The schedule's digest: 12 hex digits of a 64-bit FNV-1a hash of its canonical text
    /// (`every:PERIOD_MS:OFFSET_MS`, `cron:EXPR:ZONE`), part of every occurrence's job key.
    /// Stable across hosts and versions: changing it would re-run occurrences, so it is a
    /// protocol constant.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Checks a jitter `D` ([`Occurrence::jitter`]) against the schedule: `D` may not be longer
    /// than the period of an `every` schedule, nor than the shortest gap between the ticks of a
    /// cron expression (among the 64 ticks after `from`). A shorter `D` that does not fit a
    /// tick's window is reduced there ([`Occurrence::jitter_room`]); one longer than every gap
    /// is a mistake.
    ///
    /// # Errors
    /// `jitter`: longer than the period (the message names both).
    pub fn check_jitter(&self, jitter: Duration, from: SystemTime) -> Result<(), ConfigError> {
        let (what, gap) = match &self.kind {
            Kind::Every { period, .. } => ("the period", Some(*period)),
            Kind::Cron { .. } => {
                let mut ticks =
                    std::iter::successors(self.next_after(from), |t| self.next_after(*t))
                        .take(JITTER_CHECK_TICKS + 1);
                let mut shortest: Option<Duration> = None;
                if let Some(mut previous) = ticks.next() {
                    for t in ticks {
                        let gap = t.duration_since(previous).unwrap_or(Duration::ZERO);
                        shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
                        previous = t;
                    }
                }
                ("the shortest gap between ticks", shortest)
            }
        };
        match gap {
            Some(gap) if jitter > gap => Err(ConfigError::invalid(
                "jitter",
                format!(
                    "{jitter:?} is longer than {what} of {self} ({gap:?}): each occurrence \
                     would start in the next one's window"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The first tick strictly after `t`, or `None` past the calendar's end (year 5000 for
    /// cron) or for a time before the Unix epoch.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        self.next_ts(ts(t)?).map(SystemTime::from)
    }

    /// The latest tick at or before `t`, or `None` when there is none.
    pub fn latest_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        self.at_or_before_ts(ts(t)?).map(SystemTime::from)
    }

    /// The occurrence a run that starts at `now` (the coordination server's time) binds to:
    /// the latest tick at or before `now + E` (module docs). Its tick may lie ahead of `now`
    /// (by at most `E`): the run must then wait for it
    /// ([`Failover::wait_until_due`](crate::Failover::wait_until_due)).
    /// `None` only outside the calendar (before 1970, after year 5000).
    pub fn occurrence_at(&self, now: SystemTime) -> Option<Occurrence> {
        let now = ts(now)?;
        if let Some(next) = self.next_ts(now) {
            if next.duration_since(now) <= signed(self.tolerance_of(next)) {
                return self.occurrence_of(next);
            }
        }
        self.occurrence_of(self.at_or_before_ts(now)?)
    }

    /// The occurrence of the tick `tick` (which must be a tick of this schedule), e.g. to
    /// look a past one up.
    pub fn occurrence_of_tick(&self, tick: SystemTime) -> Option<Occurrence> {
        let t = ts(tick)?;
        if self.at_or_before_ts(t)? != t {
            return None;
        }
        self.occurrence_of(t)
    }

    fn occurrence_of(&self, tick: Timestamp) -> Option<Occurrence> {
        let next = self.next_ts(tick);
        let id = tick.to_string();
        Some(Occurrence {
            tick: SystemTime::from(tick),
            next: next.map(SystemTime::from),
            early: self.tolerance_of(tick),
            next_early: next.map(|n| self.tolerance_of(n)),
            id,
            digest: self.digest.clone(),
            manual: None,
        })
    }

    /// `E` for tick `t`: the early tolerance capped at half the gap from the tick before.
    fn tolerance_of(&self, t: Timestamp) -> Duration {
        let gap = self
            .before_ts(t)
            .map(|p| unsigned(t.duration_since(p)))
            .or_else(|| self.next_ts(t).map(|n| unsigned(n.duration_since(t))));
        match gap {
            Some(g) => self.early.min(g / 2),
            None => self.early,
        }
    }

    fn next_ts(&self, t: Timestamp) -> Option<Timestamp> {
        match &self.kind {
            Kind::Every { period, offset } => {
                let (p, o) = (period.as_nanos() as i128, offset.as_nanos() as i128);
                let k = (t.as_nanosecond() - o).div_euclid(p) + 1;
                Timestamp::from_nanosecond(k * p + o).ok()
            }
            Kind::Cron { cron, zone, .. } => cron
                .find_next_occurrence(&t.to_zoned(zone.clone()), false)
                .ok()
                .map(|z| z.timestamp()),
        }
    }

    fn at_or_before_ts(&self, t: Timestamp) -> Option<Timestamp> {
        match &self.kind {
            Kind::Every { period, offset } => {
                let (p, o) = (period.as_nanos() as i128, offset.as_nanos() as i128);
                let k = (t.as_nanosecond() - o).div_euclid(p);
                Timestamp::from_nanosecond(k * p + o).ok()
            }
            Kind::Cron { cron, zone, .. } => cron
                .find_previous_occurrence(&t.to_zoned(zone.clone()), true)
                .ok()
                .map(|z| z.timestamp())
                // croner compares whole seconds: never return a tick after `t`.
                .filter(|p| *p <= t),
        }
    }

    /// The latest tick strictly before `t`.
    fn before_ts(&self, t: Timestamp) -> Option<Timestamp> {
        let just_before = t.checked_sub(SignedDuration::from_nanos(1)).ok()?;
        self.at_or_before_ts(just_before)
    }
}

/// One tick of a [`Schedule`], as a run binds to it: the tick, its id, and the job key that
/// runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    tick: SystemTime,
    next: Option<SystemTime>,
    early: Duration,
    /// The next tick's early tolerance: runs bind to this tick until `next - next_early`.
    next_early: Option<Duration>,
    id: String,
    digest: String,
    /// Set for a manual occurrence ([`Occurrence::manual`]): the trigger's note.
    manual: Option<Manual>,
}

/// What a manual occurrence carries besides its id and time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Manual {
    note: Option<String>,
}

/// The digest part of a manual occurrence's job name (`KEY@manual@ID`): a trigger is per key,
/// so hosts whose schedules differ (a rolling change of the expression) share its one job.
pub const MANUAL_DIGEST: &str = "manual";

/// How long a manual occurrence's job keeps its `DONE`/`EXHAUSTED`: 25 hours, an hour past
/// [`TRIGGER_LIFETIME`](crate::failover::TRIGGER_LIFETIME), so a host that sees the trigger
/// late joins the job, finds it done, and never runs it twice.
pub const MANUAL_RETENTION: Duration = Duration::from_secs(25 * 3600);

impl Occurrence {
    /// The manual occurrence `id` (a trigger's, `manual-<RFC 3339 ms>`) made at `at` by the
    /// server's clock, with the trigger's `note`: run once across the fleet as the job
    /// `KEY@manual@ID` ([`Occurrence::job_key`]), whatever the hosts' schedule digests.
    /// Its [`tick`](Occurrence::tick) is `at`, it has no next tick, no jitter
    /// ([`Occurrence::jitter_room`] is zero) and its job keeps its outcome
    /// [`MANUAL_RETENTION`]. `BATON_OCCURRENCE` is `id`.
    pub fn manual(id: &str, at: SystemTime, note: Option<&str>) -> Occurrence {
        Occurrence {
            tick: at,
            next: None,
            early: Duration::ZERO,
            next_early: None,
            id: id.to_string(),
            digest: MANUAL_DIGEST.to_string(),
            manual: Some(Manual {
                note: note.map(str::to_string),
            }),
        }
    }

    /// Whether this is a manual occurrence ([`Occurrence::manual`]), not a tick.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// A manual occurrence's note (its trigger's); `None` for a tick.
    pub fn note(&self) -> Option<&str> {
        self.manual.as_ref()?.note.as_deref()
    }

    /// The tick: when the occurrence is due (no run of it starts earlier).
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    /// The schedule's next tick after this one, if any.
    pub fn next_tick(&self) -> Option<SystemTime> {
        self.next
    }

    /// This tick's early tolerance (the schedule's, capped at half the gap before the tick).
    pub fn early_tolerance(&self) -> Duration {
        self.early
    }

    /// The tick in RFC 3339, UTC (`2026-11-26T02:00:00Z`): `BATON_OCCURRENCE` for PROGRAM.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The schedule's digest ([`Schedule::digest`]).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The name of the job that runs this occurrence of the schedule on `key`:
    /// `KEY@DIGEST@TICK`.
    pub fn job_key(&self, key: &str) -> String {
        format!("{key}@{}@{}", self.digest, self.id)
    }

    /// How long the occurrence's `DONE`/`EXHAUSTED` is kept by default: two gaps to the next
    /// tick, at least ten minutes (and at least twice `lease`, the coordinator's own rule, and
    /// [`Occurrence::retention_floor`]), at most ten years (the coordinator's limit). A manual
    /// occurrence's: [`MANUAL_RETENTION`] (or twice `lease` when longer).
    pub fn default_retention(&self, lease: Duration) -> Duration {
        if self.is_manual() {
            return MANUAL_RETENTION.max(lease.saturating_mul(2));
        }
        let gap = self
            .next
            .and_then(|n| n.duration_since(self.tick).ok())
            .unwrap_or(Duration::ZERO);
        (gap.saturating_mul(2))
            .max(MIN_DEFAULT_RETENTION)
            .max(lease.saturating_mul(2))
            .min(MAX_RETENTION)
            .max(self.retention_floor())
    }

    /// The shortest retention that keeps this occurrence from running twice:
    /// `(next − tick) + E_next` ([`RETENTION_CLOCK_MARGIN`] added), `E_next` being the next
    /// tick's early tolerance; ten years (the coordinator's limit) past the calendar's end.
    ///
    /// A run binds to this tick until `E_next` before the next one
    /// ([`Schedule::occurrence_at`]), and catching up ([`Failover::latest_past_occurrence`])
    /// looks at it until the next tick itself. The outcome is written at or after the tick
    /// and kept for the retention from then, so with this floor it outlives both windows by
    /// `E_next` and the margin: room for a run that read the clock just before its window
    /// closed to reach the job. Below it, a late run of the same tick finds no outcome and
    /// runs the occurrence again as attempt 1.
    /// [`FailoverConfig::for_occurrence`](crate::FailoverConfig::for_occurrence) never keeps
    /// an outcome for less.
    ///
    /// A manual occurrence's floor is [`MANUAL_RETENTION`]: its trigger can be seen for a day.
    ///
    /// [`Failover::latest_past_occurrence`]: crate::Failover::latest_past_occurrence
    pub fn retention_floor(&self) -> Duration {
        if self.is_manual() {
            return MANUAL_RETENTION;
        }
        let until_next = self
            .next
            .and_then(|n| n.duration_since(self.tick).ok())
            .zip(self.next_early);
        match until_next {
            Some((gap, early)) => gap
                .saturating_add(early)
                .saturating_add(RETENTION_CLOCK_MARGIN)
                .min(MAX_RETENTION),
            None => MAX_RETENTION,
        }
    }

    /// The retention an occurrence's job gets: `given` (by default
    /// [`Occurrence::default_retention`]), raised to [`Occurrence::retention_floor`] when
    /// below it.
    pub fn retention(&self, given: Option<Duration>, lease: Duration) -> Duration {
        given
            .unwrap_or_else(|| self.default_retention(lease))
            .max(self.retention_floor())
    }

    /// How long before the tick `now` is (zero once it is due): what a run that bound to a
    /// coming tick must still wait.
    pub fn until_due(&self, now: SystemTime) -> Duration {
        self.tick.duration_since(now).unwrap_or(Duration::ZERO)
    }

    /// How much jitter fits this occurrence with a lease of `lease`: from the tick to the
    /// opening of the next tick's window (`next − E_next`, [`Schedule::occurrence_at`]) minus
    /// the lease, so an attempt granted at the latest start still ends its first lease before a
    /// run can bind to the next tick. Zero when the window is too short for that;
    /// [`Duration::MAX`] for the calendar's last tick; zero for a manual occurrence (never jittered).
    pub fn jitter_room(&self, lease: Duration) -> Duration {
        if self.is_manual() {
            return Duration::ZERO;
        }
        match self.next.zip(self.next_early) {
            Some((next, early)) => next
                .checked_sub(early)
                .and_then(|opens| opens.duration_since(self.tick).ok())
                .map_or(Duration::ZERO, |window| window.saturating_sub(lease)),
            None => Duration::MAX,
        }
    }

    /// The jitter `j` of this occurrence of the schedule on `key`, for a jitter of at most
    /// `jitter` and a lease of `lease`: `mix(FNV-1a-64(KEY, DIGEST, TICK_MS)) mod D`, in whole
    /// milliseconds, where `D` is `jitter` reduced to [`Occurrence::jitter_room`] when that is
    /// shorter (zero when no room is left: no jitter). So `j` lies in `[0, D)`, and every host
    /// computes the same `j` for the same occurrence (given the same `jitter` and, when the
    /// room reduces it, the same lease); occurrences of different keys, or different ticks,
    /// spread evenly over `[0, D)`.
    ///
    /// The hash is a protocol constant, like the digest: FNV-1a-64 over the key's bytes, a NUL
    /// byte, the digest, a NUL byte, and the tick's milliseconds since the Unix epoch in
    /// decimal, then MurmurHash3's 64-bit finalizer (FNV-1a's low bits mix poorly, and `mod D`
    /// reads mostly those).
    pub fn jitter(&self, key: &str, jitter: Duration, lease: Duration) -> Duration {
        let most = jitter.min(self.jitter_room(lease));
        let most_ms = u64::try_from(most.as_millis()).unwrap_or(u64::MAX);
        if most_ms == 0 {
            return Duration::ZERO;
        }
        let tick_ms = ts(self.tick).map_or(0, |t| t.as_millisecond());
        let hash = fmix64(fnv1a(&[
            key.as_bytes(),
            b"\0",
            self.digest.as_bytes(),
            b"\0",
            tick_ms.to_string().as_bytes(),
        ]));
        Duration::from_millis(hash % most_ms)
    }

    /// When this occurrence of the schedule on `key` starts with a jitter of at most `jitter`
    /// and a lease of `lease`: `tick + j` ([`Occurrence::jitter`]), never before the tick, and
    /// before the next tick's window opens by at least the lease. A run bound to the
    /// occurrence waits for it by the server's clock
    /// ([`Failover::wait_until`](crate::Failover::wait_until)); one that binds later runs at
    /// once. [`Occurrence::id`] (`BATON_OCCURRENCE`) stays the tick.
    pub fn jittered_start(&self, key: &str, jitter: Duration, lease: Duration) -> SystemTime {
        self.tick
            .checked_add(self.jitter(key, jitter, lease))
            .unwrap_or(self.tick)
    }
}

impl crate::util::schedule_record::Trigger {
    /// The manual occurrence it asks for ([`Occurrence::manual`]).
    pub fn occurrence(&self) -> Occurrence {
        Occurrence::manual(&self.id, self.at, self.note.as_deref())
    }
}

/// The parts of an occurrence's job name `KEY@DIGEST@TICK` ([`Occurrence::job_key`]): the
/// schedule's key, its digest and the tick; `None` for a name of another form. The key may
/// hold `@` itself: the last two `@` are the separators. A manual occurrence's job
/// (`KEY@manual@ID`) gives the digest [`MANUAL_DIGEST`] and its id.
pub fn split_job_key(name: &str) -> Option<(&str, &str, &str)> {
    let mut parts = name.rsplitn(3, '@');
    let (tick, digest, key) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = digest.len() == 12 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    let hex = hex || digest == MANUAL_DIGEST;
    (hex && !key.is_empty() && !tick.is_empty()).then_some((key, digest, tick))
}

/// The cron parser baton uses: five or six fields (seconds first), no year field.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

/// croner's error, with the field it is about when croner does not say: each field is
/// parsed alone (the others `*`) to find the first one croner rejects.
fn cron_error(expr: &str, e: &croner::errors::CronError) -> ConfigError {
    let fields: Vec<&str> = expr.split(' ').collect();
    let names: &[&str] = match fields.len() {
        5 => &["minute", "hour", "day of month", "month", "day of week"],
        6 => &[
            "second",
            "minute",
            "hour",
            "day of month",
            "month",
            "day of week",
        ],
        _ => &[],
    };
    for (i, name) in names.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[j] } else { "*" })
            .collect();
        if parser().parse(&alone.join(" ")).is_err() {
            return ConfigError::invalid(
                "cron",
                format!("{expr:?}: {name} field {:?}: {e}", fields[i]),
            );
        }
    }
    ConfigError::invalid(
        "cron",
        format!(
            "{expr:?}: {e} (five fields: minute hour day-of-month month day-of-week, or six \
             with seconds first)"
        ),
    )
}

/// 64-bit FNV-1a of `text`, as 12 hex digits (48 bits: two schedules on one key collide with
/// odds of one in 2^48).
fn digest(text: &str) -> String {
    format!("{:012x}", fnv1a(&[text.as_bytes()]) >> 16)
}

/// 64-bit FNV-1a of the concatenation of `parts`.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// MurmurHash3's 64-bit finalizer: every bit of the input moves every bit of the output.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

fn ts(t: SystemTime) -> Option<Timestamp> {
    Timestamp::try_from(t).ok()
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn unsigned(d: SignedDuration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// `24h`, `1h 30m`, `500ms`: whole units, largest first.
fn human(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut parts = Vec::new();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size {
            parts.push(format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    if ms > 0 {
        parts.push(format!("{ms}ms"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests;
