//! The operator's view: `baton status` listing every job, lock, leader, fair lock and queue
//! (text, `--json`, `--kind`, schedules folded or `--all`, a schedule's row showing its worst
//! open occurrence, a job's waiting backups and an election's standbys), `status --key` of a
//! lock and a leader, `baton unlock` taking a lock from a running `baton lock` (Redis and
//! PostgreSQL; the late confirmation and `fail`/`reset` are tests/cli_unlock.rs), `baton watch`
//! of a lock and of a job (each line timestamped), and the listing of a 6-node cluster, each
//! against private servers.
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

/// Whether `at` is an instant as baton writes them: UTC, RFC 3339 to the millisecond
/// (`2026-01-01T00:00:00.123Z`).
fn is_utc_millis(at: &str) -> bool {
    let b = at.as_bytes();
    b.len() == 24
        && at.ends_with('Z')
        && b[10] == b'T'
        && b[19] == b'.'
        && at[..4].bytes().all(|c| c.is_ascii_digit())
        && at[20..23].bytes().all(|c| c.is_ascii_digit())
}

/// A `baton watch` line without its timestamp, which must start it.
fn stamped(line: &str) -> &str {
    let (at, rest) = line.split_once(' ').unwrap_or((line, ""));
    assert!(is_utc_millis(at), "no UTC timestamp first: {line}");
    rest
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
    let line = stamped(&line);
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
        let line = stamped(&line);
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
    // A backup is counted on the node that owns the job's slot (sharded pub/sub).
    let run = |name: &str| {
        let mut cmd = baton_command(BATON);
        cmd.args(["run", "--url", &url, "--key", "sharded", "--name", name])
            .args(["--", "sleep", "30"]);
        spawn(&mut cmd)
    };
    let _holder = run("a");
    until_standbys(&url, "job", "sharded", 0).await;
    let _backup = run("b");
    until_standbys(&url, "job", "sharded", 1).await;
}

/// `baton run --key KEY -- false` with attempts left: the job stays `waiting` (its attempt
/// failed, nobody took it over).
async fn stuck_waiting(url: &str, key: &str) {
    // --url before `--`: after it, it would be PROGRAM's.
    let args = [
        "run",
        "--url",
        url,
        "--key",
        key,
        "--max-attempts",
        "3",
        "--",
        "false",
    ];
    let out = finish_by(
        spawn(baton_command(BATON).args(args)),
        Instant::now() + QUICK,
        "run",
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_row_shows_a_stuck_older_occurrence_and_watch_lines_are_timestamped() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let client = connect(&url).await;
    // The oldest occurrence is stuck waiting; the two after it ran fine.
    stuck_waiting(&url, "nightly@0123456789ab@2026-01-01T00:00:00Z").await;
    for tick in ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"] {
        done(&client, &format!("nightly@0123456789ab@{tick}")).await;
    }

    let out = baton(&url, &["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    let nightly = text
        .lines()
        .find(|l| l.starts_with("schedule"))
        .unwrap_or_else(|| panic!("no schedule row in\n{text}"));
    assert_eq!(
        nightly.split_whitespace().nth(2),
        Some("waiting"),
        "the stuck occurrence's state, not the latest's: {nightly}"
    );
    assert!(
        nightly.contains("worst open: 2026-01-01T00:00:00Z waiting")
            && nightly.contains("last: 2026-01-03T00:00:00Z done, 2026-01-02T00:00:00Z done"),
        "{nightly}"
    );
    let out = baton(&url, &["status", "--json", "--kind", "job"]).await;
    let row: serde_json::Value = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|o| o["kind"] == "schedule")
        .unwrap_or_else(|| panic!("no schedule in {}", describe(&out)));
    assert_eq!(row["state"], "waiting", "{row}");
    assert_eq!(row["shown"]["tick"], "2026-01-01T00:00:00Z", "{row}");
    assert_eq!(row["last"][0]["tick"], "2026-01-03T00:00:00Z", "{row}");

    // `watch` of a finished job: one line, timestamped, and `"at"` in JSON.
    let key = "nightly@0123456789ab@2026-01-03T00:00:00Z";
    let out = baton(&url, &["watch", "--key", key]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(stamped(stdout(&out).trim()), "status: done");
    let out = baton(&url, &["watch", "--key", key, "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("JSON");
    assert!(is_utc_millis(v["at"].as_str().unwrap_or_default()), "{v}");
    assert_eq!(v["state"]["state"], "done", "{v}");
}

/// Waits until `status --json` lists `kind` `name` with `standbys` at `want`; returns the
/// object.
async fn until_standbys(url: &str, kind: &str, name: &str, want: u64) -> serde_json::Value {
    let until = Instant::now() + QUICK;
    loop {
        let out = baton(url, &["status", "--json"]).await;
        let found = stdout(&out)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|o| o["kind"] == kind && o["name"] == name);
        if let Some(o) = found.filter(|o| o["standbys"] == want) {
            return o;
        }
        assert!(
            Instant::now() < until,
            "{kind} {name} never had {want} standbys: {}",
            describe(&out)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_a_jobs_waiting_backups_and_an_elections_standbys() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    // --url first: after `--` it would be PROGRAM's.
    let started = |args: &[&str]| {
        let mut cmd = baton_command(BATON);
        cmd.arg(args[0]).arg("--url").arg(&url).args(&args[1..]);
        spawn(&mut cmd)
    };
    let run = ["run", "--key", "sync", "--name", "a", "--", "sleep", "30"];
    let _holder = started(&run);
    let lead = [
        "leader", "--key", "boss", "--name", "n1", "--", "sleep", "30",
    ];
    let _leader = started(&lead);
    let job = until_standbys(&url, "job", "sync", 0).await;
    assert_eq!(job["state"], "running", "{job}");
    until_standbys(&url, "leader", "boss", 0).await;
    // A backup and a standby join: each counted once, their holders not.
    let _backup = started(&["run", "--key", "sync", "--name", "b", "--", "sleep", "30"]);
    let _standby = started(&[
        "leader", "--key", "boss", "--name", "n2", "--", "sleep", "30",
    ]);
    let job = until_standbys(&url, "job", "sync", 1).await;
    assert_eq!(job["holder"], "a", "{job}");
    let leader = until_standbys(&url, "leader", "boss", 1).await;
    assert_eq!(leader["holder"], "n1", "{leader}");
    let out = baton(&url, &["status"]).await;
    let text = stdout(&out);
    assert!(
        text.contains("1 backup waiting") && text.contains("1 standby"),
        "{text}"
    );
    let out = baton(&url, &["status", "--key", "sync"]).await;
    assert!(
        stdout(&out).contains("backups:      1 waiting"),
        "{}",
        describe(&out)
    );
}

/// `baton status --key K --history` after a night with a failed attempt and a takeover, on
/// three `baton run --every 1h` processes (hosts host-0..2) of one occurrence: attempt 1's
/// PROGRAM exits 3, attempt 2's holder is killed (SIGKILL) while PROGRAM runs, a backup takes
/// over when its lease runs out and attempt 3 succeeds. The history shows the occurrence done
/// with its attempts: each with its host, the failed one with exit status 3 and its failure,
/// the last with status 0; the killed one with its host and no end (its worker died before
/// writing it).
async fn history_after_a_failed_attempt_and_a_takeover(url: &str) {
    use common::process::{read_pid, send_signal};
    let dir = common::TempDir::new("status-history");
    let count = dir.path("count");
    let holder = dir.path("holder");
    let hang = dir.path("hang.pid");
    // Attempt 1 fails with 3, attempt 2 hangs (its host written first), attempt 3 succeeds.
    let script = format!(
        "n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; \
         case $n in 1) exit 3;; 2) echo $HOST > {holder}; echo $$ > {hang}; exec sleep 60;; \
         *) exit 0;; esac",
        count = common::shq(&count),
        holder = common::shq(&holder),
        hang = common::shq(&hang),
    );
    let mut hosts: Vec<tokio::process::Child> = (0..3)
        .map(|i| {
            let name = format!("host-{i}");
            let mut cmd = baton_command(BATON);
            cmd.env("HOST", &name)
                .args(["run", "--key", "nightly", "--every", "1h", "--lease", "1s"])
                .args(["--max-attempts", "3", "--name", &name, "--url", url])
                .args(["--", "sh", "-c", &script]);
            spawn(&mut cmd)
        })
        .collect();
    let sleeper = read_pid(&hang, QUICK).await;
    let hung = std::fs::read_to_string(&holder).unwrap().trim().to_string();
    let at: usize = hung.trim_start_matches("host-").parse().unwrap();
    // Killed once its grant is on record (a background write: a worker killed before it
    // lands shows its attempt with no host, which is another test's case).
    let until = Instant::now() + QUICK;
    loop {
        let out = baton(url, &["status", "--key", "nightly", "--history", "--json"]).await;
        let granted = stdout(&out).lines().any(|l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|e| {
                e["attempts"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|a| a["attempt"] == 2 && a["host"] == hung.as_str())
                })
            })
        });
        if granted {
            break;
        }
        assert!(Instant::now() < until, "attempt 2's grant never on record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hosts[at].kill().await.expect("kill attempt 2's baton");
    send_signal(sleeper, libc::SIGKILL);
    // The other two end: one failed attempt 1 (exit 3), one ran attempt 3 (exit 0).
    let mut codes = Vec::new();
    for (i, child) in hosts.into_iter().enumerate() {
        if i != at {
            let out = finish_by(child, Instant::now() + QUICK, "run").await;
            codes.push(common::process::code(&out));
        }
    }
    codes.sort();
    assert_eq!(codes, [0, 3]);

    // The record's writes are in the background: read until attempt 3's end is on record.
    let until = Instant::now() + QUICK;
    let entry = loop {
        let out = baton(url, &["status", "--key", "nightly", "--history", "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let entries: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(entries.len(), 1, "one night on record: {entries:?}");
        let entry = entries.into_iter().next().unwrap();
        let third_ended = entry["attempts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["attempt"] == 3 && !a["ended"].is_null()));
        if entry["outcome"] == "done" && third_ended {
            break entry;
        }
        assert!(Instant::now() < until, "history never complete: {entry}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let attempts = entry["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{entry}");
    let host_of = |n: usize| attempts[n]["host"].as_str().unwrap_or("").to_string();
    let (first, second, third) = (host_of(0), host_of(1), host_of(2));
    assert_eq!(second, hung, "{entry}");
    for h in [&first, &second, &third] {
        assert!(h.starts_with("host-"), "{entry}");
    }
    assert_ne!(first, second, "{entry}");
    assert_ne!(third, second, "{entry}");
    assert_eq!(
        attempts[0]["exit"],
        serde_json::json!({ "status": 3 }),
        "{entry}"
    );
    assert_eq!(attempts[0]["outcome"], "failed", "{entry}");
    assert!(
        attempts[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("status 3")),
        "{entry}"
    );
    assert!(attempts[1]["ended"].is_null(), "{entry}");
    assert!(!attempts[1]["started"].is_null(), "{entry}");
    assert_eq!(
        attempts[2]["exit"],
        serde_json::json!({ "status": 0 }),
        "{entry}"
    );
    assert_eq!(attempts[2]["outcome"], "done", "{entry}");
    for a in [&attempts[0], &attempts[2]] {
        assert!(!a["started"].is_null() && !a["ended"].is_null(), "{entry}");
    }

    // As text: a line per attempt, hosts and exit statuses in them.
    let out = baton(url, &["status", "--key", "nightly", "--history"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    for h in [&first, &second, &third] {
        assert!(text.contains(h.as_str()), "{text}");
    }
    assert!(text.contains("done"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_a_failed_attempt_and_a_takeover_with_hosts_and_exits_on_redis() {
    let server = RedisServer::start().expect("redis");
    history_after_a_failed_attempt_and_a_takeover(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_a_failed_attempt_and_a_takeover_with_hosts_and_exits_on_postgres() {
    let db = common::PgDatabase::create();
    history_after_a_failed_attempt_and_a_takeover(&db.url).await;
}
