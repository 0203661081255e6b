//! The `baton` command on PostgreSQL: `--url postgres://…` (or `BATON_URL`) runs the same
//! commands with the same exit statuses, against the binary's shared private server
//! (`PgServer::shared`), a database of its own per test.
#![cfg(all(feature = "cli", feature = "testing", feature = "postgres"))]

mod common;

use baton::prelude::*;
use std::process::Output;
use std::time::Duration;

use common::process::baton_command;
use common::PgDatabase;
use tokio::process::Command;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(20);

/// `baton ARGS` ([`baton_command`]).
fn baton(args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.args(args);
    cmd
}

async fn output(mut cmd: Command) -> Output {
    tokio::time::timeout(QUICK, cmd.output())
        .await
        .expect("baton did not finish in time")
        .expect("run baton")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_status_fail_and_reset_work_on_a_postgres_url() {
    let db = PgDatabase::create();
    let marker = std::env::temp_dir().join(format!("baton-cli-pg-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    // Four runs of one job at once: exactly one runs PROGRAM, all exit 0.
    let mut children = Vec::new();
    for _ in 0..4 {
        let script = format!("echo ran >> {}", marker.display());
        let mut cmd = baton(&["run", "--url", &db.url, "--key", "report", "--", "sh", "-c"]);
        cmd.arg(&script);
        children.push(cmd.spawn().unwrap());
    }
    for child in children {
        let out = tokio::time::timeout(QUICK, child.wait_with_output())
            .await
            .expect("baton run did not finish")
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let runs = std::fs::read_to_string(&marker).unwrap_or_default();
    let _ = std::fs::remove_file(&marker);
    assert_eq!(runs.lines().count(), 1, "PROGRAM ran {runs:?}");

    // The URL from the environment (BATON_URL), `status --json`.
    let mut cmd = baton(&["status", "--key", "report", "--json"]);
    cmd.env("BATON_URL", &db.url);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "done", "{status}");

    // A failing PROGRAM's status is passed through; the failure is recorded.
    let out = output(baton(&[
        "run",
        "--url",
        &db.url,
        "--key",
        "fails",
        "--max-attempts",
        "1",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = output(baton(&[
        "status", "--url", &db.url, "--key", "fails", "--json",
    ]))
    .await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "exhausted", "{status}");

    // `reset` forgets it: the next run is attempt 1 again.
    let out = output(baton(&[
        "reset", "--url", &db.url, "--key", "fails", "--yes",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = output(baton(&[
        "status", "--url", &db.url, "--key", "fails", "--json",
    ]))
    .await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "absent", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_only_commands_refuse_a_postgres_url_as_a_usage_error() {
    let dbs = [
        PgDatabase::create(),
        PgDatabase::create(),
        PgDatabase::create(),
    ];
    // --redlock names Redis masters: postgres:// ones are refused before anything runs.
    let masters = dbs.map(|d| d.url).join(",");
    let out = output(baton(&[
        "lock",
        "--key",
        "k",
        "--redlock",
        &masters,
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Redlock needs independent Redis masters"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_postgres_is_exit_69() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let out = output(baton(&["status", "--url", &url, "--key", "k"])).await;
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_lock_on_a_postgres_url_is_the_table_mutex() {
    let db = PgDatabase::create();
    // The holder prints its fencing token, then keeps the lock for a while.
    let holder = baton(&[
        "lock",
        "--url",
        &db.url,
        "--key",
        "k",
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $BATON_FENCING_TOKEN; sleep 3",
    ])
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // A second one gives up after --wait: exit 75, PROGRAM never ran.
    let waiter = output(baton(&[
        "lock", "--url", &db.url, "--key", "k", "--wait", "1s", "--", "sh", "-c", "exit 9",
    ]))
    .await;
    assert_eq!(waiter.status.code(), Some(75), "{}", text(&waiter));
    let out = tokio::time::timeout(QUICK, holder.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // Free again: the next holder's token is larger.
    let next = output(baton(&[
        "lock",
        "--url",
        &db.url,
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        "echo $BATON_FENCING_TOKEN",
    ]))
    .await;
    assert_eq!(next.status.code(), Some(0), "{}", text(&next));
    let second: u64 = String::from_utf8_lossy(&next.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(second > first, "{second} <= {first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_sslmode_require_and_the_ca_from_baton_tls_ca_file() {
    let pg = baton::testing::PgServer::start().expect("start PostgreSQL");
    let files = pg.enable_tls().expect("turn TLS on");
    let url = format!("{}?sslmode=require", pg.url());
    // PROGRAM sees its own session encrypted.
    let check = "test \"$(psql -h 127.0.0.1 -p \"$PGPORT\" -U postgres -Atc \
                 \"SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                 WHERE application_name = 'baton'\")\" = t";
    let mut cmd = baton(&["lock", "--url", &url, "--key", "k", "--", "sh", "-c", check]);
    cmd.env("BATON_TLS_CA_FILE", &files.ca_cert)
        .env("PGPORT", pg.port().to_string())
        .env("PATH", psql_path());
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Without the private CA the system's are trusted, which do not know it: not connected,
    // and the message says why.
    let out = output(baton(&["lock", "--url", &url, "--key", "k", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS handshake failed"),
        "{}",
        text(&out)
    );
    // A certificate without its key is a usage error, before connecting.
    let mut cmd = baton(&["lock", "--url", &url, "--key", "k", "--", "true"]);
    cmd.env("BATON_TLS_CERT_FILE", &files.client_cert);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
}

/// PATH with the directory of PostgreSQL's `psql` first (Debian keeps it off PATH).
fn psql_path() -> String {
    let dir = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path().join("bin").display().to_string())
        .unwrap_or_default();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

/// The SQL for a worker role in docs/operating.md ("PostgreSQL roles and `baton migrate`"):
/// the first ```` ```sql ```` block after that section's heading, as written.
fn readme_worker_role_sql() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md");
    let readme = std::fs::read_to_string(path).expect("read docs/operating.md");
    let (_, after) = readme
        .split_once("### PostgreSQL roles and `baton migrate`")
        .expect("docs/operating.md has no roles section; update tests/cli_pg.rs");
    let (_, block) = after
        .split_once("```sql\n")
        .expect("no ```sql block after the roles heading");
    let (sql, _) = block.split_once("```").expect("an unclosed ```sql block");
    sql.to_string()
}

/// `ARGS` for `lock`, `run` and `leader`, each running `true` once on `key`.
fn lock_run_leader(url: &str, key: &str) -> [Vec<String>; 3] {
    let with = |sub: &str| {
        [sub, "--url", url, "--key", key, "--", "true"]
            .map(String::from)
            .to_vec()
    };
    [with("lock"), with("run"), with("leader")]
}

/// Issue 22, 1.1: a role with only SELECT, INSERT, UPDATE and DELETE on baton's tables (and
/// USAGE on the schema and sequence) got `42501: permission denied for schema public`, exit 69,
/// for every command, because every client ran the schema's DDL on first use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dml_only_role_runs_lock_run_and_leader_once_the_owner_made_the_tables() {
    let db = PgDatabase::create_empty();
    let pg = baton::testing::PgServer::shared().unwrap();
    // The owner uses each command once: the tables are made on first use.
    for args in lock_run_leader(&db.owner_url, "owner") {
        let out = output(baton(&args.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    }
    // The sequence of advisory locks, which those commands do not use, by the migration the
    // operating guide asks for first (what `baton migrate` runs).
    let owner = baton::Client::connect(&db.owner_url).await.unwrap();
    owner.migrate().await.unwrap();
    // The operating guide's grants, as written.
    pg.psql_in(&db.name, &readme_worker_role_sql())
        .expect("the operating guide's worker role SQL");
    let worker = pg.url_as("baton_worker", "change-me", &db.name);
    for args in lock_run_leader(&worker, "worker") {
        let out = output(baton(&args.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    }
    // Advisory locks take their fencing token from the sequence the operating guide grants.
    let client = baton::Client::connect(&worker).await.unwrap();
    let guard = client
        .advisory_locks()
        .try_acquire(7_i64, baton::AdvisoryMode::Exclusive, &Default::default())
        .await
        .unwrap()
        .expect("free");
    assert!(guard.fencing_token() > 0);
    guard.release().await.unwrap();
}

/// A worker role on a database nobody migrated: it may not create the tables, so every command
/// fails at once with exit 78 (the configuration, which no retry fixes) naming `baton migrate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dml_only_role_on_an_unmigrated_database_exits_78_naming_baton_migrate() {
    let db = PgDatabase::create_empty();
    let pg = baton::testing::PgServer::shared().unwrap();
    pg.create_worker_role().unwrap();
    let worker = pg.url_as(
        baton::testing::PG_WORKER_ROLE,
        baton::testing::PG_WORKER_PASSWORD,
        &db.name,
    );
    for args in lock_run_leader(&worker, "k") {
        let out = output(baton(&args.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert_eq!(out.status.code(), Some(78), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("baton migrate"),
            "{args:?}: {}",
            text(&out)
        );
    }
    // `baton migrate` as that role is refused for the privilege (77), not the configuration.
    let out = output(baton(&["migrate", "--url", &worker])).await;
    assert_eq!(out.status.code(), Some(77), "{}", text(&out));
}

/// The rows of the exit-status table for PostgreSQL: credentials and privileges 77, a database
/// the server does not have 78; before, all of them were 69 ("cannot be reached").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_exit_77_and_an_unknown_database_78_never_69() {
    let db = PgDatabase::create();
    let pg = baton::testing::PgServer::shared().unwrap();
    // A role that may read baton's tables but not write them: 42501 on the first write.
    pg.psql(
        "DO $$ BEGIN CREATE ROLE baton_reader LOGIN PASSWORD 'reader-pw'; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    )
    .unwrap();
    pg.psql_in(
        &db.name,
        "GRANT USAGE ON SCHEMA public TO baton_reader; \
         GRANT SELECT ON baton_jobs, baton_locks TO baton_reader;",
    )
    .unwrap();
    let worker = baton::testing::PG_WORKER_ROLE;
    let cases = [
        (
            "a wrong password",
            pg.url_as(worker, "wrong", &db.name),
            77,
            "28P01",
        ),
        (
            "an unknown role",
            pg.url_as("nobody", "pw", &db.name),
            77,
            "28P01",
        ),
        (
            "no password",
            format!("postgres://{worker}@127.0.0.1:{}/{}", pg.port(), db.name),
            77,
            "password",
        ),
        (
            "a missing privilege",
            pg.url_as("baton_reader", "reader-pw", &db.name),
            77,
            "42501",
        ),
        (
            "an unknown database",
            pg.url_as(worker, baton::testing::PG_WORKER_PASSWORD, "nodb"),
            78,
            "3D000",
        ),
    ];
    for (what, url, status, says) in &cases {
        for args in lock_run_leader(url, "k") {
            let out = output(baton(&args.iter().map(String::as_str).collect::<Vec<_>>())).await;
            assert_eq!(
                out.status.code(),
                Some(*status),
                "{what}, {args:?}: {}",
                text(&out)
            );
            assert!(
                String::from_utf8_lossy(&out.stderr).contains(says),
                "{what}, {args:?}: {}",
                text(&out)
            );
        }
    }
}

/// `baton migrate` twice is idempotent, and safe while workers run: beside a lock holder it runs
/// no DDL at all; when it has DDL to run and a transaction holds the table, it waits at most its
/// `lock_timeout` at a time (never queueing writers behind it for longer), tries again, and
/// succeeds once the table is free; a Redis URL has nothing to migrate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_migrate_is_idempotent_and_waits_for_locks_only_briefly() {
    let db = PgDatabase::create_empty();
    for _ in 0..2 {
        let out = output(baton(&["migrate", "--url", &db.owner_url])).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let owner = db.connect().await;
    let relations: i64 = owner
        .query_one(
            "SELECT count(*) FROM unnest(ARRAY['baton_jobs', 'baton_locks', \
             'baton_jobs_expires_at', 'baton_locks_fence_expires_at', 'baton_advisory_fence']) n \
             WHERE to_regclass(n) IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(relations, 5);

    // Beside a worker holding a lock.
    let pg = baton::testing::PgServer::shared().unwrap();
    let worker = pg.grant_worker_role(&db.name).unwrap();
    let mut holder = baton(&[
        "lock",
        "--url",
        &worker,
        "--key",
        "held",
        "--",
        "sh",
        "-c",
        "echo held; sleep 30",
    ])
    .spawn()
    .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(holder.stdout.take().unwrap()));
    let first = tokio::time::timeout(QUICK, lines.next_line()).await;
    assert!(
        matches!(first, Ok(Ok(Some(ref l))) if l == "held"),
        "{first:?}"
    );
    let out = output(baton(&["migrate", "--url", &db.owner_url])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    holder.kill().await.unwrap();

    // With DDL to run (an index gone) behind a transaction that holds the table.
    owner
        .batch_execute("DROP INDEX baton_locks_fence_expires_at")
        .await
        .unwrap();
    let mut blocker = db.connect().await;
    let tx = blocker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE baton_locks IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let migrate = baton(&["migrate", "--url", &db.owner_url]).spawn().unwrap();
    // Its CREATE INDEX waits for the table; then gives the wait up (lock_timeout) and waits
    // again (the next try): seen as its backend waiting, then not, then waiting again.
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                   WHERE c.relname = 'baton_locks' AND NOT l.granted";
    for want in [1, 0, 1] {
        let deadline = tokio::time::Instant::now() + QUICK;
        while owner
            .query_one(waiting, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            != want
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {want} waiter on baton_locks in time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tx.commit().await.unwrap();
    let out = tokio::time::timeout(QUICK, migrate.wait_with_output())
        .await
        .expect("migrate did not finish")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(owner
        .query_one(
            "SELECT to_regclass('baton_locks_fence_expires_at') IS NOT NULL",
            &[]
        )
        .await
        .unwrap()
        .get::<_, bool>(0));

    // Nothing to migrate on Redis: exit 0 without connecting (nothing listens on port 1).
    let out = output(baton(&["migrate", "--url", "redis://127.0.0.1:1/"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to migrate"),
        "{}",
        text(&out)
    );
}

/// What `--prefix`'s help says of PostgreSQL: it prefixes the key of the job's row, so two
/// prefixes are two jobs. And a `--wait` that runs out on the table mutex says how long it
/// waited in words (`… in 1000 ms)` or `1.0 s`), never Rust's `1.000812s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_keys_postgres_rows_and_a_lock_wait_is_told_in_words() {
    let db = PgDatabase::create();
    let ran = output(baton(&[
        "run", "--url", &db.url, "--prefix", "team:", "--key", "job", "--", "true",
    ]))
    .await;
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran));
    for (prefix, state) in [("team:", "done"), ("baton:", "absent")] {
        let o = output(baton(&[
            "status", "--url", &db.url, "--prefix", prefix, "--key", "job", "--json",
        ]))
        .await;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
        assert_eq!(json["state"], state, "{prefix}: {json}");
    }

    let holder = baton(&[
        "lock",
        "--url",
        &db.url,
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        "echo held; sleep 5",
    ])
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let waiter = output(baton(&[
        "lock", "--url", &db.url, "--key", "k", "--wait", "500ms", "--", "true",
    ]))
    .await;
    assert_eq!(waiter.status.code(), Some(75), "{}", text(&waiter));
    let err = String::from_utf8_lossy(&waiter.stderr);
    assert!(err.contains("not acquired"), "{err}");
    let debug = err
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .find(|w| {
            w.ends_with('s') && w.contains('.') && w.starts_with(|c: char| c.is_ascii_digit())
        });
    assert_eq!(debug, None, "a Debug duration: {err}");
    assert!(err.contains(" ms)") || err.contains(" s)"), "{err}");
    drop(holder);
}
