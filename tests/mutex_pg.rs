//! The fenced mutex on PostgreSQL (feature `postgres`): the same API and guarantees as on
//! Redis, one row of `baton_locks` per lock. One private server for the binary
//! (`PgServer::shared`), each test on its own lock names; the restart test has a durable server
//! of its own.
#![cfg(all(feature = "postgres", feature = "testing"))]

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::testing::PgServer;
use baton::{AcquireOptions, Client, ErrorKind};
use tokio::time::Instant;

fn pg() -> &'static PgServer {
    PgServer::shared().expect("start PostgreSQL (install it: apt-get install postgresql)")
}

async fn client_at(url: &str) -> Client {
    Client::connect(url).await.expect("connect to PostgreSQL")
}

/// The workers' URL: the DML-only role on the shared server's database, which its owner
/// migrated once (`PgServer::grant_worker_role`). `pg().url()` stays the owner's, for
/// looking at and breaking what baton stored.
async fn worker_url() -> String {
    static URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    URL.get_or_init(|| worker_url_of(pg())).await.clone()
}

/// Migrates `server`'s database `postgres` as its owner, grants the DML-only worker role what
/// it needs there, and returns that role's URL.
async fn worker_url_of(server: &PgServer) -> String {
    let owner = Client::connect(server.url())
        .await
        .expect("connect as the owner");
    owner.migrate().await.expect("migrate as the owner");
    server
        .grant_worker_role("postgres")
        .expect("grant the worker role")
}

async fn client() -> Client {
    client_at(&worker_url().await).await
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c
}

fn row(name: &str) -> String {
    format!("baton:lock:{{{name}}}")
}

/// The lock row's token, `None` when released or absent.
async fn token_of(db: &tokio_postgres::Client, name: &str) -> Option<String> {
    db.query_opt(
        "SELECT token FROM baton_locks WHERE key = $1",
        &[&row(name)],
    )
    .await
    .unwrap()
    .and_then(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_increment_a_row_exactly() {
    let url = pg().url();
    let db = sql(&url).await;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS mx_counter (name text PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO mx_counter VALUES ('c', 0) ON CONFLICT (name) DO UPDATE SET n = 0;",
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for c in 0..4 {
        // Four clients with four tasks each: contention inside one client and across clients.
        let client = client().await;
        for t in 0..4u64 {
            let locks = client.locks();
            let plain = sql(&url).await;
            tasks.push(tokio::spawn(async move {
                let opts = AcquireOptions::default();
                for i in 0..200u64 {
                    let guard = locks
                        .acquire("pg-counter", Duration::from_secs(5), &opts)
                        .await
                        .expect("acquire");
                    let n: i64 = plain
                        .query_one("SELECT n FROM mx_counter WHERE name = 'c'", &[])
                        .await
                        .unwrap()
                        .get(0);
                    // Read, yield (sometimes sleep), write: lost updates show without the lock.
                    if (i + t + c) % 7 == 0 {
                        tokio::time::sleep(Duration::from_micros(300)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    plain
                        .execute("UPDATE mx_counter SET n = $1 WHERE name = 'c'", &[&(n + 1)])
                        .await
                        .unwrap();
                    assert!(guard.release().await.expect("release"), "our own lock");
                }
            }));
        }
        // Keep the client alive in the tasks' handles (cheap clones share it).
        drop(client);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n: i64 = db
        .query_one("SELECT n FROM mx_counter WHERE name = 'c'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3200);
    eprintln!("3200 increments under the mutex in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_clients_and_a_crash_of_a_durable_server() {
    let mut server = PgServer::start_durable().expect("start a durable PostgreSQL");
    let url = worker_url_of(&server).await;
    let clients = [
        client_at(&url).await,
        client_at(&url).await,
        client_at(&url).await,
    ];
    let mut last = 0u64;
    for i in 0..1000 {
        let g = clients[i % clients.len()]
            .locks()
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
    server.restart_immediate().expect("restart PostgreSQL");
    // The clients' pooled connections died with the server: retry while they reconnect.
    let give_up = Instant::now() + Duration::from_secs(15);
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
    last = g.fencing_token();
    assert!(g.release().await.unwrap());
    // Even with the row gone (deleted by hand, or cleaned up), the next token is larger: it is
    // at least the server's time in µs.
    server
        .psql("DELETE FROM baton_locks")
        .expect("delete the lock rows");
    let g = clients[1]
        .locks()
        .try_acquire("fenced", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free lock");
    assert!(
        g.fencing_token() > last,
        "{} after {last}",
        g.fencing_token()
    );
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_holder_working_five_ttls() {
    let (a, b) = (client().await, client().await);
    let ttl = Duration::from_millis(300);
    let opts = AcquireOptions::builder().watchdog(true).build().unwrap();
    let g = a.locks().acquire("pg-dog", ttl, &opts).await.unwrap();
    let until = Instant::now() + ttl * 5;
    while Instant::now() < until {
        assert!(b
            .locks()
            .try_acquire("pg-dog", ttl)
            .await
            .unwrap()
            .is_none());
        assert!(!g.lost_token().is_cancelled(), "{:?}", g.loss_reason());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(g.lease_deadline() > Instant::now());
    assert!(g.release().await.unwrap());
    assert!(b
        .locks()
        .try_acquire("pg-dog", ttl)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loss_signal_fires_when_the_row_is_expired_and_taken_over() {
    let (a, b) = (client().await, client().await);
    let ttl = Duration::from_secs(3);
    let opts = AcquireOptions::builder().watchdog(true).build().unwrap();
    let g = a.locks().acquire("pg-stolen", ttl, &opts).await.unwrap();
    // Someone ends the lease behind baton's back, and a competitor takes the lock.
    pg().psql(&format!(
        "UPDATE baton_locks SET expires_at = now() WHERE key = '{}'",
        row("pg-stolen")
    ))
    .unwrap();
    let thief = b
        .locks()
        .try_acquire("pg-stolen", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("expired, so free");
    assert!(thief.fencing_token() > g.fencing_token());
    // The next extension (within ttl / 3 = 1 s) finds another token.
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("the loss signal fired within 5 s");
    assert!(t.elapsed() < Duration::from_secs(5));
    let reason = g.loss_reason().expect("a reason");
    assert!(reason.contains("another token"), "{reason}");
    // The loser's release says "not ours" and leaves the thief's lock.
    assert!(!g.release().await.unwrap());
    let db = sql(&pg().url()).await;
    assert_eq!(
        token_of(&db, "pg-stolen").await.as_deref(),
        Some(thief.token())
    );
    assert!(thief.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_in_the_background() {
    let c = client().await;
    let db = sql(&pg().url()).await;
    let g = c
        .locks()
        .try_acquire("pg-dropped", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    assert_eq!(
        token_of(&db, "pg-dropped").await.as_deref(),
        Some(g.token())
    );
    drop(g);
    let t = Instant::now();
    while token_of(&db, "pg-dropped").await.is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the dropped guard's lock is still held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_notification() {
    let (a, b) = (client().await, client().await);
    let g = a
        .locks()
        .try_acquire("pg-wake", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    // A long backoff: without the notification the waiter would sleep for seconds.
    let opts = AcquireOptions::builder()
        .max_backoff(Duration::from_secs(20))
        .wait(Duration::from_secs(25))
        .build()
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .locks()
            .acquire("pg-wake", Duration::from_secs(30), &opts)
            .await
            .expect("acquire");
        (Instant::now(), g.release().await.unwrap())
    });
    // Let the waiter back off well past its first naps.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = Instant::now();
    assert!(g.release().await.unwrap());
    let (got, ours) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert!(ours);
    assert!(
        got.duration_since(released) < Duration::from_millis(1500),
        "woken {:?} after the release",
        got.duration_since(released)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_in_flight_releases_its_lock_by_token() {
    let c = client().await;
    let locks = c.locks();
    let db = sql(&pg().url()).await;
    let warm = locks
        .try_acquire("pg-abandoned", Duration::from_secs(1))
        .await
        .unwrap()
        .expect("free");
    let first_fence = warm.fencing_token();
    assert!(warm.release().await.unwrap());
    // Block the acquisition on the row's lock, so it is in flight when it is dropped.
    let mut blocker = sql(&pg().url()).await;
    let tx = blocker.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM baton_locks WHERE key = $1 FOR UPDATE",
        &[&row("pg-abandoned")],
    )
    .await
    .unwrap();
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        locks.try_acquire("pg-abandoned", Duration::from_secs(30)),
    )
    .await;
    assert!(attempt.is_err(), "the acquisition waits for the row lock");
    tx.commit().await.unwrap();
    // The acquisition runs once the row is free, and the client's background release by token
    // gives the lock back: it does not stay for its 30 s ttl.
    let t = Instant::now();
    loop {
        let r = db
            .query_one(
                "SELECT token, fence FROM baton_locks WHERE key = $1",
                &[&row("pg-abandoned")],
            )
            .await
            .unwrap();
        let (token, fence): (Option<String>, i64) = (r.get(0), r.get(1));
        if token.is_none() && fence as u64 > first_fence {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the abandoned acquisition's lock is still there (token {token:?}, fence {fence})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(locks
        .try_acquire("pg-abandoned", Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_only_options_are_refused_with_a_clear_error() {
    let c = client().await;
    let err = c
        .locks()
        .write_fenced("resource", 7, "x")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("docs/mutex.md"), "{err}");
    let opts = AcquireOptions::builder()
        .replica_ack(1, Duration::from_millis(100))
        .build()
        .unwrap();
    let err = c
        .locks()
        .acquire("pg-replicas", Duration::from_secs(5), &opts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("synchronous"), "{err}");
    // Nothing was taken.
    assert!(c
        .locks()
        .try_acquire("pg-replicas", Duration::from_secs(5))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_ahead_of_the_server_clock_steps_by_one() {
    let c = client().await;
    let first = c
        .locks()
        .try_acquire("pg-ahead", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    assert!(first.release().await.unwrap());
    pg().psql(&format!(
        "UPDATE baton_locks SET fence = 999999999999999990 WHERE key = '{}'",
        row("pg-ahead")
    ))
    .unwrap();
    for expected in [999_999_999_999_999_991u64, 999_999_999_999_999_992] {
        let g = c
            .locks()
            .try_acquire("pg-ahead", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(g.fencing_token(), expected);
        assert!(g.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_the_lease_on_the_server_and_the_deadline() {
    let c = client().await;
    let db = sql(&pg().url()).await;
    let mut g = c
        .locks()
        .try_acquire("pg-extend", Duration::from_secs(1))
        .await
        .unwrap()
        .expect("free");
    let before = g.lease_deadline();
    assert!(g.extend(Duration::from_secs(20)).await.unwrap());
    assert!(g.lease_deadline() > before + Duration::from_secs(15));
    let left: i64 = db
        .query_one(
            "SELECT ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
             FROM baton_locks WHERE key = $1 AND token = $2",
            &[&row("pg-extend"), &g.token()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(left > 19_000 && left <= 20_000, "{left} ms left");
    // Still held after the original 1 s lease would have ended.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(c
        .locks()
        .try_acquire("pg-extend", Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
    assert!(!g.lost_token().is_cancelled());
    assert!(g.release().await.unwrap());
}

/// The cleanup races a grant: session A acquires a free lock whose fence retention has passed,
/// in a transaction left open; session B's cleanup picked that row from its snapshot and waits
/// for A's row lock; A commits. The cleanup must then see that the row is held and keep it: a
/// deleted row would let the next acquisition insert a second holder of the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_never_deletes_a_lock_granted_while_it_waited() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let url = pg.url();
    let (observer, a, b) = (sql(&url).await, sql(&url).await, sql(&url).await);
    let [_, locks] = baton::__seam::pg_schema_and_cleanup();
    observer.batch_execute(locks.1).await.expect("the schema");
    observer
        .batch_execute(
            "INSERT INTO baton_locks VALUES ('race', NULL, NULL, 5, now() - interval '1 s')",
        )
        .await
        .unwrap();
    let acquire = baton::__seam::pg_lock_acquire();
    let (ttl_ms, retention_ms) = (60_000.0f64, 3_600_000.0f64);

    a.batch_execute("BEGIN").await.unwrap();
    let granted: Option<i64> = a
        .query_one(acquire, &[&"race", &"token-a", &ttl_ms, &retention_ms])
        .await
        .expect("A's acquisition")
        .get(0);
    assert!(granted.is_some(), "A should be granted the free lock");

    let deleted = common::cleanup_racing_open_grant(&observer, &a, b, locks.2).await;

    let token: Option<String> = observer
        .query_opt("SELECT token FROM baton_locks WHERE key = 'race'", &[])
        .await
        .unwrap()
        .and_then(|r| r.get(0));
    assert_eq!(
        (deleted, token.as_deref()),
        (0, Some("token-a")),
        "the cleanup deleted the row granted to A"
    );
    let second: Option<i64> = observer
        .query_one(acquire, &[&"race", &"token-b", &ttl_ms, &retention_ms])
        .await
        .unwrap()
        .get(0);
    assert_eq!(second, None, "a second holder was granted the lock");
}

/// The backends of `baton` connections waiting for a lock.
async fn baton_backends_waiting(observer: &tokio_postgres::Client) -> Vec<i32> {
    observer
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = 'baton' AND wait_event_type = 'Lock' ORDER BY pid",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// An acquisition that times out on the client must not keep running on the server: another
/// session holds the lock row, the client gives up at its response timeout, and then the
/// server ends the statement (`statement_timeout`) and the client closes that connection
/// rather than lending it out with the statement queued on it: its backend goes away while
/// the row is still locked. The outcome is reported as unknown (a timeout, which may have
/// taken the lock), never as "held by someone else", and the client keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquisition_ends_on_the_server_and_its_connection_is_retired() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let url = pg.url();
    let client = Client::builder(url.clone())
        .response_timeout(Duration::from_millis(500))
        .pool_size(1)
        .connect()
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let first = client.locks().try_acquire("stuck", ttl).await.unwrap();
    first.expect("a free lock").release().await.unwrap();

    let (observer, blocker) = (sql(&url).await, sql(&url).await);
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .query_one(
            "SELECT 1 FROM baton_locks WHERE key = $1 FOR UPDATE",
            &[&row("stuck")],
        )
        .await
        .unwrap();

    let locks = client.locks();
    let attempt = tokio::spawn(async move { locks.try_acquire("stuck", ttl).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    let stuck = loop {
        if let Some(pid) = baton_backends_waiting(&observer).await.first() {
            break *pid;
        }
        assert!(Instant::now() < deadline, "the acquisition never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let outcome = attempt.await.unwrap();
    match &outcome {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
        Ok(found) => panic!(
            "a timed-out acquisition was reported as {}",
            if found.is_some() { "granted" } else { "held" }
        ),
    }

    // The row is still locked: only the server's timeout and a closed socket end that backend.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: bool = observer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                &[&stuck],
            )
            .await
            .unwrap()
            .get(0);
        if !alive {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "backend {stuck} still runs the timed-out acquisition (or waits in the pool)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        client
            .locks()
            .try_acquire("unrelated", ttl)
            .await
            .expect("the next operation runs on a healthy connection")
            .is_some(),
        "an unrelated lock is free"
    );
    blocker.batch_execute("COMMIT").await.unwrap();
    assert!(
        pg.log()
            .contains("canceling statement due to statement timeout"),
        "the server did not cancel the statement by its timeout"
    );
}

/// A client waiting on one lock hears a bounded share of the notifications about other locks:
/// they are spread over 64 channels and it listens only on its lock's. 256 other locks are
/// taken and released (each release notifies) while it waits; then its own lock is released,
/// which wakes it after everything notified before (notifications arrive in commit order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_bounded_share_of_other_locks_notifications() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let url = pg.url();
    let (holder, waiter) = (client_at(&url).await, client_at(&url).await);
    let observer = sql(&url).await;
    let ttl = Duration::from_secs(30);
    let watched = holder
        .locks()
        .try_acquire("watched", ttl)
        .await
        .unwrap()
        .expect("free");
    let opts = AcquireOptions::builder()
        .max_backoff(Duration::from_secs(20))
        .wait(Duration::from_secs(25))
        .build()
        .unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move {
        w.locks()
            .acquire("watched", ttl, &opts)
            .await
            .expect("the waiter's acquisition")
    });
    // The waiter's hub listens once it subscribed (only the waiter has one).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if listening > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    const OTHERS: u64 = 256;
    for i in 0..OTHERS {
        let g = holder
            .locks()
            .try_acquire(&format!("other-{i}"), ttl)
            .await
            .unwrap()
            .expect("free");
        assert!(g.release().await.unwrap());
    }
    assert!(watched.release().await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    let heard = baton::__seam::pg_notifications_received(&waiter);
    assert!(got.release().await.unwrap());
    // 1/64 of 256 is 4 on average; 8 times that is a generous bound for a fixed hash.
    assert!(
        (1..=32).contains(&heard),
        "the waiter heard {heard} notifications for one lock among {OTHERS} others"
    );
}
