//! Replica acknowledgement (`replica_ack`): `WAIT` after each grant and `DONE` of a job and
//! after each lock acquisition, on a Sentinel set's primary with two replicas.
#![cfg(all(feature = "testing", feature = "sentinel"))]

mod common;

use std::time::Duration;

use baton::testing::RedisSentinel;
use baton::{AcquireOptions, Client, ErrorKind, Event, FailoverConfig};
use common::{TEST_PASSWORD, TEST_USER};
use tokio_stream::StreamExt;

async fn sentinel_set() -> RedisSentinel {
    tokio::task::spawn_blocking(|| {
        RedisSentinel::builder()
            .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
            .start()
            .expect("start a Sentinel set")
    })
    .await
    .expect("fixture thread")
}

/// A least-privilege client on the set's primary, found through the Sentinels.
async fn client(set: &RedisSentinel) -> Client {
    let url = set
        .url()
        .replacen("://", &format!("://{TEST_USER}:{TEST_PASSWORD}@"), 1);
    Client::connect(url)
        .await
        .expect("connect through the Sentinels")
}

fn job(key: &str, replicas: u32, max_attempts: u64) -> FailoverConfig {
    FailoverConfig::builder(key)
        .lease(Duration::from_secs(10))
        .max_attempts(max_attempts)
        .replica_ack(replicas, Duration::from_millis(300))
        .build()
        .unwrap()
}

async fn admin(url: String) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_and_done_both_replicas_confirmed_are_handed_out_as_usual() {
    let set = sentinel_set().await;
    let c = client(&set).await;
    let mut w = c.failover().start(job("acked", 2, 3));
    let mut events = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream ends with a terminal event");
        match ev {
            Event::Acquired(a) => {
                assert_eq!(a.attempt, 1);
                a.done().await.expect("done, acknowledged by both replicas");
            }
            Event::Status { .. } | Event::Reachable { .. } => {}
            other => {
                let end = other.is_terminal();
                events.push(other);
                if end {
                    break;
                }
            }
        }
    }
    assert!(
        matches!(events.as_slice(), [Event::Completed { attempt: Some(1) }]),
        "{events:?}"
    );
    let mut conn = admin(set.primary().unwrap().url()).await;
    let state: Option<String> = redis::cmd("GET")
        .arg("baton:{acked}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("DONE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_fewer_replicas_confirmed_is_never_handed_out_and_the_job_ends_exhausted() {
    let set = sentinel_set().await;
    let c = client(&set).await;
    // Three replicas asked for, two exist: no grant can ever be confirmed.
    let mut w = c.failover().start(job("short", 3, 2));
    let mut not_replicated = 0;
    let end = loop {
        let ev = tokio::time::timeout(Duration::from_secs(20), w.next())
            .await
            .expect("an event within 20 s")
            .expect("the stream ends with a terminal event");
        match ev {
            Event::Acquired(a) => panic!("attempt {} was handed out unconfirmed", a.attempt),
            Event::Error {
                kind: ErrorKind::NotReplicated,
                message,
                ..
            } => {
                assert!(message.contains("only 2 of 3 replicas"), "{message}");
                not_replicated += 1;
            }
            ev if ev.is_terminal() => break ev,
            _ => {}
        }
    };
    assert!(
        matches!(end, Event::Exhausted { attempts: Some(2) }),
        "{end:?}"
    );
    assert_eq!(not_replicated, 2, "one report per released attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_no_replica_confirmed_is_reported_though_the_job_completes() {
    let set = sentinel_set().await;
    let c = client(&set).await;
    let mut w = c.failover().start(job("lonely", 1, 3));
    let acquired = loop {
        match tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("an event within 10 s")
            .expect("open stream")
        {
            Event::Acquired(a) => break a,
            Event::Status { .. } | Event::Reachable { .. } => {}
            other => panic!("before the grant: {other:?}"),
        }
    };
    // Both replicas stop acknowledging (paused: the primary stays up, so `DONE` is written
    // there, and no replica can acknowledge it).
    let primary = set.primary_index().unwrap();
    let replicas: Vec<usize> = (0..set.nodes().len()).filter(|&i| i != primary).collect();
    for &i in &replicas {
        set.nodes()[i].pause().unwrap();
    }
    let err = acquired
        .done()
        .await
        .expect_err("DONE no replica acknowledged is not reported as safe");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(err.to_string().contains("DONE"), "{err}");
    let mut rest = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        if !matches!(ev, Event::Status { .. }) {
            rest.push(ev);
        }
    }
    assert!(
        matches!(
            rest.as_slice(),
            [
                Event::Error {
                    kind: ErrorKind::NotReplicated,
                    ..
                },
                Event::Completed { attempt: Some(1) }
            ]
        ),
        "{rest:?}"
    );
    for &i in &replicas {
        set.nodes()[i].resume().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_fewer_replicas_confirmed_is_released_and_refused() {
    let set = sentinel_set().await;
    let c = client(&set).await;
    let locks = c.locks();
    let ttl = Duration::from_secs(10);
    let ok = AcquireOptions::builder()
        .replica_ack(2, Duration::from_millis(300))
        .build()
        .unwrap();
    let g = locks
        .acquire("acked", ttl, &ok)
        .await
        .expect("acknowledged");
    assert!(g.release().await.unwrap());
    let short = AcquireOptions::builder()
        .replica_ack(3, Duration::from_millis(200))
        .max_tries(1)
        .build()
        .unwrap();
    let err = locks
        .acquire("short", ttl, &short)
        .await
        .expect_err("a grant two of three replicas confirmed is refused");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    // Released by token in the background: the lock is free again at once, not after its ttl.
    let mut conn = admin(set.primary().unwrap().url()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let held: Option<String> = redis::cmd("GET")
            .arg("baton:lock:{short}")
            .query_async(&mut conn)
            .await
            .unwrap();
        if held.is_none() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the unconfirmed lock was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A timeout above half the ttl is refused before anything is sent.
    let long = AcquireOptions::builder()
        .replica_ack(1, Duration::from_secs(6))
        .build()
        .unwrap();
    let err = locks.acquire("x", ttl, &long).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}
