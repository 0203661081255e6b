//! Redlock against real redis-servers: five private masters per test, from the fixture.
//!
//! Every scenario runs on Redis and on Valkey (`single:`), not on a cluster or behind Sentinel:
//! Redlock's masters are independent single servers by design (each a cluster or a Sentinel set
//! would be five clusters of six processes per test, and Redlock's quorum would stand in for the
//! failover those already do). The mutex and the failover coordinator run on every topology.

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::testing::RedisServer;
use baton::{Client, ConfigError, Error, ErrorKind, Fenced, LeaseGuard, Redlock, RedlockOptions};
use common::{client, get, pttl, raw, server, Deployment, Raw};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn lock_key(name: &str) -> String {
    format!("baton:redlock:{{{name}}}")
}

struct Fleet {
    servers: Vec<Deployment>,
    clients: Vec<Client>,
}

impl Fleet {
    async fn start(n: usize) -> Fleet {
        // Started side by side: a cluster or Sentinel set spends seconds waiting to settle.
        let topology = common::topology::current();
        let servers: Vec<Deployment> = std::thread::scope(|s| {
            let started: Vec<_> = (0..n)
                .map(|_| s.spawn(move || common::server_on(topology)))
                .collect();
            started.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut clients = Vec::new();
        for s in &servers {
            clients.push(client(s).await);
        }
        Fleet { servers, clients }
    }

    fn redlock(&self) -> Redlock {
        Redlock::new(&self.clients).expect("a valid fleet")
    }

    async fn raws(&self) -> Vec<Raw> {
        let mut out = Vec::new();
        for s in &self.servers {
            out.push(raw(s).await);
        }
        out
    }
}

async fn exists(conn: &mut Raw, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    n == 1
}

/// How many masters hold `token` under `key`.
async fn holding(raws: &mut [Raw], key: &str, token: &str) -> usize {
    let mut n = 0;
    for c in raws.iter_mut() {
        if get(c, key).await.as_deref() == Some(token) {
            n += 1;
        }
    }
    n
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn five_masters_acquire_and_a_second_try_is_contended_not_an_error() {
        let fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        assert_eq!((rl.masters(), rl.quorum()), (5, 3));
        let start = Instant::now();
        let guard = rl.try_acquire("a", TTL).await.unwrap().expect("acquired");
        assert!(guard.lease_deadline() < start + TTL);
        assert!(guard.lease_deadline() > Instant::now());
        let mut raws = fleet.raws().await;
        assert_eq!(holding(&mut raws, &lock_key("a"), guard.token()).await, 5);
        for c in raws.iter_mut() {
            let p = pttl(c, &lock_key("a")).await;
            assert!(p > 9_000 && p <= 10_000, "pttl {p}");
        }

        // A second contender, on its own clients.
        let mut others = Vec::new();
        for s in &fleet.servers {
            others.push(client(s).await);
        }
        let rl2 = Redlock::new(&others).unwrap();
        assert!(rl2.try_acquire("a", TTL).await.unwrap().is_none());
        let err = rl2
            .acquire("a", TTL, &RedlockOptions::builder().max_tries(2).build().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        // The contender left nothing behind, ours is intact.
        assert_eq!(holding(&mut raws, &lock_key("a"), guard.token()).await, 5);
        assert_eq!(guard.release_counted().await.unwrap(), 5);
        for c in raws.iter_mut() {
            assert!(!exists(c, &lock_key("a")).await);
        }
        // Now free for the other one.
        let g2 = rl2
            .acquire("a", TTL, &RedlockOptions::builder().max_tries(1).build().unwrap())
            .await
            .unwrap();
        assert_eq!(g2.release_counted().await.unwrap(), 5);
    }
}

// Single servers only: kills masters (each one server process).
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_masters_down_still_acquires_three_down_fails_with_the_quorum_error() {
        let mut fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        fleet.servers[0].kill();
        fleet.servers[1].kill();
        let guard = rl.try_acquire("b", TTL).await.unwrap().expect("3 of 5");
        assert_eq!(guard.release_counted().await.unwrap(), 3);

        fleet.servers[2].kill();
        let started = Instant::now();
        let err = rl.try_acquire("b", TTL).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "per-master timeouts bound the round"
        );
        assert_eq!(err.kind(), ErrorKind::QuorumUnavailable);
        assert!(err.is_retryable());
        match &err {
            Error::QuorumUnavailable {
                needed,
                reachable,
                masters,
                errors,
                ..
            } => {
                assert_eq!((*needed, *reachable, *masters), (3, 2, 5));
                assert!(errors.contains("master 0"), "{errors}");
                assert!(!errors.contains("test-pw"), "no credentials: {errors}");
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("3 are needed") && msg.contains("2 of 5"),
            "{msg}"
        );
        // The two live masters said yes, and were undone.
        for s in &fleet.servers[3..] {
            let mut c = raw(s).await;
            assert!(!exists(&mut c, &lock_key("b")).await);
        }
        // acquire() returns the error at once instead of NotAcquired.
        let err = rl
            .acquire("b", TTL, &RedlockOptions::builder().max_tries(3).build().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuorumUnavailable);
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quorum_lost_to_contention_is_ok_none_and_leaves_none_of_our_tokens() {
        let fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        let mut raws = fleet.raws().await;
        for c in raws.iter_mut().take(3) {
            let _: () = redis::cmd("SET")
                .arg(lock_key("c"))
                .arg("foreign")
                .arg("PX")
                .arg(60_000)
                .query_async(c)
                .await
                .unwrap();
        }
        assert!(rl.try_acquire("c", TTL).await.unwrap().is_none());
        for c in raws.iter_mut().take(3) {
            assert_eq!(get(c, &lock_key("c")).await.as_deref(), Some("foreign"));
        }
        for c in raws.iter_mut().skip(3) {
            assert!(!exists(c, &lock_key("c")).await, "our token was undone");
        }
    }
}

// Single servers only: kills three masters (each one server process) at the end.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn extend_by_quorum_and_release_on_every_master() {
        let mut fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        let mut raws = fleet.raws().await;
        let mut guard = rl
            .try_acquire("d", Duration::from_secs(2))
            .await
            .unwrap()
            .unwrap();
        let before = guard.lease_deadline();
        assert!(guard.extend(Duration::from_secs(30)).await.unwrap());
        assert!(guard.lease_deadline() > before + Duration::from_secs(20));
        for c in raws.iter_mut() {
            assert!(pttl(c, &lock_key("d")).await > 20_000);
        }
        // Two masters lose the key (e.g. restarted without persistence): still a quorum.
        for c in raws.iter_mut().take(2) {
            let _: () = redis::cmd("DEL")
                .arg(lock_key("d"))
                .query_async(c)
                .await
                .unwrap();
        }
        assert!(guard.extend(Duration::from_secs(30)).await.unwrap());
        // A third one is taken by someone else: no quorum, nothing deleted anywhere.
        let _: () = redis::cmd("SET")
            .arg(lock_key("d"))
            .arg("foreign")
            .query_async(&mut raws[2])
            .await
            .unwrap();
        let kept = guard.lease_deadline();
        assert!(!guard.extend(Duration::from_secs(30)).await.unwrap());
        assert_eq!(guard.lease_deadline(), kept);
        assert_eq!(
            get(&mut raws[2], &lock_key("d")).await.as_deref(),
            Some("foreign")
        );
        assert_eq!(holding(&mut raws, &lock_key("d"), guard.token()).await, 2);
        // Release reports the two masters that still held it and leaves the foreign one.
        assert_eq!(guard.release_counted().await.unwrap(), 2);
        assert_eq!(
            get(&mut raws[2], &lock_key("d")).await.as_deref(),
            Some("foreign")
        );
        for c in raws.iter_mut().skip(3) {
            assert!(!exists(c, &lock_key("d")).await);
        }

        // Extension with three masters down: the quorum error, not `false`.
        let mut guard = rl.try_acquire("e", TTL).await.unwrap().unwrap();
        for s in fleet.servers.iter_mut().take(3) {
            s.kill();
        }
        let err = guard.extend(TTL).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuorumUnavailable, "{err}");
        let err = guard.release().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuorumUnavailable, "{err}");
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_guard_releases_on_every_master_in_the_background() {
        let fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        let mut raws = fleet.raws().await;
        let guard = rl.try_acquire("f", TTL).await.unwrap().unwrap();
        let token = guard.token().to_string();
        assert_eq!(holding(&mut raws, &lock_key("f"), &token).await, 5);
        let t = Instant::now();
        drop(guard);
        assert!(t.elapsed() < Duration::from_millis(50), "drop never blocks");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut left = 0;
            for c in raws.iter_mut() {
                if exists(c, &lock_key("f")).await {
                    left += 1;
                }
            }
            if left == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{left} masters still hold it");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn row_09_redlock_fleets_under_3_even_or_with_a_duplicate_endpoint_are_config_errors() {
        let fleet = Fleet::start(3).await;
        let field = |r: Result<Redlock, ConfigError>| match r {
            Err(ConfigError::Invalid { field, reason }) => (field, reason),
            other => panic!("{other:?}"),
        };
        let (f, why) = field(Redlock::new(&fleet.clients[..2]));
        assert_eq!(f, "masters");
        assert!(why.contains("at least 3"), "{why}");
        let (f, why) = field(Redlock::new(&[]));
        assert_eq!(f, "masters");
        assert!(why.contains("got 0"), "{why}");
        // Four: even.
        let extra = client(&fleet.servers[0]).await;
        let mut four = fleet.clients.clone();
        four.push(client(&server()).await);
        let (_, why) = field(Redlock::new(&four));
        assert!(why.contains("odd"), "{why}");
        // The same server twice, through a second client: would fake a quorum.
        let dup = vec![
            fleet.clients[0].clone(),
            fleet.clients[1].clone(),
            extra.clone(),
        ];
        let (_, why) = field(Redlock::new(&dup));
        assert!(why.contains("twice"), "{why}");
        assert!(!why.contains("test-pw"), "no credentials: {why}");
        // Bad names, prefixes and ttls.
        let rl = fleet.redlock();
        assert!(rl.with_prefix("app{x}:").is_err());
        assert_eq!(rl.with_prefix("app:").unwrap().prefix(), "app:");
        for bad in ["", "a{b}"] {
            let e = rl.try_acquire(bad, TTL).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
        }
        let e = rl
            .try_acquire("k", Duration::from_millis(1))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        // Refused when built, naming the field: never at acquire time.
        let e = RedlockOptions::builder().max_tries(0).build().unwrap_err();
        assert!(
            matches!(e, ConfigError::Invalid { field: "max_tries", .. }),
            "{e}"
        );
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redlock_and_a_mutex_with_the_same_name_do_not_collide() {
        let fleet = Fleet::start(3).await;
        let rl = fleet.redlock();
        let g = rl.try_acquire("same", TTL).await.unwrap().unwrap();
        let m = fleet.clients[0]
            .locks()
            .try_acquire("same", TTL)
            .await
            .unwrap()
            .expect("the mutex has its own keys");
        assert!(m.release().await.unwrap());
        assert_eq!(g.release_counted().await.unwrap(), 3);
    }
}

// Single servers only: pauses masters (SIGSTOP on one server process each).
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paused_masters_cost_one_per_master_timeout_which_the_validity_pays() {
        let fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        fleet.servers[0].pause().unwrap();
        fleet.servers[1].pause().unwrap();
        let start = Instant::now();
        let guard = rl.try_acquire("g", TTL).await.unwrap().expect("3 of 5");
        let elapsed = start.elapsed();
        // Per-master timeout: min(response_timeout 500 ms, ttl / 10): the round waits for it once,
        // not once per master, and far below the ttl.
        assert!(
            elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(2),
            "{elapsed:?}"
        );
        // validity = ttl − elapsed − drift, counted from before the first request.
        let validity = guard.lease_deadline().saturating_duration_since(start);
        assert!(validity <= TTL - Duration::from_millis(450) - Duration::from_millis(102));
        assert!(validity >= TTL - elapsed - Duration::from_millis(103));
        fleet.servers[0].resume().unwrap();
        fleet.servers[1].resume().unwrap();
        assert!(guard.release_counted().await.unwrap() >= 3);
    }
}

// Single servers only: pauses a master (SIGSTOP on its one server process).
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_acquisition_releases_on_every_master_in_the_background() {
        let fleet = Fleet::start(5).await;
        let rl = fleet.redlock();
        let mut raws = fleet.raws().await;
        fleet.servers[0].pause().unwrap();
        // The round waits for the paused master; drop it while the others already said yes.
        let dropped = tokio::time::timeout(Duration::from_millis(150), rl.try_acquire("h", TTL)).await;
        assert!(dropped.is_err(), "the round was still waiting");
        let deadline = Instant::now() + Duration::from_secs(5);
        for c in raws.iter_mut().skip(1) {
            while exists(c, &lock_key("h")).await {
                assert!(Instant::now() < deadline, "not released in the background");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // The paused master gets the SET and then the release, in order, once resumed.
        fleet.servers[0].resume().unwrap();
        while exists(&mut raws[0], &lock_key("h")).await {
            assert!(
                Instant::now() < deadline,
                "not released on the resumed master"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_keeps_the_lock_across_five_ttls_and_a_contender_never_gets_it() {
        let ttl = Duration::from_millis(300);
        let fleet = Fleet::start(3).await;
        let rl = fleet.redlock();
        let mut guard = rl.try_acquire("w", ttl).await.unwrap().expect("acquired");
        guard.start_watchdog(None);
        assert!(guard.has_watchdog());
        let first = guard.lease_deadline();
        let mut others = Vec::new();
        for s in &fleet.servers {
            others.push(client(s).await);
        }
        let rl2 = Redlock::new(&others).unwrap();
        let until = Instant::now() + 5 * ttl;
        while Instant::now() < until {
            assert!(
                rl2.try_acquire("w", ttl).await.unwrap().is_none(),
                "a contender got the lock while the watchdog held it"
            );
            assert!(
                !guard.lost_token().is_cancelled(),
                "{:?}",
                guard.loss_reason()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(guard.lease_deadline() > first, "the deadline moved");
        assert!(guard.lease_deadline() > Instant::now());
        assert!(guard.loss_reason().is_none());
        let mut raws = fleet.raws().await;
        assert_eq!(holding(&mut raws, &lock_key("w"), guard.token()).await, 3);
        assert_eq!(guard.release_counted().await.unwrap(), 3);
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn losing_the_quorum_fires_the_loss_signal_within_a_ttl() {
        let ttl = Duration::from_millis(300);
        let fleet = Fleet::start(3).await;
        let rl = fleet.redlock();
        let mut guard = rl.try_acquire("q", ttl).await.unwrap().expect("acquired");
        guard.start_watchdog(None);
        let lost = guard.lost_token();
        tokio::time::sleep(ttl).await;
        assert!(!lost.is_cancelled(), "{:?}", guard.loss_reason());
        let mut raws = fleet.raws().await;
        for c in raws.iter_mut().take(2) {
            let _: () = redis::cmd("SET")
                .arg(lock_key("q"))
                .arg("foreign")
                .arg("PX")
                .arg(10_000)
                .query_async(c)
                .await
                .unwrap();
        }
        let overwritten = Instant::now();
        tokio::time::timeout(ttl + Duration::from_millis(50), guard.lost())
            .await
            .expect("the loss signal fired within a ttl");
        let after = overwritten.elapsed();
        let reason = guard.loss_reason().expect("a reason");
        assert!(reason.contains("no quorum"), "{reason}");
        eprintln!("loss signal {after:?} after the overwrite: {reason}");
        // The foreign values are untouched: a lost lock deletes nothing.
        assert_eq!(
            get(&mut raws[0], &lock_key("q")).await.as_deref(),
            Some("foreign")
        );
        assert_eq!(
            get(&mut raws[1], &lock_key("q")).await.as_deref(),
            Some("foreign")
        );
        assert_eq!(guard.release_counted().await.unwrap(), 1);
        assert_eq!(
            get(&mut raws[0], &lock_key("q")).await.as_deref(),
            Some("foreign")
        );
    }
}

// Single servers only: kills a master and restarts it on the same port; build_lazy takes a single server's URL.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_master_down_at_start_is_one_failed_vote_and_rejoins_once_back() {
        let mut servers: Vec<RedisServer> = (0..3).map(|_| server().into_single()).collect();
        servers[0].kill();
        let url = |s: &RedisServer| s.url_for(common::TEST_USER, common::TEST_PASSWORD);
        // `connect` reports the down master at once; `build_lazy` does not need it.
        let err = Client::connect(url(&servers[0])).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let clients: Vec<Client> = servers
            .iter()
            .map(|s| Client::builder(url(s)).build_lazy().expect("no I/O"))
            .collect();
        let rl = Redlock::new(&clients).expect("3 masters");
        let guard = rl.try_acquire("late", TTL).await.unwrap().expect("2 of 3");
        assert_eq!(guard.release_counted().await.unwrap(), 2);
        // Back on the same port: it votes again.
        servers[0].restart().unwrap();
        let start = Instant::now();
        loop {
            let guard = rl.try_acquire("late", TTL).await.unwrap().expect("free");
            if guard.release_counted().await.unwrap() == 3 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the restarted master never rejoined"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[test]
fn build_lazy_outside_a_runtime_is_a_config_error() {
    let err = Client::builder("redis://127.0.0.1:1/")
        .build_lazy()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// Generic over the guard: would not compile without [`LeaseGuard`]. Checks what every held
/// lease answers, then releases it.
async fn hold_then_release(mut guard: impl LeaseGuard) -> (String, bool) {
    assert!(!guard.is_lost() && guard.loss_reason().is_none());
    assert!(!guard.lost_token().is_cancelled());
    assert!(guard.lease_deadline() > Instant::now());
    let before = guard.lease_deadline();
    assert!(guard.extend(TTL * 2).await.unwrap());
    assert!(
        guard.lease_deadline() > before,
        "the extension moved the deadline"
    );
    guard.start_watchdog(Some(Duration::from_secs(60)));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), guard.lost())
            .await
            .is_err(),
        "not lost while held"
    );
    let key = guard.key().to_string();
    (key, guard.release().await.unwrap())
}

fn fence(guard: &impl Fenced) -> u64 {
    guard.fencing_token()
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_lease_guard_answers_the_same_trait() {
        let fleet = Fleet::start(3).await;
        let c = &fleet.clients[0];
        let m = c.locks().try_acquire("g-m", TTL).await.unwrap().expect("free");
        let f = c.fair_locks().try_acquire("g-f", TTL).await.unwrap().expect("free");
        let r = fleet.redlock().try_acquire("g-r", TTL).await.unwrap().expect("free");
        assert!(fence(&m) > 0 && fence(&f) > 0);
        assert_eq!(hold_then_release(m).await, ("g-m".to_string(), true));
        assert_eq!(hold_then_release(f).await, ("g-f".to_string(), true));
        assert_eq!(hold_then_release(r).await, ("g-r".to_string(), true));
        // Released for real: each is free again.
        assert!(c.locks().try_acquire("g-m", TTL).await.unwrap().is_some());
        assert!(c.fair_locks().try_acquire("g-f", TTL).await.unwrap().is_some());
        assert!(fleet.redlock().try_acquire("g-r", TTL).await.unwrap().is_some());
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_lock_runs_the_work_once_and_releases_on_every_master() {
        let fleet = Fleet::start(3).await;
        let rl = fleet.redlock();
        let runs = std::sync::atomic::AtomicU32::new(0);
        let out = rl
            .with_lock("w", TTL, &RedlockOptions::default(), |_| {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { 42 }
            })
            .await
            .unwrap();
        assert_eq!((out, runs.load(std::sync::atomic::Ordering::SeqCst)), (42, 1));
        let mut raws = fleet.raws().await;
        for c in raws.iter_mut() {
            assert!(!exists(c, &lock_key("w")).await, "released everywhere");
        }
        // Taken over on every master during the work: the watchdog's next round finds no
        // quorum, the work is dropped, and the loss is reported without a fencing token.
        let lost = rl
            .with_lock("w", Duration::from_millis(300), &RedlockOptions::default(), |_| async {
                for c in fleet.raws().await.iter_mut() {
                    let _: () = redis::cmd("SET")
                        .arg(lock_key("w"))
                        .arg("someone else")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(c)
                        .await
                        .unwrap();
                }
                std::future::pending::<()>().await
            })
            .await
            .unwrap_err();
        assert!(
            matches!(lost, Error::LeaseLost { fencing_token: None, .. }),
            "{lost:?}"
        );
    }
}
