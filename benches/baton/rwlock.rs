//! The read-write lock scenarios, baton's read-write lock (`Client::rw_locks()`, shipped
//! defaults) reported beside baton's mutex (`Client::locks()`) doing the same job with every
//! operation exclusive, on the same private redis-server, runs interleaved (the order rotates
//! every run, round 0 is a warm-up). The mutex is itself measured against its floors in
//! `lock-uncontended` and `lock-contended`.
//!
//! - `rw-uncontended`: one task, acquire→release cycles of a read, of a write, and of the
//!   mutex; ratio = p50 / the mutex's p50.
//! - `rw-mix`: 10 tasks on one lock for a few seconds, 9 looping on reads and 1 on writes, each
//!   operation holding the lock for [`HOLD`] (the work a reader does is what lets readers
//!   share); the mutex side runs the same 10 loops, every one exclusive. Ratio = the mutex's
//!   operations per second over the read-write lock's (below 1: the read-write lock does more).
//!   The writer's count shows it is not starved (writer preference: docs/rwlock.md).
//!
//! Nothing is asserted; every ratio is computed in the same run.

use std::time::{Duration, Instant};

use baton::{Client, LockOptions, Locks, RwLocks};
use serde_json::json;

use crate::harness::Report;
use crate::locks::{bounded, fairness, Cpu, Tally};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

/// Every side takes its lock for this long (never reached: every cycle releases).
const TTL: Duration = Duration::from_secs(10);

/// What each operation of `rw-mix` holds the lock for.
const HOLD: Duration = Duration::from_millis(1);

/// `rw-mix`: readers and writers per run.
const READERS: usize = 9;
const WRITERS: usize = 1;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Read,
    Write,
}

#[derive(Clone)]
enum Side {
    Rw(RwLocks),
    Mutex(Locks),
}

enum Held {
    Read(baton::ReadGuard),
    Write(baton::WriteGuard),
    Mutex(baton::LockGuard),
}

impl Side {
    /// Takes `key` for `op` (the mutex ignores it), waiting; `None` once `deadline` passed.
    async fn acquire(&self, key: &str, op: Op, deadline: Option<Instant>) -> Option<Held> {
        let opts = LockOptions::default();
        bounded(deadline, async {
            match (self, op) {
                (Side::Rw(l), Op::Read) => {
                    Held::Read(l.read(key, TTL, &opts).await.expect("baton read"))
                }
                (Side::Rw(l), Op::Write) => {
                    Held::Write(l.write(key, TTL, &opts).await.expect("baton write"))
                }
                (Side::Mutex(l), _) => {
                    Held::Mutex(l.acquire(key, TTL, &opts).await.expect("baton mutex"))
                }
            }
        })
        .await
    }

    async fn release(h: Held) {
        match h {
            Held::Read(g) => g.release().await.expect("baton read release"),
            Held::Write(g) => g.release().await.expect("baton write release"),
            Held::Mutex(g) => g.release().await.expect("baton mutex release"),
        };
    }
}

/// One task, `per` acquire→release cycles of `op` on `key`.
async fn cycle_round(side: &Side, key: &str, op: Op, per: usize) -> (Samples, Duration) {
    let t0 = Instant::now();
    let mut s = Samples::default();
    for _ in 0..per {
        let c0 = Instant::now();
        let h = side
            .acquire(key, op, None)
            .await
            .expect("unbounded acquire");
        Side::release(h).await;
        s.push(c0.elapsed());
    }
    (s, t0.elapsed())
}

/// `rw-uncontended`: read, write and mutex cycles, one task.
pub async fn uncontended(opts: &Opts, report: &mut Report) {
    let (per, runs): (usize, usize) = if opts.quick { (150, 2) } else { (2000, 5) };
    let server = start_server();
    let client = Client::connect(&server.url())
        .await
        .expect("baton connects");
    let sides: Vec<(&'static str, Side, Op)> = vec![
        ("read", Side::Rw(client.rw_locks()), Op::Read),
        ("write", Side::Rw(client.rw_locks()), Op::Write),
        ("mutex", Side::Mutex(client.locks()), Op::Write),
    ];
    let id = run_id();
    let mut cpu = Cpu::connect(&[server.url()]).await;
    let mut res: Vec<(&'static str, Tally)> =
        sides.iter().map(|(n, ..)| (*n, Tally::default())).collect();
    for round in 0..=runs {
        let n = if round == 0 {
            per.div_ceil(4).max(2)
        } else {
            per
        };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, side, op) = &sides[j];
            let key = format!("ru-{name}-{id}-{round}");
            let c0 = cpu.now().await;
            let (s, wall) = cycle_round(side, &key, *op, n).await;
            let c1 = cpu.now().await;
            if round > 0 {
                let t = &mut res[j].1;
                t.samples.extend(s);
                t.ops += n;
                t.wall += wall;
                t.server_cpu += c1.0 - c0.0;
                t.client_cpu += c1.1 - c0.1;
            }
        }
    }
    let mutex = &res[2].1;
    for (name, t) in &res {
        let (srv, cli) = t.cpu_per_op();
        let vs = t.p50() / mutex.p50();
        report.rows.push(Row {
            scenario: format!("rw-uncontended {name}"),
            p50_us: t.samples.pct(50.0),
            p99_us: t.samples.pct(99.0),
            ops_per_s: Some(t.ops_per_s()),
            floor_ops_per_s: Some(mutex.ops_per_s()),
            ratio: Some(vs),
            samples: t.samples.len(),
            notes: format!(
                "acquire→release, one task; ratio = p50 / the mutex's p50 ({:.0} µs); \
                 CPU/op: server {srv:.1} µs, client {cli:.1} µs; {runs} runs",
                mutex.p50()
            ),
            extra: json!({
                "side": name,
                "mutex_p50_us": mutex.samples.pct(50.0),
                "p50_vs_mutex": vs,
                "server_cpu_us_per_op": srv,
                "client_cpu_us_per_op": cli,
                "runs": runs,
            }),
        });
    }
    client.shutdown(Duration::from_secs(5)).await;
}

/// What one side of `rw-mix` did over the runs.
#[derive(Default)]
struct Mix {
    tally: Tally,
    read_wait: Samples,
    write_wait: Samples,
    reads: u64,
    writes: u64,
}

/// The mix's tasks on `key` for `dur`: (per task: op, waits, count), wall.
async fn mix_round(side: &Side, key: &str, dur: Duration) -> (Vec<(Op, Samples, u64)>, Duration) {
    let t0 = Instant::now();
    let deadline = t0 + dur;
    let ops = (0..READERS + WRITERS).map(|i| if i < READERS { Op::Read } else { Op::Write });
    let handles: Vec<_> = ops
        .map(|op| {
            let (s, k) = (side.clone(), key.to_string());
            tokio::spawn(async move {
                let (mut lat, mut n) = (Samples::default(), 0u64);
                while Instant::now() < deadline {
                    let c0 = Instant::now();
                    let Some(h) = s.acquire(&k, op, Some(deadline)).await else {
                        break;
                    };
                    lat.push(c0.elapsed());
                    n += 1;
                    tokio::time::sleep(HOLD).await;
                    Side::release(h).await;
                }
                (op, lat, n)
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("mix task"));
    }
    (out, t0.elapsed())
}

/// `rw-mix`: 9 readers and 1 writer on one lock, each operation holding it 1 ms, against the
/// mutex doing the same with every operation exclusive.
pub async fn mix(opts: &Opts, report: &mut Report) {
    let (dur, runs) = if opts.quick {
        (Duration::from_millis(300), 2)
    } else {
        (Duration::from_secs(3), 4)
    };
    let server = start_server();
    let client = Client::connect(&server.url())
        .await
        .expect("baton connects");
    let sides: Vec<(&'static str, Side)> = vec![
        ("rwlock", Side::Rw(client.rw_locks())),
        ("mutex", Side::Mutex(client.locks())),
    ];
    let id = run_id();
    let mut cpu = Cpu::connect(&[server.url()]).await;
    let mut res: Vec<(&'static str, Mix)> =
        sides.iter().map(|(n, _)| (*n, Mix::default())).collect();
    for round in 0..=runs {
        let d = if round == 0 { dur / 4 } else { dur };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, side) = &sides[j];
            let key = format!("rm-{name}-{id}-{round}");
            let c0 = cpu.now().await;
            let (tasks, wall) = mix_round(side, &key, d).await;
            let c1 = cpu.now().await;
            if round == 0 {
                continue;
            }
            let m = &mut res[j].1;
            m.tally.server_cpu += c1.0 - c0.0;
            m.tally.client_cpu += c1.1 - c0.1;
            m.tally.wall += wall;
            let first = m.tally.per_task.is_empty();
            for (i, (op, lat, n)) in tasks.into_iter().enumerate() {
                m.tally.ops += n as usize;
                m.tally.samples.extend(match op {
                    Op::Read => {
                        m.reads += n;
                        m.read_wait.extend(lat.clone());
                        lat
                    }
                    Op::Write => {
                        m.writes += n;
                        m.write_wait.extend(lat.clone());
                        lat
                    }
                });
                if first {
                    m.tally.per_task.push(n);
                } else {
                    m.tally.per_task[i] += n;
                }
            }
        }
    }
    let mutex_ops = res[1].1.tally.ops_per_s();
    for (name, m) in &res {
        let t = &m.tally;
        let (srv, cli) = t.cpu_per_op();
        let (jain, min, max) = fairness(&t.per_task);
        let secs = t.wall.as_secs_f64();
        let (rps, wps) = (m.reads as f64 / secs, m.writes as f64 / secs);
        let pct = |s: &Samples| s.pct(50.0).unwrap_or(f64::NAN);
        report.rows.push(Row {
            scenario: format!("rw-mix {name}"),
            p50_us: t.samples.pct(50.0),
            p99_us: t.samples.pct(99.0),
            ops_per_s: Some(t.ops_per_s()),
            floor_ops_per_s: Some(mutex_ops),
            ratio: Some(mutex_ops / t.ops_per_s()),
            samples: t.samples.len(),
            notes: format!(
                "{READERS} readers + {WRITERS} writer on one lock, hold 1 ms; ratio = mutex ops/s / \
                 ops/s; reads {rps:.0}/s (p50 wait {:.0} µs), writes {wps:.0}/s (p50 wait {:.0} µs); \
                 Jain {jain:.2}, per task {min}–{max}; CPU/op: server {srv:.1} µs, client {cli:.1} µs; \
                 {runs} runs",
                pct(&m.read_wait),
                pct(&m.write_wait)
            ),
            extra: json!({
                "side": name,
                "reads_per_s": rps,
                "writes_per_s": wps,
                "read_wait_p50_us": m.read_wait.pct(50.0),
                "read_wait_p99_us": m.read_wait.pct(99.0),
                "write_wait_p50_us": m.write_wait.pct(50.0),
                "write_wait_p99_us": m.write_wait.pct(99.0),
                "ops_vs_mutex": t.ops_per_s() / mutex_ops,
                "jain": jain,
                "server_cpu_us_per_op": srv,
                "client_cpu_us_per_op": cli,
                "runs": runs,
            }),
        });
    }
    client.shutdown(Duration::from_secs(5)).await;
}
