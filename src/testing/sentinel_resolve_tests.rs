//! Tests of the transport's Sentinel resolver and `+switch-master` watcher
//! (`crate::backend::redis::sentinel`) against a real [`RedisSentinel`] set.
//!
//! They live here, in the testing layer, rather than inside `src/transport/sentinel.rs`: the
//! functions are crate-private (out of reach of `tests/`), and the layering check
//! (`tests/layering.rs`) lets `testing` import the transport but not the other way round, test
//! modules included.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::internals::{
    is_primary, parse, resolve_primary, watch_switch_master, DataTemplate, Target, WatchSettings,
};
use super::RedisSentinel;
use crate::error::ErrorKind;

const TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failover may take (down-after 1 s, then election and promotion).
const FAILOVER_BOUND: Duration = Duration::from_secs(20);

/// Starts a set off the runtime's worker threads (the fixture blocks while it settles).
async fn start() -> RedisSentinel {
    tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .expect("the start task")
        .unwrap_or_else(|err| panic!("cannot start the Sentinel set: {err}"))
}

/// The fixture's URL through the topology parser: the Sentinels' URLs, the service and the
/// data template.
fn target(set: &RedisSentinel) -> (Vec<String>, String, DataTemplate) {
    match parse(&set.url()) {
        Ok(Target::Sentinel {
            sentinels,
            service,
            data,
        }) => (sentinels, service, data),
        other => panic!("{}: {other:?}", set.url()),
    }
}

/// A loopback Sentinel URL nobody listens on (a port bound, then released).
fn dead_sentinel() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    format!("redis://127.0.0.1:{port}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_names_the_current_primary_even_behind_a_dead_sentinel() {
    let set = start().await;
    let (sentinels, service, data) = target(&set);
    let primary_port = set.primary().expect("a primary").port();

    let (host, port) = resolve_primary(&sentinels, &service, TIMEOUT)
        .await
        .expect("the Sentinels name the primary");
    assert_eq!((host.as_str(), port), ("127.0.0.1", primary_port));
    let url = data.primary_url(&host, port);
    assert!(is_primary(&url, TIMEOUT).await.expect("ROLE"), "{url}");
    let replica = set
        .nodes()
        .iter()
        .find(|n| n.port() != primary_port)
        .expect("a replica");
    assert!(!is_primary(&replica.url(), TIMEOUT).await.expect("ROLE"));

    let mut with_dead = vec![dead_sentinel()];
    with_dead.extend(sentinels.iter().cloned());
    let started = Instant::now();
    let resolved = resolve_primary(&with_dead, &service, TIMEOUT)
        .await
        .expect("the live Sentinels answer");
    assert_eq!(resolved, ("127.0.0.1".to_string(), primary_port));
    assert!(
        started.elapsed() < TIMEOUT * 3,
        "a dead Sentinel costs at most its timeouts: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_is_a_clear_error() {
    let set = start().await;
    let (sentinels, _, _) = target(&set);
    let err = resolve_primary(&sentinels, "no-such-service", TIMEOUT)
        .await
        .expect_err("no Sentinel monitors it");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    assert!(message.contains("\"no-such-service\""), "{message}");
    assert!(message.contains("3 of the 3 Sentinels"), "{message}");

    // A plain data node is no Sentinel: an error, not a panic, and not an address.
    let not_a_sentinel = vec![set.nodes()[0].url()];
    let err = resolve_primary(&not_a_sentinel, set.service(), TIMEOUT)
        .await
        .expect_err("a data node does not answer SENTINEL");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.to_string().contains("none of the 1 Sentinels"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_follows_a_failover() {
    let mut set = start().await;
    let (sentinels, service, data) = target(&set);
    let cancel = CancellationToken::new();
    // A dead Sentinel first: the watcher moves on to a live one.
    let mut watched = vec![dead_sentinel()];
    watched.extend(sentinels.iter().cloned());
    let mut rx = watch_switch_master(
        watched,
        service.clone(),
        WatchSettings {
            timeout: TIMEOUT,
            max_backoff: Duration::from_millis(500),
            health_interval: Duration::from_secs(1),
        },
        cancel.clone(),
    );

    let old_index = set.primary_index().expect("a primary");
    let old = ("127.0.0.1".to_string(), set.nodes()[old_index].port());
    let initial = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|v| v.is_some()))
        .await
        .expect("the watcher learns the primary within 10 s")
        .expect("the watcher runs")
        .clone();
    assert_eq!(initial, Some(old.clone()));

    set.nodes_mut()[old_index].kill();
    let killed = Instant::now();
    let new = tokio::time::timeout(
        FAILOVER_BOUND,
        rx.wait_for(|v| v.as_ref().is_some_and(|addr| *addr != old)),
    )
    .await
    .unwrap_or_else(|_| panic!("no new primary reported within {FAILOVER_BOUND:?}"))
    .expect("the watcher runs")
    .clone()
    .expect("an address");
    eprintln!(
        "the watcher reported {new:?} {:?} after the kill",
        killed.elapsed()
    );

    let new_index = set
        .nodes()
        .iter()
        .position(|n| n.port() == new.1)
        .unwrap_or_else(|| panic!("{new:?} is none of the data nodes"));
    assert_ne!(new_index, old_index);

    // The Sentinels converge on what the watcher reported (one may lag a moment behind the one
    // that announced the switch), and the node says it is the primary.
    loop {
        let resolved = resolve_primary(&sentinels, &service, TIMEOUT).await;
        let promoted = is_primary(&data.primary_url(&new.0, new.1), TIMEOUT).await;
        if resolved.as_ref().ok() == Some(&new) && matches!(promoted, Ok(true)) {
            break;
        }
        assert!(
            killed.elapsed() < FAILOVER_BOUND,
            "resolve_primary says {resolved:?}, ROLE says {promoted:?}, the watcher {new:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The watcher does not flip back to the old primary while the Sentinels converge, and it
    // ends up where they do. Not necessarily at `new`: two Sentinels may run failovers in
    // two epochs, the later one promoting another replica (seen in CI: A announced, then B);
    // following the higher epoch is the watcher's job.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    loop {
        let watched = rx.borrow().clone();
        assert_ne!(
            watched,
            Some(old.clone()),
            "the watcher went back to the killed primary"
        );
        let resolved = resolve_primary(&sentinels, &service, TIMEOUT).await.ok();
        if let Some(now) = resolved.as_ref().filter(|r| Some(*r) == watched.as_ref()) {
            if matches!(
                is_primary(&data.primary_url(&now.0, now.1), TIMEOUT).await,
                Ok(true)
            ) {
                break;
            }
        }
        assert!(
            killed.elapsed() < FAILOVER_BOUND + Duration::from_secs(5),
            "the watcher says {watched:?}, the Sentinels {resolved:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    cancel.cancel();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while rx.changed().await.is_ok() {}
    })
    .await;
    assert!(closed.is_ok(), "the watcher task ends when cancelled");
}
