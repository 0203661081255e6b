//! The read-write lock against real servers: each scenario runs on Redis, Valkey, the Cluster,
//! Sentinel and PostgreSQL (as the least-privilege role the harness makes).
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::prelude::*;
use baton::{ErrorKind, LockOptions, RwLocks};
use common::{client, server};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(10);

fn waiting_up_to(d: Duration) -> LockOptions {
    LockOptions::builder().wait(d).build().unwrap()
}

/// Tries a read until one is refused (a writer's mark is up), releasing the shares it got;
/// panics after `within`.
async fn until_reads_are_refused(locks: &RwLocks, key: &str, within: Duration) {
    let give_up = Instant::now() + within;
    loop {
        match locks.try_read(key, LONG).await.unwrap() {
            None => return,
            Some(g) => assert!(g.release().await.unwrap()),
        }
        assert!(Instant::now() < give_up, "reads were never refused");
        tokio::task::yield_now().await;
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn readers_share_and_a_writer_excludes() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let (ra, rb) = (a.rw_locks(), b.rw_locks());
        let r1 = ra.try_read("doc", LONG).await.unwrap().expect("free");
        let r2 = rb.try_read("doc", LONG).await.unwrap().expect("readers share");
        assert_ne!(r1.token(), r2.token());
        assert!(rb.try_write("doc", LONG).await.unwrap().is_none(), "readers hold");
        // A single try does not wait, so it keeps no reader out.
        let r3 = ra.try_read("doc", LONG).await.unwrap().expect("no writer waits");
        for r in [r1, r2, r3] {
            assert!(r.release().await.unwrap());
        }
        let w = rb.try_write("doc", LONG).await.unwrap().expect("free again");
        assert!(ra.try_read("doc", LONG).await.unwrap().is_none(), "the writer excludes");
        assert!(rb.try_write("doc", LONG).await.unwrap().is_none(), "one writer");
        assert!(ra
            .try_upgradeable_read("doc", LONG)
            .await
            .unwrap()
            .is_none());
        let token = w.fencing_token();
        assert!(token > 0);
        assert!(w.release().await.unwrap());
        // A read carries the last write's token.
        let r = ra.try_read("doc", LONG).await.unwrap().expect("free");
        assert_eq!(r.fencing_token(), token);
        assert!(r.release().await.unwrap());
        // Write tokens strictly increase, across clients.
        let mut last = token;
        for i in 0..20 {
            let locks = if i % 2 == 0 { &ra } else { &rb };
            let w = locks.write("doc", LONG, &waiting_up_to(LONG)).await.unwrap();
            assert!(w.fencing_token() > last, "{} after {last}", w.fencing_token());
            last = w.fencing_token();
            assert!(w.release().await.unwrap());
        }
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_waiting_writer_blocks_new_readers_and_gets_in_after_the_current_ones() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let (ra, rb) = (a.rw_locks(), b.rw_locks());
        let mut reader = ra.try_read("pref", LONG).await.unwrap().expect("free");
        let writer = tokio::spawn({
            let rb = rb.clone();
            async move { rb.write("pref", LONG, &waiting_up_to(LONG)).await }
        });
        // The writer waits: new readers (and upgradeable readers) are refused from now on.
        until_reads_are_refused(&ra, "pref", LONG).await;
        assert!(ra
            .try_upgradeable_read("pref", LONG)
            .await
            .unwrap()
            .is_none());
        // The reader already holding keeps its share.
        assert!(reader.extend(LONG).await.unwrap());
        assert!(!writer.is_finished());
        assert!(reader.release().await.unwrap());
        let w = writer.await.unwrap().expect("the writer gets in after the last share");
        assert!(ra.try_read("pref", LONG).await.unwrap().is_none());
        let token = w.fencing_token();
        assert!(w.release().await.unwrap());
        // The grant took the writer's mark with it: readers get in at once, not after a stale
        // mark's lease (every try of one wait carries the token its mark was set with).
        let r = ra
            .try_read("pref", LONG)
            .await
            .unwrap()
            .expect("the mark went with the grant");
        assert_eq!(r.fencing_token(), token);
        assert!(r.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_crashed_readers_share_ends_with_its_lease() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let crashed = a
            .rw_locks()
            .try_read("crash", Duration::from_millis(300))
            .await
            .unwrap()
            .expect("free");
        let live = a.rw_locks().try_read("crash", LONG).await.unwrap().expect("shared");
        // The crashed reader never releases: its lease ends by the server's clock. The writer
        // still waits for the live one.
        std::mem::forget(crashed);
        assert!(b.rw_locks().try_write("crash", LONG).await.unwrap().is_none());
        assert!(live.release().await.unwrap());
        let w = b
            .rw_locks()
            .write("crash", LONG, &waiting_up_to(LONG))
            .await
            .expect("the crashed reader's share ended");
        assert!(w.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn upgrade_takes_a_new_token_and_downgrade_keeps_it() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let (ra, rb) = (a.rw_locks(), b.rw_locks());
        let w = ra.try_write("up", LONG).await.unwrap().expect("free");
        let first = w.fencing_token();
        assert!(w.release().await.unwrap());

        let mut u = ra.try_upgradeable_read("up", LONG).await.unwrap().expect("free");
        assert_eq!(u.fencing_token(), first, "a read carries the last write's token");
        assert!(!u.is_writing());
        assert!(
            rb.try_upgradeable_read("up", LONG).await.unwrap().is_none(),
            "one upgradeable reader at a time"
        );
        let r = rb.try_read("up", LONG).await.unwrap().expect("shared with plain readers");
        assert!(!u.try_upgrade().await.unwrap(), "a reader still holds");
        // The upgrade waits ahead of everyone: new readers and writers are refused.
        assert!(rb.try_read("up", LONG).await.unwrap().is_none());
        assert!(rb.try_write("up", LONG).await.unwrap().is_none());
        assert!(r.release().await.unwrap());
        u.upgrade(&waiting_up_to(LONG)).await.unwrap();
        assert!(u.is_writing());
        let second = u.fencing_token();
        assert!(second > first, "{second} after {first}");
        assert!(rb.try_read("up", LONG).await.unwrap().is_none(), "it writes now");
        // The upgraded guard extends its one lease.
        assert!(u.extend(LONG).await.unwrap());

        assert!(u.downgrade().await.unwrap());
        assert!(!u.is_writing());
        assert_eq!(u.fencing_token(), second, "a downgrade keeps the write's token");
        let r = rb.try_read("up", LONG).await.unwrap().expect("readers enter again");
        assert_eq!(r.fencing_token(), second);
        assert!(rb.try_write("up", LONG).await.unwrap().is_none(), "still upgradeable-held");
        assert!(r.release().await.unwrap());
        assert!(u.release().await.unwrap());
        let w = rb.try_write("up", LONG).await.unwrap().expect("free");
        assert!(w.fencing_token() > second);
        assert!(w.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_lost_lease_is_signalled_and_its_release_and_upgrade_say_so() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let short = Duration::from_millis(200);
        let mut stale = a.rw_locks().try_write("lost", short).await.unwrap().expect("free");
        let mut stale_up = a
            .rw_locks()
            .try_upgradeable_read("lost2", short)
            .await
            .unwrap()
            .expect("free");
        let holder = b
            .rw_locks()
            .write("lost", LONG, &waiting_up_to(LONG))
            .await
            .expect("the stale writer's lease ended");
        assert!(holder.fencing_token() > stale.fencing_token());
        assert!(!stale.extend(LONG).await.unwrap());
        assert!(stale.lost_token().is_cancelled(), "a refused extension signals loss");
        assert!(!stale.release().await.unwrap());
        assert!(holder.release().await.unwrap());

        let other = b
            .rw_locks()
            .upgradeable_read("lost2", LONG, &waiting_up_to(LONG))
            .await
            .expect("the stale upgradeable reader's lease ended");
        let err = stale_up.try_upgrade().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        assert!(!stale_up.extend(LONG).await.unwrap());
        assert!(other.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn with_read_and_with_write_release_after_the_work() {
        let server = server();
        let c = client(&server).await;
        let locks = c.rw_locks();
        let opts = LockOptions::default();
        let seen = locks
            .with_write("with", LONG, &opts, |g| {
                let t = g.fencing_token();
                async move { t }
            })
            .await
            .unwrap();
        let read = locks
            .with_read("with", LONG, &opts, |g| {
                let t = g.fencing_token();
                async move { t }
            })
            .await
            .unwrap();
        assert_eq!(read, seen);
        let w = locks.try_write("with", LONG).await.unwrap().expect("both released");
        assert!(w.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn a_writer_that_gives_up_lets_readers_in_again_once_its_mark_lapses() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let reader = a.rw_locks().try_read("gave-up", LONG).await.unwrap().expect("free");
        let bounded = LockOptions::builder().max_tries(2).build().unwrap();
        let err = b
            .rw_locks()
            .write("gave-up", Duration::from_millis(300), &bounded)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired);
        // Its mark (min(lease, 5 s) = 300 ms) lapses; a reader waiting for it gets in.
        let r = a
            .rw_locks()
            .read("gave-up", LONG, &waiting_up_to(LONG))
            .await
            .expect("the mark lapsed");
        assert!(r.release().await.unwrap());
        assert!(reader.release().await.unwrap());
    }
}

scenario! {
    postgres:
    #[tokio::test]
    async fn no_writer_ever_holds_beside_another_holder() {
        use std::sync::atomic::{AtomicI64, Ordering};
        use std::sync::Arc;
        let server = server();
        // Readers add one while they hold; a writer sets -1000 while it holds.
        let inside = Arc::new(AtomicI64::new(0));
        let mut tasks = Vec::new();
        for i in 0..6 {
            let c = client(&server).await;
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                let rw = c.rw_locks();
                let opts = waiting_up_to(Duration::from_secs(30));
                for _ in 0..8 {
                    if i < 2 {
                        let w = rw.write("mix", LONG, &opts).await.unwrap();
                        assert_eq!(inside.swap(-1000, Ordering::SeqCst), 0, "a writer beside a holder");
                        tokio::task::yield_now().await;
                        assert_eq!(inside.swap(0, Ordering::SeqCst), -1000);
                        assert!(w.release().await.unwrap());
                    } else {
                        let r = rw.read("mix", LONG, &opts).await.unwrap();
                        assert!(inside.fetch_add(1, Ordering::SeqCst) >= 0, "a reader beside the writer");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        assert!(r.release().await.unwrap());
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}

scenario! {
    #[tokio::test]
    async fn a_writer_whose_lease_ended_before_it_wrote_is_refused_once_a_reader_read() {
        use baton::FencedWrite;
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let (ra, rb) = (a.rw_locks(), b.rw_locks());
        // A first write, then a writer that pauses past its lease before writing: the readers
        // granted after it carry its token, as the last write's.
        let w1 = ra.try_write("fenced", LONG).await.unwrap().expect("free");
        assert_eq!(
            w1.write_fenced("baton:res:fenced", b"v1").await.unwrap(),
            FencedWrite::Written
        );
        assert!(w1.release().await.unwrap());
        let zombie = ra
            .try_write("fenced", Duration::from_millis(300))
            .await
            .unwrap()
            .expect("free");
        let reader = rb
            .read("fenced", LONG, &waiting_up_to(LONG))
            .await
            .expect("the writer's lease ends");
        assert_eq!(reader.fencing_token(), zombie.fencing_token());
        // The reader sees an older version than its token: that write never reached the
        // resource. Its read is recorded there...
        let seen = reader.read_fenced("baton:res:fenced").await.unwrap().expect("v1");
        assert_eq!(seen.value, b"v1");
        assert!(seen.fencing_token < reader.fencing_token());
        // ...so the paused writer, waking beside the reader, is refused.
        match zombie.write_fenced("baton:res:fenced", b"late").await.unwrap() {
            FencedWrite::Rejected { highest } => assert_eq!(highest, reader.fencing_token()),
            other => panic!("a writer whose lease ended wrote beside a reader: {other:?}"),
        }
        assert_eq!(
            reader.read_fenced("baton:res:fenced").await.unwrap().unwrap().value,
            b"v1"
        );
        assert!(reader.release().await.unwrap());
        // The next writer's token is higher than every read: it writes.
        let w3 = rb.write("fenced", LONG, &waiting_up_to(LONG)).await.unwrap();
        assert_eq!(
            w3.write_fenced("baton:res:fenced", b"v3").await.unwrap(),
            FencedWrite::Written
        );
        assert_eq!(w3.read_fenced("baton:res:fenced").await.unwrap().unwrap().value, b"v3");
        assert_eq!(
            w3.write_fenced("baton:res:fenced", b"v3b").await.unwrap(),
            FencedWrite::Written,
            "the writer's own read records nothing"
        );
    }
}
