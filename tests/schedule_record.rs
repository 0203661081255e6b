//! The schedule's record on real servers: what workers write on their grants and attempt
//! ends, what readers get back (history, hosts, repair), the pause, and the key layout.
#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, SystemTime};

use baton::{
    AttemptOutcome, AttemptRecord, Exit, FailoverConfig, RecordChange, RecordOptions,
    RecordedOutcome, Schedule,
};
use common::*;

const HOUR: Duration = Duration::from_secs(3600);

fn occurrence_config(
    key: &str,
    worker: &str,
    schedule: &Schedule,
    tick: SystemTime,
) -> FailoverConfig {
    let base = FailoverConfig::builder(key)
        .lease(Duration::from_secs(10))
        .max_attempts(3)
        .worker_name(worker)
        .build()
        .unwrap();
    let occ = schedule.occurrence_of_tick(tick).unwrap();
    base.for_occurrence(&occ, None).unwrap().with_record(
        key,
        schedule,
        tick,
        RecordOptions::default().history(5),
    )
}

/// A night with a failed attempt then a takeover by a second worker: both attempts on
/// record, with hosts, server-clock times and exit statuses; hosts seen; the record's TTL.
#[tokio::test]
async fn a_failed_attempt_and_a_takeover_are_both_on_record() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let schedule = Schedule::every(HOUR).unwrap();
    let now = f.server_time("nightly").await.unwrap();
    let tick = schedule.latest_at_or_before(now).unwrap();

    let mut a = f.start(occurrence_config("nightly", "host-a", &schedule, tick));
    let got = acquired(&mut a, Duration::from_secs(5)).await;
    got.handle.set_exit(Exit::Status(3));
    got.handle.fail("PROGRAM exited with 3").await.unwrap();
    let mut b = f.start(occurrence_config("nightly", "host-b", &schedule, tick));
    let got = acquired(&mut b, Duration::from_secs(5)).await;
    assert_eq!(got.attempt, 2);
    got.handle.set_exit(Exit::Status(0));
    got.handle.done().await.unwrap();

    // The record's writes are in the background: wait for the last one.
    let digest = schedule.digest();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let entry = loop {
        let h = f.schedule_history("nightly", digest, 10).await.unwrap();
        if let Some(e) = h.first().filter(|e| {
            e.outcome == RecordedOutcome::Done && e.attempts.iter().all(|a| a.ended.is_some())
        }) {
            break e.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "history: {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(entry.tick, tick);
    assert_eq!(entry.attempts.len(), 2, "{entry:?}");
    let (one, two) = (&entry.attempts[0], &entry.attempts[1]);
    assert_eq!(one.host.as_deref(), Some("host-a"));
    assert_eq!(one.exit, Some(Exit::Status(3)));
    assert_eq!(one.outcome, Some(AttemptOutcome::Failed));
    assert_eq!(one.message.as_deref(), Some("PROGRAM exited with 3"));
    assert_eq!(two.host.as_deref(), Some("host-b"));
    assert_eq!(two.exit, Some(Exit::Status(0)));
    assert_eq!(two.outcome, Some(AttemptOutcome::Done));
    assert!(one.started.unwrap() <= one.ended.unwrap());
    assert!(one.ended.unwrap() <= two.ended.unwrap());

    let records = f.schedule_records("nightly").await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.digest, digest);
    assert_eq!(r.spec.history, 5);
    assert_eq!(Schedule::from_spec(&r.spec).unwrap(), schedule);
    assert_eq!(r.last_outcome, Some(RecordedOutcome::Done));
    assert_eq!(r.last_tick, Some(tick));
    assert!(r.last_success.is_some());
    let mut hosts: Vec<&str> = r.hosts.iter().map(|h| h.host.as_str()).collect();
    hosts.sort();
    assert_eq!(hosts, ["host-a", "host-b"]);

    // The lifetime: max(30 days, 10 gaps of 1 h) = 30 days.
    let mut raw = raw(&srv).await;
    for suffix in ["", ":hosts", ":history", ":ticks"] {
        let key = format!("baton:schedule:{{nightly}}:{digest}{suffix}");
        let ttl = pttl(&mut raw, &key).await;
        assert!(
            ttl > 29 * 24 * 3600 * 1000 && ttl <= 30 * 24 * 3600 * 1000,
            "{key}: {ttl}"
        );
    }
}

/// The history keeps the newest N; missed ticks are written only where no entry is.
#[tokio::test]
async fn the_history_is_trimmed_and_missed_never_overwrites() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    let schedule = Schedule::every(HOUR).unwrap();
    let opts = RecordOptions::default().history(3);
    let now = f.server_time("trim").await.unwrap();
    let last = schedule.latest_at_or_before(now).unwrap();
    let ticks: Vec<SystemTime> = (0..6).rev().map(|i| last - HOUR * i).collect();
    for t in &ticks[..5] {
        f.record_occurrence(
            &schedule,
            &opts,
            "trim",
            *t,
            RecordChange::Outcome {
                outcome: RecordedOutcome::Done,
                note: None,
            },
        )
        .await
        .unwrap();
    }
    f.record_occurrence(
        &schedule,
        &opts,
        "trim",
        ticks[4],
        RecordChange::Missed(vec![ticks[4], ticks[5]]),
    )
    .await
    .unwrap();
    let h = f
        .schedule_history("trim", schedule.digest(), 10)
        .await
        .unwrap();
    let got: Vec<(SystemTime, RecordedOutcome)> = h.iter().map(|e| (e.tick, e.outcome)).collect();
    assert_eq!(
        got,
        [
            (ticks[5], RecordedOutcome::Missed),
            (ticks[4], RecordedOutcome::Done),
            (ticks[3], RecordedOutcome::Done),
        ]
    );
}

/// Pause before any record, read back; resume; an `until` in the past is refused, and one
/// that passes reads as not paused.
#[tokio::test]
async fn pause_and_resume_read_back() {
    let srv = server();
    let client = client(&srv).await;
    let f = client.failover();
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
    f.pause_schedule("p", None, Some("maintenance"))
        .await
        .unwrap();
    let p = f.schedule_pause("p").await.unwrap().unwrap();
    assert_eq!((p.until, p.note.as_deref()), (None, Some("maintenance")));
    assert!(!p.by.is_empty());
    assert!(f.resume_schedule("p").await.unwrap());
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
    assert!(!f.resume_schedule("p").await.unwrap());
    let now = f.server_time("p").await.unwrap();
    assert!(f.pause_schedule("p", Some(now - HOUR), None).await.is_err());
    f.pause_schedule("p", Some(now + Duration::from_millis(300)), None)
        .await
        .unwrap();
    assert!(f.schedule_pause("p").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(f.schedule_pause("p").await.unwrap(), None);
}

/// The listing names each key with a record or a pause once, under its prefix only. It
/// walks the keys with `SCAN`, an operator's command (as `baton status`'s listing): the
/// administrator's connection, not the workers' least-privilege user.
#[tokio::test]
async fn schedules_are_listed_once_each() {
    let srv = server();
    let client = baton::Client::connect(srv.admin_url()).await.unwrap();
    let f = client.failover();
    let hourly = Schedule::every(HOUR).unwrap();
    let daily = Schedule::every(HOUR * 24).unwrap();
    let opts = RecordOptions::default();
    let now = f.server_time("l").await.unwrap();
    let done = || RecordChange::Outcome {
        outcome: RecordedOutcome::Done,
        note: None,
    };
    // Two digests of one key (a rolling change), a second key, a key that is only paused.
    for s in [&hourly, &daily] {
        let tick = s.latest_at_or_before(now).unwrap();
        f.record_occurrence(s, &opts, "list-a", tick, done())
            .await
            .unwrap();
    }
    let tick = hourly.latest_at_or_before(now).unwrap();
    f.record_occurrence(&hourly, &opts, "list-b", tick, done())
        .await
        .unwrap();
    f.pause_schedule("list-c", None, None).await.unwrap();
    let other = FailoverConfig::builder("list-d")
        .prefix("baton:sub:")
        .build()
        .unwrap();
    f.record_occurrence(&hourly, &opts, other, tick, done())
        .await
        .unwrap();

    assert_eq!(
        client.inspect().schedules().await.unwrap(),
        ["list-a", "list-b", "list-c"]
    );
    let sub = client.inspect().with_prefix("baton:sub:").unwrap();
    assert_eq!(sub.schedules().await.unwrap(), ["list-d"]);
    assert!(client.inspect().with_prefix("no-colon").is_err());
}

/// On a Cluster every record key of one schedule key (each digest's four, the digests' index
/// and the pause) is on one node, in one slot, so the one script call that writes them is
/// legal there; the listing walks every primary.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_record_shares_one_slot_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| baton::testing::RedisCluster::start().unwrap())
        .await
        .unwrap();
    let url = cluster.cluster_url();
    let client = baton::Client::connect(url.as_str()).await.unwrap();
    let f = client.failover();
    let hourly = Schedule::every(HOUR).unwrap();
    let daily = Schedule::every(HOUR * 24).unwrap();
    let opts = RecordOptions::default();
    let now = f.server_time("x").await.unwrap();
    // Twelve keys: their hash tags spread over every primary's slots.
    let keys: Vec<String> = (0..12).map(|i| format!("slot-{i}")).collect();
    for key in &keys {
        for s in [&hourly, &daily] {
            let tick = s.latest_at_or_before(now).unwrap();
            f.record_occurrence(
                s,
                &opts,
                key.as_str(),
                tick,
                RecordChange::Started { attempt: 1 },
            )
            .await
            .unwrap();
        }
        f.pause_schedule(key.as_str(), None, None).await.unwrap();
    }
    let raw = raw_at(&url).await;
    let mut holders: std::collections::HashMap<String, Vec<(usize, u16)>> = Default::default();
    for (node, mut conn) in raw.primaries().await.into_iter().enumerate() {
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("baton:schedule:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        for name in names {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&name)
                .query_async(&mut conn)
                .await
                .unwrap();
            let key = name
                .strip_prefix("baton:schedule:{")
                .and_then(|r| r.split_once('}'))
                .map(|(k, _)| k.to_string())
                .unwrap();
            holders.entry(key).or_default().push((node, slot));
        }
    }
    let mut nodes = std::collections::HashSet::new();
    for key in &keys {
        let at = &holders[key];
        // Two digests × (summary, hosts, history, ticks) + the digests' index + the pause.
        assert_eq!(at.len(), 10, "{key}: {at:?}");
        assert!(at.iter().all(|x| *x == at[0]), "{key}: {at:?}");
        nodes.insert(at[0].0);
    }
    assert!(
        nodes.len() > 1,
        "the keys should spread over primaries: {nodes:?}"
    );
    let listed = client.inspect().schedules().await.unwrap();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(listed, want);
}

/// On PostgreSQL an expired record reads as absent, and the client's background cleanup
/// deletes its rows (summary and history), and a pause a day past its `until`.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_records_are_deleted_on_postgres() {
    // Every client of this process cleans up each 100 ms (only this test uses PostgreSQL
    // here).
    std::env::set_var(baton::testing::TEST_CLEANUP_EVERY_ENV, "100");
    let db = PgDatabase::create();
    let client = baton::Client::connect(db.url.as_str()).await.unwrap();
    let f = client.failover();
    let schedule = Schedule::every(HOUR).unwrap();
    let now = f.server_time("gone").await.unwrap();
    let tick = schedule.latest_at_or_before(now).unwrap();
    f.record_occurrence(
        &schedule,
        &RecordOptions::default(),
        "gone",
        tick,
        RecordChange::Started { attempt: 1 },
    )
    .await
    .unwrap();
    f.pause_schedule("gone", Some(now + HOUR), None)
        .await
        .unwrap();
    let owner = db.connect().await;
    let days: f64 = owner
        .query_one(
            "SELECT (extract(epoch FROM expires_at - now()) / 86400)::float8 FROM baton_schedules",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(days > 29.9 && days <= 30.0, "{days}");
    assert_eq!(
        f.schedule_history("gone", schedule.digest(), 5)
            .await
            .unwrap()
            .len(),
        1
    );

    owner
        .batch_execute(
            "UPDATE baton_schedules SET expires_at = now() - interval '1 second';
             UPDATE baton_schedule_control SET until = now() - interval '25 hours'",
        )
        .await
        .unwrap();
    // Read as absent at once.
    assert!(f.schedule_records("gone").await.unwrap().is_empty());
    assert!(f
        .schedule_history("gone", schedule.digest(), 5)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(f.schedule_pause("gone").await.unwrap(), None);
    // Deleted by the cleanup.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = owner
            .query_one(
                "SELECT (SELECT count(*) FROM baton_schedules)
                      + (SELECT count(*) FROM baton_schedule_history)
                      + (SELECT count(*) FROM baton_schedule_control)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left} rows left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The record's cost, measured on demand on a private redis-server (docs/benchmarks.md, "The
/// schedule's record"): what one occurrence adds (commands, round trips, bytes on the wire),
/// what the pause check costs, and the memory per schedule with `BATON_BENCH_SCHEDULES`
/// schedules (default 10 000) of `BATON_BENCH_HISTORY` occurrences each (default 50).
///
/// `cargo test --all-features --test schedule_record -- --ignored --nocapture record_cost`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run on demand"]
async fn record_cost() {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (schedules, history) = (
        env("BATON_BENCH_SCHEDULES", 10_000),
        env("BATON_BENCH_HISTORY", 50),
    );
    let srv = server();
    let mut raw = raw(&srv).await;
    let schedule = Schedule::every(HOUR).unwrap();
    let now = baton::Client::connect(srv.admin_url())
        .await
        .unwrap()
        .failover()
        .server_time("x")
        .await
        .unwrap();
    let tick = schedule.latest_at_or_before(now).unwrap();

    // One occurrence run to done by a fresh client (its tasks, the record's writes among
    // them, waited for by its shutdown): what the server saw.
    async fn one(
        srv: &common::Deployment,
        raw: &mut common::Raw,
        key: &str,
        schedule: &Schedule,
        tick: SystemTime,
        record: bool,
    ) -> (std::collections::HashMap<String, u64>, u64, u64) {
        let client = client(srv).await;
        let occ = schedule.occurrence_of_tick(tick).unwrap();
        let mut cfg = FailoverConfig::builder(key)
            .worker_name("worker-01.example")
            .build()
            .unwrap()
            .for_occurrence(&occ, None)
            .unwrap();
        if record {
            cfg = cfg.with_record(key, schedule, tick, RecordOptions::default());
        }
        let before = command_calls(raw).await;
        let (in0, out0) = (
            info_field(
                &mut raw.primaries().await[0],
                "stats",
                "total_net_input_bytes",
            )
            .await,
            info_field(
                &mut raw.primaries().await[0],
                "stats",
                "total_net_output_bytes",
            )
            .await,
        );
        let mut w = client.failover().start(cfg);
        let got = acquired(&mut w, Duration::from_secs(5)).await;
        got.handle.set_exit(Exit::Status(0));
        got.handle.done().await.unwrap();
        assert!(client.shutdown(Duration::from_secs(5)).await);
        let (in1, out1) = (
            info_field(
                &mut raw.primaries().await[0],
                "stats",
                "total_net_input_bytes",
            )
            .await,
            info_field(
                &mut raw.primaries().await[0],
                "stats",
                "total_net_output_bytes",
            )
            .await,
        );
        let after = command_calls(raw).await;
        let mut delta = std::collections::HashMap::new();
        for (name, n) in after {
            let d = n - before.get(&name).copied().unwrap_or(0);
            // `info` is this measurement's; `auth` and `(un)subscribe` are the fresh
            // client's connections, not the record.
            if d > 0 && !matches!(name.as_str(), "info" | "auth" | "subscribe" | "unsubscribe") {
                delta.insert(name, d);
            }
        }
        (delta, in1 - in0, out1 - out0)
    }
    // Warm-up: the scripts loaded, connections made.
    one(&srv, &mut raw, "warm", &schedule, tick, true).await;
    let (plain, plain_in, plain_out) = one(&srv, &mut raw, "plain", &schedule, tick, false).await;
    let (rec, rec_in, rec_out) = one(&srv, &mut raw, "rec", &schedule, tick, true).await;
    let sum = |m: &std::collections::HashMap<String, u64>| m.values().sum::<u64>();
    let mut added: Vec<(String, i64)> = rec
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                *v as i64 - plain.get(k).copied().unwrap_or(0) as i64,
            )
        })
        .filter(|(_, d)| *d != 0)
        .collect();
    added.sort();
    println!("one occurrence, plain: {} commands {plain:?}", sum(&plain));
    println!("one occurrence, recorded: {} commands {rec:?}", sum(&rec));
    println!(
        "added by the record: {added:?}; bytes in +{} out +{}",
        rec_in as i64 - plain_in as i64,
        rec_out as i64 - plain_out as i64
    );

    let c = client(&srv).await;
    let f = c.failover();
    // The bytes of the record's writes of one occurrence (its grant and its end, as the
    // worker sends them), over many occurrences on one connection.
    let writer = FailoverConfig::builder("bytes")
        .worker_name("worker-01.example")
        .build()
        .unwrap();
    const OCCURRENCES: u32 = 200;
    let ticks: Vec<SystemTime> = (0..OCCURRENCES).rev().map(|n| tick - HOUR * n).collect();
    // The first write of a schedule is bigger (its spec, first seen): not what every
    // occurrence pays.
    f.record_occurrence(
        &schedule,
        &RecordOptions::default(),
        writer.clone(),
        ticks[0],
        RecordChange::Started { attempt: 1 },
    )
    .await
    .unwrap();
    let in0 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_input_bytes",
    )
    .await;
    let out0 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_output_bytes",
    )
    .await;
    for t in &ticks[1..] {
        for change in [
            RecordChange::Started { attempt: 1 },
            RecordChange::Ended {
                attempt: 1,
                outcome: AttemptOutcome::Done,
                exit: Some(Exit::Status(0)),
                message: None,
            },
        ] {
            f.record_occurrence(
                &schedule,
                &RecordOptions::default(),
                writer.clone(),
                *t,
                change,
            )
            .await
            .unwrap();
        }
    }
    let in1 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_input_bytes",
    )
    .await;
    let out1 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_output_bytes",
    )
    .await;
    let n = f64::from(OCCURRENCES - 1);
    println!(
        "the record's writes of one occurrence (grant + end): {:.0} bytes sent, {:.0} received",
        (in1 - in0) as f64 / n,
        (out1 - out0) as f64 / n
    );

    // The pause check: one read.
    let before = command_calls(&mut raw).await;
    let in0 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_input_bytes",
    )
    .await;
    let out0 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_output_bytes",
    )
    .await;
    let t0 = std::time::Instant::now();
    const READS: u32 = 1000;
    for _ in 0..READS {
        f.schedule_pause("rec").await.unwrap();
    }
    let per = t0.elapsed() / READS;
    let in1 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_input_bytes",
    )
    .await;
    let out1 = info_field(
        &mut raw.primaries().await[0],
        "stats",
        "total_net_output_bytes",
    )
    .await;
    let after = command_calls(&mut raw).await;
    let calls: Vec<(String, u64)> = after
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "info" | "auth"))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    println!(
        "pause check: {calls:?} for {READS} reads; {:.0} bytes in, {:.0} out, {per:?} each",
        (in1 - in0) as f64 / f64::from(READS),
        (out1 - out0) as f64 / f64::from(READS)
    );

    // Memory: `schedules` schedules, `history` occurrences each (one attempt, done, with its
    // host, times, exit status), three hosts.
    let mut mem = raw.primaries().await.remove(0);
    let m0 = info_field(&mut mem, "memory", "used_memory").await;
    let opts = RecordOptions::default().history(history);
    let t0 = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    const TASKS: u32 = 64;
    for part in 0..TASKS {
        let f = f.clone();
        let (schedule, opts) = (schedule.clone(), opts.clone());
        tasks.spawn(async move {
            for i in (part..schedules).step_by(TASKS as usize) {
                let key = format!("bench-{i:05}");
                for n in (0..history).rev() {
                    let t = tick - HOUR * n;
                    let mut a = AttemptRecord::new(1);
                    a.host = Some(format!("worker-0{}.example", n % 3));
                    a.started = Some(t + Duration::from_millis(20));
                    a.ended = Some(t + Duration::from_secs(42));
                    a.exit = Some(Exit::Status(0));
                    a.outcome = Some(AttemptOutcome::Done);
                    let host = format!("worker-0{}.example", n % 3);
                    let writer = FailoverConfig::builder(key.as_str())
                        .worker_name(host)
                        .build()
                        .unwrap();
                    f.record_occurrence(&schedule, &opts, writer, t, RecordChange::Attempt(a))
                        .await
                        .unwrap();
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let took = t0.elapsed();
    let m1 = info_field(&mut mem, "memory", "used_memory").await;
    let mut one_keys = 0u64;
    let mut conn = raw.primaries().await.remove(0);
    for suffix in ["", ":hosts", ":history", ":ticks"] {
        let name = format!(
            "baton:schedule:{{bench-00000}}:{}{suffix}",
            schedule.digest()
        );
        let n: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&name)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
        println!("  {name}: {n} bytes");
        one_keys += n;
    }
    let digests: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("baton:schedule:{bench-00000}:digests")
        .query_async(&mut conn)
        .await
        .unwrap();
    println!(
        "memory: {schedules} schedules x {history}: used_memory +{} bytes, {} bytes per \
         schedule (MEMORY USAGE of one schedule's keys: {} + digests {digests}); filled in \
         {took:?} ({:.0} writes/s)",
        m1 - m0,
        (m1 - m0) / u64::from(schedules),
        one_keys,
        f64::from(schedules * history) / took.as_secs_f64()
    );
    assert!(
        (m1 - m0) / u64::from(schedules) <= 64 * 1024,
        "over the 64 KB target"
    );
}
