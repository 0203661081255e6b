//! The supervisor: runs PROGRAM to its end under a lease, whatever the lease (a failover
//! attempt, a lock, a leader's term). It forwards signals, follows job control, stops PROGRAM
//! when the lease is lost or a time limit passes, and stops what PROGRAM left in its group. The
//! commands only say what the lease is ([`Lease`]: a failover attempt in run.rs, any of the
//! library's held leases through [`LockLease`]) and what PROGRAM's end means.

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use std::ffi::OsString;

use baton::HeldLease;

use super::program::{in_foreground, spawn, spawn_failed, Change, Program};
use super::signals::{
    inherited_ignored, is_job_control_stop, recv_or_pending, signal_name, Signals,
};
use super::sink::Sink;
use super::text::human;

/// "Never", for timers that are not armed.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365);

/// How often baton looks (in `/proc`) whether what PROGRAM left running in its group has ended.
pub(crate) const LEFTOVER_POLL: Duration = Duration::from_millis(50);
/// How long after SIGKILL a process of PROGRAM's group may take to be gone before baton stops
/// waiting for it (it exits as soon as it leaves the kernel; one that does not was out of reach).
pub(crate) const KILL_SETTLE: Duration = Duration::from_secs(2);

/// `at + d`, saturating far in the future instead of overflowing.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// Why PROGRAM is being stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopping {
    /// The attempt is lost or out of time: exit 74.
    Lost,
    /// baton got this forwarded signal: exit 128 + n.
    Signal(libc::c_int),
}

/// How PROGRAM's supervision ended.
pub(crate) struct Supervised {
    /// PROGRAM's wait status (`Err`: baton lost track of it).
    pub(crate) status: std::io::Result<std::process::ExitStatus>,
    /// Why baton stopped PROGRAM, if it did.
    pub(crate) stopping: Option<Stopping>,
    /// What to record as the reason of a [`Stopping::Lost`].
    pub(crate) why: String,
    /// Whether PROGRAM's group had the terminal when PROGRAM ended (its SIGINT then most
    /// likely came from Ctrl-C, which reaches PROGRAM's group only).
    pub(crate) had_terminal: bool,
}

/// Runs PROGRAM to its end: forwards signals, follows job control, stops PROGRAM when the lease
/// is lost or a time limit passes. Shared by `baton run` and `baton lock`.
pub(crate) struct Supervisor<'a> {
    pub(crate) sink: &'a mut Sink,
    pub(crate) signals: &'a mut Signals,
    pub(crate) sigchld: &'a mut tokio::signal::unix::Signal,
    /// Time between SIGTERM and SIGKILL when baton stops PROGRAM (signal or time limit).
    pub(crate) kill_grace: Duration,
    /// When the lease ends for sure (--no-watchdog): PROGRAM is dead by then, whatever the grace.
    pub(crate) lease_end: Option<Instant>,
    /// The lease's length (--lease): the guard's SIGTERM lead and
    /// SIGKILL margin before the confirmed deadline depend on it (guard.rs).
    pub(crate) lease: Duration,
    /// Whether baton acts as a shell's job (passes a SIGTSTP for itself on to PROGRAM, and
    /// stops with a PROGRAM stopped by job control). Not for `baton schedule`, a daemon whose
    /// PROGRAMs never have the terminal and run several at once: stopping the whole process
    /// for one of them would stop the others' keepalives.
    pub(crate) job_control: bool,
}

impl Supervisor<'_> {
    /// Watches `program` until it is reaped. `term_at` (SIGTERM, then SIGKILL `kill_grace`
    /// later, never past `lease_end`) stops it for `why`, e.g. a deadline or --max-hold.
    pub(crate) async fn supervise<L: Lease>(
        &mut self,
        program: &mut Program,
        lease: &mut L,
        term_at: Instant,
        why: String,
    ) -> Supervised {
        let far = later(Instant::now(), FAR);
        let lease_end = self.lease_end;
        let mut why_text = why;
        let mut reason = Stopping::Lost;
        let mut kill_at = far;
        let mut stopping: Option<Stopping> = None;
        // Once PROGRAM's leader ended: whether what it left running in its group got SIGTERM,
        // and when the group got SIGKILL (if it did).
        let mut draining = false;
        let mut killed_at: Option<Instant> = None;
        // SIGCHLD reports every change of PROGRAM; this slow tick is only a safety net.
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The guard learns each confirmed deadline (guard.rs): it stops PROGRAM by then even
        // when this process cannot (stopped, blocked, starved). Read often against the lease:
        // a deadline the guard learns late only makes it err early.
        program.send_deadline(lease.confirmed_deadline(), self.kill_grace, self.lease);
        let mut deadlines = tokio::time::interval(
            (self.lease / 20).clamp(Duration::from_millis(5), Duration::from_millis(100)),
        );
        deadlines.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A SIGTSTP for baton itself (Ctrl-Z when stdin is not the terminal, or `kill -TSTP`)
        // goes to PROGRAM: stopping baton alone would let the lease lapse while PROGRAM runs.
        // PROGRAM's stop then stops baton too (below).
        let mut sigtstp = if !self.job_control || inherited_ignored(libc::SIGTSTP) {
            None
        } else {
            signal(SignalKind::from_raw(libc::SIGTSTP)).ok()
        };
        let status = 'watch: loop {
            tokio::select! {
                _ = self.sigchld.recv() => {}
                _ = recheck.tick() => {}
                _ = deadlines.tick(), if !program.ended => {
                    program.send_deadline(lease.confirmed_deadline(), self.kill_grace, self.lease);
                    continue;
                }
                // No SIGCHLD tells of PROGRAM's leftovers ending (they are not baton's children).
                _ = tokio::time::sleep(LEFTOVER_POLL), if program.ended => {}
                loss = lease.lost(self.sink) => {
                    // The lease has ended or is about to: PROGRAM must be gone before it could
                    // pass on. Whatever stopped PROGRAM before, this is now a lost lease; once
                    // PROGRAM ended by itself, its status stands (the lost lease still fails the
                    // record of a success, or the lock's release) and only its leftovers go.
                    if !program.ended {
                        stopping = Some(Stopping::Lost);
                    }
                    if loss.term {
                        program.signal(libc::SIGTERM);
                    }
                    if loss.kill_at <= Instant::now() {
                        program.signal(libc::SIGKILL);
                        killed_at.get_or_insert_with(Instant::now);
                        kill_at = far;
                    } else {
                        kill_at = kill_at.min(loss.kill_at);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(term_at), if stopping.is_none() && !program.ended => {
                    self.sink.note(&format!("stopping PROGRAM: {why_text}"));
                    stopping = Some(reason);
                    program.signal(libc::SIGTERM);
                    kill_at = cap(later(Instant::now(), self.kill_grace), lease_end);
                    continue;
                }
                _ = tokio::time::sleep_until(kill_at) => {
                    program.signal(libc::SIGKILL);
                    killed_at.get_or_insert_with(Instant::now);
                    kill_at = far;
                    continue;
                }
                _ = recv_or_pending(&mut sigtstp) => {
                    if stopping.is_none() && !program.ended {
                        program.signal(libc::SIGTSTP);
                    }
                    continue;
                }
                sig = self.signals.recv() => {
                    if program.ended {
                        // PROGRAM's status is settled; the signal only hurries its leftovers.
                        self.sink.note(&format!(
                            "got {}; forwarding it to what PROGRAM left running",
                            signal_name(sig)
                        ));
                        program.signal(sig);
                        kill_at =
                            kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                        continue;
                    }
                    self.sink.note(&format!("got {}; forwarding it to PROGRAM", signal_name(sig)));
                    reason = Stopping::Signal(sig);
                    // A lost lease stays the reason: PROGRAM is already being killed for it.
                    if stopping != Some(Stopping::Lost) {
                        stopping = Some(reason);
                    }
                    program.signal(sig);
                    kill_at = kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                    continue;
                }
            }
            // SIGCHLD (or a tick): collect what happened to PROGRAM.
            loop {
                match program.poll() {
                    Ok(None) => break,
                    Ok(Some(Change::Ended)) => break,
                    Err(e) => break 'watch Err(e),
                    Ok(Some(Change::Stopped(sig))) if is_job_control_stop(sig) => {
                        if !self.job_control {
                            // Stopped by someone else's `kill -TSTP`: it stays stopped, as after
                            // a SIGSTOP, and its lease kept, as for any PROGRAM that runs slow.
                        } else if stopping.is_some() {
                            // PROGRAM is on its way out: let it run so it can act on that.
                            program.signal(libc::SIGCONT);
                        } else if let Err(why) = self.suspend(program, sig, lease).await {
                            self.sink.warn(&format!("{why}; killing PROGRAM"));
                            why_text = why;
                            stopping = Some(Stopping::Lost);
                            program.signal(libc::SIGTERM);
                            program.signal(libc::SIGKILL);
                        }
                    }
                    Ok(Some(_)) => {}
                }
            }
            if !program.ended {
                continue;
            }
            // PROGRAM's leader ended: nothing it started may outlive it (the lease is released
            // or DONE written only after this returns). What is left in its group gets SIGTERM,
            // then SIGKILL after --kill-grace (never past the lease's end), as PROGRAM would.
            match program.leftovers() {
                Ok(false) => break 'watch program.reap(),
                Err(e) => {
                    self.sink.warn(&format!(
                        "cannot look for what PROGRAM left running ({e}); killing its process group"
                    ));
                    break 'watch program.reap();
                }
                Ok(true) if !draining => {
                    draining = true;
                    self.sink.note(&format!(
                        "PROGRAM ended; stopping what it left running in its process group \
                         (SIGTERM, then SIGKILL after {})",
                        human(self.kill_grace)
                    ));
                    program.signal(libc::SIGTERM);
                    kill_at = kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                }
                Ok(true) => {
                    // SIGKILL cannot be ignored; what survives it a while is out of baton's
                    // reach (a set-user-ID program it may not signal): waiting longer would not
                    // help, and would hold the lease forever.
                    if killed_at.is_some_and(|at| at.elapsed() >= KILL_SETTLE) {
                        self.sink.warn(
                            "something PROGRAM left running in its process group survived \
                             SIGKILL (baton may not signal it); going on without it",
                        );
                        break 'watch program.reap();
                    }
                }
            }
        };
        // The guard stopped PROGRAM: the lease's confirmed deadline came while this process
        // could not act on it (stopped, blocked, starved) or just before a late extension.
        // PROGRAM may have been cut short: the lease counts as lost, whatever its status.
        if let Some(acted) = program.acted {
            why_text = format!(
                "stopped by the guard: no extension confirmed by {}",
                wall_time(acted.deadline)
            );
            self.sink.warn(&format!(
                "PROGRAM was {why_text} ({})",
                signal_name(acted.signal)
            ));
            stopping = Some(Stopping::Lost);
        }
        let had_terminal = program.has_terminal;
        program.take_terminal_back();
        Supervised {
            status,
            stopping,
            why: why_text,
            had_terminal,
        }
    }

    /// PROGRAM was stopped by job control (Ctrl-Z, or it read the terminal in the background):
    /// stop baton as well, as the shell expects of a job, and once continued resume PROGRAM only
    /// if this process still holds its lease. `Err` says why it does not.
    pub(crate) async fn suspend<L: Lease>(
        &mut self,
        program: &mut Program,
        sig: libc::c_int,
        lease: &mut L,
    ) -> Result<(), String> {
        self.sink.note(&format!(
            "PROGRAM was stopped by {}; stopping baton too (the lease is not extended meanwhile)",
            signal_name(sig)
        ));
        program.take_terminal_back();
        let stopped_at = Instant::now();
        // SAFETY: raise(3) has no memory-safety preconditions. SIGSTOP cannot be caught, and
        // unlike SIGTSTP it is not discarded in an orphaned process group: this process stops
        // here until a SIGCONT, and raise returns then.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
        let away = stopped_at.elapsed();
        self.sink.note(&format!(
            "continued after {}; checking the lease",
            human(away)
        ));
        if self.lease_end.is_some_and(|end| Instant::now() >= end) {
            return Err(format!(
                "the lease ran out while baton was stopped ({})",
                human(away)
            ));
        }
        lease.still_held(away).await?;
        program.give_terminal();
        program.signal(libc::SIGCONT);
        Ok(())
    }
}

/// `t` in RFC 3339 (UTC) to the millisecond, as baton's messages write instants.
pub(crate) fn wall_time(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| format!("{t:?}"), |ts| format!("{ts:.3}"))
}

/// `at`, but never later than the lease's end (if the lease is not kept alive).
pub(crate) fn cap(at: Instant, lease_end: Option<Instant>) -> Instant {
    match lease_end {
        Some(end) => at.min(end),
        None => at,
    }
}

/// Starts PROGRAM and runs it to its end under a held lock (the mutex, a Redlock, a leader's
/// term): the watchdog's loss signal, not a fixed end, bounds it. `Err` is the exit status when
/// PROGRAM could not be started (said already; the caller lets the lock go).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_held<G: HeldLease>(
    guard: &G,
    held: Held,
    program: &[OsString],
    env: &[(&str, String)],
    lease_len: Duration,
    kill_grace: Duration,
    sink: &mut Sink,
    signals: &mut Signals,
    sigchld: &mut tokio::signal::unix::Signal,
) -> Result<Supervised, u8> {
    let tty = in_foreground();
    let mut child = spawn(program, env, tty).map_err(|e| spawn_failed(program, &e, tty))?;
    let mut lease = LockLease {
        guard,
        held,
        kill_grace,
        reported: false,
    };
    let mut supervisor = Supervisor {
        sink,
        signals,
        sigchld,
        kill_grace,
        lease_end: None,
        lease: lease_len,
        job_control: true,
    };
    let far = later(Instant::now(), FAR);
    Ok(supervisor
        .supervise(&mut child, &mut lease, far, String::new())
        .await)
}

/// What [`run_held`]'s lease is, for the words of its loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// A lock (the fenced mutex, a Redlock): "lock lost".
    Lock,
    /// A leader's term: "leadership lost".
    Leadership,
}

impl Held {
    /// The loss, as the first words of its line.
    fn lost(self) -> &'static str {
        match self {
            Held::Lock => "lock lost",
            Held::Leadership => "leadership lost",
        }
    }

    /// The loss, as a clause.
    fn was_lost(self) -> &'static str {
        match self {
            Held::Lock => "the lock was lost",
            Held::Leadership => "the leadership was lost",
        }
    }
}

/// How the lease PROGRAM runs under was lost.
pub(crate) struct Loss {
    /// Send SIGTERM first (PROGRAM may still clean up until `kill_at`).
    pub(crate) term: bool,
    /// When PROGRAM must be dead: SIGKILL then (at once when already past).
    pub(crate) kill_at: Instant,
}

/// The lease PROGRAM runs under, as [`Supervisor::supervise`] watches it: a failover attempt
/// (`baton run`) or a fenced mutex (`baton lock`). Whatever the lease, PROGRAM is handled the
/// same way (process group, terminal, signals, job control); only what "lost" means differs.
pub(crate) trait Lease {
    /// The next loss of the lease; pending forever once nothing more can come. Cancel safe.
    async fn lost(&mut self, sink: &mut Sink) -> Loss;

    /// Whether this process still holds the lease after being stopped (job control) for
    /// `away`; `Err` says why not.
    async fn still_held(&mut self, away: Duration) -> Result<(), String>;

    /// When the lease ends at the earliest as of the last extension the server confirmed, on
    /// this host's monotonic clock: what the guard of PROGRAM's group enforces (guard.rs).
    fn confirmed_deadline(&self) -> Instant;
}

/// `baton lock`'s and `baton leader`'s lease: a held lock (the fenced mutex, a Redlock) or a
/// leader's term, through the library's [`HeldLease`]: its loss signal and the deadline before
/// which it cannot pass on (errs early: the mutex's send time of the last confirmed extension +
/// ttl − margin, a Redlock's validity, a term's renewal).
pub(crate) struct LockLease<'a, G> {
    pub(crate) guard: &'a G,
    pub(crate) held: Held,
    pub(crate) kill_grace: Duration,
    /// The loss signal fires once and stays fired: report it once.
    pub(crate) reported: bool,
}

impl<G: HeldLease> Lease for LockLease<'_, G> {
    async fn lost(&mut self, sink: &mut Sink) -> Loss {
        if self.reported {
            return std::future::pending().await;
        }
        // Cancel safe: a cancellation token's `cancelled()` is.
        self.guard.lost().await;
        self.reported = true;
        let reason = self
            .guard
            .loss_reason()
            .unwrap_or_else(|| self.held.was_lost().into());
        sink.warn(&format!("{}: {reason}; stopping PROGRAM", self.held.lost()));
        // The deadline errs early: killed by then, PROGRAM is gone before the lock can expire
        // and pass on. When the loss is the deadline itself, that is now: SIGKILL at once. A
        // refused extension (the key is gone or foreign) can come earlier; PROGRAM then gets
        // the time left, at most --kill-grace, to stop cleanly: another holder may already
        // run, which only the fencing token guards against.
        let kill_at = self
            .guard
            .lease_deadline()
            .min(later(Instant::now(), self.kill_grace));
        Loss {
            term: true,
            kill_at,
        }
    }

    fn confirmed_deadline(&self) -> Instant {
        self.guard.lease_deadline()
    }

    async fn still_held(&mut self, away: Duration) -> Result<(), String> {
        let lost = |what: String| Err(format!("{what} while baton was stopped ({})", human(away)));
        if let Some(reason) = self.guard.loss_reason() {
            return lost(format!("{} ({reason})", self.held.was_lost()));
        }
        // Nothing was extended while stopped: past the deadline the key may have expired and
        // passed on. Before it, the watchdog's next extension settles the rest.
        if Instant::now() >= self.guard.lease_deadline() {
            return lost("the lease ran out".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Held;

    /// `baton leader` loses its leadership, `baton lock` its lock.
    #[test]
    fn a_loss_is_worded_by_what_was_held() {
        assert_eq!(Held::Lock.lost(), "lock lost");
        assert_eq!(Held::Leadership.lost(), "leadership lost");
        assert_eq!(Held::Leadership.was_lost(), "the leadership was lost");
    }
}
