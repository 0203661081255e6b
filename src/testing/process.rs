//! The processes behind every fixture: spawning a server that never outlives the test process,
//! signalling and reaping it without ever hitting a recycled PID, and the small file and port
//! chores each start needs (a private temp directory, a free loopback port, a log excerpt).
//!
//! Redis, Valkey, Sentinel, cluster and PostgreSQL servers differ in how they are configured and
//! when they are ready, not in how they live and die; that part is here, written once.
//!
//! A server never outlives the process that started it, however that process ends: on Linux
//! every server is spawned by one long-lived thread of the process and asks the kernel for a
//! signal when that thread dies (`PR_SET_PDEATHSIG`), which happens when the process exits or is
//! killed (`SIGKILL`, `SIGTERM`, a panic that aborts). Its data directory is left in the temp dir
//! then. Unix-only: signals are sent with `libc`.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How many fresh ports a first start tries. Losing the race for a port
/// (another process binds it between our probe and the server's bind) is rare, so a
/// handful of attempts makes it practically impossible to fail for that reason.
const START_ATTEMPTS: usize = 10;
/// How long one start attempt waits for the server to be ready.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Delay between two readiness probes (and between two polls of an exiting child).
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long `pause`/`resume` wait for the kernel to report the new state.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// At most this much of a log is quoted in an error message.
const LOG_EXCERPT_BYTES: usize = 8 * 1024;

/// Returns the child if it has not exited, reaping it (and clearing the slot)
/// if it has, so that its PID is never signalled after it may be recycled.
pub(super) fn live_child(slot: &mut Option<Child>) -> Option<&mut Child> {
    let exited = match slot.as_mut() {
        None => return None,
        // An error here means the child was already waited for elsewhere;
        // either way it is no longer ours to signal.
        Some(child) => !matches!(child.try_wait(), Ok(None)),
    };
    if exited {
        *slot = None;
    }
    slot.as_mut()
}

/// `SIGKILL`s the child and waits for it. `Child::kill` is a no-op error if the
/// child has already exited, which is fine here.
pub(super) fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `signal` to `pid`, which must be a child this module spawned and has
/// not yet reaped.
pub(super) fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} out of range"),
        )
    })?;
    // SAFETY: `kill(2)` has no memory-safety preconditions. The pid is our own
    // unreaped child (positive, so never a process group or "all processes"),
    // so it cannot refer to an unrelated, recycled process.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Polls `/proc/<pid>/stat` until the process is (or is no longer) stopped.
/// Gives up silently after [`SIGNAL_SETTLE_TIMEOUT`] or if `/proc` is not
/// available: the signal has been sent, this only narrows the window.
pub(super) fn wait_for_stopped_state(pid: u32, stopped: bool) {
    let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
    while Instant::now() < deadline {
        match process_state(pid) {
            Some(state) if (state == 'T') == stopped => return,
            Some(_) => thread::sleep(Duration::from_millis(1)),
            None => return,
        }
    }
}

/// The state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, ...), if readable.
pub(super) fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or
    // parentheses, so the state is the first field after the *last* ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

pub(super) fn is_executable(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(file)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Creates a fresh, uniquely named directory `<prefix>-<pid>-<n>-<nanos>` under the system temp
/// dir (absolute even if `TMPDIR` is relative); `what` names it in the error message.
pub(super) fn create_temp_dir(prefix: &str, what: &str) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut base = std::env::temp_dir();
    if base.is_relative() {
        // Redis chdirs into `--dir` (and postgres into its data directory), so a relative path
        // would resolve against the wrong directory.
        base = std::env::current_dir()?.join(base);
    }
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("{prefix}-{pid}-{n}-{nanos}"));
        // `create_dir` (not `create_dir_all`) fails if the name is taken, for
        // example by a leftover from an earlier process with the same PID.
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("cannot create {what} {}: {err}", dir.display()),
                ))
            }
        }
    }
}

/// Asks the kernel for a currently free loopback port.
///
/// The listener is dropped before the server binds the port, so another process
/// may grab it in between; a first start retries with a new port if so
/// ([`START_ATTEMPTS`]).
pub(super) fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!("cannot find a free port on 127.0.0.1: {err}"),
        )
    })?;
    Ok(listener.local_addr()?.port())
}

/// A spawn request for the spawner thread (the command and the signal the child gets when this
/// process dies), and where its answer goes.
type SpawnRequest = (Command, libc::c_int, mpsc::Sender<io::Result<Child>>);

/// Spawns a server process (`redis-server`, `initdb`, `postgres`) that gets `death_signal` when
/// this process dies.
///
/// `PR_SET_PDEATHSIG` signals the child when the *thread* that forked it exits,
/// not the process; tests and benchmarks create servers on short-lived threads
/// (each `#[test]` runs on its own), so forking there would kill the server
/// when its test thread ended. Every server is therefore forked by one
/// dedicated thread that is started on first use and never exits: it dies only
/// with the process, and takes its servers with it.
pub(super) fn spawn_dying_with_process(
    command: Command,
    death_signal: libc::c_int,
) -> io::Result<Child> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("baton-fixture-spawner".into())
            .spawn(move || {
                for (mut command, death_signal, reply) in rx {
                    die_with_this_process(&mut command, death_signal);
                    let _ = reply.send(command.spawn());
                }
                // Unreachable while `SPAWNER` holds the sender (a static: forever); should the
                // channel ever close, this thread must still not exit.
                loop {
                    thread::park();
                }
            })
            .ok()
            .map(|_| tx)
    });
    let Some(spawner) = spawner else {
        return Err(io::Error::other(
            "cannot start the test-server spawner thread",
        ));
    };
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, death_signal, reply))
        .map_err(|_| io::Error::other("the test-server spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the test-server spawner thread did not answer"))?
}

/// Makes the child get `signal` when the thread that forks it (the spawner) dies.
///
/// The `pre_exec` closure runs after std has switched to the child's `uid`/`gid` (if set):
/// changing credentials clears the parent-death signal, so it must be set afterwards.
#[cfg(target_os = "linux")]
fn die_with_this_process(command: &mut Command, signal: libc::c_int) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl(2) and getppid(2) are plain
    // system calls, and the errors are built without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The process died between fork and prctl: no signal will come, so do not start.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: servers are only stopped on drop.
#[cfg(not(target_os = "linux"))]
fn die_with_this_process(_command: &mut Command, _signal: libc::c_int) {}

/// Why a start attempt failed: worth another try, or not.
pub(super) enum Failure {
    /// The server exited early (typically: port taken) — try again.
    Retry(io::Error),
    /// Retrying cannot help (bad configuration, spawn error, timeout).
    Fatal(io::Error),
}

/// Starts a server on a fresh port (from `port`), trying another one while `launch` says the
/// port was lost to another process ([`Failure::Retry`]), up to [`START_ATTEMPTS`] times.
/// `what` names the server in the error.
pub(super) fn start_on_free_port(
    what: &str,
    mut port: impl FnMut() -> io::Result<u16>,
    mut launch: impl FnMut(u16) -> Result<Child, Failure>,
) -> io::Result<(Child, u16)> {
    let mut last_err = None;
    for _ in 0..START_ATTEMPTS {
        let port = port()?;
        match launch(port) {
            Ok(child) => return Ok((child, port)),
            Err(Failure::Retry(err)) => last_err = Some(err),
            Err(Failure::Fatal(err)) => return Err(err),
        }
    }
    let err = last_err.unwrap_or_else(|| io::Error::other(format!("{what} did not start")));
    Err(io::Error::new(
        err.kind(),
        format!("{what} did not start after {START_ATTEMPTS} attempts; last error: {err}"),
    ))
}

/// Polls the server with `ready` (given the child's PID; it returns why not yet) until it is
/// ready, or until the child exits or [`READY_TIMEOUT`] passes.
pub(super) fn wait_until_ready(
    child: &mut Child,
    mut ready: impl FnMut(u32) -> Result<(), String>,
) -> Result<(), WaitFailure> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        // Checked first so a server that died is reported at once rather than
        // after the full timeout.
        match child.try_wait() {
            Ok(Some(status)) => return Err(WaitFailure::Exited(status)),
            Ok(None) => {}
            Err(err) => return Err(WaitFailure::Io(err)),
        }
        let last = match ready(child.id()) {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(WaitFailure::TimedOut(last));
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Why waiting for a starting server gave up.
pub(super) enum WaitFailure {
    /// The child exited.
    Exited(ExitStatus),
    /// Our server was not ready within [`READY_TIMEOUT`] (no `PONG` naming our PID, no `ready`
    /// in `postmaster.pid`); the last reason it was not ready is attached.
    TimedOut(String),
    /// `try_wait` itself failed.
    Io(io::Error),
}

impl WaitFailure {
    /// The error kind of a failed start that ends so: a timeout, or anything else.
    pub(super) fn kind(&self) -> io::ErrorKind {
        match self {
            WaitFailure::TimedOut(_) => io::ErrorKind::TimedOut,
            WaitFailure::Exited(_) | WaitFailure::Io(_) => io::ErrorKind::Other,
        }
    }

    pub(super) fn reason(&self) -> String {
        match self {
            WaitFailure::Exited(status) => format!("exited during startup ({status})"),
            WaitFailure::TimedOut(last) => format!(
                "did not answer PING within {} s (last probe: {last})",
                READY_TIMEOUT.as_secs()
            ),
            WaitFailure::Io(err) => format!("could not be waited for: {err}"),
        }
    }
}

/// Reads the log from byte `offset` on, trimmed to its last
/// [`LOG_EXCERPT_BYTES`] for error messages.
pub(super) fn read_log_from(path: &Path, offset: u64) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let start = offset.max(len.saturating_sub(LOG_EXCERPT_BYTES as u64));
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(bytes) if bytes.is_empty() => "<empty>".to_owned(),
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) => format!("<cannot read {}: {err}>", path.display()),
    }
}

/// The PIDs of the processes whose parent is `parent` (a postmaster's backends and auxiliary
/// processes), read from `/proc/<pid>/stat`; empty where `/proc` cannot be read.
pub(super) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so the fields
            // are counted from the last `)`.
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Waits up to `timeout` for the child to exit: `Ok(None)` if it is still running then.
pub(super) fn wait_bounded(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// The offset of the cluster bus port from the client port (fixed in Redis and Valkey).
const BUS_OFFSET: u16 = 10000;
/// Client ports are picked from here: below the usual ephemeral range (32768 and up), and so
/// are their bus ports, so outgoing connections never take them.
const PORT_RANGE: std::ops::Range<u16> = 12000..22000;
/// How many random ports [`free_port_with_bus`] tries.
const PORT_ATTEMPTS: usize = 200;

/// A random free port in [`PORT_RANGE`] whose bus port (+10000) is free too, both checked by
/// binding them on 127.0.0.1. As with any probe, another process may take either before redis
/// binds it; the caller retries with another port then.
pub(super) fn free_port_with_bus() -> io::Result<u16> {
    let span = PORT_RANGE.end - PORT_RANGE.start;
    for _ in 0..PORT_ATTEMPTS {
        let mut bytes = [0u8; 2];
        getrandom::fill(&mut bytes).map_err(|err| io::Error::other(err.to_string()))?;
        let port = PORT_RANGE.start + u16::from_le_bytes(bytes) % span;
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        // Both listeners are dropped before the check returns, so both ports are free again.
        if free(port) && free(port + BUS_OFFSET) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "no free port in {PORT_RANGE:?} with a free cluster bus port after {PORT_ATTEMPTS} \
             tries"
        ),
    ))
}
