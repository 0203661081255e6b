//! `baton backfill`: run the past occurrences of a schedule in a window that have no terminal
//! outcome, each once across the fleet, oldest first. The library plans it
//! ([`baton::Failover::backfill_plan`]: what is settled on record or in each occurrence's own
//! job, and the oldest tick the store vouches for); each occurrence then runs as a run of an
//! occurrence does (the pause read, --overlap's fleet-wide rule, holder or backup, PROGRAM
//! supervised by [`Job`], recorded), with its outcome kept for the record's lifetime
//! ([`baton::FailoverConfig::for_backfill`]).

use std::time::SystemTime;

use baton::{Client, FailoverConfig, Schedule};

use super::cli::BackfillArgs;
use super::exit::{fail_with, usage, usage_config, EX_TEMPFAIL};
use super::out;
use super::pause::{describe, read};
use super::program::in_foreground;
use super::run::{baton_time, occurrence_env, patiently, record_options, Ended, Job};
use super::schedule::{report, Outcome};
use super::signals::install_signals;
use super::sink::{Bound, Sink};

/// `baton backfill --help`'s tail: what runs, what is refused, the exit statuses.
pub(crate) const BACKFILL_HELP: &str = "\
Example (the nights of a week, on one host or several):
  baton backfill --key nightly-report --cron '0 2 * * *' --tz Europe/Paris \\
      --from 2026-11-20T00:00:00Z --to 2026-11-27T00:00:00Z -- /usr/local/bin/report

What runs:
  Every tick of the schedule in [--from, --to] (RFC 3339; --to is capped at the server's
  clock) that has no terminal outcome (done, exhausted, replaced) in the schedule's record or
  in its occurrence's own job: missed, failed, skipped (by overlap or by a pause) and running
  ones (joined as a backup). One after another, oldest first, each as its own job
  (KEY@DIGEST@TICK, BATON_OCCURRENCE = the tick): several hosts may run the same backfill,
  each occurrence still runs once. A second backfill of the same window runs nothing.
  A backfilled occurrence keeps its DONE for the record's lifetime (at least 30 days).

What is refused:
  A window reaching a tick older than what the store vouches for (the record's history
  horizon, or when it first saw the schedule; for the latest ticks, their jobs) exits 64
  naming the oldest safe tick: a backfill never reruns a tick whose outcome may have been
  forgotten. A paused schedule exits 75: `baton resume` first.

Exit status:
  0   every occurrence ended done, here or elsewhere, or was settled already
  64  usage error, or a window older than the oldest safe tick
  75  the schedule is paused (or was paused during the backfill: the rest is not run)
  else the first failed occurrence's status, as `baton run` exits for it";

/// --from and --to, read before connecting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) from: SystemTime,
    pub(crate) to: SystemTime,
}

/// Reads --from and --to (RFC 3339). `Err` is the exit status (said).
pub(crate) fn window(args: &BackfillArgs) -> Result<Window, u8> {
    let time = |flag: &str, s: &str| {
        s.parse::<jiff::Timestamp>()
            .map(SystemTime::from)
            .map_err(|e| {
                usage(format!(
                    "{flag} {s}: not an RFC 3339 time (2026-11-26T02:00:00Z): {e}"
                ))
            })
    };
    let from = time("--from", &args.from)?;
    let to = time("--to", &args.to)?;
    if to < from {
        return Err(usage(format!(
            "--to {} is before --from {}: the window is empty",
            args.to, args.from
        )));
    }
    Ok(Window { from, to })
}

pub(crate) async fn backfill(
    client: &Client,
    args: &BackfillArgs,
    config: FailoverConfig,
    schedule: Schedule,
    window: Window,
    mut sink: Sink,
) -> u8 {
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let run = &args.run;
    let key = run.key.as_str();
    let failover = client.failover();
    // Refused while paused rather than writing a window of skips.
    match read(client, &config).await {
        Err(e) => return fail_with(&e),
        Ok(Some(p)) => {
            say!(
                "baton: {key}: the schedule is {}; nothing backfilled (`baton resume --key \
                 {key}` first)",
                describe(&p)
            );
            return EX_TEMPFAIL;
        }
        Ok(None) => {}
    }
    let history = run.when.history.unwrap_or(baton::schedule::DEFAULT_HISTORY);
    let plan = match failover
        .backfill_plan(&schedule, &config, window.from, window.to, history)
        .await
    {
        Ok(plan) => plan,
        Err(baton::Error::Config(e)) => return usage_config(&e),
        Err(e) => return fail_with(&e),
    };
    sink.say(
        serde_json::json!({
            "event": "backfill_plan",
            "run": plan.run.iter().map(|o| o.id()).collect::<Vec<_>>(),
            "settled": plan.settled.iter().map(|(o, _)| o.id()).collect::<Vec<_>>(),
            "oldest_safe": baton_time(plan.oldest_safe),
        }),
        &format!(
            "backfill of {key} ({schedule}): {} to run, {} settled on record",
            plan.run.len(),
            plan.settled.len()
        ),
    );
    for (occurrence, outcome) in &plan.settled {
        sink.note(&format!(
            "occurrence {} is settled: {}",
            occurrence.id(),
            outcome.as_str()
        ));
    }
    if plan.run.is_empty() {
        sink.say(
            serde_json::json!({ "event": "backfill_nothing" }),
            "nothing to run: every tick of the window is settled",
        );
        return 0;
    }
    let options = record_options(&run.when);
    let mut first_failure: Option<u8> = None;
    for occurrence in plan.run {
        let job_config = match config.for_backfill(&occurrence, run.retention) {
            Ok(c) => c.with_record(key, &schedule, occurrence.tick(), options.clone()),
            Err(e) => return usage_config(&e),
        };
        let job_key = job_config.key().to_string();
        // The path of any occurrence: the pause read just before it runs.
        let pause = patiently(key, "read the schedule's pause", run.give_up_after, || {
            read(client, &config)
        });
        let pause = tokio::select! {
            sig = signals.recv() => return super::signals::signal_status(sig),
            p = pause => p,
        };
        match pause {
            Err(code) => {
                first_failure.get_or_insert(code);
                continue;
            }
            Ok(Some(p)) => {
                super::pause::record_skip(client, &config, &schedule, &options, &occurrence, &p)
                    .await;
                report(
                    &mut sink,
                    &occurrence,
                    &job_key,
                    Outcome::Ran(Ended::Paused),
                );
                say!(
                    "baton: {key}: the schedule was paused during the backfill; the rest is \
                     not run (`baton resume`, then the same backfill again)"
                );
                return EX_TEMPFAIL;
            }
            Ok(None) => {}
        }
        // --overlap: the fleet-wide rule, as for any occurrence (overlap.rs).
        let admitted = super::overlap::admit(
            client,
            (key, run.give_up_after),
            run.when.overlap,
            (&schedule, &config, &options),
            &occurrence,
        );
        let admitted = tokio::select! {
            sig = signals.recv() => return super::signals::signal_status(sig),
            r = admitted => r,
        };
        let gate = match admitted {
            Err(code) => {
                first_failure.get_or_insert(code);
                continue;
            }
            Ok(super::overlap::Admitted::Skipped(line)) => {
                sink.say(
                    serde_json::json!({ "event": "skipped_overlap", "occurrence": occurrence.id() }),
                    &line,
                );
                continue;
            }
            Ok(super::overlap::Admitted::Run(gate)) => gate,
        };
        let mut run_sink = sink.for_occurrence(Bound {
            id: occurrence.id().to_string(),
            job: job_key.clone(),
        });
        run_sink.note(&format!(
            "running occurrence {}, job {job_key}",
            occurrence.id()
        ));
        let job = Job {
            client,
            args: run,
            env: occurrence_env(&occurrence),
            config: job_config,
            tty: in_foreground(),
            job_control: true,
            gate,
        };
        let ended = job.run(&mut run_sink, &mut signals, &mut sigchld).await;
        report(&mut sink, &occurrence, &job_key, Outcome::Ran(ended));
        match ended {
            Ended::Done | Ended::DoneElsewhere => {}
            // A signal stops the backfill (what ran here was stopped as `baton run` stops it).
            Ended::Signalled(_) | Ended::StoppedWaiting(_) => return ended.code(),
            other => {
                first_failure.get_or_insert(other.code());
            }
        }
    }
    first_failure.unwrap_or(0)
}
