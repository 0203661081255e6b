//! PostgreSQL (feature `postgres`): `pg-job-cycle`, baton's failover job cycle on a
//! `postgres://` client, and `pg-lock-cycle`, its mutex's uncontended acquire → release, each
//! against a hand-written floor of the same statements.
//!
//! `pg-lock-cycle`'s floor: one connection, the mutex's two statements prepared once (the
//! acquire's `INSERT … ON CONFLICT DO UPDATE … WHERE free … RETURNING fence`, the release's
//! `UPDATE … WHERE token` with its `pg_notify`), one key; baton: `locks().try_acquire(key,
//! ttl)` then `guard.release()` (no watchdog), its own key.
//!
//! One cycle is what `uncontended` measures on Redis: start a worker for a new job, `Acquired`,
//! `done()`, `Completed`, one at a time. The floor is what a careful user writes by hand for the
//! same protocol on `tokio-postgres`, on one connection, every statement prepared once: read the
//! row and the server's clock; `INSERT` the grant (with `pg_notify`); read again before
//! finishing; `UPDATE … WHERE version` to `DONE` (with `pg_notify`). Four round trips. The two
//! sides alternate sample by sample against one private server (the fixture's: `fsync` off, this
//! measures baton, not the disk).
//!
//! Round trips are counted, not inferred: for one counting round per side the server logs every
//! protocol step (`log_min_duration_statement = 0`: each prepare is a `parse` line, each
//! execution an `execute` line; tokio-postgres sends each as one round trip), and the lines
//! touching `baton_jobs` are counted per cycle.
//!
//! Nothing is asserted about timings.

use std::time::Duration;

use baton::testing::PgServer;
use baton::{Client, Event, FailoverConfig};
use serde_json::json;
use tokio::time::Instant;

use crate::harness::Report;
use crate::stats::{Row, Samples};
use crate::Opts;

const OBSERVE: &str = "
SELECT j.state, j.lease_token,
       CASE WHEN j.lease_expires > c.now
            THEN ceil(extract(epoch FROM j.lease_expires - c.now) * 1000)::bigint END,
       j.fence, j.expires_at > c.now, j.version,
       (extract(epoch FROM c.now) * 1000000)::bigint
FROM (SELECT clock_timestamp() AS now) c
LEFT JOIN baton_jobs j ON j.key = $1";

const GRANT: &str = "
WITH c AS (SELECT clock_timestamp() AS now),
u AS (INSERT INTO baton_jobs AS j (key, state, lease_token, lease_holder, lease_expires, fence,
                                   failure, expires_at, version)
      SELECT $1, '1', $2, 'floor', c.now + interval '30 seconds',
             greatest(1, (extract(epoch FROM c.now) * 1000000)::bigint), NULL,
             c.now + interval '1 day', 1
      FROM c ON CONFLICT (key) DO NOTHING RETURNING 1)
SELECT pg_notify('baton', $1 || E'\\n' || 'acquired:1') FROM u";

const DONE: &str = "
WITH c AS (SELECT clock_timestamp() AS now),
u AS (UPDATE baton_jobs j SET state = 'DONE', expires_at = c.now + interval '1 day',
             lease_token = NULL, lease_holder = NULL, lease_expires = NULL,
             version = j.version + 1
      FROM c WHERE j.key = $1 AND j.version = $2 RETURNING 1)
SELECT pg_notify('baton', $1 || E'\\n' || 'done') FROM u";

/// The mutex's acquire, as `src/backend/postgres/locks.rs` sends it: `$1` key, `$2` token,
/// `$3` lock ms, `$4` fence retention ms.
const LOCK_ACQUIRE: &str = "
WITH c AS (SELECT clock_timestamp() AS now),
h AS (
    SELECT ceil(extract(epoch FROM l.expires_at - c.now) * 1000)::bigint AS ms
    FROM baton_locks l, c
    WHERE l.key = $1 AND l.token IS NOT NULL AND l.expires_at > c.now
),
g AS (
    INSERT INTO baton_locks AS l (key, token, expires_at, fence, fence_expires_at)
    SELECT $1, $2,
           c.now + $3::float8 * interval '1 millisecond',
           floor(extract(epoch FROM c.now) * 1000000)::bigint,
           c.now + $4::float8 * interval '1 millisecond'
    FROM c
    WHERE NOT EXISTS (SELECT 1 FROM h)
    ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token,
        expires_at = EXCLUDED.expires_at,
        fence = greatest(l.fence + 1, EXCLUDED.fence),
        fence_expires_at = greatest(l.fence_expires_at, EXCLUDED.fence_expires_at)
    WHERE l.token IS NULL OR l.expires_at IS NULL OR l.expires_at <= (SELECT now FROM c)
    RETURNING l.fence
)
SELECT (SELECT fence FROM g), (SELECT ms FROM h)";

/// The mutex's release: `$1` key, `$2` token, `$3` payload.
const LOCK_RELEASE: &str = "
WITH r AS (
    UPDATE baton_locks SET token = NULL
    WHERE key = $1 AND token = $2
    RETURNING expires_at > clock_timestamp() AS held
)
SELECT r.held, pg_notify('baton', $3) FROM r";

/// The hand-written floor: one connection, four prepared statements.
struct Floor {
    client: tokio_postgres::Client,
    observe: tokio_postgres::Statement,
    grant: tokio_postgres::Statement,
    done: tokio_postgres::Statement,
}

impl Floor {
    async fn connect(url: &str) -> Floor {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("the floor connects");
        tokio::spawn(connection);
        let observe = client.prepare(OBSERVE).await.expect("prepare observe");
        let grant = client.prepare(GRANT).await.expect("prepare grant");
        let done = client.prepare(DONE).await.expect("prepare done");
        Floor {
            client,
            observe,
            grant,
            done,
        }
    }

    /// One job: read, grant, read, done.
    async fn cycle(&self, key: &str) {
        let row = self
            .client
            .query_one(&self.observe, &[&key])
            .await
            .expect("observe");
        let version: Option<i64> = row.get(5);
        assert!(version.is_none(), "{key} already exists");
        let token = format!("{:032x}", rand_u128());
        let granted = self
            .client
            .query(&self.grant, &[&key, &token])
            .await
            .expect("grant");
        assert_eq!(granted.len(), 1, "{key}: the grant wrote nothing");
        let row = self
            .client
            .query_one(&self.observe, &[&key])
            .await
            .expect("observe");
        let version: i64 = row.get::<_, Option<i64>>(5).expect("a row");
        let lease: Option<String> = row.get(1);
        assert_eq!(lease.as_deref(), Some(token.as_str()), "{key}: not ours");
        let done = self
            .client
            .query(&self.done, &[&key, &version])
            .await
            .expect("done");
        assert_eq!(done.len(), 1, "{key}: DONE wrote nothing");
    }
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let r = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    (u128::from(r()) << 64) | u128::from(r())
}

/// One baton cycle: a worker for `key` wins attempt 1 and finishes it.
async fn baton_cycle(client: &Client, key: &str) {
    let cfg = FailoverConfig::builder(key)
        .lease(Duration::from_secs(30))
        .build()
        .expect("valid config");
    let mut w = client.failover().start(cfg);
    loop {
        match w.next_event().await {
            Some(Event::Acquired(a)) => {
                a.done().await.expect("done");
            }
            Some(Event::Completed { attempt: Some(1) }) => return,
            Some(Event::Status { .. }) => {}
            other => panic!("{key}: unexpected {other:?}"),
        }
    }
}

/// The protocol steps the server logged touching `table` since byte `from` of its log:
/// (prepares, executions).
fn logged_steps(pg: &PgServer, table: &str, from: usize) -> (usize, usize) {
    let log = std::fs::read(pg.log_path()).expect("read the server's log");
    let log = String::from_utf8_lossy(log.get(from..).unwrap_or_default());
    let tail = log.as_ref();
    // A log record starts with the line prefix's timestamp (`2026-11-23 12:00:00.000 UTC
    // [pid] LOG:  duration: … ms  parse s3: <statement>`); a multi-line statement continues on
    // the following lines.
    let mut records: Vec<String> = Vec::new();
    for line in tail.lines() {
        let starts = line.len() > 11
            && line.as_bytes()[..4].iter().all(u8::is_ascii_digit)
            && line.as_bytes()[4] == b'-';
        match records.last_mut() {
            Some(r) if !starts => {
                r.push('\n');
                r.push_str(line);
            }
            _ => records.push(line.to_string()),
        }
    }
    let mut parse = 0;
    let mut execute = 0;
    for r in records.iter().filter(|r| r.contains(table)) {
        if r.contains("  parse ") {
            parse += 1;
        } else if r.contains("  execute ") {
            execute += 1;
        }
    }
    (parse, execute)
}

/// Round trips per cycle of `side` over `n` cycles, counted in the server's log.
async fn count_round_trips_in<F, Fut>(
    pg: &PgServer,
    table: &str,
    n: usize,
    mut side: F,
) -> (f64, f64)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    pg.psql("ALTER SYSTEM SET log_min_duration_statement = 0; SELECT pg_reload_conf();")
        .expect("turn on statement logging");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let from = std::fs::metadata(pg.log_path()).map_or(0, |m| m.len() as usize);
    for i in 0..n {
        side(i).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (parse, execute) = logged_steps(pg, table, from);
    pg.psql("ALTER SYSTEM RESET log_min_duration_statement; SELECT pg_reload_conf();")
        .expect("turn off statement logging");
    tokio::time::sleep(Duration::from_millis(200)).await;
    (parse as f64 / n as f64, execute as f64 / n as f64)
}

pub async fn job_cycle(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (100, 2) } else { (1000, 3) };
    let pg = PgServer::start().expect("start PostgreSQL (apt-get install postgresql)");
    let url = pg.url();
    let client = Client::connect(url.clone()).await.expect("baton connects");
    client.migrate().await.expect("baton creates its table");
    let floor = Floor::connect(&url).await;
    // Warm-up: the pool's connections, their statement caches, the LISTEN connection.
    for i in 0..20 {
        baton_cycle(&client, &format!("warm:b:{i}")).await;
        floor.cycle(&format!("warm:f:{i}")).await;
    }
    let (b_parse, b_exec) = count_round_trips_in(&pg, "baton_jobs", 50, |i| {
        let (client, key) = (&client, format!("count:b:{i}"));
        async move { baton_cycle(client, &key).await }
    })
    .await;
    let (f_parse, f_exec) = count_round_trips_in(&pg, "baton_jobs", 50, |i| {
        let (floor, key) = (&floor, format!("count:f:{i}"));
        async move { floor.cycle(&key).await }
    })
    .await;
    let mut b = Samples::default();
    let mut f = Samples::default();
    let mut b_secs = 0.0;
    let mut f_secs = 0.0;
    for run in 0..runs {
        for i in 0..per {
            let key = format!("r{run}:b:{i}");
            let t = Instant::now();
            baton_cycle(&client, &key).await;
            let d = t.elapsed();
            b.push(d);
            b_secs += d.as_secs_f64();
            let key = format!("r{run}:f:{i}");
            let t = Instant::now();
            floor.cycle(&key).await;
            let d = t.elapsed();
            f.push(d);
            f_secs += d.as_secs_f64();
        }
    }
    let n = (per * runs) as f64;
    let (bp50, fp50) = (b.pct(50.0), f.pct(50.0));
    let ratio = match (bp50, fp50) {
        (Some(b), Some(f)) if f > 0.0 => Some(b / f),
        _ => None,
    };
    report.rows.push(Row {
        scenario: "pg-job-cycle".into(),
        p50_us: bp50,
        p99_us: b.pct(99.0),
        ops_per_s: Some(n / b_secs),
        floor_ops_per_s: Some(n / f_secs),
        ratio,
        samples: b.len(),
        notes: format!(
            "PostgreSQL start→Acquired→done()→Completed; round trips per cycle baton \
             {:.2} (+{:.2} prepares) vs floor {:.2} (+{:.2}); floor p50 {:.0} µs",
            b_exec,
            b_parse,
            f_exec,
            f_parse,
            fp50.unwrap_or(0.0)
        ),
        extra: json!({
            "floor_p50_us": fp50,
            "floor_p99_us": f.pct(99.0),
            "ratio_of": "p50 cycle",
            "target_ratio": 1.15,
            "baton_executions_per_cycle": b_exec,
            "baton_prepares_per_cycle": b_parse,
            "floor_executions_per_cycle": f_exec,
            "floor_prepares_per_cycle": f_parse,
        }),
    });
    client.shutdown(Duration::from_secs(5)).await;
}

/// The lock floor: one connection, the two statements prepared once.
struct LockFloor {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
}

impl LockFloor {
    async fn connect(url: &str) -> LockFloor {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("the floor connects");
        tokio::spawn(connection);
        let acquire = client.prepare(LOCK_ACQUIRE).await.expect("prepare acquire");
        let release = client.prepare(LOCK_RELEASE).await.expect("prepare release");
        LockFloor {
            client,
            acquire,
            release,
        }
    }

    async fn cycle(&self, key: &str) {
        let token = format!("{:032x}", rand_u128());
        let (ttl, keep) = (30_000.0f64, 86_400_000.0f64);
        let row = self
            .client
            .query_one(&self.acquire, &[&key, &token, &ttl, &keep])
            .await
            .expect("acquire");
        let fence: Option<i64> = row.get(0);
        assert!(fence.is_some(), "{key}: the floor's lock was held");
        let payload = format!("{key}\nreleased");
        let released = self
            .client
            .query(&self.release, &[&key, &token, &payload])
            .await
            .expect("release");
        assert_eq!(released.len(), 1, "{key}: the release found another token");
    }
}

/// One baton lock cycle on `key`.
async fn lock_cycle(locks: &baton::Locks, key: &str) {
    let guard = locks
        .try_acquire(key, Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("uncontended");
    assert!(guard.release().await.expect("release"), "{key}: not held");
}

pub async fn lock_cycle_scenario(opts: &Opts, report: &mut Report) {
    let (per, runs) = if opts.quick { (200, 2) } else { (2000, 3) };
    let pg = PgServer::start().expect("start PostgreSQL (apt-get install postgresql)");
    let url = pg.url();
    let client = Client::connect(url.clone()).await.expect("baton connects");
    client.migrate().await.expect("baton creates its tables");
    let locks = client.locks();
    let floor = LockFloor::connect(&url).await;
    for _ in 0..50 {
        lock_cycle(&locks, "bench-b").await;
        floor.cycle("floor:lock").await;
    }
    let (b_parse, b_exec) = count_round_trips_in(&pg, "baton_locks", 50, |_| {
        let locks = &locks;
        async move { lock_cycle(locks, "bench-b").await }
    })
    .await;
    let (f_parse, f_exec) = count_round_trips_in(&pg, "baton_locks", 50, |_| {
        let floor = &floor;
        async move { floor.cycle("floor:lock").await }
    })
    .await;
    let mut b = Samples::default();
    let mut f = Samples::default();
    let (mut b_secs, mut f_secs) = (0.0, 0.0);
    for _ in 0..runs {
        for _ in 0..per {
            let t = Instant::now();
            lock_cycle(&locks, "bench-b").await;
            let d = t.elapsed();
            b.push(d);
            b_secs += d.as_secs_f64();
            let t = Instant::now();
            floor.cycle("floor:lock").await;
            let d = t.elapsed();
            f.push(d);
            f_secs += d.as_secs_f64();
        }
    }
    let n = (per * runs) as f64;
    let (bp50, fp50) = (b.pct(50.0), f.pct(50.0));
    let ratio = match (bp50, fp50) {
        (Some(b), Some(f)) if f > 0.0 => Some(b / f),
        _ => None,
    };
    report.rows.push(Row {
        scenario: "pg-lock-cycle".into(),
        p50_us: bp50,
        p99_us: b.pct(99.0),
        ops_per_s: Some(n / b_secs),
        floor_ops_per_s: Some(n / f_secs),
        ratio,
        samples: b.len(),
        notes: format!(
            "PostgreSQL mutex try_acquire→release, uncontended; round trips per cycle baton \
             {b_exec:.2} (+{b_parse:.2} prepares) vs floor {f_exec:.2} (+{f_parse:.2}); floor p50 \
             {:.0} µs",
            fp50.unwrap_or(0.0)
        ),
        extra: json!({
            "floor_p50_us": fp50,
            "floor_p99_us": f.pct(99.0),
            "ratio_of": "p50 cycle",
            "target_ratio": 1.15,
            "baton_executions_per_cycle": b_exec,
            "baton_prepares_per_cycle": b_parse,
            "floor_executions_per_cycle": f_exec,
            "floor_prepares_per_cycle": f_parse,
        }),
    });
    client.shutdown(Duration::from_secs(5)).await;
}
