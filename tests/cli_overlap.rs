//! `--overlap skip`, `buffer-one` and `replace`, fleet-wide: two `baton schedule` daemons (two
//! "hosts") on one key, on Redis and on PostgreSQL, PROGRAM outlasting the gap between ticks so
//! every tick comes while an earlier occurrence runs on one of them; and three `baton run`
//! hosts for `replace`.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
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

fn epoch(id: &str) -> f64 {
    let ts: jiff::Timestamp = id.parse().unwrap_or_else(|e| panic!("{id:?}: {e}"));
    ts.as_millisecond() as f64 / 1000.0
}

/// Two daemons `baton schedule --every EVERY --overlap POLICY` named a and b, PROGRAM logging
/// `OCCURRENCE start|end SECONDS HOST` around a sleep of `sleep` seconds.
fn daemons(
    url: &str,
    key: &str,
    (policy, every, sleep): (&str, &str, &str),
    log: &Path,
    dir: &TempDir,
) -> Vec<Child> {
    ["a", "b"]
        .iter()
        .map(|host| {
            let script = format!(
                "echo \"$BATON_OCCURRENCE start $(date +%s.%N) {host}\" >> {log}; sleep {sleep}; \
                 echo \"$BATON_OCCURRENCE end $(date +%s.%N) {host}\" >> {log}",
                log = shq(log)
            );
            let mut cmd = baton("schedule", url);
            cmd.args([
                "--key",
                key,
                "--every",
                every,
                "--overlap",
                policy,
                "--json",
            ])
            .args([
                "--name",
                host,
                "--lock-timeout",
                "2s",
                "--",
                "sh",
                "-c",
                &script,
            ]);
            cmd.stderr(Stdio::from(
                std::fs::File::create(dir.path(&format!("err-{host}"))).expect("stderr file"),
            ));
            spawn(&mut cmd)
        })
        .collect()
}

/// The runs in the log: occurrence → (start, end, host) each.
fn runs(log: &Path) -> BTreeMap<String, Vec<(f64, Option<f64>)>> {
    let mut out: BTreeMap<String, Vec<(f64, Option<f64>)>> = BTreeMap::new();
    for line in lines(log) {
        let parts: Vec<&str> = line.split(' ').collect();
        let (occ, what, at) = (parts[0], parts[1], parts[2].parse::<f64>().unwrap());
        let entry = out.entry(occ.to_string()).or_default();
        match what {
            "start" => entry.push((at, None)),
            _ => {
                if let Some(last) = entry.last_mut() {
                    last.1 = Some(at);
                }
            }
        }
    }
    out
}

async fn history(url: &str, key: &str) -> Vec<Value> {
    let out = finish_by(
        spawn(baton("status", url).args(["--key", key, "--history", "--json"])),
        Instant::now() + QUICK,
        "status --history",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn stop(children: Vec<Child>) {
    for child in children {
        send_signal(child.id().unwrap(), libc::SIGTERM);
        let _ = finish_by(child, Instant::now() + QUICK, "baton schedule").await;
    }
}

/// `skip`: PROGRAM runs 3 s on a 2 s period, so each tick after a run comes while it runs on
/// one daemon or the other: both skip it (recorded skipped_overlap), no two runs overlap and
/// no occurrence runs twice.
async fn skip_is_fleet_wide(url: &str) {
    let dir = TempDir::new("overlap-skip");
    let log = dir.path("log");
    let fleet = daemons(url, "ov-skip", ("skip", "2s", "3"), &log, &dir);
    wait_file(&log, Duration::from_secs(20), |t| {
        t.matches(" end ").count() >= 2
    })
    .await
    .expect("two runs ended");
    stop(fleet).await;
    let ran = runs(&log);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    for (occ, r) in &ran {
        assert_eq!(r.len(), 1, "{occ} ran once: {ran:?}");
        spans.push((r[0].0, r[0].1.unwrap_or(f64::MAX)));
    }
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "two runs overlapped: {ran:?}");
    }
    let h = history(url, "ov-skip").await;
    let skipped: Vec<&Value> = h
        .iter()
        .filter(|o| o["outcome"] == "skipped_overlap")
        .collect();
    assert!(
        !skipped.is_empty(),
        "a tick recorded skipped_overlap: {h:?}"
    );
    for s in skipped {
        let id = s["id"].as_str().unwrap();
        assert!(!ran.contains_key(id), "{id} was skipped and ran: {ran:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_is_fleet_wide_on_redis() {
    let srv = server();
    skip_is_fleet_wide(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_is_fleet_wide_on_postgres() {
    let db = common::PgDatabase::create();
    skip_is_fleet_wide(&db.url).await;
}

/// `buffer-one`: PROGRAM runs 4.5 s on a 4 s period. A tick that comes while one runs waits
/// (held by one daemon, the other its backup) and runs once that one ended, later than its
/// tick; none runs twice; no two runs overlap; a tick whose window closed while it waited, or
/// that came while one ran and one waited, is recorded skipped_overlap and never ran.
async fn buffer_one_waits_then_runs(url: &str) {
    let dir = TempDir::new("overlap-buffer");
    let log = dir.path("log");
    let fleet = daemons(url, "ov-buf", ("buffer-one", "4s", "4.5"), &log, &dir);
    wait_file(&log, Duration::from_secs(30), |t| {
        t.matches(" end ").count() >= 4
    })
    .await
    .expect("five runs ended");
    stop(fleet).await;
    let ran = runs(&log);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    let mut buffered = 0;
    for (occ, r) in &ran {
        assert_eq!(r.len(), 1, "{occ} ran once: {ran:?}");
        assert!(r[0].0 >= epoch(occ), "{occ} ran before its tick");
        if r[0].0 > epoch(occ) + 0.3 {
            buffered += 1;
        }
        spans.push((r[0].0, r[0].1.unwrap_or(f64::MAX)));
    }
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0 + 0.05, "two runs overlapped: {ran:?}");
    }
    assert!(
        buffered >= 1,
        "a buffered occurrence ran after the earlier one: {ran:?}"
    );
    let h = history(url, "ov-buf").await;
    for o in h.iter().filter(|o| o["outcome"] == "skipped_overlap") {
        let id = o["id"].as_str().unwrap();
        assert!(!ran.contains_key(id), "{id} was skipped and ran: {ran:?}");
    }
    assert!(
        h.iter().any(|o| o["outcome"] == "skipped_overlap"),
        "a tick recorded skipped_overlap: {h:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_buffer_one_waits_then_runs_on_redis() {
    let srv = server();
    buffer_one_waits_then_runs(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_buffer_one_waits_then_runs_on_postgres() {
    let db = common::PgDatabase::create();
    buffer_one_waits_then_runs(&db.url).await;
}

/// `replace`: host a's occurrence hangs (PROGRAM sleeps 30 s), host c waits as its backup; at
/// the next tick host b runs with `--overlap replace`: a's PROGRAM is stopped at once and a
/// exits with the lost-lease status, c ends without running it, b runs the new occurrence with
/// a higher fencing token, and the record says `replaced` then `done`.
async fn replace_stops_the_running_occurrence(url: &str) {
    let dir = TempDir::new("overlap-replace");
    let every = 4.0;
    // Start just after a tick, so a and c both bind to it with time to spare.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    while now() % every > 0.5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = |host: &str, extra: &[&str], script: String| {
        let mut cmd = baton("run", url);
        cmd.args(["--key", "ov-rep", "--every", "4s", "--early", "0s"])
            .args(["--name", host, "--lease", "2s"])
            .args(extra)
            .args(["--", "sh", "-c", &script]);
        cmd.stderr(Stdio::from(
            std::fs::File::create(dir.path(&format!("err-{host}"))).expect("stderr file"),
        ));
        spawn(&mut cmd)
    };
    let started = |host: &str| {
        format!(
            "echo \"$BATON_OCCURRENCE $BATON_FENCING_TOKEN\" > {}",
            shq(&dir.path(&format!("{host}.start")))
        )
    };
    let a = run(
        "a",
        &[],
        format!(
            "{}; sleep 30; touch {}",
            started("a"),
            shq(&dir.path("a.end"))
        ),
    );
    let a_start = wait_file(&dir.path("a.start"), QUICK, |t| t.ends_with('\n'))
        .await
        .expect("a's PROGRAM started");
    let (a_occ, a_token) = a_start.trim().split_once(' ').unwrap();
    let a_token: u64 = a_token.parse().unwrap();
    let c = run("c", &[], format!("touch {}", shq(&dir.path("c.ran"))));
    // b at the next tick.
    let next = epoch(a_occ) + every;
    while now() < next + 0.2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = run("b", &["--overlap", "replace"], started("b"));
    let b_out = finish_by(b, Instant::now() + QUICK, "b").await;
    assert_eq!(code(&b_out), 0, "b: {}", describe(&b_out));
    let a_out = finish_by(a, Instant::now() + QUICK, "a").await;
    assert_eq!(code(&a_out), 74, "a lost its lease: {}", describe(&a_out));
    let a_err = std::fs::read_to_string(dir.path("err-a")).unwrap();
    assert!(a_err.contains("replaced by b"), "a says why: {a_err}");
    let c_out = finish_by(c, Instant::now() + QUICK, "c").await;
    assert_eq!(code(&c_out), 0, "c: {}", describe(&c_out));
    assert!(!dir.path("c.ran").exists(), "the backup did not run it");
    assert!(!dir.path("a.end").exists(), "a's PROGRAM was stopped");
    let b_start = std::fs::read_to_string(dir.path("b.start")).unwrap();
    let (b_occ, b_token) = b_start.trim().split_once(' ').unwrap();
    assert!(epoch(b_occ) > epoch(a_occ), "{b_occ} after {a_occ}");
    assert!(
        b_token.parse::<u64>().unwrap() > a_token,
        "b's token {b_token} above a's {a_token}"
    );
    let h = history(url, "ov-rep").await;
    let outcome = |id: &str| {
        h.iter()
            .find(|o| o["id"] == id)
            .map(|o| o["outcome"].clone())
    };
    assert_eq!(outcome(a_occ), Some("replaced".into()), "{h:?}");
    assert_eq!(outcome(b_occ), Some("done".into()), "{h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_replace_stops_the_running_occurrence_on_redis() {
    let srv = server();
    replace_stops_the_running_occurrence(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_replace_stops_the_running_occurrence_on_postgres() {
    let db = common::PgDatabase::create();
    replace_stops_the_running_occurrence(&db.url).await;
}
