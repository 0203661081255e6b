//! baton's benchmark: `cargo bench --features testing [-- --quick] [-- --scenario NAME]`.
//!
//! It starts its own private `redis-server`s (loopback, free port, killed on drop), runs each
//! scenario several times against baton and against a *floor* (the same commands in the same
//! round trips on as many connections, hand-written on the `redis` crate: see `floor.rs`),
//! prints a table and writes `target/bench/latest.json`. Nothing here asserts a timing; every
//! figure is computed in the run. See docs/benchmarks.md for what each number means.
//!
//! Scenarios: `roundtrips`, `uncontended`, `concurrent`, `handover`, `takeover`, `idle`;
//! the locks' `lock-uncontended`, `lock-distinct`, `lock-contended`, `redlock` (baton's mutex
//! and Redlock against a hand-written floor and the `rslock` crate: see `locks.rs`); and
//! `cluster` (baton on a 3-primary Redis Cluster against baton on one server, feature `cluster`:
//! see `cluster.rs`); `leader-takeover` and `leader-handover` (baton's leader election against
//! a hand-written floor: see `leader.rs`); `fair-handoff`, `fair-contended` (the fair lock
//! against baton's mutex and a hand-written FIFO floor) and `queue-throughput` (run-or-enqueue
//! against a hand-written drain loop): see `fair.rs`; `pg-job-cycle` and `pg-lock-cycle` (the
//! failover job cycle and the mutex cycle on PostgreSQL against hand-written floors of the same
//! statements, feature `postgres`: see `postgres.rs`); `status-listing` (the operator's listing over
//! 10 000 jobs plus locks and leaders, on one server and a 6-node cluster: see `status.rs`);
//! `metrics-cost` (the uncontended failover and mutex cycles with a metrics recorder installed
//! against without: see `metrics_cost.rs`); `sem-uncontended` and `sem-contended` (the semaphore
//! against a hand-written sorted-set floor: see `semaphore.rs`); `rw-uncontended` and `rw-mix`
//! (the read-write lock beside the mutex: see `rwlock.rs`); and `profile` (only when named: see
//! `profile.rs`).

mod alloc_count;
mod baseline;
mod cluster;
mod fair;
mod floor;
mod harness;
mod holders;
mod leader;
mod locks;
mod metrics_cost;
#[cfg(feature = "postgres")]
mod postgres;
mod profile;
mod redisinfo;
mod rwlock;
mod scenarios;
mod semaphore;
mod stats;
mod status;

use std::time::{SystemTime, UNIX_EPOCH};

use baton::testing::RedisServer;
use serde_json::json;

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

/// Command-line options (cargo adds `--bench`, which is ignored).
#[derive(Debug, Clone)]
pub struct Opts {
    pub quick: bool,
    pub only: Vec<String>,
    /// `profile` only: the sides to run (`baton`, `direct`, `pooled`; all when empty).
    pub sides: Vec<String>,
    /// `profile` only: measured seconds per side.
    pub secs: Option<f64>,
    /// `profile` only: the `MONITOR` round also when sides are named.
    pub monitor: bool,
    /// `--make-baseline FILE...`: write benches/baton/baseline.json from these runs, run nothing.
    pub make_baseline: Vec<String>,
}

fn parse_args() -> Opts {
    let mut opts = Opts {
        quick: false,
        only: Vec::new(),
        sides: Vec::new(),
        secs: None,
        monitor: false,
        make_baseline: Vec::new(),
    };
    let mut args = std::env::args().skip(1).peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--monitor" => opts.monitor = true,
            "--bench" => {}
            "--side" => match args.next() {
                Some(s)
                    if profile::SIDES
                        .iter()
                        .chain(profile::EXTRA_SIDES)
                        .any(|k| *k == s) =>
                {
                    opts.sides.push(s)
                }
                _ => {
                    eprintln!(
                        "--side needs one of {}, {}",
                        profile::SIDES.join(", "),
                        profile::EXTRA_SIDES.join(", ")
                    );
                    std::process::exit(64);
                }
            },
            "--secs" => match args.next().and_then(|s| s.parse().ok()) {
                Some(n) => opts.secs = Some(n),
                None => {
                    eprintln!("--secs needs a number");
                    std::process::exit(64);
                }
            },
            // The files up to the next option: `cargo bench` appends `--bench` after them.
            "--make-baseline" => {
                while let Some(f) = args.next_if(|a| !a.starts_with("--")) {
                    opts.make_baseline.push(f);
                }
            }
            "--scenario" => match args.next() {
                Some(s) => opts.only.push(s),
                None => {
                    eprintln!("--scenario needs a name");
                    std::process::exit(64);
                }
            },
            "-h" | "--help" => {
                println!(
                    "usage: cargo bench --features testing -- [--quick] [--scenario NAME]...\n\
                     \x20      [--side NAME]... [--secs N] [--monitor] (with --scenario profile)\n\
                     \x20      or: -- --make-baseline RUN.json RUN.json RUN.json\n\
                     scenarios: {}; profile (only when named)",
                    scenarios::NAMES.join(", ")
                );
                std::process::exit(0);
            }
            other if other.starts_with('-') => eprintln!("ignoring unknown option {other}"),
            // A positional argument (cargo's bench filter) selects scenarios by name too.
            other => opts.only.push(other.to_string()),
        }
    }
    for name in &opts.only {
        if !scenarios::NAMES.contains(&name.as_str()) && name != "profile" {
            eprintln!(
                "unknown scenario {name}; known: {}",
                scenarios::NAMES.join(", ")
            );
            std::process::exit(64);
        }
    }
    opts
}

/// A fresh private redis-server for one scenario (no persistence: this measures baton, not
/// fsync).
pub fn start_server() -> RedisServer {
    RedisServer::start().expect("start a private redis-server (is redis-server on PATH?)")
}

/// A string that makes this run's job names unique.
pub fn run_id() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{ms}", std::process::id())
}

fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({ "cpu": model, "cpus": cpus, "kernel": kernel })
}

fn out_path() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
            manifest.join("target")
        });
    target.join("bench").join("latest.json")
}

/// Exits when the process that started this one (cargo) is gone: a SIGTERM to `cargo bench`
/// ends cargo but not the bench it runs, which would go on for a minute with nobody to read
/// it. Exiting is enough for cleanup: the fixture's servers die with this process.
fn exit_with_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(250));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("baton bench: the process that started it (pid {parent}) is gone; exiting");
            std::process::exit(143);
        }
    });
}

#[tokio::main]
async fn main() {
    exit_with_parent();
    // Scenario 5's holders run in a process of their own: this binary, re-executed.
    if let Some(args) = holders::child_args() {
        holders::child(args).await;
        return;
    }
    let opts = parse_args();
    if !opts.make_baseline.is_empty() {
        match baseline::make(&opts.make_baseline) {
            Ok(path) => println!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let started = std::time::Instant::now();
    let mut report = harness::Report::default();
    let (version, pool_size) = {
        let server = start_server();
        let client = redis::Client::open(server.url()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        // baton's default pool size, as its `Client`'s Debug output shows it.
        let baton = baton::Client::builder(server.url())
            .connect()
            .await
            .expect("baton connects");
        let debug = format!("{baton:?}");
        let pool_size: Option<u64> = debug
            .split_once("pool_size: ")
            .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
        baton.shutdown(std::time::Duration::from_secs(5)).await;
        (redisinfo::server_version(&mut conn).await, pool_size)
    };
    let mut meta = machine();
    meta["redis_version"] = json!(version);
    meta["baton_pool_size"] = json!(pool_size);
    meta["floor_pool_size"] = json!(harness::POOL);
    meta["quick"] = json!(opts.quick);
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    meta["profile"] = json!(profile);
    if profile == "dev" {
        eprintln!("note: built without optimizations (dev profile): a smoke run, not figures");
    }
    eprintln!(
        "baton bench ({}, {profile}): {} × {}, kernel {}, redis {version}",
        if opts.quick { "quick" } else { "full" },
        meta["cpus"],
        meta["cpu"].as_str().unwrap_or("?"),
        meta["kernel"].as_str().unwrap_or("?"),
    );
    for name in scenarios::NAMES.iter().chain(&["profile"]) {
        let named = opts.only.iter().any(|o| o == name);
        if (!opts.only.is_empty() || *name == "profile") && !named {
            continue;
        }
        let t0 = std::time::Instant::now();
        eprintln!("== {name}");
        scenarios::run(name, &opts, &mut report).await;
        eprintln!("== {name} took {:.1} s", t0.elapsed().as_secs_f64());
    }
    meta["seconds"] = json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    println!();
    println!("{}", stats::table(&report.rows));
    if !report.round_trips.is_empty() {
        println!("{}", scenarios::round_trip_table(&report.round_trips));
    }
    if !report.cluster.is_null() {
        println!("{}", cluster::node_table(&report.cluster));
    }
    let mut doc = json!({
        "meta": meta,
        "results": report.rows.iter().map(stats::Row::to_json).collect::<Vec<_>>(),
        "round_trips": report.round_trips,
        "idle": report.idle,
        "profile": report.profile,
        "cluster": report.cluster,
    });
    // Against the committed figures: worse beyond the noise band is said on stdout and stderr.
    let (lines, comparison) = baseline::compare(&doc);
    if !lines.is_empty() {
        println!("compared with {}:", baseline::path().display());
        for line in &lines {
            println!("  {line}");
        }
        if let Some(last) = lines.last().filter(|l| l.starts_with("!!!")) {
            eprintln!("{last}");
        }
    }
    doc["baseline"] = comparison;
    let path = out_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create target/bench");
    }
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&doc).expect("json") + "\n",
    )
    .expect("write latest.json");
    println!(
        "wrote {} ({:.1} s)",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}
