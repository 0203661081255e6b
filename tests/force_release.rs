//! `force_release`, an operator taking a grant from a hung holder (`baton unlock`), on the
//! fair lock and leader election (the mutex's is tested through `baton unlock` in
//! tests/cli_status.rs): the holder learns of the loss, and the next grant's fencing token is
//! higher than the taken one.
#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use baton::ElectionOptions;
use common::*;

const WITHIN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_locks_hung_holder_loses_it_and_the_next_token_is_higher() {
    let server = server();
    let (a, op) = (client(&server).await, client(&server).await);
    let mut held = a
        .fair_locks()
        .try_acquire("report", Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free");
    held.start_watchdog(None);
    let taken = op
        .fair_locks()
        .force_release("report")
        .await
        .unwrap()
        .expect("it was held");
    assert_eq!(taken.fencing_token, Some(held.fencing_token()));
    // The holder's next extension (every ttl/3) finds the lock gone and reports the loss.
    tokio::time::timeout(WITHIN, held.lost())
        .await
        .expect("the holder was told of the loss");
    let next = op
        .fair_locks()
        .try_acquire("report", Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free after the unlock");
    assert!(next.fencing_token() > held.fencing_token());
    assert!(!held.release().await.unwrap(), "no longer the holder's");
    assert!(op
        .fair_locks()
        .force_release("nothing")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_term_taken_ends_it_and_the_next_term_is_higher() {
    let server = server();
    let (a, b, op) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let opts = |name: &str| {
        ElectionOptions::builder()
            .lease(Duration::from_secs(3))
            .name(name)
            .build()
            .unwrap()
    };
    let leader = a.leaders().elector("jobs", &opts("a")).unwrap();
    let term = leader.campaign().await.unwrap();
    let taken = op
        .leaders()
        .force_release("jobs")
        .await
        .unwrap()
        .expect("a leader held it");
    assert_eq!(taken.holder, "a");
    assert_eq!(taken.fencing_token, Some(term.number()));
    tokio::time::timeout(WITHIN, term.lost())
        .await
        .expect("the leader was told its term ended");
    let standby = b.leaders().elector("jobs", &opts("b")).unwrap();
    let next = tokio::time::timeout(WITHIN, standby.campaign())
        .await
        .expect("the election was free")
        .unwrap();
    assert!(
        next.number() > term.number(),
        "{} then {}",
        term.number(),
        next.number()
    );
}
