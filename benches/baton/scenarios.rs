//! The dispatcher ([`run`] by name, over every scenario file) and the failover scenarios. Each
//! measures baton and, where one exists, its floor in the same run, interleaving their runs so
//! drift on a shared machine hits both alike. What the scenario files share is `harness.rs`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{Client, Event, FailoverConfig};
use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::floor::{self, Ending, Floor, RawEvent};
use crate::harness::{
    admin, baton_job, cfg, closed_loop, commands, connect, drain_pubsub, floor_job, floor_job_run,
    heap_in_use, own, rss_kb, spawn_idle_worker, wait_count, Report, POOL, RETENTION,
};
use crate::holders::Holders;
use crate::redisinfo::{self, CommandStats, Monitor};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

pub const NAMES: &[&str] = &[
    "roundtrips",
    "uncontended",
    "concurrent",
    "handover",
    "takeover",
    "idle",
    "lock-uncontended",
    "lock-distinct",
    "lock-contended",
    "redlock",
    "cluster",
    "leader-takeover",
    "leader-handover",
    "fair-handoff",
    "fair-contended",
    "queue-throughput",
    "pg-job-cycle",
    "pg-lock-cycle",
    "status-listing",
    "metrics-cost",
    "sem-uncontended",
    "sem-contended",
    "rw-uncontended",
    "rw-mix",
];

pub async fn run(name: &str, opts: &Opts, report: &mut Report) {
    match name {
        "roundtrips" => roundtrips(report).await,
        "uncontended" => uncontended(opts, report).await,
        "concurrent" => concurrent(opts, report).await,
        "handover" => handover(opts, report).await,
        "takeover" => takeover(opts, report).await,
        "idle" => idle(opts, report).await,
        "lock-uncontended" => crate::locks::uncontended(opts, report).await,
        "lock-distinct" => crate::locks::distinct(opts, report).await,
        "lock-contended" => crate::locks::contended(opts, report).await,
        "redlock" => crate::locks::redlock(opts, report).await,
        "cluster" => crate::cluster::cluster(opts, report).await,
        "leader-takeover" => crate::leader::takeover(opts, report).await,
        "leader-handover" => crate::leader::handover(opts, report).await,
        "fair-handoff" => crate::fair::handoff(opts, report).await,
        "fair-contended" => crate::fair::contended(opts, report).await,
        "queue-throughput" => crate::fair::queue(opts, report).await,
        #[cfg(feature = "postgres")]
        "pg-job-cycle" => crate::postgres::job_cycle(opts, report).await,
        #[cfg(feature = "postgres")]
        "pg-lock-cycle" => crate::postgres::lock_cycle_scenario(opts, report).await,
        #[cfg(not(feature = "postgres"))]
        "pg-job-cycle" | "pg-lock-cycle" => {
            eprintln!("{name} needs --features postgres; skipped")
        }
        "status-listing" => crate::status::listing(opts, report).await,
        "metrics-cost" => crate::metrics_cost::metrics_cost(opts, report).await,
        "sem-uncontended" => crate::semaphore::uncontended(opts, report).await,
        "sem-contended" => crate::semaphore::contended(opts, report).await,
        "rw-uncontended" => crate::rwlock::uncontended(opts, report).await,
        "rw-mix" => crate::rwlock::mix(opts, report).await,
        "profile" => crate::profile::profile(opts, report).await,
        _ => unreachable!("checked in parse_args"),
    }
}

/// What one side (baton or floor) of a throughput scenario measured.
#[derive(Default)]
struct Side {
    samples: Samples,
    wall: Duration,
    ops: usize,
    cmds: CommandStats,
    /// Floor only: waiting backups woken by their lease timer, not a message (lost wake-ups;
    /// 0 in a healthy run, where every holder calls `done()` at once).
    timer_wakeups: u64,
}

impl Side {
    fn add(&mut self, s: Samples, wall: Duration, ops: usize, cmds: &CommandStats) {
        self.samples.extend(s);
        self.wall += wall;
        self.ops += ops;
        for (k, v) in cmds {
            *self.cmds.entry(k.clone()).or_default() += v;
        }
    }
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64()
    }
    fn cmds_per_op(&self) -> f64 {
        commands(&self.cmds) as f64 / self.ops as f64
    }
}

fn throughput_row(
    scenario: String,
    baton: &Side,
    floor: &Side,
    kind: FloorKind,
    runs: usize,
    what: &str,
) -> Row {
    let (b, f) = (baton.ops_per_s(), floor.ops_per_s());
    let (bc, fc) = (baton.cmds_per_op(), floor.cmds_per_op());
    let same = (bc - fc).abs() < 0.05;
    let per_op = |s: &Side| -> Value {
        s.cmds
            .iter()
            .filter(|(k, _)| !own(k))
            .map(|(k, v)| {
                (
                    k.clone(),
                    json!((*v as f64 / s.ops as f64 * 100.0).round() / 100.0),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    Row {
        scenario,
        p50_us: baton.samples.pct(50.0),
        p99_us: baton.samples.pct(99.0),
        ops_per_s: Some(b),
        floor_ops_per_s: Some(f),
        ratio: Some(f / b),
        samples: baton.samples.len(),
        notes: format!(
            "{what}; vs {}; floor p50 {:.0} µs; cmds/op {bc:.2} vs floor {fc:.2}{}; {runs} runs{}",
            kind.describe(),
            floor.samples.pct(50.0).unwrap_or(0.0),
            if same { "" } else { " (DIFFER)" },
            if floor.timer_wakeups > 0 {
                format!(
                    "; FLOOR STALLED: {} backups slept a whole lease",
                    floor.timer_wakeups
                )
            } else {
                String::new()
            }
        ),
        extra: json!({
            "floor": kind.key(),
            "floor_p50_us": floor.samples.pct(50.0),
            "floor_p99_us": floor.samples.pct(99.0),
            "commands_per_op": bc,
            "floor_commands_per_op": fc,
            "commands_per_op_by_command": per_op(baton),
            "floor_commands_per_op_by_command": per_op(floor),
            "floor_timer_wakeups": floor.timer_wakeups,
            "runs": runs,
        }),
    }
}

/// The floors a throughput scenario measures baton against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FloorKind {
    /// `Floor`: a pool of `POOL` dedicated connections, one multiplexed, one pub/sub.
    Pooled,
    /// `Direct`: one connection per closed-loop task, kept for the task's life; one worker per
    /// job only (no pub/sub, no waiting).
    Direct,
}

impl FloorKind {
    fn describe(self) -> &'static str {
        match self {
            FloorKind::Pooled => "8-connection floor: pool of 8 dedicated + 1 multiplexed + 1 pub/sub",
            FloorKind::Direct => {
                "unconstrained floor: 1 connection per job task, 4 round trips per job, no pool, no pub/sub"
            }
        }
    }
    fn key(self) -> &'static str {
        match self {
            FloorKind::Pooled => "pooled8",
            FloorKind::Direct => "unconstrained",
        }
    }
}

/// Scenarios 1 and 2: closed-loop job cycles, baton and its floors interleaved run by run.
/// Returns baton's side and the floors' sides: the pooled floor always, the unconstrained floor
/// when `direct` (one worker per job only).
async fn cycles(
    tag: &str,
    conc: usize,
    per_task: usize,
    workers: usize,
    runs: usize,
    direct: bool,
) -> (Side, Side, Option<Side>) {
    assert!(
        !direct || workers == 1,
        "the unconstrained floor runs lone workers"
    );
    let server = start_server();
    let url = server.url();
    let client = connect(&url).await;
    let fl = Arc::new(Floor::connect(&url, POOL).await.expect("floor connects"));
    // The unconstrained floor's connections: one per closed-loop task, opened up front (as
    // baton's pool and the pooled floor's are opened by the warm-up round).
    let direct_conns: Arc<Vec<MultiplexedConnection>> = Arc::new(if direct {
        let mut v = Vec::with_capacity(conc);
        for _ in 0..conc {
            v.push(admin(&url).await);
        }
        v
    } else {
        Vec::new()
    });
    let dfl = Arc::new(floor::Direct::new());
    let mut adm = admin(&url).await;
    let id = run_id();
    let lease = Duration::from_secs(10);
    let (mut baton, mut floor, mut dside) = (Side::default(), Side::default(), Side::default());
    // Round 0 is the warm-up (connections opened, code paths and allocator warm).
    for round in 0..=runs {
        let per = if round == 0 {
            per_task.div_ceil(4).max(2)
        } else {
            per_task
        };
        let c = client.clone();
        let name = format!("{tag}-{id}-{round}");
        drain_pubsub(&mut adm).await;
        let before = redisinfo::commandstats(&mut adm).await;
        let (s, wall) = closed_loop(conc, per, move |i| {
            baton_job(c.clone(), cfg(&format!("{name}-{i}"), lease), workers)
        })
        .await;
        drain_pubsub(&mut adm).await;
        let mid = redisinfo::commandstats(&mut adm).await;
        let f = fl.clone();
        let name = format!("{tag}-{id}-{round}");
        let (fs, fwall) = closed_loop(conc, per, move |i| {
            floor_job_run(f.clone(), floor_job(&format!("{name}-{i}"), lease), workers)
        })
        .await;
        drain_pubsub(&mut adm).await;
        let after = redisinfo::commandstats(&mut adm).await;
        if round > 0 {
            baton.add(s, wall, conc * per, &redisinfo::delta(&before, &mid));
            floor.add(fs, fwall, conc * per, &redisinfo::delta(&mid, &after));
        }
        if direct {
            let (d, conns) = (dfl.clone(), direct_conns.clone());
            let name = format!("{tag}d-{id}-{round}");
            let (ds, dwall) = closed_loop(conc, per, move |i| {
                // Task t runs jobs t*per .. (t+1)*per on connection t.
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
            .await;
            let end = redisinfo::commandstats(&mut adm).await;
            if round > 0 {
                dside.add(ds, dwall, conc * per, &redisinfo::delta(&after, &end));
            }
        }
    }
    floor.timer_wakeups = fl.timer_wakeups();
    client.shutdown(Duration::from_secs(5)).await;
    (baton, floor, direct.then_some(dside))
}

async fn uncontended(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (150, 2) } else { (1500, 5) };
    let (b, f, _) = cycles("s1", 1, per, 1, runs, false).await;
    report.rows.push(throughput_row(
        "1 uncontended cycle".into(),
        &b,
        &f,
        FloorKind::Pooled,
        runs,
        "start→Acquired→done()→Completed, one at a time",
    ));
}

async fn concurrent(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (3, 2) } else { (40, 4) };
    let what = "64 jobs in flight on one client, ops = jobs completed";
    // One worker per job: against the unconstrained floor (what the same job costs by hand with
    // a connection per task), and against the 8-connection floor (the same connections as a
    // default baton client).
    let (b, f, d) = cycles("s2w1", 64, per, 1, runs, true).await;
    let d = d.expect("the unconstrained floor ran");
    report.rows.push(throughput_row(
        "2 64 jobs × 1 worker".into(),
        &b,
        &d,
        FloorKind::Direct,
        runs,
        what,
    ));
    report.rows.push(throughput_row(
        "2 64 × 1, 8-conn floor".into(),
        &b,
        &f,
        FloorKind::Pooled,
        runs,
        what,
    ));
    let (b, f, _) = cycles("s2w3", 64, per, 3, runs, false).await;
    report.rows.push(throughput_row(
        "2 64 jobs × 3 workers".into(),
        &b,
        &f,
        FloorKind::Pooled,
        runs,
        what,
    ));
}

/// Waits until `PUBSUB NUMSUB channel` reaches `n` (bounded).
async fn wait_numsub(adm: &mut MultiplexedConnection, channel: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(adm)
            .await
            .expect("PUBSUB NUMSUB");
        if v.1 >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel}: {} of {n} subscribers",
            v.1
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Next event that is not chatter (`Status`, `Lagged`).
async fn next_real(w: &mut baton::Worker) -> Event {
    loop {
        match w.next_event().await {
            Some(Event::Status { .. } | Event::Lagged { .. }) => {}
            Some(ev) => return ev,
            None => panic!("stream of {} ended early", w.key()),
        }
    }
}

async fn next_raw(rx: &mut mpsc::UnboundedReceiver<(RawEvent, Instant)>) -> (RawEvent, Instant) {
    rx.recv().await.expect("floor worker event")
}

/// One baton handover: from the holder's `fail()` call to the idle backup's `Acquired`.
async fn baton_handover(
    a: &Client,
    b: &Client,
    adm: &mut MultiplexedConnection,
    job: &str,
) -> Duration {
    let c = cfg(job, Duration::from_secs(10));
    let mut holder = a.failover().start(c.clone());
    let Event::Acquired(att) = next_real(&mut holder).await else {
        panic!("holder did not acquire")
    };
    let mut backup = b.failover().start(c);
    assert!(matches!(next_real(&mut backup).await, Event::Locked { .. }));
    wait_numsub(adm, &format!("baton:{{{job}}}:events"), 2).await;
    // Let the backup finish its post-subscription read and sleep: idle before the fail().
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = Instant::now();
    let fail = tokio::spawn(att.fail("bench"));
    let Event::Acquired(took) = next_real(&mut backup).await else {
        panic!("backup did not take over")
    };
    let dt = t0.elapsed();
    fail.await.expect("fail task").expect("fail()");
    took.done().await.expect("backup done()");
    assert!(matches!(next_real(&mut holder).await, Event::Failed { .. }));
    assert!(matches!(
        next_real(&mut backup).await,
        Event::Completed { .. }
    ));
    dt
}

async fn floor_handover(
    a: &Arc<Floor>,
    b: &Arc<Floor>,
    adm: &mut MultiplexedConnection,
    job: &str,
) -> Duration {
    let j = floor_job(job, Duration::from_secs(10));
    let (htx, mut hrx) = mpsc::unbounded_channel();
    let (btx, mut brx) = mpsc::unbounded_channel();
    let (hc, hctl) = oneshot::channel();
    let (bc, bctl) = oneshot::channel();
    let (fa, ja) = (a.clone(), j.clone());
    let h = tokio::spawn(async move { fa.worker(&ja, &htx, Some(hctl)).await });
    assert!(matches!(next_raw(&mut hrx).await.0, RawEvent::Acquired(1)));
    let (fb, jb) = (b.clone(), j.clone());
    let bk = tokio::spawn(async move { fb.worker(&jb, &btx, Some(bctl)).await });
    assert!(matches!(next_raw(&mut brx).await.0, RawEvent::Locked(1)));
    wait_numsub(adm, &j.keys.channel, 2).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = Instant::now();
    let _ = hc.send(Ending::Fail);
    let (ev, t1) = next_raw(&mut brx).await;
    assert!(matches!(ev, RawEvent::Acquired(2)));
    let _ = bc.send(Ending::Done);
    h.await.expect("holder").expect("floor holder");
    bk.await.expect("backup").expect("floor backup");
    t1 - t0
}

async fn handover(opts: &Opts, report: &mut Report) {
    let (n, runs) = if opts.quick { (25, 2) } else { (100, 3) };
    let server = start_server();
    let url = server.url();
    // Holder and backup on separate clients, as in separate processes.
    let (a, b) = (connect(&url).await, connect(&url).await);
    let fa = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let fb = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let mut adm = admin(&url).await;
    let id = run_id();
    let (mut bs, mut fs) = (Samples::default(), Samples::default());
    for round in 0..=runs {
        let count = if round == 0 { 5 } else { n };
        for i in 0..count {
            let d = baton_handover(&a, &b, &mut adm, &format!("s3-{id}-{round}-{i}")).await;
            let e = floor_handover(&fa, &fb, &mut adm, &format!("s3-{id}-{round}-{i}")).await;
            if round > 0 {
                bs.push(d);
                fs.push(e);
            }
        }
    }
    let (bp, fp) = (bs.pct(50.0).unwrap(), fs.pct(50.0).unwrap());
    report.rows.push(Row {
        scenario: "3 handover after fail()".into(),
        p50_us: Some(bp),
        p99_us: bs.pct(99.0),
        ops_per_s: None,
        floor_ops_per_s: None,
        ratio: Some(bp / fp),
        samples: bs.len(),
        notes: format!(
            "fail() call → backup Acquired, backup idle; floor p50/p99 {fp:.0}/{:.0} µs; \
             target p50 ≤ 1500 µs; {runs} runs",
            fs.pct(99.0).unwrap()
        ),
        extra: json!({
            "floor_p50_us": fp,
            "floor_p99_us": fs.pct(99.0),
            "ratio_of": "p50",
            "runs": runs,
        }),
    });
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The lease's expiry in Unix µs (`PEXPIRETIME`, ms precision, the server's own clock).
async fn expiry_us(adm: &mut MultiplexedConnection, lease_key: &str) -> i64 {
    let ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(lease_key)
        .query_async(adm)
        .await
        .expect("PEXPIRETIME");
    assert!(ms > 0, "{lease_key} has no expiry ({ms})");
    ms * 1000
}

/// One baton crash takeover: µs from the lease's expiry to the backup's `Acquired`.
async fn baton_takeover(a: Client, b: Client, url: String, job: String, lease: Duration) -> f64 {
    let mut adm = admin(&url).await;
    let c = cfg(&job, lease); // keepalive off: the lease runs out unless done()/fail()
    let mut holder = a.failover().start(c.clone());
    let Event::Acquired(att) = next_real(&mut holder).await else {
        panic!("holder did not acquire")
    };
    let expiry = expiry_us(&mut adm, &format!("baton:{{{job}}}:lease")).await;
    let mut backup = b.failover().start(c);
    assert!(matches!(next_real(&mut backup).await, Event::Locked { .. }));
    // The holder "crashes": it never calls done()/fail() and its handle stays alive (dropping
    // it would release the attempt), so the lease is left to expire.
    let took = loop {
        match next_real(&mut backup).await {
            Event::Acquired(t) => break t,
            Event::Locked { .. }
            | Event::Error {
                retryable: true, ..
            } => {}
            other => panic!("backup ended {}", other.name()),
        }
    };
    let dt = (unix_us() - expiry) as f64;
    took.done().await.expect("backup done()");
    drop(att);
    drop(holder);
    dt
}

async fn floor_takeover(
    a: Arc<Floor>,
    b: Arc<Floor>,
    url: String,
    job: String,
    lease: Duration,
) -> f64 {
    let mut adm = admin(&url).await;
    let j = floor_job(&job, lease);
    let (htx, mut hrx) = mpsc::unbounded_channel();
    let (btx, mut brx) = mpsc::unbounded_channel();
    let (hc, hctl) = oneshot::channel();
    let (bc, bctl) = oneshot::channel();
    let ja = j.clone();
    let h = tokio::spawn(async move { a.worker(&ja, &htx, Some(hctl)).await });
    assert!(matches!(next_raw(&mut hrx).await.0, RawEvent::Acquired(1)));
    let expiry = expiry_us(&mut adm, &j.keys.lease).await;
    let jb = j.clone();
    let bk = tokio::spawn(async move { b.worker(&jb, &btx, Some(bctl)).await });
    let dt = loop {
        match next_raw(&mut brx).await.0 {
            RawEvent::Acquired(2) => break (unix_us() - expiry) as f64,
            RawEvent::Locked(_) => {}
            other => panic!("floor backup: {other:?}"),
        }
    };
    let _ = bc.send(Ending::Done);
    let _ = hc.send(Ending::Abandon);
    h.await.expect("holder").expect("floor holder");
    bk.await.expect("backup").expect("floor backup");
    dt
}

async fn takeover(opts: &Opts, report: &mut Report) {
    let (jobs, runs, lease) = if opts.quick {
        (10, 1, Duration::from_millis(200))
    } else {
        (25, 3, Duration::from_millis(300))
    };
    let server = start_server();
    let url = server.url();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let fa = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let fb = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let id = run_id();
    let stagger = lease / jobs as u32;
    let (mut bs, mut fs) = (Samples::default(), Samples::default());
    for round in 0..runs {
        // Jobs start staggered so their leases expire one at a time, not all at once.
        let mut hs = Vec::new();
        for i in 0..jobs {
            let (a, b, url) = (a.clone(), b.clone(), url.clone());
            let job = format!("s4-{id}-{round}-{i}");
            let delay = stagger * i as u32;
            hs.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                baton_takeover(a, b, url, job, lease).await
            }));
        }
        for h in hs {
            bs.push_us(h.await.expect("takeover task"));
        }
        let mut hs = Vec::new();
        for i in 0..jobs {
            let (a, b, url) = (fa.clone(), fb.clone(), url.clone());
            let job = format!("s4-{id}-{round}-{i}");
            let delay = stagger * i as u32;
            hs.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                floor_takeover(a, b, url, job, lease).await
            }));
        }
        for h in hs {
            fs.push_us(h.await.expect("takeover task"));
        }
    }
    let (bp, fp) = (bs.pct(50.0).unwrap(), fs.pct(50.0).unwrap());
    report.rows.push(Row {
        scenario: "4 takeover after crash".into(),
        p50_us: Some(bp),
        p99_us: bs.pct(99.0),
        ops_per_s: None,
        floor_ops_per_s: None,
        ratio: Some(bp / fp),
        samples: bs.len(),
        notes: format!(
            "lease expiry → backup Acquired (lease {} ms); floor p50/p99 {fp:.0}/{:.0} µs; \
             target ≤ 10 000 µs; {runs} runs",
            lease.as_millis(),
            fs.pct(99.0).unwrap()
        ),
        extra: json!({
            "lease_ms": lease.as_millis() as u64,
            "floor_p50_us": fp,
            "floor_p99_us": fs.pct(99.0),
            "ratio_of": "p50",
            "runs": runs,
        }),
    });
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}

/// CPU time used so far (user + system) by `/proc/{proc}` (`"self"` or a PID), from its `stat`.
fn cpu_time(proc: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 (1-based); here 0-based after "pid (comm)".
    let t = ticks(11) + ticks(12);
    let hz = 100; // USER_HZ on Linux
    Duration::from_millis(t * 1000 / hz)
}

/// Scenario 5: N holders keeping their leases alive in another process (see `holders.rs`), and
/// 3 idle backups per job on one client in this one, whose RSS is then the backups'.
async fn idle(opts: &Opts, report: &mut Report) {
    let (n, lease, periods) = if opts.quick {
        (500, Duration::from_secs(1), 3)
    } else {
        (10_000, Duration::from_secs(3), 3)
    };
    let backups_per_job = 3;
    let server = start_server();
    let url = server.url();
    let mut adm = admin(&url).await;
    let rss_start = rss_kb("self");
    let id = run_id();
    let prefix = format!("s5-{id}");
    let t_setup = Instant::now();
    let holders = Holders::start(&url, &prefix, n, lease, Duration::from_secs(150)).await;
    let hpid = holders.pid().to_string();
    let backups = connect(&url).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let locked = Arc::new(AtomicUsize::new(0));
    let unexpected = Arc::new(AtomicUsize::new(0));
    // This process before its first backup (the backups' client connected, nothing started).
    let rss_before = rss_kb("self");
    let heap_before = heap_in_use();
    let mut tasks = Vec::new();
    for i in 0..n {
        for _ in 0..backups_per_job {
            tasks.push(spawn_idle_worker(
                &backups,
                &format!("{prefix}-{i}"),
                lease,
                false,
                &stop_rx,
                locked.clone(),
                unexpected.clone(),
            ));
        }
    }
    let backups_n = n * backups_per_job;
    wait_count(
        "backups locked",
        &locked,
        backups_n,
        Duration::from_secs(120),
    )
    .await;
    let setup = t_setup.elapsed();
    // Let the initial subscriptions and post-subscription reads settle.
    tokio::time::sleep(lease).await;
    let rss_all = rss_kb("self");
    let heap_all = heap_in_use();
    let window = lease * periods;
    let cs0 = redisinfo::commandstats(&mut adm).await;
    let (cpu0, hcpu0) = (cpu_time("self"), cpu_time(&hpid));
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let cs1 = redisinfo::commandstats(&mut adm).await;
    let (cpu, hcpu) = (cpu_time("self") - cpu0, cpu_time(&hpid) - hcpu0);
    let secs = t0.elapsed().as_secs_f64();
    let rss_holders = rss_kb(&hpid);
    let d = redisinfo::delta(&cs0, &cs1);
    let g = |k: &str| d.get(k).copied().unwrap_or(0);
    // Holders: one extension is one EVALSHA on the shared connection, and on the server the
    // script's GET lease, GET state and PEXPIRE ×3 (lease, state, fence): 6 commands in
    // `INFO commandstats`. Checked below: PEXPIRE = 3 × EVALSHA, no SET in the window.
    let extensions = g("evalsha");
    let holder_server_cmds = extensions * 6;
    let total = commands(&d);
    let backup_cmds = total.saturating_sub(holder_server_cmds);
    // A backup observes either with a plain read (GET state + PTTL lease on the shared
    // connection) or, when something changed, with a WATCH transition (WATCH, GET ×3, PTTL,
    // TIME; its UNWATCH rides in the connection's next pipeline). A confirmed extension has no
    // PTTL and no WATCH, so the plain reads are PTTL − WATCH and the WATCH transitions WATCH.
    let plain_reads = g("pttl").saturating_sub(g("watch"));
    let watch_checks = g("watch");
    let observations = plain_reads + watch_checks;
    let lease_periods = secs / lease.as_secs_f64();
    let obs_per = observations as f64 / backups_n as f64 / lease_periods;
    let mb = |kb: u64| kb as f64 / 1024.0;
    let kb_per_backup = rss_all.saturating_sub(rss_before) as f64 / backups_n as f64;
    // The live heap per backup (what the allocator handed out and did not get back).
    let heap_kb_per_backup = heap_before
        .zip(heap_all)
        .map(|(b, a)| a.saturating_sub(b) as f64 / 1024.0 / backups_n as f64);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    // Backups' round trips: plain reads, WATCH transitions (1 each: the UNWATCH is deferred),
    // and their grants' EXECs (none in a healthy window).
    let backup_rts = plain_reads + watch_checks + g("exec");
    // Every GET is the script's (2 per extension) or a backup's (1 per plain read, 3 per WATCH
    // transition).
    let gets_add_up = g("get") == 2 * extensions + plain_reads + 3 * watch_checks;
    // Streams that ended before the stop (a shut-down client ends every stream).
    let unexpected = unexpected.load(Ordering::Relaxed);
    // Backups first (they just stop), then holders (each releases its attempt).
    backups.shutdown(Duration::from_secs(30)).await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let holders_ended = holders.stop(Duration::from_secs(90)).await;
    if holders_ended.is_none() {
        eprintln!("idle: the holders' process did not report its stop");
    }
    let idle_json = json!({
        "jobs": n,
        "backups_per_job": backups_per_job,
        "lease_ms": lease.as_millis() as u64,
        "window_s": r2(secs),
        "setup_s": r1(setup.as_secs_f64()),
        "holders_process": "a separate process (the bench binary re-executed with --idle-holders)",
        "commands_by_command": d.iter().filter(|(k, _)| !own(k)).map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "holder_extensions": extensions,
        "holder_commands_per_s": extensions as f64 / secs,
        "holder_server_commands_per_s": holder_server_cmds as f64 / secs,
        "backup_commands_per_s": backup_cmds as f64 / secs,
        "backup_round_trips_per_s": backup_rts as f64 / secs,
        "backup_observations": observations,
        "backup_plain_reads": plain_reads,
        "backup_watch_checks": watch_checks,
        "observations_per_backup_per_lease_period": obs_per,
        "rss_mb_start": mb(rss_start),
        "rss_mb_before_backups": mb(rss_before),
        "rss_mb_all": mb(rss_all),
        "rss_kb_per_backup": r2(kb_per_backup),
        "heap_kb_per_backup": heap_kb_per_backup.map(r2),
        "holders_process_rss_mb": mb(rss_holders),
        "bench_cpu_percent": cpu.as_secs_f64() / secs * 100.0,
        "holders_process_cpu_percent": hcpu.as_secs_f64() / secs * 100.0,
        "unexpected_terminal_events": unexpected,
        "holders_ended_early": holders_ended,
        "sanity_pexpire_is_3x_evalsha": g("pexpire") == 3 * extensions,
        "sanity_gets_add_up": gets_add_up,
        "grants_during_window": g("set"),
    });
    report.rows.push(Row {
        scenario: format!("5 idle {n} jobs × {backups_per_job} backups"),
        p50_us: None,
        p99_us: None,
        ops_per_s: Some(backup_cmds as f64 / secs),
        floor_ops_per_s: None,
        ratio: None,
        samples: observations as usize,
        notes: format!(
            "ops = backups' commands/s; {obs_per:.2} observations/backup/lease (target ≤ 1.5); \
             RSS of the backups' process {:.0} MB ({:.0} before the backups, {kb_per_backup:.1} \
             KB per backup{}; target < 100 MB), holders in another process ({:.0} MB); holders \
             {:.0} EVALSHA/s ({:.0} commands/s on the server); CPU {:.0} % here, {:.0} % \
             holders; lease {} ms",
            mb(rss_all),
            mb(rss_before),
            heap_kb_per_backup.map_or(String::new(), |h| format!(", live heap {h:.1} KB")),
            mb(rss_holders),
            extensions as f64 / secs,
            holder_server_cmds as f64 / secs,
            cpu.as_secs_f64() / secs * 100.0,
            hcpu.as_secs_f64() / secs * 100.0,
            lease.as_millis()
        ),
        extra: idle_json.clone(),
    });
    report.idle = idle_json;
}

// ----- Scenario 6: round trips per transition, from MONITOR -------------------------------------

/// What one phase sent, as the server saw it.
struct PhaseCount {
    /// `total_reads_processed` delta: one per round trip (a pipeline arrives in one read).
    reads: u64,
    /// Commands the clients sent (`MONITOR`, without the script's inner calls).
    commands: usize,
    /// Commands run by scripts (`MONITOR`'s `[0 lua]` lines): not sent by any client.
    script_inner: usize,
    /// `INFO commandstats` delta (the bench's own commands left out): the clients' commands and
    /// the scripts' inner calls.
    server: CommandStats,
    /// Per connection (in order of appearance): its pipelines and how often each was sent.
    conns: Vec<(String, BTreeMap<String, u64>)>,
    rts_seen: u64,
    /// The keepalive phase only: what one lease extension costs.
    per_extension: Option<Value>,
}

impl PhaseCount {
    fn to_json(&self) -> Value {
        json!({
            "round_trips": self.reads,
            "round_trips_from_monitor": self.rts_seen,
            "commands": self.commands,
            "script_inner_commands": self.script_inner,
            "server_commands": commands(&self.server),
            "server_commands_by_command": self.server,
            "connections": self.conns.iter().map(|(k, v)| json!({"connection": k, "pipelines": v})).collect::<Vec<_>>(),
            "per_extension": self.per_extension,
        })
    }

    /// Commands sent on the connections whose pipelines `pred` picks.
    fn sent_on(&self, pred: impl Fn(&str) -> bool) -> (u64, u64) {
        let (mut cmds, mut rts) = (0, 0);
        for (_, p) in &self.conns {
            if p.keys().any(|s| pred(s)) {
                for (seq, n) in p {
                    cmds += seq.split(' ').count() as u64 * n;
                    rts += n;
                }
            }
        }
        (cmds, rts)
    }

    /// What one lease extension cost, from a phase where a keepalive holder extended: the
    /// holder's connection is the one that sends `EVALSHA`; `INFO commandstats` counts the
    /// script's inner calls too, so the server-side commands per extension are the phase's
    /// server-side commands less what the other connections sent.
    fn extension_costs(&self) -> Value {
        let extensions = self.server.get("evalsha").copied().unwrap_or(0);
        let (holder_cmds, holder_rts) = self.sent_on(|s| s.contains("EVALSHA"));
        let others = self.commands as u64 - holder_cmds;
        let server_side = commands(&self.server).saturating_sub(others);
        let per = |n: u64| {
            if extensions == 0 {
                Value::Null
            } else {
                json!((n as f64 / extensions as f64 * 100.0).round() / 100.0)
            }
        };
        json!({
            "extensions": extensions,
            "round_trips": per(holder_rts),
            "client_sent_commands": per(holder_cmds),
            "server_side_commands": per(server_side),
            "script_inner_commands_from_monitor": per(self.script_inner as u64),
        })
    }
    fn multiset(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (_, p) in &self.conns {
            for (seq, n) in p {
                *m.entry(seq.clone()).or_default() += n;
            }
        }
        m
    }
}

/// Splits the MONITOR lines into round trips: the commands of one read are contiguous (Redis
/// runs a whole query buffer before it serves another client), and every pipeline baton (and
/// the floor) sends starts with `WATCH`, `MULTI`, `UNWATCH` (a deferred one, followed by the
/// `WATCH` or `MULTI` of the same pipeline), `(UN)SUBSCRIBE`, `EVALSHA` (a lease extension),
/// `SCRIPT` (redis-rs loading the script after `NOSCRIPT`) or is the plain `GET`+`PTTL` read, so
/// a run of one connection's commands is split before those heads. A script's inner calls
/// (`[0 lua]`) are counted apart: no client sent them. (MONITOR's timestamps are no help: queued
/// commands are logged when `EXEC` runs them.)
fn analyse(lines: &[redisinfo::Seen], reads: u64, server: CommandStats) -> PhaseCount {
    const HEADS: &[&str] = &[
        "WATCH",
        "MULTI",
        "UNWATCH",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "EVALSHA",
        "SCRIPT",
    ];
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    let mut prev: Option<&redisinfo::Seen> = None;
    let sent = lines.iter().filter(|l| l.cmd != "INFO" && l.addr != "lua");
    for l in sent {
        let new = match prev {
            Some(p) if p.addr != l.addr => true,
            // A deferred UNWATCH heads the pipeline it was sent with.
            Some(p) if p.cmd == "UNWATCH" && matches!(l.cmd.as_str(), "WATCH" | "MULTI") => false,
            Some(_) => HEADS.contains(&l.cmd.as_str()),
            None => true,
        };
        if new {
            groups.push((l.addr.clone(), Vec::new()));
        }
        groups.last_mut().expect("a group").1.push(l.cmd.clone());
        prev = Some(l);
    }
    let mut order: Vec<String> = Vec::new();
    let mut per: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (addr, cmds) in &groups {
        if !order.contains(addr) {
            order.push(addr.clone());
        }
        *per.entry(addr.clone())
            .or_default()
            .entry(cmds.join(" "))
            .or_default() += 1;
    }
    let mut counters: BTreeMap<&str, usize> = BTreeMap::new();
    let conns = order
        .iter()
        .map(|addr| {
            let p = per.remove(addr).unwrap_or_default();
            let role = if p.keys().any(|s| s.contains("WATCH")) {
                "dedicated"
            } else if p.keys().any(|s| s.contains("SUBSCRIBE")) {
                "pubsub"
            } else {
                "shared"
            };
            let c = counters.entry(role).or_default();
            *c += 1;
            (format!("{role}#{c}"), p)
        })
        .collect();
    PhaseCount {
        reads,
        commands: lines
            .iter()
            .filter(|l| l.cmd != "INFO" && l.addr != "lua")
            .count(),
        script_inner: lines.iter().filter(|l| l.addr == "lua").count(),
        server,
        conns,
        rts_seen: groups.len() as u64,
        per_extension: None,
    }
}

async fn phase<T, F: Future<Output = T>>(
    adm: &mut MultiplexedConnection,
    mon: &Monitor,
    f: F,
) -> (PhaseCount, T) {
    tokio::time::sleep(Duration::from_millis(60)).await;
    let cs0 = redisinfo::commandstats(adm).await;
    let r0 = redisinfo::stat(adm, "total_reads_processed").await;
    mon.take();
    let out = f.await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let r1 = redisinfo::stat(adm, "total_reads_processed").await;
    let cs1 = redisinfo::commandstats(adm).await;
    let server = redisinfo::delta(&cs0, &cs1)
        .into_iter()
        .filter(|(k, _)| !own(k))
        .collect();
    // The second INFO's own read is counted in r1.
    (analyse(&mon.take(), r1 - r0 - 1, server), out)
}

/// Scenario 6: what each transition sends, for baton and for the floor, from MONITOR and the
/// server's read counter, on a server with nothing else going on.
async fn roundtrips(report: &mut Report) {
    let server = start_server();
    let url = server.url();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let fa = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let fb = Arc::new(Floor::connect(&url, POOL).await.expect("floor"));
    let mut adm = admin(&url).await;
    let id = run_id();
    let lease = Duration::from_secs(10);
    // Warm up: every client has opened a pooled connection.
    for c in [&a, &b] {
        baton_job(
            c.clone(),
            cfg(&format!("s6w-{id}-{}", rand_suffix()), lease),
            1,
        )
        .await;
    }
    for f in [&fa, &fb] {
        f.warm(1).await.expect("floor warm-up");
    }
    let mon = Monitor::start(server.port()).expect("MONITOR");
    let mut phases: Vec<(String, PhaseCount, Option<PhaseCount>)> = Vec::new();

    // --- baton
    let j1 = format!("s6-{id}-1");
    let (grant, (mut h, att)) = phase(&mut adm, &mon, async {
        let mut h = a.failover().start(cfg(&j1, lease));
        match next_real(&mut h).await {
            Event::Acquired(x) => (h, x),
            other => panic!("{}", other.name()),
        }
    })
    .await;
    let (done, ()) = phase(&mut adm, &mon, async {
        att.done().await.expect("done");
        assert!(matches!(next_real(&mut h).await, Event::Completed { .. }));
    })
    .await;
    let j2 = format!("s6-{id}-2");
    let mut h = a.failover().start(cfg(&j2, lease));
    let Event::Acquired(att2) = next_real(&mut h).await else {
        panic!("holder 2")
    };
    let (wait, mut bk) = phase(&mut adm, &mon, async {
        let mut bk = b.failover().start(cfg(&j2, lease));
        assert!(matches!(next_real(&mut bk).await, Event::Locked { .. }));
        bk
    })
    .await;
    let (hand, took) = phase(&mut adm, &mon, async {
        att2.fail("bench").await.expect("fail");
        match next_real(&mut bk).await {
            Event::Acquired(t) => t,
            other => panic!("{}", other.name()),
        }
    })
    .await;
    took.done().await.expect("done");
    drop((h, bk));

    // --- floor, the same steps
    let fj1 = floor_job(&j1, lease);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (c1, ctl1) = oneshot::channel();
    let (fgrant, ()) = phase(&mut adm, &mon, async {
        let (f, j, tx) = (fa.clone(), fj1.clone(), tx.clone());
        tokio::spawn(async move { f.worker(&j, &tx, Some(ctl1)).await });
        assert!(matches!(next_raw(&mut rx).await.0, RawEvent::Acquired(1)));
    })
    .await;
    let (fdone, ()) = phase(&mut adm, &mon, async {
        let _ = c1.send(Ending::Done);
        assert!(matches!(next_raw(&mut rx).await.0, RawEvent::Completed));
    })
    .await;
    let fj2 = floor_job(&j2, lease);
    let (c2, ctl2) = oneshot::channel();
    {
        let (f, j, tx) = (fa.clone(), fj2.clone(), tx.clone());
        tokio::spawn(async move { f.worker(&j, &tx, Some(ctl2)).await });
        assert!(matches!(next_raw(&mut rx).await.0, RawEvent::Acquired(1)));
    }
    let (btx, mut brx) = mpsc::unbounded_channel();
    let (c3, ctl3) = oneshot::channel();
    let (fwait, ()) = phase(&mut adm, &mon, async {
        let (f, j) = (fb.clone(), fj2.clone());
        tokio::spawn(async move { f.worker(&j, &btx, Some(ctl3)).await });
        assert!(matches!(next_raw(&mut brx).await.0, RawEvent::Locked(1)));
    })
    .await;
    let (fhand, ()) = phase(&mut adm, &mon, async {
        let _ = c2.send(Ending::Fail);
        assert!(matches!(next_raw(&mut rx).await.0, RawEvent::Failed));
        assert!(matches!(next_raw(&mut brx).await.0, RawEvent::Acquired(2)));
    })
    .await;
    let _ = c3.send(Ending::Done);

    // --- baton only: a keepalive holder and one waiting backup, over a window
    let j3 = format!("s6-{id}-3");
    let short = Duration::from_millis(300);
    let keep = FailoverConfig::builder(&j3)
        .lease(short)
        .retention(RETENTION)
        .watchdog(true)
        .build()
        .expect("config");
    let mut h3 = a.failover().start(keep);
    let Event::Acquired(att3) = next_real(&mut h3).await else {
        panic!("holder 3")
    };
    let mut b3 = b.failover().start(cfg(&j3, short));
    assert!(matches!(next_real(&mut b3).await, Event::Locked { .. }));
    // Steady state: the holder's first extension (redis-rs' `EVALSHA`, `NOSCRIPT`, `SCRIPT
    // LOAD`, `EVALSHA` on a server that never saw the script) and the backup's first re-check
    // are behind us.
    tokio::time::sleep(short).await;
    let (mut steady, ()) = phase(&mut adm, &mon, async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    })
    .await;
    steady.per_extension = Some(steady.extension_costs());
    att3.done().await.expect("done 3");
    drop((h3, b3));
    mon.stop();

    phases.push(("grant (uncontended acquire)".into(), grant, Some(fgrant)));
    phases.push(("done".into(), done, Some(fdone)));
    phases.push(("backup starts, waits (Locked)".into(), wait, Some(fwait)));
    phases.push(("fail() → backup takes over".into(), hand, Some(fhand)));
    phases.push((
        "1.5 s: keepalive holder (lease 300 ms, one EVALSHA per extension) + waiting backup".into(),
        steady,
        None,
    ));
    for (name, bt, fl) in phases {
        // Same round trips, the same pipelines, and the same commands run on the server.
        let same = fl
            .as_ref()
            .map(|f| f.reads == bt.reads && f.multiset() == bt.multiset() && f.server == bt.server);
        report.round_trips.push(json!({
            "phase": name,
            "baton": bt.to_json(),
            "floor": fl.as_ref().map(PhaseCount::to_json),
            "same": same,
        }));
    }
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}

fn rand_suffix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

/// The round-trip section printed after the main table.
pub fn round_trip_table(rows: &[Value]) -> String {
    let mut out = String::from(
        "round trips per transition (server reads; MONITOR pipelines per connection; commands \
         sent, and run on the server when scripts add inner calls)\n",
    );
    let side = |s: &Value| {
        let inner = s["script_inner_commands"].as_u64().unwrap_or(0);
        format!(
            "{} round trips ({} from MONITOR) / {} commands{}",
            s["round_trips"],
            s["round_trips_from_monitor"],
            s["commands"],
            if inner > 0 {
                format!(" sent, {} run on the server", s["server_commands"])
            } else {
                String::new()
            }
        )
    };
    for r in rows {
        let b = &r["baton"];
        let f = &r["floor"];
        out.push_str(&format!(
            "- {}: baton {}; floor {}; {}\n",
            r["phase"].as_str().unwrap_or("?"),
            side(b),
            if f.is_null() {
                "-".to_string()
            } else {
                side(f)
            },
            match r["same"].as_bool() {
                Some(true) => "same",
                Some(false) => "DIFFER",
                None => "no floor",
            }
        ));
        let e = &b["per_extension"];
        if !e.is_null() {
            out.push_str(&format!(
                "    baton per lease extension ({} in the window): {} round trip, {} command sent \
                 (EVALSHA), {} run on the server (INFO commandstats: EVALSHA and the script's \
                 inner calls; MONITOR saw {} inner calls per extension)\n",
                e["extensions"],
                e["round_trips"],
                e["client_sent_commands"],
                e["server_side_commands"],
                e["script_inner_commands_from_monitor"],
            ));
        }
        for side in ["baton", "floor"] {
            let Some(conns) = r[side]["connections"].as_array() else {
                continue;
            };
            for c in conns {
                let pipes = c["pipelines"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("[{k}]×{v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                out.push_str(&format!(
                    "    {side} {}: {pipes}\n",
                    c["connection"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    out
}
