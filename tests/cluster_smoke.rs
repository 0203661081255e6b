//! Cluster routing smoke test.
#![cfg(all(feature = "testing", feature = "cluster"))]

use baton::prelude::*;
use std::time::Duration;

use baton::testing::RedisCluster;
use baton::{Client, Event, FailoverConfig};
use tokio_stream::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_locks_run_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| {
        RedisCluster::builder()
            .acl_user("baton-test", "test-pw", "baton:")
            .start()
            .expect("cluster")
    })
    .await
    .unwrap();
    // The least-privilege user: the sharded pub/sub (RESP3, HELLO) and CLUSTER SLOTS included.
    let url = cluster.cluster_url_for("baton-test", "test-pw");
    eprintln!("{url}");
    let client = Client::connect(url).await.expect("connect");
    for i in 0..6 {
        let key = format!("job-{i}");
        let mut w = client.failover().start(
            FailoverConfig::builder(&key)
                .lease(Duration::from_secs(10))
                .build()
                .unwrap(),
        );
        let mut acquired = None;
        while let Some(ev) = w.next().await {
            eprintln!("{key}: {ev:?}");
            if let Event::Acquired(a) = ev {
                acquired = Some(a);
                break;
            }
        }
        acquired.expect("acquired").done().await.expect("done");
    }
    let locks = client.locks();
    let ttl = Duration::from_secs(30);
    let g = locks
        .acquire("L", ttl, &Default::default())
        .await
        .expect("lock");
    let l2 = locks.clone();
    // A long backoff cap: only the release's SPUBLISH can wake the waiter in time.
    let opts = baton::AcquireOptions::builder()
        .max_backoff(Duration::from_secs(20))
        .build()
        .unwrap();
    let waiter =
        tokio::spawn(async move { l2.acquire("L", ttl, &opts).await.map(|g| g.fencing_token()) });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t1 = g.fencing_token();
    let started = std::time::Instant::now();
    assert!(g.release().await.unwrap());
    let t2 = waiter.await.unwrap().expect("second acquire");
    let woken = started.elapsed();
    assert!(
        woken < Duration::from_secs(5),
        "woken after {woken:?}, not by the release"
    );
    assert!(t2 > t1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_survives_a_sentinel_failover() {
    let mut set =
        tokio::task::spawn_blocking(|| baton::testing::RedisSentinel::start().expect("sentinel"))
            .await
            .unwrap();
    let client = Client::connect(set.url()).await.expect("connect");
    let cfg = |k: &str| {
        FailoverConfig::builder(k)
            .lease(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let mut w = client.failover().start(cfg("before"));
    loop {
        if let Some(Event::Acquired(a)) = w.next().await {
            a.done().await.expect("done");
            break;
        }
    }
    let primary = set.primary_index().unwrap();
    let old = set.primary_addr().unwrap();
    set.nodes_mut()[primary].kill();
    let started = std::time::Instant::now();
    let mut w = client.failover().start(cfg("after"));
    let mut n = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
            Ok(Some(Event::Acquired(a))) => {
                a.done().await.expect("done after failover");
                break;
            }
            Ok(Some(ev)) => {
                n += 1;
                eprintln!("{:?} {ev:?}", started.elapsed());
            }
            other => panic!("{other:?}"),
        }
    }
    eprintln!(
        "done after failover in {:?} ({n} events), old {old}, new {:?}",
        started.elapsed(),
        set.primary_addr()
    );
}
