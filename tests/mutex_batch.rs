//! The mutex's group commit against real redis-servers: lock calls of many tasks of one client
//! that overlap leave together as one script call, and each keeps the guarantees of a lone call
//! (its own fence, one grant per lock, a dropped or lost call leaves no lock behind, tokens only
//! grow across a restart without data). Counts (`INFO commandstats`), never times, are asserted.

mod common;

use baton::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton::{AcquireOptions, Client, ErrorKind, LockGuard};
use common::{client, command_calls, get, raw, server, Endpoint, TEST_PASSWORD, TEST_USER};
use tokio::time::Instant;

fn lock_key(name: &str) -> String {
    format!("baton:lock:{{{name}}}")
}

fn fence_key(name: &str) -> String {
    format!("baton:lock:{{{name}}}:fence")
}

const TTL: Duration = Duration::from_secs(10);

/// `EVALSHA` calls the server ran.
async fn evalsha(r: &mut common::Raw) -> u64 {
    command_calls(r).await.get("evalsha").copied().unwrap_or(0)
}

type Tried = (String, Result<Option<LockGuard>, baton::Error>);

/// `n` tasks try `key_of(i)` at once (released together by the barrier) and hold what they got:
/// the outcomes, by task.
async fn try_wave(c: &Client, n: usize, key_of: impl Fn(usize) -> String) -> Vec<Tried> {
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (locks, start, key) = (c.locks(), start.clone(), key_of(i));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let g = locks.try_acquire(&key, TTL).await;
            (key, g)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// [`try_wave`], every try answered.
async fn wave(
    c: &Client,
    n: usize,
    key_of: impl Fn(usize) -> String,
) -> Vec<(String, Option<LockGuard>)> {
    let tried = try_wave(c, n, key_of).await;
    tried
        .into_iter()
        .map(|(k, g)| (k, g.expect("try_acquire")))
        .collect()
}

/// A client of `server` and a raw connection, with the lone and the batch scripts loaded, so
/// that counts of `EVALSHA` are of lock calls only.
async fn warmed(server: &common::Deployment) -> (Client, common::Raw) {
    let c = client(server).await;
    release_all(wave(&c, 16, |i| format!("warm{i}")).await).await;
    (c, raw(server).await)
}

/// Releases every guard at once; each must still have been ours.
async fn release_all(grants: Vec<(String, Option<LockGuard>)>) {
    let mut tasks = Vec::new();
    for (_, g) in grants {
        if let Some(g) = g {
            tasks.push(tokio::spawn(async move { g.release().await }));
        }
    }
    for t in tasks {
        assert!(t.await.unwrap().expect("release"), "released our own lock");
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sixty_four_tasks_share_script_calls_and_each_grant_keeps_its_own_fence() {
        let server = server();
        let (c, mut r) = warmed(&server).await;

        let before = evalsha(&mut r).await;
        let tasks = 64usize;
        let rounds = 20usize;
        let start = Arc::new(tokio::sync::Barrier::new(tasks));
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (locks, start) = (c.locks(), start.clone());
            handles.push(tokio::spawn(async move {
                start.wait().await;
                let key = format!("k{t}");
                let mut fences = Vec::new();
                for _ in 0..rounds {
                    let g = locks
                        .acquire(&key, TTL, &AcquireOptions::default())
                        .await
                        .expect("acquire");
                    fences.push(g.fencing_token());
                    assert!(g.release().await.expect("release"), "ours");
                }
                fences
            }));
        }
        let mut granted = 0u64;
        for h in handles {
            let fences = h.await.unwrap();
            granted += fences.len() as u64;
            assert!(
                fences.windows(2).all(|w| w[0] < w[1]),
                "a key's fencing tokens only grow: {fences:?}"
            );
        }
        let calls = evalsha(&mut r).await - before;
        eprintln!("{granted} grants and as many releases in {calls} EVALSHA calls");
        assert_eq!(granted, (tasks * rounds) as u64);
        // 2 × granted lock calls went out (each acquisition and each release); batched, they
        // took far fewer script calls than grants alone.
        assert!(calls < granted, "{calls} script calls for {granted} grants");
    }
}

scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_with_many_tries_of_one_lock_grants_it_once_with_a_higher_fence() {
        let server = server();
        let c = client(&server).await;
        let mut r = raw(&server).await;
        let keys = 8usize;
        // A first holder of each key, so each fence has a value to step from.
        let first = wave(&c, keys, |i| format!("s{i}")).await;
        let mut fence_before = HashMap::new();
        for (k, g) in &first {
            fence_before.insert(k.clone(), g.as_ref().expect("free").fencing_token());
        }
        release_all(first).await;

        let before = evalsha(&mut r).await;
        let grants = wave(&c, 64, |i| format!("s{}", i % keys)).await;
        let calls = evalsha(&mut r).await - before;
        let mut won: HashMap<String, u64> = HashMap::new();
        for (k, g) in &grants {
            if let Some(g) = g {
                assert!(
                    won.insert(k.clone(), g.fencing_token()).is_none(),
                    "{k} granted twice"
                );
            }
        }
        // Nobody released in between: exactly one grant per lock, each with its own fence,
        // above the one before.
        assert_eq!(won.len(), keys, "{won:?}");
        for (k, f) in &won {
            assert!(*f > fence_before[k], "{k}: {f} after {}", fence_before[k]);
            let stored: u64 = get(&mut r, &fence_key(k)).await.unwrap().parse().unwrap();
            assert_eq!(stored, *f, "{k}: the fence stored is the one granted");
        }
        eprintln!("64 tries of {keys} locks in {calls} EVALSHA calls");
        assert!(calls < 64, "{calls} script calls for 64 tries");
        release_all(grants).await;
    }
}

// Single server only: pauses THE server (SIGSTOP) so that a lone call stays in flight.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_dropped_while_queued_is_removed_and_nothing_is_sent_for_it() {
        let server = server();
        let (c, mut r) = warmed(&server).await;
        let before = evalsha(&mut r).await;

        server.pause().unwrap();
        // Two lone calls, in flight on the paused server: every place of the lane is taken.
        let lone = |name: &'static str| {
            let locks = c.locks();
            tokio::spawn(async move { locks.try_acquire(name, TTL).await })
        };
        let (first, second) = (lone("first"), lone("second"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Queued behind it, and dropped before anything was sent.
        let dropped = tokio::time::timeout(
            Duration::from_millis(100),
            c.locks().try_acquire("queued", TTL),
        )
        .await;
        assert!(dropped.is_err(), "queued behind a call to a paused server");
        server.resume().unwrap();

        let g = first.await.unwrap().expect("first").expect("free");
        let g2 = second.await.unwrap().expect("second").expect("free");
        // Whatever a background task would have sent has had its time.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            evalsha(&mut r).await - before,
            2,
            "only the lone calls reached the server: no batch, no release by token"
        );
        assert!(g2.release().await.unwrap());
        assert_eq!(get(&mut r, &lock_key("queued")).await, None);
        assert_eq!(get(&mut r, &fence_key("queued")).await, None, "never ran");
        assert!(g.release().await.unwrap());
        assert!(c.locks().try_acquire("queued", TTL).await.unwrap().is_some());
    }
}

// Single server only: pauses THE server (SIGSTOP) while a batch is in flight.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_whose_reply_is_lost_leaves_no_lock_behind() {
        let server = server();
        let c = Client::builder(server.user_url(TEST_USER, TEST_PASSWORD))
            .response_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect");
        let mut r = raw(&server).await;
        release_all(wave(&c, 16, |i| format!("warm{i}")).await).await;

        server.pause().unwrap();
        // Two lone calls in flight (every place of the lane); four callers queue behind them.
        let lone = |name: &'static str| {
            let locks = c.locks();
            tokio::spawn(async move { locks.try_acquire(name, TTL).await })
        };
        let (lone, lone2) = (lone("lone"), lone("lone2"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut members = Vec::new();
        for i in 0..4 {
            let locks = c.locks();
            members.push(tokio::spawn(async move {
                locks.try_acquire(&format!("m{i}"), TTL).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A lone caller gives up: its place passes to the queue, whose batch leaves for the
        // paused server and gets no reply.
        lone.abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // One member gives up after its batch left; the others run into their timeout.
        members[0].abort();
        let mut outcomes = Vec::new();
        for m in members.drain(1..) {
            outcomes.push(m.await.unwrap());
        }
        for o in &outcomes {
            let e = o.as_ref().expect_err("no reply from a paused server");
            assert!(
                matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Connection),
                "as a lone call's lost reply: {e:?}"
            );
        }
        server.resume().unwrap();

        // The batch ran when the server resumed (each member's fence stepped), and every lock
        // it took was released by token behind it: none stays for its 10 s ttl.
        let names = ["lone", "lone2", "m0", "m1", "m2", "m3"];
        let start = Instant::now();
        loop {
            let mut left = Vec::new();
            for n in names {
                if get(&mut r, &lock_key(n)).await.is_some() {
                    left.push(n);
                }
            }
            if left.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "locks left behind: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The other lone call ran into its timeout too.
        assert!(lone2.await.unwrap().is_err(), "no reply from a paused server");
        for n in names {
            assert!(
                get(&mut r, &fence_key(n)).await.is_some(),
                "{n}: the script ran"
            );
            assert!(
                c.locks().try_acquire(n, TTL).await.unwrap().is_some(),
                "{n} is free"
            );
        }
    }
}

// Single server only: restarts THE server without its data.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batched_fencing_tokens_only_grow_across_a_restart_without_data() {
        let mut server = server();
        let c = client(&server).await;
        let n = 32usize;
        let key_of = |i: usize| format!("r{i}");
        let mut last: HashMap<String, u64> = HashMap::new();
        let grants = wave(&c, n, key_of).await;
        for (k, g) in &grants {
            last.insert(k.clone(), g.as_ref().expect("free").fencing_token());
        }
        release_all(grants).await;

        server.restart().expect("restart without persistence");
        let mut r = raw(&server).await;
        assert_eq!(get(&mut r, &fence_key("r0")).await, None, "data lost");
        // The client reconnects on its own: waves until one goes through whole.
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let before = evalsha(&mut r).await;
            let mut got = Vec::new();
            let mut failed = None;
            for tried in try_wave(&c, n, key_of).await {
                match tried {
                    (k, Ok(g)) => got.push((k, g)),
                    (_, Err(e)) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                assert!(
                    e.is_retryable() && Instant::now() < give_up,
                    "after the restart: {e}"
                );
                release_all(got).await;
                // Locks a failed wave's lost calls took are released by token; wait for that.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let calls = evalsha(&mut r).await - before;
            for (k, g) in &got {
                let f = g.as_ref().expect("free after the restart").fencing_token();
                assert!(f > last[k], "{k}: {f} after {} (before the restart)", last[k]);
            }
            eprintln!("{n} grants after the restart in {calls} EVALSHA calls");
            release_all(got).await;
            break;
        }
    }
}
