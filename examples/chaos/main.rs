//! The seeded chaos harness for baton's coordinator (workload W1 of RELIABILITY.md (b)).
//!
//! ```text
//! cargo build --features cli --bin baton   # the `cli` workload (in `quick`) runs it
//! cargo run --example chaos --features testing -- --profile quick [--seed N] [--seconds T]
//! cargo run --example chaos --features testing,cluster -- --profile cluster [--seed N]
//! cargo run --example chaos --features testing,postgres -- --profile postgres [--seed N]
//! ```
//!
//! The control process starts a durable, password-protected `redis-server`, a fault proxy per
//! worker, a fenced resource server and 4 worker processes (this example re-executed with
//! `--worker i`), then runs a seeded nemesis, heals, waits for quiescence and checks the logs.
//! Profile `quick` runs the main phase and both negative controls, then the mutex workload
//! (`mutex`: holders paused past the lease, Redis paused and restarted, links cut; its negative
//! control `control-mutex-fencing-off`; `mutex-volatile`: Redis restarted without persistence);
//! `controls` only the controls, `mutex` only the mutex phases. Then the leader-election workload
//! (`leader`: candidates in the worker form on 3 elections, each term's work writing
//! BEGIN/COMMIT pairs fenced by the term, then resigning; leaders paused past their lease,
//! Redis paused and restarted, links cut; and its control `control-leader-fencing-off`);
//! profile `leader` runs only those. Then the fair-lock workload (`fair`: tasks taking 3 fair
//! locks with the watchdog, one acquisition in six through the priority reservation, writing
//! BEGIN/COMMIT pairs fenced by the fencing token; holders and reservers paused past their lease
//! or the reservation's lifetime, workers killed, Redis paused and restarted, links cut; M7 wants
//! every lock granted again soon after the heal; and its control `control-fair-fencing-off`);
//! profile `fair` runs only those. Then the CLI workload (`cli`, examples/chaos/cli.rs: 20 s of
//! jobs each run by 3 or 4 `baton run` processes through their own fault proxies, 1 s leases;
//! a worker's stderr stalled, `baton` (not PROGRAM) frozen past its lease, link blips between a
//! backup and the server; no two PROGRAMs of one job may overlap by their own timestamps and
//! every job must end DONE or EXHAUSTED; and its control `control-cli-setsid`, whose PROGRAM's
//! work escapes its group so the overlap check must flag it); profile `cli` runs only those. It
//! runs the `baton` binary next to this example's (`target/<profile>/baton`), which `cargo run
//! --example` does not build: `cargo build --all-features --bin baton` first.
//! Profile `schedule` runs the scheduling workload (examples/chaos/sched.rs: `--seconds`, 20 by
//! default, of three schedules at 2–5 s periods, each run by a `baton schedule` process on
//! every one of 3 or 4 workers, the same binary; processes frozen past their lease, killed and
//! restarted, their stderr stalled, their worker's link cut, Redis paused; no occurrence's
//! PROGRAMs overlap or complete twice, none starts before its tick by the server's clock, every
//! tick a live process witnessed ends DONE or EXHAUSTED; and its control
//! `control-schedule-prefix`, one worker under another `--prefix`, which S1 must flag).
//! Profile `semaphore` runs the semaphore workload (examples/chaos/semaphore.rs: 12 tasks on one
//! semaphore of 3 permits with the watchdog, BEGIN/COMMIT fenced per slot; the mutex workload's
//! faults for 15 s; no fourth holder at the resource (S1), no slot at or above the limit (S2);
//! its control `control-semaphore-fencing-off`; `semaphore-volatile`: Redis restarted without
//! persistence, each slot's later tokens above its earlier ones). Profile `rw` runs the
//! read-write lock workload (examples/chaos/rw.rs: readers, writers and an upgradeable reader
//! that upgrades and downgrades, on two locks, the same faults for 15 s; no writer beside
//! another holder at the resource (C1), reads see their read token's committed write (R2); its
//! control `control-rw-fencing-off`). Neither is in `quick`.
//! `failover` runs only the main phase and its two controls, and
//! a list (`failover,mutex`, `leader,fair,cli`) runs each listed workload's phases: `quick` is
//! `failover,mutex,leader,fair,cli` (not `schedule`). Profile `cluster` (needs
//! `--features testing,cluster`) runs the failover workload against a six-node Redis Cluster
//! (3 primaries, 3 replicas, node timeout 1 s; workers use `replica_ack(1, …)`) for 25 s of
//! primary kills (replica promoted, the old primary restarted as a replica), primary pauses
//! below the node timeout, reshards of a running job's slot, per-node link faults (each node
//! announces its proxy's port with `cluster-announce-port`) and worker pauses and kills, then
//! its two controls on fresh clusters (fencing off; one shard restarted without its data), then
//! the CLI workload against a fresh cluster (`cluster-cli`: stalls and freezes; the nodes'
//! proxies are shared, so no per-process link blips).
//! Profile `postgres` (needs `--features testing,postgres`) runs the failover workload, fenced,
//! with the same checker against a durable PostgreSQL (`PgServer::start_durable`, fsync on),
//! each worker connecting with a `postgres://` URL through its fault proxy (60 jobs, 25 s of
//! chaos; `--seconds` and `--jobs` override): the worker lane as in `quick`, a PostgreSQL lane
//! (`pg_terminate_backend` on every `baton` session, immediate-shutdown crash down 0.5–3 s then
//! restarted, postmaster and backends SIGSTOPped 0.3–3 s, a lease clock jump moving every
//! `lease_expires` 0.5–2 leases back) and holder pauses; then its controls on fresh servers
//! (`control-postgres-fencing-off`: C1 must flag; `control-postgres-volatile`: every job row
//! truncated after a crash-restart, worker 0 restarted: C3/C4 or a StateLost event must show
//! it). The owner migrates once and the workers log in as a role that may only read and write
//! baton's tables, the counterpart of the Redis profiles' least-privilege ACL user (in
//! `postgres-locks` too). About 75 s in all. Profile
//! `postgres-locks` (same feature; not in CI) runs the mutex and the leader-election workloads
//! the same way against a durable PostgreSQL, their locks rows of `baton_locks` (20 s of chaos
//! each; `--seconds` overrides): the worker lane, the PostgreSQL lane without the lease clock
//! jump (it moves every lease at once, like `ttl_shrink`, which the Redis lock phases go
//! without too) and two lanes of holder pauses; then both workloads' fencing-off controls. Logs and
//! `report.json` go to
//! `target/chaos/<seed>/<profile>/` (a list's commas become `+`). The seed also comes from `CHAOS_SEED`. The last line is `chaos: N passed, N failed`; the exit code is non-zero when
//! anything failed.

mod checker;
mod cli;
mod cluster;
mod control;
mod fleet;
mod nemesis;
mod pg;
mod proxy;
mod resource;
mod rw;
mod sched;
mod semaphore;
mod util;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use control::PhaseCfg;
use nemesis::Kind;
use util::{mix, BoxError};
use worker::Workload;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chaos: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if args.iter().any(|a| a == "--worker") {
        let res = worker::WorkerArgs::parse(&args);
        return match res {
            Ok(wa) => match rt.block_on(worker::run(wa)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("chaos worker: {e}");
                    ExitCode::from(1)
                }
            },
            Err(e) => {
                eprintln!("chaos worker: bad arguments: {e}");
                ExitCode::from(2)
            }
        };
    }
    match rt.block_on(control_main(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

async fn control_main(args: &[String]) -> Result<bool, BoxError> {
    let profile = flag(args, "--profile").unwrap_or_else(|| "quick".into());
    let seed: u64 = match flag(args, "--seed").or_else(|| std::env::var("CHAOS_SEED").ok()) {
        Some(s) => s.parse()?,
        None => (util::mono_ns() ^ u64::from(std::process::id())) % 10_000_000_000,
    };
    let seconds: f64 = match flag(args, "--seconds") {
        Some(s) => s.parse()?,
        None => 60.0,
    };
    let jobs: usize = match flag(args, "--jobs") {
        Some(s) => s.parse()?,
        None => 120,
    };
    println!(
        "chaos: seed {seed} profile {profile} (rerun with --seed {seed} or CHAOS_SEED={seed})"
    );
    // A list of workloads (`failover,mutex`) runs each one's phases; `quick` is all five.
    let exclusive = ["controls", "cluster", "postgres", "postgres-locks"];
    let mut workloads: Vec<&str> = Vec::new();
    if !exclusive.contains(&profile.as_str()) {
        for p in profile.split(',') {
            match p {
                "quick" => workloads.extend(["failover", "mutex", "leader", "fair", "cli"]),
                "failover" | "mutex" | "leader" | "fair" | "cli" | "schedule" | "semaphore"
                | "rw" => workloads.push(p),
                _ => {
                    return Err(format!(
                        "unknown profile {p} (quick, failover, mutex, leader, fair, cli, \
                         schedule, semaphore, rw or a list of them such as failover,mutex; \
                         controls, cluster, postgres, postgres-locks alone)"
                    )
                    .into())
                }
            }
        }
    }
    let has = |w: &str| workloads.contains(&w);
    // Per seed and profile: profiles run at once with one seed (as CI does) keep apart.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("chaos")
        .join(seed.to_string())
        .join(profile.replace(',', "+"));
    std::fs::create_dir_all(&root)?;
    // The canary password: never printed, never logged; C8 greps every log for it.
    let canary = format!("canary-{:016x}", mix(&[seed, 0xC8]));

    let mut phases = Vec::new();
    if has("failover") {
        phases.push(PhaseCfg {
            name: "main".into(),
            jobs,
            warmup_s: 3.0,
            chaos_s: seconds,
            fenced: true,
            // The third lane only pauses holders mid-write (F1): each such pause makes the
            // holder's COMMIT stale, so every run proves the resource's fencing check bites.
            lanes: vec![
                Kind::WORKER_LANE.to_vec(),
                Kind::SERVER_LANE.to_vec(),
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed,
            quiesce_bound_s: 30.0,
            workload: Workload::Failover,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    } else if profile == "cluster" {
        if !cfg!(feature = "cluster") {
            return Err(
                "profile cluster needs baton's `cluster` feature: cargo run --example \
                chaos --features testing,cluster -- --profile cluster"
                    .into(),
            );
        }
        // The same workload and checker against a 6-node Redis Cluster: primaries killed (and
        // failed over, then restarted as replicas), paused below the node timeout or until their
        // replica is promoted (then resumed: they come back as replicas), job slots
        // resharded mid-run; worker pauses and kills as in `quick`. No proxies (a cluster client
        // follows the nodes' own addresses), so no link faults.
        phases.push(PhaseCfg {
            name: "cluster".into(),
            jobs: flag(args, "--jobs").map_or(Ok(60), |j| j.parse())?,
            warmup_s: 3.0,
            chaos_s: flag(args, "--seconds").map_or(Ok(25.0), |s| s.parse())?,
            fenced: true,
            lanes: vec![
                Kind::CLUSTER_WORKER_LANE.to_vec(),
                Kind::CLUSTER_LANE.to_vec(),
                Kind::CLUSTER_NET_LANE.to_vec(),
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed,
            quiesce_bound_s: 30.0,
            workload: Workload::Failover,
            cluster: true,
            // A killed primary's replica is promoted 1–3 s after the kill (node timeout 1 s, then
            // the election), and clients find it at their next slot-map read: 3 s more.
            liveness_extra_ms: 3_000,
            postgres: false,
        });
    } else if profile == "postgres" {
        if !cfg!(feature = "postgres") {
            return Err(
                "profile postgres needs baton's `postgres` feature: cargo run --example \
                chaos --features testing,postgres -- --profile postgres"
                    .into(),
            );
        }
        // The failover workload against a durable PostgreSQL (fsync on), each worker through its
        // fault proxy: the worker lane as in `quick`, PostgreSQL's server faults (backend kill,
        // crash-restart, postmaster and backends paused, lease clock jump), holder pauses.
        phases.push(PhaseCfg {
            name: "postgres".into(),
            jobs: flag(args, "--jobs").map_or(Ok(60), |j| j.parse())?,
            warmup_s: 3.0,
            chaos_s: flag(args, "--seconds").map_or(Ok(25.0), |s| s.parse())?,
            fenced: true,
            lanes: vec![
                Kind::WORKER_LANE.to_vec(),
                Kind::PG_SERVER_LANE.to_vec(),
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed,
            quiesce_bound_s: 30.0,
            workload: Workload::Failover,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: true,
        });
        // Its controls, as on Redis: the resource ignores tokens while holders are paused past
        // their lease (C1 must flag it); the server loses every job row mid-phase and worker 0
        // is restarted (C3/C4 or a StateLost event must show it).
        phases.push(PhaseCfg {
            name: "control-postgres-fencing-off".into(),
            jobs: 30,
            warmup_s: 1.0,
            chaos_s: 12.0,
            fenced: false,
            lanes: vec![vec![Kind::PauseWorker]],
            volatile_restart_at: None,
            seed: mix(&[seed, 0x9A]),
            quiesce_bound_s: 20.0,
            workload: Workload::Failover,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: true,
        });
        phases.push(PhaseCfg {
            name: "control-postgres-volatile".into(),
            jobs: 30,
            warmup_s: 1.0,
            chaos_s: 12.0,
            fenced: true,
            lanes: vec![],
            volatile_restart_at: Some(6.0),
            seed: mix(&[seed, 0x9B]),
            quiesce_bound_s: 20.0,
            workload: Workload::Failover,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: true,
        });
    } else if profile == "postgres-locks" {
        if !cfg!(feature = "postgres") {
            return Err(
                "profile postgres-locks needs baton's `postgres` feature: cargo run --example \
                chaos --features testing,postgres -- --profile postgres-locks"
                    .into(),
            );
        }
        // The mutex and leader-election workloads against a durable PostgreSQL (their locks
        // rows of `baton_locks`), each worker through its fault proxy: the worker lane,
        // PostgreSQL's server faults but the lease clock jump (it moves every lease at once,
        // as ttl_shrink does on Redis, which these workloads go without too), holders paused
        // past their lease (their spawned commits land late and must be refused); then both
        // fencing-off controls (C1 must flag).
        let pg_lane: Vec<Kind> = Kind::PG_SERVER_LANE
            .iter()
            .copied()
            .filter(|k| *k != Kind::LeaseJump)
            .collect();
        let chaos_s = flag(args, "--seconds").map_or(Ok(20.0), |s| s.parse())?;
        for (name, workload, tag) in [
            ("postgres-mutex", Workload::Mutex, 0x9C),
            ("postgres-leader", Workload::Leader, 0x9D),
        ] {
            phases.push(PhaseCfg {
                name: name.into(),
                jobs: 0,
                warmup_s: 2.0,
                chaos_s,
                fenced: true,
                lanes: vec![
                    Kind::WORKER_LANE.to_vec(),
                    pg_lane.clone(),
                    vec![Kind::PauseWorker],
                    vec![Kind::PauseWorker],
                ],
                volatile_restart_at: None,
                seed: mix(&[seed, tag]),
                quiesce_bound_s: 20.0,
                workload,
                cluster: false,
                liveness_extra_ms: 0,
                postgres: true,
            });
        }
        for (name, workload, tag) in [
            ("control-postgres-mutex-fencing-off", Workload::Mutex, 0x9E),
            (
                "control-postgres-leader-fencing-off",
                Workload::Leader,
                0x9F,
            ),
        ] {
            phases.push(PhaseCfg {
                name: name.into(),
                jobs: 0,
                warmup_s: 1.0,
                chaos_s: 12.0,
                fenced: false,
                lanes: vec![vec![Kind::PauseWorker], vec![Kind::PauseWorker]],
                volatile_restart_at: None,
                seed: mix(&[seed, tag]),
                quiesce_bound_s: 20.0,
                workload,
                cluster: false,
                liveness_extra_ms: 0,
                postgres: true,
            });
        }
    }
    if profile == "cluster" {
        // The negative control on the cluster: the resource ignores tokens, holders are paused
        // past their lease, and C1 must flag it.
        phases.push(PhaseCfg {
            name: "control-cluster-fencing-off".into(),
            jobs: 30,
            warmup_s: 1.0,
            chaos_s: 12.0,
            fenced: false,
            lanes: vec![vec![Kind::PauseWorker]],
            volatile_restart_at: None,
            seed: mix(&[seed, 0xC1]),
            quiesce_bound_s: 20.0,
            workload: Workload::Failover,
            cluster: true,
            liveness_extra_ms: 3_000,
            postgres: false,
        });
        // The volatile control on the cluster: the shard of job 0 loses its data mid-phase
        // (primary and replica restarted empty), then worker 0 is restarted; C3/C4 or a
        // StateLost event must show it.
        phases.push(PhaseCfg {
            name: "control-cluster-volatile".into(),
            jobs: 30,
            warmup_s: 1.0,
            chaos_s: 12.0,
            fenced: true,
            lanes: vec![],
            volatile_restart_at: Some(6.0),
            seed: mix(&[seed, 0xC2]),
            quiesce_bound_s: 20.0,
            workload: Workload::Failover,
            cluster: true,
            liveness_extra_ms: 3_000,
            postgres: false,
        });
    }
    phases.push(PhaseCfg {
        name: "control-fencing-off".into(),
        jobs: 30,
        warmup_s: 1.0,
        chaos_s: 15.0,
        fenced: false,
        lanes: vec![vec![Kind::PauseWorker]],
        volatile_restart_at: None,
        seed: mix(&[seed, 0xA]),
        quiesce_bound_s: 20.0,
        workload: Workload::Failover,
        cluster: false,
        liveness_extra_ms: 0,
        postgres: false,
    });
    phases.push(PhaseCfg {
        name: "control-volatile".into(),
        jobs: 30,
        warmup_s: 1.0,
        chaos_s: 15.0,
        fenced: true,
        lanes: vec![],
        volatile_restart_at: Some(7.0),
        seed: mix(&[seed, 0xB]),
        quiesce_bound_s: 20.0,
        workload: Workload::Failover,
        cluster: false,
        liveness_extra_ms: 0,
        postgres: false,
    });
    let mutex_phases = has("mutex");
    if mutex_phases {
        // The mutex workload: holders paused past the lease, Redis paused and crash-restarted,
        // links cut. ttl_shrink only touches failover leases, so the server lane goes without.
        phases.push(PhaseCfg {
            name: "mutex".into(),
            jobs: 0,
            warmup_s: 2.0,
            chaos_s: 22.0,
            fenced: true,
            // Two lanes only pause holders: a holder paused past its lease whose work went on
            // in a spawned task commits late, and that COMMIT must be rejected as stale (C1s).
            lanes: vec![
                Kind::WORKER_LANE.to_vec(),
                Kind::SERVER_LANE
                    .iter()
                    .copied()
                    .filter(|k| *k != Kind::TtlShrink)
                    .collect(),
                vec![Kind::PauseWorker],
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed: mix(&[seed, 0xD]),
            quiesce_bound_s: 20.0,
            workload: Workload::Mutex,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }
    phases.push(PhaseCfg {
        name: "control-mutex-fencing-off".into(),
        jobs: 0,
        warmup_s: 1.0,
        chaos_s: 12.0,
        fenced: false,
        lanes: vec![vec![Kind::PauseWorker]],
        volatile_restart_at: None,
        seed: mix(&[seed, 0xE]),
        quiesce_bound_s: 20.0,
        workload: Workload::Mutex,
        cluster: false,
        liveness_extra_ms: 0,
        postgres: false,
    });
    if mutex_phases {
        // Redis restarted without persistence mid-phase: the fence is gone, yet every later
        // token must be above every earlier one (server time), so nothing stale is accepted.
        phases.push(PhaseCfg {
            name: "mutex-volatile".into(),
            jobs: 0,
            warmup_s: 1.0,
            chaos_s: 6.0,
            fenced: true,
            lanes: vec![],
            volatile_restart_at: Some(3.0),
            seed: mix(&[seed, 0xF]),
            quiesce_bound_s: 20.0,
            workload: Workload::Mutex,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }

    let leader_phases = has("leader");
    if leader_phases {
        // Leader election: candidates paused past their lease (a paused leader's spawned
        // commit lands late and must be refused by its term), Redis paused and crash-restarted,
        // links cut; then its fencing-off control.
        phases.push(PhaseCfg {
            name: "leader".into(),
            jobs: 0,
            warmup_s: 2.0,
            chaos_s: 15.0,
            fenced: true,
            lanes: vec![
                Kind::WORKER_LANE.to_vec(),
                Kind::SERVER_LANE
                    .iter()
                    .copied()
                    .filter(|k| *k != Kind::TtlShrink)
                    .collect(),
                vec![Kind::PauseWorker],
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed: mix(&[seed, 0x1E]),
            quiesce_bound_s: 20.0,
            workload: Workload::Leader,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }
    if leader_phases || profile == "controls" {
        phases.push(PhaseCfg {
            name: "control-leader-fencing-off".into(),
            jobs: 0,
            warmup_s: 1.0,
            chaos_s: 10.0,
            fenced: false,
            lanes: vec![vec![Kind::PauseWorker], vec![Kind::PauseWorker]],
            volatile_restart_at: None,
            seed: mix(&[seed, 0x1F]),
            quiesce_bound_s: 20.0,
            workload: Workload::Leader,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }
    let fair_phases = has("fair");
    if fair_phases {
        // The fair lock: holders (and reservers, one acquisition in six) paused past their
        // lease or the reservation's lifetime, killed, cut off; Redis paused and crash-restarted.
        // A paused holder's spawned commit lands late and must be refused by its fencing token;
        // every lock must be granted again soon after the heal (M7, per lock).
        phases.push(PhaseCfg {
            name: "fair".into(),
            jobs: 0,
            warmup_s: 2.0,
            chaos_s: 15.0,
            fenced: true,
            lanes: vec![
                Kind::WORKER_LANE.to_vec(),
                Kind::SERVER_LANE
                    .iter()
                    .copied()
                    .filter(|k| *k != Kind::TtlShrink)
                    .collect(),
                vec![Kind::PauseWorker],
                vec![Kind::PauseWorker],
            ],
            volatile_restart_at: None,
            seed: mix(&[seed, 0xFA]),
            quiesce_bound_s: 20.0,
            workload: Workload::Fair,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }
    if fair_phases || profile == "controls" {
        phases.push(PhaseCfg {
            name: "control-fair-fencing-off".into(),
            jobs: 0,
            warmup_s: 1.0,
            chaos_s: 10.0,
            fenced: false,
            lanes: vec![vec![Kind::PauseWorker], vec![Kind::PauseWorker]],
            volatile_restart_at: None,
            seed: mix(&[seed, 0xFB]),
            quiesce_bound_s: 20.0,
            workload: Workload::Fair,
            cluster: false,
            liveness_extra_ms: 0,
            postgres: false,
        });
    }
    // The semaphore (semaphore.rs) and the read-write lock (rw.rs): the mutex workload's faults
    // (holders paused past their lease, workers killed, links cut, Redis paused and
    // crash-restarted); then each one's fencing-off control, and the semaphore's volatile
    // restart (every slot's fence lost: each slot's later tokens must still be above its
    // earlier ones, M3).
    let lock_lanes = || {
        vec![
            Kind::WORKER_LANE.to_vec(),
            Kind::SERVER_LANE
                .iter()
                .copied()
                .filter(|k| *k != Kind::TtlShrink)
                .collect(),
            vec![Kind::PauseWorker],
            vec![Kind::PauseWorker],
        ]
    };
    for (workload, tag) in [(Workload::Semaphore, 0x5E0), (Workload::Rw, 0x5E8)] {
        let name = workload.name();
        if has(name) {
            let mut lanes = lock_lanes();
            if workload == Workload::Rw {
                // A third lane of holder pauses: fewer holds reach the resource (writers wait
                // for readers), and C1s wants a stale op refused every run.
                lanes.push(vec![Kind::PauseWorker]);
            }
            phases.push(PhaseCfg {
                name: name.into(),
                jobs: 0,
                warmup_s: 2.0,
                chaos_s: 15.0,
                fenced: true,
                lanes,
                volatile_restart_at: None,
                seed: mix(&[seed, tag]),
                quiesce_bound_s: 20.0,
                workload,
                cluster: false,
                liveness_extra_ms: 0,
                postgres: false,
            });
        }
        if has(name) || profile == "controls" {
            phases.push(PhaseCfg {
                name: format!("control-{name}-fencing-off"),
                jobs: 0,
                warmup_s: 1.0,
                chaos_s: 10.0,
                fenced: false,
                lanes: vec![vec![Kind::PauseWorker], vec![Kind::PauseWorker]],
                volatile_restart_at: None,
                seed: mix(&[seed, tag + 1]),
                quiesce_bound_s: 20.0,
                workload,
                cluster: false,
                liveness_extra_ms: 0,
                postgres: false,
            });
        }
        if has(name) && workload == Workload::Semaphore {
            phases.push(PhaseCfg {
                name: "semaphore-volatile".into(),
                jobs: 0,
                warmup_s: 1.0,
                chaos_s: 6.0,
                fenced: true,
                lanes: vec![],
                volatile_restart_at: Some(3.0),
                seed: mix(&[seed, tag + 2]),
                quiesce_bound_s: 20.0,
                workload,
                cluster: false,
                liveness_extra_ms: 0,
                postgres: false,
            });
        }
    }
    if !workloads.is_empty() {
        phases.retain(|p| !p.cluster && !p.postgres && has(p.workload.name()));
    }
    if profile == "cluster" {
        phases.retain(|p| p.cluster);
    }
    if profile == "postgres" || profile == "postgres-locks" {
        phases.retain(|p| p.postgres);
    }
    let t_start = std::time::Instant::now();
    let mut lines: Vec<(String, bool, String)> = Vec::new();
    let mut report = json!({"seed": seed, "profile": profile, "workers": worker::WORKERS,
        "phases": {}, "controls": {}, "violations": {}});
    for cfg in phases {
        let name = cfg.name.clone();
        let chaos_s = cfg.chaos_s;
        let workload = cfg.workload;
        let is_cluster = cfg.cluster;
        let is_pg = cfg.postgres;
        println!(
            "chaos: phase {name}: {} jobs, {}s chaos",
            cfg.jobs, cfg.chaos_s
        );
        let res = match control::run_phase(cfg, &root, &canary).await {
            Ok(res) => res,
            Err(e) => {
                println!("chaos: phase {name} could not run: {e}");
                report["phases"][&name] = json!({"error": e.to_string()});
                lines.push((format!("phase {name} ran"), false, e.to_string()));
                continue;
            }
        };
        let an = checker::check(&res, &canary);
        report["phases"][&name] = phase_json(&an);
        if name == "main" || name == "cluster" || name == "postgres" {
            // The density the quick profile promises: at least 40 faults of at least 10 kinds in
            // its 60 s (shorter runs are scaled down and only need every kind once per lane).
            // The cluster profile: at least 10 faults in 25 s (scaled), and with 25 s or more
            // all eight kinds (primary kill, primary pause, reshard, node partition, latency and
            // reset, worker pause and kill).
            let faults = &an.stats["faults"];
            let total = faults["total"].as_u64().unwrap_or(0);
            let kinds = faults.as_object().map_or(0, |o| {
                o.iter()
                    .filter(|(k, v)| *k != "total" && v.as_u64() > Some(0))
                    .count()
            });
            let (want_total, want_kinds) = if is_pg {
                // The postgres profile: at least 10 faults in 25 s (scaled), and with 25 s or
                // more 6 kinds (the four PostgreSQL kinds are one lane's, so all of them
                // show up in 25 s; holder pauses; one worker-lane kind at least).
                (
                    (10.0 * (chaos_s / 25.0).min(1.0)).floor() as u64,
                    if chaos_s >= 25.0 { 6 } else { 1 },
                )
            } else if is_cluster {
                (
                    (10.0 * (chaos_s / 25.0).min(1.0)).floor() as u64,
                    if chaos_s >= 25.0 { 8 } else { 1 },
                )
            } else {
                (
                    (40.0 * (chaos_s / 60.0).min(1.0)).floor() as u64,
                    if chaos_s >= 60.0 { 10 } else { 1 },
                )
            };
            lines.push((
                "faults injected".into(),
                total >= want_total && kinds >= want_kinds,
                format!("{total} faults of {kinds} kinds (required: {want_total} of {want_kinds})"),
            ));
            // C1d, the diagnostic: holder pauses must make two workers *believe* they hold one
            // job at once (otherwise the faults did not bite and C1 proved nothing).
            let pairs = an.stats["belief_overlaps"]["pairs"].as_u64().unwrap_or(0);
            lines.push((
                "C1d overlapping lease beliefs (> 0 expected under F1)".into(),
                pairs > 0,
                format!(
                    "{pairs} overlapping pair(s), {} ms in all",
                    an.stats["belief_overlaps"]["total_ms"]
                ),
            ));
            for inv in &an.invs {
                report["violations"][inv.id] = json!(inv.violations);
                lines.push((
                    format!("{} {}", inv.id, inv.name),
                    inv.pass,
                    format!("{} violation(s); {}", inv.violations, inv.note),
                ));
                for ex in &inv.examples {
                    println!("    {} example: {ex}", inv.id);
                }
            }
            for k in [
                "ops",
                "faults",
                "jobs",
                "fencing",
                "belief_overlaps",
                "liveness",
                "errors_by_kind",
                "errors_surfaced",
            ] {
                report[k] = an.stats[k].clone();
            }
            report["duration_s"] = an.stats["duration_s"].clone();
        } else if workload != Workload::Failover && !name.starts_with("control-") {
            let st = &an.stats;
            println!(
                "chaos: {name}: faults {} grants {} stale_rejected {} stale_accepted {} liveness {}",
                st["faults"], st["ops"]["grants"], st["fencing"]["stale_rejected"],
                st["fencing"]["stale_accepted"], st["liveness"]
            );
            if workload == Workload::Fair {
                println!("chaos: {name}: reservations {}", st["reservations"]);
            }
            for inv in &an.invs {
                report["violations"][format!("{name}/{}", inv.id)] = json!(inv.violations);
                lines.push((
                    format!("{name} {} {}", inv.id, inv.name),
                    inv.pass,
                    format!("{} violation(s); {}", inv.violations, inv.note),
                ));
                for ex in &inv.examples {
                    println!("    {name} {} example: {ex}", inv.id);
                }
            }
        } else {
            let (pass, note) = control_verdict(&name, &an);
            report["controls"][&name] = json!({"pass": pass, "note": note});
            lines.push((format!("control {name}"), pass, note));
        }
    }
    // The CLI workload (cli.rs): `baton run` processes under their host's faults, then its
    // control; on the cluster profile, the same fleet against the cluster (stalls and freezes).
    let mut cli_phases = Vec::new();
    if has("cli") {
        cli_phases.push(cli::CliCfg {
            name: "cli".into(),
            seed: mix(&[seed, 0xC1C]),
            chaos_s: 20.0,
            control: false,
            cluster: false,
        });
        cli_phases.push(cli::CliCfg {
            name: "control-cli-setsid".into(),
            seed: mix(&[seed, 0xC1D]),
            chaos_s: 8.0,
            control: true,
            cluster: false,
        });
    }
    if profile == "cluster" {
        cli_phases.push(cli::CliCfg {
            name: "cluster-cli".into(),
            seed: mix(&[seed, 0xC1E]),
            chaos_s: 15.0,
            control: false,
            cluster: true,
        });
    }
    for cfg in cli_phases {
        let name = cfg.name.clone();
        println!(
            "chaos: phase {name}: baton run fleet, {}s chaos",
            cfg.chaos_s
        );
        match cli::run_phase(cfg, &root, &canary).await {
            Ok(res) => {
                let (phase_lines, stats) = cli::check(&res);
                for l in &phase_lines {
                    if l.0.starts_with("control ") {
                        report["controls"][&name] = json!({"pass": l.1, "note": l.2});
                    } else if let Some(id) = l.0.split_whitespace().nth(1) {
                        // Each check's note starts with its count of violations.
                        let n =
                            l.2.split_whitespace()
                                .next()
                                .and_then(|n| n.parse::<u64>().ok());
                        if let Some(n) = n {
                            report["violations"][format!("{name}/{id}")] = json!(n);
                        }
                    }
                }
                report["phases"][&name] = stats;
                lines.extend(phase_lines);
            }
            Err(e) => {
                println!("chaos: phase {name} could not run: {e}");
                report["phases"][&name] = json!({"error": e.to_string()});
                lines.push((format!("phase {name} ran"), false, e.to_string()));
            }
        }
    }
    // The scheduling workload (sched.rs): `baton schedule` fleets under their hosts' faults and
    // server pauses, then its control. Alone (`--profile schedule`), --seconds sets its length.
    if has("schedule") {
        let chaos_s = if profile == "schedule" {
            flag(args, "--seconds").map_or(Ok(20.0), |s| s.parse())?
        } else {
            20.0
        };
        let phases = [
            sched::SchedCfg {
                name: "schedule".into(),
                seed: mix(&[seed, 0x5C4]),
                chaos_s,
                control: false,
            },
            sched::SchedCfg {
                name: "control-schedule-prefix".into(),
                seed: mix(&[seed, 0x5C5]),
                chaos_s: 7.0,
                control: true,
            },
        ];
        for cfg in phases {
            let name = cfg.name.clone();
            println!(
                "chaos: phase {name}: baton schedule fleet, {}s chaos",
                cfg.chaos_s
            );
            match sched::run_phase(cfg, &root, &canary).await {
                Ok(res) => {
                    let (phase_lines, stats) = sched::check(&res);
                    for l in &phase_lines {
                        if l.0.starts_with("control ") {
                            report["controls"][&name] = json!({"pass": l.1, "note": l.2});
                        } else if let Some(id) = l.0.split_whitespace().nth(1) {
                            let n =
                                l.2.split_whitespace()
                                    .next()
                                    .and_then(|n| n.parse::<u64>().ok());
                            if let Some(n) = n {
                                report["violations"][format!("{name}/{id}")] = json!(n);
                            }
                        }
                    }
                    report["phases"][&name] = stats;
                    lines.extend(phase_lines);
                }
                Err(e) => {
                    println!("chaos: phase {name} could not run: {e}");
                    report["phases"][&name] = json!({"error": e.to_string()});
                    lines.push((format!("phase {name} ran"), false, e.to_string()));
                }
            }
        }
    }
    report["wall_s"] = json!(t_start.elapsed().as_secs_f64());
    let passed = lines.iter().filter(|l| l.1).count();
    let failed = lines.len() - passed;
    report["summary"] = json!({"passed": passed, "failed": failed});
    let path = root.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("chaos: report {}", path.display());
    // The failover main phase's summary (the `mutex` profile has none; its phases print their
    // own lines above).
    if !report["jobs"].is_null() {
        println!(
            "chaos: faults {} jobs {} stale_rejected {} liveness {}",
            report["faults"],
            report["jobs"],
            report["fencing"]["stale_rejected"],
            report["liveness"]
        );
    }
    for (name, pass, note) in &lines {
        println!("  {} {name}: {note}", if *pass { "PASS" } else { "FAIL" });
    }
    println!("chaos: {passed} passed, {failed} failed");
    Ok(failed == 0)
}

fn phase_json(an: &checker::Analysis) -> Value {
    let mut v = an.stats.clone();
    v["invariants"] = json!(an.invs);
    v
}

/// A negative control passes when the checker flags what the control broke.
fn control_verdict(name: &str, an: &checker::Analysis) -> (bool, String) {
    let n = |id: &str| an.get(id).map_or(0, |i| i.violations);
    if name.ends_with("fencing-off") {
        // The semaphore's S1 (a fourth holder) counts as C1 does.
        let c1 = n("C1") + n("S1");
        let accepted = an.stats["fencing"]["stale_accepted"].as_u64().unwrap_or(0);
        let pauses = an.stats["faults"]["pause_worker"].as_u64().unwrap_or(0);
        if c1 > 0 {
            (true, format!("bit: C1 flagged {c1} violation(s) ({accepted} stale writes accepted, {pauses} holder pauses)"))
        } else {
            (false, format!("did not bite: C1 flagged nothing ({pauses} pauses, {accepted} stale writes accepted)"))
        }
    } else {
        let (c3, c4) = (n("C3"), n("C4"));
        if c3 + c4 > 0 {
            (
                true,
                format!(
                    "bit: C3 flagged {c3}, C4 flagged {c4} violation(s); {} StateLost event(s)",
                    an.state_lost_events
                ),
            )
        } else if an.state_lost_events > 0 {
            (
                true,
                format!(
                    "recorded: no re-run, {} StateLost event(s) reported",
                    an.state_lost_events
                ),
            )
        } else {
            (
                false,
                "did not bite: no C3/C4 violation and no StateLost event".into(),
            )
        }
    }
}
