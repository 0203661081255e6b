//! The scheduling workload (`schedule`): `baton schedule` fleets under their hosts' faults and
//! server pauses.
//!
//! Four schedules at short periods, each run by one `baton schedule` process on every worker
//! (3 or 4 workers, seeded), as a service on every server would:
//!
//! ```text
//! baton schedule --key s-every2 --every 2s ...
//! baton schedule --key s-every3 --every 3s --offset 1s ...
//! baton schedule --key s-cron5 --cron '*/5 * * * * *' ...      (seconds first)
//! baton schedule --key s-buf2 --every 2s --overlap buffer-one ...
//! baton schedule --key s-rep3 --every 3s --overlap replace ...
//! ... --lease 1s --kill-grace 200ms --max-attempts 4 --events FILE -- sh -c SCRIPT
//! ```
//!
//! Events go to a file per process (`--events`: complete even while stderr stalls). A worker's
//! processes share its fault proxy (its host's link to the server). PROGRAM is a small `sh`
//! script that appends `PID start TOKEN NS PROC ATTEMPT JOB`, then an `alive` line every 50 ms
//! for 0.3–1.3 s, then `PID end TOKEN NS CODE` to the occurrence's `spans-KEY-OCCURRENCE` file
//! (`NS`: `date +%s%N`, the host's wall clock), and exits 1 one time in five (by its PID), so
//! backups retry within the occurrence.
//!
//! **The server's clock.** Redis runs on this host, so its `TIME` is this host's wall clock:
//! the harness reads `TIME` between two readings of its own wall clock at the phase's start and
//! end, which bounds the offset between the two clocks (server = wall + offset, ± half the
//! round trip). A PROGRAM's first `date +%s%N` plus that offset is the server's time when it
//! started, up to the bound; a PROGRAM reads it after it was started, so the reading errs late,
//! never early. (A `redis-cli TIME` in PROGRAM would pass through the faults it should not
//! depend on and cost a process per start; on one host it measures nothing more.)
//!
//! Faults, seeded, from three lanes until the phase's end:
//! - `freeze`: SIGSTOP of a `baton schedule` process for 1.3–3 s, past its lease (the holder of a
//!   running occurrence four times in five): its guard must stop PROGRAM, a backup retries;
//! - `kill`: SIGKILL of a process (the holder, when one runs, three times in five), restarted
//!   0.5–2 s later with `--catch-up last` (a host coming back); never the last live process of
//!   a schedule;
//! - `stall_stderr`: a process's stderr pipe filled and left unread for 2–5 s;
//! - `blip`: a worker's link cut (silent blackhole, or reset and refused) for 0.3–2.5 s;
//! - `pause_server`: SIGSTOP of redis-server for 0.2–1 s;
//! - `pause_schedule`: an operator's `baton pause --key K` of one schedule, `baton resume`
//!   1–4 s later;
//! - `trigger`: an operator's `baton trigger --key K` (the daemons poll every second);
//! - `nothing`.
//!
//! Checks:
//! - S1: no occurrence's PROGRAMs overlap (a span is one PID's first..last timestamp), their
//!   fencing tokens rise in start order, and no occurrence runs to completion twice: at most one
//!   process reports it `done`, and none of its PROGRAMs starts with a higher token than the
//!   one whose process reported it done (a rerun only after a visibly failed or lost attempt);
//! - S2: no PROGRAM starts before its tick by the server's clock (see above; the allowance is
//!   the offset's measured bound);
//! - S3: every tick whose window `[T − 1 s, T + P − E]` (E the early tolerance) had a witness
//!   ends DONE or EXHAUSTED in the store (or, under an overlap rule, recorded
//!   `skipped_overlap` with no job): a process spawned a second before the window, neither
//!   frozen nor cut off (its link, the server) within it, nor killed within it or for 10 s
//!   after. The harness knows its faults: a tick with no witness is accounted as excused (and
//!   reported: done, or missed, or left at an attempt). Every live `baton schedule` waits on
//!   an occurrence until it ends (`--rejoin` brings back a worker whose attempt failed or was
//!   lost), so a witnessed tick is never left at an attempt;
//! - S4: every `baton schedule` process exits 0 or 143 on the harness's SIGTERM at the end (or
//!   by the harness's SIGKILL), none on its own, none stuck;
//! - S5: the password (in every process's URL, in its environment) shows in no log;
//! - S6: the schedule's record (`Failover::schedule_history`, repaired as `baton status
//!   --history` shows it) agrees with the store and the PROGRAMs: every checked tick has an
//!   entry; `done` and `exhausted` exactly when its job is `DONE` or `EXHAUSTED`; `missed` and
//!   `skipped_paused` only for a tick no PROGRAM ran (`skipped_paused` only while a pause
//!   overlapped its window); `running` or `failed` only for an excused tick whose job is
//!   left at an attempt; `skipped_overlap` only for a tick no PROGRAM ran (under
//!   `buffer-one`: none ran to success; a retry after a killed or failed attempt waits behind
//!   another occurrence too, and is settled if its window closes first). A tick whose
//!   window a pause overlapped is excused from S3 (it may be skipped);
//! - S7: under `--overlap buffer-one` (`s-buf2`) and `replace` (`s-rep3`), no two occurrences'
//!   PROGRAMs run at once: the next waits for the running one to end (or is settled skipped),
//!   or stops it and waits until its PROGRAM is gone, fleet-wide;
//! - S8: every trigger runs at most once (S1 and S2 cover its PROGRAMs as an occurrence's) and
//!   ends `DONE` or `EXHAUSTED`, its record entry saying the same, unless a pause of its
//!   schedule overlapped it (then `skipped_paused` and never run), its overlap rule skipped
//!   it (`skipped_overlap`, never run) or a later tick replaced it (`replaced`, `DONE`).
//!
//! The negative control `control-schedule-prefix` runs the same fleet without faults, one
//! worker's processes with another `--prefix` (`baton:shadow:`): that worker's fleet of one
//! runs every tick beside the others', and S1 must flag it.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::testing::{Persistence, RedisServer};
use baton::Schedule;
use serde_json::{json, Value};

use crate::cli::{
    baton_bin, files_holding, fill_pipe, lock, parent, pidfd_open, pidfd_signal, pipe, read_stderr,
};
use crate::control::WORKER_USER;
use crate::proxy::{Link, Mode};
use crate::util::{mix, mono_ns, read_jsonl, BoxError, Jsonl, Rng};

/// The lease every process asks for: a freeze or a holder's cut outlasts it.
const LEASE_MS: u64 = 1_000;
/// How long after the heal the ticks under check may take to end.
const SETTLE_S: u64 = 25;
/// A witness of a tick must not be killed for this long after its window (it may be the only
/// process that bound to it).
const WITNESS_LIFE_NS: u64 = 10_000_000_000;
/// A witness must have been spawned this long before the window (to connect and read the
/// server's clock).
const WITNESS_LEAD_NS: u64 = 1_000_000_000;

/// One scheduling phase.
#[derive(Debug, Clone)]
pub struct SchedCfg {
    pub name: String,
    pub seed: u64,
    /// Faults run until its end; the ticks checked are those whose window closed by then.
    pub chaos_s: f64,
    /// The negative control: no faults, worker 0 with another `--prefix`.
    pub control: bool,
}

/// A schedule of the workload: its key, its `baton schedule` flags, and the same calendar.
struct Spec {
    key: &'static str,
    args: &'static [&'static str],
    schedule: Schedule,
    /// `--overlap buffer-one`: no two occurrences run at once (S7).
    exclusive: bool,
}

fn specs() -> Result<Vec<Spec>, BoxError> {
    Ok(vec![
        Spec {
            key: "s-every2",
            args: &["--every", "2s"],
            schedule: Schedule::every(Duration::from_secs(2))?,
            exclusive: false,
        },
        Spec {
            key: "s-every3",
            args: &["--every", "3s", "--offset", "1s"],
            schedule: Schedule::every(Duration::from_secs(3))?.offset(Duration::from_secs(1))?,
            exclusive: false,
        },
        Spec {
            key: "s-cron5",
            args: &["--cron", "*/5 * * * * *"],
            schedule: Schedule::cron("*/5 * * * * *")?,
            exclusive: false,
        },
        Spec {
            key: "s-buf2",
            args: &["--every", "2s", "--overlap", "buffer-one"],
            schedule: Schedule::every(Duration::from_secs(2))?,
            exclusive: true,
        },
        Spec {
            key: "s-rep3",
            args: &["--every", "3s", "--overlap", "replace"],
            schedule: Schedule::every(Duration::from_secs(3))?,
            exclusive: true,
        },
    ])
}

/// PROGRAM: `sh -c SCRIPT sh DIR`.
const SCRIPT: &str = r#"D=$1
now() { date +%s%N; }
t0=$(now)
tok=${BATON_FENCING_TOKEN:-0}
F="$D/spans-$BATON_KEY-$BATON_OCCURRENCE"
n=$(( $$ % 21 + 6 ))
c=0
[ $(( $$ % 5 )) -eq 0 ] && c=1
echo "$$ start $tok $t0 $CHAOS_PROC ${BATON_ATTEMPT:-0} $BATON_JOB" >> "$F"
i=0
while [ $i -lt $n ]; do
  sleep 0.05
  echo "$$ alive $tok $(now)" >> "$F"
  i=$((i + 1))
done
echo "$$ end $tok $(now) $c" >> "$F"
exit $c"#;

/// One `baton schedule` process: worker `w`'s process of schedule `s`, its `gen`th start.
struct Proc {
    label: String,
    w: usize,
    s: usize,
    pid: i32,
    pidfd: OwnedFd,
    stalled: Arc<AtomicBool>,
    fill: OwnedFd,
    exit: Mutex<Option<(Option<i32>, Option<i32>)>>,
    /// Monotonic ns.
    spawned: u64,
    killed: AtomicBool,
    frozen: AtomicBool,
}

impl Proc {
    fn running(&self) -> bool {
        lock(&self.exit).is_none()
    }

    fn signal(&self, sig: i32) -> bool {
        self.running() && pidfd_signal(&self.pidfd, sig)
    }
}

/// What a fault took away, for S3: one process, one worker's link, or the server.
#[derive(Debug, Clone, PartialEq)]
enum Scope {
    Proc(String),
    Worker(usize),
    Server,
    /// A schedule paused by an operator (`baton pause`).
    Schedule(usize),
}

/// A fault's interval (monotonic ns; `to` is `u64::MAX` for a kill).
#[derive(Debug, Clone)]
struct Outage {
    scope: Scope,
    kind: &'static str,
    from: u64,
    to: u64,
}

struct Phase {
    cfg: SchedCfg,
    dir: PathBuf,
    bin: PathBuf,
    /// The workers' URL, `{port}` their link's.
    url: String,
    /// An operator's URL: straight to the server, not through a worker's link.
    admin_url: String,
    links: Vec<Arc<Link>>,
    specs: Vec<Spec>,
    redis: Arc<Mutex<RedisServer>>,
    log: Arc<Jsonl>,
    procs: Mutex<Vec<Arc<Proc>>>,
    gens: Mutex<BTreeMap<(usize, usize), usize>>,
    faults: Mutex<BTreeMap<String, u64>>,
    outages: Mutex<Vec<Outage>>,
    frozen_holders: Mutex<Vec<String>>,
    dropped_lines: Arc<AtomicU64>,
    /// The triggers made: schedule index, id (S8).
    triggers: Mutex<Vec<(usize, String)>>,
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn ns_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Phase {
    fn count(&self, kind: &str) {
        *lock(&self.faults).entry(kind.into()).or_default() += 1;
    }

    fn outage(&self, scope: Scope, kind: &'static str, from: u64, to: u64) {
        lock(&self.outages).push(Outage {
            scope,
            kind,
            from,
            to,
        });
    }

    fn live(&self) -> Vec<Arc<Proc>> {
        lock(&self.procs)
            .iter()
            .filter(|p| p.running())
            .cloned()
            .collect()
    }

    /// Starts worker `w`'s process of schedule `s` (a restart: `--catch-up last`).
    fn spawn(&self, w: usize, s: usize) -> Result<Arc<Proc>, BoxError> {
        let gen = {
            let mut g = lock(&self.gens);
            let e = g.entry((w, s)).or_default();
            *e += 1;
            *e - 1
        };
        let spec = &self.specs[s];
        let label = format!("w{w}-{}-g{gen}", spec.key);
        let (read, write) = pipe()?;
        let fill = write.try_clone()?;
        let url = self.url.replace("{port}", &self.links[w].port.to_string());
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("schedule");
        if self.cfg.control && w == 0 {
            cmd.args(["--prefix", "baton:shadow:"]);
        }
        cmd.args(["--key", spec.key])
            .args(spec.args)
            .args([
                "--lease",
                "1s",
                "--kill-grace",
                "200ms",
                "--max-attempts",
                "4",
                "--history",
                "500",
                "--trigger-poll",
                "1s",
            ])
            .args(["--name", &label])
            .arg("--events")
            .arg(self.dir.join(format!("events-{label}.jsonl")));
        if gen > 0 {
            cmd.args(["--catch-up", "last"]);
        }
        cmd.args(["--", "sh", "-c", SCRIPT, "sh"])
            .arg(&self.dir)
            // The URL carries the password: in the environment, never on a command line.
            .env("BATON_URL", url)
            .env_remove("BATON_REDIS_URL")
            .env("CHAOS_PROC", &label)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(write))
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().ok_or("baton exited at once")? as i32;
        let pidfd = pidfd_open(pid)?;
        let stalled = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        tokio::spawn(read_stderr(
            read,
            self.dir.join(format!("baton-{label}.stderr")),
            stalled.clone(),
            done.clone(),
            self.dropped_lines.clone(),
        ));
        let proc = Arc::new(Proc {
            label: label.clone(),
            w,
            s,
            pid,
            pidfd,
            stalled,
            fill,
            exit: Mutex::new(None),
            spawned: mono_ns(),
            killed: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
        });
        self.log
            .write(json!({"p":"control","type":"info","f":"spawn","proc":label,"pid":pid}));
        lock(&self.procs).push(proc.clone());
        let log = self.log.clone();
        let p2 = proc.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            *lock(&p2.exit) = Some((code, signal));
            done.store(true, Ordering::Relaxed);
            log.write(
                json!({"p":"control","type":"info","f":"exit","proc":p2.label,
                "code":code,"signal":signal}),
            );
        });
        Ok(proc)
    }

    /// The live processes whose PROGRAM wrote the last line of a spans file and still runs:
    /// the holders of running occurrences.
    fn holders(&self) -> Vec<Arc<Proc>> {
        let live = self.live();
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for e in rd.filter_map(|e| e.ok()) {
            if !e.file_name().to_string_lossy().starts_with("spans-") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let Some(last) = text
                .lines()
                .rev()
                .find(|l| l.split_whitespace().count() >= 4)
            else {
                continue;
            };
            if last.split_whitespace().nth(1) == Some("end") {
                continue;
            }
            let Some(pid) = last.split_whitespace().next().and_then(|p| p.parse().ok()) else {
                continue;
            };
            if let Some(pp) = parent(pid) {
                if let Some(p) = live.iter().find(|p| p.pid == pp) {
                    out.push(p.clone());
                }
            }
        }
        out
    }

    fn fault_log(&self, kind: &str, target: &str, detail: Value) {
        self.log.write(
            json!({"p":"nemesis","type":"start","kind":kind,"target":target,"detail":detail}),
        );
    }

    fn stop_log(&self, kind: &str, target: &str) {
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":kind,"target":target}));
    }

    /// A holder (`holder_share` of the time, when one runs) or any live process.
    fn pick(&self, rng: &mut Rng, holder_share: f64) -> Option<(Arc<Proc>, bool)> {
        let holders = self.holders();
        if !holders.is_empty() && rng.unit() < holder_share {
            return Some((holders[rng.below(holders.len())].clone(), true));
        }
        let live = self.live();
        if live.is_empty() {
            return None;
        }
        let p = live[rng.below(live.len())].clone();
        let is_holder = holders.iter().any(|h| h.pid == p.pid);
        Some((p, is_holder))
    }

    async fn freeze(&self, rng: &mut Rng) {
        // Until one holder has been frozen past its lease, every freeze waits for one.
        let none_yet = lock(&self.frozen_holders).is_empty();
        let share = if none_yet { 1.0 } else { 0.8 };
        let mut picked = None;
        for _ in 0..10 {
            match self.pick(rng, share) {
                Some((p, h)) if h || !none_yet => {
                    picked = Some((p, h));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let Some((target, is_holder)) = picked else {
            return;
        };
        if target.frozen.load(Ordering::Relaxed) {
            return;
        }
        let ms = rng.range(1300.0, 3000.0) as u64;
        let from = mono_ns();
        if !target.signal(libc::SIGSTOP) {
            return;
        }
        target.frozen.store(true, Ordering::Relaxed);
        self.count("freeze");
        self.fault_log("freeze", &target.label, json!({"ms":ms,"holder":is_holder}));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        target.signal(libc::SIGCONT);
        target.frozen.store(false, Ordering::Relaxed);
        self.outage(Scope::Proc(target.label.clone()), "freeze", from, mono_ns());
        if is_holder && ms > LEASE_MS {
            lock(&self.frozen_holders).push(target.label.clone());
        }
        self.stop_log("freeze", &target.label);
    }

    async fn kill(&self, rng: &mut Rng) {
        let Some((target, is_holder)) = self.pick(rng, 0.6) else {
            return;
        };
        // Never the schedule's last live process (nor one frozen: the freeze's lane owns it).
        let peers = self
            .live()
            .iter()
            .filter(|p| p.s == target.s && p.pid != target.pid)
            .count();
        if peers == 0 || target.frozen.load(Ordering::Relaxed) {
            return;
        }
        let from = mono_ns();
        // Marked first: the exit watcher may see the death before this lane goes on.
        target.killed.store(true, Ordering::Relaxed);
        if !target.signal(libc::SIGKILL) {
            target.killed.store(false, Ordering::Relaxed);
            return;
        }
        self.count("kill");
        self.outage(Scope::Proc(target.label.clone()), "kill", from, u64::MAX);
        let down_ms = rng.range(500.0, 2000.0) as u64;
        self.fault_log(
            "kill",
            &target.label,
            json!({"holder":is_holder,"down_ms":down_ms}),
        );
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        let res = self.spawn(target.w, target.s);
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"kill",
            "target":target.label,"restarted":res.as_ref().map(|p| p.label.clone()).ok(),
            "err":res.err().map(|e| e.to_string())}));
    }

    async fn stall_stderr(&self, rng: &mut Rng) {
        let Some((target, is_holder)) = self.pick(rng, 0.7) else {
            return;
        };
        if target.stalled.load(Ordering::Relaxed) {
            return;
        }
        let ms = rng.range(2000.0, 5000.0) as u64;
        self.count("stall_stderr");
        self.fault_log(
            "stall_stderr",
            &target.label,
            json!({"ms":ms,"holder":is_holder}),
        );
        target.stalled.store(true, Ordering::Relaxed);
        if let Ok(fd) = target.fill.try_clone() {
            // The filler thread blocks on the full pipe until the reader drains it.
            drop(tokio::task::spawn_blocking(move || fill_pipe(fd)));
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
        target.stalled.store(false, Ordering::Relaxed);
        self.stop_log("stall_stderr", &target.label);
    }

    async fn blip(&self, rng: &mut Rng) {
        // The holder's worker one time in two, when one runs.
        let w = match self.pick(rng, 0.5) {
            Some((p, true)) => p.w,
            _ => rng.below(self.links.len()),
        };
        let link = self.links[w].clone();
        let ms = rng.range(300.0, 2500.0) as u64;
        let silent = rng.unit() < 0.5;
        self.count("blip");
        self.fault_log("blip", &format!("w{w}"), json!({"ms":ms,"silent":silent}));
        let from = mono_ns();
        if silent {
            link.set_mode(Mode::Blackhole);
        } else {
            link.reset_all();
            link.set_mode(Mode::Refuse);
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
        link.set_mode(Mode::Pass);
        self.outage(Scope::Worker(w), "blip", from, mono_ns());
        self.stop_log("blip", &format!("w{w}"));
    }

    async fn pause_server(&self, rng: &mut Rng) {
        let ms = rng.range(200.0, 1000.0) as u64;
        let from = mono_ns();
        let r = lock(&self.redis).pause().map_err(|e| e.to_string());
        self.count("pause_server");
        self.fault_log("pause_server", "redis", json!({"ms":ms,"err":r.err()}));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let r = lock(&self.redis).resume().map_err(|e| e.to_string());
        self.outage(Scope::Server, "pause_server", from, mono_ns());
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"pause_server",
            "err":r.err()}));
    }

    /// An operator's `baton pause --key K`, and `baton resume --key K` 1–4 s later; the
    /// schedule counts as paused from before the first command to after the second.
    async fn pause_schedule(&self, rng: &mut Rng) {
        let s = rng.below(self.specs.len());
        let key = self.specs[s].key;
        let ms = rng.range(1000.0, 4000.0) as u64;
        self.count("pause_schedule");
        self.fault_log("pause_schedule", key, json!({"ms":ms}));
        let from = mono_ns();
        let paused = self
            .operator(&["pause", "--key", key, "--note", "chaos"])
            .await;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        // Resumed until it says so: a schedule left paused would excuse every later tick.
        let mut resumed = self.operator(&["resume", "--key", key]).await;
        for _ in 0..20 {
            if resumed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            resumed = self.operator(&["resume", "--key", key]).await;
        }
        self.outage(Scope::Schedule(s), "pause_schedule", from, mono_ns());
        self.log
            .write(json!({"p":"nemesis","type":"stop","kind":"pause_schedule",
            "target":key,"pause":paused.err(),"resume":resumed.err()}));
    }

    /// An operator's `baton trigger --key K` of one schedule.
    async fn trigger(&self, rng: &mut Rng) {
        let s = rng.below(self.specs.len());
        let key = self.specs[s].key;
        self.count("trigger");
        let made = self
            .operator_out(&["trigger", "--key", key, "--note", "chaos"])
            .await;
        if let Ok(id) = &made {
            lock(&self.triggers).push((s, id.trim().to_string()));
        }
        self.fault_log("trigger", key, json!({"made": made}));
    }

    /// Runs `baton ARGS` as an operator (the admin URL, in the environment), bounded by 5 s.
    async fn operator(&self, args: &[&str]) -> Result<(), String> {
        self.operator_out(args).await.map(drop)
    }

    /// [`Phase::operator`], its standard output.
    async fn operator_out(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(args)
            .env("BATON_URL", &self.admin_url)
            .env_remove("BATON_REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(5), cmd.output()).await;
        match out {
            Ok(Ok(o)) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into()),
            Ok(Ok(o)) => Err(format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    async fn lane(self: Arc<Self>, mut rng: Rng, deadline: u64, kinds: Vec<&'static str>) {
        while mono_ns() < deadline {
            tokio::time::sleep(Duration::from_millis(rng.range(300.0, 1200.0) as u64)).await;
            if mono_ns() >= deadline {
                break;
            }
            match kinds[rng.below(kinds.len())] {
                "freeze" => self.freeze(&mut rng).await,
                "kill" => self.kill(&mut rng).await,
                "stall_stderr" => self.stall_stderr(&mut rng).await,
                "blip" => self.blip(&mut rng).await,
                "pause_server" => self.pause_server(&mut rng).await,
                "pause_schedule" => self.pause_schedule(&mut rng).await,
                "trigger" => self.trigger(&mut rng).await,
                _ => {
                    self.count("nothing");
                    tokio::time::sleep(Duration::from_millis(rng.range(500.0, 2000.0) as u64))
                        .await;
                }
            }
        }
    }

    fn heal(&self) {
        let _ = lock(&self.redis).resume();
        for l in &self.links {
            l.set_mode(Mode::Pass);
        }
        for p in lock(&self.procs).iter() {
            p.stalled.store(false, Ordering::Relaxed);
            p.signal(libc::SIGCONT);
        }
    }
}

/// A tick under check: its schedule, job, times (wall ns) and whether a witness saw it.
#[derive(Debug, Clone)]
pub struct Tick {
    s: usize,
    job: String,
    tick_ns: u64,
    /// The end of its window, `T + P − E`.
    close_ns: u64,
    witness: Option<String>,
    /// What took every process away, when no witness.
    why: Vec<String>,
    /// Whether a pause of its schedule overlapped its window.
    paused: bool,
}

/// A trigger made during the phase (S8).
#[derive(Debug, Clone)]
pub struct Triggered {
    /// Its job, `KEY@manual@ID`.
    job: String,
    /// Whether a pause of its schedule overlapped it.
    paused: bool,
}

/// What a phase left behind for the checker.
pub struct SchedResult {
    pub cfg: SchedCfg,
    dir: PathBuf,
    workers: usize,
    ticks: Vec<Tick>,
    /// Every occurrence id of the phase (the checked ones and the others) → tick (wall ns).
    tick_of: BTreeMap<String, u64>,
    /// Job → its final state in the store (the main prefix).
    final_state: BTreeMap<String, Option<String>>,
    final_state_err: Option<String>,
    /// The triggers made (S8).
    triggered: Vec<Triggered>,
    /// Per schedule (by index): whether it runs under `--overlap buffer-one` (S7), and its key.
    exclusive: Vec<(&'static str, bool)>,
    /// The keys of the schedules under `--overlap buffer-one` (S6).
    buffered: Vec<&'static str>,
    /// Job → its occurrence's outcome in the schedule's record, repaired (S6).
    recorded: BTreeMap<String, String>,
    recorded_err: Option<String>,
    /// Process label → (exit code, signal, killed by the harness).
    exits: Vec<(String, Option<i32>, Option<i32>, bool)>,
    stuck: Vec<String>,
    faults: BTreeMap<String, u64>,
    frozen_holders: Vec<String>,
    /// server − wall (ns) and its bound, at the start and the end.
    offsets: Vec<(i64, u64)>,
    secret_in: Vec<String>,
}

/// Reads Redis TIME between two readings of the wall clock: (server − wall midpoint, half the
/// round trip + 1 µs of TIME's resolution), in ns; the tightest of 8 readings.
async fn clock_offset(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(i64, u64), BoxError> {
    let mut best: Option<(i64, u64)> = None;
    for _ in 0..8 {
        let before = wall_ns();
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
        let after = wall_ns();
        let server = s * 1_000_000_000 + us * 1_000;
        let mid = before / 2 + after / 2;
        let sample = (server as i64 - mid as i64, (after - before) / 2 + 1_000);
        if best.map_or(true, |b| sample.1 < b.1) {
            best = Some(sample);
        }
    }
    best.ok_or_else(|| "no clock reading".into())
}

async fn read_states(
    url: &str,
    jobs: &[String],
) -> Result<BTreeMap<String, Option<String>>, BoxError> {
    let client = redis::Client::open(url)?;
    let mut last = String::new();
    for _ in 0..20 {
        let fut = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let mut out = BTreeMap::new();
            for j in jobs {
                let v: Option<String> = redis::cmd("GET")
                    .arg(format!("baton:{{{j}}}"))
                    .query_async(&mut conn)
                    .await?;
                out.insert(j.clone(), v);
            }
            Ok::<_, redis::RedisError>(out)
        };
        match tokio::time::timeout(Duration::from_secs(5), fut).await {
            Ok(Ok(m)) => return Ok(m),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the final state: {last}").into())
}

/// Every occurrence on record of the schedules `keys` (each digest), repaired from the
/// occurrences' own jobs as `baton status --history` shows them: job → outcome.
async fn read_records(url: &str, keys: &[&str]) -> Result<BTreeMap<String, String>, BoxError> {
    let mut last = String::new();
    for _ in 0..20 {
        let fut = async {
            let client = baton::Client::connect(url).await?;
            let failover = client.failover();
            let mut out = BTreeMap::new();
            for key in keys {
                for record in failover.schedule_records(*key).await? {
                    for entry in failover
                        .schedule_history(*key, &record.digest, 1000)
                        .await?
                    {
                        // A manual occurrence's job is digest-free.
                        let digest = if entry.manual {
                            "manual"
                        } else {
                            &record.digest
                        };
                        out.insert(
                            format!("{key}@{digest}@{}", entry.id),
                            entry.outcome.as_str().to_string(),
                        );
                    }
                }
            }
            Ok::<_, baton::Error>(out)
        };
        match tokio::time::timeout(Duration::from_secs(10), fut).await {
            Ok(Ok(m)) => return Ok(m),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the schedules' records: {last}").into())
}

fn terminal(s: &Option<String>) -> bool {
    matches!(s.as_deref(), Some("DONE" | "EXHAUSTED"))
}

/// Runs one scheduling phase: the server, the workers' links, the fleet, the faults, the heal,
/// the final state.
pub async fn run_phase(cfg: SchedCfg, root: &Path, canary: &str) -> Result<SchedResult, BoxError> {
    let dir = root.join(&cfg.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let bin = baton_bin(&dir)?;
    let log = Arc::new(Jsonl::open(&dir.join("nemesis.jsonl"))?);
    log.write(
        json!({"p":"control","type":"info","f":"phase","name":cfg.name,
        "seed":cfg.seed,"control":cfg.control}),
    );
    let pw = canary.to_string();
    let redis = tokio::task::spawn_blocking(move || {
        RedisServer::builder()
            .persistence(Persistence::Durable)
            .requirepass(&pw)
            .acl_user(WORKER_USER, &pw, "baton:")
            .start()
    })
    .await??;
    let port = redis.port();
    let admin_url = format!("redis://:{canary}@127.0.0.1:{port}/");
    let mut rng = Rng::new(mix(&[cfg.seed, 0x5C1]));
    let workers = if cfg.control { 3 } else { 3 + rng.below(2) };
    let mut links = Vec::new();
    for w in 0..workers {
        links.push(
            Link::start(
                &format!("w{w}"),
                port,
                log.clone(),
                mix(&[cfg.seed, 0x5C2, w as u64]),
            )
            .await?,
        );
    }
    let admin = redis::Client::open(admin_url.as_str())?;
    let mut conn = admin.get_multiplexed_async_connection().await?;
    let mut offsets = vec![clock_offset(&mut conn).await?];
    let specs = specs()?;
    let nspecs = specs.len();
    let phase = Arc::new(Phase {
        cfg: cfg.clone(),
        dir: dir.clone(),
        bin,
        url: format!("redis://{WORKER_USER}:{canary}@127.0.0.1:{{port}}/"),
        admin_url: admin_url.clone(),
        links,
        specs,
        redis: Arc::new(Mutex::new(redis)),
        log: log.clone(),
        procs: Mutex::new(Vec::new()),
        gens: Mutex::new(BTreeMap::new()),
        faults: Mutex::new(BTreeMap::new()),
        outages: Mutex::new(Vec::new()),
        frozen_holders: Mutex::new(Vec::new()),
        dropped_lines: Arc::new(AtomicU64::new(0)),
        triggers: Mutex::new(Vec::new()),
    });
    // Monotonic and wall clocks side by side: fault intervals are monotonic, ticks wall.
    let (mono0, wall0) = (mono_ns(), wall_ns());
    let to_wall = |m: u64| -> u64 {
        if m == u64::MAX {
            u64::MAX
        } else {
            (m + wall0).saturating_sub(mono0)
        }
    };
    for w in 0..workers {
        for s in 0..nspecs {
            phase.spawn(w, s)?;
        }
    }
    let start_wall = wall_ns();
    let start = mono_ns();
    let deadline = start + (cfg.chaos_s * 1e9) as u64;
    let lanes: Vec<Vec<&'static str>> = if cfg.control {
        Vec::new()
    } else {
        vec![
            vec![
                "freeze",
                "kill",
                "stall_stderr",
                "pause_schedule",
                "nothing",
            ],
            vec!["blip", "pause_server", "freeze", "trigger", "nothing"],
            vec!["freeze", "kill", "blip", "trigger"],
        ]
    };
    // Faults start once the first occurrences run.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let tasks: Vec<_> = lanes
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            tokio::spawn(phase.clone().lane(
                Rng::new(mix(&[cfg.seed, 0x5C3, i as u64])),
                deadline,
                k,
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_nanos(deadline.saturating_sub(mono_ns()))).await;
    for t in tasks {
        let _ = t.await;
    }
    phase.heal();
    let heal = mono_ns();
    let end_wall = to_wall(deadline);
    log.write(json!({"p":"control","type":"info","f":"heal"}));

    // The ticks of the phase, and those under check: window closed by the end of the faults.
    let mut ticks = Vec::new();
    let mut tick_of = BTreeMap::new();
    let outages = lock(&phase.outages).clone();
    let procs: Vec<Arc<Proc>> = lock(&phase.procs).clone();
    for (s, spec) in phase.specs.iter().enumerate() {
        let mut t = UNIX_EPOCH + Duration::from_nanos(start_wall.saturating_sub(10_000_000_000));
        while let Some(next) = spec.schedule.next_after(t) {
            t = next;
            let Some(occ) = spec.schedule.occurrence_of_tick(t) else {
                break;
            };
            let tick_ns = ns_of(t);
            if tick_ns > end_wall + 20_000_000_000 {
                break;
            }
            let Some(close) = occ
                .next_tick()
                .map(|n| ns_of(n) - occ.early_tolerance().as_nanos() as u64)
            else {
                continue;
            };
            if tick_ns < start_wall || close > end_wall {
                continue;
            }
            // A witness: spawned a second before the window, not frozen or cut off in it, not
            // killed in it or for 10 s after.
            let win = (tick_ns.saturating_sub(WITNESS_LEAD_NS), close);
            let mut witness = None;
            let mut why = Vec::new();
            let server_out = outages.iter().find(|o| {
                o.scope == Scope::Server && to_wall(o.from) < win.1 && to_wall(o.to) > win.0
            });
            let paused = outages.iter().any(|o| {
                o.scope == Scope::Schedule(s) && to_wall(o.from) < win.1 && to_wall(o.to) > win.0
            });
            if paused {
                why.push("the schedule was paused".into());
            } else if let Some(o) = server_out {
                why.push(format!("server: {}", o.kind));
            } else {
                for p in procs.iter().filter(|p| p.s == s) {
                    if to_wall(p.spawned) + WITNESS_LEAD_NS > win.0 {
                        if to_wall(p.spawned) < win.1 {
                            why.push(format!("{}: started late", p.label));
                        }
                        continue;
                    }
                    let hit = outages.iter().find(|o| {
                        let (from, to) = (to_wall(o.from), to_wall(o.to));
                        let applies = match &o.scope {
                            Scope::Proc(l) => *l == p.label,
                            Scope::Worker(w) => *w == p.w,
                            Scope::Server | Scope::Schedule(_) => false,
                        };
                        let until = if o.kind == "kill" {
                            win.1 + WITNESS_LIFE_NS
                        } else {
                            win.1
                        };
                        applies && from < until && to > win.0
                    });
                    match hit {
                        Some(o) => why.push(format!("{}: {}", p.label, o.kind)),
                        None => {
                            witness = Some(p.label.clone());
                            break;
                        }
                    }
                }
            }
            ticks.push(Tick {
                s,
                job: occ.job_key(spec.key),
                tick_ns,
                close_ns: close,
                witness,
                why,
                paused,
            });
        }
    }
    // Let the checked ticks end (the fleet keeps running, healed), then stop the fleet.
    // Done when every checked tick's job is terminal, or when no state changed for 4 s (a
    // missed tick, or one left at a lost holder's attempt, never ends): longer than a lease
    // plus the longest PROGRAM, so a running occurrence always moves within it.
    // The triggers made, and whether a pause of their schedule overlapped them (S8).
    let mut triggered = Vec::new();
    for (s, id) in lock(&phase.triggers).iter() {
        let key = phase.specs[*s].key;
        let at = id
            .strip_prefix("manual-")
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map_or(0, |t| t.as_nanosecond().max(0) as u64);
        tick_of.insert(format!("{key}|{id}"), at);
        let paused = outages.iter().any(|o| {
            o.scope == Scope::Schedule(*s)
                && to_wall(o.from) < at + 5_000_000_000
                && to_wall(o.to) > at.saturating_sub(1_000_000_000)
        });
        triggered.push(Triggered {
            job: format!("{key}@manual@{id}"),
            paused,
        });
    }
    let mut jobs: Vec<String> = ticks.iter().map(|t| t.job.clone()).collect();
    jobs.extend(triggered.iter().map(|t| t.job.clone()));
    let bound = heal + SETTLE_S * 1_000_000_000;
    let mut seen: Option<(BTreeMap<String, Option<String>>, u64)> = None;
    loop {
        let states = read_states(&admin_url, &jobs).await.ok();
        let all = states.as_ref().is_some_and(|m| m.values().all(terminal));
        let now = mono_ns();
        let stable = match (&seen, &states) {
            (Some((prev, since)), Some(cur)) if prev == cur => now - since > 4_000_000_000,
            _ => {
                seen = states.map(|m| (m, now));
                false
            }
        };
        if all || stable || now > bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    offsets.push(clock_offset(&mut conn).await?);
    for p in phase.live() {
        p.signal(libc::SIGTERM);
    }
    let stop_bound = mono_ns() + 8_000_000_000;
    while !phase.live().is_empty() && mono_ns() < stop_bound {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut stuck = Vec::new();
    for p in phase.live() {
        stuck.push(p.label.clone());
        p.killed.store(false, Ordering::Relaxed);
        p.signal(libc::SIGKILL);
    }
    for _ in 0..100 {
        if lock(&phase.procs).iter().all(|p| !p.running()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every occurrence the fleet could have run, until it stopped.
    let stop_wall = wall_ns();
    for spec in &phase.specs {
        let mut t = UNIX_EPOCH + Duration::from_nanos(start_wall.saturating_sub(10_000_000_000));
        while let Some(next) = spec.schedule.next_after(t) {
            t = next;
            if ns_of(t) > stop_wall + 10_000_000_000 {
                break;
            }
            if let Some(occ) = spec.schedule.occurrence_of_tick(t) {
                tick_of.insert(format!("{}|{}", spec.key, occ.id()), ns_of(t));
            }
        }
    }
    let (final_state, final_state_err) = match read_states(&admin_url, &jobs).await {
        Ok(s) => (s, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let keys: Vec<&str> = phase.specs.iter().map(|s| s.key).collect();
    let exclusive = phase.specs.iter().map(|s| (s.key, s.exclusive)).collect();
    let buffered = phase
        .specs
        .iter()
        .filter(|s| s.args.contains(&"buffer-one"))
        .map(|s| s.key)
        .collect();
    let (recorded, recorded_err) = match read_records(&admin_url, &keys).await {
        Ok(r) => (r, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let mut faults = lock(&phase.faults).clone();
    faults.insert(
        "total".into(),
        [
            "freeze",
            "kill",
            "stall_stderr",
            "blip",
            "pause_server",
            "pause_schedule",
            "trigger",
        ]
        .iter()
        .map(|k| faults.get(*k).copied().unwrap_or(0))
        .sum(),
    );
    faults.insert(
        "procs_that_dropped_output".into(),
        phase.dropped_lines.load(Ordering::Relaxed),
    );
    let exits = lock(&phase.procs)
        .iter()
        .map(|p| {
            let (c, s) = lock(&p.exit).unwrap_or((None, None));
            (p.label.clone(), c, s, p.killed.load(Ordering::Relaxed))
        })
        .collect();
    let frozen_holders = lock(&phase.frozen_holders).clone();
    let _ = std::fs::remove_file(dir.join("baton-bin"));
    let secret_in = files_holding(&dir, canary);
    log.write(json!({"p":"control","type":"info","f":"phase_end","stuck":stuck}));
    drop(conn);
    let redis = phase.redis.clone();
    drop(phase);
    let _ = tokio::task::spawn_blocking(move || drop(redis)).await;
    Ok(SchedResult {
        cfg,
        dir,
        workers,
        ticks,
        tick_of,
        final_state,
        final_state_err,
        recorded,
        recorded_err,
        triggered,
        exclusive,
        buffered,
        exits,
        stuck,
        faults,
        frozen_holders,
        offsets,
        secret_in,
    })
}

/// One PROGRAM as it recorded itself.
#[derive(Debug, Clone)]
struct Span {
    pid: u32,
    token: u64,
    first: u64,
    last: u64,
    /// From its `start` line: its wall-clock start, process, job and attempt.
    start: Option<(u64, String, String, u64)>,
    /// Its `end` line's exit code.
    code: Option<i32>,
}

fn spans(path: &Path) -> Vec<Span> {
    let mut by_pid: BTreeMap<u32, Span> = BTreeMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (Ok(pid), Ok(token), Ok(ns)) = (f[0].parse(), f[2].parse(), f[3].parse::<u64>()) else {
            continue;
        };
        let s = by_pid.entry(pid).or_insert(Span {
            pid,
            token,
            first: ns,
            last: ns,
            start: None,
            code: None,
        });
        s.first = s.first.min(ns);
        s.last = s.last.max(ns);
        match (f[1], f.len()) {
            ("start", 7) => {
                s.start = Some((
                    ns,
                    f[4].to_string(),
                    f[6].to_string(),
                    f[5].parse().unwrap_or(0),
                ))
            }
            ("end", 5) => s.code = f[4].parse().ok(),
            _ => {}
        }
    }
    let mut all: Vec<Span> = by_pid.into_values().collect();
    all.sort_by_key(|s| s.first);
    all
}

/// The phase's verdict lines (`(name, pass, note)`) and its statistics for report.json.
pub fn check(r: &SchedResult) -> (Vec<(String, bool, String)>, Value) {
    let name = &r.cfg.name;
    // Every process's `occurrence_ended` reports: job → processes that reported it done.
    let mut done_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for (label, ..) in &r.exits {
        for ev in read_jsonl(&r.dir.join(format!("events-{label}.jsonl"))) {
            if ev["event"] != "occurrence_ended" {
                continue;
            }
            let outcome = ev["outcome"].as_str().unwrap_or("?").to_string();
            *outcomes.entry(outcome.clone()).or_default() += 1;
            if outcome == "done" {
                if let Some(job) = ev["job"].as_str() {
                    done_by.entry(job.into()).or_default().push(label.clone());
                }
            }
        }
    }
    // S1 and S2 over every spans file.
    let mut s1 = Vec::new();
    let mut s2 = Vec::new();
    let mut programs = 0usize;
    let mut takeovers = 0usize;
    let mut cut = 0usize;
    let mut lateness_ms: Vec<f64> = Vec::new();
    // The tightest reading of the server's clock against this host's (one host: one clock,
    // so the offset is the reading's error, within its bound).
    let (off, bound) = r
        .offsets
        .iter()
        .min_by_key(|o| o.1)
        .map_or((0, 0), |o| (o.0, o.1 as i64));
    let files: Vec<PathBuf> = std::fs::read_dir(&r.dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("spans-"))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut occurrences = 0usize;
    // Under buffer-one: every PROGRAM's span with its job, per schedule key (S7).
    let mut by_schedule: BTreeMap<String, Vec<(u64, u64, String, u32)>> = BTreeMap::new();
    // The jobs some PROGRAM ran for, and those one ran to success (S6).
    let mut ran: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut succeeded: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    // Job → its last attempt that ran PROGRAM, and that PROGRAM's process.
    for path in &files {
        let all = spans(path);
        if all.is_empty() {
            continue;
        }
        occurrences += 1;
        programs += all.len();
        takeovers += usize::from(all.len() > 1);
        cut += all.iter().filter(|s| s.code.is_none()).count();
        let Some(job) = all
            .iter()
            .find_map(|s| s.start.as_ref().map(|x| x.2.clone()))
        else {
            continue;
        };
        ran.insert(job.clone());
        if all.iter().any(|s| s.code == Some(0)) {
            succeeded.insert(job.clone());
        }
        let key = job.split('@').next().unwrap_or("").to_string();
        if r.exclusive.iter().any(|(k, x)| *x && *k == key) {
            for sp in &all {
                by_schedule.entry(key.clone()).or_default().push((
                    sp.first,
                    sp.last,
                    job.clone(),
                    sp.pid,
                ));
            }
        }
        let mut latest: Option<&Span> = None;
        for s in &all {
            if let Some(p) = latest {
                if p.last >= s.first {
                    s1.push(format!(
                        "{job}: PROGRAM {} (token {}) still ran {} ms after PROGRAM {} (token \
                         {}) started",
                        p.pid,
                        p.token,
                        (p.last - s.first) / 1_000_000,
                        s.pid,
                        s.token
                    ));
                }
                if s.token <= p.token {
                    s1.push(format!(
                        "{job}: PROGRAM {} started with token {} after PROGRAM {} with token {}",
                        s.pid, s.token, p.pid, p.token
                    ));
                }
            }
            if latest.map_or(true, |p| s.last > p.last) {
                latest = Some(s);
            }
            // S2: its start by the server's clock against its tick.
            if let Some((start, ..)) = &s.start {
                let (key, occ) = job
                    .split_once('@')
                    .map(|(k, rest)| (k, rest.rsplit_once('@').map_or("", |x| x.1)))
                    .unwrap_or(("", ""));
                match r.tick_of.get(&format!("{key}|{occ}")) {
                    Some(tick) => {
                        let server = *start as i64 + off;
                        lateness_ms.push((server - *tick as i64) as f64 / 1e6);
                        if server + bound < *tick as i64 {
                            s2.push(format!(
                                "{job}: PROGRAM {} started {:.1} ms before its tick by the \
                                 server's clock (bound {:.1} ms)",
                                s.pid,
                                (*tick as i64 - server) as f64 / 1e6,
                                bound as f64 / 1e6
                            ));
                        }
                    }
                    None => s2.push(format!(
                        "{job}: PROGRAM {} ran an unknown occurrence",
                        s.pid
                    )),
                }
            }
        }
        // No completion twice: one process reports the occurrence done, and no PROGRAM starts
        // after its PROGRAM with a higher token.
        let reporters = done_by.get(&job).cloned().unwrap_or_default();
        if reporters.len() > 1 {
            s1.push(format!(
                "{job}: reported done by {} processes: {}",
                reporters.len(),
                reporters.join(", ")
            ));
        }
        for rep in &reporters {
            let mine = all
                .iter()
                .filter(|s| s.start.as_ref().is_some_and(|x| x.1 == *rep))
                .map(|s| s.token)
                .max();
            if let Some(tok) = mine {
                if let Some(later) = all.iter().find(|s| s.token > tok) {
                    s1.push(format!(
                        "{job}: PROGRAM {} (token {}) ran after {rep}'s PROGRAM (token {tok}) \
                         was reported done",
                        later.pid, later.token
                    ));
                }
            }
        }
    }
    // S3.
    let mut s3 = Vec::new();
    let mut excused = Vec::new();
    let (mut checked, mut done, mut exhausted, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    if let Some(e) = &r.final_state_err {
        s3.push(format!("final state unreadable: {e}"));
    }
    for t in &r.ticks {
        let st = r.final_state.get(&t.job).cloned().flatten();
        if t.witness.is_none() {
            excused.push(format!(
                "{} ({}): {}",
                t.job,
                st.as_deref().unwrap_or("missed"),
                t.why.join(", ")
            ));
            continue;
        }
        checked += 1;
        match st.as_deref() {
            Some("DONE") => done += 1,
            Some("EXHAUSTED") => exhausted += 1,
            // Skipped by its overlap rule (another occurrence ran): never acquired, on record
            // (S6 checks that no PROGRAM ran for it).
            None if r.recorded.get(&t.job).map(String::as_str) == Some("skipped_overlap") => {
                skipped += 1
            }
            other => s3.push(format!(
                "{}: final state {other:?} (window closed {} ms after the tick; witness {})",
                t.job,
                (t.close_ns - t.tick_ns) / 1_000_000,
                t.witness.as_deref().unwrap_or("-")
            )),
        }
    }
    // S6: the record against the store and the PROGRAMs.
    let mut s6 = Vec::new();
    let mut on_record: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(e) = &r.recorded_err {
        s6.push(format!("records unreadable: {e}"));
    }
    for t in &r.ticks {
        let st = r.final_state.get(&t.job).cloned().flatten();
        let Some(outcome) = r.recorded.get(&t.job) else {
            s6.push(format!("{}: no entry on record (store: {st:?})", t.job));
            continue;
        };
        *on_record.entry(outcome.clone()).or_default() += 1;
        let program = ran.contains(&t.job);
        let bad = match outcome.as_str() {
            "done" => st.as_deref() != Some("DONE"),
            "exhausted" => st.as_deref() != Some("EXHAUSTED"),
            "missed" => program || terminal(&st),
            "skipped_paused" => program || terminal(&st) || !t.paused,
            "running" | "failed" => t.witness.is_some() || terminal(&st),
            // Under buffer-one a retry (its earlier attempt's PROGRAM killed or failed) waits
            // behind another occurrence too, and is settled if its window closes first.
            "skipped_overlap" => {
                let buffered = r
                    .buffered
                    .iter()
                    .any(|k| t.job.split('@').next() == Some(*k));
                succeeded.contains(&t.job) || (program && !buffered)
            }
            // Stopped by a later occurrence (`--overlap replace`): its job completed.
            "replaced" => st.as_deref() != Some("DONE"),
            _ => true,
        };
        if bad {
            s6.push(format!(
                "{}: recorded {outcome}, store {st:?}, PROGRAM {}, paused {}, witness {}",
                t.job,
                if program { "ran" } else { "never ran" },
                t.paused,
                t.witness.as_deref().unwrap_or("-")
            ));
        }
    }
    // S8: the triggers.
    let mut s8 = Vec::new();
    let mut trig_outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for t in &r.triggered {
        let st = r.final_state.get(&t.job).cloned().flatten();
        let rec = r.recorded.get(&t.job).cloned();
        let program = ran.contains(&t.job);
        let key = match (st.as_deref(), rec.as_deref()) {
            (Some("DONE"), Some("done")) | (Some("EXHAUSTED"), Some("exhausted")) => "ran",
            // Under `--overlap replace` a later tick may stop it; under `skip`/`buffer-one`
            // an earlier running one may skip it.
            (Some("DONE"), Some("replaced")) => "replaced",
            (_, Some("skipped_overlap")) if !program => "skipped_overlap",
            (None, Some("skipped_paused")) if t.paused && !program => "skipped_paused",
            _ => {
                s8.push(format!(
                    "{}: store {st:?}, record {rec:?}, PROGRAM {}, paused {}",
                    t.job,
                    if program { "ran" } else { "never ran" },
                    t.paused
                ));
                "bad"
            }
        };
        *trig_outcomes.entry(key.into()).or_default() += 1;
    }
    // S7: under buffer-one, no two occurrences' PROGRAMs at once.
    let mut s7 = Vec::new();
    let mut s7_spans = 0usize;
    for (key, spans) in &mut by_schedule {
        spans.sort();
        s7_spans += spans.len();
        let mut latest: Option<(u64, String, u32)> = None;
        for (first, last, job, pid) in spans.iter() {
            if let Some((end, other, opid)) = &latest {
                if *end >= *first && other != job {
                    s7.push(format!(
                        "{key}: PROGRAM {pid} of {job} started {} ms before PROGRAM {opid} of \
                         {other} ended",
                        (end - first) / 1_000_000
                    ));
                }
            }
            if latest.as_ref().map_or(true, |l| *last > l.0) {
                latest = Some((*last, job.clone(), *pid));
            }
        }
    }
    // S4.
    let mut s4 = Vec::new();
    let mut by_exit: BTreeMap<String, u64> = BTreeMap::new();
    for (label, code, signal, killed) in &r.exits {
        let k = match (code, signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown".into(),
        };
        *by_exit.entry(k.clone()).or_default() += 1;
        let ok = if *killed {
            *signal == Some(libc::SIGKILL)
        } else {
            matches!(code, Some(0 | 143))
        };
        if !ok {
            s4.push(format!("{label} exited {k} (see baton-{label}.stderr)"));
        }
    }
    for l in &r.stuck {
        s4.push(format!("{l} still ran 8 s after SIGTERM"));
    }
    let frozen_cut = r.frozen_holders.len();
    let per_sched: Vec<Value> = (0..r.exclusive.len())
        .map(|s| json!(r.ticks.iter().filter(|t| t.s == s).count()))
        .collect();
    lateness_ms.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| -> f64 {
        lateness_ms
            .get(((lateness_ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let stats = json!({
        "workers": r.workers, "occurrences": occurrences, "programs": programs,
        "takeovers": takeovers, "programs_cut": cut, "ticks_checked": checked,
        "ticks_per_schedule": per_sched, "done": done, "exhausted": exhausted,
        "excused": excused.len(), "excused_examples": excused.iter().take(8).collect::<Vec<_>>(),
        "outcomes": outcomes, "on_record": on_record, "exits": by_exit, "faults": r.faults,
        "frozen_holders": frozen_cut, "clock_offsets_ns": r.offsets,
        "start_after_tick_ms": {"min": pct(0.0), "median": pct(0.5), "max": pct(1.0)},
        "s1_examples": s1.iter().take(8).collect::<Vec<_>>(),
    });
    println!(
        "chaos: {name}: {} workers, occurrences {occurrences} programs {programs} takeovers \
         {takeovers} ticks checked {checked} (done {done}, exhausted {exhausted}) excused {} \
         outcomes {} exits {} faults {}; PROGRAM start − tick: min {:.1} median {:.1} ms",
        r.workers,
        excused.len(),
        json!(outcomes),
        json!(by_exit),
        json!(r.faults),
        pct(0.0),
        pct(0.5)
    );
    let examples = |v: &[String]| {
        for ex in v.iter().take(8) {
            println!("    {name} example: {ex}");
        }
    };
    let mut lines = Vec::new();
    if r.cfg.control {
        examples(&s1);
        let pass = !s1.is_empty();
        lines.push((
            format!("control {name}"),
            pass,
            if pass {
                format!(
                    "bit: S1 flagged {} violation(s) of a worker running every tick under \
                     another prefix ({occurrences} occurrences)",
                    s1.len()
                )
            } else {
                format!("did not bite: S1 flagged nothing ({occurrences} occurrences)")
            },
        ));
        return (lines, stats);
    }
    examples(&s1);
    lines.push((
        format!("{name} S1 no occurrence's PROGRAMs overlap or complete twice"),
        s1.is_empty(),
        format!(
            "{} violation(s) in {programs} PROGRAMs of {occurrences} occurrences ({takeovers} \
             with a retry or takeover)",
            s1.len()
        ),
    ));
    examples(&s2);
    lines.push((
        format!("{name} S2 no PROGRAM starts before its tick by the server's clock"),
        s2.is_empty() && !lateness_ms.is_empty(),
        format!(
            "{} violation(s) in {} starts; offset server − wall {} ns ± {} ns; start − tick \
             min {:.1} ms",
            s2.len(),
            lateness_ms.len(),
            off,
            bound,
            pct(0.0)
        ),
    ));
    examples(&s3);
    for ex in excused.iter().take(4) {
        println!("    {name} excused: {ex}");
    }
    lines.push((
        format!("{name} S3 every witnessed tick ends DONE or EXHAUSTED (or skipped by overlap)"),
        s3.is_empty() && checked > 0,
        format!(
            "{} violation(s); {checked} ticks checked ({done} DONE, {exhausted} EXHAUSTED, \
             {skipped} skipped by overlap), {} with no witness (every process frozen, killed or \
             cut off, the server paused, or the schedule paused)",
            s3.len(),
            excused.len()
        ),
    ));
    examples(&s4);
    lines.push((
        format!("{name} S4 every baton schedule exits 0 or 143 on SIGTERM"),
        s4.is_empty(),
        format!("{} violation(s); exits {}", s4.len(), json!(by_exit)),
    ));
    examples(&r.secret_in);
    lines.push((
        format!("{name} S5 no secret in logs"),
        r.secret_in.is_empty(),
        format!("{} violation(s)", r.secret_in.len()),
    ));
    examples(&s6);
    lines.push((
        format!("{name} S6 the record agrees with the store and the PROGRAMs"),
        s6.is_empty() && !r.ticks.is_empty(),
        format!(
            "{} violation(s) in {} ticks; on record {}",
            s6.len(),
            r.ticks.len(),
            json!(on_record)
        ),
    ));
    examples(&s8);
    lines.push((
        format!("{name} S8 every trigger runs once and ends DONE or EXHAUSTED on record"),
        s8.is_empty() && !r.triggered.is_empty(),
        format!(
            "{} violation(s) in {} triggers: {}",
            s8.len(),
            r.triggered.len(),
            json!(trig_outcomes)
        ),
    ));
    examples(&s7);
    lines.push((
        format!("{name} S7 under buffer-one and replace no two occurrences run at once"),
        s7.is_empty() && s7_spans > 0,
        format!("{} violation(s) in {s7_spans} PROGRAMs", s7.len()),
    ));
    let total = r.faults.get("total").copied().unwrap_or(0);
    let kinds = [
        "freeze",
        "kill",
        "stall_stderr",
        "blip",
        "pause_server",
        "pause_schedule",
    ]
    .iter()
    .filter(|k| r.faults.get(**k).copied().unwrap_or(0) > 0)
    .count();
    let want_total = (5.0 * (r.cfg.chaos_s / 20.0).min(1.0)).floor() as u64;
    lines.push((
        format!("{name} faults injected"),
        total >= want_total && kinds >= 3 && frozen_cut > 0 && takeovers > 0,
        format!(
            "{total} faults of {kinds} kinds (required: {want_total} of 3); {frozen_cut} \
             holders frozen past the lease, {takeovers} occurrences with more than one PROGRAM \
             (> 0 expected each)"
        ),
    ));
    (lines, stats)
}
