//! Shared helpers for the integration tests: a private redis-server per test, a client on it,
//! and event readers with generous deadlines (they prove wake-up paths, never speed).
#![allow(dead_code)]

pub mod process;
#[macro_use]
pub mod topology;

use std::time::Duration;

use baton::testing::{Persistence, RedisServer};
use baton::{Client, Event, FailoverConfig, FailoverConfigBuilder, Worker};
use redis::aio::MultiplexedConnection;
use tokio_stream::StreamExt;

/// The bound used to prove "woken, not waiting out the lease" with a 10 s lease.
pub const WAKE: Duration = Duration::from_secs(5);

/// The least-privilege user every test client connects as (security checklist d#1: the
/// integration suite passes with only `baton::acl::FAILOVER_COMMANDS` on `baton:` keys). The
/// default user stays the passwordless administrator that `raw()` uses to inspect and break things.
pub const TEST_USER: &str = "baton-test";
pub const TEST_PASSWORD: &str = "test-pw-4d1f";

/// A server builder with [`TEST_USER`] already added (for servers with extra settings), of the
/// variant the running scenario is on ([`topology`]; Redis outside a scenario).
pub fn builder() -> baton::testing::RedisServerBuilder {
    RedisServer::builder()
        .flavor(topology::current())
        .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
}

pub fn server() -> RedisServer {
    builder()
        .start()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", topology::current().name()))
}

pub fn durable_server() -> RedisServer {
    builder()
        .persistence(Persistence::Durable)
        .start()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", topology::current().name()))
}

/// A client logged in as [`TEST_USER`].
pub async fn client(server: &RedisServer) -> Client {
    Client::connect(server.url_for(TEST_USER, TEST_PASSWORD))
        .await
        .expect("connect")
}

pub async fn raw(server: &RedisServer) -> MultiplexedConnection {
    raw_at(&server.url()).await
}

/// A plain connection to `url` (the default user: an administrator).
pub async fn raw_at(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A job configuration with a 10 s lease (so any takeover under 5 s proves a wake-up).
pub fn job(key: &str) -> FailoverConfigBuilder {
    FailoverConfig::builder(key).lock_timeout(Duration::from_secs(10))
}

/// The next event that is not `Status`/`Lagged`, or a panic after `within`.
pub async fn next(w: &mut Worker, within: Duration) -> Event {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Status { .. } | Event::Lagged { .. })) => continue,
            Ok(Some(ev)) => return ev,
            Ok(None) => panic!("stream of {} ended without the expected event", w.key()),
            Err(_) => panic!("no event from {} within {within:?}", w.key()),
        }
    }
}

/// Reads events until the terminal one; returns them all (without `Status`).
pub async fn until_end(w: &mut Worker, within: Duration) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Status { .. })) => continue,
            Ok(Some(ev)) => {
                let end = ev.is_terminal();
                out.push(ev);
                if end {
                    // Exactly one terminal event: the stream must end right after it.
                    let rest = tokio::time::timeout(Duration::from_secs(5), w.next())
                        .await
                        .expect("stream closes after its terminal event");
                    assert!(rest.is_none(), "event after the terminal one: {rest:?}");
                    return out;
                }
            }
            Ok(None) => panic!(
                "stream of {} ended without a terminal event: {out:?}",
                w.key()
            ),
            Err(_) => panic!("{} did not end within {within:?}; so far {out:?}", w.key()),
        }
    }
}

pub fn name(ev: &Event) -> String {
    let json = serde_json::to_value(ev).unwrap()["event"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(json, ev.name(), "Event::name agrees with the JSON tag");
    json
}

pub async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

pub async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

pub fn state_key(job: &str) -> String {
    format!("baton:{{{job}}}")
}

pub fn lease_key(job: &str) -> String {
    format!("baton:{{{job}}}:lease")
}

pub fn fence_key(job: &str) -> String {
    format!("baton:{{{job}}}:fence")
}

/// Expects an `Acquired` event and returns it.
pub async fn acquired(w: &mut Worker, within: Duration) -> baton::Acquired {
    match next(w, within).await {
        Event::Acquired(a) => a,
        other => panic!("expected Acquired from {}, got {other:?}", w.key()),
    }
}

/// A command as its parts, for [`run_cmds`] and [`inject_before_exec`].
pub fn cmd(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Runs raw commands (a foreign client's writes) and returns their replies.
pub async fn run_cmds(conn: &mut MultiplexedConnection, cmds: &[Vec<String>]) -> Vec<redis::Value> {
    let mut out = Vec::new();
    for c in cmds {
        let v: redis::Value = redis::cmd(&c[0])
            .arg(&c[1..])
            .query_async(conn)
            .await
            .unwrap_or_else(|e| panic!("{c:?}: {e}"));
        out.push(v);
    }
    out
}

/// Installs a hook that runs `cmds` from a separate connection right before the first `EXEC` of
/// the transition named `what` (`"grant"`, `"finish"`, ...): exactly the window the `WATCH`
/// protects.
pub fn inject_before_exec(
    client: &Client,
    url: String,
    what: &'static str,
    cmds: Vec<Vec<String>>,
) {
    once_before_exec(client, what, move || {
        let (url, cmds) = (url.clone(), cmds.clone());
        async move {
            run_cmds(&mut raw_at(&url).await, &cmds).await;
        }
    });
}

static PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records every panic message of this test binary (the library's tasks included) from now on,
/// keeping the default hook's output; see [`recorded_panics`].
pub fn record_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(info.to_string());
            default(info);
        }));
    });
}

/// The panic messages recorded since [`record_panics`].
pub fn recorded_panics() -> Vec<String> {
    PANICS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// One numeric field of `INFO section`.
pub async fn info_field(conn: &mut MultiplexedConnection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}

/// Installs a before-EXEC hook that runs `f` the first time the transition `what` reaches its
/// `EXEC` (`"grant"`, `"finish"`, ...), and does nothing the other times.
pub fn once_before_exec<F, Fut>(client: &Client, what: &'static str, f: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = std::sync::Arc::new(f);
    baton::__seam::set_before_exec_hook(
        client,
        Some(std::sync::Arc::new(move |name| {
            let (fired, f) = (fired.clone(), f.clone());
            Box::pin(async move {
                if name != what || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                f().await;
            })
        })),
    );
}

/// A private directory under the system temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "baton-cli-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Single-quotes a path for `sh -c`.
pub fn shq(path: &std::path::Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// `INFO commandstats` call counts, by command name.
pub async fn command_calls(
    conn: &mut MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}
