//! The semaphore against real servers: one scenario list run on Redis, Valkey, a Redis Cluster,
//! a Sentinel set and PostgreSQL (as the least-privilege role); the scenarios that read Redis
//! keys or write fenced values (Redis only) skip PostgreSQL.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::prelude::*;
use baton::{ErrorKind, LockOptions};
use common::*;

const LEASE: Duration = Duration::from_secs(10);

scenario! {
    postgres:
    #[tokio::test]
    async fn n_holders_take_the_lowest_free_slots_and_the_next_is_refused() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        let mut held = Vec::new();
        for want in 0..3u32 {
            let g = sems.try_acquire("pool", 3, LEASE).await.unwrap().expect("a free permit");
            assert_eq!(g.slot(), want);
            assert!(g.fencing_token() > 0);
            held.push(g);
        }
        assert!(sems.try_acquire("pool", 3, LEASE).await.unwrap().is_none());
        // Freeing the middle slot: the next grant takes it, the lowest free one.
        let middle = held.remove(1);
        assert!(middle.release().await.unwrap());
        let g = sems.try_acquire("pool", 3, LEASE).await.unwrap().expect("a freed permit");
        assert_eq!(g.slot(), 1);
        assert!(sems.try_acquire("pool", 3, LEASE).await.unwrap().is_none());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_waiter_gets_the_permit_a_release_frees() {
        let srv = server();
        let first = client(&srv).await;
        let other = client(&srv).await;
        let sems = first.semaphores();
        let a = sems.try_acquire("wait", 1, LEASE).await.unwrap().unwrap();
        let opts = LockOptions::builder().wait(Duration::from_secs(30)).build().unwrap();
        let waiter = tokio::spawn(async move {
            other.semaphores().acquire("wait", 1, LEASE, &opts).await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "granted while the only permit was held");
        let before = a.fencing_token();
        assert!(a.release().await.unwrap());
        let b = waiter.await.unwrap().unwrap();
        assert_eq!(b.slot(), 0);
        assert!(b.fencing_token() > before);
        // A bounded wait on a full semaphore ends in NotAcquired.
        let opts = LockOptions::builder().max_tries(2).build().unwrap();
        let e = sems.acquire("wait", 1, LEASE, &opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAcquired, "{e}");
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_crashed_holders_permit_returns_after_its_lease_with_a_higher_token() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        let short = Duration::from_millis(300);
        let a = sems.try_acquire("crash", 1, short).await.unwrap().unwrap();
        let old = a.fencing_token();
        // A crash: the guard is forgotten, nothing releases it.
        std::mem::forget(a);
        assert!(sems.try_acquire("crash", 1, LEASE).await.unwrap().is_none());
        let opts = LockOptions::builder().wait(Duration::from_secs(10)).build().unwrap();
        let b = sems.acquire("crash", 1, LEASE, &opts).await.unwrap();
        assert_eq!(b.slot(), 0);
        assert!(b.fencing_token() > old, "{} after {old}", b.fencing_token());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn per_slot_tokens_strictly_increase_across_regrants() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        let mut last = [0u64; 2];
        for _ in 0..50 {
            let a = sems.try_acquire("tokens", 2, LEASE).await.unwrap().unwrap();
            let b = sems.try_acquire("tokens", 2, LEASE).await.unwrap().unwrap();
            for g in [&a, &b] {
                let s = g.slot() as usize;
                assert!(g.fencing_token() > last[s], "slot {s}: {} after {}", g.fencing_token(), last[s]);
                last[s] = g.fencing_token();
            }
            assert!(a.release().await.unwrap());
            assert!(b.release().await.unwrap());
        }
    }
}

scenario! {
    #[tokio::test]
    async fn a_regranted_slot_fences_off_a_stale_holders_write() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        // The resource side: a permit of slot 0 re-granted refuses the old holder's write.
        let old = sems.try_acquire("tokens", 2, LEASE).await.unwrap().unwrap();
        assert_eq!(old.slot(), 0);
        let stale = old.fencing_token();
        assert!(old.release().await.unwrap());
        let new = sems.try_acquire("tokens", 2, LEASE).await.unwrap().unwrap();
        assert_eq!(new.slot(), 0);
        let resource = "baton:resource:sem";
        assert_eq!(new.write_fenced(resource, "new").await.unwrap(), baton::FencedWrite::Written);
        let refused = sems.write_fenced(resource, 0, stale, "stale").await.unwrap();
        assert!(matches!(refused, baton::FencedWrite::Rejected { .. }), "{refused:?}");
        let read = new.read_fenced(resource).await.unwrap().unwrap();
        assert_eq!(read.value, b"new".to_vec());
        assert_eq!(read.fencing_token, new.fencing_token());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn another_limit_is_a_typed_error_and_set_limit_lower_keeps_holders() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        let a = sems.try_acquire("limit", 3, LEASE).await.unwrap().unwrap();
        let b = sems.try_acquire("limit", 3, LEASE).await.unwrap().unwrap();
        let c = sems.try_acquire("limit", 3, LEASE).await.unwrap().unwrap();
        let e = sems.try_acquire("limit", 5, LEASE).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        let text = e.to_string();
        assert!(text.contains('3') && text.contains('5'), "{text}");
        // Lowered to 1 under three holders: they keep their permits ...
        assert_eq!(sems.set_limit("limit", 1).await.unwrap(), Some(3));
        let mut a = a;
        assert!(a.extend(LEASE).await.unwrap());
        assert!(sems.try_acquire("limit", 1, LEASE).await.unwrap().is_none());
        // ... and nothing is granted until fewer than one is held.
        assert!(a.release().await.unwrap());
        assert!(b.release().await.unwrap());
        assert!(sems.try_acquire("limit", 1, LEASE).await.unwrap().is_none());
        assert!(c.release().await.unwrap());
        let d = sems.try_acquire("limit", 1, LEASE).await.unwrap().unwrap();
        assert_eq!(d.slot(), 0);
        // The old limit is refused now.
        let e = sems.try_acquire("limit", 3, LEASE).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
    }
}

scenario! {
    #[tokio::test]
    async fn release_extend_and_the_loss_signal_as_the_mutex() {
        let srv = server();
        let client = client(&srv).await;
        let mut conn = raw(&srv).await;
        let sems = client.semaphores();
        let mut g = sems.try_acquire("loss", 2, LEASE).await.unwrap().unwrap();
        let slot_key = format!("baton:sem:{{loss}}:{}", g.slot());
        assert_eq!(get(&mut conn, &slot_key).await.as_deref(), Some(g.token()));
        assert!(g.extend(Duration::from_secs(20)).await.unwrap());
        assert!(pttl(&mut conn, &slot_key).await > 10_000);
        // Another token in the slot (an operator, a takeover): the extension is refused and the
        // loss signal fires; the release deletes nothing.
        let _: () = redis::cmd("SET")
            .arg(&slot_key)
            .arg("someone-else")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!g.extend(LEASE).await.unwrap());
        assert!(g.is_lost());
        assert!(!g.release().await.unwrap());
        assert_eq!(get(&mut conn, &slot_key).await.as_deref(), Some("someone-else"));
        // with_permit runs the work (slot 0 is still someone else's) and releases.
        let slot = sems
            .with_permit("loss", 2, LEASE, &LockOptions::default(), |g| {
                let s = g.slot();
                async move { s }
            })
            .await
            .unwrap();
        assert_eq!(slot, 1);
        let free = sems.try_acquire("loss", 2, LEASE).await.unwrap().unwrap();
        assert_eq!(free.slot(), 1);
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn extend_release_and_a_lost_permit_through_the_guard() {
        let srv = server();
        let client = client(&srv).await;
        let sems = client.semaphores();
        let mut a = sems.try_acquire("guard", 2, LEASE).await.unwrap().unwrap();
        assert!(a.extend(Duration::from_secs(20)).await.unwrap());
        let short = Duration::from_millis(200);
        let mut b = sems.try_acquire("guard", 2, short).await.unwrap().unwrap();
        assert_eq!(b.slot(), 1);
        // Its lease ends and another takes the slot: the extension is refused, the loss signal
        // fires and the release frees nothing of the new holder's.
        let opts = LockOptions::builder().wait(Duration::from_secs(10)).build().unwrap();
        let c = sems.acquire("guard", 2, LEASE, &opts).await.unwrap();
        assert_eq!(c.slot(), 1);
        assert!(!b.extend(LEASE).await.unwrap());
        assert!(b.is_lost());
        assert!(!b.release().await.unwrap());
        assert!(sems.try_acquire("guard", 2, LEASE).await.unwrap().is_none());
        assert!(a.release().await.unwrap());
        let slot = sems
            .with_permit("guard", 2, LEASE, &LockOptions::default(), |g| {
                let s = g.slot();
                async move { s }
            })
            .await
            .unwrap();
        assert_eq!(slot, 0);
        assert!(c.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn fair_waiters_are_granted_in_arrival_order_across_clients_and_nobody_barges() {
        let srv = server();
        let first = client(&srv).await;
        let sems = first.semaphores();
        let a = sems.try_acquire("line", 1, LEASE).await.unwrap().unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let fair = LockOptions::builder()
            .fair(true)
            .wait(Duration::from_secs(30))
            .build()
            .unwrap();
        let mut waiters = Vec::new();
        for i in 0..3u32 {
            // Each waiter on a client of its own (so each client's wake-one reaches it), asking
            // after the one before it joined the line.
            let (c, order, fair) = (client(&srv).await, order.clone(), fair.clone());
            waiters.push(tokio::spawn(async move {
                let g = c.semaphores().acquire("line", 1, LEASE, &fair).await?;
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(50)).await;
                g.release().await
            }));
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        assert!(order.lock().unwrap().is_empty(), "granted while the only permit was held");
        assert!(a.release().await.unwrap());
        // A try outside the line waits behind it: it is granted only once every waiter was.
        loop {
            if let Some(g) = sems.try_acquire("line", 1, LEASE).await.unwrap() {
                assert_eq!(order.lock().unwrap().len(), 3, "a try outside the line barged in");
                g.release().await.unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for w in waiters {
            assert!(w.await.unwrap().unwrap());
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_fair_waiter_that_gives_up_leaves_the_line_at_once_and_a_dead_ones_place_ends() {
        let srv = server();
        let first = client(&srv).await;
        let other = client(&srv).await;
        let sems = first.semaphores();
        let a = sems.try_acquire("leave", 1, LEASE).await.unwrap().unwrap();
        // Gives up after its wait: it leaves the line, so once the permit is free a try outside
        // the line gets it long before the place's 60 s liveness would have ended.
        let patient = LockOptions::builder()
            .fair(true)
            .waiter_timeout(Duration::from_secs(60))
            .wait(Duration::from_millis(300))
            .build()
            .unwrap();
        let e = other.semaphores().acquire("leave", 1, LEASE, &patient).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAcquired, "{e}");
        assert!(a.release().await.unwrap());
        let mut got = None;
        for _ in 0..200 {
            got = sems.try_acquire("leave", 1, LEASE).await.unwrap();
            if got.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let b = got.expect("the waiter that gave up still holds its place in the line");
        // A waiter that stops without leaving (its process frozen: the future neither polled
        // nor dropped) keeps its place until its waiter timeout, then the line goes on.
        let frozen = LockOptions::builder()
            .fair(true)
            .waiter_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        let other_sems = other.semaphores();
        let mut waiting = Box::pin(other_sems.acquire("leave", 1, LEASE, &frozen));
        assert!(tokio::time::timeout(Duration::from_millis(300), &mut waiting).await.is_err());
        std::mem::forget(waiting);
        assert!(b.release().await.unwrap());
        assert!(
            sems.try_acquire("leave", 1, LEASE).await.unwrap().is_none(),
            "a try outside the line went ahead of a live place"
        );
        let opts = LockOptions::builder().wait(Duration::from_secs(30)).build().unwrap();
        let c = sems.acquire("leave", 1, LEASE, &opts).await.unwrap();
        assert_eq!(c.slot(), 0);
    }
}

scenario! {
    #[tokio::test]
    async fn fair_is_the_semaphores_option_and_waiter_timeout_needs_it() {
        let srv = server();
        let client = client(&srv).await;
        let fair = LockOptions::builder().fair(true).build().unwrap();
        let e = client.locks().acquire("m", LEASE, &fair).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("`fair`"), "{e}");
        let e = client.rw_locks().read("m", LEASE, &fair).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let lonely = LockOptions::builder()
            .waiter_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let e = client.semaphores().acquire("m", 2, LEASE, &lonely).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("without `fair`"), "{e}");
        let g = client.semaphores().acquire("m", 2, LEASE, &fair).await.unwrap();
        assert_eq!(g.slot(), 0);
    }
}
