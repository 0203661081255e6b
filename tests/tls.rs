//! Catalogue rows 8 and 33 (RELIABILITY.md §c) and security items d#4–d#7 over real TLS: a
//! private TLS-only redis-server per test (certificates made by `openssl` at test time), the
//! whole failover protocol over TLS, and every handshake failure as `ErrorKind::Tls`, at once,
//! without a panic and without any plain-TCP attempt.

mod common;

use std::time::{Duration, Instant};

use baton::testing::RedisServer;
use baton::{Client, ClientBuilder, ConfigError, Error, ErrorKind, Event};
use common::*;

/// Generous: a TLS failure must come back in well under the connect timeouts' sum.
const PROMPT: Duration = Duration::from_secs(5);

fn assert_no_panic() {
    let panics = recorded_panics();
    assert!(panics.is_empty(), "panics: {panics:?}");
}

fn tls_server() -> RedisServer {
    record_panics();
    RedisServer::builder()
        .tls()
        .start()
        .unwrap_or_else(|e| panic!("cannot start a TLS redis-server: {e}"))
}

/// The right CA and the client certificate, for `host`.
fn trusted(srv: &RedisServer, host: &str) -> ClientBuilder {
    let files = srv.tls().expect("a TLS server");
    Client::builder(format!("rediss://{host}:{}/", srv.port()))
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .tls_client_cert_files(&files.client_cert, &files.client_key)
        .unwrap()
}

/// Connects, expecting a TLS failure: returns it after checking kind, retryability and speed.
async fn tls_failure(b: ClientBuilder) -> Error {
    let t0 = Instant::now();
    let err = b.connect().await.expect_err("the handshake must fail");
    let took = t0.elapsed();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err:?}");
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(!err.is_retryable(), "a TLS failure is never retried");
    assert!(
        took < PROMPT,
        "took {took:?}: retried instead of failing at once"
    );
    err
}

/// A plain-TCP attempt on the TLS-only port makes redis log an SSL error; there must be none.
fn assert_no_plain_attempt(srv: &RedisServer) {
    let log = srv.log();
    for sign in [
        "wrong version number",
        "http request",
        "packet length too long",
    ] {
        assert!(
            !log.contains(sign),
            "a non-TLS connection reached the server:\n{log}"
        );
    }
}

#[tokio::test]
async fn row_33_right_ca_and_client_cert_run_the_whole_failover_protocol() {
    let srv = tls_server();
    let client = trusted(&srv, "127.0.0.1")
        .connect()
        .await
        .expect("connect over TLS");
    let cfg = job("tls").build().unwrap();
    let mut a = client.failover().start(cfg.clone());
    let first = acquired(&mut a, WAKE).await;
    assert_eq!(first.attempt, 1);
    let first_token = first.fencing_token;
    let mut b = client.failover().start(cfg.clone());
    assert!(matches!(next(&mut b, WAKE).await, Event::Locked { .. }));
    // The backup is woken through pub/sub, over TLS as well, well before the 10 s lease ends.
    first.fail("handing over").await.unwrap();
    let second = acquired(&mut b, WAKE).await;
    assert_eq!(second.attempt, 2);
    assert!(second.fencing_token > first_token);
    second.done().await.unwrap();
    for w in [&mut a, &mut b] {
        let evs = until_end(w, WAKE).await;
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Error { .. })),
            "errors over TLS: {evs:?}"
        );
    }
    assert_eq!(
        client.failover().job_state("tls").await.unwrap(),
        baton::JobState::Done
    );
    // And by the name in the certificate, through the plain unix socket for the raw check.
    let by_name = trusted(&srv, "localhost")
        .connect()
        .await
        .expect("localhost");
    assert_eq!(
        by_name.failover().job_state("tls").await.unwrap(),
        baton::JobState::Done
    );
    let unix = srv.unix_url().expect("a unix socket");
    let mut raw = redis::Client::open(unix)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    assert_eq!(
        get(&mut raw, &state_key("tls")).await.as_deref(),
        Some("DONE")
    );
    assert!(client.shutdown(Duration::from_secs(5)).await);
    assert_no_plain_attempt(&srv);
    assert_no_panic();
}

#[tokio::test]
async fn row_33_wrong_ca_is_a_tls_error_never_retried_insecurely() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let b = trusted(&srv, "127.0.0.1")
        .tls_root_ca_file(&files.untrusted_ca_cert)
        .unwrap();
    let err = tls_failure(b).await;
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    assert_no_plain_attempt(&srv);
    assert_no_panic();
}

#[tokio::test]
async fn row_33_no_ca_means_system_roots_which_do_not_know_a_private_ca() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let b = Client::builder(srv.url())
        .tls_client_cert_files(&files.client_cert, &files.client_key)
        .unwrap();
    let err = tls_failure(b).await;
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    assert_no_plain_attempt(&srv);
    assert_no_panic();
}

#[tokio::test]
async fn row_33_name_not_in_the_certificate_is_a_tls_error() {
    let srv = tls_server();
    // The server listens on 127.0.0.2 too, but its certificate names localhost and 127.0.0.1.
    let err = tls_failure(trusted(&srv, "127.0.0.2")).await;
    assert!(
        err.to_string().contains("not valid for name \"127.0.0.2\""),
        "{err}"
    );
    assert_no_plain_attempt(&srv);
    assert_no_panic();
}

#[tokio::test]
async fn row_33_missing_client_cert_is_a_tls_error() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let b = Client::builder(srv.url())
        .tls_root_ca_file(&files.ca_cert)
        .unwrap();
    let err = tls_failure(b).await;
    assert!(err.to_string().contains("CertificateRequired"), "{err}");
    assert_no_plain_attempt(&srv);
    assert_no_panic();
}

#[tokio::test]
async fn row_33_a_plain_client_on_the_tls_port_is_a_connection_error() {
    let srv = tls_server();
    let plain = format!("redis://127.0.0.1:{}/", srv.port());
    let t0 = Instant::now();
    let err = Client::connect(plain).await.expect_err("no plain service");
    assert!(t0.elapsed() < PROMPT, "{:?}", t0.elapsed());
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{err:?}"
    );
    // What assert_no_plain_attempt looks for is what a plain attempt leaves in the log.
    let log = srv.log();
    assert!(log.contains("wrong version number"), "{log}");
    assert_no_panic();
}

fn config_field(err: Error) -> &'static str {
    match err {
        Error::Config(ConfigError::Invalid { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[tokio::test]
async fn insecure_fragment_is_refused() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let before = srv.log();
    for url in [
        format!("rediss://127.0.0.1:{}/#insecure", srv.port()),
        format!("rediss://:pw@127.0.0.1:{}/0#insecure", srv.port()),
    ] {
        let t0 = Instant::now();
        let err = Client::builder(url.clone())
            .tls_root_ca_file(&files.ca_cert)
            .unwrap()
            .tls_client_cert_files(&files.client_cert, &files.client_key)
            .unwrap()
            .connect()
            .await
            .expect_err("#insecure must be refused");
        assert!(t0.elapsed() < PROMPT);
        assert!(err.to_string().contains("#insecure"), "{err}");
        assert!(!err.to_string().contains(":pw@"), "{err}");
        assert_eq!(config_field(err), "url", "{url}");
        // Without any TLS option too.
        let err = Client::connect(url).await.expect_err("refused");
        assert_eq!(config_field(err), "url");
    }
    // Refused before any network I/O: the server saw nothing.
    assert_eq!(srv.log(), before);
    assert_no_panic();
}

#[tokio::test]
async fn row_08_tls_options_with_a_redis_url_are_a_config_error() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let err = Client::builder(format!("redis://127.0.0.1:{}/", srv.port()))
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .connect()
        .await
        .expect_err("TLS options need rediss://");
    assert!(err.to_string().contains("not rediss://"), "{err}");
    assert_eq!(config_field(err), "url");
    for url in [
        "rediss://127.0.0.1:0/".to_string(),
        format!("rediss://:@127.0.0.1:{}/", srv.port()),
        "rediss://127.0.0.1:99999/".to_string(),
        format!("https://127.0.0.1:{}/", srv.port()),
    ] {
        let err = trusted_url(&srv, &url).connect().await.expect_err(&url);
        assert_eq!(config_field(err), "url", "{url}");
    }
    assert_no_panic();
}

fn trusted_url(srv: &RedisServer, url: &str) -> ClientBuilder {
    let files = srv.tls().unwrap();
    Client::builder(url)
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .tls_client_cert_files(&files.client_cert, &files.client_key)
        .unwrap()
}

#[tokio::test]
async fn row_33_bad_pem_and_a_key_that_does_not_fit_are_config_errors_naming_the_field() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let key = std::fs::read_to_string(&files.server_key).unwrap();
    // The server's key with the client's certificate: caught before connecting.
    let err = Client::builder(srv.url())
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .tls_client_cert_pem(std::fs::read(&files.client_cert).unwrap(), key.clone())
        .connect()
        .await
        .expect_err("mismatched key");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!shown.contains(&body[..20]), "key material in {shown}");
    assert_eq!(config_field(err), "tls_client_key");
    // Not PEM at all.
    let err = Client::builder(srv.url())
        .tls_root_ca_pem("not a certificate")
        .connect()
        .await
        .expect_err("bad CA");
    assert_eq!(config_field(err), "tls_root_ca");
    let err = Client::builder(srv.url())
        .tls_client_cert_pem("nope", key)
        .connect()
        .await
        .expect_err("bad cert");
    assert_eq!(config_field(err), "tls_client_cert");
    // Files that do not exist: at the builder call that names them.
    let err = Client::builder(srv.url())
        .tls_root_ca_file("/nonexistent/ca.crt")
        .expect_err("missing file");
    assert!(matches!(
        err,
        ConfigError::Invalid {
            field: "tls_root_ca",
            ..
        }
    ));
    let err = Client::builder(srv.url())
        .tls_client_cert_files(&files.client_cert, "/nonexistent/client.key")
        .expect_err("missing file");
    assert!(matches!(
        err,
        ConfigError::Invalid {
            field: "tls_client_key",
            ..
        }
    ));
    assert_no_panic();
}

#[tokio::test]
async fn tls_options_debug_shows_paths_and_sizes_never_key_material() {
    let srv = tls_server();
    let files = srv.tls().unwrap();
    let key = std::fs::read_to_string(&files.client_key).unwrap();
    let b = Client::builder(srv.url())
        .tls_client_cert_pem(std::fs::read(&files.client_cert).unwrap(), key.clone());
    let shown = format!("{b:?}");
    assert!(shown.contains("<pem "), "{shown}");
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains("CERTIFICATE"),
        "{shown}"
    );
    let b = trusted(&srv, "127.0.0.1");
    let shown = format!("{b:?}");
    assert!(
        shown.contains(&files.client_key.display().to_string()),
        "{shown}"
    );
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    let client = b.connect().await.unwrap();
    let shown = format!("{client:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert_no_panic();
}
