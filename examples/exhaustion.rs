//! Flaky work and `max_attempts`: the job ends `DONE`, or `EXHAUSTED` after 3 failed attempts.
//!
//! Four workers (`w1` ..= `w4`, each with its own [`baton::Client`], as if in separate
//! processes) receive one job with `max_attempts(3)`. The work succeeds with probability 0.15
//! (like the original `redis-locking-worker` example), decided by a small seeded PRNG
//! (splitmix64), so a run is reproducible: set `SEED` (default 42) to try other luck. A worker
//! whose attempt fails gives it up with `fail(...)` and a backup takes over at once; after the
//! third failure the job is marked `EXHAUSTED` and every worker stops, whoever is left.
//! No more than 3 attempts ever start, however many workers there are.
//!
//! stdout gets one JSON line per event (`worker`, `key`, `t_ms` since the start, and the
//! event's fields); lines with `action` are the work's dice rolls. The outcome goes to stderr.
//!
//! Run it with a private, throw-away `redis-server` (it must be on `PATH`):
//!
//! ```text
//! cargo run --example exhaustion --features testing
//! SEED=7 cargo run --example exhaustion --features testing
//! ```
//!
//! With the default seed all three attempts fail (`EXHAUSTED`); with `SEED=7` the second
//! attempt succeeds (`DONE`).
//!
//! or against a long-lived server, e.g. the one from docker-compose:
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example exhaustion --features testing
//! ```
//!
//! The job key contains the process id and a timestamp, so reruns never find an old state.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{Client, Event, FailoverConfig};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_stream::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How likely one run of the work is to succeed.
const SUCCESS_PROBABILITY: f64 = 0.15;
/// The seed used when `SEED` is not set.
const DEFAULT_SEED: u64 = 42;
const WORKERS: [&str; 4] = ["w1", "w2", "w3", "w4"];
const MAX_ATTEMPTS: u64 = 3;
/// How long one run of the work takes.
const WORK: Duration = Duration::from_millis(50);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seed = match std::env::var("SEED") {
        Ok(s) => s
            .parse()
            .map_err(|e| format!("SEED must be an unsigned integer: {e}"))?,
        Err(_) => DEFAULT_SEED,
    };
    // Keep the private server (if any) alive until the end of main.
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    let started = std::time::Instant::now();
    let summary = demo(&url, &run_id()?, seed, SUCCESS_PROBABILITY).await?;

    eprintln!();
    for run in &summary.runs {
        eprintln!(
            "attempt {} on {}: roll {:.3} -> {}",
            run.attempt,
            run.worker,
            run.roll,
            if run.success { "success" } else { "failure" }
        );
    }
    let state = summary.state.as_deref().unwrap_or("<missing>");
    let attempts = summary.runs.len();
    match state {
        "DONE" => eprintln!("outcome: DONE at attempt {attempts} of {MAX_ATTEMPTS}"),
        "EXHAUSTED" => eprintln!("outcome: EXHAUSTED after {attempts} attempts"),
        other => eprintln!("outcome: unexpected state {other} after {attempts} attempts"),
    }
    let ends: Vec<String> = summary
        .ends
        .iter()
        .map(|(w, e)| format!("{w} {e}"))
        .collect();
    eprintln!(
        "job {} (seed {seed}, success probability {SUCCESS_PROBABILITY}); workers ended: {}; \
         {:.2}s",
        summary.key,
        ends.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A suffix that makes this run's job key unique: the process id and the time in ms.
fn run_id() -> Result<String, BoxError> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    Ok(format!("{}-{ms}", std::process::id()))
}

/// splitmix64: a tiny, well-mixed PRNG, enough to make the dice reproducible.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One run of the work (one `Acquired`).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Who ran it.
    pub worker: String,
    /// The attempt number.
    pub attempt: u64,
    /// The dice roll in `[0, 1)`.
    pub roll: f64,
    /// Whether `roll < success probability`.
    pub success: bool,
}

/// What happened, for `main` to print and the smoke test to check.
#[derive(Debug)]
pub struct Summary {
    /// The job name.
    pub key: String,
    /// Every run of the work, in order.
    pub runs: Vec<Run>,
    /// Each worker's terminal event (`"Exhausted"`, `"Failed"`, `"Completed"`, ...).
    pub ends: Vec<(String, String)>,
    /// `GET baton:{KEY}` at the end: `DONE` or `EXHAUSTED`.
    pub state: Option<String>,
}

/// What the workers share: the clock, the dice and the record of runs.
struct Shared {
    t0: Instant,
    key: String,
    p_success: f64,
    dice: Mutex<SplitMix64>,
    runs: Mutex<Vec<Run>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Prints one JSON line: `fields` plus who, which job and when.
    fn print(&self, worker: &str, mut line: Value) -> Result<(), BoxError> {
        let fields = line.as_object_mut().ok_or("a line must be a JSON object")?;
        fields.insert("worker".into(), json!(worker));
        fields.insert("key".into(), json!(self.key));
        fields.insert("t_ms".into(), json!(self.t0.elapsed().as_millis() as u64));
        println!("{line}");
        Ok(())
    }

    /// The flaky work: takes a while, then succeeds with probability `p_success`.
    async fn work(&self, worker: &str, attempt: u64) -> Result<Run, BoxError> {
        tokio::time::sleep(WORK).await;
        // Attempts run one after another, so the n-th roll always belongs to attempt n.
        let roll = lock(&self.dice).next_f64();
        let run = Run {
            worker: worker.to_string(),
            attempt,
            roll,
            success: roll < self.p_success,
        };
        lock(&self.runs).push(run.clone());
        self.print(
            worker,
            json!({"action": "work", "attempt": attempt, "roll": roll, "success": run.success}),
        )?;
        Ok(run)
    }
}

/// One worker's consumer loop. Returns the name of its terminal event.
async fn worker(
    shared: Arc<Shared>,
    client: Client,
    name: &'static str,
    config: FailoverConfig,
) -> Result<String, BoxError> {
    let mut events = client.failover().start(config);
    while let Some(event) = events.next().await {
        shared.print(name, serde_json::to_value(&event)?)?;
        match event {
            Event::Acquired(attempt) => {
                let run = shared.work(name, attempt.attempt).await?;
                if run.success {
                    attempt.done().await?;
                } else {
                    let reason = format!("roll {:.3} >= {}", run.roll, shared.p_success);
                    attempt.fail(reason).await?;
                }
            }
            event if event.is_terminal() => {
                let end = serde_json::to_value(&event)?;
                return Ok(end["event"].as_str().unwrap_or_default().to_string());
            }
            _ => {}
        }
    }
    Err(format!("the stream of {name} ended without a terminal event").into())
}

/// Runs the job on four workers against the Redis server at `url`. `run` makes the key unique;
/// `seed` and `p_success` decide how the work goes.
pub async fn demo(url: &str, run: &str, seed: u64, p_success: f64) -> Result<Summary, BoxError> {
    let key = format!("demo:exhaustion:{run}");
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        key: key.clone(),
        p_success,
        dice: Mutex::new(SplitMix64(seed)),
        runs: Mutex::new(Vec::new()),
    });
    let mut clients = Vec::new();
    for _ in WORKERS {
        clients.push(Client::connect(url).await?);
    }
    let mut tasks = Vec::new();
    for (name, client) in WORKERS.into_iter().zip(&clients) {
        let config = FailoverConfig::builder(&key)
            .lease(Duration::from_secs(2))
            .max_attempts(MAX_ATTEMPTS)
            // DONE/EXHAUSTED are kept this long (default 24 h), so a late duplicate is not re-run;
            // short here so the demo's keys do not pile up in a long-lived Redis.
            .retention(Duration::from_secs(600))
            .worker_name(name)
            .build()?;
        tasks.push(tokio::spawn(worker(
            shared.clone(),
            client.clone(),
            name,
            config,
        )));
    }
    let mut ends = Vec::new();
    for (name, task) in WORKERS.into_iter().zip(tasks) {
        ends.push((name.to_string(), task.await??));
    }
    let state = Some(
        clients[0]
            .failover()
            .job_state(key.as_str())
            .await?
            .to_string(),
    );
    let runs = lock(&shared.runs).clone();
    Ok(Summary {
        key,
        runs,
        ends,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_always_fails_ends_exhausted_after_exactly_max_attempts() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        let summary = demo(&server.url(), &run_id().unwrap(), DEFAULT_SEED, 0.0)
            .await
            .unwrap();
        assert_eq!(summary.state.as_deref(), Some("EXHAUSTED"));
        let attempts: Vec<u64> = summary.runs.iter().map(|r| r.attempt).collect();
        assert_eq!(attempts, vec![1, 2, 3], "{:?}", summary.runs);
        assert!(summary.runs.iter().all(|r| !r.success));
        // Each attempt ran on a different worker (a failed worker does not rejoin).
        let mut ran_on: Vec<&str> = summary.runs.iter().map(|r| r.worker.as_str()).collect();
        ran_on.sort();
        ran_on.dedup();
        assert_eq!(ran_on.len(), 3, "{:?}", summary.runs);
        assert_eq!(summary.ends.len(), WORKERS.len());
        for (worker, end) in &summary.ends {
            assert!(end == "Exhausted" || end == "Failed", "{worker}: {end}");
        }
        // The worker that never ran learns the job is exhausted.
        let idle = summary
            .ends
            .iter()
            .find(|(w, _)| !ran_on.contains(&w.as_str()))
            .unwrap();
        assert_eq!(idle.1, "Exhausted");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_same_seed_gives_the_same_story() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        let mut stories = Vec::new();
        for i in 0..2 {
            let run = format!("{}-{i}", run_id().unwrap());
            let s = demo(&server.url(), &run, DEFAULT_SEED, SUCCESS_PROBABILITY)
                .await
                .unwrap();
            let rolls: Vec<(u64, u64, bool)> = s
                .runs
                .iter()
                .map(|r| (r.attempt, r.roll.to_bits(), r.success))
                .collect();
            // At most max_attempts runs, numbered 1, 2, ...; only the last may succeed.
            assert!(!rolls.is_empty() && rolls.len() <= MAX_ATTEMPTS as usize);
            assert!(rolls.iter().enumerate().all(|(i, r)| r.0 == i as u64 + 1));
            assert!(rolls[..rolls.len() - 1].iter().all(|r| !r.2));
            let done = rolls.last().unwrap().2;
            let expected = if done { "DONE" } else { "EXHAUSTED" };
            assert_eq!(s.state.as_deref(), Some(expected), "{rolls:?}");
            stories.push((rolls, s.state));
        }
        assert_eq!(stories[0], stories[1]);
    }

    #[test]
    fn splitmix64_matches_the_reference() {
        // The first outputs of splitmix64 seeded with 0 (from the reference implementation).
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64(DEFAULT_SEED);
        assert!((0..1000)
            .map(|_| r.next_f64())
            .all(|x| (0.0..1.0).contains(&x)));
    }
}
