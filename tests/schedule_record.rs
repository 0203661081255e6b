//! The schedule's record on real servers: what workers write on their grants and attempt
//! ends, what readers get back (history, hosts, repair), the pause, and the key layout.
#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, SystemTime};

use baton::{
    AttemptOutcome, Exit, FailoverConfig, RecordChange, RecordOptions, RecordedOutcome, Schedule,
};
use common::*;

const HOUR: Duration = Duration::from_secs(3600);

fn occurrence_config(
    key: &str,
    worker: &str,
    schedule: &Schedule,
    tick: SystemTime,
) -> FailoverConfig {
    let base = FailoverConfig::builder(key)
        .lease(Duration::from_secs(10))
        .max_attempts(3)
        .worker_name(worker)
        .build()
        .unwrap();
    let occ = schedule.occurrence_of_tick(tick).unwrap();
    base.for_occurrence(&occ, None).unwrap().with_record(
        key,
        schedule,
        tick,
        RecordOptions::default().history(5),
    )
}

/// A night with a failed attempt then a takeover by a second worker: both attempts on
/// record, with hosts, server-clock times and exit statuses; hosts seen; the record's TTL.
#[tokio::test]
async fn a_failed_attempt_and_a_takeover_are_both_on_record() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let schedule = Schedule::every(HOUR).unwrap();
    let now = f.server_time("nightly").await.unwrap();
    let tick = schedule.latest_at_or_before(now).unwrap();

    let mut a = f.start(occurrence_config("nightly", "host-a", &schedule, tick));
    let got = acquired(&mut a, Duration::from_secs(5)).await;
    got.handle.set_exit(Exit::Status(3));
    got.handle.fail("PROGRAM exited with 3").await.unwrap();
    let mut b = f.start(occurrence_config("nightly", "host-b", &schedule, tick));
    let got = acquired(&mut b, Duration::from_secs(5)).await;
    assert_eq!(got.attempt, 2);
    got.handle.set_exit(Exit::Status(0));
    got.handle.done().await.unwrap();

    // The record's writes are in the background: wait for the last one.
    let digest = schedule.digest();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let entry = loop {
        let h = f.schedule_history("nightly", digest, 10).await.unwrap();
        if let Some(e) = h.first().filter(|e| {
            e.outcome == RecordedOutcome::Done && e.attempts.iter().all(|a| a.ended.is_some())
        }) {
            break e.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "history: {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(entry.tick, tick);
    assert_eq!(entry.attempts.len(), 2, "{entry:?}");
    let (one, two) = (&entry.attempts[0], &entry.attempts[1]);
    assert_eq!(one.host.as_deref(), Some("host-a"));
    assert_eq!(one.exit, Some(Exit::Status(3)));
    assert_eq!(one.outcome, Some(AttemptOutcome::Failed));
    assert_eq!(one.message.as_deref(), Some("PROGRAM exited with 3"));
    assert_eq!(two.host.as_deref(), Some("host-b"));
    assert_eq!(two.exit, Some(Exit::Status(0)));
    assert_eq!(two.outcome, Some(AttemptOutcome::Done));
    assert!(one.started.unwrap() <= one.ended.unwrap());
    assert!(one.ended.unwrap() <= two.ended.unwrap());

    let records = f.schedule_records("nightly").await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.digest, digest);
    assert_eq!(r.spec.history, 5);
    assert_eq!(Schedule::from_spec(&r.spec).unwrap(), schedule);
    assert_eq!(r.last_outcome, Some(RecordedOutcome::Done));
    assert_eq!(r.last_tick, Some(tick));
    assert!(r.last_success.is_some());
    let mut hosts: Vec<&str> = r.hosts.iter().map(|h| h.host.as_str()).collect();
    hosts.sort();
    assert_eq!(hosts, ["host-a", "host-b"]);

    // The lifetime: max(30 days, 10 gaps of 1 h) = 30 days.
    let mut raw = raw(&srv).await;
    for suffix in ["", ":hosts", ":history", ":ticks"] {
        let key = format!("baton:schedule:{{nightly}}:{digest}{suffix}");
        let ttl = pttl(&mut raw, &key).await;
        assert!(
            ttl > 29 * 24 * 3600 * 1000 && ttl <= 30 * 24 * 3600 * 1000,
            "{key}: {ttl}"
        );
    }
}

/// The history keeps the newest N; missed ticks are written only where no entry is.
#[tokio::test]
async fn the_history_is_trimmed_and_missed_never_overwrites() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let schedule = Schedule::every(HOUR).unwrap();
    let opts = RecordOptions::default().history(3);
    let now = f.server_time("trim").await.unwrap();
    let last = schedule.latest_at_or_before(now).unwrap();
    let ticks: Vec<SystemTime> = (0..6).rev().map(|i| last - HOUR * i).collect();
    for t in &ticks[..5] {
        f.record_occurrence(
            &schedule,
            &opts,
            "trim",
            *t,
            RecordChange::Outcome {
                outcome: RecordedOutcome::Done,
                note: None,
            },
        )
        .await
        .unwrap();
    }
    f.record_occurrence(
        &schedule,
        &opts,
        "trim",
        ticks[4],
        RecordChange::Missed(vec![ticks[4], ticks[5]]),
    )
    .await
    .unwrap();
    let h = f
        .schedule_history("trim", schedule.digest(), 10)
        .await
        .unwrap();
    let got: Vec<(SystemTime, RecordedOutcome)> = h.iter().map(|e| (e.tick, e.outcome)).collect();
    assert_eq!(
        got,
        [
            (ticks[5], RecordedOutcome::Missed),
            (ticks[4], RecordedOutcome::Done),
            (ticks[3], RecordedOutcome::Done),
        ]
    );
}

/// Pause before any record, read back; resume; an `until` in the past is refused, and one
/// that passes reads as not paused.
#[tokio::test]
async fn pause_and_resume_read_back() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
    f.pause_schedule("p", None, Some("maintenance"))
        .await
        .unwrap();
    let p = f.schedule_pause("p").await.unwrap().unwrap();
    assert_eq!((p.until, p.note.as_deref()), (None, Some("maintenance")));
    assert!(!p.by.is_empty());
    assert!(f.resume_schedule("p").await.unwrap());
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
    assert!(!f.resume_schedule("p").await.unwrap());
    let now = f.server_time("p").await.unwrap();
    assert!(f.pause_schedule("p", Some(now - HOUR), None).await.is_err());
    f.pause_schedule("p", Some(now + Duration::from_millis(300)), None)
        .await
        .unwrap();
    assert!(f.schedule_pause("p").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
}

/// The listing names each key with a record or a pause once, under its prefix only. It
/// walks the keys with `SCAN`, an operator's command (as `baton status`'s listing): the
/// administrator's connection, not the workers' least-privilege user.
#[tokio::test]
async fn schedules_are_listed_once_each() {
    let srv = server();
    let client = baton::Client::connect(srv.admin_url()).await.unwrap();
    let f = client.failover();
    let hourly = Schedule::every(HOUR).unwrap();
    let daily = Schedule::every(HOUR * 24).unwrap();
    let opts = RecordOptions::default();
    let now = f.server_time("l").await.unwrap();
    let done = || RecordChange::Outcome {
        outcome: RecordedOutcome::Done,
        note: None,
    };
    // Two digests of one key (a rolling change), a second key, a key that is only paused.
    for s in [&hourly, &daily] {
        let tick = s.latest_at_or_before(now).unwrap();
        f.record_occurrence(s, &opts, "list-a", tick, done())
            .await
            .unwrap();
    }
    let tick = hourly.latest_at_or_before(now).unwrap();
    f.record_occurrence(&hourly, &opts, "list-b", tick, done())
        .await
        .unwrap();
    f.pause_schedule("list-c", None, None).await.unwrap();
    let other = FailoverConfig::builder("list-d")
        .prefix("baton:sub:")
        .build()
        .unwrap();
    f.record_occurrence(&hourly, &opts, other, tick, done())
        .await
        .unwrap();

    assert_eq!(
        f.list_schedules("baton:").await.unwrap(),
        ["list-a", "list-b", "list-c"]
    );
    assert_eq!(f.list_schedules("baton:sub:").await.unwrap(), ["list-d"]);
    assert!(f.list_schedules("no-colon").await.is_err());
}
