//! PROGRAM as baton's child: started as the leader of its own process group (with a guard,
//! guard.rs), handed the terminal, followed with `waitid(2)` (never by tokio, so baton alone
//! decides when the leader is reaped and its group's number may be reused), signalled as a
//! group. The raw process and terminal control, apart from the policy in supervisor.rs.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};

use super::guard;
use super::out;
use super::signals::FORWARDED;

/// PROGRAM could not be started: gives the terminal back (the child made its group the
/// foreground one before its exec failed), says why, and returns 127 (not found) or 126.
pub(crate) fn spawn_failed(program: &[OsString], e: &std::io::Error, tty: bool) -> u8 {
    if tty {
        set_foreground(own_group());
    }
    say!(
        "baton: cannot execute {}: {e}",
        program[0].to_string_lossy()
    );
    if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// PROGRAM as this process started it: the leader of its own process group, watched with
/// `waitid` (never by tokio, so this process alone decides when the leader is reaped).
pub(crate) struct Program {
    pub(crate) pid: libc::pid_t,
    /// The process group PROGRAM leads, until the leader is reaped: from then on the number may
    /// name an unrelated process group, so no signal is sent to it any more.
    pub(crate) group: Option<libc::pid_t>,
    /// Whether PROGRAM's group was made the terminal's foreground group by baton (which then
    /// takes the terminal back).
    pub(crate) has_terminal: bool,
    /// Whether the leader has ended (it is a zombie, kept so until [`Program::reap`]).
    pub(crate) ended: bool,
    /// Kills the group if baton dies or the lease's confirmed deadline passes; stopped right
    /// before the leader is reaped. `None` when it could not be started (PROGRAM then runs with
    /// only its own parent-death signal and baton's supervisor).
    pub(crate) guard: Option<guard::Guard>,
    /// What the guard did to PROGRAM's group, as read when the leader was reaped.
    pub(crate) acted: Option<guard::Acted>,
}

/// A status change of PROGRAM.
pub(crate) enum Change {
    /// Its leader ended; it is a zombie until [`Program::reap`], so the group's number still
    /// names PROGRAM's group (and what PROGRAM left running in it can be stopped).
    Ended,
    /// It was stopped by this signal.
    Stopped(libc::c_int),
    /// It was continued (or traced).
    Other,
}

impl Program {
    /// Sends `sig` to PROGRAM's group, followed by SIGCONT for a terminating signal (a stopped
    /// process acts on it only once continued). Nothing once the leader was reaped.
    pub(crate) fn signal(&self, sig: libc::c_int) {
        let Some(group) = self.group.filter(|&g| g > 1) else {
            return;
        };
        // SAFETY: kill(2) has no memory-safety preconditions. The group's leader is not reaped
        // (at worst a zombie), so its number still names PROGRAM's group.
        unsafe {
            libc::kill(-group, sig);
            if FORWARDED.contains(&sig) {
                libc::kill(-group, libc::SIGCONT);
            }
        }
    }

    /// The next status change of PROGRAM, without blocking (`None`: nothing new; always once
    /// the leader has ended).
    pub(crate) fn poll(&mut self) -> std::io::Result<Option<Change>> {
        if self.group.is_none() || self.ended {
            return Ok(None);
        }
        loop {
            // Has it ended? Look without reaping it: while the leader is a zombie its number
            // cannot be reused, so what is left of its group can still be signalled by that
            // number.
            if waitid(self.pid, libc::WEXITED | libc::WNOWAIT)?.is_some() {
                self.ended = true;
                return Ok(Some(Change::Ended));
            }
            match stop_change(self.pid)? {
                StopChange::Ended => continue,
                StopChange::None => return Ok(None),
                StopChange::Stopped(sig) => return Ok(Some(Change::Stopped(sig))),
                StopChange::Other => return Ok(Some(Change::Other)),
            }
        }
    }

    /// Whether anything PROGRAM started still runs in its group, its leader having ended.
    /// `Err`: `/proc` cannot tell.
    pub(crate) fn leftovers(&self) -> std::io::Result<bool> {
        match self.group {
            Some(group) if self.ended => guard::group_has_live_members(group),
            _ => Ok(false),
        }
    }

    /// Reaps the ended leader (see [`Change::Ended`]) and returns its status. A last SIGKILL to
    /// the group first, for whatever the `/proc` scan could not see, then the guard is stopped:
    /// from the reap on, the group's number may name another group.
    pub(crate) fn reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.signal(libc::SIGKILL);
        if let Some(mut guard) = self.guard.take() {
            // Its reports stay readable in the pipe after it is gone; read them first anyway.
            self.acted = guard.acted();
            guard.stop();
        }
        let status = reap(self.pid)?;
        self.group = None;
        Ok(std::process::ExitStatus::from_raw(status))
    }

    /// Tells the guard the lease's confirmed deadline (see guard.rs): it stops PROGRAM's group
    /// by then even if baton cannot. Never blocks.
    pub(crate) fn send_deadline(
        &mut self,
        deadline: tokio::time::Instant,
        kill_grace: std::time::Duration,
        lease: std::time::Duration,
    ) {
        if let Some(guard) = &mut self.guard {
            guard.send_deadline(
                deadline.into_std(),
                guard::term_lead(kill_grace, lease),
                guard::kill_margin(lease),
            );
        }
    }

    /// Makes PROGRAM's group the terminal's foreground group again, if baton is in the
    /// foreground (it is not after a shell's `bg`).
    pub(crate) fn give_terminal(&mut self) {
        if let Some(group) = self.group {
            if in_foreground() && set_foreground(group) {
                self.has_terminal = true;
            }
        }
    }

    /// Makes baton's group the terminal's foreground group again, if it handed it to PROGRAM.
    pub(crate) fn take_terminal_back(&mut self) {
        if std::mem::take(&mut self.has_terminal) {
            set_foreground(own_group());
        }
    }
}

impl Drop for Program {
    /// A PROGRAM dropped before it was reaped (baton lost track of it and is giving up) is
    /// killed with its whole group, while the unreaped leader still holds the group's number;
    /// then the guard is stopped and the leader reaped, so no zombie is left behind in a
    /// long-running `baton schedule`. The reap never blocks this thread: a leader that is not
    /// gone at once (in uninterruptible sleep, say) is reaped by a thread of its own.
    fn drop(&mut self) {
        if self.group.is_none() {
            return;
        }
        self.signal(libc::SIGKILL);
        if let Some(guard) = self.guard.take() {
            guard.stop();
        }
        self.group = None;
        let pid = self.pid;
        if !matches!(waitid(pid, libc::WEXITED), Ok(Some(_))) {
            // Best effort: if no thread can be started, the zombie stays until baton exits.
            let _ = std::thread::Builder::new()
                .name("baton-reaper".into())
                .spawn(move || {
                    let _ = reap(pid);
                });
        }
    }
}

/// What [`stop_change`] saw.
#[derive(Debug, PartialEq)]
pub(crate) enum StopChange {
    /// No stop or continue to report.
    None,
    /// Stopped by this signal.
    Stopped(libc::c_int),
    /// Continued (or traced).
    Other,
    /// The child has ended (it is a zombie): look for its exit status.
    Ended,
}

/// A stop or continue of the child `pid`, without blocking and without reaping it.
///
/// Linux answers `ECHILD` when the only matching child is a zombie and `WEXITED` was not asked
/// for: a child that ends between the exit check and this call is reported as
/// [`StopChange::Ended`], never as an error. `ECHILD` from a later exit check is then real.
pub(crate) fn stop_change(pid: libc::pid_t) -> std::io::Result<StopChange> {
    match waitid(pid, libc::WSTOPPED | libc::WCONTINUED) {
        Ok(None) => Ok(StopChange::None),
        // SAFETY: for CLD_STOPPED, waitid(2) filled in si_status (the stop signal).
        Ok(Some(info)) if info.si_code == libc::CLD_STOPPED => {
            Ok(StopChange::Stopped(unsafe { info.si_status() }))
        }
        Ok(Some(_)) => Ok(StopChange::Other),
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(StopChange::Ended),
        Err(e) => Err(e),
    }
}

/// waitid(2) on `pid` without blocking: the child's status, if it has one matching `flags`.
pub(crate) fn waitid(
    pid: libc::pid_t,
    flags: libc::c_int,
) -> std::io::Result<Option<libc::siginfo_t>> {
    loop {
        // SAFETY: an all-zero siginfo_t is valid; waitid writes one into it. With WNOHANG and no
        // matching change it leaves si_pid zero (it was zeroed, as POSIX leaves that unspecified).
        let (r, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                flags | libc::WNOHANG,
            );
            (r, info)
        };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: si_pid is valid for every SIGCHLD siginfo, and zero when nothing was reported.
        return Ok((unsafe { info.si_pid() } == pid).then_some(info));
    }
}

/// Reaps an ended child; returns its wait status.
pub(crate) fn reap(pid: libc::pid_t) -> std::io::Result<libc::c_int> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) writes the status into a valid local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = std::io::Error::last_os_error();
        if r == -1 && e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
}

pub(crate) fn own_group() -> libc::pid_t {
    // SAFETY: getpgrp(2) has no preconditions and cannot fail.
    unsafe { libc::getpgrp() }
}

/// Whether baton may hand the terminal on: stdin is a terminal and baton's process group is its
/// foreground group (baton is not a background job).
pub(crate) fn in_foreground() -> bool {
    // SAFETY: isatty(3) and tcgetpgrp(3) on fd 0 have no memory-safety preconditions.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == own_group() }
}

/// Makes `group` the foreground group of the terminal on stdin. SIGTTOU is blocked meanwhile: a
/// background process calling tcsetpgrp would be stopped by it. Only async-signal-safe calls,
/// so PROGRAM's child side uses it between fork and exec.
pub(crate) fn set_foreground(group: libc::pid_t) -> bool {
    // SAFETY: all-zero sigset_t values are valid and initialized by sigemptyset; the mask is
    // restored before returning; tcsetpgrp on fd 0 has no memory-safety preconditions.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        let ok = libc::tcsetpgrp(0, group) == 0;
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        ok
    }
}

/// Starts PROGRAM as the leader of a new process group, with a guard that kills that group if
/// baton dies (see guard.rs); with `terminal`, that group takes the terminal before PROGRAM runs
/// (so its first read cannot meet SIGTTIN).
/// `program` is PROGRAM and its arguments (at least one element); `env` is added to baton's.
pub(crate) fn spawn(
    program: &[OsString],
    env: &[(&str, String)],
    terminal: bool,
) -> std::io::Result<Program> {
    // Started first, so that it knows PROGRAM's group before PROGRAM can start anything.
    let guard = match guard::Guard::start() {
        Ok(g) => Some(g),
        Err(e) => {
            // Without /proc, say. PROGRAM still dies with baton; what it starts may not.
            say!(
                "baton: cannot start the guard of PROGRAM's process group ({e}): what PROGRAM \
                 starts may outlive baton"
            );
            None
        }
    };
    let pipe = guard.as_ref().map(guard::Guard::pipe);
    let mut cmd = std::process::Command::new(&program[0]);
    cmd.args(&program[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe prctl(2), getppid(2), getpid(2), sigemptyset/sigaddset/sigprocmask,
    // tcsetpgrp(3), and `guard::announce` (getpgrp, signal, write), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Die with baton, even when baton is SIGKILLed.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // baton may have died between fork and prctl: then nobody would signal us.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // std made the process group before running this: the guard learns it now.
            if let Some(pipe) = pipe {
                guard::announce(pipe)?;
            }
            if terminal {
                // Best effort: without the terminal PROGRAM still runs (SIGTTIN if it reads).
                set_foreground(libc::getpid());
            }
            Ok(())
        });
    }
    // std's Child neither kills nor reaps on drop: `Program` does both. On an error the guard
    // is dropped (stopped) with it: std reaped the child that could not exec.
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    Ok(Program {
        pid,
        group: Some(pid),
        has_terminal: terminal,
        ended: false,
        guard,
        acted: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A PROGRAM dropped unreaped (baton lost track of it) is killed and reaped: no zombie is
    /// left behind. Before, it stayed a zombie for the life of a long-running `baton schedule`.
    #[test]
    // The child is reaped by `Program`'s drop, which is what this test checks.
    #[allow(clippy::zombie_processes)]
    fn a_dropped_program_is_killed_and_reaped() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let program = Program {
            pid,
            group: Some(pid),
            has_terminal: false,
            ended: false,
            guard: None,
            acted: None,
        };
        drop(program);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Gone from /proc once reaped; a zombie keeps its entry (state Z) until then.
        while std::fs::metadata(format!("/proc/{pid}")).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "PROGRAM {pid} was left a zombie: {:?}",
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A child that ends between `poll`'s exit check and its stop check: Linux answers that
    /// stop check with ECHILD, which once made `baton lock` exit 74 ("lost track of PROGRAM").
    #[test]
    // The child is reaped by `Program::poll`, which is what this test checks.
    #[allow(clippy::zombie_processes)]
    pub(crate) fn a_child_ending_between_the_exit_and_stop_checks_is_reaped_not_lost() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while waitid(pid, libc::WEXITED | libc::WNOWAIT)
            .unwrap()
            .is_none()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The ground the fix stands on: the zombie is invisible to a stop-only waitid.
        let raw = waitid(pid, libc::WSTOPPED | libc::WCONTINUED).unwrap_err();
        assert_eq!(raw.raw_os_error(), Some(libc::ECHILD));
        assert_eq!(stop_change(pid).unwrap(), StopChange::Ended);
        let mut program = Program {
            pid,
            group: Some(pid),
            has_terminal: false,
            ended: false,
            guard: None,
            acted: None,
        };
        match program.poll().unwrap() {
            Some(Change::Ended) => {}
            _ => panic!("the ended child was not reported as ended"),
        }
        assert!(
            !program.leftovers().unwrap(),
            "nothing else was in its group"
        );
        assert_eq!(program.reap().unwrap().code(), Some(3));
        assert!(program.group.is_none());
    }
}
