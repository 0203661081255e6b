//! Rows of the bad-input catalogue (RELIABILITY.md §c) that are about the server and its
//! permissions, plus the least-privilege ACL user. Config rows live beside the config code; rows
//! about foreign values in `tests/failover.rs`.
#![cfg(feature = "testing")]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use baton::testing::RedisServer;
use baton::{Client, ErrorKind, Event, FailoverConfig};
use common::*;

async fn admin(srv: &RedisServer, args: &[String]) -> redis::Value {
    let mut conn = raw(srv).await;
    redis::cmd("ACL")
        .arg(args)
        .query_async(&mut conn)
        .await
        .unwrap()
}

fn user_url(srv: &RedisServer, user: &str, pw: &str) -> String {
    format!("redis://{user}:{pw}@127.0.0.1:{}/", srv.port())
}

#[tokio::test]
async fn least_privilege_user_runs_the_whole_protocol_and_the_list_matches_acl_getuser() {
    let srv = server();
    admin(
        &srv,
        &baton::acl::setuser_args("baton", "canary-pw-1", "baton:"),
    )
    .await;
    let client = Client::connect(user_url(&srv, "baton", "canary-pw-1"))
        .await
        .unwrap();
    assert!(
        client.durability().await.is_ok(),
        "CONFIG GET is in the list"
    );
    let cfg = FailoverConfig::builder("acl")
        .lock_timeout(Duration::from_millis(600))
        .keepalive(true)
        .build()
        .unwrap();
    let mut a = client.start(cfg.clone());
    let first = acquired(&mut a, WAKE).await;
    let mut b = client.start(cfg.clone());
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    // Let a keepalive or two happen as this user.
    tokio::time::sleep(Duration::from_millis(700)).await;
    first.fail("as the acl user").await.unwrap();
    let second = acquired(&mut b, WAKE).await;
    second.done().await.unwrap();
    for w in [&mut a, &mut b] {
        let evs = until_end(w, WAKE).await;
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Error { .. })),
            "errors as the acl user: {evs:?}"
        );
    }
    // The operator tools too.
    let status = client.job_status("acl").await.unwrap();
    assert_eq!(status.state, baton::JobState::Done);
    let mut held = client.start(job("acl2").build().unwrap());
    let _h = acquired(&mut held, WAKE).await;
    assert_eq!(client.fail_attempt("acl2", "test").await.unwrap(), Some(1));
    client.reset_job("acl").await.unwrap();

    // The constant is exactly what the server granted.
    let mut conn = raw(&srv).await;
    let info: Vec<redis::Value> = redis::cmd("ACL")
        .arg("GETUSER")
        .arg("baton")
        .query_async(&mut conn)
        .await
        .unwrap();
    let commands = info
        .chunks(2)
        .find_map(|kv| match (&kv[0], &kv[1]) {
            (redis::Value::BulkString(k), redis::Value::BulkString(v)) if k == b"commands" => {
                Some(String::from_utf8_lossy(v).into_owned())
            }
            _ => None,
        })
        .expect("commands field");
    // Redis folds a complete category back into its name (+watch +unwatch +multi +exec, with
    // discard removed, reads back as "+@transaction -discard"): expand before comparing.
    let mut granted = BTreeSet::new();
    for token in commands.split_whitespace() {
        match token {
            "+@transaction" => {
                granted.extend(["watch", "unwatch", "multi", "exec", "discard"].map(String::from))
            }
            t if t.starts_with('-') && !t.starts_with("-@") => {
                granted.remove(&t[1..]);
            }
            t => {
                if let Some(c) = t.strip_prefix('+') {
                    granted.insert(c.to_string());
                }
            }
        }
    }
    let expected: BTreeSet<String> = baton::acl::FAILOVER_COMMANDS
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(granted, expected, "ACL GETUSER says {commands}");
    assert!(commands.contains("-@all"), "{commands}");
}

#[tokio::test]
async fn row_noperm_a_user_lacking_a_command_gets_a_permission_error_and_nothing_runs() {
    let srv = server();
    let mut args = baton::acl::setuser_args("weak", "pw", "baton:");
    args.push("-publish".into());
    admin(&srv, &args).await;
    let client = Client::connect(user_url(&srv, "weak", "pw")).await.unwrap();
    let mut w = client.start(job("noperm").build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    assert!(
        matches!(
            evs.last(),
            Some(Event::Error {
                kind: ErrorKind::Permission,
                retryable: false,
                ..
            })
        ),
        "{evs:?}"
    );
    assert!(!evs.iter().any(|e| matches!(e, Event::Acquired(_))));
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("noperm")).await,
        None,
        "nothing written"
    );
}

#[tokio::test]
async fn row_auth_failure_is_a_permission_error_that_never_shows_the_password() {
    let srv = RedisServer::builder()
        .requirepass("right-pw")
        .start()
        .unwrap();
    let url = format!("redis://:wrong-canary@127.0.0.1:{}/", srv.port());
    let err = Client::connect(url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    assert!(!format!("{err} {err:?}").contains("wrong-canary"));
    let ok = Client::connect(format!("redis://:right-pw@127.0.0.1:{}/", srv.port())).await;
    assert!(ok.is_ok());
    assert!(!format!("{:?}", ok.unwrap()).contains("right-pw"));
}

#[tokio::test]
async fn row_19_readonly_replica_is_retryable_and_never_counts_as_an_attempt() {
    let primary = server();
    let replica = RedisServer::builder()
        .arg("replicaof", &format!("127.0.0.1 {}", primary.port()))
        .start()
        .unwrap();
    let client = client(&replica).await;
    let mut w = client.start(job("ro").build().unwrap());
    let mut readonly = 0;
    while readonly < 2 {
        match next(&mut w, WAKE).await {
            Event::Error {
                kind: ErrorKind::ReadOnly,
                retryable: true,
                ..
            } => readonly += 1,
            other => panic!("{other:?}"),
        }
    }
    w.stop();
    assert!(matches!(
        until_end(&mut w, WAKE).await.last(),
        Some(Event::Stopped)
    ));
    let mut conn = raw(&primary).await;
    assert_eq!(get(&mut conn, &state_key("ro")).await, None);
}

#[tokio::test]
async fn row_oom_a_full_server_is_a_retryable_error_and_nothing_is_half_written() {
    let srv = RedisServer::builder()
        .arg("maxmemory", "2mb")
        .arg("maxmemory-policy", "noeviction")
        .start()
        .unwrap();
    let mut conn = raw(&srv).await;
    // Fill memory until writes are refused.
    let blob = "x".repeat(64 * 1024);
    for i in 0..1000 {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(&blob)
            .query_async(&mut conn)
            .await;
        if r.is_err() {
            break;
        }
    }
    let client = client(&srv).await;
    let mut w = client.start(job("oom").build().unwrap());
    match next(&mut w, WAKE).await {
        Event::Error {
            kind,
            retryable,
            message,
        } => {
            assert_eq!(kind, ErrorKind::Oom, "{message}");
            assert!(retryable);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&mut conn, &state_key("oom")).await, None);
    assert_eq!(get(&mut conn, &lease_key("oom")).await, None);
    // Memory freed: the worker carries on and wins attempt 1.
    let _: () = redis::cmd("FLUSHDB").query_async(&mut conn).await.unwrap();
    let got = loop {
        match next(&mut w, Duration::from_secs(10)).await {
            Event::Acquired(a) => break a,
            Event::Error {
                retryable: true, ..
            } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(got.attempt, 1);
    got.done().await.unwrap();
}
