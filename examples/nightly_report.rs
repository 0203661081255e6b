//! A nightly report on three workers, one of which crashes in the middle of a night's report.
//!
//! Every worker runs the same [`Failover::schedule`](baton::Failover::schedule): each night is
//! an occurrence with a job of its own (`nightly-report:RUN@DIGEST@NIGHT`), run by one worker,
//! taken over by a backup if it fails or crashes, never run twice.
//!
//! 1. `w1` starts first and takes the first night.
//! 2. `w2` and `w3` start while it works (a rolling deploy), with [`CatchUp::Last`]: the latest
//!    night is neither done nor exhausted, so they join it, as backups.
//! 3. `w1` crashes: its runtime stops mid-report, without `fail()` or a release. Its lease
//!    (1 s, kept alive while it ran) runs out, and a backup takes the night over as attempt 2.
//! 4. The next nights run once each, on whichever of `w2` and `w3` wins them.
//!
//! Each worker's reports are printed as they come; at the end the example checks that every
//! night ran to `DONE` exactly once (the crashed one by its attempt 2) and none was skipped.
//!
//! The "nights" here are seconds so that it runs in a few seconds; in production the schedule
//! would be `Schedule::cron_in("0 2 * * *", "Europe/Paris")?` (02:00 in Paris, daylight saving
//! included) and the lease a few minutes.
//!
//! Run it with a private, throw-away `redis-server` (it must be on `PATH`):
//!
//! ```text
//! cargo run --example nightly_report --features testing
//! ```
//!
//! or against a long-lived server (`REDIS_URL=redis://127.0.0.1:6379/`). Job keys contain the
//! process id and a timestamp, so reruns never find an old `DONE`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{
    CatchUp, Client, FailoverConfig, Occurrence, OccurrenceOutcome, OccurrenceReport, RunOutcome,
    Schedule, ScheduleOptions, Scheduled,
};
use tokio::sync::oneshot;
use tokio_stream::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The workers' lease: how long a crashed holder keeps its night before a backup takes over.
const LEASE: Duration = Duration::from_secs(1);
/// How long writing one report takes.
const REPORT_WORK: Duration = Duration::from_millis(150);
/// How many nights after the crashed one the survivors run before the example ends.
const NIGHTS_AFTER: usize = 3;

/// The schedule: a night every second (production: `0 2 * * *` in Europe/Paris).
fn nights() -> Result<Schedule, BoxError> {
    Ok(Schedule::every(Duration::from_secs(1))?)
}

/// What a report run returns: which attempt wrote it, with which fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The attempt of the night's job.
    pub attempt: u64,
    /// Its fencing token (what the report store would check).
    pub fence: u64,
}

/// A report as the "report store" received it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The night (the occurrence id, RFC 3339 UTC).
    pub night: String,
    /// Who wrote it.
    pub worker: &'static str,
    /// As which attempt.
    pub written: Written,
}

/// What one surviving worker saw of one night.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `w2` or `w3`.
    pub worker: &'static str,
    /// The night.
    pub night: Occurrence,
    /// How it ended on this worker: `done (attempt N)`, `done elsewhere`, …
    pub outcome: String,
    /// The attempt that wrote it, when this worker did.
    pub written: Option<Written>,
}

/// Everything the run did, for `main` to print and the test to check.
#[derive(Debug)]
pub struct Summary {
    /// The night `w1` crashed in.
    pub crashed: Occurrence,
    /// Each survivor's reports, in the order they came.
    pub seen: Vec<Seen>,
    /// The report store's contents.
    pub stored: Vec<Stored>,
    /// Each night's job state at the end (`DONE`, …).
    pub states: BTreeMap<String, String>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Keep the private server (if any) alive until the end of main.
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    let summary = demo(&url, &run_id()?).await?;
    summary.check()?;
    println!(
        "every night from {} on ran to DONE exactly once; the crashed one by attempt 2",
        summary.crashed.id()
    );
    Ok(())
}

/// A suffix that makes this run's job keys unique: the process id and the time in ms.
fn run_id() -> Result<String, BoxError> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    Ok(format!("{}-{ms}", std::process::id()))
}

fn config(key: &str, worker: &str) -> Result<FailoverConfig, BoxError> {
    Ok(FailoverConfig::builder(key)
        .lease(LEASE)
        .worker_name(worker)
        .build()?)
}

/// Runs the three workers against the Redis server at `url`; `run` makes the job key unique.
pub async fn demo(url: &str, run: &str) -> Result<Summary, BoxError> {
    let key = format!("nightly-report:{run}");
    let stored: Arc<Mutex<Vec<Stored>>> = Arc::default();

    // w1 runs in a "process" of its own: a runtime in a thread, which it crashes by stopping.
    let (started_tx, started_rx) = oneshot::channel();
    let (crash_tx, crash_rx) = oneshot::channel();
    let w1 = {
        let (url, config) = (url.to_string(), config(&key, "w1")?);
        let schedule = nights()?;
        std::thread::spawn(move || crashing_worker(url, schedule, config, started_tx, crash_rx))
    };
    let crashed: Occurrence = tokio::time::timeout(Duration::from_secs(5), started_rx)
        .await
        .map_err(|_| "w1 started no night")??;
    println!("w1  {}  starts the report", crashed.id());

    // The others start while w1 works: CatchUp::Last joins the running night as a backup.
    let mut survivors = Vec::new();
    for name in ["w2", "w3"] {
        let client = Client::connect(url).await?;
        let runs = report_worker(&client, name, &key, stored.clone())?;
        survivors.push((name, client, runs));
    }
    crash_tx.send(()).map_err(|_| "w1 is gone already")?;
    tokio::task::spawn_blocking(move || w1.join())
        .await?
        .map_err(|_| "w1's thread panicked")??;
    println!("w1  {}  crashes mid-report", crashed.id());

    // Each survivor reports until it has seen the crashed night and the nights after it.
    let mut seen = Vec::new();
    for (name, _, runs) in &mut survivors {
        let mut nights_seen = 0;
        let mut crashed_seen = false;
        while !crashed_seen || nights_seen < NIGHTS_AFTER {
            let report = tokio::time::timeout(Duration::from_secs(5), runs.next())
                .await
                .map_err(|_| format!("{name} reported nothing for 5 s"))?
                .ok_or("the stream ended")?;
            let s = describe(name, report);
            println!("{}  {}  {}", s.worker, s.night.id(), s.outcome);
            if s.night == crashed {
                crashed_seen = true;
            } else if s.night.tick() > crashed.tick() {
                nights_seen += 1;
            }
            seen.push(s);
        }
    }
    // What the coordinator stored for each night's job (as `baton status` would show it).
    let mut states = BTreeMap::new();
    for s in &seen {
        let job = config(&key, "check")?.for_occurrence(&s.night, None)?;
        let state = survivors[0].1.failover().job_state(job).await?;
        states.insert(s.night.id().to_string(), state.to_string());
    }
    for (_, client, runs) in survivors {
        runs.stop();
        drop(runs);
        client.shutdown(Duration::from_secs(2)).await;
    }
    let stored = stored.lock().map_err(|_| "poisoned")?.clone();
    Ok(Summary {
        crashed,
        seen,
        stored,
        states,
    })
}

/// A surviving worker: every night's report, written with the attempt's fencing token.
fn report_worker(
    client: &Client,
    name: &'static str,
    key: &str,
    stored: Arc<Mutex<Vec<Stored>>>,
) -> Result<Scheduled<Written, String>, BoxError> {
    let options = ScheduleOptions::builder().catch_up(CatchUp::Last).build()?;
    Ok(client.failover().schedule(
        nights()?,
        config(key, name)?,
        options,
        move |night, attempt| {
            let stored = stored.clone();
            async move {
                tokio::time::sleep(REPORT_WORK).await;
                let written = Written {
                    attempt: attempt.attempt,
                    fence: attempt.fencing_token,
                };
                stored.lock().map_err(|_| "poisoned")?.push(Stored {
                    night: night.id().to_string(),
                    worker: name,
                    written,
                });
                Ok::<_, String>(written)
            }
        },
    ))
}

/// w1: starts the first night's report, tells `started`, and crashes when `crash` says so.
fn crashing_worker(
    url: String,
    schedule: Schedule,
    config: FailoverConfig,
    started: oneshot::Sender<Occurrence>,
    crash: oneshot::Receiver<()>,
) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = Client::connect(url).await?;
        let started = Arc::new(Mutex::new(Some(started)));
        let runs = client.failover().schedule(
            schedule,
            config,
            ScheduleOptions::default(),
            move |night, _attempt| {
                let started = started.clone();
                async move {
                    if let Some(tx) = started.lock().map_err(|_| "poisoned")?.take() {
                        let _ = tx.send(night);
                    }
                    // The report never finishes: the process dies first.
                    std::future::pending::<Result<Written, String>>().await
                }
            },
        );
        let _ = crash.await;
        // A crashed process does nothing politely: dropping the stream or the client would
        // fail the attempt at once; here only the lease running out tells the others.
        std::mem::forget(runs);
        std::mem::forget(client);
        Ok::<_, BoxError>(())
    })?;
    rt.shutdown_background();
    Ok(())
}

fn describe(worker: &'static str, report: OccurrenceReport<Written, String>) -> Seen {
    let (outcome, written) = match report.outcome {
        OccurrenceOutcome::Ran(RunOutcome::Done(w)) => (
            format!("done here (attempt {}, fence {})", w.attempt, w.fence),
            Some(w),
        ),
        OccurrenceOutcome::Ran(RunOutcome::CompletedElsewhere) => ("done elsewhere".into(), None),
        OccurrenceOutcome::Ran(RunOutcome::Failed {
            attempt, reason, ..
        }) => (format!("attempt {attempt} failed: {reason}"), None),
        OccurrenceOutcome::Ran(RunOutcome::Exhausted {
            attempts: Some(attempts),
        }) => (format!("exhausted after {attempts} attempts"), None),
        OccurrenceOutcome::Ran(RunOutcome::Exhausted { attempts: None }) => {
            ("exhausted (found so)".into(), None)
        }
        OccurrenceOutcome::Skipped => ("skipped".into(), None),
        other => (format!("{other:?}"), None),
    };
    Seen {
        worker,
        night: report.occurrence,
        outcome,
        written,
    }
}

impl Summary {
    /// Every night from the crashed one on, with no gap, ran to `DONE` exactly once: one
    /// survivor wrote it, the other saw it done elsewhere, the store got it once, and the
    /// crashed night was written by attempt 2.
    pub fn check(&self) -> Result<(), BoxError> {
        let mut nights: BTreeMap<SystemTime, Vec<&Seen>> = BTreeMap::new();
        for s in self
            .seen
            .iter()
            .filter(|s| s.night.tick() >= self.crashed.tick())
        {
            nights.entry(s.night.tick()).or_default().push(s);
        }
        let ticks: Vec<_> = nights.keys().copied().collect();
        if ticks.first() != Some(&self.crashed.tick()) || ticks.len() <= NIGHTS_AFTER {
            return Err(format!("nights seen: {ticks:?}").into());
        }
        for pair in ticks.windows(2) {
            if pair[1].duration_since(pair[0])? != Duration::from_secs(1) {
                return Err(format!("a night was skipped: {ticks:?}").into());
            }
        }
        for (tick, seen) in &nights {
            let night = &seen[0].night;
            let written: Vec<_> = seen.iter().filter_map(|s| s.written).collect();
            let elsewhere = seen
                .iter()
                .filter(|s| s.outcome == "done elsewhere")
                .count();
            if written.len() != 1 || elsewhere + 1 != seen.len() {
                return Err(format!("night {tick:?} was not done exactly once: {seen:?}").into());
            }
            let stored = self.stored.iter().filter(|s| s.night == night.id()).count();
            if stored != 1 {
                return Err(format!("night {} was stored {stored} times", night.id()).into());
            }
            if self.states.get(night.id()).map(String::as_str) != Some("DONE") {
                return Err(
                    format!("night {} is {:?}", night.id(), self.states.get(night.id())).into(),
                );
            }
            if *night == self.crashed && written[0].attempt != 2 {
                return Err(format!("the crashed night was written by {:?}", written[0]).into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_night_runs_to_done_once_despite_the_crash() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        let summary = demo(&server.url(), &run_id().unwrap()).await.unwrap();
        summary.check().unwrap();
        // Both survivors saw the crashed night: one took it over, the other saw it done.
        let of_crashed: Vec<_> = summary
            .seen
            .iter()
            .filter(|s| s.night == summary.crashed)
            .collect();
        assert_eq!(of_crashed.len(), 2, "{of_crashed:?}");
    }
}
