//! Many jobs and workers on one shared client, with a MONITOR capture proving that every
//! WATCH … EXEC ran undisturbed on its own connection.
#![cfg(feature = "testing")]

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use baton::Event;
use common::*;
use tokio_stream::StreamExt;

const JOBS: usize = 200;
const WORKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_jobs_by_three_workers_on_one_client_each_done_exactly_once() {
    let srv = server();
    let mut monitor = redis::Client::open(srv.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>();
    let client = client(&srv).await;
    let mut tasks = Vec::new();
    for j in 0..JOBS {
        for w in 0..WORKERS {
            let cfg = job(&format!("load:{j}")).build().unwrap();
            let mut stream = client.failover().start(cfg);
            tasks.push(tokio::spawn(async move {
                let mut grants = Vec::new();
                let mut completed_by_us = 0;
                loop {
                    let ev = next(&mut stream, Duration::from_secs(60)).await;
                    match ev {
                        Event::Acquired(a) => {
                            grants.push(a.attempt);
                            // Every fourth job fails its first attempt, so handovers happen too.
                            if j % 4 == 0 && a.attempt == 1 {
                                a.fail("first attempt fails").await.unwrap();
                            } else {
                                a.done().await.unwrap();
                            }
                        }
                        Event::Completed { attempt } => {
                            completed_by_us += attempt.is_some() as usize;
                            return (j, w, grants, completed_by_us, "Completed");
                        }
                        Event::Failed { .. } => return (j, w, grants, completed_by_us, "Failed"),
                        ev if ev.is_terminal() => panic!("job {j} worker {w}: {ev:?}"),
                        _ => {}
                    }
                }
            }));
        }
    }
    let mut done_by: HashMap<usize, usize> = HashMap::new();
    let mut granted: HashSet<(usize, u64)> = HashSet::new();
    for t in tasks {
        let (j, _w, grants, completed, _end) = t.await.unwrap();
        for g in grants {
            assert!(granted.insert((j, g)), "job {j} attempt {g} granted twice");
        }
        *done_by.entry(j).or_default() += completed;
    }
    let mut conn = raw(&srv).await;
    for j in 0..JOBS {
        assert_eq!(
            done_by.get(&j),
            Some(&1),
            "job {j} completed {done_by:?} times"
        );
        let key = state_key(&format!("load:{j}"));
        assert_eq!(get(&mut conn, &key).await.as_deref(), Some("DONE"), "{key}");
        let expected_attempts = if j % 4 == 0 { 2 } else { 1 };
        assert!(granted.contains(&(j, expected_attempts)));
        assert!(!granted.contains(&(j, expected_attempts + 1)));
    }

    // A marker command ends the capture.
    let _: () = redis::cmd("SET")
        .arg("monitor:end")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut lines = Vec::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(10), monitor.next())
            .await
            .expect("monitor stream stalled")
            .expect("monitor stream ended");
        let end = line.contains("\"monitor:end\"");
        lines.push(line);
        if end {
            break;
        }
    }
    check_transactions(&lines);
}

/// Per connection, between a WATCH and its EXEC/UNWATCH only the same job's reads, MULTI and
/// writes may appear: no second WATCH, no other job's keys.
fn check_transactions(lines: &[String]) {
    let mut open: HashMap<String, String> = HashMap::new();
    let mut watches = 0;
    let mut execs = 0;
    for line in lines {
        let Some((addr, args)) = parse_monitor_line(line) else {
            continue;
        };
        let cmd = args[0].to_ascii_uppercase();
        match cmd.as_str() {
            "WATCH" => {
                watches += 1;
                assert!(
                    !open.contains_key(&addr),
                    "second WATCH on {addr} before EXEC: {line}"
                );
                open.insert(addr, tag(&args[1]));
            }
            "EXEC" | "UNWATCH" => {
                if open.remove(&addr).is_some() && cmd == "EXEC" {
                    execs += 1;
                }
            }
            _ => {
                if let Some(job) = open.get(&addr) {
                    assert!(
                        matches!(
                            cmd.as_str(),
                            "GET"
                                | "PTTL"
                                | "TIME"
                                | "MULTI"
                                | "SET"
                                | "DEL"
                                | "PEXPIRE"
                                | "PUBLISH"
                        ),
                        "unexpected {cmd} inside a transaction on {addr}: {line}"
                    );
                    for key in args.iter().skip(1).take(1) {
                        assert_eq!(&tag(key), job, "another job's key inside a WATCH: {line}");
                    }
                }
            }
        }
    }
    // One grant per job plus the handovers, plus every done/fail: the capture saw real work.
    assert!(watches >= JOBS * 2, "only {watches} WATCHes captured");
    assert!(execs >= JOBS * 2, "only {execs} EXECs captured");
}

fn tag(key: &str) -> String {
    match (key.find('{'), key.find('}')) {
        (Some(a), Some(b)) if b > a => key[a + 1..b].to_string(),
        _ => String::new(),
    }
}

/// `1700000000.123456 [0 127.0.0.1:54906] "WATCH" "a"` → ("127.0.0.1:54906", ["WATCH", "a"]).
fn parse_monitor_line(line: &str) -> Option<(String, Vec<String>)> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    let addr = line[open + 1..close].split_whitespace().nth(1)?.to_string();
    let mut args = Vec::new();
    let mut rest = line[close + 1..].chars().peekable();
    while let Some(c) = rest.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = rest.next() {
            match c {
                '\\' => {
                    if let Some(n) = rest.next() {
                        arg.push(n);
                    }
                }
                '"' => break,
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    (!args.is_empty()).then_some((addr, args))
}

#[test]
#[should_panic(expected = "second WATCH")]
fn the_capture_check_catches_an_interleaved_watch() {
    let lines = [
        r#"1.0 [0 127.0.0.1:1] "WATCH" "baton:{a}" "baton:{a}:lease""#,
        r#"1.1 [0 127.0.0.1:1] "GET" "baton:{a}""#,
        r#"1.2 [0 127.0.0.1:1] "WATCH" "baton:{b}""#,
        r#"1.3 [0 127.0.0.1:1] "EXEC""#,
    ];
    check_transactions(&lines.map(String::from));
}

#[test]
#[should_panic(expected = "another job's key")]
fn the_capture_check_catches_a_foreign_key_inside_a_transaction() {
    let lines = [
        r#"1.0 [0 127.0.0.1:1] "WATCH" "baton:{a}""#,
        r#"1.1 [0 127.0.0.1:1] "SET" "baton:{b}" "1""#,
        r#"1.3 [0 127.0.0.1:1] "EXEC""#,
    ];
    check_transactions(&lines.map(String::from));
}

#[tokio::test]
async fn waiting_backups_recheck_a_kept_alive_lease_with_one_plain_read_per_lease_period() {
    // The holder extends every lease/3 (one EVALSHA). A backup wakes
    // when the lease it read would run out and finds it extended: that check must be a plain
    // GET + PTTL, not a WATCH transition, and happen about once per lease period.
    const LEASE: Duration = Duration::from_millis(600);
    const BACKUPS: u64 = 3;
    let srv = server();
    let client = client(&srv).await;
    let cfg = baton::FailoverConfig::builder("idle")
        .lease(LEASE)
        .watchdog(true)
        .build()
        .unwrap();
    let mut holder = client.failover().start(cfg.clone());
    let held = acquired(&mut holder, WAKE).await;
    let mut backups = Vec::new();
    for _ in 0..BACKUPS {
        let mut b = client.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        backups.push(b);
    }
    let mut admin = raw(&srv).await;
    let before = command_calls(&mut admin).await;
    let window = LEASE * 5;
    tokio::time::sleep(window).await;
    let after = command_calls(&mut admin).await;
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    // Every extension is one EVALSHA (no WATCH); a backup's full transition is a WATCH; every
    // WATCH'ed observation and every plain read has one PTTL (the script reads PTTL only when it
    // refuses, which it does not here).
    let extensions = delta("evalsha");
    let backup_transitions = delta("watch");
    let backup_reads = delta("pttl") - delta("watch");
    let periods = (window.as_millis() / LEASE.as_millis()) as u64;
    assert!(extensions >= 3, "the holder did not extend: {extensions}");
    // Before the plain-read re-check this was about one per backup per lease period (18 here).
    assert!(
        backup_transitions == 0,
        "{backup_transitions} WATCH observations without an EXEC: backups re-checked under WATCH"
    );
    assert!(
        backup_reads >= BACKUPS && backup_reads <= 2 * BACKUPS * periods,
        "{backup_reads} plain reads by {BACKUPS} backups over {periods} lease periods"
    );
    // Nothing else happened: the holder still holds, the backups still wait.
    for b in &mut backups {
        assert!(
            tokio::time::timeout(Duration::from_millis(10), b.next())
                .await
                .is_err(),
            "a backup reported something while nothing changed"
        );
    }
    held.done().await.unwrap();
}

#[tokio::test]
async fn a_kept_alive_holder_sends_one_command_per_extension() {
    // Each extension used to be 11 commands (WATCH, 5 reads, MULTI, 3 PEXPIRE, EXEC): 10 000
    // kept-alive holders at a 3 s lease made 110 000 commands/s. Now it is one EVALSHA from the
    // client; on the server the script's own calls (2 GET, 3 PEXPIRE) count as well.
    const LEASE: Duration = Duration::from_millis(300);
    let srv = server();
    let client = client(&srv).await;
    let cfg = baton::FailoverConfig::builder("kept")
        .lease(LEASE)
        .watchdog(true)
        .build()
        .unwrap();
    let mut holder = client.failover().start(cfg);
    let held = acquired(&mut holder, WAKE).await;
    let mut admin = raw(&srv).await;
    // Let the first extension load the script (SCRIPT LOAD after NOSCRIPT happens once).
    tokio::time::sleep(LEASE).await;
    let before = command_calls(&mut admin).await;
    tokio::time::sleep(LEASE * 5).await;
    let after = command_calls(&mut admin).await;
    let mut delta: HashMap<String, u64> = after
        .iter()
        .map(|(c, n)| (c.clone(), n - before.get(c).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    delta.remove("info");
    let extensions = delta.get("evalsha").copied().unwrap_or(0);
    assert!(extensions >= 10, "the holder did not extend: {delta:?}");
    // Client side: nothing but the EVALSHAs (one command per extension).
    let sent: u64 = delta
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "get" | "pexpire"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(sent, extensions, "commands sent besides EVALSHA: {delta:?}");
    // Server side (INFO commandstats counts a script's calls): 6 per extension.
    assert_eq!(delta.get("get").copied(), Some(2 * extensions), "{delta:?}");
    assert_eq!(
        delta.get("pexpire").copied(),
        Some(3 * extensions),
        "{delta:?}"
    );
    held.done().await.unwrap();
}

#[tokio::test]
async fn a_decision_that_writes_nothing_sends_its_unwatch_with_the_next_observation() {
    // A backup that finds the job held decides to wait: its WATCH is not ended by a separate
    // UNWATCH round trip; the connection goes back to the pool and its next pipeline starts
    // with UNWATCH.
    let srv = server();
    let holder_client = client(&srv).await;
    let backup_client = client(&srv).await;
    let mut holder = holder_client
        .failover()
        .start(job("deferred").build().unwrap());
    let held = acquired(&mut holder, WAKE).await;
    let mut admin = raw(&srv).await;
    let before = command_calls(&mut admin).await;
    let mut backup = backup_client
        .failover()
        .start(job("deferred").build().unwrap());
    assert!(matches!(
        next(&mut backup, WAKE).await,
        Event::Locked { .. }
    ));
    let after = command_calls(&mut admin).await;
    let delta = |c: &str, a: &HashMap<String, u64>| {
        a.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0)
    };
    assert_eq!(delta("watch", &after), 1, "{after:?}");
    assert_eq!(
        delta("unwatch", &after),
        0,
        "the UNWATCH was a round trip of its own"
    );
    // The holder finishes; the backup observes again on the same pooled connection: the
    // deferred UNWATCH goes first, and the decision is right.
    held.done().await.unwrap();
    let events = until_end(&mut backup, WAKE).await;
    assert!(
        matches!(events.last(), Some(Event::Completed { attempt: None })),
        "{events:?}"
    );
    let end = command_calls(&mut admin).await;
    // The backup's two observations and the holder's done().
    assert_eq!(delta("watch", &end), 3, "{end:?}");
    assert_eq!(delta("unwatch", &end), 1, "{end:?}");
}
