//! Scheduled jobs through the `baton` binary: `baton run --every/--cron` (one occurrence per
//! run, bound by the server's clock) and `baton schedule` (the long-running form), against a
//! private redis-server per test (and PostgreSQL for `run`). Ticks are a second or two apart;
//! the server runs on this host, so its clock is the one `date` reads in PROGRAM.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::process::*;
use common::{server, shq, TempDir};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

/// `baton SUB --url URL` ([`baton_command`]).
fn baton(sub: &str, url: &str) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg(sub).arg("--url").arg(url);
    cmd
}

/// `cmd` with its stderr written to `path` (read while it runs).
fn stderr_to(cmd: &mut Command, path: &Path) {
    cmd.stderr(Stdio::from(
        std::fs::File::create(path).expect("stderr file"),
    ));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Seconds since the epoch of an RFC 3339 time (an occurrence's id).
fn epoch(id: &str) -> f64 {
    let ts: jiff::Timestamp = id.parse().unwrap_or_else(|e| panic!("{id:?}: {e}"));
    ts.as_millisecond() as f64 / 1000.0
}

/// The id of the tick at `secs` seconds since the epoch.
fn id_of(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64)
        .unwrap()
        .to_string()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The first multiple of `period` seconds at least `margin` seconds from now.
fn tick_after(period: u64, margin: f64) -> u64 {
    let t = (now_secs() + margin).ceil() as u64;
    t.div_ceil(period) * period
}

/// Sleeps until `at` seconds since the epoch (this host's clock, the server's too).
async fn sleep_until_epoch(at: f64) {
    let left = at - now_secs();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// The `occurrence_ended` lines of a `--json` stderr.
fn reports(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "occurrence_ended")
        .collect()
}

/// Lines `OCCURRENCE REST...` of a file PROGRAM appends to, by occurrence.
fn by_occurrence(path: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines(path) {
        let mut parts = line.splitn(2, ' ');
        let occ = parts.next().unwrap_or_default().to_string();
        out.entry(occ)
            .or_default()
            .push(parts.next().unwrap_or_default().to_string());
    }
    out
}

// ---------------------------------------------------------------------------------------------
// baton run with a schedule
// ---------------------------------------------------------------------------------------------

/// Three `baton run --every 2s` at each of three consecutive ticks, one started inside the
/// early tolerance (E = 1 s here: half the period) and two late: each occurrence runs exactly
/// once, none is skipped, and PROGRAM never starts before its tick.
async fn three_runs_at_each_of_three_ticks(url: &str) {
    let dir = TempDir::new("sched-run");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE $(date +%s.%N)\" >> {}", shq(&log));
    let first = tick_after(2, 1.5);
    let ticks: Vec<u64> = (0..3).map(|k| first + 2 * k).collect();
    // (start offset from the tick, tick): the early one 0.8 s before, the late ones after.
    let mut starts: Vec<(f64, u64)> = Vec::new();
    for &t in &ticks {
        for offset in [-0.8, 0.2, 0.5] {
            starts.push((t as f64 + offset, t));
        }
    }
    let mut children: Vec<(f64, u64, Child)> = Vec::new();
    for (at, tick) in starts {
        sleep_until_epoch(at).await;
        let child = spawn(
            baton("run", url)
                .args(["--key", "tick", "--every", "2s", "--lock-timeout", "2s"])
                .args(["--", "sh", "-c", &script]),
        );
        children.push((at - tick as f64, tick, child));
    }
    for (offset, tick, child) in children {
        let out = finish(child, "baton run --every 2s").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains("occurrence ") && err.contains("tick@"),
            "baton says which occurrence it bound to: {err}"
        );
        if offset < 0.0 {
            assert!(
                err.contains(&format!("occurrence {}", id_of(tick))) && err.contains("waiting"),
                "a run 0.8 s before tick {tick} binds to it and waits: {err}"
            );
        }
    }
    let ran = by_occurrence(&log);
    for &t in &ticks {
        let runs = ran.get(&id_of(t)).cloned().unwrap_or_default();
        assert_eq!(
            runs.len(),
            1,
            "tick {} ran {runs:?}; all: {ran:#?}",
            id_of(t)
        );
    }
    for (occ, runs) in &ran {
        assert_eq!(runs.len(), 1, "{occ} ran {runs:?}");
        let started: f64 = runs[0].trim().parse().unwrap();
        assert!(
            started >= epoch(occ),
            "PROGRAM of {occ} started at {started}, before its tick"
        );
    }
}

#[tokio::test]
async fn run_every_binds_each_process_to_one_tick_and_runs_it_once_never_early() {
    let srv = server();
    three_runs_at_each_of_three_ticks(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_every_on_postgres_runs_each_tick_once_never_early() {
    let db = common::PgDatabase::create();
    three_runs_at_each_of_three_ticks(&db.url).await;
}

/// Two `baton run --every 2s --key KEY --lock-timeout LEASE -- sh -c SCRIPT`, started 0.2 s
/// after a tick: both bind to it (E = 1 s; the next tick binds runs from 1 s on). The tick
/// (seconds since the epoch) and the processes.
async fn two_runs_after_a_tick(
    url: &str,
    key: &str,
    lease: &str,
    script: &str,
) -> (u64, Vec<Child>) {
    let tick = tick_after(2, 0.5);
    sleep_until_epoch(tick as f64 + 0.2).await;
    let children = (0..2)
        .map(|_| {
            spawn(
                baton("run", url)
                    .args(["--key", key, "--every", "2s", "--lock-timeout", lease])
                    .args(["--", "sh", "-c", script]),
            )
        })
        .collect();
    (tick, children)
}

/// A failing attempt of one occurrence is retried by a backup within that occurrence: the same
/// BATON_OCCURRENCE, BATON_ATTEMPT 2.
#[tokio::test]
async fn a_failed_attempt_is_retried_by_a_backup_within_its_occurrence() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-retry");
    let log = dir.path("log");
    let script = format!(
        "echo \"$BATON_OCCURRENCE $BATON_ATTEMPT\" >> {}; [ \"$BATON_ATTEMPT\" -ge 2 ]",
        shq(&log)
    );
    let (tick, children) = two_runs_after_a_tick(&url, "retry", "2s", &script).await;
    let mut codes = Vec::new();
    for child in children {
        let out = finish(child, "baton run --every").await;
        codes.push(code(&out));
    }
    codes.sort_unstable();
    assert_eq!(
        codes,
        [0, 1],
        "the holder exits with PROGRAM's 1, the backup 0"
    );
    let id = id_of(tick);
    assert_eq!(
        lines(&log),
        [format!("{id} 1"), format!("{id} 2")],
        "attempt 2 of the same occurrence"
    );
}

/// A holder killed mid-occurrence (SIGKILL to its baton) is taken over after its lease, within
/// the same occurrence.
#[tokio::test]
async fn a_killed_holder_is_taken_over_after_its_lease_within_its_occurrence() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-kill");
    let log = dir.path("log");
    let script = format!(
        "echo \"$BATON_OCCURRENCE $BATON_ATTEMPT $PPID\" >> {}; \
         [ \"$BATON_ATTEMPT\" -ge 2 ] || exec sleep 30",
        shq(&log)
    );
    let (tick, mut children) = two_runs_after_a_tick(&url, "kill", "1s", &script).await;
    let first = wait_file(&log, QUICK, |t| t.ends_with('\n'))
        .await
        .expect("the holder ran PROGRAM");
    let fields: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(fields[..2], [id_of(tick).as_str(), "1"], "{first}");
    let holder_pid: u32 = fields[2].parse().unwrap();
    let i = children
        .iter()
        .position(|c| c.id() == Some(holder_pid))
        .expect("PROGRAM's parent is one of the two batons");
    let mut holder = children.remove(i);
    let killed_at = Instant::now();
    holder.start_kill().expect("SIGKILL the holder");
    let _ = holder.wait().await;
    let backup = children.pop().unwrap();
    let out = finish(backup, "the backup").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let ran = lines(&log);
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(
        ran[1].starts_with(&format!("{} 2 ", id_of(tick))),
        "attempt 2 of the same occurrence: {ran:?}"
    );
    assert!(
        killed_at.elapsed() < Duration::from_secs(8),
        "taken over after the 1 s lease, not later"
    );
}

/// `--retention` shorter than the window a run binds to a tick in: `--every 10s` binds runs to
/// a tick until 5 s after it, `--retention 1s` would let `DONE` expire after 1 s. Two runs of
/// the same tick 2.5 s apart (a late cron, a systemd `Persistent=` catch-up): PROGRAM runs once,
/// the late run finds the occurrence done, and baton says once that it kept `DONE` longer.
#[tokio::test]
async fn a_retention_shorter_than_the_gap_never_runs_an_occurrence_twice() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-retention");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE $BATON_ATTEMPT\" >> {}", shq(&log));
    let run = || {
        let mut cmd = baton("run", &url);
        cmd.args(["--key", "short", "--every", "10s", "--retention", "1s"])
            .args(["--lock-timeout", "500ms", "--", "sh", "-c", &script]);
        cmd
    };
    let tick = tick_after(10, 0.0);
    sleep_until_epoch(tick as f64 + 0.2).await;
    let first = finish(spawn(&mut run()), "the first run").await;
    assert_eq!(code(&first), 0, "{}", describe(&first));
    sleep_until_epoch(tick as f64 + 2.7).await;
    let late = finish(spawn(&mut run()), "the late run").await;
    assert_eq!(code(&late), 0, "{}", describe(&late));
    assert_eq!(
        lines(&log),
        [format!("{} 1", id_of(tick))],
        "PROGRAM ran once for the occurrence; the late run: {}",
        describe(&late)
    );
    let said = stderr(&first);
    assert_eq!(
        said.matches("--retention 1.0 s is too short").count(),
        1,
        "said once: {said}"
    );
}

/// Two schedules on one key (`--every 1s` and `--every 2s`) bind to the same instant but never
/// share an occurrence: each has its own job, and both run.
#[tokio::test]
async fn two_schedules_on_one_key_never_share_an_occurrence() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-two");
    let log = dir.path("log");
    let script = format!(
        "echo \"$BATON_OCCURRENCE $BATON_JOB $BATON_KEY\" >> {}",
        shq(&log)
    );
    let tick = tick_after(2, 1.0);
    // 0.3 s early: within both tolerances (0.5 s and 1 s).
    sleep_until_epoch(tick as f64 - 0.3).await;
    let children: Vec<Child> = ["1s", "2s"]
        .iter()
        .map(|every| {
            spawn(
                baton("run", &url)
                    .args(["--key", "shared", "--every", every])
                    .args(["--", "sh", "-c", &script]),
            )
        })
        .collect();
    for child in children {
        let out = finish(child, "baton run").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
    }
    let ran = lines(&log);
    assert_eq!(ran.len(), 2, "both schedules ran: {ran:?}");
    let parts: Vec<Vec<&str>> = ran.iter().map(|l| l.split(' ').collect()).collect();
    let id = id_of(tick);
    assert!(
        parts.iter().all(|p| p[0] == id && p[2] == "shared"),
        "{ran:?}"
    );
    assert_ne!(parts[0][1], parts[1][1], "different jobs: {ran:?}");
    assert!(parts.iter().all(|p| p[1].starts_with("shared@")), "{ran:?}");
}

// ---------------------------------------------------------------------------------------------
// baton schedule
// ---------------------------------------------------------------------------------------------

/// `baton schedule --every 1s` on three processes for about five ticks: every tick runs once,
/// with no gap, and for each exactly one process reports having run it.
#[tokio::test]
async fn schedule_on_three_processes_runs_every_tick_once_without_gaps() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-three");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE $BATON_ATTEMPT\" >> {}", shq(&log));
    let mut children = Vec::new();
    for i in 0..3 {
        let err = dir.path(&format!("err{i}"));
        let mut cmd = baton("schedule", &url);
        cmd.args([
            "--key",
            "every",
            "--every",
            "1s",
            "--lock-timeout",
            "2s",
            "--json",
        ])
        .args(["--", "sh", "-c", &script]);
        stderr_to(&mut cmd, &err);
        children.push((spawn(&mut cmd), err));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // About five ticks after the last start, stopped half-way between two ticks (PROGRAM is
    // quick: nothing runs then, so each exits 0).
    let stop_at = now_secs().floor() + 5.5;
    sleep_until_epoch(stop_at).await;
    for (child, _) in &children {
        send_signal(child.id().unwrap(), libc::SIGTERM);
    }
    let mut ran_here: BTreeMap<String, usize> = BTreeMap::new();
    for (child, err) in children {
        let out = finish(child, "baton schedule").await;
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        assert_eq!(code(&out), 0, "{}\n{text}", describe(&out));
        for r in reports(&text) {
            assert!(
                ["done", "done_elsewhere"].contains(&r["outcome"].as_str().unwrap()),
                "{r}"
            );
            if r["outcome"] == "done" {
                *ran_here
                    .entry(r["occurrence"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
    }
    let ran = by_occurrence(&log);
    let ticks: Vec<f64> = ran.keys().map(|k| epoch(k)).collect();
    assert!(ticks.len() >= 4, "about five ticks ran: {ran:#?}");
    for pair in ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], 1.0, "a gap between ticks: {ran:#?}");
    }
    for (occ, runs) in &ran {
        assert_eq!(runs, &["1"], "{occ} ran {runs:?}");
        assert_eq!(
            ran_here.get(occ),
            Some(&1),
            "one process reports running {occ}: {ran_here:?}"
        );
    }
}

/// A `baton schedule` stopped (SIGSTOP: a stalled process, a suspended host) past the binding
/// window of the tick it waited for does not run that stale tick on waking: it runs the
/// occurrence a run starting then binds to, so PROGRAM always starts inside its tick's window
/// `[T, T + P − E)` (P = 2 s, E = 1 s here).
#[tokio::test]
async fn a_schedule_stalled_past_its_window_runs_the_occurrence_it_binds_to_on_waking() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-stall");
    let log = dir.path("log");
    let err = dir.path("err");
    let script = format!("echo \"$BATON_OCCURRENCE $(date +%s.%N)\" >> {}", shq(&log));
    let mut cmd = baton("schedule", &url);
    cmd.args(["--key", "stall", "--every", "2s", "--lock-timeout", "1s"])
        .args(["--", "sh", "-c", &script]);
    stderr_to(&mut cmd, &err);
    let child = spawn(&mut cmd);
    let pid = child.id().unwrap();
    // Stopped 0.3 s after a tick T0 (waiting for T0 + 2) until T0 + 3.5: past T0 + 2's window.
    let t0 = tick_after(2, 0.5) as f64;
    sleep_until_epoch(t0 + 0.3).await;
    send_signal(pid, libc::SIGSTOP);
    sleep_until_epoch(t0 + 3.5).await;
    send_signal(pid, libc::SIGCONT);
    sleep_until_epoch(t0 + 6.5).await;
    send_signal(pid, libc::SIGTERM);
    let out = finish(child, "baton schedule").await;
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(code(&out), 0, "{}\n{text}", describe(&out));
    let ran = by_occurrence(&log);
    assert!(!ran.is_empty(), "nothing ran: {text}");
    for (occ, starts) in &ran {
        let tick = epoch(occ);
        for start in starts {
            let start: f64 = start.parse().unwrap();
            assert!(
                start >= tick && start < tick + 1.0,
                "{occ} started at {start:.3}, outside its window [T, T + 1 s): {ran:#?}\n{text}"
            );
        }
    }
    assert!(
        !ran.contains_key(&id_of(t0 as u64 + 2)),
        "the tick waited for during the stall ran after it: {ran:#?}"
    );
    assert!(
        ran.contains_key(&id_of(t0 as u64 + 4)),
        "the occurrence bound on waking ran: {ran:#?}\n{text}"
    );
}

/// The offset of an hourly schedule whose latest tick was half an hour ago: far from both
/// ticks, so the test does not race one.
fn half_hour_ago_offset() -> String {
    let now = now_secs() as u64;
    format!("{}s", (now - 1800) % 3600)
}

/// `--catch-up last` runs the latest past tick when it is not done; a later start finds it done
/// and does not run it again.
#[tokio::test]
async fn catch_up_last_runs_a_past_tick_not_done_and_not_one_done() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-catch");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log));
    let offset = half_hour_ago_offset();
    let start = |n: usize| {
        let err = dir.path(&format!("err{n}"));
        let mut cmd = baton("schedule", &url);
        cmd.args(["--key", "catch", "--every", "1h", "--offset", &offset])
            .args(["--catch-up", "last", "--json", "--", "sh", "-c", &script]);
        stderr_to(&mut cmd, &err);
        (spawn(&mut cmd), err)
    };
    for (n, outcome) in [(0, "done"), (1, "done_elsewhere")] {
        let (child, err) = start(n);
        let text = wait_file(&err, QUICK, |t| !reports(t).is_empty())
            .await
            .unwrap_or_else(|| panic!("no report from start {n}"));
        let r = &reports(&text)[0];
        assert_eq!(r["outcome"], outcome, "start {n}: {text}");
        send_signal(child.id().unwrap(), libc::SIGTERM);
        let out = finish(child, "baton schedule").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
    }
    let ran = lines(&log);
    assert_eq!(ran.len(), 1, "the past tick ran once: {ran:?}");
    assert!(epoch(&ran[0]) < now_secs() - 1700.0, "{ran:?}");
}

/// `--overlap skip`: a tick that comes while an earlier occurrence still runs here is reported
/// skipped and not run.
#[tokio::test]
async fn overlap_skip_reports_a_tick_that_comes_while_one_runs() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-skip");
    let log = dir.path("log");
    let err = dir.path("err");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}; sleep 1.5", shq(&log));
    let mut cmd = baton("schedule", &url);
    cmd.args([
        "--key",
        "skip",
        "--every",
        "1s",
        "--overlap",
        "skip",
        "--json",
    ])
    .args(["--lock-timeout", "3s", "--", "sh", "-c", &script]);
    stderr_to(&mut cmd, &err);
    let child = spawn(&mut cmd);
    let text = wait_file(&err, QUICK, |t| {
        reports(t).iter().any(|r| r["outcome"] == "skipped_overlap")
    })
    .await
    .expect("a tick reported skipped");
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let _ = finish(child, "baton schedule").await;
    let skipped: BTreeSet<String> = reports(&text)
        .iter()
        .filter(|r| r["outcome"] == "skipped_overlap")
        .map(|r| r["occurrence"].as_str().unwrap().to_string())
        .collect();
    let ran: BTreeSet<String> = lines(&log).into_iter().collect();
    assert!(!ran.is_empty(), "an occurrence ran");
    assert!(
        skipped.is_disjoint(&ran),
        "skipped {skipped:?} but ran {ran:?}"
    );
    for s in &skipped {
        assert!(
            ran.iter()
                .any(|r| epoch(r) < epoch(s) && epoch(s) < epoch(r) + 1.5),
            "{s} was skipped while an earlier one ran: {ran:?}"
        );
    }
}

/// One server, PROGRAM failing the first time it runs: `schedule` rejoins by default, so the
/// same occurrence's attempt 2 runs here and the occurrence ends done.
#[tokio::test]
async fn a_one_server_schedule_retries_an_occurrence_whose_attempt_1_failed() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-rejoin");
    let (log, failed, err) = (dir.path("log"), dir.path("failed"), dir.path("err"));
    let script = format!(
        "echo \"$BATON_OCCURRENCE $BATON_ATTEMPT\" >> {log}; \
         if [ ! -e {failed} ]; then touch {failed}; exit 3; fi",
        log = shq(&log),
        failed = shq(&failed),
    );
    let mut cmd = baton("schedule", &url);
    cmd.args(["--key", "rejoin", "--every", "2s", "--json"])
        .args(["--lock-timeout", "600ms", "--", "sh", "-c", &script]);
    stderr_to(&mut cmd, &err);
    let child = spawn(&mut cmd);
    let text = wait_file(&err, QUICK, |t| !reports(t).is_empty()).await;
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let _ = finish(child, "baton schedule").await;
    let text = text.expect("an occurrence ended");
    let first = &reports(&text)[0];
    assert_eq!(
        first["outcome"], "done",
        "the occurrence whose attempt 1 failed was not retried here: {first}"
    );
    let occurrence = first["occurrence"].as_str().unwrap();
    assert_eq!(
        by_occurrence(&log)
            .get(occurrence)
            .cloned()
            .unwrap_or_default(),
        ["1", "2"],
        "attempts of {occurrence}"
    );
}

/// `--overlap allow` with PROGRAM outlasting several ticks: no more than --max-concurrent
/// occurrences run at once; the others are reported skipped.
#[tokio::test]
async fn max_concurrent_bounds_the_occurrences_that_run_at_once() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-max");
    let (log, err) = (dir.path("log"), dir.path("err"));
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}; sleep 2.5", shq(&log));
    let mut cmd = baton("schedule", &url);
    cmd.args([
        "--key",
        "max",
        "--every",
        "1s",
        "--max-concurrent",
        "1",
        "--json",
    ])
    .args(["--lock-timeout", "3s", "--", "sh", "-c", &script]);
    stderr_to(&mut cmd, &err);
    let child = spawn(&mut cmd);
    let text = wait_file(&err, QUICK, |t| {
        reports(t).iter().any(|r| r["outcome"] == "skipped")
    })
    .await;
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = finish(child, "baton schedule").await;
    let text = text.unwrap_or_else(|| {
        panic!(
            "no tick reported skipped: {}{}",
            std::fs::read_to_string(&err).unwrap_or_default(),
            stderr(&out)
        )
    });
    let skipped: BTreeSet<String> = reports(&text)
        .iter()
        .filter(|r| r["outcome"] == "skipped")
        .map(|r| r["occurrence"].as_str().unwrap().to_string())
        .collect();
    let ran = lines(&log);
    assert_eq!(ran.len(), 1, "one occurrence at a time ran: {ran:?}");
    assert!(!skipped.contains(&ran[0]), "{skipped:?} / {ran:?}");
}

/// SIGTERM to `baton schedule` while it waits for a tick: exit 0. While it holds an attempt:
/// PROGRAM is stopped, the attempt failed (a backup may take over), exit 143.
#[tokio::test]
async fn sigterm_exits_0_while_waiting_and_143_failing_the_attempt_while_holding() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("sched-term");

    let err = dir.path("waiting");
    let mut cmd = baton("schedule", &url);
    cmd.args(["--key", "term", "--every", "1h", "-v", "--", "true"]);
    stderr_to(&mut cmd, &err);
    let child = spawn(&mut cmd);
    wait_file(&err, QUICK, |t| t.contains("next tick"))
        .await
        .expect("waiting for the next tick");
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = finish(child, "baton schedule, waiting").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));

    let pidfile = dir.path("pid");
    let jobfile = dir.path("job");
    let script = format!(
        "echo \"$BATON_JOB\" > {}; echo $$ > {}; exec sleep 30",
        shq(&jobfile),
        shq(&pidfile)
    );
    let offset = half_hour_ago_offset();
    let child = spawn(
        baton("schedule", &url)
            .args(["--key", "term", "--every", "1h", "--offset", &offset])
            .args(["--catch-up", "last", "--", "sh", "-c", &script]),
    );
    let program = read_pid(&pidfile, QUICK).await;
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = finish(child, "baton schedule, holding").await;
    assert_eq!(code(&out), 143, "{}", describe(&out));
    assert!(
        stderr(&out).contains("ran here: stopped by SIGTERM"),
        "{}",
        describe(&out)
    );
    assert!(gone_within(program, QUICK).await, "PROGRAM was stopped");
    let job = std::fs::read_to_string(&jobfile)
        .unwrap()
        .trim()
        .to_string();
    let status = finish(
        spawn(baton("status", &url).args(["--key", &job, "--json"])),
        "status",
    )
    .await;
    let value: Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", describe(&status)));
    assert_eq!(value["state"], "waiting", "attempt 1 failed: {value}");
    assert!(
        value["last_failure"]
            .as_str()
            .is_some_and(|f| f.contains("SIGTERM")),
        "{value}"
    );
}

// ---------------------------------------------------------------------------------------------
// Usage and help
// ---------------------------------------------------------------------------------------------

/// Each schedule flag's parse error exits 64 with a message naming the flag, before connecting
/// (the URL is unreachable).
#[tokio::test]
async fn every_schedule_flag_s_parse_error_exits_64_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--every", "soon"], "--every"),
        (&["--every", "0s"], "--every"),
        (&["--every", "2s", "--offset", "later"], "--offset"),
        (&["--every", "2s", "--offset", "5s"], "--offset"),
        (&["--offset", "1s"], "--every"),
        (&["--cron", "0 2 * *"], "--cron"),
        (&["--cron", "0 61 * * *"], "--cron"),
        (&["--cron", "0 2 * * *", "--tz", "Mars/Olympus"], "--tz"),
        (&["--tz", "Europe/Paris"], "--cron"),
        (&["--every", "1s", "--cron", "* * * * *"], "--cron"),
        (&["--every", "1s", "--early", "a bit"], "--early"),
        (&["--early", "5s"], "--every"),
        (&["--every", "2s", "--jitter", "3s"], "--jitter"),
        (&["--cron", "0 2,3 * * *", "--jitter", "2h"], "--jitter"),
        (&["--jitter", "1s"], "--every"),
    ];
    let schedule_only: &[(&[&str], &str)] = &[
        (&["--every", "1s", "--catch-up", "sometimes"], "--catch-up"),
        (&["--every", "1s", "--overlap", "maybe"], "--overlap"),
        (&[], "--every"),
    ];
    let unreachable = "redis://127.0.0.1:1/";
    let mut all = Vec::new();
    for (args, flag) in cases {
        all.push(("run", *args, *flag));
        all.push(("schedule", *args, *flag));
    }
    for (args, flag) in schedule_only {
        all.push(("schedule", *args, *flag));
    }
    for (sub, args, flag) in all {
        let out = finish(
            spawn(
                baton(sub, unreachable)
                    .args(["--key", "k"])
                    .args(args)
                    .args(["--", "true"]),
            ),
            "a usage error",
        )
        .await;
        assert_eq!(code(&out), 64, "{sub} {args:?}: {}", describe(&out));
        assert!(
            stderr(&out).contains(flag),
            "{sub} {args:?} names {flag}: {}",
            stderr(&out)
        );
    }
}

#[tokio::test]
async fn help_of_run_and_schedule_shows_crontab_lines_systemd_units_and_the_guarantees() {
    let help = |sub: &'static str| async move {
        let out = finish(
            spawn(
                Command::new(BATON)
                    .args([sub, "--help"])
                    .stdout(Stdio::piped()),
            ),
            "--help",
        )
        .await;
        assert_eq!(code(&out), 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let run = help("run").await;
    for want in [
        "0 2 * * *  baton run --quiet --key nightly-report --cron '0 2 * * *' --tz Europe/Paris",
        "Type=oneshot",
        "[Timer]",
        "OnCalendar=",
        "baton run --key nightly-report --every 24h",
        "once across the fleet",
        "never starts before its tick",
        "--early",
        "BATON_OCCURRENCE",
        "BATON_JOB",
    ] {
        assert!(run.contains(want), "run --help lacks {want:?}:\n{run}");
    }
    let schedule = help("schedule").await;
    for want in [
        "ExecStart=/usr/local/bin/baton schedule --key nightly-report",
        "[Service]",
        "KillMode=mixed",
        "@reboot  baton schedule",
        "once across the fleet, never before its tick",
        "--catch-up",
        "--overlap",
        "Exit statuses of `baton schedule`",
        "143",
        "BATON_OCCURRENCE",
    ] {
        assert!(
            schedule.contains(want),
            "schedule --help lacks {want:?}:\n{schedule}"
        );
    }
}

/// The crontab lines of the README and of docs/cli.md (and of `run --help`), run as cron runs
/// them (their command by `/bin/sh -c`): the first run runs the report for tonight's occurrence
/// (the latest 02:00 in Paris, by the server's clock), a duplicate run of the same night does
/// not, and neither prints a thing (`--quiet`: cron mails whatever a job prints).
#[tokio::test]
async fn the_crontab_lines_of_the_docs_run_the_nights_occurrence_once_and_print_nothing() {
    let help = finish(
        spawn(
            Command::new(BATON)
                .args(["run", "--help"])
                .stdout(Stdio::piped()),
        ),
        "run --help",
    )
    .await;
    for doc in ["README.md", "docs/cli.md"] {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).expect(doc);
        let line = text
            .split("```cron\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .and_then(|block| {
                block
                    .lines()
                    .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            })
            .unwrap_or_else(|| panic!("a crontab line in a ```cron block of {doc}"))
            .trim()
            .to_string();
        crontab_line_runs_once_quietly(doc, &line, &help).await;
    }
}

async fn crontab_line_runs_once_quietly(doc: &str, line: &str, help: &Output) {
    assert!(
        String::from_utf8_lossy(&help.stdout).contains(line),
        "`baton run --help` shows another crontab line than {doc}'s {line:?}"
    );
    let command = line
        .split_whitespace()
        .skip(5)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        !command.contains('%'),
        "crontab would cut the line at %: {line:?}"
    );
    assert!(command.contains("--quiet"), "{doc}: {line:?}");
    assert!(command.contains("/usr/local/bin/report"), "{line:?}");

    let srv = server();
    let dir = TempDir::new("sched-crontab");
    let ran = dir.path("ran");
    let report = dir.path("report");
    std::fs::write(
        &report,
        format!(
            "#!/bin/sh\necho \"$BATON_OCCURRENCE $BATON_KEY\" >> {}\n",
            shq(&ran)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&report, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let command = command
        .replace("/usr/local/bin/report", &shq(&report))
        .replacen("baton ", &format!("{} ", shq(Path::new(BATON))), 1);
    // Tonight's tick: the latest 02:00 in Paris at or before now + 60 s (the early tolerance).
    let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    let mut night = soon
        .to_zoned(jiff::tz::TimeZone::get("Europe/Paris").unwrap())
        .date()
        .at(2, 0, 0, 0)
        .to_zoned(jiff::tz::TimeZone::get("Europe/Paris").unwrap())
        .unwrap();
    if night.timestamp() > soon {
        night = night.yesterday().unwrap();
    }
    for _ in 0..2 {
        let out = finish_by(
            spawn(
                Command::new("/bin/sh")
                    .arg("-c")
                    .arg(&command)
                    .env("BATON_URL", srv.url())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true),
            ),
            // Within a minute before 02:00 in Paris it binds to the coming tick and waits.
            Instant::now() + Duration::from_secs(90),
            "the crontab line",
        )
        .await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "{doc}'s crontab line printed something on success: {}",
            describe(&out)
        );
    }
    assert_eq!(
        lines(&ran),
        [format!("{} nightly-report", night.timestamp())],
        "tonight's occurrence ran once"
    );
}

// ---------------------------------------------------------------------------------------------
// --jitter
// ---------------------------------------------------------------------------------------------

/// `--every 2s --early 200ms --lease 500ms` leaves 1.3 s between a tick and the next tick's
/// window minus the lease: `--jitter 1200ms` fits.
const JITTER_FLAGS: [&str; 8] = [
    "--every", "2s", "--early", "200ms", "--lease", "500ms", "--jitter", "1200ms",
];

/// The jitter the library computes for `key`'s occurrence at `tick` (seconds) under
/// [`JITTER_FLAGS`] with `--jitter` `d`.
fn jitter_of(key: &str, tick: u64, d: Duration) -> Duration {
    let schedule = baton::Schedule::every(Duration::from_secs(2))
        .unwrap()
        .early(Duration::from_millis(200));
    schedule
        .occurrence_of_tick(UNIX_EPOCH + Duration::from_secs(tick))
        .unwrap()
        .jitter(key, d, Duration::from_millis(500))
}

/// A key whose jitter under [`JITTER_FLAGS`] is at least 400 ms at each of the `n` ticks from
/// `first`: a start at the tick could not pass for one at the tick plus its jitter.
fn key_with_long_jitters(prefix: &str, first: u64, n: u64) -> String {
    (0..10_000)
        .map(|k| format!("{prefix}-{k}"))
        .find(|key| {
            (0..n).all(|i| {
                jitter_of(key, first + 2 * i, Duration::from_millis(1200))
                    >= Duration::from_millis(400)
            })
        })
        .expect("a key with long jitters")
}

/// The `occurrence` event of a `--json` stderr.
fn occurrence_event(text: &str) -> Value {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "occurrence")
        .unwrap_or_else(|| panic!("no occurrence event in {text}"))
}

/// Three `baton run --jitter` processes (three hosts) bound to one tick: all three say the same
/// jitter, the one the library computes; PROGRAM runs once, attempt 1, at or after the tick
/// plus that jitter by the server's clock (`date` here: the server runs on this host), and
/// before the next tick's window.
#[tokio::test]
async fn run_jitter_starts_attempt_1_at_the_tick_plus_the_same_jitter_on_every_host() {
    let srv = server();
    let dir = TempDir::new("sched-jitter");
    let log = dir.path("log");
    let script = format!(
        "echo \"$BATON_OCCURRENCE $BATON_ATTEMPT $(date +%s.%N)\" >> {}",
        shq(&log)
    );
    let tick = tick_after(2, 1.0);
    let key = key_with_long_jitters("jittered", tick, 1);
    let j = jitter_of(&key, tick, Duration::from_millis(1200));
    // Just after the tick: each binds to it (its window runs until the next tick − 200 ms).
    sleep_until_epoch(tick as f64 + 0.05).await;
    let children: Vec<Child> = (0..3)
        .map(|_| {
            spawn(
                baton("run", &srv.url())
                    .args(["--key", &key, "--json"])
                    .args(JITTER_FLAGS)
                    .args(["--", "sh", "-c", &script]),
            )
        })
        .collect();
    let mut jobs = BTreeSet::new();
    for child in children {
        let out = finish(child, "baton run --jitter").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let event = occurrence_event(&stderr(&out));
        assert_eq!(event["occurrence"], id_of(tick), "{event}");
        assert_eq!(
            event["jitter_ms"].as_u64(),
            Some(j.as_millis() as u64),
            "every host computes the library's jitter: {event}"
        );
        let start = jiff::Timestamp::from_millisecond((tick * 1000) as i64 + j.as_millis() as i64)
            .unwrap()
            .to_string();
        assert_eq!(event["start"], start, "{event}");
        jobs.insert(event["job"].as_str().unwrap().to_string());
    }
    assert_eq!(jobs.len(), 1, "one job for the tick: {jobs:?}");
    let ran = by_occurrence(&log);
    let runs = &ran[&id_of(tick)];
    assert_eq!(runs.len(), 1, "the occurrence ran once: {ran:?}");
    let (attempt, at) = runs[0].split_once(' ').unwrap();
    assert_eq!(attempt, "1");
    let at: f64 = at.parse().unwrap();
    let start = tick as f64 + j.as_secs_f64();
    assert!(
        at >= start,
        "PROGRAM started at {at:.3}, {:.3} s before tick + jitter {start:.3}",
        start - at
    );
    assert!(
        at < tick as f64 + 1.8,
        "PROGRAM started in the next tick's window"
    );
}

/// Jitter is not in the digest: runs with different `--jitter` (a rolling change) and one
/// without bind the tick to the same job, which runs once.
#[tokio::test]
async fn runs_with_different_jitters_bind_one_tick_to_one_job() {
    let srv = server();
    let dir = TempDir::new("sched-jitter-mixed");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE $BATON_ATTEMPT\" >> {}", shq(&log));
    let tick = tick_after(2, 1.0);
    sleep_until_epoch(tick as f64 + 0.05).await;
    let children: Vec<Child> = [Some("1200ms"), Some("300ms"), None]
        .into_iter()
        .map(|jitter| {
            let mut cmd = baton("run", &srv.url());
            cmd.args([
                "--key", "mixed", "--json", "--every", "2s", "--early", "200ms",
            ])
            .args(["--lease", "500ms"]);
            if let Some(j) = jitter {
                cmd.args(["--jitter", j]);
            }
            spawn(cmd.args(["--", "sh", "-c", &script]))
        })
        .collect();
    let mut jobs = BTreeSet::new();
    for child in children {
        let out = finish(child, "baton run").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let event = occurrence_event(&stderr(&out));
        assert_eq!(event["occurrence"], id_of(tick), "{event}");
        jobs.insert(event["job"].as_str().unwrap().to_string());
    }
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        by_occurrence(&log).get(&id_of(tick)).map(Vec::len),
        Some(1),
        "{:?}",
        lines(&log)
    );
}

/// `--jitter` longer than the period is refused before connecting, naming both.
#[tokio::test]
async fn a_jitter_longer_than_the_period_exits_64_naming_both() {
    for sub in ["run", "schedule"] {
        let out = finish(
            spawn(
                baton(sub, "redis://127.0.0.1:1/")
                    .args(["--key", "k", "--every", "1m", "--jitter", "90s"])
                    .args(["--", "true"]),
            ),
            "a usage error",
        )
        .await;
        assert_eq!(code(&out), 64, "{}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains(
                "invalid --jitter: 1 min 30 s is longer than the period of every 1m (1 min)"
            ),
            "{sub}: {err}"
        );
    }
}

/// Three `baton schedule --jitter` (three hosts) over a few ticks: each occurrence runs once,
/// never before its tick plus the jitter the library computes, always before the next tick's
/// window; `BATON_OCCURRENCE` is the tick.
#[tokio::test]
async fn schedule_jitter_runs_each_occurrence_once_at_its_tick_plus_its_jitter() {
    let srv = server();
    let dir = TempDir::new("sched-jitter-daemons");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE $(date +%s.%N)\" >> {}", shq(&log));
    let first = tick_after(2, 1.0);
    let key = key_with_long_jitters("daemon", first, 4);
    let mut children = Vec::new();
    for i in 0..3 {
        let err = dir.path(&format!("err{i}"));
        let mut cmd = baton("schedule", &srv.url());
        cmd.args(["--key", &key, "--json"])
            .args(JITTER_FLAGS)
            .args(["--", "sh", "-c", &script]);
        stderr_to(&mut cmd, &err);
        children.push((spawn(&mut cmd), err));
    }
    // Stopped just after the third tick, before its jittered start (at least 400 ms later):
    // nothing runs then, so each exits 0.
    sleep_until_epoch(first as f64 + 4.1).await;
    for (child, _) in &children {
        send_signal(child.id().unwrap(), libc::SIGTERM);
    }
    for (child, err) in children {
        let out = finish(child, "baton schedule").await;
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        assert_eq!(code(&out), 0, "{}\n{text}", describe(&out));
    }
    let ran = by_occurrence(&log);
    assert!(
        ran.contains_key(&id_of(first)) && ran.contains_key(&id_of(first + 2)),
        "{ran:?}"
    );
    for (occ, starts) in &ran {
        assert_eq!(starts.len(), 1, "{occ} ran {} times: {ran:?}", starts.len());
        let tick = epoch(occ) as u64;
        let start = tick as f64 + jitter_of(&key, tick, Duration::from_millis(1200)).as_secs_f64();
        let at: f64 = starts[0].parse().unwrap();
        assert!(
            at >= start,
            "{occ} started at {at:.3}, before tick + jitter {start:.3}"
        );
        assert!(
            at < tick as f64 + 1.8,
            "{occ} started in the next tick's window"
        );
    }
}

/// The `--jitter` line of docs/cli.md, run as written (its PROGRAM replaced): it binds to this
/// hour's occurrence and says the jitter the library computes. Past the hour's tick plus its
/// jitter it runs PROGRAM at once, with `BATON_OCCURRENCE` the tick; before it, it says it waits
/// for the tick + jitter, and SIGTERM then ends it with 143, nothing run.
#[tokio::test]
async fn the_jitter_line_of_the_docs_runs_at_the_tick_plus_its_jitter() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md")).unwrap();
    let line = doc
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("baton run ") && l.contains("--jitter"))
        .expect("a `baton run … --jitter` line in docs/cli.md")
        .to_string();
    for part in [
        "--key hourly-sync",
        "--cron '0 * * * *'",
        "--jitter 10m",
        "/usr/local/bin/sync",
    ] {
        assert!(line.contains(part), "{line:?} lacks {part:?}");
    }
    let srv = server();
    let dir = TempDir::new("sched-jitter-doc");
    let ran = dir.path("ran");
    let sync = dir.path("sync");
    std::fs::write(
        &sync,
        format!("#!/bin/sh\necho \"$BATON_OCCURRENCE\" >> {}\n", shq(&ran)),
    )
    .unwrap();
    std::fs::set_permissions(&sync, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let command = line.replace("/usr/local/bin/sync", &shq(&sync)).replacen(
        "baton ",
        &format!("{} ", shq(Path::new(BATON))),
        1,
    );
    let hourly = baton::Schedule::cron("0 * * * *").unwrap();
    // Away from the edges (2 s) of this hour's start and of its window, so the library's
    // reading here and baton's of the server's clock agree on the case.
    let (occurrence, start) = loop {
        let now = SystemTime::now();
        let occurrence = hourly.occurrence_at(now).unwrap();
        let start = occurrence.jittered_start(
            "hourly-sync",
            Duration::from_secs(600),
            Duration::from_secs(30),
        );
        let next_window = occurrence.next_tick().unwrap() - Duration::from_secs(60);
        let near = |t: SystemTime| {
            let d = if t > now {
                t.duration_since(now)
            } else {
                now.duration_since(t)
            };
            d.unwrap() < Duration::from_secs(2)
        };
        if !near(start) && !near(occurrence.tick()) && !near(next_window) {
            break (occurrence, start);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let j = start.duration_since(occurrence.tick()).unwrap();
    let sh = |json: bool| {
        let mut cmd = Command::new("/bin/sh");
        let command = if json {
            command.replacen(" -- ", " --json -- ", 1)
        } else {
            command.clone()
        };
        // `exec`: the signals the test sends reach baton, not a shell that would die and
        // leave baton holding the output pipes (dash does not exec the last command itself).
        cmd.arg("-c")
            .arg(format!("exec {command}"))
            .env("BATON_URL", srv.url())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    };
    let said = format!("occurrence {}", occurrence.id());
    if SystemTime::now() > start {
        let out = finish(spawn(&mut sh(false)), "the docs' --jitter line").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let err = stderr(&out);
        assert!(err.contains(&said) && err.contains(", jitter "), "{err}");
        assert!(
            !err.contains("waiting"),
            "past tick + jitter it runs at once: {err}"
        );
        assert_eq!(lines(&ran), [occurrence.id().to_string()]);
        // The same line with --json: the jitter to the millisecond.
        let out = finish(spawn(&mut sh(true)), "the line with --json").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let event = occurrence_event(&stderr(&out));
        assert_eq!(
            event["jitter_ms"].as_u64(),
            Some(j.as_millis() as u64),
            "{event}"
        );
        assert_eq!(lines(&ran).len(), 1, "done already: not run again");
    } else {
        let err = dir.path("err");
        let mut cmd = sh(false);
        stderr_to(&mut cmd, &err);
        let child = spawn(&mut cmd);
        let text = wait_file(&err, QUICK, |t| t.contains("waiting"))
            .await
            .unwrap_or_else(|| panic!("no waiting line: {:?}", std::fs::read_to_string(&err)));
        assert!(
            text.contains(&said)
                && text.contains(", jitter ")
                && text.contains("for the tick + jitter"),
            "{text}"
        );
        send_signal(child.id().unwrap(), libc::SIGTERM);
        let out = finish(child, "the docs' --jitter line").await;
        assert_eq!(code(&out), 143, "{}", describe(&out));
        assert!(lines(&ran).is_empty(), "nothing ran before tick + jitter");
    }
}

async fn finish(child: Child, what: &str) -> Output {
    finish_by(child, Instant::now() + QUICK, what).await
}

// ---------------------------------------------------------------------------------------------
// baton pause / resume
// ---------------------------------------------------------------------------------------------

/// Three `baton schedule --every 2s` workers; `baton pause` over three ticks, then `baton
/// resume`: those ticks ran nowhere and are recorded skipped (paused), the next tick runs
/// once, and no paused tick is caught up.
async fn pause_over_three_ticks_then_resume(url: &str) {
    let dir = TempDir::new("sched-pause");
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log));
    let mut workers = Vec::new();
    for i in 0..3 {
        let name = format!("host-{i}");
        let mut cmd = baton("schedule", url);
        cmd.args([
            "--key", "paused", "--every", "2s", "--name", &name, "--", "sh", "-c",
        ])
        .arg(&script);
        workers.push(spawn(&mut cmd));
    }
    wait_file(&log, Duration::from_secs(20), |t| t.lines().count() >= 1)
        .await
        .expect("a first occurrence ran");
    // Paused 0.5 s after a tick: the next three ticks are skipped.
    let t0 = tick_after(2, 0.0);
    sleep_until_epoch(t0 as f64 + 0.5).await;
    let out = finish_by(
        spawn(baton("pause", url).args(["--key", "paused", "--note", "maintenance"])),
        Instant::now() + QUICK,
        "pause",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let paused: Vec<u64> = (1..=3).map(|k| t0 + 2 * k).collect();
    sleep_until_epoch(paused[2] as f64 + 0.5).await;
    let out = finish_by(
        spawn(baton("resume", url).args(["--key", "paused"])),
        Instant::now() + QUICK,
        "resume",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let next = paused[2] + 2;
    wait_file(&log, Duration::from_secs(10), |t| t.contains(&id_of(next)))
        .await
        .unwrap_or_else(|| panic!("{} did not run after resume", id_of(next)));
    sleep_until_epoch(next as f64 + 1.0).await;
    let ran = by_occurrence(&log);
    for t in &paused {
        assert!(
            !ran.contains_key(&id_of(*t)),
            "paused tick {} ran: {ran:?}",
            id_of(*t)
        );
    }
    assert_eq!(ran[&id_of(next)].len(), 1, "{ran:?}");
    let out = finish_by(
        spawn(baton("status", url).args(["--key", "paused", "--history", "--json"])),
        Instant::now() + QUICK,
        "status --history",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let history: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for t in &paused {
        let entry = history
            .iter()
            .find(|o| o["id"] == id_of(*t))
            .unwrap_or_else(|| panic!("{} not on record: {history:?}", id_of(*t)));
        assert_eq!(entry["outcome"], "skipped_paused", "{entry}");
    }
    drop(workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_over_three_ticks_then_resume_skips_them_and_runs_the_next_on_redis() {
    let srv = server();
    pause_over_three_ticks_then_resume(&srv.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_over_three_ticks_then_resume_skips_them_and_runs_the_next_on_postgres() {
    let db = common::PgDatabase::create();
    pause_over_three_ticks_then_resume(&db.url).await;
}
