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
