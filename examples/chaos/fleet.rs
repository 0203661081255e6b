//! The worker processes: spawn (re-executing this example), signal, restart, and record exits.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::json;

use crate::util::{BoxError, Jsonl};
use crate::worker::{WorkerArgs, URL_ENV};

#[derive(Debug, Clone, Serialize)]
pub struct ExitRec {
    pub worker: usize,
    pub inc: u32,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// SIGKILLed by the nemesis (or at the quiescence bound, see `killed_at_bound`).
    pub killed: bool,
    pub killed_at_bound: bool,
}

#[derive(Debug, Default)]
struct Slot {
    inc: u32,
    pid: Option<i32>,
    running: bool,
    stopped: bool,
    killed: bool,
    killed_at_bound: bool,
}

pub struct Fleet {
    exe: PathBuf,
    url: String,
    base: WorkerArgs,
    slots: Vec<Mutex<Slot>>,
    pub exits: Mutex<Vec<ExitRec>>,
    log: Arc<Jsonl>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fleet {
    /// `urls[i]` is worker i's Redis URL (its proxy port, with the password).
    pub fn new(base: WorkerArgs, url_for: String, n: usize, log: Arc<Jsonl>) -> Arc<Fleet> {
        // A private copy of this executable: another `cargo build` may replace (or delete) the
        // file in target/ while the run goes on.
        let phase = base
            .run_dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let exe = base
            .run_dir
            .with_file_name(format!("chaos-worker-bin-{phase}"));
        let exe = match std::env::current_exe().and_then(|src| std::fs::copy(src, &exe)) {
            Ok(_) => exe,
            Err(_) => std::env::current_exe().unwrap_or_else(|_| PathBuf::from("chaos")),
        };
        Arc::new(Fleet {
            exe,
            url: url_for,
            base,
            slots: (0..n).map(|_| Mutex::new(Slot::default())).collect(),
            exits: Mutex::new(Vec::new()),
            log,
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// `url` contains `{port}`, replaced by the worker's proxy port.
    pub fn spawn(self: &Arc<Self>, i: usize, proxy_port: u16) -> Result<(), BoxError> {
        let mut slot = lock(&self.slots[i]);
        slot.inc += 1;
        let mut args = self.base.clone();
        args.id = i;
        args.inc = slot.inc;
        let stderr =
            std::fs::File::create(args.run_dir.join(format!("worker-{i}.{}.stderr", slot.inc)))?;
        let mut child = tokio::process::Command::new(&self.exe)
            .args(args.to_args())
            .env(URL_ENV, self.url.replace("{port}", &proxy_port.to_string()))
            .env("RUST_BACKTRACE", "1")
            .envs(pg_maintenance(&self.url))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().map(|p| p as i32);
        *slot = Slot {
            inc: slot.inc,
            pid,
            running: true,
            ..Slot::default()
        };
        self.log
            .write(json!({"p":"control","type":"info","f":"spawn","worker":i,
            "inc":slot.inc,"pid":pid}));
        let inc = slot.inc;
        let fleet = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let mut slot = lock(&fleet.slots[i]);
            let (code, signal) = match status {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let rec = ExitRec {
                worker: i,
                inc,
                code,
                signal,
                killed: slot.inc == inc && slot.killed,
                killed_at_bound: slot.inc == inc && slot.killed_at_bound,
            };
            if slot.inc == inc {
                slot.running = false;
                slot.pid = None;
            }
            fleet
                .log
                .write(json!({"p":"control","type":"info","f":"exit","rec":rec}));
            lock(&fleet.exits).push(rec);
        });
        Ok(())
    }

    pub fn pid(&self, i: usize) -> Option<i32> {
        let s = lock(&self.slots[i]);
        if s.running {
            s.pid
        } else {
            None
        }
    }

    pub fn inc(&self, i: usize) -> u32 {
        lock(&self.slots[i]).inc
    }

    fn signal(&self, i: usize, sig: i32) -> Option<i32> {
        let mut s = lock(&self.slots[i]);
        let pid = if s.running { s.pid? } else { return None };
        // SAFETY: plain kill(2) on a child we spawned and have not reaped (running is cleared
        // under this lock when it is reaped).
        let rc = unsafe { libc::kill(pid, sig) };
        if rc != 0 {
            return None;
        }
        match sig {
            libc::SIGSTOP => s.stopped = true,
            libc::SIGCONT => s.stopped = false,
            libc::SIGKILL => {
                s.killed = true;
                s.stopped = false;
            }
            _ => {}
        }
        Some(pid)
    }

    pub fn stop(&self, i: usize) -> Option<i32> {
        self.signal(i, libc::SIGSTOP)
    }

    pub fn cont(&self, i: usize) -> Option<i32> {
        self.signal(i, libc::SIGCONT)
    }

    pub fn kill(&self, i: usize) -> Option<i32> {
        self.signal(i, libc::SIGKILL)
    }

    pub fn running(&self, i: usize) -> bool {
        lock(&self.slots[i]).running
    }

    /// SIGCONT every stopped worker.
    pub fn cont_all(&self) {
        for i in 0..self.slots.len() {
            if lock(&self.slots[i]).stopped {
                self.cont(i);
            }
        }
    }

    /// Kills whatever still runs at the quiescence bound.
    pub fn kill_leftovers(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            let running = lock(&self.slots[i]).running;
            if running {
                lock(&self.slots[i]).killed_at_bound = true;
                self.kill(i);
                out.push(i);
            }
        }
        out
    }

    pub fn all_exited(&self) -> bool {
        self.slots.iter().all(|s| !lock(s).running)
    }
}

/// On PostgreSQL, a fence retention of 2 s and a cleanup every 200 ms (testing overrides of
/// max(24 h, 2 × ttl) and 60 s), so the cleanups delete free lock rows and race live grants
/// during the run.
fn pg_maintenance(url: &str) -> Vec<(&'static str, &'static str)> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres") {
        return vec![
            (baton::testing::TEST_FENCE_RETENTION_ENV, "2000"),
            (baton::testing::TEST_CLEANUP_EVERY_ENV, "200"),
        ];
    }
    let _ = url;
    Vec::new()
}
