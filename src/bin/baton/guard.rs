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
//! # What still escapes
//!
//! A descendant that leaves PROGRAM's process group (`setsid`, `setpgid`, a daemon's double
//! fork) is out of reach of the guard and of baton's own signals; so is one in another PID
//! namespace of its own making. A process group is the unit a shell's job control uses too.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, Stdio};

/// The hidden first argument that makes `baton` run as a guard. Not a flag clap knows: nobody
/// types it, and `baton --help` does not show it.
pub const ARG: &str = "__baton_guard_of_program_group";

/// A running guard, stopped (killed and reaped) by [`Guard::stop`] or on drop.
pub struct Guard {
    child: Child,
    /// The pipe's write end: baton holds it open for as long as it lives. PROGRAM's child side
    /// writes its group into it (see [`Guard::pipe`]).
    writer: OwnedFd,
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
        let child = Command::new("/proc/self/exe")
            .arg(ARG)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Guard { child, writer })
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
    let mut stdin = std::io::stdin().lock();
    let mut group = [0u8; 4];
    if stdin.read_exact(&mut group).is_err() {
        // End-of-file before a group: no PROGRAM was started under this guard.
        return ExitCode::SUCCESS;
    }
    let group = libc::pid_t::from_ne_bytes(group);
    let mut rest = [0u8; 64];
    loop {
        match stdin.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Any other error: the pipe is unusable, and baton can no longer be watched. Err
            // on the side of the kill (a live baton would see PROGRAM die, and say so).
            Err(_) => break,
        }
    }
    // Never 0 or 1: kill(-1) would signal every process the guard may signal.
    if group > 1 {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    ExitCode::SUCCESS
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
    fn this_process_group_has_a_live_member_and_an_unused_one_has_none() {
        // SAFETY: getpgrp(2) has no preconditions.
        let own = unsafe { libc::getpgrp() };
        assert!(group_has_live_members(own).unwrap());
        // Above the kernel's PID limit (4194304 at most): no process group can have it.
        assert!(!group_has_live_members(5_000_000).unwrap());
    }
}
