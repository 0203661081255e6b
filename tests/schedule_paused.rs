//! `Failover::schedule` and the schedule's pause on a real server: a paused schedule's ticks
//! are reported `Paused` and recorded `skipped_paused`, unrun; after `resume_schedule` the
//! next tick runs, and the paused ones are not caught up (Redis and PostgreSQL).
#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use baton::{
    FailoverConfig, OccurrenceOutcome, RecordedOutcome, RunOutcome, Schedule, ScheduleOptions,
};
use common::*;
use tokio_stream::StreamExt;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_paused_schedule_skips_its_ticks_and_runs_the_next_after_resume_on_redis() {
    let srv = server();
    paused_then_resumed(client(&srv).await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_paused_schedule_skips_its_ticks_and_runs_the_next_after_resume_on_postgres() {
    let db = PgDatabase::create();
    let client = baton::Client::connect(&db.url).await.unwrap();
    paused_then_resumed(client).await;
}

async fn paused_then_resumed(client: baton::Client) {
    let f = client.failover();
    let schedule = Schedule::every(SECOND).unwrap();
    let config = FailoverConfig::builder("paused")
        .lease(Duration::from_millis(500))
        .worker_name("w1")
        .build()
        .unwrap();
    f.pause_schedule("paused", None, Some("maintenance"))
        .await
        .unwrap();
    let ran: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let log = ran.clone();
    let mut runs = f.schedule(
        schedule.clone(),
        config,
        ScheduleOptions::builder().build().unwrap(),
        move |occurrence, _attempt| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(occurrence.tick());
                Ok::<(), String>(())
            }
        },
    );
    let mut paused = Vec::new();
    for _ in 0..3 {
        let report = next(&mut runs).await;
        match report.outcome {
            OccurrenceOutcome::Paused(p) => assert_eq!(p.note.as_deref(), Some("maintenance")),
            other => panic!("{} was not skipped: {other:?}", report.occurrence.id()),
        }
        paused.push(report.occurrence.tick());
    }
    assert!(ran.lock().unwrap().is_empty(), "ran while paused");
    assert!(f.resume_schedule("paused").await.unwrap());
    let report = next(&mut runs).await;
    assert!(
        matches!(report.outcome, OccurrenceOutcome::Ran(RunOutcome::Done(()))),
        "{report:?}"
    );
    // The next tick after the last paused one: none of the paused ticks caught up.
    assert_eq!(
        Some(report.occurrence.tick()),
        schedule.next_after(*paused.last().unwrap())
    );
    assert_eq!(*ran.lock().unwrap(), vec![report.occurrence.tick()]);

    // On record: the three ticks skipped (paused, with the note), the fourth done.
    let history = f
        .schedule_history("paused", schedule.digest(), 10)
        .await
        .unwrap();
    let outcome_of = |tick: SystemTime| {
        history
            .iter()
            .find(|o| o.tick == tick)
            .map(|o| (o.outcome, o.note.clone()))
    };
    for tick in &paused {
        assert_eq!(
            outcome_of(*tick),
            Some((RecordedOutcome::SkippedPaused, Some("maintenance".into()))),
            "{history:?}"
        );
    }
    // The done entry is written in the background by the worker: read until it is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let history = f
            .schedule_history("paused", schedule.digest(), 10)
            .await
            .unwrap();
        let done = history
            .iter()
            .find(|o| o.tick == report.occurrence.tick())
            .map(|o| o.outcome);
        if done == Some(RecordedOutcome::Done) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{history:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn next(runs: &mut baton::Scheduled<(), String>) -> baton::OccurrenceReport<(), String> {
    tokio::time::timeout(Duration::from_secs(5), runs.next())
        .await
        .expect("a report within 5 s")
        .expect("the stream goes on")
}
