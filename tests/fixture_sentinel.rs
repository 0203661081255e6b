//! Tests of the `RedisSentinel` fixture itself (`--features testing`).
#![cfg(feature = "testing")]

use std::time::{Duration, Instant};

use baton::testing::{Flavor, RedisSentinel};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

/// How long a failover may take (down-after 1 s, then election and promotion).
const FAILOVER_BOUND: Duration = Duration::from_secs(20);

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to a fixture process")
}

/// Starts a set, panicking with a readable message if that fails, and reports how long it took.
fn start() -> RedisSentinel {
    start_flavor(Flavor::Redis)
}

fn start_flavor(flavor: Flavor) -> RedisSentinel {
    let started = Instant::now();
    let set = RedisSentinel::builder()
        .flavor(flavor)
        .start()
        .unwrap_or_else(|err| panic!("cannot start the {} set: {err}", flavor.name()));
    eprintln!(
        "the {} Sentinel set came up in {:?}",
        flavor.name(),
        started.elapsed()
    );
    set
}

/// `SENTINEL get-master-addr-by-name` on the Sentinel at `url`, as `host:port`.
async fn master_addr(url: &str, service: &str) -> String {
    let mut conn = connect(url).await;
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(service)
        .query_async(&mut conn)
        .await
        .expect("SENTINEL get-master-addr-by-name");
    format!("{host}:{port}")
}

/// The first element of `ROLE`: `master` or `slave`.
async fn role(url: &str) -> String {
    let mut conn = connect(url).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut conn)
        .await
        .expect("ROLE");
    match role.first() {
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        other => panic!("unexpected ROLE reply {other:?}"),
    }
}

/// Whether a process with this PID exists (zombies included).
fn process_exists(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[tokio::test]
async fn the_set_comes_up_and_replicates() {
    let started = Instant::now();
    let set = start();
    assert_eq!(set.service(), "baton-test");
    let addrs = set.sentinel_addrs();
    assert_eq!(addrs.len(), 3);
    assert_eq!(
        set.url(),
        format!("redis+sentinel://{}/baton-test", addrs.join(","))
    );
    assert_eq!(set.nodes().len(), 3);

    let primary = set.primary().expect("the Sentinels name a primary");
    let primary_addr = format!("127.0.0.1:{}", primary.port());
    assert_eq!(
        primary.port(),
        set.nodes()[0].port(),
        "node 0 starts as primary"
    );
    for sentinel in set.sentinels() {
        assert_eq!(
            master_addr(&sentinel.url(), set.service()).await,
            primary_addr
        );
    }
    assert_eq!(role(&primary.url()).await, "master");

    let mut conn = connect(&primary.url()).await;
    let _: () = conn.set("sentinel-key", "v1").await.expect("SET");
    let acked: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(1000)
        .query_async(&mut conn)
        .await
        .expect("WAIT");
    assert_eq!(acked, 2, "both replicas acknowledge the write");
    for replica in &set.nodes()[1..] {
        assert_eq!(role(&replica.url()).await, "slave");
        let mut conn = connect(&replica.url()).await;
        let value: Option<String> = conn.get("sentinel-key").await.expect("GET on a replica");
        assert_eq!(value.as_deref(), Some("v1"));
    }
    eprintln!("test 1 took {:?}", started.elapsed());
}

#[tokio::test]
async fn killing_the_primary_fails_over_to_a_replica() {
    fails_over(Flavor::Redis).await;
}

/// The same on Valkey (its server binary in Sentinel mode, too).
#[tokio::test]
async fn killing_the_primary_fails_over_to_a_replica_on_valkey() {
    fails_over(Flavor::Valkey).await;
}

async fn fails_over(flavor: Flavor) {
    let started = Instant::now();
    let mut set = start_flavor(flavor);
    let old = set.primary_addr().expect("a primary");
    let old_index = set.primary_index().expect("a primary node");
    set.nodes_mut()[old_index].kill();
    let killed = Instant::now();

    let sentinel = set.sentinels()[0].url();
    let new = loop {
        let addr = master_addr(&sentinel, set.service()).await;
        if addr != old {
            break addr;
        }
        assert!(
            killed.elapsed() < FAILOVER_BOUND,
            "no failover within {FAILOVER_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("{} failover took {:?}", flavor.name(), killed.elapsed());
    let new_index = set.primary_index().expect("a new primary node");
    assert_ne!(new_index, old_index);
    let new_primary = &set.nodes()[new_index];
    assert_eq!(new, format!("127.0.0.1:{}", new_primary.port()));

    // The Sentinels switch once the replica reports itself primary; poll anyway, bounded.
    while role(&new_primary.url()).await != "master" {
        assert!(
            killed.elapsed() < FAILOVER_BOUND,
            "the new primary is no master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut conn = connect(&new_primary.url()).await;
    let _: () = conn
        .set("after-failover", "v2")
        .await
        .expect("SET on the new primary");
    let value: Option<String> = conn.get("after-failover").await.expect("GET");
    assert_eq!(value.as_deref(), Some("v2"));
    eprintln!("test 2 ({}) took {:?}", flavor.name(), started.elapsed());
}

#[test]
fn dropping_the_set_leaves_no_process_behind() {
    let started = Instant::now();
    let set = start();
    let pids: Vec<u32> = set
        .nodes()
        .iter()
        .chain(set.sentinels())
        .map(|s| s.pid().expect("running"))
        .collect();
    let dirs: Vec<_> = set
        .nodes()
        .iter()
        .chain(set.sentinels())
        .map(|s| s.dir().to_path_buf())
        .collect();
    assert_eq!(pids.len(), 6);
    assert!(pids.iter().all(|&pid| process_exists(pid)));
    drop(set);
    for pid in pids {
        assert!(!process_exists(pid), "pid {pid} survived the drop");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} survived the drop", dir.display());
    }
    eprintln!("test 3 took {:?}", started.elapsed());
}

#[test]
fn an_invalid_service_name_is_rejected() {
    let err = RedisSentinel::builder()
        .service("two words")
        .start()
        .expect_err("a service name with a space");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn an_acl_user_reaches_every_data_node() {
    let set = RedisSentinel::builder()
        .service("acl-set")
        .acl_user("sentinel-user", "pw-7f3e", "baton:")
        .start()
        .unwrap_or_else(|err| panic!("cannot start the set: {err}"));
    assert_eq!(set.service(), "acl-set");
    assert!(set.url().ends_with("/acl-set"));
    let primary = set.primary().expect("a primary");
    let mut conn = connect(&primary.url_for("sentinel-user", "pw-7f3e")).await;
    let _: () = conn.set("baton:acl", "v").await.expect("SET in the prefix");
    let denied: redis::RedisResult<()> = conn.set("elsewhere", "v").await;
    assert!(denied.is_err(), "a key outside the prefix is refused");
    for replica in &set.nodes()[1..] {
        let mut conn = connect(&replica.url_for("sentinel-user", "pw-7f3e")).await;
        let _: Option<String> = conn.get("baton:acl").await.expect("GET on a replica");
    }
}

#[tokio::test]
async fn a_restarted_sentinel_resumes_from_its_rewritten_config() {
    let mut set = start();
    let primary = set.primary_addr().expect("a primary");
    let sentinel = &mut set.sentinels_mut()[1];
    let port = sentinel.port();
    sentinel.kill();
    assert!(!sentinel.is_running());
    sentinel.restart().expect("restart the Sentinel");
    assert_eq!(sentinel.port(), port);
    let conf = std::fs::read_to_string(sentinel.dir().join("sentinel.conf")).expect("its config");
    assert!(
        conf.contains("sentinel myid"),
        "rewritten by the Sentinel:\n{conf}"
    );
    assert_eq!(master_addr(&sentinel.url(), "baton-test").await, primary);
}
