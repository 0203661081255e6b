//! A schedule's occurrences (`KEY@DIGEST@TICK`) folded into one row: what `baton status` and
//! `baton dashboard` list for a schedule unless asked for each occurrence.
//!
//! The row shows the schedule's **worst open occurrence**, not its latest: an occurrence that
//! is stuck (waiting for a backup that never comes) or exhausted stays in sight after later
//! ticks ran fine, for as long as its state is kept (its retention). "Worst" is
//! [`Entry::severity`]: corrupt, then exhausted, then waiting, then running; "open" is every
//! state but done. Between occurrences equally bad the oldest is shown: it has been so the
//! longest. Once every occurrence is done, the row shows the latest. The row also recalls the
//! last [`LAST_OCCURRENCES`] occurrences and their outcomes, newest first.
//!
//! A manual occurrence (`KEY@manual@ID`, `baton trigger`) belongs to its key, not to a digest:
//! it is folded into every row of its key (one, unless the expression is changing), ordered by
//! its time; a key with manual occurrences only gets a row of digest `manual`.

use std::collections::BTreeMap;

use super::Entry;

/// How many of a schedule's latest occurrences its row recalls.
pub const LAST_OCCURRENCES: usize = 3;

/// One occurrence of a schedule: its tick (RFC 3339, UTC, as in the job's name) and its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Occurrence {
    /// The tick, as the occurrence's job name spells it.
    pub tick: String,
    /// The occurrence's job.
    pub entry: Entry,
}

/// The schedules of a listing, folded as entries are given: the only state a listing keeps
/// across batches (a few occurrences per schedule, not the entries).
#[derive(Debug, Default)]
pub struct ScheduleFold {
    rows: BTreeMap<(String, String), Folded>,
    /// Manual occurrences by key, folded into the key's rows at the end.
    manual: BTreeMap<String, Vec<Occurrence>>,
}

#[derive(Debug, Default)]
struct Folded {
    count: u64,
    /// The latest occurrences by tick (RFC 3339 in UTC sorts by time), oldest first.
    last: Vec<Occurrence>,
    /// The worst open occurrence so far.
    worst: Option<Occurrence>,
}

impl ScheduleFold {
    /// A fold of no schedule yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `entry` when it is a schedule's occurrence (`KEY@DIGEST@TICK`); gives it back
    /// otherwise.
    pub fn fold(&mut self, entry: Entry) -> Option<Entry> {
        let Some((key, digest, tick)) = entry.occurrence() else {
            return Some(entry);
        };
        let id = (key.to_string(), digest.to_string());
        let manual = digest == crate::schedule::MANUAL_DIGEST;
        let occurrence = Occurrence {
            tick: tick.to_string(),
            entry,
        };
        if manual {
            self.manual.entry(id.0).or_default().push(occurrence);
            return None;
        }
        self.rows.entry(id).or_default().add(occurrence);
        None
    }

    /// One row per schedule, by key and digest.
    pub fn rows(self) -> impl Iterator<Item = ScheduleRow> {
        let mut rows = self.rows;
        for (key, manual) in self.manual {
            let digests: Vec<(String, String)> = rows
                .range((key.clone(), String::new())..)
                .take_while(|((k, _), _)| *k == key)
                .map(|(id, _)| id.clone())
                .collect();
            let digests = if digests.is_empty() {
                vec![(key.clone(), crate::schedule::MANUAL_DIGEST.to_string())]
            } else {
                digests
            };
            for id in digests {
                let folded = rows.entry(id).or_default();
                for o in &manual {
                    folded.add(o.clone());
                }
            }
        }
        rows.into_iter().filter_map(|((key, digest), f)| {
            let mut last = f.last;
            last.reverse();
            let shown = f.worst.or_else(|| last.first().cloned())?;
            Some(ScheduleRow {
                key,
                digest,
                occurrences: f.count,
                shown,
                last,
            })
        })
    }
}

impl Folded {
    fn add(&mut self, o: Occurrence) {
        self.count += 1;
        let severity = o.entry.severity();
        if severity > 0 {
            let worse = self.worst.as_ref().map_or(true, |w| {
                let was = w.entry.severity();
                severity > was || (severity == was && when(&o.tick) < when(&w.tick))
            });
            if worse {
                self.worst = Some(o.clone());
            }
        }
        let at = self.last.partition_point(|l| when(&l.tick) < when(&o.tick));
        self.last.insert(at, o);
        if self.last.len() > LAST_OCCURRENCES {
            self.last.remove(0);
        }
    }
}

/// The time an occurrence's id spells, for ordering: a tick's RFC 3339 text, or a manual
/// occurrence's (`manual-<RFC 3339>`).
fn when(tick: &str) -> &str {
    tick.strip_prefix("manual-").unwrap_or(tick)
}

/// A schedule as one row; from [`ScheduleFold::rows`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleRow {
    /// The schedule's key (`KEY` of `KEY@DIGEST@TICK`).
    pub key: String,
    /// The digest of its expression (the store holds the digest only).
    pub digest: String,
    /// How many of its occurrences were listed.
    pub occurrences: u64,
    /// The occurrence the row shows: the worst open one, or the latest when all are done.
    pub shown: Occurrence,
    /// The latest occurrences, newest first (at most [`LAST_OCCURRENCES`]).
    pub last: Vec<Occurrence>,
}

impl ScheduleRow {
    /// Whether the row shows another occurrence than the latest (an older one is worse).
    pub fn shows_an_older_occurrence(&self) -> bool {
        self.last.first().is_some_and(|l| l.tick != self.shown.tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::{EntryState, Kind};

    fn occurrence(tick: &str, state: EntryState) -> Entry {
        let mut e = Entry::lock(Kind::Job, &format!("nightly@0123456789ab@{tick}"));
        e.state = state;
        e
    }

    #[test]
    fn a_manual_occurrence_shows_under_its_schedules_row() {
        let mut fold = ScheduleFold::new();
        assert!(fold
            .fold(occurrence("2026-11-26T02:00:00Z", EntryState::Done))
            .is_none());
        let mut m = Entry::lock(Kind::Job, "nightly@manual@manual-2026-11-26T03:00:00.000Z");
        m.state = EntryState::Done;
        assert!(fold.fold(m).is_none());
        let rows: Vec<ScheduleRow> = fold.rows().collect();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].digest, "0123456789ab");
        assert_eq!(rows[0].occurrences, 2);
        assert_eq!(rows[0].last[0].tick, "manual-2026-11-26T03:00:00.000Z");
        // A key triggered only: a row of its own.
        let mut fold = ScheduleFold::new();
        assert!(fold
            .fold(Entry::lock(
                Kind::Job,
                "other@manual@manual-2026-11-26T03:00:00.000Z"
            ))
            .is_none());
        let rows: Vec<ScheduleRow> = fold.rows().collect();
        assert_eq!(
            (rows[0].key.as_str(), rows[0].digest.as_str()),
            ("other", "manual")
        );
    }

    fn row(states: &[(&str, EntryState)]) -> ScheduleRow {
        let mut fold = ScheduleFold::new();
        for (tick, state) in states {
            assert!(fold.fold(occurrence(tick, *state)).is_none());
        }
        let mut rows: Vec<ScheduleRow> = fold.rows().collect();
        assert_eq!(rows.len(), 1);
        rows.remove(0)
    }

    #[test]
    fn the_worst_open_occurrence_is_shown_even_when_older_than_the_last_ones() {
        use EntryState::*;
        let r = row(&[
            ("2026-01-01T00:00:00Z", Waiting),
            ("2026-01-02T00:00:00Z", Done),
            ("2026-01-03T00:00:00Z", Done),
            ("2026-01-04T00:00:00Z", Running),
            ("2026-01-05T00:00:00Z", Done),
        ]);
        assert_eq!(
            (r.shown.tick.as_str(), r.shown.entry.state),
            ("2026-01-01T00:00:00Z", Waiting)
        );
        assert!(r.shows_an_older_occurrence());
        assert_eq!(r.occurrences, 5);
        let ticks: Vec<&str> = r.last.iter().map(|o| o.tick.as_str()).collect();
        assert_eq!(
            ticks,
            [
                "2026-01-05T00:00:00Z",
                "2026-01-04T00:00:00Z",
                "2026-01-03T00:00:00Z"
            ]
        );
        // Exhausted is worse than waiting; between equals, the oldest.
        let r = row(&[
            ("2026-01-02T00:00:00Z", Waiting),
            ("2026-01-03T00:00:00Z", Exhausted),
            ("2026-01-01T00:00:00Z", Waiting),
            ("2026-01-04T00:00:00Z", Exhausted),
        ]);
        assert_eq!(r.shown.tick, "2026-01-03T00:00:00Z");
    }

    #[test]
    fn a_schedule_whose_occurrences_are_all_done_shows_the_latest() {
        use EntryState::*;
        let r = row(&[
            ("2026-01-02T00:00:00Z", Done),
            ("2026-01-01T00:00:00Z", Done),
        ]);
        assert_eq!(r.shown.tick, "2026-01-02T00:00:00Z");
        assert!(!r.shows_an_older_occurrence());
    }

    #[test]
    fn other_entries_are_given_back() {
        let mut fold = ScheduleFold::new();
        let job = Entry::lock(Kind::Job, "report");
        assert_eq!(fold.fold(job.clone()), Some(job));
        assert_eq!(fold.rows().count(), 0);
    }
}
