//! `baton schedule`: the long-running form of a scheduled `baton run`, one per server. At every
//! tick (by the server's clock) it runs that occurrence's job exactly as `baton run --every …`
//! would (holder or backup, PROGRAM supervised the same way, by the same code: [`Job`]), then
//! waits for the next tick. Occurrences run at once in this process when one outlasts the gap
//! to the next tick (each is a job of its own), up to --max-concurrent, unless --overlap
//! `skip` or `buffer-one` (decided fleet-wide by the library, after the pause is read:
//! overlap.rs). With --jitter an occurrence's job starts at its tick plus its jitter, by the
//! server's clock (the tick still decides which occurrence it is, and when --max-concurrent
//! looks).
//! Every --trigger-poll it reads the key's pending triggers (`baton trigger`) and starts each
//! manual occurrence it has not started yet the same way (no jitter; trigger.rs).
//!
//! Why not the library's `Failover::schedule`: its work is a closure run under
//! `Failover::run`, while PROGRAM's supervision here is driven by the worker's events (the
//! watchdog's loss, the deadline, job control), which `Job` already does for `baton run`. The
//! calendar, the binding to the server's clock and the wait for a tick are the library's.
//!
//! Signals: the command holds the one set of handlers and fans each signal out ([`Fan`]) to
//! every running occurrence, which handles it as `baton run` does (a waiting backup stops
//! waiting; a holder forwards it to PROGRAM and fails its attempt), and stops waiting for
//! ticks. It exits once every occurrence has ended: 0 when none of their attempts was failed by
//! the signal (nothing was running here), else the signal's status as `baton run` exits.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use baton::{Client, FailoverConfig, JobState, Occurrence, Schedule};
use tokio::signal::unix::{signal, SignalKind};

use super::cli::{CatchUpArg, ScheduleArgs};
use super::exit::{EX_UNAVAILABLE, EX_USAGE};
use super::out;
use super::run::{occurrence_env, patiently, record_options, Ended, Jittered, Job};
use super::signals::{signal_name, signal_status, Fan, Signals};
use super::sink::{Bound, Sink};
use super::text::{self, human};

/// How long to wait before reading the server's clock again after it could not be read, and
/// before running again an occurrence whose coordination failed.
const CLOCK_RETRY: Duration = Duration::from_secs(1);

/// How one occurrence ended on this server, as its report line says.
pub(crate) enum Outcome {
    /// It ran as a job here (or waited for one): how that ended.
    Ran(Ended),
    /// `--max-concurrent`: this many occurrences still ran here at its tick.
    Full(usize),
    /// `--catch-up last` found it already DONE or EXHAUSTED.
    Found(JobState),
}

/// An occurrence's run in this process, and what it reports when it ends.
type Run<'a> = Pin<Box<dyn Future<Output = (Occurrence, String, Ended)> + 'a>>;

/// The occurrences running in this process at once: one per tick that came while earlier ones
/// ran (or waited as backups), at most `--max-concurrent` of them.
/// Polled together by the command's one task, so they share its thread (PROGRAM is forked from
/// it, see main.rs) and its signal handlers.
#[derive(Default)]
struct Runs<'a>(Vec<Run<'a>>);

impl<'a> Runs<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// The next occurrence to end. Cancel safe: a run is removed only when it has ended.
    async fn next(&mut self) -> (Occurrence, String, Ended) {
        std::future::poll_fn(|cx| {
            for i in 0..self.0.len() {
                if let Poll::Ready(done) = self.0[i].as_mut().poll(cx) {
                    drop(self.0.swap_remove(i));
                    return Poll::Ready(done);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// What every occurrence's run shares.
struct Command<'a> {
    client: &'a Client,
    args: &'a ScheduleArgs,
    config: FailoverConfig,
    schedule: Schedule,
    fan: Fan,
    /// `--catch-up all`: ticks at or before this are the catch-up's, run as a backfill runs
    /// them (their outcome kept for the record's lifetime).
    backfill_until: std::cell::Cell<Option<SystemTime>>,
}

pub(crate) async fn schedule(
    client: &Client,
    args: &ScheduleArgs,
    config: FailoverConfig,
    schedule: Schedule,
    mut sink: Sink,
) -> u8 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            say!("baton: cannot install signal handlers: {e}");
            return EX_UNAVAILABLE;
        }
    };
    let key = args.run.key.as_str();
    warn_long_lease(&mut sink, &schedule, args.run.lease);
    let cmd = Command {
        client,
        args,
        config,
        schedule,
        fan: Fan::new(),
        backfill_until: std::cell::Cell::new(None),
    };
    let mut runs = Runs::default();
    let mut last: Option<SystemTime> = None;
    // `--catch-up all`: the window's ticks still to run, one after another (the one running
    // is `catching`), beside the next ticks.
    let mut catch_up: std::collections::VecDeque<Occurrence> = Default::default();
    let mut catching: Option<SystemTime> = None;

    let stop = 'ticks: {
        if args.catch_up != CatchUpArg::None {
            // Tried until it can be checked, as the library's `CatchUp::Last` does: a server
            // unreachable at start is when catching up matters most (every server may have
            // been down at the tick).
            let mut failing = false;
            let found = loop {
                let found = tokio::select! {
                    sig = signals.recv() => break 'ticks sig,
                    f = cmd.catch_up_plan() => f,
                };
                match found {
                    Err(e) if e.is_retryable() => {
                        if !failing {
                            tell!(
                                "baton: {key}: the latest past tick cannot be checked yet ({}); \
                                 trying again every {}",
                                text::error_message(&e),
                                human(CLOCK_RETRY)
                            );
                        }
                        failing = true;
                        tokio::select! {
                            sig = signals.recv() => break 'ticks sig,
                            () = tokio::time::sleep(CLOCK_RETRY) => {}
                        }
                    }
                    other => break other,
                }
            };
            match found {
                Ok(plan) if args.catch_up == CatchUpArg::All => {
                    last = plan.newest_tick();
                    cmd.backfill_until.set(last);
                    sink.note(&format!(
                        "catching up {} occurrence(s) of the last {}, oldest first ({} settled \
                         on record, {} skipped while paused not caught up)",
                        plan.run.len(),
                        human(args.catch_up_window.unwrap_or_default()),
                        plan.settled.len(),
                        plan.paused.len()
                    ));
                    catch_up.extend(plan.run);
                    while let Some(next) = catch_up.pop_front() {
                        let tick = next.tick();
                        if let Some(run) = cmd.start(&mut sink, next) {
                            catching = Some(tick);
                            runs.0.push(run);
                            break;
                        }
                    }
                }
                Ok(plan) => {
                    last = plan.newest_tick();
                    for (occurrence, outcome) in &plan.settled {
                        let state = match outcome {
                            baton::RecordedOutcome::Exhausted => JobState::Exhausted,
                            _ => JobState::Done,
                        };
                        let job = occurrence.job_key(key);
                        report(&mut sink, occurrence, &job, Outcome::Found(state));
                    }
                    for occurrence in &plan.paused {
                        sink.note(&format!(
                            "occurrence {} was skipped while paused: not caught up",
                            occurrence.id()
                        ));
                    }
                    for occurrence in plan.run {
                        if let Some(run) = cmd.start(&mut sink, occurrence) {
                            runs.0.push(run);
                        }
                    }
                }
                Err(e) => sink.warn(&format!(
                    "the latest past tick could not be checked ({}); not caught up",
                    text::error_message(&e)
                )),
            }
        }
        let verbose = sink.verbose >= 1 && !sink.json;
        let mut due = Box::pin(cmd.next_due(last, verbose));
        // Manual occurrences (`baton trigger`): read every --trigger-poll, each started once.
        let poll_triggers = |poll, failing, every| {
            Box::pin(super::trigger::next_triggers(
                client,
                cmd.config.clone(),
                poll,
                every,
                failing,
            ))
        };
        let mut triggers = poll_triggers(baton::TriggerPoll::new(), false, Duration::ZERO);
        loop {
            tokio::select! {
                // Ended runs before a due tick: `--max-concurrent` must not count one that has
                // ended as still running.
                biased;
                sig = signals.recv() => break 'ticks sig,
                (occurrence, job, ended) = runs.next(), if !runs.is_empty() => {
                    report(&mut sink, &occurrence, &job, Outcome::Ran(ended));
                    if ended == Ended::Error(EX_UNAVAILABLE) && can_still_run(&occurrence) {
                        // The server kept failing past --give-up-after, but the occurrence is
                        // still the current one: run it again (a backup elsewhere may have
                        // done it meanwhile; its state says so).
                        sink.note(&format!(
                            "occurrence {} can still run; trying again in {}",
                            occurrence.id(),
                            human(CLOCK_RETRY)
                        ));
                        if let Some(run) = cmd.start_after(&mut sink, occurrence, CLOCK_RETRY) {
                            runs.0.push(run);
                        }
                    } else if catching == Some(occurrence.tick()) {
                        // `--catch-up all`: the next of the window, once this one ended.
                        catching = None;
                        while let Some(next) = catch_up.pop_front() {
                            let tick = next.tick();
                            if let Some(run) = cmd.start(&mut sink, next) {
                                catching = Some(tick);
                                runs.0.push(run);
                                break;
                            }
                        }
                    }
                }
                (poll, failing, manual) = &mut triggers => {
                    triggers = poll_triggers(poll, failing, args.trigger_poll);
                    for occurrence in manual {
                        // As a tick: the pause, the record, the coordination (no jitter).
                        if let Some(run) = cmd.start(&mut sink, occurrence) {
                            runs.0.push(run);
                        }
                    }
                }
                occurrence = &mut due => {
                    last = Some(occurrence.tick());
                    due = Box::pin(cmd.next_due(last, verbose));
                    let most = usize::try_from(args.max_concurrent).unwrap_or(usize::MAX);
                    // --overlap is decided fleet-wide in the run (after its pause is read);
                    // --max-concurrent stays this process's own bound.
                    if runs.len() >= most {
                        let job = occurrence.job_key(key);
                        report(&mut sink, &occurrence, &job, Outcome::Full(runs.len()));
                    } else if let Some(run) = cmd.start(&mut sink, occurrence) {
                        runs.0.push(run);
                    }
                }
            }
        }
    };

    // Stopping: every run got the signal (a share of these handlers); wait for them to end,
    // passing on further signals (a second SIGTERM hurries PROGRAMs as it would under `run`).
    cmd.fan.send(stop);
    sink.note(&format!(
        "got {}; no more ticks, stopping what runs here",
        signal_name(stop)
    ));
    let mut failed_by: Option<libc::c_int> = None;
    while !runs.is_empty() {
        tokio::select! {
            sig = signals.recv() => cmd.fan.send(sig),
            (occurrence, job, ended) = runs.next() => {
                if let Ended::Signalled(sig) = ended {
                    failed_by.get_or_insert(sig);
                }
                report(&mut sink, &occurrence, &job, Outcome::Ran(ended));
            }
        }
    }
    failed_by.map_or(0, signal_status)
}

impl<'a> Command<'a> {
    /// What `--catch-up` runs at start ([`baton::Failover::catch_up_plan`]).
    async fn catch_up_plan(&self) -> Result<baton::BackfillPlan, baton::Error> {
        let catch_up = match self.args.catch_up {
            CatchUpArg::None => baton::CatchUp::None,
            CatchUpArg::Last => baton::CatchUp::Last,
            CatchUpArg::All => baton::CatchUp::All {
                window: self.args.catch_up_window.unwrap_or_default(),
            },
        };
        let history = self
            .args
            .run
            .when
            .history
            .unwrap_or(baton::schedule::DEFAULT_HISTORY);
        self.client
            .failover()
            .catch_up_plan(&self.schedule, &self.config, catch_up, history)
            .await
    }

    /// The next occurrence to run, once its tick has come by the server's clock
    /// ([`baton::Failover::next_occurrence`]: the first tick after `last`, or at start after
    /// now; one woken past its window runs the occurrence a run starting now binds to). Read
    /// errors are said once per outage and retried every second.
    async fn next_due(&self, last: Option<SystemTime>, verbose: bool) -> Occurrence {
        let key = &self.args.run.key;
        let failover = self.client.failover();
        let mut failing = false;
        if verbose {
            // Words for the wait only (the wait reads the clock itself).
            if let Ok(now) = failover.server_time(key).await {
                let next = self
                    .schedule
                    .next_after(last.unwrap_or(now))
                    .and_then(|t| self.schedule.occurrence_of_tick(t));
                if let Some(next) = next {
                    say!(
                        "baton: {key}: next tick {} in {}",
                        next.id(),
                        human(next.until_due(now))
                    );
                }
            }
        }
        loop {
            match failover.next_occurrence(&self.schedule, key, last).await {
                Ok(occurrence) => {
                    if failing {
                        tell!("baton: {key}: the server's clock can be read again");
                    }
                    return occurrence;
                }
                Err(baton::Error::Config(_)) => {
                    say!("baton: {key}: {} has no further tick", self.schedule);
                    return std::future::pending().await;
                }
                Err(e) => {
                    if !failing {
                        tell!(
                            "baton: {key}: cannot read the server's clock ({}); trying again \
                             every {}",
                            text::error_message(&e),
                            human(CLOCK_RETRY)
                        );
                    }
                    failing = true;
                    tokio::time::sleep(CLOCK_RETRY).await;
                }
            }
        }
    }

    /// Starts `occurrence`'s run, or reports why it cannot start (`None`).
    fn start(&'a self, sink: &mut Sink, occurrence: Occurrence) -> Option<Run<'a>> {
        self.start_after(sink, occurrence, Duration::ZERO)
    }

    /// As [`start`](Self::start), the job's run beginning after `delay` (a signal meanwhile
    /// ends it as one while waiting as a backup does: nothing ran here).
    fn start_after(
        &'a self,
        sink: &mut Sink,
        occurrence: Occurrence,
        delay: Duration,
    ) -> Option<Run<'a>> {
        let args = &self.args.run;
        let caught_up = self
            .backfill_until
            .get()
            .is_some_and(|until| occurrence.tick() <= until);
        let config = if caught_up {
            self.config.for_backfill(&occurrence, args.retention)
        } else {
            self.config.for_occurrence(&occurrence, args.retention)
        };
        let config = match config {
            // Recorded as `baton run --every/--cron` records its occurrence.
            Ok(c) => c.with_occurrence_record(
                &args.key,
                &self.schedule,
                &occurrence,
                record_options(&args.when),
            ),
            Err(e) => {
                say!("baton: {}", text::config_message(&e));
                let job = occurrence.job_key(&args.key);
                report(
                    sink,
                    &occurrence,
                    &job,
                    Outcome::Ran(Ended::Error(EX_USAGE)),
                );
                return None;
            }
        };
        let job_key = config.key().to_string();
        // Listened to before PROGRAM exists, so none of its changes can be missed.
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => s,
            Err(e) => {
                say!("baton: cannot install signal handlers: {e}");
                let ended = Ended::Error(EX_UNAVAILABLE);
                report(sink, &occurrence, &job_key, Outcome::Ran(ended));
                return None;
            }
        };
        let mut run_sink = sink.for_occurrence(Bound {
            id: occurrence.id().to_string(),
            job: job_key.clone(),
        });
        let jitter = args.when.jitter.unwrap_or(Duration::ZERO);
        let start = occurrence.jittered_start(&args.key, jitter, args.lease);
        let jittered = args.when.jitter.map(|most| Jittered {
            most,
            j: start.duration_since(occurrence.tick()).unwrap_or_default(),
            room: occurrence.jitter_room(args.lease),
        });
        run_sink.note(&format!(
            "running {}, job {job_key}{}",
            super::trigger::label(&occurrence),
            jittered.map_or_else(String::new, |j| format!(", {}", j.text()))
        ));
        let mut signals = self.fan.subscribe();
        let job = Job {
            client: self.client,
            args,
            env: occurrence_env(&occurrence),
            config,
            // A daemon: PROGRAM never has the terminal, and no occurrence stops the others.
            tty: false,
            job_control: false,
            gate: None,
        };
        Some(Box::pin(async move {
            if !delay.is_zero() {
                tokio::select! {
                    sig = signals.recv() => {
                        return (occurrence, job_key, Ended::StoppedWaiting(signal_status(sig)));
                    }
                    () = tokio::time::sleep(delay) => {}
                }
            }
            if start > occurrence.tick() {
                // As the wait for an attempt: a signal stops it (nothing ran here), and a
                // server that keeps failing past --give-up-after ends it with 69 (run again
                // while the occurrence is still the current one).
                let failover = self.client.failover();
                let waited = patiently(
                    &args.key,
                    "read the server's clock",
                    args.give_up_after,
                    || failover.wait_until(&args.key, start),
                );
                tokio::select! {
                    sig = signals.recv() => {
                        return (occurrence, job_key, Ended::StoppedWaiting(signal_status(sig)));
                    }
                    r = waited => if let Err(code) = r {
                        return (occurrence, job_key, Ended::Error(code));
                    }
                }
            }
            // Paused (`baton pause`): the tick is recorded skipped and nothing runs; the next
            // tick is waited for as always (the cadence is kept, nothing caught up).
            let pause = patiently(
                &args.key,
                "read the schedule's pause",
                args.give_up_after,
                || super::pause::read(self.client, &self.config),
            );
            let pause = tokio::select! {
                sig = signals.recv() => {
                    return (occurrence, job_key, Ended::StoppedWaiting(signal_status(sig)));
                }
                p = pause => p,
            };
            match pause {
                Err(code) => return (occurrence, job_key, Ended::Error(code)),
                Ok(Some(p)) => {
                    let options = record_options(&args.when);
                    super::pause::record_skip(
                        self.client,
                        &self.config,
                        &self.schedule,
                        &options,
                        &occurrence,
                        &p,
                    )
                    .await;
                    super::trigger::settle(self.client, &self.config, &occurrence, Ended::Paused)
                        .await;
                    return (occurrence, job_key, Ended::Paused);
                }
                Ok(None) => {}
            }
            // --overlap: the fleet-wide rule (overlap.rs), then the job (held behind an
            // earlier occurrence under buffer-one).
            let mut job = job;
            let options = record_options(&args.when);
            let admitted = super::overlap::admit(
                self.client,
                (&args.key, args.give_up_after),
                args.when.overlap,
                (&self.schedule, &self.config, &options),
                &occurrence,
            );
            let admitted = tokio::select! {
                sig = signals.recv() => {
                    return (occurrence, job_key, Ended::StoppedWaiting(signal_status(sig)));
                }
                d = admitted => d,
            };
            match admitted {
                Err(code) => return (occurrence, job_key, Ended::Error(code)),
                Ok(super::overlap::Admitted::Skipped(_)) => {
                    let ended = Ended::SkippedOverlap;
                    super::trigger::settle(self.client, &self.config, &occurrence, ended).await;
                    return (occurrence, job_key, ended);
                }
                Ok(super::overlap::Admitted::Run(gate)) => job.gate = gate,
            }
            let ended = job.run(&mut run_sink, &mut signals, &mut sigchld).await;
            super::trigger::settle(self.client, &self.config, &occurrence, ended).await;
            (occurrence, job_key, ended)
        }))
    }
}

/// Whether `occurrence` is still the one a run starting now binds to (its next tick has not
/// come by this host's clock): then a run of it that could not coordinate is worth another
/// try. Past that, the next occurrence is due and runs on its own.
fn can_still_run(occurrence: &Occurrence) -> bool {
    occurrence
        .next_tick()
        .is_some_and(|next| SystemTime::now() < next)
}

/// Warns when a holder that dies would keep its occurrence past the next tick: allowed (each
/// occurrence is a job of its own), but rarely meant.
fn warn_long_lease(sink: &mut Sink, schedule: &Schedule, lease: Duration) {
    let Some(occurrence) = schedule.occurrence_at(SystemTime::now()) else {
        return;
    };
    let Some(gap) = occurrence
        .next_tick()
        .and_then(|n| n.duration_since(occurrence.tick()).ok())
    else {
        return;
    };
    if lease > gap {
        sink.caution(&format!(
            "--lease ({}) is longer than the gap between ticks ({}): a holder that dies \
             keeps its occurrence past the next tick, which runs beside it",
            human(lease),
            human(gap)
        ));
    }
}

/// The one line per occurrence: its tick, its job and how it ended here.
pub(crate) fn report(sink: &mut Sink, occurrence: &Occurrence, job: &str, outcome: Outcome) {
    let (name, status, what) = match outcome {
        Outcome::Ran(Ended::Done) => ("done", Some(0), "ran here: done".to_string()),
        Outcome::Ran(Ended::Failed(code)) => (
            "failed",
            Some(code),
            format!("ran here: failed with status {code}"),
        ),
        Outcome::Ran(Ended::Signalled(sig)) => (
            "stopped",
            Some(signal_status(sig)),
            format!(
                "ran here: stopped by {} (the attempt is failed; a backup takes over)",
                signal_name(sig)
            ),
        ),
        Outcome::Ran(Ended::DoneElsewhere) => ("done_elsewhere", None, "done elsewhere".into()),
        Outcome::Ran(Ended::Exhausted(attempts)) => (
            "exhausted",
            None,
            match attempts {
                Some(n) => format!("exhausted after {}; nothing ran here", text::attempts(n)),
                None => "exhausted; nothing ran here".into(),
            },
        ),
        Outcome::Ran(Ended::StoppedWaiting(_)) => (
            "stopped_waiting",
            None,
            "stopped while waiting as a backup (nothing ran here)".into(),
        ),
        Outcome::Ran(Ended::Error(code)) => {
            ("error", Some(code), format!("error (exit status {code})"))
        }
        Outcome::Ran(Ended::Paused) => (
            "skipped_paused",
            None,
            "skipped: the schedule is paused (`baton resume`)".into(),
        ),
        Outcome::Ran(Ended::SkippedOverlap) => (
            "skipped_overlap",
            None,
            "skipped: earlier occurrences still ran in the fleet (--overlap)".into(),
        ),
        Outcome::Full(n) => (
            "skipped",
            None,
            format!("skipped: {n} earlier occurrences still run here (--max-concurrent)"),
        ),
        Outcome::Found(JobState::Exhausted) => (
            "exhausted",
            None,
            "exhausted already (not caught up)".into(),
        ),
        Outcome::Found(_) => (
            "done_elsewhere",
            None,
            "done already (not caught up)".into(),
        ),
    };
    let value = serde_json::json!({
        "event": "occurrence_ended",
        "occurrence": occurrence.id(),
        "manual": occurrence.is_manual(),
        "job": job,
        "outcome": name,
        "status": status,
    });
    let text = format!("{}, job {job}: {what}", super::trigger::label(occurrence));
    // --quiet keeps what went wrong: a failure, an error, an exhausted occurrence.
    let error = matches!(name, "failed" | "stopped" | "error" | "exhausted");
    if error {
        sink.say_error(value, &text);
    } else {
        sink.say(value, &text);
    }
}
