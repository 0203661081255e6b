//! Deterministic fault scenarios of RELIABILITY.md §b.8 that apply to the failover coordinator.
//! (S2/S3 restarts: `failover_faults.rs` and catalogue row 28; S4 eviction: catalogue row 21;
//! S5 WATCH on a shared connection: the MONITOR check in `failover_load.rs`; S7 late replies:
//! catalogue rows 25 and 26; S6 and S9 need WAIT and Lua, which the coordinator does not use.)
#![cfg(feature = "testing")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use baton::{Event, FailoverConfig};
use common::*;

/// A resource that accepts a write only with a token at least as high as any it has seen.
#[derive(Default)]
struct FencedResource {
    highest: HashMap<String, u64>,
    log: Vec<(String, u64, &'static str)>,
}

impl FencedResource {
    fn write(&mut self, key: &str, token: u64, who: &'static str) -> bool {
        let h = self.highest.entry(key.to_string()).or_default();
        if token < *h {
            return false;
        }
        *h = token;
        self.log.push((key.to_string(), token, who));
        true
    }
}

scenario! {
    #[tokio::test]
    async fn s1_fencing_rejects_a_paused_holders_stale_write() {
        let srv = server();
        let client = client(&srv).await;
        let cfg = FailoverConfig::builder("s1")
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let mut resource = FencedResource::default();
        let mut a = client.failover().start(cfg.clone());
        let old = acquired(&mut a, WAKE).await;
        assert!(resource.write("acct", old.fencing_token, "A"));
        // A "pauses" (does nothing) past its lease; B takes over and writes.
        let mut b = client.failover().start(cfg);
        let new = loop {
            match next(&mut b, WAKE).await {
                Event::Acquired(x) => break x,
                Event::Locked { .. } => {}
                other => panic!("{other:?}"),
            }
        };
        assert!(resource.write("acct", new.fencing_token, "B"));
        // A wakes up and writes with its old token: rejected. Without fencing it would have won.
        assert!(
            !resource.write("acct", old.fencing_token, "A"),
            "stale write accepted"
        );
        assert_eq!(resource.log.last().unwrap().2, "B");
        // And A learns it lost the attempt.
        assert!(matches!(
            old.done().await,
            Err(baton::Error::LeaseLost { .. })
        ));
        new.done().await.unwrap();
    }
}

scenario! {
    #[tokio::test]
    async fn s8_a_server_clock_jump_ends_the_lease_early_and_the_holder_says_so() {
        // F9: what a forward jump of the server clock does to a lease, emulated by shrinking its TTL.
        let srv = server();
        let client = client(&srv).await;
        let mut conn = raw(&srv).await;
        let cfg = FailoverConfig::builder("s8")
            .lease(Duration::from_secs(3))
            .watchdog(true)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let old = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg);
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
        let _: () = redis::cmd("PEXPIRE")
            .arg(lease_key("s8"))
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        // The backup wakes at the (now past) lease end and takes over with a higher token.
        let new = acquired(&mut b, WAKE).await;
        assert_eq!(new.attempt, 2);
        assert!(new.fencing_token > old.fencing_token);
        // The holder's next extension finds another token: LeaseLost, at once, not at done().
        let evs = until_end(&mut a, WAKE).await;
        assert!(
            matches!(evs.last(), Some(Event::LeaseLost { attempt: 1, .. })),
            "{evs:?}"
        );
        new.done().await.unwrap();
    }
}

// Single server only: freezes THE server process (kill -STOP on its PID) mid-EXEC.
scenario! {
    single:
    #[tokio::test]
    async fn s1b_a_grant_that_outlived_its_lease_before_handover_is_never_handed_out() {
        // The worker's EXEC reply arrives later than the lease is long (here Redis is frozen while the
        // EXEC is in flight, as a paused worker process would be): by then a backup may hold the next
        // attempt, so the worker must report LeaseLost without ever emitting Acquired.
        let srv = server();
        let client = baton::Client::builder(srv.url())
            .response_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        let pid = srv.pid().unwrap().to_string();
        let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        baton::__seam::set_before_exec_hook(
            &client,
            Some(std::sync::Arc::new(move |what| {
                let (pid, fired) = (pid.clone(), fired.clone());
                Box::pin(async move {
                    if what != "grant" || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    let stop = std::process::Command::new("kill")
                        .args(["-STOP", &pid])
                        .status();
                    assert!(stop.unwrap().success());
                    std::thread::spawn(move || {
                        // Three times the 300 ms lease, well inside the 5 s response timeout.
                        std::thread::sleep(Duration::from_millis(900));
                        let _ = std::process::Command::new("kill")
                            .args(["-CONT", &pid])
                            .status();
                    });
                })
            })),
        );
        let cfg = FailoverConfig::builder("s1b")
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        match next(&mut a, WAKE).await {
            Event::LeaseLost { attempt, reason } => {
                assert_eq!(attempt, 1);
                assert!(
                    reason.contains("before the grant could be handed over"),
                    "{reason}"
                );
            }
            other => panic!("expected LeaseLost before any Acquired, got {other:?}"),
        }
        // The attempt stays counted; a backup takes the next one once the lease has run out.
        let mut b = client.failover().start(cfg);
        let got = loop {
            match next(&mut b, WAKE).await {
                Event::Acquired(x) => break x,
                Event::Locked { attempt: 1, .. } => {}
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(got.attempt, 2);
        got.done().await.unwrap();
    }
}

/// Polls `f`'s history of `key` until `ready` holds (the record's writes are spawned by the
/// workers, off their protocol's path), for up to 5 s.
async fn history_when(
    f: &baton::Failover,
    key: &str,
    digest: &str,
    ready: impl Fn(&[baton::OccurrenceRecord]) -> bool,
) -> Vec<baton::OccurrenceRecord> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let h = f.schedule_history(key, digest, 50).await.unwrap();
        if ready(&h) {
            return h;
        }
        assert!(tokio::time::Instant::now() < deadline, "history: {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// The schedule's record on every backend: a night with a failed attempt and a takeover (both
// attempts with hosts and exit statuses), the summary, missed ticks and the trim, the repair of
// an entry left `running` by a worker that died after its grant, the pause, and the listing.
scenario! {
    postgres:
    #[tokio::test]
    async fn s10_the_schedule_record_holds_what_the_workers_did() {
        use baton::{
            AttemptOutcome, CheckStatus, Exit, RecordChange, RecordOptions, RecordedOutcome,
            Schedule,
        };
        use std::time::SystemTime;
        const HOUR: Duration = Duration::from_secs(3600);
        let srv = server();
        let client = client(&srv).await;
        let f = client.failover();
        let schedule = Schedule::every(HOUR).unwrap();
        let digest = schedule.digest();
        let opts = RecordOptions::default().history(4);
        let now = f.server_time("s10").await.unwrap();
        let tick = schedule.latest_at_or_before(now).unwrap();
        let config = |worker: &str, tick: SystemTime, record: bool| {
            let base = FailoverConfig::builder("s10")
                .lease(Duration::from_secs(10))
                .max_attempts(3)
                .worker_name(worker)
                .build()
                .unwrap();
            let occ = schedule.occurrence_of_tick(tick).unwrap();
            let cfg = base.for_occurrence(&occ, None).unwrap();
            if record {
                cfg.with_record("s10", &schedule, tick, opts.clone())
            } else {
                cfg
            }
        };

        // What a recording worker on `host` writes under (the schedule's key).
        let writer = |host: &str| {
            FailoverConfig::builder("s10").worker_name(host).build().unwrap()
        };

        // Two ticks ago: a worker granted attempt 1 (its grant on record), ended the job and
        // died before writing the end. The reader repairs it from the job: done.
        let old = tick - HOUR * 2;
        let mut w = f.start(config("host-a", old, false));
        let got = acquired(&mut w, WAKE).await;
        f.record_occurrence(&schedule, &opts, writer("host-a"), old,
            RecordChange::Started { attempt: 1 })
            .await
            .unwrap();
        got.handle.done().await.unwrap();
        let h = f.schedule_history("s10", digest, 10).await.unwrap();
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[0].outcome, RecordedOutcome::Done, "{h:?}");
        assert_eq!(h[0].attempts[0].host.as_deref(), Some("host-a"));
        assert_eq!(h[0].attempts[0].ended, None, "its end was never written");
        assert!(h[0].note.is_some());

        // The newest tick: attempt 1 fails with exit 3 on host-a, host-b takes over.
        let mut a = f.start(config("host-a", tick, true));
        let got = acquired(&mut a, WAKE).await;
        got.handle.set_exit(Exit::Status(3));
        got.handle.fail("PROGRAM exited with 3").await.unwrap();
        let mut b = f.start(config("host-b", tick, true));
        let got = acquired(&mut b, WAKE).await;
        assert_eq!(got.attempt, 2);
        got.handle.set_exit(Exit::Status(0));
        got.handle.done().await.unwrap();
        let h = history_when(&f, "s10", digest, |h| {
            h.first().is_some_and(|e| {
                e.tick == tick
                    && e.outcome == RecordedOutcome::Done
                    && e.attempts.len() == 2
                    && e.attempts.iter().all(|a| a.ended.is_some())
            })
        })
        .await;
        let (one, two) = (&h[0].attempts[0], &h[0].attempts[1]);
        assert_eq!(
            (one.host.as_deref(), one.exit, one.outcome, one.message.as_deref()),
            (Some("host-a"), Some(Exit::Status(3)), Some(AttemptOutcome::Failed),
             Some("PROGRAM exited with 3"))
        );
        assert_eq!(
            (two.host.as_deref(), two.exit, two.outcome),
            (Some("host-b"), Some(Exit::Status(0)), Some(AttemptOutcome::Done))
        );
        assert!(one.started.unwrap() <= one.ended.unwrap());
        assert!(one.ended.unwrap() <= two.ended.unwrap());
        // The grant of the newest tick saw the older one on record: the tick between them,
        // whose window closed with nobody, is written missed.
        let h = history_when(&f, "s10", digest, |h| h.len() == 3).await;
        let got: Vec<(SystemTime, RecordedOutcome)> =
            h.iter().map(|e| (e.tick, e.outcome)).collect();
        assert_eq!(
            got,
            [
                (tick, RecordedOutcome::Done),
                (tick - HOUR, RecordedOutcome::Missed),
                (old, RecordedOutcome::Done),
            ]
        );

        let records = f.schedule_records("s10").await.unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!((r.digest.as_str(), r.spec.history), (digest, 4));
        assert_eq!(Schedule::from_spec(&r.spec).unwrap(), schedule);
        assert_eq!(r.last_tick, Some(tick));
        assert_eq!(r.last_outcome, Some(RecordedOutcome::Done));
        assert!(r.last_success.is_some());
        let mut hosts: Vec<&str> = r.hosts.iter().map(|h| h.host.as_str()).collect();
        hosts.sort();
        assert_eq!(hosts, ["host-a", "host-b"]);
        let check = r.check(&h, now, None);
        assert_eq!(check.status, CheckStatus::Ok, "{}", check.line);

        // Missed never overwrites; the history keeps the newest 4.
        f.record_occurrence(&schedule, &opts, "s10", tick,
            RecordChange::Missed(vec![tick, tick - HOUR * 3, tick - HOUR * 4]))
            .await
            .unwrap();
        let h = f.schedule_history("s10", digest, 10).await.unwrap();
        let got: Vec<(SystemTime, RecordedOutcome)> =
            h.iter().map(|e| (e.tick, e.outcome)).collect();
        assert_eq!(
            got,
            [
                (tick, RecordedOutcome::Done),
                (tick - HOUR, RecordedOutcome::Missed),
                (old, RecordedOutcome::Done),
                (tick - HOUR * 3, RecordedOutcome::Missed),
            ]
        );

        // A worker killed after its grant, its job left with no live lease: the entry left
        // `running` reads as failed, its attempt lost.
        let next = tick + HOUR;
        let mut w = f.start(config("host-c", next, false));
        let got = acquired(&mut w, WAKE).await;
        f.record_occurrence(&schedule, &opts, writer("host-c"), next,
            RecordChange::Started { attempt: 1 })
            .await
            .unwrap();
        got.handle.fail("killed").await.unwrap();
        let h = f.schedule_history("s10", digest, 1).await.unwrap();
        assert_eq!(h[0].tick, next);
        assert_eq!(h[0].outcome, RecordedOutcome::Failed, "{h:?}");
        assert_eq!(h[0].attempts[0].outcome, Some(AttemptOutcome::Lost));

        // Pause and resume: a key may be paused with no record.
        f.pause_schedule("s10-other", None, Some("maintenance")).await.unwrap();
        let p = f.schedule_pause("s10-other").await.unwrap().unwrap();
        assert_eq!((p.until, p.note.as_deref()), (None, Some("maintenance")));
        // The store keeps milliseconds.
        let ms = (now + HOUR).duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis();
        let paused_until = SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
        f.pause_schedule("s10", Some(paused_until), None).await.unwrap();
        let r = f.schedule_records("s10").await.unwrap();
        assert_eq!(r[0].paused.as_ref().and_then(|p| p.until), Some(paused_until));
        assert!(f.pause_schedule("s10", Some(now - HOUR), None).await.is_err());
        assert!(f.resume_schedule("s10").await.unwrap());
        assert!(!f.resume_schedule("s10").await.unwrap());
        assert_eq!(f.schedule_pause("s10").await.unwrap(), None);

        // The listing (an operator's: SCAN on Redis, as the administrator).
        let admin = baton::Client::connect(srv.admin_url()).await.unwrap();
        assert_eq!(
            admin.inspect().schedules().await.unwrap(),
            ["s10", "s10-other"]
        );
    }
}

// Missed ticks on a real server: with every worker dead, `check` computes them from the
// store alone; the next grant writes them `missed`, except a tick a host ran without writing
// the record (an older baton), which is written with what its own job reads.
scenario! {
    postgres:
    #[tokio::test]
    async fn s11_missed_ticks_are_computed_and_recorded_from_the_store() {
        use baton::{CheckStatus, RecordChange, RecordOptions, RecordedOutcome, Schedule};
        use std::time::SystemTime;
        const HOUR: Duration = Duration::from_secs(3600);
        let srv = server();
        let client = client(&srv).await;
        let f = client.failover();
        let schedule = Schedule::every(HOUR).unwrap();
        let digest = schedule.digest();
        let opts = RecordOptions::default();
        let now = f.server_time("s11").await.unwrap();
        let tick = schedule.latest_at_or_before(now).unwrap();
        let t = |n: u32| tick - HOUR * n;
        let run = |at: SystemTime, record: bool| {
            let occ = schedule.occurrence_of_tick(at).unwrap();
            let cfg = FailoverConfig::builder("s11")
                .lease(Duration::from_secs(10))
                .worker_name("host-a")
                .build()
                .unwrap()
                .for_occurrence(&occ, None)
                .unwrap();
            if record {
                cfg.with_record("s11", &schedule, at, opts.clone())
            } else {
                cfg
            }
        };
        // Four hours ago: done, on record. Then every worker is dead for three ticks.
        f.record_occurrence(&schedule, &opts, "s11", t(4),
            RecordChange::Outcome { outcome: RecordedOutcome::Done, note: None })
            .await
            .unwrap();
        let records = f.schedule_records("s11").await.unwrap();
        let history = f.schedule_history("s11", digest, 50).await.unwrap();
        let check = records[0].check(&history, now, None);
        assert_eq!(check.status, CheckStatus::Critical, "{}", check.line);
        assert_eq!(check.missed.len(), 3, "{:?}", check.missed);
        assert!(check.line.contains("3 missed"), "{}", check.line);

        // An older baton ran two ticks ago (no record written); now a recording worker runs
        // the newest tick: its grant writes the gap.
        let mut old = f.start(run(t(2), false));
        acquired(&mut old, WAKE).await.done().await.unwrap();
        let mut w = f.start(run(tick, true));
        acquired(&mut w, WAKE).await.done().await.unwrap();
        let h = history_when(&f, "s11", digest, |h| h.len() == 5 && h[0].outcome == RecordedOutcome::Done).await;
        let got: Vec<(SystemTime, RecordedOutcome)> =
            h.iter().map(|e| (e.tick, e.outcome)).collect();
        assert_eq!(
            got,
            [
                (tick, RecordedOutcome::Done),
                (t(1), RecordedOutcome::Missed),
                (t(2), RecordedOutcome::Done),
                (t(3), RecordedOutcome::Missed),
                (t(4), RecordedOutcome::Done),
            ]
        );
        assert!(h[2].note.as_deref().unwrap_or("").contains("older baton"), "{:?}", h[2]);
        // The success after them: OK again.
        let records = f.schedule_records("s11").await.unwrap();
        let check = records[0].check(&h, now, None);
        assert_eq!(check.status, CheckStatus::Ok, "{}", check.line);
    }
}
