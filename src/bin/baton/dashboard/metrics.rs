//! The dashboard's `/metrics`: what it reads, as Prometheus text, for a Prometheus that watches
//! the jobs through the one process already reading them.
//!
//! Each family has its `# HELP` line: the entries of the last good read by kind and state (a
//! gauge; a schedule counts once, as its row on the page), the age of that read (a gauge,
//! `+Inf` before the first), the reads that failed (a counter), and per schedule, from its
//! record in the store: the end of its last success, the outcomes its bounded history holds
//! and its missed ticks not made up since (gauges: counts over a history that drops its oldest
//! entries go down as well as up, which a counter must never do), whether it is paused, and the
//! schedules left out past `--max-schedules` (a gauge, per read). A schedule's series carry
//! its key as the `schedule` label: unlike the library's own metrics (whose labels never carry
//! a key), this exporter is one process watching a bounded set of schedules, capped.
//!
//! They come from the watch channel every page reads, so a scrape costs no read of the server.
//! The dashboard installs no `metrics` recorder: the families are written here directly, and
//! the library records nothing while it only lists.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{unix_ms, Listing, Published, ScheduleStats, Shared};

/// `baton_entries{kind,state}`.
pub(super) const ENTRIES: &str = "baton_entries";
/// `baton_dashboard_last_read_age_seconds`.
pub(super) const LAST_READ_AGE: &str = "baton_dashboard_last_read_age_seconds";
/// `baton_dashboard_read_failures_total`.
pub(super) const READ_FAILURES: &str = "baton_dashboard_read_failures_total";

/// `baton_schedule_last_success_timestamp_seconds{schedule}`.
pub(super) const LAST_SUCCESS: &str = "baton_schedule_last_success_timestamp_seconds";
/// `baton_schedule_occurrences_recorded{schedule,outcome}`.
pub(super) const RECORDED: &str = "baton_schedule_occurrences_recorded";
/// `baton_schedule_missed{schedule}`.
pub(super) const MISSED: &str = "baton_schedule_missed";
/// `baton_schedule_paused{schedule}`.
pub(super) const PAUSED: &str = "baton_schedule_paused";
/// `baton_dashboard_schedules_dropped`.
pub(super) const DROPPED: &str = "baton_dashboard_schedules_dropped";

/// The content type of the Prometheus text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `/metrics`: the published read, as Prometheus text.
pub(super) async fn serve(State(shared): State<Arc<Shared>>) -> Response {
    let published = shared.published.borrow().clone();
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        render(&published, unix_ms()),
    )
        .into_response()
}

/// The text of `p` at `now_ms` (Unix ms).
fn render(p: &Published, now_ms: u64) -> String {
    let mut out = String::new();
    family(
        &mut out,
        ENTRIES,
        "gauge",
        "Entries under the dashboard's prefix at its last good read, by kind and state (a \
         schedule counts once, in the state of its row).",
    );
    for ((kind, state), n) in &p.listing.by_kind_state {
        // Fixed words from the listing (`job`, `exhausted`, ...): nothing to escape.
        let _ = writeln!(out, "{ENTRIES}{{kind=\"{kind}\",state=\"{state}\"}} {n}");
    }
    family(
        &mut out,
        LAST_READ_AGE,
        "gauge",
        "Seconds since the dashboard's last good read of the server (+Inf before the first).",
    );
    let age = if p.read_at_ms == 0 {
        "+Inf".to_string()
    } else {
        // Wall-clock milliseconds: a clock stepped back reads as a fresh read, never negative.
        format!("{:.3}", now_ms.saturating_sub(p.read_at_ms) as f64 / 1000.0)
    };
    let _ = writeln!(out, "{LAST_READ_AGE} {age}");
    family(
        &mut out,
        READ_FAILURES,
        "counter",
        "Reads of the server by the dashboard that failed or did not answer in time.",
    );
    let _ = writeln!(out, "{READ_FAILURES} {}", p.failed_reads);
    schedules(&mut out, &p.listing);
    out
}

/// The per-schedule families, from the records read with the listing.
fn schedules(out: &mut String, l: &Listing) {
    let label = |s: &ScheduleStats| escape(&s.schedule);
    family(
        out,
        LAST_SUCCESS,
        "gauge",
        "When the schedule's last successful occurrence ended, by the server's clock (Unix \
         seconds), from its record in the store; absent while it has none on record.",
    );
    for s in &l.schedules {
        if let Some(ms) = s.last_success_ms {
            let _ = writeln!(
                out,
                "{LAST_SUCCESS}{{schedule=\"{}\"}} {:.3}",
                label(s),
                ms as f64 / 1000.0
            );
        }
    }
    family(
        out,
        RECORDED,
        "gauge",
        "Occurrences in the schedule's bounded history (its last N, --history) by outcome: a \
         gauge, not a counter, since the oldest entries leave the history.",
    );
    for s in &l.schedules {
        for (outcome, n) in &s.outcomes {
            let _ = writeln!(
                out,
                "{RECORDED}{{schedule=\"{}\",outcome=\"{outcome}\"}} {n}",
                label(s)
            );
        }
    }
    family(
        out,
        MISSED,
        "gauge",
        "Ticks of the schedule whose window closed with no attempt (recorded missed, or \
         computed from the store when no host recorded them) since its last success: 0 again \
         once an occurrence succeeds.",
    );
    for s in &l.schedules {
        let _ = writeln!(out, "{MISSED}{{schedule=\"{}\"}} {}", label(s), s.missed);
    }
    family(
        out,
        PAUSED,
        "gauge",
        "1 while the schedule is paused (baton pause), 0 otherwise.",
    );
    for s in &l.schedules {
        let _ = writeln!(
            out,
            "{PAUSED}{{schedule=\"{}\"}} {}",
            label(s),
            u8::from(s.paused)
        );
    }
    family(
        out,
        DROPPED,
        "gauge",
        "Schedules left out of the baton_schedule_* families at the last good read, past \
         --max-schedules.",
    );
    let _ = writeln!(out, "{DROPPED} {}", l.schedules_dropped);
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::super::Row;
    use super::*;
    use baton::inspect::EntryState;

    fn row(kind: &'static str, state: EntryState) -> Row {
        Row {
            kind,
            name: "x".into(),
            state: state.as_str(),
            holder: None,
            remaining_ms: None,
            fencing_token: None,
            attempt: None,
            standbys: None,
            can_standby: false,
            digest: None,
            schedule: None,
            expression: None,
            note: String::new(),
            problem: false,
        }
    }

    #[test]
    fn every_family_is_described_and_entries_count_by_kind_and_state() {
        let mut listing = Listing::default();
        listing.push(row("job", EntryState::Exhausted));
        listing.push(row("job", EntryState::Exhausted));
        listing.push(row("job", EntryState::Done));
        listing.push(row("lock", EntryState::Held));
        let never = render(&Published::default(), 5_000);
        assert!(
            never.contains(&format!("\n{LAST_READ_AGE} +Inf\n")),
            "{never}"
        );
        let p = Published {
            listing: Arc::new(listing),
            read_at_ms: 1_000,
            failed_reads: 3,
            ..Published::default()
        };
        let text = render(&p, 3_500);
        for line in [
            "baton_entries{kind=\"job\",state=\"exhausted\"} 2",
            "baton_entries{kind=\"job\",state=\"done\"} 1",
            "baton_entries{kind=\"lock\",state=\"held\"} 1",
            "baton_dashboard_last_read_age_seconds 2.500",
            "baton_dashboard_read_failures_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
        for name in [ENTRIES, LAST_READ_AGE, READ_FAILURES] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}:\n{text}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}:\n{text}");
        }
    }
}
