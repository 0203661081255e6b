//! One chaos worker process: uses baton exactly as a user would, through its proxy port.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton::prelude::*;
use baton::{Client, Event, FailoverConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::util::{job_name, mix, mono_ns, BoxError, Jsonl, Rng};

/// The environment variable carrying the Redis URL (with the password): not on the command line.
pub const URL_ENV: &str = "BATON_CHAOS_REDIS_URL";
pub const WORKERS: usize = 4;
pub const LEASE: Duration = Duration::from_secs(1);
pub const MAX_ATTEMPTS: u64 = 3;
/// The mutex workload: tasks per worker process, lock names, the wait bound of one acquisition.
pub const MUTEX_TASKS: usize = 3;
pub const MUTEX_LOCKS: usize = 3;
pub const MUTEX_WAIT: Duration = Duration::from_secs(3);
/// The fair-lock workload: a waiter that stops refreshing its place (killed, paused) is evicted
/// after this, and a priority reservation whose owner is gone lapses after `FAIR_RESERVATION`.
/// The waiter timeout is the lease: a paused holder's own process often holds the queue's head
/// too, and a longer timeout would let the head's pause keep the lock from everyone else until
/// the holder resumes (its late commit then finds nothing newer and is accepted, correctly, but
/// the fencing check is not exercised).
pub const FAIR_WAITER_TIMEOUT: Duration = LEASE;
pub const FAIR_RESERVATION: Duration = Duration::from_millis(1500);
/// The file (in the run directory) whose existence tells mutex workers to stop early, once the
/// control process saw progress after the final heal.
pub const STOP_FILE: &str = "stop";

/// What the workers exercise: the failover coordinator (W1), the fenced mutex, leader election,
/// the fair lock, the semaphore (semaphore.rs) or the read-write lock (rw.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Failover,
    Mutex,
    Leader,
    Fair,
    Semaphore,
    Rw,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Failover => "failover",
            Workload::Mutex => "mutex",
            Workload::Leader => "leader",
            Workload::Fair => "fair",
            Workload::Semaphore => "semaphore",
            Workload::Rw => "rw",
        }
    }

    fn parse(s: &str) -> Result<Workload, BoxError> {
        match s {
            "failover" => Ok(Workload::Failover),
            "mutex" => Ok(Workload::Mutex),
            "leader" => Ok(Workload::Leader),
            "fair" => Ok(Workload::Fair),
            "semaphore" => Ok(Workload::Semaphore),
            "rw" => Ok(Workload::Rw),
            _ => Err(format!(
                "unknown workload {s} (failover, mutex, leader, fair, semaphore, rw)"
            )
            .into()),
        }
    }
}

/// `m-1`.
pub fn lock_name(i: usize) -> String {
    format!("m-{i}")
}

/// `l-1`.
pub fn election_name(i: usize) -> String {
    format!("l-{i}")
}

/// `f-1`.
pub fn fair_lock_name(i: usize) -> String {
    format!("f-{i}")
}

#[derive(Debug, Clone)]
pub struct WorkerArgs {
    pub id: usize,
    pub inc: u32,
    pub run_dir: PathBuf,
    pub resource: String,
    pub jobs: usize,
    /// Monotonic ns of job 0's release, and the spacing between releases.
    pub t0: u64,
    pub spacing_ms: u64,
    pub seed: u64,
    pub workload: Workload,
    /// Mutex workload: monotonic ns at which the tasks stop taking locks (0: failover).
    pub deadline: u64,
    /// `replica_ack(1, LEASE / 2)` on every job (the cluster profile): a SIGKILLed primary's
    /// acknowledged grants are then on its replica, which gets promoted.
    pub replica_ack: bool,
}

impl WorkerArgs {
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--worker".into(),
            self.id.to_string(),
            "--inc".into(),
            self.inc.to_string(),
            "--run-dir".into(),
            self.run_dir.display().to_string(),
            "--resource-addr".into(),
            self.resource.clone(),
            "--jobs".into(),
            self.jobs.to_string(),
            "--t0".into(),
            self.t0.to_string(),
            "--spacing-ms".into(),
            self.spacing_ms.to_string(),
            "--seed".into(),
            self.seed.to_string(),
        ];
        // Only the mutex workload adds arguments: failover workers run as before.
        if self.workload != Workload::Failover {
            args.extend([
                "--workload".into(),
                self.workload.name().into(),
                "--deadline".into(),
                self.deadline.to_string(),
            ]);
        }
        if self.replica_ack {
            args.push("--replica-ack".into());
        }
        args
    }

    pub fn parse(args: &[String]) -> Result<WorkerArgs, BoxError> {
        let get = |name: &str| -> Result<String, BoxError> {
            let i = args
                .iter()
                .position(|a| a == name)
                .ok_or_else(|| format!("missing {name}"))?;
            Ok(args
                .get(i + 1)
                .ok_or_else(|| format!("missing value of {name}"))?
                .clone())
        };
        let opt = |name: &str| args.iter().position(|a| a == name).map(|_| get(name));
        let workload = match opt("--workload") {
            Some(w) => Workload::parse(&w?)?,
            None => Workload::Failover,
        };
        let deadline = match opt("--deadline") {
            Some(d) => d?.parse()?,
            None => 0,
        };
        Ok(WorkerArgs {
            id: get("--worker")?.parse()?,
            inc: get("--inc")?.parse()?,
            run_dir: PathBuf::from(get("--run-dir")?),
            resource: get("--resource-addr")?,
            jobs: get("--jobs")?.parse()?,
            t0: get("--t0")?.parse()?,
            spacing_ms: get("--spacing-ms")?.parse()?,
            seed: get("--seed")?.parse()?,
            workload,
            deadline,
            replica_ack: args.iter().any(|a| a == "--replica-ack"),
        })
    }
}

pub(crate) struct Ctx {
    pub(crate) args: WorkerArgs,
    pub(crate) holder: String,
    log: Jsonl,
}

impl Ctx {
    pub(crate) fn write(&self, mut v: Value) {
        if let Some(o) = v.as_object_mut() {
            o.insert("p".into(), json!(format!("w{}", self.args.id)));
            o.insert("inc".into(), json!(self.args.inc));
        }
        self.log.write(v);
    }
}

pub async fn run(args: WorkerArgs) -> Result<(), BoxError> {
    let url = std::env::var(URL_ENV).map_err(|_| format!("{URL_ENV} is not set"))?;
    let path = args
        .run_dir
        .join(format!("worker-{}.{}.jsonl", args.id, args.inc));
    let ctx = Arc::new(Ctx {
        holder: format!("w{}.{}", args.id, args.inc),
        log: Jsonl::open(&path)?,
        args,
    });
    ctx.write(json!({"type":"start","pid":std::process::id()}));

    // Connect like a user, retrying while the nemesis keeps Redis away.
    let mut delay = Duration::from_millis(100);
    let client = loop {
        match Client::builder(url.clone()).connect().await {
            Ok(c) => break c,
            Err(e) => {
                ctx.write(
                    json!({"type":"fail","api_err":true,"f":"connect","kind":e.kind(),
                    "err":e.to_string()}),
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    };
    ctx.write(json!({"type":"info","f":"connected"}));
    match ctx.args.workload {
        Workload::Mutex => return run_mutex(ctx, client).await,
        Workload::Leader => return run_leader(ctx, client).await,
        Workload::Fair => return run_fair(ctx, client).await,
        Workload::Semaphore => return crate::semaphore::run(ctx, client).await,
        Workload::Rw => return crate::rw::run(ctx, client).await,
        Workload::Failover => {}
    }

    let now = mono_ns();
    let mut late = 0u64;
    let mut tasks = Vec::new();
    for j in 0..ctx.args.jobs {
        let primary = j % WORKERS;
        let rank = (ctx.args.id + WORKERS - primary) % WORKERS;
        let offset_ms = if rank == 0 { 0 } else { 100 + 30 * rank as u64 };
        let mut at = ctx.args.t0 + (j as u64 * ctx.args.spacing_ms + offset_ms) * 1_000_000;
        if at < now {
            // A restarted incarnation joins past jobs too, a few ms apart.
            late += 1;
            at = now + late * 3_000_000;
        }
        let (ctx, client) = (ctx.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let wait = at.saturating_sub(mono_ns());
            tokio::time::sleep(Duration::from_nanos(wait)).await;
            drive(&ctx, &client, j).await
        }));
    }
    let mut failures = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failures += 1;
                ctx.write(json!({"type":"harness_err","err":e.to_string()}));
            }
            Err(e) => {
                failures += 1;
                ctx.write(json!({"type":"harness_err","err":e.to_string()}));
            }
        }
    }
    ctx.write(json!({"type":"exit","harness_failures":failures}));
    if failures > 0 {
        return Err(format!("{failures} job drivers failed").into());
    }
    Ok(())
}

/// Reads one job's event stream to its end and acts on `Acquired`.
async fn drive(ctx: &Ctx, client: &Client, j: usize) -> Result<(), BoxError> {
    let job = job_name(j);
    let mut cfg = FailoverConfig::builder(job.clone())
        .max_attempts(MAX_ATTEMPTS)
        .lease(LEASE)
        .watchdog(true)
        .retention(Duration::from_secs(3600))
        .worker_name(ctx.holder.clone());
    if ctx.args.replica_ack {
        cfg = cfg.replica_ack(1, LEASE / 2);
    }
    let cfg = cfg.build()?;
    let mut rng = Rng::new(mix(&[
        ctx.args.seed,
        ctx.args.id as u64,
        ctx.args.inc as u64,
        j as u64,
    ]));
    let mut worker = client.failover().start(cfg);
    ctx.write(json!({"type":"invoke","f":"start","job":job}));
    while let Some(ev) = worker.next_event().await {
        let mut line = serde_json::to_value(&ev)?;
        if let Some(o) = line.as_object_mut() {
            o.insert("type".into(), json!("event"));
            o.insert("ev".into(), json!(ev.name()));
            o.insert("job".into(), json!(job));
            o.remove("event");
        }
        ctx.write(line);
        let terminal = ev.is_terminal();
        if let Event::Acquired(acq) = ev {
            let (attempt, token) = (acq.attempt, acq.fencing_token);
            let begin = resource_write(ctx, &job, token, &format!("BEGIN-{attempt}")).await;
            let outcome = if begin.as_deref() == Some("OK") {
                let ms = rng.range(20.0, 150.0) as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let commit = resource_write(ctx, &job, token, &format!("COMMIT-{attempt}")).await;
                match commit.as_deref() {
                    Some("OK") if rng.unit() < 0.2 => "fail-injected",
                    Some("OK") => "done",
                    _ => "fail-resource",
                }
            } else {
                "fail-resource"
            };
            ctx.write(json!({"type":"invoke","f":outcome,"job":job,"attempt":attempt}));
            let res = if outcome == "done" {
                acq.done().await
            } else if outcome == "fail-injected" {
                acq.fail("injected").await
            } else {
                acq.fail("resource write failed or stale").await
            };
            match res {
                Ok(()) => ctx.write(json!({"type":"ok","f":outcome,"job":job,"attempt":attempt})),
                // Jepsen's typing: a lost reply (connection, timeout) leaves the outcome unknown
                // ("info", may have happened); any other error definitely changed nothing.
                Err(e) => ctx.write(json!({"type":op_type(&e),"api_err":true,"f":outcome,
                    "job":job,"attempt":attempt,"kind":e.kind(),"err":e.to_string()})),
            }
        } else if terminal {
            break;
        }
    }
    ctx.write(json!({"type":"end","job":job}));
    Ok(())
}

/// The history type of a failed API call: `info` when its outcome is unknown, else `fail`.
pub(crate) fn op_type(e: &baton::Error) -> &'static str {
    match e.kind() {
        baton::ErrorKind::Connection | baton::ErrorKind::Timeout => "info",
        _ => "fail",
    }
}

/// One request to the resource server on a fresh connection. `None` when it could not be done
/// (logged as indeterminate).
pub(crate) async fn resource_write(ctx: &Ctx, job: &str, token: u64, op: &str) -> Option<String> {
    ctx.write(json!({"type":"invoke","f":"write","job":job,"token":token,"op":op}));
    let req = format!("W {job} {token} {} {op}\n", ctx.holder);
    let fut = async {
        let mut sock = TcpStream::connect(ctx.args.resource.as_str()).await?;
        sock.write_all(req.as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(&mut sock).read_line(&mut line).await?;
        Ok::<_, std::io::Error>(line.trim().to_string())
    };
    match tokio::time::timeout(Duration::from_secs(3), fut).await {
        Ok(Ok(reply)) if !reply.is_empty() => {
            let ty = if reply == "OK" { "ok" } else { "fail" };
            ctx.write(json!({"type":ty,"f":"write","job":job,"token":token,"op":op,"reply":reply}));
            Some(reply)
        }
        Ok(Ok(_)) => {
            ctx.write(json!({"type":"info","f":"write","job":job,"op":op,"err":"empty reply"}));
            None
        }
        Ok(Err(e)) => {
            ctx.write(json!({"type":"info","f":"write","job":job,"op":op,"err":e.to_string()}));
            None
        }
        Err(_) => {
            ctx.write(json!({"type":"info","f":"write","job":job,"op":op,"err":"timeout"}));
            None
        }
    }
}

/// The mutex workload: `MUTEX_TASKS` tasks, each taking a seeded one of `MUTEX_LOCKS` locks with
/// `with_lock` until the deadline (or the stop file), writing BEGIN/COMMIT to the resource with
/// the fencing token inside.
async fn run_mutex(ctx: Arc<Ctx>, client: Client) -> Result<(), BoxError> {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let opts = Arc::new(baton::AcquireOptions::builder().wait(MUTEX_WAIT).build()?);
    let mut tasks = Vec::new();
    for task in 0..MUTEX_TASKS {
        let (ctx, client, counter, opts) =
            (ctx.clone(), client.clone(), counter.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            mutex_task(&ctx, &client, &counter, &opts, task).await
        }));
    }
    join_tasks(&ctx, tasks, "mutex").await
}

/// The leader workload: `MUTEX_TASKS` candidates per process, each running the worker form on a
/// seeded one of `MUTEX_LOCKS` elections until the deadline (or the stop file). A term's work
/// writes BEGIN/COMMIT pairs to the resource with the term as fencing token, then returns (the
/// worker resigns): short terms, many handovers.
async fn run_leader(ctx: Arc<Ctx>, client: Client) -> Result<(), BoxError> {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..MUTEX_TASKS {
        let (ctx, client, counter) = (ctx.clone(), client.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            leader_task(&ctx, &client, &counter, task).await
        }));
    }
    join_tasks(&ctx, tasks, "leader").await
}

pub(crate) async fn join_tasks(
    ctx: &Arc<Ctx>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
    what: &str,
) -> Result<(), BoxError> {
    let mut failures = 0;
    for t in tasks {
        let err = match t.await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        failures += 1;
        ctx.write(json!({"type":"harness_err","err":err}));
    }
    ctx.write(json!({"type":"exit","harness_failures":failures}));
    if failures > 0 {
        return Err(format!("{failures} {what} tasks failed").into());
    }
    Ok(())
}

async fn leader_task(
    ctx: &Arc<Ctx>,
    client: &Client,
    counter: &Arc<std::sync::atomic::AtomicU64>,
    task: usize,
) -> Result<(), BoxError> {
    let mut rng = Rng::new(mix(&[
        ctx.args.seed,
        ctx.args.id as u64,
        ctx.args.inc as u64,
        task as u64,
        0x4C,
    ]));
    let leaders = client.leaders();
    let opts = baton::ElectionOptions::builder()
        .lease(LEASE)
        .name(format!("{}.{task}", ctx.holder))
        .build()?;
    let stop = ctx.args.run_dir.join(STOP_FILE);
    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 100.0) as u64)).await;
    while mono_ns() < ctx.args.deadline && !stop.exists() {
        let name = election_name(rng.below(MUTEX_LOCKS));
        let rounds = 1 + rng.below(3);
        let hold_ms = rng.range(20.0, 150.0) as u64;
        // As for the mutex: three in four terms commit from a spawned task, which the term's
        // stop token does not reach, so a leader paused past its lease commits late and only
        // the fencing token keeps the resource safe.
        let detached = rng.unit() < 0.75;
        ctx.write(json!({"type":"invoke","f":"lock","lock":name}));
        let work = {
            let (ctx, name, counter) = (ctx.clone(), name.clone(), counter.clone());
            move |term: baton::Term| {
                let (ctx, name) = (ctx.clone(), name.clone());
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                async move {
                    let fence = term.fencing_token();
                    ctx.write(
                        json!({"type":"info","f":"grant","lock":name,"n":n,"token":fence,
                        "detached":detached}),
                    );
                    for _ in 0..rounds {
                        if term.lost_token().is_cancelled() {
                            return;
                        }
                        let begin = resource_write(&ctx, &name, fence, &format!("BEGIN-{n}")).await;
                        if begin.as_deref() != Some("OK") {
                            return;
                        }
                        let commit = {
                            let (ctx, name) = (ctx.clone(), name.clone());
                            async move {
                                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                                resource_write(&ctx, &name, fence, &format!("COMMIT-{n}")).await
                            }
                        };
                        let committed = if detached {
                            tokio::spawn(commit).await.ok().flatten()
                        } else {
                            tokio::select! {
                                _ = term.lost() => None,
                                c = commit => c,
                            }
                        };
                        if committed.as_deref() != Some("OK") {
                            return;
                        }
                    }
                }
            }
        };
        let mut w = leaders.lead(&name, &opts, work)?;
        let campaign_until = tokio::time::Instant::now() + MUTEX_WAIT;
        let mut elected = false;
        loop {
            let next = if elected {
                w.next_event().await
            } else {
                match tokio::time::timeout_at(campaign_until, w.next_event()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        // Not elected in time: stop campaigning (the stream ends with Stopped).
                        w.resign();
                        continue;
                    }
                }
            };
            let Some(ev) = next else { break };
            match &ev {
                baton::LeaderEvent::Elected { .. } => elected = true,
                baton::LeaderEvent::Lost { term, reason } => ctx.write(
                    json!({"type":"info","api_err":true,"f":"lock","lock":name,"kind":"LeaseLost",
                    "token":term,"err":reason}),
                ),
                baton::LeaderEvent::StopOverdue { term, waited_ms } => ctx.write(
                    json!({"type":"info","f":"stop_overdue","lock":name,"token":term,
                    "waited_ms":waited_ms}),
                ),
                baton::LeaderEvent::Error {
                    kind,
                    message,
                    retryable,
                } => ctx.write(
                    json!({"type":if *retryable {"info"} else {"fail"},"api_err":true,"f":"lock",
                    "lock":name,"kind":kind,"err":message}),
                ),
                baton::LeaderEvent::Resigned { .. } => {
                    ctx.write(json!({"type":"ok","f":"lock","lock":name,"outcome":"done"}))
                }
                _ => {}
            }
            if ev.is_terminal() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
    }
    ctx.write(json!({"type":"end","task":task}));
    Ok(())
}

async fn mutex_task(
    ctx: &Arc<Ctx>,
    client: &Client,
    counter: &std::sync::atomic::AtomicU64,
    opts: &baton::AcquireOptions,
    task: usize,
) -> Result<(), BoxError> {
    let mut rng = Rng::new(mix(&[
        ctx.args.seed,
        ctx.args.id as u64,
        ctx.args.inc as u64,
        task as u64,
        0x4D,
    ]));
    let locks = client.locks();
    let stop = ctx.args.run_dir.join(STOP_FILE);
    // Spread the tasks' first tries a little.
    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 100.0) as u64)).await;
    while mono_ns() < ctx.args.deadline && !stop.exists() {
        let name = lock_name(rng.below(MUTEX_LOCKS));
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let hold_ms = rng.range(20.0, 150.0) as u64;
        // Three in four holders hand the work and its COMMIT to a spawned task, as work given to
        // another task or thread is: `with_lock`'s cancellation on a lost lock does not reach
        // it, so a holder paused past its lease there commits late, and only the fencing token
        // keeps the resource safe. The others do it in the closure (and are cancelled).
        let detached = rng.unit() < 0.75;
        ctx.write(json!({"type":"invoke","f":"lock","lock":name,"n":n}));
        let work = |guard: &baton::LockGuard| {
            let fence = guard.fencing_token();
            let (ctx, name) = (ctx.clone(), name.clone());
            async move {
                ctx.write(
                    json!({"type":"info","f":"grant","lock":name,"n":n,"token":fence,
                    "detached":detached}),
                );
                let begin = resource_write(&ctx, &name, fence, &format!("BEGIN-{n}")).await;
                if begin.as_deref() != Some("OK") {
                    return "fail-resource";
                }
                let commit = async move {
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    resource_write(&ctx, &name, fence, &format!("COMMIT-{n}")).await
                };
                let commit = if detached {
                    tokio::spawn(commit).await.ok().flatten()
                } else {
                    commit.await
                };
                if commit.as_deref() != Some("OK") {
                    return "fail-resource";
                }
                "done"
            }
        };
        match locks.with_lock(&name, LEASE, opts, work).await {
            Ok(outcome) => {
                ctx.write(json!({"type":"ok","f":"lock","lock":name,"n":n,"outcome":outcome}))
            }
            Err(e) => {
                let token = match &e {
                    baton::Error::LeaseLost { fencing_token, .. } => *fencing_token,
                    _ => None,
                };
                ctx.write(
                    json!({"type":op_type(&e),"api_err":true,"f":"lock","lock":name,
                    "n":n,"kind":e.kind(),"token":token,"err":e.to_string()}),
                );
                tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
            }
        }
    }
    ctx.write(json!({"type":"end","task":task}));
    Ok(())
}

/// The fair-lock workload: `MUTEX_TASKS` tasks per process, each taking a seeded one of
/// `MUTEX_LOCKS` fair locks (with the watchdog) until the deadline (or the stop file), writing
/// BEGIN/COMMIT to the resource with the fencing token, then releasing. One acquisition in six
/// first takes the lock's priority reservation and acquires through it, so reservers are paused
/// and killed too (a dead reserver's reservation must lapse after its lifetime).
async fn run_fair(ctx: Arc<Ctx>, client: Client) -> Result<(), BoxError> {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let opts = Arc::new(
        baton::fair::FairOptions::builder()
            .wait(MUTEX_WAIT)
            .waiter_timeout(FAIR_WAITER_TIMEOUT)
            .watchdog(true)
            .build()?,
    );
    let mut tasks = Vec::new();
    for task in 0..MUTEX_TASKS {
        let (ctx, client, counter, opts) =
            (ctx.clone(), client.clone(), counter.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            fair_task(&ctx, &client, &counter, &opts, task).await
        }));
    }
    join_tasks(&ctx, tasks, "fair").await
}

/// Logs a failed fair-lock call (`f`: `reserve`, `lock` or `release`).
fn log_fair_err(ctx: &Ctx, f: &str, name: &str, n: u64, e: &baton::Error) {
    ctx.write(
        json!({"type":op_type(e),"api_err":true,"f":f,"lock":name,"n":n,
        "kind":e.kind(),"err":e.to_string()}),
    );
}

async fn fair_task(
    ctx: &Arc<Ctx>,
    client: &Client,
    counter: &std::sync::atomic::AtomicU64,
    opts: &baton::fair::FairOptions,
    task: usize,
) -> Result<(), BoxError> {
    let mut rng = Rng::new(mix(&[
        ctx.args.seed,
        ctx.args.id as u64,
        ctx.args.inc as u64,
        task as u64,
        0x46,
    ]));
    let locks = client.fair_locks();
    let stop = ctx.args.run_dir.join(STOP_FILE);
    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 100.0) as u64)).await;
    while mono_ns() < ctx.args.deadline && !stop.exists() {
        let name = fair_lock_name(rng.below(MUTEX_LOCKS));
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let hold_ms = rng.range(20.0, 150.0) as u64;
        // As for the mutex: three in four holders commit from a spawned task, which the loss
        // signal does not reach, so a holder paused past its lease commits late and only the
        // fencing token keeps the resource safe.
        let detached = rng.unit() < 0.75;
        let reserve = rng.unit() < 1.0 / 6.0;
        let mut reserved = false;
        let acquired = if reserve {
            ctx.write(json!({"type":"invoke","f":"reserve","lock":name,"n":n}));
            match locks.reserve(&name, FAIR_RESERVATION).await {
                Ok(r) => {
                    reserved = true;
                    ctx.write(json!({"type":"ok","f":"reserve","lock":name,"n":n}));
                    ctx.write(
                        json!({"type":"invoke","f":"lock","lock":name,"n":n,"reserved":true}),
                    );
                    r.acquire(LEASE, opts).await
                }
                Err(e) => {
                    // Another contender's reservation (or a fault): queue as everyone else.
                    log_fair_err(ctx, "reserve", &name, n, &e);
                    ctx.write(json!({"type":"invoke","f":"lock","lock":name,"n":n}));
                    locks.acquire(&name, LEASE, opts).await
                }
            }
        } else {
            ctx.write(json!({"type":"invoke","f":"lock","lock":name,"n":n}));
            locks.acquire(&name, LEASE, opts).await
        };
        let guard = match acquired {
            Ok(g) => g,
            Err(e) => {
                log_fair_err(ctx, "lock", &name, n, &e);
                tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
                continue;
            }
        };
        let fence = guard.fencing_token();
        ctx.write(
            json!({"type":"info","f":"grant","lock":name,"n":n,"token":fence,
            "detached":detached,"reserved":reserved}),
        );
        let outcome = 'work: {
            let begin = resource_write(ctx, &name, fence, &format!("BEGIN-{n}")).await;
            if begin.as_deref() != Some("OK") {
                break 'work "fail-resource";
            }
            let commit = {
                let (ctx, name) = (ctx.clone(), name.clone());
                async move {
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    resource_write(&ctx, &name, fence, &format!("COMMIT-{n}")).await
                }
            };
            let committed = if detached {
                tokio::spawn(commit).await.ok().flatten()
            } else {
                tokio::select! {
                    _ = guard.lost() => None,
                    c = commit => c,
                }
            };
            if committed.as_deref() != Some("OK") {
                break 'work "fail-resource";
            }
            "done"
        };
        if let Some(reason) = guard.loss_reason() {
            ctx.write(
                json!({"type":"info","api_err":true,"f":"lock","lock":name,"n":n,
                "kind":"LeaseLost","token":fence,"err":reason}),
            );
        }
        match guard.release().await {
            Ok(ours) => ctx.write(json!({"type":"ok","f":"lock","lock":name,"n":n,
                "outcome":outcome,"released":ours})),
            Err(e) => log_fair_err(ctx, "release", &name, n, &e),
        }
        tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
    }
    ctx.write(json!({"type":"end","task":task}));
    Ok(())
}
