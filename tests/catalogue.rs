//! The bad-input catalogue of RELIABILITY.md §c: one test per applicable row, named
//! `row_NN_<what it shows>`, each asserting the row's expected behaviour (a typed error or event
//! with a stable `ErrorKind`, no panic, nothing foreign overwritten, nothing assumed written when
//! the outcome is unknown), plus the least-privilege ACL user of §d.1.
//!
//! Not here: rows 8 and 33 (URL and TLS) live with the TLS work; row 9 (Redlock fleets) in
//! `tests/redlock.rs` (`row_09_…`, it needs several servers); row 34 (PostgreSQL: a terminated
//! session's advisory lock) in `tests/advisory.rs` (`row_34_…`, it needs a PostgreSQL server).
#![cfg(feature = "testing")]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::testing::{Persistence, RedisServer};
use baton::{Client, ConfigError, ErrorKind, Event, FailoverConfig, JobState, RunOutcome};
use common::*;
use tokio::time::Instant;
use tokio_stream::StreamExt;

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

/// The field a rejected configuration names, and the reason (with the valid range).
fn rejected(r: Result<FailoverConfig, ConfigError>) -> (&'static str, String) {
    match r {
        Err(ConfigError::Invalid { field, reason }) => (field, reason),
        Err(other) => panic!("unexpected {other:?}"),
        Ok(c) => panic!("accepted: {c:?}"),
    }
}

/// A key exactly as it is stored: its type, its serialized value (`DUMP`, byte-exact) and TTL.
async fn snapshot(conn: &mut Raw, key: &str) -> (String, Option<Vec<u8>>, i64) {
    let t: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    (t, dump, pttl(conn, key).await)
}

/// Writes a foreign value with `setup`, runs a worker on `job_name`, and checks each row's
/// default: the stream is exactly one non-retryable `Error` of `kind` naming `key` (reported at
/// once, not after waiting), nothing was acquired, and `key` is left byte for byte as it was.
/// Each `(job, value)`: the state key holds `value`, which baton must report as `CorruptState`
/// and leave untouched.
async fn state_values_are_corrupt(srv: &RedisServer, cases: &[(&str, &str)]) {
    for (name, value) in cases {
        let key = state_key(name);
        let setup = [cmd(&["SET", &key, value])];
        foreign_value_is_reported_and_left_untouched(
            srv,
            name,
            &setup,
            ErrorKind::CorruptState,
            &key,
        )
        .await;
    }
}

async fn foreign_value_is_reported_and_left_untouched(
    srv: &RedisServer,
    job_name: &str,
    setup: &[Vec<String>],
    kind: ErrorKind,
    key: &str,
) {
    let client = client(srv).await;
    let mut conn = raw(srv).await;
    run_cmds(&mut conn, setup).await;
    let before = snapshot(&mut conn, key).await;
    let mut w = client.failover().start(job(job_name).build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    match evs.as_slice() {
        [Event::Error {
            kind: k,
            message,
            retryable: false,
        }] => {
            assert_eq!(*k, kind, "{job_name:?}: {message}");
            assert!(message.contains(key), "{job_name:?}: {message}");
        }
        other => panic!("{job_name:?}: {other:?}"),
    }
    assert_eq!(
        snapshot(&mut conn, key).await,
        before,
        "{job_name:?}: the foreign value was touched"
    );
}

/// CPU time (user + system) of the calling thread, from `/proc/thread-self/stat`.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command name (which may contain spaces) start at field 3, `state`;
    // utime and stime are fields 14 and 15 of proc(5).
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz.max(1))
}

/// Reads events until `Acquired`, skipping retryable errors (an outage being retried).
async fn acquired_after_retries(w: &mut baton::Worker, within: Duration) -> baton::Acquired {
    let deadline = Instant::now() + within;
    loop {
        match next(w, deadline.saturating_duration_since(Instant::now())).await {
            Event::Acquired(a) => return a,
            Event::Error {
                retryable: true, ..
            }
            | Event::Locked { .. } => {}
            other => panic!("{other:?}"),
        }
    }
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
        .lease(Duration::from_millis(600))
        .watchdog(true)
        .build()
        .unwrap();
    let mut a = client.failover().start(cfg.clone());
    let first = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg.clone());
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
    let status = client.failover().job_status("acl").await.unwrap();
    assert_eq!(status.state, baton::JobState::Done);
    let mut held = client.failover().start(job("acl2").build().unwrap());
    let _h = acquired(&mut held, WAKE).await;
    assert_eq!(
        client
            .failover()
            .fail_attempt("acl2", &baton::Expected::Attempt(1), "test")
            .await
            .unwrap(),
        baton::FailAttempt::Released(1)
    );
    client.failover().reset_job("acl", None).await.unwrap();

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

// ----- Configuration (rows 1–7): rejected by `build()`, before any network I/O --------------

#[test]
fn row_01_zero_max_attempts_is_rejected_at_build_time() {
    let err = FailoverConfig::builder("k").max_attempts(0).build();
    let (field, reason) = rejected(err.clone());
    assert_eq!(field, "max_attempts");
    assert!(reason.contains("1 ..= 1000000"), "{reason}");
    // A config file goes through the same validation.
    let file = serde_json::from_str::<FailoverConfig>(r#"{"key":"k","max_attempts":0}"#);
    assert!(file.unwrap_err().to_string().contains("max_attempts"));
    // Seen as the crate error (e.g. from `Failover::run`), it is a stable, final kind.
    let err = baton::Error::from(err.unwrap_err());
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn row_02_huge_max_attempts_is_rejected_and_the_counter_never_passes_the_cap() {
    for n in [1_000_001, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
        let (field, reason) = rejected(FailoverConfig::builder("k").max_attempts(n).build());
        assert_eq!(field, "max_attempts", "{n}");
        assert!(reason.contains(&n.to_string()), "{reason}");
    }
    // At the cap, the last failed attempt is written as EXHAUSTED, never as cap + 1.
    let srv = server();
    let mut conn = raw(&srv).await;
    run_cmds(&mut conn, &[cmd(&["SET", &state_key("cap"), "1000000"])]).await;
    let client = client(&srv).await;
    let mut w = client
        .failover()
        .start(job("cap").max_attempts(1_000_000).build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    assert!(
        matches!(
            evs.as_slice(),
            [Event::Exhausted {
                attempts: Some(1_000_000)
            }]
        ),
        "{evs:?}"
    );
    assert_eq!(
        get(&mut conn, &state_key("cap")).await.as_deref(),
        Some("EXHAUSTED")
    );
}

#[test]
fn row_03_ttls_of_zero_or_out_of_range_are_rejected_so_px_0_is_never_sent() {
    let b = || FailoverConfig::builder("k");
    for d in [
        Duration::ZERO,
        Duration::from_micros(999), // rounds down to PX 0
        Duration::from_millis(9),
        Duration::from_secs(86_400) + Duration::from_millis(1),
        Duration::from_millis(i64::MAX as u64),
        Duration::MAX,
    ] {
        let (field, reason) = rejected(b().lease(d).retention(Duration::MAX).build());
        assert_eq!(field, "lease", "{d:?}");
        assert!(reason.contains("10ms ..= 1 day"), "{reason}");
    }
    for d in [Duration::from_millis(i64::MAX as u64), Duration::MAX] {
        assert_eq!(rejected(b().retention(d).build()).0, "retention", "{d:?}");
    }
    // Negative and 20-digit values in a config file are refused by the parser.
    for text in [
        r#"{"key":"k","lease_ms":-5}"#,
        r#"{"key":"k","lease_ms":99999999999999999999}"#,
        r#"{"key":"k","retention_ms":-1}"#,
    ] {
        assert!(
            serde_json::from_str::<FailoverConfig>(text).is_err(),
            "{text}"
        );
    }
    let edge = b().lease(Duration::from_millis(10)).build().unwrap();
    assert_eq!(edge.lease(), Duration::from_millis(10));
}

#[test]
fn row_04_the_watchdog_interval_is_always_a_third_of_the_lease() {
    for ms in [10, 11, 100, 5_000, 86_400_000] {
        let lease = Duration::from_millis(ms);
        let cfg = FailoverConfig::builder("k")
            .lease(lease)
            .retention(lease * 2)
            .watchdog(true)
            .build()
            .unwrap();
        let interval = cfg.watchdog_interval();
        assert!(interval > Duration::ZERO, "{lease:?}");
        assert!(interval * 3 <= lease, "{interval:?} for a {lease:?} lease");
    }
    // It is derived, not a setting: a config file cannot set a longer one.
    let file = r#"{"key":"k","watchdog":true,"watchdog_interval_ms":5000}"#;
    assert!(serde_json::from_str::<FailoverConfig>(file).is_err());
}

#[test]
fn row_05_empty_or_blank_names_and_a_prefix_without_separator_are_rejected() {
    for key in ["", " ", "   ", "\t\r\n"] {
        assert_eq!(
            rejected(FailoverConfig::builder(key).build()).0,
            "key",
            "{key:?}"
        );
    }
    for prefix in ["", " ", ":", "  :", "\t:", "baton", "baton:x"] {
        let r = FailoverConfig::builder("k").prefix(prefix).build();
        assert_eq!(rejected(r).0, "prefix", "{prefix:?}");
    }
    for name in ["", "  "] {
        let r = FailoverConfig::builder("k").worker_name(name).build();
        assert_eq!(rejected(r).0, "worker_name", "{name:?}");
    }
    assert!(FailoverConfig::builder(" k ")
        .prefix("app:")
        .build()
        .is_ok());
}

#[tokio::test]
async fn row_06_oversized_keys_and_payloads_are_refused_or_truncated_client_side() {
    let (field, reason) = rejected(FailoverConfig::builder("x".repeat(600 * 1024)).build());
    assert_eq!(field, "key");
    assert!(reason.contains("1..=1024 bytes"), "{reason}");
    // The limit is in bytes: 342 three-byte characters are 1026 bytes.
    assert_eq!(
        rejected(FailoverConfig::builder("ジ".repeat(342)).build()).0,
        "key"
    );
    assert!(FailoverConfig::builder("x".repeat(1024)).build().is_ok());
    let long_prefix = format!("{}:", "p".repeat(1024));
    let r = FailoverConfig::builder("k").prefix(long_prefix).build();
    assert_eq!(rejected(r).0, "prefix");
    let r = FailoverConfig::builder("k")
        .worker_name("w".repeat(257))
        .build();
    assert_eq!(rejected(r).0, "worker_name");

    // A 600 KB failure reason is stored truncated: baton never relies on the server's 512 MB
    // bulk limit to bound what it writes.
    let srv = server();
    let client = client(&srv).await;
    let mut w = client.failover().start(job("big-reason").build().unwrap());
    let a = acquired(&mut w, WAKE).await;
    a.fail("r".repeat(600 * 1024)).await.unwrap();
    until_end(&mut w, WAKE).await;
    let mut conn = raw(&srv).await;
    let stored = get(&mut conn, "baton:{big-reason}:failure").await.unwrap();
    assert!(stored.len() <= 2048, "{} bytes stored", stored.len());
    assert!(stored.ends_with(&"r".repeat(1024)), "{stored:.80}");
}

/// Row 8: a URL of an unknown scheme is refused before any I/O with the schemes this build
/// accepts, exactly (all features are on here, so `postgres://` among them; schemes of features
/// that are not compiled in are never offered).
#[cfg(all(
    feature = "tls",
    feature = "cluster",
    feature = "sentinel",
    feature = "postgres"
))]
#[test]
fn row_08_an_unknown_scheme_lists_exactly_the_compiled_schemes() {
    for url in ["http://127.0.0.1:6379/", "memcache://h:1/"] {
        let err = Client::builder(url).build_lazy().expect_err(url);
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
        let message = err.to_string();
        let listed = message
            .split_once("the scheme must be ")
            .unwrap_or_else(|| panic!("{message}"))
            .1;
        let schemes: BTreeSet<&str> = listed
            .split([',', ' '])
            .filter(|w| w.ends_with("://"))
            .collect();
        let expected: BTreeSet<&str> = [
            "redis://",
            "rediss://",
            "unix://",
            "redis+cluster://",
            "redis+sentinel://",
            "postgres://",
            "postgresql://",
        ]
        .into();
        assert_eq!(schemes, expected, "{message}");
    }
}

#[tokio::test]
async fn row_07_unicode_and_binary_job_names_round_trip_byte_exact() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    for name in [
        "lock:ジョブ:🔒",
        "nul\0byte",
        "cr\r\nlf",
        " spaces in the name ",
        "\u{1b}[31mescape",
    ] {
        let mut w = client.failover().start(job(name).build().unwrap());
        let a = acquired(&mut w, WAKE).await;
        // The exact bytes are the key: `baton:{<name>}`.
        let key = format!("baton:{{{name}}}");
        assert_eq!(get(&mut conn, &key).await.as_deref(), Some("1"), "{name:?}");
        a.done().await.unwrap();
        until_end(&mut w, WAKE).await;
        assert_eq!(
            get(&mut conn, &key).await.as_deref(),
            Some("DONE"),
            "{name:?}"
        );
        assert_eq!(
            client.failover().job_state(name).await.unwrap(),
            JobState::Done
        );
        // A name one byte away is another job.
        let twin = format!("{name}x");
        assert_eq!(
            client.failover().job_state(twin.as_str()).await.unwrap(),
            JobState::Absent
        );
    }
}

// ----- Foreign values in the job's keys (rows 10–17) -----------------------------------------

#[tokio::test]
async fn row_10_a_non_integer_in_any_key_of_the_job_is_corrupt_state_and_left_untouched() {
    let srv = server();
    let cases = [
        (
            "hello",
            vec![cmd(&["SET", "baton:{hello}", "hello"])],
            state_key("hello"),
        ),
        (
            "fence",
            vec![cmd(&["SET", "baton:{fence}:fence", "abc"])],
            fence_key("fence"),
        ),
        (
            "lease",
            vec![
                cmd(&["SET", "baton:{lease}", "1"]),
                cmd(&["SET", "baton:{lease}:lease", "junk"]),
            ],
            lease_key("lease"),
        ),
    ];
    for (name, setup, key) in cases {
        foreign_value_is_reported_and_left_untouched(
            &srv,
            name,
            &setup,
            ErrorKind::CorruptState,
            &key,
        )
        .await;
    }
}

#[tokio::test]
async fn row_11_a_count_above_our_maximum_is_exhausted_for_us_and_never_acquired() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    run_cmds(&mut conn, &[cmd(&["SET", &state_key("big"), "99"])]).await;
    let before = snapshot(&mut conn, &state_key("big")).await;
    let mut w = client
        .failover()
        .start(job("big").max_attempts(3).build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    assert!(
        matches!(evs.as_slice(), [Event::Exhausted { attempts: Some(99) }]),
        "{evs:?}"
    );
    assert_eq!(snapshot(&mut conn, &state_key("big")).await, before);
    assert_eq!(get(&mut conn, &lease_key("big")).await, None);
}

#[tokio::test]
async fn row_12_negative_zero_or_non_canonical_counts_are_corrupt_state() {
    let srv = server();
    // `-5` is what INCR would happily count up from; `0`, `03`, `+3` are numbers baton never
    // writes.
    state_values_are_corrupt(
        &srv,
        &[("neg", "-5"), ("zero", "0"), ("lead", "03"), ("plus", "+3")],
    )
    .await;
}

#[tokio::test]
async fn row_13_a_count_beyond_i64_is_corrupt_state() {
    let srv = server();
    state_values_are_corrupt(
        &srv,
        &[
            ("twenty", "99999999999999999999"),
            ("i64max1", "9223372036854775808"),
        ],
    )
    .await;
}

#[tokio::test]
async fn row_14_only_the_exact_done_sentinel_means_done() {
    let srv = server();
    state_values_are_corrupt(
        &srv,
        &[
            ("lower", "done"),
            ("space", "DONE "),
            ("nul", "DONE\0"),
            ("mixed", "Done"),
            ("exh", "exhausted"),
        ],
    )
    .await;
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    run_cmds(&mut conn, &[cmd(&["SET", &state_key("exact"), "DONE"])]).await;
    let mut w = client.failover().start(job("exact").build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    assert!(
        matches!(evs.as_slice(), [Event::Completed { attempt: None }]),
        "{evs:?}"
    );
}

#[tokio::test]
async fn row_15_a_wrong_type_in_any_key_is_reported_at_once_never_waited_on() {
    let srv = server();
    let cases = [
        (
            "list",
            vec![cmd(&["LPUSH", "baton:{list}", "x"])],
            state_key("list"),
        ),
        (
            "hash",
            vec![
                cmd(&["SET", "baton:{hash}", "1"]),
                cmd(&["HSET", "baton:{hash}:lease", "f", "v"]),
            ],
            lease_key("hash"),
        ),
        (
            "set",
            vec![cmd(&["SADD", "baton:{set}:fence", "1"])],
            fence_key("set"),
        ),
    ];
    for (name, setup, key) in cases {
        foreign_value_is_reported_and_left_untouched(
            &srv,
            name,
            &setup,
            ErrorKind::WrongType,
            &key,
        )
        .await;
    }
}

#[tokio::test]
async fn row_16_a_lease_without_ttl_is_reported_rechecked_and_never_made_to_expire() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let token = "0123456789abcdef0123456789abcdef";
    run_cmds(
        &mut conn,
        &[
            cmd(&["SET", &state_key("nottl"), "1"]),
            cmd(&["SET", &lease_key("nottl"), &format!("{token} someone")]),
        ],
    )
    .await;
    let before = snapshot(&mut conn, &lease_key("nottl")).await;
    let mut w = client.failover().start(
        FailoverConfig::builder("nottl")
            .lease(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    // Reported (retryable: an operator may fix it) and re-checked every lease.
    let mut no_expiry = 0;
    while no_expiry < 2 {
        match next(&mut w, WAKE).await {
            Event::Error {
                kind: ErrorKind::NoExpiry,
                message,
                retryable: true,
            } => {
                assert!(message.contains(&lease_key("nottl")), "{message}");
                no_expiry += 1;
            }
            Event::Locked {
                lease_remaining_ms: None,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
    }
    // Never PERSISTed, never given a TTL, never overwritten.
    assert_eq!(snapshot(&mut conn, &lease_key("nottl")).await, before);
    assert_eq!(
        get(&mut conn, &state_key("nottl")).await.as_deref(),
        Some("1")
    );
    // Once the operator removes it, the re-check notices and the job goes on.
    run_cmds(&mut conn, &[cmd(&["DEL", &lease_key("nottl")])]).await;
    let a = acquired_after_retries(&mut w, WAKE).await;
    assert_eq!(a.attempt, 2);
    a.done().await.unwrap();
}

#[tokio::test]
async fn row_17_fencing_tokens_never_go_back_when_the_fence_key_is_deleted_or_reset() {
    // baton floors every token by the server's TIME in µs and by the last token this worker was
    // granted, so a foreign DEL or SET of the fence key cannot make tokens regress (they only go
    // back if the server's clock does); no TokenRegression error is needed.
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = job("fence").max_attempts(10).build().unwrap();
    let mut last = 0;
    for i in 0..4 {
        let mut w = client.failover().start(cfg.clone());
        let a = acquired(&mut w, WAKE).await;
        assert_eq!(a.attempt, i + 1);
        assert!(a.fencing_token > last, "{} <= {last}", a.fencing_token);
        last = a.fencing_token;
        match i {
            1 => run_cmds(&mut conn, &[cmd(&["DEL", &fence_key("fence")])]).await,
            2 => run_cmds(&mut conn, &[cmd(&["SET", &fence_key("fence"), "1"])]).await,
            _ => vec![],
        };
        a.fail("next").await.unwrap();
        until_end(&mut w, WAKE).await;
    }
}

#[tokio::test]
async fn row_18_baton_sends_no_lua_so_a_script_flush_mid_handover_changes_nothing() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = job("noscript").build().unwrap();
    let mut a = client.failover().start(cfg.clone());
    let first = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg);
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    first.fail("handing over").await.unwrap();
    let second = acquired(&mut b, WAKE).await;
    assert_eq!(second.attempt, 2);
    second.done().await.unwrap();
    for w in [&mut a, &mut b] {
        let evs = until_end(w, WAKE).await;
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Error { .. })),
            "{evs:?}"
        );
    }
    // No script was ever run or loaded (so no NOSCRIPT can happen and no key is ever
    // interpolated into Lua); the stats do see the flush and baton's transactions.
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(stats.contains("cmdstat_script|flush:"), "{stats}");
    assert!(stats.contains("cmdstat_exec:"), "{stats}");
    for lua in ["cmdstat_eval", "cmdstat_script|load", "cmdstat_fcall"] {
        assert!(!stats.contains(lua), "{lua} in {stats}");
    }
}

// ----- The server and its permissions (rows 19–23) -------------------------------------------

#[tokio::test]
async fn row_19_readonly_replica_is_retryable_and_never_counts_as_an_attempt() {
    let primary = server();
    let replica = builder()
        .arg("replicaof", &format!("127.0.0.1 {}", primary.port()))
        .start()
        .unwrap();
    let client = client(&replica).await;
    let mut w = client.failover().start(job("ro").build().unwrap());
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
    // Promote the replica: the worker, still retrying, wins attempt 1: the refusals counted
    // for nothing.
    let mut conn = raw(&replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let a = acquired_after_retries(&mut w, Duration::from_secs(10)).await;
    assert_eq!(a.attempt, 1);
    a.done().await.unwrap();
}

#[tokio::test]
async fn row_20_a_full_server_is_a_retryable_oom_error_and_nothing_is_half_written() {
    let srv = builder()
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
    let mut w = client.failover().start(job("oom").build().unwrap());
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
    let got = acquired_after_retries(&mut w, Duration::from_secs(10)).await;
    assert_eq!(got.attempt, 1, "the refused grant counted as an attempt");
    got.done().await.unwrap();
}

#[tokio::test]
async fn row_21_an_evicting_server_is_flagged_by_the_durability_check() {
    // S4: with an eviction policy Redis may drop a held lease (it did, with volatile-ttl); the
    // documented requirement is noeviction, and `Client::connect` warns when it can tell.
    let srv = builder()
        .arg("maxmemory", "2mb")
        .arg("maxmemory-policy", "volatile-ttl")
        .persistence(Persistence::Durable)
        .start()
        .unwrap();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    for policy in ["volatile-ttl", "allkeys-lru", "noeviction"] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut conn)
            .await
            .unwrap();
        let d = client.durability().await.unwrap();
        let flagged = d
            .problems()
            .iter()
            .any(|p| p.contains(&format!("maxmemory-policy is {policy}")));
        assert_eq!(
            flagged,
            policy != "noeviction",
            "{policy}: {:?}",
            d.problems()
        );
        assert_eq!(
            d.is_safe(),
            policy == "noeviction",
            "{policy}: {:?}",
            d.problems()
        );
    }
}

#[tokio::test]
async fn row_22_auth_failure_fails_closed_as_a_permission_error_without_the_password() {
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

    // Fail closed: where the default user needs no password, a failed AUTH as a named user
    // (wrong password, unknown user, disabled user) must not carry on as the default user, as
    // redis-cli does.
    let open = server();
    admin(
        &open,
        &cmd(&["SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all"]),
    )
    .await;
    admin(
        &open,
        &cmd(&["SETUSER", "off-user", "off", ">wrong-canary", "~*", "+@all"]),
    )
    .await;
    for user in ["app", "ghost", "off-user"] {
        let t0 = Instant::now();
        let err = Client::connect(user_url(&open, user, "wrong-canary"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Permission, "{user}: {err}");
        assert!(!format!("{err} {err:?}").contains("wrong-canary"), "{user}");
        assert!(
            t0.elapsed() < WAKE,
            "{user}: retried for {:?}",
            t0.elapsed()
        );
    }
    assert!(Client::connect(user_url(&open, "app", "app-pw"))
        .await
        .is_ok());
}

#[tokio::test]
async fn row_23_a_user_lacking_a_command_gets_a_final_permission_error_naming_it() {
    let srv = server();
    let mut args = baton::acl::setuser_args("weak", "pw", "baton:");
    args.push("-publish".into());
    admin(&srv, &args).await;
    let client = Client::connect(user_url(&srv, "weak", "pw")).await.unwrap();
    let mut w = client.failover().start(job("noperm").build().unwrap());
    let evs = until_end(&mut w, WAKE).await;
    // One final error, naming the command; not retried in a loop.
    match evs.as_slice() {
        [Event::Error {
            kind: ErrorKind::Permission,
            retryable: false,
            message,
        }] => assert!(message.contains("publish"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(!evs.iter().any(|e| matches!(e, Event::Acquired(_))));
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("noperm")).await,
        None,
        "nothing written"
    );
}

// ----- Outages, pauses, lost replies and clocks (rows 24–32) ---------------------------------

// current_thread (the default, named for clarity): the worker, the redis-rs connection tasks and
// the pub/sub hub of this test all run on this one thread, so its CPU time is theirs alone,
// whatever the other tests of this binary are doing meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn row_24_connection_refused_is_a_retryable_connection_error_with_backoff_and_no_busy_loop() {
    // At connect time: a port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let err = Client::connect(format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));

    // While a worker runs: Redis goes down for 3 s.
    let mut srv = server();
    let client = client(&srv).await;
    srv.kill();
    let mut w = client.failover().start(job("refused").build().unwrap());
    let (cpu0, t0) = (thread_cpu(), Instant::now());
    let mut refused = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        match tokio::time::timeout(Duration::from_millis(100), next(&mut w, WAKE)).await {
            Ok(Event::Error {
                kind: ErrorKind::Connection,
                retryable: true,
                message,
            }) => {
                assert!(message.contains("refused"), "{message}");
                refused += 1;
            }
            Ok(other) => panic!("during the outage: {other:?}"),
            Err(_) => {}
        }
    }
    let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
    // Exponential backoff from 50 ms: about 7 tries in 3 s, and no measurable CPU. With the
    // backoff set to zero (tried) it was ~2500 tries and ~430 ms of CPU: tokio's 1 ms timer
    // tick is all that stood between it and a spinning core.
    assert!((2..=30).contains(&refused), "{refused} errors in {wall:?}");
    assert!(cpu < wall / 10, "{cpu:?} of CPU in {wall:?}");
    srv.restart().unwrap();
    let a = acquired_after_retries(&mut w, Duration::from_secs(15)).await;
    assert_eq!(a.attempt, 1);
    a.done().await.unwrap();
}

#[tokio::test]
async fn row_25_a_grant_whose_exec_timed_out_is_re_read_and_recognised_as_ours() {
    // Freeze Redis right before the grant's EXEC is sent: the EXEC times out on the client (its
    // outcome unknown), then Redis wakes up and applies it. The worker must re-read, find its
    // own token in the lease and take the attempt, instead of starting another one or waiting
    // out its own lease as a stranger's.
    let srv = Arc::new(server());
    let client = client(&srv).await;
    let fired = Arc::new(AtomicBool::new(false));
    let frozen = srv.clone();
    baton::__seam::set_before_exec_hook(
        &client,
        Some(Arc::new(move |what| {
            let (srv, fired) = (frozen.clone(), fired.clone());
            Box::pin(async move {
                if what != "grant" || fired.swap(true, Ordering::SeqCst) {
                    return;
                }
                srv.pause().unwrap();
                std::thread::spawn(move || {
                    // Longer than the 500 ms response timeout.
                    std::thread::sleep(Duration::from_millis(1200));
                    srv.resume().unwrap();
                });
            })
        })),
    );
    let t0 = Instant::now();
    let mut w = client.failover().start(job("lostreply").build().unwrap());
    let mut timeouts = 0;
    let got = loop {
        match next(&mut w, WAKE).await {
            Event::Error {
                retryable: true,
                kind,
                ..
            } => {
                assert!(
                    matches!(kind, ErrorKind::Timeout | ErrorKind::Connection),
                    "{kind:?}"
                );
                timeouts += 1;
            }
            Event::Acquired(a) => break a,
            other => panic!("{other:?}"),
        }
    };
    assert!(timeouts > 0, "the EXEC did not time out");
    assert_eq!(got.attempt, 1);
    // Well before the 10 s lease it granted itself could have run out.
    assert!(t0.elapsed() < WAKE);
    let mut conn = raw(&srv).await;
    assert_eq!(
        get(&mut conn, &state_key("lostreply")).await.as_deref(),
        Some("1")
    );
    got.done().await.unwrap();
}

#[tokio::test]
async fn row_26_a_late_reply_after_a_timeout_is_never_taken_for_the_next_request() {
    let srv = server();
    let client = Client::builder(srv.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let mut conn = raw(&srv).await;
    run_cmds(
        &mut conn,
        &[
            cmd(&["SET", &state_key("a"), "1"]),
            cmd(&["SET", &state_key("b"), "DONE"]),
            cmd(&["SET", &state_key("c"), "7"]),
        ],
    )
    .await;
    srv.pause().unwrap();
    // Two reads time out; their replies are still owed and arrive after the resume.
    for name in ["a", "b"] {
        let err = client.failover().job_state(name).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(err.is_retryable());
    }
    // A worker's transition times out too (on a dedicated connection).
    let mut w = client.failover().start(job("b").build().unwrap());
    match next(&mut w, WAKE).await {
        Event::Error {
            kind: ErrorKind::Timeout | ErrorKind::Connection,
            retryable: true,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    srv.resume().unwrap();
    // Each later request gets its own reply: `c` is not given the late reply meant for `a`.
    assert!(matches!(
        client.failover().job_state("c").await.unwrap(),
        JobState::Attempt { number: 7, .. }
    ));
    assert_eq!(
        client.failover().job_state("b").await.unwrap(),
        JobState::Done
    );
    assert!(matches!(
        client.failover().job_state("a").await.unwrap(),
        JobState::Attempt { number: 1, .. }
    ));
    // The worker re-reads `b` and finds it DONE; it never acquires.
    let evs = until_end(&mut w, WAKE).await;
    assert!(
        matches!(evs.last(), Some(Event::Completed { attempt: None })),
        "{evs:?}"
    );
    assert!(!evs.iter().any(|e| matches!(e, Event::Acquired(_))));
}

#[tokio::test]
async fn row_27_a_lost_watch_race_or_a_reset_exec_consumes_no_attempt() {
    let srv = server();
    let rival = "ffffffffffffffffffffffffffffffff rival";
    // Attempt 1 failed (count 1, no lease) in each case; the hook acts right before the
    // takeover's EXEC.
    for (name, injected) in [
        // A write that changes nothing still trips the WATCH: EXEC answers nil.
        ("same", vec![cmd(&["SET", "baton:{same}", "1"])]),
        // Another backup wins attempt 2 first.
        (
            "rival",
            vec![
                cmd(&["SET", "baton:{rival}", "2"]),
                cmd(&["SET", "baton:{rival}:lease", rival, "PX", "10000"]),
            ],
        ),
        // The connection is reset between MULTI/EXEC queueing and the reply: indeterminate.
        (
            "reset",
            vec![cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])],
        ),
    ] {
        // Fresh per case: the reset case kills every other connection, this one included.
        let mut conn = raw(&srv).await;
        let client = client(&srv).await;
        run_cmds(&mut conn, &[cmd(&["SET", &state_key(name), "1"])]).await;
        inject_before_exec(&client, srv.url(), "grant", injected);
        let mut w = client.failover().start(
            job(name)
                .max_attempts(10)
                .status_level(baton::StatusLevel::Verbose)
                .build()
                .unwrap(),
        );
        if name == "rival" {
            // The loser sees the winner's attempt and waits; the count is the winner's.
            assert!(
                matches!(next(&mut w, WAKE).await, Event::Locked { attempt: 2, .. }),
                "{name}"
            );
            assert_eq!(get(&mut conn, &state_key(name)).await.as_deref(), Some("2"));
            // The rival fails: the loser takes the next attempt, 3.
            run_cmds(
                &mut conn,
                &[
                    cmd(&["DEL", &lease_key(name)]),
                    cmd(&["PUBLISH", "baton:{rival}:events", "failed"]),
                ],
            )
            .await;
            let a = acquired(&mut w, WAKE).await;
            assert_eq!(a.attempt, 3);
            a.done().await.unwrap();
            continue;
        }
        // Everything up to the grant, Status included: each observation says what it decided.
        let mut decided = 0;
        let mut indeterminate = 0;
        let a = loop {
            match tokio::time::timeout(WAKE, w.next()).await.unwrap().unwrap() {
                Event::Acquired(a) => break a,
                Event::Status { message, .. } if message.contains("decided Grant") => decided += 1,
                Event::Error {
                    kind: ErrorKind::Connection | ErrorKind::Timeout,
                    retryable: true,
                    ..
                } => indeterminate += 1,
                // The answer after those errors.
                Event::Status { .. } | Event::Reachable { .. } => {}
                other => panic!("{name}: {other:?}"),
            }
        };
        assert_eq!(a.attempt, 2, "{name}: the failed EXEC consumed an attempt");
        // The first EXEC really failed (nil, or a reset), and the grant was decided anew.
        assert!(decided >= 2, "{name}: decided {decided} times");
        assert_eq!(indeterminate > 0, name == "reset", "{name}");
        let mut conn = raw(&srv).await;
        assert_eq!(get(&mut conn, &state_key(name)).await.as_deref(), Some("2"));
        a.done().await.unwrap();
    }
}

#[tokio::test]
async fn row_28_redis_restarted_without_persistence_is_state_lost_never_a_rerun() {
    let mut srv = server();
    let client = client(&srv).await;
    let cfg = FailoverConfig::builder("lost")
        .lease(Duration::from_secs(10))
        .watchdog(true)
        .build()
        .unwrap();
    let mut a = client.failover().start(cfg.clone());
    let _got = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg);
    assert!(matches!(
        next(&mut b, WAKE).await,
        Event::Locked { attempt: 1, .. }
    ));
    srv.kill();
    srv.restart_with(Persistence::Volatile).unwrap();
    for (who, w) in [("holder", &mut a), ("backup", &mut b)] {
        let evs = until_end(w, Duration::from_secs(15)).await;
        assert!(
            matches!(
                evs.last(),
                Some(Event::Error {
                    kind: ErrorKind::StateLost,
                    retryable: false,
                    ..
                })
            ),
            "{who}: {evs:?}"
        );
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Acquired(_))),
            "{who} re-ran the job"
        );
    }
}

#[tokio::test]
async fn row_29_client_pause_write_times_out_the_holder_which_then_carries_on_alone() {
    let srv = server();
    let client = Client::builder(srv.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let mut conn = raw(&srv).await;
    // Keepalive every 4 s / 3; the pause covers the first extension and its retries.
    let cfg = job("paused")
        .lease(Duration::from_secs(4))
        .watchdog(true)
        .build()
        .unwrap();
    let mut a = client.failover().start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg);
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2500)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut timeouts = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        match tokio::time::timeout(Duration::from_millis(100), next(&mut a, WAKE)).await {
            Ok(Event::Error {
                kind: ErrorKind::Timeout,
                retryable: true,
                ..
            }) => timeouts += 1,
            Ok(other) => panic!("holder during the pause: {other:?}"),
            Err(_) => {}
        }
    }
    assert!(timeouts > 0, "no extension timed out during the pause");
    // The holder still holds attempt 1 and finishes; the backup never held anything.
    got.done().await.unwrap();
    let evs = until_end(&mut a, WAKE).await;
    assert!(
        matches!(evs.last(), Some(Event::Completed { attempt: Some(1) })),
        "{evs:?}"
    );
    let evs = until_end(&mut b, WAKE).await;
    assert!(
        matches!(evs.as_slice(), [Event::Completed { attempt: None }]),
        "{evs:?}"
    );
}

#[tokio::test]
async fn row_30_a_server_clock_jump_hands_over_and_the_holder_hears_lease_lost_at_once() {
    // F9 emulated by shrinking the lease's TTL, for a holder without keepalive (S8 in
    // scenarios.rs is the keepalive case): nothing of its own would tell it before its deadline.
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = FailoverConfig::builder("jump")
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut a = client.failover().start(cfg.clone());
    let old = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg);
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    run_cmds(&mut conn, &[cmd(&["PEXPIRE", &lease_key("jump"), "1"])]).await;
    let new = acquired(&mut b, WAKE).await;
    assert_eq!(new.attempt, 2);
    assert!(new.fencing_token > old.fencing_token);
    // The holder hears it without calling anything (the takeover's `acquired:2`).
    let evs = until_end(&mut a, WAKE).await;
    assert!(
        matches!(evs.last(), Some(Event::LeaseLost { attempt: 1, .. })),
        "{evs:?}"
    );
    // Its late done() is refused and writes nothing.
    assert!(matches!(
        old.done().await,
        Err(baton::Error::LeaseLost { .. })
    ));
    assert_eq!(
        get(&mut conn, &state_key("jump")).await.as_deref(),
        Some("2")
    );
    new.done().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn row_31_a_monotonic_jump_past_the_lease_is_lease_lost_without_panicking() {
    // A real CLOCK_MONOTONIC jump cannot be made here. What a jump does to the worker is that
    // every timer is overdue at once; freezing this runtime's only thread does exactly that
    // (while Redis, in another process, really lets the lease expire). Huge deadlines
    // (`max_hold` at its 10-year cap) must saturate, not overflow.
    let ten_years = Duration::from_secs(10 * 365 * 86_400);
    let (field, _) = rejected(job("k").max_hold(Some(Duration::MAX)).build());
    assert_eq!(field, "max_hold");
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = FailoverConfig::builder("mono")
        .lease(Duration::from_millis(300))
        .watchdog(true)
        .max_hold(Some(ten_years))
        .build()
        .unwrap();
    let mut a = client.failover().start(cfg.clone());
    let got = acquired(&mut a, WAKE).await;
    std::thread::sleep(Duration::from_millis(900));
    // The overdue extension finds the lease gone: the holder does not assume it still holds.
    let evs = until_end(&mut a, WAKE).await;
    assert!(
        matches!(evs.last(), Some(Event::LeaseLost { attempt: 1, .. })),
        "{evs:?}"
    );
    assert!(matches!(
        got.done().await,
        Err(baton::Error::LeaseLost { .. })
    ));
    assert_eq!(
        get(&mut conn, &state_key("mono")).await.as_deref(),
        Some("1")
    );
    let mut b = client.failover().start(cfg);
    let next_one = acquired(&mut b, WAKE).await;
    assert_eq!(next_one.attempt, 2);
    next_one.done().await.unwrap();
}

#[tokio::test]
async fn row_32_a_killed_pubsub_link_is_resubscribed_and_the_state_re_read() {
    let srv = server();
    let client = client(&srv).await;
    let mut conn = raw(&srv).await;
    let cfg = job("pubsub").build().unwrap();
    let mut a = client.failover().start(cfg.clone());
    let _first = acquired(&mut a, WAKE).await;
    let mut b = client.failover().start(cfg);
    assert!(matches!(
        next(&mut b, WAKE).await,
        Event::Locked { attempt: 1, .. }
    ));
    // The holder's lease ends and the news is lost (no message: as if `failed` had been
    // published while the link was down); then the link dies.
    run_cmds(&mut conn, &[cmd(&["DEL", &lease_key("pubsub")])]).await;
    let killed = run_cmds(&mut conn, &[cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])]).await;
    assert_eq!(killed, vec![redis::Value::Int(1)], "one pub/sub link");
    // Only the resubscribe-and-re-read path can wake the backup before the 10 s lease it saw.
    let t0 = Instant::now();
    let second = acquired(&mut b, WAKE).await;
    assert_eq!(second.attempt, 2);
    assert!(t0.elapsed() < WAKE);
    // And the old holder hears the takeover on the new link.
    let evs = until_end(&mut a, WAKE).await;
    assert!(
        matches!(evs.last(), Some(Event::LeaseLost { attempt: 1, .. })),
        "{evs:?}"
    );
    second.done().await.unwrap();
}

// ----- User code (row 35) --------------------------------------------------------------------

#[tokio::test]
async fn row_35_a_panicking_job_fails_its_attempt_visibly_and_a_backup_takes_over() {
    let srv = server();
    let client = client(&srv).await;
    let cfg = job("panics").max_attempts(5).build().unwrap();
    // A panic inside the work's future, while a backup (another process's client) waits.
    let go = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (client, cfg, go) = (client.clone(), cfg.clone(), go.clone());
        tokio::spawn(async move {
            client
                .failover()
                .run(cfg, move |_| {
                    let go = go.clone();
                    async move {
                        go.notified().await;
                        if true {
                            panic!("boom in the future");
                        }
                        Ok::<(), String>(())
                    }
                })
                .await
        })
    };
    let other = self::client(&srv).await;
    let mut backup = other.failover().start(cfg.clone());
    assert!(matches!(
        next(&mut backup, WAKE).await,
        Event::Locked { attempt: 1, .. }
    ));
    go.notify_one();
    match running
        .await
        .expect("the coordinator did not panic")
        .unwrap()
    {
        RunOutcome::Failed {
            attempt: 1,
            reason,
            panicked: true,
            error: None,
        } => assert!(reason.contains("boom in the future"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The backup takes over at once (the 10 s lease was released, not waited out).
    let second = acquired(&mut backup, WAKE).await;
    assert_eq!(second.attempt, 2);
    second.fail("handing on").await.unwrap();
    // A closure that panics before it returns a future is contained the same way.
    let out = client
        .failover()
        .run(cfg.clone(), |_| -> std::future::Ready<Result<(), String>> {
            panic!("boom before the future")
        })
        .await
        .unwrap();
    match out {
        RunOutcome::Failed {
            attempt: 3,
            reason,
            panicked: true,
            error: None,
        } => assert!(reason.contains("boom before the future"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The same client keeps coordinating.
    let done = client
        .failover()
        .run(cfg, |a| async move { Ok::<_, String>(a.attempt) })
        .await
        .unwrap();
    assert_eq!(done, RunOutcome::Done(4));
}
