//! `baton leader`, run as child processes against a private redis-server per test: PROGRAM runs
//! only while its baton leads, a SIGTERM hands over at once, a killed leader's standby takes
//! over after the lease, a lost leadership kills PROGRAM and baton campaigns again. Bounds are
//! generous: they prove that processes are stopped and woken, never speed.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::path::Path;

use std::time::Duration;

use common::process::*;
use common::{server, shq, TempDir, WAKE};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

/// `baton leader --redis-url URL ARGS` ([`baton_command`]).
fn leader(url: &str, args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("leader").arg("--redis-url").arg(url).args(args);
    cmd
}

/// A long-lived PROGRAM: appends "`$tag` `$BATON_FENCING_TOKEN` `$$`" to `log` when it starts
/// and "`$tag` stopped" when it gets SIGTERM.
fn program(tag: &str, log: &Path) -> String {
    let log = shq(log);
    format!(
        "echo \"{tag} $BATON_FENCING_TOKEN $$\" >> {log}
         trap 'echo \"{tag} stopped\" >> {log}; exit 0' TERM
         while :; do sleep 0.05; done"
    )
}

fn starts(text: &str) -> Vec<(String, u64, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            let (tag, a, b) = (p.next()?, p.next()?, p.next()?);
            Some((tag.to_string(), a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

fn spawn_leader(url: &str, lease: &str, tag: &str, log: &Path) -> Child {
    spawn(&mut leader(
        url,
        &[
            "--key",
            "sched",
            "--lease",
            lease,
            "--name",
            tag,
            "--",
            "sh",
            "-c",
            &program(tag, log),
        ],
    ))
}

#[tokio::test]
async fn sigterm_stops_program_resigns_and_a_standby_leads_at_once() {
    let srv = server();
    sigterm_hands_over(&srv.url()).await;
}

/// The same on PostgreSQL (`--url postgres://…`, the lease a row of `baton_locks`), in a
/// database of its own on the binary's shared private server.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn on_postgres_sigterm_stops_program_resigns_and_a_standby_leads_at_once() {
    let db = common::PgDatabase::create();
    sigterm_hands_over(&db.url).await;
}

async fn sigterm_hands_over(url: &str) {
    let url = url.to_string();
    let dir = TempDir::new("leader-term");
    let log = dir.path("log");
    let a = spawn_leader(&url, "10s", "a", &log);
    wait_file(&log, QUICK, |t| t.contains("a "))
        .await
        .expect("a never led");
    let b = spawn_leader(&url, "10s", "b", &log);
    // b is a standby: its PROGRAM does not run while a leads.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(starts(&text).len(), 1, "two PROGRAMs at once:\n{text}");
    let a_pid = a.id().unwrap();
    let sent = Instant::now();
    send_signal(a_pid, libc::SIGTERM);
    let out = finish_by(a, Instant::now() + QUICK, "leader a").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let text = wait_file(&log, WAKE, |t| starts(t).len() == 2)
        .await
        .expect("the standby did not lead within 5 s of the resignation (lease 10 s)");
    assert!(sent.elapsed() < WAKE);
    let s = starts(&text);
    assert_eq!(s[1].0, "b");
    assert!(s[1].1 > s[0].1, "terms {} then {}", s[0].1, s[1].1);
    // a's PROGRAM was stopped before b's started.
    let stopped = text.find("a stopped").expect("a's PROGRAM got no SIGTERM");
    let b_started = text.find("b ").unwrap();
    assert!(stopped < b_started, "{text}");
    send_signal(b.id().unwrap(), libc::SIGTERM);
    let out = finish_by(b, Instant::now() + QUICK, "leader b").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
}

#[tokio::test]
async fn a_killed_leaders_program_dies_with_it_and_a_standby_leads_after_the_lease() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("leader-kill");
    let log = dir.path("log");
    let a = spawn_leader(&url, "1s", "a", &log);
    let text = wait_file(&log, QUICK, |t| !starts(t).is_empty())
        .await
        .expect("a never led");
    let a_program = starts(&text)[0].2;
    let b = spawn_leader(&url, "1s", "b", &log);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    send_signal(a.id().unwrap(), libc::SIGKILL);
    assert!(
        gone_within(a_program, QUICK).await,
        "PROGRAM outlived its baton"
    );
    let text = wait_file(&log, WAKE, |t| starts(t).len() == 2)
        .await
        .expect("no takeover after the lease");
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "took over after {took:?}: before the lease could end"
    );
    let s = starts(&text);
    assert_eq!(s[1].0, "b");
    assert!(s[1].1 > s[0].1);
    drop(a);
    send_signal(b.id().unwrap(), libc::SIGTERM);
    let out = finish_by(b, Instant::now() + QUICK, "leader b").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
}

// Pauses THE server (SIGSTOP): single server only.
#[tokio::test]
async fn a_lost_leadership_stops_program_and_baton_campaigns_again() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("leader-lost");
    let log = dir.path("log");
    let a = spawn_leader(&url, "1s", "a", &log);
    wait_file(&log, QUICK, |t| !starts(t).is_empty())
        .await
        .expect("a never led");
    srv.single().pause().unwrap();
    let stopped = wait_file(&log, WAKE, |t| t.contains("a stopped")).await;
    srv.single().resume().unwrap();
    assert!(
        stopped.is_some(),
        "PROGRAM was not stopped when renewals failed"
    );
    // Once the server is back, the same baton leads again in a new term.
    let text = wait_file(&log, QUICK, |t| starts(t).len() == 2)
        .await
        .expect("baton did not campaign again");
    let s = starts(&text);
    assert!(s[1].1 > s[0].1);
    send_signal(a.id().unwrap(), libc::SIGTERM);
    let out = finish_by(a, Instant::now() + QUICK, "leader a").await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(
        describe(&out).contains("campaigning again"),
        "{}",
        describe(&out)
    );
    // A leader loses its leadership, not a lock (the guard may stop PROGRAM first, and then
    // says that instead).
    assert!(!describe(&out).contains("lock lost"), "{}", describe(&out));
}

#[tokio::test]
async fn program_ending_by_itself_is_baton_s_status_and_the_leadership_is_resigned() {
    let srv = server();
    let url = srv.url();
    let out = finish_by(
        spawn(&mut leader(
            &url,
            &["--key", "short", "--", "sh", "-c", "exit 7"],
        )),
        Instant::now() + QUICK,
        "leader",
    )
    .await;
    assert_eq!(code(&out), 7, "{}", describe(&out));
    let mut conn = common::raw(&srv).await;
    assert_eq!(common::get(&mut conn, "baton:leader:{short}").await, None);
}

#[tokio::test]
async fn the_help_lists_every_exit_status() {
    let out = std::process::Command::new(BATON)
        .args(["leader", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit statuses of `baton leader`",
        "  0 ",
        "  64 ",
        "  65 ",
        "  69 ",
        "126/127",
        "129/131",
        "BATON_FENCING_TOKEN",
    ] {
        assert!(help.contains(needle), "missing {needle:?} in:\n{help}");
    }
    let bad = std::process::Command::new(BATON)
        .args(["leader", "--key", "k", "--lease", "1ms", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
}

/// What PROGRAM starts dies with a SIGKILLed leader too, even while PROGRAM waits for it (the
/// parent-death signal kills PROGRAM alone; `sleep` here would run on beside the next leader's
/// PROGRAM).
#[tokio::test]
async fn a_sigkilled_leader_takes_what_its_program_started_down_too() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("leader-crash-child");
    let pidfile = dir.path("pid");
    let mut cmd = leader(
        &url,
        &[
            "--key",
            "E",
            "--",
            "sh",
            "-c",
            "sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 100'; true",
        ],
    );
    cmd.env("PIDFILE", &pidfile);
    let mut a = spawn(&mut cmd);
    let sleeper = read_pid(&pidfile, QUICK).await;
    assert!(alive(sleeper));
    a.start_kill().expect("SIGKILL baton");
    tokio::time::timeout(QUICK, a.wait())
        .await
        .expect("baton reaped")
        .unwrap();
    assert!(
        gone_within(sleeper, Duration::from_secs(2)).await,
        "PROGRAM's child (pid {sleeper}) outlived the SIGKILLed baton"
    );
}
