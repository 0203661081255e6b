//! `baton trigger`, `baton run … --now`, and how `baton schedule` starts the manual
//! occurrences of its key. The decisions are the library's ([`baton::Failover::triggers`],
//! [`baton::TriggerPoll`], the trigger cleared once a run ends final); this file says them
//! and wires them into the commands.

use std::time::{Duration, SystemTime};

use baton::{Client, FailoverConfig, Occurrence, TriggerPoll};

use super::cli::RunArgs;
use super::exit::fail_with;
use super::out;
use super::run::{baton_time, patiently, Ended};
use super::text;

/// `baton trigger --key K [--note TEXT] [--json]`: stores the trigger, prints its id.
pub(crate) async fn trigger(
    client: &Client,
    config: FailoverConfig,
    note: Option<&str>,
    json: bool,
) -> u8 {
    match client
        .failover()
        .trigger_schedule(config.clone(), note)
        .await
    {
        Ok(t) => {
            if json {
                // Strings and a time: serializing cannot fail.
                outln!("{}", serde_json::to_string(&t).unwrap_or_default());
            } else {
                outln!("{}", t.id);
                tell!(
                    "baton: {}: triggered {} at {}; every `baton schedule --key {}` runs it once \
                     within its --trigger-poll",
                    config.key(),
                    t.id,
                    baton_time(t.at),
                    config.key()
                );
            }
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// `baton run --now`: makes a trigger (so `baton schedule` daemons of the key join as
/// backups) and returns its manual occurrence, bound now, and the server's time.
pub(crate) async fn bind_now(
    client: &Client,
    args: &RunArgs,
    base: &FailoverConfig,
    note: Option<&str>,
) -> Result<(Occurrence, SystemTime), u8> {
    let failover = client.failover();
    let t = patiently(&args.key, "store the trigger", args.give_up_after, || {
        failover.trigger_schedule(base.clone(), note)
    })
    .await?;
    Ok((t.occurrence(), t.at))
}

/// Whether a run of a manual occurrence that ended `ended` here settles it (done here or
/// elsewhere, exhausted, skipped while paused), as the library's driver decides
/// ([`baton::RunOutcome::is_final`]).
pub(crate) fn settles(ended: Ended) -> bool {
    matches!(
        ended,
        Ended::Done
            | Ended::DoneElsewhere
            | Ended::Exhausted(_)
            | Ended::Paused
            | Ended::SkippedOverlap
    )
}

/// Clears `occurrence`'s trigger once its run here ended `ended` final; nothing for a tick.
/// A failure is said and changes nothing: the trigger stays pending, and a host that runs it
/// later finds its job settled (it keeps its outcome longer than a trigger lives).
pub(crate) async fn settle(
    client: &Client,
    base: &FailoverConfig,
    occurrence: &Occurrence,
    ended: Ended,
) {
    if !occurrence.is_manual() || !settles(ended) {
        return;
    }
    if let Err(e) = client
        .failover()
        .clear_trigger(base.clone(), occurrence.id())
        .await
    {
        tell!(
            "baton: {}: could not clear trigger {} ({}); it stays pending, and its job is \
             settled",
            base.key(),
            occurrence.id(),
            text::error_message(&e)
        );
    }
}

/// How an occurrence is named in reports: `occurrence T` or `manual occurrence ID`.
pub(crate) fn label(occurrence: &Occurrence) -> String {
    if occurrence.is_manual() {
        format!("manual occurrence {}", occurrence.id())
    } else {
        format!("occurrence {}", occurrence.id())
    }
}

/// Waits `every`, then reads the key's pending triggers: the manual occurrences not started
/// here yet (and the poll, handed back for the next wait). A failed read is said once per
/// outage (`failing`) and gives none.
pub(crate) async fn next_triggers(
    client: &Client,
    config: FailoverConfig,
    mut poll: TriggerPoll,
    every: Duration,
    mut failing: bool,
) -> (TriggerPoll, bool, Vec<Occurrence>) {
    tokio::time::sleep(every).await;
    match client.failover().triggers(config.clone()).await {
        Ok(pending) => {
            if failing {
                tell!("baton: {}: the triggers can be read again", config.key());
            }
            let new = poll.take_new(&pending);
            (poll, false, new)
        }
        Err(e) if e.kind() == baton::ErrorKind::Unsupported => {
            // No record, no triggers: never read again.
            std::future::pending::<()>().await;
            (poll, failing, vec![])
        }
        Err(e) => {
            if !failing {
                tell!(
                    "baton: {}: cannot read the triggers ({}); trying again every {}",
                    config.key(),
                    text::error_message(&e),
                    text::human(every)
                );
            }
            failing = true;
            (poll, failing, vec![])
        }
    }
}
