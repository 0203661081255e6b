//! PostgreSQL advisory locks (`baton::advisory`, issue 14) against a private PostgreSQL
//! (`baton::testing::PgServer`): one server for the whole file, each test on keys of its own.
#![cfg(all(feature = "postgres", feature = "testing"))]

use baton::prelude::*;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use baton::advisory::tokio_postgres::types::Type;
use baton::advisory::{AdvisoryKey, AdvisoryMode, AdvisoryOptions};
use baton::testing::PgServer;
use baton::{Client, ErrorKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The file's server, dropped (stopped, its directory removed) at process exit.
static PG: Mutex<Option<PgServer>> = Mutex::new(None);
static URL: OnceLock<String> = OnceLock::new();
/// The workers' URL: the DML-only role, on the database its owner migrated once.
static WORKER_URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

extern "C" fn stop_pg() {
    if let Ok(mut pg) = PG.lock() {
        drop(pg.take());
    }
}

fn url() -> String {
    URL.get_or_init(|| {
        let t0 = Instant::now();
        let pg = PgServer::start().expect("start PostgreSQL");
        let url = pg.url();
        eprintln!("PgServer::start took {:?}", t0.elapsed());

        *PG.lock().unwrap() = Some(pg);
        // SAFETY: `stop_pg` is an `extern "C" fn()` that only takes a mutex and drops a value.
        unsafe { libc::atexit(stop_pg) };
        url
    })
    .clone()
}

fn psql(sql: &str) -> String {
    url();
    let pg = PG.lock().unwrap();
    pg.as_ref().unwrap().psql(sql).expect("psql")
}

/// A client as the DML-only worker role.
async fn client() -> Client {
    let worker = WORKER_URL
        .get_or_init(|| async {
            let owner = Client::connect(url()).await.expect("connect as the owner");
            owner.migrate().await.expect("migrate as the owner");
            let pg = PG.lock().unwrap();
            pg.as_ref()
                .expect("started by url()")
                .grant_worker_role("postgres")
                .expect("grant the worker role")
        })
        .await
        .clone();
    Client::builder(worker)
        .connect()
        .await
        .expect("connect to PostgreSQL")
}

fn opts() -> AdvisoryOptions {
    AdvisoryOptions::default()
}

const EX: AdvisoryMode = AdvisoryMode::Exclusive;
const SH: AdvisoryMode = AdvisoryMode::Shared;

/// The pids of the backends holding `key` granted, from `pg_locks` (via psql, not baton).
fn holders(key: AdvisoryKey) -> Vec<i32> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let out = psql(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid} ORDER BY pid"
    ));
    out.lines().map(|l| l.trim().parse().unwrap()).collect()
}

#[tokio::test]
async fn an_unlock_from_another_session_is_impossible_through_the_api() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:unlock-elsewhere");
    let a = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();
    assert_eq!(holders(key), vec![a.backend_pid()]);

    // B is another session: it does not get the lock, and there is nothing it can release.
    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_none());
    // An unrelated guard, released and dropped, leaves A's lock alone.
    let other = locks
        .try_acquire(
            AdvisoryKey::hashed("adv:test:unlock-elsewhere:other"),
            EX,
            &opts(),
        )
        .await
        .unwrap()
        .unwrap();
    other.release().await.unwrap();
    let dropped = locks
        .try_acquire(
            AdvisoryKey::hashed("adv:test:unlock-elsewhere:other"),
            EX,
            &opts(),
        )
        .await
        .unwrap()
        .unwrap();
    drop(dropped);
    // A bounded blocking acquire of the same key fails with the typed error.
    let bounded = AdvisoryOptions::builder()
        .wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = locks.acquire(key, EX, &bounded).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // Even raw SQL from another session cannot unlock it (PostgreSQL's rule, shown here).
    let k = key.as_i64().unwrap();
    assert_eq!(psql(&format!("SELECT pg_advisory_unlock({k})")).trim(), "f");
    assert_eq!(holders(key), vec![a.backend_pid()], "A's lock is A's");
    assert!(!a.is_lost());

    a.release().await.unwrap();
    assert!(holders(key).is_empty());
}

#[tokio::test]
async fn a_session_guard_keeps_its_lock_across_a_rolled_back_transaction() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::from((14, 2));
    // A fast heartbeat: it beats inside the holder's transactions below.
    let fast = AdvisoryOptions::builder()
        .heartbeat(Duration::from_millis(20))
        .build()
        .unwrap();
    let a = locks.try_acquire(key, EX, &fast).await.unwrap().unwrap();
    a.client()
        .batch_execute("BEGIN; CREATE TEMP TABLE adv_scratch (x int); ROLLBACK")
        .await
        .unwrap();
    // An aborted transaction too (an error inside, then ROLLBACK). The heartbeats answered
    // "current transaction is aborted" meanwhile: the session is alive, no loss.
    a.client().batch_execute("BEGIN").await.unwrap();
    assert!(a.client().batch_execute("SELECT 1/0").await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!a.is_lost(), "{:?}", a.loss_reason());
    a.client().batch_execute("ROLLBACK").await.unwrap();

    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_none());
    assert_eq!(holders(key), vec![a.backend_pid()]);
    assert!(!a.is_lost());
    a.release().await.unwrap();
    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_some());
}

#[tokio::test]
async fn stacked_acquires_in_one_process_contend_like_two_sessions() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::from(0x5eed_0001_i64);
    let first = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();
    // Forbidden by construction: the second guard is another session, not a re-entry.
    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_none());
    let ran = locks
        .try_with_xact_lock(key, EX, &opts(), |_tx| {
            Box::pin(async { Ok::<_, BoxError>(()) })
        })
        .await
        .unwrap();
    assert!(ran.is_none(), "the transaction form contends too");
    // Another key space: (0, 0x5eed0001) is not the same lock as the bigint 0x5eed0001.
    let pair = locks
        .try_acquire((0, 0x5eed_0001), EX, &opts())
        .await
        .unwrap()
        .unwrap();
    let (c1, o1, s1) = key.pg_locks_ids();
    let (c2, o2, s2) = pair.advisory_key().pg_locks_ids();
    assert_eq!((c1, o1, s1, s2), (c2, o2, 1, 2));
    assert_eq!(holders(pair.advisory_key()), vec![pair.backend_pid()]);
    first.release().await.unwrap();
    pair.release().await.unwrap();
    let again = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();
    again.release().await.unwrap();
}

/// The increment, read then written back: one round trip each (types given, no prepare).
const READ: &str = "SELECT n FROM adv_counter WHERE id = $1";
const WRITE: &str = "UPDATE adv_counter SET n = $2 WHERE id = $1";

const TASKS: usize = 16;
const ROUNDS: usize = 200;

/// Rounds per task of the session form: every session guard is a new PostgreSQL connection (a
/// backend process forked, then ended), about 5-8 ms of CPU each on a loaded 2-core CI machine,
/// so 16 × 200 takes about 25 s there; CI runs 16 × 50 (800 guards, ~6 s).
/// `BATON_ADVISORY_SESSION_ROUNDS=200` runs the full 3200.
fn session_rounds() -> usize {
    std::env::var("BATON_ADVISORY_SESSION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn counter_row(id: &str) {
    psql(&format!(
        "CREATE TABLE IF NOT EXISTS adv_counter (id text PRIMARY KEY, n bigint NOT NULL); \
         GRANT SELECT, UPDATE ON adv_counter TO {}; \
         INSERT INTO adv_counter VALUES ('{id}', 0) ON CONFLICT (id) DO UPDATE SET n = 0",
        baton::testing::PG_WORKER_ROLE
    ));
}

fn counter(id: &str) -> i64 {
    psql(&format!("SELECT n FROM adv_counter WHERE id = '{id}'"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_of_guarded_increments_session_form_are_exact() {
    let id = "session";
    let rounds = session_rounds();
    counter_row(id);
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:increments:session");
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let guard = locks.acquire(key, EX, &opts()).await.unwrap();
                let c = guard.client();
                let n: i64 = c.query_typed(READ, &[(&id, Type::TEXT)]).await.unwrap()[0].get(0);
                tokio::task::yield_now().await;
                c.query_typed(WRITE, &[(&id, Type::TEXT), (&(n + 1), Type::INT8)])
                    .await
                    .unwrap();
                seen.push((n, guard.fencing_token()));
                guard.release().await.unwrap();
            }
            seen
        }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.unwrap());
    }
    eprintln!(
        "{} session-guarded increments in {:?}",
        TASKS * rounds,
        t0.elapsed()
    );
    assert_eq!(counter(id), (TASKS * rounds) as i64);
    assert_eq!(seen.len(), TASKS * rounds);
    // Every value was read once, and the fencing tokens rise with the holders' order.
    seen.sort();
    for (i, pair) in seen.windows(2).enumerate() {
        assert_eq!(pair[0].0, i as i64);
        assert!(pair[0].1 < pair[1].1, "tokens out of order: {pair:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_times_200_guarded_increments_transaction_form_are_exact() {
    let id = "xact";
    counter_row(id);
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:increments:xact");
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                locks
                    .with_xact_lock(key, EX, &opts(), |tx| {
                        Box::pin(async move {
                            let n: i64 =
                                tx.query_typed(READ, &[(&id, Type::TEXT)]).await?[0].get(0);
                            tokio::task::yield_now().await;
                            tx.query_typed(WRITE, &[(&id, Type::TEXT), (&(n + 1), Type::INT8)])
                                .await?;
                            Ok::<_, BoxError>(())
                        })
                    })
                    .await
                    .unwrap()
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    eprintln!(
        "{} transaction-guarded increments in {:?}",
        TASKS * ROUNDS,
        t0.elapsed()
    );
    assert_eq!(counter(id), (TASKS * ROUNDS) as i64);
}

#[tokio::test]
async fn the_transaction_form_commits_on_ok_and_rolls_back_on_err() {
    let id = "xact-rollback";
    counter_row(id);
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:xact-rollback");
    // The work's error comes back inside `Ok`: baton itself did not fail.
    let out: Result<(), BoxError> = locks
        .with_xact_lock(key, EX, &opts(), |tx| {
            Box::pin(async move {
                tx.execute("UPDATE adv_counter SET n = n + 1 WHERE id = $1", &[&id])
                    .await?;
                Err::<(), BoxError>("the work failed".into())
            })
        })
        .await
        .expect("baton's part succeeded");
    assert_eq!(out.unwrap_err().to_string(), "the work failed");
    assert_eq!(counter(id), 0, "rolled back");
    // The lock ended with the transaction.
    assert!(holders(key).is_empty());
    let n: i64 = locks
        .with_xact_lock(key, EX, &opts(), |tx| {
            Box::pin(async move {
                let n = tx
                    .query_one(
                        "UPDATE adv_counter SET n = n + 1 WHERE id = $1 RETURNING n",
                        &[&id],
                    )
                    .await?
                    .get(0);
                Ok::<_, BoxError>(n)
            })
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(counter(id), 1, "committed");
    assert!(holders(key).is_empty());
}

#[tokio::test]
async fn row_34_a_terminated_session_fires_the_loss_signal_and_release_says_lost() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:row34");
    let o = AdvisoryOptions::builder()
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let guard = locks.try_acquire(key, EX, &o).await.unwrap().unwrap();
    assert!(!guard.is_lost());
    let pid = guard.backend_pid();
    assert_eq!(
        psql(&format!("SELECT pg_terminate_backend({pid})")).trim(),
        "t"
    );
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss signal fires within 5 s");
    eprintln!("loss signal after {:?}", t0.elapsed());
    assert!(guard.is_lost());
    assert!(guard.loss_reason().is_some());
    // Lost before the release: it says so, it was no longer held.
    assert!(!guard.release().await.unwrap());
    // The server frees it as the terminated backend exits (just after its FATAL message).
    let deadline = Instant::now() + Duration::from_secs(5);
    let next = loop {
        if let Some(next) = locks.try_acquire(key, EX, &o).await.unwrap() {
            break next;
        }
        assert!(Instant::now() < deadline, "the lock outlived its session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_silent_backend_is_found_by_the_heartbeat() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:silent");
    let o = AdvisoryOptions::builder()
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let guard = locks.try_acquire(key, EX, &o).await.unwrap().unwrap();
    let pid = guard.backend_pid().to_string();
    // The backend stops answering, its socket stays open: only the heartbeat can tell.
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(stop.success());
    let t0 = Instant::now();
    let fired = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status();
    fired.expect("the heartbeat finds a silent backend within 5 s");
    eprintln!("silent backend found after {:?}", t0.elapsed());
    assert!(
        guard.loss_reason().unwrap().contains("heartbeat"),
        "{:?}",
        guard.loss_reason()
    );
    assert!(!guard.release().await.unwrap());
}

#[tokio::test]
async fn shared_guards_coexist_and_exclude_an_exclusive_one() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:shared");
    let s1 = locks.try_acquire(key, SH, &opts()).await.unwrap().unwrap();
    let s2 = locks.try_acquire(key, SH, &opts()).await.unwrap().unwrap();
    assert_eq!(s1.mode(), SH);
    let mut pids = vec![s1.backend_pid(), s2.backend_pid()];
    pids.sort();
    assert_eq!(holders(key), pids);
    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_none());
    let ex = locks
        .try_with_xact_lock(key, EX, &opts(), |_tx| {
            Box::pin(async { Ok::<_, BoxError>(()) })
        })
        .await
        .unwrap();
    assert!(ex.is_none());
    let sh = locks
        .try_with_xact_lock(key, SH, &opts(), |_tx| {
            Box::pin(async { Ok::<_, BoxError>(7) })
        })
        .await
        .unwrap()
        .transpose()
        .unwrap();
    assert_eq!(sh, Some(7));
    s1.release().await.unwrap();
    assert!(locks.try_acquire(key, EX, &opts()).await.unwrap().is_none());
    s2.release().await.unwrap();
    let ex = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();
    assert!(locks.try_acquire(key, SH, &opts()).await.unwrap().is_none());
    ex.release().await.unwrap();
}

#[tokio::test]
async fn a_blocking_acquire_times_out_while_held_and_is_woken_when_released() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:blocking");
    let holder = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();

    let short = AdvisoryOptions::builder()
        .wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let err = locks.acquire(key, EX, &short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The transaction form the same way.
    let err = locks
        .with_xact_lock(key, EX, &short, |_tx| {
            Box::pin(async { Ok::<_, BoxError>(()) })
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");

    // Released mid-wait: the waiter is granted.
    let long = AdvisoryOptions::builder()
        .wait(Duration::from_secs(20))
        .build()
        .unwrap();
    let waiter = {
        let locks = locks.clone();
        let long = long.clone();
        tokio::spawn(async move { locks.acquire(key, EX, &long).await })
    };
    let xact_waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_xact_lock(key, SH, &long, |_tx| {
                    Box::pin(async { Ok::<_, BoxError>("ran") })
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|ran| ran.map_err(|e| e.to_string()))
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lock is held"
    );
    let released = Instant::now();
    holder.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("granted well before its wait ends")
        .unwrap()
        .unwrap();
    eprintln!("waiter granted {:?} after the release", released.elapsed());
    assert_eq!(holders(key), vec![got.backend_pid()]);
    // The shared transaction waits behind the exclusive waiter, then runs.
    got.release().await.unwrap();
    let ran = tokio::time::timeout(Duration::from_secs(5), xact_waiter)
        .await
        .expect("the transaction form is granted too")
        .unwrap()
        .unwrap();
    assert_eq!(ran, "ran");
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_acquisitions() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:fencing");
    let mut last = 0;
    for i in 0..6 {
        let guard = if i % 2 == 0 {
            locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap()
        } else {
            // Bounded: a dropped guard that kept its lock would fail here, not hang.
            let bounded = AdvisoryOptions::builder()
                .wait(Duration::from_secs(5))
                .build()
                .unwrap();
            locks.acquire(key, EX, &bounded).await.unwrap()
        };
        assert!(
            guard.fencing_token() > last,
            "{} <= {last}",
            guard.fencing_token()
        );
        last = guard.fencing_token();
        if i == 3 {
            drop(guard); // dropped, not released: the next one still gets a larger token
        } else {
            guard.release().await.unwrap();
        }
    }
    // The sequence is a plain PostgreSQL sequence, readable by the resource's own SQL.
    let current: u64 = psql("SELECT last_value FROM baton_advisory_fence")
        .trim()
        .parse()
        .unwrap();
    assert!(current >= last);
}

#[tokio::test]
async fn a_redis_client_refuses_advisory_locks() {
    let client = Client::builder("redis://127.0.0.1:1/")
        .build_lazy()
        .unwrap();
    let locks = client.advisory_locks();
    let err = locks.try_acquire(1_i64, EX, &opts()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("advisory locks"), "{err}");
    let err = locks.acquire(1_i64, EX, &opts()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = locks
        .with_xact_lock(1_i64, EX, &opts(), |_tx| {
            Box::pin(async { Ok::<_, BoxError>(()) })
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

/// The pids of the sessions waiting (not granted) for `key`.
fn waiters(key: AdvisoryKey) -> usize {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    psql(&format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
    ))
    .trim()
    .parse()
    .unwrap()
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_no_session_queued_for_the_lock() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::hashed("adv:test:abandoned-waiter");
    let holder = locks.try_acquire(key, EX, &opts()).await.unwrap().unwrap();
    let session = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire(key, EX, &opts()).await })
    };
    let xact = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_xact_lock(key, EX, &opts(), |_tx| {
                    Box::pin(async { Ok::<_, BoxError>(()) })
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|ran| ran.map_err(|e| e.to_string()))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiters(key) < 2 {
        assert!(Instant::now() < deadline, "the two waiters never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both callers give up (their futures are dropped mid-wait).
    session.abort();
    xact.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiters(key) > 0 {
        assert!(
            Instant::now() < deadline,
            "abandoned waiters still queued in PostgreSQL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    // Nobody took the lock behind our back, and the pool still works.
    assert!(holders(key).is_empty());
    let ran = locks
        .try_with_xact_lock(key, EX, &opts(), |tx| {
            Box::pin(async move {
                let one: i32 = tx.query_one("SELECT 1", &[]).await?.get(0);
                Ok::<_, BoxError>(one)
            })
        })
        .await
        .unwrap()
        .transpose()
        .unwrap();
    assert_eq!(ran, Some(1));
}

#[tokio::test]
async fn a_release_after_an_unlock_behind_the_guards_back_reports_the_loss() {
    let locks = client().await.advisory_locks();
    let key = AdvisoryKey::from((14, 3));
    let guard = locks.try_acquire(key, SH, &opts()).await.unwrap().unwrap();
    let unlocked: bool = guard
        .client()
        .query_one("SELECT pg_advisory_unlock_shared(14, 3)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(unlocked);
    // PostgreSQL says this session did not hold it any more.
    assert!(!guard.release().await.unwrap());
}
