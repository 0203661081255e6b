//! The interleavings a code review found (issue 9), each driven deterministically: a refused
//! `WATCH`, a lost `done()` reply, `stop()` racing a queued `done()`, loss detection behind a
//! stuck extension or a starved pool, and the smaller ones. Every test here failed on the code
//! before its fix.

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::{ErrorKind, Event};
use common::*;
use tokio_stream::StreamExt;

/// Defect 1: a user whose ACL refuses `WATCH` must not run unguarded transactions. The refusal
/// is a non-retryable `Permission` error naming the command, and nothing is written.
#[tokio::test]
async fn a_refused_watch_is_a_permission_error_and_nothing_is_written() {
    let server = server();
    let mut admin = raw(&server).await;
    run_cmds(
        &mut admin,
        &[cmd(&[
            "ACL", "SETUSER", "nowatch", "on", ">nw-pw", "~*", "&*", "+@all", "-watch",
        ])],
    )
    .await;
    let client = baton::Client::connect(server.url_for("nowatch", "nw-pw"))
        .await
        .expect("connect");
    let mut w = client
        .failover()
        .start(job("refused-watch").build().unwrap());
    let events = until_end(&mut w, WAKE).await;
    match events.last() {
        Some(Event::Error {
            kind,
            message,
            retryable,
            ..
        }) => {
            assert_eq!(*kind, ErrorKind::Permission, "{events:?}");
            assert!(!retryable, "{events:?}");
            assert!(message.contains("WATCH"), "names the command: {message}");
        }
        other => panic!("expected a terminal Permission error, got {other:?} in {events:?}"),
    }
    assert!(
        !events.iter().any(|e| matches!(e, Event::Acquired(_))),
        "{events:?}"
    );
    for key in [
        state_key("refused-watch"),
        lease_key("refused-watch"),
        fence_key("refused-watch"),
    ] {
        assert_eq!(get(&mut admin, &key).await, None, "{key} was written");
    }
    // The operator tool's transaction is guarded the same way.
    let err = client
        .failover()
        .fail_attempt("refused-watch", &baton::Expected::Any, "test")
        .await
        .expect_err("fail_attempt with WATCH refused");
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    assert!(err.to_string().contains("WATCH"), "{err}");
}

/// Installs a before-EXEC hook that, the first time the transition `what` runs, kills the
/// dedicated connection it is about to send its `EXEC` on (so the request is lost, unapplied,
/// and the worker cannot tell) and then runs `cmds` as another worker would.
fn lose_exec_then(client: &baton::Client, url: String, what: &'static str, cmds: Vec<Vec<String>>) {
    once_before_exec(client, what, move || {
        let (url, cmds) = (url.clone(), cmds.clone());
        async move {
            let mut c = raw_at(&url).await;
            // The transition's connection is the test user's one whose last command was the
            // observation's TIME (WATCH + reads, just answered).
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut c)
                .await
                .unwrap();
            let ids: Vec<String> = list
                .lines()
                .filter(|l| l.contains(&format!("user={TEST_USER} ")) && l.contains(" cmd=time "))
                .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
                .map(str::to_string)
                .collect();
            assert_eq!(ids.len(), 1, "one transition in flight: {list}");
            run_cmds(&mut c, &[cmd(&["CLIENT", "KILL", "ID", &ids[0]])]).await;
            run_cmds(&mut c, &cmds).await;
        }
    });
}

/// Defect 2: H's `DONE` is lost; a backup B takes the next attempt and completes the job. When H
/// reads back `DONE`, the fence (B's, higher than H's) shows the completion was not H's:
/// `done()` says `LeaseLost`, never success.
#[tokio::test]
async fn a_lost_done_reply_does_not_claim_a_later_attempts_completion() {
    let server = server();
    let client = client(&server).await;
    let mut w = client.failover().start(job("lost-done").build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    let theirs = (a.fencing_token + 1000).to_string();
    // What B does while H's request is lost: its grant of attempt 2 (the lease ran out), then
    // its DONE.
    lose_exec_then(
        &client,
        server.url(),
        "finish",
        vec![
            cmd(&["DEL", &lease_key("lost-done")]),
            cmd(&["SET", &state_key("lost-done"), "2"]),
            cmd(&["SET", &fence_key("lost-done"), &theirs]),
            cmd(&["SET", &state_key("lost-done"), "DONE"]),
        ],
    );
    let err = a.done().await.expect_err("H did not complete the job");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    let events = until_end(&mut w, WAKE).await;
    assert!(
        matches!(events.last(), Some(Event::LeaseLost { attempt: 1, .. })),
        "{events:?}"
    );
}

/// Defect 2, no evidence: the job reads `DONE` but the fence is gone, so nothing tells whose
/// `DONE` it is. `done()` returns the non-retryable `OutcomeUnknown`, the stream ends with it,
/// and `run()` returns it as `Err`.
#[tokio::test]
async fn a_lost_done_reply_without_evidence_is_outcome_unknown() {
    let server = server();
    let client = client(&server).await;
    let ruin = |job: &str| {
        vec![
            cmd(&["DEL", &lease_key(job)]),
            cmd(&["DEL", &fence_key(job)]),
            cmd(&["SET", &state_key(job), "DONE"]),
        ]
    };
    let mut w = client
        .failover()
        .start(job("unknown-done").build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    lose_exec_then(&client, server.url(), "finish", ruin("unknown-done"));
    let err = a.done().await.expect_err("no evidence either way");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(!err.is_retryable());
    let events = until_end(&mut w, WAKE).await;
    assert!(
        matches!(
            events.last(),
            Some(Event::Error {
                kind: ErrorKind::OutcomeUnknown,
                retryable: false,
                ..
            })
        ),
        "{events:?}"
    );
    // The closure form.
    lose_exec_then(&client, server.url(), "finish", ruin("unknown-run"));
    // The work's success is the user's value, so it comes back inside `Ok`, with the kind.
    let out = client
        .failover()
        .run(job("unknown-run").build().unwrap(), |_| async {
            Ok::<_, std::io::Error>(())
        })
        .await
        .expect("run() returns the value with OutcomeUnknown inside Ok");
    let baton::RunOutcome::DoneUnconfirmed {
        kind, value: (), ..
    } = out
    else {
        panic!("expected DoneUnconfirmed, got {out:?}");
    };
    assert_eq!(kind, ErrorKind::OutcomeUnknown, "{out:?}");
}

/// Defect 3: a `done()` queued at the same instant as `stop()` is served first: the finished
/// work is recorded, not released for a backup to run again. (The test runtime has one thread,
/// so the worker task cannot run between the two calls.)
#[tokio::test]
async fn a_done_queued_before_stop_is_served() {
    let server = server();
    let client = client(&server).await;
    let mut w = client.failover().start(job("stop-race").build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    let done = a.done();
    tokio::pin!(done);
    tokio::select! {
        biased;
        _ = &mut done => panic!("done() finished without the worker task running"),
        _ = std::future::ready(()) => {}
    }
    w.stop();
    done.await.expect("the queued done() is served");
    let events = until_end(&mut w, WAKE).await;
    assert!(
        matches!(events.last(), Some(Event::Completed { attempt: Some(1) })),
        "{events:?}"
    );
    let mut admin = raw(&server).await;
    assert_eq!(
        get(&mut admin, &state_key("stop-race")).await.as_deref(),
        Some("DONE")
    );
}

/// Waits until the lease's expiry moves (an extension was just confirmed), then returns the new
/// `PEXPIRETIME` (ms, Unix time). The next extension is a keepalive interval away.
async fn right_after_an_extension(admin: &mut common::Raw, job: &str) -> i64 {
    let read = |c: &mut common::Raw| {
        let key = lease_key(job);
        let mut c = c.clone();
        async move {
            redis::cmd("PEXPIRETIME")
                .arg(key)
                .query_async::<i64>(&mut c)
                .await
                .unwrap()
        }
    };
    let first = read(admin).await;
    let deadline = tokio::time::Instant::now() + WAKE;
    loop {
        let now = read(admin).await;
        if now != first {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "no extension");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A keepalive holder (3 s lease) on a client whose response timeout (2.5 s) outlasts the
/// lease's remainder; Redis is frozen (SIGSTOP) right after one of its extensions. Returns the
/// client, the worker, its attempt and the lease's `PEXPIRETIME` read just before the freeze.
async fn frozen_right_after_an_extension(
    server: &baton::testing::RedisServer,
    key: &str,
) -> (baton::Client, baton::Worker, baton::Acquired, i64) {
    let client = baton::Client::builder(server.url_for(TEST_USER, TEST_PASSWORD))
        .response_timeout(Duration::from_millis(2500))
        .connect()
        .await
        .unwrap();
    let cfg = job(key)
        .lease(Duration::from_secs(3))
        .watchdog(true)
        .build()
        .unwrap();
    let mut w = client.failover().start(cfg);
    let a = acquired(&mut w, WAKE).await;
    let mut admin = raw(server).await;
    let expires = right_after_an_extension(&mut admin, key).await;
    server.pause().unwrap();
    (client, w, a, expires)
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Defect 4: with Redis frozen (SIGSTOP) the extension in flight hangs; `LeaseLost` must still
/// come by the lease deadline (at the latest the lease's `PEXPIRETIME` as read just before the
/// freeze), whatever that request is doing. A response timeout longer than the lease's
/// remainder shows the request's own timeout is not what ends the wait.
#[tokio::test]
async fn lease_lost_comes_by_the_lease_deadline_while_redis_is_frozen() {
    let server = server();
    let (_client, mut w, _a, expires) = frozen_right_after_an_extension(&server, "frozen").await;
    let ev = next(&mut w, Duration::from_secs(10)).await;
    let at = unix_ms();
    server.resume().unwrap();
    assert!(matches!(ev, Event::LeaseLost { .. }), "{ev:?}");
    assert!(
        at <= expires + 100,
        "LeaseLost {} ms after the lease's PEXPIRETIME",
        at - expires
    );
}

/// Defect 4, `done()` in flight: frozen Redis, `done()` returns by the lease deadline instead of
/// waiting on (its requests were never answered, so nothing was written: `LeaseLost`).
#[tokio::test]
async fn a_done_in_flight_returns_by_the_lease_deadline_while_redis_is_frozen() {
    let server = server();
    let (_client, _w, a, expires) = frozen_right_after_an_extension(&server, "frozen-done").await;
    let r = tokio::time::timeout(Duration::from_secs(10), a.done()).await;
    let at = unix_ms();
    server.resume().unwrap();
    let err = r
        .expect("done() returned")
        .expect_err("nothing was recorded");
    assert!(
        matches!(err.kind(), ErrorKind::LeaseLost | ErrorKind::OutcomeUnknown),
        "{err}"
    );
    assert!(
        at <= expires + 100,
        "done() returned {} ms after the lease's PEXPIRETIME",
        at - expires
    );
}

/// Defect 4, starved pool: every dedicated connection is taken by a transition that hangs (here
/// one connection, held inside another job's grant). A holder's keepalive must not wait for the
/// pool: the lease stays alive and nothing is reported lost.
#[tokio::test]
async fn a_starved_pool_does_not_stop_a_holders_keepalive() {
    let server = server();
    let client = baton::Client::builder(server.url_for(TEST_USER, TEST_PASSWORD))
        .pool_size(1)
        .connect()
        .await
        .unwrap();
    let lease = Duration::from_millis(900);
    let cfg = job("kept").lease(lease).watchdog(true).build().unwrap();
    let mut holder = client.failover().start(cfg);
    let _a = acquired(&mut holder, WAKE).await;
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    baton::__seam::set_before_exec_hook(
        &client,
        Some(std::sync::Arc::new(move |name| {
            let gate = gate.clone();
            Box::pin(async move {
                if name == "grant" {
                    gate.notified().await;
                }
            })
        })),
    );
    // This worker's grant takes the only dedicated connection and hangs in the hook.
    let mut starving = client.failover().start(job("starving").build().unwrap());
    tokio::time::sleep(lease * 3).await;
    let mut admin = raw(&server).await;
    let left = pttl(&mut admin, &lease_key("kept")).await;
    assert!(
        left > 0,
        "the lease ran out while the pool was starved: {left}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(10), holder.next())
            .await
            .map_or(true, |e| !matches!(e, Some(Event::LeaseLost { .. }))),
        "the holder lost its lease"
    );
    release.notify_one();
    let _ = acquired(&mut starving, WAKE).await;
}

/// Defect 6: releasing and exhausting refresh the fence's TTL with the state's (DESIGN.md §3),
/// so the next grant builds on it for the whole retention.
#[tokio::test]
async fn release_and_exhaustion_refresh_the_fence_ttl() {
    let server = server();
    let client = client(&server).await;
    let mut admin = raw(&server).await;
    // A failed attempt (a backup takes over later).
    let mut w = client
        .failover()
        .start(job("fence-ttl").max_attempts(3).build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    run_cmds(
        &mut admin,
        &[cmd(&["PEXPIRE", &fence_key("fence-ttl"), "100000"])],
    )
    .await;
    a.fail("test").await.unwrap();
    assert!(
        pttl(&mut admin, &fence_key("fence-ttl")).await > 3_600_000,
        "fail() refreshes the fence"
    );
    // The last attempt's lease runs out; a backup writes EXHAUSTED.
    let mut w = client
        .failover()
        .start(job("fence-ex").max_attempts(1).build().unwrap());
    let _a = acquired(&mut w, WAKE).await;
    run_cmds(
        &mut admin,
        &[
            cmd(&["PEXPIRE", &fence_key("fence-ex"), "100000"]),
            cmd(&["DEL", &lease_key("fence-ex")]),
        ],
    )
    .await;
    let mut b = client
        .failover()
        .start(job("fence-ex").max_attempts(1).build().unwrap());
    let events = until_end(&mut b, WAKE).await;
    assert!(
        matches!(events.last(), Some(Event::Exhausted { .. })),
        "{events:?}"
    );
    assert!(
        pttl(&mut admin, &fence_key("fence-ex")).await > 3_600_000,
        "writing EXHAUSTED refreshes the fence"
    );
}

/// Loss is observable without the event stream: the handle's `lost()` future and its
/// cancellation token fire when another worker takes the attempt over.
#[tokio::test]
async fn the_attempt_handle_reports_loss_without_the_event_stream() {
    let server = server();
    let client = client(&server).await;
    let cfg = job("handle-loss").watchdog(true).build().unwrap();
    let mut w = client.failover().start(cfg);
    let a = acquired(&mut w, WAKE).await;
    let token = a.handle.lost_token();
    assert!(!token.is_cancelled() && !a.is_lost());
    let mut admin = raw(&server).await;
    run_cmds(
        &mut admin,
        &[
            cmd(&["SET", &state_key("handle-loss"), "2"]),
            cmd(&[
                "SET",
                &lease_key("handle-loss"),
                "ffffffffffffffffffffffffffffffff other:1",
                "PX",
                "10000",
            ]),
            cmd(&["PUBLISH", "baton:{handle-loss}:events", "acquired:2"]),
        ],
    )
    .await;
    let why = tokio::time::timeout(WAKE, a.handle.lost_error())
        .await
        .expect("lost_error() resolves");
    assert_eq!(why.kind(), ErrorKind::LeaseLost, "{why}");
    assert!(token.is_cancelled() && a.handle.is_lost());
    // The loss reason is the one `lost_error()` reports.
    let reason = a.loss_reason().expect("a reason once lost");
    assert!(why.to_string().contains(&reason), "{why} / {reason}");
    drop(w);
}

/// `JobWatch` is a `Stream` of changes that ends with the job.
#[tokio::test]
async fn a_job_watch_is_a_stream_that_ends_with_the_job() {
    let server = server();
    let client = client(&server).await;
    let mut watch = client.failover().watch_job("watched").await.unwrap();
    let mut w = client.failover().start(job("watched").build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    a.done().await.unwrap();
    let mut changes = Vec::new();
    while let Some(change) = tokio::time::timeout(WAKE, StreamExt::next(&mut watch))
        .await
        .expect("a change or the end")
    {
        changes.push(change.unwrap());
    }
    // Each change carries the status read after its message, so the stream may end at the
    // first message whose status already shows the job DONE.
    assert_eq!(changes[0].message, "acquired:1", "{changes:?}");
    let last = changes.last().unwrap();
    assert!(last.status.is_finished(), "{changes:?}");
    assert_eq!(last.status.state, baton::JobState::Done, "{changes:?}");
}

async fn connections_received(admin: &mut common::Raw) -> u64 {
    info_field(admin, "stats", "total_connections_received").await
}

/// Defect 6: a request that times out drops its own connection, but not the pool's idle ones (a
/// slow reply says nothing about them; only a connection error does). Two grants are held in
/// the hook together so the pool has two connections; one `done()` then times out while Redis
/// is paused, and the other transitions reuse the idle connection instead of opening new ones.
#[tokio::test]
async fn a_timeout_does_not_empty_the_pool() {
    let server = server();
    let client = baton::Client::builder(server.url_for(TEST_USER, TEST_PASSWORD))
        .pool_size(2)
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = server.pid().expect("a running server");
    let (b, p) = (barrier.clone(), paused.clone());
    baton::__seam::set_before_exec_hook(
        &client,
        Some(std::sync::Arc::new(move |name| {
            let (b, p) = (b.clone(), p.clone());
            Box::pin(async move {
                if name == "grant" {
                    b.wait().await;
                } else if name == "finish" && !p.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    // Freeze Redis for twice the response timeout: this EXEC times out.
                    // SAFETY: kill(2) with our own child's PID; no memory is involved.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(600)).await;
                        // SAFETY: as above.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
                    });
                }
            })
        })),
    );
    let mut a = client.failover().start(job("pool-a").build().unwrap());
    let mut b = client.failover().start(job("pool-b").build().unwrap());
    let (ga, gb) = (acquired(&mut a, WAKE).await, acquired(&mut b, WAKE).await);
    let mut admin = raw(&server).await;
    let before = connections_received(&mut admin).await;
    let _ = ga.done().await;
    gb.done().await.unwrap();
    let after = connections_received(&mut admin).await;
    assert_eq!(
        after - before,
        0,
        "transitions after a timeout opened new connections: the idle ones were dropped"
    );
}

/// A holder without keepalive whose pub/sub link dropped while another worker took its attempt
/// over (the announcement was lost with the link) learns it when the link comes back, not only
/// at its `done()`. (Found as a flaky catalogue row 32: the takeover raced the resubscription.)
#[tokio::test]
async fn a_holder_rechecks_its_attempt_after_the_pubsub_link_comes_back() {
    let server = server();
    let client = client(&server).await;
    let mut w = client.failover().start(job("relink").build().unwrap());
    let _a = acquired(&mut w, WAKE).await;
    let mut admin = raw(&server).await;
    // Wait until the holder's subscription is live on the server.
    let channel = "baton:{relink}:events";
    let deadline = tokio::time::Instant::now() + WAKE;
    loop {
        let v: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut admin)
            .await
            .unwrap();
        if v.get(1) == Some(&redis::Value::Int(1)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no subscription");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Another worker's grant of attempt 2, whose announcement is lost; then the link dies.
    run_cmds(
        &mut admin,
        &[
            cmd(&["SET", &state_key("relink"), "2"]),
            cmd(&[
                "SET",
                &lease_key("relink"),
                "ffffffffffffffffffffffffffffffff other:1",
                "PX",
                "10000",
            ]),
            cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]),
        ],
    )
    .await;
    let ev = next(&mut w, WAKE).await;
    assert!(matches!(ev, Event::LeaseLost { attempt: 1, .. }), "{ev:?}");
}
