//! Scenario `status-listing`: the operator's listing (`Inspector::list`, what `baton status`
//! prints) over N jobs (10 000 in a full run) plus N/100 locks and N/200 leaders, on one
//! server and on a 6-node Redis Cluster (feature `cluster`): wall time of the whole listing,
//! entries per second, and the resident set it adds to this process (sampled during the
//! listing: the peak of `VmRSS` over its start). Bounded memory shows as an RSS increase that
//! does not grow with N. Nothing is asserted but that every entry was listed once.

use std::time::{Duration, Instant};

use baton::{Client, ElectionOptions, FailoverConfig};
use serde_json::json;

use crate::harness::Report;
use crate::Opts;

/// Jobs in a full run; a quick run (CI's smoke) lists a few hundred.
const FULL_JOBS: usize = 10_000;
const QUICK_JOBS: usize = 300;
/// Requests in flight while filling the server.
const IN_FLIGHT: usize = 64;

pub async fn listing(opts: &Opts, report: &mut Report) {
    let jobs = if opts.quick { QUICK_JOBS } else { FULL_JOBS };
    let server = crate::start_server();
    let single = measure("single server", &server.url(), jobs).await;
    #[cfg(feature = "cluster")]
    let cluster = {
        let cluster = tokio::task::spawn_blocking(|| {
            baton::testing::RedisCluster::start().expect("start a 6-node cluster")
        })
        .await
        .expect("cluster fixture");
        measure("6-node cluster", &cluster.cluster_url(), jobs).await
    };
    #[cfg(not(feature = "cluster"))]
    let cluster = {
        eprintln!("status-listing: the cluster half needs the `cluster` feature; skipped");
        serde_json::Value::Null
    };
    report.idle["status_listing"] = json!({ "single": single, "cluster": cluster });
}

/// Fills `url` with `jobs` done jobs, locks and leaders, then lists them all once.
async fn measure(what: &str, url: &str, jobs: usize) -> serde_json::Value {
    let client = Client::connect(url).await.expect("baton connects");
    let (locks, leaders) = (jobs / 100, jobs / 200);
    let t0 = Instant::now();
    // Held while listed: dropped at the end of this function.
    let _held = fill(&client, jobs, locks, leaders).await;
    let fill_s = t0.elapsed().as_secs_f64();

    let rss_before = rss_kb();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kb(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let t0 = Instant::now();
    let mut listing = client.inspect().list(None);
    let (mut listed, mut batches) = (0usize, 0usize);
    while let Some(batch) = listing.next_batch().await.expect("a batch") {
        listed += batch.len();
        batches += 1;
        peak.fetch_max(rss_kb(), std::sync::atomic::Ordering::Relaxed);
    }
    let secs = t0.elapsed().as_secs_f64();
    sampler.abort();
    let rss_peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let expected = jobs + locks + leaders;
    assert_eq!(listed, expected, "{what}: every entry listed once");
    let added_mb = rss_peak.saturating_sub(rss_before) as f64 / 1024.0;
    eprintln!(
        "status-listing, {what}: {listed} entries ({jobs} jobs, {locks} locks, {leaders} \
         leaders) in {secs:.2} s ({:.0} entries/s, {batches} batches); RSS {:.1} MB before, \
         peak +{added_mb:.1} MB while listing (filled in {fill_s:.1} s)",
        listed as f64 / secs,
        rss_before as f64 / 1024.0,
    );
    client.shutdown(Duration::from_secs(5)).await;
    json!({
        "entries": listed,
        "jobs": jobs,
        "locks": locks,
        "leaders": leaders,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "entries_per_second": (listed as f64 / secs).round(),
        "batches": batches,
        "rss_mb_before": rss_before as f64 / 1024.0,
        "rss_mb_added_peak": (added_mb * 10.0).round() / 10.0,
    })
}

/// `jobs` jobs run to `DONE`, `locks` held locks and `leaders` elected leaders, through baton
/// itself (so a cluster's keys land on their primaries), `IN_FLIGHT` at a time.
async fn fill(client: &Client, jobs: usize, locks: usize, leaders: usize) -> Held {
    let id = crate::run_id();
    let mut set = tokio::task::JoinSet::new();
    let mut guards = Vec::new();
    for i in 0..jobs {
        let failover = client.failover();
        let job = FailoverConfig::builder(format!("list-{id}-{i}"))
            .retention(Duration::from_secs(600))
            .build()
            .expect("job");
        set.spawn(async move {
            failover
                .run(job, |_| async { Ok::<(), std::io::Error>(()) })
                .await
                .expect("run");
        });
        if set.len() >= IN_FLIGHT {
            set.join_next().await;
        }
    }
    while set.join_next().await.is_some() {}
    for i in 0..locks {
        guards.push(
            client
                .locks()
                .try_acquire(&format!("lock-{id}-{i}"), Duration::from_secs(600))
                .await
                .expect("lock")
                .expect("free"),
        );
    }
    let opts = ElectionOptions::builder()
        .lease(Duration::from_secs(600))
        .build()
        .expect("options");
    let mut electors = Vec::new();
    for i in 0..leaders {
        let elector = client
            .leaders()
            .elector(&format!("leader-{id}-{i}"), &opts)
            .expect("elector");
        let term = elector.campaign().await.expect("lead");
        electors.push((elector, term));
    }
    (guards, electors)
}

/// What [`fill`] holds: locks and leaders stay held while they are listed (their drops
/// release them).
type Held = (Vec<baton::LockGuard>, Vec<(baton::Elector, baton::Term)>);

fn rss_kb() -> u64 {
    crate::harness::rss_kb("self")
}
