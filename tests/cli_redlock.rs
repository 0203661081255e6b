//! `baton lock --redlock`, run as a child process against three private redis-servers per test:
//! no fencing token, mutual exclusion across processes, loss (PROGRAM killed, exit 74), the
//! quorum error and usage errors. Bounds are generous: they prove that processes are stopped,
//! never speed.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use baton::testing::RedisServer;
use common::process::*;
use common::{get, raw, server, shq, TempDir};
use tokio::process::Command;
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(15);
const EX_LOST: i32 = 74;

fn lock_key(name: &str) -> String {
    format!("baton:redlock:{{{name}}}")
}

/// `baton lock --redlock URLS ARGS` ([`baton_command`], and no inherited fencing token).
fn redlock(urls: &str, args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("lock").arg("--redlock").arg(urls).args(args);
    cmd.env_remove("BATON_FENCING_TOKEN");
    cmd
}

fn fleet() -> (Vec<RedisServer>, String) {
    let servers: Vec<RedisServer> = (0..3).map(|_| server().into_single()).collect();
    let urls = servers
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    (servers, urls)
}

async fn run(cmd: &mut Command, what: &str) -> Output {
    let child = cmd.spawn().expect("spawn baton");
    finish_by(child, Instant::now() + QUICK, what).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_runs_the_program_once_without_a_fencing_token() {
    let (_servers, urls) = fleet();
    let dir = TempDir::new("redlock-unset");
    let f = dir.path("f");
    let script = format!(
        "echo \"${{BATON_FENCING_TOKEN-unset}} $BATON_LOCK_KEY\" >> {}",
        shq(&f)
    );
    let started = Instant::now();
    let o = run(
        &mut redlock(&urls, &["--key", "once", "--", "sh", "-c", &script]),
        "once",
    )
    .await;
    eprintln!("one run took {:?}", started.elapsed());
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "unset once\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_redlock_runs_never_overlap() {
    let (_servers, urls) = fleet();
    let dir = TempDir::new("redlock-overlap");
    let mut children = Vec::new();
    for i in 0..2 {
        let out = dir.path(&format!("t{i}"));
        // Nanosecond timestamps at start and end, around a sleep.
        let script = format!(
            "date +%s%N > {o}; sleep 0.7; date +%s%N >> {o}",
            o = shq(&out)
        );
        children.push(
            redlock(
                &urls,
                &["--key", "ovl", "--ttl", "1s", "--", "sh", "-c", &script],
            )
            .spawn()
            .expect("spawn baton"),
        );
    }
    let deadline = Instant::now() + QUICK;
    let mut intervals = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let o = finish_by(child, deadline, "overlap").await;
        assert_eq!(code(&o), 0, "{}", describe(&o));
        let text = std::fs::read_to_string(dir.path(&format!("t{i}"))).unwrap();
        let t: Vec<u128> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_eq!(t.len(), 2, "{text}");
        intervals.push((t[0], t[1]));
    }
    intervals.sort_unstable();
    assert!(
        intervals[0].1 <= intervals[1].0,
        "the runs overlapped: {intervals:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_quorum_kills_the_program_and_exits_74() {
    let (servers, urls) = fleet();
    let dir = TempDir::new("redlock-lost");
    let pid = dir.path("pid");
    // PROGRAM ignores SIGTERM: only the SIGKILL, due by the validity deadline, stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        shq(&pid)
    );
    let child = redlock(
        &urls,
        &["--key", "lost", "--ttl", "600ms", "--", "sh", "-c", &script],
    )
    .spawn()
    .expect("spawn baton");
    let program = read_pid(&pid, QUICK).await;
    let mut conns = Vec::new();
    for s in &servers[..2] {
        conns.push(raw(s).await);
    }
    let overwritten = Instant::now();
    for c in &mut conns {
        let _: () = redis::cmd("SET")
            .arg(lock_key("lost"))
            .arg("foreign")
            .query_async(c)
            .await
            .unwrap();
    }
    let o = finish_by(child, Instant::now() + QUICK, "lost redlock").await;
    let took = overwritten.elapsed();
    eprintln!("exited {took:?} after the overwrite");
    assert_eq!(code(&o), EX_LOST, "{}", describe(&o));
    assert!(
        !alive(program),
        "PROGRAM {program} is dead once baton exits"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    for c in &mut conns {
        assert_eq!(get(c, &lock_key("lost")).await.as_deref(), Some("foreign"));
    }
}

#[tokio::test]
async fn redlock_usage_errors_exit_64_without_redis() {
    for urls in [
        "redis://127.0.0.1:1/",
        "redis://127.0.0.1:1/,redis://127.0.0.1:2/",
        "redis://127.0.0.1:1/,redis://127.0.0.1:2/,redis://127.0.0.1:3/,redis://127.0.0.1:4/",
        "redis://127.0.0.1:1/,redis://127.0.0.1:2/,redis://127.0.0.1:1/",
    ] {
        let o = run(&mut redlock(urls, &["--key", "k", "--", "true"]), "usage").await;
        assert_eq!(code(&o), 64, "{urls}: {}", describe(&o));
    }
    let o = run(
        &mut redlock(
            "redis://127.0.0.1:1/,redis://127.0.0.1:2/,redis://127.0.0.1:3/",
            &[
                "--redis-url",
                "redis://127.0.0.1:1/",
                "--key",
                "k",
                "--",
                "true",
            ],
        ),
        "conflict",
    )
    .await;
    assert_eq!(code(&o), 64, "{}", describe(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_down_at_start_does_not_stop_the_run() {
    let (mut servers, urls) = fleet();
    servers[2].kill();
    let dir = TempDir::new("redlock-one-down");
    let f = dir.path("f");
    let script = format!("echo ran >> {}", shq(&f));
    let o = run(
        &mut redlock(&urls, &["--key", "one-down", "--", "sh", "-c", &script]),
        "one master down",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "ran\n");
    // Released on the two that hold it.
    for s in &servers[..2] {
        assert_eq!(get(&mut raw(s).await, &lock_key("one-down")).await, None);
    }
}

#[tokio::test]
async fn unreachable_masters_exit_69_naming_the_quorum() {
    let o = run(
        &mut redlock(
            "redis://127.0.0.1:1/,redis://127.0.0.1:2/,redis://127.0.0.1:3/",
            &["--key", "k", "--", "true"],
        ),
        "unreachable",
    )
    .await;
    assert_eq!(code(&o), 69, "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("quorum of 2 of 3"), "{err}");
}

#[tokio::test]
async fn help_says_why_there_is_no_fencing_token() {
    let o = run(
        Command::new(BATON)
            .args(["lock", "--help"])
            .stdout(Stdio::piped()),
        "help",
    )
    .await;
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--redlock"), "{help}");
    assert!(help.contains("no BATON_FENCING_TOKEN"), "{help}");
    assert!(help.contains("no monotonic"), "{help}");
}
