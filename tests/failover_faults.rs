//! Keepalive, deadlines and Redis restarts, against a real private redis-server.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::{Event, FailoverConfig};
use common::*;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(1);

scenario! {
    postgres:
    #[tokio::test]
    async fn watchdog_holder_working_three_leases_is_never_overlapped() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("ka")
            .lease(LEASE)
            .watchdog(true)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg);
        assert!(matches!(
            next(&mut b, WAKE).await,
            Event::Locked { attempt: 1, .. }
        ));
        // Work for 3 × the lease; the backup must not take over meanwhile.
        let work = tokio::time::sleep(LEASE * 3);
        tokio::pin!(work);
        loop {
            tokio::select! {
                _ = &mut work => break,
                ev = next(&mut b, LEASE * 4) => panic!("backup saw {ev:?} while the holder worked"),
                ev = next(&mut a, LEASE * 4) => match ev {
                    Event::Error { retryable: true, .. } => {}
                    other => panic!("holder saw {other:?}"),
                },
            }
        }
        got.done().await.unwrap();
        assert!(matches!(
            until_end(&mut a, WAKE).await.as_slice(),
            [Event::Completed { attempt: Some(1) }]
        ));
        assert!(matches!(
            until_end(&mut b, WAKE).await.as_slice(),
            [Event::Completed { attempt: None }]
        ));
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn max_hold_ends_a_kept_alive_attempt() {
        let srv = server();
        let client = client(&srv).await;
        let max_hold = Duration::from_millis(2500);
        let cfg = FailoverConfig::builder("maxrun")
            .lease(LEASE)
            .watchdog(true)
            .max_hold(Some(max_hold))
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let t0 = Instant::now();
        let mut b = client.failover().start(cfg);
        let evs = until_end(&mut a, Duration::from_secs(10)).await;
        assert!(t0.elapsed() >= max_hold - Duration::from_millis(100));
        assert!(
            matches!(
                evs.as_slice(),
                [
                    Event::DeadlinePassed { attempt: 1 },
                    Event::LeaseLost { attempt: 1, .. }
                ]
            ),
            "{evs:?}"
        );
        // Released at once: the backup takes over without waiting out another lease.
        let x = loop {
            match next(&mut b, WAKE).await {
                Event::Acquired(x) => break x,
                Event::Locked { .. } => {}
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(x.attempt, 2);
        assert!(matches!(
            got.done().await,
            Err(baton::Error::LeaseLost { .. })
        ));
        x.done().await.unwrap();
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn without_the_watchdog_the_holder_hears_its_deadline_before_a_backup_takes_over() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("deadline")
            .lease(LEASE)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg);
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        assert!(matches!(
            next(&mut a, WAKE).await,
            Event::DeadlinePassed { attempt: 1 }
        ));
        // The deadline errs early: the lease has not ended on the server yet (or only just).
        let left = stored(&srv, "deadline").await.lease_ttl_ms;
        assert!(left != -1, "lease lost its TTL");
        let x = acquired(&mut b, WAKE).await;
        assert_eq!(x.attempt, 2);
        // The stale holder learns at once that another worker holds the job.
        let evs = until_end(&mut a, WAKE).await;
        assert!(
            matches!(evs.as_slice(), [Event::LeaseLost { attempt: 1, .. }]),
            "{evs:?}"
        );
        assert!(matches!(
            got.done().await,
            Err(baton::Error::LeaseLost { .. })
        ));
        x.done().await.unwrap();
    }
}

// Single server only: kills and restarts THE server (the same port, its AOF replayed).
scenario! {
    single:
    #[tokio::test]
    async fn redis_restarted_with_aof_workers_report_errors_reconnect_and_carry_on() {
        let mut srv = durable_server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("restart")
            .lease(Duration::from_secs(3))
            .watchdog(true)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let got = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        srv.kill();
        // Let the holder's keepalive hit the outage.
        let mut errors = 0;
        let outage = Instant::now();
        while outage.elapsed() < Duration::from_millis(1500) {
            if let Ok(ev) = tokio::time::timeout(Duration::from_millis(100), next(&mut a, WAKE)).await {
                match ev {
                    Event::Error {
                        retryable: true, ..
                    } => errors += 1,
                    other => panic!("holder during the outage: {other:?}"),
                }
            }
        }
        srv.restart().unwrap();
        assert!(errors > 0, "no Error event during the outage");
        // The state survived; the holder still holds it and finishes normally.
        got.done().await.unwrap();
        let evs = until_end(&mut a, Duration::from_secs(10)).await;
        assert!(
            matches!(evs.last(), Some(Event::Completed { attempt: Some(1) })),
            "{evs:?}"
        );
        let evs = until_end(&mut b, Duration::from_secs(10)).await;
        assert!(
            matches!(evs.last(), Some(Event::Completed { attempt: None })),
            "{evs:?}"
        );
        // And the client keeps working for new jobs.
        let mut c = client.failover().start(FailoverConfig::builder("after").build().unwrap());
        acquired(&mut c, WAKE).await.done().await.unwrap();
    }
}

scenario! {
    #[tokio::test]
    async fn durability_settings_are_checked() {
        let volatile = server();
        let d = client(&volatile).await.durability().await.unwrap();
        assert!(!d.is_safe());
        assert!(
            d.problems()
                .iter()
                .any(|p| p.starts_with("appendonly is no")),
            "{d:?}"
        );
        let durable = durable_server();
        let d = client(&durable).await.durability().await.unwrap();
        assert!(d.is_safe(), "{:?}", d.problems());
    }
}

// Single server only: kills THE server so that nothing answers (a cluster or Sentinel set fails over instead).
scenario! {
    single:
    #[tokio::test]
    async fn fail_against_an_unreachable_redis_gives_up_when_the_lease_runs_out() {
        // Releasing only matters until the lease runs out by itself (then a backup takes over
        // anyway), so fail() must not keep retrying for the 5 s that done() may spend.
        let mut srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("giveup")
            .lease(Duration::from_secs(1))
            .build()
            .unwrap();
        let mut w = client.failover().start(cfg);
        let got = acquired(&mut w, WAKE).await;
        let t0 = Instant::now();
        srv.kill();
        let res = got.fail("redis is gone").await;
        let took = t0.elapsed();
        assert!(
            res.is_err(),
            "a release against a dead server cannot succeed"
        );
        assert!(
            took < Duration::from_millis(3500),
            "fail() kept retrying for {took:?} past a 1 s lease"
        );
    }
}
