//! The semaphore scenarios: `sem-uncontended` and `sem-contended`, baton's semaphore
//! (`Client::semaphores()`, shipped defaults) against a hand-written **floor** doing the same job
//! with the guarantees a careful user gives it, on the same private redis-server, runs
//! interleaved (the order rotates every run, round 0 is a warm-up):
//!
//! - the floor keeps a semaphore in one sorted set of expiring permits (member = the holder's
//!   random token, score = its expiry in server milliseconds) and takes a permit with one
//!   `EVALSHA` of [`FLOOR_ACQUIRE`]: drop the expired members, refuse when as many are left as
//!   the limit, else add the token with its expiry and return a fencing token from `INCR` on a
//!   counter beside the set. Its release is `ZREM` (1 round trip, no script); under contention
//!   it polls with the lock floor's full-jitter backoff (1 → 16 ms).
//! - baton: `Semaphores::acquire` (one script reading every slot, a slot fence stepped from the
//!   server clock) and `PermitGuard::release` (the mutex's compare-and-delete of the slot key,
//!   which also wakes one waiter per client on the semaphore's channel).
//!
//! What the floor does not give, and baton does: a slot number, a fencing token per slot that
//! keeps growing after a restart that lost the data (the floor's `INCR` restarts at 1), a stored
//! limit checked on every call, waking a waiter on release instead of polling.
//!
//! Nothing is asserted; every ratio is computed against the floor measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::{Client, LockOptions, PermitGuard, Semaphores};
use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::harness::Report;
use crate::locks::{backoff, bounded, fairness, past, token, Cpu, Tally};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

/// Every side takes its permits for this long (never reached: every cycle releases).
const TTL: Duration = Duration::from_secs(10);

/// The contended scenario's limit and tasks.
const LIMIT: u32 = 4;
const TASKS: usize = 64;

/// The floor's acquire, as a careful user writes it. `KEYS` = the permits (sorted set), the
/// fence counter; `ARGV` = token, lease ms, limit. The set expires with its newest permit (all
/// leases are equal here), so it is never kept forever; 0 when every permit is held, else the
/// fencing token.
pub const FLOOR_ACQUIRE: &str = "
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('INCR', KEYS[2])";

/// The floor's backoff, stated in the notes.
const FLOOR_BACKOFF: &str = "floor backoff: full jitter, 1 ms doubling to 16 ms";

/// The floor's connection.
#[derive(Clone)]
pub struct SemFloor {
    conn: MultiplexedConnection,
    sha: Arc<str>,
}

impl SemFloor {
    pub async fn connect(url: &str) -> SemFloor {
        let client = redis::Client::open(url).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("floor connects");
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(FLOOR_ACQUIRE)
            .query_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
        SemFloor {
            conn,
            sha: sha.into(),
        }
    }

    /// One try: the fencing token, or `None` when every permit is held.
    pub async fn try_acquire(&self, key: &str, token: &str, limit: u32) -> Option<u64> {
        let mut c = self.conn.clone();
        let fence: u64 = redis::cmd("EVALSHA")
            .arg(&*self.sha)
            .arg(2)
            .arg(format!("{{{key}}}:permits"))
            .arg(format!("{{{key}}}:fence"))
            .arg(token)
            .arg(TTL.as_millis() as u64)
            .arg(limit)
            .query_async(&mut c)
            .await
            .expect("floor EVALSHA");
        (fence > 0).then_some(fence)
    }

    /// Gives the permit back: `ZREM`.
    pub async fn release(&self, key: &str, token: &str) -> bool {
        let mut c = self.conn.clone();
        let n: i64 = redis::cmd("ZREM")
            .arg(format!("{{{key}}}:permits"))
            .arg(token)
            .query_async(&mut c)
            .await
            .expect("floor ZREM");
        n == 1
    }
}

#[derive(Clone)]
enum Sem {
    Baton(Semaphores),
    Floor(SemFloor),
}

// Not boxed: a box would add an allocation per cycle to baton's side only.
#[allow(clippy::large_enum_variant)]
enum Permit {
    Baton(PermitGuard),
    Floor(String),
}

impl Sem {
    /// Takes a permit of `key` (of `limit`), waiting while all are held; `None` once `deadline`
    /// passed.
    async fn acquire(&self, key: &str, limit: u32, deadline: Option<Instant>) -> Option<Permit> {
        match self {
            Sem::Baton(s) => bounded(deadline, async {
                s.acquire(key, limit, TTL, &LockOptions::default())
                    .await
                    .expect("baton semaphore acquire")
            })
            .await
            .map(Permit::Baton),
            Sem::Floor(f) => {
                let mut n = 0;
                loop {
                    let t = token();
                    if f.try_acquire(key, &t, limit).await.is_some() {
                        return Some(Permit::Floor(t));
                    }
                    if past(deadline) {
                        return None;
                    }
                    backoff(&mut n).await;
                }
            }
        }
    }

    async fn release(&self, key: &str, p: Permit) {
        match (self, p) {
            (_, Permit::Baton(g)) => {
                g.release().await.expect("baton permit release");
            }
            (Sem::Floor(f), Permit::Floor(t)) => {
                f.release(key, &t).await;
            }
            (Sem::Baton(_), Permit::Floor(_)) => unreachable!("a permit goes back to its side"),
        }
    }
}

type Sides = Vec<(&'static str, Sem)>;

async fn sides(url: &str) -> (Sides, Client) {
    let client = Client::connect(url).await.expect("baton connects");
    let sides = vec![
        ("baton", Sem::Baton(client.semaphores())),
        ("floor", Sem::Floor(SemFloor::connect(url).await)),
    ];
    (sides, client)
}

fn side<'a>(res: &'a [(&'static str, Tally)], name: &str) -> &'a Tally {
    &res.iter().find(|(n, _)| *n == name).expect("side").1
}

/// One row per side; `ratio` is the side's cost over the floor's: p50 / the floor's p50 when
/// `latency`, else `floor ops/s / ops/s`.
fn rows(
    scenario: &str,
    res: &[(&'static str, Tally)],
    latency: bool,
    what: &str,
    runs: usize,
) -> Vec<Row> {
    let floor = side(res, "floor");
    res.iter()
        .map(|(name, t)| {
            let ratio = if latency {
                t.p50() / floor.p50()
            } else {
                floor.ops_per_s() / t.ops_per_s()
            };
            let tput = t.ops_per_s() / floor.ops_per_s();
            let (srv, cli) = t.cpu_per_op();
            let mut notes = format!(
                "{what}; p50 {:.2} × floor, ops/s {tput:.2} × floor; CPU/op: server {srv:.1} µs, client {cli:.1} µs",
                t.p50() / floor.p50()
            );
            if !latency && *name == "floor" {
                notes.push_str("; ");
                notes.push_str(FLOOR_BACKOFF);
            }
            notes.push_str(&format!("; {runs} runs"));
            let mut extra = json!({
                "side": name,
                "floor_p50_us": floor.samples.pct(50.0),
                "ops_vs_floor": tput,
                "p50_vs_floor": t.p50() / floor.p50(),
                "server_cpu_us_per_op": srv,
                "client_cpu_us_per_op": cli,
                "runs": runs,
            });
            if !t.per_task.is_empty() {
                let (f, min, max) = fairness(&t.per_task);
                extra["jain"] = json!(f);
                extra["min_per_task"] = json!(min);
                extra["max_per_task"] = json!(max);
                notes = format!("Jain {f:.2}, per task {min}–{max}; {notes}");
            }
            Row {
                scenario: format!("{scenario} {name}"),
                p50_us: t.samples.pct(50.0),
                p99_us: t.samples.pct(99.0),
                ops_per_s: Some(t.ops_per_s()),
                floor_ops_per_s: Some(floor.ops_per_s()),
                ratio: Some(ratio),
                samples: t.samples.len(),
                notes,
                extra,
            }
        })
        .collect()
}

/// One task, `per` acquire→release cycles on one semaphore of `limit`.
async fn cycle_round(sem: &Sem, key: &str, limit: u32, per: usize) -> (Samples, Duration) {
    let t0 = Instant::now();
    let mut s = Samples::default();
    for _ in 0..per {
        let c0 = Instant::now();
        let p = sem
            .acquire(key, limit, None)
            .await
            .expect("unbounded acquire");
        sem.release(key, p).await;
        s.push(c0.elapsed());
    }
    (s, t0.elapsed())
}

/// `tasks` loops on one semaphore of `limit` for `dur`: (acquire latencies, acquisitions per
/// task, wall).
async fn contended_round(
    sem: &Sem,
    tasks: usize,
    limit: u32,
    dur: Duration,
    key: &str,
) -> (Samples, Vec<u64>, Duration) {
    let t0 = Instant::now();
    let deadline = t0 + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (s, k) = (sem.clone(), key.to_string());
            tokio::spawn(async move {
                let (mut lat, mut n) = (Samples::default(), 0u64);
                while Instant::now() < deadline {
                    let c0 = Instant::now();
                    let Some(p) = s.acquire(&k, limit, Some(deadline)).await else {
                        break;
                    };
                    lat.push(c0.elapsed());
                    n += 1;
                    s.release(&k, p).await;
                }
                (lat, n)
            })
        })
        .collect();
    let (mut all, mut counts) = (Samples::default(), Vec::with_capacity(tasks));
    for h in handles {
        let (s, n) = h.await.expect("contended task");
        all.extend(s);
        counts.push(n);
    }
    (all, counts, t0.elapsed())
}

/// `sem-uncontended`: one task, acquire→release of a permit of a semaphore of 4 (nobody else).
pub async fn uncontended(opts: &Opts, report: &mut Report) {
    let (per, runs): (usize, usize) = if opts.quick { (150, 2) } else { (2000, 5) };
    let server = start_server();
    let (sides, client) = sides(&server.url()).await;
    let id = run_id();
    let mut cpu = Cpu::connect(&[server.url()]).await;
    let mut res: Vec<(&'static str, Tally)> =
        sides.iter().map(|(n, _)| (*n, Tally::default())).collect();
    for round in 0..=runs {
        let n = if round == 0 {
            per.div_ceil(4).max(2)
        } else {
            per
        };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, sem) = &sides[j];
            let key = format!("su-{name}-{id}-{round}");
            let c0 = cpu.now().await;
            let (s, wall) = cycle_round(sem, &key, LIMIT, n).await;
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
    report.rows.extend(rows(
        "sem-uncontended",
        &res,
        true,
        "acquire→release of a permit (limit 4), one task; ratio = p50 / floor p50 (target baton ≤ 1.1)",
        runs,
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

/// `sem-contended`: 64 tasks on one semaphore of 4, hold 0.
pub async fn contended(opts: &Opts, report: &mut Report) {
    let (dur, runs) = if opts.quick {
        (Duration::from_millis(300), 2)
    } else {
        (Duration::from_secs(3), 4)
    };
    let server = start_server();
    let (sides, client) = sides(&server.url()).await;
    let id = run_id();
    let mut cpu = Cpu::connect(&[server.url()]).await;
    let mut res: Vec<(&'static str, Tally)> =
        sides.iter().map(|(n, _)| (*n, Tally::default())).collect();
    for round in 0..=runs {
        let d = if round == 0 { dur / 4 } else { dur };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, sem) = &sides[j];
            let key = format!("sc-{name}-{id}-{round}");
            let c0 = cpu.now().await;
            let (s, counts, wall) = contended_round(sem, TASKS, LIMIT, d, &key).await;
            let c1 = cpu.now().await;
            if round > 0 {
                let t = &mut res[j].1;
                t.server_cpu += c1.0 - c0.0;
                t.client_cpu += c1.1 - c0.1;
                t.samples.extend(s);
                t.ops += counts.iter().sum::<u64>() as usize;
                t.wall += wall;
                if t.per_task.is_empty() {
                    t.per_task = counts;
                } else {
                    for (a, b) in t.per_task.iter_mut().zip(counts) {
                        *a += b;
                    }
                }
            }
        }
    }
    report.rows.extend(rows(
        "sem-contended",
        &res,
        false,
        "64 tasks on one semaphore of 4, hold 0: ops/s = grants/s, p50 = wait for a permit \
         (targets baton ops/s ≥ 0.9 × floor, Jain ≥ 0.95)",
        runs,
    ));
    client.shutdown(Duration::from_secs(5)).await;
}
