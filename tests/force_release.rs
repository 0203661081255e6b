//! `force_release`, an operator taking a grant from a hung holder (`baton unlock`), on the
//! mutex, the fair lock and leader election: only the grant named (its fencing token, or its
//! holder) is taken; the holder hears it at once on its channel, long before its next extension
//! would have told it; the next grant's fencing token is higher than the taken one.
#![cfg(feature = "testing")]

mod common;

use baton::prelude::*;
use std::time::Duration;

use baton::{Client, ElectionOptions, Expected, ForceRelease};
use common::*;
use tokio::time::Instant;

const WITHIN: Duration = Duration::from_secs(5);
/// A lease long enough that its first extension (at a third of it) is far off: a loss heard
/// while more than five sixths of it are left came before that extension was even due.
const LONG: Duration = Duration::from_secs(30);

/// Waits (bounded) until `channel` has a subscriber on the Redis server: the holder's watchdog
/// listens there once its subscription is confirmed. A holder that never listens is then told
/// by the assertion on when its loss fired, not here.
async fn listened<E: Endpoint + ?Sized>(server: &E, channel: &str) {
    let mut conn = raw(server).await;
    for _ in 0..200 {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await
            .map(|v: Vec<(String, i64)>| v.into_iter().next().unwrap_or_default())
            .unwrap();
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    eprintln!("nobody subscribed to {channel}");
}

/// Asserts the loss fired while more than 5/6 of the lease was left: before the watchdog's
/// first extension (due at 2/3 left) could have found the lock gone.
fn heard_at_once(left: Duration, what: &str) {
    assert!(
        left > LONG * 5 / 6,
        "{what}: the loss fired with {left:?} of a {LONG:?} lease left: not at once, but at an \
         extension"
    );
}

/// Holds mutex `name` on `a` with a watchdog, takes it through `op` naming its token, and
/// returns how much of the lease was left when the holder's loss signal fired.
async fn mutex_taken(a: &Client, op: &Client, name: &str, ready: impl std::future::Future) {
    let mut held = a
        .locks()
        .try_acquire(name, LONG)
        .await
        .unwrap()
        .expect("free");
    held.start_watchdog(None);
    ready.await;
    // A stale name (an older grant's token, a holder it is not) takes nothing.
    for stale in [
        Expected::Token(held.fencing_token() - 1),
        Expected::Holder("deadbeef".into()),
    ] {
        match op.locks().force_release(name, &stale).await.unwrap() {
            ForceRelease::HeldByAnother(t) => {
                assert_eq!(t.fencing_token, Some(held.fencing_token()))
            }
            other => panic!("{stale:?} took {other:?}"),
        }
    }
    assert!(!held.is_lost(), "a stale name took the lock");
    let taken = op
        .locks()
        .force_release(name, &Expected::Token(held.fencing_token()))
        .await
        .unwrap();
    assert!(
        matches!(&taken, ForceRelease::Released(t) if t.fencing_token == Some(held.fencing_token())),
        "{taken:?}"
    );
    tokio::time::timeout(WITHIN + LONG / 3, held.lost())
        .await
        .expect("the holder was told of the loss");
    let left = held
        .lease_deadline()
        .saturating_duration_since(Instant::now());
    heard_at_once(left, "mutex");
    assert!(
        held.loss_reason().unwrap_or_default().contains("operator"),
        "{:?}",
        held.loss_reason()
    );
    let next = op
        .locks()
        .try_acquire(name, LONG)
        .await
        .unwrap()
        .expect("free after the unlock");
    assert!(next.fencing_token() > held.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_mutex_holder_hears_it_before_its_next_extension() {
    let server = server();
    let (a, op) = (client(&server).await, client(&server).await);
    mutex_taken(&a, &op, "db", listened(&server, "baton:lock:{db}:released")).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_mutex_holder_hears_it_before_its_next_extension_on_postgres() {
    let db = PgDatabase::create();
    let (a, op) = (
        Client::connect(&db.url).await.unwrap(),
        Client::connect(&db.url).await.unwrap(),
    );
    // The holder's client LISTENs on the channel its lock's topic hashes to once its
    // watchdog subscribed: its connection's last statement is that LISTEN.
    let ready = async {
        let owner = db.connect().await;
        for _ in 0..200 {
            let n: i64 = owner
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND query LIKE 'LISTEN%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        eprintln!("the holder never listened");
    };
    mutex_taken(&a, &op, "db", ready).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_locks_hung_holder_hears_it_at_once_and_the_next_token_is_higher() {
    let server = server();
    let (a, op) = (client(&server).await, client(&server).await);
    let mut held = a
        .fair_locks()
        .try_acquire("report", LONG)
        .await
        .unwrap()
        .expect("free");
    held.start_watchdog(None);
    listened(&server, "baton:fair:{report}:taken").await;
    let stale = op
        .fair_locks()
        .force_release("report", &Expected::Token(held.fencing_token() + 1))
        .await
        .unwrap();
    assert!(matches!(stale, ForceRelease::HeldByAnother(_)), "{stale:?}");
    let taken = op
        .fair_locks()
        .force_release("report", &Expected::Token(held.fencing_token()))
        .await
        .unwrap();
    let ForceRelease::Released(taken) = taken else {
        panic!("not taken: {taken:?}");
    };
    assert_eq!(taken.fencing_token, Some(held.fencing_token()));
    tokio::time::timeout(WITHIN + LONG / 3, held.lost())
        .await
        .expect("the holder was told of the loss");
    heard_at_once(
        held.lease_deadline()
            .saturating_duration_since(Instant::now()),
        "fair lock",
    );
    let next = op
        .fair_locks()
        .try_acquire("report", LONG)
        .await
        .unwrap()
        .expect("free after the unlock");
    assert!(next.fencing_token() > held.fencing_token());
    assert!(!held.release().await.unwrap(), "no longer the holder's");
    assert_eq!(
        op.fair_locks()
            .force_release("nothing", &Expected::Any)
            .await
            .unwrap(),
        ForceRelease::Free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_term_taken_ends_it_at_once_and_the_next_term_is_higher() {
    let server = server();
    let (a, b, op) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let opts = |name: &str| {
        ElectionOptions::builder()
            .lease(LONG)
            .name(name)
            .build()
            .unwrap()
    };
    let leader = a.leaders().elector("jobs", &opts("a")).unwrap();
    let term = leader.campaign().await.unwrap();
    listened(&server, "baton:leader:{jobs}:events").await;
    // Named by its holder: a leader's name.
    let other = op
        .leaders()
        .force_release("jobs", &Expected::Holder("b".into()))
        .await
        .unwrap();
    assert!(matches!(other, ForceRelease::HeldByAnother(_)), "{other:?}");
    let taken = op
        .leaders()
        .force_release("jobs", &Expected::Holder("a".into()))
        .await
        .unwrap();
    let ForceRelease::Released(taken) = taken else {
        panic!("not taken: {taken:?}");
    };
    assert_eq!(taken.holder, "a");
    assert_eq!(taken.fencing_token, Some(term.fencing_token()));
    tokio::time::timeout(WITHIN + LONG / 3, term.lost())
        .await
        .expect("the leader was told its term ended");
    heard_at_once(
        term.lease_deadline()
            .saturating_duration_since(Instant::now()),
        "leader",
    );
    let standby = b.leaders().elector("jobs", &opts("b")).unwrap();
    let next = tokio::time::timeout(WITHIN, standby.campaign())
        .await
        .expect("the election was free")
        .unwrap();
    assert!(
        next.fencing_token() > term.fencing_token(),
        "{} then {}",
        term.fencing_token(),
        next.fencing_token()
    );
}

/// How many of the lock's channels have subscribers.
async fn lock_channels(admin: &mut Raw) -> i64 {
    let c: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("baton:lock:*")
        .query_async(admin)
        .await
        .unwrap();
    c.len() as i64
}

async fn info(admin: &mut Raw, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async::<String>(admin)
        .await
        .unwrap()
}

/// The cost of listening for a force release, measured (not asserted): 30 000 mutexes held by
/// one client with their watchdogs, each listening on its lock's channel. Prints the server's
/// channels, pub/sub connections and memory before and after the watchdogs start. Run it with
/// `cargo test --all-features --test force_release -- --ignored --nocapture listening_cost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: 30 000 holders"]
async fn listening_cost_of_30_000_holders() {
    const HOLDERS: usize = 30_000;
    let server = server();
    let a = client(&server).await;
    let mut admin = raw(&server).await;
    let mut guards = Vec::with_capacity(HOLDERS);
    for i in 0..HOLDERS {
        guards.push(
            a.locks()
                .try_acquire(&format!("k{i}"), Duration::from_secs(600))
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let report = |label: &str, info: &str, clients: &str, channels: i64| {
        let field = |text: &str, name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .unwrap_or("?")
                .trim()
                .to_string()
        };
        eprintln!(
            "{label}: channels {channels}, used_memory {} ({}), connected_clients {}, \
             pubsub_clients {}",
            field(info, "used_memory"),
            field(info, "used_memory_human"),
            field(clients, "connected_clients"),
            field(clients, "pubsub_clients"),
        );
        field(info, "used_memory").parse::<i64>().unwrap_or(0)
    };
    let before = report(
        "held, no watchdog",
        &info(&mut admin, "memory").await,
        &info(&mut admin, "clients").await,
        lock_channels(&mut admin).await,
    );
    for g in &mut guards {
        g.start_watchdog(None);
    }
    let mut n = 0;
    for _ in 0..600 {
        n = lock_channels(&mut admin).await;
        if n as usize >= HOLDERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = report(
        "held, watchdogs listening",
        &info(&mut admin, "memory").await,
        &info(&mut admin, "clients").await,
        n,
    );
    eprintln!(
        "per listening holder: {} bytes on the server",
        (after - before) / HOLDERS as i64
    );
    assert_eq!(
        n as usize, HOLDERS,
        "every holder listens on its lock's channel"
    );
}
