//! `baton run`: wait for an attempt of the job, run PROGRAM under it, record DONE or the
//! failure. The failover worker decides; this file turns its events into PROGRAM's life and
//! baton's exit status.

use std::time::Duration;

use baton::{Client, ErrorKind, Event, FailoverConfig, JobState};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::cli::RunArgs;
use super::exit::{
    exit_code, exit_for, usage, usage_config, EX_EXHAUSTED, EX_LOST, EX_UNAVAILABLE,
};
use super::held::{Lease, Loss};
use super::program::{in_foreground, spawn, spawn_failed};
use super::signals::{install_signals, signal_name, signal_status, Signals};
use super::sink::Sink;
use super::supervisor::{later, Stopping, Supervised, Supervisor, FAR};
use super::text::{self, human};
use super::LEASE_CHECK_TIMEOUT;

/// Builds and checks `run`'s job configuration and opens its events file.
pub(crate) fn config(args: &RunArgs, prefix: &str) -> Result<(FailoverConfig, Sink), u8> {
    let mut builder = FailoverConfig::builder(args.key.clone())
        .prefix(prefix)
        .lease(args.lock_timeout)
        .max_attempts(args.max_attempts)
        .retention(args.retention)
        .keepalive(!args.no_keepalive)
        .retry_delay(args.retry_delay);
    if let Some(name) = &args.name {
        builder = builder.worker_name(name.clone());
    }
    // Validate --max-run with the library's rules, but enforce it here: PROGRAM must be stopped
    // *before* the attempt is released, which only this process can do.
    builder
        .clone()
        .max_run(args.max_run)
        .build()
        .map_err(|e| usage_config(&e))?;
    let config = builder.build().map_err(|e| usage_config(&e))?;
    let file = match &args.events {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| usage(format!("cannot open {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let sink = Sink {
        json: args.json,
        file,
        verbose: args.verbose,
        key: args.key.clone(),
    };
    Ok((config, sink))
}

pub(crate) async fn run(
    client: &Client,
    args: &RunArgs,
    config: FailoverConfig,
    mut sink: Sink,
) -> u8 {
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut worker = client.failover().start(config.clone());
    let mut failing_since: Option<Instant> = None;
    loop {
        let event = tokio::select! {
            sig = signals.recv() => {
                return stop_waiting(&mut worker, &mut sink, signal_status(sig)).await;
            }
            ev = worker.next() => ev,
        };
        let Some(event) = event else {
            eprintln!("baton: the worker ended unexpectedly");
            return EX_UNAVAILABLE;
        };
        sink.emit(&event);
        match event {
            Event::Acquired(acquired) => {
                let mut holder = Holder {
                    args,
                    client,
                    config: &config,
                    worker: &mut worker,
                    sink: &mut sink,
                    signals: &mut signals,
                    sigchld: &mut sigchld,
                };
                return holder.hold(acquired).await;
            }
            Event::Error {
                retryable: true, ..
            } => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(5) {
                    eprintln!("baton: {}: redis keeps failing; giving up", args.key);
                    return stop_waiting(&mut worker, &mut sink, EX_UNAVAILABLE).await;
                }
            }
            Event::Error { kind, message, .. } => {
                if args.json {
                    eprintln!("baton: {}", text::reword(&message));
                }
                return exit_for(kind);
            }
            Event::Completed { .. } => return 0,
            Event::Exhausted { .. } => return EX_EXHAUSTED,
            Event::Stopped => return 130,
            Event::Locked { .. } | Event::Status { .. } => failing_since = None,
            _ => {}
        }
    }
}

/// Stops a waiting worker, reads its remaining events, and returns `code`.
pub(crate) async fn stop_waiting(worker: &mut baton::Worker, sink: &mut Sink, code: u8) -> u8 {
    worker.stop();
    drain(worker, sink).await;
    code
}

/// Reads the worker's events until the stream ends (bounded).
pub(crate) async fn drain(worker: &mut baton::Worker, sink: &mut Sink) -> Option<Event> {
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, worker.next()).await {
        sink.emit(&ev);
        last = Some(ev);
    }
    last
}

/// `baton run`'s lease: a failover attempt, reported by the worker's events.
pub(crate) struct RunLease<'a> {
    args: &'a RunArgs,
    client: &'a Client,
    config: &'a FailoverConfig,
    worker: &'a mut baton::Worker,
    attempt: u64,
    /// An ended stream answers `None` at once, forever: stop polling it, or the supervision
    /// loop would spin and starve the runtime of the SIGCHLD that reports PROGRAM's exit.
    events_ended: bool,
}

impl Lease for RunLease<'_> {
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
                // No keepalive: the lease is about to end; PROGRAM must stop now.
                Event::DeadlinePassed { .. } => {
                    return Loss {
                        term: false,
                        kill_at: now,
                    }
                }
                // The lease has ended (or belongs to someone else): stop at once.
                Event::LeaseLost { .. }
                | Event::Error {
                    retryable: false, ..
                } => {
                    return Loss {
                        term: true,
                        kill_at: now,
                    }
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
            self.client.failover().job_status(self.config.clone()),
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
            // Redis cannot tell now. With keepalive the lease was extended at most a third of it
            // before the stop: half a lease later it surely still runs, and the worker's next
            // extension settles the rest.
            _ if away < self.args.lock_timeout / 2 => Ok(()),
            Ok(Err(e)) => lost(format!(
                "the lease could not be confirmed ({})",
                text::error_message(&e)
            )),
            Err(_) => lost("the lease could not be confirmed (no answer from redis)".into()),
        }
    }
}

pub(crate) struct Holder<'a> {
    args: &'a RunArgs,
    client: &'a Client,
    config: &'a FailoverConfig,
    worker: &'a mut baton::Worker,
    sink: &'a mut Sink,
    signals: &'a mut Signals,
    sigchld: &'a mut tokio::signal::unix::Signal,
}

impl Holder<'_> {
    async fn hold(&mut self, acquired: baton::Acquired) -> u8 {
        let args = self.args;
        let tty = in_foreground();
        let env = [
            ("BATON_KEY", args.key.clone()),
            ("BATON_ATTEMPT", acquired.attempt.to_string()),
            ("BATON_LAST_ATTEMPT", acquired.last.to_string()),
            ("BATON_FENCING_TOKEN", acquired.fencing_token.to_string()),
        ];
        let mut program = match spawn(&args.program, &env, tty) {
            Ok(p) => p,
            Err(e) => {
                let code = spawn_failed(&args.program, &e, tty);
                let _ = acquired.fail(format!("cannot execute PROGRAM: {e}")).await;
                drain(self.worker, self.sink).await;
                return code;
            }
        };
        let now = Instant::now();
        let far = later(now, FAR);
        // Without keepalive the lease ends lock_timeout after the grant's EXEC was sent: the
        // worker computed that instant (`lease_deadline`, a little early) when the grant came
        // back, so any time between that and this point is already counted. PROGRAM must be
        // gone by then: SIGTERM kill_grace (at most a quarter lease) before, SIGKILL at it.
        let lease_end = args.no_keepalive.then_some(acquired.lease_deadline);
        // The grant's send time (as early as the deadline errs): --max-run counts from it.
        let granted = acquired
            .lease_deadline
            .checked_sub(args.lock_timeout)
            .unwrap_or(now);
        let mut term_at = match lease_end {
            Some(end) => end
                .checked_sub(args.kill_grace.min(args.lock_timeout / 4))
                .unwrap_or(end),
            None => far,
        };
        let mut why_text = String::from("deadline passed");
        if let Some(max_run) = args.max_run {
            let at = later(granted, max_run);
            if at < term_at {
                term_at = at;
                why_text = format!("--max-run of {} reached", human(max_run));
            }
        }
        let mut lease = RunLease {
            args,
            client: self.client,
            config: self.config,
            worker: self.worker,
            attempt: acquired.attempt,
            events_ended: false,
        };
        let mut supervisor = Supervisor {
            sink: self.sink,
            signals: self.signals,
            sigchld: self.sigchld,
            kill_grace: args.kill_grace,
            lease_end,
        };
        let Supervised {
            status,
            stopping,
            why: why_text,
            ..
        } = supervisor
            .supervise(&mut program, &mut lease, term_at, why_text)
            .await;
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                eprintln!("baton: lost track of PROGRAM: {e}");
                let _ = acquired.fail(format!("lost track of PROGRAM: {e}")).await;
                drain(self.worker, self.sink).await;
                return EX_LOST;
            }
        };
        let code = exit_code(&status);
        match stopping {
            Some(Stopping::Lost) => {
                let _ = acquired.fail(why_text).await;
                drain(self.worker, self.sink).await;
                EX_LOST
            }
            Some(Stopping::Signal(sig)) => {
                let _ = acquired
                    .fail(format!("baton got {}", signal_name(sig)))
                    .await;
                drain(self.worker, self.sink).await;
                signal_status(sig)
            }
            None if status.success() => match acquired.done().await {
                Ok(()) => {
                    drain(self.worker, self.sink).await;
                    0
                }
                Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                    eprintln!(
                        "baton: PROGRAM succeeded, but whether that was recorded is unknown: the \
                         job may or may not be DONE (see `baton status`): {}",
                        text::error_message(&e)
                    );
                    drain(self.worker, self.sink).await;
                    EX_LOST
                }
                Err(e) => {
                    eprintln!(
                        "baton: PROGRAM succeeded but the success could not be recorded: {}",
                        text::error_message(&e)
                    );
                    drain(self.worker, self.sink).await;
                    EX_LOST
                }
            },
            None => {
                let reason = format!("PROGRAM exited with status {code}");
                match acquired.fail(reason).await {
                    Ok(()) | Err(baton::Error::LeaseLost { .. }) => {}
                    Err(e) => eprintln!(
                        "baton: the failure could not be recorded: {}",
                        text::error_message(&e)
                    ),
                }
                drain(self.worker, self.sink).await;
                code
            }
        }
    }
}
