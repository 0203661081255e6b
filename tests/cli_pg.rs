//! The `baton` command on PostgreSQL: `--url postgres://…` (or `BATON_URL`) runs the same
//! commands with the same exit statuses, against the binary's shared private server
//! (`PgServer::shared`), a database of its own per test.
#![cfg(all(feature = "cli", feature = "testing", feature = "postgres"))]

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::PgDatabase;
use tokio::process::Command;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(20);

/// `baton ARGS`, with no inherited `BATON_*` settings, output captured, killed on drop.
fn baton(args: &[&str]) -> Command {
    let mut cmd = Command::new(BATON);
    cmd.args(args)
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_URL")
        .env_remove("BATON_REDIS_PASSWORD_FILE")
        .env_remove("BATON_TLS_CA_FILE")
        .env_remove("BATON_TLS_CERT_FILE")
        .env_remove("BATON_TLS_KEY_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
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
