//! `Failover::schedule` and manual occurrences on a real server: a trigger is run once by
//! one of two drivers (of different schedules on one key: a rolling change), reported as a
//! manual occurrence, recorded manual in the history, and cleared (Redis and PostgreSQL).
#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::{
    FailoverConfig, OccurrenceOutcome, RecordedOutcome, RunOutcome, Schedule, ScheduleOptions,
};
use common::*;
use tokio_stream::StreamExt;

#[tokio::test]
async fn a_trigger_runs_once_across_two_drivers_on_redis() {
    let srv = server();
    trigger_once(client(&srv).await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_trigger_runs_once_across_two_drivers_on_postgres() {
    let db = PgDatabase::create();
    let client = baton::Client::connect(&db.url).await.unwrap();
    trigger_once(client).await;
}

async fn trigger_once(client: baton::Client) {
    let f = client.failover();
    let ran: Arc<Mutex<Vec<String>>> = Arc::default();
    let options = ScheduleOptions::builder()
        .trigger_poll(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut drivers = Vec::new();
    for (i, schedule) in [
        Schedule::every(Duration::from_secs(3600)).unwrap(),
        Schedule::cron("0 3 * * *").unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let config = FailoverConfig::builder("trig")
            .lease(Duration::from_secs(2))
            .worker_name(format!("w{i}"))
            .build()
            .unwrap();
        let log = ran.clone();
        drivers.push(
            f.schedule(schedule, config, options.clone(), move |occurrence, _| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(occurrence.id().to_string());
                    Ok::<(), String>(())
                }
            }),
        );
    }
    let trigger = f.trigger_schedule("trig", Some("by hand")).await.unwrap();
    assert!(trigger.id.starts_with("manual-"), "{trigger:?}");
    assert_eq!(f.triggers("trig").await.unwrap(), vec![trigger.clone()]);
    // A driver that saw it reports it: one ran it, another that saw it before it was
    // cleared found it done (or joined as a backup). One that never saw it reports nothing.
    let mut outcomes = Vec::new();
    for d in &mut drivers {
        let Ok(report) = tokio::time::timeout(Duration::from_secs(3), d.next()).await else {
            continue;
        };
        let report = report.expect("the stream goes on");
        assert!(report.occurrence.is_manual());
        assert_eq!(report.occurrence.id(), trigger.id);
        assert_eq!(report.job_key, format!("trig@manual@{}", trigger.id));
        match report.outcome {
            OccurrenceOutcome::Ran(o) => outcomes.push(o),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(*ran.lock().unwrap(), vec![trigger.id.clone()]);
    let done = outcomes
        .iter()
        .filter(|o| matches!(o, RunOutcome::Done(())))
        .count();
    assert_eq!(done, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(RunOutcome::is_final), "{outcomes:?}");
    // Cleared by the drivers once settled; recorded manual in the runner's digest.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let cleared = f.triggers("trig").await.unwrap().is_empty();
        let records = f.schedule_records("trig").await.unwrap();
        let mut entry = None;
        for r in &records {
            for o in f.schedule_history("trig", &r.digest, 10).await.unwrap() {
                if o.id == trigger.id {
                    entry = Some(o);
                }
            }
            // A manual run never moves the newest calendar tick.
            assert_eq!(r.last_tick, None, "{r:?}");
        }
        if let Some(e) = entry.filter(|e| e.outcome == RecordedOutcome::Done && cleared) {
            assert!(e.manual);
            assert_eq!(e.note.as_deref(), Some("by hand"));
            assert_eq!(e.tick, trigger.at);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled on record"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A manual occurrence that runs counts for the overlap rules of the ticks that come while it
/// runs, found through the pending triggers even with no record entry for it (its record
/// write not landed yet, or lost); and a tick running counts for a manual occurrence made
/// after it, whose trigger time is earlier than nothing the record knows.
#[tokio::test]
async fn a_running_manual_occurrence_is_live_for_the_overlap_rules() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
    let base = FailoverConfig::builder("trig-live")
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let trigger = f.trigger_schedule(base.clone(), None).await.unwrap();
    let manual = trigger.occurrence();
    // Its job held, with no record entry: the configuration records nothing.
    let job = base.for_occurrence(&manual, None).unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let held = Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let (f, release, held) = (f.clone(), release.clone(), held.clone());
        async move {
            f.run(job, move |_| {
                let (release, held) = (release.clone(), held.clone());
                async move {
                    held.notify_one();
                    release.notified().await;
                    Ok::<(), String>(())
                }
            })
            .await
        }
    });
    held.notified().await;
    let now = f.server_time("trig-live").await.unwrap();
    let tick = hourly
        .occurrence_of_tick(hourly.next_after(now).unwrap())
        .unwrap();
    let live = f.live_occurrences(&hourly, &base, &tick).await.unwrap();
    assert_eq!(
        live.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
        [manual.id()],
        "{live:?}"
    );
    assert_eq!(live[0].job_key, manual.job_key("trig-live"));
    // Skip and buffer-one decide on it.
    assert!(matches!(
        f.overlap_decision(baton::Overlap::Skip, &hourly, &base, &tick)
            .await
            .unwrap(),
        baton::OverlapDecision::Skip { live: 1 }
    ));
    // The manual occurrence itself does not count itself.
    assert!(f
        .live_occurrences(&hourly, &base, &manual)
        .await
        .unwrap()
        .is_empty());
    release.notify_one();
    assert!(matches!(
        holder.await.unwrap().unwrap(),
        RunOutcome::Done(_)
    ));
    assert!(f
        .live_occurrences(&hourly, &base, &tick)
        .await
        .unwrap()
        .is_empty());
}
