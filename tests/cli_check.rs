//! `baton check` (Nagios statuses 0/1/2/3) against a private redis-server and PostgreSQL:
//! every worker of a schedule killed over two ticks makes it CRITICAL naming the missed ticks;
//! the dashboard's `/metrics`, scraped then, passes `promtool check metrics`, and fed to
//! `promtool test rules` as the input series of docs/operating.md's alert rules fires the
//! missed-run alert (the rules pass `promtool check rules`); an absent schedule is CRITICAL
//! unless --allow-absent; an unreachable server and a wrong command line are UNKNOWN.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::Output;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::process::*;
use common::{server, shq, PgDatabase, TempDir};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(15);

fn baton(url: &str, args: &[&str]) -> Child {
    let mut cmd = baton_command(BATON);
    cmd.arg("--url").arg(url).args(args);
    spawn(&mut cmd)
}

async fn finished(url: &str, args: &[&str]) -> Output {
    finish_by(baton(url, args), Instant::now() + QUICK, args[0]).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn id_of(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64)
        .unwrap()
        .to_string()
}

async fn sleep_until_epoch(at: f64) {
    let left = at - now_secs();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// Three `baton schedule --every 2s` workers of `key`; waits for a first occurrence done,
/// kills them all (SIGKILL), and returns the two ticks that then passed with no worker, once
/// both windows have closed.
async fn every_worker_dead_over_two_ticks(url: &str, key: &str, dir: &TempDir) -> (u64, u64) {
    let log = dir.path("log");
    let script = format!("echo \"$BATON_OCCURRENCE\" >> {}", shq(&log));
    let mut workers: Vec<Child> = (0..3)
        .map(|i| {
            let name = format!("host-{i}");
            baton(
                url,
                &[
                    "schedule", "--key", key, "--every", "2s", "--lease", "1s", "--name", &name,
                    "--", "sh", "-c", &script,
                ],
            )
        })
        .collect();
    wait_file(&log, Duration::from_secs(20), |t| t.lines().count() >= 1)
        .await
        .unwrap_or_else(|| panic!("no occurrence ran within 20 s"));
    // The record is written beside the run, never before it (on PostgreSQL its tables may
    // still be being made on first use): killed before its first write, the fleet would have
    // left no record at all, which `check` rightly calls absent.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = finished(url, &["check", "--key", key]).await;
        if !stdout(&out).contains("no record in the store") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no record within 20 s: {}",
            describe(&out)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in &mut workers {
        w.kill().await.expect("kill a worker");
    }
    let killed = now_secs();
    // The next two ticks after the kill, and past the second's window (tick + 2 s − E, E =
    // 1 s here: half the period).
    let first = (killed.ceil() as u64).div_ceil(2) * 2;
    let second = first + 2;
    sleep_until_epoch(second as f64 + 2.5).await;
    (first, second)
}

async fn every_worker_killed_makes_check_critical_naming_the_missed_ticks(url: &str) {
    let dir = TempDir::new("check-missed");
    let (t1, t2) = every_worker_dead_over_two_ticks(url, "nightly", &dir).await;
    let out = finished(url, &["check", "--key", "nightly"]).await;
    assert_eq!(code(&out), 2, "{}", describe(&out));
    let line = stdout(&out);
    assert_eq!(line.lines().count(), 1, "one status line: {line}");
    assert!(line.starts_with("SCHEDULE CRITICAL"), "{line}");
    for t in [t1, t2] {
        assert!(line.contains(&id_of(t)), "{} named in {line}", id_of(t));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_killed_over_two_ticks_check_exits_2_naming_them_and_the_alert_fires() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("check-alert");
    let (t1, t2) = every_worker_dead_over_two_ticks(&url, "nightly", &dir).await;
    let out = finished(&url, &["check", "--key", "nightly"]).await;
    assert_eq!(code(&out), 2, "{}", describe(&out));
    for t in [t1, t2] {
        assert!(stdout(&out).contains(&id_of(t)), "{}", describe(&out));
    }

    // The store-computed /metrics, scraped now.
    let (_dash, addr) = dashboard(&url).await;
    let deadline = Instant::now() + QUICK;
    let scrape = loop {
        let body = get(&addr, "/metrics").await;
        if body.lines().any(|l| {
            l.starts_with("baton_schedule_missed{schedule=\"nightly\"} ") && !l.ends_with(" 0")
        }) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no missed ticks in /metrics:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    promtool_check(&scrape, "the dashboard's /metrics with every worker dead");
    let missed = scrape
        .lines()
        .find_map(|l| l.strip_prefix("baton_schedule_missed{schedule=\"nightly\"} "))
        .expect("the missed gauge")
        .trim()
        .to_string();
    assert!(missed.parse::<u64>().unwrap() >= 2, "{scrape}");

    // The documented rules: valid, and fed with the scrape's series, the missed-run alert
    // fires.
    let rules = dir.path("rules.yml");
    std::fs::write(&rules, documented_rules()).unwrap();
    let check = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("run promtool check rules");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let mut series = String::new();
    for line in scrape.lines().filter(|l| l.starts_with("baton_")) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        // The scraped value held over the test's five minutes.
        series += &format!(
            "      - series: '{name}'\n        values: '{}'\n",
            [value; 6].join(" ")
        );
    }
    let test = format!(
        "rule_files:\n  - {rules}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    \
         input_series:\n{series}    alert_rule_test:\n      - eval_time: 2m\n        \
         alertname: BatonScheduleMissed\n        exp_alerts:\n          - exp_labels:\n              \
         severity: page\n              schedule: nightly\n            exp_annotations:\n              \
         summary: \"Schedule nightly missed {missed} tick(s): no host ran them\"\n              \
         description: \"Every worker may be down. `baton check --key nightly` names the ticks.\"\n",
        rules = rules.display()
    );
    let test_file = dir.path("rules_test.yml");
    std::fs::write(&test_file, &test).unwrap();
    let run = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test_file)
        .output()
        .expect("run promtool test rules");
    assert!(
        run.status.success(),
        "promtool test rules:\n{}{}\n--- the test ---\n{test}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_killed_over_two_ticks_check_exits_2_on_postgres() {
    let db = PgDatabase::create();
    every_worker_killed_makes_check_critical_naming_the_missed_ticks(&db.url).await;
}

async fn an_absent_schedule_is_critical_unless_allowed(url: &str) {
    let out = finished(url, &["check", "--key", "never-ran"]).await;
    assert_eq!(code(&out), 2, "{}", describe(&out));
    assert!(
        stdout(&out).starts_with("SCHEDULE CRITICAL"),
        "{}",
        describe(&out)
    );
    let out = finished(url, &["check", "--key", "never-ran", "--allow-absent"]).await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(
        stdout(&out).starts_with("SCHEDULE OK"),
        "{}",
        describe(&out)
    );
}

#[tokio::test]
async fn an_absent_schedule_is_critical_unless_allowed_on_redis() {
    let srv = server();
    an_absent_schedule_is_critical_unless_allowed(&srv.url()).await;
}

#[tokio::test]
async fn an_absent_schedule_is_critical_unless_allowed_on_postgres() {
    let db = PgDatabase::create();
    an_absent_schedule_is_critical_unless_allowed(&db.url).await;
}

/// A server that cannot be reached, and a wrong command line, are UNKNOWN (3), never a
/// sysexits status a monitor would call a broken plugin.
#[tokio::test]
async fn an_unreachable_server_and_a_wrong_line_are_unknown() {
    let out = finished("redis://127.0.0.1:1/", &["check", "--key", "k"]).await;
    assert_eq!(code(&out), 3, "{}", describe(&out));
    assert!(
        stdout(&out).starts_with("SCHEDULE UNKNOWN"),
        "{}",
        describe(&out)
    );
    let out = finished("redis://127.0.0.1:1/", &["check", "--max-age", "soon"]).await;
    assert_eq!(code(&out), 3, "{}", describe(&out));
    let help = finished("redis://127.0.0.1:1/", &["check", "--help"]).await;
    assert_eq!(code(&help), 0, "{}", describe(&help));
    assert!(stdout(&help).contains("Nagios"), "{}", describe(&help));
}

/// The alert rules of docs/operating.md ("Alerting on schedules"), as written there.
fn documented_rules() -> String {
    let doc = include_str!("../docs/operating.md");
    let section = doc
        .split("### Alerting on schedules")
        .nth(1)
        .expect("docs/operating.md has its alert rules");
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = section[start..].find("```").expect("the block's end") + start;
    section[start..end].to_string()
}

/// `baton dashboard` on a free loopback port, and its address.
async fn dashboard(url: &str) -> (Child, String) {
    let mut child = baton(
        url,
        &[
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "200ms",
        ],
    );
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let line = tokio::time::timeout(QUICK, lines.next_line())
        .await
        .expect("the dashboard's first line in time")
        .expect("read stderr")
        .expect("a first line");
    let addr = line
        .split("at http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, addr)
}

/// A GET's body.
async fn get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("send");
    let mut reply = String::new();
    tokio::time::timeout(QUICK, s.read_to_string(&mut reply))
        .await
        .expect("a reply in time")
        .expect("read");
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The commands of docs/cli.md's section on the schedule's record, run as written (with
/// `BATON_URL`) after a night's run: each exits 0 (the check is OK: the night is done, its
/// success recent, nothing missed), the pause shows in `status`, the resume ends it.
#[tokio::test]
async fn the_records_commands_of_the_docs_run_as_written() {
    let srv = server();
    let url = srv.url();
    let doc = include_str!("../docs/cli.md");
    let section = doc
        .split("### The schedule's record: history, missed runs, pause")
        .nth(1)
        .expect("docs/cli.md has the record's section");
    let start = section.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let end = section[start..].find("```").expect("the block's end") + start;
    let lines: Vec<&str> = section[start..end].lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let out = finished(
        &url,
        &[
            "run",
            "--key",
            "nightly-report",
            "--every",
            "24h",
            "--offset",
            "2h",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let bin = std::path::Path::new(BATON).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    for line in lines {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", line])
            .env("PATH", &path)
            .env("BATON_URL", &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let out = finish_by(spawn(&mut cmd), Instant::now() + QUICK, line).await;
        assert_eq!(code(&out), 0, "{line}: {}", describe(&out));
        if line.starts_with("baton check") {
            assert!(
                stdout(&out).starts_with("SCHEDULE OK"),
                "{}",
                describe(&out)
            );
        }
        if line.starts_with("baton pause") {
            let status = finished(&url, &["status", "--key", "nightly-report"]).await;
            assert!(
                stdout(&status).contains("database migration"),
                "{}",
                describe(&status)
            );
        }
    }
    let status = finished(&url, &["status", "--key", "nightly-report"]).await;
    assert!(
        !stdout(&status).contains("database migration"),
        "{}",
        describe(&status)
    );
}
