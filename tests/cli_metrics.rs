//! `--metrics-addr` and `--metrics-file`, on `baton` processes against a private redis-server:
//! a failover counted by the processes that lived it (the holder's file written on exit, the
//! backup scraped while it holds the attempt it took over), `/healthz` of `baton leader`
//! following leadership and the server, the flags' usage errors, and the dashboard's
//! `/metrics`. Every scrape of `run`, `lock`, `leader` and `dashboard` passes
//! `promtool check metrics` (Prometheus' own linter: a `# HELP` line per metric, among others)
//! with nothing to say; promtool missing fails the test (`.ci/ensure-promtool` installs it).
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::path::Path;
use std::time::Duration;

use common::process::*;
use common::{server, shq, TempDir, WAKE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

/// A loopback address nobody listens on now (the port the kernel handed out, given back).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").to_string()
}

/// One HTTP/1.0 GET: the status code and the body; `None` when nothing answers.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::time::timeout(QUICK, tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut reply = String::new();
    tokio::time::timeout(QUICK, s.read_to_string(&mut reply))
        .await
        .ok()?
        .ok()?;
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// Polls `GET addr path` until `ok` accepts the reply, by `within`; panics with the last one.
async fn until(
    addr: &str,
    path: &str,
    within: Duration,
    ok: impl Fn(&(u16, String)) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + within;
    loop {
        let reply = get(addr, path).await;
        if let Some(r) = reply.as_ref().filter(|r| ok(r)) {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "GET {addr}{path}: still {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the sample `name{labels}` in Prometheus text (labels in any order), if any.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let found: Vec<&str> = rest
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .collect();
        let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        (found.len() == want.len() && want.iter().all(|w| found.contains(&w.as_str())))
            .then(|| value.parse().ok())
            .flatten()
    })
}

fn run_cmd(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("run").arg("--url").arg(url).args(args);
    cmd
}

/// A PROGRAM that says it started (`started`), waits for `go`, then exits `status`.
fn waits_for(started: &Path, go: &Path, status: u8) -> String {
    format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done; exit {status}",
        shq(started),
        shq(go)
    )
}

async fn wait_for(path: &Path) {
    let deadline = Instant::now() + WAKE;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const FAILOVER: [(&str, &str); 2] = [("primitive", "failover"), ("backend", "redis")];

fn with<'a>(more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    FAILOVER.iter().chain(more).copied().collect()
}

#[tokio::test]
async fn a_failover_is_counted_by_the_holder_that_failed_and_the_backup_that_took_over() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("cli-metrics");
    let (a_started, a_go, b_started, b_go) = (
        dir.path("a-started"),
        dir.path("a-go"),
        dir.path("b-started"),
        dir.path("b-go"),
    );
    let file = dir.path("holder.prom");
    let holder = spawn(&mut run_cmd(
        &url,
        &[
            "--key",
            "job",
            "--metrics-file",
            file.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &waits_for(&a_started, &a_go, 1),
        ],
    ));
    wait_for(&a_started).await;
    let addr = free_addr();
    let backup = spawn(&mut run_cmd(
        &url,
        &[
            "--key",
            "job",
            "--metrics-addr",
            &addr,
            "--",
            "sh",
            "-c",
            &waits_for(&b_started, &b_go, 0),
        ],
    ));
    // Serving while it waits as a backup, and healthy.
    assert_eq!(
        until(&addr, "/healthz", WAKE, |r| r.0 == 200).await.1,
        "ok\n"
    );
    let (_, waiting) = until(&addr, "/metrics", WAKE, |r| r.0 == 200).await;
    assert_eq!(
        sample(
            &waiting,
            "baton_grants_total",
            &with(&[("takeover", "true")])
        ),
        None,
        "nothing granted yet:\n{waiting}"
    );

    // The holder fails (PROGRAM exits 1): the backup takes attempt 2 over.
    std::fs::write(&a_go, "").unwrap();
    let out = finish_by(holder, Instant::now() + QUICK, "the holder").await;
    assert_eq!(code(&out), 1, "{}", describe(&out));
    wait_for(&b_started).await;
    let (_, holding) = until(&addr, "/metrics", WAKE, |r| {
        sample(&r.1, "baton_grants_total", &with(&[("takeover", "true")])) == Some(1.0)
    })
    .await;
    promtool_check(&holding, "run --metrics-addr (the backup holding)");
    let count = |name: &str, labels: &[(&str, &str)]| sample(&holding, name, labels);
    assert_eq!(
        count("baton_grants_total", &with(&[("takeover", "false")])),
        None,
        "{holding}"
    );
    assert_eq!(
        count("baton_acquire_duration_seconds_count", &FAILOVER),
        Some(1.0),
        "{holding}"
    );
    assert!(
        count("baton_acquire_duration_seconds_sum", &FAILOVER).is_some_and(|s| s > 0.0),
        "{holding}"
    );
    assert_eq!(
        count(
            "baton_transition_duration_seconds_count",
            &with(&[("transition", "grant")])
        ),
        Some(1.0),
        "{holding}"
    );

    // The holder's file, written on its exit: its grant and its failed attempt.
    let text = std::fs::read_to_string(&file).expect("the holder wrote its metrics");
    promtool_check(&text, "run --metrics-file (the holder)");
    let redis = [("backend", "redis")];
    assert_eq!(
        sample(&text, "baton_grants_total", &with(&[("takeover", "false")])),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "baton_failed_attempts_total", &redis),
        Some(1.0),
        "{text}"
    );
    for transition in ["grant", "fail"] {
        assert_eq!(
            sample(
                &text,
                "baton_transition_duration_seconds_count",
                &with(&[("transition", transition)])
            ),
            Some(1.0),
            "{transition}: {text}"
        );
    }
    assert_eq!(
        sample(&text, "baton_hold_duration_seconds_count", &FAILOVER),
        Some(1.0),
        "{text}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    std::fs::write(&b_go, "").unwrap();
    let out = finish_by(backup, Instant::now() + QUICK, "the backup").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
}

fn leader_cmd(url: &str, tag: &str, addr: &str, log: &Path) -> tokio::process::Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("leader").arg("--url").arg(url).args([
        "--key",
        "el",
        "--lease",
        "1s",
        "--name",
        tag,
        "--metrics-addr",
        addr,
        "--",
        "sh",
        "-c",
        &format!(
            "echo {tag} >> {}; trap 'exit 0' TERM; while :; do sleep 0.05; done",
            shq(log)
        ),
    ]);
    cmd
}

#[tokio::test]
async fn leader_healthz_is_ok_while_leading_or_standing_by_and_not_once_the_server_is_gone() {
    let mut srv = server();
    let url = srv.url();
    let dir = TempDir::new("cli-metrics-leader");
    let log = dir.path("log");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = spawn(&mut leader_cmd(&url, "a", &a_addr, &log));
    let ok = |r: &(u16, String)| r.0 == 200;
    until(&a_addr, "/healthz", WAKE, ok).await;
    let deadline = Instant::now() + WAKE;
    while lines(&log) != ["a"] {
        assert!(Instant::now() < deadline, "a never led: {:?}", lines(&log));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = spawn(&mut leader_cmd(&url, "b", &b_addr, &log));
    until(&b_addr, "/healthz", WAKE, ok).await;
    // The leader counted its term, the standby none.
    let (_, a_metrics) = until(&a_addr, "/metrics", WAKE, ok).await;
    assert_eq!(
        sample(
            &a_metrics,
            "baton_leader_changes_total",
            &[("backend", "redis")]
        ),
        Some(1.0),
        "{a_metrics}"
    );
    promtool_check(&a_metrics, "leader --metrics-addr (the leader)");
    // Both stay healthy for a few renewals.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(&a_addr, "/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(get(&b_addr, "/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(lines(&log), ["a"], "b stood by");

    // The server goes away: the leader loses its term, and neither can read the election.
    srv.single_mut().kill();
    let within = Duration::from_secs(15);
    let unhealthy = |r: &(u16, String)| r.0 == 503;
    until(&a_addr, "/healthz", within, unhealthy).await;
    until(&b_addr, "/healthz", within, unhealthy).await;
    drop((a, b));
}

#[tokio::test]
async fn a_bad_metrics_flag_is_a_usage_error_naming_it() {
    for command in ["run", "schedule", "lock", "leader"] {
        let mut cmd = baton_command(BATON);
        cmd.args([command, "--help"]);
        let out = finish_by(spawn(&mut cmd), Instant::now() + QUICK, "--help").await;
        let text = String::from_utf8_lossy(&out.stdout);
        for flag in ["--metrics-addr", "--metrics-file"] {
            assert!(
                text.contains(flag),
                "{command} --help documents {flag}:\n{text}"
            );
        }
    }
    // Checked before connecting: the URL leads nowhere.
    for (flag, value) in [
        ("--metrics-addr", "nowhere"),
        ("--metrics-file", "/nonexistent-dir/baton.prom"),
    ] {
        let mut cmd = run_cmd(
            "redis://127.0.0.1:1/",
            &["--key", "j", flag, value, "--", "true"],
        );
        let out = finish_by(spawn(&mut cmd), Instant::now() + QUICK, flag).await;
        assert_eq!(code(&out), 64, "{flag} {value}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{flag} {value}: {}",
            describe(&out)
        );
    }
}

#[tokio::test]
async fn a_lock_scrape_passes_promtool() {
    let srv = server();
    let dir = TempDir::new("cli-metrics-lock");
    let (file, started, go) = (dir.path("lock.prom"), dir.path("started"), dir.path("go"));
    let addr = free_addr();
    let mut cmd = baton_command(BATON);
    cmd.arg("lock").arg("--url").arg(srv.url()).args([
        "--key",
        "lk",
        "--metrics-addr",
        &addr,
        "--metrics-file",
        file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &waits_for(&started, &go, 0),
    ]);
    let lock = spawn(&mut cmd);
    wait_for(&started).await;
    let (_, held) = until(&addr, "/metrics", WAKE, |r| {
        sample(
            &r.1,
            "baton_grants_total",
            &[
                ("primitive", "mutex"),
                ("backend", "redis"),
                ("takeover", "false"),
            ],
        ) == Some(1.0)
    })
    .await;
    promtool_check(&held, "lock --metrics-addr (holding)");
    std::fs::write(&go, "").unwrap();
    let out = finish_by(lock, Instant::now() + QUICK, "the lock").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let text = std::fs::read_to_string(&file).expect("the lock wrote its metrics");
    assert_eq!(
        sample(
            &text,
            "baton_hold_duration_seconds_count",
            &[("primitive", "mutex"), ("backend", "redis")]
        ),
        Some(1.0),
        "{text}"
    );
    promtool_check(&text, "lock --metrics-file (released)");
}

/// The dashboard's `/metrics`: its entries by kind and state, the age of its last good read
/// and its failed reads, described, before and during an outage.
#[cfg(feature = "dashboard")]
#[tokio::test]
async fn the_dashboard_serves_its_entries_and_reads_as_metrics_that_pass_promtool() {
    let mut srv = server();
    let url = srv.url();
    // An exhausted job: its one attempt failed.
    let out = finish_by(
        spawn(&mut run_cmd(
            &url,
            &["--key", "nightly", "--max-attempts", "1", "--", "false"],
        )),
        Instant::now() + QUICK,
        "the failing run",
    )
    .await;
    assert_ne!(code(&out), 0, "{}", describe(&out));
    let addr = free_addr();
    let mut cmd = baton_command(BATON);
    cmd.arg("--url")
        .arg(&url)
        .args(["dashboard", "--listen", &addr, "--interval", "100ms"]);
    let dashboard = spawn(&mut cmd);
    let exhausted = [("kind", "job"), ("state", "exhausted")];
    let (_, text) = until(&addr, "/metrics", WAKE, |r| {
        sample(&r.1, "baton_entries", &exhausted) == Some(1.0)
    })
    .await;
    promtool_check(&text, "dashboard /metrics");
    assert!(
        sample(&text, "baton_dashboard_last_read_age_seconds", &[]).is_some_and(|a| a < 5.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "baton_dashboard_read_failures_total", &[]),
        Some(0.0),
        "{text}"
    );

    // The server goes away: reads fail and are counted, the last good read ages, the entries
    // stay those of the last good read.
    srv.single_mut().kill();
    let (_, text) = until(&addr, "/metrics", Duration::from_secs(15), |r| {
        sample(&r.1, "baton_dashboard_read_failures_total", &[]).is_some_and(|n| n >= 1.0)
    })
    .await;
    promtool_check(&text, "dashboard /metrics (server gone)");
    assert_eq!(
        sample(&text, "baton_entries", &exhausted),
        Some(1.0),
        "{text}"
    );
    drop(dashboard);
}
