//! The mutex's acceptance count on every Redis topology: 16 tasks × 200 read-sleep-write
//! increments of a plain Redis counter under the mutex, exact. A binary of its own because it is
//! the mutex's slowest scenario (3 200 handoffs of one key per topology): it runs beside the rest
//! of `tests/mutex.rs` instead of after it. On PostgreSQL, `tests/mutex_pg.rs` counts the same
//! on a row (`sixteen_tasks_increment_a_row_exactly`).

mod common;

use std::time::Duration;

use baton::AcquireOptions;
use common::{client, get, raw, server};

/// A tiny xorshift, for sleeps of 0–1 ms without a rand dependency.
fn next_rand(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sixteen_tasks_increment_a_plain_counter_exactly() {
        let server = server();
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        for t in 0..16u64 {
            // Four clients with four tasks each: contention inside one client and across clients.
            let c = client(&server).await;
            let mut plain = raw(&server).await;
            tasks.push(tokio::spawn(async move {
                let locks = c.locks();
                let opts = AcquireOptions::default();
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                for _ in 0..200 {
                    let guard = locks
                        .acquire("counter", Duration::from_secs(5), &opts)
                        .await
                        .expect("acquire");
                    let v: i64 = get(&mut plain, "counter")
                        .await
                        .map_or(0, |v| v.parse().unwrap());
                    tokio::time::sleep(Duration::from_micros(next_rand(&mut rng) % 1000)).await;
                    let _: () = redis::cmd("SET")
                        .arg("counter")
                        .arg(v + 1)
                        .query_async(&mut plain)
                        .await
                        .unwrap();
                    assert!(
                        guard.release().await.expect("release"),
                        "released our own lock"
                    );
                }
                c
            }));
        }
        let mut clients = Vec::new();
        for t in tasks {
            clients.push(t.await.unwrap());
        }
        let mut conn = raw(&server).await;
        assert_eq!(get(&mut conn, "counter").await.as_deref(), Some("3200"));
        eprintln!("3200 increments under the mutex in {:?}", started.elapsed());
    }
}
