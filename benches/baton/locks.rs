//! The lock scenarios: `lock-uncontended`, `lock-distinct`, `lock-contended` (baton's mutex,
//! `Client::locks()`) and `redlock` (`Redlock::new` over 3 private masters), each measuring
//! three sides against the same private redis-server(s), runs interleaved (the order rotates
//! every run, round 0 is a warm-up):
//!
//! - **baton**, with its shipped defaults (`AcquireOptions::default()`,
//!   `RedlockOptions::default()`);
//! - the **floor**, hand-written: `SET key token NX PX ttl` to acquire, an `EVALSHA`
//!   compare-and-delete to release (2 round trips per cycle), on one
//!   `redis::aio::MultiplexedConnection` per server, a plain loop with a full-jitter exponential
//!   backoff (1 → 16 ms) under contention; for Redlock the same on the 3 masters at once
//!   (`tokio::join!`), a quorum of 2, released on all 3 when short of it;
//! - the **fenced floor** (single server only), hand-written too, for the same job as baton's
//!   mutex: a lock with a fencing token that only grows, past a restart that lost the data
//!   (`max(old + 1, server time in µs)`, DESIGN.md §3). Its acquire is one `EVALSHA` of
//!   [`FENCED_ACQUIRE`] (`SET NX PX`, then the fence), its release the floor's compare-and-delete;
//!   the same loop and backoff as the floor;
//! - the **`rslock`** crate (0.10, `LockManager` over the same URL(s)) with its default retry
//!   settings (see [`RSLOCK_RETRY`]).
//!
//! Nothing is asserted; every ratio is computed against the floor measured in the same run.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::{AcquireOptions, Client, LockGuard, Locks, Redlock, RedlockGuard, RedlockOptions};
use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::harness::Report;
use crate::redisinfo;
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

/// Every side takes its locks for this long (never reached: every cycle releases).
const TTL: Duration = Duration::from_secs(10);

/// The floor's release: compare-and-delete.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) else return 0 end";

/// The fenced floor's acquire, as a careful user writes it: the lock, then the fence stepped to
/// `max(old + 1, server time in µs)` with a day's retention; 0 when the lock is held, else the
/// fencing token.
const FENCED_ACQUIRE: &str = "
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local old = tonumber(redis.call('GET', KEYS[2])) or 0
local f = string.format('%.0f', math.max(old + 1, now))
redis.call('SET', KEYS[2], f, 'PX', ARGV[3])
return f";

/// rslock's retry settings as this benchmark uses them (its defaults, untouched).
pub const RSLOCK_RETRY: &str = "rslock defaults: lock() = 3 tries, a random 0–200 ms sleep \
                                between tries; acquire() = lock() in a loop";

/// The floor's backoff, stated in the notes.
const FLOOR_BACKOFF: &str = "floor backoff: full jitter, 1 ms doubling to 16 ms";

pub(crate) fn rand_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// A random 128-bit token in hex, as long as baton's.
pub(crate) fn token() -> String {
    format!("{:016x}{:016x}", rand_u64(), rand_u64())
}

pub(crate) async fn backoff(n: &mut u32) {
    let cap_us = 1000u64 << (*n).min(4);
    *n += 1;
    tokio::time::sleep(Duration::from_micros(rand_u64() % cap_us + 1)).await;
}

pub(crate) fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

pub(crate) async fn bounded<T>(deadline: Option<Instant>, f: impl Future<Output = T>) -> Option<T> {
    match deadline {
        None => Some(f.await),
        Some(d) => tokio::time::timeout_at(d.into(), f).await.ok(),
    }
}

/// The floor's connection to one server.
#[derive(Clone)]
struct FloorConn {
    conn: MultiplexedConnection,
    sha: Arc<str>,
    fenced_sha: Arc<str>,
}

impl FloorConn {
    async fn connect(url: &str) -> FloorConn {
        let client = redis::Client::open(url).expect("url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("floor connects");
        let load = |body: &'static str| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(body)
                    .query_async::<String>(&mut conn)
                    .await
                    .expect("SCRIPT LOAD")
            }
        };
        let sha = load(RELEASE).await;
        let fenced_sha = load(FENCED_ACQUIRE).await;
        FloorConn {
            conn,
            sha: sha.into(),
            fenced_sha: fenced_sha.into(),
        }
    }

    /// The fenced floor's acquire: the fencing token, or `None` when held.
    async fn try_set_fenced(&self, key: &str, token: &str) -> Option<u64> {
        let mut c = self.conn.clone();
        let r: redis::Value = redis::cmd("EVALSHA")
            .arg(&*self.fenced_sha)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:fence"))
            .arg(token)
            .arg(TTL.as_millis() as u64)
            .arg(86_400_000u64)
            .query_async(&mut c)
            .await
            .expect("fenced floor EVALSHA");
        match r {
            redis::Value::Int(0) => None,
            v => Some(
                redis::from_redis_value::<String>(v)
                    .expect("a fencing token")
                    .parse()
                    .expect("a number"),
            ),
        }
    }

    async fn try_set(&self, key: &str, token: &str) -> bool {
        let mut c = self.conn.clone();
        let r: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut c)
            .await
            .expect("floor SET NX PX");
        r.is_some()
    }

    async fn del(&self, key: &str, token: &str) -> bool {
        let mut c = self.conn.clone();
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&*self.sha)
            .arg(1)
            .arg(key)
            .arg(token)
            .query_async(&mut c)
            .await
            .expect("floor EVALSHA");
        n == 1
    }
}

#[derive(Clone)]
enum Locker {
    Baton(Locks),
    Floor(FloorConn),
    FencedFloor(FloorConn),
    Rslock(rslock::LockManager),
    BatonRedlock(Redlock),
    FloorRedlock(Arc<[FloorConn; 3]>),
}

enum Held {
    Baton(LockGuard),
    Floor(String),
    Rslock(rslock::Lock),
    BatonRedlock(RedlockGuard),
    FloorRedlock(String),
}

impl Locker {
    /// Takes `key`, waiting while it is held; `None` once `deadline` passed.
    async fn acquire(&self, key: &str, deadline: Option<Instant>) -> Option<Held> {
        match self {
            Locker::Baton(l) => bounded(deadline, async {
                l.acquire(key, TTL, &AcquireOptions::default())
                    .await
                    .expect("baton acquire")
            })
            .await
            .map(Held::Baton),
            Locker::BatonRedlock(r) => bounded(deadline, async {
                r.acquire(key, TTL, &RedlockOptions::default())
                    .await
                    .expect("baton redlock acquire")
            })
            .await
            .map(Held::BatonRedlock),
            // rslock's own `acquire()` is this loop without the deadline.
            Locker::Rslock(m) => loop {
                match m.lock(key, TTL).await {
                    Ok(l) => return Some(Held::Rslock(l)),
                    Err(rslock::LockError::Unavailable) if past(deadline) => return None,
                    Err(rslock::LockError::Unavailable) => {}
                    Err(e) => panic!("rslock lock: {e}"),
                }
            },
            Locker::Floor(f) => {
                let mut n = 0;
                loop {
                    let t = token();
                    if f.try_set(key, &t).await {
                        return Some(Held::Floor(t));
                    }
                    if past(deadline) {
                        return None;
                    }
                    backoff(&mut n).await;
                }
            }
            Locker::FencedFloor(f) => {
                let mut n = 0;
                loop {
                    let t = token();
                    if f.try_set_fenced(key, &t).await.is_some() {
                        return Some(Held::Floor(t));
                    }
                    if past(deadline) {
                        return None;
                    }
                    backoff(&mut n).await;
                }
            }
            Locker::FloorRedlock(fs) => {
                let mut n = 0;
                loop {
                    let t = token();
                    let start = Instant::now();
                    let (a, b, c) = tokio::join!(
                        fs[0].try_set(key, &t),
                        fs[1].try_set(key, &t),
                        fs[2].try_set(key, &t)
                    );
                    let votes = usize::from(a) + usize::from(b) + usize::from(c);
                    // Validity: the ttl minus the round and a 1 % drift allowance.
                    if votes >= 2 && start.elapsed() < TTL.mul_f64(0.99) {
                        return Some(Held::FloorRedlock(t));
                    }
                    tokio::join!(fs[0].del(key, &t), fs[1].del(key, &t), fs[2].del(key, &t));
                    if past(deadline) {
                        return None;
                    }
                    backoff(&mut n).await;
                }
            }
        }
    }

    async fn release(&self, key: &str, held: Held) {
        match (self, held) {
            (_, Held::Baton(g)) => {
                g.release().await.expect("baton release");
            }
            (_, Held::BatonRedlock(g)) => {
                g.release().await.expect("baton redlock release");
            }
            (_, Held::Rslock(l)) => l.release().await,
            (Locker::Floor(f) | Locker::FencedFloor(f), Held::Floor(t)) => {
                f.del(key, &t).await;
            }
            (Locker::FloorRedlock(fs), Held::FloorRedlock(t)) => {
                tokio::join!(fs[0].del(key, &t), fs[1].del(key, &t), fs[2].del(key, &t));
            }
            _ => unreachable!("a guard goes back to its own side"),
        }
    }
}

/// One side's results over the measured runs.
#[derive(Default)]
pub(crate) struct Tally {
    /// Per cycle (acquire→release), or per acquisition under contention, in µs.
    pub(crate) samples: Samples,
    pub(crate) ops: usize,
    pub(crate) wall: Duration,
    /// Acquisitions per task (contended only), summed over the runs.
    pub(crate) per_task: Vec<u64>,
    /// CPU seconds spent meanwhile by the server(s) and by this process (the side measured).
    pub(crate) server_cpu: f64,
    pub(crate) client_cpu: f64,
}

impl Tally {
    pub(crate) fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64()
    }
    pub(crate) fn p50(&self) -> f64 {
        self.samples.pct(50.0).unwrap_or(f64::NAN)
    }
    /// CPU µs per operation: (server, client).
    pub(crate) fn cpu_per_op(&self) -> (f64, f64) {
        let per = |s: f64| s * 1e6 / self.ops.max(1) as f64;
        (per(self.server_cpu), per(self.client_cpu))
    }
}

/// CPU seconds so far: the servers' (`INFO cpu`, user + sys, summed) and this process's.
pub(crate) struct Cpu(Vec<MultiplexedConnection>);

impl Cpu {
    pub(crate) async fn connect(urls: &[String]) -> Cpu {
        let mut conns = Vec::new();
        for u in urls {
            let c = redis::Client::open(u.as_str()).expect("url");
            conns.push(c.get_multiplexed_async_connection().await.expect("admin"));
        }
        Cpu(conns)
    }

    pub(crate) async fn now(&mut self) -> (f64, f64) {
        let mut server = 0.0;
        for c in &mut self.0 {
            server += redisinfo::field(c, "cpu", "used_cpu_user").await
                + redisinfo::field(c, "cpu", "used_cpu_sys").await;
        }
        let p = crate::profile::proc_now();
        (server, p.user + p.sys)
    }
}

/// `tasks` closed loops of `per` acquire→release cycles, task `i` on `key(i)`.
async fn cycle_round(
    locker: &Locker,
    tasks: usize,
    per: usize,
    key: impl Fn(usize) -> String,
) -> (Samples, usize, Duration) {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (l, k) = (locker.clone(), key(i));
            tokio::spawn(async move {
                let mut s = Samples::default();
                for _ in 0..per {
                    let c0 = Instant::now();
                    let h = l.acquire(&k, None).await.expect("unbounded acquire");
                    l.release(&k, h).await;
                    s.push(c0.elapsed());
                }
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for h in handles {
        all.extend(h.await.expect("cycle task"));
    }
    (all, tasks * per, t0.elapsed())
}

/// `tasks` loops on one key for `dur`: (acquire latencies, acquisitions per task, wall).
async fn contended_round(
    locker: &Locker,
    tasks: usize,
    dur: Duration,
    key: &str,
) -> (Samples, Vec<u64>, Duration) {
    let t0 = Instant::now();
    let deadline = t0 + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (l, k) = (locker.clone(), key.to_string());
            tokio::spawn(async move {
                let (mut s, mut n) = (Samples::default(), 0u64);
                while Instant::now() < deadline {
                    let c0 = Instant::now();
                    let Some(h) = l.acquire(&k, Some(deadline)).await else {
                        break;
                    };
                    s.push(c0.elapsed());
                    n += 1;
                    l.release(&k, h).await;
                }
                (s, n)
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

/// The sides of one scenario, by name: `baton`, `floor`, `fenced-floor` (single server),
/// `rslock`.
type Sides = Vec<(&'static str, Locker)>;

async fn single_sides(url: &str) -> (Sides, Client) {
    let client = Client::connect(url).await.expect("baton connects");
    let sides = vec![
        ("baton", Locker::Baton(client.locks())),
        ("floor", Locker::Floor(FloorConn::connect(url).await)),
        (
            "fenced-floor",
            Locker::FencedFloor(FloorConn::connect(url).await),
        ),
        (
            "rslock",
            Locker::Rslock(rslock::LockManager::new(vec![url.to_string()])),
        ),
    ];
    (sides, client)
}

async fn redlock_sides(urls: &[String]) -> (Sides, Vec<Client>) {
    let mut clients = Vec::new();
    let mut floors = Vec::new();
    for u in urls {
        clients.push(Client::connect(u).await.expect("baton connects"));
        floors.push(FloorConn::connect(u).await);
    }
    let floors: [FloorConn; 3] = floors.try_into().ok().expect("3 masters");
    let sides = vec![
        (
            "baton",
            Locker::BatonRedlock(Redlock::new(&clients).expect("redlock over 3 masters")),
        ),
        ("floor", Locker::FloorRedlock(Arc::new(floors))),
        (
            "rslock",
            Locker::Rslock(rslock::LockManager::new(urls.to_vec())),
        ),
    ];
    (sides, clients)
}

/// Cycles on every side, interleaved: round 0 warms up, the order rotates every round.
async fn cycles(
    sides: &Sides,
    urls: &[String],
    tag: &str,
    tasks: usize,
    per: usize,
    runs: usize,
) -> Vec<(&'static str, Tally)> {
    let id = run_id();
    let mut cpu = Cpu::connect(urls).await;
    let mut out: Vec<(&'static str, Tally)> =
        sides.iter().map(|(n, _)| (*n, Tally::default())).collect();
    for round in 0..=runs {
        let n = if round == 0 {
            per.div_ceil(4).max(2)
        } else {
            per
        };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, locker) = &sides[j];
            let c0 = cpu.now().await;
            let (s, ops, wall) = cycle_round(locker, tasks, n, |i| {
                format!("{tag}-{name}-{id}-{round}-{i}")
            })
            .await;
            let c1 = cpu.now().await;
            if round > 0 {
                let t = &mut out[j].1;
                t.samples.extend(s);
                t.ops += ops;
                t.wall += wall;
                t.server_cpu += c1.0 - c0.0;
                t.client_cpu += c1.1 - c0.1;
            }
        }
    }
    out
}

fn side<'a>(res: &'a [(&'static str, Tally)], name: &str) -> &'a Tally {
    &res.iter().find(|(n, _)| *n == name).expect("side").1
}

/// One row per side; `ratio` is the side's cost over the floor's: p50 / the floor's p50 when
/// `latency`, else wall time per operation (`floor ops/s / ops/s`).
fn rows(
    scenario: &str,
    res: &[(&'static str, Tally)],
    latency: bool,
    what: &str,
    runs: usize,
    extra_note: &str,
) -> Vec<Row> {
    let floor = side(res, "floor");
    let fenced = res
        .iter()
        .find(|(n, _)| *n == "fenced-floor")
        .map(|(_, t)| t);
    let rs = side(res, "rslock");
    res.iter()
        .map(|(name, t)| {
            let ratio = if latency {
                t.p50() / floor.p50()
            } else {
                floor.ops_per_s() / t.ops_per_s()
            };
            let tput = t.ops_per_s() / floor.ops_per_s();
            let vs_rslock = t.ops_per_s() / rs.ops_per_s();
            let p50_vs_rslock = t.p50() / rs.p50();
            let (srv, cli) = t.cpu_per_op();
            let mut notes = format!(
                "{what}; p50 {:.2} × floor, ops/s {tput:.2} × floor; CPU/op: server {srv:.1} µs, client {cli:.1} µs",
                t.p50() / floor.p50()
            );
            if *name == "baton" {
                notes.push_str(&format!(
                    "; vs rslock: ops/s {vs_rslock:.2} ×, p50 {p50_vs_rslock:.2} ×"
                ));
                if let Some(f) = fenced {
                    notes.push_str(&format!(
                        "; vs fenced floor: ops/s {:.2} ×, p50 {:.2} ×",
                        t.ops_per_s() / f.ops_per_s(),
                        t.p50() / f.p50()
                    ));
                }
            }
            if !extra_note.is_empty() && *name != "baton" {
                notes.push_str("; ");
                notes.push_str(if *name == "rslock" {
                    RSLOCK_RETRY
                } else {
                    extra_note
                });
            }
            notes.push_str(&format!("; {runs} runs"));
            let mut extra = json!({
                "side": name,
                "floor_p50_us": floor.samples.pct(50.0),
                "ops_vs_floor": tput,
                "p50_vs_floor": t.p50() / floor.p50(),
                "ops_vs_rslock": vs_rslock,
                "p50_vs_rslock": p50_vs_rslock,
                "server_cpu_us_per_op": srv,
                "client_cpu_us_per_op": cli,
                "runs": runs,
            });
            if *name == "rslock" {
                extra["rslock_retry"] = json!(RSLOCK_RETRY);
            }
            if let Some(f) = fenced {
                extra["ops_vs_fenced_floor"] = json!(t.ops_per_s() / f.ops_per_s());
                extra["p50_vs_fenced_floor"] = json!(t.p50() / f.p50());
            }
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

/// Jain's fairness index (1 = every task got as many; 1/n = one task got all), min, max.
pub(crate) fn fairness(counts: &[u64]) -> (f64, u64, u64) {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    let jain = if sq > 0.0 {
        sum * sum / (counts.len() as f64 * sq)
    } else {
        0.0
    };
    let min = counts.iter().copied().min().unwrap_or(0);
    let max = counts.iter().copied().max().unwrap_or(0);
    (jain, min, max)
}

pub async fn uncontended(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (150, 2) } else { (2000, 5) };
    let server = start_server();
    let (sides, client) = single_sides(&server.url()).await;
    let res = cycles(&sides, &[server.url()], "lu", 1, per, runs).await;
    report.rows.extend(rows(
        "lock-uncontended",
        &res,
        true,
        "acquire→release on one key, one task; ratio = p50 / floor p50 (target baton ≤ 1.05)",
        runs,
        "",
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

pub async fn distinct(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (4, 2) } else { (60, 4) };
    let server = start_server();
    let (sides, client) = single_sides(&server.url()).await;
    let res = cycles(&sides, &[server.url()], "ld", 64, per, runs).await;
    report.rows.extend(rows(
        "lock-distinct",
        &res,
        false,
        "64 tasks × 64 keys, one client; targets baton ops/s ≥ 0.95 × floor, ≥ 1.3 × rslock",
        runs,
        "",
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

pub async fn contended(opts: &Opts, report: &mut Report) {
    let (dur, runs) = if opts.quick {
        (Duration::from_millis(300), 2)
    } else {
        (Duration::from_secs(3), 4)
    };
    let server = start_server();
    let (sides, client) = single_sides(&server.url()).await;
    let id = run_id();
    let mut cpu = Cpu::connect(&[server.url()]).await;
    let mut res: Vec<(&'static str, Tally)> =
        sides.iter().map(|(n, _)| (*n, Tally::default())).collect();
    for round in 0..=runs {
        let d = if round == 0 { dur / 4 } else { dur };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let (name, locker) = &sides[j];
            let key = format!("lc-{name}-{id}-{round}");
            let c0 = cpu.now().await;
            let (s, counts, wall) = contended_round(locker, 64, d, &key).await;
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
        "lock-contended",
        &res,
        false,
        "64 tasks on one key, hold 0: ops/s = handoffs/s, p50 = wait for the lock",
        runs,
        FLOOR_BACKOFF,
    ));
    client.shutdown(Duration::from_secs(5)).await;
}

pub async fn redlock(opts: &Opts, report: &mut Report) {
    let (per1, per64, runs) = if opts.quick {
        (100, 3, 2)
    } else {
        (1000, 20, 4)
    };
    let servers = [start_server(), start_server(), start_server()];
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let (sides, clients) = redlock_sides(&urls).await;
    let res = cycles(&sides, &urls, "ru", 1, per1, runs).await;
    report.rows.extend(rows(
        "redlock-uncontended",
        &res,
        true,
        "3 masters, acquire→release on one key, one task; ratio = p50 / floor p50",
        runs,
        "",
    ));
    let res = cycles(&sides, &urls, "rd", 64, per64, runs).await;
    report.rows.extend(rows(
        "redlock-distinct",
        &res,
        false,
        "3 masters, 64 tasks × 64 keys, one client per master",
        runs,
        "",
    ));
    for c in clients {
        c.shutdown(Duration::from_secs(5)).await;
    }
}
