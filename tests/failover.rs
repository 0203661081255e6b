//! The failover coordinator against a real, private redis-server: grants, waits, handovers,
//! exhaustion, stale holders and the races the WATCH protects.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::prelude::*;
use baton::{Event, FailoverConfig};
use common::*;
use tokio::time::Instant;

scenario! {
    postgres:
    #[tokio::test]
    async fn absent_key_first_worker_acquires_and_the_others_are_locked_once() {
        let srv = server();
        let client = client(&srv).await;
        let mut a = client.failover().start(job("j").build().unwrap());
        let got = acquired(&mut a, WAKE).await;
        assert_eq!(got.attempt, 1);
        assert!(!got.last);
        let before = stored(&srv, "j").await;
        assert_eq!(before.state.as_deref(), Some("1"));
        assert_eq!(before.fence, Some(got.fencing_token.to_string()));
        assert!(before.lease.is_some());

        let mut backups: Vec<_> = (0..3)
            .map(|_| client.failover().start(job("j").build().unwrap()))
            .collect();
        for b in &mut backups {
            match next(b, WAKE).await {
                Event::Locked {
                    attempt,
                    max_attempts,
                    lease_remaining_ms,
                } => {
                    assert_eq!((attempt, max_attempts), (1, 5));
                    assert!(lease_remaining_ms.is_some_and(|ms| ms <= 10_000));
                }
                other => panic!("expected Locked, got {other:?}"),
            }
        }
        // The backups wrote nothing.
        let after = stored(&srv, "j").await;
        assert_eq!(
            (after.state, after.lease, after.fence),
            (before.state, before.lease, before.fence)
        );

        got.done().await.unwrap();
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Completed { attempt: Some(1) }]
        ));
        for b in &mut backups {
            let evs = until_end(b, WAKE).await;
            // Locked was reported exactly once (it was read above), then Completed.
            assert!(
                matches!(evs.as_slice(), [Event::Completed { attempt: None }]),
                "{evs:?}"
            );
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn done_stores_done_with_retention_and_ends_every_backup_without_waiting_the_lease() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = job("d")
            .retention(Duration::from_secs(3600))
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        let mut c = client.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        assert!(matches!(next(&mut c, WAKE).await, Event::Locked { .. }));
        let t0 = Instant::now();
        got.done().await.unwrap();
        for w in [&mut b, &mut c] {
            let evs = until_end(w, WAKE).await;
            assert!(matches!(
                evs.as_slice(),
                [Event::Completed { attempt: None }]
            ));
        }
        assert!(t0.elapsed() < WAKE, "backups waited out the lease");
        let after = stored(&srv, "d").await;
        assert_eq!(after.state.as_deref(), Some("DONE"));
        let ttl = after.state_ttl_ms;
        assert!(ttl > 3_500_000 && ttl <= 3_600_000, "state TTL {ttl}");
        assert_eq!(after.lease_ttl_ms, -2, "lease deleted");
        // A worker started later ends Completed without running.
        let mut late = client.failover().start(cfg);
        let evs = until_end(&mut late, WAKE).await;
        assert!(
            matches!(evs.as_slice(), [Event::Completed { attempt: None }]),
            "{evs:?}"
        );
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn fail_hands_the_job_to_a_backup_at_once() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = job("f").build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        let mut c = client.failover().start(cfg.clone());
        assert!(matches!(
            next(&mut b, WAKE).await,
            Event::Locked { attempt: 1, .. }
        ));
        assert!(matches!(
            next(&mut c, WAKE).await,
            Event::Locked { attempt: 1, .. }
        ));
        let t0 = Instant::now();
        got.fail("smtp said no").await.unwrap();
        let evs = until_end(&mut a, WAKE).await;
        assert!(
            matches!(evs.as_slice(), [Event::Failed { attempt: 1, reason }] if reason == "smtp said no"),
            "{evs:?}"
        );
        // Exactly one backup wins attempt 2; the other sees it locked.
        let (eb, ec) = (next(&mut b, WAKE).await, next(&mut c, WAKE).await);
        assert!(t0.elapsed() < WAKE);
        let (winner, loser, mut wstream, mut lstream) = match (eb, ec) {
            (Event::Acquired(x), other) => (x, other, b, c),
            (other, Event::Acquired(x)) => (x, other, c, b),
            other => panic!("nobody took over: {other:?}"),
        };
        assert_eq!(winner.attempt, 2);
        assert!(
            matches!(loser, Event::Locked { attempt: 2, .. }),
            "{loser:?}"
        );
        let failure = stored(&srv, "f").await.failure;
        assert!(failure.unwrap().contains("smtp said no"));
        winner.done().await.unwrap();
        assert!(matches!(
            until_end(&mut wstream, WAKE).await.as_slice(),
            [Event::Completed { attempt: Some(2) }]
        ));
        assert!(matches!(
            until_end(&mut lstream, WAKE).await.as_slice(),
            [Event::Completed { attempt: None }]
        ));
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_failure_published_while_the_backup_subscribes_is_not_missed() {
        // The backup reads the state, then subscribes; a `failed` published in between is never
        // delivered to it. Racing the failure against the backup's start, with a spread of delays,
        // hits that window; every round must still take over well before the 10 s lease runs out.
        let srv = server();
        let client = client(&srv).await;
        for round in 0..20u64 {
            let key = format!("race:{round}");
            let cfg = job(&key).build().unwrap();
            let mut a = client.failover().start(cfg.clone());
            let got = acquired(&mut a, WAKE).await;
            let mut b = client.failover().start(cfg);
            tokio::time::sleep(Duration::from_micros(round * 150)).await;
            let t0 = Instant::now();
            got.fail("x").await.unwrap();
            loop {
                match next(&mut b, WAKE).await {
                    Event::Locked { .. } => continue,
                    Event::Acquired(x) => {
                        assert_eq!(x.attempt, 2);
                        x.done().await.unwrap();
                        break;
                    }
                    other => panic!("round {round}: {other:?}"),
                }
            }
            assert!(t0.elapsed() < WAKE, "round {round} waited out the lease");
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_crashed_holder_is_replaced_once_its_lease_expires_and_not_before() {
        let srv = server();
        let url = srv.url();
        let lease = Duration::from_millis(1500);
        let cfg = FailoverConfig::builder("crash")
            .lease(lease)
            .build()
            .unwrap();
        // The holder runs on its own runtime, which is then dropped: its tasks stop mid-attempt
        // without calling done() or fail(), as in a crash.
        let cfg2 = cfg.clone();
        let fence = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let fence = rt.block_on(async move {
                let client = baton::Client::connect(url).await.unwrap();
                let mut w = client.failover().start(cfg2);
                let a = acquired(&mut w, WAKE).await;
                let f = a.fencing_token;
                // Keep the handle alive past the runtime so nothing fails the attempt politely.
                std::mem::forget(a);
                std::mem::forget(w);
                f
            });
            drop(rt);
            fence
        })
        .join()
        .unwrap();
        let crashed_at = Instant::now();
        let client = client(&srv).await;
        let mut b = client.failover().start(cfg);
        assert!(matches!(
            next(&mut b, WAKE).await,
            Event::Locked { attempt: 1, .. }
        ));
        let got = acquired(&mut b, lease * 3).await;
        let waited = crashed_at.elapsed();
        assert_eq!(got.attempt, 2);
        assert!(got.fencing_token > fence);
        // Not before the lease ran out (measured from after the holder's grant, so this errs low).
        assert!(
            waited >= lease - Duration::from_millis(200),
            "took over after {waited:?}"
        );
        got.done().await.unwrap();
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn the_handle_shows_the_deadline_each_confirmed_extension_moves() {
        let srv = server();
        let client = client(&srv).await;
        let lease = Duration::from_millis(600);
        let cfg = FailoverConfig::builder("moving")
            .lease(lease)
            .watchdog(true)
            .build()
            .unwrap();
        let mut w = client.failover().start(cfg);
        let got = acquired(&mut w, WAKE).await;
        let handle = got.handle.clone();
        use baton::HeldLease;
        assert_eq!(handle.lease_deadline(), got.grant_deadline());
        assert_eq!(got.lease_deadline(), got.grant_deadline());
        // Past the grant's own deadline the attempt is still held: keepalive extended it, and
        // the handle's deadline moved on with the extensions, always ahead of now.
        tokio::time::sleep_until(got.grant_deadline() + lease).await;
        let moved = handle.lease_deadline();
        assert!(moved > got.grant_deadline() + lease, "{moved:?}");
        assert_eq!(got.lease_deadline(), moved, "the event's deadline is the handle's");
        assert!(moved > Instant::now());
        got.done().await.unwrap();
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn k_backups_racing_for_one_count_produce_exactly_one_acquired() {
        let srv = server();
        let client = client(&srv).await;
        for round in 0..50 {
            let key = format!("k8:{round}");
            let cfg = job(&key).build().unwrap();
            // Attempt 1 failed (its lease is gone): eight backups race for attempt 2.
            let mut first = client.failover().start(cfg.clone());
            acquired(&mut first, WAKE).await.fail("x").await.unwrap();
            until_end(&mut first, WAKE).await;
            let mut workers: Vec<_> = (0..8).map(|_| client.failover().start(cfg.clone())).collect();
            let mut grants = 0;
            let mut handles = Vec::new();
            for w in &mut workers {
                match next(w, WAKE).await {
                    Event::Acquired(a) => {
                        assert_eq!(a.attempt, 2);
                        grants += 1;
                        handles.push(a);
                    }
                    Event::Locked { attempt: 2, .. } => {}
                    other => panic!("round {round}: {other:?}"),
                }
            }
            assert_eq!(grants, 1, "round {round}");
            for a in handles {
                a.done().await.unwrap();
            }
            for w in &mut workers {
                let evs = until_end(w, WAKE).await;
                assert!(
                    evs.iter().all(|e| !matches!(e, Event::Acquired(_))),
                    "second grant in round {round}: {evs:?}"
                );
            }
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn attempts_never_exceed_max_and_the_job_ends_exhausted() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = job("ex").max_attempts(3).build().unwrap();
        let mut workers: Vec<_> = (0..5).map(|_| client.failover().start(cfg.clone())).collect();
        let mut seen_attempts = Vec::new();
        let mut ends = Vec::new();
        // Every worker that wins an attempt fails it.
        let mut tasks = Vec::new();
        for mut w in workers.drain(..) {
            tasks.push(tokio::spawn(async move {
                let mut attempts = Vec::new();
                loop {
                    let ev = next(&mut w, Duration::from_secs(20)).await;
                    match ev {
                        Event::Acquired(a) => {
                            attempts.push((a.attempt, a.last));
                            a.fail("always fails").await.unwrap();
                        }
                        ev if ev.is_terminal() => return (attempts, name(&ev)),
                        _ => {}
                    }
                }
            }));
        }
        for t in tasks {
            let (a, end) = t.await.unwrap();
            seen_attempts.extend(a);
            ends.push(end);
        }
        seen_attempts.sort();
        assert_eq!(seen_attempts, vec![(1, false), (2, false), (3, true)]);
        ends.sort();
        assert_eq!(
            ends,
            vec!["Exhausted", "Exhausted", "Exhausted", "Failed", "Failed"]
        );
        assert_eq!(
            stored(&srv, "ex").await.state.as_deref(),
            Some("EXHAUSTED")
        );
        // A later worker ends Exhausted too, while the state is retained.
        let mut late = client.failover().start(cfg);
        let evs = until_end(&mut late, WAKE).await;
        assert!(
            matches!(evs.as_slice(), [Event::Exhausted { .. }]),
            "{evs:?}"
        );
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_last_holder_finishing_after_exhaustion_gets_lease_lost() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("late-ex")
            .lease(Duration::from_millis(300))
            .max_attempts(1)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        assert!(got.last);
        let mut b = client.failover().start(cfg);
        // The lease runs out; the backup sees the last attempt failed and writes EXHAUSTED.
        let evs = until_end(&mut b, WAKE).await;
        assert!(
            matches!(evs.last(), Some(Event::Exhausted { attempts: Some(1) })),
            "{evs:?}"
        );
        let err = got.done().await.unwrap_err();
        assert!(
            matches!(err, baton::Error::LeaseLost { attempt: 1, .. }),
            "{err}"
        );
        assert_eq!(
            stored(&srv, "late-ex").await.state.as_deref(),
            Some("EXHAUSTED")
        );
        let evs = until_end(&mut a, WAKE).await;
        assert!(
            matches!(evs.last(), Some(Event::LeaseLost { .. })),
            "{evs:?}"
        );
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_stale_holder_cannot_complete_but_a_late_one_nobody_replaced_can() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("stale")
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let old = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        let new = loop {
            match next(&mut b, WAKE).await {
                Event::Acquired(x) => break x,
                Event::Locked { .. } => {}
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(new.attempt, 2);
        let lease_before = stored(&srv, "stale").await.lease;
        let err = old.done().await.unwrap_err();
        assert!(
            matches!(err, baton::Error::LeaseLost { attempt: 1, .. }),
            "{err}"
        );
        let after = stored(&srv, "stale").await;
        assert_eq!(after.state.as_deref(), Some("2"));
        assert_eq!(after.lease, lease_before);
        new.done().await.unwrap();

        // Late, but nobody took over: still a success.
        let mut c = client.failover().start(
            FailoverConfig::builder("late")
                .lease(Duration::from_millis(200))
                .build()
                .unwrap(),
        );
        let got = acquired(&mut c, WAKE).await;
        assert!(matches!(
            next(&mut c, WAKE).await,
            Event::DeadlinePassed { attempt: 1 }
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(stored(&srv, "late").await.lease_ttl_ms, -2, "lease expired");
        got.done().await.unwrap();
        assert_eq!(stored(&srv, "late").await.state.as_deref(), Some("DONE"));
    }
}

scenario! {
    #[tokio::test]
    async fn a_value_written_between_check_and_takeover_aborts_the_takeover() {
        let srv = server();
        let mut conn = raw(&srv).await;
        // Another count: the takeover aborts, re-observes, and the count (with no lease) is taken
        // over properly as the next attempt.
        for (value, expect) in [
            ("4", "Acquired5"),
            ("DONE", "Completed"),
            ("garbage", "Error"),
        ] {
            let client = client(&srv).await;
            let key = format!("between:{value}");
            let _: () = redis::cmd("SET")
                .arg(state_key(&key))
                .arg("1")
                .query_async(&mut conn)
                .await
                .unwrap();
            inject_before_exec(
                &client,
                srv.url(),
                "grant",
                vec![cmd(&["SET", &state_key(&key), value])],
            );
            let mut w = client.failover().start(job(&key).max_attempts(10).build().unwrap());
            let evs = until_end_or_acquired(&mut w).await;
            let got = match evs.last().unwrap() {
                Event::Acquired(a) => format!("Acquired{}", a.attempt),
                other => name(other),
            };
            assert_eq!(got, expect, "{value}: {evs:?}");
            let none_for_two = evs
                .iter()
                .all(|e| !matches!(e, Event::Acquired(a) if a.attempt == 2));
            assert!(none_for_two, "attempt 2 was granted over {value}: {evs:?}");
            if value == "garbage" {
                // Reported, and never overwritten.
                assert_eq!(
                    get(&mut conn, &state_key(&key)).await.as_deref(),
                    Some("garbage")
                );
                if let Some(Event::Error { kind, message, .. }) = evs.last() {
                    assert_eq!(*kind, baton::ErrorKind::CorruptState);
                    assert!(message.contains(&state_key(&key)), "{message}");
                }
            }
        }
    }
}

async fn until_end_or_acquired(w: &mut baton::Worker) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let ev = next(w, WAKE).await;
        let stop = ev.is_terminal() || matches!(ev, Event::Acquired(_));
        out.push(ev);
        if stop {
            return out;
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn rejoin_after_fail_waits_as_a_backup_again() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = job("rejoin")
            .max_attempts(2)
            .rejoin_after_fail(true)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg);
        let first = acquired(&mut a, WAKE).await;
        first.fail("once").await.unwrap();
        // Said by an event that is never dropped, unlike a `Status` line.
        assert!(matches!(
            next(&mut a, WAKE).await,
            Event::Rejoined { attempt: 1, ref reason } if reason == "once"
        ));
        // With nobody else around, the same worker takes attempt 2.
        let second = acquired(&mut a, WAKE).await;
        assert_eq!(second.attempt, 2);
        assert!(second.last);
        second.fail("twice").await.unwrap();
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Exhausted { attempts: Some(2) }]
        ));
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn rejoin_after_fail_waits_as_a_backup_again_after_a_lost_lease() {
        // A lost attempt rejoins too: before, the worker left with `LeaseLost`, and when it was
        // the only worker alive (the backup that took over from it died in turn) the job stayed
        // at attempt n with no lease and nobody to run or exhaust it.
        let srv = server();
        let client = client(&srv).await;
        // A short lease: the holder hears of the loss at its next extension (a third of it).
        let cfg = job("rejoin-lost")
            .lease(Duration::from_millis(900))
            .watchdog(true)
            .max_attempts(2)
            .rejoin_after_fail(true)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let first = acquired(&mut a, WAKE).await;
        // An operator's `baton fail` takes the attempt from under its holder: lost, as a lease
        // taken over or run out is.
        client
            .failover()
            .fail_attempt(cfg.clone(), &baton::Expected::Attempt(1), "hung")
            .await
            .unwrap();
        let ev = next(&mut a, WAKE).await;
        assert!(
            matches!(
                ev,
                Event::Rejoined { attempt: 1, ref reason } if reason.starts_with("lease lost")
            ),
            "{ev:?}"
        );
        // The handle says so too: the loss signal stops the work on it.
        assert!(first.handle.is_lost());
        // Nobody else is around: the same worker takes attempt 2 and finishes the job.
        let second = acquired(&mut a, WAKE).await;
        assert_eq!(second.attempt, 2);
        second.done().await.unwrap();
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Completed { attempt: Some(2) }]
        ));
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn retry_delay_postpones_the_takeover() {
        let srv = server();
        let client = client(&srv).await;
        let delay = Duration::from_millis(400);
        let cfg = job("delay").retry_delay(delay).build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg);
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        let t0 = Instant::now();
        got.fail("x").await.unwrap();
        let x = acquired(&mut b, WAKE).await;
        assert_eq!(x.attempt, 2);
        assert!(t0.elapsed() >= delay, "took over after {:?}", t0.elapsed());
        x.done().await.unwrap();
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn dropping_the_handle_or_the_stream_fails_the_attempt() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = job("drop").build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        drop(got);
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Failed { attempt: 1, .. }]
        ));
        let second = acquired(&mut b, WAKE).await;
        assert_eq!(second.attempt, 2);
        let mut c = client.failover().start(cfg);
        assert!(matches!(
            next(&mut c, WAKE).await,
            Event::Locked { attempt: 2, .. }
        ));
        // Dropping the holder's stream (with the handle inside an unread event or not) releases it.
        drop(b);
        drop(second);
        let third = acquired(&mut c, WAKE).await;
        assert_eq!(third.attempt, 3);
        third.done().await.unwrap();
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn stop_releases_a_held_attempt_and_shutdown_ends_every_worker() {
        let srv = server();
        let client = client(&srv).await;
        let other = common::client(&srv).await;
        let cfg = job("stop").build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = other.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        a.stop();
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Stopped]
        ));
        assert!(matches!(
            got.done().await,
            Err(baton::Error::LeaseLost { .. })
        ));
        let x = acquired(&mut b, WAKE).await;
        assert_eq!(x.attempt, 2);
        // Shutdown of the holder's client releases its attempt too (the handle is kept: a dropped
        // handle would fail the attempt before the shutdown, as a queued command is served first).
        let mut c = client.failover().start(cfg);
        let _x = x;
        let _ = c;
        assert!(other.shutdown(WAKE).await);
        assert!(matches!(
            until_end(&mut b, WAKE).await.last(),
            Some(Event::Stopped)
        ));
        c = client.failover().start(job("stop2").build().unwrap());
        let _held = acquired(&mut c, WAKE).await;
        assert!(client.shutdown(WAKE).await);
        assert!(matches!(
            until_end(&mut c, WAKE).await.last(),
            Some(Event::Stopped)
        ));
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn events_serialize_as_json_lines() {
        let srv = server();
        let client = client(&srv).await;
        let mut a = client.failover().start(job("json").build().unwrap());
        let got = acquired(&mut a, WAKE).await;
        let line = serde_json::to_string(&Event::Acquired(got.clone())).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "Acquired");
        assert_eq!(v["attempt"], 1);
        assert_eq!(v["fencing_token"], got.fencing_token);
        assert!(v.get("handle").is_none());
        got.done().await.unwrap();
        let end = until_end(&mut a, WAKE).await;
        assert_eq!(
            serde_json::to_string(&end[0]).unwrap(),
            r#"{"event":"Completed","attempt":1}"#
        );
    }
}
