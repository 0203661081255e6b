//! The operator's view: `baton status` listing every job, lock, leader, fair lock and queue
//! (text, `--json`, `--kind`, schedules folded or `--all`), `status --key` of a lock and a
//! leader, `baton unlock` taking a lock from a running `baton lock` (Redis and PostgreSQL; the
//! late confirmation and `fail`/`reset` are tests/cli_unlock.rs),
//! `baton watch` of a lock, and the listing of a 6-node cluster, each against private servers.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use baton::prelude::*;
use std::process::Output;
use std::time::Duration;

use baton::inspect::{EntryState, Kind};
use baton::testing::{RedisCluster, RedisServer};
use baton::{Client, ElectionOptions, FailoverConfig};
use common::process::{baton_command, describe, finish_by, spawn};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(15);
const EX_USAGE: i32 = 64;
const EX_LOST: i32 = 74;

async fn baton(url: &str, args: &[&str]) -> Output {
    let mut cmd = baton_command(BATON);
    cmd.args(args).arg("--url").arg(url);
    finish_by(spawn(&mut cmd), Instant::now() + QUICK, args[0]).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn connect(url: &str) -> Client {
    Client::connect(url).await.expect("connect")
}

/// A job run to its end (`DONE`), under `name`.
async fn done(client: &Client, name: &str) {
    let job = FailoverConfig::builder(name).build().unwrap();
    client
        .failover()
        .run(job, |_| async { Ok::<(), std::io::Error>(()) })
        .await
        .expect("run the job");
}

/// Waits until `name` is held as `kind`, and returns its fencing token.
async fn held(client: &Client, kind: Kind, name: &str) -> u64 {
    let until = Instant::now() + QUICK;
    loop {
        let found = client.inspect().find(name).await.expect("find");
        if let Some(e) = found
            .iter()
            .find(|e| e.kind == kind && e.state == EntryState::Held)
        {
            return e.fencing_token.expect("a held lock has a fencing token");
        }
        assert!(Instant::now() < until, "{name} never held: {found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_every_kind_folds_schedules_and_filters() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let client = connect(&url).await;
    done(&client, "report").await;
    for tick in [
        "2026-01-01T00:00:00Z",
        "2026-01-02T00:00:00Z",
        "2026-01-03T00:00:00Z",
    ] {
        done(&client, &format!("nightly@0123456789ab@{tick}")).await;
    }
    let lock = client
        .locks()
        .try_acquire("db", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let fair = client
        .fair_locks()
        .try_acquire("printer", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let elector = client
        .leaders()
        .elector(
            "boss",
            &ElectionOptions::builder().name("node-1").build().unwrap(),
        )
        .unwrap();
    let term = elector.campaign().await.expect("lead");
    client
        .queues()
        .run_or_enqueue("mail", b"hi", Duration::from_secs(5), |_| async {
            Ok::<(), std::io::Error>(())
        })
        .await
        .expect("queue");
    // Another application's keys under the same prefix are skipped.
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("baton:not-ours")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();

    let out = baton(&url, &["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    let row = |kind: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(kind) && l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {kind} {name} in\n{text}"))
            .to_string()
    };
    assert!(row("job", "report").contains("done"));
    let db = row("lock", "db");
    assert!(
        db.contains("held") && db.contains(&lock.fencing_token().to_string()),
        "{db}"
    );
    assert!(row("fair", "printer").contains(&fair.fencing_token().to_string()));
    let boss = row("leader", "boss");
    assert!(boss.contains("node-1") && boss.contains(&term.fencing_token().to_string()));
    assert!(row("queue", "mail").contains("free"));
    let nightly = row("schedule", "nightly@0123456789ab");
    assert!(
        nightly.contains("3 occurrences") && nightly.contains("2026-01-03T00:00:00Z done"),
        "{nightly}"
    );
    assert!(!text.contains("not-ours"), "{text}");
    // Header + report + schedule + db + printer + boss + mail.
    assert_eq!(text.lines().count(), 7, "{text}");

    // --json: one object per line.
    let out = baton(&url, &["status", "--json"]).await;
    let objects: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(objects.len(), 6, "{}", describe(&out));
    let boss = objects.iter().find(|o| o["name"] == "boss").expect("boss");
    assert_eq!(boss["kind"], "leader");
    assert_eq!(boss["state"], "held");
    assert_eq!(boss["holder"], "node-1");
    assert_eq!(boss["fencing_token"], term.fencing_token());

    // --kind: that kind only.
    let out = baton(&url, &["status", "--kind", "lock"]).await;
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().nth(1).unwrap().starts_with("lock"), "{text}");

    // --all: each occurrence is a job row of its own.
    let out = baton(&url, &["status", "--all", "--kind", "job"]).await;
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 5, "{text}");
    assert_eq!(text.matches("nightly@0123456789ab@").count(), 3, "{text}");

    // status --key of a held lock and of a leader.
    let out = baton(&url, &["status", "--key", "db"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(text.contains("state:        held (holder "), "{text}");
    assert!(
        text.contains(&format!("fencing:      {}", lock.fencing_token())),
        "{text}"
    );
    assert!(!text.contains("absent"), "{text}");
    let out = baton(&url, &["status", "--key", "boss", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("JSON");
    assert_eq!(v["holder"], "node-1");
    assert_eq!(v["fencing_token"], term.fencing_token());
    drop((lock, fair, term));
}

/// `baton lock` holds `key`; `baton unlock` refuses without naming its grant (64), takes it with
/// its fencing token; the holder exits 74; the next holder's fencing token is higher than the
/// one taken.
async fn unlock_takes_a_lock_from_baton_lock(url: &str) {
    let client = connect(url).await;
    let mut cmd = baton_command(BATON);
    cmd.args([
        "lock", "--url", url, "--key", "hung", "--ttl", "1s", "--", "sleep", "30",
    ]);
    let holder = spawn(&mut cmd);
    let taken = held(&client, Kind::Lock, "hung").await;

    let out = baton(url, &["unlock", "--key", "hung"]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{}", describe(&out));
    let token = taken.to_string();
    let out = baton(
        url,
        &["unlock", "--key", "hung", "--yes", "--token", &token],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!("fencing token {taken}")),
        "{}",
        describe(&out)
    );

    let out = finish_by(holder, Instant::now() + QUICK, "the hung holder").await;
    assert_eq!(out.status.code(), Some(EX_LOST), "{}", describe(&out));
    let next = client
        .locks()
        .try_acquire("hung", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after unlock");
    assert!(
        next.fencing_token() > taken,
        "{} <= {taken}",
        next.fencing_token()
    );
    // A job's name: `baton fail` is the tool.
    done(&client, "a-job").await;
    let out = baton(url, &["unlock", "--key", "a-job", "--kind", "job"]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("baton fail"));
    // The listing (SCAN on Redis, the tables' pages on PostgreSQL) has both, the lock held by
    // its new holder.
    let out = baton(url, &["status", "--json"]).await;
    let objects: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(objects.len(), 2, "{}", describe(&out));
    let lock = objects
        .iter()
        .find(|o| o["kind"] == "lock")
        .expect("the lock");
    assert_eq!(lock["name"], "hung");
    assert_eq!(lock["state"], "held");
    assert_eq!(lock["fencing_token"], next.fencing_token());
    let job = objects
        .iter()
        .find(|o| o["kind"] == "job")
        .expect("the job");
    assert_eq!(
        (&job["name"], &job["state"]),
        (&"a-job".into(), &"done".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_takes_a_lock_from_a_hung_holder_on_redis() {
    let server = RedisServer::start().expect("redis");
    unlock_takes_a_lock_from_baton_lock(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_takes_a_lock_from_a_hung_holder_on_postgres() {
    let db = common::PgDatabase::create();
    unlock_takes_a_lock_from_baton_lock(&db.url).await;
}

async fn next_line(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
    tokio::time::timeout(QUICK, lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_of_a_lock_sees_its_holder_change() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let client = connect(&url).await;
    let first = client
        .locks()
        .try_acquire("w", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let mut cmd = baton_command(BATON);
    cmd.args(["watch", "--url", &url, "--key", "w"]);
    let mut child = spawn(&mut cmd);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = next_line(&mut lines).await;
    assert!(
        line.starts_with("status: lock held by")
            && line.contains(&first.fencing_token().to_string()),
        "{line}"
    );
    assert!(first.release().await.unwrap());
    let second = client
        .locks()
        .try_acquire("w", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let want = format!("held by {}", &second.token()[..8]);
    loop {
        let line = next_line(&mut lines).await;
        assert!(line.starts_with("changed: lock"), "{line}");
        if line.contains(&want) {
            assert!(line.contains(&second.fencing_token().to_string()), "{line}");
            break;
        }
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_entries_on_every_primary_of_a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start().expect("cluster"))
        .await
        .unwrap();
    let url = cluster.cluster_url();
    let client = connect(&url).await;
    let mut guards = Vec::new();
    // 24 names spread their hash tags over every primary's slots.
    for i in 0..24 {
        guards.push(
            client
                .locks()
                .try_acquire(&format!("l{i}"), Duration::from_secs(30))
                .await
                .unwrap()
                .expect("free"),
        );
    }
    for i in 0..6 {
        done(&client, &format!("j{i}")).await;
    }
    // Small batches: many SCAN calls per primary.
    let inspect = client.inspect().with_batch_size(5).unwrap();
    let mut listing = inspect.list(None);
    let mut names = Vec::new();
    while let Some(batch) = listing.next_batch().await.expect("a batch") {
        names.extend(batch.into_iter().map(|e| format!("{}:{}", e.kind, e.name)));
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 30, "{names:?}");
    let out = baton(&url, &["status", "--kind", "lock"]).await;
    assert_eq!(stdout(&out).lines().count(), 25, "{}", describe(&out));
}
