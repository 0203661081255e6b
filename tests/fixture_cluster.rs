//! Tests of the `RedisCluster` fixture itself (`--features testing`).
#![cfg(feature = "testing")]

use std::time::{Duration, Instant};

use baton::testing::cluster::{slot, SLOTS};
use baton::testing::{Flavor, RedisCluster, RedisClusterBuilder};
use redis::aio::MultiplexedConnection;

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to a cluster node")
}

/// Starts a cluster, panicking with a readable message if that fails, and says how long it took.
fn start() -> RedisCluster {
    start_with(RedisCluster::builder())
}

fn start_with(builder: RedisClusterBuilder) -> RedisCluster {
    let started = Instant::now();
    let cluster = builder
        .start()
        .unwrap_or_else(|err| panic!("cannot start cluster: {err}"));
    eprintln!("cluster up in {:?}", started.elapsed());
    cluster
}

/// Whether a process with this PID exists (zombies included).
fn process_exists(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// `(primary id, slot count, replica count)` per shard, from `CLUSTER NODES` of `url`.
async fn shards(url: &str) -> Vec<(String, usize, usize)> {
    let mut conn = connect(url).await;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .expect("CLUSTER NODES");
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let mut shards = Vec::new();
    for l in &lines {
        let flags: Vec<&str> = l[2].split(',').collect();
        if flags.contains(&"master") && !flags.contains(&"fail") {
            let slots: usize = l[8..]
                .iter()
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
                    None => 1,
                })
                .sum();
            let replicas = lines
                .iter()
                .filter(|o| o[3] == l[0] && !o[2].contains("fail"))
                .count();
            shards.push((l[0].to_string(), slots, replicas));
        }
    }
    shards
}

#[tokio::test]
async fn cluster_comes_up_with_three_shards_and_redirects() {
    comes_up_and_redirects(Flavor::Redis).await;
}

/// The same on Valkey (`.ci/ensure-valkey` provides it), as a least-privilege ACL user.
#[tokio::test]
async fn valkey_cluster_comes_up_with_three_shards_and_redirects() {
    comes_up_and_redirects(Flavor::Valkey).await;
}

async fn comes_up_and_redirects(flavor: Flavor) {
    let test = Instant::now();
    let cluster = start_with(RedisCluster::builder().flavor(flavor).acl_user(
        "app",
        "app-secret",
        "app:",
    ));
    assert_eq!(cluster.flavor(), flavor);
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.primaries().len(), 3);
    assert_eq!(cluster.replicas().len(), 3);
    for node in cluster.nodes() {
        assert!(node.port() < 55536, "port {} too high", node.port());
    }
    assert!(cluster
        .cluster_url()
        .starts_with("redis+cluster://127.0.0.1:"));
    assert_eq!(cluster.seed_urls().len(), 6);

    // Every node agrees: three primaries, all slots, one replica each.
    for url in cluster.seed_urls() {
        let shards = shards(&url).await;
        assert_eq!(shards.len(), 3, "{shards:?}");
        assert_eq!(
            shards.iter().map(|s| s.1).sum::<usize>(),
            usize::from(SLOTS)
        );
        assert!(shards.iter().all(|s| s.2 == 1), "{shards:?}");
    }

    assert_eq!(slot(b"foo"), 12182);
    let owner = cluster.node_for_key(b"foo").expect("slot of foo served");
    assert!(cluster.primaries().contains(&owner));
    let mut conn = connect(&cluster.nodes()[owner].url()).await;
    let () = redis::cmd("SET")
        .arg("foo")
        .arg("bar")
        .query_async(&mut conn)
        .await
        .expect("SET on the owner");

    // The ACL user exists on every node: it may write its prefix on the owner, and nothing else.
    let key = b"app:{foo}";
    let app_owner = cluster.node_for_key(key).expect("served");
    assert_eq!(app_owner, owner, "same hash tag, same slot");
    let mut app = connect(&cluster.nodes()[owner].url_for("app", "app-secret")).await;
    let () = redis::cmd("SET")
        .arg(&key[..])
        .arg("1")
        .query_async(&mut app)
        .await
        .expect("the ACL user writes its prefix");
    redis::cmd("SET")
        .arg("foo")
        .arg("1")
        .query_async::<()>(&mut app)
        .await
        .expect_err("the ACL user may not write outside its prefix");
    assert!(cluster
        .cluster_url_for("app", "app-secret")
        .starts_with("redis+cluster://app:app-secret@127.0.0.1:"));

    let value: String = redis::cmd("GET")
        .arg("foo")
        .query_async(&mut conn)
        .await
        .expect("GET on the owner");
    assert_eq!(value, "bar");

    let other = cluster
        .primaries()
        .into_iter()
        .find(|&p| p != owner)
        .expect("another primary");
    let mut conn = connect(&cluster.nodes()[other].url()).await;
    let err = redis::cmd("SET")
        .arg("foo")
        .arg("baz")
        .query_async::<()>(&mut conn)
        .await
        .expect_err("a non-owner redirects");
    let text = format!("{err:?} {err}");
    assert!(text.contains("MOVED") || text.contains("Moved"), "{text}");
    assert!(
        text.contains(&cluster.nodes()[owner].port().to_string()),
        "{text}"
    );
    eprintln!("test 1 ({}) took {:?}", flavor.name(), test.elapsed());
}

#[tokio::test]
async fn killing_a_primary_promotes_its_replica() {
    let test = Instant::now();
    let mut cluster = start();
    let primary = cluster.primaries()[0];
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|&r| cluster.primary_of(r) == Some(primary))
        .expect("the primary has a replica");
    cluster.node_mut(primary).kill();
    let killed = Instant::now();

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        cluster.refresh_roles().expect("refresh roles");
        if cluster.primaries().contains(&replica) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica {replica} not promoted within 15 s: {cluster:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("replica promoted {:?} after the kill", killed.elapsed());
    assert_eq!(cluster.primaries().len(), 3);
    assert!(!cluster.slots_of(replica).is_empty());
    cluster
        .wait_healthy(Duration::from_secs(15))
        .expect("healthy again");
    eprintln!(
        "cluster_state:ok again {:?} after the kill",
        killed.elapsed()
    );

    // Another live node's view agrees: the replica is a primary now.
    let id = cluster.node_id(replica).expect("id").to_string();
    let witness = cluster
        .nodes()
        .iter()
        .enumerate()
        .find(|(i, n)| *i != replica && n.is_running())
        .map(|(_, n)| n.url())
        .expect("a live node");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if shards(&witness).await.iter().any(|s| s.0 == id) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "other node does not see the promotion"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("test 2 took {:?}", test.elapsed());
}

#[tokio::test]
async fn dropping_the_cluster_leaves_no_server_behind() {
    let test = Instant::now();
    let cluster = start();
    let pids: Vec<u32> = cluster
        .nodes()
        .iter()
        .map(|n| n.pid().expect("running"))
        .collect();
    let dirs: Vec<_> = cluster.nodes().iter().map(|n| n.dir().to_owned()).collect();
    assert!(pids.iter().all(|&pid| process_exists(pid)));
    drop(cluster);
    for pid in pids {
        assert!(!process_exists(pid), "redis-server {pid} still exists");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    eprintln!("test 3 took {:?}", test.elapsed());
}
