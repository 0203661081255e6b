//! Resharding a job's slot mid-run on a Redis Cluster: the keys move to another primary while
//! workers hold and race for the job. Nothing may be lost, no attempt granted twice, and nothing
//! committed on the node that gave the slot away. Each test has its own cluster (destructive).
#![cfg(all(feature = "testing", feature = "cluster"))]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use baton::testing::cluster::slot;
use baton::testing::RedisCluster;
use baton::{Acquired, Client, Event, FailoverConfig, Worker};
use common::{TEST_PASSWORD, TEST_USER};
use tokio_stream::StreamExt;

const JOB: &str = "moving";

async fn cluster() -> RedisCluster {
    tokio::task::spawn_blocking(|| {
        RedisCluster::builder()
            .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
            .start()
            .expect("start a cluster")
    })
    .await
    .expect("fixture thread")
}

fn config(lease: Duration, replica_ack: bool) -> FailoverConfig {
    let b = FailoverConfig::builder(JOB).lease(lease);
    let b = if replica_ack {
        b.replica_ack(1, Duration::from_secs(2))
    } else {
        b
    };
    b.max_attempts(4).build().unwrap()
}

/// Three workers with a 10 s lease, each with its own client (its own slot map).
async fn workers(c: &RedisCluster) -> Vec<Worker> {
    workers_with(c, Duration::from_secs(10), false).await
}

async fn workers_with(c: &RedisCluster, lease: Duration, replica_ack: bool) -> Vec<Worker> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let client = Client::connect(c.cluster_url_for(TEST_USER, TEST_PASSWORD))
            .await
            .expect("connect to the cluster");
        out.push(client.failover().start(config(lease, replica_ack)));
    }
    out
}

/// The first `Acquired` among `ws`, with the worker's index; other events are kept in `log`.
async fn first_acquired(ws: &mut [Worker], log: &mut Vec<(usize, Event)>) -> (usize, Acquired) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        for (i, w) in ws.iter_mut().enumerate() {
            if let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(20), w.next()).await {
                match ev {
                    Event::Acquired(a) => return (i, a),
                    Event::Status { .. } => {}
                    other => log.push((i, other)),
                }
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody acquired within 20 s: {log:?}"
        );
    }
}

/// Every remaining event of every worker until its stream ends.
async fn drain(ws: &mut [Worker], log: &mut Vec<(usize, Event)>) {
    for (i, w) in ws.iter_mut().enumerate() {
        loop {
            match tokio::time::timeout(Duration::from_secs(20), w.next()).await {
                Ok(Some(Event::Status { .. })) => {}
                Ok(Some(Event::Acquired(a))) => panic!("worker {i} acquired {} late", a.attempt),
                Ok(Some(ev)) => log.push((i, ev)),
                Ok(None) => break,
                Err(_) => panic!("worker {i} did not end: {log:?}"),
            }
        }
    }
}

async fn state_on(c: &RedisCluster, node: usize) -> Option<String> {
    let mut conn = redis::Client::open(c.nodes()[node].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // READONLY-free plain GET on the node itself; a node that does not own the slot answers
    // MOVED, which reads as "not here".
    redis::cmd("GET")
        .arg(format!("baton:{{{JOB}}}"))
        .query_async::<Option<String>>(&mut conn)
        .await
        .ok()
        .flatten()
}

/// Moves the job's slot to another primary; returns `(from, to)`.
async fn reshard(
    mut c: RedisCluster,
    pause_before_finish: Duration,
) -> (RedisCluster, usize, usize) {
    tokio::task::spawn_blocking(move || {
        let s = slot(JOB.as_bytes());
        let owner = c.node_for_key(JOB.as_bytes()).expect("an owner");
        let to = *c
            .primaries()
            .iter()
            .find(|&&p| p != owner)
            .expect("another primary");
        let from = c.begin_slot_migration(s, to).expect("begin");
        assert_eq!(from, owner);
        let moved = c.migrate_slot_keys(s, from, to).expect("migrate keys");
        assert!(moved >= 2, "the job's keys moved ({moved})");
        std::thread::sleep(pause_before_finish);
        c.finish_slot_migration(s, from, to).expect("finish");
        (c, from, to)
    })
    .await
    .expect("reshard thread")
}

fn acquired_attempts(log: &[(usize, Event)], first: u64) -> Vec<u64> {
    let mut out = vec![first];
    for (_, ev) in log {
        if let Event::Acquired(a) = ev {
            out.push(a.attempt);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_while_the_holder_works_then_fails_hands_attempt_2_over_on_the_new_owner() {
    let c = cluster().await;
    let mut ws = workers(&c).await;
    let mut log = Vec::new();
    let (holder, a1) = first_acquired(&mut ws, &mut log).await;
    assert_eq!(a1.attempt, 1);
    let (c, from, to) = reshard(c, Duration::ZERO).await;
    // The holder's fail() meets MOVED on the old owner, refreshes its map and commits on the
    // new one.
    a1.fail("failing on purpose after the reshard")
        .await
        .expect("fail() recorded on the new owner");
    let failed_at = std::time::Instant::now();
    let (next, a2) = first_acquired(&mut ws, &mut log).await;
    // Woken by the `failed` published on the new owner (their subscriptions moved with the
    // slot), not by waiting out the 10 s lease.
    assert!(
        failed_at.elapsed() < Duration::from_secs(5),
        "attempt 2 came {:?} after fail()",
        failed_at.elapsed()
    );
    assert_ne!(next, holder, "a backup takes attempt 2");
    assert_eq!(a2.attempt, 2);
    a2.done().await.expect("done on the new owner");
    drain(&mut ws, &mut log).await;
    let mut ends: HashMap<usize, String> = HashMap::new();
    for (i, ev) in &log {
        if ev.is_terminal() {
            assert!(
                ends.insert(*i, ev.name().to_string()).is_none(),
                "worker {i} ended twice: {log:?}"
            );
        }
    }
    assert_eq!(
        ends.get(&holder).map(String::as_str),
        Some("Failed"),
        "{log:?}"
    );
    assert_eq!(
        ends.get(&next).map(String::as_str),
        Some("Completed"),
        "{log:?}"
    );
    assert_eq!(ends.len(), 3, "every worker ended: {log:?}");
    assert_eq!(state_on(&c, to).await.as_deref(), Some("DONE"));
    assert_eq!(
        state_on(&c, from).await,
        None,
        "nothing left on the old owner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_sent_mid_migration_follows_ask_then_moved_and_is_recorded_once() {
    let c = cluster().await;
    let mut ws = workers(&c).await;
    let mut log = Vec::new();
    let (holder, a1) = first_acquired(&mut ws, &mut log).await;
    // The keys move at once; the slot stays assigned to the old owner (answering ASK) for
    // 600 ms, well inside the 10 s lease, while `done()` keeps trying.
    let resharding = tokio::spawn(reshard(c, Duration::from_millis(600)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    a1.done()
        .await
        .expect("done() recorded once the migration ended, within the lease");
    let (c, from, to) = resharding.await.unwrap();
    drain(&mut ws, &mut log).await;
    assert_eq!(
        acquired_attempts(&log, 1),
        vec![1],
        "one grant only: {log:?}"
    );
    let completed: Vec<usize> = log
        .iter()
        .filter(|(_, ev)| matches!(ev, Event::Completed { .. }))
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        completed.len(),
        3,
        "every worker sees the job done: {log:?}"
    );
    assert!(completed.contains(&holder));
    assert_eq!(state_on(&c, to).await.as_deref(), Some("DONE"));
    assert_eq!(state_on(&c, from).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_jobs_primary_mid_attempt_work_continues_after_the_replica_is_promoted() {
    let mut c = cluster().await;
    // A 20 s lease: the backups must learn of `DONE` from the moved slot map and the
    // re-subscription, not by waiting the lease out. The grant waits for the replica's
    // acknowledgement: without it, the replica promoted after the kill may not have the grant
    // yet (asynchronous replication; a CI run saw `StateLost` when this test merely slept
    // 300 ms), which is the loss docs/operating.md's "What a failover can lose" describes, not routing.
    let mut ws = workers_with(&c, Duration::from_secs(20), true).await;
    let mut log = Vec::new();
    let (holder, a1) = first_acquired(&mut ws, &mut log).await;
    let owner = c.node_for_key(JOB.as_bytes()).expect("an owner");
    c.node_mut(owner).kill();
    let killed_at = std::time::Instant::now();
    // Recorded on the promoted replica. It has no replica of its own now (the killed node is
    // down), so `DONE` itself cannot be acknowledged: `NotReplicated` is the honest answer.
    match a1.done().await {
        Ok(()) => {}
        Err(e) if e.kind() == baton::ErrorKind::NotReplicated => {}
        Err(e) => panic!("done() across the failover: {e}"),
    }
    eprintln!("done {:?} after the kill", killed_at.elapsed());
    let done_at = std::time::Instant::now();
    drain(&mut ws, &mut log).await;
    assert!(
        done_at.elapsed() < Duration::from_secs(5),
        "the backups saw DONE {:?} after it was recorded (lease 20 s)",
        done_at.elapsed()
    );
    assert_eq!(
        acquired_attempts(&log, 1),
        vec![1],
        "one grant only: {log:?}"
    );
    let completed = log
        .iter()
        .filter(|(_, ev)| matches!(ev, Event::Completed { .. }))
        .count();
    assert_eq!(completed, 3, "every worker sees the job done: {log:?}");
    assert!(log
        .iter()
        .any(|(i, ev)| *i == holder && matches!(ev, Event::Completed { attempt: Some(1) })));
    let c = tokio::task::spawn_blocking(move || {
        c.refresh_roles().expect("roles");
        c
    })
    .await
    .unwrap();
    let new_owner = c.node_for_key(JOB.as_bytes()).expect("a promoted owner");
    assert_ne!(new_owner, owner);
    assert_eq!(state_on(&c, new_owner).await.as_deref(), Some("DONE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_released_mid_migration_follows_ask_to_the_importing_node() {
    let mut c = cluster().await;
    let client = Client::connect(c.cluster_url_for(TEST_USER, TEST_PASSWORD))
        .await
        .expect("connect to the cluster");
    let locks = client.locks();
    let guard = locks
        .acquire(JOB, Duration::from_secs(30), &Default::default())
        .await
        .expect("the lock");
    // The lock's keys move to another primary; the slot stays assigned to the old owner, which
    // now answers ASK for them, until the test ends (no MOVED will come to help).
    let (c, from, to) = tokio::task::spawn_blocking(move || {
        c.refresh_roles().expect("roles");
        let key = format!("lock:{{{JOB}}}");
        let s = slot(key.as_bytes());
        let owner = c.node_for_key(key.as_bytes()).expect("an owner");
        let to = *c
            .primaries()
            .iter()
            .find(|&&p| p != owner)
            .expect("another primary");
        let from = c.begin_slot_migration(s, to).expect("begin");
        let moved = c.migrate_slot_keys(s, from, to).expect("migrate keys");
        assert!(moved >= 2, "the lock's keys moved ({moved})");
        (c, from, to)
    })
    .await
    .unwrap();
    // One request, no retry: the release script is refused with ASK by the old owner and runs
    // on the importing node after ASKING (the script is loaded there on the way).
    assert!(
        guard.release().await.expect("released through ASK"),
        "the lock was ours on the importing node"
    );
    let lock_key = format!("baton:lock:{{{JOB}}}");
    let mut conn = redis::Client::open(c.nodes()[to].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let left: i64 = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(&lock_key)
        .query_async::<(i64,)>(&mut conn)
        .await
        .expect("EXISTS on the importing node")
        .0;
    assert_eq!(left, 0, "the lock key is gone from the importing node");
    drop((c, from));
}
