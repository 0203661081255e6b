//! `--scenario profile` (not part of the full run): where the time of scenario 2's 64 jobs × 1
//! worker goes, for baton and both floors, from outside the library.
//!
//! Per side, over repeated closed-loop rounds (64 tasks × 40 jobs): jobs/s, this process's CPU
//! per job (user, system; `/proc/self/stat`), its context switches per job (all threads,
//! `/proc/self/task/*/status`), the server's CPU per job (`INFO cpu`), its reads per job (one
//! per pipeline on loopback: round trips), commands per job (`INFO commandstats`) and
//! connections opened (`total_connections_received`), tokio's worker parks and busy time per
//! job (`RuntimeMetrics`), and allocations per job (a counting
//! global allocator, on only in this scenario). Then one short round per side under
//! `MONITOR`: per dedicated connection (one that sends `WATCH`), how long a transition holds it
//! on the server (`WATCH` → `EXEC`/`UNWATCH`, which spans one client round trip) and how long it
//! then sits unused until its next `WATCH` (reply, client work, pool hand-off, next request).
//! `MONITOR` slows the server: those times compare the sides, they are not the real ones.
//!
//! `--side baton|direct|pooled|baton-pool64` (repeatable) runs only those sides (`baton-pool64`,
//! an experiment: baton with `pool_size(64)`, runs only when named); `--monitor` adds the
//! `MONITOR` round to named sides (without `--side` it always runs); `--secs N` sets each side's
//! measured time (default 10, 2 with `--quick`). For a profiler, name one side and attach it to
//! the process (`perf record -g -- target/release/deps/baton-* --scenario profile --side baton`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::alloc_count;
use crate::floor::{self, Floor};
use crate::harness::{
    admin, baton_job, cfg, closed_loop, commands, connect, floor_job, floor_job_run, own, Report,
    POOL,
};
use crate::redisinfo::{self, CommandStats, Monitor};
use crate::stats::Samples;
use crate::{run_id, start_server, Opts};

const CONC: usize = 64;
const PER: usize = 40;
pub const SIDES: &[&str] = &["baton", "direct", "pooled"];
/// Sides run only when asked for with `--side`: experiments, not figures of the benchmark
/// (which runs baton with its defaults). `baton-pool64`: baton with `pool_size(64)`.
pub const EXTRA_SIDES: &[&str] = &["baton-pool64"];

/// This process: CPU seconds (user, system) and context switches (voluntary, involuntary).
#[derive(Clone, Copy, Default)]
pub(crate) struct Proc {
    pub user: f64,
    pub sys: f64,
    vol: u64,
    invol: u64,
}

pub(crate) fn proc_now() -> Proc {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 100.0 // USER_HZ
    };
    let (mut vol, mut invol) = (0, 0);
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            for l in status.lines() {
                let n = |p: &str| l.strip_prefix(p).and_then(|v| v.trim().parse::<u64>().ok());
                if let Some(v) = n("voluntary_ctxt_switches:") {
                    vol += v;
                } else if let Some(v) = n("nonvoluntary_ctxt_switches:") {
                    invol += v;
                }
            }
        }
    }
    Proc {
        user: ticks(11),
        sys: ticks(12),
        vol,
        invol,
    }
}

/// tokio's worker threads: times parked (went idle), busy seconds.
fn runtime_now() -> (u64, f64) {
    let m = tokio::runtime::Handle::current().metrics();
    (0..m.num_workers()).fold((0, 0.0), |(p, b), w| {
        (
            p + m.worker_park_count(w),
            b + m.worker_total_busy_duration(w).as_secs_f64(),
        )
    })
}

/// The server: commands, connections opened, reads (round trips), CPU seconds.
struct Server {
    cmds: CommandStats,
    conns: f64,
    reads: f64,
    cpu: f64,
}

async fn server_now(adm: &mut MultiplexedConnection) -> Server {
    let cmds = redisinfo::commandstats(adm).await;
    let conns = redisinfo::field(adm, "stats", "total_connections_received").await;
    let reads = redisinfo::field(adm, "stats", "total_reads_processed").await;
    let cpu = redisinfo::field(adm, "cpu", "used_cpu_user").await
        + redisinfo::field(adm, "cpu", "used_cpu_sys").await;
    Server {
        cmds,
        conns,
        reads,
        cpu,
    }
}

#[derive(Default)]
struct Acc {
    jobs: usize,
    wall: f64,
    samples: Samples,
    cpu_user: f64,
    cpu_sys: f64,
    vol: u64,
    invol: u64,
    allocs: u64,
    reallocs: u64,
    alloc_bytes: u64,
    parks: u64,
    busy: f64,
    srv_cpu: f64,
    reads: f64,
    conns: f64,
    cmds: CommandStats,
}

impl Acc {
    fn to_json(&self) -> Value {
        let j = self.jobs as f64;
        let per = |x: f64| (x / j * 100.0).round() / 100.0;
        let us = |x: f64| (x / j * 1e6 * 10.0).round() / 10.0;
        json!({
            "jobs": self.jobs,
            "wall_s": (self.wall * 100.0).round() / 100.0,
            "jobs_per_s": (j / self.wall).round(),
            "p50_us": self.samples.pct(50.0).map(f64::round),
            "p99_us": self.samples.pct(99.0).map(f64::round),
            "client_cpu_us_per_job": us(self.cpu_user + self.cpu_sys),
            "client_user_us_per_job": us(self.cpu_user),
            "client_sys_us_per_job": us(self.cpu_sys),
            "client_cpu_cores": ((self.cpu_user + self.cpu_sys) / self.wall * 100.0).round() / 100.0,
            "worker_parks_per_job": per(self.parks as f64),
            "worker_busy_us_per_job": us(self.busy),
            "allocations_per_job": per(self.allocs as f64),
            "reallocations_per_job": per(self.reallocs as f64),
            "allocated_bytes_per_job": per(self.alloc_bytes as f64).round(),
            "server_cpu_us_per_job": us(self.srv_cpu),
            "server_cpu_cores": (self.srv_cpu / self.wall * 100.0).round() / 100.0,
            "voluntary_switches_per_job": per(self.vol as f64),
            "involuntary_switches_per_job": per(self.invol as f64),
            "server_reads_per_job": per(self.reads),
            "commands_per_job": per(commands(&self.cmds) as f64),
            "commands_per_job_by_command": self.cmds.iter().filter(|(k, _)| !own(k))
                .map(|(k, v)| (k.clone(), json!(per(*v as f64))))
                .collect::<serde_json::Map<_, _>>(),
            "connections_opened": self.conns,
        })
    }
}

struct Sides {
    client: baton::Client,
    /// `baton-pool64` only.
    client64: Option<baton::Client>,
    pooled: Arc<Floor>,
    direct: Arc<floor::Direct>,
    conns: Arc<Vec<MultiplexedConnection>>,
    id: String,
}

/// One closed-loop round of `side`: samples and wall time.
async fn round(s: &Sides, side: &str, tag: &str, per: usize) -> (Samples, Duration) {
    let lease = Duration::from_secs(10);
    let name = format!("p-{side}-{}-{tag}", s.id);
    match side {
        "baton" | "baton-pool64" => {
            let c = if side == "baton" {
                s.client.clone()
            } else {
                s.client64.clone().expect("the pool-64 client")
            };
            closed_loop(CONC, per, move |i| {
                baton_job(c.clone(), cfg(&format!("{name}-{i}"), lease), 1)
            })
            .await
        }
        "pooled" => {
            let f = s.pooled.clone();
            closed_loop(CONC, per, move |i| {
                floor_job_run(f.clone(), floor_job(&format!("{name}-{i}"), lease), 1)
            })
            .await
        }
        _ => {
            let (d, conns) = (s.direct.clone(), s.conns.clone());
            closed_loop(CONC, per, move |i| {
                let (d, mut conn) = (d.clone(), conns[i / per].clone());
                let job = floor_job(&format!("{name}-{i}"), lease);
                async move {
                    let t0 = Instant::now();
                    d.job(&mut conn, &job)
                        .await
                        .expect("unconstrained floor job");
                    t0.elapsed()
                }
            })
            .await
        }
    }
}

/// Waits (bounded) until no channel has a subscriber, so one side's trailing `UNSUBSCRIBE`s
/// are not counted in the next's.
async fn settle(adm: &mut MultiplexedConnection) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(adm)
            .await
            .expect("PUBSUB CHANNELS");
        if channels.is_empty() || Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Dedicated-connection occupancy from a `MONITOR` capture.
fn occupancy(lines: &[redisinfo::Seen], jobs: usize) -> Value {
    let mut by_conn: HashMap<&str, Vec<&redisinfo::Seen>> = HashMap::new();
    for l in lines {
        by_conn.entry(l.addr.as_str()).or_default().push(l);
    }
    let (mut holds, mut gaps) = (Vec::new(), Vec::new());
    let (mut busy, mut span) = (0.0, 0.0);
    let mut dedicated = 0;
    let mut other: HashMap<String, u64> = HashMap::new();
    for seen in by_conn.values() {
        if !seen.iter().any(|l| l.cmd == "WATCH") {
            for l in seen {
                *other.entry(l.cmd.to_ascii_lowercase()).or_default() += 1;
            }
            continue;
        }
        dedicated += 1;
        let (mut start, mut last_end): (Option<f64>, Option<f64>) = (None, None);
        let (mut first, mut end_all) = (None, 0.0);
        for l in seen.iter() {
            match l.cmd.as_str() {
                "WATCH" => {
                    if let Some(e) = last_end {
                        gaps.push((l.at - e) * 1e6);
                    }
                    start = Some(l.at);
                    first.get_or_insert(l.at);
                }
                "EXEC" | "UNWATCH" => {
                    if let Some(s) = start.take() {
                        holds.push((l.at - s) * 1e6);
                        busy += l.at - s;
                    }
                    last_end = Some(l.at);
                    end_all = l.at;
                }
                _ => {}
            }
        }
        if let Some(f) = first {
            span += end_all - f;
        }
    }
    json!({
        "jobs": jobs,
        "dedicated_connections_used": dedicated,
        "transitions": holds.len(),
        "transitions_per_job": (holds.len() as f64 / jobs as f64 * 100.0).round() / 100.0,
        "hold_us_p50": pct(&mut holds, 50.0).round(),
        "hold_us_p90": pct(&mut holds, 90.0).round(),
        "gap_us_p50": pct(&mut gaps, 50.0).round(),
        "gap_us_p90": pct(&mut gaps, 90.0).round(),
        "busy_fraction": if span > 0.0 { (busy / span * 100.0).round() / 100.0 } else { 0.0 },
        "other_connections_commands": other,
    })
}

pub async fn profile(opts: &Opts, report: &mut Report) {
    let secs = opts.secs.unwrap_or(if opts.quick { 2.0 } else { 10.0 });
    alloc_count::start();
    let sides: Vec<&str> = if opts.sides.is_empty() {
        SIDES.to_vec()
    } else {
        opts.sides.iter().map(String::as_str).collect()
    };
    let server = start_server();
    let url = server.url();
    let mut adm = admin(&url).await;
    let mut conns = Vec::with_capacity(CONC);
    for _ in 0..CONC {
        conns.push(admin(&url).await);
    }
    let s = Sides {
        client: connect(&url).await,
        client64: if sides.contains(&"baton-pool64") {
            Some(
                baton::Client::builder(&url)
                    .pool_size(64)
                    .connect()
                    .await
                    .expect("baton connects"),
            )
        } else {
            None
        },
        pooled: Arc::new(Floor::connect(&url, POOL).await.expect("floor connects")),
        direct: Arc::new(floor::Direct::new()),
        conns: Arc::new(conns),
        id: run_id(),
    };
    // Warm-up: pools opened, code paths and allocator warm.
    for side in &sides {
        round(&s, side, "w", 5).await;
    }
    let mut acc: HashMap<&str, Acc> = sides.iter().map(|s| (*s, Acc::default())).collect();
    let mut r = 0;
    // Rounds interleave the sides until each has run `secs`.
    while sides.iter().any(|side| acc[side].wall < secs) {
        r += 1;
        for side in &sides {
            if acc[side].wall >= secs {
                continue;
            }
            settle(&mut adm).await;
            let (s0, p0) = (server_now(&mut adm).await, proc_now());
            let (a0, r0) = (alloc_count::now(), runtime_now());
            let (samples, wall) = round(&s, side, &r.to_string(), PER).await;
            let (a1, r1) = (alloc_count::now(), runtime_now());
            let p1 = proc_now();
            settle(&mut adm).await;
            let s1 = server_now(&mut adm).await;
            let a = acc.get_mut(side).expect("side");
            a.jobs += CONC * PER;
            a.wall += wall.as_secs_f64();
            a.samples.extend(samples);
            a.cpu_user += p1.user - p0.user;
            a.cpu_sys += p1.sys - p0.sys;
            a.vol += p1.vol - p0.vol;
            a.invol += p1.invol - p0.invol;
            a.allocs += a1.allocs - a0.allocs;
            a.reallocs += a1.reallocs - a0.reallocs;
            a.alloc_bytes += a1.bytes - a0.bytes;
            a.parks += r1.0 - r0.0;
            a.busy += r1.1 - r0.1;
            a.srv_cpu += s1.cpu - s0.cpu;
            a.reads += s1.reads - s0.reads;
            a.conns += s1.conns - s0.conns;
            for (k, v) in redisinfo::delta(&s0.cmds, &s1.cmds) {
                *a.cmds.entry(k).or_default() += v;
            }
        }
    }
    let mut out = serde_json::Map::new();
    for side in &sides {
        out.insert(side.to_string(), acc[side].to_json());
    }
    if opts.sides.is_empty() || opts.monitor {
        let mon = Monitor::start(server.port()).expect("MONITOR");
        let per = 10;
        for side in &sides {
            settle(&mut adm).await;
            mon.take();
            round(&s, side, "m", per).await;
            settle(&mut adm).await;
            let lines = mon.take();
            out.insert(format!("{side}_monitor"), occupancy(&lines, CONC * per));
        }
        mon.stop();
    }
    s.client.shutdown(Duration::from_secs(5)).await;
    if let Some(c) = &s.client64 {
        c.shutdown(Duration::from_secs(5)).await;
    }
    for side in &sides {
        let v = &out[*side];
        eprintln!(
            "profile {side:>6}: {} jobs/s; client CPU {} µs/job ({} cores), server CPU {} µs/job \
             ({} cores); {} reads, {} commands per job; {} connections opened; \
             switches/job {} vol {} invol; tokio workers parked {} times and busy {} µs per job; \
             {} allocations + {} reallocations ({} bytes) per job",
            v["jobs_per_s"],
            v["client_cpu_us_per_job"],
            v["client_cpu_cores"],
            v["server_cpu_us_per_job"],
            v["server_cpu_cores"],
            v["server_reads_per_job"],
            v["commands_per_job"],
            v["connections_opened"],
            v["voluntary_switches_per_job"],
            v["involuntary_switches_per_job"],
            v["worker_parks_per_job"],
            v["worker_busy_us_per_job"],
            v["allocations_per_job"],
            v["reallocations_per_job"],
            v["allocated_bytes_per_job"],
        );
        if let Some(m) = out.get(&format!("{side}_monitor")) {
            eprintln!(
                "        under MONITOR: {} dedicated connections, {} transitions/job, hold p50/p90 \
                 {}/{} µs, idle gap p50/p90 {}/{} µs, busy {}",
                m["dedicated_connections_used"],
                m["transitions_per_job"],
                m["hold_us_p50"],
                m["hold_us_p90"],
                m["gap_us_p50"],
                m["gap_us_p90"],
                m["busy_fraction"],
            );
        }
    }
    report.profile = Value::Object(out);
}
