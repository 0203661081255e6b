//! The fair lock's and run-or-enqueue's scenarios, against hand-written floors on the same
//! private redis-server, samples interleaved (round 0 is a warm-up). Nothing is asserted.
//!
//! - `fair-handoff`: a holder and `W` parked waiters (1 and 10) on one fair lock; µs from
//!   `release()` being called to the queue's head holding the lock, also in round trips (a
//!   `PING`'s p50 in the same run), and server commands per handoff (`INFO commandstats`
//!   around the handoff only). The waiters' liveness refreshes are counted apart: in a window
//!   where `W` waiters sit parked (waiter timeout 300 ms: a refresh every 100 ms) and nothing
//!   is released.
//! - `fair-contended`: 8 tasks acquire → release one key in a loop (hold 0); handoffs/s for
//!   the fair lock, baton's mutex (`Client::locks()`, which barges) and the floor; the spread
//!   of per-task counts shows the order.
//! - `queue-throughput`: 8 posters `run_or_enqueue` on one key (a no-op handler); items
//!   handled per second against a hand-written LPUSH + SET NX drain loop.
//!
//! **The FIFO floor** is what a careful user writes by hand for a FIFO lock on Redis: a LIST of
//! waiter tokens, the lock a `SET PX` key, and one pub/sub channel per waiter. Acquire is one
//! `EVALSHA` (grant iff the lock is free and the caller heads the list or the list is empty;
//! else `RPUSH` the caller once, `LPOS`-checked); a waiter has one id and one pub/sub
//! connection `SUBSCRIBE`d to its own channel for its whole life (so it subscribes before its
//! first try and never on the handoff's path), and tries again on each message; release is one
//! `EVALSHA` compare-and-`DEL` that `PUBLISH`es `go` to the list's head. No fence, no liveness
//! (a dead waiter blocks the list forever), no reservation, no timeouts.
//!
//! **The fenced FIFO floor** (`fair-contended`) is the FIFO floor with what baton's fair lock
//! guarantees besides order, as a careful user adds it: each grant steps a fencing token to
//! `max(old + 1, server time in µs)` (as the mutex's fenced floor, `locks.rs`), and waiters
//! have liveness: each try writes the waiter's deadline (server time + the waiter timeout,
//! baton's default 10 s) into a hash and refreshes the list's and the hash's TTLs, and a grant
//! or release first drops dead heads (head only, as baton). Its parked waiters try again every
//! third of the waiter timeout, which refreshes their deadline. Baton's `fair-contended` target
//! is against this floor.
//!
//! **The run-or-enqueue floor**: `LPUSH items x` and `SET lock token NX PX` pipelined (one
//! round trip); the poster that set the lock `RPOP`s 100 at a time, handles each, and on an
//! empty pop runs one `EVALSHA` "DEL the lock iff it is mine and the list is empty" (else it
//! pops again). An item is popped before it is handled: at-most-once, where baton is
//! at-least-once (XADD / XRANGE / XDEL on a Stream, a fenced lease with a watchdog). **The safe
//! floor** keeps baton's guarantee: the same lock and posting, each item `LMOVE`d to a
//! processing list and `LREM`ed after its handler returned (pipelined with the next `LMOVE`:
//! one round trip per item), what a crashed holder left handled first; baton's target is
//! against this one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::{AcquireOptions, Client, FairOptions};
use redis::aio::{MultiplexedConnection, PubSub};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::harness::{admin, connect, Report};
use crate::redisinfo::{self, CommandStats};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

/// Every lock is taken for this long (never reached: every cycle releases).
const TTL: Duration = Duration::from_secs(10);

/// The fenced FIFO floor's waiter timeout: baton's default.
fn fenced_waiter_timeout() -> Duration {
    FairOptions::default().waiter_timeout()
}

/// The floor's acquire: grant iff free and first in line, else join the line once.
const FLOOR_ACQUIRE: &str = "local head = redis.call('LINDEX', KEYS[2], 0) \
    if redis.call('EXISTS', KEYS[1]) == 0 and ((not head) or head == ARGV[1]) then \
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
      if head then redis.call('LPOP', KEYS[2]) end \
      return 1 end \
    if not redis.call('LPOS', KEYS[2], ARGV[1]) then redis.call('RPUSH', KEYS[2], ARGV[1]) end \
    return 0";

/// The floor's release: compare-and-DEL, then wake the line's head on its own channel.
const FLOOR_RELEASE: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
    redis.call('DEL', KEYS[1]) \
    local head = redis.call('LINDEX', KEYS[2], 0) \
    if head then redis.call('PUBLISH', ARGV[2] .. head, 'go') end \
    return 1";

/// Drops dead heads of the line (`KEYS[2]`; deadlines in the hash `KEYS[A]`, ms of server
/// time `now`) and leaves `head` at the first live one: the fenced FIFO floor's shared prefix.
const FENCED_EVICT: &str = "local t = redis.call('TIME') \
    local now_us = t[1] * 1000000 + t[2] \
    local now = math.floor(now_us / 1000) \
    local head = redis.call('LINDEX', KEYS[2], 0) \
    while head and head ~= ARGV[1] do \
      local d = tonumber(redis.call('HGET', KEYS[A], head)) \
      if d and d > now then break end \
      redis.call('LPOP', KEYS[2]) redis.call('HDEL', KEYS[A], head) \
      head = redis.call('LINDEX', KEYS[2], 0) \
    end ";

/// The fenced FIFO floor's acquire after [`FENCED_EVICT`] (`KEYS`: lock, line, fence,
/// deadlines; `ARGV`: token, ttl ms, waiter timeout ms): the fencing token when granted (free and first live in line), else
/// 0 after joining the line once and writing the waiter's deadline.
const FENCED_FLOOR_ACQUIRE: &str =
    "if redis.call('EXISTS', KEYS[1]) == 0 and ((not head) or head == ARGV[1]) then \
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
      if head then redis.call('LPOP', KEYS[2]) redis.call('HDEL', KEYS[4], head) end \
      local old = tonumber(redis.call('GET', KEYS[3])) or 0 \
      local f = string.format('%.0f', math.max(old + 1, now_us)) \
      redis.call('SET', KEYS[3], f, 'PX', 86400000) \
      return f end \
    if not redis.call('LPOS', KEYS[2], ARGV[1]) then redis.call('RPUSH', KEYS[2], ARGV[1]) end \
    redis.call('HSET', KEYS[4], ARGV[1], now + tonumber(ARGV[3])) \
    redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[3])) \
    redis.call('PEXPIRE', KEYS[4], 2 * tonumber(ARGV[3])) \
    return 0";

/// The fenced FIFO floor's release around [`FENCED_EVICT`] (`KEYS`: lock, line, deadlines;
/// `ARGV`: token, channel prefix): compare-and-DEL, drop dead heads, wake the first live one on
/// its own channel.
const FENCED_FLOOR_RELEASE_CHECK: &str =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
    redis.call('DEL', KEYS[1]) ";

/// The end of [`FENCED_FLOOR_RELEASE_CHECK`], after [`FENCED_EVICT`].
const FENCED_FLOOR_RELEASE: &str = "if head then redis.call('PUBLISH', ARGV[2] .. head, 'go') end \
    return 1";

/// The run-or-enqueue floor's release: DEL the lock iff it is ours and nothing is queued.
/// 1: released; 0: items left; -1: not ours any more.
const FLOOR_RELEASE_IF_EMPTY: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end \
    if redis.call('LLEN', KEYS[2]) > 0 then return 0 end \
    redis.call('DEL', KEYS[1]) return 1";

/// What the fenced FIFO floor adds, stated in the notes.
const FENCED_FIFO_FLOOR: &str = "; the floor plus a fence stepped on each grant, waiter \
    deadlines (server time + 10 s) in a hash written on each try, TTLs on the line and the hash, \
    dead heads dropped on grant and release, parked waiters retrying every 3.3 s";

/// What the FIFO floor is, stated in the notes.
const FIFO_FLOOR: &str = "floor: LIST of waiters + SET PX lock, acquire = one EVALSHA (grant \
    iff free and head, else RPUSH once), per-waiter channel SUBSCRIBEd for the waiter's whole \
    life, release = EVALSHA \
    compare-and-DEL + PUBLISH to the head; no fence, no liveness, no reservation";

/// What the safe run-or-enqueue floor is, stated in the notes.
const SAFE_QUEUE_FLOOR: &str = "safe floor: LPUSH + SET NX PX pipelined; the setter LMOVEs each \
    item to a processing list and LREMs it after handling (pipelined with the next LMOVE), then \
    EVALSHA DEL-iff-mine-and-empty; at-least-once, as baton";

/// What the run-or-enqueue floor is, stated in the notes.
const QUEUE_FLOOR: &str = "floor: LPUSH + SET NX PX pipelined; the setter RPOPs 100 at a \
    time, then EVALSHA DEL-iff-mine-and-empty; at-most-once (pop before handling)";

fn token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let r = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("{:016x}{:016x}", r(), r())
}

/// The bench's own commands, left out of the counts.
fn own(cmd: &str) -> bool {
    matches!(
        cmd,
        "info" | "zcard" | "llen" | "ping" | "pubsub|channels" | "pubsub|numsub" | "script|load"
    )
}

fn add(total: &mut CommandStats, d: &CommandStats) {
    for (k, v) in d {
        if !own(k) {
            *total.entry(k.clone()).or_default() += v;
        }
    }
}

/// Commands per operation, total and by name.
fn per_op(c: &CommandStats, ops: usize) -> (f64, serde_json::Value) {
    let n = ops.max(1) as f64;
    let total = c.values().sum::<u64>() as f64 / n;
    let by: serde_json::Map<_, _> = c
        .iter()
        .map(|(k, v)| (k.clone(), json!((*v as f64 / n * 100.0).round() / 100.0)))
        .collect();
    (total, serde_json::Value::Object(by))
}

/// Commands a client sends itself (the rest of a handoff's count ran inside scripts).
fn sent_by_client(cmd: &str) -> bool {
    matches!(
        cmd,
        "evalsha" | "eval" | "subscribe" | "unsubscribe" | "ssubscribe" | "sunsubscribe"
    )
}

/// (sent by clients, run inside scripts) per operation.
fn split(c: &CommandStats, ops: usize) -> (f64, f64) {
    let n = ops.max(1) as f64;
    let sent: u64 = c
        .iter()
        .filter(|(k, _)| sent_by_client(k))
        .map(|(_, v)| v)
        .sum();
    let all: u64 = c.values().sum();
    (sent as f64 / n, (all - sent) as f64 / n)
}

fn brief(by: &serde_json::Value) -> String {
    by.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// Waits (bounded) until `key` (a sorted set or a list) has `n` members.
async fn wait_len(adm: &mut MultiplexedConnection, key: &str, n: usize, zset: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let len: usize = redis::cmd(if zset { "ZCARD" } else { "LLEN" })
            .arg(key)
            .query_async(adm)
            .await
            .expect("ZCARD/LLEN");
        if len >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{key}: {len} of {n} waiters");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn fair_opts(waiter_timeout: Duration) -> FairOptions {
    FairOptions::builder()
        .waiter_timeout(waiter_timeout)
        .build()
        .expect("valid fair options")
}

/// The FIFO floor: one multiplexed connection for the scripts, a pub/sub connection per waiter.
#[derive(Clone)]
struct Fifo {
    url: String,
    conn: MultiplexedConnection,
    acquire: String,
    release: String,
    release_if_empty: String,
    fenced_acquire: String,
    fenced_release: String,
}

impl Fifo {
    async fn connect(url: &str) -> Fifo {
        let conn = admin(url).await;
        let load = |src: String| {
            let mut c = conn.clone();
            async move {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(src)
                    .query_async::<String>(&mut c)
                    .await
                    .expect("SCRIPT LOAD")
            }
        };
        let evict = |deadlines: &str| FENCED_EVICT.replace("KEYS[A]", deadlines);
        Fifo {
            url: url.to_string(),
            acquire: load(FLOOR_ACQUIRE.into()).await,
            release: load(FLOOR_RELEASE.into()).await,
            release_if_empty: load(FLOOR_RELEASE_IF_EMPTY.into()).await,
            fenced_acquire: load(evict("KEYS[4]") + FENCED_FLOOR_ACQUIRE).await,
            fenced_release: load(
                FENCED_FLOOR_RELEASE_CHECK.to_string() + &evict("KEYS[3]") + FENCED_FLOOR_RELEASE,
            )
            .await,
            conn,
        }
    }

    async fn pubsub(&self) -> PubSub {
        redis::Client::open(self.url.as_str())
            .expect("url")
            .get_async_pubsub()
            .await
            .expect("floor pub/sub")
    }

    async fn try_acquire(&self, key: &str, token: &str) -> bool {
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.acquire)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:queue"))
            .arg(token)
            .arg(TTL.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await
            .expect("floor acquire");
        n == 1
    }

    /// Subscribes `ps` to waiter `token`'s own channel on `key` (once per waiter: a careful
    /// user keeps it across acquisitions).
    async fn subscribe(ps: &mut PubSub, key: &str, token: &str) {
        ps.subscribe(format!("{key}:wake:{token}"))
            .await
            .expect("floor SUBSCRIBE");
    }

    /// Tries, and tries again on each message on the waiter's channel (`ps`, subscribed
    /// before: [`Fifo::subscribe`]) or after a second without one. Returns once it holds the
    /// lock; the subscription stays (a stale `go` later costs one extra try).
    async fn acquire(&self, ps: &mut PubSub, key: &str, token: &str) {
        while !self.try_acquire(key, token).await {
            let mut msgs = ps.on_message();
            let _ = tokio::time::timeout(Duration::from_secs(1), msgs.next()).await;
        }
    }

    /// The fenced FIFO floor's try: its fencing token when granted.
    async fn try_acquire_fenced(&self, key: &str, token: &str) -> Option<u64> {
        let v: redis::Value = redis::cmd("EVALSHA")
            .arg(&self.fenced_acquire)
            .arg(4)
            .arg(key)
            .arg(format!("{key}:queue"))
            .arg(format!("{key}:fence"))
            .arg(format!("{key}:alive"))
            .arg(token)
            .arg(TTL.as_millis() as u64)
            .arg(fenced_waiter_timeout().as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await
            .expect("fenced floor acquire");
        match v {
            redis::Value::BulkString(b) => Some(
                std::str::from_utf8(&b)
                    .expect("utf-8")
                    .parse()
                    .expect("a fence"),
            ),
            _ => None,
        }
    }

    /// As [`Fifo::acquire`] for the fenced floor: a parked waiter tries again (refreshing its
    /// deadline) every third of the waiter timeout. Returns the fencing token.
    async fn acquire_fenced(&self, ps: &mut PubSub, key: &str, token: &str) -> u64 {
        loop {
            if let Some(f) = self.try_acquire_fenced(key, token).await {
                return f;
            }
            let mut msgs = ps.on_message();
            let _ = tokio::time::timeout(fenced_waiter_timeout() / 3, msgs.next()).await;
        }
    }

    async fn release_fenced(&self, key: &str, token: &str) -> bool {
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.fenced_release)
            .arg(3)
            .arg(key)
            .arg(format!("{key}:queue"))
            .arg(format!("{key}:alive"))
            .arg(token)
            .arg(format!("{key}:wake:"))
            .query_async(&mut self.conn.clone())
            .await
            .expect("fenced floor release");
        n == 1
    }

    async fn release(&self, key: &str, token: &str) -> bool {
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.release)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:queue"))
            .arg(token)
            .arg(format!("{key}:wake:"))
            .query_async(&mut self.conn.clone())
            .await
            .expect("floor release");
        n == 1
    }
}

/// µs of one `PING` round trip on a multiplexed connection (p50 of 200).
async fn round_trip(adm: &mut MultiplexedConnection) -> f64 {
    let mut s = Samples::default();
    for _ in 0..200 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(adm).await.expect("PING");
        s.push(t.elapsed());
    }
    s.pct(50.0).unwrap_or(f64::NAN)
}

// ---------------------------------------------------------------------------------------------
// fair-handoff

/// One handoff sample: µs from release() called to the head holding, and the commands the
/// server ran in between (plus a 3 ms tail for the head's trailing unsubscribe).
type Handoff = (f64, CommandStats);

/// Settles, then counts commands from `t0` to the head holding (+ 3 ms).
async fn measure<F: std::future::Future<Output = ()>>(
    adm: &mut MultiplexedConnection,
    release: F,
    held: &mut mpsc::UnboundedReceiver<Instant>,
) -> Handoff {
    // Let every waiter finish its post-subscription try and park.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let before = redisinfo::commandstats(adm).await;
    let t0 = Instant::now();
    release.await;
    let t1 = held.recv().await.expect("the head holds");
    tokio::time::sleep(Duration::from_millis(3)).await;
    let after = redisinfo::commandstats(adm).await;
    (
        (t1 - t0).as_secs_f64() * 1e6,
        redisinfo::delta(&before, &after),
    )
}

/// baton: `holder` holds, `w` waiters (on `waiters`, queued one after the other) park; the
/// holder releases; the head's `acquire()` returning ends the sample. Then everyone cascades
/// through the lock and leaves (not counted).
async fn baton_handoff(
    holder: &Client,
    waiters: &Client,
    adm: &mut MultiplexedConnection,
    key: &str,
    w: usize,
) -> Handoff {
    let opts = fair_opts(Duration::from_secs(10));
    let g = holder
        .fair_locks()
        .acquire(key, TTL, &opts)
        .await
        .expect("holder acquires");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(());
    let qkey = format!("baton:fair:{{{key}}}:queue");
    let mut tasks = Vec::new();
    for i in 0..w {
        let (fl, tx, mut stop, k, o) = (
            waiters.fair_locks(),
            tx.clone(),
            stop_rx.clone(),
            key.to_string(),
            opts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let g = fl.acquire(&k, TTL, &o).await.expect("waiter acquires");
            let _ = tx.send(Instant::now());
            let _ = stop.changed().await;
            g.release().await.expect("waiter releases");
        }));
        wait_len(adm, &qkey, i + 1, true).await;
    }
    let out = measure(
        adm,
        async {
            assert!(g.release().await.expect("holder releases"));
        },
        &mut rx,
    )
    .await;
    stop_tx.send(()).expect("waiters listen");
    for t in tasks {
        t.await.expect("waiter task");
    }
    out
}

/// The floor: the same with the FIFO floor.
async fn floor_handoff(f: &Fifo, adm: &mut MultiplexedConnection, key: &str, w: usize) -> Handoff {
    let ht = token();
    assert!(f.try_acquire(key, &ht).await, "floor holder acquires");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(());
    let qkey = format!("{key}:queue");
    let mut tasks = Vec::new();
    for i in 0..w {
        let mut ps = f.pubsub().await;
        let (f2, tx, mut stop, k) = (f.clone(), tx.clone(), stop_rx.clone(), key.to_string());
        let t = token();
        Fifo::subscribe(&mut ps, key, &t).await;
        tasks.push(tokio::spawn(async move {
            f2.acquire(&mut ps, &k, &t).await;
            let _ = tx.send(Instant::now());
            let _ = stop.changed().await;
            assert!(f2.release(&k, &t).await, "floor waiter releases");
        }));
        wait_len(adm, &qkey, i + 1, false).await;
    }
    let out = measure(
        adm,
        async {
            assert!(f.release(key, &ht).await, "floor holder releases");
        },
        &mut rx,
    )
    .await;
    stop_tx.send(()).expect("floor waiters listen");
    for t in tasks {
        t.await.expect("floor waiter task");
    }
    out
}

/// Commands per waiter per second while `w` waiters sit parked behind a holder that never
/// releases (waiter timeout `wt`), over `window`.
async fn liveness(
    holder: &Client,
    waiters: &Client,
    adm: &mut MultiplexedConnection,
    key: &str,
    w: usize,
    wt: Duration,
    window: Duration,
) -> (f64, serde_json::Value) {
    let opts = fair_opts(wt);
    let g = holder
        .fair_locks()
        .acquire(key, TTL, &opts)
        .await
        .expect("holder acquires");
    let qkey = format!("baton:fair:{{{key}}}:queue");
    let mut tasks = Vec::new();
    for i in 0..w {
        let (fl, k, o) = (waiters.fair_locks(), key.to_string(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let _ = fl.acquire(&k, TTL, &o).await;
        }));
        wait_len(adm, &qkey, i + 1, true).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let before = redisinfo::commandstats(adm).await;
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let after = redisinfo::commandstats(adm).await;
    let secs = t0.elapsed().as_secs_f64();
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    g.release().await.expect("holder releases");
    let mut c = CommandStats::new();
    add(&mut c, &redisinfo::delta(&before, &after));
    let (sent, in_scripts) = split(&c, 1);
    let per = w as f64 * secs;
    (
        sent / per + in_scripts / per,
        json!({ "sent_per_waiter_per_s": sent / per, "in_scripts_per_waiter_per_s": in_scripts / per, "by_name": c }),
    )
}

pub async fn handoff(opts: &Opts, report: &mut Report) {
    let (n, runs) = if opts.quick { (6, 1) } else { (30, 3) };
    let server = start_server();
    let url = server.url();
    // Holder and waiters on separate clients, as in separate processes.
    let (a, b) = (connect(&url).await, connect(&url).await);
    let floor = Fifo::connect(&url).await;
    let mut adm = admin(&url).await;
    let rtt = round_trip(&mut adm).await;
    let id = run_id();
    for w in [1usize, 10] {
        let (mut bs, mut fs) = (Samples::default(), Samples::default());
        let (mut bc, mut fc) = (CommandStats::new(), CommandStats::new());
        for round in 0..=runs {
            let count = if round == 0 { 2 } else { n };
            for i in 0..count {
                let key = format!("fh-b-{id}-{w}-{round}-{i}");
                let (d, c) = baton_handoff(&a, &b, &mut adm, &key, w).await;
                let key = format!("fh-f-{id}-{w}-{round}-{i}");
                let (e, fcs) = floor_handoff(&floor, &mut adm, &key, w).await;
                if round > 0 {
                    bs.push_us(d);
                    fs.push_us(e);
                    add(&mut bc, &c);
                    add(&mut fc, &fcs);
                }
            }
        }
        let fp = fs.pct(50.0).unwrap_or(f64::NAN);
        for (name, s, c) in [("baton", &bs, &bc), ("floor", &fs, &fc)] {
            let p50 = s.pct(50.0).unwrap_or(f64::NAN);
            let (cmds, by) = per_op(c, s.len());
            let (sent, in_scripts) = split(c, s.len());
            let mut notes = format!(
                "{w} parked waiter(s): release() called → head holds = {:.1} × a PING p50 \
                 ({rtt:.0} µs; target ≤ 3 round trips; on the path: release, one-way wake, the \
                 head's grant); per handoff {sent:.1} commands sent by \
                 clients + {in_scripts:.1} run inside scripts = {cmds:.1} ({}), counted from \
                 the release to the head holding + 3 ms",
                p50 / rtt,
                brief(&by)
            );
            if name == "floor" {
                notes.push_str("; ");
                notes.push_str(FIFO_FLOOR);
            }
            notes.push_str(&format!("; {runs} runs"));
            report.rows.push(Row {
                scenario: format!("fair-handoff w={w} {name}"),
                p50_us: Some(p50),
                p99_us: s.pct(99.0),
                ops_per_s: None,
                floor_ops_per_s: None,
                ratio: Some(p50 / fp),
                samples: s.len(),
                notes,
                extra: json!({
                    "side": name,
                    "waiters": w,
                    "ratio_of": "p50",
                    "floor_p50_us": fp,
                    "ping_p50_us": rtt,
                    "ping_multiples_p50": p50 / rtt,
                    "target_round_trips": 3,
                    "commands_per_handoff": cmds,
                    "sent_per_handoff": sent,
                    "in_scripts_per_handoff": in_scripts,
                    "commands": by,
                    "runs": runs,
                }),
            });
        }
    }
    // Liveness refreshes, apart from handoffs: 10 parked waiters, nothing released.
    let (wt, window) = (
        Duration::from_millis(300),
        if opts.quick {
            Duration::from_millis(400)
        } else {
            Duration::from_secs(2)
        },
    );
    let (per_waiter_s, by) =
        liveness(&a, &b, &mut adm, &format!("fh-l-{id}"), 10, wt, window).await;
    report.rows.push(Row {
        scenario: "fair-handoff liveness".into(),
        p50_us: None,
        p99_us: None,
        ops_per_s: Some(per_waiter_s),
        floor_ops_per_s: None,
        ratio: None,
        samples: 10,
        notes: format!(
            "server commands per parked waiter per second with waiter_timeout {} ms (a refresh \
             every {} ms expected: {:.1}/s), 10 waiters, no release, over {} ms: {:.1} sent + \
             {:.1} run inside scripts per waiter per second (in all: {}); the floor has no \
             liveness (0)",
            wt.as_millis(),
            (wt / 3).as_millis(),
            3.0 / wt.as_secs_f64(),
            window.as_millis(),
            by["sent_per_waiter_per_s"].as_f64().unwrap_or(f64::NAN),
            by["in_scripts_per_waiter_per_s"]
                .as_f64()
                .unwrap_or(f64::NAN),
            brief(&by["by_name"])
        ),
        extra: json!({
            "side": "baton",
            "waiter_timeout_ms": wt.as_millis() as u64,
            "commands_per_waiter_per_s": per_waiter_s,
            "commands": by,
            "window_ms": window.as_millis() as u64,
        }),
    });
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// fair-contended

const TASKS: usize = 8;

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Fair,
    Mutex,
    Floor,
    FencedFloor,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Fair => "fair",
            Side::Mutex => "mutex",
            Side::Floor => "floor",
            Side::FencedFloor => "fenced-floor",
        }
    }
}

/// `TASKS` tasks acquire → release `key` until `dur` is over; per-task counts and wall time.
async fn contended_round(
    side: Side,
    client: &Client,
    f: &Fifo,
    key: &str,
    dur: Duration,
) -> (Vec<u64>, f64) {
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    let end = t0 + dur;
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (client, f, key, counts) = (client.clone(), f.clone(), key.to_string(), counts.clone());
        // The floor's waiter: one id and one subscribed channel for the task's whole life.
        let t = token();
        let ps = if matches!(side, Side::Floor | Side::FencedFloor) {
            let mut ps = f.pubsub().await;
            Fifo::subscribe(&mut ps, &key, &t).await;
            Some(ps)
        } else {
            None
        };
        tasks.push(tokio::spawn(async move {
            let fo = FairOptions::default();
            let mo = AcquireOptions::default();
            let mut ps = ps;
            while Instant::now() < end {
                match side {
                    Side::Fair => {
                        let g = client
                            .fair_locks()
                            .acquire(&key, TTL, &fo)
                            .await
                            .expect("fair");
                        g.release().await.expect("fair release");
                    }
                    Side::Mutex => {
                        let g = client.locks().acquire(&key, TTL, &mo).await.expect("mutex");
                        g.release().await.expect("mutex release");
                    }
                    Side::Floor => {
                        let p = ps.as_mut().expect("pub/sub");
                        f.acquire(p, &key, &t).await;
                        f.release(&key, &t).await;
                    }
                    Side::FencedFloor => {
                        let p = ps.as_mut().expect("pub/sub");
                        f.acquire_fenced(p, &key, &t).await;
                        f.release_fenced(&key, &t).await;
                    }
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("contending task");
    }
    let wall = t0.elapsed().as_secs_f64();
    (
        counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        wall,
    )
}

pub async fn contended(opts: &Opts, report: &mut Report) {
    let (dur, runs) = if opts.quick {
        (Duration::from_millis(300), 1)
    } else {
        (Duration::from_secs(2), 3)
    };
    let server = start_server();
    let url = server.url();
    let client = connect(&url).await;
    let floor = Fifo::connect(&url).await;
    let id = run_id();
    let sides = [Side::Fair, Side::Mutex, Side::Floor, Side::FencedFloor];
    // (ops, wall, per-task counts) per side; server and this process's CPU seconds per side.
    let mut adm = admin(&url).await;
    let mut cpu: Vec<(f64, f64)> = sides.iter().map(|_| (0.0, 0.0)).collect();
    let server_cpu = |adm: &mut MultiplexedConnection| {
        let mut adm = adm.clone();
        async move {
            redisinfo::field(&mut adm, "cpu", "used_cpu_user").await
                + redisinfo::field(&mut adm, "cpu", "used_cpu_sys").await
        }
    };
    let mut cmds: Vec<CommandStats> = sides.iter().map(|_| CommandStats::new()).collect();
    let mut res: Vec<(u64, f64, Vec<u64>)> =
        sides.iter().map(|_| (0, 0.0, vec![0; TASKS])).collect();
    for round in 0..=runs {
        let d = if round == 0 { dur / 4 } else { dur };
        for k in 0..sides.len() {
            let j = (k + round) % sides.len();
            let key = format!("fc-{}-{id}-{round}", sides[j].name());
            let before = redisinfo::commandstats(&mut adm).await;
            let (server0, own0) = (server_cpu(&mut adm).await, crate::profile::proc_now());
            let (counts, wall) = contended_round(sides[j], &client, &floor, &key, d).await;
            let (server1, own1) = (server_cpu(&mut adm).await, crate::profile::proc_now());
            let after = redisinfo::commandstats(&mut adm).await;
            if round > 0 {
                add(&mut cmds[j], &redisinfo::delta(&before, &after));
                cpu[j].0 += server1 - server0;
                cpu[j].1 += (own1.user + own1.sys) - (own0.user + own0.sys);
                let r = &mut res[j];
                r.0 += counts.iter().sum::<u64>();
                r.1 += wall;
                for (a, b) in r.2.iter_mut().zip(counts) {
                    *a += b;
                }
            }
        }
    }
    let rate = |j: usize| res[j].0 as f64 / res[j].1.max(1e-9);
    let floor_rate = rate(2);
    let fenced_rate = rate(3);
    for (j, side) in sides.iter().enumerate() {
        let per = &res[j].2;
        let (min, max) = (
            per.iter().copied().min().unwrap_or(0),
            per.iter().copied().max().unwrap_or(0),
        );
        let ops = res[j].0 as usize;
        let (all, by) = per_op(&cmds[j], ops);
        let (sent, in_scripts) = split(&cmds[j], ops);
        let per_op_us = |secs: f64| secs * 1e6 / (ops.max(1) as f64);
        let (server_us, client_us) = (per_op_us(cpu[j].0), per_op_us(cpu[j].1));
        let mut notes = format!(
            "{TASKS} tasks on one key, one client, hold 0: ops/s = handoffs/s; per-task counts \
             min {min} max {max} (the spread shows the order: FIFO keeps it near 1); per \
             acquire+release {sent:.2} scripts and pub/sub commands sent + {in_scripts:.1} run \
             inside scripts = {all:.1} ({}); CPU per acquire+release: server {server_us:.0} µs, \
             client {client_us:.0} µs",
            brief(&by)
        );
        match side {
            Side::Fair => notes.push_str(&format!(
                "; FairOptions::default(); fenced floor ÷ this: {:.2}",
                fenced_rate / rate(j)
            )),
            Side::Mutex => notes.push_str("; baton's mutex, AcquireOptions::default() (one client: its tasks take turns, no order across clients)"),
            Side::Floor => {
                notes.push_str("; ");
                notes.push_str(FIFO_FLOOR);
            }
            Side::FencedFloor => notes.push_str(FENCED_FIFO_FLOOR),
        }
        notes.push_str(&format!("; {runs} runs"));
        report.rows.push(Row {
            scenario: format!("fair-contended {}", side.name()),
            p50_us: None,
            p99_us: None,
            ops_per_s: Some(rate(j)),
            floor_ops_per_s: Some(floor_rate),
            ratio: Some(floor_rate / rate(j)),
            samples: res[j].0 as usize,
            notes,
            extra: json!({
                "side": side.name(),
                "tasks": TASKS,
                "ratio_of": "floor ops/s ÷ this side's",
                "fenced_floor_ops_per_s": fenced_rate,
                "fenced_floor_ratio": fenced_rate / rate(j),
                "per_task": per,
                "commands_per_op": all,
                "sent_per_op": sent,
                "in_scripts_per_op": in_scripts,
                "commands": by,
                "server_cpu_us_per_op": server_us,
                "client_cpu_us_per_op": client_us,
                "runs": runs,
            }),
        });
    }
    client.shutdown(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// queue-throughput

const POSTERS: usize = 8;

/// baton: `POSTERS` tasks `run_or_enqueue` until `dur` is over; (handled, posted, wall s).
async fn baton_queue(client: &Client, key: &str, dur: Duration) -> (u64, u64, f64) {
    let handled = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + dur;
    let mut tasks = Vec::new();
    for _ in 0..POSTERS {
        let (q, key, handled) = (client.queues(), key.to_string(), handled.clone());
        tasks.push(tokio::spawn(async move {
            let mut posted = 0u64;
            while Instant::now() < end {
                let h = handled.clone();
                q.run_or_enqueue(&key, b"x", Duration::from_secs(10), move |_item| {
                    h.fetch_add(1, Ordering::Relaxed);
                    async { Ok::<(), std::io::Error>(()) }
                })
                .await
                .expect("run_or_enqueue");
                posted += 1;
            }
            posted
        }));
    }
    let mut posted = 0;
    for t in tasks {
        posted += t.await.expect("poster");
    }
    // Every poster returned: nobody holds the key, so nothing can be left.
    let wall = t0.elapsed().as_secs_f64();
    let left = client.queues().pending(key).await.expect("pending");
    assert_eq!(left, 0, "baton left {left} items on {key}");
    (handled.load(Ordering::Relaxed), posted, wall)
}

/// The floor, the same way.
async fn floor_queue(f: &Fifo, key: &str, dur: Duration) -> (u64, u64, f64) {
    let handled = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + dur;
    let (lock, items) = (format!("{key}:lock"), format!("{key}:items"));
    let mut tasks = Vec::new();
    for _ in 0..POSTERS {
        let (f, lock, items, handled) = (f.clone(), lock.clone(), items.clone(), handled.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = f.conn.clone();
            let mut posted = 0u64;
            while Instant::now() < end {
                let t = token();
                posted += 1;
                if !post_and_try_lock(&mut c, &items, &lock, &t).await {
                    continue;
                }
                loop {
                    let got: Option<Vec<String>> = redis::cmd("RPOP")
                        .arg(&items)
                        .arg(100)
                        .query_async(&mut c)
                        .await
                        .expect("floor RPOP");
                    match got {
                        Some(v) if !v.is_empty() => {
                            for _item in v {
                                handled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            if release_if_empty(&mut c, &f, &lock, &items, &t).await != 0 {
                                break;
                            }
                        }
                    }
                }
            }
            posted
        }));
    }
    let mut posted = 0;
    for t in tasks {
        posted += t.await.expect("floor poster");
    }
    let wall = t0.elapsed().as_secs_f64();
    (handled.load(Ordering::Relaxed), posted, wall)
}

/// The run-or-enqueue floors' post: `LPUSH` the item and try `SET lock token NX PX`, pipelined
/// (one round trip); whether this poster now holds the lock.
async fn post_and_try_lock(
    c: &mut MultiplexedConnection,
    items: &str,
    lock: &str,
    t: &str,
) -> bool {
    let (_, set): (i64, Option<String>) = redis::pipe()
        .cmd("LPUSH")
        .arg(items)
        .arg("x")
        .cmd("SET")
        .arg(lock)
        .arg(t)
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64)
        .query_async(c)
        .await
        .expect("floor LPUSH + SET NX");
    set.is_some()
}

/// The run-or-enqueue floors' "release if empty" ([`FLOOR_RELEASE_IF_EMPTY`]'s reply).
async fn release_if_empty(
    c: &mut MultiplexedConnection,
    f: &Fifo,
    lock: &str,
    items: &str,
    t: &str,
) -> i64 {
    redis::cmd("EVALSHA")
        .arg(&f.release_if_empty)
        .arg(2)
        .arg(lock)
        .arg(items)
        .arg(t)
        .query_async(c)
        .await
        .expect("floor release-if-empty")
}

/// The safe floor: the same lock and posting, but at-least-once as baton is: each item is
/// `LMOVE`d to a processing list and `LREM`ed from it only after its handler returned (the
/// `LREM` of one item pipelined with the `LMOVE` of the next: one round trip per item); a new
/// holder first handles what a crashed one left in the processing list.
async fn floor_queue_safe(f: &Fifo, key: &str, dur: Duration) -> (u64, u64, f64) {
    let handled = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + dur;
    let (lock, items, processing) = (
        format!("{key}:lock"),
        format!("{key}:items"),
        format!("{key}:processing"),
    );
    let mut tasks = Vec::new();
    for _ in 0..POSTERS {
        let (f, lock, items, processing, handled) = (
            f.clone(),
            lock.clone(),
            items.clone(),
            processing.clone(),
            handled.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut c = f.conn.clone();
            let mut posted = 0u64;
            while Instant::now() < end {
                let t = token();
                posted += 1;
                if !post_and_try_lock(&mut c, &items, &lock, &t).await {
                    continue;
                }
                // What a crashed holder left: handled again (at-least-once), then removed.
                let left: Vec<String> = redis::cmd("LRANGE")
                    .arg(&processing)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut c)
                    .await
                    .expect("safe floor LRANGE processing");
                assert!(left.is_empty(), "nobody crashed here");
                let mut done: Option<String> = None;
                loop {
                    let mut p = redis::pipe();
                    if let Some(item) = &done {
                        p.cmd("LREM").arg(&processing).arg(1).arg(item).ignore();
                    }
                    p.cmd("LMOVE")
                        .arg(&items)
                        .arg(&processing)
                        .arg("RIGHT")
                        .arg("LEFT");
                    let (next,): (Option<String>,) = p
                        .query_async(&mut c)
                        .await
                        .expect("safe floor LREM + LMOVE");
                    match next {
                        Some(item) => {
                            handled.fetch_add(1, Ordering::Relaxed);
                            done = Some(item);
                        }
                        None => {
                            done = None;
                            if release_if_empty(&mut c, &f, &lock, &items, &t).await != 0 {
                                break;
                            }
                        }
                    }
                }
            }
            posted
        }));
    }
    let mut posted = 0;
    for t in tasks {
        posted += t.await.expect("safe floor poster");
    }
    let wall = t0.elapsed().as_secs_f64();
    (handled.load(Ordering::Relaxed), posted, wall)
}

pub async fn queue(opts: &Opts, report: &mut Report) {
    let (dur, runs) = if opts.quick {
        (Duration::from_millis(300), 1)
    } else {
        (Duration::from_secs(2), 3)
    };
    let server = start_server();
    let url = server.url();
    let client = connect(&url).await;
    let floor = Fifo::connect(&url).await;
    let id = run_id();
    // (handled, posted, wall) per side: baton, the floor, the safe floor.
    let mut res = [(0u64, 0u64, 0.0f64); 3];
    for round in 0..=runs {
        let d = if round == 0 { dur / 4 } else { dur };
        for k in 0..3 {
            let j = (k + round) % 3;
            let key = format!("qt-{j}-{id}-{round}");
            let r = match j {
                0 => baton_queue(&client, &key, d).await,
                1 => floor_queue(&floor, &key, d).await,
                _ => floor_queue_safe(&floor, &key, d).await,
            };
            assert_eq!(r.0, r.1, "side {j}: every posted item handled once");
            if round > 0 {
                res[j].0 += r.0;
                res[j].1 += r.1;
                res[j].2 += r.2;
            }
        }
    }
    let rate = |j: usize| res[j].0 as f64 / res[j].2.max(1e-9);
    // Each side against the unsafe floor, then baton against the safe floor (the target).
    let rows = [
        ("baton", 0, 1),
        ("floor", 1, 1),
        ("safe-floor", 2, 1),
        ("baton vs safe-floor", 0, 2),
    ];
    for (name, j, against) in rows {
        let mut notes = format!(
            "{POSTERS} posters on one key, no-op handler: ops/s = items handled per second \
             (every posted item handled, checked)"
        );
        match j {
            1 => {
                notes.push_str("; ");
                notes.push_str(QUEUE_FLOOR);
            }
            2 => {
                notes.push_str("; ");
                notes.push_str(SAFE_QUEUE_FLOOR);
            }
            _ => notes.push_str("; Queues defaults (ttl 10 s), at-least-once on a Stream"),
        }
        notes.push_str(&format!("; {runs} runs"));
        report.rows.push(Row {
            scenario: format!("queue-throughput {name}"),
            p50_us: None,
            p99_us: None,
            ops_per_s: Some(rate(j)),
            floor_ops_per_s: Some(rate(against)),
            ratio: Some(rate(against) / rate(j)),
            samples: res[j].0 as usize,
            notes,
            extra: json!({
                "side": name,
                "posters": POSTERS,
                "ratio_of": if against == 1 { "floor items/s ÷ this side's" } else { "safe floor items/s ÷ baton's" },
                "runs": runs,
            }),
        });
    }
    client.shutdown(Duration::from_secs(5)).await;
}
