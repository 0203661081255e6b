//! Failover between one primary and two backups, in two scenes.
//!
//! Three workers (`w1`, `w2`, `w3`), each with its own [`baton::Client`] as if they ran in
//! separate processes, receive the same job:
//!
//! 1. **The primary fails.** `w1` wins attempt 1 and gives it up with `fail(...)`; a backup is
//!    woken at once, takes over as attempt 2 and completes it with `done()`. The other backup
//!    ends `Completed` without running anything.
//! 2. **The primary crashes.** `w1` wins attempt 1 of a second job, then its process dies
//!    without calling `done()` or `fail()` (here: its tokio runtime is dropped). The backups
//!    wait (`Locked`) until the 1.5 s lease runs out; then one of them takes over as attempt 2
//!    and completes the job.
//!
//! Every event is printed to stdout as one JSON line (`worker`, `key`, `t_ms` since the start
//! of the scene, and the event's own fields; lines with an `action` field say what the demo's
//! worker did). A human-readable timeline of both scenes is printed to stderr at the end.
//!
//! Run it with a private, throw-away `redis-server` (it must be on `PATH`):
//!
//! ```text
//! cargo run --example failover --features testing
//! ```
//!
//! or against a long-lived server, e.g. the one from docker-compose:
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example failover --features testing
//! ```
//!
//! Job keys contain the process id and a timestamp, so reruns never find an old `DONE`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{Client, Event, FailoverConfig, Worker};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_stream::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease of both scenes. Without the watchdog (the default) an attempt must end within it,
/// and a crashed holder blocks the job for at most this long.
const LEASE: Duration = Duration::from_millis(1500);
/// How long the primary "works" before its attempt fails or it crashes.
const PRIMARY_WORK: Duration = Duration::from_millis(300);
/// How long a backup's successful run takes.
const BACKUP_WORK: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Keep the private server (if any) alive until the end of main.
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    let started = std::time::Instant::now();
    let summary = demo(&url, &run_id()?).await?;
    eprintln!();
    summary
        .scene1
        .print_timeline("Scene 1: the primary fails, a backup takes over at once");
    eprintln!();
    summary
        .scene2
        .print_timeline("Scene 2: the primary crashes, a backup takes over when the lease expires");
    eprintln!();
    eprintln!(
        "scene 1: job {} ended {}; scene 2: job {} ended {}, takeover {:.3}s after the crashed \
         holder's grant (lease {:.3}s); total {:.2}s",
        summary.scene1.key,
        summary.scene1.state.as_deref().unwrap_or("<missing>"),
        summary.scene2.key,
        summary.scene2.state.as_deref().unwrap_or("<missing>"),
        summary
            .scene2
            .takeover_after
            .unwrap_or_default()
            .as_secs_f64(),
        LEASE.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// A suffix that makes this run's job keys unique: the process id and the time in ms.
fn run_id() -> Result<String, BoxError> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    Ok(format!("{}-{ms}", std::process::id()))
}

/// What both scenes did, for `main` to print and the smoke test to check.
#[derive(Debug)]
pub struct Summary {
    /// The primary fails its attempt.
    pub scene1: Scene,
    /// The primary crashes while it holds its attempt.
    pub scene2: Scene,
}

/// One scene's timeline and outcome.
#[derive(Debug)]
pub struct Scene {
    /// The job name.
    pub key: String,
    /// Everything that happened, in order.
    pub entries: Vec<Entry>,
    /// Each worker's terminal event (`"Completed"`, `"Failed"`, ...), `w1` first.
    pub ends: Vec<(String, String)>,
    /// What `GET baton:{KEY}` returned at the end.
    pub state: Option<String>,
    /// Scene 2: the time from the crashed holder's grant to the backup's takeover.
    pub takeover_after: Option<Duration>,
}

/// One line of a scene's timeline.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Since the start of the scene.
    pub t: Duration,
    /// `w1`, `w2`, `w3`.
    pub worker: String,
    /// The JSON line printed for it.
    pub line: Value,
}

impl Scene {
    /// `(worker, attempt, time)` of every `Acquired` event, in order.
    pub fn grants(&self) -> Vec<(String, u64, Duration)> {
        self.entries
            .iter()
            .filter(|e| e.line["event"] == "Acquired")
            .filter_map(|e| Some((e.worker.clone(), e.line["attempt"].as_u64()?, e.t)))
            .collect()
    }

    fn print_timeline(&self, title: &str) {
        eprintln!("{title} (job {})", self.key);
        for e in &self.entries {
            eprintln!(
                "  {:>6.3}s {} {}",
                e.t.as_secs_f64(),
                e.worker,
                describe(&e.line)
            );
        }
    }
}

/// A one-line, human description of a JSON line.
fn describe(v: &Value) -> String {
    let num = |field: &str| v[field].as_u64().unwrap_or_default();
    let text = |field: &str| v[field].as_str().unwrap_or_default().to_string();
    if let Some(action) = v["action"].as_str() {
        return match action {
            "fail" => format!("calls fail(\"{}\")", text("reason")),
            "crash" => "crashes: its process dies without done() or fail()".into(),
            other => format!("calls {other}()"),
        };
    }
    match v["event"].as_str().unwrap_or_default() {
        "Acquired" => format!(
            "Acquired attempt {} (fencing token {})",
            num("attempt"),
            num("fencing_token")
        ),
        "Locked" => match v["lease_remaining_ms"].as_u64() {
            Some(ms) => format!(
                "Locked: attempt {} runs elsewhere, lease {ms} ms left",
                num("attempt")
            ),
            None => format!("Locked: attempt {} runs elsewhere", num("attempt")),
        },
        "Failed" => format!("Failed attempt {}: {}", num("attempt"), text("reason")),
        "Completed" => match v["attempt"].as_u64() {
            Some(n) => format!("Completed: attempt {n} done by this worker"),
            None => "Completed: done by another worker".into(),
        },
        "Status" => format!("Status: {}", text("message")),
        "DeadlinePassed" => format!(
            "DeadlinePassed: attempt {}'s lease runs out",
            num("attempt")
        ),
        "LeaseLost" => format!("LeaseLost attempt {}: {}", num("attempt"), text("reason")),
        "Exhausted" => format!("Exhausted after {} attempts", num("attempts")),
        "Error" => format!("Error ({}): {}", text("kind"), text("message")),
        other => other.to_string(),
    }
}

/// Collects a scene's timeline and prints each line as JSON as it happens.
struct Timeline {
    t0: Instant,
    key: String,
    entries: Mutex<Vec<Entry>>,
}

impl Timeline {
    fn new(key: &str) -> Arc<Timeline> {
        Arc::new(Timeline {
            t0: Instant::now(),
            key: key.to_string(),
            entries: Mutex::new(Vec::new()),
        })
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an event: the event serialized by serde, plus who, which job and when.
    fn event(&self, worker: &str, event: &Event) -> Result<(), BoxError> {
        self.record(worker, serde_json::to_value(event)?)
    }

    /// Records something the demo's worker did (`{"action": ...}`).
    fn action(&self, worker: &str, fields: Value) -> Result<(), BoxError> {
        self.record(worker, fields)
    }

    fn record(&self, worker: &str, mut line: Value) -> Result<(), BoxError> {
        // Take the time and append under the lock, so the timeline stays in order.
        let mut entries = self.entries();
        let t = self.t0.elapsed();
        let fields = line
            .as_object_mut()
            .ok_or("an event must serialize to an object")?;
        fields.insert("worker".into(), json!(worker));
        fields.insert("key".into(), json!(self.key));
        fields.insert("t_ms".into(), json!(t.as_millis() as u64));
        println!("{line}");
        entries.push(Entry {
            t,
            worker: worker.to_string(),
            line,
        });
        Ok(())
    }
}

/// What a worker does with an attempt it wins.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Work for a while, then give the attempt up with this reason.
    Fail(&'static str),
    /// Work for a while, then record success.
    Done,
}

/// The consumer loop of one worker: reads its event stream to the end, acts on `Acquired`, and
/// returns the name of the terminal event. `won` is told when this worker wins an attempt.
async fn drive(
    name: &'static str,
    mut worker: Worker,
    plan: Plan,
    work: Duration,
    timeline: Arc<Timeline>,
    mut won: Option<oneshot::Sender<()>>,
) -> Result<String, BoxError> {
    while let Some(event) = worker.next().await {
        timeline.event(name, &event)?;
        match event {
            Event::Acquired(attempt) => {
                if let Some(tx) = won.take() {
                    let _ = tx.send(());
                }
                // The work. Without the watchdog it must end within the lease.
                tokio::time::sleep(work).await;
                match plan {
                    Plan::Fail(reason) => {
                        timeline.action(name, json!({"action": "fail", "reason": reason}))?;
                        attempt.fail(reason).await?;
                    }
                    Plan::Done => {
                        timeline.action(name, json!({"action": "done"}))?;
                        attempt.done().await?;
                    }
                }
                // The stream goes on with this worker's terminal event.
            }
            event if event.is_terminal() => return event_name(&event),
            _ => {}
        }
    }
    Err(format!("the stream of {name} ended without a terminal event").into())
}

fn event_name(event: &Event) -> Result<String, BoxError> {
    Ok(serde_json::to_value(event)?["event"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Connects one client per worker, as if each ran in its own process.
async fn clients(url: &str, n: usize) -> Result<Vec<Client>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Client::connect(url).await?);
    }
    Ok(out)
}

fn job(key: &str, worker: &str) -> Result<FailoverConfig, BoxError> {
    Ok(FailoverConfig::builder(key)
        .lease(LEASE)
        .max_attempts(3)
        // DONE/EXHAUSTED are kept this long (default 24 h), so a late duplicate is not re-run;
        // short here so the demo's keys do not pile up in a long-lived Redis.
        .retention(Duration::from_secs(600))
        .worker_name(worker)
        .build()?)
}

/// `GET baton:{KEY}`: the job's state (an attempt number, `DONE` or `EXHAUSTED`).
async fn state(client: &Client, key: &str) -> Result<Option<String>, BoxError> {
    Ok(Some(client.failover().job_state(key).await?.to_string()))
}

/// Runs both scenes against the Redis server at `url`; `run` makes the job keys unique.
pub async fn demo(url: &str, run: &str) -> Result<Summary, BoxError> {
    let scene1 = primary_fails(url, &format!("demo:failover:{run}:fails")).await?;
    let scene2 = primary_crashes(url, &format!("demo:failover:{run}:crashes")).await?;
    Ok(Summary { scene1, scene2 })
}

/// Scene 1: `w1` wins attempt 1 and fails it; a backup takes over at once.
async fn primary_fails(url: &str, key: &str) -> Result<Scene, BoxError> {
    let clients = clients(url, 3).await?;
    let timeline = Timeline::new(key);

    // The primary starts first, so it wins attempt 1.
    let (won_tx, won_rx) = oneshot::channel();
    let primary = tokio::spawn(drive(
        "w1",
        clients[0].failover().start(job(key, "w1")?),
        Plan::Fail("upstream timed out"),
        PRIMARY_WORK,
        timeline.clone(),
        Some(won_tx),
    ));
    won_rx.await?;

    // The backups join while it works, and wait.
    let mut backups = Vec::new();
    for (i, name) in [(1, "w2"), (2, "w3")] {
        backups.push(tokio::spawn(drive(
            name,
            clients[i].failover().start(job(key, name)?),
            Plan::Done,
            BACKUP_WORK,
            timeline.clone(),
            None,
        )));
    }

    let mut ends = vec![("w1".to_string(), primary.await??)];
    for (name, task) in ["w2", "w3"].into_iter().zip(backups) {
        ends.push((name.to_string(), task.await??));
    }
    let state = state(&clients[0], key).await?;
    let entries = timeline.entries().clone();
    Ok(Scene {
        key: key.to_string(),
        entries,
        ends,
        state,
        takeover_after: None,
    })
}

/// Scene 2: `w1` wins attempt 1 and crashes; a backup takes over once the lease expires.
async fn primary_crashes(url: &str, key: &str) -> Result<Scene, BoxError> {
    let clients = clients(url, 2).await?;
    let timeline = Timeline::new(key);

    // The holder runs on its own runtime in its own thread, its "process". Dropping that runtime
    // stops its tasks mid-attempt without done() or fail(): nothing tells Redis, only the lease
    // running out does.
    let (won_tx, won_rx) = oneshot::channel();
    let holder = {
        let (url, cfg, timeline) = (url.to_string(), job(key, "w1")?, timeline.clone());
        std::thread::spawn(move || crashing_holder(url, cfg, timeline, won_tx))
    };
    // The backups join once the holder has won attempt 1.
    let won = won_rx.await;
    let mut backups = Vec::new();
    if won.is_ok() {
        for (client, name) in clients.iter().zip(["w2", "w3"]) {
            backups.push(tokio::spawn(drive(
                name,
                client.failover().start(job(key, name)?),
                Plan::Done,
                BACKUP_WORK,
                timeline.clone(),
                None,
            )));
        }
    }
    let crashed = tokio::task::spawn_blocking(move || holder.join())
        .await?
        .map_err(|_| "the holder thread panicked")?;
    crashed?;

    let mut ends = vec![("w1".to_string(), "<crashed>".to_string())];
    for (name, task) in ["w2", "w3"].into_iter().zip(backups) {
        ends.push((name.to_string(), task.await??));
    }
    let state = state(&clients[0], key).await?;
    let entries = timeline.entries().clone();
    let mut scene = Scene {
        key: key.to_string(),
        entries,
        ends,
        state,
        takeover_after: None,
    };
    let grants = scene.grants();
    let first = grants.iter().find(|g| g.1 == 1).map(|g| g.2);
    let second = grants.iter().find(|g| g.1 == 2).map(|g| g.2);
    if let (Some(first), Some(second)) = (first, second) {
        // Measured from when w1 *received* its grant, which is after Redis set the lease, so
        // this errs on the short side.
        scene.takeover_after = Some(second.saturating_sub(first));
    }
    Ok(scene)
}

/// The crashing holder: wins attempt 1, "works" briefly, then dies with its runtime.
fn crashing_holder(
    url: String,
    cfg: FailoverConfig,
    timeline: Arc<Timeline>,
    won: oneshot::Sender<()>,
) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = Client::connect(url).await?;
        let mut worker = client.failover().start(cfg);
        loop {
            let Some(event) = worker.next().await else {
                return Err::<(), BoxError>("the holder's stream ended early".into());
            };
            timeline.event("w1", &event)?;
            match event {
                Event::Acquired(attempt) => {
                    let _ = won.send(());
                    tokio::time::sleep(PRIMARY_WORK).await;
                    // Leak the attempt handle and the stream: dropping them would fail the
                    // attempt politely, and a crashed process does nothing politely.
                    std::mem::forget(attempt);
                    std::mem::forget(worker);
                    return Ok(());
                }
                event if event.is_terminal() => {
                    return Err(format!("the holder ended before acquiring: {event:?}").into())
                }
                _ => {}
            }
        }
    })?;
    timeline.action("w1", json!({"action": "crash"}))?;
    drop(rt);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_scenes_hand_the_job_over_once() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        let summary = demo(&server.url(), &run_id().unwrap()).await.unwrap();

        // Scene 1: w1 ran attempt 1 and failed it; a backup ran attempt 2 and completed it.
        let s1 = &summary.scene1;
        let grants: Vec<_> = s1.grants().into_iter().map(|(w, a, _)| (w, a)).collect();
        assert_eq!(
            grants.len(),
            2,
            "exactly one Acquired per attempt: {grants:?}"
        );
        assert_eq!(grants[0], ("w1".to_string(), 1));
        assert_eq!(grants[1].1, 2);
        assert!(["w2", "w3"].contains(&grants[1].0.as_str()), "{grants:?}");
        assert_eq!(s1.state.as_deref(), Some("DONE"));
        assert_eq!(s1.ends[0], ("w1".to_string(), "Failed".to_string()));
        assert!(
            s1.ends[1..].iter().all(|(_, end)| end == "Completed"),
            "{:?}",
            s1.ends
        );
        // The winner's Completed names its attempt; the other backup's does not.
        let completed: Vec<_> = s1
            .entries
            .iter()
            .filter(|e| e.line["event"] == "Completed")
            .map(|e| (e.worker.clone(), e.line["attempt"].as_u64()))
            .collect();
        assert_eq!(completed.len(), 2, "{completed:?}");
        assert!(
            completed.contains(&(grants[1].0.clone(), Some(2))),
            "{completed:?}"
        );

        // Scene 2: the takeover is attempt 2, by a backup, and not before the lease ran out.
        let s2 = &summary.scene2;
        let grants: Vec<_> = s2.grants().into_iter().map(|(w, a, _)| (w, a)).collect();
        assert_eq!(
            grants.len(),
            2,
            "exactly one Acquired per attempt: {grants:?}"
        );
        assert_eq!(grants[0], ("w1".to_string(), 1));
        assert_eq!(grants[1].1, 2);
        assert!(["w2", "w3"].contains(&grants[1].0.as_str()), "{grants:?}");
        let waited = s2.takeover_after.expect("a takeover");
        assert!(
            waited >= LEASE - Duration::from_millis(200),
            "took over after {waited:?}, lease {LEASE:?}"
        );
        // And not much later either: the backups wake when the lease can have ended.
        assert!(waited < LEASE * 3, "took over only after {waited:?}");
        assert!(s2
            .entries
            .iter()
            .any(|e| e.worker != "w1" && e.line["event"] == "Locked" && e.line["attempt"] == 1));
        assert_eq!(s2.state.as_deref(), Some("DONE"));
        assert!(
            s2.ends[1..].iter().all(|(_, end)| end == "Completed"),
            "{:?}",
            s2.ends
        );
    }
}
