//! What the library records through the `metrics` facade, read back from a local recorder
//! (`metrics-util`'s `DebuggingRecorder`) on a current-thread runtime: every task of the
//! client runs on the test's thread, inside `with_local_recorder`, so the recorder sees all of
//! it and nothing of the tests running beside it. And `describe_metrics`, read back from a
//! local Prometheus recorder: every documented metric served with its `# HELP` line, passing
//! `promtool check metrics`.
#![cfg(feature = "testing")]

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::{Event, FailoverConfig};
use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Runs `test` on a current-thread runtime with a local recorder installed; returns what was
/// recorded.
fn recorded<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    metrics::with_local_recorder(&recorder, || runtime.block_on(test()));
    Recorded(series(&snapshotter))
}

/// Every series as (kind, name, sorted labels, value). Taken once: a snapshot drains what it
/// reads.
fn series(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v): (CompositeKey, _, _, _)| {
            let (kind, key) = k.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            (kind, key.name().to_string(), labels, v)
        })
        .collect()
}

type Series = (MetricKind, String, Vec<(String, String)>, DebugValue);

struct Recorded(Vec<Series>);

impl Recorded {
    /// The counter `name` with exactly `labels` (0 when never incremented).
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.find(name, labels)
            .map(|v| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .unwrap_or(0)
    }

    /// How many samples the histogram `name` with exactly `labels` holds.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.find(name, labels)
            .map(|v| match v {
                DebugValue::Histogram(s) => s.len(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .unwrap_or(0)
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.sort();
        self.0
            .iter()
            .find(|(_, n, l, _)| n == name && *l == want)
            .map(|(_, _, _, v)| v)
    }

    /// Every series of `name`, for failure messages.
    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, n, _, _)| n == name)
            .map(|(_, _, l, v)| format!("{l:?} = {v:?}"))
            .collect()
    }
}

const FAILOVER: [(&str, &str); 2] = [("primitive", "failover"), ("backend", "redis")];
const MUTEX: [(&str, &str); 2] = [("primitive", "mutex"), ("backend", "redis")];

fn with<'a>(base: &[(&'a str, &'a str)], more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    base.iter().chain(more).copied().collect()
}

#[test]
fn a_failover_with_a_failed_attempt_counts_the_grant_the_failure_the_takeover_and_done() {
    let rec = recorded(|| async {
        let srv = server();
        let client = client(&srv).await;
        let cfg: FailoverConfig = job("m").build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let first = acquired(&mut a, WAKE).await;
        assert_eq!(first.attempt, 1);
        let mut b = client.failover().start(cfg);
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        first.fail("it broke").await.unwrap();
        let second = acquired(&mut b, WAKE).await;
        assert_eq!(second.attempt, 2);
        second.done().await.unwrap();
        assert!(matches!(
            until_end(&mut b, WAKE).await.as_slice(),
            [Event::Completed { attempt: Some(2) }]
        ));
        client.shutdown(WAKE).await;
    });
    let grants = |takeover| {
        rec.counter(
            "baton_grants_total",
            &with(&FAILOVER, &[("takeover", takeover)]),
        )
    };
    assert_eq!(
        (grants("false"), grants("true")),
        (1, 1),
        "{:?}",
        rec.all("baton_grants_total")
    );
    let redis = [("backend", "redis")];
    assert_eq!(rec.counter("baton_failed_attempts_total", &redis), 1);
    assert_eq!(rec.counter("baton_done_total", &redis), 1);
    assert_eq!(rec.counter("baton_exhausted_total", &redis), 0);
    assert_eq!(rec.samples("baton_acquire_duration_seconds", &FAILOVER), 2);
    assert_eq!(rec.samples("baton_hold_duration_seconds", &FAILOVER), 2);
    for (transition, n) in [("grant", 2), ("fail", 1), ("done", 1)] {
        assert_eq!(
            rec.samples(
                "baton_transition_duration_seconds",
                &with(&FAILOVER, &[("transition", transition)])
            ),
            n,
            "{transition}: {:?}",
            rec.all("baton_transition_duration_seconds")
        );
    }
    assert_eq!(
        rec.all("baton_lease_lost_total"),
        Vec::<String>::new(),
        "nothing was lost"
    );
}

#[test]
fn a_mutex_cycle_records_its_acquisition_hold_and_extensions() {
    let rec = recorded(|| async {
        let srv = server();
        let client = client(&srv).await;
        let locks = client.locks();
        let mut guard = locks
            .try_acquire("m", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("a free lock");
        assert!(guard.extend(Duration::from_secs(5)).await.unwrap());
        assert!(guard.release().await.unwrap());
        // A lease that runs out under its watchdog-less holder, then refuses the extension.
        let mut stale = locks
            .try_acquire("gone", Duration::from_millis(50))
            .await
            .unwrap()
            .expect("a free lock");
        tokio::time::sleep(Duration::from_millis(80)).await;
        let other = locks
            .try_acquire("gone", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("expired");
        assert!(!stale.extend(Duration::from_secs(5)).await.unwrap());
        drop(stale);
        other.release().await.unwrap();
        client.shutdown(WAKE).await;
    });
    assert_eq!(
        rec.counter(
            "baton_grants_total",
            &with(&MUTEX, &[("takeover", "false")])
        ),
        3
    );
    assert_eq!(rec.samples("baton_acquire_duration_seconds", &MUTEX), 3);
    assert_eq!(
        rec.samples("baton_hold_duration_seconds", &MUTEX),
        3,
        "each hold once, the lost one at its loss"
    );
    let extensions = |outcome| {
        rec.counter(
            "baton_extensions_total",
            &with(&MUTEX, &[("outcome", outcome)]),
        )
    };
    assert_eq!((extensions("ok"), extensions("refused")), (1, 1));
    assert_eq!(
        rec.counter(
            "baton_lease_lost_total",
            &with(&MUTEX, &[("reason", "taken")])
        ),
        1
    );
    for (transition, n) in [("grant", 3), ("extend", 1), ("release", 2)] {
        assert_eq!(
            rec.samples(
                "baton_transition_duration_seconds",
                &with(&MUTEX, &[("transition", transition)])
            ),
            n,
            "{transition}"
        );
    }
}

#[test]
fn a_leader_term_counts_one_grant_two_changes_and_its_renewals() {
    let rec = recorded(|| async {
        let srv = server();
        let client = client(&srv).await;
        let opts = baton::ElectionOptions::builder()
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let elector = client.leaders().elector("el", &opts).unwrap();
        let term = elector.campaign().await.unwrap();
        // A few renewals (every lease / 3).
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(!term.is_lost());
        assert!(elector.resign().await.unwrap());
        client.shutdown(WAKE).await;
    });
    const LEADER: [(&str, &str); 2] = [("primitive", "leader"), ("backend", "redis")];
    assert_eq!(
        rec.counter(
            "baton_grants_total",
            &with(&LEADER, &[("takeover", "false")])
        ),
        1
    );
    assert_eq!(
        rec.counter("baton_leader_changes_total", &[("backend", "redis")]),
        2,
        "elected, then resigned: {:?}",
        rec.all("baton_leader_changes_total")
    );
    assert_eq!(rec.samples("baton_hold_duration_seconds", &LEADER), 1);
    assert!(
        rec.counter(
            "baton_extensions_total",
            &with(&LEADER, &[("outcome", "ok")])
        ) >= 2,
        "{:?}",
        rec.all("baton_extensions_total")
    );
    assert_eq!(rec.all("baton_lease_lost_total"), Vec::<String>::new());
}

/// A worker whose Redis user may not touch the schedule's record (keys `baton:{*` only: the
/// jobs', not `baton:schedule:*`) runs its occurrence all the same; each of the record's
/// failed writes (the grant, the attempt's end) is counted.
#[test]
fn a_record_write_that_fails_is_counted_and_the_job_runs() {
    let rec = recorded(|| async {
        let srv = server();
        let mut admin = raw(&srv).await;
        let mut args = baton::acl::setuser_args("norecord", "pw-norecord", "baton:");
        for a in &mut args {
            if a == "~baton:*" {
                *a = "~baton:{*".to_string();
            }
        }
        let mut acl = redis::cmd("ACL");
        for a in &args {
            acl.arg(a);
        }
        for mut conn in admin.primaries().await {
            let _: () = acl.query_async(&mut conn).await.unwrap();
        }
        let _ = &mut admin;
        let client = baton::Client::connect(srv.user_url("norecord", "pw-norecord"))
            .await
            .unwrap();
        let schedule = baton::Schedule::every(Duration::from_secs(3600)).unwrap();
        let now = client.failover().server_time("r").await.unwrap();
        let tick = schedule.latest_at_or_before(now).unwrap();
        let occurrence = schedule.occurrence_of_tick(tick).unwrap();
        let cfg = job("r")
            .build()
            .unwrap()
            .for_occurrence(&occurrence, None)
            .unwrap()
            .with_record("r", &schedule, tick, baton::RecordOptions::default());
        let mut w = client.failover().start(cfg);
        acquired(&mut w, WAKE).await.done().await.unwrap();
        // Waits for the client's tasks, the record's writes among them.
        assert!(client.shutdown(WAKE).await);
    });
    let redis = [("backend", "redis")];
    assert_eq!(rec.counter("baton_done_total", &redis), 1);
    assert_eq!(
        rec.counter("baton_schedule_record_errors_total", &redis),
        2,
        "the grant's write and the end's"
    );
}

/// Every metric of the table in docs/operating.md ("Metrics and traces"), which the library's
/// unit tests keep equal to the metrics it records.
fn documented_metrics() -> Vec<String> {
    include_str!("../docs/operating.md")
        .lines()
        .filter_map(|l| l.strip_prefix("| `baton_"))
        .filter_map(|l| l.split('`').next())
        .map(|rest| format!("baton_{rest}"))
        .collect()
}

#[test]
fn describe_metrics_gives_a_prometheus_recorder_the_help_of_every_metric() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let names = documented_metrics();
    assert!(names.len() >= 12, "{names:?}");
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        baton::describe_metrics();
        // The exporter renders only the metrics it has seen: one sample of each, as the
        // library records it (counters end in _total, durations in _seconds).
        for name in &names {
            if name.ends_with("_seconds") {
                metrics::histogram!(name.clone()).record(0.01);
            } else {
                metrics::counter!(name.clone()).increment(1);
            }
        }
    });
    let text = handle.render();
    for name in &names {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "{name} has no # HELP line:\n{text}"
        );
    }
    common::process::promtool_check(&text, "describe_metrics() on a Prometheus recorder");
}
