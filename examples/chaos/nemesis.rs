//! The seeded nemesis: lanes (worker/network faults, server faults, holder pauses), each sleeping 0.5–1.5 s
//! between faults, going through a shuffled pass of its kinds first, then drawing by weight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::testing::{PgServer, RedisCluster, RedisServer};
use serde_json::{json, Value};

use crate::fleet::Fleet;
use crate::proxy::{Link, Mode};
use crate::resource::Resource;
use crate::util::{mono_ns, BoxError, Jsonl, Rng};
use crate::worker::LEASE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    PauseWorker,
    KillWorker,
    PauseRedis,
    CrashRestartRedis,
    PartitionWorker,
    Latency,
    Reset,
    Slice,
    TtlShrink,
    ClientKill,
    ClientPause,
    /// Cluster profile: SIGKILL a primary, wait for its replica's promotion, restart it (it
    /// rejoins as a replica).
    KillPrimary,
    /// Cluster profile: every client's link to one node (its proxy) blackholed 1–4 s.
    PartitionNode,
    /// Cluster profile: 50–400 ms on every client's link to one node, 2–6 s.
    LatencyNode,
    /// Cluster profile: every client connection to one node reset, new ones refused 0–1.5 s.
    ResetNode,
    /// Cluster profile: SIGSTOP a primary for less than the node timeout (no failover).
    PausePrimary,
    /// Cluster profile: SIGSTOP a primary until its replica is promoted, then SIGCONT it (it
    /// comes back as a replica): a node that hangs instead of dying.
    PauseUntilPromotion,
    /// Cluster profile: move an in-use job's slot to another primary (IMPORTING/MIGRATING,
    /// MIGRATE, SETSLOT NODE), with short random pauses between the steps.
    Reshard,
    /// Profile `postgres`: `pg_terminate_backend` on every baton connection (application_name
    /// `baton`), like Redis' `CLIENT KILL`.
    PgBackendKill,
    /// Profile `postgres`: immediate shutdown (SIGQUIT), down 0.5–3 s, started again on the same
    /// port and data (fsync on: nothing acknowledged is lost).
    CrashRestartPg,
    /// Profile `postgres`: SIGSTOP the postmaster and its backends 0.3–3 s.
    PausePg,
    /// Profile `postgres`: the server clock jumps forward for leases (like `TtlShrink`): every
    /// `lease_expires` in `baton_jobs` moved 0.5–2 leases into the past.
    LeaseJump,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::PauseWorker => "pause_worker",
            Kind::KillWorker => "kill_worker",
            Kind::PauseRedis => "pause_redis",
            Kind::CrashRestartRedis => "crash_restart_redis",
            Kind::PartitionWorker => "partition_worker",
            Kind::Latency => "latency",
            Kind::Reset => "reset",
            Kind::Slice => "slice",
            Kind::TtlShrink => "ttl_shrink",
            Kind::ClientKill => "client_kill",
            Kind::ClientPause => "client_pause",
            Kind::KillPrimary => "kill_primary",
            Kind::PartitionNode => "partition_node",
            Kind::LatencyNode => "latency_node",
            Kind::ResetNode => "reset_node",
            Kind::PausePrimary => "pause_primary",
            Kind::PauseUntilPromotion => "pause_until_promotion",
            Kind::Reshard => "reshard",
            Kind::PgBackendKill => "pg_backend_kill",
            Kind::CrashRestartPg => "crash_restart_pg",
            Kind::PausePg => "pause_pg",
            Kind::LeaseJump => "lease_jump",
        }
    }

    fn weight(self) -> usize {
        match self {
            Kind::PauseWorker | Kind::PartitionWorker => 3,
            Kind::KillWorker | Kind::PauseRedis | Kind::Latency | Kind::TtlShrink => 2,
            Kind::Reshard | Kind::PausePrimary => 2,
            Kind::PausePg | Kind::LeaseJump => 2,
            _ => 1,
        }
    }

    pub const WORKER_LANE: [Kind; 6] = [
        Kind::PauseWorker,
        Kind::KillWorker,
        Kind::PartitionWorker,
        Kind::Latency,
        Kind::Reset,
        Kind::Slice,
    ];
    pub const SERVER_LANE: [Kind; 5] = [
        Kind::PauseRedis,
        Kind::CrashRestartRedis,
        Kind::TtlShrink,
        Kind::ClientKill,
        Kind::ClientPause,
    ];
    /// The cluster profile's worker lane: no proxies there, so only process faults.
    pub const CLUSTER_WORKER_LANE: [Kind; 2] = [Kind::PauseWorker, Kind::KillWorker];
    /// The cluster profile's node lane (one lane: node faults never overlap, so a reshard never
    /// meets a failover half-way).
    pub const CLUSTER_LANE: [Kind; 4] = [
        Kind::KillPrimary,
        Kind::PausePrimary,
        Kind::PauseUntilPromotion,
        Kind::Reshard,
    ];
    /// The cluster profile's network lane: per-node proxies (each node announces its proxy's
    /// port with `cluster-announce-port`, so clients reach it only through the proxy).
    pub const CLUSTER_NET_LANE: [Kind; 3] =
        [Kind::PartitionNode, Kind::LatencyNode, Kind::ResetNode];
    /// The `postgres` profile's server lane: PostgreSQL's counterparts of `SERVER_LANE`.
    pub const PG_SERVER_LANE: [Kind; 4] = [
        Kind::PgBackendKill,
        Kind::CrashRestartPg,
        Kind::PausePg,
        Kind::LeaseJump,
    ];
}

/// Everything the nemesis can hit.
pub struct Ctx {
    /// The single Redis (every profile but `cluster`).
    pub redis: Option<Arc<Mutex<RedisServer>>>,
    /// The cluster (profile `cluster`), and when its jobs are released (for `Reshard`).
    pub cluster: Option<Arc<Mutex<RedisCluster>>>,
    /// The PostgreSQL server (profile `postgres`); `admin_url` is then its superuser URL.
    pub pg: Option<Arc<Mutex<PgServer>>>,
    pub job_clock: JobClock,
    /// Cluster profile: node i's proxy (clients' only way to it).
    pub node_links: Vec<Arc<Link>>,
    pub admin_url: String,
    pub links: Vec<Arc<Link>>,
    pub fleet: Arc<Fleet>,
    pub resource: Arc<Resource>,
    pub log: Arc<Jsonl>,
    pub next_id: AtomicU64,
}

/// Job `j` is released at `t0 + j * spacing_ns` (monotonic ns); `jobs` in all.
#[derive(Debug, Clone, Copy)]
pub struct JobClock {
    pub t0: u64,
    pub spacing_ns: u64,
    pub jobs: usize,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

impl Ctx {
    pub(crate) fn start(&self, kind: Kind, targets: &[usize], detail: Value) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let targets: Vec<String> = targets.iter().map(|i| format!("w{i}")).collect();
        self.log.write(
            json!({"p":"nemesis","type":"start","id":id,"kind":kind.name(),
            "targets":targets,"detail":detail}),
        );
        id
    }

    pub(crate) fn stop(&self, id: u64, kind: Kind, detail: Value) {
        self.log.write(
            json!({"p":"nemesis","type":"stop","id":id,"kind":kind.name(),
            "detail":detail}),
        );
    }

    pub(crate) fn all(&self) -> Vec<usize> {
        (0..self.fleet.len()).collect()
    }

    /// A worker currently between BEGIN and COMMIT (polls the resource up to `wait`), else a
    /// random one.
    async fn holder_or_random(&self, rng: &mut Rng, wait: Duration) -> (usize, bool) {
        let until = mono_ns() + wait.as_nanos() as u64;
        loop {
            let holders = self.resource.current_holders(60);
            let live: Vec<usize> = holders
                .iter()
                .filter_map(|h| {
                    let (w, inc) = h.trim_start_matches('w').split_once('.')?;
                    let (w, inc) = (w.parse::<usize>().ok()?, inc.parse::<u32>().ok()?);
                    (w < self.fleet.len()
                        && self.fleet.inc(w) == inc
                        && self.fleet.pid(w).is_some())
                    .then_some(w)
                })
                .collect();
            if !live.is_empty() {
                return (live[rng.below(live.len())], true);
            }
            if mono_ns() > until {
                return (rng.below(self.fleet.len()), false);
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }

    async fn admin(&self) -> Result<redis::aio::MultiplexedConnection, BoxError> {
        let client = redis::Client::open(self.admin_url.as_str())?;
        let conn = tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| "admin connect timed out")??;
        Ok(conn)
    }

    async fn admin_cmd(&self, cmd: redis::Cmd) -> Result<redis::Value, BoxError> {
        let mut conn = self.admin().await?;
        let v = tokio::time::timeout(Duration::from_secs(3), cmd.query_async(&mut conn))
            .await
            .map_err(|_| "admin command timed out")??;
        Ok(v)
    }

    /// Runs one fault to its end (heal included).
    pub async fn inject(&self, kind: Kind, rng: &mut Rng) {
        let lease = LEASE.as_secs_f64();
        match kind {
            Kind::PauseWorker => {
                let (w, holder) = self
                    .holder_or_random(rng, Duration::from_millis(3000))
                    .await;
                let d = rng.range(1.5, 3.0) * lease;
                // A paused holder's attempt to write after resuming is the stale write C1s
                // must see rejected; it only happens if a successor wrote with a higher token
                // during the pause. Whether one did within `d` is a race (the takeover waits
                // for the lease, then a poll or notification), so a paused holder stays
                // paused until the resource has accepted a higher token on its key, up to
                // three more leases.
                let open = if holder {
                    self.resource
                        .open_of(&format!("w{w}.{}", self.fleet.inc(w)))
                } else {
                    None
                };
                let pid = self.fleet.stop(w);
                let id = self.start(
                    kind,
                    &[w],
                    json!({"pid":pid,"holder":holder,"secs":d,"inc":self.fleet.inc(w)}),
                );
                tokio::time::sleep(secs(d)).await;
                let mut overtaken = None;
                if let Some((key, token)) = &open {
                    let until = mono_ns() + secs(3.0 * lease).as_nanos() as u64;
                    while self.resource.highest(key) <= *token && mono_ns() < until {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    overtaken = Some(self.resource.highest(key) > *token);
                }
                self.fleet.cont(w);
                self.stop(id, kind, json!({"overtaken": overtaken}));
            }
            Kind::KillWorker => {
                let (w, holder) = self.holder_or_random(rng, Duration::from_millis(500)).await;
                let inc = self.fleet.inc(w);
                let pid = self.fleet.kill(w);
                let d = rng.range(1.0, 3.0);
                let id = self.start(
                    kind,
                    &[w],
                    json!({"pid":pid,"holder":holder,"inc":inc,"restart_after":d}),
                );
                // Wait for the exit to be reaped before the new incarnation starts.
                for _ in 0..100 {
                    if !self.fleet.running(w) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                tokio::time::sleep(secs(d)).await;
                let res = if self.fleet.running(w) {
                    Err("still running".to_string())
                } else {
                    self.fleet
                        .spawn(w, self.links.get(w).map_or(0, |l| l.port))
                        .map_err(|e| e.to_string())
                };
                self.stop(
                    id,
                    kind,
                    json!({"restarted":res.is_ok(),"err":res.err(),"inc":self.fleet.inc(w)}),
                );
            }
            Kind::PauseRedis => {
                let d = rng.range(0.3, 3.0);
                let Some(redis) = &self.redis else { return };
                let r = lock(redis).pause().map_err(|e| e.to_string());
                let id = self.start(kind, &self.all(), json!({"secs":d,"err":r.err()}));
                tokio::time::sleep(secs(d)).await;
                let r = lock(redis).resume().map_err(|e| e.to_string());
                self.stop(id, kind, json!({"err":r.err()}));
            }
            Kind::CrashRestartRedis => {
                let Some(redis) = self.redis.clone() else {
                    return;
                };
                let d = rng.range(0.5, 3.0);
                let r2 = redis.clone();
                let _ = tokio::task::spawn_blocking(move || lock(&r2).kill()).await;
                let id = self.start(kind, &self.all(), json!({"down_secs":d}));
                tokio::time::sleep(secs(d)).await;
                let r = tokio::task::spawn_blocking(move || lock(&redis).restart())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                self.stop(id, kind, json!({"err":r.err()}));
            }
            Kind::PartitionWorker => {
                let w = rng.below(self.links.len());
                let d = rng.range(1.0, 6.0);
                let id = self.start(kind, &[w], json!({"secs":d}));
                self.links[w].set_mode(Mode::Blackhole);
                tokio::time::sleep(secs(d)).await;
                self.links[w].set_mode(Mode::Pass);
                self.stop(id, kind, json!({}));
            }
            Kind::Latency => {
                let targets = if rng.unit() < 0.5 {
                    self.all()
                } else {
                    vec![rng.below(self.links.len())]
                };
                let ms = rng.range(50.0, 500.0) as u64;
                let d = rng.range(3.0, 10.0);
                let id = self.start(kind, &targets, json!({"ms":ms,"secs":d}));
                for &w in &targets {
                    self.links[w].set_mode(Mode::Delay { ms, jitter_pct: 20 });
                }
                tokio::time::sleep(secs(d)).await;
                for &w in &targets {
                    self.links[w].set_mode(Mode::Pass);
                }
                self.stop(id, kind, json!({}));
            }
            Kind::Reset => {
                let targets = if rng.unit() < 0.5 {
                    self.all()
                } else {
                    vec![rng.below(self.links.len())]
                };
                let refuse = rng.range(0.0, 1.5);
                let id = self.start(kind, &targets, json!({"refuse_secs":refuse}));
                for &w in &targets {
                    self.links[w].set_mode(Mode::Refuse);
                    self.links[w].reset_all();
                }
                tokio::time::sleep(secs(refuse)).await;
                for &w in &targets {
                    self.links[w].set_mode(Mode::Pass);
                }
                self.stop(id, kind, json!({}));
            }
            Kind::Slice => {
                let w = rng.below(self.links.len());
                let max = 1 + rng.below(7);
                let id = self.start(kind, &[w], json!({"max":max,"secs":5}));
                self.links[w].set_mode(Mode::Slice { max });
                tokio::time::sleep(Duration::from_secs(5)).await;
                self.links[w].set_mode(Mode::Pass);
                self.stop(id, kind, json!({}));
            }
            Kind::TtlShrink => {
                let delta_ms = (rng.range(0.5, 2.0) * LEASE.as_millis() as f64) as i64;
                let id = self.start(kind, &self.all(), json!({"delta_ms":delta_ms}));
                let r = self.ttl_shrink(delta_ms).await;
                self.stop(
                    id,
                    kind,
                    json!({"keys":r.as_ref().ok(),
                    "err":r.as_ref().err().map(|e| e.to_string())}),
                );
            }
            Kind::ClientKill => {
                let id = self.start(kind, &self.all(), json!({}));
                let mut cmd = redis::cmd("CLIENT");
                cmd.arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes");
                let r = self.admin_cmd(cmd).await;
                self.stop(
                    id,
                    kind,
                    json!({"reply":r.as_ref().ok().map(|v| format!("{v:?}")),
                    "err":r.as_ref().err().map(|e| e.to_string())}),
                );
            }
            Kind::ClientPause => {
                let id = self.start(kind, &self.all(), json!({"ms":1500}));
                let mut cmd = redis::cmd("CLIENT");
                cmd.arg("PAUSE").arg(1500).arg("WRITE");
                let r = self.admin_cmd(cmd).await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                self.stop(
                    id,
                    kind,
                    json!({"err":r.as_ref().err().map(|e| e.to_string())}),
                );
            }
            Kind::PgBackendKill => {
                let id = self.start(kind, &self.all(), json!({}));
                let r = self.pg_backend_kill().await;
                self.stop(
                    id,
                    kind,
                    json!({"killed":r.as_ref().ok(),
                    "err":r.as_ref().err().map(|e| e.to_string())}),
                );
            }
            Kind::CrashRestartPg => {
                let Some(pg) = self.pg.clone() else { return };
                let d = rng.range(0.5, 3.0);
                let p2 = pg.clone();
                let _ = tokio::task::spawn_blocking(move || lock(&p2).crash()).await;
                let id = self.start(kind, &self.all(), json!({"down_secs":d}));
                tokio::time::sleep(secs(d)).await;
                let r = tokio::task::spawn_blocking(move || lock(&pg).restart())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                self.stop(id, kind, json!({"err":r.err()}));
            }
            Kind::PausePg => {
                let Some(pg) = self.pg.clone() else { return };
                let d = rng.range(0.3, 3.0);
                // Blocking (it lists /proc and waits for the postmaster to stop): off the runtime.
                let p2 = pg.clone();
                let r = tokio::task::spawn_blocking(move || lock(&p2).pause())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                let id = self.start(kind, &self.all(), json!({"secs":d,"err":r.err()}));
                tokio::time::sleep(secs(d)).await;
                let r = tokio::task::spawn_blocking(move || lock(&pg).resume())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                self.stop(id, kind, json!({"err":r.err()}));
            }
            Kind::LeaseJump => {
                let delta_ms = (rng.range(0.5, 2.0) * LEASE.as_millis() as f64) as i64;
                let id = self.start(kind, &self.all(), json!({"delta_ms":delta_ms}));
                let r = self.lease_jump(delta_ms).await;
                self.stop(
                    id,
                    kind,
                    json!({"rows":r.as_ref().ok(),
                    "err":r.as_ref().err().map(|e| e.to_string())}),
                );
            }
            Kind::KillPrimary => self.kill_primary(rng).await,
            Kind::PausePrimary => self.pause_primary(rng).await,
            Kind::PauseUntilPromotion => self.pause_until_promotion(rng).await,
            Kind::Reshard => self.reshard(rng).await,
            Kind::PartitionNode | Kind::LatencyNode | Kind::ResetNode => {
                self.node_link_fault(kind, rng).await
            }
        }
    }

    /// Emulated forward jump of the server clock: lease TTLs shrink by `delta_ms`.
    async fn ttl_shrink(&self, delta_ms: i64) -> Result<u64, BoxError> {
        let mut conn = self.admin().await?;
        let fut = async {
            let mut cursor: u64 = 0;
            let mut n = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("baton:*:lease")
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                for k in keys {
                    let pttl: i64 = redis::cmd("PTTL").arg(&k).query_async(&mut conn).await?;
                    if pttl < 0 {
                        continue;
                    }
                    let left = pttl - delta_ms;
                    if left <= 0 {
                        let _: i64 = redis::cmd("DEL").arg(&k).query_async(&mut conn).await?;
                    } else {
                        let _: i64 = redis::cmd("PEXPIRE")
                            .arg(&k)
                            .arg(left)
                            .query_async(&mut conn)
                            .await?;
                    }
                    n += 1;
                }
                cursor = next;
                if cursor == 0 {
                    return Ok::<u64, redis::RedisError>(n);
                }
            }
        };
        Ok(tokio::time::timeout(Duration::from_secs(3), fut)
            .await
            .map_err(|_| "ttl shrink timed out")??)
    }

    /// `pg_terminate_backend` on every baton session (application_name `baton`, which baton
    /// sets unless the URL names one), through an admin connection that bypasses the proxies.
    /// Returns how many backends were signalled.
    async fn pg_backend_kill(&self) -> Result<i64, BoxError> {
        let admin = crate::pg::Admin::connect(&self.admin_url).await?;
        admin.terminate_baton_backends().await
    }

    /// Emulated forward jump of the server clock for leases: every lease expiry moved
    /// `delta_ms` into the past (rows' `version` untouched: a clock jump changes no row).
    async fn lease_jump(&self, delta_ms: i64) -> Result<u64, BoxError> {
        let admin = crate::pg::Admin::connect(&self.admin_url).await?;
        admin.lease_jump(delta_ms).await
    }

    /// Heals everything: links pass, Redis resumed (or restarted), workers continued.
    pub async fn heal_all(&self) {
        for l in self.links.iter().chain(&self.node_links) {
            l.set_mode(Mode::Pass);
        }
        if let Some(redis) = self.redis.clone() {
            let _ = lock(&redis).resume();
            let _ = tokio::task::spawn_blocking(move || {
                let mut r = lock(&redis);
                if !r.is_running() {
                    let _ = r.restart();
                }
            })
            .await;
        }
        if let Some(pg) = self.pg.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                let mut p = lock(&pg);
                if p.is_running() {
                    let _ = p.resume();
                } else {
                    let _ = p.restart();
                }
            })
            .await;
        }
        let mut healthy = None;
        if let Some(cluster) = self.cluster.clone() {
            let proxies: Vec<u16> = self.node_links.iter().map(|l| l.port).collect();
            healthy = Some(
                tokio::task::spawn_blocking(move || {
                    let mut c = lock(&cluster);
                    for i in 0..c.nodes().len() {
                        let _ = c.node_mut(i).resume();
                        if !c.node_mut(i).is_running() && c.node_mut(i).restart().is_ok() {
                            if let Some(p) = proxies.get(i) {
                                let _ = crate::cluster::announce(&c, i, *p);
                            }
                        }
                    }
                    c.wait_healthy(Duration::from_secs(20))
                        .map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r),
            );
        }
        self.fleet.cont_all();
        self.log
            .write(json!({"p":"nemesis","type":"info","f":"heal_all",
            "cluster_healthy":healthy.as_ref().map(|r| r.is_ok()),
            "err":healthy.and_then(|r| r.err())}));
    }
}

/// One lane: until `deadline` (monotonic ns), sleep 0.5–1.5 s and run one fault.
pub async fn lane(ctx: Arc<Ctx>, kinds: Vec<Kind>, mut rng: Rng, deadline: u64) {
    if kinds.is_empty() {
        return;
    }
    let mut first = kinds.clone();
    rng.shuffle(&mut first);
    let mut queue = first.into_iter();
    let total: usize = kinds.iter().map(|k| k.weight()).sum();
    loop {
        tokio::time::sleep(secs(rng.range(0.5, 1.5))).await;
        if mono_ns() >= deadline {
            return;
        }
        let kind = queue.next().unwrap_or_else(|| {
            let mut x = rng.below(total);
            for k in &kinds {
                if x < k.weight() {
                    return *k;
                }
                x -= k.weight();
            }
            kinds[0]
        });
        ctx.inject(kind, &mut rng).await;
    }
}
