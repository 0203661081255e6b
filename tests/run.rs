//! The closure form `Failover::run`.
#![cfg(feature = "testing")]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::{FailoverConfig, RunOutcome};
use common::*;

#[tokio::test]
async fn run_records_done_and_later_runs_do_not_repeat_the_work() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let out = client
        .failover()
        .run("nightly", move |attempt| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                assert_eq!(attempt.attempt, 1);
                assert!(attempt.fencing_token > 0);
                Ok::<_, String>(attempt.attempt * 10)
            }
        })
        .await
        .unwrap();
    assert_eq!(out, RunOutcome::Done(10));
    // Serializable like every event, tagged `outcome`, the work's value as a field.
    assert_eq!(
        serde_json::to_value(&out).unwrap(),
        serde_json::json!({"outcome": "Done", "value": 10})
    );
    assert_eq!(
        get(&mut conn, &state_key("nightly")).await.as_deref(),
        Some("DONE")
    );
    let c = calls.clone();
    let again = client
        .failover()
        .run("nightly", move |_| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(0)
            }
        })
        .await
        .unwrap();
    assert_eq!(again, RunOutcome::CompletedElsewhere);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_error_or_a_panic_fails_the_attempt_and_a_backup_takes_over() {
    let srv = server();
    let client = client(&srv).await;
    let cfg = job("flaky").max_attempts(3).build().unwrap();
    let first = client
        .failover()
        .run(cfg.clone(), |_| async { Err::<(), _>("disk full") })
        .await
        .unwrap();
    assert_eq!(
        first,
        RunOutcome::Failed {
            attempt: 1,
            reason: "disk full".into(),
            panicked: false,
            // The work's own error value is kept, not only its text.
            error: Some("disk full"),
        }
    );
    let second = client
        .failover()
        .run(cfg.clone(), |_| async {
            if true {
                panic!("boom");
            }
            Ok::<(), String>(())
        })
        .await
        .unwrap();
    match second {
        RunOutcome::Failed {
            attempt: 2,
            reason,
            panicked: true,
            error: None,
        } => assert!(reason.contains("boom"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let third = client
        .failover()
        .run(cfg.clone(), |a| async move { Ok::<_, String>(a.last) })
        .await
        .unwrap();
    assert_eq!(third, RunOutcome::Done(true));
}

#[tokio::test]
async fn the_last_failure_ends_exhausted() {
    let srv = server();
    let client = client(&srv).await;
    let cfg = job("once").max_attempts(1).build().unwrap();
    let out = client
        .failover()
        .run(cfg, |_| async { Err::<(), _>("no") })
        .await
        .unwrap();
    assert_eq!(out, RunOutcome::Exhausted { attempts: Some(1) });
}

#[tokio::test]
async fn losing_the_lease_cancels_the_work() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let started = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (s, f) = (started.clone(), finished.clone());
    let cfg = FailoverConfig::builder("steal")
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .failover()
                .run(cfg, move |_| {
                    let (s, f) = (s.clone(), f.clone());
                    async move {
                        s.store(true, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        f.store(true, Ordering::SeqCst);
                        Ok::<_, String>(())
                    }
                })
                .await
        }
    });
    while !started.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Someone else's token replaces ours: the next extension finds it.
    let _: () = redis::cmd("SET")
        .arg(lease_key("steal"))
        .arg("ffffffffffffffffffffffffffffffff intruder")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = tokio::time::timeout(WAKE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(out, RunOutcome::LeaseLost { attempt: 1, .. }),
        "{out:?}"
    );
    assert!(!finished.load(Ordering::SeqCst));
}

#[tokio::test]
async fn run_rejects_an_invalid_job_name() {
    let srv = server();
    let client = client(&srv).await;
    let err = client
        .failover()
        .run("bad{name}", |_| async { Ok::<_, String>(()) })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), baton::ErrorKind::Config);
}

#[tokio::test]
async fn a_success_whose_done_is_refused_keeps_the_works_result() {
    // The work succeeds, but another worker took the attempt over just before its DONE: the
    // outcome says so and still carries the work's value.
    let srv = server();
    let client = client(&srv).await;
    inject_before_exec(
        &client,
        srv.url(),
        "finish",
        vec![
            cmd(&["SET", &state_key("taken"), "2"]),
            cmd(&[
                "SET",
                &lease_key("taken"),
                "ffffffffffffffffffffffffffffffff other:1",
                "PX",
                "10000",
            ]),
        ],
    );
    let out = client
        .failover()
        .run(job("taken").build().unwrap(), |_| async {
            Ok::<_, String>("the report")
        })
        .await
        .unwrap();
    match out {
        RunOutcome::NotRecorded {
            attempt: 1, value, ..
        } => assert_eq!(value, "the report"),
        other => panic!("{other:?}"),
    }
}
