//! The guard of PROGRAM's process group: nothing PROGRAM starts outlives `baton`.
//!
//! PROGRAM itself dies with baton by its parent-death signal, but that signal is not inherited:
//! a child PROGRAM forks (`sh -c 'sleep 100; true'`'s `sleep`) is reparented to init and runs on
//! beside the next holder's PROGRAM. So every PROGRAM gets a guard: a tiny process, baton's own
//! binary re-executed in a hidden mode ([`ARG`]), that kills PROGRAM's whole process group with
//! SIGKILL the moment baton dies, by any signal, SIGKILL (the OOM killer) included.
//!
//! # Why a guard, and why it watches a pipe
//!
//! - A subreaper (PR_SET_CHILD_SUBREAPER) would collect orphans while baton lives, but a
//!   SIGKILLed baton takes it along: the orphans go to init and run on. Something must outlive
//!   baton by a moment to kill them, and that is a second process.
//! - A cgroup (`cgroup.kill`) would also catch descendants that leave the process group, but it
//!   is writable only under a delegated hierarchy (systemd `Delegate=`, root), rarely where cron
//!   or a shell runs baton.
//! - The guard learns of baton's death by end-of-file on a pipe whose only writer is baton: the
//!   kernel closes a process's descriptors when the process ends, whatever ended it, and the
//!   write end is close-on-exec, so no PROGRAM keeps it open. A parent-death signal would do the
//!   same, but it fires when the forking *thread* ends (a tokio blocking thread, say), and it
//!   would have to be caught; end-of-file needs neither.
//! - The guard is an exec'd process, not a bare fork of baton: a fork of a multi-threaded
//!   process may only call async-signal-safe functions, and would hold copies of baton's
//!   sockets (to Redis or PostgreSQL) open.
//! - The guard stands beside PROGRAM, not between baton and PROGRAM: PROGRAM stays baton's
//!   child, so baton still sees its stops (job control) and its exit status directly, and it
//!   stays the leader of its own group (`setsid` refuses a group leader; a shell run as PROGRAM
//!   finds itself in charge of its job). The guard is in a process group of its own, so no
//!   terminal signal (Ctrl-C, Ctrl-Z) and no signal baton sends to PROGRAM's group reaches it.
//!
//! # The handshake
//!
//! baton starts the guard with the read end of a pipe as its stdin. PROGRAM's child side,
//! between fork and exec and right after it made its own process group, writes that group's
//! number into the pipe (async-signal-safe `write`); only then does it exec PROGRAM. So the
//! guard knows the group before PROGRAM can start anything, and data written into a pipe stays
//! readable after its writers are gone: even when baton dies in between, the guard reads the
//! number, then end-of-file, and kills the group.
//!
//! The number stays PROGRAM's group while baton lives: baton reaps PROGRAM's leader only after
//! it stopped the guard (a zombie leader keeps its number from being reused). When baton dies,
//! init reaps that zombie, and the guard's SIGKILL follows end-of-file at once, long before
//! process numbers could wrap around to a new group with that number.
//!
//! # The lease: PROGRAM never outlives it, even when baton cannot act
//!
//! baton's own supervisor stops PROGRAM before its lease can pass on, but only while baton
//! runs: stopped by SIGSTOP (a debugger, a frozen cgroup), blocked, or starved of CPU, it
//! cannot, and a backup would run the job beside PROGRAM. So the guard enforces the lease too.
//! After the group number, baton sends it each *confirmed* deadline (the lease's end as of the
//! last extension the server acknowledged, which errs early) as a [`Deadline`] message of
//! [`MESSAGE`] bytes: three native-endian `u64`s, the deadline on `CLOCK_BOOTTIME` in
//! nanoseconds, then the SIGTERM lead and the SIGKILL margin in nanoseconds. Writes of fewer
//! than `PIPE_BUF` bytes are atomic, so a message is never split or interleaved.
//!
//! - **baton never blocks on it.** The write end is baton's alone (close-on-exec; PROGRAM's
//!   child side wrote its 4 bytes before exec) and non-blocking: a message that does not fit
//!   is dropped. The next one supersedes it anyway, and the guard, acting on an older (earlier)
//!   deadline, errs early.
//! - **The guard never acts on a stale deadline.** When its timer fires it first drains every
//!   message already in the pipe, then acts only if the newest deadline still says so.
//! - **Clocks.** baton converts once per message, reading both clocks at one point:
//!   `boottime_now + (deadline − monotonic_now)`. The guard's timer is a `timerfd` on
//!   `CLOCK_BOOTTIME`, which counts the time a suspended host spent asleep, as the server's
//!   clock does (`CLOCK_MONOTONIC` would not: a laptop lid closed past the lease would leave
//!   PROGRAM running after it).
//! - **Timing,** the rule baton's own supervisor uses: SIGTERM (and SIGCONT, for a stopped
//!   group) `min(--kill-grace, lease / 4)` before the deadline, SIGKILL at the deadline minus
//!   [`kill_margin`]. Each action is reported back to baton on the guard's stdout (a second
//!   pipe, read without blocking) just before it is taken, so a baton that resumes says "stopped by the guard: no
//!   extension confirmed by …", fails the attempt and exits 74, never "killed by signal 9".
//!
//! # What still escapes
//!
//! The whole host paused (a VM frozen by its hypervisor, a live migration) pauses the guard
//! with baton; `CLOCK_BOOTTIME` does not count such a pause, and PROGRAM resumes with both.
//! Only the fencing token protects the resource then: a backup's writes carry a higher one.
//!
//! A descendant that leaves PROGRAM's process group (`setsid`, `setpgid`, a daemon's double
//! fork) is out of reach of the guard and of baton's own signals; so is one in another PID
//! namespace of its own making. A process group is the unit a shell's job control uses too.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime};

/// The hidden first argument that makes `baton` run as a guard. Not a flag clap knows: nobody
/// types it, and `baton --help` does not show it.
pub const ARG: &str = "__baton_guard_of_program_group";

/// The size of a deadline message (see the module docs): three `u64`s.
pub const MESSAGE: usize = 24;
/// The size of a report of the guard's (an action it took): two `u64`s, the signal and the
/// deadline it acted on (`CLOCK_BOOTTIME` nanoseconds).
const REPORT: usize = 16;

/// How long before the lease's deadline the guard sends SIGKILL: a twentieth of the lease, at
/// most 250 ms.
///
/// The deadline already errs early: it counts from the *send* time of the last confirmed
/// extension and takes max(1 %, 2 ms) off for clock rate differences with the server. The
/// margin covers what happens after the guard's timer fires and before the server could hand
/// the lease on: the guard being scheduled (milliseconds on a busy host, tens of them on a
/// starved one) and the kernel ending every member of the group (well under a millisecond
/// each; a process in uninterruptible sleep dies only when its I/O returns, which no margin
/// fixes). A backup also needs its own round trip after the key expires, which only adds
/// slack. A twentieth keeps the margin small against the lease (25 ms of a 500 ms lease); the
/// cap keeps long leases from losing more than a quarter second of work for it.
pub fn kill_margin(lease: Duration) -> Duration {
    (lease / 20).min(Duration::from_millis(250))
}

/// How long before the deadline the guard (and baton's own supervisor without the watchdog)
/// sends SIGTERM: `min(kill_grace, lease / 4)`.
pub fn term_lead(kill_grace: Duration, lease: Duration) -> Duration {
    kill_grace.min(lease / 4)
}

/// What the guard did to PROGRAM's group, as it reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acted {
    /// The strongest signal sent (SIGKILL after SIGTERM).
    pub signal: libc::c_int,
    /// The lease deadline that had passed without a newer one, on the wall clock.
    pub deadline: SystemTime,
}

/// A running guard, stopped (killed and reaped) by [`Guard::stop`] or on drop.
pub struct Guard {
    child: Child,
    /// The pipe's write end: baton holds it open for as long as it lives. PROGRAM's child side
    /// writes its group into it (see [`Guard::pipe`]), then baton its deadlines (non-blocking).
    writer: OwnedFd,
    /// The read end of the guard's reports (non-blocking).
    reports: OwnedFd,
    /// Bytes of a report read in part.
    partial: Vec<u8>,
    /// The strongest action reported so far.
    acted: Option<Acted>,
    /// The last deadline sent, not to send it again.
    sent: Option<std::time::Instant>,
}

impl Guard {
    /// Starts a guard: baton's own binary (`/proc/self/exe`, which stays valid when the file is
    /// replaced by an upgrade) in guard mode, in a process group of its own, stdin the read end
    /// of a new pipe, stdout and stderr null (it must not keep baton's pipes open).
    pub fn start() -> std::io::Result<Guard> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2(2) writes two new descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned by nothing else.
        let (reader, writer) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut back = [0 as libc::c_int; 2];
        // SAFETY: as above.
        if unsafe { libc::pipe2(back.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        let (reports, report_writer) =
            unsafe { (OwnedFd::from_raw_fd(back[0]), OwnedFd::from_raw_fd(back[1])) };
        // baton's ends never block it: the deadline pipe's write end (its own file description,
        // separate from the guard's read end, so the guard still blocks) and the reports' read
        // end. Set before the guard starts, so no write can find them blocking.
        set_nonblocking(writer.as_raw_fd())?;
        set_nonblocking(reports.as_raw_fd())?;
        let child = Command::new("/proc/self/exe")
            .arg(ARG)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::from(report_writer))
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Guard {
            child,
            writer,
            reports,
            partial: Vec::new(),
            acted: None,
            sent: None,
        })
    }

    /// Tells the guard the lease's confirmed deadline (on the monotonic clock), with the
    /// SIGTERM lead and the SIGKILL margin before it. Never blocks: a message that does not fit
    /// into the pipe is dropped (the guard then acts on an earlier deadline). Nothing is sent
    /// when `deadline` is the one sent last.
    pub fn send_deadline(&mut self, deadline: std::time::Instant, term: Duration, kill: Duration) {
        if self.sent == Some(deadline) {
            return;
        }
        let message = encode(boottime_of(deadline), term, kill);
        // SAFETY: write(2) from a valid local buffer to a descriptor this guard owns.
        let n = unsafe { libc::write(self.writer.as_raw_fd(), message.as_ptr().cast(), MESSAGE) };
        // All or nothing: fewer than PIPE_BUF bytes. EAGAIN (full) drops it: see above.
        if n == MESSAGE as isize {
            self.sent = Some(deadline);
        }
    }

    /// What the guard did to PROGRAM's group, if anything: its reports read without blocking.
    pub fn acted(&mut self) -> Option<Acted> {
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: read(2) into a valid local buffer from a descriptor this guard owns.
            let n =
                unsafe { libc::read(self.reports.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            // `n` is positive and at most `buf.len()`.
            self.partial.extend_from_slice(&buf[..n as usize]);
        }
        while self.partial.len() >= REPORT {
            let report: Vec<u8> = self.partial.drain(..REPORT).collect();
            let (signal, deadline) = decode_report(&report);
            let acted = Acted {
                signal,
                deadline: wall_of_boottime(deadline),
            };
            // SIGKILL is the stronger action; otherwise the latest report stands.
            if !matches!(self.acted, Some(a) if a.signal == libc::SIGKILL) {
                self.acted = Some(acted);
            }
        }
        self.acted
    }

    /// The descriptor PROGRAM's child side writes its process group into, with [`announce`].
    pub fn pipe(&self) -> RawFd {
        self.writer.as_raw_fd()
    }

    /// Stops the guard: PROGRAM's group is empty or baton is about to reap its leader, after
    /// which the group's number may name another group. SIGKILL first, then the pipe closes:
    /// the other order would make the guard kill the group.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Errors mean it is gone already. Either way it is reaped here: SIGKILL ends it at
        // once, so the wait is short. `self.writer` closes only after this body.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PROGRAM's child side, between fork and exec: tells the guard behind `pipe` which process
/// group to kill (the caller's own, which it leads by now). Only async-signal-safe calls.
///
/// # Errors
///
/// The write failed (the guard is gone): PROGRAM must not run unguarded.
pub fn announce(pipe: RawFd) -> std::io::Result<()> {
    // SAFETY: getpgrp(2), signal(2) and write(2) are async-signal-safe; the buffer is a local.
    // SIGPIPE is ignored around the write so a gone reader is an EPIPE error, not a death
    // before exec that std would report as a PROGRAM that started and ended by SIGPIPE; it is
    // set back to its default (std reset it so in this child) before PROGRAM's exec.
    unsafe {
        let group = libc::getpgrp().to_ne_bytes();
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let n = loop {
            let n = libc::write(pipe, group.as_ptr().cast(), group.len());
            if n == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            break n;
        };
        let e = std::io::Error::last_os_error();
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // A pipe write of fewer than PIPE_BUF bytes is all or nothing.
        if n != group.len() as isize {
            return Err(e);
        }
    }
    Ok(())
}

/// The guard's whole life: read PROGRAM's group, wait for end-of-file (baton is gone), kill the
/// group. Runs in the re-exec'd binary before anything else (no runtime, no clap).
pub fn main() -> ExitCode {
    // SAFETY: signal(2) and prctl(2) with PR_SET_NAME (a NUL-terminated static name) have no
    // memory-safety preconditions. Nothing but baton's death may end the guard early: it is in
    // a group of its own, so these come only from someone who means the whole session (a
    // hangup, `kill -TERM` on every process): baton acts on them, and its exit is the guard's
    // cue. SIGKILL still ends it, and baton uses just that to stop it.
    unsafe {
        for sig in [
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // "exe" (from /proc/self/exe) would say nothing in ps or top.
        libc::prctl(
            libc::PR_SET_NAME,
            c"baton-guard".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    // The raw descriptor, never std's buffered stdin: what follows the group (deadlines) must
    // not sit in a buffer the watch below does not read.
    let input = std::io::stdin().as_raw_fd();
    let mut pending = Vec::new();
    while pending.len() < 4 {
        if !matches!(read_some(input, &mut pending), Ok(true)) {
            // End-of-file before a group: no PROGRAM was started under this guard.
            return ExitCode::SUCCESS;
        }
    }
    let group = libc::pid_t::from_ne_bytes([pending[0], pending[1], pending[2], pending[3]]);
    pending.drain(..4);
    // Never 0 or 1: kill(-1) would signal every process the guard may signal.
    if group <= 1 {
        return ExitCode::SUCCESS;
    }
    watch(group, input, pending);
    // SAFETY: kill(2) has no memory-safety preconditions; `group` > 1.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    ExitCode::SUCCESS
}

/// The guard's watch over `group`, until end-of-file on `input` (baton is gone) or an error
/// reading it: acts on the deadlines baton sends (module docs). Returns when the group must be
/// killed.
fn watch(group: libc::pid_t, input: RawFd, mut pending: Vec<u8>) {
    // SAFETY: timerfd_create(2) has no memory-safety preconditions.
    let timer = unsafe { libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC) };
    // Without a timer (an old kernel) the guard still kills the group when baton dies.
    let timer = (timer >= 0).then(|| {
        // SAFETY: timerfd_create returned a new descriptor owned by nothing else.
        unsafe { OwnedFd::from_raw_fd(timer) }
    });
    let mut deadline: Option<Deadline> = None;
    while pending.len() >= MESSAGE {
        let message: Vec<u8> = pending.drain(..MESSAGE).collect();
        deadline = Some(decode(&message));
    }
    let mut termed = false;
    let mut killed = false;
    loop {
        let next = deadline.and_then(|d| d.next_action(termed, killed));
        if let Some(t) = &timer {
            arm(t.as_raw_fd(), next);
        }
        let mut fds = [
            libc::pollfd {
                fd: input,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: timer.as_ref().map_or(-1, |t| t.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on two valid pollfds (a negative fd is ignored).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // The pipe cannot be watched any more: err on the side of the kill.
            return;
        }
        if fds[0].revents != 0 {
            // Messages first, whatever the timer says: never act on a stale deadline.
            match read_some(input, &mut pending) {
                Ok(true) => {}
                // End-of-file (baton is gone) or an unusable pipe.
                Ok(false) | Err(_) => return,
            }
            while pending.len() >= MESSAGE {
                let message: Vec<u8> = pending.drain(..MESSAGE).collect();
                deadline = Some(decode(&message));
            }
            continue;
        }
        if fds[1].revents == 0 {
            continue;
        }
        if let Some(t) = &timer {
            let mut expirations = [0u8; 8];
            // SAFETY: read(2) of a timerfd's 8-byte counter into a valid local.
            unsafe {
                libc::read(t.as_raw_fd(), expirations.as_mut_ptr().cast(), 8);
            }
        }
        // A message may have come in with the timer: drain first (the loop's next poll sees
        // it at once and re-arms the timer from the newest deadline).
        if readable(input) {
            continue;
        }
        let Some(d) = deadline else { continue };
        let now = boottime_now();
        // Each action is reported *before* it is taken: baton reads the reports when it reaps
        // PROGRAM's leader, and a PROGRAM that dies of the signal at once could be reaped in
        // the moment between a signal and a report sent after it (the guard preempted on a busy
        // host); baton would then take the guard's SIGTERM for a signal of PROGRAM's own and
        // exit 143 instead of 74. A report read before its signal lands says no more than the
        // truth either: the confirmed deadline has come, so the lease counts as lost.
        if !termed && now >= d.term_at() {
            termed = true;
            report(libc::SIGTERM, d.deadline);
            step_delay();
            // SAFETY: kill(2) has no memory-safety preconditions; `group` > 1.
            unsafe {
                libc::kill(-group, libc::SIGTERM);
                libc::kill(-group, libc::SIGCONT);
            }
        }
        if !killed && now >= d.kill_at() {
            killed = true;
            report(libc::SIGKILL, d.deadline);
            step_delay();
            // SAFETY: as above.
            unsafe {
                libc::kill(-group, libc::SIGKILL);
            }
        }
    }
}

/// A deadline message: the lease's end and when to act before it, on `CLOCK_BOOTTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Deadline {
    /// Nanoseconds of `CLOCK_BOOTTIME`.
    deadline: u64,
    term: u64,
    kill: u64,
}

impl Deadline {
    fn term_at(&self) -> u64 {
        self.deadline.saturating_sub(self.term)
    }

    fn kill_at(&self) -> u64 {
        self.deadline.saturating_sub(self.kill)
    }

    /// When the guard acts next, if it still has anything to do.
    fn next_action(&self, termed: bool, killed: bool) -> Option<u64> {
        match (termed, killed) {
            (_, true) => None,
            (false, false) => Some(self.term_at().min(self.kill_at())),
            (true, false) => Some(self.kill_at()),
        }
    }
}

fn encode(deadline: u64, term: Duration, kill: Duration) -> [u8; MESSAGE] {
    let mut m = [0u8; MESSAGE];
    m[..8].copy_from_slice(&deadline.to_ne_bytes());
    m[8..16].copy_from_slice(&nanos(term).to_ne_bytes());
    m[16..].copy_from_slice(&nanos(kill).to_ne_bytes());
    m
}

fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(src) = bytes.get(at..at + 8) {
        w.copy_from_slice(src);
    }
    u64::from_ne_bytes(w)
}

fn decode(m: &[u8]) -> Deadline {
    Deadline {
        deadline: word(m, 0),
        term: word(m, 8),
        kill: word(m, 16),
    }
}

fn decode_report(r: &[u8]) -> (libc::c_int, u64) {
    let signal = libc::c_int::try_from(word(r, 0)).unwrap_or(libc::SIGKILL);
    (signal, word(r, 8))
}

/// The name of the variable that makes a debug build's guard pause between reporting an
/// action and taking it (milliseconds), so a test can hold the guard in that moment and check
/// that baton never mistakes the guard's signal for one of PROGRAM's own. Release builds
/// ignore it.
pub const STEP_DELAY_VAR: &str = "BATON_TEST_GUARD_STEP_DELAY_MS";

/// The pause of [`STEP_DELAY_VAR`], in debug builds only.
fn step_delay() {
    if cfg!(debug_assertions) {
        if let Some(ms) = std::env::var(STEP_DELAY_VAR)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

/// Tells baton what the guard did (its stdout, a pipe baton reads without blocking). Best
/// effort: if baton is gone, nobody needs to know.
fn report(signal: libc::c_int, deadline: u64) {
    let mut r = [0u8; REPORT];
    r[..8].copy_from_slice(&u64::try_from(signal).unwrap_or(0).to_ne_bytes());
    r[8..].copy_from_slice(&deadline.to_ne_bytes());
    // SAFETY: write(2) from a valid local buffer to stdout.
    unsafe {
        libc::write(1, r.as_ptr().cast(), REPORT);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `CLOCK_BOOTTIME` now, in nanoseconds.
fn boottime_now() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes into a valid local; both clocks always exist on Linux.
    unsafe {
        libc::clock_gettime(clock, &mut ts);
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// `at` (monotonic) on `CLOCK_BOOTTIME`: both clocks read at one point, the difference added.
fn boottime_of(at: std::time::Instant) -> u64 {
    let boot = boottime_now();
    let now = std::time::Instant::now();
    if at >= now {
        boot.saturating_add(nanos(at - now))
    } else {
        boot.saturating_sub(nanos(now - at))
    }
}

/// A `CLOCK_BOOTTIME` instant on the wall clock (for messages).
fn wall_of_boottime(t: u64) -> SystemTime {
    let boot = boottime_now();
    let wall = SystemTime::now();
    if t >= boot {
        wall + Duration::from_nanos(t - boot)
    } else {
        wall.checked_sub(Duration::from_nanos(boot - t))
            .unwrap_or(wall)
    }
}

/// Arms `timer` to fire at `at` (`CLOCK_BOOTTIME` nanoseconds, absolute), or disarms it.
fn arm(timer: RawFd, at: Option<u64>) {
    let spec = |ns: u64| libc::timespec {
        tv_sec: libc::time_t::try_from(ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits every c_long.
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let value = match at {
        // A zero it_value disarms; an instant already past fires at once. 1 ns, not 0, for an
        // action due at boot time zero.
        Some(at) => spec(at.max(1)),
        None => spec(0),
    };
    let new = libc::itimerspec {
        it_interval: spec(0),
        it_value: value,
    };
    // SAFETY: timerfd_settime(2) reads a valid local itimerspec; the old value is not asked.
    unsafe {
        libc::timerfd_settime(timer, libc::TFD_TIMER_ABSTIME, &new, std::ptr::null_mut());
    }
}

/// Reads what is in `fd` into `into`. `Ok(false)`: end-of-file.
fn read_some(fd: RawFd, into: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: read(2) into a valid local buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            // `n` is positive and at most `buf.len()`.
            into.extend_from_slice(&buf[..n as usize]);
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether `fd` has something to read (or its end) right now.
fn readable(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd, without waiting.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on a descriptor the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags == -1 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether a process other than a zombie is in process group `group`: what PROGRAM left running
/// after its leader (a zombie, not reaped yet, while this is asked) ended. Read from `/proc`,
/// since kill(2) with signal 0 also counts the zombie leader.
///
/// # Errors
///
/// `/proc` cannot be listed.
pub fn group_has_live_members(group: libc::pid_t) -> std::io::Result<bool> {
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that ended since the listing has no stat any more: not a member.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((state, pgrp)) = parse_stat(&stat) {
            if pgrp == group && !matches!(state, 'Z' | 'X' | 'x') {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The state letter and the process group of a `/proc/PID/stat` line: "PID (COMM) S PPID PGRP
/// ...", where COMM may hold spaces and parentheses, so the fields are counted from the last
/// `)`.
fn parse_stat(stat: &str) -> Option<(char, libc::pid_t)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_state_and_group_whatever_the_command_name() {
        assert_eq!(
            parse_stat("4242 (sleep) S 4241 4240 4240 34816 4240 4194304 96 0"),
            Some(('S', 4240))
        );
        // A command name may hold spaces and ") ": the fields follow the last ')'.
        assert_eq!(parse_stat("77 (a) b (c)) Z 1 76 76 0 -1"), Some(('Z', 76)));
        assert_eq!(parse_stat("77 (truncated"), None);
        assert_eq!(parse_stat("77 (x) R 1 notanumber"), None);
    }

    #[test]
    fn a_deadline_message_round_trips_and_orders_its_actions() {
        let m = encode(
            5_000_000_000,
            Duration::from_millis(500),
            Duration::from_millis(100),
        );
        let d = decode(&m);
        assert_eq!(d.deadline, 5_000_000_000);
        assert_eq!(d.term_at(), 4_500_000_000);
        assert_eq!(d.kill_at(), 4_900_000_000);
        assert_eq!(d.next_action(false, false), Some(4_500_000_000));
        assert_eq!(d.next_action(true, false), Some(4_900_000_000));
        assert_eq!(d.next_action(true, true), None);
        // A lead shorter than the margin (--kill-grace 0): SIGKILL comes first, alone.
        let d = decode(&encode(5_000, Duration::ZERO, Duration::from_nanos(100)));
        assert_eq!(d.next_action(false, false), Some(4_900));
        // Near boot time zero nothing underflows.
        let d = decode(&encode(10, Duration::from_secs(1), Duration::from_secs(1)));
        assert_eq!((d.term_at(), d.kill_at()), (0, 0));
    }

    #[test]
    fn the_kill_margin_is_a_twentieth_of_the_lease_at_most_250_ms() {
        assert_eq!(
            kill_margin(Duration::from_millis(500)),
            Duration::from_millis(25)
        );
        assert_eq!(
            kill_margin(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(
            kill_margin(Duration::from_secs(30)),
            Duration::from_millis(250)
        );
        assert_eq!(
            term_lead(Duration::from_secs(10), Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            term_lead(Duration::from_millis(300), Duration::from_secs(30)),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn boottime_conversion_keeps_the_distance_to_now() {
        let ahead = std::time::Instant::now() + Duration::from_secs(3);
        let t = boottime_of(ahead);
        let now = boottime_now();
        assert!(t > now && t - now <= 3_000_000_000, "{t} vs {now}");
        let behind = std::time::Instant::now()
            .checked_sub(Duration::from_secs(1))
            .unwrap();
        assert!(boottime_of(behind) < boottime_now());
    }

    #[test]
    fn this_process_group_has_a_live_member_and_an_unused_one_has_none() {
        // SAFETY: getpgrp(2) has no preconditions.
        let own = unsafe { libc::getpgrp() };
        assert!(group_has_live_members(own).unwrap());
        // Above the kernel's PID limit (4194304 at most): no process group can have it.
        assert!(!group_has_live_members(5_000_000).unwrap());
    }
}
