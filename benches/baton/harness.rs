//! The harness every scenario file shares: the report they fill, the clients they connect
//! (baton with its shipped defaults, an admin connection), the failover job and worker helpers,
//! a closed-loop driver, and the process measurements (RSS, heap, counts). A leaf: it calls no
//! scenario; `scenarios.rs` (the dispatcher) calls them all.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::{Client, Event, FailoverConfig};
use redis::aio::MultiplexedConnection;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::floor::{self, Floor};
use crate::redisinfo::CommandStats;
use crate::stats::{Row, Samples};

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub round_trips: Vec<Value>,
    pub idle: Value,
    pub profile: Value,
    /// Scenario `cluster`: the per-node split (see `cluster.rs`).
    pub cluster: Value,
}

pub(crate) const RETENTION: Duration = Duration::from_secs(120);
/// The pooled floor's pool size: baton's default `pool_size` when the floor was written (the
/// benchmark runs baton with its defaults; `meta.baton_pool_size` says what they are now).
pub const POOL: usize = 8;

pub(crate) fn cfg(job: &str, lease: Duration) -> FailoverConfig {
    FailoverConfig::builder(job)
        .lease(lease)
        .retention(RETENTION)
        .worker_name(format!("bench-baton:{}", std::process::id()))
        .build()
        .expect("a valid config")
}

pub(crate) fn floor_job(job: &str, lease: Duration) -> floor::Job {
    floor::Job {
        keys: floor::Keys::new("floor:", job),
        lease_ms: lease.as_millis() as u64,
        retention_ms: RETENTION.as_millis() as u64,
    }
}

/// A baton client with its shipped defaults (pool size included: no bench-only settings).
pub(crate) async fn connect(url: &str) -> Client {
    Client::builder(url)
        .connect()
        .await
        .expect("baton connects")
}

pub(crate) async fn admin(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// Runs one baton worker to its terminal event, calling `done()` as soon as it acquires.
async fn baton_worker(client: Client, cfg: FailoverConfig) -> &'static str {
    let mut w = client.failover().start(cfg);
    while let Some(ev) = w.next_event().await {
        match ev {
            Event::Acquired(a) => a.done().await.expect("done() of an uncontended attempt"),
            ev if ev.is_terminal() => return ev.name(),
            _ => {}
        }
    }
    "closed"
}

/// One job with `workers` baton workers started at once; the time until every one ended.
pub(crate) async fn baton_job(client: Client, cfg: FailoverConfig, workers: usize) -> Duration {
    let t0 = Instant::now();
    if workers == 1 {
        let end = baton_worker(client, cfg).await;
        assert_eq!(end, "Completed", "a lone worker completes its job");
    } else {
        let hs: Vec<_> = (0..workers)
            .map(|_| tokio::spawn(baton_worker(client.clone(), cfg.clone())))
            .collect();
        for h in hs {
            assert_eq!(h.await.expect("worker task"), "Completed");
        }
    }
    t0.elapsed()
}

/// The same job on the floor.
pub(crate) async fn floor_job_run(f: Arc<Floor>, job: floor::Job, workers: usize) -> Duration {
    let (tx, _rx) = mpsc::unbounded_channel();
    let t0 = Instant::now();
    if workers == 1 {
        f.worker(&job, &tx, None).await.expect("floor worker");
    } else {
        let hs: Vec<_> = (0..workers)
            .map(|_| {
                let (f, job, tx) = (f.clone(), job.clone(), tx.clone());
                tokio::spawn(async move { f.worker(&job, &tx, None).await })
            })
            .collect();
        for h in hs {
            h.await.expect("floor task").expect("floor worker");
        }
    }
    t0.elapsed()
}

/// `conc` tasks each running `per_task` jobs one after the other: samples and wall time.
pub(crate) async fn closed_loop<F, Fut>(conc: usize, per_task: usize, job: F) -> (Samples, Duration)
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Duration> + Send + 'static,
{
    let t0 = Instant::now();
    let hs: Vec<_> = (0..conc)
        .map(|t| {
            let job = job.clone();
            tokio::spawn(async move {
                let mut s = Samples::default();
                for j in 0..per_task {
                    s.push(job(t * per_task + j).await);
                }
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for h in hs {
        all.extend(h.await.expect("load task"));
    }
    (all, t0.elapsed())
}

/// Waits (bounded) until no channel has a subscriber: unsubscribes are sent after a worker
/// ends, so without this they would be counted in the next run's commands.
pub(crate) async fn drain_pubsub(adm: &mut MultiplexedConnection) {
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

/// The bench's own commands (`INFO`, and `drain_pubsub`'s `PUBSUB CHANNELS`), left out of the
/// counts.
pub(crate) fn own(cmd: &str) -> bool {
    cmd == "info" || cmd == "pubsub|channels"
}

/// Commands per operation from a commandstats delta (the bench's own commands left out).
pub(crate) fn commands(d: &CommandStats) -> u64 {
    d.iter().filter(|(k, _)| !own(k)).map(|(_, v)| v).sum()
}

/// The resident set in kB (`VmRSS`) of `/proc/{proc}` (`"self"` or a PID).
pub(crate) fn rss_kb(proc: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{proc}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes the allocator has handed out and not had back (glibc's `mallinfo2`: `uordblks` plus
/// `hblkhd`, the mmapped blocks); `None` on other C libraries. Set against RSS it tells the live
/// heap from what the allocator keeps after a peak.
pub(crate) fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[repr(C)]
        struct Mallinfo2 {
            arena: usize,
            ordblks: usize,
            smblks: usize,
            hblks: usize,
            hblkhd: usize,
            usmblks: usize,
            fsmblks: usize,
            uordblks: usize,
            fordblks: usize,
            keepcost: usize,
        }
        extern "C" {
            fn mallinfo2() -> Mallinfo2;
        }
        // SAFETY: glibc ≥ 2.33 exports `mallinfo2`, which takes no argument and returns the
        // struct above by value; it only reads the allocator's statistics.
        let m = unsafe { mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

pub(crate) async fn wait_count(what: &str, c: &AtomicUsize, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while c.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} within {limit:?}",
            c.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One worker of scenario 5 (a keepalive holder or a waiting backup) with a task that reads its
/// events, as an application would: `ok` counts its `Acquired` or `Locked`, `unexpected` a stream
/// that ended. The task keeps the holder's attempt handle until `stop` turns true, and returns
/// the worker (dropped by whoever awaits it, after the client's shutdown).
pub(crate) fn spawn_idle_worker(
    client: &Client,
    job: &str,
    lease: Duration,
    watchdog: bool,
    stop: &tokio::sync::watch::Receiver<bool>,
    ok: Arc<AtomicUsize>,
    unexpected: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<baton::Worker> {
    let c = FailoverConfig::builder(job)
        .lease(lease)
        .retention(RETENTION)
        .watchdog(watchdog)
        .build()
        .expect("config");
    let mut w = client.failover().start(c);
    let mut stop = stop.clone();
    tokio::spawn(async move {
        let mut keep = None;
        loop {
            tokio::select! {
                ev = w.next_event() => match ev {
                    Some(Event::Acquired(a)) => { keep = Some(a); ok.fetch_add(1, Ordering::Relaxed); }
                    Some(Event::Locked { .. }) => { ok.fetch_add(1, Ordering::Relaxed); }
                    Some(ev) if ev.is_terminal() => { unexpected.fetch_add(1, Ordering::Relaxed); break; }
                    Some(_) => {}
                    None => break,
                },
                _ = stop.changed() => break,
            }
        }
        // Keep the handle until the client is shut down, so nothing is released here.
        let _ = stop.wait_for(|s| *s).await;
        drop(keep);
        w
    })
}
