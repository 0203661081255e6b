//! Tests of the PostgreSQL backend's pooled connections (`crate::backend::postgres::pool`)
//! against a real [`PgServer`]: a connection goes back to the pool only when its last
//! statement completed.
//!
//! They live here, in the testing layer, for the reason `sentinel_resolve_tests.rs` gives: the
//! pool is crate-private, and the layering check lets `testing` import the backend, not the
//! other way round.

use std::time::Duration;

use tokio::time::Instant;

use super::internals::{ConnSettings, PgTransport, TlsSettings};
use super::PgServer;

/// Long enough that no test below ends by a timeout of the client or the server: a statement
/// still running after the test moved on is one the client abandoned, never one it gave up on.
const RESPONSE: Duration = Duration::from_secs(5);

/// The shared server, started off the runtime's worker threads (the fixture blocks while it
/// boots).
async fn server() -> &'static PgServer {
    tokio::task::spawn_blocking(PgServer::shared)
        .await
        .expect("the start task")
        .unwrap_or_else(|e| {
            panic!("start PostgreSQL (install it: apt-get install postgresql): {e}")
        })
}

/// A transport on `server` whose pool holds one connection, so the next borrower gets the
/// previous one's connection unless it was closed.
fn transport(server: &PgServer) -> PgTransport {
    let settings = ConnSettings {
        connect_timeout: Duration::from_secs(5),
        response_timeout: RESPONSE,
        max_backoff: Duration::from_secs(1),
        pool_size: 1,
    };
    PgTransport::new(&server.url(), None, settings, &TlsSettings::default())
        .expect("a transport for the fixture's URL")
}

/// The backend PID of a pooled connection's session.
async fn backend_pid(t: &PgTransport) -> Result<i32, crate::Error> {
    let conn = t.pooled().await?;
    let row = conn
        .by(
            Instant::now() + RESPONSE,
            "reading the backend's PID",
            conn.query_one("SELECT pg_backend_pid()", &[]),
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_statement_completed_goes_back_to_the_pool() {
    let t = transport(server().await);
    let first = backend_pid(&t).await.expect("the first statement");
    let second = backend_pid(&t).await.expect("the second statement");
    assert_eq!(first, second, "a clean connection is reused, not reopened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_statement_was_dropped_mid_flight_is_not_reused() {
    let pg = server().await;
    let t = transport(pg);
    let (admin, driver) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .expect("connect the test's own session");
    tokio::spawn(driver);

    let old_pid = backend_pid(&t).await.expect("the first statement");
    let conn = t.pooled().await.expect("the same connection back");
    {
        // Longer than the server's statement_timeout (the response timeout): on a reused
        // connection the next statement would wait for that timeout, then run on this backend.
        let sleeping = conn.by(
            Instant::now() + RESPONSE * 4,
            "sleeping",
            conn.query_one("SELECT pg_sleep(60)", &[]),
        );
        tokio::pin!(sleeping);
        // Polled until the server runs it (bounded), then dropped, as a caller's `select!` or
        // `timeout` drops it.
        let mut running = false;
        for _ in 0..100 {
            tokio::select! {
                done = &mut sleeping => panic!("pg_sleep(60) ended early: {done:?}"),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            let active: bool = admin
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                     WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%')",
                    &[&old_pid],
                )
                .await
                .expect("read pg_stat_activity")
                .get(0);
            if active {
                running = true;
                break;
            }
        }
        assert!(running, "the server never ran the statement");
    }
    drop(conn);

    match backend_pid(&t).await {
        Ok(new_pid) => assert_ne!(
            new_pid, old_pid,
            "the next borrower got the connection whose statement was dropped mid-flight \
             (it ran behind pg_sleep on backend {old_pid})"
        ),
        Err(e) => panic!(
            "the next borrower queued behind the statement dropped mid-flight on backend \
             {old_pid}: {e}"
        ),
    }
}
