//! The faults of baton's own host, against `baton run`, `lock` and `leader` as child processes
//! on a private redis-server per test: a stderr nobody reads, a stderr whose reader is gone, a
//! stdout closed under `status`, and baton itself frozen (SIGSTOP) while PROGRAM works.
//!
//! What is checked is PROGRAM's own record: each PROGRAM appends `ID start|alive|end TOKEN NS`
//! lines (its process id, the fencing token, the wall clock in nanoseconds) to one file, and no
//! two PROGRAMs' spans may overlap. The guard (src/bin/baton/guard.rs) and the output queue
//! (src/bin/baton/out.rs) are what make them hold. Bounds are generous; nothing is timed.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::process::*;
use common::{server, shq, TempDir};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const EX_LOST: i32 = 74;

/// A PROGRAM that records its span in `log`: a `start` line, an `alive` line every 50 ms for
/// `seconds`, then `end`. `before` runs first (e.g. a write to stderr).
fn recorder(log: &Path, seconds: u32, before: &str) -> String {
    format!(
        "{before}
         now() {{ date +%s%N; }}
         echo \"$$ start ${{BATON_FENCING_TOKEN:-0}} $(now)\" >> {log}
         i=0
         while [ $i -lt {ticks} ]; do
           sleep 0.05
           echo \"$$ alive ${{BATON_FENCING_TOKEN:-0}} $(now)\" >> {log}
           i=$((i + 1))
         done
         echo \"$$ end ${{BATON_FENCING_TOKEN:-0}} $(now)\" >> {log}",
        log = shq(log),
        ticks = seconds * 20,
    )
}

/// One PROGRAM's span as it recorded it.
#[derive(Debug, Clone, Copy)]
struct Span {
    token: u64,
    first: u128,
    last: u128,
    ended: bool,
}

/// Every PROGRAM's span in `log`, by process id.
fn spans(log: &Path) -> BTreeMap<u32, Span> {
    let mut out: BTreeMap<u32, Span> = BTreeMap::new();
    for line in lines(log) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [pid, what, token, ns] = f[..] else {
            // A line cut short by SIGKILL mid-write.
            continue;
        };
        let (Ok(pid), Ok(token), Ok(ns)) = (pid.parse(), token.parse(), ns.parse::<u128>()) else {
            continue;
        };
        let s = out.entry(pid).or_insert(Span {
            token,
            first: ns,
            last: ns,
            ended: false,
        });
        s.first = s.first.min(ns);
        s.last = s.last.max(ns);
        s.ended |= what == "end";
    }
    out
}

/// Asserts that no two PROGRAMs' spans overlap; returns them in order of start.
fn assert_no_overlap(log: &Path) -> Vec<Span> {
    let mut all: Vec<Span> = spans(log).into_values().collect();
    all.sort_by_key(|s| s.first);
    for w in all.windows(2) {
        assert!(
            w[0].last < w[1].first,
            "two PROGRAMs ran at once: {:?} still ran {} ms after {:?} started",
            w[0],
            (w[0].last - w[1].first) / 1_000_000,
            w[1]
        );
    }
    all
}

/// Waits (bounded) until `log` has a `start` line from `count` PROGRAMs.
async fn started(log: &Path, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while spans(log).len() < count {
        assert!(
            Instant::now() < deadline,
            "PROGRAM #{count} never started: {:?}",
            lines(log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn baton(url: &str, args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("--url").arg(url).args(args);
    cmd
}

fn signal(child: &Child, sig: libc::c_int) {
    let pid = child.id().expect("baton still runs") as libc::pid_t;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2(2) writes two new descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just opened and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Whether process `pid` is gone or a zombie (its leader ended; baton has not reaped it).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z"),
    }
}

/// `baton run` whose stderr is a pipe nobody reads, kept full by PROGRAM's own output,
/// while a 1.2 s pause of Redis makes an extension fail: the error line baton then writes
/// must not block the thread that keeps the lease and supervises PROGRAM. Before the output
/// queue it did (`wchan=anon_pipe_write`): the lease lapsed and the backup ran attempt 2
/// while attempt 1's PROGRAM still ran.
#[tokio::test]
async fn a_stderr_nobody_reads_never_lets_two_programs_run_at_once() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("stalled-stderr");
    let log = dir.path("spans");
    let (reader, writer) = pipe();
    // More than the pipe holds, in the background: the pipe stays full while PROGRAM works.
    let holder = recorder(&log, 6, "(head -c 70000 /dev/zero >&2 &)");
    let mut a = baton(
        &url,
        &[
            "run",
            "--key",
            "stall",
            "--lock-timeout",
            "2s",
            "-v",
            "--",
            "sh",
            "-c",
            &holder,
        ],
    );
    a.stderr(Stdio::from(writer));
    let a = spawn(&mut a);
    started(&log, 1).await;
    let backup = recorder(&log, 1, "");
    let b = spawn(&mut baton(
        &url,
        &[
            "run",
            "--key",
            "stall",
            "--lock-timeout",
            "2s",
            "--",
            "sh",
            "-c",
            &backup,
        ],
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    srv.single().pause().expect("pause redis");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    srv.single().resume().expect("resume redis");
    let deadline = Instant::now() + Duration::from_secs(30);
    let oa = finish_by(a, deadline, "holder").await;
    let ob = finish_by(b, deadline, "backup").await;
    drop(reader);
    let spans = assert_no_overlap(&log);
    // The job ended once: either the holder kept its lease and finished (the backup then ends
    // "done by another worker"), or it lost it and was stopped before the backup ran.
    assert_eq!(code(&ob), 0, "backup: {}", describe(&ob));
    assert!(
        [0, EX_LOST].contains(&code(&oa)),
        "holder: {}",
        describe(&oa)
    );
    assert!(spans.iter().any(|s| s.ended), "{spans:?}");
}

/// `baton run -v` whose stderr's reader is gone: writing a line is EPIPE, which once panicked
/// (exit 101) and killed PROGRAM mid-work. The job completes and is recorded DONE.
#[tokio::test]
async fn a_closed_stderr_ends_batons_output_not_the_job() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("closed-stderr");
    let log = dir.path("spans");
    let (reader, writer) = pipe();
    drop(reader);
    let work = recorder(&log, 1, "");
    let mut a = baton(
        &url,
        &["run", "--key", "epipe", "-v", "--", "sh", "-c", &work],
    );
    a.stderr(Stdio::from(writer));
    let out = finish_by(
        spawn(&mut a),
        Instant::now() + Duration::from_secs(20),
        "run",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(spans(&log).values().all(|s| s.ended), "{:?}", lines(&log));
    let status = finish_by(
        spawn(&mut baton(&url, &["status", "--key", "epipe"])),
        Instant::now() + Duration::from_secs(10),
        "status",
    )
    .await;
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("DONE"), "{}", describe(&status));
}

/// `baton status` and `watch` whose stdout is closed (`| head -0`) end quietly: no panic.
#[tokio::test]
async fn status_and_watch_on_a_closed_stdout_exit_quietly() {
    let srv = server();
    let url = srv.url();
    let done = finish_by(
        spawn(&mut baton(&url, &["run", "--key", "shown", "--", "true"])),
        Instant::now() + Duration::from_secs(10),
        "run",
    )
    .await;
    assert_eq!(code(&done), 0, "{}", describe(&done));
    for args in [
        &["status", "--key", "shown"][..],
        &["status"][..],
        &["watch", "--key", "shown"][..],
    ] {
        let (reader, writer) = pipe();
        drop(reader);
        let mut cmd = baton(&url, args);
        cmd.stdout(Stdio::from(writer));
        let out = finish_by(
            spawn(&mut cmd),
            Instant::now() + Duration::from_secs(10),
            "cmd",
        )
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {}", describe(&out));
        assert_ne!(code(&out), 101, "{args:?}: {}", describe(&out));
    }
}

/// Which command holds the lease in [`frozen_baton`].
#[derive(Debug, Clone, Copy)]
enum Cmd {
    Run,
    Lock,
    Leader,
}

impl Cmd {
    fn args(self, key: &str, program: &str, holder: bool) -> Vec<String> {
        let mut args: Vec<String> = match self {
            Cmd::Run => vec!["run".into(), "--lock-timeout".into(), "2s".into()],
            Cmd::Lock => vec!["lock".into(), "--ttl".into(), "2s".into()],
            Cmd::Leader => vec!["leader".into(), "--lease".into(), "2s".into()],
        };
        args.extend(["--key".into(), key.into()]);
        if holder {
            args.extend(["--kill-grace".into(), "300ms".into()]);
        }
        args.extend(["--".into(), "sh".into(), "-c".into(), program.into()]);
        args
    }
}

/// baton frozen by SIGSTOP while its PROGRAM works (a debugger, a frozen cgroup): nothing of
/// baton's own runs, so only the guard can stop PROGRAM before the lease passes on. Before the
/// guard enforced the lease, PROGRAM ran on beside the backup's.
async fn frozen_baton(cmd: Cmd) {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("frozen");
    let log = dir.path("spans");
    let key = format!("frozen-{cmd:?}").to_lowercase();
    let holder = recorder(&log, 20, "");
    let mut a = spawn(&mut baton(
        &url,
        &cmd.args(&key, &holder, true)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ));
    started(&log, 1).await;
    let first = *spans(&log).keys().next().expect("one PROGRAM");
    signal(&a, libc::SIGSTOP);
    let backup = recorder(&log, 1, "");
    let b = spawn(&mut baton(
        &url,
        &cmd.args(&key, &backup, false)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ));
    let ob = finish_by(b, Instant::now() + Duration::from_secs(30), "backup").await;
    assert_eq!(code(&ob), 0, "{cmd:?} backup: {}", describe(&ob));
    // Checked while baton is still frozen: the guard alone stopped PROGRAM's group.
    assert!(gone(first), "{cmd:?}: PROGRAM {first} still runs");
    let all = assert_no_overlap(&log);
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        !all[0].ended,
        "{cmd:?}: the frozen holder's PROGRAM was stopped: {all:?}"
    );
    assert!(all[1].ended, "{all:?}");
    assert!(
        all[1].token > all[0].token,
        "{cmd:?}: the backup's token is higher: {all:?}"
    );
    signal(&a, libc::SIGCONT);
    if let Cmd::Leader = cmd {
        // A resumed leader campaigns again (and may lead again): stop it once it has said why
        // its term ended.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut stderr = a.stderr.take().expect("stderr");
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while !text.contains("stopped by the guard") {
            use tokio::io::AsyncReadExt;
            let n = tokio::time::timeout_at(deadline, stderr.read(&mut buf))
                .await
                .expect("the resumed leader says why its term ended")
                .expect("read stderr");
            assert!(n > 0, "{cmd:?}: stderr ended: {text}");
            text += &String::from_utf8_lossy(&buf[..n]);
        }
        return;
    }
    let oa: Output = finish_by(a, Instant::now() + Duration::from_secs(15), "holder").await;
    assert_eq!(code(&oa), EX_LOST, "{cmd:?} holder: {}", describe(&oa));
    let stderr = String::from_utf8_lossy(&oa.stderr);
    assert!(
        stderr.contains("stopped by the guard: no extension confirmed by"),
        "{cmd:?}: {}",
        describe(&oa)
    );
    assert!(!stderr.contains("killed by signal"), "{}", describe(&oa));
}

#[tokio::test]
async fn a_frozen_baton_run_cannot_keep_program_past_its_lease() {
    frozen_baton(Cmd::Run).await;
}

#[tokio::test]
async fn a_frozen_baton_lock_cannot_keep_program_past_its_lease() {
    frozen_baton(Cmd::Lock).await;
}

#[tokio::test]
async fn a_frozen_baton_leader_cannot_keep_program_past_its_lease() {
    frozen_baton(Cmd::Leader).await;
}

/// The guard stops PROGRAM for a frozen baton and reports it; baton, resumed, must say so and
/// exit 74 however the two interleave. A debug build's guard can be held between its report
/// and its signal (`BATON_TEST_GUARD_STEP_DELAY_MS`): when it signalled first and reported
/// after, a baton resumed in between reaped a PROGRAM ended by SIGTERM with no report to read
/// yet, and exited 143 as if PROGRAM had been signalled by someone else (the chaos harness's
/// intermittent X4 with `--profile cli --seed 6532274453`).
#[tokio::test]
async fn a_resumed_baton_never_mistakes_the_guards_signal_for_programs_own() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("guard-order");
    let log = dir.path("spans");
    let holder = recorder(&log, 20, "");
    let mut cmd = baton(
        &url,
        &[
            "run",
            "--lease",
            "2s",
            "--kill-grace",
            "300ms",
            "--key",
            "guard-order",
            "--",
            "sh",
            "-c",
            &holder,
        ],
    );
    cmd.env("BATON_TEST_GUARD_STEP_DELAY_MS", "3000");
    let a = spawn(&mut cmd);
    started(&log, 1).await;
    signal(&a, libc::SIGSTOP);
    // The last confirmed extension is at most 2 s old, so the guard's SIGTERM step (300 ms
    // before the deadline) comes within 1.7 s; it then waits 3 s before its second half.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    signal(&a, libc::SIGCONT);
    let oa: Output = finish_by(a, Instant::now() + Duration::from_secs(20), "holder").await;
    let stderr = String::from_utf8_lossy(&oa.stderr);
    assert_eq!(code(&oa), EX_LOST, "{}", describe(&oa));
    assert!(
        stderr.contains("stopped by the guard: no extension confirmed by"),
        "{}",
        describe(&oa)
    );
}
