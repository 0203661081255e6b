//! The fenced mutex against real redis-servers (one per test, from the fixture).

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::{AcquireOptions, ErrorKind};
use common::{client, get, pttl, raw, server, Deployment, Logs, Raw};
use tokio::time::Instant;
use tracing::instrument::WithSubscriber;

/// What a backend-neutral scenario reads besides the API: the lock as stored.
enum Db {
    Redis(Raw),
    #[cfg(feature = "postgres")]
    Pg(tokio_postgres::Client),
}

async fn db(server: &Deployment) -> Db {
    #[cfg(feature = "postgres")]
    if let Deployment::Postgres(d) = server {
        return Db::Pg(d.connect().await);
    }
    Db::Redis(raw(server).await)
}

impl Db {
    /// Lock `name`'s holder token and remaining ms (`(None, -2)` when free), as stored.
    async fn lock(&mut self, name: &str) -> (Option<String>, i64) {
        match self {
            Db::Redis(r) => (
                get(r, &lock_key(name)).await,
                pttl(r, &lock_key(name)).await,
            ),
            #[cfg(feature = "postgres")]
            Db::Pg(c) => c
                .query_opt(
                    "SELECT token,
                            ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
                     FROM baton_locks
                     WHERE key = $1 AND token IS NOT NULL AND expires_at > clock_timestamp()",
                    &[&lock_key(name)],
                )
                .await
                .unwrap()
                .map_or((None, -2), |r| (r.get(0), r.get(1))),
        }
    }
}

fn lock_key(name: &str) -> String {
    format!("baton:lock:{{{name}}}")
}

fn fence_key(name: &str) -> String {
    format!("baton:lock:{{{name}}}:fence")
}

async fn set(conn: &mut Raw, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

// Single server only: restarts THE server without its data.
scenario! {
    single:
    #[tokio::test]
    async fn fencing_tokens_strictly_increase_across_clients_and_a_restart_without_data() {
        let mut server = server();
        let clients = [
            client(&server).await,
            client(&server).await,
            client(&server).await,
        ];
        let mut last = 0u64;
        for i in 0..1000 {
            let locks = clients[i % clients.len()].locks();
            let g = locks
                .try_acquire("fenced", Duration::from_secs(5))
                .await
                .unwrap()
                .expect("free lock");
            assert!(
                g.fencing_token() > last,
                "{} after {last}",
                g.fencing_token()
            );
            last = g.fencing_token();
            assert!(g.release().await.unwrap());
        }
        server.restart().expect("restart without persistence");
        let mut conn = raw(&server).await;
        assert_eq!(
            get(&mut conn, &fence_key("fenced")).await,
            None,
            "data lost"
        );
        // The clients reconnect on their own; retry while they do.
        let give_up = Instant::now() + Duration::from_secs(10);
        let g = loop {
            match clients[0]
                .locks()
                .try_acquire("fenced", Duration::from_secs(5))
                .await
            {
                Ok(Some(g)) => break g,
                Ok(None) => panic!("nobody holds the lock after the restart"),
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(
            g.fencing_token() > last,
            "{} after {last}",
            g.fencing_token()
        );
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn foreign_token_release_and_extend_say_not_held_and_leave_the_lock() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let mut stale = a
            .locks()
            .try_acquire("stolen", Duration::from_millis(100))
            .await
            .unwrap()
            .expect("free");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let holder = b
            .locks()
            .try_acquire("stolen", Duration::from_secs(10))
            .await
            .unwrap()
            .expect("expired, so free");
        assert!(holder.fencing_token() > stale.fencing_token());
        assert!(!stale.extend(Duration::from_secs(30)).await.unwrap());
        assert!(
            stale.lost_token().is_cancelled(),
            "a refused extension signals loss"
        );
        assert!(!stale.release().await.unwrap());
        let (token, left) = db(&server).await.lock("stolen").await;
        assert_eq!(token.as_deref(), Some(holder.token()));
        assert!(left > 9_000 && left <= 10_000, "PTTL {left}");
        assert!(holder.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn try_acquire_on_a_held_lock_is_none() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let g = a
            .locks()
            .try_acquire("busy", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        assert!(b
            .locks()
            .try_acquire("busy", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none());
        let bounded = AcquireOptions::builder().max_tries(3).build().unwrap();
        let err = b
            .locks()
            .acquire("busy", Duration::from_secs(5), &bounded)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired);
        assert!(!err.is_retryable());
        assert!(g.release().await.unwrap());
    }
}

// Redis only: writes the fence key by hand (a PostgreSQL fence is a bigint column; the
// fence-ahead case is in tests/mutex_pg.rs).
scenario! {
    #[tokio::test]
    async fn a_corrupt_fence_is_reported_and_left_untouched() {
        let server = server();
        let c = client(&server).await;
        let mut conn = raw(&server).await;
        // Not decimal, not canonical, or 19 digits (more than a fence baton writes).
        for odd in ["12abc", "007", "0", "-5", "1000000000000000000"] {
            set(&mut conn, &fence_key("odd"), odd).await;
            let err = c
                .locks()
                .try_acquire("odd", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::CorruptState, "{odd}");
            assert_eq!(
                get(&mut conn, &fence_key("odd")).await.as_deref(),
                Some(odd)
            );
            assert_eq!(
                get(&mut conn, &lock_key("odd")).await,
                None,
                "no lock taken"
            );
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_dropped_guard_is_released_in_the_background() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let g = a
            .locks()
            .try_acquire("dropped", Duration::from_secs(10))
            .await
            .unwrap()
            .expect("free");
        let t = Instant::now();
        drop(g);
        let opts = AcquireOptions::builder()
            .wait(Duration::from_secs(5))
            .build()
            .unwrap();
        let g2 = b
            .locks()
            .acquire("dropped", Duration::from_secs(10), &opts)
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(g2.release().await.unwrap());
    }
}

// Single server only: pauses THE server (SIGSTOP) to cut the watchdog off.
scenario! {
    single:
    #[tokio::test]
    async fn the_watchdog_keeps_a_long_holder_and_reports_loss_on_a_paused_server() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let ttl = Duration::from_millis(300);
        let opts = AcquireOptions::builder().watchdog(true).build().unwrap();
        let g = a.locks().acquire("dog", ttl, &opts).await.unwrap();
        // Work 5 × ttl; nobody else gets the lock meanwhile.
        let until = Instant::now() + ttl * 5;
        while Instant::now() < until {
            assert!(b.locks().try_acquire("dog", ttl).await.unwrap().is_none());
            assert!(!g.lost_token().is_cancelled(), "{:?}", g.loss_reason());
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        assert!(g.lease_deadline() > Instant::now());
        assert!(g.release().await.unwrap());

        let g = a.locks().acquire("dog", ttl, &opts).await.unwrap();
        server.pause().unwrap();
        let paused_at = Instant::now();
        let fired = tokio::time::timeout(Duration::from_secs(3), g.lost()).await;
        let fired_at = Instant::now();
        server.resume().unwrap();
        assert!(fired.is_ok(), "no loss signal within 3 s of the pause");
        let deadline = g.lease_deadline();
        assert!(
            fired_at <= deadline + Duration::from_millis(50),
            "fired {:?} after the deadline",
            fired_at.saturating_duration_since(deadline)
        );
        assert!(fired_at.duration_since(paused_at) <= ttl + Duration::from_millis(50));
        assert!(g.loss_reason().is_some());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn with_lock_runs_with_the_fencing_token_and_releases() {
        let server = server();
        let c = client(&server).await;
        let locks = c.locks();
        let fence = locks
            .with_lock(
                "closure",
                Duration::from_millis(300),
                &AcquireOptions::default(),
                |guard| {
                    let f = guard.fencing_token();
                    async move {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        f
                    }
                },
            )
            .await
            .unwrap();
        assert!(fence > 0);
        assert_eq!(db(&server).await.lock("closure").await.0, None, "released");
    }
}

// Redis only: `write_fenced` writes a Redis hash (Unsupported on PostgreSQL).
scenario! {
    #[tokio::test]
    async fn a_stale_holders_fenced_write_is_rejected() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let ttl = Duration::from_millis(200);
        // A holds the lock, then stalls past its lease (no watchdog: nothing extends it).
        let stale = a
            .locks()
            .try_acquire("doc", ttl)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(
            a.locks()
                .write_fenced("baton:resource:doc", stale.fencing_token(), "from A")
                .await
                .unwrap(),
            baton::FencedWrite::Written
        );
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        // A long lease for B: only A's must run out; B's must outlast the checks below on a
        // loaded machine (200 ms did not, in CI, and its release then found it expired).
        let fresh = b
            .locks()
            .try_acquire("doc", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("expired");
        assert!(fresh.fencing_token() > stale.fencing_token());
        assert_eq!(
            b.locks()
                .write_fenced("baton:resource:doc", fresh.fencing_token(), "from B")
                .await
                .unwrap(),
            baton::FencedWrite::Written
        );
        // A wakes up and writes with its old token: refused, nothing changes.
        assert_eq!(
            a.locks()
                .write_fenced("baton:resource:doc", stale.fencing_token(), "late from A")
                .await
                .unwrap(),
            baton::FencedWrite::Rejected {
                highest: fresh.fencing_token()
            }
        );
        let mut c = raw(&server).await;
        let stored: Option<String> = redis::cmd("HGET")
            .arg("baton:resource:doc")
            .arg("value")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(stored.as_deref(), Some("from B"));
        assert!(!stale.release().await.unwrap(), "A's lock was taken over");
        assert!(fresh.release().await.unwrap());
        // A stored token baton never writes is reported, never overwritten.
        let _: () = redis::cmd("HSET")
            .arg("baton:resource:odd")
            .arg("fencing_token")
            .arg("007")
            .query_async(&mut c)
            .await
            .unwrap();
        let err = b
            .locks()
            .write_fenced("baton:resource:odd", 9, "x")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CorruptState);
    }
}

// Redis only: fenced resources are Redis hashes (Unsupported on PostgreSQL).
scenario! {
    #[tokio::test]
    async fn read_fenced_returns_what_write_fenced_wrote_from_either_lock() {
        let server = server();
        let c = client(&server).await;
        let locks = c.locks();
        let res = "baton:resource:read";
        assert_eq!(locks.read_fenced(res).await.unwrap(), None, "nothing yet");
        let guard = locks.try_acquire("read", Duration::from_secs(10)).await.unwrap().expect("free");
        assert_eq!(
            guard.write_fenced(res, "from the mutex").await.unwrap(),
            baton::FencedWrite::Written
        );
        let read = locks.read_fenced(res).await.unwrap().expect("written");
        assert_eq!(read.value, b"from the mutex");
        assert_eq!(read.fencing_token, guard.fencing_token());
        // The guard reads the same; a read is never refused, whatever the reader's token.
        assert_eq!(guard.read_fenced(res).await.unwrap(), Some(read.clone()));
        assert!(guard.release().await.unwrap());
        assert_eq!(locks.read_fenced(res).await.unwrap(), Some(read.clone()));
        // A fair lock's guard writes and reads the same resource, with its own (larger) token.
        let fair = c
            .fair_locks()
            .try_acquire("read", Duration::from_secs(10))
            .await
            .unwrap()
            .expect("free");
        let high = read.fencing_token.max(fair.fencing_token()).saturating_add(1);
        // A token above the fair guard's wrote last: the fair guard is refused, and still reads.
        assert_eq!(
            locks.write_fenced(res, high, "newer").await.unwrap(),
            baton::FencedWrite::Written
        );
        assert_eq!(
            fair.write_fenced(res, "stale").await.unwrap(),
            baton::FencedWrite::Rejected { highest: high }
        );
        let now = fair.read_fenced(res).await.unwrap().expect("written");
        assert_eq!((now.value.as_slice(), now.fencing_token), (&b"newer"[..], high));
        assert!(fair.release().await.unwrap());
        // A value without a canonical token is reported, as the write does.
        let mut r = raw(&server).await;
        let _: () = redis::cmd("HSET")
            .arg("baton:resource:odd-read")
            .arg("value")
            .arg("x")
            .arg("fencing_token")
            .arg("007")
            .query_async(&mut r)
            .await
            .unwrap();
        let err = locks.read_fenced("baton:resource:odd-read").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CorruptState);
    }
}

// Single server only: pauses THE server (SIGSTOP) while the acquisition's script is in flight.
scenario! {
    single:
    #[tokio::test]
    async fn an_acquire_dropped_after_its_script_was_sent_releases_the_lock() {
        let server = server();
        let c = client(&server).await;
        let key = lock_key("abandoned");
        // Load the script first (one acquisition), so the abandoned one is a single EVALSHA that
        // runs when the server resumes, not a NOSCRIPT answered after the future is gone.
        let locks = c.locks();
        let warm = locks
            .try_acquire("abandoned", Duration::from_secs(1))
            .await
            .unwrap()
            .expect("free");
        let first_fence = warm.fencing_token();
        assert!(warm.release().await.unwrap());
        // A paused server receives the script but cannot answer: the future is dropped with the
        // outcome unknown, and the lock is taken once the server resumes.
        server.pause().unwrap();
        let attempt = tokio::time::timeout(
            Duration::from_millis(150),
            locks.try_acquire("abandoned", Duration::from_secs(30)),
        )
        .await;
        assert!(attempt.is_err(), "no reply from a paused server");
        server.resume().unwrap();
        // The client's background task releases by token, behind the acquisition on the same
        // connection: the lock does not stay for its 30 s ttl.
        let mut r = raw(&server).await;
        let start = Instant::now();
        loop {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut r)
                .await
                .unwrap();
            if exists == 0 && start.elapsed() > Duration::from_millis(100) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the abandoned acquisition's lock is still there"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // And the fence shows the script did run: the lock was taken, then given back.
        let fence: u64 = get(&mut r, &fence_key("abandoned"))
            .await
            .and_then(|f| f.parse().ok())
            .expect("a fence");
        assert!(fence > first_fence, "the abandoned acquisition ran");
        assert!(c
            .locks()
            .try_acquire("abandoned", Duration::from_secs(1))
            .await
            .unwrap()
            .is_some());
    }
}

// Single server only: kills and restarts THE server.
scenario! {
    single:
    #[tokio::test]
    async fn acquire_rides_out_a_server_restart_within_its_bound() {
        let mut server = server();
        let c = client(&server).await;
        server.kill();
        let restarter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            server.restart().expect("restart");
            server
        });
        let opts = AcquireOptions::builder()
            .wait(Duration::from_secs(10))
            .build()
            .unwrap();
        let guard = c
            .locks()
            .acquire("through-restart", Duration::from_secs(5), &opts)
            .await
            .expect("acquired once the server was back");
        assert!(guard.release().await.unwrap());
        let _server = restarter.join().unwrap();
        // With a bound shorter than the outage, the error is the connection's, not NotAcquired.
        let mut server = _server;
        server.kill();
        let short = AcquireOptions::builder()
            .wait(Duration::from_millis(300))
            .build()
            .unwrap();
        let err = c
            .locks()
            .acquire("through-restart", Duration::from_secs(5), &short)
            .await
            .unwrap_err();
        assert_ne!(err.kind(), ErrorKind::NotAcquired, "{err}");
        assert!(err.is_retryable(), "{err}");
    }
}

/// EVALSHA calls so far.
async fn evalsha_calls(conn: &mut Raw) -> u64 {
    common::command_calls(conn)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

scenario! { postgres:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_releases_and_asks_again_waits_behind_the_local_waiter() {
        let server = server();
        let c = client(&server).await;
        let locks = c.locks();
        let ttl = Duration::from_secs(30);
        let opts = AcquireOptions::default();
        // A wait on another lock first opens the client's pub/sub connection, which can take
        // longer than a round's pause below on a loaded host.
        let warm = locks.try_acquire("warm", ttl).await.unwrap().expect("free");
        let (locks_w, opts_w) = (locks.clone(), opts.clone());
        let waiter = tokio::spawn(async move {
            let g = locks_w.acquire("warm", ttl, &opts_w).await.expect("acquires");
            assert!(g.release().await.unwrap());
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(warm.release().await.unwrap());
        waiter.await.unwrap();
        let mut held = locks.try_acquire("turns", ttl).await.unwrap().expect("free");
        for round in 0..10 {
            let order = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let (locks_b, opts_b, order_b) = (locks.clone(), opts.clone(), order.clone());
            // B's own trace says when it has tried, joined the lock's channel and parked (a
            // fixed pause was sometimes too short for three PostgreSQL round trips on a loaded
            // host).
            let logs = Logs::default();
            let subscriber = logs.subscriber(tracing::Level::TRACE);
            let b = tokio::spawn(
                async move {
                    let g = locks_b.acquire("turns", ttl, &opts_b).await.expect("b acquires");
                    order_b.lock().unwrap().push('b');
                    assert!(g.release().await.unwrap());
                }
                .with_subscriber(subscriber),
            );
            tokio::time::timeout(Duration::from_secs(30), async {
                while !logs.text().contains("waiting for a release") {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("B parks within 30 s");
            // A releases and asks again at once: its release woke B, and A waits behind it.
            assert!(held.release().await.unwrap());
            held = locks.acquire("turns", ttl, &opts).await.expect("a acquires");
            order.lock().unwrap().push('a');
            let order = order.lock().unwrap().clone();
            // B took the lock and gave it back before A's acquire returned.
            assert_eq!(
                order, "ba",
                "round {round}: the task that released took the lock back before the waiter \
                 its release woke"
            );
            b.await.unwrap();
        }
        assert!(held.release().await.unwrap());
    }
}

// Redis only: counts EVALSHA calls on the server (on PostgreSQL every local waiter is
// woken; tests/mutex_pg.rs checks the wake-up itself).
scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_wakes_one_local_waiter_not_every_one() {
        let server = server();
        let c = client(&server).await;
        let mut r = raw(&server).await;
        let locks = c.locks();
        let ttl = Duration::from_secs(30);
        let holder = locks.try_acquire("herd", ttl).await.unwrap().expect("free");
        // Long backoffs, so the waiters' own timers stay quiet around the release.
        let opts = AcquireOptions::builder()
            .max_backoff(Duration::from_secs(20))
            .build()
            .unwrap();
        let (won_tx, mut won_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for _ in 0..24 {
            let (locks, opts, won) = (locks.clone(), opts.clone(), won_tx.clone());
            waiters.push(tokio::spawn(async move {
                let g = locks.acquire("herd", ttl, &opts).await.expect("acquire");
                let _ = won.send(());
                // Hold it: the others stay parked.
                tokio::time::sleep(Duration::from_secs(60)).await;
                drop(g);
            }));
        }
        // Every waiter has tried, joined the channel and backed off past its short naps: after
        // 8 s each sleeps for seconds, so few of their own timers can fire in the window below
        // even on a loaded machine (after 2 s, a CI run once saw more than 6).
        tokio::time::sleep(Duration::from_secs(8)).await;
        let before = evalsha_calls(&mut r).await;
        assert!(holder.release().await.unwrap());
        tokio::time::timeout(Duration::from_secs(5), won_rx.recv())
            .await
            .expect("a waiter took the lock within 5 s of the release")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The release itself, then the tries it prompted (and any waiter's own timer that fired
        // in the window: a few at most).
        let tries = evalsha_calls(&mut r).await - before - 1;
        assert!(
            (1..=6).contains(&tries),
            "one release was followed by {tries} tries of 24 local waiters (24: the herd)"
        );
        for w in waiters {
            w.abort();
        }
    }
}

// Redis only: writes the fence key by hand (tests/mutex_pg.rs has the PostgreSQL case).
scenario! {
    #[tokio::test]
    async fn a_fence_ahead_of_the_server_clock_steps_by_one() {
        let server = server();
        let c = client(&server).await;
        let mut r = raw(&server).await;
        // A fence far ahead of server time in µs (a clock that went back, say): the next grant is
        // old + 1, exactly, past what a Lua double holds (2^53).
        set(&mut r, &fence_key("ahead"), "999999999999999990").await;
        for expected in [999_999_999_999_999_991, 999_999_999_999_999_992] {
            let g = c
                .locks()
                .try_acquire("ahead", Duration::from_secs(5))
                .await
                .unwrap()
                .expect("free");
            assert_eq!(g.fencing_token(), expected);
            assert!(
                pttl(&mut r, &fence_key("ahead")).await > 86_000_000,
                "the stepped fence keeps its retention"
            );
            assert!(g.release().await.unwrap());
        }
    }
}

// Redis only: counts script calls on the server, and flushes its scripts.
scenario! {
    #[tokio::test]
    async fn a_cycle_is_two_script_calls_and_a_forgotten_script_is_loaded_again() {
        let server = server();
        let c = client(&server).await;
        let mut r = raw(&server).await;
        let locks = c.locks();
        let ttl = Duration::from_secs(5);
        // The first cycle may load the scripts; count from the second on.
        let g = locks.try_acquire("cycle", ttl).await.unwrap().expect("free");
        let mut last = g.fencing_token();
        assert!(g.release().await.unwrap());
        let before = common::command_calls(&mut r).await;
        for _ in 0..20 {
            let g = locks.try_acquire("cycle", ttl).await.unwrap().expect("free");
            assert!(g.fencing_token() > last);
            last = g.fencing_token();
            assert!(g.release().await.unwrap());
        }
        let after = common::command_calls(&mut r).await;
        let delta = |name: &str| {
            after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
        };
        // One EVALSHA to acquire, one to release: two round trips per cycle (the commands
        // the scripts run inside count on their own).
        assert_eq!(delta("evalsha"), 40, "commands: {after:?} after {before:?}");
        // A server that forgot its scripts (a restart, `SCRIPT FLUSH`) answers NOSCRIPT once per
        // script: each is loaded and sent again, and the cycle works as before.
        for mut node in r.primaries().await {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut node)
                .await
                .unwrap();
        }
        let before = common::command_calls(&mut r).await;
        let g = locks.try_acquire("cycle", ttl).await.unwrap().expect("free");
        assert!(g.fencing_token() > last);
        assert!(g.release().await.unwrap());
        let after = common::command_calls(&mut r).await;
        let loads: u64 = after
            .iter()
            .filter(|(name, _)| name.starts_with("script"))
            .map(|(name, n)| n - before.get(name).copied().unwrap_or(0))
            .sum();
        assert_eq!(loads, 2, "commands: {after:?} after {before:?}");
        assert_eq!(
            after.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0),
            4,
            "each script refused once, then run"
        );
    }
}
