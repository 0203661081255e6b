//! `Failover::backfill_plan`, `Failover::backfill` and `CatchUp::All` on a real server (Redis
//! and PostgreSQL): a window with settled ticks plans the others, runs them once each in
//! order, and plans nothing afterwards; a window older than the record's horizon is refused
//! naming the oldest safe tick; the long-running form catches up a window at start.
#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{
    CatchUp, ConfigError, Error, FailoverConfig, OccurrenceOutcome, RecordChange, RecordOptions,
    RecordedOutcome, RunOutcome, Schedule, ScheduleOptions,
};
use common::*;
use tokio_stream::StreamExt;

const SECOND: Duration = Duration::from_secs(1);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn a_backfill_runs_the_unsettled_ticks_once_in_order_on_redis() {
    let srv = server();
    backfill_in_order(client(&srv).await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_backfill_runs_the_unsettled_ticks_once_in_order_on_postgres() {
    let db = PgDatabase::create();
    backfill_in_order(baton::Client::connect(&db.url).await.unwrap()).await;
}

async fn backfill_in_order(client: baton::Client) {
    let f = client.failover();
    let every = Schedule::every(SECOND).unwrap();
    let config = FailoverConfig::builder("lib-backfill")
        .lease(Duration::from_millis(500))
        .worker_name("w1")
        .build()
        .unwrap();
    let first = now_secs() - 20;
    let ticks: Vec<SystemTime> = (first..first + 6).map(at).collect();
    // Tick 0 done (job and record), tick 2 done in its job only (its record write lost).
    for (i, done_on_record) in [(0, true), (2, false)] {
        let occurrence = every.occurrence_of_tick(ticks[i]).unwrap();
        let job = config.for_occurrence(&occurrence, None).unwrap();
        f.run(job, |_| async { Ok::<_, String>(()) }).await.unwrap();
        let outcome = if done_on_record {
            RecordedOutcome::Done
        } else {
            RecordedOutcome::Missed
        };
        f.record_occurrence(
            &every,
            &RecordOptions::default(),
            config.clone(),
            ticks[i],
            RecordChange::Outcome {
                outcome,
                note: None,
            },
        )
        .await
        .unwrap();
    }
    let plan = f
        .backfill_plan(&every, &config, ticks[0], ticks[5], 50)
        .await
        .unwrap();
    let settled: Vec<SystemTime> = plan.settled.iter().map(|(o, _)| o.tick()).collect();
    assert_eq!(settled, [ticks[0], ticks[2]], "{plan:?}");
    let planned: Vec<SystemTime> = plan.run.iter().map(|o| o.tick()).collect();
    assert_eq!(planned, [ticks[1], ticks[3], ticks[4], ticks[5]]);
    assert_eq!(plan.oldest_safe, ticks[0]);

    let ran: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let log = ran.clone();
    let mut runs = f.backfill(
        every.clone(),
        config.clone(),
        plan,
        ScheduleOptions::default(),
        move |occurrence, _attempt| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(occurrence.tick());
                Ok::<(), String>(())
            }
        },
    );
    let mut reported = Vec::new();
    while let Some(report) = tokio::time::timeout(Duration::from_secs(10), runs.next())
        .await
        .expect("a report within 10 s")
    {
        assert!(
            matches!(report.outcome, OccurrenceOutcome::Ran(RunOutcome::Done(()))),
            "{report:?}"
        );
        reported.push(report.occurrence.tick());
    }
    assert_eq!(reported, planned, "reported in order, then the stream ends");
    assert_eq!(*ran.lock().unwrap(), planned, "each run once, oldest first");

    let again = f
        .backfill_plan(&every, &config, ticks[0], ticks[5], 50)
        .await
        .unwrap();
    assert!(
        again.run.is_empty(),
        "a second backfill runs nothing: {again:?}"
    );
    assert_eq!(again.settled.len(), 6);

    let err = f
        .backfill_plan(&every, &config, ticks[0] - 3 * SECOND, ticks[5], 50)
        .await
        .unwrap_err();
    match err {
        Error::Config(ConfigError::Invalid {
            field: "from",
            reason,
        }) => assert!(
            reason.contains(&format!(
                "the oldest tick the record vouches for is {}",
                jiff::Timestamp::try_from(ticks[0]).unwrap()
            )),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

/// `CatchUp::All`: the window's unsettled ticks run at start, oldest first; the tick done
/// before is not run again.
#[tokio::test]
async fn catch_up_all_runs_a_window_at_start_on_redis() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let every = Schedule::every(SECOND).unwrap();
    let config = FailoverConfig::builder("lib-catch-up")
        .lease(Duration::from_millis(500))
        .build()
        .unwrap();
    // Older than any tick's retention floor (6.5 s for every 1 s): the ticks before it are
    // vouched for by nothing, and not caught up.
    let first = now_secs() - 10;
    let occurrence = every.occurrence_of_tick(at(first)).unwrap();
    f.run(
        config.for_occurrence(&occurrence, None).unwrap(),
        |_| async { Ok::<_, String>(()) },
    )
    .await
    .unwrap();
    f.record_occurrence(
        &every,
        &RecordOptions::default(),
        config.clone(),
        at(first),
        RecordChange::Outcome {
            outcome: RecordedOutcome::Done,
            note: None,
        },
    )
    .await
    .unwrap();
    let started = now_secs();
    let options = ScheduleOptions::builder()
        .catch_up(CatchUp::All {
            window: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let mut runs = f.schedule(every, config, options, |_occurrence, _attempt| async {
        Ok::<(), String>(())
    });
    let missed: Vec<SystemTime> = (first + 1..started).map(at).collect();
    let mut seen = Vec::new();
    while !missed.iter().all(|t| seen.contains(t)) {
        let report = tokio::time::timeout(Duration::from_secs(10), runs.next())
            .await
            .expect("a report within 10 s")
            .expect("the stream goes on");
        assert!(
            matches!(report.outcome, OccurrenceOutcome::Ran(RunOutcome::Done(()))),
            "{report:?}"
        );
        assert_ne!(
            report.occurrence.tick(),
            at(first),
            "the done tick ran again"
        );
        assert!(!seen.contains(&report.occurrence.tick()), "ran twice");
        seen.push(report.occurrence.tick());
    }
    let caught: Vec<SystemTime> = seen.into_iter().filter(|t| *t < at(started)).collect();
    assert_eq!(caught, missed, "caught up oldest first");
}
