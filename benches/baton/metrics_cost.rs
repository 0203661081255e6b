//! Scenario `metrics-cost`: what recording metrics costs the uncontended failover cycle (one
//! worker: grant, `done()`, `Completed`) and the uncontended mutex cycle (`try_acquire`,
//! `release`), with a recorder installed against without.
//!
//! The global recorder cannot be removed once installed, so both sides run in one process on
//! a current-thread runtime of their own (on a thread of their own: the bench's main runtime
//! cannot block), the recorder side inside `metrics::with_local_recorder`, which covers every
//! task of that runtime. The recorder is the Prometheus exporter's, as `baton --metrics-addr`
//! installs it. Short batches of the two sides alternate, so drift (the server's, the host's)
//! falls on both alike; the figure is the ratio of the two sides' median cycle times.

use std::time::Duration;

use baton::{Client, Event};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use tokio::time::Instant;

use crate::harness::{cfg, connect, Report};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

pub async fn metrics_cost(opts: &Opts, report: &mut Report) {
    // Small batches, many of them: the host's load (other builds, other processes) comes in
    // bursts, and short alternating batches spread each burst over both sides.
    let (batches, per_batch) = if opts.quick { (2, 20) } else { (500, 10) };
    let server = start_server();
    let url = server.url();
    let rows = tokio::task::spawn_blocking(move || measure(&url, batches, per_batch))
        .await
        .expect("the measuring thread");
    report.rows.extend(rows);
}

/// The two cycles' samples, recorder off and on.
#[derive(Default)]
struct Sides {
    failover: [Samples; 2],
    mutex: [Samples; 2],
}

fn measure(url: &str, batches: usize, per_batch: usize) -> Vec<Row> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let client = runtime.block_on(connect(url));
    let id = run_id();
    let mut sides = Sides::default();
    // A warm-up batch of each side, not kept: connections, scripts loaded, caches.
    for batch in 0..=batches {
        // Each side goes first every other batch: whatever the first batch after a switch
        // pays (a cold cache line, a timer) is paid by both alike.
        let order = if batch % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            let tag = format!("{id}-{batch}-{on}");
            let run = || runtime.block_on(batch_of(&client, &tag, per_batch));
            let (f, m) = if on {
                metrics::with_local_recorder(&recorder, run)
            } else {
                run()
            };
            if batch > 0 {
                sides.failover[usize::from(on)].extend(f);
                sides.mutex[usize::from(on)].extend(m);
            }
        }
    }
    runtime.block_on(client.shutdown(Duration::from_secs(5)));
    // The recorder saw every cycle of its side: its own count is the check that it was on.
    let rendered = handle.render();
    let grants = rendered
        .lines()
        .filter(|l| l.starts_with("baton_grants_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>();
    let expected = (2 * (batches + 1) * per_batch) as f64;
    assert_eq!(
        grants, expected,
        "the recorder counted every grant of its side"
    );
    vec![
        row("metrics-cost failover cycle", &sides.failover),
        row("metrics-cost mutex cycle", &sides.mutex),
    ]
}

/// `n` failover cycles then `n` mutex cycles; their times.
async fn batch_of(client: &Client, tag: &str, n: usize) -> (Samples, Samples) {
    let (mut failover, mut mutex) = (Samples::default(), Samples::default());
    for i in 0..n {
        let t0 = Instant::now();
        let mut w = client
            .failover()
            .start(cfg(&format!("mc-{tag}-{i}"), Duration::from_secs(30)));
        loop {
            match w.next_event().await.expect("a terminal event") {
                Event::Acquired(a) => a.done().await.expect("done() of an uncontended attempt"),
                Event::Completed { .. } => break,
                ev if ev.is_terminal() => panic!("an uncontended job ended with {ev:?}"),
                _ => {}
            }
        }
        failover.push(t0.elapsed());
    }
    let locks = client.locks();
    let key = format!("mc-lock-{tag}");
    for _ in 0..n {
        let t0 = Instant::now();
        let guard = locks
            .try_acquire(&key, Duration::from_secs(30))
            .await
            .expect("try_acquire")
            .expect("an uncontended lock");
        assert!(guard.release().await.expect("release"));
        mutex.push(t0.elapsed());
    }
    (failover, mutex)
}

fn row(scenario: &str, [off, on]: &[Samples; 2]) -> Row {
    let (off50, on50) = (off.pct(50.0), on.pct(50.0));
    let ratio = on50.zip(off50).map(|(a, b)| a / b);
    Row {
        scenario: scenario.to_string(),
        p50_us: on50,
        p99_us: on.pct(99.0),
        ops_per_s: None,
        floor_ops_per_s: None,
        ratio,
        samples: on.len(),
        notes: format!(
            "recorder on / off, p50 (off {:.0} µs; target ≤ 1.03)",
            off50.unwrap_or(f64::NAN)
        ),
        extra: json!({
            "ratio_of": "p50 with a Prometheus recorder / p50 without",
            "off_p50_us": off50,
            "off_p99_us": off.pct(99.0),
            "target_ratio": 1.03,
        }),
    }
}
