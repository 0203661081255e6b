//! Scheduled jobs through the library (`Failover::schedule`, `Failover::occurrence`,
//! `Failover::wait_until_due`) on real servers: each test starts its own redis-server (the
//! PostgreSQL tests share the binary's one server, a database each), with `every(1s)`-style
//! schedules and short leases so the whole binary stays within a few seconds of ticks.
//!
//! Every run of the work records the server's time as it starts (`Run::server_time`), so
//! "never early" and "bound to the right tick" are checked against the clock that decides.
#![cfg(feature = "testing")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use baton::{
    Attempt, CatchUp, Client, FailoverConfig, Occurrence, OccurrenceOutcome, OccurrenceReport,
    Overlap, RunOutcome, Schedule, ScheduleOptions, Scheduled,
};
use common::*;
use tokio::time::Instant;
use tokio_stream::StreamExt;

const SECOND: Duration = Duration::from_secs(1);

/// One run of the work: who ran which occurrence, as which attempt, and when by the server.
#[derive(Debug, Clone)]
struct Run {
    worker: &'static str,
    occurrence: String,
    tick: SystemTime,
    job: String,
    attempt: u64,
    server_time: SystemTime,
    at: Instant,
}

type Log = Arc<Mutex<Vec<Run>>>;

/// What the work does with one attempt.
#[derive(Debug, Clone, Copy)]
enum Act {
    Succeed,
    Fail,
    /// Never returns (the holder hangs, or its process is about to die).
    Hang,
    Sleep(Duration),
}

fn every(period: Duration) -> Schedule {
    Schedule::every(period).unwrap()
}

fn config(key: &str, worker: &str, lease: Duration) -> FailoverConfig {
    FailoverConfig::builder(key)
        .lease(lease)
        .worker_name(worker)
        .build()
        .unwrap()
}

fn catch_up_last() -> ScheduleOptions {
    ScheduleOptions::builder()
        .catch_up(CatchUp::Last)
        .build()
        .unwrap()
}

/// Starts `Failover::schedule` on `client` as worker `name`: each attempt reads the server's
/// clock, is logged, then does what `plan` says.
#[allow(clippy::too_many_arguments)]
fn start(
    client: &Client,
    name: &'static str,
    schedule: &Schedule,
    key: &str,
    lease: Duration,
    options: ScheduleOptions,
    log: &Log,
    plan: impl Fn(&Occurrence, &Attempt) -> Act + Clone + Send + Sync + 'static,
) -> Scheduled<(), String> {
    let failover = client.failover();
    let log = log.clone();
    client.failover().schedule(
        schedule.clone(),
        config(key, name, lease),
        options,
        move |occurrence, attempt| {
            let (failover, log, plan) = (failover.clone(), log.clone(), plan.clone());
            async move {
                let server_time = failover
                    .server_time(&attempt.key)
                    .await
                    .map_err(|e| e.to_string())?;
                let act = plan(&occurrence, &attempt);
                log.lock().unwrap().push(Run {
                    worker: name,
                    occurrence: occurrence.id().to_string(),
                    tick: occurrence.tick(),
                    job: attempt.key.clone(),
                    attempt: attempt.attempt,
                    server_time,
                    at: Instant::now(),
                });
                match act {
                    Act::Succeed => Ok(()),
                    Act::Fail => Err("planned failure".to_string()),
                    Act::Hang => std::future::pending().await,
                    Act::Sleep(d) => {
                        tokio::time::sleep(d).await;
                        Ok(())
                    }
                }
            }
        },
    )
}

/// The next `n` reports of `runs`, each within `within`.
async fn take(
    runs: &mut Scheduled<(), String>,
    n: usize,
    within: Duration,
) -> Vec<OccurrenceReport<(), String>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let report = tokio::time::timeout(within, runs.next())
            .await
            .unwrap_or_else(|_| panic!("no report within {within:?} after {out:?}"))
            .expect("the stream ended");
        out.push(report);
    }
    out
}

/// A short name of how an occurrence ended on one worker.
fn ended(report: &OccurrenceReport<(), String>) -> String {
    match &report.outcome {
        OccurrenceOutcome::Ran(RunOutcome::Done(())) => "done".into(),
        OccurrenceOutcome::Ran(RunOutcome::CompletedElsewhere) => "elsewhere".into(),
        OccurrenceOutcome::Ran(RunOutcome::Failed { attempt, .. }) => format!("failed {attempt}"),
        OccurrenceOutcome::Ran(RunOutcome::Stopped) => "stopped".into(),
        OccurrenceOutcome::Skipped => "skipped".into(),
        other => format!("{other:?}"),
    }
}

/// Waits (polling the log, within `within`) for a run that `pred` accepts.
async fn wait_for_run(log: &Log, within: Duration, pred: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + within;
    loop {
        if let Some(run) = log.lock().unwrap().iter().find(|r| pred(r)) {
            return run.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no such run within {within:?}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the server's clock is early in a second (0.05–0.5 s past a whole second), so
/// workers started now all wait for the same coming tick.
async fn early_in_a_second(client: &Client, key: &str) {
    let schedule = every(SECOND);
    for _ in 0..5 {
        let now = client.failover().server_time(key).await.unwrap();
        let since = now
            .duration_since(schedule.latest_at_or_before(now).unwrap())
            .unwrap();
        if since >= Duration::from_millis(50) && since <= Duration::from_millis(500) {
            return;
        }
        tokio::time::sleep((SECOND + Duration::from_millis(100)).saturating_sub(since)).await;
    }
    panic!("the server's clock never came to the start of a second");
}

/// Every run started at or after its tick by the server's clock, and a run starting at that
/// server time binds to that very tick.
fn assert_never_early(schedule: &Schedule, runs: &[Run]) {
    for run in runs {
        assert!(
            run.server_time >= run.tick,
            "{run:?} started before its tick"
        );
        assert_eq!(
            schedule.occurrence_at(run.server_time).map(|o| o.tick()),
            Some(run.tick),
            "{run:?} is not the occurrence a run at its server time binds to"
        );
    }
}

/// Three workers (three clients) of `every(1s)` over four ticks: each tick runs exactly once
/// (one `Done`, the others `CompletedElsewhere`), with no gap, never before its tick.
async fn three_workers_run_every_tick_once(clients: &[Client], key: &str) {
    let schedule = every(SECOND);
    let log = Log::default();
    early_in_a_second(&clients[0], key).await;
    let mut streams: Vec<_> = clients
        .iter()
        .zip(["w1", "w2", "w3"])
        .map(|(c, name)| {
            start(
                c,
                name,
                &schedule,
                key,
                2 * SECOND,
                ScheduleOptions::default(),
                &log,
                |_, _| Act::Succeed,
            )
        })
        .collect();
    // occurrence -> how it ended on each worker
    let mut seen: BTreeMap<SystemTime, Vec<String>> = BTreeMap::new();
    for runs in &mut streams {
        for report in take(runs, 4, 3 * SECOND).await {
            assert_eq!(report.job_key, report.occurrence.job_key(key));
            seen.entry(report.occurrence.tick())
                .or_default()
                .push(ended(&report));
        }
    }
    drop(streams);
    let runs = log.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        4,
        "all three workers saw the same four ticks: {seen:?}"
    );
    let ticks: Vec<_> = seen.keys().copied().collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1].duration_since(pair[0]).unwrap(),
            SECOND,
            "a gap: {seen:?}"
        );
    }
    for (tick, ends) in &seen {
        let mut ends = ends.clone();
        ends.sort();
        assert_eq!(ends, ["done", "elsewhere", "elsewhere"], "tick {tick:?}");
        let ran = runs.iter().filter(|r| r.tick == *tick).count();
        assert_eq!(ran, 1, "tick {tick:?} ran {ran} times: {runs:?}");
    }
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert_never_early(&schedule, &runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_run_every_tick_once_none_skipped_none_early() {
    let srv = server();
    let clients = [client(&srv).await, client(&srv).await, client(&srv).await];
    three_workers_run_every_tick_once(&clients, "tick").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_retried_by_a_backup_within_the_occurrence() {
    let srv = server();
    let schedule = every(SECOND);
    let log = Log::default();
    let clients = [client(&srv).await, client(&srv).await, client(&srv).await];
    early_in_a_second(&clients[0], "retry").await;
    let mut streams: Vec<_> = clients
        .iter()
        .zip(["w1", "w2", "w3"])
        .map(|(c, name)| {
            start(
                c,
                name,
                &schedule,
                "retry",
                2 * SECOND,
                ScheduleOptions::default(),
                &log,
                |_, attempt| {
                    if attempt.attempt == 1 {
                        Act::Fail
                    } else {
                        Act::Succeed
                    }
                },
            )
        })
        .collect();
    let mut ends = Vec::new();
    for runs in &mut streams {
        let report = take(runs, 1, 3 * SECOND).await.remove(0);
        ends.push((report.occurrence.clone(), ended(&report)));
    }
    drop(streams);
    let occurrence = ends[0].0.clone();
    assert!(ends.iter().all(|(o, _)| *o == occurrence), "{ends:?}");
    let mut how: Vec<_> = ends.iter().map(|(_, e)| e.as_str()).collect();
    how.sort();
    assert_eq!(how, ["done", "elsewhere", "failed 1"], "{ends:?}");

    let runs = log.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (first, second) = (&runs[0], &runs[1]);
    assert_eq!((first.attempt, second.attempt), (1, 2), "{runs:?}");
    assert_ne!(first.worker, second.worker, "a backup retries: {runs:?}");
    assert_eq!(first.occurrence, occurrence.id());
    assert_eq!(second.occurrence, occurrence.id());
    assert_eq!(first.job, occurrence.job_key("retry"));
    assert_eq!(second.job, first.job, "the same occurrence's job");
    assert_never_early(&schedule, &runs);
}

/// The holder of an occurrence crashes (its runtime stops while its work runs: no `fail()`,
/// no release, only its lease running out tells); a backup takes the occurrence over as
/// attempt 2 after the lease, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_is_taken_over_after_its_lease() {
    const LEASE: Duration = Duration::from_millis(1500);
    let srv = server();
    let schedule = every(SECOND);
    let log = Log::default();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<Occurrence>();
    let (crash_tx, crash_rx) = tokio::sync::oneshot::channel::<()>();
    let url = srv.user_url(TEST_USER, TEST_PASSWORD);
    let holder_schedule = schedule.clone();
    // The holder's "process": a runtime of its own in a thread of its own.
    let holder = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = Client::connect(url).await.unwrap();
            let started = Arc::new(Mutex::new(Some(started_tx)));
            let runs = client.failover().schedule(
                holder_schedule,
                config("crash", "w1", LEASE),
                ScheduleOptions::default(),
                move |occurrence, _attempt| {
                    let started = started.clone();
                    async move {
                        if let Some(tx) = started.lock().unwrap().take() {
                            let _ = tx.send(occurrence);
                        }
                        std::future::pending::<Result<(), String>>().await
                    }
                },
            );
            let _ = crash_rx.await;
            // A crash does nothing politely: neither the stream nor the client is dropped
            // (which would fail the attempt), their tasks just stop with the runtime.
            std::mem::forget(runs);
            std::mem::forget(client);
        });
        rt.shutdown_background();
    });
    let occurrence = tokio::time::timeout(3 * SECOND, started_rx)
        .await
        .expect("the holder won no occurrence")
        .unwrap();
    // The backups come up while the holder works on it: `CatchUp::Last` joins that running
    // occurrence (its state is an attempt, neither done nor exhausted).
    let (c2, c3) = (client(&srv).await, client(&srv).await);
    let mut backups = [
        start(
            &c2,
            "w2",
            &schedule,
            "crash",
            LEASE,
            catch_up_last(),
            &log,
            |_, _| Act::Succeed,
        ),
        start(
            &c3,
            "w3",
            &schedule,
            "crash",
            LEASE,
            catch_up_last(),
            &log,
            |_, _| Act::Succeed,
        ),
    ];
    crash_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || holder.join())
        .await
        .unwrap()
        .unwrap();
    let crashed = Instant::now();

    let takeover = wait_for_run(&log, 5 * SECOND, |r| r.occurrence == occurrence.id()).await;
    assert_eq!(takeover.attempt, 2, "{takeover:?}");
    assert_eq!(takeover.job, occurrence.job_key("crash"));
    let after = takeover.at.duration_since(crashed);
    // The lease was renewed at least every third of it, so at least two thirds were left.
    assert!(
        after >= LEASE * 2 / 3 - Duration::from_millis(200),
        "taken over {after:?} after the crash, with a lease of {LEASE:?}"
    );
    assert!(
        after < LEASE * 2,
        "taken over only {after:?} after the crash"
    );
    let mut ends = Vec::new();
    for runs in &mut backups {
        // Later ticks run meanwhile (on the backups), and may be reported first.
        let mut of_it = None;
        for _ in 0..4 {
            let report = take(runs, 1, 3 * SECOND).await.remove(0);
            if report.occurrence == occurrence {
                of_it = Some(report);
                break;
            }
        }
        ends.push(ended(&of_it.expect("the crashed occurrence is reported")));
    }
    ends.sort();
    assert_eq!(ends, ["done", "elsewhere"]);
    let runs = log.lock().unwrap().clone();
    assert_eq!(
        runs.iter()
            .filter(|r| r.occurrence == occurrence.id())
            .count(),
        1,
        "{runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedules_on_one_key_never_share_an_occurrence() {
    let srv = server();
    let client = client(&srv).await;
    let (each_second, every_other) = (every(SECOND), every(2 * SECOND));
    assert_ne!(each_second.digest(), every_other.digest());
    let log = Log::default();
    let opts = ScheduleOptions::default;
    let mut a = start(
        &client,
        "a",
        &each_second,
        "shared",
        SECOND,
        opts(),
        &log,
        |_, _| Act::Succeed,
    );
    let mut b = start(
        &client,
        "b",
        &every_other,
        "shared",
        SECOND,
        opts(),
        &log,
        |_, _| Act::Succeed,
    );
    // Both tick at every even second: each runs that instant as an occurrence of its own.
    let from_b = take(&mut b, 1, 3 * SECOND).await.remove(0);
    assert_eq!(ended(&from_b), "done");
    let mut from_a = None;
    for report in take(&mut a, 3, 3 * SECOND).await {
        if report.occurrence.tick() == from_b.occurrence.tick() {
            from_a = Some(report);
        }
    }
    let from_a = from_a.expect("the every-second schedule ran that instant too");
    assert_eq!(
        ended(&from_a),
        "done",
        "not completed by the other schedule"
    );
    assert_eq!(from_a.occurrence.id(), from_b.occurrence.id());
    assert_ne!(from_a.job_key, from_b.job_key);
    let runs = log.lock().unwrap().clone();
    let at_that_tick: BTreeSet<_> = runs
        .iter()
        .filter(|r| r.occurrence == from_b.occurrence.id())
        .map(|r| (r.worker, r.job.clone()))
        .collect();
    assert_eq!(
        at_that_tick,
        BTreeSet::from([("a", from_a.job_key.clone()), ("b", from_b.job_key.clone())])
    );
}

/// `CatchUp::Last` runs the latest past tick when nobody ran it (every server was down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_last_runs_the_latest_past_tick_nobody_ran() {
    let srv = server();
    let client = client(&srv).await;
    // A minute: without the catch-up, nothing would run within the test's deadline.
    let schedule = every(Duration::from_secs(60));
    let log = Log::default();
    let before = client.failover().server_time("missed").await.unwrap();
    let mut runs = start(
        &client,
        "w",
        &schedule,
        "missed",
        SECOND,
        catch_up_last(),
        &log,
        |_, _| Act::Succeed,
    );
    let report = take(&mut runs, 1, 3 * SECOND).await.remove(0);
    let after = client.failover().server_time("missed").await.unwrap();
    assert_eq!(ended(&report), "done");
    let tick = report.occurrence.tick();
    assert!(
        tick >= schedule.latest_at_or_before(before).unwrap() && tick <= after,
        "ran {} instead of the latest past tick",
        report.occurrence.id()
    );
    assert_eq!(log.lock().unwrap().len(), 1);
}

/// `CatchUp::Last` does not run the latest past tick when it is done: the first occurrence it
/// reports is the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_last_leaves_a_done_tick_alone() {
    let srv = server();
    let client = client(&srv).await;
    let schedule = every(2 * SECOND);
    let failover = client.failover();
    // Far enough from the next tick that the latest past one stays the latest while we work.
    let mut now = failover.server_time("done").await.unwrap();
    let left = schedule
        .next_after(now)
        .unwrap()
        .duration_since(now)
        .unwrap();
    if left < Duration::from_millis(800) {
        tokio::time::sleep(left + Duration::from_millis(100)).await;
        now = failover.server_time("done").await.unwrap();
    }
    let latest = schedule
        .occurrence_of_tick(schedule.latest_at_or_before(now).unwrap())
        .unwrap();
    let job = config("done", "earlier", SECOND)
        .for_occurrence(&latest, None)
        .unwrap();
    let earlier = failover
        .run(job, |_| async { Ok::<_, String>(()) })
        .await
        .unwrap();
    assert!(matches!(earlier, RunOutcome::Done(())), "{earlier:?}");

    let log = Log::default();
    let mut runs = start(
        &client,
        "w",
        &schedule,
        "done",
        SECOND,
        catch_up_last(),
        &log,
        |_, _| Act::Succeed,
    );
    let report = take(&mut runs, 1, 3 * SECOND).await.remove(0);
    assert_eq!(
        report.occurrence.tick(),
        latest.next_tick().unwrap(),
        "the done tick {} was taken up again",
        latest.id()
    );
    assert_eq!(ended(&report), "done");
    let runs = log.lock().unwrap().clone();
    assert!(runs.iter().all(|r| r.occurrence != latest.id()), "{runs:?}");
}

/// The server cannot be reached when the schedule starts: the catch-up is tried again once it
/// can, not given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_last_is_retried_while_the_server_is_unreachable() {
    let srv = server();
    let client = Client::builder(srv.user_url(TEST_USER, TEST_PASSWORD))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let schedule = every(Duration::from_secs(60));
    let log = Log::default();
    srv.pause().unwrap();
    let mut runs = start(
        &client,
        "w",
        &schedule,
        "unreachable",
        SECOND,
        catch_up_last(),
        &log,
        |_, _| Act::Succeed,
    );
    // Long enough for the first catch-up to time out.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let resumed = SystemTime::now();
    srv.resume().unwrap();
    let report = take(&mut runs, 1, 5 * SECOND).await.remove(0);
    assert_eq!(ended(&report), "done");
    let tick = report.occurrence.tick();
    assert!(
        tick <= SystemTime::now() && tick >= schedule.latest_at_or_before(resumed).unwrap(),
        "ran {} instead of catching up",
        report.occurrence.id()
    );
}

/// `Overlap::Skip`: a tick that comes while the previous occurrence still runs is reported as
/// skipped by every worker of it (the holder and its backup) and run by none; the one after
/// runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_skips_a_tick_while_the_previous_occurrence_runs() {
    let srv = server();
    let schedule = every(SECOND);
    let log = Log::default();
    let clients = [client(&srv).await, client(&srv).await];
    let skip = || {
        ScheduleOptions::builder()
            .overlap(Overlap::Skip)
            .build()
            .unwrap()
    };
    let first = Arc::new(AtomicBool::new(true));
    let plan = move |_: &Occurrence, _: &Attempt| {
        if first.swap(false, Ordering::SeqCst) {
            Act::Sleep(Duration::from_millis(1500))
        } else {
            Act::Succeed
        }
    };
    early_in_a_second(&clients[0], "overlap").await;
    let mut streams = [
        start(
            &clients[0],
            "w1",
            &schedule,
            "overlap",
            3 * SECOND,
            skip(),
            &log,
            plan.clone(),
        ),
        start(
            &clients[1],
            "w2",
            &schedule,
            "overlap",
            3 * SECOND,
            skip(),
            &log,
            plan,
        ),
    ];
    let mut ticks = Vec::new();
    for runs in &mut streams {
        let mut reports = take(runs, 3, 3 * SECOND).await;
        reports.sort_by_key(|r| r.occurrence.tick());
        let how: Vec<_> = reports.iter().map(ended).collect();
        assert!(matches!(how[0].as_str(), "done" | "elsewhere"), "{how:?}");
        assert_eq!(how[1], "skipped", "{how:?}");
        assert!(matches!(how[2].as_str(), "done" | "elsewhere"), "{how:?}");
        ticks.push(
            reports
                .iter()
                .map(|r| r.occurrence.tick())
                .collect::<Vec<_>>(),
        );
    }
    drop(streams);
    assert_eq!(ticks[0], ticks[1], "both workers saw the same ticks");
    let t = &ticks[0];
    assert_eq!(t[1].duration_since(t[0]).unwrap(), SECOND);
    assert_eq!(t[2].duration_since(t[1]).unwrap(), SECOND);
    let runs = log.lock().unwrap().clone();
    let ran: Vec<_> = runs.iter().map(|r| r.tick).collect();
    assert_eq!(ran, [t[0], t[2]], "the skipped tick ran nowhere: {runs:?}");
}

/// A worker whose process stalls (here the test's single-threaded runtime is blocked, as a
/// SIGSTOP or a long GC would) past whole periods resumes at the occurrence a run starting
/// now binds to, never at the stale tick it was waiting for.
#[tokio::test]
async fn a_worker_paused_past_whole_periods_runs_the_occurrence_it_binds_to_now() {
    let srv = server();
    let client = client(&srv).await;
    let schedule = every(SECOND);
    let log = Log::default();
    let opts = ScheduleOptions::default();
    let mut runs = start(
        &client,
        "w",
        &schedule,
        "paused",
        2 * SECOND,
        opts,
        &log,
        |_, _| Act::Succeed,
    );
    let first = take(&mut runs, 1, 3 * SECOND).await.remove(0);
    assert_eq!(ended(&first), "done");
    // The worker now waits for the next tick; nothing of this runtime moves for 3.3 s.
    std::thread::sleep(Duration::from_millis(3300));
    let next = take(&mut runs, 1, 3 * SECOND).await.remove(0);
    assert_eq!(ended(&next), "done");
    assert!(
        next.occurrence.tick() >= first.occurrence.tick() + 3 * SECOND,
        "{} ran after a pause that ended past {}",
        next.occurrence.id(),
        first.occurrence.id()
    );
    assert_never_early(&schedule, &log.lock().unwrap());
}

/// `for_occurrence` with a retention shorter than the binding window (1 s for `every(10s)`,
/// whose runs bind to a tick for up to 5 s after it): the occurrence's `DONE` outlives it, so
/// a late run of the same occurrence 1.5 s later completes elsewhere instead of running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retention_never_lets_a_late_run_repeat_the_occurrence() {
    let srv = server();
    let client = client(&srv).await;
    let failover = client.failover();
    let schedule = every(10 * SECOND);
    let occurrence = failover.occurrence(&schedule, "short").await.unwrap();
    let job = || {
        config("short", "w", Duration::from_millis(500))
            .for_occurrence(&occurrence, Some(SECOND))
            .unwrap()
    };
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let run = |ran: Arc<std::sync::atomic::AtomicUsize>| {
        failover.run(job(), move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, String>(()) }
        })
    };
    let first = run(ran.clone()).await.unwrap();
    assert!(matches!(first, RunOutcome::Done(())), "{first:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = run(ran.clone()).await.unwrap();
    assert!(
        matches!(late, RunOutcome::CompletedElsewhere),
        "the late run of {} ran it again: {late:?}",
        occurrence.id()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// A caller that keeps the stream without polling it: at most `report_capacity` reports wait
/// (the newest), and every other one is counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_nobody_reads_are_bounded_and_the_oldest_dropped_counted() {
    let srv = server();
    let client = client(&srv).await;
    let schedule = every(SECOND);
    let log = Log::default();
    let options = ScheduleOptions::builder()
        .report_capacity(2)
        .build()
        .unwrap();
    let mut runs = start(
        &client,
        "w",
        &schedule,
        "unread",
        SECOND,
        options,
        &log,
        |_, _| Act::Succeed,
    );
    // Not polled while five ticks run.
    let deadline = Instant::now() + 15 * SECOND;
    while runs.dropped_reports() < 3 {
        assert!(
            Instant::now() < deadline,
            "no drops after {} runs",
            log.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runs.stop();
    let mut kept = Vec::new();
    while let Some(report) = tokio::time::timeout(5 * SECOND, runs.next())
        .await
        .expect("the stream ends after stop")
    {
        kept.push(report);
    }
    assert!(kept.len() <= 2, "more than the capacity waited: {kept:?}");
    let ran = log.lock().unwrap().clone();
    let dropped = runs.dropped_reports() as usize;
    // One report per occurrence run here, plus one for a run stopped before its work began.
    let reported = kept.len() + dropped;
    assert!(
        reported == ran.len() || reported == ran.len() + 1,
        "{} kept + {dropped} dropped for {} runs",
        kept.len(),
        ran.len()
    );
    // The newest were kept: the last tick that ran is among them (unless a stopped run's
    // report came after it).
    let newest = ran.iter().map(|r| r.tick).max().unwrap();
    assert!(
        kept.iter().any(|r| r.occurrence.tick() >= newest),
        "the newest report was dropped: {kept:?}"
    );
}

/// A holder that hangs and an occurrence that then stops here, by dropping the stream or by
/// `stop()`: its attempt is failed at once (the backup takes it over long before the 10 s
/// lease), and `stop()` reports it.
async fn held_occurrence_is_failed_when(stop: bool) {
    let srv = server();
    let schedule = every(SECOND);
    let log = Log::default();
    let lease = 10 * SECOND;
    let (c1, c2) = (client(&srv).await, client(&srv).await);
    let opts = ScheduleOptions::default;
    let mut holder = start(&c1, "w1", &schedule, "held", lease, opts(), &log, |_, _| {
        Act::Hang
    });
    let held = wait_for_run(&log, 3 * SECOND, |r| r.worker == "w1").await;
    let _backup = start(
        &c2,
        "w2",
        &schedule,
        "held",
        lease,
        catch_up_last(),
        &log,
        |_, _| Act::Succeed,
    );
    let stopped = Instant::now();
    if stop {
        holder.stop();
        let report = take(&mut holder, 1, 3 * SECOND).await.remove(0);
        assert_eq!(report.occurrence.id(), held.occurrence);
        assert_eq!(ended(&report), "stopped");
        let end = tokio::time::timeout(3 * SECOND, holder.next()).await;
        assert!(
            matches!(end, Ok(None)),
            "the stream goes on after stop: {end:?}"
        );
    } else {
        drop(holder);
    }
    let takeover = wait_for_run(&log, WAKE, |r| {
        r.occurrence == held.occurrence && r.worker == "w2"
    })
    .await;
    assert_eq!(takeover.attempt, 2);
    let after = takeover.at.duration_since(stopped);
    assert!(
        after < 3 * SECOND,
        "taken over only {after:?} after the holder stopped"
    );
    // The holder's client is still connected: only the stream stopped.
    drop(c1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_fails_a_held_occurrence_so_a_backup_takes_over_at_once() {
    held_occurrence_is_failed_when(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_reports_a_held_occurrence_and_a_backup_takes_over_at_once() {
    held_occurrence_is_failed_when(true).await;
}

/// `Failover::occurrence` binds by the server's clock (`occurrence_at(server_time)`), a run
/// that binds to a coming tick waits for it with `wait_until_due`, and after the wait the
/// server's clock is at or past the tick.
async fn binds_by_the_server_clock(client: &Client, key: &str) {
    let failover = client.failover();
    let schedule = every(SECOND); // E is capped at half the period: 0.5 s
                                  // Come to 0.15–0.4 s before a tick by the server's clock.
    let mut ready = false;
    for _ in 0..5 {
        let now = failover.server_time(key).await.unwrap();
        let left = schedule
            .next_after(now)
            .unwrap()
            .duration_since(now)
            .unwrap();
        if left >= Duration::from_millis(150) && left <= Duration::from_millis(400) {
            ready = true;
            break;
        }
        let nap = if left > Duration::from_millis(400) {
            left - Duration::from_millis(300)
        } else {
            left + Duration::from_millis(700)
        };
        tokio::time::sleep(nap).await;
    }
    assert!(ready, "never came to just before a tick");
    let before = failover.server_time(key).await.unwrap();
    let occurrence = failover.occurrence(&schedule, key).await.unwrap();
    let after = failover.server_time(key).await.unwrap();
    for t in [before, after] {
        assert_eq!(
            schedule.occurrence_at(t).as_ref(),
            Some(&occurrence),
            "occurrence() is occurrence_at(server_time)"
        );
    }
    assert!(
        occurrence.tick() > after,
        "an early run binds to the coming tick"
    );
    failover.wait_until_due(&occurrence, key).await.unwrap();
    let due = failover.server_time(key).await.unwrap();
    assert!(due >= occurrence.tick(), "woke before the tick");
    assert!(
        due < occurrence.tick() + Duration::from_millis(400),
        "woke {:?} after the tick",
        due.duration_since(occurrence.tick())
    );
    // Now a little late: the run binds to the tick that passed.
    assert_eq!(
        failover.occurrence(&schedule, key).await.unwrap(),
        occurrence
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrence_and_wait_until_due_go_by_the_server_clock() {
    let srv = server();
    binds_by_the_server_clock(&client(&srv).await, "bind").await;
}

// ---------------------------------------------------------------------------------------------
// Jitter
// ---------------------------------------------------------------------------------------------

/// A thousand schedules on different keys that tick at the same instant start spread over
/// `[0, D)`: all within it, nearly all at distinct instants, every tenth of `D` about as
/// full as the others. Pure: the same on every host.
#[test]
fn jitter_spreads_schedules_that_tick_at_the_same_instant() {
    let hourly = every(Duration::from_secs(3600));
    let tick: SystemTime =
        SystemTime::from("2026-11-26T02:00:00Z".parse::<jiff::Timestamp>().unwrap());
    let occurrence = hourly.occurrence_of_tick(tick).unwrap();
    let (d, lease) = (Duration::from_secs(60), Duration::from_secs(30));
    let starts: Vec<SystemTime> = (0..1000)
        .map(|k| occurrence.jittered_start(&format!("report-{k}"), d, lease))
        .collect();
    let mut tenths = [0u32; 10];
    for start in &starts {
        let j = start.duration_since(tick).expect("never before the tick");
        assert!(j < d, "{j:?} is not below {d:?}");
        tenths[(j.as_millis() * 10 / d.as_millis()) as usize] += 1;
    }
    let distinct: BTreeSet<_> = starts.iter().collect();
    // 1000 draws among 60 000 milliseconds: about 8 collide.
    assert!(distinct.len() >= 980, "{} distinct starts", distinct.len());
    for (i, n) in tenths.iter().enumerate() {
        assert!(
            (60..=140).contains(n),
            "tenth {i} of D holds {n} of 1000: {tenths:?}"
        );
    }
    // The same key at successive ticks spreads too (the tick is hashed).
    let js: BTreeSet<_> = std::iter::successors(Some(occurrence.clone()), |o| {
        hourly.occurrence_of_tick(o.next_tick().unwrap())
    })
    .take(100)
    .map(|o| o.jitter("report-0", d, lease))
    .collect();
    assert!(js.len() >= 95, "{js:?}");
    // Jitter is not in the digest: a rolling change of it never splits a tick into two jobs.
    assert_eq!(
        occurrence.job_key("report-0"),
        format!("report-0@{}@{}", hourly.digest(), occurrence.id())
    );
}

/// `every 2s` with E = 200 ms and a 500 ms lease leaves 1.3 s of room: D = 1.2 s fits.
const JITTER_PERIOD: Duration = Duration::from_secs(2);
const JITTER_EARLY: Duration = Duration::from_millis(200);
const JITTER_LEASE: Duration = Duration::from_millis(500);
const JITTER: Duration = Duration::from_millis(1200);

/// A key whose jitter is at least 400 ms at each of the next 8 ticks after `now`, so a start
/// at the tick (no jitter) could not pass for one at the tick plus its jitter.
fn key_with_long_jitters(schedule: &Schedule, now: SystemTime) -> String {
    (0..10_000)
        .map(|k| format!("jittered-{k}"))
        .find(|key| {
            std::iter::successors(schedule.occurrence_at(now), |o| {
                schedule.occurrence_of_tick(o.next_tick().unwrap())
            })
            .take(8)
            .all(|o| o.jitter(key, JITTER, JITTER_LEASE) >= Duration::from_millis(400))
        })
        .expect("a key with long jitters")
}

/// Three workers with the same jitter: each occurrence runs once, its attempt 1 starting at the
/// tick plus the jitter the library computes (by the server's clock), never before, and before
/// the next tick's window opens. Whichever worker won, none started earlier: the three compute
/// the same start.
async fn three_workers_start_each_occurrence_at_its_jittered_start(clients: &[Client]) {
    let schedule = every(JITTER_PERIOD).early(JITTER_EARLY);
    let now = clients[0].failover().server_time("any").await.unwrap();
    let key = key_with_long_jitters(&schedule, now);
    let log = Log::default();
    let options = || ScheduleOptions::builder().jitter(JITTER).build().unwrap();
    let mut streams: Vec<_> = clients
        .iter()
        .zip(["w1", "w2", "w3"])
        .map(|(c, name)| {
            start(
                c,
                name,
                &schedule,
                &key,
                JITTER_LEASE,
                options(),
                &log,
                |_, _| Act::Succeed,
            )
        })
        .collect();
    let mut seen: BTreeMap<SystemTime, Vec<String>> = BTreeMap::new();
    for runs in &mut streams {
        for report in take(runs, 2, 3 * JITTER_PERIOD).await {
            seen.entry(report.occurrence.tick())
                .or_default()
                .push(ended(&report));
        }
    }
    drop(streams);
    let runs = log.lock().unwrap().clone();
    assert!(seen.len() >= 2, "{seen:?}");
    for (tick, ends) in &seen {
        if ends.len() < 3 {
            continue; // a worker's third report: another tick
        }
        let mut ends = ends.clone();
        ends.sort();
        assert_eq!(ends, ["done", "elsewhere", "elsewhere"], "tick {tick:?}");
    }
    assert!(!runs.is_empty());
    for run in &runs {
        let occurrence = schedule.occurrence_of_tick(run.tick).unwrap();
        let start = occurrence.jittered_start(&key, JITTER, JITTER_LEASE);
        assert!(
            start >= run.tick + Duration::from_millis(400),
            "the key's jitter is long"
        );
        assert_eq!(run.attempt, 1, "{run:?}");
        assert!(
            run.server_time >= start,
            "{run:?} started {:?} before its tick + jitter",
            start.duration_since(run.server_time).unwrap()
        );
        let next = occurrence.next_tick().unwrap();
        assert!(
            run.server_time < next - JITTER_EARLY,
            "{run:?} started in the next tick's window"
        );
        assert_eq!(
            runs.iter().filter(|r| r.tick == run.tick).count(),
            1,
            "{runs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_start_each_occurrence_at_its_tick_plus_its_jitter() {
    let srv = server();
    let clients = [client(&srv).await, client(&srv).await, client(&srv).await];
    three_workers_start_each_occurrence_at_its_jittered_start(&clients).await;
}

/// `wait_until` waits for a jittered start by the server's clock, and returns at once for one
/// that has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_until_waits_for_the_jittered_start_by_the_server_clock() {
    let srv = server();
    let client = client(&srv).await;
    let failover = client.failover();
    let schedule = every(JITTER_PERIOD).early(JITTER_EARLY);
    let now = failover.server_time("w").await.unwrap();
    let key = key_with_long_jitters(&schedule, now);
    let occurrence = failover.occurrence(&schedule, &key).await.unwrap();
    let start = occurrence.jittered_start(&key, JITTER, JITTER_LEASE);
    failover.wait_until(&key, start).await.unwrap();
    let woke = failover.server_time(&key).await.unwrap();
    assert!(woke >= start, "woke before tick + jitter");
    // A start that has passed: at once, and the run still binds to the same occurrence.
    failover.wait_until(&key, occurrence.tick()).await.unwrap();
    assert_eq!(schedule.occurrence_at(woke), Some(occurrence));
}

/// A jitter longer than the period is a configuration error, reported for the occurrence
/// (which does not run) and naming the jitter and the period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jitter_longer_than_the_period_is_reported_and_nothing_runs() {
    let srv = server();
    let client = client(&srv).await;
    let log = Log::default();
    let options = ScheduleOptions::builder()
        .jitter(2 * SECOND)
        .build()
        .unwrap();
    let mut runs = start(
        &client,
        "w",
        &every(SECOND),
        "too-long",
        SECOND,
        options,
        &log,
        |_, _| Act::Succeed,
    );
    let report = take(&mut runs, 1, 3 * SECOND).await.remove(0);
    match &report.outcome {
        OccurrenceOutcome::Error(baton::Error::Config(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("jitter") && text.contains("2s") && text.contains("period"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(log.lock().unwrap().is_empty());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    async fn clients(db: &PgDatabase, n: usize) -> Vec<Client> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                Client::connect(db.url.clone())
                    .await
                    .expect("connect to PostgreSQL"),
            );
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn occurrence_and_wait_until_due_go_by_the_server_clock_on_postgres() {
        let db = PgDatabase::create();
        binds_by_the_server_clock(&clients(&db, 1).await[0], "bind").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_workers_start_each_occurrence_at_its_tick_plus_its_jitter_on_postgres() {
        let db = PgDatabase::create();
        three_workers_start_each_occurrence_at_its_jittered_start(&clients(&db, 3).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_workers_run_every_tick_once_on_postgres() {
        let db = PgDatabase::create();
        three_workers_run_every_tick_once(&clients(&db, 3).await, "tick").await;
    }
}
