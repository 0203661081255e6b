//! baton's own output, written so that no output can stall coordination.
//!
//! The thread that runs the lease's watchdog and PROGRAM's supervisor is the CLI's only runtime
//! thread. A blocking write on it (a log pipe whose reader stopped reading, an events file on a
//! hung NFS mount) would stop the watchdog while PROGRAM runs on: the lease lapses and a backup
//! runs the job a second time beside it. So every line baton writes while it coordinates goes
//! into a bounded queue ([`Queue`]), drained by a writer thread of its own that alone blocks in
//! `write(2)`:
//!
//! - **Full queue: drop and count.** A line that finds the queue full is dropped, and the next
//!   line that fits is preceded by "baton: 120 messages dropped: stderr is not being read" (a
//!   JSON line with `--json`), so a reader that comes back learns what it missed.
//! - **A closed reader ends the output, never baton.** `EPIPE` (SIGPIPE is ignored by Rust
//!   programs) or any other write error closes that output for good: later lines are
//!   discarded. `eprintln!` would panic here (exit 101) and kill PROGRAM mid-work.
//! - **No `O_NONBLOCK` on inherited descriptors.** stderr is shared with PROGRAM, which would
//!   get `EAGAIN` from its own writes. The writer thread blocks instead; if someone else made
//!   the descriptor non-blocking it waits for it with `poll(2)`.
//! - **The writer never forks.** PROGRAM is forked from the main thread, which lives as long as
//!   the process: the parent-death signal follows the forking thread.
//! - **Exit does not wait for a stuck writer.** [`finish`] gives the queue a moment to drain
//!   while the writer makes progress, then baton exits: the process's end takes the blocked
//!   thread with it.
//!
//! `status`, `watch` and `unlock` print their answers on stdout with [`outln!`]: those commands
//! hold no lease, so a blocking write is harmless there, but a closed stdout (`baton status |
//! head -1`) ends them quietly instead of with a panic.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How many lines stderr's queue holds before it drops: a burst of errors during an outage
/// (one a second at most, per worker) fits many times over; a reader gone for minutes does not,
/// and then memory stays bounded.
const STDERR_LINES: usize = 1024;
/// The events file's queue (`--events`): every event is a line there, `Status` ones included.
const FILE_LINES: usize = 4096;
/// How long [`finish`] waits for a queue to drain at most, and how long without any progress.
const FINISH_AT_MOST: Duration = Duration::from_secs(2);
const FINISH_STALLED: Duration = Duration::from_millis(200);

/// What a queue's writer thread and its users share.
struct Shared {
    /// Lines dropped since the last drop notice was queued.
    dropped: AtomicU64,
    /// Lines queued and not yet written (or discarded).
    pending: AtomicUsize,
    /// Bumped after every completed write: [`finish`] waits only while it moves.
    progress: AtomicU64,
    /// The output failed (EPIPE, EBADF, ...): nothing more is written.
    closed: AtomicBool,
}

/// A bounded queue of lines and the thread that writes them to one descriptor.
pub(crate) struct Queue {
    tx: SyncSender<Vec<u8>>,
    shared: Arc<Shared>,
    /// The drop notice for `n` lines, as a whole line (newline included).
    notice: fn(u64, bool) -> String,
    /// Whether the notice is written as a JSON line.
    json: AtomicBool,
}

impl Queue {
    /// A queue of `lines` lines written to `fd` by a new thread named `name`. `fd` must stay
    /// open for the life of the process (stderr, or a file the queue owns through `keep`).
    fn start(
        fd: RawFd,
        keep: Option<std::fs::File>,
        lines: usize,
        name: &str,
        notice: fn(u64, bool) -> String,
    ) -> std::io::Result<Queue> {
        let (tx, rx) = sync_channel::<Vec<u8>>(lines);
        let shared = Arc::new(Shared {
            dropped: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            progress: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _keep = keep;
                writer(fd, &rx, &theirs);
            })?;
        Ok(Queue {
            tx,
            shared,
            notice,
            json: AtomicBool::new(false),
        })
    }

    /// Queues `line` (a newline is added), or drops and counts it when the queue is full.
    /// Never blocks.
    pub(crate) fn line(&self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.bytes(bytes);
    }

    /// Queues `bytes` as they are (whole lines), or drops and counts them. Never blocks.
    pub(crate) fn bytes(&self, bytes: Vec<u8>) {
        if self.shared.closed.load(Ordering::Relaxed) {
            return;
        }
        // Lines dropped before this one are announced first, in their place in the stream.
        let dropped = self.shared.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            let notice = (self.notice)(dropped, self.json.load(Ordering::Relaxed));
            if !self.send(notice.into_bytes()) {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            self.shared.dropped.fetch_sub(dropped, Ordering::Relaxed);
        }
        if !self.send(bytes) {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn send(&self, bytes: Vec<u8>) -> bool {
        self.shared.pending.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(bytes) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.pending.fetch_sub(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Waits until what is queued is written, while the writer makes progress, for
    /// [`FINISH_AT_MOST`] at most.
    fn finish(&self) {
        let start = Instant::now();
        let mut seen = self.shared.progress.load(Ordering::Relaxed);
        let mut moved = Instant::now();
        while self.shared.pending.load(Ordering::Relaxed) > 0
            && !self.shared.closed.load(Ordering::Relaxed)
            && start.elapsed() < FINISH_AT_MOST
            && moved.elapsed() < FINISH_STALLED
        {
            std::thread::sleep(Duration::from_millis(2));
            let now = self.shared.progress.load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                moved = Instant::now();
            }
        }
    }

    /// Lines dropped and not announced yet (tests and the exit path read it).
    #[cfg(test)]
    fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// The writer thread: writes every queued line whole, in order, until the output fails.
fn writer(fd: RawFd, rx: &Receiver<Vec<u8>>, shared: &Shared) {
    while let Ok(bytes) = rx.recv() {
        if !shared.closed.load(Ordering::Relaxed) && write_all(fd, &bytes).is_err() {
            // EPIPE (the reader is gone), EBADF, EIO, ENOSPC: this output is over. What is
            // queued and what comes later is discarded; baton goes on.
            shared.closed.store(true, Ordering::Relaxed);
        }
        shared.pending.fetch_sub(1, Ordering::Relaxed);
        shared.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// `write(2)` until all of `bytes` is written. `EINTR` is retried; `EAGAIN` (a descriptor
/// someone else made non-blocking) waits for room with `poll(2)`.
fn write_all(fd: RawFd, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: write(2) reads at most `bytes.len()` bytes from a valid slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n >= 0 {
            // `n` is at most `bytes.len()`: the cast cannot lose anything.
            bytes = &bytes[(n as usize).min(bytes.len())..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: poll(2) on one valid pollfd. Its result does not matter: the write
                // that follows says whether there is room.
                unsafe {
                    libc::poll(&mut pfd, 1, 1000);
                }
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

fn stderr_notice(n: u64, json: bool) -> String {
    if json {
        format!(
            "{}\n",
            serde_json::json!({
                "event": "dropped",
                "messages": n,
                "reason": "stderr is not being read",
            })
        )
    } else {
        format!("baton: {n} messages dropped: stderr is not being read\n")
    }
}

fn file_notice(n: u64, _json: bool) -> String {
    format!(
        "{}\n",
        serde_json::json!({
            "event": "dropped",
            "messages": n,
            "reason": "the events file could not be written fast enough",
        })
    )
}

/// stderr's queue, started on first use. `None` when its thread could not be started: lines
/// are then dropped, and baton coordinates on (it never blocks on stderr).
fn stderr_queue() -> Option<&'static Queue> {
    static STDERR: OnceLock<Option<Queue>> = OnceLock::new();
    STDERR
        .get_or_init(|| {
            Queue::start(
                std::io::stderr().as_raw_fd(),
                None,
                STDERR_LINES,
                "baton-stderr",
                stderr_notice,
            )
            .ok()
        })
        .as_ref()
}

/// Writes `line` and a newline to stderr through its queue: never blocks, never panics.
pub(crate) fn err(line: &str) {
    if let Some(q) = stderr_queue() {
        q.line(line);
    }
}

/// Whether `--quiet` was given: baton's own lines on stderr are then only errors (see
/// [`quiet`]).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Sets `--quiet` for the whole process (once, right after the command line is parsed).
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given. Under it baton writes only errors: lines that explain a
/// non-zero exit status (a failed or exhausted job, a lost lock or leadership, a server that
/// kept failing); never how a run went when it went well (the occurrence it bound to, "done
/// elsewhere", "skipped"), retries in progress, or warnings. PROGRAM's own output is PROGRAM's.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Words stderr's drop notice as a JSON line (`--json`: every line on stderr is one).
pub(crate) fn set_json(json: bool) {
    if let Some(q) = stderr_queue() {
        q.json.store(json, Ordering::Relaxed);
    }
}

/// The events files' queues, so that [`finish`] drains them too.
static FILES: std::sync::Mutex<Vec<Arc<Queue>>> = std::sync::Mutex::new(Vec::new());

/// Gives the events files' and stderr's queues a moment to drain before baton exits (see
/// [`Queue::finish`]).
pub(crate) fn finish() {
    let files = match FILES.lock() {
        Ok(f) => f.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    for q in files {
        q.finish();
    }
    if let Some(q) = stderr_queue() {
        q.finish();
    }
}

/// A file written through a queue of its own (`--events`): appends whole lines without ever
/// blocking the caller. Clones share the queue (and its thread), so the lines of the
/// occurrences `baton schedule` runs at once never interleave.
#[derive(Clone)]
pub(crate) struct FileOut {
    queue: Arc<Queue>,
}

impl FileOut {
    /// Starts the writer of `file`.
    pub(crate) fn start(file: std::fs::File) -> std::io::Result<FileOut> {
        let fd = file.as_raw_fd();
        let queue = Arc::new(Queue::start(
            fd,
            Some(file),
            FILE_LINES,
            "baton-events",
            file_notice,
        )?);
        match FILES.lock() {
            Ok(mut f) => f.push(queue.clone()),
            Err(poisoned) => poisoned.into_inner().push(queue.clone()),
        }
        Ok(FileOut { queue })
    }

    /// Appends `line` and a newline; dropped and counted when the file falls behind.
    pub(crate) fn line(&self, line: &str) {
        self.queue.line(line);
    }
}

/// The `--verbose --verbose` tracing output's writer: each formatted event goes into stderr's
/// queue, like every other line.
pub(crate) struct TracingWriter;

impl Write for TracingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(q) = stderr_queue() {
            q.bytes(buf.to_vec());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether stdout was found closed by [`print`]: `watch` stops then.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stdout (blocking: only the commands that hold no lease print there). A
/// closed stdout is not an error: the output ends quietly and [`stdout_closed`] says so.
pub(crate) fn print(text: &str) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Whether a write to stdout failed (its reader is gone): a command printing a stream stops.
pub(crate) fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Whether `fd` is still open in this process (for tests of the writer).
#[cfg(test)]
fn is_open(fd: RawFd) -> bool {
    // SAFETY: fcntl(F_GETFD) on any number has no memory-safety preconditions.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// `eprintln!` for baton's own lines: through stderr's queue (never blocks, never panics).
macro_rules! say {
    ($($arg:tt)*) => {
        out::err(&format!($($arg)*))
    };
}

/// [`say!`] unless `--quiet`: for the lines that are not errors.
macro_rules! tell {
    ($($arg:tt)*) => {
        if !out::quiet() {
            out::err(&format!($($arg)*))
        }
    };
}

/// `println!` for the answers of `status`, `watch` and `unlock`: a closed stdout ends the
/// output quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        out::print(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// [`outln!`] unless `--quiet`: the confirmation of a command that changed something (`reset`,
/// `fail`, `unlock`), which a script that runs it quietly does not want on stdout.
macro_rules! doneln {
    ($($arg:tt)*) => {
        if !out::quiet() {
            out::print(&format!("{}\n", format_args!($($arg)*)))
        }
    };
}

/// `print!` with [`outln!`]'s handling of a closed stdout.
macro_rules! out {
    ($($arg:tt)*) => {
        out::print(&format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2(2) writes two new descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both were just opened and are owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn read_available(fd: &OwnedFd) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
                break;
            }
            // SAFETY: read(2) into a valid local buffer.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        String::from_utf8(out).unwrap()
    }

    /// A pipe nobody reads: queuing never blocks, the overflow is counted, and once the reader
    /// reads again the notice says how many lines it missed, in their place.
    #[test]
    fn a_stalled_reader_never_blocks_the_caller_and_hears_what_it_missed() {
        let (r, w) = pipe();
        let fd = w.as_raw_fd();
        // Fill the pipe itself first so the writer thread blocks in write(2).
        // SAFETY: F_GETPIPE_SZ on a pipe has no memory-safety preconditions.
        let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) } as usize;
        let q = Queue::start(
            fd,
            Some(std::fs::File::from(w)),
            8,
            "test-writer",
            stderr_notice,
        )
        .unwrap();
        q.bytes(vec![b'x'; size + 1]);
        // Wait until the writer took the big write and filled the pipe (it is then blocked in
        // write(2)): a writer thread that takes it only while the lines are queued frees a
        // slot then, and the count starts again after the notice that slot carries.
        for polled in 0.. {
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD on a pipe's read end writes one c_int into `n`.
            unsafe { libc::ioctl(r.as_raw_fd(), libc::FIONREAD, &mut n) };
            if usize::try_from(n).unwrap_or(0) >= size {
                break;
            }
            assert!(polled < 20_000, "the writer never filled the pipe");
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..100 {
            q.line(&format!("line {i}"));
        }
        // 8 lines fit the queue; the rest were dropped, and the caller went on at once.
        let dropped = q.dropped();
        assert_eq!(dropped, 92);
        let text = read_available(&r);
        let text = text.trim_start_matches('x');
        assert!(text.starts_with("line 0\n"), "{text:?}");
        q.line("after");
        let more = read_available(&r);
        assert_eq!(
            more,
            format!("baton: {dropped} messages dropped: stderr is not being read\nafter\n")
        );
        assert_eq!(q.dropped(), 0);
    }

    /// A reader that went away (EPIPE) closes the output: no panic, later lines are discarded,
    /// and `finish` does not wait for them.
    #[test]
    fn a_closed_reader_ends_the_output_without_a_panic() {
        let (r, w) = pipe();
        drop(r);
        let fd = w.as_raw_fd();
        let q = Queue::start(
            fd,
            Some(std::fs::File::from(w)),
            8,
            "test-writer",
            stderr_notice,
        )
        .unwrap();
        q.line("nobody reads this");
        q.finish();
        assert!(q.shared.closed.load(Ordering::Relaxed));
        q.line("nor this");
        assert_eq!(q.shared.pending.load(Ordering::Relaxed), 0);
        assert!(is_open(fd), "the queue keeps its file open");
    }

    /// `finish` returns although the writer is stuck in write(2) on a full pipe.
    #[test]
    fn finish_does_not_wait_for_a_stuck_writer() {
        let (_r, w) = pipe();
        let fd = w.as_raw_fd();
        // SAFETY: as above.
        let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) } as usize;
        let q = Queue::start(
            fd,
            Some(std::fs::File::from(w)),
            8,
            "test-writer",
            stderr_notice,
        )
        .unwrap();
        q.bytes(vec![b'x'; size + 1]);
        q.line("stuck behind");
        q.finish();
        // It returned with lines still queued behind the stuck write.
        assert!(q.shared.pending.load(Ordering::Relaxed) > 0);
    }
}
