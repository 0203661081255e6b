//! `baton lock`, run as a child process against a private redis-server per test: mutual
//! exclusion across processes, fencing tokens, status pass-through, `--wait`, loss (PROGRAM
//! killed before the lease could pass on), forwarded signals and the help text. Bounds are
//! generous: they prove that processes are stopped and woken, never speed.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::process::*;
use common::{get, raw, server, shq, TempDir};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

/// The lost-lease status of `baton run`, which `baton lock` shares.
const EX_LOST: i32 = 74;
/// `--wait` ran out (EX_TEMPFAIL).
const EX_TEMPFAIL: i32 = 75;

/// `baton lock --redis-url URL ARGS` ([`baton_command`]).
fn lock(url: &str, args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("lock").arg("--redis-url").arg(url).args(args);
    cmd
}

async fn run(cmd: &mut Command, what: &str) -> Output {
    finish_by(spawn(cmd), Instant::now() + QUICK, what).await
}

/// Whether process `pid` has a handler for `sig` (its `SigCgt` mask in /proc).
fn catches(pid: u32, sig: libc::c_int) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

fn lock_key(name: &str) -> String {
    format!("baton:lock:{{{name}}}")
}

/// redis-cli ships with redis-server (the fixture needs the latter anyway).
fn redis_cli() -> bool {
    std::process::Command::new("redis-cli")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn eight_processes_increment_a_plain_counter_exactly_under_the_lock() {
    assert!(
        redis_cli(),
        "redis-cli is needed (it comes with redis-server)"
    );
    let srv = server();
    let url = srv.url();
    let port = srv.port();
    let dir = TempDir::new("lock-count");
    let tokens = dir.path("tokens");
    // Read, sleep 1..5 ms, write back + 1: two holders at once would lose increments.
    let script = format!(
        "echo \"$BATON_FENCING_TOKEN\" >> {tokens}
         i=0
         while [ $i -lt 25 ]; do
           v=$(redis-cli -p {port} GET counter)
           sleep 0.00$((i % 5 + 1))
           redis-cli -p {port} SET counter $((${{v:-0}} + 1)) > /dev/null
           i=$((i + 1))
         done",
        tokens = shq(&tokens)
    );
    let started = Instant::now();
    let children: Vec<Child> = (0..8)
        .map(|_| {
            spawn(&mut lock(
                &url,
                &["--key", "counter", "--", "sh", "-c", &script],
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, child) in children.into_iter().enumerate() {
        let o = finish_by(child, deadline, &format!("lock #{i}")).await;
        assert_eq!(code(&o), 0, "lock #{i}: {}", describe(&o));
    }
    eprintln!("8 x 25 increments took {:?}", started.elapsed());
    let mut conn = raw(&srv).await;
    assert_eq!(get(&mut conn, "counter").await.as_deref(), Some("200"));
    let tokens: Vec<u64> = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(|l| l.parse().expect("BATON_FENCING_TOKEN is a number"))
        .collect();
    // Appended in the order the holders ran: each grant's token exceeds the one before.
    assert_eq!(tokens.len(), 8, "{tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // Released: nothing left behind.
    assert_eq!(get(&mut conn, &lock_key("counter")).await, None);

    // Negative control: the same eight scripts without the lock lose increments, so the exact
    // count above is the lock's doing.
    let _: () = redis::cmd("DEL")
        .arg("counter")
        .query_async(&mut conn)
        .await
        .unwrap();
    let unlocked: Vec<Child> = (0..8)
        .map(|_| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &script])
                .env("BATON_FENCING_TOKEN", "0")
                .stdout(Stdio::null())
                .kill_on_drop(true);
            cmd.spawn().expect("spawn sh")
        })
        .collect();
    for mut child in unlocked {
        let ok = tokio::time::timeout(QUICK, child.wait()).await;
        assert!(ok.is_ok_and(|s| s.is_ok_and(|s| s.success())));
    }
    let racy: u64 = get(&mut conn, "counter").await.unwrap().parse().unwrap();
    assert!(racy < 200, "without the lock increments are lost ({racy})");
}

#[tokio::test]
async fn fencing_tokens_are_set_and_strictly_increase_across_runs() {
    let srv = server();
    let url = srv.url();
    let mut seen = Vec::new();
    for i in 0..4 {
        let o = run(
            &mut lock(
                &url,
                &[
                    "--key",
                    "fence",
                    "--",
                    "sh",
                    "-c",
                    "echo \"$BATON_LOCK_KEY $BATON_FENCING_TOKEN\"",
                ],
            ),
            "lock",
        )
        .await;
        assert_eq!(code(&o), 0, "run {i}: {}", describe(&o));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let (key, token) = text.trim().split_once(' ').expect("two words");
        assert_eq!(key, "fence");
        seen.push(token.parse::<u64>().expect("a number"));
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
}

#[tokio::test]
async fn the_program_status_is_passed_through_and_the_lock_released() {
    let srv = server();
    let url = srv.url();
    let o = run(
        &mut lock(&url, &["--key", "st", "--", "sh", "-c", "exit 7"]),
        "exit 7",
    )
    .await;
    assert_eq!(code(&o), 7, "{}", describe(&o));
    let o = run(
        &mut lock(&url, &["--key", "st", "--", "sh", "-c", "kill -USR1 $$"]),
        "killed",
    )
    .await;
    assert_eq!(code(&o), 128 + libc::SIGUSR1, "{}", describe(&o));
    let o = run(
        &mut lock(&url, &["--key", "st", "--", "/no/such/program"]),
        "missing",
    )
    .await;
    assert_eq!(code(&o), 127, "{}", describe(&o));
    let mut conn = raw(&srv).await;
    assert_eq!(get(&mut conn, &lock_key("st")).await, None);
}

#[tokio::test]
async fn wait_running_out_while_another_holds_the_lock_exits_75() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-wait");
    let pid = dir.path("pid");
    let script = format!("echo $$ > {}; sleep 30", shq(&pid));
    let holder = spawn(&mut lock(&url, &["--key", "w", "--", "sh", "-c", &script]));
    read_pid(&pid, QUICK).await;
    let started = Instant::now();
    let o = run(
        &mut lock(
            &url,
            &[
                "--key", "w", "--wait", "200ms", "--", "sh", "-c", "echo ran",
            ],
        ),
        "--wait 200ms",
    )
    .await;
    assert_eq!(code(&o), EX_TEMPFAIL, "{}", describe(&o));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(o.stdout.is_empty(), "PROGRAM did not run: {}", describe(&o));
    assert!(!o.stderr.is_empty(), "a message says why");
    // Without --wait a waiter waits as long as it takes; a signal ends the wait, PROGRAM unrun.
    let waiter = spawn(&mut lock(
        &url,
        &["--key", "w", "--", "sh", "-c", "echo ran"],
    ));
    let pid = waiter.id().unwrap();
    // Once baton catches SIGINT it is past its setup (signals are installed before waiting).
    let deadline = Instant::now() + QUICK;
    while !catches(pid, libc::SIGINT) {
        assert!(Instant::now() < deadline, "baton never caught SIGINT");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    send_signal(pid, libc::SIGINT);
    let o = finish_by(waiter, Instant::now() + QUICK, "SIGINT while waiting").await;
    assert_eq!(code(&o), 130, "{}", describe(&o));
    assert!(o.stdout.is_empty(), "PROGRAM did not run: {}", describe(&o));
    drop(holder);
}

#[tokio::test]
async fn a_lost_lock_kills_the_program_before_the_lease_could_pass_on_and_exits_74() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-lost");
    let pid = dir.path("pid");
    // PROGRAM ignores SIGTERM: only the SIGKILL, due by the lease's end, stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        shq(&pid)
    );
    let child = spawn(&mut lock(
        &url,
        &["--key", "lost", "--ttl", "600ms", "--", "sh", "-c", &script],
    ));
    let program = read_pid(&pid, QUICK).await;
    // Someone else's token: the watchdog's next extension (within ttl/3) is refused.
    let mut conn = raw(&srv).await;
    let overwritten = Instant::now();
    let _: () = redis::cmd("SET")
        .arg(lock_key("lost"))
        .arg("foreign")
        .query_async(&mut conn)
        .await
        .unwrap();
    let o = finish_by(child, Instant::now() + QUICK, "lost lock").await;
    let took = overwritten.elapsed();
    assert_eq!(code(&o), EX_LOST, "{}", describe(&o));
    assert!(
        !alive(program),
        "PROGRAM {program} is dead once baton exits"
    );
    // Refused at the next extension (≤ 200 ms), killed by the lease's end (≤ 600 ms after the
    // last confirmed extension): well under a second, with margin for a loaded host.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // The foreign holder's lock is left alone.
    assert_eq!(
        get(&mut conn, &lock_key("lost")).await.as_deref(),
        Some("foreign")
    );
}

#[tokio::test]
async fn a_paused_server_makes_the_lock_lost_at_its_deadline_and_the_program_is_killed() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-paused");
    let pid = dir.path("pid");
    let script = format!("echo $$ > {}; while :; do sleep 0.05; done", shq(&pid));
    let child = spawn(&mut lock(
        &url,
        &["--key", "p", "--ttl", "600ms", "--", "sh", "-c", &script],
    ));
    let program = read_pid(&pid, QUICK).await;
    srv.pause().unwrap();
    let paused = Instant::now();
    let o = finish_by(child, Instant::now() + QUICK, "paused server").await;
    let took = paused.elapsed();
    srv.resume().unwrap();
    assert_eq!(code(&o), EX_LOST, "{}", describe(&o));
    assert!(
        !alive(program),
        "PROGRAM {program} is dead once baton exits"
    );
    // No extension confirmed: lost at the deadline (≤ 600 ms after the last one), killed at
    // once; the release that follows gives up on its own timeout.
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

#[tokio::test]
async fn sigterm_to_baton_is_forwarded_and_exits_143_releasing_the_lock() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-term");
    let pid = dir.path("pid");
    let script = format!("echo $$ > {}; sleep 30", shq(&pid));
    let child = spawn(&mut lock(&url, &["--key", "t", "--", "sh", "-c", &script]));
    let program = read_pid(&pid, QUICK).await;
    send_signal(child.id().unwrap(), libc::SIGTERM);
    let o = finish_by(child, Instant::now() + QUICK, "SIGTERM").await;
    assert_eq!(code(&o), 143, "{}", describe(&o));
    assert!(!alive(program));
    let mut conn = raw(&srv).await;
    assert_eq!(get(&mut conn, &lock_key("t")).await, None);
}

#[tokio::test]
async fn help_lists_every_exit_status_and_says_the_default_wait_is_forever() {
    let mut cmd = Command::new(BATON);
    cmd.args(["lock", "--help"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let o = finish_by(spawn(&mut cmd), Instant::now() + QUICK, "--help").await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    for n in [64, 65, 69, 74, 75, 126, 127, 129, 130, 131, 143] {
        assert!(
            text.contains(&n.to_string()),
            "{n} is not documented:\n{text}"
        );
    }
    for word in [
        "--key",
        "--lease",
        "--wait",
        "--kill-grace",
        "forever",
        "BATON_FENCING_TOKEN",
        "BATON_LOCK_KEY",
    ] {
        assert!(text.contains(word), "{word} is not documented:\n{text}");
    }
}

#[tokio::test]
async fn bad_settings_exit_64_without_redis() {
    // Nothing listens on port 1: the settings are refused before connecting.
    for args in [
        ["--lease", "1ms"],
        // The former name, an alias.
        ["--ttl", "2days"],
        ["--wait", "soon"],
        ["--kill-grace", "2days"],
        ["--key", "a{b}"],
        ["--prefix", "no-colon"],
    ] {
        let mut all = if args[0] == "--key" {
            vec![]
        } else {
            vec!["--key", "k"]
        };
        all.extend(args);
        all.extend(["--", "true"]);
        let o = run(&mut lock("redis://127.0.0.1:1/", &all), "usage").await;
        assert_eq!(code(&o), 64, "{args:?}: {}", describe(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("redis"), "refused before connecting: {err}");
    }
}

/// What PROGRAM starts dies with a SIGKILLed baton too, even while PROGRAM waits for it (the
/// parent-death signal kills PROGRAM alone).
#[tokio::test]
async fn a_sigkilled_baton_takes_what_its_program_started_down_too() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-crash-child");
    let pidfile = dir.path("pid");
    let script = format!("sleep 100 & echo $! > {}; wait", shq(&pidfile));
    let mut holder = spawn(&mut lock(&url, &["--key", "cc", "--", "sh", "-c", &script]));
    let sleeper = read_pid(&pidfile, QUICK).await;
    assert!(alive(sleeper));
    holder.start_kill().expect("SIGKILL baton");
    tokio::time::timeout(QUICK, holder.wait())
        .await
        .expect("baton reaped")
        .unwrap();
    assert!(
        gone_within(sleeper, Duration::from_secs(2)).await,
        "PROGRAM's child (pid {sleeper}) outlived the SIGKILLed baton"
    );
}

/// What PROGRAM leaves running when it exits is stopped before the lock is released: it gets
/// SIGTERM and time to clean up, and the next holder's PROGRAM starts only after it is gone.
#[tokio::test]
async fn what_program_leaves_running_is_stopped_before_the_lock_is_released() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-leftover");
    let (log, go, pidfile) = (dir.path("log"), dir.path("go"), dir.path("pid"));
    // The leftover takes a moment to clean up: a lock released at once would let the next
    // holder's PROGRAM overtake it.
    let first = format!(
        "(trap 'sleep 0.3; echo cleaned >> {log}; exit 0' TERM; while :; do sleep 0.05; done) &
         echo $! > {pid}
         while [ ! -e {go} ]; do sleep 0.05; done
         echo first-exits >> {log}",
        log = shq(&log),
        pid = shq(&pidfile),
        go = shq(&go),
    );
    let first = spawn(&mut lock(&url, &["--key", "lo", "--", "sh", "-c", &first]));
    let left = read_pid(&pidfile, QUICK).await;
    let second = format!("echo second >> {}", shq(&log));
    let second = spawn(&mut lock(&url, &["--key", "lo", "--", "sh", "-c", &second]));
    std::fs::write(&go, "").unwrap();
    let o = finish_by(first, Instant::now() + QUICK, "first holder").await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert!(!alive(left), "the leftover (pid {left}) outlived its baton");
    let o2 = finish_by(second, Instant::now() + QUICK, "second holder").await;
    assert_eq!(code(&o2), 0, "{}", describe(&o2));
    assert_eq!(
        lines(&log),
        ["first-exits", "cleaned", "second"],
        "{}",
        describe(&o)
    );
}

/// A leftover that ignores SIGTERM gets SIGKILL after --kill-grace; baton still exits with
/// PROGRAM's status.
#[tokio::test]
async fn a_leftover_ignoring_sigterm_is_killed_after_the_kill_grace() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("lock-stubborn");
    let pidfile = dir.path("pid");
    let script = format!(
        "(trap '' TERM; exec sleep 100) & echo $! > {}; exit 3",
        shq(&pidfile)
    );
    let o = run(
        &mut lock(
            &url,
            &[
                "--key",
                "sb",
                "--kill-grace",
                "500ms",
                "--",
                "sh",
                "-c",
                &script,
            ],
        ),
        "stubborn leftover",
    )
    .await;
    assert_eq!(code(&o), 3, "{}", describe(&o));
    let left = read_pid(&pidfile, QUICK).await;
    assert!(!alive(left), "the leftover (pid {left}) outlived its baton");
    let mut conn = raw(&srv).await;
    assert_eq!(get(&mut conn, &lock_key("sb")).await, None);
}

/// `--name` is stored with the lock (after the random part of its token, which release
/// compares whole), host:pid by default; a `--wait 0s` that finds it held says "1 try".
#[tokio::test]
async fn a_lock_holder_is_stored_by_name_and_one_try_is_one_try() {
    let srv = server();
    let url = srv.url();
    let mut conn = raw(&srv).await;
    let key = "baton:lock:{named}";
    for (name, args) in [
        (Some("web-1"), vec!["--key", "named", "--name", "web-1"]),
        (None, vec!["--key", "named"]),
    ] {
        let mut cmd = lock(&url, &args);
        cmd.args(["--", "sleep", "3"]);
        let holder = spawn(&mut cmd);
        let pid = holder.id().unwrap();
        let deadline = Instant::now() + QUICK;
        let value = loop {
            if let Some(v) = get(&mut conn, key).await {
                break v;
            }
            assert!(Instant::now() < deadline, "the lock was never taken");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (token, stored) = value.split_once(':').expect("TOKEN:NAME");
        assert_eq!(token.len(), 32, "{value}");
        match name {
            Some(n) => assert_eq!(stored, n),
            None => assert!(stored.ends_with(&format!(":{pid}")), "{value}"),
        }
        let busy = run(
            &mut lock(&url, &["--key", "named", "--wait", "0s", "--", "true"]),
            "busy",
        )
        .await;
        assert_eq!(code(&busy), EX_TEMPFAIL, "{}", describe(&busy));
        let text = describe(&busy);
        assert!(
            text.contains("(1 try in") && !text.contains("tries"),
            "{text}"
        );
        let out = finish_by(holder, Instant::now() + QUICK, "holder").await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        // Released by its whole token: free again.
        assert_eq!(get(&mut conn, key).await, None);
    }
}
