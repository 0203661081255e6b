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
