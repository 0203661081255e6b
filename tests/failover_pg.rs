//! The failover coordinator on PostgreSQL (feature `postgres`): the same workers, events and
//! guarantees as on Redis, on one private server shared by this binary
//! (`baton::testing::PgServer::shared`), each test on its own job names.
#![cfg(all(feature = "postgres", feature = "testing"))]

use std::time::Duration;

use baton::testing::PgServer;
use baton::{Client, Event, FailoverConfig};
use tokio::time::Instant;

const WAKE: Duration = Duration::from_secs(5);

fn pg() -> &'static PgServer {
    PgServer::shared().expect("start PostgreSQL (install it: apt-get install postgresql)")
}

async fn client() -> Client {
    Client::connect(pg().url())
        .await
        .expect("connect to PostgreSQL")
}

fn job(key: &str) -> FailoverConfig {
    FailoverConfig::builder(key)
        .lock_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn next(w: &mut baton::Worker, within: Duration) -> Event {
    tokio::time::timeout(within, w.next_event())
        .await
        .expect("no event in time")
        .expect("stream ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_acquires_backups_are_locked_and_done_ends_them_all() {
    let client = client().await;
    let mut a = client.start(job("pg:first"));
    let got = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(got.attempt, 1);
    let mut b = client.start(job("pg:first"));
    assert!(
        matches!(next(&mut b, WAKE).await, Event::Locked { attempt: 1, .. }),
        "the backup should be locked"
    );
    let t0 = Instant::now();
    got.done().await.unwrap();
    assert!(matches!(
        next(&mut a, WAKE).await,
        Event::Completed { attempt: Some(1) }
    ));
    assert!(matches!(
        next(&mut b, WAKE).await,
        Event::Completed { attempt: None }
    ));
    assert!(t0.elapsed() < WAKE, "the backup waited out the lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_hands_over_at_once_and_fencing_tokens_increase() {
    let client = client().await;
    let mut a = client.start(job("pg:fail"));
    let first = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let mut b = client.start(job("pg:fail"));
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    let fence1 = first.fencing_token;
    let t0 = Instant::now();
    first.fail("no").await.unwrap();
    let second = match next(&mut b, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert!(t0.elapsed() < WAKE, "the takeover waited out the lease");
    assert_eq!(second.attempt, 2);
    assert!(second.fencing_token > fence1);
    second.done().await.unwrap();
}
