//! The failover coordinator on PostgreSQL (feature `postgres`): the same workers, events and
//! guarantees as on Redis, on one private server shared by this binary
//! (`baton::testing::PgServer::shared`), each test on its own job names.
#![cfg(all(feature = "postgres", feature = "testing"))]

mod common;

use std::time::Duration;

use baton::testing::PgServer;
use baton::{Client, Event, FailoverConfig};
use common::Logs;
use tokio::time::Instant;

const WAKE: Duration = Duration::from_secs(5);

fn pg() -> &'static PgServer {
    PgServer::shared().expect("start PostgreSQL (install it: apt-get install postgresql)")
}

/// The workers' URL: the DML-only role on the shared server's database, which its owner
/// migrated once (`PgServer::grant_worker_role`). `pg().url()` stays the owner's.
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
    Client::connect(worker_url().await)
        .await
        .expect("connect to PostgreSQL")
}

fn job(key: &str) -> FailoverConfig {
    FailoverConfig::builder(key)
        .lease(Duration::from_secs(10))
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
    let mut a = client.failover().start(job("pg:first"));
    let got = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(got.attempt, 1);
    let mut b = client.failover().start(job("pg:first"));
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
    let mut a = client.failover().start(job("pg:fail"));
    let first = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let mut b = client.failover().start(job("pg:fail"));
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

/// Reads `w` to its end, skipping retryable `Error` events; returns every event (errors too).
async fn drain(w: &mut baton::Worker, within: Duration) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = Instant::now() + within;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, w.next_event()).await {
        out.push(ev);
    }
    out
}

/// The acceptance test of the restart: a server crash (immediate shutdown, fsync on) in the
/// middle of 12 jobs × 3 workers loses no job and grants no attempt twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_restart_mid_run_loses_no_job_and_grants_no_attempt_twice() {
    let mut pg = PgServer::start_durable().expect("start a durable PostgreSQL");
    let url = worker_url_of(&pg).await;
    let clients = [
        Client::connect(url.clone()).await.unwrap(),
        Client::connect(url.clone()).await.unwrap(),
    ];
    let jobs: Vec<String> = (0..12).map(|i| format!("restart:{i}")).collect();
    let mut tasks = Vec::new();
    for (i, key) in jobs.iter().enumerate() {
        for w in 0..3 {
            let client = clients[(i + w) % 2].clone();
            let cfg = job(key);
            tasks.push(tokio::spawn(async move {
                let mut worker = client.failover().start(cfg);
                let mut granted = Vec::new();
                let mut events = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(60);
                while let Ok(Some(ev)) =
                    tokio::time::timeout_at(deadline, worker.next_event()).await
                {
                    if let Event::Acquired(a) = &ev {
                        granted.push((a.attempt, a.fencing_token, Instant::now()));
                    }
                    let name = format!("{ev:?}");
                    if let Event::Acquired(a) = ev {
                        // Work that spans the restart, then done(), retried by the worker.
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        let _ = a.done().await;
                    }
                    events.push(name);
                }
                (granted, events)
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old_pid = pg.pid();
    let restarted_at = Instant::now();
    pg.restart_immediate().expect("restart PostgreSQL");
    assert_ne!(pg.pid(), old_pid);
    let mut granted: std::collections::BTreeMap<String, Vec<(u64, u64, Instant)>> =
        Default::default();
    for (i, t) in tasks.into_iter().enumerate() {
        let (g, events) = t.await.unwrap();
        assert!(
            events
                .last()
                .is_some_and(|e| e.starts_with("Completed") || e.starts_with("LeaseLost")),
            "worker {i} did not end: {events:?}"
        );
        granted.entry(jobs[i / 3].clone()).or_default().extend(g);
    }
    // Work was in flight across the crash: granted before it, done (700 ms later) after it.
    assert!(
        granted
            .values()
            .flatten()
            .any(|(_, _, at)| *at < restarted_at),
        "no attempt was held across the restart"
    );
    for key in &jobs {
        let attempts = granted.get(key).cloned().unwrap_or_default();
        let mut numbers: Vec<u64> = attempts.iter().map(|(n, _, _)| *n).collect();
        let before = numbers.len();
        numbers.sort();
        numbers.dedup();
        assert_eq!(
            numbers.len(),
            before,
            "{key}: an attempt was granted twice: {attempts:?}"
        );
        assert!(!numbers.is_empty(), "{key} was never granted");
        let status = clients[0]
            .failover()
            .job_status(key.as_str())
            .await
            .unwrap();
        assert_eq!(status.state, baton::JobState::Done, "{key}: {status:?}");
    }
}

/// The client's LISTEN connection killed by the server (`pg_terminate_backend`): it comes back
/// by itself, the backup looks again, and a failure afterwards still wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listen_connection_is_re_established_and_wake_ups_still_arrive() {
    let client = client().await;
    let mut a = client.failover().start(job("pg:listen"));
    let held = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let mut b = client.failover().start(job("pg:listen"));
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    // The hub sends its LISTEN on its own connection, asynchronously to the backup's `Locked`:
    // kill that connection as soon as the server shows it (bounded), not before it exists.
    let looked = Instant::now();
    loop {
        let killed = pg()
            .psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()",
            )
            .unwrap();
        if killed.trim() != "0" {
            break;
        }
        assert!(
            looked.elapsed() < WAKE,
            "no LISTEN connection found to kill within {WAKE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The hub reconnects (backoff from 0) and the backup re-reads; then the failure wakes it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    held.fail("x").await.unwrap();
    loop {
        match next(&mut b, WAKE).await {
            Event::Acquired(x) => {
                assert_eq!(x.attempt, 2);
                x.done().await.unwrap();
                break;
            }
            Event::Locked { .. } | Event::Error { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(t0.elapsed() < WAKE, "the takeover waited out the lease");
    drain(&mut a, WAKE).await;
}

/// Job names are any UTF-8 (catalogue row 7): a newline and non-ASCII characters round-trip and
/// still wake backups (the notification's topic is split off at its last newline); a NUL byte,
/// which PostgreSQL's text cannot store, is refused with a clear error instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_and_newline_names_work_and_a_nul_is_refused() {
    let client = client().await;
    let name = "pg:line\nbreak:ジョブ";
    let mut a = client.failover().start(job(name));
    let held = match next(&mut a, WAKE).await {
        Event::Acquired(x) => x,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let mut b = client.failover().start(job(name));
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    let t0 = Instant::now();
    held.fail("x").await.unwrap();
    match next(&mut b, WAKE).await {
        Event::Acquired(x) => x.done().await.unwrap(),
        other => panic!("expected Acquired, got {other:?}"),
    }
    assert!(t0.elapsed() < WAKE, "the wake-up was lost");
    assert_eq!(
        client.failover().job_status(name).await.unwrap().state,
        baton::JobState::Done
    );
    let mut nul = client.failover().start(job("pg:nul\0byte"));
    match next(&mut nul, WAKE).await {
        Event::Error { kind, message, .. } => {
            assert_eq!(kind, baton::ErrorKind::Unsupported);
            assert!(message.contains("NUL"), "{message}");
        }
        other => panic!("expected an Unsupported error, got {other:?}"),
    }
}

/// A `tracing` writer into a shared buffer.
/// Connecting warns when PostgreSQL may lose acknowledged commits (the shared fixture runs with
/// fsync and synchronous_commit off), and stays quiet on a durable server.
#[tokio::test]
async fn connecting_warns_about_unsafe_durability_settings() {
    let logs = Logs::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::WARN));

    let _unsafe = Client::connect(pg().url()).await.unwrap();
    let warned = logs.text();
    assert!(
        warned.contains("fsync is off") && warned.contains("synchronous_commit is off"),
        "{warned}"
    );

    logs.clear();
    let durable = PgServer::start_durable().unwrap();
    let _safe = Client::connect(durable.url()).await.unwrap();
    let quiet = logs.text();
    assert!(!quiet.contains("may lose"), "{quiet}");
}

/// `Client::migrate` creates every table and sequence baton uses on PostgreSQL, in a fresh
/// database, before any worker ran; and it can run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_whole_schema_and_is_idempotent() {
    pg().psql("CREATE DATABASE migrate_test").unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/migrate_test", pg().port());
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let query = "SELECT to_regclass('baton_jobs') IS NOT NULL, \
                 to_regclass('baton_locks') IS NOT NULL, \
                 to_regclass('baton_advisory_fence') IS NOT NULL";
    let before = admin.query_one(query, &[]).await.unwrap();
    assert_eq!(
        (
            before.get::<_, bool>(0),
            before.get::<_, bool>(1),
            before.get::<_, bool>(2)
        ),
        (false, false, false)
    );
    let client = Client::connect(url).await.unwrap();
    client.migrate().await.unwrap();
    client.migrate().await.unwrap();
    let after = admin.query_one(query, &[]).await.unwrap();
    assert_eq!(
        (
            after.get::<_, bool>(0),
            after.get::<_, bool>(1),
            after.get::<_, bool>(2)
        ),
        (true, true, true)
    );
}

/// The periodic cleanups delete only what may go: a job row past its expiry (it reads as
/// absent already), and a lock row whose fence retention passed and whose lock is free
/// (released, or its lease ended). A live lock is never deleted, whatever its retention.
#[tokio::test]
async fn the_cleanups_delete_only_expired_jobs_and_free_locks_past_their_retention() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let (client, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let [jobs, locks] = baton::__seam::pg_schema_and_cleanup();
    assert_eq!((jobs.0, locks.0), ("baton_jobs", "baton_locks"));
    client
        .batch_execute(jobs.1)
        .await
        .expect("the jobs' schema");
    client
        .batch_execute(locks.1)
        .await
        .expect("the locks' schema");
    client
        .batch_execute(
            "INSERT INTO baton_jobs (key, state, expires_at) VALUES
             ('baton:{old}', 'DONE', now() - interval '1 s'),
             ('baton:{live}', '2', now() + interval '1 hour'),
             ('baton:{done}', 'DONE', now() + interval '1 hour');
             INSERT INTO baton_locks VALUES
             ('released',    NULL, NULL,                      1, now() - interval '1 s'),
             ('lease-ended', 't1', now() - interval '1 s',    2, now() - interval '1 s'),
             ('held',        't2', now() + interval '1 hour', 3, now() - interval '1 s'),
             ('fence-kept',  NULL, NULL,                      4, now() + interval '1 hour'),
             ('held-kept',   't3', now() + interval '1 hour', 5, now() + interval '1 hour')",
        )
        .await
        .expect("the rows");
    client
        .batch_execute(jobs.2)
        .await
        .expect("the jobs' cleanup");
    client
        .batch_execute(locks.2)
        .await
        .expect("the locks' cleanup");
    let keys = |table: &str| {
        let sql = format!("SELECT key FROM {table} ORDER BY key");
        let client = &client;
        async move {
            client
                .query(&sql, &[])
                .await
                .expect("read")
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("baton_jobs").await, ["baton:{done}", "baton:{live}"]);
    assert_eq!(
        keys("baton_locks").await,
        ["fence-kept", "held", "held-kept"]
    );
}

async fn session(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c
}

/// Runs a worker's grant statement (see `baton::__seam::pg_job_grant`) on `db`; whether it
/// wrote.
async fn grant(
    db: &tokio_postgres::Client,
    key: &str,
    version: Option<i64>,
    fence: u64,
    token: &str,
) -> bool {
    let (sql, params) = baton::__seam::pg_job_grant(key, version, 1, fence, token).unwrap();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    !db.query(&sql, &params).await.expect("a grant").is_empty()
}

/// The cleanup races a grant: session A grants an attempt on an expired job row (which reads
/// as absent) in a transaction left open; session B's cleanup picked that row from its snapshot
/// and waits for A's row lock; A commits. The cleanup must then see the row's new expiry and
/// keep it: a deleted row would let the next worker find no job and grant attempt 1 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_never_deletes_a_job_granted_while_it_waited() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let url = pg.url();
    let (observer, a, b) = (
        session(&url).await,
        session(&url).await,
        session(&url).await,
    );
    let [jobs, _] = baton::__seam::pg_schema_and_cleanup();
    observer.batch_execute(jobs.1).await.expect("the schema");
    observer
        .batch_execute(
            "INSERT INTO baton_jobs (key, state, fence, expires_at, version) \
             VALUES ('baton:{race}', 'DONE', 3, now() - interval '1 s', 7)",
        )
        .await
        .unwrap();

    a.batch_execute("BEGIN").await.unwrap();
    assert!(
        grant(&a, "baton:{race}", Some(7), 4, "token-a").await,
        "A should be granted attempt 1 of the expired job"
    );
    let deleted = common::cleanup_racing_open_grant(&observer, &a, b, jobs.2).await;

    let holder: Option<String> = observer
        .query_opt(
            "SELECT lease_token FROM baton_jobs WHERE key = 'baton:{race}'",
            &[],
        )
        .await
        .unwrap()
        .and_then(|r| r.get(0));
    assert_eq!(
        (deleted, holder.as_deref()),
        (0, Some("token-a")),
        "the cleanup deleted the job row granted to A"
    );
    // A worker that now finds no row would insert attempt 1 again: a second holder.
    assert!(
        !grant(&observer, "baton:{race}", None, 5, "token-b").await,
        "attempt 1 was granted twice"
    );
}
