//! `--overlap` of `baton schedule` and `baton run --every/--cron`: the library's fleet-wide
//! rule ([`baton::Failover::overlap_decision`]) applied to the occurrence a run binds to,
//! after its pause is read and before its job is acquired. `skip` records the tick skipped
//! while an earlier occurrence runs anywhere; `buffer-one` acquires the job as usual and, as
//! its holder, waits for the earlier one to end before PROGRAM is spawned ([`Gate`], awaited in
//! run.rs's holder), or settles it unrun when its window closes first.

use baton::{Client, FailoverConfig, LiveOccurrence, Occurrence, Overlap, Schedule};

use super::cli::OverlapArg;
use super::out;

/// The library's policy for `--overlap` (absent: `allow`).
pub(crate) fn policy(arg: Option<OverlapArg>) -> Overlap {
    match arg {
        None | Some(OverlapArg::Allow) => Overlap::Allow,
        Some(OverlapArg::Skip) => Overlap::Skip,
        Some(OverlapArg::BufferOne) => Overlap::BufferOne,
    }
}

/// `buffer-one`'s wait before PROGRAM: the occurrence held, and the earlier one it waits for.
pub(crate) struct Gate {
    pub(crate) occurrence: Occurrence,
    pub(crate) behind: LiveOccurrence,
}

/// Records `occurrence` skipped by the overlap rule (`live` earlier occurrences ran) and
/// returns the line to say. A failed record write is said and changes nothing: the tick is
/// skipped all the same (the record is best effort).
pub(crate) async fn record_skip(
    client: &Client,
    config: &FailoverConfig,
    schedule: &Schedule,
    options: &baton::RecordOptions,
    occurrence: &Occurrence,
    live: usize,
) -> String {
    let change = baton::RecordChange::Outcome {
        outcome: baton::RecordedOutcome::SkippedOverlap,
        note: Some(format!("{live} earlier occurrence(s) still ran")),
    };
    let written = client
        .failover()
        .record_occurrence(schedule, options, config.clone(), occurrence.tick(), change)
        .await;
    if let Err(e) = written {
        say!(
            "baton: {}: could not record occurrence {} skipped in the schedule's history: {}",
            config.key(),
            occurrence.id(),
            super::text::error_message(&e)
        );
    }
    skipped_line(occurrence, live)
}

/// The line of an occurrence skipped because `live` earlier ones still run in the fleet.
pub(crate) fn skipped_line(occurrence: &Occurrence, live: usize) -> String {
    format!(
        "occurrence {} skipped: {} still run{} in the fleet (--overlap)",
        occurrence.id(),
        if live == 1 {
            "an earlier occurrence".to_string()
        } else {
            format!("{live} earlier occurrences")
        },
        if live == 1 { "s" } else { "" }
    )
}
