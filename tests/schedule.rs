//! Scheduled jobs through the library: `Failover::schedule`, `Failover::occurrence`.
#![cfg(feature = "testing")]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::{FailoverConfig, OccurrenceOutcome, RunOutcome, Schedule, ScheduleOptions};
use common::*;
use tokio_stream::StreamExt;

#[tokio::test]
async fn three_workers_run_every_tick_once() {
    let srv = server();
    let ran: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let client = client(&srv).await;
        let ran = ran.clone();
        let schedule = Schedule::every(Duration::from_secs(1)).unwrap();
        let config = FailoverConfig::builder("tick")
            .lease(Duration::from_secs(2))
            .build()
            .unwrap();
        let runs = client.failover().schedule(
            schedule,
            config,
            ScheduleOptions::default(),
            move |occ, _attempt| {
                let ran = ran.clone();
                async move {
                    *ran.lock().unwrap().entry(occ.id().to_string()).or_default() += 1;
                    Ok::<_, String>(())
                }
            },
        );
        streams.push((client, runs));
    }
    let mut reports = Vec::new();
    for (_, runs) in &mut streams {
        for _ in 0..3 {
            let r = tokio::time::timeout(Duration::from_secs(10), runs.next())
                .await
                .unwrap()
                .unwrap();
            reports.push((r.occurrence.id().to_string(), format!("{:?}", r.outcome)));
        }
    }
    eprintln!("{reports:#?}");
    let ran = ran.lock().unwrap().clone();
    eprintln!("{ran:?}");
    assert!(ran.len() >= 3);
    assert!(ran.values().all(|n| *n == 1), "{ran:?}");
    let _ = OccurrenceOutcome::<(), String>::Ran(RunOutcome::Stopped);
}
