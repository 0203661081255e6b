//! Manual occurrences through the `baton` binary: `baton trigger` runs one occurrence once
//! across three `baton schedule` daemons (even of different expressions: a rolling change),
//! recorded in the history with its host and exit status and cleared once done; a trigger
//! while paused is skipped (paused); `baton run --now` runs one manual occurrence once.
//! Redis and PostgreSQL (the least-privilege role).
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::process::*;
use common::{server, shq, TempDir};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(10);

fn baton(sub: &str, url: &str) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg(sub).arg("--url").arg(url);
    cmd
}

async fn run(cmd: &mut Command, what: &str) -> Output {
    let out = finish_by(spawn(cmd), Instant::now() + QUICK, what).await;
    assert_eq!(code(&out), 0, "{what}: {}", describe(&out));
    out
}

/// The lines of `log` (`ID HOST`) for occurrence `id`.
fn runs_of(log: &Path, id: &str) -> Vec<String> {
    lines(log)
        .into_iter()
        .filter(|l| l.split(' ').next() == Some(id))
        .collect()
}

/// The history entries of `key`, every digest (`status --history --json`).
async fn history(url: &str, key: &str) -> Vec<Value> {
    let out = run(
        baton("status", url).args(["--key", key, "--history", "--json"]),
        "status --history",
    )
    .await;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until `key` has no pending trigger (the run that settled it clears it).
async fn cleared(url: &str, key: &str) {
    let client = baton::Client::connect(url).await.expect("connect");
    let deadline = Instant::now() + QUICK;
    loop {
        let pending = client.failover().triggers(key).await.expect("triggers");
        if pending.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still pending: {pending:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three daemons of `key` (two cron expressions and an hourly one: three digests, as in a
/// rolling change), polling triggers every 200 ms; PROGRAM logs `ID HOST`.
fn daemons(url: &str, key: &str, log: &Path) -> Vec<Child> {
    let script = format!("echo \"$BATON_OCCURRENCE $BATON_HOST\" >> {}", shq(log));
    let whens: [&[&str]; 3] = [
        &["--cron", "0 3 * * *"],
        &["--cron", "0 4 * * *"],
        &["--every", "1h"],
    ];
    whens
        .iter()
        .enumerate()
        .map(|(i, when)| {
            let name = format!("host-{i}");
            let mut cmd = baton("schedule", url);
            cmd.args(["--key", key, "--trigger-poll", "200ms", "--name", &name])
                .args(*when)
                .env("BATON_HOST", &name)
                .args(["--", "sh", "-c"])
                .arg(&script);
            spawn(&mut cmd)
        })
        .collect()
}

async fn trigger(url: &str, key: &str, note: &str) -> String {
    let out = run(
        baton("trigger", url).args(["--key", key, "--note", note]),
        "trigger",
    )
    .await;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("manual-"), "{id:?}");
    id
}

async fn triggers_run_once(url: &str) {
    let dir = TempDir::new("trigger");
    let log = dir.path("log");
    let key = "trig";
    let fleet = daemons(url, key, &log);
    // The daemons are up once each has read the (empty) triggers: give them a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 1. One trigger: one run across three daemons of three digests.
    let id = trigger(url, key, "rerun after the fix").await;
    wait_file(&log, QUICK, |t| t.contains(&id))
        .await
        .unwrap_or_else(|| panic!("{id} did not run"));
    cleared(url, key).await;
    // A few more polls: nobody runs it again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let ran = runs_of(&log, &id);
    assert_eq!(ran.len(), 1, "{ran:?}");
    let host = ran[0].split(' ').nth(1).unwrap_or_default().to_string();
    // On record: the manual entry, done, with the host that ran it and exit 0.
    let deadline = Instant::now() + QUICK;
    let entry = loop {
        let h = history(url, key).await;
        let found = h.into_iter().find(|e| e["id"] == id.as_str());
        if let Some(e) = found.filter(|e| e["outcome"] == "done") {
            break e;
        }
        assert!(Instant::now() < deadline, "{id} not recorded done");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(entry["manual"], true, "{entry}");
    assert_eq!(entry["note"], "rerun after the fix", "{entry}");
    let attempt = &entry["attempts"][0];
    assert_eq!(attempt["host"], host.as_str(), "{entry}");
    assert_eq!(attempt["exit"], serde_json::json!({"status": 0}), "{entry}");

    // 2. Paused: the trigger is skipped (paused) like any occurrence, and cleared.
    run(baton("pause", url).args(["--key", key]), "pause").await;
    let paused = trigger(url, key, "while paused").await;
    cleared(url, key).await;
    let h = history(url, key).await;
    let entry = h
        .iter()
        .find(|e| e["id"] == paused.as_str())
        .unwrap_or_else(|| panic!("{paused} not on record: {h:?}"));
    assert_eq!(entry["outcome"], "skipped_paused", "{entry}");
    assert!(runs_of(&log, &paused).is_empty());
    run(baton("resume", url).args(["--key", key]), "resume").await;

    // 3. `baton run --now`: one manual occurrence, run once (here or by a daemon that
    // joined it), exit 0, trigger cleared.
    let script = format!("echo \"$BATON_OCCURRENCE now\" >> {}", shq(&log));
    run(
        baton("run", url)
            .args([
                "--key",
                key,
                "--cron",
                "0 3 * * *",
                "--now",
                "--",
                "sh",
                "-c",
            ])
            .arg(&script),
        "run --now",
    )
    .await;
    cleared(url, key).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let now_runs: Vec<String> = lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("manual-") && !l.starts_with(&id))
        .collect();
    assert_eq!(now_runs.len(), 1, "{now_runs:?}");
    drop(fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_runs_once_across_three_daemons_on_redis() {
    let srv = server();
    triggers_run_once(&srv.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_runs_once_across_three_daemons_on_postgres() {
    let db = common::PgDatabase::create();
    triggers_run_once(&db.url).await;
}

#[tokio::test]
async fn schedule_refuses_now_and_run_now_needs_a_schedule() {
    let srv = server();
    let url = srv.url();
    let out = finish_by(
        spawn(baton("schedule", &url).args(["--key", "k", "--every", "1h", "--now", "--", "true"])),
        Instant::now() + QUICK,
        "schedule --now",
    )
    .await;
    assert_eq!(code(&out), 64, "{}", describe(&out));
    let out = finish_by(
        spawn(baton("run", &url).args(["--key", "k", "--now", "--", "true"])),
        Instant::now() + QUICK,
        "run --now",
    )
    .await;
    assert_eq!(code(&out), 64, "{}", describe(&out));
}

/// The `baton trigger` line of docs/cli.md, run as written: it prints the trigger's id, and
/// the trigger is pending.
#[tokio::test]
async fn the_trigger_line_of_the_docs_prints_the_id() {
    let srv = server();
    let url = srv.url();
    let doc = include_str!("../docs/cli.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("baton trigger --key"))
        .expect("a `baton trigger` line in docs/cli.md");
    let words = shell_words(line);
    let mut cmd = baton(&words[1], &url);
    cmd.args(&words[2..]);
    let out = run(&mut cmd, line).await;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let client = baton::Client::connect(url.as_str()).await.expect("connect");
    let pending = client.failover().triggers("nightly-report").await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].id, id);
    assert_eq!(pending[0].note.as_deref(), Some("rerun after the fix"));
}

/// Splits a documentation line into words (double quotes group).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = vec![];
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}
