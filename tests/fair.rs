//! The fair lock against real servers (one deployment per test, from the fixture).

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::{ErrorKind, FairLocks, FairOptions};
use common::{client, get, raw, server, Raw};
use tokio::time::Instant;
use tokio_stream::StreamExt;

fn queue_key(name: &str) -> String {
    format!("baton:fair:{{{name}}}:queue")
}

fn alive_key(name: &str) -> String {
    format!("baton:fair:{{{name}}}:alive")
}

async fn zcard(conn: &mut Raw, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// Waits (up to 10 s) until the queue of `name` has `n` waiters.
async fn queued(conn: &mut Raw, name: &str, n: u64) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let now = zcard(conn, &queue_key(name)).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "the queue of {name} has {now} waiters after 10 s, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Long timers, so that waiters only move when woken.
fn quiet() -> FairOptions {
    FairOptions::builder()
        .waiter_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

const TTL: Duration = Duration::from_secs(30);

scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_waiters_are_granted_in_arrival_order() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        let holder = locks.acquire("order", TTL, &quiet()).await.unwrap();
        let first_fence = holder.fencing_token();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        // Two clients, alternating, so the order is the server's and not one client's.
        let other = client(&server).await;
        for i in 0..10u64 {
            let locks = if i % 2 == 0 { locks.clone() } else { other.fair_locks() };
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let g = locks.acquire("order", TTL, &quiet()).await.expect("acquire");
                let _ = tx.send((i, g.fencing_token()));
                assert!(g.release().await.expect("release"));
            }));
            // Enqueued one by one: waiter i is number i + 1 in the server's queue.
            queued(&mut r, "order", i + 1).await;
        }
        assert!(holder.release().await.unwrap());
        let mut last = first_fence;
        for expected in 0..10u64 {
            let (i, fence) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the next waiter was granted within 10 s")
                .unwrap();
            assert_eq!(i, expected, "granted out of arrival order");
            assert!(fence > last, "fencing token {fence} after {last}");
            last = fence;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(zcard(&mut r, &queue_key("order")).await, 0);
        assert_eq!(zcard(&mut r, &alive_key("order")).await, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_goes_next_ahead_of_ten_contenders() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        let holder = locks.acquire("vip", TTL, &quiet()).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        // Busy contenders: each refreshes its place (one try) every 30 ms, so they keep
        // knocking at the free, reserved lock.
        let busy = FairOptions::builder()
            .waiter_timeout(Duration::from_millis(90))
            .build()
            .unwrap();
        for i in 0..10u64 {
            let (locks, tx, busy) = (locks.clone(), tx.clone(), busy.clone());
            tasks.push(tokio::spawn(async move {
                let g = locks.acquire("vip", TTL, &busy).await.expect("acquire");
                let _ = tx.send(format!("waiter {i}"));
                assert!(g.release().await.expect("release"));
            }));
        }
        queued(&mut r, "vip", 10).await;
        let reservation = locks.reserve("vip", Duration::from_secs(10)).await.unwrap();
        assert!(holder.release().await.unwrap());
        // The lock is free and reserved, and the contenders keep trying (each try is one
        // EVALSHA): let them knock twenty times before the reserver even starts.
        let evalsha = |m: &std::collections::HashMap<String, u64>| {
            m.get("evalsha").copied().unwrap_or(0)
        };
        let base = evalsha(&common::command_calls(&mut r).await);
        let give_up = Instant::now() + Duration::from_secs(10);
        while evalsha(&common::command_calls(&mut r).await) < base + 20 {
            assert!(Instant::now() < give_up, "the contenders stopped trying");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(rx.try_recv().is_err(), "a contender jumped the reservation");
        let reserver = {
            let tx = tx.clone();
            tokio::spawn(async move {
                let g = reservation.acquire(TTL, &quiet()).await.expect("reserved acquire");
                let _ = tx.send("reserver".to_string());
                assert!(g.release().await.expect("release"));
            })
        };
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("someone was granted within 10 s")
            .unwrap();
        assert_eq!(first, "reserver", "the reservation was jumped");
        reserver.await.unwrap();
        for _ in 0..10 {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the queue moved on after the reserver")
                .unwrap();
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            get(&mut r, "baton:fair:{vip}:reserved").await,
            None,
            "the grant consumed the reservation"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn eight_tasks_increment_a_plain_counter_exactly() {
        let server = server();
        let mut tasks = Vec::new();
        for _ in 0..8u64 {
            let c = client(&server).await;
            let mut plain = raw(&server).await;
            tasks.push(tokio::spawn(async move {
                let locks = c.fair_locks();
                let opts = FairOptions::default();
                for _ in 0..50 {
                    let guard = locks
                        .acquire("counter", Duration::from_secs(5), &opts)
                        .await
                        .expect("acquire");
                    let v: Option<i64> = redis::cmd("GET")
                        .arg("fair-counter")
                        .query_async(&mut plain)
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                    let _: () = redis::cmd("SET")
                        .arg("fair-counter")
                        .arg(v.unwrap_or(0) + 1)
                        .query_async(&mut plain)
                        .await
                        .unwrap();
                    assert!(guard.release().await.expect("release"), "released our own lock");
                }
                c
            }));
        }
        let mut clients = Vec::new();
        for t in tasks {
            clients.push(t.await.unwrap());
        }
        let mut conn = raw(&server).await;
        assert_eq!(get(&mut conn, "fair-counter").await.as_deref(), Some("400"));
    }
}

#[tokio::test]
async fn a_free_lock_goes_to_the_queue_head_not_to_a_newcomer() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let holder = locks.acquire("head", TTL, &quiet()).await.unwrap();
    // The head queues, then is not polled for a while (a slow process, alive for 30 s).
    let opts = quiet();
    let mut head = Box::pin(locks.acquire("head", TTL, &opts));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut head)
            .await
            .is_err(),
        "granted while held"
    );
    queued(&mut r, "head", 1).await;
    assert!(holder.release().await.unwrap());
    // The lock is free, but it is the head's turn: a newcomer trying now is refused.
    let newcomer = FairOptions::builder()
        .wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = locks.acquire("head", TTL, &newcomer).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // The head's wake is waiting for it: polled again, it takes the lock at once.
    let g = tokio::time::timeout(Duration::from_secs(5), head)
        .await
        .expect("the head was granted within 5 s")
        .expect("acquire");
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn a_foreign_type_at_the_queue_is_reported_not_waited_on() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let _: () = redis::cmd("LPUSH")
        .arg(queue_key("typed"))
        .arg("x")
        .query_async(&mut r)
        .await
        .unwrap();
    let err = c
        .fair_locks()
        .acquire("typed", TTL, &FairOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert_eq!(
        get(&mut r, "baton:fair:{typed}").await,
        None,
        "nothing held"
    );
}

#[tokio::test]
async fn a_second_concurrent_reservation_is_refused_with_reserved() {
    let server = server();
    let c = client(&server).await;
    let locks = c.fair_locks();
    let first = locks
        .reserve("twice", Duration::from_secs(10))
        .await
        .unwrap();
    let err = locks
        .reserve("twice", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Reserved, "{err}");
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("baton:fair:{twice}:reserved"),
        "{err}"
    );
    // Dropping the first gives it up (in the background): a new one then succeeds.
    drop(first);
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        match locks.reserve("twice", Duration::from_secs(10)).await {
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::Reserved && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("the dropped reservation still blocks: {e}"),
        }
    }
}

#[tokio::test]
async fn a_cancelled_reserved_acquire_gives_the_reservation_up() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let holder = locks.acquire("cancel", TTL, &quiet()).await.unwrap();
    let reservation = locks
        .reserve("cancel", Duration::from_secs(30))
        .await
        .unwrap();
    let reserver = tokio::spawn(async move { reservation.acquire(TTL, &quiet()).await });
    // Waiting behind the holder: its tries renew the reservation (30 s), never end it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reserver.is_finished());
    assert!(get(&mut r, "baton:fair:{cancel}:reserved").await.is_some());
    reserver.abort();
    // Its lifetime is 30 s: only the leave on drop ends it this soon.
    let give_up = Instant::now() + Duration::from_secs(5);
    while get(&mut r, "baton:fair:{cancel}:reserved").await.is_some() {
        assert!(
            Instant::now() < give_up,
            "the cancelled reservation still stands"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(holder.release().await.unwrap());
    let g = locks
        .acquire(
            "cancel",
            TTL,
            &FairOptions::builder()
                .wait(Duration::from_secs(2))
                .build()
                .unwrap(),
        )
        .await
        .expect("the lock is no longer reserved");
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn the_watchdog_keeps_a_fair_lock_past_its_ttl() {
    let server = server();
    let c = client(&server).await;
    let locks = c.fair_locks();
    let ttl = Duration::from_millis(300);
    let opts = FairOptions::builder().watchdog(true).build().unwrap();
    let g = locks.acquire("dog", ttl, &opts).await.unwrap();
    let fence = g.fencing_token();
    let short = FairOptions::builder()
        .wait(Duration::from_millis(1200))
        .build()
        .unwrap();
    // Four ttls later, still held: nobody else gets it.
    let err = locks.acquire("dog", ttl, &short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(!g.lost_token().is_cancelled());
    assert!(g.lease_deadline() > Instant::now());
    assert!(g.release().await.unwrap(), "still ours after four ttls");
    let next = locks.acquire("dog", ttl, &short).await.unwrap();
    assert!(next.fencing_token() > fence);
    assert!(next.release().await.unwrap());
}

#[tokio::test]
async fn bad_names_ttls_and_lifetimes_are_rejected_before_any_io() {
    let c = baton::Client::builder("redis://127.0.0.1:1/")
        .build_lazy()
        .unwrap();
    let locks = c.fair_locks();
    let o = FairOptions::default();
    for (key, ttl) in [
        ("", TTL),
        ("a{b}", TTL),
        ("ok", Duration::from_millis(9)),
        ("ok", Duration::from_secs(86_401)),
    ] {
        let err = locks.acquire(key, ttl, &o).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{key:?} {ttl:?}: {err}");
    }
    let err = locks
        .reserve("ok", Duration::from_millis(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("lifetime"), "{err}");
    assert!(locks.with_prefix("nocolon").is_err());
}

/// A corrupt fence is found before anything changes: the contender that would be granted is
/// refused with `CorruptState` and the lock key is never written, so no lock is taken that
/// could not be fenced and no waiter's entry or reservation is consumed by a grant that did not
/// happen (keyspace notifications show every write a script makes).
#[tokio::test]
async fn a_corrupt_fence_is_reported_before_the_lock_is_taken_or_the_queue_moved() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("K$gz")
        .query_async(&mut r)
        .await
        .unwrap();
    let holder = locks.acquire("bent", TTL, &quiet()).await.unwrap();
    let reservation = locks
        .reserve("bent", Duration::from_secs(30))
        .await
        .unwrap();
    let reserved_by = get(&mut r, "baton:fair:{bent}:reserved").await;
    assert!(reserved_by.is_some());
    let _: () = redis::cmd("SET")
        .arg("baton:fair:{bent}:fence")
        .arg("not-a-number")
        .query_async(&mut r)
        .await
        .unwrap();
    // Writes to the lock key and the reservation from here on.
    let mut events = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    events
        .psubscribe("__keyspace@0__:baton:fair:{bent}")
        .await
        .unwrap();
    events
        .psubscribe("__keyspace@0__:baton:fair:{bent}:reserved")
        .await
        .unwrap();
    let mut events = events.into_on_message();
    // The release is the last write expected on the lock key.
    assert!(holder.release().await.unwrap());
    let first = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the release's DEL")
        .expect("pub/sub");
    assert_eq!(first.get_payload::<String>().unwrap(), "del");
    // The reserver goes next and meets the corrupt fence.
    let err = tokio::time::timeout(Duration::from_secs(5), reservation.acquire(TTL, &quiet()))
        .await
        .expect("the reserver was woken")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CorruptState, "{err}");
    // The failed acquisition gives its reservation up (a DEL from its leave); before that, no
    // script may have set the lock or consumed the reservation.
    let mut seen = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), events.next()).await {
        seen.push((
            m.get_channel_name().to_string(),
            m.get_payload::<String>().unwrap(),
        ));
    }
    let on_lock: Vec<_> = seen
        .iter()
        .filter(|(ch, _)| ch.ends_with(":{bent}"))
        .collect();
    assert!(
        on_lock.is_empty(),
        "the lock key was written although its fence was corrupt: {seen:?}"
    );
    assert_eq!(
        get(&mut r, "baton:fair:{bent}:fence").await.as_deref(),
        Some("not-a-number"),
        "the corrupt value is left for an operator to see"
    );
}

/// A reserver whose grant reply was lost finds the lock holding its own id when it tries
/// again: it is granted (the lock renewed) even when the fence key is gone meanwhile (data
/// loss, a `DEL` by hand), with a fence from the server's clock, instead of failing with an
/// unexpected reply and then releasing a lock it holds.
#[tokio::test]
async fn a_lost_grant_is_resumed_even_when_the_fence_key_was_lost() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let reservation = locks
        .reserve("lost", Duration::from_secs(30))
        .await
        .unwrap();
    let id = get(&mut r, "baton:fair:{lost}:reserved")
        .await
        .expect("the reservation holds its id");
    // As if a grant to this id had applied and its reply been lost, and the fence then lost.
    let _: () = redis::cmd("SET")
        .arg("baton:fair:{lost}")
        .arg(&id)
        .arg("PX")
        .arg(30_000)
        .query_async(&mut r)
        .await
        .unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let g = tokio::time::timeout(Duration::from_secs(5), reservation.acquire(TTL, &quiet()))
        .await
        .expect("the reserver was answered")
        .expect("granted: the lock holds its id");
    assert!(
        g.fencing_token() + 60_000_000 > before,
        "the fence restarts from the server's clock (µs): {} vs {before}",
        g.fencing_token()
    );
    assert_eq!(
        get(&mut r, "baton:fair:{lost}").await.as_deref(),
        Some(id.as_str()),
        "still held"
    );
    assert_eq!(
        get(&mut r, "baton:fair:{lost}:fence").await,
        Some(g.fencing_token().to_string()),
        "the fence is stored again"
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn a_dead_reservers_reservation_stops_blocking_after_its_lifetime() {
    let server = server();
    let c = client(&server).await;
    let locks = c.fair_locks();
    let dead = locks
        .reserve("orphan", Duration::from_secs(1))
        .await
        .unwrap();
    let started = Instant::now();
    // Its owner dies without any cleanup.
    std::mem::forget(dead);
    let short = FairOptions::builder()
        .wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = locks.acquire("orphan", TTL, &short).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotAcquired,
        "the free lock is reserved for someone else: {err}"
    );
    let g = locks
        .acquire(
            "orphan",
            TTL,
            &FairOptions::builder()
                .wait(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .await
        .expect("granted once the dead reservation expired");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a 1 s reservation blocked for {:?}",
        started.elapsed()
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn a_dead_waiter_delays_the_queue_by_at_most_its_timeout() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let holder = locks.acquire("dead", TTL, &quiet()).await.unwrap();
    let one_second = FairOptions::builder()
        .waiter_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    // The dead waiter: queued first, then forgotten (no leave, no refresh: a crashed process).
    let mut dead = Box::pin(locks.acquire("dead", TTL, &one_second));
    let _ = tokio::time::timeout(Duration::from_millis(500), &mut dead).await;
    assert_eq!(
        zcard(&mut r, &queue_key("dead")).await,
        1,
        "the dead waiter queued"
    );
    std::mem::forget(dead);
    let live = {
        let (locks, opts) = (locks.clone(), one_second.clone());
        tokio::spawn(async move { locks.acquire("dead", TTL, &opts).await })
    };
    queued(&mut r, "dead", 2).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let g = tokio::time::timeout(Duration::from_secs(10), live)
        .await
        .expect("the live waiter was granted within 10 s")
        .unwrap()
        .expect("acquire");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "a dead waiter with a 1 s timeout held the queue up for {:?}",
        released.elapsed()
    );
    assert_eq!(
        zcard(&mut r, &queue_key("dead")).await,
        0,
        "the dead waiter was evicted"
    );
    assert_eq!(zcard(&mut r, &alive_key("dead")).await, 0);
    assert!(g.release().await.unwrap());
}

#[tokio::test]
async fn a_dropped_acquire_leaves_the_queue_at_once() {
    let server = server();
    let mut r = raw(&server).await;
    let c = client(&server).await;
    let locks = c.fair_locks();
    let holder = locks.acquire("drop", TTL, &quiet()).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("drop", TTL, &quiet()).await })
    };
    queued(&mut r, "drop", 1).await;
    waiter.abort();
    let dropped = Instant::now();
    // Its waiter timeout is 30 s: only the leave on drop empties the queue this soon.
    queued(&mut r, "drop", 0).await;
    assert!(dropped.elapsed() < Duration::from_secs(5));
    assert_eq!(zcard(&mut r, &alive_key("drop")).await, 0);
    assert!(holder.release().await.unwrap());
}

/// Every command the server ran between `before` and `after`, but the test's own `INFO`.
fn delta(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "info" | "ping"))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The commands of one handoff (release → the head holds) with `n` waiters queued.
async fn handoff_commands(
    r: &mut Raw,
    locks: &FairLocks,
    name: &str,
    n: u64,
) -> std::collections::BTreeMap<String, u64> {
    let ttl = Duration::from_secs(60);
    let opts = FairOptions::builder()
        .waiter_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let evalsha =
        |m: &std::collections::HashMap<String, u64>| m.get("evalsha").copied().unwrap_or(0);
    let base = evalsha(&common::command_calls(r).await);
    let holder = locks.acquire(name, ttl, &opts).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (locks, opts, tx, name) = (locks.clone(), opts.clone(), tx.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let g = locks.acquire(&name, ttl, &opts).await.expect("acquire");
            let _ = tx.send(());
            // Hold it: the others stay parked.
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(g);
        }));
    }
    // Every waiter has made its two tries (queued, then again once subscribed): from here on
    // only a wake moves one (their own timers are 20 s away).
    let give_up = Instant::now() + Duration::from_secs(10);
    while evalsha(&common::command_calls(r).await) < base + 1 + 2 * n {
        assert!(
            Instant::now() < give_up,
            "the waiters did not settle in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = common::command_calls(r).await;
    assert!(holder.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the head was granted within 5 s")
        .unwrap();
    // The head's grant has been answered, so it ran; the granted waiter keeps its wake
    // channel subscribed for its next wait (no UNSUBSCRIBE).
    let after = common::command_calls(r).await;
    for t in tasks {
        t.abort();
    }
    delta(&before, &after)
}

// Single server only: counts one server's commands.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handoff_costs_the_same_commands_with_ten_waiters_as_with_one() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        // Load both scripts first, so neither count includes a SCRIPT LOAD.
        let g = locks.acquire("warm", TTL, &quiet()).await.unwrap();
        assert!(g.release().await.unwrap());
        let one = handoff_commands(&mut r, &locks, "cost1", 1).await;
        let ten = handoff_commands(&mut r, &locks, "cost10", 10).await;
        assert_eq!(
            one.get("evalsha"),
            Some(&2),
            "a handoff is the release and the head's grant: {one:?}"
        );
        assert_eq!(one, ten, "10 waiters cost more per handoff than 1");
        // The grant reads the fence and the server's clock once each (checked before anything
        // is written, reused by the fence step): one TIME per script, and GETs of the lock
        // (twice), the reservation (twice) and the fence. The release and the grant look at the
        // queue's head only (one ZRANGE each), no scan for dead waiters.
        assert_eq!(
            (one.get("time"), one.get("get"), one.get("zrange")),
            (Some(&2), Some(&5), Some(&2)),
            "a handoff reads the clock once per script, the fence once and the head only: {one:?}"
        );
        assert!(
            !one.contains_key("subscribe") && !one.contains_key("unsubscribe"),
            "no wake channel is (un)subscribed on a handoff: {one:?}"
        );
    }
}

// Single server only: counts one server's commands.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiters_wake_channel_is_kept_for_its_next_wait() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        let opts = FairOptions::builder()
            .waiter_timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let subscribes =
            |m: &std::collections::HashMap<String, u64>| m.get("subscribe").copied().unwrap_or(0);
        let before = common::command_calls(&mut r).await;
        let rounds = 20;
        // Two tasks take the lock in turns, each waiting for the other every time.
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (locks, opts) = (locks.clone(), opts.clone());
                tokio::spawn(async move {
                    for _ in 0..rounds {
                        let g = locks.acquire("kept", TTL, &opts).await.expect("acquire");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        assert!(g.release().await.unwrap());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let after = common::command_calls(&mut r).await;
        let subscribed = subscribes(&after) - subscribes(&before);
        let waits_at_least = rounds - 1;
        assert!(
            (1..=2).contains(&subscribed),
            "{subscribed} SUBSCRIBE for {waits_at_least} or more waits of two tasks (one per \
             wait: a channel per wait)"
        );
    }
}

scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn try_acquire_is_none_while_held_and_gives_its_place_up() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        let held = locks.try_acquire("try", TTL).await.unwrap().expect("free");
        assert!(locks.try_acquire("try", TTL).await.unwrap().is_none());
        // The failed try left the queue (through a task of the client).
        queued(&mut r, "try", 0).await;
        let first = held.fencing_token();
        assert!(held.release().await.unwrap());
        let again = locks.try_acquire("try", TTL).await.unwrap().expect("free again");
        assert!(again.fencing_token() > first);
        assert!(again.release().await.unwrap());
    }
}

scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_lock_runs_the_work_once_with_its_token_and_releases() {
        let server = server();
        let mut r = raw(&server).await;
        let c = client(&server).await;
        let locks = c.fair_locks();
        let runs = std::sync::atomic::AtomicU32::new(0);
        let token = locks
            .with_lock("with", TTL, &quiet(), |guard| {
                let token = guard.fencing_token();
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move { token }
            })
            .await
            .unwrap();
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(token > 0);
        assert_eq!(get(&mut r, "baton:fair:{with}").await, None, "released");
        // Taken over during the work: the work is dropped and the loss reported.
        let lost = locks
            .with_lock("with", Duration::from_millis(300), &quiet(), |_| async {
                let mut r = raw(&server).await;
                let _: () = redis::cmd("SET")
                    .arg("baton:fair:{with}")
                    .arg("someone else")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut r)
                    .await
                    .unwrap();
                std::future::pending::<()>().await
            })
            .await
            .unwrap_err();
        assert_eq!(lost.kind(), ErrorKind::LeaseLost, "{lost}");
        assert!(
            matches!(lost, baton::Error::LeaseLost { fencing_token: Some(t), .. } if t > token),
            "{lost:?}"
        );
    }
}
