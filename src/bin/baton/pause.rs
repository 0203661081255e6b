//! `baton pause` and `baton resume`: set or clear a schedule's pause in the store, for the
//! whole fleet. The pause is per key (every digest of it), may come before any host has run
//! the schedule, and is read by every run that binds to one of its occurrences (run.rs,
//! schedule.rs), which records the tick skipped (paused) instead of running it.

use std::time::{Duration, SystemTime};

use baton::{Client, FailoverConfig};

use super::exit::{fail_with, usage};
use super::out;
use super::run::baton_time;

/// `--until`: a time, or a duration from now by the server's clock (read once connected).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    At(SystemTime),
    In(Duration),
}

/// Reads `--until`: an RFC 3339 time or a duration (`2h`). `Err` is the exit status (said).
pub(crate) fn parse_until(s: &str) -> Result<Until, u8> {
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Ok(Until::At(SystemTime::from(ts)));
    }
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(Until::In(d)),
        _ => Err(usage(format!(
            "--until {s}: neither an RFC 3339 time (2026-12-24T08:00:00Z) nor a duration \
             from now (2h, 30m)"
        ))),
    }
}

pub(crate) async fn pause(
    client: &Client,
    config: FailoverConfig,
    until: Option<Until>,
    note: Option<&str>,
) -> u8 {
    let failover = client.failover();
    let key = config.key();
    // Both forms of --until are read against the server's clock, which every host's pause
    // check uses: a local clock that runs ahead would end the pause early (or late).
    let until = match until {
        None => None,
        Some(until) => {
            let now = match failover.server_time(key).await {
                Ok(now) => now,
                Err(e) => return fail_with(&e),
            };
            match until {
                Until::In(d) => Some(now + d),
                Until::At(t) if t <= now => {
                    return usage(format!(
                        "--until {} is not after the server's time ({}): nothing to pause",
                        baton_time(t),
                        baton_time(now)
                    ));
                }
                Until::At(t) => Some(t),
            }
        }
    };
    if let Err(e) = failover.pause_schedule(config.clone(), until, note).await {
        return fail_with(&e);
    }
    match until {
        Some(t) => doneln!(
            "{key}: paused until {} (by the server's clock); `baton resume --key {key}` ends \
             it sooner",
            baton_time(t)
        ),
        None => doneln!("{key}: paused until `baton resume --key {key}`"),
    }
    0
}

pub(crate) async fn resume(client: &Client, config: FailoverConfig) -> u8 {
    let key = config.key();
    match client.failover().resume_schedule(config.clone()).await {
        Ok(true) => doneln!("{key}: resumed; the next tick runs (skipped ticks are not caught up)"),
        Ok(false) => doneln!("{key}: was not paused"),
        Err(e) => return fail_with(&e),
    }
    0
}

/// The schedule's pause as a run is about to acquire ([`baton::Failover::schedule_pause`],
/// one read). A backend that cannot keep the schedule's record cannot keep a pause either:
/// not paused.
pub(crate) async fn read(
    client: &Client,
    config: &FailoverConfig,
) -> Result<Option<baton::Pause>, baton::Error> {
    match client.failover().schedule_pause(config.clone()).await {
        Err(e) if e.kind() == baton::ErrorKind::Unsupported => Ok(None),
        read => read,
    }
}

/// How a pause reads in one line: `paused until T (by B at A: NOTE)`.
pub(crate) fn describe(p: &baton::Pause) -> String {
    let mut s = match p.until {
        Some(t) => format!("paused until {}", baton_time(t)),
        None => "paused until resumed".to_string(),
    };
    s += &format!(" (by {} at {}", p.by, baton_time(p.at));
    if let Some(n) = &p.note {
        s += &format!(": {n}");
    }
    s.push(')');
    s
}

/// What a run bound to `occurrence` does when its schedule is paused: records the tick
/// skipped (paused) in the schedule's history and returns the line to say. `pause` is what
/// [`baton::Failover::schedule_pause`] read. A failed record write is said and does not
/// change the outcome: the tick is skipped all the same (the record is best effort, as the
/// workers' own writes are).
pub(crate) async fn record_skip(
    client: &Client,
    config: &FailoverConfig,
    schedule: &baton::Schedule,
    options: &baton::RecordOptions,
    occurrence: &baton::Occurrence,
    pause: &baton::Pause,
) -> String {
    let change = baton::RecordChange::Outcome {
        outcome: baton::RecordedOutcome::SkippedPaused,
        note: pause.note.clone(),
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
    format!(
        "{} skipped: the schedule is {}",
        super::trigger::label(occurrence),
        describe(pause)
    )
}
