//! `baton run` in a terminal, without tmux: each test opens a pseudo-terminal and starts baton as
//! the leader of a new session whose controlling terminal is the pty's slave end (stdin, stdout
//! and stderr on it), as a login shell would run a foreground job. What a user types is written
//! to the master end: a line, Ctrl-C (0x03), Ctrl-Z (0x1a). Every wait is bounded; on a timeout
//! PROGRAM and baton are killed by PID before the test fails.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use common::{get, lease_key, raw, server, shq, state_key, TempDir};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for anything that should happen at once.
const QUICK: Duration = Duration::from_secs(10);

/// Ctrl-C and Ctrl-Z as the terminal's default settings (VINTR, VSUSP) know them.
const CTRL_C: u8 = 0x03;
const CTRL_Z: u8 = 0x1a;

/// A pseudo-terminal: the master end (non-blocking) and what was read from it so far.
struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
    output: Vec<u8>,
}

impl Pty {
    fn open() -> Pty {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two file descriptors into the locals; name, termios and winsize
        // may be null (the kernel's defaults: canonical mode, echo, ISIG with ^C and ^Z).
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned by nothing else.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        // SAFETY: fcntl on a valid descriptor.
        unsafe {
            let flags = libc::fcntl(master.as_raw_fd(), libc::F_GETFL);
            assert!(flags >= 0);
            assert_eq!(
                libc::fcntl(master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK),
                0
            );
        }
        Pty {
            master,
            slave,
            output: Vec::new(),
        }
    }

    /// Reads whatever the terminal shows now (so writers on the slave never block).
    fn pump(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads at most buf.len() bytes into buf from a valid descriptor.
            let n =
                unsafe { libc::read(self.master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return; // EAGAIN: nothing more now; EIO: no slave left open.
            }
            self.output.extend_from_slice(&buf[..n as usize]);
        }
    }

    /// Types `bytes` on the terminal.
    fn type_bytes(&self, bytes: &[u8]) {
        // SAFETY: writes bytes.len() bytes from a valid slice to a valid descriptor.
        let n = unsafe { libc::write(self.master.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize, "write to the pty master");
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

/// `baton SUB --redis-url URL ARGS...` in a new session whose controlling terminal is `pty`.
fn baton_on(pty: &Pty, sub: &str, url: &str, args: &[&str]) -> Child {
    let stdio = |pty: &Pty| Stdio::from(pty.slave.try_clone().expect("dup the pty slave"));
    let mut cmd = Command::new(BATON);
    cmd.arg(sub)
        .arg("--redis-url")
        .arg(url)
        .args(args)
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_URL")
        .env_remove("BATON_REDIS_PASSWORD_FILE")
        .env_remove("BATON_TLS_CA_FILE")
        .env_remove("BATON_TLS_CERT_FILE")
        .env_remove("BATON_TLS_KEY_FILE")
        .stdin(stdio(pty))
        .stdout(stdio(pty))
        .stderr(stdio(pty))
        .kill_on_drop(true);
    // SAFETY: signal(2), setsid(2) and ioctl(2) are async-signal-safe and allocate nothing.
    unsafe {
        cmd.pre_exec(|| {
            // As an interactive shell starts a job: a test run started in the background by a
            // script (`cmd &`) inherits SIGINT and SIGQUIT ignored, and baton and PROGRAM would
            // keep them ignored (Ctrl-C would do nothing).
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            // A new session (and process group) with the pty as its controlling terminal; the
            // session leader's group becomes the terminal's foreground group.
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn baton")
}

/// The process state letter from /proc (R, S, T, Z, ...), `None` once the process is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
}

fn alive(pid: u32) -> bool {
    !matches!(state(pid), Some('Z' | 'X') | None)
}

/// A running baton and, once known, its PROGRAM: killed by PID if the test gives up.
struct Run {
    baton: Child,
    baton_pid: u32,
    program: Option<u32>,
}

impl Run {
    /// `baton run ARGS...`.
    fn start(pty: &Pty, url: &str, args: &[&str]) -> Run {
        Run::start_sub(pty, "run", url, args)
    }

    fn start_sub(pty: &Pty, sub: &str, url: &str, args: &[&str]) -> Run {
        let baton = baton_on(pty, sub, url, args);
        let baton_pid = baton.id().expect("baton's pid");
        Run {
            baton,
            baton_pid,
            program: None,
        }
    }

    /// Kills PROGRAM (first, while baton has not reaped it, so its PID is still PROGRAM's) and
    /// baton, then fails the test.
    fn give_up(&mut self, pty: &mut Pty, why: &str) -> ! {
        if let Some(pid) = self.program.filter(|&p| alive(p)) {
            // SAFETY: kill(2) on PROGRAM, a child of our baton that is still alive.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = self.baton.start_kill();
        pty.pump();
        panic!(
            "{why}\nbaton state {:?}, PROGRAM {:?} state {:?}\n--- terminal ---\n{}",
            state(self.baton_pid),
            self.program,
            self.program.and_then(state),
            pty.text()
        );
    }

    /// Polls (pumping the terminal) until `pred` holds, giving up after `within`.
    async fn until(
        &mut self,
        pty: &mut Pty,
        within: Duration,
        what: &str,
        mut pred: impl FnMut(&mut Self, &Pty) -> bool,
    ) {
        let deadline = Instant::now() + within;
        loop {
            pty.pump();
            if pred(self, pty) {
                return;
            }
            if Instant::now() >= deadline {
                self.give_up(pty, &format!("not within {within:?}: {what}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for PROGRAM's `echo $$ > FILE`.
    async fn program_started(&mut self, pty: &mut Pty, pidfile: &Path) -> u32 {
        self.until(pty, QUICK, "PROGRAM wrote its PID", |_, _| {
            std::fs::read_to_string(pidfile).is_ok_and(|t| t.ends_with('\n'))
        })
        .await;
        let pid = std::fs::read_to_string(pidfile)
            .unwrap()
            .trim()
            .parse()
            .expect("a PID");
        self.program = Some(pid);
        pid
    }

    /// Waits for baton to exit.
    async fn exit(&mut self, pty: &mut Pty, within: Duration, what: &str) -> ExitStatus {
        let mut status = None;
        self.until(pty, within, what, |run, _| {
            status = run.baton.try_wait().expect("try_wait");
            status.is_some()
        })
        .await;
        pty.pump();
        status.expect("exited")
    }
}

/// baton on a fresh terminal running `sh -c 'echo $$ > PIDFILE; read x; AFTER'` for job `key`
/// (with `--lock-timeout LEASE` when given), once PROGRAM has written its PID.
struct Session {
    srv: baton::testing::RedisServer,
    _dir: TempDir,
    pty: Pty,
    run: Run,
    program: u32,
}

async fn session(key: &str, lease: Option<&str>, after_read: &str) -> Session {
    let srv = server().into_single();
    let dir = TempDir::new(key);
    let pidfile = dir.path("pid");
    let script = format!("echo $$ > {}; read x; {after_read}", shq(&pidfile));
    let mut pty = Pty::open();
    let mut args = vec!["--key", key];
    if let Some(lease) = lease {
        args.extend(["--lock-timeout", lease]);
    }
    args.extend(["--", "sh", "-c", &script]);
    let mut run = Run::start(&pty, &srv.url(), &args);
    let program = run.program_started(&mut pty, &pidfile).await;
    Session {
        srv,
        _dir: dir,
        pty,
        run,
        program,
    }
}

#[tokio::test]
async fn a_line_typed_on_the_terminal_reaches_the_program_and_the_job_is_done() {
    let Session {
        srv,
        _dir,
        mut pty,
        mut run,
        program: _,
    } = session("tty-read", None, "echo \"got:$x\"").await;
    pty.type_bytes(b"hello\n");
    let status = run.exit(&mut pty, QUICK, "baton exits").await;
    let text = pty.text();
    assert_eq!(status.code(), Some(0), "{status:?}; terminal:\n{text}");
    assert!(text.contains("got:hello"), "PROGRAM read the line: {text}");
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("tty-read")).await.as_deref(),
        Some("DONE")
    );
}

#[tokio::test]
async fn ctrl_c_ends_the_program_and_baton() {
    let Session {
        srv,
        _dir,
        mut pty,
        mut run,
        program,
    } = session("tty-intr", None, "echo after-read").await;
    // PROGRAM is blocked in `read` on the terminal (sleeping, not stopped).
    run.until(&mut pty, QUICK, "PROGRAM waits in read", |_, _| {
        state(program) == Some('S')
    })
    .await;
    pty.type_bytes(&[CTRL_C]);
    let status = run
        .exit(&mut pty, Duration::from_secs(5), "baton exits after Ctrl-C")
        .await;
    let text = pty.text();
    assert_eq!(status.code(), Some(130), "{status:?}; terminal:\n{text}");
    assert!(!alive(program), "PROGRAM (pid {program}) outlived Ctrl-C");
    assert!(!text.contains("after-read"), "{text}");
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &lease_key("tty-intr")).await,
        None,
        "the attempt was released"
    );
}

#[tokio::test]
async fn ctrl_z_stops_both_and_a_continue_after_the_lease_ran_out_exits_74() {
    let Session {
        srv: _srv,
        _dir,
        mut pty,
        mut run,
        program,
    } = session("tty-tstp", Some("1s"), "echo after-read").await;
    pty.type_bytes(&[CTRL_Z]);
    let baton = run.baton_pid;
    run.until(&mut pty, QUICK, "PROGRAM and baton both stopped", |_, _| {
        state(program) == Some('T') && state(baton) == Some('T')
    })
    .await;
    // Longer than the 1 s lease: nothing keeps it alive while baton is stopped.
    let stopped = Instant::now();
    run.until(&mut pty, QUICK, "the lease ran out", |_, _| {
        stopped.elapsed() >= Duration::from_millis(2500)
    })
    .await;
    assert_eq!(state(baton), Some('T'), "baton stayed stopped");
    // SAFETY: kill(2) on the baton this test started, which is alive (stopped).
    unsafe {
        libc::kill(baton as libc::pid_t, libc::SIGCONT);
    }
    let status = run
        .exit(&mut pty, QUICK, "baton exits once continued")
        .await;
    let text = pty.text();
    assert_eq!(status.code(), Some(74), "{status:?}; terminal:\n{text}");
    assert!(
        !alive(program),
        "PROGRAM (pid {program}) outlived its lost lease"
    );
    assert!(!text.contains("after-read"), "PROGRAM went on: {text}");
}

#[tokio::test]
async fn ctrl_z_then_a_continue_within_the_lease_resumes_the_program_with_the_terminal() {
    let Session {
        srv,
        _dir,
        mut pty,
        mut run,
        program,
    } = session("tty-cont", Some("10s"), "echo \"got:$x\"").await;
    pty.type_bytes(&[CTRL_Z]);
    let baton = run.baton_pid;
    run.until(&mut pty, QUICK, "PROGRAM and baton both stopped", |_, _| {
        state(program) == Some('T') && state(baton) == Some('T')
    })
    .await;
    // SAFETY: kill(2) on the baton this test started, which is alive (stopped).
    unsafe {
        libc::kill(baton as libc::pid_t, libc::SIGCONT);
    }
    run.until(&mut pty, QUICK, "PROGRAM continued", |_, _| {
        state(program) != Some('T')
    })
    .await;
    // PROGRAM has the terminal again: it reads the line instead of stopping on SIGTTIN.
    pty.type_bytes(b"again\n");
    let status = run.exit(&mut pty, QUICK, "baton exits").await;
    let text = pty.text();
    assert_eq!(status.code(), Some(0), "{status:?}; terminal:\n{text}");
    assert!(text.contains("got:again"), "PROGRAM read the line: {text}");
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("tty-cont")).await.as_deref(),
        Some("DONE")
    );
}

/// `baton leader` in a terminal: Ctrl-C reaches PROGRAM's group only (it has the terminal), yet
/// it keeps the meaning `baton leader --help` gives SIGINT: PROGRAM stopped, the leadership
/// resigned at once (not left to run out its lease), exit 0.
#[tokio::test]
async fn ctrl_c_on_a_leader_stops_the_program_resigns_and_exits_0() {
    let srv = server().into_single();
    let dir = TempDir::new("tty-leader");
    let pidfile = dir.path("pid");
    let script = format!("echo $$ > {}; read x; echo after-read", shq(&pidfile));
    let mut pty = Pty::open();
    let args = [
        "--key", "tty-lead", "--lease", "30s", "--", "sh", "-c", &script,
    ];
    let mut run = Run::start_sub(&pty, "leader", &srv.url(), &args);
    let program = run.program_started(&mut pty, &pidfile).await;
    run.until(&mut pty, QUICK, "PROGRAM waits in read", |_, _| {
        state(program) == Some('S')
    })
    .await;
    let mut conn = raw(&srv).await;
    let key = "baton:leader:{tty-lead}";
    assert!(get(&mut conn, key).await.is_some(), "baton leads");
    pty.type_bytes(&[CTRL_C]);
    let status = run.exit(&mut pty, QUICK, "baton exits after Ctrl-C").await;
    let text = pty.text();
    assert_eq!(status.code(), Some(0), "{status:?}; terminal:\n{text}");
    assert!(!alive(program), "PROGRAM (pid {program}) outlived Ctrl-C");
    assert!(!text.contains("after-read"), "{text}");
    // Resigned: the 30 s lease is gone now, so a standby would lead at once.
    assert_eq!(
        get(&mut conn, key).await,
        None,
        "the leadership was resigned"
    );
}
