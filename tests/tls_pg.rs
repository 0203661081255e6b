//! TLS to PostgreSQL (`sslmode=require`): every connection of a client (the pool, the `LISTEN`
//! hub, a session guard's own) is encrypted and the server's certificate verified; an untrusted
//! certificate or a server without TLS is a TLS error, never plain TCP. Against a private
//! PostgreSQL of its own with TLS turned on (`PgServer::enable_tls`).
#![cfg(all(feature = "testing", feature = "postgres"))]

use baton::prelude::*;
use std::time::Duration;

use baton::testing::PgServer;
use baton::{AcquireOptions, Client, ErrorKind};

/// One server for the binary's tests (each uses names of its own).
fn server() -> &'static (PgServer, baton::testing::TlsFiles) {
    static SERVER: std::sync::OnceLock<(PgServer, baton::testing::TlsFiles)> =
        std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        let pg = PgServer::start().expect("start PostgreSQL");
        let files = pg.enable_tls().expect("turn TLS on");
        (pg, files)
    })
}

/// The sessions named `baton` and whether each is encrypted.
fn baton_sessions(pg: &PgServer) -> String {
    pg.psql(
        "SELECT coalesce(string_agg(s.ssl::text, ',' ORDER BY a.pid), '')
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.application_name = 'baton'",
    )
    .expect("psql")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_with_the_private_ca_encrypts_every_connection() {
    let (pg, files) = server();
    let url = format!("{}?sslmode=require", pg.url());
    let a = Client::builder(&url)
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .connect()
        .await
        .expect("connect over TLS");
    let b = Client::builder(&url)
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .connect()
        .await
        .unwrap();
    // A held lock and a waiter parked on its release: pooled connections and b's LISTEN hub.
    let held = a
        .locks()
        .acquire("tls", Duration::from_secs(10), &AcquireOptions::default())
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.locks()
            .acquire("tls", Duration::from_secs(10), &AcquireOptions::default())
            .await
            .map(|g| g.fencing_token())
    });
    // A session guard has a connection of its own.
    let session = a
        .advisory_locks()
        .acquire(41i64, baton::AdvisoryMode::Exclusive, &Default::default())
        .await
        .expect("a session lock over TLS");
    // At least four sessions: a's pooled one and its session guard's, b's pooled one and its
    // LISTEN connection (the waiter subscribes after its first try).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let sessions = loop {
        let sessions = baton_sessions(pg);
        if sessions.split(',').filter(|s| s.trim() == "true").count() >= 4 {
            break sessions;
        }
        assert!(
            std::time::Instant::now() < until,
            "fewer than 4 baton sessions over TLS: {sessions:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !sessions.contains("false"),
        "a baton session without TLS: {sessions:?}"
    );
    let first = held.fencing_token();
    assert!(held.release().await.unwrap());
    let second = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken through the LISTEN connection")
        .unwrap()
        .unwrap();
    assert!(second > first);
    drop(session);
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_tls_error_not_plain_tcp() {
    let (pg, files) = server();
    let url = format!("{}?sslmode=require", pg.url());
    // Another CA than the one that signed the server's certificate.
    let err = Client::builder(&url)
        .tls_root_ca_file(&files.untrusted_ca_cert)
        .unwrap()
        .connect()
        .await
        .expect_err("a certificate from an untrusted CA was accepted");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // libpq's verify-full reads as require: verified the same way.
    let err = Client::builder(format!("{}?sslmode=verify-full", pg.url()))
        .tls_root_ca_file(&files.untrusted_ca_cert)
        .unwrap()
        .connect()
        .await
        .expect_err("verify-full accepted an untrusted certificate");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
}

#[tokio::test]
async fn a_server_without_tls_is_refused_under_require() {
    let plain = PgServer::start().expect("start PostgreSQL");
    let url = format!("{}?sslmode=require", plain.url());
    let err = Client::connect(&url)
        .await
        .expect_err("sslmode=require connected without TLS");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("does not support TLS"), "{err}");
    // The default (prefer) connects without TLS, as before.
    let c = Client::connect(&plain.url())
        .await
        .expect("a plain connection");
    assert!(c
        .locks()
        .try_acquire("plain", Duration::from_secs(5))
        .await
        .unwrap()
        .is_some());
}
