//! Tests of the `RedisServer` fixture itself (`--features testing`).
#![cfg(feature = "testing")]

use std::time::Duration;

use baton::testing::{Persistence, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the fixture's redis-server")
}

async fn ping(url: &str) -> String {
    let mut conn = connect(url).await;
    redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("PING")
}

/// Starts a server, panicking with a readable message if that fails.
fn start(builder: baton::testing::RedisServerBuilder) -> RedisServer {
    builder
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"))
}

/// Whether a process with this PID exists (zombies included).
fn process_exists(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is
    // involved.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[tokio::test]
async fn two_servers_on_different_ports_answer_ping() {
    let a = start(RedisServer::builder());
    let b = start(RedisServer::builder());
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    assert_eq!(a.url(), format!("redis://127.0.0.1:{}/", a.port()));
    assert!(a.is_running() && b.is_running());
    assert_eq!(ping(&a.url()).await, "PONG");
    assert_eq!(ping(&b.url()).await, "PONG");
}

#[tokio::test]
async fn durable_data_survives_kill_and_restart() {
    let mut server = start(RedisServer::builder().persistence(Persistence::Durable));
    let mut conn = connect(&server.url()).await;
    let _: () = conn.set("durable-key", "v1").await.expect("SET");

    let port = server.port();
    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    server.kill(); // idempotent
    assert!(server.dir().exists(), "kill keeps the data dir");

    server
        .restart()
        .unwrap_or_else(|err| panic!("restart: {err}"));
    assert_eq!(server.port(), port, "restart keeps the port");
    let mut conn = connect(&server.url()).await;
    let value: Option<String> = conn.get("durable-key").await.expect("GET");
    assert_eq!(value.as_deref(), Some("v1"), "log:\n{}", server.log());
}

#[tokio::test]
async fn volatile_data_is_lost_on_kill_and_restart() {
    let mut server = start(RedisServer::builder());
    let mut conn = connect(&server.url()).await;
    let _: () = conn.set("volatile-key", "v1").await.expect("SET");

    let old_pid = server.pid();
    server.kill();
    server
        .restart()
        .unwrap_or_else(|err| panic!("restart: {err}"));
    assert_ne!(server.pid(), old_pid);

    let mut conn = connect(&server.url()).await;
    let value: Option<String> = conn.get("volatile-key").await.expect("GET");
    assert_eq!(value, None);
}

#[tokio::test]
async fn durable_restarted_as_volatile_loses_data() {
    let mut server = start(RedisServer::builder().persistence(Persistence::Durable));
    let mut conn = connect(&server.url()).await;
    let _: () = conn.set("switched-key", "v1").await.expect("SET");

    server.kill();
    server
        .restart_with(Persistence::Volatile)
        .unwrap_or_else(|err| panic!("restart_with: {err}"));
    let mut conn = connect(&server.url()).await;
    let value: Option<String> = conn.get("switched-key").await.expect("GET");
    assert_eq!(value, None);
}

#[tokio::test]
async fn restart_of_a_running_server_kills_it_first() {
    let mut server = start(RedisServer::builder());
    let old_pid = server.pid().expect("running");
    server
        .restart()
        .unwrap_or_else(|err| panic!("restart: {err}"));
    assert!(!process_exists(old_pid));
    assert_eq!(ping(&server.url()).await, "PONG");
}

#[tokio::test]
async fn pause_blocks_replies_until_resume() {
    let server = start(RedisServer::builder());
    let mut conn = connect(&server.url()).await;
    let _: () = conn.set("paused-key", "v1").await.expect("SET");

    server.pause().expect("pause");
    assert!(server.is_running(), "a paused server is still running");
    let get = conn.get::<_, Option<String>>("paused-key");
    let result = tokio::time::timeout(Duration::from_millis(300), get).await;
    assert!(result.is_err(), "GET answered while paused: {result:?}");

    server.resume().expect("resume");
    let value: Option<String> = conn.get("paused-key").await.expect("GET after resume");
    assert_eq!(value.as_deref(), Some("v1"));
}

#[tokio::test]
async fn drop_kills_the_process_and_removes_the_dir() {
    let server = start(RedisServer::builder().persistence(Persistence::Durable));
    let pid = server.pid().expect("running");
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    assert!(dir.join("redis.log").exists());
    drop(server);
    assert!(!process_exists(pid), "pid {pid} still exists after drop");
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
}

#[tokio::test]
async fn drop_of_a_paused_server_kills_it() {
    let server = start(RedisServer::builder());
    let pid = server.pid().expect("running");
    server.pause().expect("pause");
    drop(server);
    assert!(!process_exists(pid), "pid {pid} still exists after drop");
}

#[tokio::test]
async fn requirepass_requires_the_password() {
    let server = start(RedisServer::builder().requirepass("s3cret pw"));
    let port = server.port();

    let with_password = format!("redis://:s3cret%20pw@127.0.0.1:{port}/");
    assert_eq!(ping(&with_password).await, "PONG");

    // Depending on the client, the refusal comes when connecting or with the
    // first command; either way it must be an authentication error.
    let err = match redis::Client::open(server.url())
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
    {
        Err(err) => err,
        Ok(mut conn) => redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .expect_err("PING without password must fail"),
    };
    let text = err.to_string();
    assert!(
        text.contains("NOAUTH") || err.kind() == redis::ErrorKind::AuthenticationFailed,
        "not an auth error: {text}"
    );

    let wrong = format!("redis://:wrong@127.0.0.1:{port}/");
    let err = redis::Client::open(wrong)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect_err("a wrong password must be refused");
    assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed, "{err}");
}

#[test]
fn invalid_argument_fails_fast_with_the_log() {
    let started = std::time::Instant::now();
    let err = RedisServer::builder()
        .arg("no-such-directive", "1")
        .start()
        .expect_err("redis-server must reject an unknown directive");
    let text = err.to_string();
    assert!(text.contains("no-such-directive"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn extra_args_are_passed_and_the_sync_api_works_without_a_runtime() {
    let server = start(RedisServer::builder().arg("maxmemory-policy", "allkeys-lru"));
    assert!(
        server.log().contains("Ready to accept connections"),
        "{}",
        server.log()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let policy: Vec<String> = rt.block_on(async {
        let mut conn = connect(&server.url()).await;
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await
            .expect("CONFIG GET")
    });
    assert_eq!(policy, ["maxmemory-policy", "allkeys-lru"]);
}

#[test]
fn missing_binary_is_reported() {
    // Changing REDIS_SERVER_BIN in this process would break the tests running
    // concurrently, so the check runs in a child copy of this test binary.
    if std::env::var_os("BATON_FIXTURE_MISSING_BIN_CHILD").is_some() {
        let err = RedisServer::start().expect_err("must fail without a binary");
        let text = err.to_string();
        assert!(text.contains("apt-get install redis-server"), "{text}");
        assert!(text.contains("REDIS_SERVER_BIN"), "{text}");
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    // Output is captured so the child's own test summary does not end up in
    // this run's output.
    let output = std::process::Command::new(exe)
        .args(["--exact", "missing_binary_is_reported", "--nocapture"])
        .env("BATON_FIXTURE_MISSING_BIN_CHILD", "1")
        .env("REDIS_SERVER_BIN", "/nonexistent/redis-server")
        .output()
        .expect("run the test binary");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn server_and_builder_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RedisServer>();
    assert_send_sync::<baton::testing::RedisServerBuilder>();
}

#[tokio::test]
async fn a_server_that_exits_by_itself_is_not_running() {
    let mut server = start(RedisServer::builder());
    let mut conn = connect(&server.url()).await;
    // The connection drops without a reply, so the result is an error.
    let _ = redis::cmd("SHUTDOWN")
        .arg("NOSAVE")
        .query_async::<()>(&mut conn)
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.is_running() {
        assert!(std::time::Instant::now() < deadline, "still running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.pid(), None);
    assert!(server.pause().is_err());
    server
        .restart()
        .unwrap_or_else(|err| panic!("restart: {err}"));
    assert_eq!(ping(&server.url()).await, "PONG");
}

#[tokio::test]
async fn passwords_stay_off_the_command_line_and_acl_users_survive_a_restart() {
    // Security checklist d#9: /proc/<pid>/cmdline is readable by every local user.
    let mut server = start(RedisServer::builder().requirepass("s3cret pw").acl_user(
        "app",
        "app \"pw\"",
        "app:",
    ));
    let cmdline = |server: &RedisServer| {
        let raw = std::fs::read(format!("/proc/{}/cmdline", server.pid().unwrap())).unwrap();
        String::from_utf8_lossy(&raw).replace('\0', " ")
    };
    let port = server.port();
    for _ in 0..2 {
        let line = cmdline(&server);
        assert!(!line.contains("s3cret") && !line.contains("pw"), "{line}");
        assert_eq!(
            ping(&format!("redis://:s3cret%20pw@127.0.0.1:{port}/")).await,
            "PONG"
        );
        assert_eq!(ping(&server.url_for("app", "app%20%22pw%22")).await, "PONG");
        server.restart().unwrap();
    }
}
