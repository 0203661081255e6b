//! `--overlap` of `baton schedule` and `baton run --every/--cron`: the library's fleet-wide
//! rule ([`baton::Failover::overlap_decision`]) applied to the occurrence a run binds to,
//! after its pause is read and before its job is acquired. `skip` records the tick skipped
//! while an earlier occurrence runs anywhere; `buffer-one` acquires the job as usual and, as
//! its holder, waits for the earlier one to end before PROGRAM is spawned ([`Gate`], awaited in
//! run.rs's holder), or settles it unrun when its window closes first; `replace` stops the
//! earlier ones wherever they run and waits them out before the job is acquired. [`admit`] is
//! that one step for `run`, `schedule` and `backfill`.

use baton::{Client, FailoverConfig, LiveOccurrence, Occurrence, Overlap, Schedule};

use super::cli::OverlapArg;
use super::out;
use super::run::patiently;

/// The library's policy for `--overlap` (absent: `allow`).
pub(crate) fn policy(arg: Option<OverlapArg>) -> Overlap {
    match arg {
        None | Some(OverlapArg::Allow) => Overlap::Allow,
        Some(OverlapArg::Skip) => Overlap::Skip,
        Some(OverlapArg::BufferOne) => Overlap::BufferOne,
        Some(OverlapArg::Replace) => Overlap::Replace,
    }
}

/// What [`admit`] lets an occurrence do.
// Made once per occurrence and unpacked at once: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Admitted {
    /// Run its job (as holder, behind the gate under `buffer-one`).
    Run(Option<Gate>),
    /// Skipped and recorded: the line to say.
    Skipped(String),
}

/// What the run of `occurrence` does under `--overlap` (`arg`), before its job is acquired:
/// the library's fleet-wide decision, the skip recorded, the gate made, or the earlier
/// occurrences stopped and waited out (`replace`). Reads and stops are retried as `run`
/// retries the server (--give-up-after: `Err` with the status to exit with).
pub(crate) async fn admit(
    client: &Client,
    (key, give_up): (&str, std::time::Duration),
    arg: Option<OverlapArg>,
    (schedule, base, options): (&Schedule, &FailoverConfig, &baton::RecordOptions),
    occurrence: &Occurrence,
) -> Result<Admitted, u8> {
    let policy = policy(arg);
    let failover = client.failover();
    let decided = patiently(key, "read the earlier occurrences", give_up, || {
        failover.overlap_decision(policy, schedule, base, occurrence)
    })
    .await?;
    match decided {
        baton::OverlapDecision::Skip { live } => {
            let line = record_skip(client, base, schedule, options, occurrence, live).await;
            Ok(Admitted::Skipped(line))
        }
        baton::OverlapDecision::Buffer { behind } => Ok(Admitted::Run(Some(Gate {
            occurrence: occurrence.clone(),
            behind,
        }))),
        baton::OverlapDecision::Replace { live } => {
            tell!(
                "baton: {key}: occurrence {}: stopping {} (--overlap replace)",
                occurrence.id(),
                live.iter()
                    .map(|l| format!("occurrence {}", l.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let stopped = patiently(key, "stop the earlier occurrences", give_up, || {
                failover.replace_occurrences(schedule, base, options, occurrence, &live)
            })
            .await?;
            tell!(
                "baton: {key}: occurrence {}: {stopped} earlier occurrence(s) stopped here and \
                 every stopped holder gone; running it",
                occurrence.id()
            );
            Ok(Admitted::Run(None))
        }
        _ => Ok(Admitted::Run(None)),
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
        .record_occurrence_of(schedule, options, config.clone(), occurrence, change)
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
