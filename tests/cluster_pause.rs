//! A primary that hangs instead of dying (`SIGSTOP`): once its replica is promoted, every kind
//! of waiter in one process moves on to the new primary, within 10 s. A paused node keeps its
//! connections open and answers nothing, so nothing but a timeout tells a client it is gone;
//! the client must route around it as it does around a dead one. Each test has its own cluster
//! or Sentinel set (destructive).
#![cfg(all(feature = "testing", feature = "cluster", feature = "sentinel"))]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use baton::testing::{RedisCluster, RedisSentinel};
use baton::{AcquireOptions, Client, ElectionOptions, Event, FailoverConfig, Worker};
use common::{TEST_PASSWORD, TEST_USER};
use tokio_stream::StreamExt;

/// The job, the lock and the election share this name, hence one hash tag, one slot and one
/// primary on a cluster.
const NAME: &str = "paused";

/// How long each waiter may take to move on once the replica is promoted (node timeout 1 s).
const PROCEED: Duration = Duration::from_secs(10);

/// The first `Acquired` of `w`, within 20 s.
async fn acquired(w: &mut Worker) -> baton::Acquired {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Acquired(a))) => return a,
            Ok(Some(_)) => {}
            other => panic!("no Acquired within 20 s: {other:?}"),
        }
    }
}

/// Waits for `w`'s first `Locked` (it waits as a backup), within 20 s.
async fn locked(w: &mut Worker) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Locked { .. })) => return,
            Ok(Some(Event::Acquired(a))) => panic!("the backup acquired {}", a.attempt),
            Ok(Some(_)) => {}
            other => panic!("no Locked within 20 s: {other:?}"),
        }
    }
}

/// `fut`, or a panic naming `what` if it is not ready by `deadline`.
async fn by<T>(deadline: Instant, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout_at(deadline.into(), fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {PROCEED:?} of the promotion"),
    }
}

/// Holds the job (keepalive), the lock and the leadership on `client`, with a backup, a lock
/// waiter and a standby elector waiting; `pause` freezes the primary and returns once its
/// replica was promoted; then each waiter must move on within [`PROCEED`].
/// `pause`'s output (the deployment) is kept until the end.
async fn hangs_then_everyone_proceeds<P, F, K>(client: Client, pause: P)
where
    P: FnOnce() -> F,
    F: Future<Output = K>,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let job = || {
        FailoverConfig::builder(NAME)
            .lease(Duration::from_secs(10))
            .watchdog(true)
            .build()
            .unwrap()
    };
    let mut holder = client.failover().start(job());
    let attempt = acquired(&mut holder).await;
    let mut backup = client.failover().start(job());
    locked(&mut backup).await;

    let locks = client.locks();
    let ttl = Duration::from_secs(10);
    let guard = locks
        .acquire(NAME, ttl, &AcquireOptions::default())
        .await
        .expect("the lock");
    let waiting = {
        let locks = locks.clone();
        let opts = AcquireOptions::builder()
            .wait(Duration::from_secs(60))
            .build()
            .unwrap();
        tokio::spawn(async move { locks.acquire(NAME, ttl, &opts).await })
    };

    let leaders = client.leaders();
    let opts = ElectionOptions::builder()
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let leader = leaders.elector(NAME, &opts).unwrap();
    leader.campaign().await.expect("the first term");
    let standby = leaders.elector(NAME, &opts).unwrap();
    let campaigning = tokio::spawn(async move {
        let term = standby.campaign().await;
        (standby, term)
    });
    // Everyone is in place (the waiters have made their first request).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished() && !campaigning.is_finished());

    let _deployment = pause().await;
    let promoted = Instant::now();
    let deadline = promoted + PROCEED;

    // The holder's attempt survived (its keepalive reached the new primary, or had no need
    // to yet) and its outcome is recorded there; the backup learns of it.
    by(deadline, "the holder's done()", attempt.done())
        .await
        .expect("done() on the promoted replica");
    by(deadline, "the backup seeing DONE", async {
        loop {
            match backup.next().await {
                Some(Event::Completed { .. }) => break,
                Some(Event::Acquired(a)) => panic!("the backup acquired {}", a.attempt),
                Some(_) => {}
                None => panic!("the backup's stream ended before DONE"),
            }
        }
    })
    .await;
    eprintln!(
        "the job moved on {:?} after the promotion",
        promoted.elapsed()
    );

    assert!(
        by(deadline, "releasing the lock", guard.release())
            .await
            .expect("release on the promoted replica"),
        "the lock was still ours"
    );
    let second = by(deadline, "the lock waiter", waiting)
        .await
        .unwrap()
        .expect("the waiter's acquire");
    eprintln!(
        "the lock moved on {:?} after the promotion",
        promoted.elapsed()
    );
    drop(second);

    assert!(
        by(deadline, "resigning", leader.resign())
            .await
            .expect("resign on the promoted replica"),
        "the first term was still ours"
    );
    let (standby, term) = by(deadline, "the standby's campaign", campaigning)
        .await
        .unwrap();
    term.expect("the standby's term");
    assert!(standby.is_leader());
    eprintln!(
        "the election moved on {:?} after the promotion",
        promoted.elapsed()
    );
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_primary_is_routed_around_once_its_replica_is_promoted() {
    let mut cluster = tokio::task::spawn_blocking(|| {
        RedisCluster::builder()
            .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
            .start()
            .expect("start a cluster")
    })
    .await
    .unwrap();
    let client = Client::connect(cluster.cluster_url_for(TEST_USER, TEST_PASSWORD))
        .await
        .expect("connect to the cluster");
    let owner = cluster.node_for_key(NAME.as_bytes()).expect("an owner");
    let owner_url = cluster.nodes()[owner].url();
    let pause = move || async move {
        // Every grant so far is on the replica before the primary freezes (replication is
        // asynchronous; losing a write is another matter than routing).
        wait_replicated(&owner_url).await;
        cluster.nodes()[owner].pause().expect("pause the primary");
        let paused = Instant::now();
        let deadline = paused + Duration::from_secs(30);
        tokio::task::block_in_place(|| loop {
            cluster.refresh_roles().expect("roles");
            match cluster.node_for_key(NAME.as_bytes()) {
                Some(n) if n != owner => break,
                _ => {}
            }
            assert!(Instant::now() < deadline, "no promotion within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        });
        eprintln!(
            "the replica was promoted {:?} after the pause",
            paused.elapsed()
        );
        cluster
    };
    hangs_then_everyone_proceeds(client, pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sentinel_primary_is_routed_around_once_the_sentinels_promote_a_replica() {
    let set = tokio::task::spawn_blocking(|| {
        RedisSentinel::builder()
            .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
            .start()
            .expect("start a Sentinel set")
    })
    .await
    .unwrap();
    let client = Client::connect(format!(
        "redis+sentinel://{TEST_USER}:{TEST_PASSWORD}@{}/{}",
        set.sentinel_addrs().join(","),
        set.service()
    ))
    .await
    .expect("connect through the Sentinels");
    let pause = move || async move {
        let old = set.primary_addr().expect("the primary");
        let primary = set.primary().expect("the primary");
        wait_replicated(&primary.url()).await;
        primary.pause().expect("pause the primary");
        let paused = Instant::now();
        let deadline = paused + Duration::from_secs(30);
        tokio::task::block_in_place(|| loop {
            if set.primary_addr().is_ok_and(|a| a != old) {
                break;
            }
            assert!(Instant::now() < deadline, "no promotion within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        });
        eprintln!(
            "the replica was promoted {:?} after the pause",
            paused.elapsed()
        );
        set
    };
    hangs_then_everyone_proceeds(client, pause).await;
}

/// `WAIT` on the node at `url` until every replica has everything written so far.
async fn wait_replicated(url: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let replicas: i64 = redis::cmd("INFO")
        .arg("replication")
        .query_async::<String>(&mut conn)
        .await
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(acked, replicas, "every replica has the grants");
}
