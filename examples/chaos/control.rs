//! One phase of a run: Redis, proxies, resource, workers, nemesis, heal, quiescence, final state.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::testing::{
    Persistence, PgServer, RedisCluster, RedisServer, PG_WORKER_PASSWORD, PG_WORKER_ROLE,
};
use serde_json::json;

use crate::fleet::{ExitRec, Fleet};
use crate::nemesis::{self, Kind};
use crate::proxy::Link;
use crate::resource::Resource;
use crate::util::{job_name, mix, mono_ns, BoxError, Jsonl, Rng};
use crate::worker::{fair_lock_name, WorkerArgs, Workload, LEASE, MUTEX_LOCKS, STOP_FILE, WORKERS};

/// The ACL user the workers connect as: only baton's keys, channels and commands.
pub const WORKER_USER: &str = "baton-chaos";

#[derive(Debug, Clone)]
pub struct PhaseCfg {
    pub name: String,
    pub jobs: usize,
    pub warmup_s: f64,
    pub chaos_s: f64,
    pub fenced: bool,
    /// The nemesis lanes, each running its kinds one after another, concurrently with the others.
    pub lanes: Vec<Vec<Kind>>,
    /// Seconds into the chaos window at which Redis is crashed and restarted *volatile*, after
    /// which worker 0 is killed and restarted (negative control b; failover workload only).
    pub volatile_restart_at: Option<f64>,
    pub seed: u64,
    pub quiesce_bound_s: f64,
    pub workload: Workload,
    /// Run against a `RedisCluster` (workers connect with its `redis+cluster://` URL, no proxies;
    /// grants and DONEs wait for the replica, see `worker::WorkerArgs::replica_ack`).
    pub cluster: bool,
    /// Added to the liveness bound (C7): a cluster failover takes 1–3 s before the replica serves.
    pub liveness_extra_ms: u64,
    /// Run against a durable PostgreSQL (`PgServer::start_durable`) instead of Redis: workers
    /// connect through their proxies with a `postgres://` URL (profile `postgres`).
    pub postgres: bool,
}

pub struct PhaseResult {
    pub cfg: PhaseCfg,
    pub dir: PathBuf,
    pub final_state: BTreeMap<String, Option<String>>,
    pub exits: Vec<ExitRec>,
    pub heal_t: u64,
    pub start_t: u64,
    pub end_t: u64,
    pub stuck: Vec<usize>,
    pub volatile_t: Option<u64>,
    pub final_state_err: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub async fn run_phase(
    cfg: PhaseCfg,
    root: &std::path::Path,
    canary: &str,
) -> Result<PhaseResult, BoxError> {
    let dir = root.join(&cfg.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let start_t = mono_ns();
    let log = Arc::new(Jsonl::open(&dir.join("nemesis.jsonl"))?);
    log.write(
        json!({"p":"control","type":"info","f":"phase","name":cfg.name,"jobs":cfg.jobs,
        "fenced":cfg.fenced,"seed":cfg.seed,"workload":cfg.workload.name()}),
    );

    // The default user (the nemesis's admin connection) and the workers' least-privilege user
    // share the canary password; the fixture keeps both in an owner-only ACL file (never on a
    // command line), so the workers' user survives every crash-restart.
    // The cluster fixture has no requirepass: its default user stays passwordless (loopback only)
    // and the workers log in as the least-privilege user with the canary password.
    let pw = canary.to_string();
    let mut node_links = Vec::new();
    let mut pg = None;
    let (redis, cluster, redis_port, admin_url, worker_url) = if cfg.postgres {
        // fsync on: a crash-restart loses nothing acknowledged. Set up as an operator would:
        // the owner (the superuser, trusted on loopback) migrates once, and the workers log in
        // as the fixture's DML-only role, which may not create tables.
        let server = tokio::task::spawn_blocking(PgServer::start_durable).await??;
        let port = server.port();
        let admin_url = server.url();
        let owner = baton::Client::connect(&admin_url).await?;
        owner.migrate().await?;
        owner.shutdown(Duration::from_secs(5)).await;
        let server = tokio::task::spawn_blocking(move || {
            server.grant_worker_role("postgres").map(|_| server)
        })
        .await??;
        log.write(
            json!({"p":"control","type":"info","f":"postgres","port":port,
            "pid":server.pid()}),
        );
        pg = Some(Arc::new(Mutex::new(server)));
        (
            None,
            None,
            port,
            admin_url,
            format!("postgres://{PG_WORKER_ROLE}:{PG_WORKER_PASSWORD}@127.0.0.1:{{port}}/postgres"),
        )
    } else if cfg.cluster {
        let c = tokio::task::spawn_blocking(move || {
            RedisCluster::builder()
                .acl_user(WORKER_USER, &pw, "baton:")
                .start()
        })
        .await??;
        // One proxy per node, announced by the node as its port: clients (and replicas'
        // replication links) reach it only through the proxy; the cluster bus stays direct.
        let ports: Vec<u16> = c.nodes().iter().map(|n| n.port()).collect();
        for (i, p) in ports.iter().enumerate() {
            node_links.push(
                Link::start(
                    &format!("n{i}"),
                    *p,
                    log.clone(),
                    mix(&[cfg.seed, 78, i as u64]),
                )
                .await?,
            );
        }
        let proxies: Vec<u16> = node_links.iter().map(|l| l.port).collect();
        let c = Arc::new(Mutex::new(c));
        let c2 = c.clone();
        let p2 = proxies.clone();
        tokio::task::spawn_blocking(move || crate::cluster::announce_all(&lock(&c2), &p2))
            .await??;
        let hosts: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let url = format!(
            "redis+cluster://{WORKER_USER}:{canary}@{}/",
            hosts.join(",")
        );
        let (primaries, replicas) = {
            let g = lock(&c);
            (g.primaries(), g.replicas())
        };
        log.write(
            json!({"p":"control","type":"info","f":"cluster","ports":ports,
            "proxies":proxies,"primaries":primaries,"replicas":replicas}),
        );
        (None, Some(c), 0, String::new(), url)
    } else {
        let redis = tokio::task::spawn_blocking(move || {
            RedisServer::builder()
                .persistence(Persistence::Durable)
                .requirepass(&pw)
                .acl_user(WORKER_USER, &pw, "baton:")
                .start()
        })
        .await??;
        let redis_port = redis.port();
        (
            Some(Arc::new(Mutex::new(redis))),
            None,
            redis_port,
            format!("redis://:{canary}@127.0.0.1:{redis_port}/"),
            format!("redis://{WORKER_USER}:{canary}@127.0.0.1:{{port}}/"),
        )
    };

    let mut links = Vec::new();
    // A cluster client learns the nodes' own addresses from the cluster: no proxies there.
    for i in 0..if cfg.cluster { 0 } else { WORKERS } {
        links.push(
            Link::start(
                &format!("w{i}"),
                redis_port,
                log.clone(),
                mix(&[cfg.seed, 77, i as u64]),
            )
            .await?,
        );
    }
    let resource = Resource::start(cfg.fenced, Jsonl::open(&dir.join("resource.jsonl"))?).await?;

    let total_ms = ((cfg.warmup_s + cfg.chaos_s) * 1000.0) as u64;
    let spacing_ms = (total_ms / cfg.jobs.max(1) as u64).max(1);
    let t0 = mono_ns() + 700_000_000;
    let chaos_start = t0 + (cfg.warmup_s * 1e9) as u64;
    let deadline = chaos_start + (cfg.chaos_s * 1e9) as u64;
    let base = WorkerArgs {
        id: 0,
        inc: 0,
        run_dir: dir.clone(),
        resource: format!("127.0.0.1:{}", resource.port),
        jobs: cfg.jobs,
        t0,
        spacing_ms,
        seed: cfg.seed,
        workload: cfg.workload,
        replica_ack: cfg.cluster,
        // Mutex workers stop at the stop file, written once progress after the final heal was
        // seen; this deadline only caps a run whose control process went away.
        deadline: match cfg.workload {
            Workload::Failover => 0,
            Workload::Mutex
            | Workload::Leader
            | Workload::Fair
            | Workload::Semaphore
            | Workload::Rw => deadline + (cfg.quiesce_bound_s * 1e9) as u64 + 20_000_000_000,
        },
    };
    let fleet = Fleet::new(base, worker_url, WORKERS, log.clone());
    for i in 0..WORKERS {
        fleet.spawn(i, links.get(i).map_or(0, |l| l.port))?;
    }
    let ctx = Arc::new(nemesis::Ctx {
        redis: redis.clone(),
        cluster: cluster.clone(),
        pg: pg.clone(),
        node_links: node_links.clone(),
        job_clock: nemesis::JobClock {
            t0,
            spacing_ns: spacing_ms * 1_000_000,
            jobs: cfg.jobs,
        },
        admin_url: admin_url.clone(),
        links: links.clone(),
        fleet: fleet.clone(),
        resource: resource.clone(),
        log: log.clone(),
        next_id: AtomicU64::new(1),
    });

    // Warm-up, then chaos.
    tokio::time::sleep(Duration::from_nanos(chaos_start.saturating_sub(mono_ns()))).await;
    log.write(json!({"p":"control","type":"info","f":"chaos_start"}));
    let lanes: Vec<_> = cfg
        .lanes
        .iter()
        .enumerate()
        .map(|(i, kinds)| {
            tokio::spawn(nemesis::lane(
                ctx.clone(),
                kinds.clone(),
                Rng::new(mix(&[cfg.seed, i as u64 + 1])),
                deadline,
            ))
        })
        .collect();
    let mut volatile_t = None;
    if let Some(at) = cfg.volatile_restart_at {
        let when = chaos_start + (at * 1e9) as u64;
        tokio::time::sleep(Duration::from_nanos(when.saturating_sub(mono_ns()))).await;
        volatile_t = Some(volatile_restart(&ctx, cfg.workload == Workload::Failover).await);
    }
    for lane in lanes {
        let _ = lane.await;
    }
    tokio::time::sleep(Duration::from_nanos(deadline.saturating_sub(mono_ns()))).await;

    // Heal, then wait for quiescence.
    ctx.heal_all().await;
    let heal_t = mono_ns();
    if cfg.workload != Workload::Failover {
        // Let the mutex (or leader) workers show progress after the heal (a write accepted at the resource,
        // then one more second of work), bounded, then tell them to stop.
        let until = heal_t + LEASE.as_nanos() as u64 + 7_000_000_000;
        let mut seen = None;
        while mono_ns() < until {
            // The fair lock: progress on every lock, so a reservation or a queue left stuck
            // by a fault shows as a lock without a grant after the heal (M7).
            let progressed = match cfg.workload {
                Workload::Fair => {
                    (0..MUTEX_LOCKS).all(|i| resource.last_accepted_on(&fair_lock_name(i)) > heal_t)
                }
                _ => resource.last_accepted() > heal_t,
            };
            if seen.is_none() && progressed {
                seen = Some(mono_ns());
            }
            if seen.is_some_and(|t| mono_ns() > t + 1_000_000_000) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Err(e) = std::fs::write(dir.join(STOP_FILE), b"stop") {
            log.write(json!({"p":"control","type":"info","f":"stop_file","err":e.to_string()}));
        }
        log.write(json!({"p":"control","type":"info","f":"stop_workers"}));
    }
    let bound = heal_t + (cfg.quiesce_bound_s * 1e9) as u64;
    while !fleet.all_exited() && mono_ns() < bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stuck = fleet.kill_leftovers();
    if !stuck.is_empty() {
        log.write(json!({"p":"control","type":"info","f":"quiescence_bound","stuck":stuck}));
    }
    // Let the exit watchers record the last exits.
    for _ in 0..50 {
        if lock(&fleet.exits).len() >= (0..WORKERS).map(|i| fleet.inc(i) as usize).sum::<usize>() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let jobs = match cfg.workload {
        Workload::Failover => cfg.jobs,
        Workload::Mutex
        | Workload::Leader
        | Workload::Fair
        | Workload::Semaphore
        | Workload::Rw => 0,
    };
    let read = match &cluster {
        Some(c) => crate::cluster::read_final_state(c, jobs).await,
        None if cfg.postgres => crate::pg::read_final_state(&admin_url, jobs).await,
        None => read_final_state(&admin_url, jobs).await,
    };
    let (final_state, final_state_err) = match read {
        Ok(s) => (s, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let exits = lock(&fleet.exits).clone();
    // The private copy of the executable the workers ran (54 MB in debug builds).
    let _ = std::fs::remove_file(root.join(format!("chaos-worker-bin-{}", cfg.name)));
    log.write(json!({"p":"control","type":"info","f":"phase_end"}));
    drop(ctx);
    drop(links);
    drop(node_links);
    let _ = tokio::task::spawn_blocking(move || {
        drop(redis);
        drop(cluster);
        drop(pg);
    })
    .await;
    Ok(PhaseResult {
        cfg,
        dir,
        final_state,
        exits,
        heal_t,
        start_t,
        end_t: mono_ns(),
        stuck,
        volatile_t,
        final_state_err,
    })
}

/// Negative control (b): Redis loses everything (restart without persistence), then (with
/// `restart_w0`) a worker is killed and restarted, so a new incarnation meets jobs whose DONE was
/// lost.
async fn volatile_restart(ctx: &nemesis::Ctx, restart_w0: bool) -> u64 {
    let redis = ctx.redis.clone();
    let r = if let Some(pg) = ctx.pg.clone() {
        // PostgreSQL loses its data: an immediate shutdown, a start on the same data, and
        // every job row truncated (as if the server came back from a disk without them).
        let restarted = tokio::task::spawn_blocking(move || lock(&pg).restart())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match restarted {
            Ok(()) => match crate::pg::Admin::connect(&ctx.admin_url).await {
                Ok(admin) => admin.truncate_jobs().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        }
    } else if let Some(cluster) = ctx.cluster.clone() {
        // The cluster's nodes keep no data across a restart: killing a shard's replica, then its
        // primary (no failover: there is no replica left), and restarting both loses the shard.
        let proxies: Vec<u16> = ctx.node_links.iter().map(|l| l.port).collect();
        tokio::task::spawn_blocking(move || {
            crate::cluster::lose_shard(&mut lock(&cluster), &crate::util::job_name(0), &proxies)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
    } else {
        tokio::task::spawn_blocking(move || {
            let redis = redis.ok_or_else(|| std::io::Error::other("no single Redis"))?;
            let mut r = lock(&redis);
            r.kill();
            r.restart_with(Persistence::Volatile)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    };
    let t = mono_ns();
    ctx.log.write(
        json!({"p":"nemesis","type":"start","id":0,"kind":"volatile_restart",
        "targets":["w0","w1","w2","w3"],"detail":{"err":r.err()}}),
    );
    ctx.log
        .write(json!({"p":"nemesis","type":"stop","id":0,"kind":"volatile_restart","detail":{}}));
    if !restart_w0 {
        return t;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    ctx.fleet.kill(0);
    for _ in 0..100 {
        if !ctx.fleet.running(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = ctx.fleet.spawn(0, ctx.links.first().map_or(0, |l| l.port));
    ctx.log
        .write(json!({"p":"nemesis","type":"info","f":"control_restart_w0",
        "err":r.err().map(|e| e.to_string())}));
    t
}

/// `GET baton:{j-…}` for every job, via an admin connection that bypasses the proxy.
pub(crate) async fn read_final_state(
    url: &str,
    jobs: usize,
) -> Result<BTreeMap<String, Option<String>>, BoxError> {
    let client = redis::Client::open(url)?;
    let mut last = None;
    for _ in 0..20 {
        let fut = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let mut out = BTreeMap::new();
            for j in 0..jobs {
                let name = job_name(j);
                let v: Option<String> = redis::cmd("GET")
                    .arg(format!("baton:{{{name}}}"))
                    .query_async(&mut conn)
                    .await?;
                out.insert(name, v);
            }
            Ok::<_, redis::RedisError>(out)
        };
        match tokio::time::timeout(Duration::from_secs(5), fut).await {
            Ok(Ok(m)) => return Ok(m),
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("timed out".into()),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the final state: {}", last.unwrap_or_default()).into())
}
