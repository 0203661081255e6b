//! Security item d#8: credentials are never logged. A canary password goes in through the URL,
//! `.password()` and `.password_file()` (and a wrong one through the URL of an ACL user), and
//! everything a user could see is collected: `{:?}` and `{}` of the builder, the client and
//! every error, every worker event as JSON, everything `tracing` logs at TRACE level, and any
//! panic message. The canary must appear nowhere. Under the `tls` feature the same holds for
//! the private key of a client certificate.

mod common;

use std::time::Duration;

use baton::testing::RedisServer;
use baton::{Client, ClientBuilder, Event, Worker};
use common::*;
use tokio_stream::StreamExt;

/// Every secret in this file contains it.
const CANARY: &str = "canary-7f3a9c";

/// Everything collected, with where it came from.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, what: impl Into<String>, text: impl Into<String>) {
        self.0.push((what.into(), text.into()));
    }
    fn shown<T: std::fmt::Debug + std::fmt::Display>(&mut self, what: &str, v: &T) {
        self.add(format!("{what} (Debug)"), format!("{v:?}"));
        self.add(format!("{what} (Display)"), v.to_string());
    }
    fn debug<T: std::fmt::Debug>(&mut self, what: &str, v: &T) {
        self.add(format!("{what} (Debug)"), format!("{v:?}"));
    }
    fn event(&mut self, what: &str, ev: &Event) {
        self.add(
            format!("{what} event JSON"),
            serde_json::to_string(ev).expect("events serialize"),
        );
        self.debug(&format!("{what} event"), ev);
    }
    fn assert_clean(&self, secret: &str) {
        for (what, text) in &self.0 {
            assert!(
                !text.contains(secret),
                "the secret leaked through {what}: {text}"
            );
        }
    }
}

/// Reads events for up to `within` (or to the stream's end), recording each.
async fn drain(seen: &mut Seen, what: &str, w: &mut Worker, within: Duration) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, w.next()).await {
        seen.event(what, &ev);
        out.push(ev);
    }
    out
}

fn server_with_password() -> RedisServer {
    RedisServer::builder()
        .requirepass(CANARY)
        .start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"))
}

fn url_with(password: &str, user: &str, port: u16) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{port}/")
}

/// Connects (recording the builder and the outcome), runs one job to DONE and a failover, and
/// returns the client.
async fn connect_and_run(seen: &mut Seen, what: &str, b: ClientBuilder) -> Client {
    seen.debug(&format!("{what} builder"), &b);
    let client = b.connect().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    seen.debug(&format!("{what} client"), &client);
    let cfg = job(&format!("redact-{what}")).build().unwrap();
    let mut a = client.failover().start(cfg.clone());
    let first = acquired(&mut a, WAKE).await;
    seen.debug(&format!("{what} acquired"), &first);
    let mut b = client.failover().start(cfg);
    let locked = next(&mut b, WAKE).await;
    seen.event(what, &locked);
    first.fail(format!("{what} fails once")).await.unwrap();
    let second = acquired(&mut b, WAKE).await;
    second.done().await.unwrap();
    for w in [&mut a, &mut b] {
        for ev in until_end(w, WAKE).await {
            seen.event(what, &ev);
        }
    }
    client
}

#[tokio::test]
async fn the_password_never_shows_in_debug_display_events_logs_or_errors() {
    record_panics();
    let logs = Logs::default();
    let subscriber = logs.subscriber(tracing::Level::TRACE);
    // The test runs on one thread (current-thread runtime), so the library's tasks log here too.
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut seen = Seen::default();

    let mut srv = server_with_password();
    let port = srv.port();
    seen.debug("fixture", &srv);

    // 1. In the URL.
    let url = url_with(CANARY, "", port);
    let by_url = connect_and_run(&mut seen, "url", Client::builder(url.clone())).await;

    // 2. Through .password(), overriding a URL without one.
    let b = Client::builder(srv.url()).password(CANARY);
    let by_setter = connect_and_run(&mut seen, "password", b).await;

    // 3. Through .password_file().
    let path = srv.dir().join("redis-password");
    std::fs::write(&path, format!("{CANARY}\n")).unwrap();
    let b = Client::builder(srv.url()).password_file(&path).unwrap();
    let by_file = connect_and_run(&mut seen, "password_file", b).await;

    // 4. An ACL user whose password is a canary too, and a wrong password for it.
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let user_pw = format!("{CANARY}-user");
    let _: redis::Value = redis::cmd("ACL")
        .arg(baton::acl::setuser_args("baton", &user_pw, "baton:"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let as_user = Client::builder(url_with(&user_pw, "baton", port));
    let _user = connect_and_run(&mut seen, "acl-user", as_user).await;
    for (what, b) in [
        (
            "wrong password in the URL",
            Client::builder(url_with(&format!("{CANARY}-wrong"), "", port)),
        ),
        (
            "wrong ACL password",
            Client::builder(url_with(&format!("{CANARY}-wrong"), "baton", port)),
        ),
        (
            "wrong .password()",
            Client::builder(srv.url()).password(format!("{CANARY}-wrong")),
        ),
        ("no password", Client::builder(srv.url())),
    ] {
        seen.debug(&format!("{what} builder"), &b);
        let err = b.connect().await.expect_err(what);
        assert_eq!(err.kind(), baton::ErrorKind::Permission, "{what}: {err:?}");
        seen.shown(what, &err);
    }

    // 5. Config errors on URLs with the canary in them.
    for url in [
        format!("redis://:{CANARY}@127.0.0.1:0/"),
        format!("redis://:{CANARY}@127.0.0.1:99999/"),
        format!("http://:{CANARY}@127.0.0.1:{port}/"),
        format!("redis://:{CANARY}@127.0.0.1:{port}/#insecure"),
        format!("unix:///tmp/none.sock?pass={CANARY}"),
        format!("redis://:{CANARY}/x@127.0.0.1:{port}/"),
    ] {
        let b = Client::builder(url.clone());
        seen.debug("invalid URL builder", &b);
        let err = b.connect().await.expect_err(&url);
        seen.shown("invalid URL", &err);
    }

    // 6. An unreachable server (a port nobody listens on), with the canary in the URL.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = Client::connect(url_with(CANARY, "", closed_port))
        .await
        .expect_err("nobody listens");
    assert!(
        matches!(
            err.kind(),
            baton::ErrorKind::Connection | baton::ErrorKind::Timeout
        ),
        "{err:?}"
    );
    seen.shown("unreachable", &err);

    // 7. Workers whose server dies under them: their error events.
    // A 1 s lease, so that `fail` on a dead server gives up soon.
    let short = baton::FailoverConfig::builder("redact-crash")
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut w = by_url.failover().start(short);
    let held = acquired(&mut w, WAKE).await;
    srv.kill();
    // `fail` keeps trying to record the outcome for a while; its error (if it comes within 2 s)
    // and the worker's error events are what is checked.
    if let Ok(res) =
        tokio::time::timeout(Duration::from_secs(2), held.fail("after the crash")).await
    {
        seen.debug("fail after the crash", &res);
        if let Err(err) = &res {
            seen.shown("fail after the crash", err);
        }
    }
    let evs = drain(&mut seen, "crash", &mut w, Duration::from_secs(2)).await;
    drop(w);
    let mut w2 = by_setter
        .failover()
        .start(job("redact-crash-2").build().unwrap());
    let evs2 = drain(&mut seen, "crash-2", &mut w2, Duration::from_secs(2)).await;
    drop(w2);
    let errors = evs
        .iter()
        .chain(&evs2)
        .filter(|e| matches!(e, Event::Error { .. }))
        .count();
    assert!(errors > 0, "expected error events: {evs:?} {evs2:?}");
    let status = by_file.failover().job_state("redact-crash").await;
    seen.debug("job_state while down", &status);

    for c in [&by_url, &by_setter, &by_file] {
        seen.debug("client after all", c);
        c.shutdown(Duration::from_secs(2)).await;
    }
    drop(_guard);

    let logged = logs.text();
    // The capture works: the volatile fixture triggers the durability warning at connect.
    assert!(
        logged.contains("redis may lose acknowledged writes"),
        "{logged}"
    );
    seen.add("tracing at TRACE", logged);
    let panics = recorded_panics().join("\n");
    assert!(panics.is_empty(), "panics: {panics}");
    seen.add("panics", panics);
    seen.assert_clean(CANARY);
    assert!(seen.0.len() > 50, "collected only {} texts", seen.0.len());
}

/// Under `tls`: a client key, a password, and a TLS failure; neither the key nor the password
/// shows anywhere.
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_key_material_and_password_never_show() {
    record_panics();
    let logs = Logs::default();
    let subscriber = logs.subscriber(tracing::Level::TRACE);
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut seen = Seen::default();

    let srv = RedisServer::builder()
        .tls()
        .requirepass(CANARY)
        .start()
        .unwrap_or_else(|e| panic!("cannot start a TLS redis-server: {e}"));
    let files = srv.tls().unwrap().clone();
    let key = std::fs::read_to_string(&files.client_key).unwrap();
    let key_body: String = key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .join("");
    let key_lines: Vec<String> = key
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_string)
        .collect();
    assert!(!key_lines.is_empty());
    let url = format!("rediss://:{CANARY}@127.0.0.1:{}/", srv.port());
    let ok = Client::builder(url.clone())
        .tls_root_ca_file(&files.ca_cert)
        .unwrap()
        .tls_client_cert_pem(std::fs::read(&files.client_cert).unwrap(), key.clone());
    let client = connect_and_run(&mut seen, "tls", ok).await;
    seen.debug("fixture", &srv);
    for (what, b) in [
        (
            "wrong CA",
            Client::builder(url.clone())
                .tls_root_ca_file(&files.untrusted_ca_cert)
                .unwrap()
                .tls_client_cert_pem(std::fs::read(&files.client_cert).unwrap(), key.clone()),
        ),
        (
            "wrong password",
            Client::builder(url.clone())
                .password(format!("{CANARY}-wrong"))
                .tls_root_ca_file(&files.ca_cert)
                .unwrap()
                .tls_client_cert_files(&files.client_cert, &files.client_key)
                .unwrap(),
        ),
        (
            "key that does not fit",
            Client::builder(url.clone())
                .tls_root_ca_file(&files.ca_cert)
                .unwrap()
                .tls_client_cert_pem(
                    std::fs::read(&files.client_cert).unwrap(),
                    std::fs::read(&files.server_key).unwrap(),
                ),
        ),
    ] {
        seen.debug(&format!("{what} builder"), &b);
        let err = b.connect().await.expect_err(what);
        seen.shown(what, &err);
    }
    client.shutdown(Duration::from_secs(2)).await;
    drop(_guard);
    seen.add("tracing at TRACE", logs.text());
    let panics = recorded_panics().join("\n");
    assert!(panics.is_empty(), "panics: {panics}");
    seen.assert_clean(CANARY);
    seen.assert_clean("PRIVATE KEY");
    seen.assert_clean(&key_body);
    for line in &key_lines {
        seen.assert_clean(line);
    }
}
