//! Scenario `cluster`: baton on a Redis Cluster (3 primaries, 3 replicas, on loopback) against
//! baton on one private `redis-server`, in the same run, rounds interleaved (the side that goes
//! first alternates) so load drift on the machine hits both alike.
//!
//! - (a) the uncontended cycle (start→Acquired→done()→Completed, one at a time);
//! - (b) 64 jobs in flight on one client (one worker per job), ops = jobs completed;
//! - (c) N jobs (1 000 in a full run) one after the other on each: `INFO commandstats`,
//!   `total_reads_processed` and `INFO cpu` deltas per primary: commands per job per node, each
//!   node's share of the jobs (by the slot of the job's hash tag), and the totals against the
//!   single server's (the same commands in the same round trips, routed).
//!
//! The ratio is cluster / single (wall time per op; p50 / p50), 1.0 = no routing cost. The
//! bench's own commands (`INFO`, `PUBSUB …`) and replication's (`REPLCONF` from the replicas)
//! are left out of the counts; `CLUSTER SLOTS` (baton reading its slot map) would be counted.

use serde_json::Value;

use crate::harness::Report;
use crate::Opts;

#[cfg(not(feature = "cluster"))]
pub async fn cluster(_opts: &Opts, _report: &mut Report) {
    eprintln!("cluster: skipped (needs the `cluster` feature: cargo bench --all-features)");
}

#[cfg(feature = "cluster")]
pub async fn cluster(opts: &Opts, report: &mut Report) {
    imp::cluster(opts, report).await
}

/// The per-node table printed after the main table.
pub fn node_table(v: &Value) -> String {
    let mut out = format!(
        "cluster, {} jobs one after the other, per primary (INFO commandstats, \
         total_reads_processed and INFO cpu deltas; replication and the bench's own commands \
         left out); per-job figures of a node are per job it owns\n",
        v["jobs"]
    );
    out.push_str(&format!(
        "{:<20} {:>6} {:>7} {:>8} {:>9} {:>10} {:>9} {:>11}  {}\n",
        "node",
        "jobs",
        "share",
        "cmds",
        "cmds/job",
        "reads/job",
        "subs/job",
        "cpu µs/job",
        "by command, per job it owns (path + subscriptions)"
    ));
    let f = |x: &Value, p: usize| x.as_f64().map_or("-".into(), |v| format!("{v:.p$}"));
    let rows = v["nodes"].as_array().cloned().unwrap_or_default();
    for n in rows.iter().chain([&v["cluster_total"], &v["single"]]) {
        if n.is_null() {
            continue;
        }
        let by = n["commands_per_job_by_command"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<20} {:>6} {:>7} {:>8} {:>9} {:>10} {:>9} {:>11}  {}\n",
            n["node"].as_str().unwrap_or("?"),
            n["jobs"].to_string(),
            n["job_share"]
                .as_f64()
                .map_or("-".into(), |s| format!("{:.1} %", s * 100.0)),
            n["commands"].to_string(),
            f(&n["path_commands_per_job"], 2),
            f(&n["path_reads_per_job"], 2),
            f(&n["subscription_commands_per_job"], 2),
            f(&n["cpu_us_per_job"], 1),
            by
        ));
    }
    out.push_str(&format!(
        "on the job's path (subscriptions aside): same commands as the single server: {}; same \
         reads (round trips): {}; all commands by name (subscriptions included): {}{}\n",
        v["same_commands"],
        v["same_reads"],
        v["same_by_command"],
        if v["same_by_command"] == Value::Bool(false) {
            format!(
                ", cluster - single: {}",
                v["cluster_minus_single_by_command"]
            )
        } else {
            String::new()
        },
    ));
    out.push_str(&format!(
        "the cluster's replicas used {:.1} µs of CPU per job on top (applying the replication \
         stream)\n",
        v["cluster_total"]["replica_cpu_us_per_job"]
            .as_f64()
            .unwrap_or(f64::NAN)
    ));
    out.push_str(&format!(
        "idle servers' CPU (µs per s): single {:.0}, the 3 primaries {:.0}, the 3 replicas {:.0}; \
         this process's CPU per job: cluster {:.0} µs, single {:.0} µs\n",
        v["idle_cpu"]["single_us_per_s"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["idle_cpu"]["primaries_us_per_s"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["idle_cpu"]["replicas_us_per_s"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["client_cpu_us_per_job"]["cluster"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["client_cpu_us_per_job"]["single"]
            .as_f64()
            .unwrap_or(f64::NAN),
    ));
    if let Some(split) = v["concurrent_64"]["nodes"].as_array() {
        out.push_str("64 jobs in flight (all measured rounds), per primary: ");
        out.push_str(
            &split
                .iter()
                .map(|n| {
                    format!(
                        "{} {:.1} % of the commands, {:.1} % of the server CPU ({:.2} s)",
                        n["node"].as_str().unwrap_or("?"),
                        n["command_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
                        n["cpu_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
                        n["cpu_s"].as_f64().unwrap_or(f64::NAN),
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        );
        out.push_str(&format!(
            "; single server CPU {:.2} s for the same jobs\n",
            v["concurrent_64"]["single_cpu_s"]
                .as_f64()
                .unwrap_or(f64::NAN)
        ));
    }
    out
}

#[cfg(feature = "cluster")]
mod imp {
    use std::time::Duration;

    use baton::testing::RedisCluster;
    use redis::aio::MultiplexedConnection;
    use serde_json::{json, Value};
    use tokio::time::Instant;

    use crate::harness::Report;
    use crate::harness::{admin, baton_job, cfg, closed_loop, connect, drain_pubsub, own};
    use crate::redisinfo::{self, CommandStats};
    use crate::stats::{Row, Samples};
    use crate::{run_id, start_server, Opts};

    /// Pause before a run's closing snapshot.
    const SETTLE: Duration = Duration::from_millis(50);

    /// Commands that are neither baton's: the bench's own and replication's.
    fn foreign(cmd: &str) -> bool {
        own(cmd) || cmd.starts_with("pubsub|") || cmd == "replconf"
    }

    fn total(d: &CommandStats) -> u64 {
        d.iter().filter(|(k, _)| !foreign(k)).map(|(_, v)| v).sum()
    }

    fn add(into: &mut CommandStats, d: &CommandStats) {
        for (k, v) in d {
            *into.entry(k.clone()).or_default() += v;
        }
    }

    /// What a node (or a group of them) says: commands, reads, CPU seconds.
    #[derive(Default, Clone)]
    struct Snap {
        cmds: CommandStats,
        reads: u64,
        cpu: f64,
    }

    async fn snap(conn: &mut MultiplexedConnection) -> Snap {
        let cmds = redisinfo::commandstats(conn).await;
        let reads = redisinfo::stat(conn, "total_reads_processed").await;
        let cpu = redisinfo::field(conn, "cpu", "used_cpu_user").await
            + redisinfo::field(conn, "cpu", "used_cpu_sys").await;
        Snap { cmds, reads, cpu }
    }

    /// `after - before`; the reads less the bench's own (one per `INFO`/`PUBSUB` it sent) and
    /// replication's (`REPLCONF`).
    fn diff(before: &Snap, after: &Snap) -> Snap {
        let cmds = redisinfo::delta(&before.cmds, &after.cmds);
        let not_ours: u64 = cmds
            .iter()
            .filter(|(k, _)| foreign(k))
            .map(|(_, v)| v)
            .sum();
        Snap {
            reads: (after.reads - before.reads).saturating_sub(not_ours),
            cpu: after.cpu - before.cpu,
            cmds,
        }
    }

    /// The single server or the cluster's primaries.
    struct Target {
        name: &'static str,
        client: baton::Client,
        /// Admin connections: the server, or each primary.
        adm: Vec<MultiplexedConnection>,
        /// Each node's name.
        labels: Vec<String>,
        /// Admin connections to the replicas (none for the single server): their CPU only.
        replicas: Vec<MultiplexedConnection>,
        /// The replicas' CPU seconds in the last `run_on`.
        last_replica_cpu: f64,
        /// This process's CPU seconds during the last `run_on`'s jobs.
        last_client_cpu: f64,
    }

    impl Target {
        /// Waits (bounded) until no node has a subscribed channel, plain or sharded: the
        /// unsubscribes go out after a worker ends and would count in the next run.
        async fn drain(&mut self) {
            for c in &mut self.adm {
                drain_pubsub(c).await;
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let ch: Vec<String> = redis::cmd("PUBSUB")
                        .arg("SHARDCHANNELS")
                        .query_async(c)
                        .await
                        .expect("PUBSUB SHARDCHANNELS");
                    if ch.is_empty() || Instant::now() > deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
        async fn replica_cpu(&mut self) -> f64 {
            let mut sum = 0.0;
            for c in &mut self.replicas {
                sum += redisinfo::field(c, "cpu", "used_cpu_user").await
                    + redisinfo::field(c, "cpu", "used_cpu_sys").await;
            }
            sum
        }
        async fn snaps(&mut self) -> Vec<Snap> {
            self.drain().await;
            let mut v = Vec::with_capacity(self.adm.len());
            for c in &mut self.adm {
                v.push(snap(c).await);
            }
            v
        }
    }

    #[derive(Default)]
    struct Side {
        samples: Samples,
        wall: Duration,
        ops: usize,
        cmds: CommandStats,
        reads: u64,
        /// Per node: commands and CPU seconds.
        nodes: Vec<(u64, f64)>,
        /// Per round: ops/s and p50 µs.
        rounds: Vec<(f64, f64)>,
        /// The replicas' CPU seconds.
        replica_cpu: f64,
        /// This process's CPU seconds.
        client_cpu: f64,
    }

    impl Side {
        fn add(&mut self, s: Samples, wall: Duration, ops: usize, d: &[Snap], replica_cpu: f64) {
            self.replica_cpu += replica_cpu;
            self.rounds.push((
                ops as f64 / wall.as_secs_f64(),
                s.pct(50.0).unwrap_or(f64::NAN),
            ));
            self.samples.extend(s);
            self.wall += wall;
            self.ops += ops;
            self.nodes.resize(d.len(), (0, 0.0));
            for (k, n) in d.iter().enumerate() {
                add(&mut self.cmds, &n.cmds);
                self.reads += n.reads;
                self.nodes[k].0 += total(&n.cmds);
                self.nodes[k].1 += n.cpu;
            }
        }
        fn ops_per_s(&self) -> f64 {
            self.ops as f64 / self.wall.as_secs_f64()
        }
        fn cmds_per_op(&self) -> f64 {
            total(&self.cmds) as f64 / self.ops as f64
        }
        /// The primaries' (or the server's) CPU µs per op.
        fn cpu_us_per_op(&self) -> f64 {
            self.nodes.iter().map(|n| n.1).sum::<f64>() * 1e6 / self.ops as f64
        }
        fn subs_per_op(&self) -> f64 {
            self.cmds
                .iter()
                .filter(|(k, _)| subscription(k))
                .map(|(_, v)| *v as f64)
                .sum::<f64>()
                / self.ops as f64
        }
        fn reads_per_op(&self) -> f64 {
            self.reads as f64 / self.ops as f64
        }
    }

    /// This process's CPU seconds (user + system, all threads; `/proc/self/stat`, in clock
    /// ticks of 10 ms).
    fn own_cpu() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        // After the command name: state (field 3) ... utime (14), stime (15).
        (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
    }

    /// One side's run: samples, wall time, per-node deltas, replicas' CPU seconds.
    type Measured = (Samples, Duration, Vec<Snap>, f64, f64);

    /// One closed-loop run of `conc` × `per` jobs on `t`: samples, wall time, per-node deltas.
    async fn run_on(
        t: &mut Target,
        tag: &str,
        conc: usize,
        per: usize,
    ) -> (Samples, Duration, Vec<Snap>) {
        let before = t.snaps().await;
        let r0 = t.replica_cpu().await;
        let c = t.client.clone();
        let name = format!("{tag}-{}", t.name);
        let cpu0 = own_cpu();
        let lease = Duration::from_secs(10);
        let (s, wall) = closed_loop(conc, per, move |i| {
            baton_job(c.clone(), cfg(&format!("{name}-{i}"), lease), 1)
        })
        .await;
        t.last_client_cpu = own_cpu() - cpu0;
        // A subscription goes out alongside the work, awaited by nobody: let it land (`drain`
        // only sees channels that are still subscribed).
        tokio::time::sleep(SETTLE).await;
        let after = t.snaps().await;
        t.last_replica_cpu = t.replica_cpu().await - r0;
        let d = before.iter().zip(&after).map(|(b, a)| diff(b, a)).collect();
        (s, wall, d)
    }

    fn round_to(x: f64, d: i32) -> f64 {
        let m = 10f64.powi(d);
        (x * m).round() / m
    }

    fn by_command(cmds: &CommandStats, per: usize) -> Value {
        cmds.iter()
            .filter(|(k, _)| !foreign(k))
            .map(|(k, v)| (k.clone(), json!(round_to(*v as f64 / per.max(1) as f64, 2))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    fn compare_row(scenario: &str, what: &str, single: &Side, clus: &Side, runs: usize) -> Row {
        let (s, c) = (single.ops_per_s(), clus.ops_per_s());
        let sp = single.samples.pct(50.0).unwrap_or(f64::NAN);
        let cp = clus.samples.pct(50.0).unwrap_or(f64::NAN);
        let (sc, cc) = (single.cmds_per_op(), clus.cmds_per_op());
        let per_round: Vec<Value> = single
            .rounds
            .iter()
            .zip(&clus.rounds)
            .map(|(s, c)| {
                json!({
                    "single_ops_per_s": round_to(s.0, 1),
                    "cluster_ops_per_s": round_to(c.0, 1),
                    "ratio": round_to(s.0 / c.0, 3),
                    "p50_ratio": round_to(c.1 / s.1, 3),
                })
            })
            .collect();
        let ratios = per_round
            .iter()
            .map(|r| format!("{:.2}", r["ratio"].as_f64().unwrap_or(f64::NAN)))
            .collect::<Vec<_>>()
            .join(", ");
        Row {
            scenario: scenario.into(),
            p50_us: Some(cp),
            p99_us: clus.samples.pct(99.0),
            ops_per_s: Some(c),
            floor_ops_per_s: Some(s),
            ratio: Some(s / c),
            samples: clus.samples.len(),
            notes: format!(
                "{what}; baton on the cluster vs baton on one server (the floor column); \
                 single p50 {sp:.0} µs, p99 {:.0} µs; p50 ratio {:.2}; ratio per round {ratios}; \
                 cmds/op {:.2} vs single {:.2}{} + subscriptions {:.2} vs {:.2}; reads/op (pub/sub included) {:.2} vs \
                 {:.2}; server CPU/op {:.0} µs on the primaries + {:.0} µs on the replicas vs \
                 {:.0} µs; client CPU/op {:.0} µs vs {:.0} µs; {runs} runs",
                single.samples.pct(99.0).unwrap_or(f64::NAN),
                cp / sp,
                cc - clus.subs_per_op(),
                sc - single.subs_per_op(),
                if (sc - single.subs_per_op() - cc + clus.subs_per_op()).abs() < 0.05 {
                    ""
                } else {
                    " (DIFFER)"
                },
                clus.subs_per_op(),
                single.subs_per_op(),
                clus.reads_per_op(),
                single.reads_per_op(),
                clus.cpu_us_per_op(),
                clus.replica_cpu * 1e6 / clus.ops as f64,
                single.cpu_us_per_op(),
                clus.client_cpu * 1e6 / clus.ops as f64,
                single.client_cpu * 1e6 / single.ops as f64,
            ),
            extra: json!({
                "baseline": "baton on one redis-server, same run, rounds interleaved",
                "single_p50_us": sp,
                "single_p99_us": single.samples.pct(99.0),
                "p50_ratio": cp / sp,
                "commands_per_op": cc,
                "single_commands_per_op": sc,
                "commands_per_op_by_command": by_command(&clus.cmds, clus.ops),
                "single_commands_per_op_by_command": by_command(&single.cmds, single.ops),
                "subscription_commands_per_op": clus.subs_per_op(),
                "single_subscription_commands_per_op": single.subs_per_op(),
                "server_cpu_us_per_op": clus.cpu_us_per_op(),
                "replica_cpu_us_per_op": clus.replica_cpu * 1e6 / clus.ops as f64,
                "single_server_cpu_us_per_op": single.cpu_us_per_op(),
                "client_cpu_us_per_op": clus.client_cpu * 1e6 / clus.ops as f64,
                "single_client_cpu_us_per_op": single.client_cpu * 1e6 / single.ops as f64,
                "reads_per_op": clus.reads_per_op(),
                "single_reads_per_op": single.reads_per_op(),
                "per_round": per_round,
                "runs": runs,
            }),
        }
    }

    /// `(S)SUBSCRIBE` and `(S)UNSUBSCRIBE`: sent by the hub alongside the work, awaited by
    /// nobody, and both dropped when a job ends before its hub batch went out (so their count
    /// varies with timing, on one server as on the cluster).
    fn subscription(cmd: &str) -> bool {
        matches!(
            cmd,
            "subscribe" | "unsubscribe" | "ssubscribe" | "sunsubscribe"
        )
    }

    /// One node's line of part (c): per-job figures are per job the node owns. "Path" figures
    /// leave the subscriptions out: those are the job's own round trips, which must match.
    fn node_json(label: &str, jobs: usize, all_jobs: usize, d: &Snap) -> Value {
        let per = |n: f64| (jobs > 0).then(|| n / jobs as f64);
        let subs: u64 = d
            .cmds
            .iter()
            .filter(|(k, _)| subscription(k))
            .map(|(_, v)| v)
            .sum();
        let path = total(&d.cmds) - subs;
        // Each subscription change is a read of its own on the pub/sub connection.
        let path_reads = d.reads.saturating_sub(subs);
        json!({
            "path_commands": path,
            "path_commands_per_job": per(path as f64),
            "path_reads": path_reads,
            "path_reads_per_job": per(path_reads as f64),
            "subscription_commands": subs,
            "subscription_commands_per_job": per(subs as f64),
            "node": label,
            "jobs": jobs,
            "job_share": jobs as f64 / all_jobs as f64,
            "commands": total(&d.cmds),
            "commands_per_job": per(total(&d.cmds) as f64),
            "reads": d.reads,
            "reads_per_job": per(d.reads as f64),
            "cpu_s": d.cpu,
            "cpu_us_per_job": per(d.cpu * 1e6),
            "commands_per_job_by_command": by_command(&d.cmds, jobs),
        })
    }

    /// Commands by name, the sharded pub/sub ones named as on one server.
    fn plain(d: &CommandStats) -> CommandStats {
        let mut m = CommandStats::new();
        for (k, v) in d.iter().filter(|(k, _)| !foreign(k)) {
            let k = match k.as_str() {
                "spublish" => "publish",
                "ssubscribe" => "subscribe",
                "sunsubscribe" => "unsubscribe",
                k => k,
            };
            *m.entry(k.to_string()).or_default() += v;
        }
        m
    }

    pub async fn cluster(opts: &Opts, report: &mut Report) {
        // (a) cycles per round, (b) jobs per task per round, measured rounds, (c) jobs.
        let (per_a, per_b, runs, jobs_c): (usize, usize, usize, usize) = if opts.quick {
            (20, 2, 1, 60)
        } else {
            (1000, 30, 5, 1000)
        };
        let server = start_server();
        let t0 = std::time::Instant::now();
        let cl = tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("cluster start task")
            .expect("start a private Redis Cluster (redis-server and redis-cli on PATH?)");
        eprintln!("cluster: 6 nodes up in {:.1} s", t0.elapsed().as_secs_f64());
        let primaries = cl.primaries();
        let mut single = Target {
            name: "single",
            client: connect(&server.url()).await,
            adm: vec![admin(&server.url()).await],
            labels: vec![format!("single :{}", server.port())],
            replicas: Vec::new(),
            last_replica_cpu: 0.0,
            last_client_cpu: 0.0,
        };
        let mut clus = Target {
            name: "cluster",
            client: connect(&cl.cluster_url()).await,
            adm: Vec::new(),
            labels: Vec::new(),
            replicas: Vec::new(),
            last_replica_cpu: 0.0,
            last_client_cpu: 0.0,
        };
        for r in cl.replicas() {
            clus.replicas.push(admin(&cl.nodes()[r].url()).await);
        }
        for &p in &primaries {
            let node = &cl.nodes()[p];
            clus.adm.push(admin(&node.url()).await);
            clus.labels.push(format!("primary :{}", node.port()));
        }
        let id = run_id();

        // The servers' CPU with nothing to do (cluster cron and bus, replication pings): a
        // background per second that the per-op CPU figures below include.
        let idle = if opts.quick { 0.2 } else { 1.0 };
        let (s0, c0) = (single.snaps().await, clus.snaps().await);
        let r0 = clus.replica_cpu().await;
        tokio::time::sleep(Duration::from_secs_f64(idle)).await;
        let (s1, c1) = (single.snaps().await, clus.snaps().await);
        let r1 = clus.replica_cpu().await;
        let rate = |a: &[Snap], b: &[Snap]| {
            a.iter().zip(b).map(|(a, b)| b.cpu - a.cpu).sum::<f64>() / idle * 1e6
        };
        let idle_cpu = json!({
            "single_us_per_s": rate(&s0, &s1),
            "primaries_us_per_s": rate(&c0, &c1),
            "replicas_us_per_s": (r1 - r0) / idle * 1e6,
            "seconds": idle,
        });

        // (a) and (b), interleaved; round 0 warms both up (pools opened on every primary).
        let (mut sa, mut ca, mut sb, mut cb) = (
            Side::default(),
            Side::default(),
            Side::default(),
            Side::default(),
        );
        for round in 0..=runs {
            let (pa, pb) = if round == 0 {
                (per_a.div_ceil(4).max(2), per_b.div_ceil(4).max(2))
            } else {
                (per_a, per_b)
            };
            let single_first = round % 2 == 1;
            for (part, conc, per) in [("a", 1, pa), ("b", 64, pb)] {
                let mut out: [Option<Measured>; 2] = [None, None];
                for k in 0..2 {
                    let is_single = (k == 0) == single_first;
                    let t = if is_single { &mut single } else { &mut clus };
                    let tag = format!("cl{part}-{id}-{round}");
                    let (s, w, d) = run_on(t, &tag, conc, per).await;
                    out[usize::from(!is_single)] =
                        Some((s, w, d, t.last_replica_cpu, t.last_client_cpu));
                }
                if round == 0 {
                    continue;
                }
                let [s, c] = out.map(|o| o.expect("both sides ran"));
                let (ss, cs) = if part == "a" {
                    (&mut sa, &mut ca)
                } else {
                    (&mut sb, &mut cb)
                };
                ss.add(s.0, s.1, conc * per, &s.2, s.3);
                cs.add(c.0, c.1, conc * per, &c.2, c.3);
                ss.client_cpu += s.4;
                cs.client_cpu += c.4;
            }
        }
        report.rows.push(compare_row(
            "cluster 1 uncontended",
            "start→Acquired→done()→Completed, one at a time",
            &sa,
            &ca,
            runs,
        ));
        report.rows.push(compare_row(
            "cluster 64 jobs × 1 worker",
            "64 jobs in flight on one client, ops = jobs completed",
            &sb,
            &cb,
            runs,
        ));
        let b_cmds: u64 = cb.nodes.iter().map(|n| n.0).sum();
        let b_cpu: f64 = cb.nodes.iter().map(|n| n.1).sum();
        let b_split: Vec<Value> = cb
            .nodes
            .iter()
            .enumerate()
            .map(|(k, n)| {
                json!({
                    "node": clus.labels[k],
                    "commands": n.0,
                    "command_share": n.0 as f64 / b_cmds as f64,
                    "cpu_s": n.1,
                    "cpu_share": n.1 / b_cpu,
                })
            })
            .collect();

        // (c) N jobs one after the other on each (reads = round trips: nothing overlaps).
        let tag = format!("clc-{id}");
        let (s_s, s_wall, s_d) = run_on(&mut single, &tag, 1, jobs_c).await;
        let (c_s, c_wall, c_d) = run_on(&mut clus, &tag, 1, jobs_c).await;
        let mut jobs_on = vec![0usize; primaries.len()];
        let mut unplaced = 0;
        for i in 0..jobs_c {
            let key = format!("baton:{{{tag}-cluster-{i}}}");
            match cl
                .node_for_key(key.as_bytes())
                .and_then(|n| primaries.iter().position(|&p| p == n))
            {
                Some(k) => jobs_on[k] += 1,
                None => unplaced += 1,
            }
        }
        let nodes: Vec<Value> = c_d
            .iter()
            .enumerate()
            .map(|(k, d)| node_json(&clus.labels[k], jobs_on[k], jobs_c, d))
            .collect();
        let mut sum = Snap::default();
        for d in &c_d {
            add(&mut sum.cmds, &d.cmds);
            sum.reads += d.reads;
            sum.cpu += d.cpu;
        }
        let mut ctot = node_json("cluster total", jobs_c, jobs_c, &sum);
        ctot["replica_cpu_us_per_job"] = json!(clus.last_replica_cpu * 1e6 / jobs_c as f64);
        let stot = node_json(&single.labels[0], jobs_c, jobs_c, &s_d[0]);
        let same_cmds = ctot["path_commands"] == stot["path_commands"];
        let same_reads = ctot["path_reads"] == stot["path_reads"];
        let (pc, ps) = (plain(&sum.cmds), plain(&s_d[0].cmds));
        let same_by_command = pc == ps;
        // cluster - single, per command (plain names), where they differ.
        let differ: serde_json::Map<String, Value> = pc
            .keys()
            .chain(ps.keys())
            .filter_map(|k| {
                let (c, s) = (
                    pc.get(k).copied().unwrap_or(0),
                    ps.get(k).copied().unwrap_or(0),
                );
                (c != s).then(|| (k.clone(), json!(c as i64 - s as i64)))
            })
            .collect();
        for n in &nodes {
            report.rows.push(Row {
                scenario: format!("cluster {jobs_c}: {}", n["node"].as_str().unwrap_or("?")),
                p50_us: None,
                p99_us: None,
                ops_per_s: None,
                floor_ops_per_s: None,
                ratio: None,
                samples: n["jobs"].as_u64().unwrap_or(0) as usize,
                notes: format!(
                    "{} jobs ({:.1} %), {} cmds; per job it owns: {:.2} cmds + {:.2} \
                     subscriptions, {:.2} reads, {:.0} µs server CPU",
                    n["jobs"],
                    n["job_share"].as_f64().unwrap_or(0.0) * 100.0,
                    n["commands"],
                    n["path_commands_per_job"].as_f64().unwrap_or(f64::NAN),
                    n["subscription_commands_per_job"]
                        .as_f64()
                        .unwrap_or(f64::NAN),
                    n["path_reads_per_job"].as_f64().unwrap_or(f64::NAN),
                    n["cpu_us_per_job"].as_f64().unwrap_or(f64::NAN),
                ),
                extra: n.clone(),
            });
        }
        report.rows.push(Row {
            scenario: format!("cluster {jobs_c}: total"),
            p50_us: c_s.pct(50.0),
            p99_us: c_s.pct(99.0),
            ops_per_s: Some(jobs_c as f64 / c_wall.as_secs_f64()),
            floor_ops_per_s: Some(jobs_c as f64 / s_wall.as_secs_f64()),
            ratio: Some(c_wall.as_secs_f64() / s_wall.as_secs_f64()),
            samples: c_s.len(),
            notes: format!(
                "one job at a time, vs single; on the job's path (subscriptions aside): cmds/job \
                 {:.2} vs {:.2} ({}), reads/job {:.2} vs {:.2} ({}); subscriptions/job {:.2} vs \
                 {:.2}; all commands by name: {}{}",
                ctot["path_commands_per_job"].as_f64().unwrap_or(f64::NAN),
                stot["path_commands_per_job"].as_f64().unwrap_or(f64::NAN),
                if same_cmds { "same" } else { "DIFFER" },
                ctot["path_reads_per_job"].as_f64().unwrap_or(f64::NAN),
                stot["path_reads_per_job"].as_f64().unwrap_or(f64::NAN),
                if same_reads { "same" } else { "DIFFER" },
                ctot["subscription_commands_per_job"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                stot["subscription_commands_per_job"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                if same_by_command {
                    "same (s-pub/sub counted as plain)".to_string()
                } else {
                    format!(
                        "DIFFER, cluster - single: {}",
                        Value::Object(differ.clone())
                    )
                },
                if unplaced > 0 {
                    format!("; {unplaced} jobs on no known primary")
                } else {
                    String::new()
                },
            ),
            extra: json!({
                "single_p50_us": s_s.pct(50.0),
                "cluster_total": ctot,
                "single": stot,
            }),
        });
        report.cluster = json!({
            "jobs": jobs_c,
            "unplaced_jobs": unplaced,
            "nodes": nodes,
            "cluster_total": ctot,
            "single": stot,
            "same_commands": same_cmds,
            "same_reads": same_reads,
            "same_by_command": same_by_command,
            "idle_cpu": idle_cpu,
            "wall_s": {"cluster": c_wall.as_secs_f64(), "single": s_wall.as_secs_f64()},
            "client_cpu_us_per_job": {
                "cluster": clus.last_client_cpu * 1e6 / jobs_c as f64,
                "single": single.last_client_cpu * 1e6 / jobs_c as f64,
            },
            "cluster_minus_single_by_command": differ,
            "concurrent_64": {
                "nodes": b_split,
                "commands": b_cmds,
                "cpu_s": b_cpu,
                "single_commands": sb.nodes.first().map(|n| n.0),
                "single_cpu_s": sb.nodes.first().map(|n| n.1),
            },
        });
        single.client.shutdown(Duration::from_secs(5)).await;
        clus.client.shutdown(Duration::from_secs(5)).await;
        drop(cl);
    }
}
