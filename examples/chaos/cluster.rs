//! The cluster profile's node faults (primary kill and failover, primary pause, a pause until
//! the replica is promoted, resharding) and
//! its final-state read, on a [`RedisCluster`] fixture.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::testing::cluster::slot;
use baton::testing::RedisCluster;
use serde_json::json;

use crate::nemesis::{lock, secs, Ctx, Kind};
use crate::proxy::Mode;
use crate::util::{job_name, mono_ns, BoxError, Rng};

/// The nodes' `cluster-node-timeout` (the fixture's): a pause shorter than this fails nothing over.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a killed primary's replica may take to be promoted before the fault gives up waiting.
const FAILOVER_WAIT: Duration = Duration::from_secs(15);

type Shared = Arc<Mutex<RedisCluster>>;

async fn blocking<T: Send + 'static>(
    cluster: &Shared,
    f: impl FnOnce(&mut RedisCluster) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || f(&mut lock(&c)))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
}

/// After node `n` came back (restarted or resumed): waits for the cluster to be healthy and
/// reads which role `n` has now, with the wait's error if it did not become healthy; `Err` only
/// when the roles cannot be read.
fn rejoined(c: &mut RedisCluster, n: usize) -> Result<(&'static str, Option<String>), String> {
    let healthy = c
        .wait_healthy(Duration::from_secs(15))
        .map_err(|e| e.to_string());
    c.refresh_roles().map_err(|e| e.to_string())?;
    let role = if c.primaries().contains(&n) {
        "primary"
    } else if c.replicas().contains(&n) {
        "replica"
    } else {
        "unknown"
    };
    Ok((role, healthy.err()))
}

impl Ctx {
    /// SIGKILLs a primary, waits for its replica's promotion, keeps it down a little longer,
    /// restarts it (it rejoins as a replica of the promoted node) and waits for a healthy cluster.
    pub(crate) async fn kill_primary(&self, rng: &mut Rng) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let r = rng.next_u64();
        let extra = rng.range(0.5, 2.0);
        let killed = blocking(&cluster, move |c| {
            c.refresh_roles().map_err(|e| e.to_string())?;
            // Only a primary with a replica: one without would come back empty, still owning
            // its slots (the fixture keeps no data across a restart), which is the volatile
            // control's fault, not this one's.
            let pairs: Vec<(usize, usize)> = c
                .replicas()
                .into_iter()
                .filter_map(|i| Some((c.primary_of(i)?, i)))
                .collect();
            let (n, replica) = *pairs
                .get(r as usize % pairs.len().max(1))
                .ok_or("no primary with a replica")?;
            let replica = Some(replica);
            let port = c.nodes()[n].port();
            c.node_mut(n).kill();
            Ok((n, replica, port))
        })
        .await;
        let (n, replica, port) = match killed {
            Ok(k) => k,
            Err(e) => {
                let id = self.start(Kind::KillPrimary, &self.all(), json!({"err":e}));
                self.stop(id, Kind::KillPrimary, json!({}));
                return;
            }
        };
        let t_kill = Instant::now();
        let id = self.start(
            Kind::KillPrimary,
            &self.all(),
            json!({"node":n,"port":port,"replica":replica,"down_secs_after_promotion":extra}),
        );
        // Wait for the promotion (the replica reports itself primary).
        let mut failover_ms = None;
        while t_kill.elapsed() < FAILOVER_WAIT {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let promoted = blocking(&cluster, move |c| {
                c.refresh_roles().map_err(|e| e.to_string())?;
                Ok(replica.is_some_and(|r| c.primaries().contains(&r)))
            })
            .await
            .unwrap_or(false);
            if promoted {
                failover_ms = Some(t_kill.elapsed().as_millis() as u64);
                break;
            }
        }
        self.log
            .write(json!({"p":"nemesis","type":"info","f":"failover","id":id,
            "node":n,"replica":replica,"failover_ms":failover_ms}));
        tokio::time::sleep(secs(extra)).await;
        let t_restart = Instant::now();
        let res = blocking(&cluster, move |c| {
            c.node_mut(n)
                .restart()
                .map_err(|e| format!("restart: {e}"))?;
            rejoined(c, n)
        })
        .await;
        let (role, err) = match res {
            Ok((role, healthy_err)) => (Some(role), healthy_err),
            Err(e) => (None, Some(e)),
        };
        self.stop(
            id,
            Kind::KillPrimary,
            json!({"failover_ms":failover_ms,"down_ms":t_kill.elapsed().as_millis() as u64,
                "rejoin_ms":t_restart.elapsed().as_millis() as u64,"role_after":role,"err":err}),
        );
    }

    /// SIGSTOPs a primary for 20–80 % of the node timeout: slow, not failed over.
    pub(crate) async fn pause_primary(&self, rng: &mut Rng) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let r = rng.next_u64();
        let d = rng.range(0.2, 0.8) * NODE_TIMEOUT.as_secs_f64();
        let paused = blocking(&cluster, move |c| {
            c.refresh_roles().map_err(|e| e.to_string())?;
            let ps = c.primaries();
            let n = *ps.get(r as usize % ps.len().max(1)).ok_or("no primary")?;
            c.nodes()[n].pause().map_err(|e| e.to_string())?;
            Ok(n)
        })
        .await;
        let id = self.start(
            Kind::PausePrimary,
            &self.all(),
            json!({"node":paused.as_ref().ok(),"secs":d,"err":paused.as_ref().err()}),
        );
        let Ok(n) = paused else {
            self.stop(id, Kind::PausePrimary, json!({}));
            return;
        };
        tokio::time::sleep(secs(d)).await;
        let r = blocking(&cluster, move |c| {
            c.nodes()[n].resume().map_err(|e| e.to_string())
        })
        .await;
        self.stop(id, Kind::PausePrimary, json!({"err":r.err()}));
    }

    /// SIGSTOPs a primary that has a replica and keeps it stopped until the replica is promoted
    /// (or [`FAILOVER_WAIT`] passed), a little longer, then SIGCONTs it: it learns of the
    /// failover by gossip and comes back as a replica of the promoted node. Unlike a kill, the
    /// node's sockets stay open and silent meanwhile, so only timeouts tell a client it is gone.
    pub(crate) async fn pause_until_promotion(&self, rng: &mut Rng) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let r = rng.next_u64();
        let extra = rng.range(0.2, 1.5);
        let paused = blocking(&cluster, move |c| {
            c.refresh_roles().map_err(|e| e.to_string())?;
            let pairs: Vec<(usize, usize)> = c
                .replicas()
                .into_iter()
                .filter_map(|i| Some((c.primary_of(i)?, i)))
                .collect();
            let (n, replica) = *pairs
                .get(r as usize % pairs.len().max(1))
                .ok_or("no primary with a replica")?;
            c.nodes()[n].pause().map_err(|e| e.to_string())?;
            Ok((n, replica))
        })
        .await;
        let id = self.start(
            Kind::PauseUntilPromotion,
            &self.all(),
            json!({"node":paused.as_ref().ok().map(|p| p.0),
                "replica":paused.as_ref().ok().map(|p| p.1),
                "secs_after_promotion":extra,"err":paused.as_ref().err()}),
        );
        let Ok((n, replica)) = paused else {
            self.stop(id, Kind::PauseUntilPromotion, json!({}));
            return;
        };
        let t_pause = Instant::now();
        let mut failover_ms = None;
        while t_pause.elapsed() < FAILOVER_WAIT {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The paused node does not answer: refresh_roles leaves it out.
            let promoted = blocking(&cluster, move |c| {
                c.refresh_roles().map_err(|e| e.to_string())?;
                Ok(c.primaries().contains(&replica))
            })
            .await
            .unwrap_or(false);
            if promoted {
                failover_ms = Some(t_pause.elapsed().as_millis() as u64);
                break;
            }
        }
        self.log
            .write(json!({"p":"nemesis","type":"info","f":"failover","id":id,
            "node":n,"replica":replica,"failover_ms":failover_ms}));
        tokio::time::sleep(secs(extra)).await;
        let t_resume = Instant::now();
        let res = blocking(&cluster, move |c| {
            c.nodes()[n].resume().map_err(|e| format!("resume: {e}"))?;
            rejoined(c, n)
        })
        .await;
        let (role, err) = match res {
            Ok((role, healthy_err)) => (Some(role), healthy_err),
            Err(e) => (None, Some(e)),
        };
        self.stop(
            id,
            Kind::PauseUntilPromotion,
            json!({"failover_ms":failover_ms,"paused_ms":t_pause.elapsed().as_millis() as u64,
                "rejoin_ms":t_resume.elapsed().as_millis() as u64,"role_after":role,"err":err}),
        );
    }

    /// Moves the slot of a job released in the last few seconds (likely running) to another
    /// primary, in the three steps of `redis-cli --cluster reshard`, 0–400 ms apart.
    pub(crate) async fn reshard(&self, rng: &mut Rng) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let jc = self.job_clock;
        let released = (mono_ns().saturating_sub(jc.t0) / jc.spacing_ns.max(1)) as usize;
        let newest = released.min(jc.jobs.saturating_sub(1));
        let j = newest.saturating_sub(rng.below(6));
        let job = job_name(j);
        let s = slot(job.as_bytes());
        let r = rng.next_u64();
        let (p1, p2) = (rng.range(0.0, 0.4), rng.range(0.0, 0.4));
        let begun = blocking(&cluster, move |c| {
            c.refresh_roles().map_err(|e| e.to_string())?;
            let owner = c
                .node_for_key(format!("baton:{{{}}}", job_name(j)).as_bytes())
                .ok_or("no owner")?;
            let others: Vec<usize> = c.primaries().into_iter().filter(|&p| p != owner).collect();
            let to = *others
                .get(r as usize % others.len().max(1))
                .ok_or("no other primary")?;
            let from = c.begin_slot_migration(s, to).map_err(|e| {
                // Leave nothing half-set.
                let _ = stable(c, s);
                format!("begin: {e}")
            })?;
            Ok((from, to))
        })
        .await;
        let id = self.start(
            Kind::Reshard,
            &self.all(),
            json!({"job":job,"slot":s,"from":begun.as_ref().ok().map(|b| b.0),
                "to":begun.as_ref().ok().map(|b| b.1),"err":begun.as_ref().err()}),
        );
        let Ok((from, to)) = begun else {
            self.stop(id, Kind::Reshard, json!({}));
            return;
        };
        tokio::time::sleep(secs(p1)).await;
        let moved = blocking(&cluster, move |c| {
            let mut last = String::new();
            for _ in 0..10 {
                match c.migrate_slot_keys(s, from, to) {
                    Ok(n) => return Ok(n),
                    Err(e) => last = e.to_string(),
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(format!("migrate: {last}"))
        })
        .await;
        self.log.write(
            json!({"p":"nemesis","type":"info","f":"reshard_keys_moved","id":id,
            "keys":moved.as_ref().ok(),"err":moved.as_ref().err()}),
        );
        tokio::time::sleep(secs(p2)).await;
        let fin = blocking(&cluster, move |c| {
            c.finish_slot_migration(s, from, to)
                .map_err(|e| format!("finish: {e}"))
        })
        .await;
        self.stop(
            id,
            Kind::Reshard,
            json!({"keys":moved.as_ref().ok(),"err":moved.err().or(fin.err())}),
        );
    }
}

impl Ctx {
    /// A fault on every client's link to one node (its proxy): the cluster bus is untouched, so
    /// nothing is failed over; clients (and the replica's replication link, which also follows
    /// the announced port) just cannot reach it.
    pub(crate) async fn node_link_fault(&self, kind: Kind, rng: &mut Rng) {
        if self.node_links.is_empty() {
            return;
        }
        // Two in three hit a primary (from the roles last read; the node lane may hold the
        // fixture, then any node).
        let primaries = match self.cluster.as_ref().map(|c| c.try_lock()) {
            Some(Ok(c)) => c.primaries(),
            _ => Vec::new(),
        };
        let n = if !primaries.is_empty() && rng.unit() < 2.0 / 3.0 {
            primaries[rng.below(primaries.len())]
        } else {
            rng.below(self.node_links.len())
        };
        let link = self.node_links[n].clone();
        match kind {
            Kind::PartitionNode => {
                let d = rng.range(1.0, 4.0);
                let id = self.start(kind, &self.all(), json!({"node":n,"secs":d}));
                link.set_mode(Mode::Blackhole);
                tokio::time::sleep(secs(d)).await;
                link.set_mode(Mode::Pass);
                self.stop(id, kind, json!({}));
            }
            Kind::LatencyNode => {
                let ms = rng.range(50.0, 400.0) as u64;
                let d = rng.range(2.0, 6.0);
                let id = self.start(kind, &self.all(), json!({"node":n,"ms":ms,"secs":d}));
                link.set_mode(Mode::Delay { ms, jitter_pct: 20 });
                tokio::time::sleep(secs(d)).await;
                link.set_mode(Mode::Pass);
                self.stop(id, kind, json!({}));
            }
            _ => {
                let refuse = rng.range(0.0, 1.5);
                let id = self.start(kind, &self.all(), json!({"node":n,"refuse_secs":refuse}));
                link.set_mode(Mode::Refuse);
                link.reset_all();
                tokio::time::sleep(secs(refuse)).await;
                link.set_mode(Mode::Pass);
                self.stop(id, kind, json!({}));
            }
        }
    }
}

fn node_conn(c: &RedisCluster, n: usize) -> Result<redis::Connection, String> {
    let client = redis::Client::open(c.nodes()[n].url()).map_err(|e| e.to_string())?;
    client
        .get_connection_with_timeout(Duration::from_millis(500))
        .map_err(|e| e.to_string())
}

/// Node `n` announces `port` (its proxy) to clients; its bus port stays its own.
pub fn announce(c: &RedisCluster, n: usize, port: u16) -> Result<(), String> {
    let mut conn = node_conn(c, n)?;
    let bus = c.nodes()[n].port() + 10000;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("cluster-announce-port")
        .arg(port)
        .arg("cluster-announce-bus-port")
        .arg(bus)
        .query::<()>(&mut conn)
        .map_err(|e| format!("node {n}: CONFIG SET cluster-announce-port: {e}"))
}

/// Every node announces its proxy's port; waits (up to 10 s) until every node's `CLUSTER SLOTS`
/// names only proxy ports.
pub fn announce_all(c: &RedisCluster, proxies: &[u16]) -> Result<(), String> {
    for (n, p) in proxies.iter().enumerate() {
        announce(c, n, *p)?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut stale = None;
        for n in 0..c.nodes().len() {
            let mut conn = node_conn(c, n)?;
            let v: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query(&mut conn)
                .map_err(|e| e.to_string())?;
            let mut ports = Vec::new();
            collect_ports(&v, &mut ports);
            if let Some(p) = ports.iter().find(|p| !proxies.contains(p)) {
                stale = Some(format!("node {n} still names port {p}"));
                break;
            }
        }
        match stale {
            None => return Ok(()),
            Some(why) if Instant::now() > deadline => return Err(why),
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The ports in a `CLUSTER SLOTS` reply: `[[start, end, [ip, port, id, …], …], …]`.
fn collect_ports(v: &redis::Value, out: &mut Vec<u16>) {
    if let redis::Value::Array(ranges) = v {
        for r in ranges {
            if let redis::Value::Array(parts) = r {
                for node in parts.iter().skip(2) {
                    if let redis::Value::Array(f) = node {
                        if let Some(redis::Value::Int(p)) = f.get(1) {
                            out.push(*p as u16);
                        }
                    }
                }
            }
        }
    }
}

/// Negative control on the cluster: the shard serving `job` loses everything (its replica and
/// its primary SIGKILLed, both restarted without data; nodes.conf keeps the slots), so jobs
/// whose DONE lived there run again.
pub fn lose_shard(c: &mut RedisCluster, job: &str, proxies: &[u16]) -> Result<(), String> {
    c.refresh_roles().map_err(|e| e.to_string())?;
    let p = c
        .node_for_key(format!("baton:{{{job}}}").as_bytes())
        .ok_or("no owner")?;
    let replica = c
        .replicas()
        .into_iter()
        .find(|&i| c.primary_of(i) == Some(p));
    if let Some(r) = replica {
        c.node_mut(r).kill();
    }
    c.node_mut(p).kill();
    for n in std::iter::once(p).chain(replica) {
        c.node_mut(n)
            .restart()
            .map_err(|e| format!("restart {n}: {e}"))?;
        if let Some(port) = proxies.get(n) {
            announce(c, n, *port)?;
        }
    }
    c.wait_healthy(Duration::from_secs(15))
        .map_err(|e| e.to_string())?;
    c.refresh_roles().map_err(|e| e.to_string())
}

/// `CLUSTER SETSLOT s STABLE` on every primary (undoes a half-begun migration).
fn stable(c: &RedisCluster, s: u16) -> Result<(), String> {
    for i in c.primaries() {
        let client = redis::Client::open(c.nodes()[i].url()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .map_err(|e| e.to_string())?;
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(s)
            .arg("STABLE")
            .query::<()>(&mut conn)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `GET baton:{j-…}` for every job, each on the primary serving its slot (read from the nodes).
pub async fn read_final_state(
    cluster: &Shared,
    jobs: usize,
) -> Result<BTreeMap<String, Option<String>>, BoxError> {
    let mut last = String::new();
    for _ in 0..20 {
        let res = blocking(cluster, move |c| {
            c.refresh_roles().map_err(|e| e.to_string())?;
            let mut conns = BTreeMap::new();
            let mut out = BTreeMap::new();
            for j in 0..jobs {
                let name = job_name(j);
                let key = format!("baton:{{{name}}}");
                let n = c
                    .node_for_key(key.as_bytes())
                    .ok_or_else(|| format!("no primary serves {key}"))?;
                if let std::collections::btree_map::Entry::Vacant(e) = conns.entry(n) {
                    let client =
                        redis::Client::open(c.nodes()[n].url()).map_err(|e| e.to_string())?;
                    let conn = client
                        .get_connection_with_timeout(Duration::from_secs(1))
                        .map_err(|e| e.to_string())?;
                    e.insert(conn);
                }
                let conn = conns.get_mut(&n).ok_or("no connection")?;
                let v: Option<String> = redis::cmd("GET")
                    .arg(&key)
                    .query(conn)
                    .map_err(|e| e.to_string())?;
                out.insert(name, v);
            }
            Ok(out)
        })
        .await;
        match res {
            Ok(m) => return Ok(m),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the final state: {last}").into())
}
