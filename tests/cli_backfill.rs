//! `baton backfill` and `baton schedule --catch-up all` against a private redis-server per
//! test, and PostgreSQL: a window's ticks with no terminal outcome run once each across
//! several processes, a second backfill runs nothing, a window older than what the record
//! vouches for is refused with 64 naming the oldest safe tick, and the long-running form
//! catches up the ticks every worker missed. The past is made with the library: occurrences
//! run to DONE and recorded, as a fleet would have left them.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{FailoverConfig, RecordChange, RecordOptions, RecordedOutcome, Schedule};
use common::process::*;
use common::{server, shq, TempDir};
use tokio::process::Command;
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(20);

fn baton(sub: &str, url: &str) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg(sub).arg("--url").arg(url);
    cmd
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn id_of(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64)
        .unwrap()
        .to_string()
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// How many times each occurrence appears in a log PROGRAM appends `$BATON_OCCURRENCE` to.
fn counts(path: &std::path::Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in lines(path) {
        *out.entry(line).or_insert(0) += 1;
    }
    out
}

/// The occurrences of `ticks` (seconds) of an `every 1s` schedule on `key` run to DONE and
/// recorded done, as a fleet that ran them would have left them.
async fn done_before(url: &str, key: &str, ticks: &[u64]) {
    let every = Schedule::every(Duration::from_secs(1)).unwrap();
    recorded(url, key, &every, ticks, RecordedOutcome::Done).await;
}

/// The occurrences of `ticks` of `schedule` on `key` recorded `outcome` (and, for `done`,
/// run to DONE).
async fn recorded(
    url: &str,
    key: &str,
    schedule: &Schedule,
    ticks: &[u64],
    outcome: RecordedOutcome,
) {
    let client = baton::Client::connect(url).await.expect("connect");
    let f = client.failover();
    let schedule = schedule.clone();
    let base = FailoverConfig::builder(key)
        .worker_name("earlier-host")
        .build()
        .unwrap();
    for &t in ticks {
        let occurrence = schedule.occurrence_of_tick(at(t)).unwrap();
        if outcome == RecordedOutcome::Done {
            let job = base.for_occurrence(&occurrence, None).unwrap();
            f.run(job, |_| async { Ok::<_, String>(()) })
                .await
                .expect("the earlier run");
        }
        f.record_occurrence(
            &schedule,
            &RecordOptions::default(),
            base.clone(),
            at(t),
            RecordChange::Outcome {
                outcome,
                note: None,
            },
        )
        .await
        .expect("the earlier record");
    }
}

/// A six-tick window with two ticks done: three `baton backfill` at once run the other four
/// once each (PROGRAM's log), each exits 0; a second backfill runs nothing and says so; a
/// window starting before the record's first tick exits 64 naming it.
async fn six_ticks_two_done(url: &str) {
    let dir = TempDir::new("backfill");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log));
    let first = now_secs() - 20;
    let ticks: Vec<u64> = (first..first + 6).collect();
    done_before(url, "nightly", &[ticks[0], ticks[2]]).await;
    let backfill = |from: u64, to: u64| {
        let mut cmd = baton("backfill", url);
        cmd.args(["--key", "nightly", "--every", "1s", "--lease", "2s"])
            .args(["--from", &id_of(from), "--to", &id_of(to)])
            .args(["--", "sh", "-c", &script]);
        cmd
    };
    let children: Vec<_> = (0..3)
        .map(|_| spawn(&mut backfill(ticks[0], ticks[5])))
        .collect();
    for child in children {
        let out = finish_by(child, Instant::now() + QUICK, "baton backfill").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
    }
    let ran = counts(&log);
    let expected: BTreeMap<String, usize> =
        [1, 3, 4, 5].iter().map(|&i| (id_of(ticks[i]), 1)).collect();
    assert_eq!(ran, expected, "the four unsettled ticks ran once each");

    let out = finish_by(
        spawn(&mut backfill(ticks[0], ticks[5])),
        Instant::now() + QUICK,
        "the second backfill",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let err = stderr(&out);
    assert!(err.contains("0 to run, 6 settled on record"), "{err}");
    assert!(err.contains("nothing to run"), "{err}");
    assert_eq!(counts(&log), expected, "the second backfill ran nothing");

    // Before the record's first tick: nothing vouches that those ticks never ran.
    let out = finish_by(
        spawn(&mut backfill(ticks[0] - 5, ticks[5])),
        Instant::now() + QUICK,
        "a backfill older than the horizon",
    )
    .await;
    assert_eq!(code(&out), 64, "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the oldest tick the record vouches for is {}",
            id_of(ticks[0])
        )),
        "{err}"
    );
    assert_eq!(counts(&log), expected, "the refused backfill ran nothing");
}

#[tokio::test]
async fn backfill_runs_each_unsettled_tick_once_across_three_processes_on_redis() {
    let srv = server();
    six_ticks_two_done(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_runs_each_unsettled_tick_once_across_three_processes_on_postgres() {
    let db = common::PgDatabase::create();
    six_ticks_two_done(&db.url).await;
}

/// A paused schedule is not backfilled: 75, nothing run, nothing recorded skipped.
#[tokio::test]
async fn backfill_of_a_paused_schedule_exits_75_and_runs_nothing() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("backfill-paused");
    let log = dir.path("log");
    let first = now_secs() - 10;
    done_before(&url, "paused", &[first]).await;
    let out = finish_by(
        spawn(baton("pause", &url).args(["--key", "paused"])),
        Instant::now() + QUICK,
        "baton pause",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let out = finish_by(
        spawn(
            baton("backfill", &url)
                .args(["--key", "paused", "--every", "1s"])
                .args(["--from", &id_of(first), "--to", &id_of(first + 3)])
                .args(["--", "sh", "-c", &format!("echo x >> {}", shq(&log))]),
        ),
        Instant::now() + QUICK,
        "baton backfill",
    )
    .await;
    assert_eq!(code(&out), 75, "{}", describe(&out));
    assert!(stderr(&out).contains("resume"), "{}", describe(&out));
    assert!(lines(&log).is_empty());
}

/// Every worker was down for a few ticks: three `baton schedule --catch-up all` run each
/// missed tick once (and the one done before not again), then go on with the next ticks,
/// each once too.
async fn catch_up_all_after_every_worker_was_down(url: &str) {
    let dir = TempDir::new("catch-up-all");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log));
    let first = now_secs() - 8;
    done_before(url, "sweep", &[first]).await;
    let started = now_secs();
    let mut children = Vec::new();
    for i in 0..3 {
        let mut cmd = baton("schedule", url);
        cmd.args(["--key", "sweep", "--every", "1s", "--lease", "2s"])
            .args(["--catch-up", "all", "--catch-up-window", "1m"])
            .args(["--name", &format!("host-{i}"), "--", "sh", "-c", &script]);
        children.push(spawn(&mut cmd));
    }
    let missed: Vec<String> = (first + 1..started).map(id_of).collect();
    let caught = wait_file(&log, QUICK, |_| {
        let ran = counts(&log);
        missed.iter().all(|id| ran.contains_key(id))
    })
    .await;
    for child in &children {
        send_signal(child.id().unwrap(), libc::SIGTERM);
    }
    for child in children {
        finish_by(child, Instant::now() + QUICK, "baton schedule").await;
    }
    let ran = counts(&log);
    assert!(caught.is_some(), "every missed tick caught up: {ran:?}");
    assert!(
        !ran.contains_key(&id_of(first)),
        "the tick done before is not run again: {ran:?}"
    );
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "no tick ran twice: {twice:?}");
}

#[tokio::test]
async fn catch_up_all_runs_the_missed_ticks_once_on_redis() {
    let srv = server();
    catch_up_all_after_every_worker_was_down(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_all_runs_the_missed_ticks_once_on_postgres() {
    let db = common::PgDatabase::create();
    catch_up_all_after_every_worker_was_down(&db.url).await;
}

/// `--catch-up all` needs its window.
#[tokio::test]
async fn catch_up_all_without_a_window_exits_64() {
    let out = finish_by(
        spawn(
            baton("schedule", "redis://127.0.0.1:1/")
                .args(["--key", "k", "--every", "1s", "--catch-up", "all"])
                .args(["--", "true"]),
        ),
        Instant::now() + QUICK,
        "baton schedule",
    )
    .await;
    assert_eq!(code(&out), 64, "{}", describe(&out));
    assert!(
        stderr(&out).contains("--catch-up-window"),
        "{}",
        describe(&out)
    );
}

/// `--catch-up last` does not run a latest past tick recorded skipped while paused: a pause is
/// an operator's decision (`baton backfill` runs it when asked).
#[tokio::test]
async fn catch_up_last_leaves_a_tick_skipped_while_paused() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("catch-up-paused");
    let log = dir.path("log");
    let err = dir.path("err");
    let now = now_secs();
    let offset = (now - 1800) % 3600;
    let hourly = Schedule::every(Duration::from_secs(3600))
        .unwrap()
        .offset(Duration::from_secs(offset))
        .unwrap();
    let latest = hourly.latest_at_or_before(SystemTime::now()).unwrap();
    let latest = latest.duration_since(UNIX_EPOCH).unwrap().as_secs();
    recorded(
        &url,
        "hourly",
        &hourly,
        &[latest],
        RecordedOutcome::SkippedPaused,
    )
    .await;
    let mut cmd = baton("schedule", &url);
    cmd.args([
        "--key",
        "hourly",
        "--every",
        "1h",
        "--offset",
        &format!("{offset}s"),
    ])
    .args(["--catch-up", "last", "-v", "--", "sh", "-c"])
    .arg(format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log)))
    .stderr(std::process::Stdio::from(
        std::fs::File::create(&err).unwrap(),
    ));
    let child = spawn(&mut cmd);
    let said = wait_file(&err, QUICK, |t| t.contains("not caught up")).await;
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = finish_by(child, Instant::now() + QUICK, "baton schedule").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(said.is_some(), "{text}");
    assert!(
        text.contains(&format!(
            "occurrence {} was skipped while paused",
            id_of(latest)
        )),
        "{text}"
    );
    assert!(lines(&log).is_empty(), "nothing ran: {:?}", lines(&log));
}

/// The `baton backfill` line of docs/cli.md, run as written (its PROGRAM replaced) on a store
/// whose record has the window's first night done: the other nights of the window run once.
#[tokio::test]
async fn the_backfill_line_of_the_docs_runs_as_written() {
    let doc = include_str!("../docs/cli.md");
    let section = doc
        .split("### Backfill and catch-up")
        .nth(1)
        .expect("docs/cli.md has the backfill section");
    let line = section
        .lines()
        .find(|l| l.starts_with("baton backfill "))
        .expect("a `baton backfill` line");
    let args: Vec<&str> = line.split_whitespace().skip(2).collect();
    let cut = args.iter().position(|a| *a == "--").expect("-- PROGRAM");
    let flag = |name: &str| {
        let i = args.iter().position(|a| *a == name).unwrap();
        args[i + 1].parse::<jiff::Timestamp>().unwrap().as_second() as u64
    };
    let (from, to) = (flag("--from"), flag("--to"));
    let nightly = Schedule::every(Duration::from_secs(24 * 3600))
        .unwrap()
        .offset(Duration::from_secs(2 * 3600))
        .unwrap();
    let nights: Vec<u64> = (0..)
        .map(|d| from + 2 * 3600 + d * 24 * 3600)
        .take_while(|t| *t <= to)
        .collect();
    if nights.last().map_or(true, |t| *t > now_secs()) {
        eprintln!("the documented window is not past yet on this host's clock: skipped");
        return;
    }
    let srv = server();
    let url = srv.url();
    let key = args[args.iter().position(|a| *a == "--key").unwrap() + 1];
    recorded(&url, key, &nightly, &nights[..1], RecordedOutcome::Done).await;
    let dir = TempDir::new("backfill-doc");
    let log = dir.path("log");
    let out = finish_by(
        spawn(
            baton("backfill", &url)
                .args(&args[..cut])
                .args(["--", "sh", "-c"])
                .arg(format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log))),
        ),
        Instant::now() + QUICK,
        line,
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let expected: BTreeMap<String, usize> = nights[1..].iter().map(|&t| (id_of(t), 1)).collect();
    assert_eq!(counts(&log), expected, "{}", describe(&out));
}
