//! The floor: the failover protocol hand-written on the `redis` crate, sending exactly the
//! commands baton sends, in the same round trips, on the same kinds of connections (a pool of
//! dedicated connections for `WATCH … EXEC`, one multiplexed connection for plain reads, one
//! pub/sub connection), and nothing else: no validation beyond what the next step needs, no
//! events, no tracing, no timeouts. Like baton, a decision that writes nothing (the job is held,
//! done, ...) sends no `UNWATCH` of its own: the connection goes back to the pool marked, and its
//! next pipeline starts with `UNWATCH`.
//!
//! Scenario 6 (`roundtrips`) checks the equivalence with `MONITOR`.
//!
//! [`Direct`] is the unconstrained floor of scenario 2's one-worker rows: the same commands and
//! round trips per job, on a connection per job task instead of the 8-connection pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// The keys of one job, laid out as baton lays them out (`P{J}`, `P{J}:lease`, ...).
#[derive(Clone, Debug)]
pub struct Keys {
    pub state: String,
    pub lease: String,
    pub fence: String,
    pub failure: String,
    pub channel: String,
}

impl Keys {
    pub fn new(prefix: &str, job: &str) -> Keys {
        let state = format!("{prefix}{{{job}}}");
        Keys {
            lease: format!("{state}:lease"),
            fence: format!("{state}:fence"),
            failure: format!("{state}:failure"),
            channel: format!("{state}:events"),
            state,
        }
    }
}

/// The connections of one floor "client": as many as a baton `Client` opens.
pub struct Floor {
    pool: Pool,
    shared: MultiplexedConnection,
    hub: Hub,
    name: String,
    tokens: AtomicU64,
    /// Waiting backups whose lease timer ran out with no message (a lost wake-up in the
    /// throughput scenarios, where every holder finishes at once).
    timer_wakeups: AtomicU64,
}

struct Pool {
    client: redis::Client,
    /// Idle connections, each with whether a `WATCH` may still be active on it (its `UNWATCH`
    /// was deferred to its next pipeline, as baton does).
    idle: Mutex<Vec<(MultiplexedConnection, bool)>>,
    permits: Arc<Semaphore>,
}

/// A pooled connection, returned on drop.
struct Dedicated<'a> {
    conn: Option<MultiplexedConnection>,
    /// Like baton's `Dedicated`: a decision that writes nothing does not send `UNWATCH`; the
    /// connection's next pipeline starts with it.
    unwatch_first: bool,
    pool: &'a Pool,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Dedicated<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            self.pool.idle.lock().unwrap().push((c, self.unwatch_first));
        }
    }
}

impl Dedicated<'_> {
    fn conn(&mut self) -> &mut MultiplexedConnection {
        self.conn.as_mut().expect("a pooled connection")
    }

    /// Round trip 1 of a transition, after the deferred `UNWATCH` if there is one.
    async fn observe(&mut self, k: &Keys) -> redis::RedisResult<Obs> {
        let first = std::mem::take(&mut self.unwatch_first);
        Floor::observe(self.conn(), first, k).await
    }

    /// Round trip 2 of a transition (`MULTI … EXEC`).
    async fn exec(&mut self, cmds: redis::Pipeline) -> redis::RedisResult<bool> {
        let first = std::mem::take(&mut self.unwatch_first);
        Floor::exec(self.conn(), first, cmds).await
    }

    /// A decision that writes nothing: no round trip, the next pipeline starts with `UNWATCH`.
    fn defer_unwatch(&mut self) {
        self.unwatch_first = true;
    }
}

impl Pool {
    async fn get(&self) -> redis::RedisResult<Dedicated<'_>> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("pool open");
        let idle = self.idle.lock().unwrap().pop();
        let (conn, unwatch_first) = match idle {
            Some(c) => c,
            None => (self.client.get_multiplexed_async_connection().await?, false),
        };
        Ok(Dedicated {
            conn: Some(conn),
            unwatch_first,
            pool: self,
            _permit: permit,
        })
    }
}

type Waiters = Arc<Mutex<HashMap<String, Vec<(u64, mpsc::UnboundedSender<String>)>>>>;

/// Per channel: a lock that orders its `SUBSCRIBE`s and `UNSUBSCRIBE`s, guarding whether the
/// server has confirmed the channel's subscription (and no `UNSUBSCRIBE` was sent since).
type Channels = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<bool>>>>>;

/// One pub/sub connection shared by every floor worker of a client, reference counted per
/// channel like baton's hub, and like it, `subscribe` returns only once the server has confirmed
/// the channel's subscription, for every subscriber, not only the one that sent `SUBSCRIBE`.
/// Unlike baton's hub, (un)subscriptions of different channels are not serialized through one
/// task; those of one channel are ordered by a per-channel lock, so a late `UNSUBSCRIBE` can
/// never overtake the `SUBSCRIBE` of the channel's next waiter.
struct Hub {
    sink: PubSubSink,
    waiters: Waiters,
    channels: Channels,
    next: AtomicU64,
}

struct Sub {
    rx: mpsc::UnboundedReceiver<String>,
    id: u64,
}

fn lock_of(channels: &Channels, channel: &str) -> Arc<tokio::sync::Mutex<bool>> {
    channels
        .lock()
        .unwrap()
        .entry(channel.to_string())
        .or_default()
        .clone()
}

/// Removes waiter `id` of `channel`; `true` when it was the channel's last.
fn remove_waiter(waiters: &Waiters, channel: &str, id: u64) -> bool {
    let mut w = waiters.lock().unwrap();
    match w.get_mut(channel) {
        Some(list) => {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                w.remove(channel);
                true
            } else {
                false
            }
        }
        None => false,
    }
}

impl Hub {
    /// Registers a waiter for `channel` and returns once the server has confirmed the channel's
    /// subscription. Every caller waits for that confirmation: a waiter that returned while
    /// another one's `SUBSCRIBE` was still on its way could make its plain read, see the lease
    /// alive, and sleep through a `PUBLISH` that reached the server before the `SUBSCRIBE`
    /// (deaf for a whole lease).
    async fn subscribe(&self, channel: &str) -> redis::RedisResult<Sub> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.waiters
            .lock()
            .unwrap()
            .entry(channel.to_string())
            .or_default()
            .push((id, tx));
        let lock = lock_of(&self.channels, channel);
        let mut subscribed = lock.lock().await;
        if !*subscribed {
            if let Err(e) = self.sink.clone().subscribe(channel).await {
                drop(subscribed);
                if remove_waiter(&self.waiters, channel, id) {
                    self.release(channel);
                }
                return Err(e);
            }
            *subscribed = true;
        }
        Ok(Sub { rx, id })
    }

    /// Like baton's `Subscription::drop`: the worker does not wait for `UNSUBSCRIBE`.
    fn unsubscribe(&self, channel: &str, sub: Sub) {
        if remove_waiter(&self.waiters, channel, sub.id) {
            self.release(channel);
        }
    }

    /// The channel lost its last waiter: unsubscribe, unless a new waiter came meanwhile.
    fn release(&self, channel: &str) {
        let mut sink = self.sink.clone();
        let channel = channel.to_string();
        let lock = lock_of(&self.channels, &channel);
        let waiters = self.waiters.clone();
        let channels = self.channels.clone();
        tokio::spawn(async move {
            let mut subscribed = lock.lock().await;
            // A new waiter came meanwhile: the channel must stay subscribed.
            if waiters.lock().unwrap().contains_key(&channel) {
                return;
            }
            if *subscribed {
                let _ = sink.unsubscribe(&channel).await;
                *subscribed = false;
            }
            // Forget the channel's lock unless someone else holds it (a subscriber that finds
            // no entry creates a new one, after this UNSUBSCRIBE was confirmed).
            let mut ch = channels.lock().unwrap();
            if ch.get(&channel).is_some_and(|l| Arc::strong_count(l) == 2) {
                ch.remove(&channel);
            }
        });
    }
}

/// What round trip 1 read, reduced to what the next step needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Absent,
    Attempt(u64),
    Done,
    Other,
}

fn seen(v: &Value) -> Seen {
    match v {
        Value::Nil => Seen::Absent,
        Value::BulkString(b) if b == b"DONE" => Seen::Done,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Seen::Other, Seen::Attempt),
        _ => Seen::Other,
    }
}

/// A pipeline whose server errors come back as values, starting with a deferred `UNWATCH` (its
/// reply dropped) when `unwatch_first`, as baton's `Dedicated::pipe`.
fn pipe(unwatch_first: bool) -> redis::Pipeline {
    let mut p = redis::pipe();
    p.ignore_errors();
    if unwatch_first {
        p.cmd("UNWATCH").ignore();
    }
    p
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        _ => -2,
    }
}

fn fence_of(v: &Value) -> u64 {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

fn time_us(v: &Value) -> u64 {
    let part = |p: &Value| match p {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0),
        Value::Int(n) => *n as u64,
        _ => 0,
    };
    match v {
        Value::Array(p) if p.len() == 2 => part(&p[0]) * 1_000_000 + part(&p[1]),
        _ => 0,
    }
}

struct Obs {
    state: Seen,
    /// The lease's PTTL: -2 when gone.
    pttl: i64,
    fence: u64,
    now_us: u64,
}

/// How a floor holder ends its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Done,
    Fail,
    /// Leave the lease to expire (a crash).
    Abandon,
}

/// What a floor worker reports.
#[derive(Debug)]
pub enum RawEvent {
    Acquired(u64),
    Locked(u64),
    Completed,
    Failed,
    Abandoned,
}

/// One job's settings.
#[derive(Clone, Debug)]
pub struct Job {
    pub keys: Keys,
    pub lease_ms: u64,
    pub retention_ms: u64,
}

/// Round trip 2 of a grant: the commands between `MULTI` and `EXEC`.
fn grant_cmds(job: &Job, attempt: u64, obs: &Obs, token: &str, name: &str) -> redis::Pipeline {
    let k = &job.keys;
    let fence = (obs.fence + 1).max(obs.now_us);
    let mut tx = redis::pipe();
    tx.cmd("SET")
        .arg(&k.state)
        .arg(attempt)
        .arg("PX")
        .arg(job.retention_ms)
        .cmd("SET")
        .arg(&k.lease)
        .arg(format!("{token} {name}"))
        .arg("PX")
        .arg(job.lease_ms)
        .cmd("SET")
        .arg(&k.fence)
        .arg(fence)
        .arg("PX")
        .arg(job.retention_ms)
        .cmd("PUBLISH")
        .arg(&k.channel)
        .arg(format!("acquired:{attempt}"));
    tx
}

/// Round trip 2 of `done()`/`fail()`: the commands between `MULTI` and `EXEC`.
fn finish_cmds(job: &Job, attempt: u64, ending: Ending, name: &str) -> redis::Pipeline {
    let k = &job.keys;
    let mut tx = redis::pipe();
    match ending {
        Ending::Done => {
            tx.cmd("SET")
                .arg(&k.state)
                .arg("DONE")
                .arg("PX")
                .arg(job.retention_ms)
                .cmd("DEL")
                .arg(&k.lease)
                .cmd("PEXPIRE")
                .arg(&k.fence)
                .arg(job.retention_ms)
                .cmd("PUBLISH")
                .arg(&k.channel)
                .arg("done");
        }
        _ => {
            // The fence lives as long as the state (baton's `finish_once`).
            tx.cmd("PEXPIRE")
                .arg(&k.state)
                .arg(job.retention_ms)
                .cmd("DEL")
                .arg(&k.lease)
                .cmd("PEXPIRE")
                .arg(&k.fence)
                .arg(job.retention_ms)
                .cmd("SET")
                .arg(&k.failure)
                .arg(format!("attempt {attempt} by {name}: bench"))
                .arg("PX")
                .arg(job.retention_ms)
                .cmd("PUBLISH")
                .arg(&k.channel)
                .arg("failed");
        }
    }
    tx
}

/// The unconstrained floor (scenario 2, one worker per job): what a careful user writes by hand
/// for a lone worker that runs a job and completes it, on a connection of its own that no
/// other task shares (no pool to wait for, no pub/sub: nobody else waits on the job). The same
/// 4 round trips as a grant plus `done()`: `[WATCH GET GET PTTL GET TIME]`,
/// `[MULTI SET SET SET PUBLISH EXEC]`, `[WATCH GET GET PTTL GET TIME]`,
/// `[MULTI SET DEL PEXPIRE PUBLISH EXEC]`, each retried on a nil `EXEC`.
pub struct Direct {
    name: String,
    tokens: AtomicU64,
}

impl Direct {
    pub fn new() -> Direct {
        Direct {
            name: format!("bench-direct:{}", std::process::id()),
            tokens: AtomicU64::new(1),
        }
    }

    /// Grants attempt 1 (or the next) of `job` on `conn` and completes it.
    pub async fn job(&self, conn: &mut MultiplexedConnection, job: &Job) -> redis::RedisResult<()> {
        let attempt = loop {
            let obs = Floor::observe(conn, false, &job.keys).await?;
            let attempt = match obs.state {
                Seen::Absent => 1,
                Seen::Attempt(n) if obs.pttl == -2 => n + 1,
                other => panic!(
                    "direct floor: {:?} is held or over ({other:?})",
                    job.keys.state
                ),
            };
            let n = self.tokens.fetch_add(1, Ordering::Relaxed);
            let token = format!("{:016x}{n:016x}", std::process::id());
            let tx = grant_cmds(job, attempt, &obs, &token, &self.name);
            if Floor::exec(conn, false, tx).await? {
                break attempt;
            }
        };
        loop {
            let _obs = Floor::observe(conn, false, &job.keys).await?;
            let tx = finish_cmds(job, attempt, Ending::Done, &self.name);
            if Floor::exec(conn, false, tx).await? {
                return Ok(());
            }
        }
    }
}

impl Floor {
    pub async fn connect(url: &str, pool_size: usize) -> redis::RedisResult<Floor> {
        let client = redis::Client::open(url)?;
        let shared = client.get_multiplexed_async_connection().await?;
        let (sink, mut stream) = client.get_async_pubsub().await?.split();
        let waiters: Waiters = Arc::default();
        let w = waiters.clone();
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
                if let Some(list) = w.lock().unwrap().get_mut(msg.get_channel_name()) {
                    list.retain(|(_, tx)| tx.send(payload.clone()).is_ok());
                }
            }
        });
        Ok(Floor {
            pool: Pool {
                client,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(pool_size)),
            },
            shared,
            hub: Hub {
                sink,
                waiters,
                channels: Channels::default(),
                next: AtomicU64::new(1),
            },
            name: format!("bench-floor:{}", std::process::id()),
            tokens: AtomicU64::new(1),
            timer_wakeups: AtomicU64::new(0),
        })
    }

    /// Opens `n` pool connections ahead of time, as a warmed-up baton client has them.
    pub async fn warm(&self, n: usize) -> redis::RedisResult<()> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(self.pool.get().await?);
        }
        Ok(())
    }

    /// How many times a waiting backup's lease timer ran out before any message came.
    pub fn timer_wakeups(&self) -> u64 {
        self.timer_wakeups.load(Ordering::Relaxed)
    }

    fn token(&self) -> String {
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:016x}", std::process::id(), n)
    }

    /// `[WATCH GET GET PTTL GET TIME]`, after `UNWATCH` when `unwatch_first` (a deferred one).
    async fn observe(
        conn: &mut MultiplexedConnection,
        unwatch_first: bool,
        k: &Keys,
    ) -> redis::RedisResult<Obs> {
        let mut p = pipe(unwatch_first);
        p.cmd("WATCH")
            .arg(&k.state)
            .arg(&k.lease)
            .arg(&k.fence)
            .ignore()
            .cmd("GET")
            .arg(&k.state)
            .cmd("GET")
            .arg(&k.lease)
            .cmd("PTTL")
            .arg(&k.lease)
            .cmd("GET")
            .arg(&k.fence)
            .cmd("TIME");
        let v: Vec<Value> = p.query_async(conn).await?;
        let lease_gone = matches!(v[1], Value::Nil);
        Ok(Obs {
            state: seen(&v[0]),
            pttl: if lease_gone { -2 } else { int(&v[2]) },
            fence: fence_of(&v[3]),
            now_us: time_us(&v[4]),
        })
    }

    /// `MULTI`, the commands, `EXEC` in one round trip (after `UNWATCH` when `unwatch_first`);
    /// `false` when `EXEC` answered nil.
    async fn exec(
        conn: &mut MultiplexedConnection,
        unwatch_first: bool,
        cmds: redis::Pipeline,
    ) -> redis::RedisResult<bool> {
        let mut p = pipe(unwatch_first);
        p.cmd("MULTI");
        for c in cmds.cmd_iter() {
            p.add_command(c.clone());
        }
        p.cmd("EXEC");
        let mut v: Vec<Value> = p.query_async(conn).await?;
        Ok(!matches!(v.pop(), Some(Value::Nil)))
    }

    /// The plain read a backup makes once its subscription is confirmed.
    async fn quick_read(&self, k: &Keys) -> redis::RedisResult<(Seen, i64)> {
        let mut conn = self.shared.clone();
        let mut p = redis::pipe();
        p.ignore_errors()
            .cmd("GET")
            .arg(&k.state)
            .cmd("PTTL")
            .arg(&k.lease);
        let v: Vec<Value> = p.query_async(&mut conn).await?;
        Ok((seen(&v[0]), int(&v[1])))
    }

    /// One worker of `job`, as baton runs it: observe under WATCH; grant, wait or stop. A holder
    /// subscribes to the job's channel, then ends as `ending` says (`control` may say it later).
    pub async fn worker(
        &self,
        job: &Job,
        events: &mpsc::UnboundedSender<(RawEvent, Instant)>,
        mut control: Option<tokio::sync::oneshot::Receiver<Ending>>,
    ) -> redis::RedisResult<()> {
        let k = &job.keys;
        let mut sub: Option<Sub> = None;
        let mut locked: Option<u64> = None;
        let result = loop {
            let mut d = self.pool.get().await?;
            let obs = d.observe(k).await?;
            match obs.state {
                Seen::Done => {
                    d.defer_unwatch();
                    let _ = events.send((RawEvent::Completed, Instant::now()));
                    break Ok(());
                }
                Seen::Other => {
                    d.defer_unwatch();
                    break Ok(());
                }
                Seen::Attempt(n) if obs.pttl != -2 => {
                    d.defer_unwatch();
                    drop(d);
                    if locked != Some(n) {
                        locked = Some(n);
                        let _ = events.send((RawEvent::Locked(n), Instant::now()));
                    }
                    let mut pttl = obs.pttl;
                    if sub.is_none() {
                        sub = Some(self.hub.subscribe(&k.channel).await?);
                        match self.quick_read(k).await? {
                            (Seen::Attempt(m), p) if m == n && p != -2 => pttl = p,
                            _ => continue,
                        }
                    }
                    // Like baton's `wait()`: a message means "decide now"; the end of the lease's
                    // time means one plain read, and sleeping again while the lease is alive.
                    loop {
                        let sleep = Duration::from_millis(pttl.max(1) as u64);
                        let rx = &mut sub.as_mut().expect("subscribed").rx;
                        let message = tokio::select! {
                            _ = rx.recv() => true,
                            _ = tokio::time::sleep(sleep) => false,
                        };
                        if message {
                            break;
                        }
                        self.timer_wakeups.fetch_add(1, Ordering::Relaxed);
                        match self.quick_read(k).await? {
                            (Seen::Attempt(m), p) if m == n && p > 0 => pttl = p,
                            _ => break,
                        }
                    }
                }
                state => {
                    let attempt = match state {
                        Seen::Attempt(n) => n + 1,
                        _ => 1,
                    };
                    let tx = grant_cmds(job, attempt, &obs, &self.token(), &self.name);
                    if !d.exec(tx).await? {
                        continue;
                    }
                    drop(d);
                    let _ = events.send((RawEvent::Acquired(attempt), Instant::now()));
                    // Like baton's `hold()`: the holder subscribes alongside the work, and
                    // `done()`/`fail()` do not wait for the subscription.
                    let need_sub = sub.is_none();
                    let subscribing = async {
                        if need_sub {
                            Some(self.hub.subscribe(&k.channel).await)
                        } else {
                            None
                        }
                    };
                    let work = async {
                        let ending = match control.take() {
                            None => Ending::Done,
                            Some(rx) => rx.await.unwrap_or(Ending::Abandon),
                        };
                        if ending == Ending::Abandon {
                            let _ = events.send((RawEvent::Abandoned, Instant::now()));
                            return Ok(());
                        }
                        self.finish(job, attempt, ending).await?;
                        let ev = match ending {
                            Ending::Done => RawEvent::Completed,
                            _ => RawEvent::Failed,
                        };
                        let _ = events.send((ev, Instant::now()));
                        Ok(())
                    };
                    let (subscribed, worked) = tokio::join!(subscribing, work);
                    if let Some(s) = subscribed {
                        sub = Some(s?);
                    }
                    break worked;
                }
            }
        };
        if let Some(s) = sub {
            self.hub.unsubscribe(&k.channel, s);
        }
        result
    }

    /// The holder's `done()`/`fail()` transition, retried on a nil `EXEC`.
    async fn finish(&self, job: &Job, attempt: u64, ending: Ending) -> redis::RedisResult<()> {
        let k = &job.keys;
        loop {
            let mut d = self.pool.get().await?;
            let _obs = d.observe(k).await?;
            let tx = finish_cmds(job, attempt, ending, &self.name);
            if d.exec(tx).await? {
                return Ok(());
            }
        }
    }
}
