//! A message-sending service: one sender at a time owns each message, a backup takes over when
//! a send fails, and the mail server rejects a stale sender by its fencing token.
//!
//! What fencing gives is not "exactly once": a holder that is paused past its lease can still
//! try to send; the mail server rejects that send once it has accepted one with a newer token
//! (so a stale writer never overwrites its successor), and a send that happened but whose
//! `done()` was lost is reported (`OutcomeUnknown`, or `NotRecorded` in the closure form) rather
//! than hidden. In this run nothing pauses, so each message is sent once; the summary counts it.
//!
//! Three sender processes (`s1`, `s2`, `s3`, each with its own [`baton::Client`]) all receive
//! the same 10 messages, `msg:<run>:1` ..= `msg:<run>:10`, and start a worker per message. The
//! worker that wins an attempt "sends" the message: it appends `(message, sender, attempt,
//! fencing token)` to a shared outbox (standing for the mail server, which rejects a send that
//! carries an older fencing token than one it already accepted), then calls `done()`. The first
//! attempt of every 3rd message fails with `fail("smtp timeout")`, so a backup on another sender
//! takes over as attempt 2.
//!
//! `s1` and `s2` read the [`baton::Event`] stream of each worker ([`baton::Failover::start`]);
//! `s3` uses the closure form ([`baton::Failover::run`]), which does the same wiring for you.
//!
//! stdout gets one JSON line per event (`worker`, `key`, `t_ms` since the start, and the
//! event's fields); lines with `action` are the sends, lines with `outcome` are `s3`'s
//! `RunOutcome`s. A per-message summary goes to stderr.
//!
//! Run it with a private, throw-away `redis-server` (it must be on `PATH`):
//!
//! ```text
//! cargo run --example message_sender --features testing
//! ```
//!
//! or against a long-lived server, e.g. the one from docker-compose:
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example message_sender --features testing
//! ```
//!
//! Message keys contain the process id and a timestamp, so reruns never find an old `DONE`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{Client, Event, FailoverConfig, RunOutcome};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How many messages the service receives.
const MESSAGES: u64 = 10;
/// The sender processes; the last one uses the closure form.
const SENDERS: [&str; 3] = ["s1", "s2", "s3"];
/// The first attempt of every `FLAKY_EVERY`th message fails.
const FLAKY_EVERY: u64 = 3;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Keep the private server (if any) alive until the end of main.
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    let started = std::time::Instant::now();
    let summary = demo(&url, &run_id()?).await?;

    eprintln!();
    for (i, key) in summary.keys.iter().enumerate() {
        let tries: Vec<String> = summary
            .tries
            .iter()
            .filter(|t| &t.message == key)
            .map(|t| {
                let result = t.error.as_deref().unwrap_or("sent");
                format!("attempt {} by {}: {result}", t.attempt, t.sender)
            })
            .collect();
        eprintln!(
            "{key:<40} {:<5} {}",
            summary.states[i].as_deref().unwrap_or("<missing>"),
            tries.join("; ")
        );
    }
    let counts = summary.sends_per_message();
    let once = counts.values().filter(|&&n| n == 1).count();
    eprintln!(
        "{once} of {} messages sent once ({} sends tried, {} failed) in {:.2}s",
        summary.keys.len(),
        summary.tries.len(),
        summary.tries.iter().filter(|t| t.error.is_some()).count(),
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// A suffix that makes this run's message keys unique: the process id and the time in ms.
fn run_id() -> Result<String, BoxError> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    Ok(format!("{}-{ms}", std::process::id()))
}

/// One message in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The message (its job key).
    pub message: String,
    /// Who sent it.
    pub sender: String,
    /// The attempt that sent it.
    pub attempt: u64,
    /// The attempt's fencing token.
    pub fencing_token: u64,
}

/// One try to send a message (one `Acquired`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Try {
    /// The message (its job key).
    pub message: String,
    /// Who tried.
    pub sender: String,
    /// The attempt number.
    pub attempt: u64,
    /// Why the send failed, if it did.
    pub error: Option<String>,
}

/// The outbox: what the "mail server" accepted. Like any resource written under a lease, it
/// checks fencing tokens, so a sender whose attempt was taken over cannot send with it.
#[derive(Debug, Default)]
struct Outbox {
    sent: Vec<Sent>,
    highest_token: HashMap<String, u64>,
}

impl Outbox {
    fn deliver(&mut self, sent: Sent) -> Result<(), String> {
        let highest = self.highest_token.entry(sent.message.clone()).or_default();
        if sent.fencing_token < *highest {
            return Err(format!(
                "stale fencing token {} (already saw {highest})",
                sent.fencing_token
            ));
        }
        *highest = sent.fencing_token;
        self.sent.push(sent);
        Ok(())
    }
}

/// What the run did, for `main` to print and the smoke test to check.
#[derive(Debug)]
pub struct Summary {
    /// The message keys, in order.
    pub keys: Vec<String>,
    /// Every send that was tried, in order.
    pub tries: Vec<Try>,
    /// What the outbox accepted, in order.
    pub outbox: Vec<Sent>,
    /// `GET baton:{KEY}` of each message at the end, in the order of `keys`.
    pub states: Vec<Option<String>>,
    /// `(sender, message, how its worker ended)`: the terminal event's name for `s1`/`s2`,
    /// the `RunOutcome` variant for `s3`.
    pub ends: Vec<(String, String, String)>,
}

impl Summary {
    /// How many times each message landed in the outbox.
    pub fn sends_per_message(&self) -> HashMap<String, usize> {
        let mut counts: HashMap<String, usize> = self.keys.iter().map(|k| (k.clone(), 0)).collect();
        for sent in &self.outbox {
            *counts.entry(sent.message.clone()).or_default() += 1;
        }
        counts
    }
}

/// What every sender shares: the clock, the outbox and the record of tries.
struct Service {
    t0: Instant,
    outbox: Mutex<Outbox>,
    tries: Mutex<Vec<Try>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Service {
    /// Prints one JSON line: `fields` plus who, which message and when.
    fn print(&self, worker: &str, key: &str, mut line: Value) -> Result<(), BoxError> {
        let fields = line.as_object_mut().ok_or("a line must be a JSON object")?;
        fields.insert("worker".into(), json!(worker));
        fields.insert("key".into(), json!(key));
        fields.insert("t_ms".into(), json!(self.t0.elapsed().as_millis() as u64));
        println!("{line}");
        Ok(())
    }

    /// Prints an event, serialized by serde.
    fn event(&self, worker: &str, key: &str, event: &Event) -> Result<(), BoxError> {
        self.print(worker, key, serde_json::to_value(event)?)
    }

    /// "Sends" message number `index` (job `key`) under `attempt`: the work both forms run.
    async fn send(
        &self,
        sender: &str,
        index: u64,
        key: &str,
        attempt: u64,
        fencing_token: u64,
    ) -> Result<(), String> {
        // Talking to the mail server takes a few ms.
        tokio::time::sleep(Duration::from_millis(5 + index % 4 * 5)).await;
        let result = if index % FLAKY_EVERY == 0 && attempt == 1 {
            Err("smtp timeout".to_string())
        } else {
            lock(&self.outbox).deliver(Sent {
                message: key.to_string(),
                sender: sender.to_string(),
                attempt,
                fencing_token,
            })
        };
        lock(&self.tries).push(Try {
            message: key.to_string(),
            sender: sender.to_string(),
            attempt,
            error: result.clone().err(),
        });
        let mut line = json!({
            "action": "send",
            "attempt": attempt,
            "fencing_token": fencing_token,
            "ok": result.is_ok(),
        });
        if let Err(error) = &result {
            line["error"] = json!(error);
        }
        self.print(sender, key, line).map_err(|e| e.to_string())?;
        result
    }
}

fn job(key: &str, sender: &str) -> Result<FailoverConfig, BoxError> {
    Ok(FailoverConfig::builder(key)
        .lease(Duration::from_secs(2))
        .max_attempts(3)
        // DONE/EXHAUSTED are kept this long (default 24 h), so a late duplicate is not re-run;
        // short here so the demo's keys do not pile up in a long-lived Redis.
        .retention(Duration::from_secs(600))
        .worker_name(sender)
        .build()?)
}

/// The event-stream form: one worker for one message. Returns the terminal event's name.
async fn send_with_events(
    service: Arc<Service>,
    client: Client,
    sender: &'static str,
    index: u64,
    key: String,
) -> Result<String, BoxError> {
    let mut worker = client.failover().start(job(&key, sender)?);
    while let Some(event) = worker.next().await {
        service.event(sender, &key, &event)?;
        match event {
            Event::Acquired(attempt) => {
                let sent = service
                    .send(sender, index, &key, attempt.attempt, attempt.fencing_token)
                    .await;
                match sent {
                    Ok(()) => attempt.done().await?,
                    // A backup on another sender takes over at once.
                    Err(reason) => attempt.fail(reason).await?,
                }
            }
            event if event.is_terminal() => {
                let end = serde_json::to_value(&event)?;
                return Ok(end["event"].as_str().unwrap_or_default().to_string());
            }
            _ => {}
        }
    }
    Err(format!("the stream of {sender} for {key} ended without a terminal event").into())
}

/// The closure form: `run` wires the stream, turns `Ok`/`Err` into `done()`/`fail()`.
/// Returns the `RunOutcome` variant's name.
async fn send_with_run(
    service: Arc<Service>,
    client: Client,
    sender: &'static str,
    index: u64,
    key: String,
) -> Result<String, BoxError> {
    let work_service = service.clone();
    let outcome = client
        .failover()
        .run(job(&key, sender)?, move |attempt| {
            let service = work_service.clone();
            async move {
                service
                    .send(
                        sender,
                        index,
                        &attempt.key,
                        attempt.attempt,
                        attempt.fencing_token,
                    )
                    .await
            }
        })
        .await?;
    let (name, detail) = match &outcome {
        RunOutcome::Done(()) => ("Done", Value::Null),
        RunOutcome::CompletedElsewhere => ("CompletedElsewhere", Value::Null),
        RunOutcome::Failed {
            attempt, reason, ..
        } => ("Failed", json!({"attempt": attempt, "reason": reason})),
        RunOutcome::Exhausted { attempts } => ("Exhausted", json!({"attempts": attempts})),
        RunOutcome::LeaseLost { attempt, reason } => {
            ("LeaseLost", json!({"attempt": attempt, "reason": reason}))
        }
        RunOutcome::Stopped => ("Stopped", Value::Null),
        _ => ("Other", json!({ "debug": format!("{outcome:?}") })),
    };
    let mut line = json!({ "outcome": name });
    if let (Some(line), Some(detail)) = (line.as_object_mut(), detail.as_object()) {
        line.extend(detail.clone());
    }
    service.print(sender, &key, line)?;
    Ok(name.to_string())
}

/// Runs the service against the Redis server at `url`; `run` makes the message keys unique.
pub async fn demo(url: &str, run: &str) -> Result<Summary, BoxError> {
    let service = Arc::new(Service {
        t0: Instant::now(),
        outbox: Mutex::new(Outbox::default()),
        tries: Mutex::new(Vec::new()),
    });
    let keys: Vec<String> = (1..=MESSAGES).map(|i| format!("msg:{run}:{i}")).collect();

    // One client per sender, as if each ran in its own process.
    let mut clients = Vec::new();
    for _ in SENDERS {
        clients.push(Client::connect(url).await?);
    }

    // Every sender receives every message and starts a worker for it.
    let mut workers = JoinSet::new();
    for (n, (sender, client)) in SENDERS.into_iter().zip(&clients).enumerate() {
        for (index, key) in (1..=MESSAGES).zip(&keys) {
            let (service, client, key) = (service.clone(), client.clone(), key.clone());
            workers.spawn(async move {
                let end = if n == SENDERS.len() - 1 {
                    send_with_run(service, client, sender, index, key.clone()).await
                } else {
                    send_with_events(service, client, sender, index, key.clone()).await
                };
                end.map(|end| (sender.to_string(), key, end))
            });
        }
    }
    let mut ends = Vec::new();
    while let Some(end) = workers.join_next().await {
        ends.push(end??);
    }
    ends.sort();

    let mut states = Vec::new();
    for key in &keys {
        states.push(Some(
            clients[0]
                .failover()
                .job_state(key.as_str())
                .await?
                .to_string(),
        ));
    }
    let tries = lock(&service.tries).clone();
    let outbox = lock(&service.outbox).sent.clone();
    Ok(Summary {
        keys,
        tries,
        outbox,
        states,
        ends,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_message_is_sent_exactly_once() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        let summary = demo(&server.url(), &run_id().unwrap()).await.unwrap();
        assert_eq!(summary.keys.len(), MESSAGES as usize);

        // Exactly one successful send per message, and every job is DONE.
        let counts = summary.sends_per_message();
        for key in &summary.keys {
            assert_eq!(counts[key], 1, "{key}: {:?}", summary.outbox);
        }
        assert_eq!(summary.outbox.len(), MESSAGES as usize);
        for (key, state) in summary.keys.iter().zip(&summary.states) {
            assert_eq!(state.as_deref(), Some("DONE"), "{key}");
        }

        // One try per attempt; the flaky messages needed a second attempt, on another sender.
        for (i, key) in (1..=MESSAGES).zip(&summary.keys) {
            let tries: Vec<&Try> = summary.tries.iter().filter(|t| &t.message == key).collect();
            let attempts: Vec<u64> = tries.iter().map(|t| t.attempt).collect();
            let sent = summary.outbox.iter().find(|s| &s.message == key).unwrap();
            if i % FLAKY_EVERY == 0 {
                assert_eq!(attempts, vec![1, 2], "{key}: {tries:?}");
                assert_eq!(tries[0].error.as_deref(), Some("smtp timeout"));
                assert_eq!(sent.attempt, 2);
                assert_ne!(sent.sender, tries[0].sender, "{key}: a backup sent it");
            } else {
                assert_eq!(attempts, vec![1], "{key}: {tries:?}");
                assert_eq!(sent.attempt, 1);
            }
        }

        // Every worker of every sender ended, and none lost its attempt or hit an error.
        assert_eq!(summary.ends.len(), SENDERS.len() * MESSAGES as usize);
        for (sender, key, end) in &summary.ends {
            let expected: &[&str] = if sender == "s3" {
                &["Done", "CompletedElsewhere", "Failed"]
            } else {
                &["Completed", "Failed"]
            };
            assert!(expected.contains(&end.as_str()), "{sender} {key}: {end}");
        }
    }
}
