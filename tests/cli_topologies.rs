//! The `baton` command on a Redis Cluster and behind Sentinel: `--redis-url` takes the
//! `redis+cluster://` and `redis+sentinel://` forms, and `run` / `status` work there as on one
//! server.
#![cfg(all(feature = "cli", feature = "testing"))]

use std::process::Stdio;
use std::time::Duration;

use baton::testing::{RedisCluster, RedisSentinel};
use tokio::process::Command;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// `baton ARGS… --redis-url URL`, output captured, bounded to 30 s.
async fn baton(url: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BATON);
    cmd.args(&args[..1])
        .arg("--redis-url")
        .arg(url)
        .args(&args[1..])
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_URL")
        .env_remove("BATON_REDIS_PASSWORD_FILE")
        .env_remove("BATON_TLS_CA_FILE")
        .env_remove("BATON_TLS_CERT_FILE")
        .env_remove("BATON_TLS_KEY_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("baton ended within 30 s")
        .expect("baton ran")
}

async fn run_then_status(url: &str, job: &str) {
    let out = baton(url, &["run", "--key", job, "--", "sh", "-c", "exit 0"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = baton(url, &["status", "--key", job, "--json"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "status: {text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("status JSON");
    assert_eq!(v["state"], "done", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_work_on_a_cluster_url() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start().expect("cluster"))
        .await
        .unwrap();
    // Jobs whose slots live on different primaries.
    for job in ["a", "b", "c", "d"] {
        run_then_status(&cluster.cluster_url(), job).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_work_on_a_sentinel_url() {
    let set = tokio::task::spawn_blocking(|| RedisSentinel::start().expect("sentinel set"))
        .await
        .unwrap();
    run_then_status(&set.url(), "s").await;
}

/// A run that starts right after the primary of its job's slot was killed: the seeds answer,
/// that slot does not until its replica takes over (here by hand, 6 s after the kill, with a
/// node timeout long enough that no automatic failover comes first). The run waits for it and
/// then runs PROGRAM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_as_its_primary_dies_waits_for_the_failover_and_runs() {
    let mut cluster = tokio::task::spawn_blocking(|| {
        RedisCluster::builder()
            .arg("cluster-node-timeout", "60000")
            .start()
            .expect("cluster")
    })
    .await
    .unwrap();
    let primary = cluster.node_for_key(b"{failing}").expect("a primary");
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|&r| cluster.primary_of(r) == Some(primary))
        .expect("its replica");
    let replica_url = cluster.nodes()[replica].url();
    cluster.node_mut(primary).kill();
    let url = cluster.cluster_url();
    let run = tokio::spawn(async move {
        baton(
            &url,
            &[
                "run",
                "--key",
                "failing",
                "--lock-timeout",
                "1s",
                "--",
                "sh",
                "-c",
                "exit 0",
            ],
        )
        .await
    });
    tokio::time::sleep(Duration::from_secs(6)).await;
    tokio::task::spawn_blocking(move || {
        let mut conn = redis::Client::open(replica_url)
            .and_then(|c| c.get_connection())
            .expect("replica connection");
        redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .arg("TAKEOVER")
            .query::<()>(&mut conn)
            .expect("CLUSTER FAILOVER TAKEOVER");
    })
    .await
    .unwrap();
    let out = run.await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the run gave up before the failover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(cluster);
}

#[tokio::test]
async fn a_bad_cluster_url_exits_64_without_echoing_the_password() {
    let out = baton(
        "redis+cluster://user:s3cret-pw@127.0.0.1:1,/",
        &["status", "--key", "x"],
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(!err.contains("s3cret-pw"), "{err}");
}
