//! The leader-election scenarios: `leader-takeover` (the leader crashes, the standby leads
//! once its lease runs out) and `leader-handover` (the leader resigns, the idle standby leads
//! at once). Each runs baton (`Client::leaders()`, `Elector`, shipped defaults but the lease)
//! and a hand-written floor on the `redis` crate against the same private redis-server, their
//! samples interleaved one by one (round 0 is a warm-up).
//!
//! The floor is what a careful user writes by hand for the same job, and nothing else: no
//! term (fence), no events, no timeouts.
//!
//! - Leader: `SET key token NX PX lease`, renewed every `lease / 3` by an `EVALSHA`
//!   compare-and-`PEXPIRE`.
//! - Standby: `SET key token NX PX lease` pipelined with `PTTL key` (one round trip); on a
//!   miss it sleeps the PTTL (1 ms when the key has none or is about to go), then tries again.
//!   In `leader-handover` it is also `SUBSCRIBE`d to the election's channel (its own pub/sub
//!   connection) and tries again as soon as a message arrives.
//! - Resign: one `EVALSHA` compare-and-`DEL` that `PUBLISH`es `released` when it deleted.
//!
//! `leader-handover` also runs a **fenced floor**: the floor whose tries are one `EVALSHA` of
//! [`FENCED_TRY`], which also steps a term number (the fence, as baton's term) past a restart
//! that lost the data: what a careful user writes for a leader whose term only grows.
//!
//! Nothing is asserted about timings.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::{Client, ElectionOptions, Fenced};
use redis::aio::{MultiplexedConnection, PubSub};
use serde_json::json;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use crate::harness::{admin, connect, drain_pubsub, Report};
use crate::redisinfo::{self, CommandStats, Monitor};
use crate::stats::{Row, Samples};
use crate::{run_id, start_server, Opts};

/// The floor's renewal: compare-and-`PEXPIRE`.
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// The floor's resignation: compare-and-`DEL`, then `PUBLISH released` on the channel.
const RESIGN: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                      redis.call('DEL', KEYS[1]); redis.call('PUBLISH', KEYS[2], 'released'); \
                      return 1 else return 0 end";

/// The fenced floor's try, as a careful user writes it: the lease, then the term stepped to
/// `max(old + 1, server time in µs)` with a day's retention, as the mutex's fenced floor
/// (`locks.rs`); `{1, term}` when it leads, else `{0, the leader's PTTL}`.
const FENCED_TRY: &str = "
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local old = tonumber(redis.call('GET', KEYS[2])) or 0
  local f = string.format('%.0f', math.max(old + 1, now))
  redis.call('SET', KEYS[2], f, 'PX', 86400000)
  return {1, f}
end
return {0, redis.call('PTTL', KEYS[1])}";

/// What the floor does, stated in the notes.
const FLOOR_WHAT: &str = "floor: SET NX PX + PTTL pipelined, sleep PTTL, renew by EVALSHA \
                          compare-and-PEXPIRE every lease/3, no term";

/// The handover floor's standby and resignation, stated in the notes.
const FLOOR_HANDOVER: &str = "floor: standby SUBSCRIBEd, SET NX PX on the message; resign = \
                              EVALSHA compare-and-DEL + PUBLISH";

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The `i`-th of a low-discrepancy sequence in `[0, 1)` (golden ratio): both sides crash at
/// the same spread of points in the renewal cycle.
fn phase(i: usize) -> f64 {
    (i as f64 * 0.618_033_988_749_895).fract()
}

fn token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let r = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("{:016x}{:016x}", r(), r())
}

fn election(lease: Duration, name: &str) -> ElectionOptions {
    ElectionOptions::builder()
        .lease(lease)
        .name(name)
        .build()
        .expect("valid election options")
}

/// Waits (bounded) until `channel` has at least `n` subscribers.
async fn wait_numsub(adm: &mut MultiplexedConnection, channel: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(adm)
            .await
            .expect("PUBSUB NUMSUB");
        if v.1 >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel}: {} of {n} subscribers",
            v.1
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The lease's expiry in Unix µs (`PEXPIRETIME`, ms precision, the server's clock).
async fn expiry_us(adm: &mut MultiplexedConnection, key: &str) -> i64 {
    let ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(adm)
        .await
        .expect("PEXPIRETIME");
    assert!(ms > 0, "{key} has no expiry ({ms})");
    ms * 1000
}

/// The bench's own commands, left out of the counts.
fn own(cmd: &str) -> bool {
    matches!(
        cmd,
        "info" | "pubsub|channels" | "pubsub|numsub" | "pexpiretime" | "script|load"
    )
}

fn add(total: &mut CommandStats, d: &CommandStats) {
    for (k, v) in d {
        if !own(k) {
            *total.entry(k.clone()).or_default() += v;
        }
    }
}

/// Commands per operation, total and by name (`"evalsha": 2.0, ...`).
fn per_op(c: &CommandStats, ops: usize) -> (f64, serde_json::Value) {
    let n = ops.max(1) as f64;
    let total = c.values().sum::<u64>() as f64 / n;
    let by: serde_json::Map<_, _> = c
        .iter()
        .map(|(k, v)| (k.clone(), json!((*v as f64 / n * 100.0).round() / 100.0)))
        .collect();
    (total, by.into())
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

/// What `MONITOR` saw since the last call: the commands clients sent (upper case, in order;
/// the bench's own left out) and how many ran inside scripts.
fn sent(mon: &Monitor) -> (Vec<String>, usize) {
    let seen = mon.take();
    let in_scripts = seen.iter().filter(|s| s.addr == "lua").count();
    let top = seen
        .into_iter()
        .filter(|s| s.addr != "lua" && !own(&s.cmd.to_ascii_lowercase()))
        .filter(|s| !matches!(s.cmd.as_str(), "PUBSUB" | "SCRIPT"))
        .map(|s| s.cmd)
        .collect();
    (top, in_scripts)
}

/// One side's `MONITOR`ed pass, as JSON and as a note.
fn sent_note(top: &[String], in_scripts: usize) -> (serde_json::Value, String) {
    (
        json!({ "sent": top, "sent_count": top.len(), "run_in_scripts": in_scripts }),
        format!(
            "one MONITORed pass: {} commands sent ({}), {in_scripts} run inside scripts",
            top.len(),
            top.join(" ")
        ),
    )
}

/// The floor's side: one multiplexed connection (and, for the handover's standby, one pub/sub
/// connection: [`floor_pubsub`]).
struct Floor {
    conn: MultiplexedConnection,
    renew: String,
    resign: String,
    /// The fenced floor's try ([`FENCED_TRY`]), for `leader-handover`.
    fenced: String,
}

async fn floor_pubsub(url: &str) -> PubSub {
    redis::Client::open(url)
        .expect("url")
        .get_async_pubsub()
        .await
        .expect("floor pub/sub")
}

impl Floor {
    async fn connect(url: &str) -> Floor {
        let client = redis::Client::open(url).expect("url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("floor connects");
        let load = |src: &'static str| {
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
        let renew = load(RENEW).await;
        let resign = load(RESIGN).await;
        let fenced = load(FENCED_TRY).await;
        Floor {
            conn,
            renew,
            resign,
            fenced,
        }
    }

    /// One try: `Ok` when it leads, else the holder's PTTL in ms (-2: gone, -1: no TTL).
    async fn try_lead(&self, key: &str, token: &str, lease: Duration) -> Result<(), i64> {
        let mut c = self.conn.clone();
        let (set, pttl): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease.as_millis() as u64)
            .cmd("PTTL")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("floor SET NX PX + PTTL");
        if set.is_some() {
            Ok(())
        } else {
            Err(pttl)
        }
    }

    /// The fenced floor's try: `Ok(term)` when it leads, else the holder's PTTL in ms.
    async fn try_lead_fenced(&self, key: &str, token: &str, lease: Duration) -> Result<u64, i64> {
        let mut c = self.conn.clone();
        let (led, v): (i64, String) = redis::cmd("EVALSHA")
            .arg(&self.fenced)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:term"))
            .arg(token)
            .arg(lease.as_millis() as u64)
            .query_async(&mut c)
            .await
            .expect("fenced floor EVALSHA");
        if led == 1 {
            Ok(v.parse().expect("a term"))
        } else {
            Err(v.parse().expect("a PTTL"))
        }
    }

    /// One try of the floor (`fenced`: of the fenced floor).
    async fn try_side(
        &self,
        fenced: bool,
        key: &str,
        token: &str,
        lease: Duration,
    ) -> Result<(), i64> {
        if fenced {
            self.try_lead_fenced(key, token, lease).await.map(|_| ())
        } else {
            self.try_lead(key, token, lease).await
        }
    }

    /// Tries until it leads, sleeping the holder's PTTL between tries.
    async fn campaign(&self, key: &str, token: &str, lease: Duration) {
        loop {
            match self.try_lead(key, token, lease).await {
                Ok(()) => return,
                // Gone between the SET and the PTTL: at once.
                Err(-2) => {}
                Err(p) => tokio::time::sleep(Duration::from_millis(p.max(1) as u64)).await,
            }
        }
    }

    /// Renews every `lease / 3` until the key is no longer ours (or the task is aborted).
    fn spawn_renewals(
        &self,
        key: &str,
        token: &str,
        lease: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let (mut c, sha) = (self.conn.clone(), self.renew.clone());
        let (key, token) = (key.to_string(), token.to_string());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + lease / 3, lease / 3);
            loop {
                tick.tick().await;
                let ok: i64 = redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(&key)
                    .arg(&token)
                    .arg(lease.as_millis() as u64)
                    .query_async(&mut c)
                    .await
                    .expect("floor renew");
                if ok == 0 {
                    return;
                }
            }
        })
    }

    async fn resign(&self, key: &str, channel: &str, token: &str) -> bool {
        let mut c = self.conn.clone();
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.resign)
            .arg(2)
            .arg(key)
            .arg(channel)
            .arg(token)
            .query_async(&mut c)
            .await
            .expect("floor resign");
        n == 1
    }
}

/// The floor standby of `leader-handover` (`fenced`: the fenced floor's): subscribes, tries,
/// then tries again on each message (or at the holder's PTTL); unsubscribes once it leads.
/// Returns when it led.
#[allow(clippy::too_many_arguments)]
async fn floor_standby(
    ps: &mut PubSub,
    f: &Floor,
    fenced: bool,
    key: &str,
    channel: &str,
    token: &str,
    lease: Duration,
    parked: tokio::sync::oneshot::Sender<()>,
) -> Instant {
    ps.subscribe(channel).await.expect("floor SUBSCRIBE");
    let mut parked = Some(parked);
    let led = loop {
        match f.try_side(fenced, key, token, lease).await {
            Ok(()) => break Instant::now(),
            Err(-2) => continue,
            Err(p) => {
                if let Some(tx) = parked.take() {
                    let _ = tx.send(());
                }
                let nap = Duration::from_millis(p.max(1) as u64);
                let mut msgs = ps.on_message();
                // A message or the PTTL, whichever first: then try again.
                let _ = tokio::time::timeout(nap, msgs.next()).await;
            }
        }
    };
    ps.unsubscribe(channel).await.expect("floor UNSUBSCRIBE");
    led
}

// ---------------------------------------------------------------------------------------------
// leader-takeover

/// One crash sample: (crash → elected, lease expiry → elected, crash → lease expiry), in µs.
type Crash = (f64, f64, f64);

/// baton: the leader (on a client and a runtime of its own) is elected with `lease` and
/// renews; the standby campaigns; after `wait` the leader's runtime stops (renewals stop,
/// nothing is released: a crash; `Client::shutdown` would resign, a handover); the standby's
/// `campaign()` returns once the lease ran out.
async fn baton_takeover(
    url: &str,
    standby: &Client,
    adm: &mut MultiplexedConnection,
    key: &str,
    lease: Duration,
    wait: Duration,
) -> Crash {
    let leader_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the leader's runtime");
    let (leader_url, leader_key) = (url.to_string(), key.to_string());
    let (leader_client, le) = leader_rt
        .spawn(async move {
            let c = connect(&leader_url).await;
            let le = c
                .leaders()
                .elector(&leader_key, &election(lease, "bench-leader"))
                .expect("elector");
            le.campaign().await.expect("leader elected");
            (c, le)
        })
        .await
        .expect("the leader's task");
    let se = standby
        .leaders()
        .elector(key, &election(lease, "bench-standby"))
        .expect("elector");
    let camp = tokio::spawn(async move {
        let t = se.campaign().await.expect("standby elected");
        (Instant::now(), unix_us(), t, se)
    });
    wait_numsub(adm, &format!("baton:leader:{{{key}}}:events"), 1).await;
    tokio::time::sleep(wait).await;
    let (crash, crash_unix) = (Instant::now(), unix_us());
    leader_rt.shutdown_background();
    // Read after the crash: no renewal can move it any more.
    let expiry = expiry_us(adm, &format!("baton:leader:{{{key}}}")).await;
    let (t1, u1, term, se) = camp.await.expect("standby task");
    assert!(term.fencing_token() > 0);
    se.resign().await.expect("standby resigns");
    drop(le);
    drop(leader_client);
    (
        (t1 - crash).as_secs_f64() * 1e6,
        (u1 - expiry) as f64,
        (expiry - crash_unix) as f64,
    )
}

/// The floor: the same, the leader "crashing" by its renewal task being aborted.
async fn floor_takeover(
    f: &Arc<Floor>,
    adm: &mut MultiplexedConnection,
    key: &str,
    lease: Duration,
    wait: Duration,
) -> Crash {
    let lt = token();
    f.try_lead(key, &lt, lease)
        .await
        .expect("floor leader elected");
    let renewals = f.spawn_renewals(key, &lt, lease);
    let st = token();
    let (fs, k) = (f.clone(), key.to_string());
    let camp = tokio::spawn(async move {
        fs.campaign(&k, &st, lease).await;
        (Instant::now(), unix_us(), st)
    });
    // The standby's first try has been made by then (it has no subscription to wait for).
    tokio::time::sleep(Duration::from_millis(2)).await;
    tokio::time::sleep(wait).await;
    let (crash, crash_unix) = (Instant::now(), unix_us());
    renewals.abort();
    let _ = renewals.await;
    let expiry = expiry_us(adm, key).await;
    let (t1, u1, st) = camp.await.expect("floor standby");
    f.resign(key, &format!("{key}:events"), &st).await;
    (
        (t1 - crash).as_secs_f64() * 1e6,
        (u1 - expiry) as f64,
        (expiry - crash_unix) as f64,
    )
}

#[derive(Default)]
struct CrashTally {
    crash: Samples,
    expiry: Samples,
    remaining: Samples,
    cmds: CommandStats,
}

impl CrashTally {
    fn push(&mut self, (c, e, r): Crash) {
        self.crash.push_us(c);
        self.expiry.push_us(e);
        self.remaining.push_us(r);
    }
}

pub async fn takeover(opts: &Opts, report: &mut Report) {
    let (n, runs, lease) = if opts.quick {
        (3, 1, Duration::from_millis(100))
    } else {
        (15, 3, Duration::from_millis(200))
    };
    let server = start_server();
    let url = server.url();
    let standby = connect(&url).await;
    let floor = Arc::new(Floor::connect(&url).await);
    let mut adm = admin(&url).await;
    let id = run_id();
    let (mut b, mut f) = (CrashTally::default(), CrashTally::default());
    let mut sample = 0;
    for round in 0..=runs {
        let count = if round == 0 { 1 } else { n };
        for i in 0..count {
            // The crash comes at a point spread over the whole lease, after the election.
            let wait = lease.mul_f64(phase(sample));
            sample += 1;
            let before = redisinfo::commandstats(&mut adm).await;
            let key = format!("lt-b-{id}-{round}-{i}");
            let s = baton_takeover(&url, &standby, &mut adm, &key, lease, wait).await;
            drain_pubsub(&mut adm).await;
            let mid = redisinfo::commandstats(&mut adm).await;
            let key = format!("lt-f-{id}-{round}-{i}");
            let t = floor_takeover(&floor, &mut adm, &key, lease, wait).await;
            let after = redisinfo::commandstats(&mut adm).await;
            if round > 0 {
                b.push(s);
                f.push(t);
                add(&mut b.cmds, &redisinfo::delta(&before, &mid));
                add(&mut f.cmds, &redisinfo::delta(&mid, &after));
            }
        }
    }
    // One pass of each side under MONITOR (not timed): what went over the wire.
    let mon = Monitor::start(server.port()).expect("MONITOR");
    let _ = sent(&mon);
    baton_takeover(
        &url,
        &standby,
        &mut adm,
        &format!("lt-b-{id}-m"),
        lease,
        lease / 2,
    )
    .await;
    drain_pubsub(&mut adm).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let bm = sent(&mon);
    floor_takeover(&floor, &mut adm, &format!("lt-f-{id}-m"), lease, lease / 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fm = sent(&mon);
    mon.stop();
    let ops = b.crash.len();
    let lease_us = lease.as_secs_f64() * 1e6;
    let target_us = lease_us + 10_000.0;
    for (name, t, other, m) in [("baton", &b, &f, &bm), ("floor", &f, &b, &fm)] {
        let (mj, mnote) = sent_note(&m.0, m.1);
        let (p50, p99) = (t.crash.pct(50.0).unwrap(), t.crash.pct(99.0).unwrap());
        let (e50, e99) = (t.expiry.pct(50.0).unwrap(), t.expiry.pct(99.0).unwrap());
        let floor_t = if name == "baton" { other } else { t };
        let ratio_crash = p50 / floor_t.crash.pct(50.0).unwrap();
        let ratio_expiry = e50 / floor_t.expiry.pct(50.0).unwrap();
        let (cmds, by) = per_op(&t.cmds, ops);
        let mut notes = format!(
            "crash → elected, lease {} ms renewed every lease/3; target p50 ≤ lease + 10 ms = \
             {target_us:.0} µs; lease expiry → elected p50/p99 {e50:.0}/{e99:.0} µs \
             ({ratio_expiry:.2} × floor); crash → expiry p50 {:.0} µs; {cmds:.1} commands per \
             takeover ({})",
            lease.as_millis(),
            t.remaining.pct(50.0).unwrap(),
            brief(&by),
        );
        notes.push_str(&format!("; {mnote} (crash at lease/2)"));
        if name == "floor" {
            notes.push_str("; ");
            notes.push_str(FLOOR_WHAT);
        }
        notes.push_str(&format!("; {runs} runs"));
        report.rows.push(Row {
            scenario: format!("leader-takeover {name}"),
            p50_us: Some(p50),
            p99_us: Some(p99),
            ops_per_s: None,
            floor_ops_per_s: None,
            ratio: Some(ratio_crash),
            samples: t.crash.len(),
            notes,
            extra: json!({
                "side": name,
                "lease_ms": lease.as_millis() as u64,
                "target_p50_us": target_us,
                "ratio_of": "p50 crash → elected",
                "expiry_to_elected_p50_us": e50,
                "expiry_to_elected_p99_us": e99,
                "expiry_ratio_vs_floor": ratio_expiry,
                "crash_to_expiry_p50_us": t.remaining.pct(50.0),
                "crash_to_expiry_max_us": t.remaining.pct(100.0),
                "commands_per_takeover": cmds,
                "commands": by,
                "monitored_pass": mj,
                "runs": runs,
            }),
        });
    }
    standby.shutdown(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// leader-handover

/// A lease never reached: every handover resigns.
const HANDOVER_LEASE: Duration = Duration::from_secs(10);

/// baton: `a` leads, `b`'s `campaign()` is parked (subscribed, idle); µs from `resign()` being
/// called to `b`'s `campaign()` returning.
async fn baton_handover(a: &Client, b: &Client, adm: &mut MultiplexedConnection, key: &str) -> f64 {
    let opts = election(HANDOVER_LEASE, "bench");
    let le = a.leaders().elector(key, &opts).expect("elector");
    le.campaign().await.expect("leader elected");
    let se = b.leaders().elector(key, &opts).expect("elector");
    let camp = tokio::spawn(async move {
        se.campaign().await.expect("standby elected");
        (Instant::now(), se)
    });
    wait_numsub(adm, &format!("baton:leader:{{{key}}}:events"), 1).await;
    // Let the standby finish its post-subscription try and park: idle before the resign.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = Instant::now();
    let resign = tokio::spawn(async move { le.resign().await });
    let (t1, se) = camp.await.expect("standby task");
    assert!(resign.await.expect("resign task").expect("resign"));
    se.resign().await.expect("standby resigns");
    (t1 - t0).as_secs_f64() * 1e6
}

/// The floor (`fenced`: the fenced floor): as [`baton_handover`], µs from the resignation being
/// sent to the standby's winning try's reply.
async fn floor_handover(f: &Arc<Floor>, fenced: bool, ps: &mut Option<PubSub>, key: &str) -> f64 {
    let channel = format!("{key}:events");
    let lt = token();
    f.try_side(fenced, key, &lt, HANDOVER_LEASE)
        .await
        .expect("floor leader elected");
    let (tx, parked) = tokio::sync::oneshot::channel();
    let mut p = ps.take().expect("the floor's pub/sub connection");
    let (fs, k, ch) = (f.clone(), key.to_string(), channel.clone());
    let camp = tokio::spawn(async move {
        let st = token();
        let t = floor_standby(&mut p, &fs, fenced, &k, &ch, &st, HANDOVER_LEASE, tx).await;
        (t, st, p)
    });
    parked.await.expect("floor standby parked");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = Instant::now();
    let (fr, k, ch) = (f.clone(), key.to_string(), channel.clone());
    let resign = tokio::spawn(async move { fr.resign(&k, &ch, &lt).await });
    let (t1, st, p) = camp.await.expect("floor standby");
    assert!(resign.await.expect("floor resign task"));
    *ps = Some(p);
    f.resign(key, &channel, &st).await;
    (t1 - t0).as_secs_f64() * 1e6
}

/// One handover of side `side` of [`handover`]: baton, the floor, the fenced floor.
async fn handover_side(
    side: usize,
    (a, b): (&Client, &Client),
    floor: &Arc<Floor>,
    ps: &mut Option<PubSub>,
    adm: &mut MultiplexedConnection,
    key: &str,
) -> f64 {
    match side {
        0 => {
            let d = baton_handover(a, b, adm, key).await;
            drain_pubsub(adm).await;
            d
        }
        s => floor_handover(floor, s == 2, ps, key).await,
    }
}

pub async fn handover(opts: &Opts, report: &mut Report) {
    let (n, runs) = if opts.quick { (20, 1) } else { (100, 3) };
    let server = start_server();
    let url = server.url();
    // Leader and standby on separate clients, as in separate processes.
    let (a, b) = (connect(&url).await, connect(&url).await);
    let floor = Arc::new(Floor::connect(&url).await);
    let mut ps = Some(floor_pubsub(&url).await);
    let mut adm = admin(&url).await;
    let id = run_id();
    // baton, the floor, the fenced floor: samples and command counts, interleaved one by one.
    const SIDES: [&str; 3] = ["baton", "floor", "fenced-floor"];
    let mut samples: [Samples; 3] = Default::default();
    let mut counts = [
        CommandStats::new(),
        CommandStats::new(),
        CommandStats::new(),
    ];
    for round in 0..=runs {
        let count = if round == 0 { 5 } else { n };
        for i in 0..count {
            for side in 0..SIDES.len() {
                let before = redisinfo::commandstats(&mut adm).await;
                let key = format!("lh-{side}-{id}-{round}-{i}");
                let d = handover_side(side, (&a, &b), &floor, &mut ps, &mut adm, &key).await;
                let after = redisinfo::commandstats(&mut adm).await;
                if round > 0 {
                    samples[side].push_us(d);
                    add(&mut counts[side], &redisinfo::delta(&before, &after));
                }
            }
        }
    }
    let mon = Monitor::start(server.port()).expect("MONITOR");
    let _ = sent(&mon);
    let mut monitored = Vec::new();
    for side in 0..SIDES.len() {
        let key = format!("lh-{side}-{id}-m");
        handover_side(side, (&a, &b), &floor, &mut ps, &mut adm, &key).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        monitored.push(sent(&mon));
    }
    mon.stop();
    let fp = samples[1].pct(50.0).unwrap();
    let fenced_p50 = samples[2].pct(50.0).unwrap();
    for (side, name) in SIDES.iter().enumerate() {
        let (s, c, m) = (&samples[side], &counts[side], &monitored[side]);
        let (mj, mnote) = sent_note(&m.0, m.1);
        let p50 = s.pct(50.0).unwrap();
        let (cmds, by) = per_op(c, s.len());
        let mut notes = format!(
            "resign() called → parked standby's campaign() returns; target p50 ≤ 2000 µs; \
             {cmds:.1} commands run per cycle (elect, park, resign, take over, standby resigns: \
             {}); {mnote}",
            brief(&by)
        );
        match side {
            0 => notes.push_str(&format!("; vs fenced floor: p50 {:.2} ×", p50 / fenced_p50)),
            1 => {
                notes.push_str("; ");
                notes.push_str(FLOOR_HANDOVER);
            }
            _ => notes.push_str("; the floor, each try one EVALSHA that also steps the term"),
        }
        notes.push_str(&format!("; {runs} runs"));
        report.rows.push(Row {
            scenario: format!("leader-handover {name}"),
            p50_us: Some(p50),
            p99_us: s.pct(99.0),
            ops_per_s: None,
            floor_ops_per_s: None,
            ratio: Some(p50 / fp),
            samples: s.len(),
            notes,
            extra: json!({
                "side": name,
                "floor_p50_us": fp,
                "floor_p99_us": samples[1].pct(99.0),
                "fenced_floor_p50_us": fenced_p50,
                "p50_vs_fenced_floor": p50 / fenced_p50,
                "ratio_of": "p50",
                "target_p50_us": 2000,
                "commands_per_cycle": cmds,
                "commands": by,
                "monitored_pass": mj,
                "runs": runs,
            }),
        });
    }
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}
