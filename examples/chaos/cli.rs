//! The CLI workload (`cli`): the faults of the `baton` command's own host, against real
//! `baton run` processes.
//!
//! Jobs start one after another (about one every 1.2 s during the phase), each run by 3 or 4
//! `baton run --key j-NNNN` processes, as a cron line on 3 or 4 servers would: each process
//! connects through its own fault proxy, with a 1 s lease (`--lease 1s --kill-grace
//! 200ms`) and `--max-attempts` equal to the number of its processes (each process runs at most
//! one attempt, so a job whose processes all took theirs and failed ends EXHAUSTED; one whose
//! last holder lost its lease with nobody left to see it stays at its last attempt, and the
//! next run finds it exhausted). PROGRAM
//! is a small `sh` script that appends `PID start|alive|end TOKEN NS` lines (its process id, the
//! fencing token, the wall clock in ns from `date +%s%N`) to the job's `spans-j-NNNN` file, an
//! `alive` line every 50 ms for 1–2 s, and exits 1 one time in five (a backup takes over).
//!
//! Faults, seeded, from three lanes until the phase's end:
//! - `stall_stderr`: a process's stderr is a pipe the harness stops reading for 2–5 s, filled
//!   to the brim first (atomic 4 KiB writes the reader discards); a 0.3–0.6 s reset of the
//!   same process's link in the middle gives baton an error line to write into the full pipe
//!   (before the output queue that write blocked the thread that keeps the lease);
//! - `freeze_baton`: SIGSTOP of the `baton` process (never PROGRAM, never its guard) for
//!   1.3–3 s, past the lease, then SIGCONT: the guard must stop PROGRAM's group before the
//!   lease's end, and baton exits 74 on resuming; one freeze in five hits a backup;
//! - `blip`: a backup's link cut (silent blackhole, or reset and refused) for 0.3–3 s, twice
//!   in a row one time in three, at most 3.5 s in all and once per process (a backup cut for
//!   more than 5 s within one wait may still give up with exit 69); one blip in four cuts the
//!   holder instead, for 1.2–2.5 s, past its lease;
//! - `nothing`: the control, a pause.
//!
//! Checks: no two PROGRAMs of one job overlap (a span is one PID's first..last timestamp),
//! their fencing tokens rise in the order they started, every job ends DONE or EXHAUSTED
//! within 40 s of the heal (a job left at an attempt gets one late `baton run`, the next cron
//! line's, straight to the server: it must exit 75 without running PROGRAM, which proves no
//! attempt was left untaken), and every `baton run` exits 0, 1 (PROGRAM's status), 74 (lost its
//! attempt) or 75 (exhausted), and the password (in every process's URL, passed in the
//! environment) shows in no log. Diagnostics that the faults bit: freezes of a holder that ended
//! in exit 74 (stopped by the guard), and processes that dropped output lines.
//!
//! The negative control `control-cli-setsid` runs the same fleet with a PROGRAM whose work
//! escapes its process group through `setsid` (the documented escape: neither baton nor its
//! guard can stop it) and freezes each job's holder past its lease: the overlap check must
//! flag the escaped work running beside the backup's.
//!
//! The `baton` binary is the one built next to this example (`target/<profile>/baton`):
//! `cargo run --example chaos` does not build binaries, so `cargo build --all-features --bin
//! baton` first (CI's test step does), or name another build with `CHAOS_BATON=PATH`.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::testing::{Persistence, RedisCluster, RedisServer};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::control::WORKER_USER;
use crate::proxy::{Link, Mode};
use crate::util::{job_name, mix, mono_ns, BoxError, Jsonl, Rng};

/// Names a `baton` binary to run instead of the one built next to this example.
const BATON_ENV: &str = "CHAOS_BATON";

/// The lease every `baton run` asks for, and what a freeze or a holder's cut must outlast.
const LEASE_MS: u64 = 1_000;
/// How long after the heal every job must have reached DONE or EXHAUSTED and every process
/// exited.
const QUIESCE_S: u64 = 40;

/// One CLI phase.
#[derive(Debug, Clone)]
pub struct CliCfg {
    pub name: String,
    pub seed: u64,
    /// Jobs start during this window; faults run until its end.
    pub chaos_s: f64,
    /// The negative control: PROGRAM's work escapes its group (setsid); only holder freezes.
    pub control: bool,
    /// Against a six-node Redis Cluster through its node proxies (no per-process links there:
    /// stalls and freezes only).
    pub cluster: bool,
}

/// One `baton run` process.
struct Runner {
    job: usize,
    idx: usize,
    pid: i32,
    /// A pidfd: signals reach this process and never a reused PID.
    pidfd: OwnedFd,
    link: Option<Arc<Link>>,
    stalled: Arc<AtomicBool>,
    /// The harness's own copy of the stderr pipe's write end, to fill it.
    fill: OwnedFd,
    exit: Mutex<Option<(Option<i32>, Option<i32>)>>,
    blipped: AtomicBool,
    frozen: AtomicBool,
}

impl Runner {
    fn running(&self) -> bool {
        lock(&self.exit).is_none()
    }

    fn signal(&self, sig: i32) -> bool {
        self.running() && pidfd_signal(&self.pidfd, sig)
    }

    fn name(&self) -> String {
        format!("{}/r{}", job_name(self.job), self.idx)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a phase left behind for the checker.
pub struct CliResult {
    pub cfg: CliCfg,
    pub dir: PathBuf,
    pub jobs: usize,
    pub runners: Vec<(usize, usize, Option<i32>, Option<i32>)>,
    pub final_state: BTreeMap<String, Option<String>>,
    pub final_state_err: Option<String>,
    /// The late runs of jobs left unfinished after the heal: exit code and whether PROGRAM ran.
    pub late: BTreeMap<String, Result<(Option<i32>, bool), String>>,
    pub stuck: Vec<String>,
    pub faults: BTreeMap<String, u64>,
    /// Holder freezes (past the lease) whose process then exited 74.
    pub frozen_holders: Vec<(usize, usize)>,
    /// The logs the password showed up in.
    pub secret_in: Vec<String>,
}

/// The `baton` binary next to this example's own (`target/<profile>/examples/chaos` →
/// `target/<profile>/baton`), copied privately (a build may replace it meanwhile).
/// `CHAOS_BATON=PATH` runs another build instead (an older one, to see the checks bite).
pub(crate) fn baton_bin(dir: &Path) -> Result<PathBuf, BoxError> {
    let bin = match std::env::var_os(BATON_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.join("baton"))
            .ok_or("cannot place the baton binary next to this example")?,
    };
    if !bin.is_file() {
        return Err(format!(
            "the cli workload runs the baton binary, {} is missing: build it first with \
             `cargo build --all-features --bin baton` (cargo run --example does not build it), \
             or name one with CHAOS_BATON=PATH",
            bin.display()
        )
        .into());
    }
    let copy = dir.join("baton-bin");
    std::fs::copy(&bin, &copy)?;
    Ok(copy)
}

/// PROGRAM: `sh -c SCRIPT sh SPANS TICKS CODE`.
const SCRIPT: &str = r#"L=$1; T=$2; C=$3
now() { date +%s%N; }
tok=${BATON_FENCING_TOKEN:-0}
echo "program $$ attempt ${BATON_ATTEMPT:-0} token $tok" >&2
echo "$$ start $tok $(now)" >> "$L"
i=0
while [ $i -lt $T ]; do
  sleep 0.05
  echo "$$ alive $tok $(now)" >> "$L"
  i=$((i + 1))
done
echo "$$ end $tok $(now)" >> "$L"
exit $C"#;

/// The control's PROGRAM: the same work, escaped from PROGRAM's process group by `setsid`.
fn control_script() -> String {
    format!(
        "setsid sh -c '{}' sh \"$1\" \"$2\" 0 </dev/null 2>/dev/null &\nwait $!\nexit $3",
        SCRIPT.replace("exit $C", "exit 0")
    )
}

/// `pid`'s parent, from /proc.
pub(crate) fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether one of `pid`'s threads sleeps in a pipe write (its output thread, on the stalled
/// pipe): the stall reached baton.
pub(crate) fn blocked_in_pipe_write(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(|t| t.ok()).any(|t| {
        std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.contains("pipe_write"))
    })
}

pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2(2) writes two new descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The files directly in `dir` whose bytes contain `canary` (a secret that must show in no
/// log), by path.
pub(crate) fn files_holding(dir: &Path, canary: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    std::fs::read(p)
                        .is_ok_and(|b| b.windows(canary.len()).any(|w| w == canary.as_bytes()))
                })
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Sends `sig` to the process behind `pidfd` (never to a reused pid); whether it was sent.
pub(crate) fn pidfd_signal(pidfd: &OwnedFd, sig: i32) -> bool {
    // SAFETY: pidfd_send_signal(2) on a pidfd the caller owns; no pointers but a null siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    rc == 0
}

pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Fills the pipe behind `fd` to its capacity with 4 KiB writes (atomic: never torn into
/// baton's lines) of `F…` lines the reader discards. Blocks once the pipe is full, until the
/// reader drains it.
pub(crate) fn fill_pipe(fd: OwnedFd) {
    // SAFETY: fcntl(F_GETPIPE_SZ) on a pipe descriptor we own.
    let cap = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) };
    let cap = if cap > 0 { cap as usize } else { 65_536 };
    let mut chunk = vec![b'F'; 4096];
    for i in (1023..4096).step_by(1024) {
        chunk[i] = b'\n';
    }
    // The reader may take one more buffer (16 KiB) as the stall begins; what does not fit
    // waits in this write until the drain.
    let mut left = 2 * cap + 16 * 1024;
    while left > 0 {
        // SAFETY: write(2) from a live buffer of its length to a descriptor we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            return;
        }
        left = left.saturating_sub(n as usize);
    }
}

/// Reads a runner's stderr into `path` (dropping the filler), except while `stalled`; ends once
/// the runner exited and the pipe stayed empty for 300 ms.
pub(crate) async fn read_stderr(
    read: OwnedFd,
    path: PathBuf,
    stalled: Arc<AtomicBool>,
    runner_done: Arc<AtomicBool>,
    dropped_lines: Arc<AtomicU64>,
) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(read) else {
        return;
    };
    let Ok(mut out) = std::fs::File::create(&path) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    let mut line: Vec<u8> = Vec::new();
    loop {
        if stalled.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        match tokio::time::timeout(Duration::from_millis(300), rx.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                for &b in &buf[..n] {
                    line.push(b);
                    if b == b'\n' {
                        if !line.starts_with(b"FFFF") {
                            if line.windows(16).any(|w| w == b"messages dropped") {
                                dropped_lines.fetch_add(1, Ordering::Relaxed);
                            }
                            let _ = std::io::Write::write_all(&mut out, &line);
                        }
                        line.clear();
                    }
                }
            }
            Err(_) => {
                if runner_done.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
}

struct Phase {
    cfg: CliCfg,
    dir: PathBuf,
    bin: PathBuf,
    url: String,
    upstream: u16,
    log: Arc<Jsonl>,
    runners: Mutex<Vec<Arc<Runner>>>,
    faults: Mutex<BTreeMap<String, u64>>,
    frozen_holders: Mutex<Vec<(usize, usize)>>,
    dropped_lines: Arc<AtomicU64>,
    started_jobs: AtomicU64,
}

impl Phase {
    /// The next cron line's run of `job`, after the heal, straight to the server: with every
    /// attempt used it must find the job exhausted (exit 75, writing EXHAUSTED) without running
    /// PROGRAM; running PROGRAM proves an attempt was left that no process took (a backup that
    /// quit: a lost job). Returns its exit code and whether PROGRAM ran.
    async fn late_run(&self, job: usize, runners: usize) -> Result<(Option<i32>, bool), BoxError> {
        let url = self.url.replace("{port}", &self.upstream.to_string());
        let marker = self.dir.join(format!("late-{}", job_name(job)));
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(["run", "--key", &job_name(job)])
            .args(["--lease", "1s", "--kill-grace", "200ms"])
            .args(["--max-attempts", &runners.to_string()])
            .args(["--", "sh", "-c", "echo ran >> \"$0\""])
            .arg(&marker)
            .env("BATON_URL", url)
            .env_remove("BATON_REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let status = tokio::time::timeout(Duration::from_secs(20), cmd.status()).await??;
        Ok((status.code(), marker.exists()))
    }

    fn spans_path(&self, job: usize) -> PathBuf {
        self.dir.join(format!("spans-{}", job_name(job)))
    }

    fn count(&self, kind: &str) {
        *lock(&self.faults).entry(kind.into()).or_default() += 1;
    }

    async fn spawn(
        self: &Arc<Self>,
        job: usize,
        idx: usize,
        runners: usize,
        rng: &mut Rng,
    ) -> Result<(), BoxError> {
        let link = if self.cfg.cluster {
            None
        } else {
            Some(
                Link::start(
                    &format!("{}-r{idx}", job_name(job)),
                    self.upstream,
                    self.log.clone(),
                    mix(&[self.cfg.seed, 79, job as u64, idx as u64]),
                )
                .await?,
            )
        };
        let url = match &link {
            Some(l) => self.url.replace("{port}", &l.port.to_string()),
            None => self.url.clone(),
        };
        // The control's work outlasts a freeze early in it: 4 s.
        let ticks = if self.cfg.control {
            80
        } else {
            20 + rng.below(21)
        };
        let code = if rng.unit() < 0.2 { 1 } else { 0 };
        let script = if self.cfg.control {
            control_script()
        } else {
            SCRIPT.to_string()
        };
        let (read, write) = pipe()?;
        let fill = write.try_clone()?;
        let spans = self.spans_path(job);
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(["run", "--key", &job_name(job)])
            .args(["--lease", "1s", "--kill-grace", "200ms"])
            .args(["--max-attempts", &runners.to_string(), "--json"])
            .args(["--name", &format!("{}-r{idx}", job_name(job))])
            .args(["--", "sh", "-c", &script, "sh"])
            .arg(&spans)
            .args([ticks.to_string(), code.to_string()])
            // The URL carries the password: in the environment, never on a command line.
            .env("BATON_URL", url)
            .env_remove("BATON_REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(write))
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().ok_or("baton exited at once")? as i32;
        // Opened before the child can be reaped (only the wait below reaps it).
        let pidfd = pidfd_open(pid)?;
        let stalled = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        tokio::spawn(read_stderr(
            read,
            self.dir
                .join(format!("baton-{}-r{idx}.stderr", job_name(job))),
            stalled.clone(),
            done.clone(),
            self.dropped_lines.clone(),
        ));
        let runner = Arc::new(Runner {
            job,
            idx,
            pid,
            pidfd,
            link,
            stalled,
            fill,
            exit: Mutex::new(None),
            blipped: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
        });
        self.log.write(
            json!({"p":"control","type":"info","f":"spawn","runner":runner.name(),
            "pid":pid,"ticks":ticks,"code":code}),
        );
        lock(&self.runners).push(runner.clone());
        let log = self.log.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            *lock(&runner.exit) = Some((code, signal));
            done.store(true, Ordering::Relaxed);
            log.write(
                json!({"p":"control","type":"info","f":"exit","runner":runner.name(),
                "code":code,"signal":signal}),
            );
        });
        Ok(())
    }

    fn live(&self) -> Vec<Arc<Runner>> {
        lock(&self.runners)
            .iter()
            .filter(|r| r.running())
            .cloned()
            .collect()
    }

    /// The live runner whose PROGRAM wrote the job's last span line, if it still runs.
    fn holder(&self, job: usize) -> Option<Arc<Runner>> {
        let text = std::fs::read_to_string(self.spans_path(job)).ok()?;
        let last = text
            .lines()
            .rev()
            .find(|l| l.split_whitespace().count() == 4)?;
        let mut pid: i32 = last.split_whitespace().next()?.parse().ok()?;
        let live = self.live();
        // PROGRAM's parent is baton; in the control the work's is PROGRAM (setsid keeps it).
        for _ in 0..3 {
            pid = parent(pid)?;
            if let Some(r) = live.iter().find(|r| r.job == job && r.pid == pid) {
                return Some(r.clone());
            }
        }
        None
    }

    /// A live job's holder and its live backups, picked at random.
    fn pick_job(&self, rng: &mut Rng) -> Option<(Arc<Runner>, Vec<Arc<Runner>>)> {
        let live = self.live();
        let mut jobs: Vec<usize> = live.iter().map(|r| r.job).collect();
        jobs.sort_unstable();
        jobs.dedup();
        rng.shuffle(&mut jobs);
        for j in jobs {
            if let Some(h) = self.holder(j) {
                let backups = live
                    .iter()
                    .filter(|r| r.job == j && r.pid != h.pid)
                    .cloned()
                    .collect();
                return Some((h, backups));
            }
        }
        None
    }

    fn fault_log(&self, kind: &str, target: &Runner, detail: Value) {
        self.log
            .write(json!({"p":"nemesis","type":"start","kind":kind,
            "target":target.name(),"pid":target.pid,"detail":detail}));
    }

    async fn stall_stderr(&self, rng: &mut Rng) {
        let Some((holder, backups)) = self.pick_job(rng) else {
            return;
        };
        let target = if rng.unit() < 0.8 || backups.is_empty() {
            holder
        } else {
            backups[rng.below(backups.len())].clone()
        };
        let stall_ms = rng.range(2000.0, 5000.0) as u64;
        let reset_ms = rng.range(300.0, 600.0) as u64;
        self.count("stall_stderr");
        self.fault_log(
            "stall_stderr",
            &target,
            json!({"ms":stall_ms,"reset_ms":reset_ms}),
        );
        target.stalled.store(true, Ordering::Relaxed);
        if let Ok(fd) = target.fill.try_clone() {
            // The filler thread blocks on the full pipe until the reader drains it.
            drop(tokio::task::spawn_blocking(move || fill_pipe(fd)));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Some(l) = &target.link {
            l.reset_all();
            l.set_mode(Mode::Refuse);
            tokio::time::sleep(Duration::from_millis(reset_ms)).await;
            l.set_mode(Mode::Pass);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Seen once baton wrote more than the full pipe holds (its lines then queue, or drop).
        let mut reached = blocked_in_pipe_write(target.pid);
        tokio::time::sleep(Duration::from_millis(
            stall_ms.saturating_sub(500 + reset_ms),
        ))
        .await;
        reached |= blocked_in_pipe_write(target.pid);
        if reached {
            self.count("stall_reached_baton");
        }
        target.stalled.store(false, Ordering::Relaxed);
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"stall_stderr",
            "target":target.name()}));
    }

    async fn freeze_baton(&self, rng: &mut Rng, holder_only: bool) {
        let Some((holder, backups)) = self.pick_job(rng) else {
            return;
        };
        if holder.frozen.load(Ordering::Relaxed) && holder_only {
            return;
        }
        // Until one holder has been frozen past its lease, every freeze is one: the check
        // "faults injected" wants a guard stop, and a run whose few freezes all hit backups
        // (seed 1212) proved nothing about the guard.
        let none_yet = lock(&self.frozen_holders).is_empty();
        let is_holder = holder_only || rng.unit() < 0.8 || backups.is_empty() || none_yet;
        let target = if is_holder {
            holder
        } else {
            backups[rng.below(backups.len())].clone()
        };
        let ms = rng.range(1300.0, 3000.0) as u64;
        if !target.signal(libc::SIGSTOP) {
            return;
        }
        target.frozen.store(true, Ordering::Relaxed);
        self.count("freeze_baton");
        self.fault_log("freeze_baton", &target, json!({"ms":ms,"holder":is_holder}));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        target.signal(libc::SIGCONT);
        if is_holder && ms > LEASE_MS {
            lock(&self.frozen_holders).push((target.job, target.idx));
        }
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"freeze_baton",
            "target":target.name()}));
    }

    async fn blip(&self, rng: &mut Rng) {
        let Some((holder, backups)) = self.pick_job(rng) else {
            return;
        };
        let fresh: Vec<_> = backups
            .into_iter()
            .filter(|b| !b.blipped.load(Ordering::Relaxed))
            .collect();
        let on_holder = rng.unit() < 0.25 || fresh.is_empty();
        if on_holder && holder.blipped.load(Ordering::Relaxed) {
            return;
        }
        let target = if on_holder {
            holder
        } else {
            fresh[rng.below(fresh.len())].clone()
        };
        let Some(link) = target.link.clone() else {
            return;
        };
        target.blipped.store(true, Ordering::Relaxed);
        // A backup: 0.3–3 s, and one time in three a second cut soon after, 3.5 s in all at
        // most. The holder: one cut past its lease.
        let mut cuts = Vec::new();
        if on_holder {
            cuts.push(rng.range(1200.0, 2500.0) as u64);
        } else {
            let first = rng.range(300.0, 3000.0) as u64;
            cuts.push(first);
            if rng.unit() < 0.33 && first < 2500 {
                let gap = rng.range(200.0, 800.0) as u64;
                let second = rng.range(300.0, (3500 - first).saturating_sub(gap).max(301) as f64);
                cuts.push(gap);
                cuts.push(second as u64);
            }
        }
        let silent = rng.unit() < 0.5;
        self.count("blip");
        self.fault_log(
            "blip",
            &target,
            json!({"cuts_and_gaps_ms":cuts,"holder":on_holder,"silent":silent}),
        );
        for (i, ms) in cuts.iter().enumerate() {
            if i % 2 == 0 {
                if silent {
                    link.set_mode(Mode::Blackhole);
                } else {
                    link.reset_all();
                    link.set_mode(Mode::Refuse);
                }
            } else {
                link.set_mode(Mode::Pass);
            }
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        link.set_mode(Mode::Pass);
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"blip",
            "target":target.name()}));
    }

    async fn lane(self: Arc<Self>, mut rng: Rng, deadline: u64, kinds: Vec<&'static str>) {
        while mono_ns() < deadline {
            tokio::time::sleep(Duration::from_millis(rng.range(300.0, 1200.0) as u64)).await;
            if mono_ns() >= deadline {
                break;
            }
            match kinds[rng.below(kinds.len())] {
                "stall_stderr" => self.stall_stderr(&mut rng).await,
                "freeze_baton" => self.freeze_baton(&mut rng, self.cfg.control).await,
                "blip" => self.blip(&mut rng).await,
                _ => {
                    self.count("nothing");
                    tokio::time::sleep(Duration::from_millis(rng.range(500.0, 2000.0) as u64))
                        .await;
                }
            }
        }
    }

    fn heal(&self) {
        for r in lock(&self.runners).iter() {
            r.stalled.store(false, Ordering::Relaxed);
            if let Some(l) = &r.link {
                l.set_mode(Mode::Pass);
            }
            r.signal(libc::SIGCONT);
        }
    }
}

/// Runs one CLI phase: servers, the fleet of `baton run` processes, the faults, the heal, the
/// final state.
pub async fn run_phase(cfg: CliCfg, root: &Path, canary: &str) -> Result<CliResult, BoxError> {
    let dir = root.join(&cfg.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let bin = baton_bin(&dir)?;
    let log = Arc::new(Jsonl::open(&dir.join("nemesis.jsonl"))?);
    log.write(
        json!({"p":"control","type":"info","f":"phase","name":cfg.name,
        "seed":cfg.seed,"control":cfg.control,"cluster":cfg.cluster}),
    );
    let pw = canary.to_string();
    let mut redis = None;
    let mut cluster = None;
    let mut node_links = Vec::new();
    let (url, upstream, admin_url) = if cfg.cluster {
        let c = tokio::task::spawn_blocking(move || {
            RedisCluster::builder()
                .acl_user(WORKER_USER, &pw, "baton:")
                .start()
        })
        .await??;
        let ports: Vec<u16> = c.nodes().iter().map(|n| n.port()).collect();
        for (i, p) in ports.iter().enumerate() {
            node_links.push(
                Link::start(
                    &format!("n{i}"),
                    *p,
                    log.clone(),
                    mix(&[cfg.seed, 78, i as u64]),
                )
                .await?,
            );
        }
        let proxies: Vec<u16> = node_links.iter().map(|l| l.port).collect();
        let c = Arc::new(Mutex::new(c));
        let (c2, p2) = (c.clone(), proxies.clone());
        tokio::task::spawn_blocking(move || crate::cluster::announce_all(&lock(&c2), &p2))
            .await??;
        let hosts: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        cluster = Some(c);
        (
            format!(
                "redis+cluster://{WORKER_USER}:{canary}@{}/",
                hosts.join(",")
            ),
            0,
            String::new(),
        )
    } else {
        let r = tokio::task::spawn_blocking(move || {
            RedisServer::builder()
                .persistence(Persistence::Durable)
                .requirepass(&pw)
                .acl_user(WORKER_USER, &pw, "baton:")
                .start()
        })
        .await??;
        let port = r.port();
        redis = Some(r);
        (
            format!("redis://{WORKER_USER}:{canary}@127.0.0.1:{{port}}/"),
            port,
            format!("redis://:{canary}@127.0.0.1:{port}/"),
        )
    };

    let phase = Arc::new(Phase {
        cfg: cfg.clone(),
        dir: dir.clone(),
        bin,
        url,
        upstream,
        log: log.clone(),
        runners: Mutex::new(Vec::new()),
        faults: Mutex::new(BTreeMap::new()),
        frozen_holders: Mutex::new(Vec::new()),
        dropped_lines: Arc::new(AtomicU64::new(0)),
        started_jobs: AtomicU64::new(0),
    });
    let start = mono_ns();
    let deadline = start + (cfg.chaos_s * 1e9) as u64;
    // The jobs: one every 1.2 s (the control: one every 2 s, each frozen once), until the end.
    let spacing_ms: u64 = if cfg.control { 2_000 } else { 1_200 };
    let spawner = {
        let phase = phase.clone();
        let seed = cfg.seed;
        tokio::spawn(async move {
            let mut rng = Rng::new(mix(&[seed, 0xC11]));
            let mut j = 0usize;
            let mut errors = Vec::new();
            while mono_ns() + 500_000_000 < deadline {
                let at = start + j as u64 * spacing_ms * 1_000_000;
                tokio::time::sleep(Duration::from_nanos(at.saturating_sub(mono_ns()))).await;
                let runners = 3 + rng.below(2);
                phase.started_jobs.fetch_add(1, Ordering::Relaxed);
                for idx in 0..runners {
                    if let Err(e) = phase.spawn(j, idx, runners, &mut rng).await {
                        errors.push(format!("{}/r{idx}: {e}", job_name(j)));
                    }
                    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 150.0) as u64)).await;
                }
                j += 1;
            }
            errors
        })
    };
    // Faults start once the first job runs.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let kinds: &[&[&str]] = match (cfg.control, cfg.cluster) {
        (true, _) => &[&["freeze_baton"]],
        (false, true) => &[
            &["stall_stderr", "freeze_baton", "nothing"],
            &["freeze_baton", "stall_stderr", "nothing"],
            &["freeze_baton", "stall_stderr"],
        ],
        (false, false) => &[
            &["stall_stderr", "freeze_baton", "blip", "nothing"],
            &["freeze_baton", "blip", "blip", "nothing"],
            &["stall_stderr", "freeze_baton", "blip"],
        ],
    };
    let lanes: Vec<_> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            tokio::spawn(phase.clone().lane(
                Rng::new(mix(&[cfg.seed, 0xC12, i as u64])),
                deadline,
                k.to_vec(),
            ))
        })
        .collect();
    let spawn_errors = spawner.await.unwrap_or_default();
    for l in lanes {
        let _ = l.await;
    }
    phase.heal();
    log.write(json!({"p":"control","type":"info","f":"heal","spawn_errors":spawn_errors}));
    let heal_t = mono_ns();
    let bound = heal_t + QUIESCE_S * 1_000_000_000;
    while !phase.live().is_empty() && mono_ns() < bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stuck = Vec::new();
    for r in phase.live() {
        stuck.push(r.name());
        r.signal(libc::SIGKILL);
    }
    if cfg.control {
        // The escaped work ends by itself (80 ticks): let it write its last lines.
        tokio::time::sleep(Duration::from_millis(5_000)).await;
    }
    // Let the exit watchers record the last exits.
    for _ in 0..50 {
        if lock(&phase.runners).iter().all(|r| !r.running()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let jobs = phase.started_jobs.load(Ordering::Relaxed) as usize;
    let read = match &cluster {
        Some(c) => crate::cluster::read_final_state(c, jobs).await,
        None => crate::control::read_final_state(&admin_url, jobs).await,
    };
    let (mut final_state, mut final_state_err) = match read {
        Ok(s) => (s, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    // A job left at an attempt is exhausted in effect when its last holder lost the lease with
    // no backup left (each process takes at most one attempt): the next run must find it so.
    let mut late = BTreeMap::new();
    for j in 0..jobs {
        let name = job_name(j);
        if matches!(
            final_state.get(&name).and_then(|s| s.as_deref()),
            Some("DONE" | "EXHAUSTED")
        ) {
            continue;
        }
        let runners = lock(&phase.runners).iter().filter(|r| r.job == j).count();
        let outcome = phase.late_run(j, runners).await;
        log.write(
            json!({"p":"control","type":"info","f":"late_run","job":name,
            "outcome":format!("{outcome:?}")}),
        );
        late.insert(name, outcome.map_err(|e| e.to_string()));
    }
    if !late.is_empty() {
        let read = match &cluster {
            Some(c) => crate::cluster::read_final_state(c, jobs).await,
            None => crate::control::read_final_state(&admin_url, jobs).await,
        };
        match read {
            Ok(s) => final_state = s,
            Err(e) => final_state_err = Some(e.to_string()),
        }
    }
    let mut faults = lock(&phase.faults).clone();
    faults.insert(
        "total".into(),
        ["stall_stderr", "freeze_baton", "blip"]
            .iter()
            .map(|k| faults.get(*k).copied().unwrap_or(0))
            .sum(),
    );
    let dropped = phase.dropped_lines.load(Ordering::Relaxed);
    faults.insert("runners_that_dropped_output".into(), dropped);
    let runners = lock(&phase.runners)
        .iter()
        .map(|r| {
            let (c, s) = lock(&r.exit).unwrap_or((None, None));
            (r.job, r.idx, c, s)
        })
        .collect();
    let frozen_holders = lock(&phase.frozen_holders).clone();
    let _ = std::fs::remove_file(dir.join("baton-bin"));
    // The password is in every process's URL (their environment): it must show in no log.
    let secret_in = files_holding(&dir, canary);
    log.write(json!({"p":"control","type":"info","f":"phase_end","stuck":stuck}));
    drop(phase);
    drop(node_links);
    let _ = tokio::task::spawn_blocking(move || {
        drop(redis);
        drop(cluster);
    })
    .await;
    Ok(CliResult {
        cfg,
        dir,
        jobs,
        runners,
        final_state,
        final_state_err,
        late,
        stuck,
        faults,
        frozen_holders,
        secret_in,
    })
}

/// One PROGRAM's span as it recorded it.
#[derive(Debug, Clone, Copy)]
struct Span {
    pid: u32,
    token: u64,
    first: u128,
    last: u128,
}

fn spans(path: &Path) -> Vec<Span> {
    let mut by_pid: BTreeMap<u32, Span> = BTreeMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // A line cut short by SIGKILL mid-write is skipped.
        let [pid, _, token, ns] = f[..] else {
            continue;
        };
        let (Ok(pid), Ok(token), Ok(ns)) = (pid.parse(), token.parse(), ns.parse::<u128>()) else {
            continue;
        };
        let s = by_pid.entry(pid).or_insert(Span {
            pid,
            token,
            first: ns,
            last: ns,
        });
        s.first = s.first.min(ns);
        s.last = s.last.max(ns);
    }
    let mut all: Vec<Span> = by_pid.into_values().collect();
    all.sort_by_key(|s| s.first);
    all
}

/// The phase's verdict lines (`(name, pass, note)`, as the other workloads report them) and
/// its statistics for report.json.
pub fn check(r: &CliResult) -> (Vec<(String, bool, String)>, Value) {
    let name = &r.cfg.name;
    let mut overlaps = Vec::new();
    let mut token_order = Vec::new();
    let mut programs = 0usize;
    for j in 0..r.jobs {
        let all = spans(&r.dir.join(format!("spans-{}", job_name(j))));
        programs += all.len();
        // Sorted by start: a span overlaps a later one when it ends after that one starts
        // (compared with the latest end so far, not only the previous span's).
        let mut latest: Option<Span> = None;
        for s in &all {
            if let Some(p) = latest {
                if p.last >= s.first {
                    overlaps.push(format!(
                        "{}: PROGRAM {} (token {}) still ran {} ms after PROGRAM {} (token {}) \
                         started",
                        job_name(j),
                        p.pid,
                        p.token,
                        (p.last - s.first) / 1_000_000,
                        s.pid,
                        s.token
                    ));
                }
                if s.token <= p.token {
                    token_order.push(format!(
                        "{}: PROGRAM {} started with token {} after PROGRAM {} with token {}",
                        job_name(j),
                        s.pid,
                        s.token,
                        p.pid,
                        p.token
                    ));
                }
            }
            if latest.map_or(true, |p| s.last > p.last) {
                latest = Some(*s);
            }
        }
    }
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    let mut odd_exits = Vec::new();
    for (job, idx, code, signal) in &r.runners {
        let k = match (code, signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown".into(),
        };
        *by_code.entry(k.clone()).or_default() += 1;
        if !matches!(code, Some(0 | 1 | 74 | 75)) {
            odd_exits.push(format!(
                "{}/r{idx} exited {k} (see baton-{}-r{idx}.stderr)",
                job_name(*job),
                job_name(*job)
            ));
        }
    }
    let mut done = 0u64;
    let mut exhausted = 0u64;
    let mut lost = Vec::new();
    if let Some(e) = &r.final_state_err {
        lost.push(format!("final state unreadable: {e}"));
    }
    let mut exhausted_late = 0u64;
    for (job, st) in &r.final_state {
        match (st.as_deref(), r.late.get(job)) {
            (_, Some(Ok((_, true)))) => lost.push(format!(
                "{job}: an attempt was left that no process took (a late run ran PROGRAM)"
            )),
            (Some("EXHAUSTED"), Some(Ok((Some(75), false)))) => exhausted_late += 1,
            (_, Some(late)) => {
                lost.push(format!("{job}: final state {st:?}; the late run: {late:?}"))
            }
            (Some("DONE"), None) => done += 1,
            (Some("EXHAUSTED"), None) => exhausted += 1,
            (other, None) => lost.push(format!("{job}: final state {other:?}")),
        }
    }
    let guard_stops = r
        .frozen_holders
        .iter()
        .filter(|(j, i)| {
            r.runners
                .iter()
                .any(|(rj, ri, c, _)| rj == j && ri == i && *c == Some(74))
        })
        .count();
    let stats = json!({
        "jobs": r.jobs, "programs": programs, "done": done, "exhausted": exhausted,
        "exits": by_code, "faults": r.faults, "frozen_holders": r.frozen_holders.len(),
        "frozen_holders_exit_74": guard_stops, "stuck": r.stuck,
        "overlaps": overlaps.len(), "overlap_examples": overlaps.iter().take(8).collect::<Vec<_>>(),
    });
    println!(
        "chaos: {name}: jobs {} programs {programs} done {done} exhausted {exhausted} exits {} faults {}",
        r.jobs,
        json!(by_code),
        json!(r.faults)
    );
    let mut lines = Vec::new();
    let examples = |v: &[String]| {
        for ex in v.iter().take(8) {
            println!("    {name} example: {ex}");
        }
    };
    if r.cfg.control {
        let pass = !overlaps.is_empty();
        lines.push((
            format!("control {name}"),
            pass,
            if pass {
                format!(
                    "bit: the overlap check flagged {} overlap(s) of work escaped through \
                     setsid ({} holder freezes)",
                    overlaps.len(),
                    r.frozen_holders.len()
                )
            } else {
                format!(
                    "did not bite: no overlap flagged ({} holder freezes)",
                    r.frozen_holders.len()
                )
            },
        ));
        return (lines, stats);
    }
    examples(&overlaps);
    lines.push((
        format!("{name} X1 no two PROGRAMs of one job overlap"),
        overlaps.is_empty(),
        format!(
            "{} violation(s) in {programs} PROGRAM spans of {} jobs",
            overlaps.len(),
            r.jobs
        ),
    ));
    examples(&token_order);
    lines.push((
        format!("{name} X2 fencing tokens rise in PROGRAMs' start order"),
        token_order.is_empty(),
        format!("{} violation(s)", token_order.len()),
    ));
    examples(&lost);
    lines.push((
        format!("{name} X3 every job ends DONE or EXHAUSTED"),
        lost.is_empty() && r.stuck.is_empty(),
        format!(
            "{} violation(s); {done} DONE, {exhausted} EXHAUSTED, {exhausted_late} exhausted by \
             the last holder's lost lease (a late run found them so); {} process(es) still \
             running {QUIESCE_S} s after the heal",
            lost.len(),
            r.stuck.len()
        ),
    ));
    examples(&odd_exits);
    lines.push((
        format!("{name} X4 every baton run exits 0, 1, 74 or 75"),
        odd_exits.is_empty(),
        format!(
            "{} violation(s) (69 is a backup that gave up); exits {}",
            odd_exits.len(),
            json!(by_code)
        ),
    ));
    examples(&r.secret_in);
    lines.push((
        format!("{name} X5 no secret in logs"),
        r.secret_in.is_empty(),
        format!("{} violation(s)", r.secret_in.len()),
    ));
    let total = r.faults.get("total").copied().unwrap_or(0);
    let kinds = ["stall_stderr", "freeze_baton", "blip"]
        .iter()
        .filter(|k| r.faults.get(**k).copied().unwrap_or(0) > 0)
        .count();
    let want_kinds = if r.cfg.cluster { 2 } else { 3 };
    lines.push((
        format!("{name} faults injected"),
        total >= 5 && kinds >= want_kinds && guard_stops > 0,
        format!(
            "{total} faults of {kinds} kinds (required: 5 of {want_kinds}); {guard_stops} of {} \
             holders frozen past the lease then exited 74 (> 0 expected)",
            r.frozen_holders.len()
        ),
    ));
    (lines, stats)
}
