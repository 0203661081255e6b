//! The operator's commands name what they act on: `baton unlock --token N` (or `--holder ID`),
//! `baton fail --attempt N`, `baton reset --attempt N`. Asked without a name they describe the
//! holder and print the exact command that names it; run late, after the holder changed, that
//! command leaves the new holder alone (exit 75). `--yes` alone names nothing and is refused;
//! `--any` still takes whatever holds it. On Redis and PostgreSQL, against private servers.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use baton::prelude::*;
use std::process::Output;
use std::time::Duration;

use baton::inspect::{EntryState, Kind};
use baton::testing::RedisServer;
use baton::{Client, FailoverConfig, JobState};
use common::process::{baton_command, describe, finish_by, spawn};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(15);
const EX_USAGE: i32 = 64;
const EX_TEMPFAIL: i32 = 75;
const LEASE: Duration = Duration::from_secs(30);

async fn baton(url: &str, args: &[&str]) -> Output {
    let mut cmd = baton_command(BATON);
    cmd.args(args).arg("--url").arg(url);
    finish_by(spawn(&mut cmd), Instant::now() + QUICK, args[0]).await
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The command a refusal printed, on a line of its own: `baton ...`.
fn printed(out: &Output) -> String {
    stderr(out)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("baton "))
        .unwrap_or_else(|| panic!("no command printed: {}", describe(out)))
        .to_string()
}

/// Runs a printed command as an operator pastes it (its words split as a shell would for
/// these plain ones; `"$BATON_URL"` is the URL, from the environment).
async fn run_printed(line: &str, url: &str) -> Output {
    let mut cmd = baton_command(BATON);
    cmd.env("BATON_URL", url);
    for word in line.split_whitespace().skip(1) {
        cmd.arg(if word == "\"$BATON_URL\"" { url } else { word });
    }
    finish_by(spawn(&mut cmd), Instant::now() + QUICK, line).await
}

/// The fencing token of `name`'s `kind` holder now, if held.
async fn holder_token(client: &Client, kind: Kind, name: &str) -> Option<u64> {
    client
        .inspect()
        .find(name)
        .await
        .expect("find")
        .into_iter()
        .find(|e| e.kind == kind && e.state == EntryState::Held)
        .and_then(|e| e.fencing_token)
}

/// Holder X is shown; X finishes and Y takes the lock; the operator confirms late.
async fn a_late_unlock_leaves_the_new_holder_alone(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let x = client
        .locks()
        .try_acquire("shared", LEASE)
        .await
        .unwrap()
        .expect("free");
    let x_token = x.fencing_token();
    let shown = baton(url, &["unlock", "--key", "shared"]).await;
    assert_eq!(shown.status.code(), Some(EX_USAGE), "{}", describe(&shown));
    assert!(x.release().await.unwrap(), "X finished");
    let y = client
        .locks()
        .try_acquire("shared", LEASE)
        .await
        .unwrap()
        .expect("free after X");
    // `--yes` alone names no grant: refused, Y keeps the lock.
    let out = baton(url, &["unlock", "--key", "shared", "--yes"]).await;
    assert_eq!(
        holder_token(&client, Kind::Lock, "shared").await,
        Some(y.fencing_token()),
        "a late --yes took the lock from its new holder: {}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(EX_USAGE), "{}", describe(&out));
    // The command printed when X was shown names X's token: run late, it leaves Y alone.
    let line = printed(&shown);
    assert!(
        line.ends_with(&format!("unlock --key shared --token {x_token}")),
        "{line}"
    );
    let out = run_printed(&line, url).await;
    assert_eq!(out.status.code(), Some(EX_TEMPFAIL), "{}", describe(&out));
    assert!(
        stderr(&out).contains("now held by another grant"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        holder_token(&client, Kind::Lock, "shared").await,
        Some(y.fencing_token()),
        "Y still holds"
    );
    assert!(!y.is_lost());
    // `--yes` with Y's token takes Y's grant.
    let token = y.fencing_token().to_string();
    let out = baton(
        url,
        &["unlock", "--key", "shared", "--yes", "--token", &token],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(holder_token(&client, Kind::Lock, "shared").await, None);
    // `--any` takes whatever holds it.
    let z = client
        .locks()
        .try_acquire("shared", LEASE)
        .await
        .unwrap()
        .expect("free after the unlock");
    let out = baton(url, &["unlock", "--key", "shared", "--any"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("fencing token {}", z.fencing_token())),
        "{}",
        describe(&out)
    );
    assert_eq!(holder_token(&client, Kind::Lock, "shared").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_unlock_leaves_the_new_holder_alone_on_redis() {
    let server = RedisServer::start().expect("redis");
    a_late_unlock_leaves_the_new_holder_alone(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_unlock_leaves_the_new_holder_alone_on_postgres() {
    let db = common::PgDatabase::create();
    a_late_unlock_leaves_the_new_holder_alone(&db.url).await;
}

fn job() -> FailoverConfig {
    FailoverConfig::builder("nightly")
        .lease(LEASE)
        .max_attempts(5)
        // As `baton run` holds: extended, and listening for an operator's release.
        .watchdog(true)
        .build()
        .unwrap()
}

/// The live attempt of the job, if any.
async fn live_attempt(client: &Client) -> Option<u64> {
    match client.failover().job_status(job()).await.unwrap().state {
        JobState::Attempt {
            number,
            holder: Some(_),
            ..
        } => Some(number),
        _ => None,
    }
}

/// The worker's next grant, skipping what it reports while it waits as a backup.
async fn granted(w: &mut baton::Worker) -> baton::Acquired {
    let until = tokio::time::Instant::now() + QUICK;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match common::next(w, left).await {
            baton::Event::Acquired(a) => return a,
            baton::Event::Locked { .. } => continue,
            other => panic!("expected a grant, got {other:?}"),
        }
    }
}

/// Attempt 1 is shown; it fails and a backup takes attempt 2; the operator's late `fail`
/// leaves attempt 2 alone unless it names it (or says `--any`).
async fn a_late_fail_leaves_the_new_attempt_alone(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let mut a = client.failover().start(job());
    let first = common::acquired(&mut a, QUICK).await;
    assert_eq!(first.attempt, 1);
    let mut b = client.failover().start(job());
    let shown = baton(url, &["fail", "--key", "nightly"]).await;
    assert_eq!(shown.status.code(), Some(EX_USAGE), "{}", describe(&shown));
    first.handle.fail("broken").await.unwrap();
    let second = granted(&mut b).await;
    assert_eq!(second.attempt, 2);

    // `--yes` alone names no attempt: refused, attempt 2 goes on.
    let out = baton(url, &["fail", "--key", "nightly", "--yes"]).await;
    assert_eq!(
        live_attempt(&client).await,
        Some(2),
        "a late `fail --yes` released the new attempt: {}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(EX_USAGE), "{}", describe(&out));
    // The command printed for attempt 1, run late: nothing done.
    let line = printed(&shown);
    assert!(line.ends_with("fail --key nightly --attempt 1"), "{line}");
    let out = run_printed(&line, url).await;
    assert_eq!(out.status.code(), Some(EX_TEMPFAIL), "{}", describe(&out));
    assert_eq!(live_attempt(&client).await, Some(2), "attempt 2 goes on");

    // `fail --any` releases whichever attempt is live: the holder hears `failed` at once.
    let out = baton(url, &["fail", "--key", "nightly", "--any"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("released attempt 2"),
        "{}",
        describe(&out)
    );
    // The worker hears it on the job's channel (its stream drives it).
    let heard = common::next(&mut b, QUICK).await;
    tokio::time::timeout(QUICK, second.handle.lost())
        .await
        .unwrap_or_else(|_| panic!("the holder of attempt 2 heard it: {heard:?}"));
}

/// `reset` of a live job is refused unless its live attempt is named; the refusal prints the
/// command that names it.
async fn reset_of_a_live_job_needs_its_attempt(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let mut a = client.failover().start(job());
    let first = granted(&mut a).await;
    assert_eq!(first.attempt, 1);
    let out = baton(url, &["reset", "--key", "nightly", "--yes"]).await;
    assert_eq!(
        live_attempt(&client).await,
        Some(1),
        "`reset --yes` deleted a live job's state: {}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(EX_USAGE), "{}", describe(&out));
    let line = printed(&out);
    assert!(line.ends_with("reset --key nightly --attempt 1"), "{line}");
    let out = baton(url, &["reset", "--key", "nightly", "--attempt", "2"]).await;
    assert_eq!(out.status.code(), Some(EX_TEMPFAIL), "{}", describe(&out));
    assert_eq!(live_attempt(&client).await, Some(1));
    let out = run_printed(&line, url).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        client.failover().job_status(job()).await.unwrap().state,
        JobState::Absent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_of_a_live_job_needs_its_attempt_on_redis() {
    let server = RedisServer::start().expect("redis");
    reset_of_a_live_job_needs_its_attempt(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_of_a_live_job_needs_its_attempt_on_postgres() {
    let db = common::PgDatabase::create();
    reset_of_a_live_job_needs_its_attempt(&db.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_fail_leaves_the_new_attempt_alone_on_redis() {
    let server = RedisServer::start().expect("redis");
    a_late_fail_leaves_the_new_attempt_alone(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_fail_leaves_the_new_attempt_alone_on_postgres() {
    let db = common::PgDatabase::create();
    a_late_fail_leaves_the_new_attempt_alone(&db.url).await;
}
