//! The `baton` command-line binary, run as a child process against a private redis-server per
//! test: exactly-once runs, exhaustion, crashed holders, deadlines, corrupt state, an unreachable
//! server, the operator commands and the help text. Bounds are generous: they prove wake-ups and
//! that processes are stopped, never speed.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::process::*;
use common::{get, lease_key, raw, server, shq, state_key, TempDir};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `baton SUB --redis-url URL` ([`baton_command`]).
fn baton(sub: &str, url: &str) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg(sub).arg("--redis-url").arg(url);
    cmd
}

/// `baton ARGS` for commands that need no Redis (help).
fn plain(args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.args(args);
    cmd
}

async fn finish(child: Child, within: Duration, what: &str) -> Output {
    finish_by(child, Instant::now() + within, what).await
}

/// Runs a command to completion (bounded by [`QUICK`]).
async fn run(cmd: &mut Command, what: &str) -> Output {
    finish(spawn(cmd), QUICK, what).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON lines of an events file (complete lines only).
fn event_lines(text: &str) -> Vec<Value> {
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n') && !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l.trim()).unwrap_or_else(|e| panic!("bad event line {l:?}: {e}"))
        })
        .collect()
}

fn event_names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            e["event"]
                .as_str()
                .unwrap_or_else(|| panic!("event without an \"event\" field: {e}"))
                .to_owned()
        })
        .collect()
}

/// Waits until an events file holds an event named `name`.
async fn wait_event(path: &Path, name: &str, within: Duration) {
    let found = wait_file(path, within, |t| {
        event_names(&event_lines(t)).iter().any(|n| n == name)
    })
    .await;
    assert!(
        found.is_some(),
        "no {name} event in {} within {within:?}; got {:?}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// `baton status --json` parsed, with its exit code.
async fn status_json(url: &str, key: &str) -> (i32, Value) {
    let out = run(
        baton("status", url).args(["--key", key, "--json"]),
        "status --json",
    )
    .await;
    let text = stdout(&out);
    let value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "status --json is not one JSON object ({e}): {}",
            describe(&out)
        )
    });
    (code(&out), value)
}

/// Whether `text` contains `n` as a whole number (not as part of a longer one).
fn mentions_number(text: &str, n: u32) -> bool {
    text.split(|c: char| !c.is_ascii_digit())
        .any(|tok| tok == n.to_string())
}

/// A loopback port nobody listens on.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A loopback TCP proxy to `upstream` that holds back everything the server sends by `delay`
/// (in order; the client's requests pass at once). It lives as long as the test's runtime.
async fn slow_replies_proxy(upstream: u16, delay: Duration) -> u16 {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut client_rd, mut client_wr) = client.into_split();
                let (mut server_rd, mut server_wr) = server.into_split();
                let requests = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
                });
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = server_rd.read(&mut buf).await {
                        if n == 0
                            || tx
                                .send((Instant::now() + delay, buf[..n].to_vec()))
                                .is_err()
                        {
                            break;
                        }
                    }
                });
                while let Some((at, bytes)) = rx.recv().await {
                    tokio::time::sleep_until(at).await;
                    if client_wr.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                requests.abort();
            });
        }
    });
    port
}

/// Whether `strace` can trace a child here (it is missing, or ptrace is forbidden, on some CI).
fn strace_works() -> bool {
    std::process::Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn three_concurrent_runs_execute_the_program_once_and_all_exit_zero() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("once");
    let out = dir.path("out");
    let script = format!("echo \"$BATON_ATTEMPT\" >> {}", shq(&out));
    let children: Vec<Child> = (0..3)
        .map(|_| spawn(baton("run", &url).args(["--key", "once", "--", "sh", "-c", &script])))
        .collect();
    let deadline = Instant::now() + QUICK;
    for (i, child) in children.into_iter().enumerate() {
        let o = finish_by(child, deadline, &format!("run #{i}")).await;
        assert_eq!(code(&o), 0, "run #{i}: {}", describe(&o));
    }
    assert_eq!(lines(&out), ["1"], "the program ran exactly once");
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("once")).await.as_deref(),
        Some("DONE")
    );
}

#[tokio::test]
async fn a_failing_program_is_retried_by_backups_at_once_until_exhausted() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("exhaust");
    let out = dir.path("out");
    let script = format!("echo \"$BATON_ATTEMPT\" >> {}; exit 3", shq(&out));
    let t0 = Instant::now();
    let children: Vec<Child> = (0..5)
        .map(|_| {
            spawn(baton("run", &url).args([
                "--key",
                "exhaust",
                "--max-attempts",
                "3",
                "--lock-timeout",
                "10s",
                "--",
                "sh",
                "-c",
                &script,
            ]))
        })
        .collect();
    let deadline = t0 + QUICK;
    let mut codes = Vec::new();
    let mut outputs = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let o = finish_by(child, deadline, &format!("run #{i}")).await;
        codes.push(code(&o));
        outputs.push(describe(&o));
    }
    let elapsed = t0.elapsed();
    codes.sort_unstable();
    assert_eq!(
        codes,
        [3, 3, 3, 75, 75],
        "exit codes; outputs: {outputs:#?}"
    );
    assert_eq!(lines(&out), ["1", "2", "3"], "attempts in order");
    // A 10 s lease: any takeover that waited for the lease instead of the `failed` message
    // would take 10 s.
    assert!(
        elapsed < Duration::from_secs(8),
        "backups waited for the lease: {elapsed:?}"
    );
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("exhaust")).await.as_deref(),
        Some("EXHAUSTED")
    );
}

#[tokio::test]
async fn a_sigkilled_holder_takes_its_program_down_and_a_backup_takes_over_after_the_lease() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("crash");
    let pidfile = dir.path("pid");
    let out = dir.path("out");
    let events = dir.path("backup-events");
    let holder_script = format!("echo $$ > {}; exec sleep 60", shq(&pidfile));
    let mut holder = spawn(baton("run", &url).args([
        "--key",
        "crash",
        "--lock-timeout",
        "1s",
        "--",
        "sh",
        "-c",
        &holder_script,
    ]));
    let program = read_pid(&pidfile, QUICK).await;
    assert!(alive(program));

    let backup_script = format!("echo \"$BATON_ATTEMPT\" >> {}", shq(&out));
    let backup = spawn(
        baton("run", &url)
            .args(["--key", "crash", "--lock-timeout", "1s", "--events"])
            .arg(&events)
            .args(["--", "sh", "-c", &backup_script]),
    );
    wait_event(&events, "Locked", QUICK).await;
    assert!(
        lines(&out).is_empty(),
        "the backup ran while the holder lived"
    );

    holder.start_kill().expect("SIGKILL the holder");
    let t_kill = Instant::now();
    let status = tokio::time::timeout(QUICK, holder.wait())
        .await
        .expect("holder reaped")
        .unwrap();
    assert_eq!(status.code(), None, "the holder was killed by a signal");

    assert!(
        gone_within(program, Duration::from_secs(5)).await,
        "the program (pid {program}) outlived the SIGKILLed baton"
    );
    let took_over = wait_file(&out, Duration::from_secs(10), |t| t.contains('\n')).await;
    let after = t_kill.elapsed();
    assert_eq!(
        took_over.as_deref(),
        Some("2\n"),
        "the backup ran attempt 2"
    );
    assert!(
        after < Duration::from_secs(3),
        "the backup took over {after:?} after the kill (lease 1 s)"
    );
    let o = finish(backup, QUICK, "backup").await;
    assert_eq!(code(&o), 0, "backup: {}", describe(&o));
    assert_eq!(lines(&out), ["2"]);
}

/// One phase of the deadline test: `Err` describes what went wrong.
type Phase = Result<(), String>;

async fn no_watchdog_deadline_stops_the_program(url: &str, dir: &TempDir) -> Phase {
    let pidfile = dir.path("nokeep-pid");
    let script = format!("echo $$ > {}; exec sleep 10", shq(&pidfile));
    let t0 = Instant::now();
    let child = spawn(baton("run", url).args([
        "--key",
        "nokeep",
        "--no-watchdog",
        "--lease",
        "1s",
        "--kill-grace",
        "200ms",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let pid = read_pid(&pidfile, QUICK).await;
    let o = finish(child, QUICK, "--no-watchdog").await;
    let elapsed = t0.elapsed();
    let mut errs = Vec::new();
    if o.status.code() != Some(74) {
        errs.push(format!("expected exit 74: {}", describe(&o)));
    }
    if elapsed > Duration::from_secs(5) {
        errs.push(format!("took {elapsed:?} (lease 1 s, grace 200 ms)"));
    }
    if !gone_within(pid, Duration::from_secs(1)).await {
        errs.push(format!("program {pid} still running after baton exited"));
    }
    errs.is_empty()
        .then_some(())
        .ok_or_else(|| format!("--no-watchdog: {}", errs.join("; ")))
}

async fn the_watchdog_lets_a_program_outlive_the_lease(
    url: &str,
    dir: &TempDir,
    srv: &baton::testing::RedisServer,
) -> Phase {
    let marker = dir.path("keep-out");
    let script = format!("sleep 3; echo finished > {}", shq(&marker));
    let child = spawn(
        baton("run", url).args(["--key", "keep", "--lease", "1s", "--", "sh", "-c", &script]),
    );
    let o = finish(child, Duration::from_secs(20), "watchdog").await;
    let mut errs = Vec::new();
    if o.status.code() != Some(0) {
        errs.push(format!("expected exit 0: {}", describe(&o)));
    }
    if lines(&marker) != ["finished"] {
        errs.push(format!("program did not finish: {:?}", lines(&marker)));
    }
    let mut conn = raw(srv).await;
    let state = get(&mut conn, &state_key("keep")).await;
    if state.as_deref() != Some("DONE") {
        errs.push(format!("state {state:?}, expected DONE"));
    }
    errs.is_empty()
        .then_some(())
        .ok_or_else(|| format!("watchdog: {}", errs.join("; ")))
}

async fn max_hold_stops_the_program(url: &str, dir: &TempDir) -> Phase {
    let pidfile = dir.path("maxrun-pid");
    let script = format!("echo $$ > {}; exec sleep 30", shq(&pidfile));
    let t0 = Instant::now();
    let child = spawn(baton("run", url).args([
        "--key",
        "maxrun",
        "--max-hold",
        "2s",
        "--lease",
        "1s",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let pid = read_pid(&pidfile, QUICK).await;
    let o = finish(child, QUICK, "--max-hold").await;
    let elapsed = t0.elapsed();
    let mut errs = Vec::new();
    if o.status.code() != Some(74) {
        errs.push(format!("expected exit 74: {}", describe(&o)));
    }
    if elapsed > Duration::from_secs(7) {
        errs.push(format!("took {elapsed:?} (max-hold 2 s)"));
    }
    if !gone_within(pid, Duration::from_secs(1)).await {
        errs.push(format!("program {pid} still running after baton exited"));
    }
    errs.is_empty()
        .then_some(())
        .ok_or_else(|| format!("--max-hold: {}", errs.join("; ")))
}

#[tokio::test]
async fn deadlines_stop_the_program_with_74_while_the_watchdog_lets_it_finish() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("deadline");
    // The three cases run side by side (different keys); every failure is reported.
    let (a, b, c) = tokio::join!(
        no_watchdog_deadline_stops_the_program(&url, &dir),
        the_watchdog_lets_a_program_outlive_the_lease(&url, &dir, &srv),
        max_hold_stops_the_program(&url, &dir),
    );
    let errs: Vec<String> = [a, b, c].into_iter().filter_map(Result::err).collect();
    assert!(errs.is_empty(), "{errs:#?}");
}

#[tokio::test]
async fn corrupt_state_exits_65_naming_the_key_and_is_left_untouched() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("corrupt");
    let marker = dir.path("ran");
    let mut conn = raw(&srv).await;
    let key = state_key("corrupt");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .unwrap();

    let script = format!("echo ran > {}", shq(&marker));
    let o = run(
        baton("run", &url).args(["--key", "corrupt", "--", "sh", "-c", &script]),
        "run on corrupt state",
    )
    .await;
    assert_eq!(code(&o), 65, "{}", describe(&o));
    assert!(
        stderr(&o).contains("baton:{corrupt}"),
        "stderr names the key: {}",
        describe(&o)
    );
    assert!(!marker.exists(), "the program ran on a corrupt state");
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some("garbage"));

    let o = run(
        baton("status", &url).args(["--key", "corrupt"]),
        "status on corrupt state",
    )
    .await;
    assert_eq!(code(&o), 65, "status: {}", describe(&o));
    let (status_code, json) = status_json(&url, "corrupt").await;
    assert_eq!(status_code, 65, "status --json exit code: {json}");
    assert_eq!(json["state"], "corrupt", "{json}");
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some("garbage"));
}

#[tokio::test]
async fn an_unreachable_redis_exits_69_with_a_message_and_no_panic() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let dir = TempDir::new("unreachable");
    let marker = dir.path("ran");
    let script = format!("echo ran > {}", shq(&marker));
    // Nothing ever answered: --connect-timeout (not --give-up-after's ten minutes) ends it.
    let o = run(
        baton("run", &url).args([
            "--key",
            "nowhere",
            "--connect-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ]),
        "run without redis",
    )
    .await;
    assert_eq!(code(&o), 69, "{}", describe(&o));
    let err = stderr(&o);
    assert!(err.contains("--connect-timeout"), "{}", describe(&o));
    assert!(!err.contains("panicked"), "{}", describe(&o));
    assert!(!marker.exists(), "the program ran without coordination");

    let o = run(
        baton("status", &url).args(["--key", "nowhere"]),
        "status without redis",
    )
    .await;
    assert_eq!(code(&o), 69, "status: {}", describe(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", describe(&o));
}

/// A job whose holder (straight to the server) runs attempt 1 until the test lets it fail, and
/// whose only backup reaches the server through a relay that the test cuts for each of
/// `outages` (`(after, length)`: the gap since the previous step, then the cut's length).
/// Returns the backup's output, its events and the attempts PROGRAM ran.
async fn backup_behind_a_blipping_link(
    tag: &str,
    outages: &[(Duration, Duration)],
    backup_args: &[&str],
) -> (Output, Vec<Value>, Vec<String>) {
    let srv = server();
    let url = srv.url();
    let relay = baton::testing::TcpRelay::start(srv.port()).expect("relay");
    let relayed = format!("redis://127.0.0.1:{}/", relay.port());
    let dir = TempDir::new(tag);
    let (out, go, events) = (dir.path("out"), dir.path("go"), dir.path("events"));
    // Attempt 1 waits (bounded, 20 s) for the test's go, then fails; later attempts succeed.
    let script = format!(
        "echo \"$BATON_ATTEMPT\" >> {out}; [ \"$BATON_ATTEMPT\" = 1 ] || exit 0; i=0; \
         while [ ! -e {go} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 3",
        out = shq(&out),
        go = shq(&go),
    );
    let lease = ["--key", tag, "--lock-timeout", "600ms"];
    let holder = spawn(
        baton("run", &url)
            .args(lease)
            .args(["--", "sh", "-c", &script]),
    );
    assert!(
        wait_file(&out, QUICK, |t| t.contains('1')).await.is_some(),
        "the holder did not start attempt 1"
    );
    let backup = spawn(
        baton("run", &relayed)
            .args(lease)
            .args(backup_args)
            .arg("--events")
            .arg(&events)
            .args(["--", "sh", "-c", &script]),
    );
    wait_event(&events, "Locked", QUICK).await;
    for (after, length) in outages {
        tokio::time::sleep(*after).await;
        relay.cut();
        tokio::time::sleep(*length).await;
        relay.restore();
    }
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + QUICK;
    let h = finish_by(holder, deadline, "holder").await;
    assert_eq!(code(&h), 3, "holder: {}", describe(&h));
    let b = finish_by(backup, deadline, "backup").await;
    let events = event_lines(&std::fs::read_to_string(&events).unwrap_or_default());
    (b, events, lines(&out))
}

#[tokio::test]
async fn a_backup_rides_out_two_blips_and_runs_the_attempt_the_holder_failed() {
    // Two 1.5 s outages whose errors are more than 5 s apart, with the server answering
    // between them: each outage is short, and the answers between them reset the clock.
    let blips = [
        (Duration::from_millis(300), Duration::from_millis(1500)),
        (Duration::from_millis(3700), Duration::from_millis(1500)),
    ];
    let (b, events, attempts) = backup_behind_a_blipping_link("blips", &blips, &[]).await;
    assert_eq!(
        code(&b),
        0,
        "the backup gave up on two short outages: {}",
        describe(&b)
    );
    assert_eq!(attempts, ["1", "2"], "attempt 2 ran on the backup");
    let names = event_names(&events);
    let reachable = names.iter().filter(|n| *n == "Reachable").count();
    assert!(reachable >= 2, "one Reachable per outage: {names:?}");
}

#[tokio::test]
async fn a_backup_rides_out_one_blip_and_gives_up_only_past_give_up_after() {
    // The control: one outage, survived before as now.
    let blip = [(Duration::from_millis(300), Duration::from_millis(1500))];
    let (b, _, attempts) = backup_behind_a_blipping_link("one-blip", &blip, &[]).await;
    assert_eq!(code(&b), 0, "one outage: {}", describe(&b));
    assert_eq!(attempts, ["1", "2"]);
    // An outage longer than --give-up-after ends the wait with 69, and nothing ran there.
    let long = [(Duration::from_millis(300), Duration::from_millis(2500))];
    let (b, _, attempts) =
        backup_behind_a_blipping_link("long-outage", &long, &["--give-up-after", "1s"]).await;
    assert_eq!(code(&b), 69, "a long outage: {}", describe(&b));
    assert!(stderr(&b).contains("--give-up-after"), "{}", describe(&b));
    assert_eq!(attempts, ["1"], "the backup gave up: no attempt 2 ran");
}

/// The `count` of the `ACL LOG` entries of failed logins (`reason` `auth`) as `user`: how many
/// times the server refused that login (entries of one user and reason are merged).
async fn refused_logins(conn: &mut common::Raw, user: &str) -> i64 {
    let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(conn)
        .await
        .unwrap();
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(redis::Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    };
    entries
        .iter()
        .filter(|e| text(e.get("reason")) == "auth" && text(e.get("username")) == user)
        .map(|e| match e.get("count") {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("ACL LOG count: {other:?}"),
        })
        .sum()
}

/// Refusals that no retry fixes are told apart from an unreachable server (69), which a
/// supervisor retries forever: credentials and ACL denials exit 77 (EX_NOPERM), a database the
/// server rejects 78 (EX_CONFIG); and a refused login is tried once, not once per retry.
#[tokio::test]
async fn refused_credentials_exit_77_and_a_rejected_database_78_never_69() {
    let srv = server();
    let mut admin = raw(&srv).await;
    // A user that may do everything but run scripts and transactions, which every baton
    // command that writes needs.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noscripts",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
            "-@transaction",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let cases = [
        (
            "a wrong password",
            srv.url_for(common::TEST_USER, "wrong"),
            77,
            "AUTH",
        ),
        ("an unknown user", srv.url_for("nobody", "pw"), 77, "AUTH"),
        (
            "an ACL denial",
            srv.url_for("noscripts", "pw"),
            77,
            "NOPERM",
        ),
        (
            "a database index out of range",
            format!("redis://127.0.0.1:{}/99", srv.port()),
            78,
            "DB index is out of range",
        ),
    ];
    for (what, url, status, says) in &cases {
        for sub in [
            &["lock", "--key", "k", "--", "true"][..],
            &["run", "--key", "k", "--", "true"],
            &["leader", "--key", "k", "--", "true"],
            &["status", "--key", "k"],
        ] {
            if sub[0] == "status" && *says == "NOPERM" {
                // `status` only reads, which that user may.
                continue;
            }
            let o = run(
                baton(sub[0], url).args(&sub[1..]),
                &format!("{} with {what}", sub[0]),
            )
            .await;
            assert_eq!(
                code(&o),
                *status,
                "{} with {what}: {}",
                sub[0],
                describe(&o)
            );
            assert!(
                stderr(&o).contains(says),
                "{} with {what}: {}",
                sub[0],
                describe(&o)
            );
        }
    }
    // One wrong password, one refused login: the connect loop does not try it again.
    let before = refused_logins(&mut admin, common::TEST_USER).await;
    let o = run(
        baton("status", &srv.url_for(common::TEST_USER, "wrong")).args(["--key", "k"]),
        "status with a wrong password",
    )
    .await;
    assert_eq!(code(&o), 77, "{}", describe(&o));
    let after = refused_logins(&mut admin, common::TEST_USER).await;
    assert_eq!(
        after - before,
        1,
        "the server refused the login {} times",
        after - before
    );
}

#[tokio::test]
async fn fail_releases_a_hung_holder_so_a_backup_takes_over_at_once() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("fail");
    let pidfile = dir.path("pid");
    let out = dir.path("out");
    let events = dir.path("backup-events");
    let mut conn = raw(&srv).await;

    let holder_script = format!("echo $$ > {}; exec sleep 60", shq(&pidfile));
    let mut holder = spawn(baton("run", &url).args([
        "--key",
        "hung",
        "--lock-timeout",
        "30s",
        "--",
        "sh",
        "-c",
        &holder_script,
    ]));
    let program = read_pid(&pidfile, QUICK).await;
    assert!(alive(program));
    let backup_script = format!("echo \"$BATON_ATTEMPT\" >> {}", shq(&out));
    let backup = spawn(
        baton("run", &url)
            .args(["--key", "hung", "--lock-timeout", "30s", "--events"])
            .arg(&events)
            .args(["--", "sh", "-c", &backup_script]),
    );
    wait_event(&events, "Locked", QUICK).await;

    // Without naming the attempt, a live job is left alone; the refusal prints the command
    // that names it.
    let o = run(
        baton("fail", &url).args(["--key", "hung", "--reason", "stuck"]),
        "fail without --attempt",
    )
    .await;
    assert_eq!(code(&o), 64, "fail without --attempt: {}", describe(&o));
    assert!(
        stderr(&o).contains("fail --key hung --attempt 1 --reason stuck"),
        "the refusal prints the command: {}",
        describe(&o)
    );
    let o = run(
        baton("reset", &url).args(["--key", "hung", "--yes"]),
        "reset --yes without --attempt",
    )
    .await;
    assert_eq!(code(&o), 64, "reset without --attempt: {}", describe(&o));
    assert!(
        stderr(&o).contains("reset --key hung --attempt 1"),
        "the refusal prints the command: {}",
        describe(&o)
    );
    assert!(
        get(&mut conn, &lease_key("hung")).await.is_some(),
        "lease kept"
    );
    assert_eq!(
        get(&mut conn, &state_key("hung")).await.as_deref(),
        Some("1")
    );
    assert!(holder.try_wait().unwrap().is_none(), "holder still running");
    assert!(lines(&out).is_empty(), "backup still waiting");

    let o = run(
        baton("fail", &url).args(["--key", "hung", "--reason", "stuck", "--attempt", "1"]),
        "fail --attempt 1",
    )
    .await;
    assert_eq!(code(&o), 0, "fail --attempt 1: {}", describe(&o));
    let t0 = Instant::now();

    // The backup is woken by `failed`, well before the 30 s lease would have run out.
    let ran = wait_file(&out, Duration::from_secs(10), |t| t.contains('\n')).await;
    assert_eq!(
        ran.as_deref(),
        Some("2\n"),
        "backup ran attempt 2 within 10 s"
    );
    let o = finish_by(backup, t0 + Duration::from_secs(15), "backup").await;
    assert_eq!(code(&o), 0, "backup: {}", describe(&o));

    // The released holder hears the release on the job's channel and stops its program at once,
    // long before its next lease extension (every lock-timeout / 3 = 10 s) would have told it.
    let o = finish_by(holder, t0 + Duration::from_secs(5), "hung holder").await;
    assert_eq!(code(&o), 74, "hung holder: {}", describe(&o));
    // In words, not the channel's protocol text (`acquired:2`). Which word reaches the holder
    // first, the release (`failed`) or the backup's grant, is a race: either says it in words.
    let said = stderr(&o);
    assert!(
        !said.contains("acquired:")
            && said.contains("lost attempt 1")
            && (said.contains("was granted attempt 2")
                || said.contains("an operator released the attempt")),
        "hung holder: {}",
        describe(&o)
    );
    assert!(
        gone_within(program, Duration::from_secs(1)).await,
        "the hung program (pid {program}) outlived its baton"
    );

    let (status_code, json) = status_json(&url, "hung").await;
    assert_eq!(status_code, 0, "{json}");
    assert_eq!(json["state"], "done", "{json}");
    assert_eq!(json["key"], "hung", "{json}");
    assert_eq!(lines(&out), ["2"]);
}

#[tokio::test]
async fn help_documents_every_flag_and_exit_status() {
    let flags = [
        "--key",
        "--redis-url",
        "--prefix",
        "--lease",
        "--max-attempts",
        "--retention",
        "--no-watchdog",
        "--max-hold",
        "--retry-delay",
        "--kill-grace",
        "--name",
        "--json",
        "--events",
        "--give-up-after",
        "--connect-timeout",
        "--rejoin",
    ];
    let statuses = [64, 65, 69, 74, 75, 77, 78, 126, 127, 129, 130, 131, 143];

    let top = run(&mut plain(&["--help"]), "--help").await;
    let run_help = run(&mut plain(&["run", "--help"]), "run --help").await;

    for (what, out) in [("--help", &top), ("run --help", &run_help)] {
        assert_eq!(code(out), 0, "{what}: {}", describe(out));
        let text = format!("{}{}", stdout(out), stderr(out));
        let missing: Vec<u32> = statuses
            .iter()
            .copied()
            .filter(|&n| !mentions_number(&text, n))
            .collect();
        assert!(
            missing.is_empty(),
            "{what} does not document exit statuses {missing:?}:\n{text}"
        );
    }
    // What can escape the guard of PROGRAM's process group is said, not left to find out (in
    // `run --help`: `--help` is the overview).
    let run_text = format!("{}{}", stdout(&run_help), stderr(&run_help));
    assert!(
        run_text.contains("setsid or setpgid"),
        "run --help says what leaves PROGRAM's group:\n{run_text}"
    );
    let top_text = format!("{}{}", stdout(&top), stderr(&top));
    for sub in ["run", "status", "watch", "fail", "reset", "migrate"] {
        assert!(top_text.contains(sub), "--help lists `{sub}`:\n{top_text}");
    }
    let missing: Vec<&str> = flags
        .iter()
        .copied()
        .filter(|f| !run_text.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "run --help does not document {missing:?}:\n{run_text}"
    );
}

#[tokio::test]
async fn the_program_gets_the_baton_environment_and_its_stdio_and_events_go_to_the_file() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("env");
    let envfile = dir.path("env");
    let stdinfile = dir.path("stdin");
    let events = dir.path("events");
    let script = format!(
        "env | grep '^BATON_' | sort > {}; echo out-marker; echo err-marker >&2; \
         read line; echo \"$line\" > {}",
        shq(&envfile),
        shq(&stdinfile)
    );
    let mut child = spawn(
        baton("run", &url)
            .args(["--key", "cli:env", "--max-attempts", "2", "--events"])
            .arg(&events)
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::piped()),
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"in-marker\n").await.unwrap();
    drop(stdin);
    let o = finish(child, QUICK, "run").await;
    assert_eq!(code(&o), 0, "{}", describe(&o));

    let env: HashMap<String, String> = lines(&envfile)
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let var = |name: &str| {
        env.get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not set; BATON_* were {env:?}"))
    };
    assert_eq!(var("BATON_KEY"), "cli:env");
    // Documented for every run, not only a schedule's: without one, the job is the key.
    assert_eq!(var("BATON_JOB"), "cli:env");
    assert_eq!(var("BATON_ATTEMPT"), "1");
    assert_eq!(var("BATON_LAST_ATTEMPT"), "false");
    let token: u64 = var("BATON_FENCING_TOKEN")
        .parse()
        .unwrap_or_else(|e| panic!("BATON_FENCING_TOKEN {env:?}: {e}"));
    assert!(token > 0);

    assert!(
        stdout(&o).contains("out-marker"),
        "stdout passes through: {}",
        describe(&o)
    );
    assert!(
        stderr(&o).contains("err-marker"),
        "stderr passes through: {}",
        describe(&o)
    );
    assert_eq!(lines(&stdinfile), ["in-marker"], "stdin passes through");

    let text = std::fs::read_to_string(&events).expect("events file written");
    assert!(text.ends_with('\n'), "events end with a newline: {text:?}");
    let evs = event_lines(&text);
    let names = event_names(&evs);
    let acquired = names.iter().position(|n| n == "Acquired");
    let completed = names.iter().position(|n| n == "Completed");
    assert!(
        matches!((acquired, completed), (Some(a), Some(c)) if a < c),
        "Acquired then Completed in {names:?}"
    );
    let acq = &evs[acquired.unwrap()];
    if let Some(t) = acq.get("fencing_token") {
        assert_eq!(
            t.as_u64(),
            Some(token),
            "Acquired's token is the env's: {acq}"
        );
    }
    if let Some(a) = acq.get("attempt") {
        assert_eq!(a.as_u64(), Some(1), "{acq}");
    }
}

#[tokio::test]
async fn status_reports_absent_and_reset_lets_a_done_job_run_again() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("reset");
    let out = dir.path("out");
    let mut conn = raw(&srv).await;

    let (c, json) = status_json(&url, "again").await;
    assert_eq!(c, 0, "{json}");
    assert_eq!(json["state"], "absent", "{json}");
    assert_eq!(json["key"], "again", "{json}");
    assert!(json["attempt"].is_null(), "{json}");

    let script = format!("echo \"$BATON_ATTEMPT\" >> {}", shq(&out));
    let o = run(
        baton("run", &url).args(["--key", "again", "--", "sh", "-c", &script]),
        "first run",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    let (c, json) = status_json(&url, "again").await;
    assert_eq!(c, 0, "{json}");
    assert_eq!(json["state"], "done", "{json}");

    // DONE is remembered: a second run does not repeat the work.
    let o = run(
        baton("run", &url).args(["--key", "again", "--", "sh", "-c", &script]),
        "run on a done job",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(lines(&out), ["1"]);

    let o = run(
        baton("reset", &url).args(["--key", "again", "--yes"]),
        "reset --yes",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(get(&mut conn, &state_key("again")).await, None);
    let (c, json) = status_json(&url, "again").await;
    assert_eq!(c, 0, "{json}");
    assert_eq!(json["state"], "absent", "{json}");

    let o = run(
        baton("run", &url).args(["--key", "again", "--", "sh", "-c", &script]),
        "run after reset",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(lines(&out), ["1", "1"], "the program ran again after reset");
}

#[tokio::test]
async fn settings_are_checked_before_connecting_so_usage_errors_exit_64_without_redis() {
    // Nobody listens there: any attempt to connect would end in 69 after retrying for seconds.
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let program = ["--", "true"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("run", vec!["--key", "ok", "--lock-timeout", "0s"]),
        ("run", vec!["--key", "a{b}"]),
        (
            "run",
            vec!["--key", "ok", "--lock-timeout", "10s", "--retention", "1s"],
        ),
        (
            "run",
            vec!["--key", "ok", "--max-hold", "1s", "--lock-timeout", "10s"],
        ),
        ("run", vec!["--key", "ok", "--prefix", "no-colon"]),
        ("status", vec!["--key", "a{b}"]),
        ("watch", vec!["--key", "a{b}"]),
        ("fail", vec!["--key", "a{b}", "--yes"]),
        ("reset", vec!["--key", "a{b}", "--yes"]),
    ];
    for (sub, args) in cases {
        let mut cmd = baton(sub, &url);
        cmd.args(&args);
        if sub == "run" {
            cmd.args(program);
        }
        let t0 = Instant::now();
        let o = run(&mut cmd, &format!("{sub} {args:?}")).await;
        let took = t0.elapsed();
        assert_eq!(code(&o), 64, "{sub} {args:?}: {}", describe(&o));
        assert!(
            !stderr(&o).contains("panicked") && !stderr(&o).trim().is_empty(),
            "{sub} {args:?}: {}",
            describe(&o)
        );
        assert!(
            took < Duration::from_secs(3),
            "{sub} {args:?} took {took:?}: it tried to connect first"
        );
    }
}

#[tokio::test]
async fn huge_durations_are_refused_with_64_instead_of_panicking() {
    let srv = server();
    let url = srv.url();
    for flag in [
        "--kill-grace",
        "--lock-timeout",
        "--retention",
        "--max-hold",
        "--retry-delay",
    ] {
        // Without the watchdog, a 1 s lease makes baton SIGTERM PROGRAM (and time the SIGKILL a
        // kill-grace later) within a second, if it ever runs.
        let mut args = vec!["--key", "huge", "--no-watchdog"];
        if flag != "--lock-timeout" {
            args.extend(["--lock-timeout", "1s"]);
        }
        // The second (~1.6e19 s) overflows Instant arithmetic.
        for value in ["1000000000years", "500000000000years"] {
            let o = run(
                baton("run", &url)
                    .args(&args)
                    .args([flag, value, "--", "sleep", "3"]),
                &format!("{flag} {value}"),
            )
            .await;
            assert_eq!(code(&o), 64, "{flag} {value}: {}", describe(&o));
            assert!(
                !stderr(&o).contains("panicked"),
                "{flag} {value}: {}",
                describe(&o)
            );
        }
    }
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("huge")).await,
        None,
        "nothing ran"
    );
}

#[tokio::test]
async fn sighup_and_sigquit_are_forwarded_and_end_the_attempt_like_sigint() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("hup");
    let mut conn = raw(&srv).await;
    for (sig, key, expected) in [(libc::SIGHUP, "hup", 129), (libc::SIGQUIT, "quit", 131)] {
        let pidfile = dir.path(&format!("{key}-pid"));
        let script = format!("echo $$ > {}; exec sleep 60", shq(&pidfile));
        let holder = spawn(baton("run", &url).args(["--key", key, "--", "sh", "-c", &script]));
        let program = read_pid(&pidfile, QUICK).await;
        send_signal(holder.id().unwrap(), sig);
        let o = finish(holder, QUICK, key).await;
        assert_eq!(code(&o), expected, "{key}: {}", describe(&o));
        assert!(
            gone_within(program, Duration::from_secs(1)).await,
            "{key}: PROGRAM (pid {program}) outlived baton"
        );
        assert_eq!(
            get(&mut conn, &lease_key(key)).await,
            None,
            "{key}: released"
        );
        let (_, json) = status_json(&url, key).await;
        let failure = json["last_failure"].as_str().unwrap_or_default().to_owned();
        assert!(failure.contains("baton got SIG"), "{key}: {json}");
    }

    // A waiting backup ends as well, and releases nothing.
    let pidfile = dir.path("busy-pid");
    let script = format!("echo $$ > {}; exec sleep 60", shq(&pidfile));
    let events = dir.path("backup-events");
    let holder = spawn(baton("run", &url).args(["--key", "busy", "--", "sh", "-c", &script]));
    read_pid(&pidfile, QUICK).await;
    let backup = spawn(
        baton("run", &url)
            .args(["--key", "busy", "--events"])
            .arg(&events)
            .args(["--", "true"]),
    );
    wait_event(&events, "Locked", QUICK).await;
    send_signal(backup.id().unwrap(), libc::SIGHUP);
    let o = finish(backup, QUICK, "backup").await;
    assert_eq!(code(&o), 129, "backup: {}", describe(&o));
    assert!(get(&mut conn, &lease_key("busy")).await.is_some());
    drop(holder);
}

#[tokio::test]
async fn a_signal_baton_inherits_as_ignored_stays_ignored() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("nohup");
    let pidfile = dir.path("pid");
    let script = format!("echo $$ > {}; sleep 1", shq(&pidfile));
    // As `nohup baton run ...` would start it.
    let mut cmd = baton_command("sh");
    cmd.arg("-c")
        .arg(r#"trap '' HUP; exec "$@""#)
        .arg("sh")
        .arg(BATON)
        .args([
            "run",
            "--redis-url",
            &url,
            "--key",
            "nohup",
            "--",
            "sh",
            "-c",
            &script,
        ]);
    let holder = spawn(&mut cmd);
    let program = read_pid(&pidfile, QUICK).await;
    send_signal(holder.id().unwrap(), libc::SIGHUP);
    send_signal(program, libc::SIGHUP);
    let o = finish(holder, QUICK, "nohup").await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    let (_, json) = status_json(&url, "nohup").await;
    assert_eq!(json["state"], "done", "{json}");
}

/// The process state letter from /proc (R, S, T, Z, ...).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
}

#[tokio::test]
async fn sigtstp_to_baton_stops_the_program_too_and_sigcont_resumes_both() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("tstp");
    let pidfile = dir.path("pid");
    let out = dir.path("out");
    let script = format!(
        "echo $$ > {}; sleep 1; echo finished > {}",
        shq(&pidfile),
        shq(&out)
    );
    let holder = spawn(baton("run", &url).args(["--key", "tstp", "--", "sh", "-c", &script]));
    let baton_pid = holder.id().unwrap();
    let program = read_pid(&pidfile, QUICK).await;
    send_signal(baton_pid, libc::SIGTSTP);
    let deadline = Instant::now() + QUICK;
    while !(proc_state(program) == Some('T') && proc_state(baton_pid) == Some('T')) {
        assert!(
            Instant::now() < deadline,
            "not both stopped: PROGRAM {:?}, baton {:?}",
            proc_state(program),
            proc_state(baton_pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped well past PROGRAM's 1 s of work: it must not have gone on meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(lines(&out).is_empty(), "PROGRAM ran on while stopped");
    send_signal(baton_pid, libc::SIGCONT);
    let o = finish(holder, QUICK, "continued baton").await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    assert_eq!(lines(&out), ["finished"]);
    let (_, json) = status_json(&url, "tstp").await;
    assert_eq!(json["state"], "done", "{json}");
}

#[tokio::test]
async fn sigterm_reaches_a_stopped_program_at_once() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("stopped");
    let pidfile = dir.path("pid");
    // PROGRAM handles SIGTERM, so a stopped PROGRAM acts on it only once continued (Linux kills
    // a stopped process at once only for a signal whose default action applies).
    let script = format!(
        "trap 'exit 7' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        shq(&pidfile)
    );
    // A 30 s grace: only a SIGCONT after the SIGTERM ends PROGRAM within the bound below.
    let holder = spawn(baton("run", &url).args([
        "--key",
        "stopped",
        "--kill-grace",
        "30s",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let program = read_pid(&pidfile, QUICK).await;
    // Stop PROGRAM's whole group (not job control: baton goes on running and holding).
    // SAFETY: kill(2) on the process group of the PROGRAM this test started.
    assert_eq!(
        unsafe { libc::kill(-(program as libc::pid_t), libc::SIGSTOP) },
        0
    );
    let t0 = Instant::now();
    send_signal(holder.id().unwrap(), libc::SIGTERM);
    let o = finish(
        holder,
        Duration::from_secs(5),
        "SIGTERM with a stopped PROGRAM",
    )
    .await;
    assert_eq!(code(&o), 143, "{}", describe(&o));
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        gone_within(program, Duration::from_secs(1)).await,
        "PROGRAM (pid {program}) outlived baton"
    );
}

#[tokio::test]
async fn without_the_watchdog_sigterm_comes_kill_grace_before_the_leases_end_counted_from_the_grant(
) {
    let srv = server();
    // Every reply reaches baton 350 ms late, the grant's among them. Counted from when baton
    // read the grant, SIGTERM would come 250 ms before a lease end that is 350 ms late: after
    // the real end (when the worker's DeadlinePassed makes baton SIGKILL PROGRAM), i.e. never.
    let proxy = slow_replies_proxy(srv.port(), Duration::from_millis(350)).await;
    let url = format!("redis://127.0.0.1:{proxy}/");
    let dir = TempDir::new("granttime");
    let pidfile = dir.path("pid");
    let termfile = dir.path("term");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        shq(&termfile),
        shq(&pidfile)
    );
    let holder = spawn(baton("run", &url).args([
        "--key",
        "granttime",
        "--no-watchdog",
        "--lock-timeout",
        "2s",
        "--kill-grace",
        "250ms",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let program = read_pid(&pidfile, Duration::from_secs(20)).await;
    let mut conn = raw(&srv).await;
    let lease = lease_key("granttime");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut lease_gone, mut program_gone) = (None, None);
    while (lease_gone.is_none() || program_gone.is_none()) && Instant::now() < deadline {
        let now = Instant::now();
        if program_gone.is_none() && !alive(program) {
            program_gone = Some(now);
        }
        if lease_gone.is_none() && get(&mut conn, &lease).await.is_none() {
            lease_gone = Some(now);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (Some(lease_gone), Some(program_gone)) = (lease_gone, program_gone) else {
        panic!("lease gone {lease_gone:?}, program gone {program_gone:?} within 10 s");
    };
    let o = finish(holder, QUICK, "--no-watchdog behind a slow link").await;
    assert_eq!(code(&o), 74, "{}", describe(&o));
    assert_eq!(
        lines(&termfile),
        ["term"],
        "PROGRAM got SIGTERM (kill-grace before the lease's end), not only SIGKILL"
    );
    assert!(
        program_gone <= lease_gone + Duration::from_millis(100),
        "PROGRAM ran {:?} past its lease's end",
        program_gone - lease_gone
    );
}

#[tokio::test]
async fn no_signal_goes_to_the_programs_group_after_its_leader_was_reaped() {
    if !strace_works() {
        eprintln!("skipped: strace is missing or cannot trace here");
        return;
    }
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("reaped");
    let pidfile = dir.path("pid");
    let trace = dir.path("trace");
    let script = format!("echo $$ > {}; exit 3", shq(&pidfile));
    let mut cmd = baton_command("strace");
    cmd.args(["-f", "-qq", "-e", "trace=kill,wait4,waitid", "-o"])
        .arg(&trace)
        .args([
            BATON,
            "run",
            "--redis-url",
            &url,
            "--key",
            "reaped",
            "--max-attempts",
            "1",
        ])
        .args(["--", "sh", "-c", &script]);
    let o = finish(
        spawn(&mut cmd),
        Duration::from_secs(20),
        "baton under strace",
    )
    .await;
    assert_eq!(code(&o), 3, "{}", describe(&o));
    let pid = read_pid(&pidfile, QUICK).await;
    let lines = lines(&trace);
    // The line that reaps PROGRAM: wait4 returning its PID, or a waitid that is not WNOWAIT.
    let reaped = lines.iter().position(|l| {
        let waits = (l.contains("wait4(") || l.contains("wait4 resumed"))
            && l.trim_end().ends_with(&format!("= {pid}"));
        let waitid = (l.contains("waitid(") || l.contains("waitid resumed"))
            && l.contains(&format!("si_pid={pid},"))
            && (l.contains("CLD_EXITED") || l.contains("CLD_KILLED"))
            && !l.contains("WNOWAIT");
        waits || waitid
    });
    let Some(reaped) = reaped else {
        panic!("no line reaps PROGRAM (pid {pid}):\n{}", lines.join("\n"));
    };
    let group = format!("kill(-{pid},");
    let late: Vec<&String> = lines[reaped..]
        .iter()
        .filter(|l| l.contains(&group))
        .collect();
    assert!(
        late.is_empty(),
        "signals to PROGRAM's group after its leader was reaped: {late:#?}\n{}",
        lines.join("\n")
    );
}

/// What PROGRAM starts dies with a SIGKILLed baton too, even while PROGRAM waits for it: the
/// parent-death signal kills PROGRAM alone, and its child (`sleep` here) would run on with init
/// as its parent, beside the next attempt's PROGRAM.
#[tokio::test]
async fn a_sigkilled_baton_takes_what_its_program_started_down_too() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("crash-child");
    let pidfile = dir.path("pid");
    let script = format!("sleep 100 & echo $! > {}; wait", shq(&pidfile));
    let mut holder =
        spawn(baton("run", &url).args(["--key", "crash-child", "--", "sh", "-c", &script]));
    let sleeper = read_pid(&pidfile, QUICK).await;
    assert!(alive(sleeper));
    holder.start_kill().expect("SIGKILL baton");
    let status = tokio::time::timeout(QUICK, holder.wait())
        .await
        .expect("baton reaped")
        .unwrap();
    assert_eq!(status.code(), None, "baton was killed by a signal");
    assert!(
        gone_within(sleeper, Duration::from_secs(2)).await,
        "PROGRAM's child (pid {sleeper}) outlived the SIGKILLed baton"
    );
}

/// What PROGRAM leaves running when it exits gets SIGTERM (and time to clean up) before the job
/// is recorded DONE and baton exits; nothing of it is left running then.
#[tokio::test]
async fn what_program_leaves_running_is_stopped_before_baton_records_done() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("leftover");
    let pidfile = dir.path("pid");
    let log = dir.path("log");
    let ready = dir.path("ready");
    // PROGRAM exits only once the leftover's trap is set: on a loaded host the subshell may
    // not have run `trap` yet when its parent exits, and would then die of the SIGTERM
    // without cleaning up (a race in the test's script, not in baton).
    let script = format!(
        "(trap 'sleep 0.2; echo cleaned >> {log}; exit 0' TERM; : > {ready}; while :; do sleep 0.05; done) &
         echo $! > {pid}
         while [ ! -e {ready} ]; do sleep 0.01; done
         echo exits >> {log}",
        log = shq(&log),
        pid = shq(&pidfile),
        ready = shq(&ready),
    );
    let o = run(
        baton("run", &url).args(["--key", "leftover", "--", "sh", "-c", &script]),
        "run with a leftover",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    let left = read_pid(&pidfile, QUICK).await;
    assert!(!alive(left), "the leftover (pid {left}) outlived baton");
    assert_eq!(
        lines(&log),
        ["exits", "cleaned"],
        "the leftover got SIGTERM and baton waited for it: {}",
        describe(&o)
    );
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("leftover")).await.as_deref(),
        Some("DONE")
    );
}

// ---------------------------------------------------------------------------------------------
// Messages: flags by their names, durations in words
// ---------------------------------------------------------------------------------------------

/// The words of `text` that are Rust `Debug` durations (`4.006396222s`, `10ms`, `1.5µs`):
/// baton's messages say `4.0 s`, `10 ms` instead.
fn debug_durations(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == 'µ'))
        .filter(|w| {
            let unit = ["ns", "µs", "ms", "s"].into_iter().find(|u| w.ends_with(u));
            unit.is_some_and(|u| {
                let number = &w[..w.len() - u.len()];
                number.starts_with(|c: char| c.is_ascii_digit()) && number.parse::<f64>().is_ok()
            })
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_debug_duration_finder_finds_them_and_only_them() {
    assert_eq!(
        debug_durations("took 4.006396222s, then 10ms (1.5µs); 4.0 s, 250 ms, job w30s"),
        ["4.006396222s", "10ms", "1.5µs"]
    );
}

#[tokio::test]
async fn refused_settings_are_named_by_their_flags_with_durations_in_words() {
    let srv = server();
    let url = srv.url();
    let cases: [(&str, &[&str], &[&str]); 6] = [
        (
            "run",
            // The former name of --lease, an alias: the message names the flag as it is now.
            &["--lock-timeout", "5ms"],
            &["invalid --lease: 5 ms is outside 10 ms ..= 1 day"],
        ),
        (
            "run",
            // --max-run is --max-hold's former name, an alias.
            &["--max-run", "1s", "--lease", "10s"],
            &["invalid --max-hold: 1.0 s must exceed --lease (10.0 s)"],
        ),
        (
            "run",
            &["--lease", "10s", "--retention", "1s"],
            &["invalid --retention: 1.0 s", "--lease"],
        ),
        ("run", &["--name", " "], &["invalid --name"]),
        (
            "leader",
            &["--lease", "1ms"],
            &["invalid --lease: 1 ms is outside 10 ms ..= 1 day"],
        ),
        (
            "lock",
            &["--ttl", "1ms"],
            &["invalid --lease: 1 ms is outside 10 ms ..= 1 day"],
        ),
    ];
    for (sub, args, said) in cases {
        let o = run(
            baton(sub, &url)
                .args(["--key", "flags"])
                .args(args)
                .args(["--", "true"]),
            &format!("{sub} {args:?}"),
        )
        .await;
        assert_eq!(code(&o), 64, "{sub} {args:?}: {}", describe(&o));
        let err = stderr(&o);
        for words in said {
            assert!(
                err.contains(words),
                "{sub} {args:?} should say {words:?}: {err}"
            );
        }
        assert!(
            !err.contains('`') && !err.contains('_'),
            "{sub} {args:?} names a library field instead of its flag: {err}"
        );
        assert_eq!(
            debug_durations(&err),
            [] as [String; 0],
            "{sub} {args:?}: {err}"
        );
    }
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("flags")).await,
        None,
        "nothing ran"
    );
}

#[tokio::test]
async fn the_former_flag_names_are_still_accepted() {
    let srv = server();
    let url = srv.url();
    // --no-keepalive, --max-run and --lock-timeout are the former names of --no-watchdog,
    // --max-hold and --lease: scripts written with them keep working.
    let o = run(
        baton("run", &url).args([
            "--key",
            "aliases",
            "--no-keepalive",
            "--max-run",
            "5s",
            "--lock-timeout",
            "2s",
            "--",
            "true",
        ]),
        "run with the former flag names",
    )
    .await;
    assert_eq!(code(&o), 0, "{}", describe(&o));
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("aliases")).await.as_deref(),
        Some("DONE")
    );
    // --help lists them as aliases, next to the current names.
    let help = run(&mut plain(&["run", "--help"]), "run --help").await;
    let text = stdout(&help);
    for alias in ["no-keepalive", "max-run", "lock-timeout"] {
        assert!(text.contains(alias), "run --help lists {alias}:\n{text}");
    }
}

#[tokio::test]
async fn a_max_hold_stop_is_told_and_the_status_reads_in_words() {
    let srv = server();
    let url = srv.url();
    let o = run(
        baton("run", &url).args([
            "--key",
            "words",
            "-v",
            "--max-hold",
            "1500ms",
            "--lease",
            "1s",
            "--",
            "sleep",
            "30",
        ]),
        "run --max-hold 1500ms",
    )
    .await;
    assert_eq!(code(&o), 74, "{}", describe(&o));
    let err = stderr(&o);
    assert!(
        err.contains("stopping PROGRAM: --max-hold of 1.5 s reached"),
        "{err}"
    );
    assert_eq!(debug_durations(&err), [] as [String; 0], "{err}");
    let status = run(baton("status", &url).args(["--key", "words"]), "status").await;
    assert_eq!(code(&status), 0, "{}", describe(&status));
    let text = stdout(&status);
    // Kept for --retention (24 h by default): hours and minutes, not `23h 59m 58s 917ms`.
    assert!(text.contains("retained:     23 h 59 min more"), "{text}");
    assert_eq!(debug_durations(&text), [] as [String; 0], "{text}");
}

#[tokio::test]
async fn a_lock_wait_running_out_says_how_long_it_waited_in_words() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("wait-words");
    let pid = dir.path("pid");
    let script = format!("echo $$ > {}; sleep 30", shq(&pid));
    let holder = spawn(baton("lock", &url).args(["--key", "w", "--", "sh", "-c", &script]));
    read_pid(&pid, QUICK).await;
    let o = run(
        baton("lock", &url).args(["--key", "w", "--wait", "300ms", "--", "true"]),
        "lock --wait 300ms",
    )
    .await;
    assert_eq!(code(&o), 75, "{}", describe(&o));
    let err = stderr(&o);
    assert!(
        err.contains("not acquired") && err.contains(" ms)"),
        "{err}"
    );
    assert_eq!(debug_durations(&err), [] as [String; 0], "{err}");
    drop(holder);
}

/// The lines of `text` about `flag`: its own line and, in `--help`'s layout, the indented
/// paragraphs under it up to the next flag.
fn help_of(text: &str, flag: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    let first = lines.next().unwrap_or_default().to_string();
    // A flag's own line is indented at most 6 columns; its paragraphs, 10.
    let rest: Vec<&str> = lines
        .take_while(|l| !(l.trim_start().starts_with('-') && l.len() - l.trim_start().len() <= 6))
        .collect();
    format!("{first}\n{}", rest.join("\n"))
}

#[tokio::test]
async fn url_help_is_one_line_with_h_and_prefix_help_names_each_commands_keys() {
    let short = run(&mut plain(&["run", "-h"]), "run -h").await;
    let long = run(&mut plain(&["run", "--help"]), "run --help").await;
    assert_eq!(code(&short), 0, "{}", describe(&short));
    let url_short = help_of(&stdout(&short), "--url");
    assert_eq!(url_short.trim().lines().count(), 1, "{url_short}");
    assert!(!url_short.contains("BATON_TLS_CA_FILE"), "{url_short}");
    let url_long = help_of(&stdout(&long), "--url");
    for words in [
        "redis+sentinel://host:port",
        "sslmode=require",
        "BATON_TLS_CA_FILE",
    ] {
        assert!(
            url_long.contains(words),
            "--help on --url says {words}: {url_long}"
        );
    }

    let keys = [
        ("run", "job's keys"),
        ("status", "job's keys"),
        ("watch", "job's keys"),
        ("fail", "job's keys"),
        ("reset", "job's keys"),
        ("lock", "lock's keys"),
        ("leader", "election's keys"),
        ("unlock", "fair lock's PREFIXfair:{KEY}"),
    ];
    for (sub, whose) in keys {
        let o = run(&mut plain(&[sub, "-h"]), &format!("{sub} -h")).await;
        let prefix = help_of(&stdout(&o), "--prefix");
        assert!(prefix.contains(whose), "{sub}: {prefix}");
        assert!(prefix.contains("PostgreSQL"), "{sub}: {prefix}");
        assert!(!prefix.contains("job's Redis keys"), "{sub}: {prefix}");
    }
    let o = run(&mut plain(&["lock", "-h"]), "lock -h").await;
    assert!(help_of(&stdout(&o), "--prefix").contains("redlock:{KEY}"));
}

/// A job exhausted by earlier runs: a later run says so in one line by default and under
/// `--quiet` (it exits 75: cron should mail it), with the attempts the job really made (its
/// failure note, since the store keeps EXHAUSTED without the count), never this run's
/// `--max-attempts`; `--json` says `attempts: null` rather than a number it does not know.
#[tokio::test]
async fn a_run_that_finds_the_job_exhausted_says_so_with_the_jobs_own_attempts() {
    let srv = server();
    let url = srv.url();
    let first = run(
        baton("run", &url).args(["--key", "ex-count", "--max-attempts", "1", "--", "false"]),
        "first",
    )
    .await;
    assert_eq!(code(&first), 1, "{}", describe(&first));
    for flag in [None, Some("-v"), Some("--quiet")] {
        let mut cmd = baton("run", &url);
        cmd.args(["--key", "ex-count"]);
        cmd.args(flag);
        let out = run(cmd.args(["--", "true"]), "later").await;
        assert_eq!(code(&out), 75, "{}", describe(&out));
        let e = stderr(&out);
        assert!(!e.contains("5 attempts"), "{flag:?}: {e}");
        assert_eq!(
            e.lines().filter(|l| l.contains("exhausted")).count(),
            1,
            "{flag:?}: {e}"
        );
        assert!(
            e.contains("exhausted (last failure: attempt 1 by ")
                && e.contains("nothing run (`baton reset --key ex-count` to run it again)"),
            "{flag:?}: {e}"
        );
    }
    let out = run(
        baton("run", &url).args(["--key", "ex-count", "--json", "--", "true"]),
        "json",
    )
    .await;
    let events = event_lines(&stderr(&out));
    let ex = events
        .iter()
        .find(|v| v["event"] == "Exhausted")
        .unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(ex["attempts"], Value::Null, "{ex}");
}

/// `--quiet`: nothing from baton when a run goes well (done here, done elsewhere), PROGRAM's
/// own output untouched; `-q` with `-v` is a usage error.
#[tokio::test]
async fn quiet_runs_print_only_programs_output() {
    let srv = server();
    let url = srv.url();
    for _ in 0..2 {
        let out = run(
            baton("run", &url).args([
                "--quiet",
                "--key",
                "q",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2",
            ]),
            "quiet",
        )
        .await;
        assert_eq!(code(&out), 0, "{}", describe(&out));
        // The second run finds the job done: it prints nothing at all.
        assert!(
            matches!(
                (stdout(&out).as_str(), stderr(&out).as_str()),
                ("out\n", "err\n") | ("", "")
            ),
            "{}",
            describe(&out)
        );
    }
    let both = run(
        baton("run", &url).args(["-q", "-v", "--key", "q", "--", "true"]),
        "q v",
    )
    .await;
    assert_eq!(code(&both), 64, "{}", describe(&both));
    let out = run(
        baton("reset", &url).args(["--quiet", "--key", "q"]),
        "reset",
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "{}",
        describe(&out)
    );
}
