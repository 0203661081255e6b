//! `baton run`: wait for an attempt of the job, run PROGRAM under it, record DONE or the
//! failure. The failover worker decides; this file turns its events into PROGRAM's life and
//! baton's exit status. With a schedule (--every, --cron) the job is one occurrence's: bound by
//! the server's clock, waited for when its tick (plus its --jitter) lies ahead, then run like
//! any job.
//!
//! One job's run ([`run_job`]) is a function of its own, with its signals given to it, so that
//! `baton schedule` runs several occurrences at once in this process, each exactly as `baton
//! run` would.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, SystemTime};

use baton::{Client, ErrorKind, Event, FailoverConfig, HeldLease, JobState, Occurrence, Schedule};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::cli::{RunArgs, WhenArgs};
use super::exit::{
    exit_code, exit_for, fail_with, usage, usage_config, EX_EXHAUSTED, EX_LOST, EX_UNAVAILABLE,
};
use super::out;
use super::program::{in_foreground, spawn, spawn_failed};
use super::signals::{install_signals, signal_name, signal_status, Signals};
use super::sink::{Bound, Sink};
use super::supervisor::{later, Stopping, Supervised, Supervisor, FAR};
use super::supervisor::{Lease, Loss};
use super::text::{self, human};
use super::LEASE_CHECK_TIMEOUT;

/// `--retention` when not given, for a job that is not an occurrence of a schedule.
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Builds and checks `run`'s job configuration and opens its events file.
/// `rejoin` is `--rejoin`'s default for the command (`schedule` rejoins, `run` does not).
pub(crate) fn config(
    args: &RunArgs,
    prefix: &str,
    rejoin: bool,
) -> Result<(FailoverConfig, Sink), u8> {
    let scheduled = args.when.every.is_some() || args.when.cron.is_some();
    // An occurrence's job gets its own retention (`for_occurrence`); this one only has to pass
    // the coordinator's rule (at least twice the lease) for a long --lease.
    let retention = match args.retention {
        Some(r) => r,
        None if scheduled => DEFAULT_RETENTION.max(args.lease.saturating_mul(2)),
        None => DEFAULT_RETENTION,
    };
    let mut builder = FailoverConfig::builder(args.key.clone())
        .prefix(prefix)
        .lease(args.lease)
        .max_attempts(args.max_attempts)
        .retention(retention)
        .watchdog(!args.no_watchdog)
        .retry_delay(args.retry_delay)
        .rejoin_after_fail(args.rejoin.unwrap_or(rejoin));
    if let Some(name) = &args.name {
        builder = builder.worker_name(name.clone());
    }
    // Validate --max-hold with the library's rules, but enforce it here: PROGRAM must be stopped
    // *before* the attempt is released, which only this process can do.
    builder
        .clone()
        .max_hold(args.max_hold)
        .build()
        .map_err(|e| usage_config(&e))?;
    let config = builder.build().map_err(|e| usage_config(&e))?;
    let file = match &args.events {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(super::out::FileOut::start)
                .map_err(|e| usage(format!("cannot open {}: {e}", path.display())))?,
        ),
        None => None,
    };
    super::out::set_json(args.json);
    let sink = Sink {
        json: args.json,
        file,
        verbose: args.verbose,
        key: args.key.clone(),
        occurrence: None,
    };
    Ok((config, sink))
}

/// The schedule of --every/--offset or --cron/--tz, with --early (`None` without one), checked
/// as far as it can be without the server: an occurrence's job (its key, its retention) is
/// built for the tick of the local clock, so a key too long for `KEY@DIGEST@TICK`, a
/// --retention the coordinator refuses or a --jitter longer than the period is a usage error
/// before connecting.
pub(crate) fn schedule_of(
    when: &WhenArgs,
    config: &FailoverConfig,
    retention: Option<Duration>,
) -> Result<Option<Schedule>, u8> {
    let schedule = match (when.every, &when.cron) {
        (Some(period), _) => {
            Schedule::every(period).and_then(|s| s.offset(when.offset.unwrap_or(Duration::ZERO)))
        }
        (None, Some(expr)) => Schedule::cron_in(expr, when.tz.as_deref().unwrap_or("UTC")),
        (None, None) => return Ok(None),
    };
    let mut schedule = schedule.map_err(|e| usage_config(&e))?;
    if let Some(early) = when.early {
        schedule = schedule.early(early);
    }
    if let Some(jitter) = when.jitter {
        schedule
            .check_jitter(jitter, SystemTime::now())
            .map_err(|e| usage_config(&e))?;
    }
    if let Some(occurrence) = schedule.occurrence_at(SystemTime::now()) {
        config
            .for_occurrence(&occurrence, retention)
            .map_err(|e| usage_config(&e))?;
        if let Some(given) = retention {
            say_retention_floor(&schedule, occurrence, given);
        }
    }
    Ok(Some(schedule))
}

/// How the schedule's record is written: --history, and the --jitter its spec describes.
pub(crate) fn record_options(when: &WhenArgs) -> baton::RecordOptions {
    let options = baton::RecordOptions::default().jitter(when.jitter.unwrap_or(Duration::ZERO));
    match when.history {
        Some(n) => options.history(n),
        None => options,
    }
}

/// How many ticks from now [`say_retention_floor`] looks at: enough for the irregular gaps
/// of a cron expression's week (`0 2,3 * * 1-5`), and cheap.
const FLOOR_TICKS: usize = 64;

/// Says once, before connecting, when --retention is below what keeps an occurrence from
/// running twice ([`Occurrence::retention_floor`]): the library keeps each occurrence's
/// outcome that long instead, and the operator should know the flag was overruled.
fn say_retention_floor(schedule: &Schedule, first: Occurrence, given: Duration) {
    let floors: Vec<Duration> = std::iter::successors(Some(first), |o| {
        o.next_tick().and_then(|t| schedule.occurrence_of_tick(t))
    })
    .take(FLOOR_TICKS)
    .map(|o| o.retention_floor())
    .collect();
    let (Some(low), Some(high)) = (floors.iter().min(), floors.iter().max()) else {
        return;
    };
    if given >= *high {
        return;
    }
    let kept = if low == high {
        human(*high)
    } else {
        format!("up to {}", human(*high))
    };
    tell!(
        "baton: --retention {} is too short for {schedule}: a late run could bind to an \
         occurrence after its DONE expired and run it again; each occurrence's DONE/EXHAUSTED \
         is kept {kept} instead (the gap to the next tick, its --early, and {} for clock reads)",
        human(given),
        human(baton::schedule::RETENTION_CLOCK_MARGIN),
    );
}

/// How one job's run ended in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// This process ran the attempt that made the job DONE.
    Done,
    /// This process ran an attempt that failed (PROGRAM's status, 126/127, or 74 when the
    /// attempt was lost or its success could not be recorded).
    Failed(u8),
    /// This process's attempt was failed because baton got this signal (PROGRAM was stopped).
    Signalled(libc::c_int),
    /// Another worker made the job DONE.
    DoneElsewhere,
    /// Every attempt failed; none was run here last. The number of attempts the job made,
    /// when the worker knows it (`Event::Exhausted`).
    Exhausted(Option<u64>),
    /// A signal (or the worker's stop) ended the wait for an attempt: nothing ran here.
    StoppedWaiting(u8),
    /// baton could not coordinate the job (said already): this exit status.
    Error(u8),
    /// The schedule was paused (`baton pause`): the tick was recorded skipped, nothing ran.
    Paused,
    /// `--overlap skip`/`buffer-one` skipped the occurrence (recorded skipped_overlap): earlier
    /// ones still ran in the fleet, or its window closed while it waited (nothing ran).
    SkippedOverlap,
}

impl Ended {
    /// `baton run`'s exit status for this end.
    pub(crate) fn code(self) -> u8 {
        match self {
            Ended::Done | Ended::DoneElsewhere | Ended::Paused | Ended::SkippedOverlap => 0,
            Ended::Failed(code) | Ended::StoppedWaiting(code) | Ended::Error(code) => code,
            Ended::Signalled(sig) => signal_status(sig),
            Ended::Exhausted(_) => EX_EXHAUSTED,
        }
    }
}

pub(crate) async fn run(
    client: &Client,
    args: &RunArgs,
    config: FailoverConfig,
    schedule: Option<Schedule>,
    mut sink: Sink,
) -> u8 {
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut env = Vec::new();
    // --now: the manual occurrence run here, whose trigger is cleared once it ended final.
    let mut manual: Option<(FailoverConfig, Occurrence)> = None;
    let mut gate = None;
    let config = match schedule {
        None => config,
        Some(schedule) => {
            let base = config.clone();
            let bound = tokio::select! {
                sig = signals.recv() => return signal_status(sig),
                // --now: a manual occurrence of its own (a trigger) instead of the tick's.
                b = async {
                    if args.when.now {
                        super::trigger::bind_now(client, args, &base, None).await
                    } else {
                        bind(client, args, &schedule).await
                    }
                } => b,
            };
            let (occurrence, now) = match bound {
                Ok(b) => b,
                Err(code) => return code,
            };
            let jitter = args.when.jitter.unwrap_or(Duration::ZERO);
            let start = occurrence.jittered_start(&args.key, jitter, args.lease);
            let wait = start.duration_since(now).unwrap_or(Duration::ZERO);
            // The occurrence's worker records its grant and its attempt's end (host, times,
            // PROGRAM's exit status) in the schedule's record.
            let config = match config.for_occurrence(&occurrence, args.retention) {
                Ok(c) => c.with_occurrence_record(
                    &args.key,
                    &schedule,
                    &occurrence,
                    record_options(&args.when),
                ),
                Err(e) => return usage_config(&e),
            };
            sink.occurrence = Some(Bound {
                id: occurrence.id().to_string(),
                job: config.key().to_string(),
            });
            let jittered = args.when.jitter.map(|most| Jittered {
                most,
                j: start.duration_since(occurrence.tick()).unwrap_or_default(),
                room: occurrence.jitter_room(args.lease),
            });
            say_bound(&mut sink, &schedule, &occurrence, jittered, wait);
            if !wait.is_zero() {
                // A signal while waiting for the tick ends the run as one while waiting for an
                // attempt does: nothing ran here.
                let failover = client.failover();
                let due = patiently(
                    &args.key,
                    "read the server's clock",
                    args.give_up_after,
                    || failover.wait_until(&args.key, start),
                );
                let due = tokio::select! {
                    sig = signals.recv() => return signal_status(sig),
                    r = due => r,
                };
                if let Err(code) = due {
                    return code;
                }
            }
            // Paused (`baton pause`): the tick is recorded skipped and nothing runs (pause.rs).
            let pause = patiently(
                &args.key,
                "read the schedule's pause",
                args.give_up_after,
                || super::pause::read(client, &base),
            );
            let pause = tokio::select! {
                sig = signals.recv() => return signal_status(sig),
                r = pause => r,
            };
            match pause {
                Err(code) => return code,
                Ok(Some(p)) => {
                    let options = record_options(&args.when);
                    let line = super::pause::record_skip(
                        client,
                        &base,
                        &schedule,
                        &options,
                        &occurrence,
                        &p,
                    )
                    .await;
                    sink.say(serde_json::json!({ "event": "skipped_paused" }), &line);
                    super::trigger::settle(client, &base, &occurrence, Ended::Paused).await;
                    return 0;
                }
                Ok(None) => {}
            }
            // --overlap: the fleet-wide rule (overlap.rs).
            let options = record_options(&args.when);
            let admitted = super::overlap::admit(
                client,
                (&args.key, args.give_up_after),
                args.when.overlap,
                (&schedule, &base, &options),
                &occurrence,
            );
            let admitted = tokio::select! {
                sig = signals.recv() => return signal_status(sig),
                r = admitted => r,
            };
            match admitted {
                Err(code) => return code,
                Ok(super::overlap::Admitted::Skipped(line)) => {
                    sink.say(serde_json::json!({ "event": "skipped_overlap" }), &line);
                    let ended = Ended::SkippedOverlap;
                    super::trigger::settle(client, &base, &occurrence, ended).await;
                    return 0;
                }
                Ok(super::overlap::Admitted::Run(g)) => gate = g,
            }
            env = occurrence_env(&occurrence);
            manual = Some((base, occurrence));
            config
        }
    };
    let job = Job {
        client,
        args,
        config,
        env,
        tty: in_foreground(),
        job_control: true,
        gate,
    };
    let ended = job.run(&mut sink, &mut signals, &mut sigchld).await;
    if let Some((base, occurrence)) = &manual {
        super::trigger::settle(client, base, occurrence, ended).await;
    }
    if let Ended::Exhausted(attempts) = ended {
        let text = exhausted_here(client, &job.config, attempts).await;
        sink.warn(&text);
    }
    ended.code()
}

/// What a run that found the job exhausted says (even under --quiet: it exits 75, and cron
/// should mail that nothing ran): how many attempts the job made, or, when the store does
/// not keep the count, its last failure note; and how to run it again.
pub(crate) async fn exhausted_here(
    client: &Client,
    config: &FailoverConfig,
    attempts: Option<u64>,
) -> String {
    let how = match attempts {
        Some(n) => format!("exhausted after {}", text::attempts(n)),
        None => {
            // The state keeps EXHAUSTED, not the count: the failure note says which attempt
            // failed last (a holder that died wrote none).
            let status = tokio::time::timeout(
                LEASE_CHECK_TIMEOUT,
                client.failover().job_status(config.clone()),
            )
            .await;
            match status {
                Ok(Ok(s)) => match s.last_failure {
                    Some(note) => format!("exhausted (last failure: {})", text::reword(&note)),
                    None => "exhausted".into(),
                },
                _ => "exhausted".into(),
            }
        }
    };
    format!(
        "{how}; nothing run (`baton reset --key {}` to run it again)",
        config.key()
    )
}

/// The occurrence a run starting now binds to, by the server's clock, and the server's time
/// it was bound at. `Err` is the exit status (said).
async fn bind(
    client: &Client,
    args: &RunArgs,
    schedule: &Schedule,
) -> Result<(Occurrence, SystemTime), u8> {
    // `Failover::occurrence` with the server's time kept, to say how long the wait is. A cron
    // line that fires during a failover reads it once the server answers again.
    let failover = client.failover();
    let key = args.key.as_str();
    let now = patiently(key, "read the server's clock", args.give_up_after, || {
        failover.server_time(key)
    })
    .await?;
    let occurrence = schedule.occurrence_at(now).ok_or_else(|| {
        usage(format!(
            "{schedule} has no tick around the server's time ({})",
            baton_time(now)
        ))
    })?;
    Ok((occurrence, now))
}

/// `op` until it succeeds, retrying errors a retry can fix (said once) for up to `give_up` of
/// them in a row (--give-up-after). `Err` is the exit status (said).
pub(crate) async fn patiently<T, Fut>(
    key: &str,
    what: &str,
    give_up: Duration,
    mut op: impl FnMut() -> Fut,
) -> Result<T, u8>
where
    Fut: std::future::Future<Output = Result<T, baton::Error>>,
{
    let mut failing_since: Option<Instant> = None;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() => {
                let since = *failing_since.get_or_insert_with(|| {
                    tell!(
                        "baton: {key}: cannot {what} yet ({}); trying again",
                        text::error_message(&e)
                    );
                    Instant::now()
                });
                if since.elapsed() >= give_up {
                    say!(
                        "baton: {key}: the server kept failing for {} (--give-up-after); giving up",
                        human(give_up)
                    );
                    return Err(fail_with(&e));
                }
                tokio::time::sleep(RETRY_PAUSE.min(give_up)).await;
            }
            Err(e) => return Err(fail_with(&e)),
        }
    }
}

/// The pause between two tries of [`patiently`]: what the server's clock is read for can wait
/// that long, and a failover takes seconds.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// `t` in RFC 3339 (UTC), as occurrence ids are written, to the millisecond at most (ticks
/// are whole milliseconds, so their ids are unchanged; a time read from the clock is not).
pub(crate) fn baton_time(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .and_then(|ts| jiff::Timestamp::from_millisecond(ts.as_millisecond()))
        .map_or_else(|_| format!("{t:?}"), |ts| ts.to_string())
}

/// An occurrence's jitter as `run` says it: --jitter, the occurrence's `j`, and the room its
/// window leaves (which reduces --jitter when shorter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Jittered {
    pub(crate) most: Duration,
    pub(crate) j: Duration,
    pub(crate) room: Duration,
}

impl Jittered {
    /// `jitter 4.2 s`, and why it is shorter than --jitter could make it when the window
    /// reduced it.
    pub(crate) fn text(&self) -> String {
        if self.room.is_zero() && !self.most.is_zero() {
            return format!(
                "no jitter (the window before the next tick leaves no room for --jitter {} \
                 with --lease to spare)",
                human(self.most)
            );
        }
        let mut text = format!("jitter {}", human_exact(self.j));
        if self.room < self.most {
            text += &format!(
                " (--jitter {} reduced to {}, what fits before the next tick's window with \
                 --lease to spare)",
                human(self.most),
                human(self.room)
            );
        }
        text
    }
}

/// `d` to the millisecond: the jitter is, and hosts compare it.
fn human_exact(d: Duration) -> String {
    if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        format!("{}.{:03} s", d.as_secs(), d.subsec_millis())
    } else {
        human(d)
    }
}

/// Says which occurrence a run bound to: `occurrence 2026-11-26T01:00:00Z (cron '0 2 * * *'
/// in Europe/Paris), job KEY@DIGEST@TICK`, its jitter with --jitter, and the wait for its tick
/// (plus the jitter) if it lies ahead.
fn say_bound(
    sink: &mut Sink,
    schedule: &Schedule,
    occurrence: &Occurrence,
    jittered: Option<Jittered>,
    wait: Duration,
) {
    let job = sink
        .occurrence
        .as_ref()
        .map(|b| b.job.clone())
        .unwrap_or_default();
    let mut text = format!("occurrence {} ({schedule}), job {job}", occurrence.id());
    if let Some(j) = &jittered {
        text += &format!(", {}", j.text());
    }
    let jitter = jittered.map_or(Duration::ZERO, |j| j.j);
    if !wait.is_zero() {
        let until = if jitter.is_zero() {
            "the tick"
        } else {
            "the tick + jitter"
        };
        text += &format!("; waiting {} for {until}", human(wait));
    }
    let start = occurrence
        .tick()
        .checked_add(jitter)
        .unwrap_or(occurrence.tick());
    let value = serde_json::json!({
        "event": "occurrence",
        "schedule": schedule.to_string(),
        "wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "jitter_ms": u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX),
        "start": baton_time(start),
    });
    sink.say(value, &text);
}

/// What PROGRAM learns of its occurrence besides what every job's PROGRAM gets (its
/// `BATON_JOB` is the occurrence's job key, as for every job: its configuration's key).
pub(crate) fn occurrence_env(occurrence: &Occurrence) -> Vec<(&'static str, String)> {
    vec![("BATON_OCCURRENCE", occurrence.id().to_string())]
}

/// One job run in this process as `baton run` runs it: wait for an attempt (or the job's end),
/// run PROGRAM under it, record the outcome.
pub(crate) struct Job<'a> {
    pub(crate) client: &'a Client,
    pub(crate) args: &'a RunArgs,
    /// The job's configuration (an occurrence's, for a schedule).
    pub(crate) config: FailoverConfig,
    /// Added to PROGRAM's environment (the occurrence's variables).
    pub(crate) env: Vec<(&'static str, String)>,
    /// Whether PROGRAM gets the terminal (baton runs in its foreground).
    pub(crate) tty: bool,
    /// See [`Supervisor::job_control`].
    pub(crate) job_control: bool,
    /// `--overlap buffer-one`: what the holder waits for before PROGRAM (overlap.rs).
    pub(crate) gate: Option<super::overlap::Gate>,
}

impl Job<'_> {
    /// Runs the job to its end here. `signals` are this run's forwarded signals (its own
    /// handlers for `baton run`, a share of the command's for `baton schedule`), `sigchld`
    /// reports PROGRAM's changes.
    pub(crate) async fn run(
        &self,
        sink: &mut Sink,
        signals: &mut Signals,
        sigchld: &mut tokio::signal::unix::Signal,
    ) -> Ended {
        let args = self.args;
        let give_up = give_up_after(args.give_up_after, self.config.retention());
        let rejoin = self.config.rejoin_after_fail();
        let mut worker = self.client.failover().start(self.config.clone());
        // When the server began to fail, by the first retryable error since its last answer
        // (the library's `Reachable` event says when it answers again).
        let mut failing_since: Option<Instant> = None;
        // With --rejoin: how this worker's own failed attempt ended, reported if the job ends
        // without another attempt here.
        let mut ran: Option<Ended> = None;
        loop {
            let give_up_at = failing_since.map(|since| later(since, give_up));
            let event = tokio::select! {
                sig = signals.recv() => {
                    let code = stop_waiting(&mut worker, sink, signal_status(sig)).await;
                    return ran.unwrap_or(Ended::StoppedWaiting(code));
                }
                () = sleep_until_some(give_up_at) => {
                    // Said even with --json, whose events only show the retries.
                    say!(
                        "baton: {}: the server kept failing for {} (--give-up-after); giving up",
                        args.key,
                        human(give_up)
                    );
                    let code = stop_waiting(&mut worker, sink, EX_UNAVAILABLE).await;
                    return Ended::Error(code);
                }
                ev = worker.next() => ev,
            };
            let Some(event) = event else {
                // With --rejoin the stream goes on after this worker's failed attempt only if
                // the worker rejoined; otherwise its end is that attempt's.
                if let Some(ended) = ran {
                    return ended;
                }
                sink.warn("the worker ended unexpectedly");
                return Ended::Error(EX_UNAVAILABLE);
            };
            match &event {
                // Said by the caller, once, with how to run the job again.
                Event::Exhausted { .. } if ran.is_none() => sink.emit_json(&event),
                _ => sink.emit(&event),
            }
            match event {
                Event::Acquired(acquired) => {
                    failing_since = None;
                    let mut holder = Holder {
                        job: self,
                        worker: &mut worker,
                        sink,
                        signals,
                        sigchld,
                    };
                    let ended = holder.hold(acquired).await;
                    match ended {
                        // The worker rejoined as a backup (`drain` stopped at `Rejoined`) or
                        // ended (the next read says so): read on either way.
                        Ended::Failed(_) if rejoin => ran = Some(ended),
                        // A signal ends the whole run, even when the worker rejoined.
                        Ended::Signalled(_) if rejoin => {
                            stop_waiting(&mut worker, sink, 0).await;
                            return ended;
                        }
                        _ => return ended,
                    }
                }
                Event::Error {
                    retryable: true, ..
                } => {
                    failing_since.get_or_insert_with(Instant::now);
                }
                Event::Error { kind, message, .. } => {
                    if args.json {
                        say!("baton: {}", text::reword(&message));
                    }
                    return Ended::Error(exit_for(kind));
                }
                Event::Completed { .. } => return Ended::DoneElsewhere,
                // Every attempt failed; if the last one ran here, its status says more.
                Event::Exhausted { attempts } => return ran.unwrap_or(Ended::Exhausted(attempts)),
                Event::Stopped => return ran.unwrap_or(Ended::StoppedWaiting(130)),
                // Both come from an answer of the server.
                Event::Reachable { .. } | Event::Locked { .. } => failing_since = None,
                _ => {}
            }
        }
    }
}

/// How long a waiting run rides out a failing server: --give-up-after, but never so long that
/// the job's DONE could have come and gone unseen. DONE is kept `retention` after it is
/// written, at the earliest after the last answer this worker saw; the outage's clock starts a
/// little after that answer (the failing request's timeout, a backoff), which the quarter of
/// the retention left over covers (at least half a lease: retention is two leases or more).
pub(crate) fn give_up_after(flag: Duration, retention: Duration) -> Duration {
    flag.min(retention / 4 * 3)
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Stops a waiting worker, reads its remaining events, and returns `code`.
pub(crate) async fn stop_waiting(worker: &mut baton::Worker, sink: &mut Sink, code: u8) -> u8 {
    worker.stop();
    drain(worker, sink).await;
    code
}

/// Reads the worker's events until the stream ends (bounded), or until the worker rejoins as
/// a backup after its failed attempt (`--rejoin`): what follows that belongs to the next wait,
/// which [`Job::run`] reads.
pub(crate) async fn drain(worker: &mut baton::Worker, sink: &mut Sink) -> Option<Event> {
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, worker.next()).await {
        sink.emit(&ev);
        let rejoined = matches!(ev, Event::Rejoined { .. });
        last = Some(ev);
        if rejoined {
            break;
        }
    }
    last
}

/// `baton run`'s lease: a failover attempt, reported by the worker's events.
pub(crate) struct RunLease<'a> {
    job: &'a Job<'a>,
    worker: &'a mut baton::Worker,
    attempt: u64,
    /// The attempt's handle, for its confirmed deadline as the watchdog moves it.
    handle: baton::AttemptHandle,
    /// An ended stream answers `None` at once, forever: stop polling it, or the supervision
    /// loop would spin and starve the runtime of the SIGCHLD that reports PROGRAM's exit.
    events_ended: bool,
    /// The worker said `Rejoined` while PROGRAM ran: its lease was lost and it waits as a
    /// backup again (`--rejoin`). What it says next belongs to the next wait, which
    /// [`Job::run`] reads: the attempt's end must not drain it.
    rejoined: bool,
}

impl Lease for RunLease<'_> {
    fn confirmed_deadline(&self) -> Instant {
        self.handle.lease_deadline()
    }

    async fn lost(&mut self, sink: &mut Sink) -> Loss {
        loop {
            if self.events_ended {
                return std::future::pending().await;
            }
            // Cancel safe: `Worker::next` is, and nothing else awaits here.
            let Some(ev) = self.worker.next().await else {
                self.events_ended = true;
                continue;
            };
            sink.emit(&ev);
            let now = Instant::now();
            match ev {
                // No watchdog: the lease is about to end; PROGRAM must stop now.
                Event::DeadlinePassed { .. } => {
                    return Loss {
                        term: false,
                        kill_at: now,
                    }
                }
                // The lease has ended (or belongs to someone else): stop at once. With
                // --rejoin a lost lease reads `Rejoined` (the worker waits as a backup again).
                Event::LeaseLost { .. }
                | Event::Error {
                    retryable: false, ..
                } => {
                    return Loss {
                        term: true,
                        kill_at: now,
                    }
                }
                Event::Rejoined { .. } => {
                    self.rejoined = true;
                    return Loss {
                        term: true,
                        kill_at: now,
                    };
                }
                _ => {}
            }
        }
    }

    async fn still_held(&mut self, away: Duration) -> Result<(), String> {
        let attempt = self.attempt;
        let lost = |what: String| Err(format!("{what} while baton was stopped ({})", human(away)));
        let status = tokio::time::timeout(
            LEASE_CHECK_TIMEOUT,
            self.job
                .client
                .failover()
                .job_status(self.job.config.clone()),
        )
        .await;
        match status {
            Ok(Ok(s)) => match s.state {
                // Attempt numbers are granted once: a live lease on ours is ours.
                JobState::Attempt {
                    number,
                    holder: Some(_),
                    ..
                } if number == attempt => Ok(()),
                JobState::Attempt { number, .. } if number == attempt => {
                    lost("the lease ran out".into())
                }
                other => lost(format!("attempt {attempt} ended (the job is now {other})")),
            },
            // Redis cannot tell now. With the watchdog the lease was extended at most a third of it
            // before the stop: half a lease later it surely still runs, and the worker's next
            // extension settles the rest.
            _ if away < self.job.args.lease / 2 => Ok(()),
            Ok(Err(e)) => lost(format!(
                "the lease could not be confirmed ({})",
                text::error_message(&e)
            )),
            Err(_) => lost("the lease could not be confirmed (no answer from redis)".into()),
        }
    }
}

pub(crate) struct Holder<'a> {
    job: &'a Job<'a>,
    worker: &'a mut baton::Worker,
    sink: &'a mut Sink,
    signals: &'a mut Signals,
    sigchld: &'a mut tokio::signal::unix::Signal,
}

impl Holder<'_> {
    /// `--overlap buffer-one`: holding the occurrence, waits for the earlier one to end
    /// before PROGRAM (the watchdog keeps the lease). `None`: run PROGRAM now. A signal ends
    /// the wait as a waiting backup's (the attempt is failed: a backup takes over, nothing ran
    /// here); the window closing first settles the occurrence unrun (its job DONE, recorded
    /// skipped_overlap, so no backup runs it).
    async fn wait_at_gate(
        &mut self,
        gate: &super::overlap::Gate,
        acquired: &baton::Acquired,
    ) -> Option<Ended> {
        let job = self.job;
        self.sink.note(&format!(
            "occurrence {} waits for occurrence {} to end (--overlap buffer-one)",
            gate.occurrence.id(),
            gate.behind.id
        ));
        let failover = job.client.failover();
        let wait = failover.wait_out_occurrence(&job.config, &gate.occurrence, &gate.behind);
        let ended = tokio::select! {
            sig = self.signals.recv() => {
                let _ = acquired
                    .handle
                    .clone()
                    .fail(format!("baton got {} while waiting for an earlier occurrence", signal_name(sig)))
                    .await;
                Ended::StoppedWaiting(signal_status(sig))
            }
            _ = acquired.handle.lost_error() => Ended::Failed(EX_LOST),
            r = wait => match r {
                Ok(baton::WaitedOut::WindowClosed) => {
                    let settled = acquired
                        .handle
                        .clone()
                        .done_settled(baton::RecordedOutcome::SkippedOverlap)
                        .await;
                    match settled {
                        Ok(()) => Ended::SkippedOverlap,
                        Err(e) => {
                            say!(
                                "baton: the skipped occurrence could not be settled: {}",
                                text::error_message(&e)
                            );
                            Ended::Failed(EX_LOST)
                        }
                    }
                }
                _ => return None,
            },
        };
        drain(self.worker, self.sink).await;
        Some(ended)
    }

    async fn hold(&mut self, acquired: baton::Acquired) -> Ended {
        let job = self.job;
        let args = job.args;
        let tty = job.tty;
        let mut env = vec![
            ("BATON_KEY", args.key.clone()),
            // The job's key: --key, or an occurrence's KEY@DIGEST@TICK under a schedule.
            ("BATON_JOB", job.config.key().to_string()),
            ("BATON_ATTEMPT", acquired.attempt.to_string()),
            ("BATON_LAST_ATTEMPT", acquired.last.to_string()),
            ("BATON_FENCING_TOKEN", acquired.fencing_token.to_string()),
        ];
        env.extend(job.env.iter().cloned());
        if let Some(gate) = &job.gate {
            if let Some(ended) = self.wait_at_gate(gate, &acquired).await {
                return ended;
            }
        }
        let mut program = match spawn(&args.program, &env, tty) {
            Ok(p) => p,
            Err(e) => {
                let code = spawn_failed(&args.program, &e, tty);
                let _ = acquired.fail(format!("cannot execute PROGRAM: {e}")).await;
                drain(self.worker, self.sink).await;
                return Ended::Failed(code);
            }
        };
        let now = Instant::now();
        let far = later(now, FAR);
        // Without the watchdog the lease ends --lease after the grant's EXEC was sent: the
        // worker computed that instant (`grant_deadline`, a little early) when the grant came
        // back, so any time between that and this point is already counted. PROGRAM must be
        // gone by then: SIGTERM kill_grace (at most a quarter lease) before, SIGKILL at it.
        let lease_end = args.no_watchdog.then_some(acquired.grant_deadline());
        // The grant's send time (as early as the deadline errs): --max-hold counts from it.
        let granted = acquired
            .grant_deadline()
            .checked_sub(args.lease)
            .unwrap_or(now);
        let mut term_at = match lease_end {
            Some(end) => end
                .checked_sub(args.kill_grace.min(args.lease / 4))
                .unwrap_or(end),
            None => far,
        };
        let mut why_text = String::from("deadline passed");
        if let Some(max_hold) = args.max_hold {
            let at = later(granted, max_hold);
            if at < term_at {
                term_at = at;
                why_text = format!("--max-hold of {} reached", human(max_hold));
            }
        }
        let mut lease = RunLease {
            job,
            worker: self.worker,
            attempt: acquired.attempt,
            handle: acquired.handle.clone(),
            events_ended: false,
            rejoined: false,
        };
        let mut supervisor = Supervisor {
            sink: self.sink,
            signals: self.signals,
            sigchld: self.sigchld,
            kill_grace: args.kill_grace,
            lease_end,
            lease: args.lease,
            job_control: job.job_control,
        };
        let Supervised {
            status,
            stopping,
            why: why_text,
            ..
        } = supervisor
            .supervise(&mut program, &mut lease, term_at, why_text)
            .await;
        let rejoined = lease.rejoined;
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                say!("baton: lost track of PROGRAM: {e}");
                let _ = acquired.fail(format!("lost track of PROGRAM: {e}")).await;
                if !rejoined {
                    drain(self.worker, self.sink).await;
                }
                return Ended::Failed(EX_LOST);
            }
        };
        let code = exit_code(&status);
        // PROGRAM's status or signal, for the attempt's end in the schedule's record.
        let exit = match (status.code(), status.signal()) {
            (Some(n), _) => Some(baton::Exit::Status(n)),
            (None, Some(sig)) => Some(baton::Exit::Signal(sig)),
            (None, None) => None,
        };
        if let Some(exit) = exit {
            acquired.handle.set_exit(exit);
        }
        let ended = match stopping {
            Some(Stopping::Lost) => {
                let _ = acquired.fail(why_text).await;
                Ended::Failed(EX_LOST)
            }
            Some(Stopping::Signal(sig)) => {
                let _ = acquired
                    .fail(format!("baton got {}", signal_name(sig)))
                    .await;
                Ended::Signalled(sig)
            }
            None if status.success() => match acquired.done().await {
                Ok(()) => Ended::Done,
                Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                    say!(
                        "baton: PROGRAM succeeded, but whether that was recorded is unknown: the \
                         job may or may not be DONE (see `baton status`): {}",
                        text::error_message(&e)
                    );
                    Ended::Failed(EX_LOST)
                }
                Err(e) => {
                    say!(
                        "baton: PROGRAM succeeded but the success could not be recorded: {}",
                        text::error_message(&e)
                    );
                    Ended::Failed(EX_LOST)
                }
            },
            None => {
                let reason = format!("PROGRAM exited with status {code}");
                match acquired.fail(reason).await {
                    Ok(()) | Err(baton::Error::LeaseLost { .. }) => {}
                    Err(e) => say!(
                        "baton: the failure could not be recorded: {}",
                        text::error_message(&e)
                    ),
                }
                Ended::Failed(code)
            }
        };
        if !rejoined {
            drain(self.worker, self.sink).await;
        }
        ended
    }
}
