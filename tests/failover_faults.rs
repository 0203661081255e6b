//! Keepalive, deadlines and Redis restarts, against a real private redis-server.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::testing::Persistence;
use baton::{ErrorKind, Event, FailoverConfig};
use common::*;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn keepalive_holder_working_three_leases_is_never_overlapped() {
    let srv = server();
    let client = client(&srv).await;
    let cfg = FailoverConfig::builder("ka")
        .lock_timeout(LEASE)
        .keepalive(true)
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    let mut b = client.start(cfg);
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

#[tokio::test]
async fn max_run_ends_a_kept_alive_attempt() {
    let srv = server();
    let client = client(&srv).await;
    let max_run = Duration::from_millis(2500);
    let cfg = FailoverConfig::builder("maxrun")
        .lock_timeout(LEASE)
        .keepalive(true)
        .max_run(Some(max_run))
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    let t0 = Instant::now();
    let mut b = client.start(cfg);
    let evs = until_end(&mut a, Duration::from_secs(10)).await;
    assert!(t0.elapsed() >= max_run - Duration::from_millis(100));
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

#[tokio::test]
async fn without_keepalive_the_holder_hears_its_deadline_before_a_backup_takes_over() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = FailoverConfig::builder("deadline")
        .lock_timeout(LEASE)
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    let mut b = client.start(cfg);
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    assert!(matches!(
        next(&mut a, WAKE).await,
        Event::DeadlinePassed { attempt: 1 }
    ));
    // The deadline errs early: the lease has not ended on the server yet (or only just).
    let left = pttl(&mut conn, &lease_key("deadline")).await;
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

#[tokio::test]
async fn redis_restarted_with_aof_workers_report_errors_reconnect_and_carry_on() {
    let mut srv = durable_server();
    let client = client(&srv).await;
    let cfg = FailoverConfig::builder("restart")
        .lock_timeout(Duration::from_secs(3))
        .keepalive(true)
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    let mut b = client.start(cfg.clone());
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
    let mut c = client.start(FailoverConfig::builder("after").build().unwrap());
    acquired(&mut c, WAKE).await.done().await.unwrap();
}

#[tokio::test]
async fn redis_restarted_without_persistence_workers_that_saw_the_state_report_state_lost() {
    let mut srv = server();
    let client = client(&srv).await;
    let cfg = FailoverConfig::builder("lost")
        .lock_timeout(Duration::from_secs(10))
        .keepalive(true)
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let _got = acquired(&mut a, WAKE).await;
    let mut b = client.start(cfg);
    assert!(matches!(
        next(&mut b, WAKE).await,
        Event::Locked { attempt: 1, .. }
    ));
    srv.kill();
    srv.restart_with(Persistence::Volatile).unwrap();
    for (who, w) in [("holder", &mut a), ("backup", &mut b)] {
        let evs = until_end(w, Duration::from_secs(15)).await;
        assert!(
            matches!(
                evs.last(),
                Some(Event::Error {
                    kind: ErrorKind::StateLost,
                    retryable: false,
                    ..
                })
            ),
            "{who}: {evs:?}"
        );
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Acquired(_))),
            "{who} re-ran the job"
        );
    }
}

#[tokio::test]
async fn unreachable_redis_is_a_typed_error_not_a_hang() {
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let err = baton::Client::connect(format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_grant_whose_reply_was_lost_is_recognised_as_ours() {
    // Freeze Redis right before the grant's EXEC is sent: the EXEC times out on the client (its
    // outcome unknown), then Redis wakes up and applies it. The worker must find its own token
    // in the lease and take the attempt, instead of waiting out its own lease as a stranger's.
    let srv = server();
    let client = client(&srv).await;
    let pid = srv.pid().unwrap().to_string();
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    client.set_before_exec_hook(Some(std::sync::Arc::new(move |what| {
        let (pid, fired) = (pid.clone(), fired.clone());
        Box::pin(async move {
            if what != "grant" || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let stop = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            assert!(stop.unwrap().success());
            std::thread::spawn(move || {
                // Longer than the 500 ms response timeout.
                std::thread::sleep(Duration::from_millis(1200));
                let _ = std::process::Command::new("kill")
                    .args(["-CONT", &pid])
                    .status();
            });
        })
    })));
    let t0 = Instant::now();
    let mut w = client.start(job("lostreply").build().unwrap());
    let mut errors = 0;
    let got = loop {
        match next(&mut w, WAKE).await {
            Event::Error {
                retryable: true,
                kind,
                ..
            } => {
                assert!(
                    matches!(kind, ErrorKind::Timeout | ErrorKind::Connection),
                    "{kind:?}"
                );
                errors += 1;
            }
            Event::Acquired(a) => break a,
            other => panic!("{other:?}"),
        }
    };
    assert!(errors > 0, "the EXEC did not time out");
    assert_eq!(got.attempt, 1);
    // Well before the 10 s lease it granted itself could have run out.
    assert!(t0.elapsed() < WAKE);
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("lostreply")).await.as_deref(),
        Some("1")
    );
    got.done().await.unwrap();
}

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
