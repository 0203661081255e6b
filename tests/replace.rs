//! `Failover::replace_attempt`, the fenced stop request a holder acts on, against real servers
//! (Redis, Valkey, the Cluster for the stop marker's slot, Sentinel, PostgreSQL): the holder
//! loses its attempt at once with the replacement named, its backups end without running it,
//! the marker is acknowledged once the work lets go (or ends with the old lease), and a later
//! grant carries a higher fencing token.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::prelude::*;
use baton::{Event, Expected, JobState, Replaced};
use common::*;
use tokio::time::Instant;

scenario! {
    postgres:
    #[tokio::test]
    async fn a_replaced_holder_stops_at_once_its_backups_end_and_it_acknowledges() {
        let srv = server();
        let client = client(&srv).await;
        // A long lease: every step below must come from the replacement, not from a timer.
        let cfg = job("rep").lease(Duration::from_secs(30)).watchdog(true).build().unwrap();
        let mut a = client.failover().start(cfg.clone());
        let held = acquired(&mut a, WAKE).await;
        let mut b = client.failover().start(cfg.clone());
        assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));

        // The wrong attempt named: nothing done.
        let other = client
            .failover()
            .replace_attempt(cfg.clone(), &Expected::Attempt(7), "ops")
            .await
            .unwrap();
        assert_eq!(other, Replaced::Other(1));

        // The holder subscribes to the job's channel alongside the work, not before handing it
        // out: a replacement in that first moment is found at the next extension instead.
        // Let the subscription settle so that this test sees the message path.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t0 = Instant::now();
        let replaced = client
            .failover()
            .replace_attempt(cfg.clone(), &Expected::Attempt(1), "tick 2")
            .await
            .unwrap();
        let Replaced::Stopped { attempt, lease_remaining } = replaced else {
            panic!("expected Stopped, got {replaced:?}");
        };
        assert_eq!(attempt, 1);
        assert!(lease_remaining > Duration::from_secs(20), "{lease_remaining:?}");

        // The holder hears it at once, with the replacement named; the handle is lost.
        let ev = next(&mut a, WAKE).await;
        assert!(
            matches!(ev, Event::LeaseLost { attempt: 1, ref reason } if reason == "replaced by tick 2"),
            "{ev:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(held.handle.is_lost());
        // The backup reads DONE and ends: nobody retries a replaced attempt.
        assert!(matches!(
            until_end(&mut b, WAKE).await.as_slice(),
            [Event::Completed { attempt: None }]
        ));
        let status = client.failover().job_status(cfg.clone()).await.unwrap();
        assert_eq!(status.state, JobState::Done);
        assert_eq!(
            status.last_failure.as_deref(),
            Some("attempt 1 replaced by tick 2")
        );

        // The marker stays while the work holds the attempt, and goes once it lets go.
        let marker = tokio::time::timeout(
            Duration::from_millis(300),
            client.failover().wait_out_stop(cfg.clone()),
        )
        .await;
        assert!(marker.is_err(), "the stop marker went before the work stopped");
        // The work ends as any work does on a lost lease: its `fail` is answered by the loss.
        let err = held.fail("stopped").await.unwrap_err();
        assert!(matches!(err, baton::Error::LeaseLost { .. }), "{err}");
        tokio::time::timeout(WAKE, client.failover().wait_out_stop(cfg.clone()))
            .await
            .expect("the acknowledgement deleted the marker")
            .unwrap();
        // Acknowledged already: nothing left to delete.
        assert!(!client.failover().acknowledge_stop(cfg.clone(), 1).await.unwrap());

        // Nothing live any more.
        assert_eq!(
            client
                .failover()
                .replace_attempt(cfg.clone(), &Expected::Any, "again")
                .await
                .unwrap(),
            Replaced::NotLive
        );
    }

    #[tokio::test]
    async fn an_unreachable_holders_marker_ends_with_its_lease_and_the_next_grant_is_fenced_higher() {
        let srv = server();
        let client = client(&srv).await;
        // Without the watchdog the lease is never extended: a holder that keeps its handle
        // (as a frozen process would) holds the marker until the lease's end by the server.
        let cfg = job("rep-frozen")
            .lease(Duration::from_millis(1500))
            .watchdog(false)
            .build()
            .unwrap();
        let mut a = client.failover().start(cfg.clone());
        let held = acquired(&mut a, WAKE).await;
        let old_token = held.fencing_token;
        let deadline = held.handle.lease_deadline();
        let replaced = client
            .failover()
            .replace_attempt(cfg.clone(), &Expected::Any, "next")
            .await
            .unwrap();
        assert!(matches!(replaced, Replaced::Stopped { attempt: 1, .. }), "{replaced:?}");
        // The work never lets go of its handle here: only the lease's end frees the marker.
        client.failover().wait_out_stop(cfg.clone()).await.unwrap();
        assert!(
            Instant::now() >= deadline,
            "wait_out_stop returned before the old lease could have ended"
        );
        drop(held);

        // The next occurrence's job (another key): its grant is fenced above the replaced one.
        let mut n = client.failover().start(job("rep-frozen-next").build().unwrap());
        let next_grant = acquired(&mut n, WAKE).await;
        assert!(
            next_grant.fencing_token > old_token,
            "{} <= {old_token}",
            next_grant.fencing_token
        );
        next_grant.done().await.unwrap();
    }
}
