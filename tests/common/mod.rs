//! Shared helpers for the integration tests: a private deployment per test (one redis-server,
//! or inside `scenario!` the running topology's: a Valkey server, a Redis Cluster or a Sentinel
//! set), a client on it, an administrator's connection that works on all of them, and event
//! readers with generous deadlines (they prove wake-up paths, never speed).
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
/// server binary the running scenario's topology uses ([`topology`]; Redis outside a scenario).
/// Always a single server: scenarios that need extra settings on every topology go through
/// [`server`] or [`durable_server`].
pub fn builder() -> baton::testing::RedisServerBuilder {
    RedisServer::builder()
        .flavor(topology::current().flavor())
        .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
}

/// A deployment of the running scenario's topology ([`topology::current`]), with [`TEST_USER`]
/// on every data node; volatile.
pub fn server() -> Deployment {
    server_on(topology::current())
}

/// Like [`server`], of `topology` (for threads, which do not see the scenario's topology).
pub fn server_on(topology: topology::Topology) -> Deployment {
    Deployment::start(topology, Persistence::Volatile)
}

/// Like [`server`], with every data node fsyncing each write to its append-only file.
pub fn durable_server() -> Deployment {
    Deployment::start(topology::current(), Persistence::Durable)
}

/// What a scenario runs against: one server, a Redis Cluster or a Sentinel set.
///
/// Derefs to the [`RedisServer`] for the single-server topologies only (kill, pause, restart,
/// pid...); on a cluster or Sentinel set that panics, naming the scenario's mistake: such a
/// scenario belongs under `scenario! { single: ... }`.
// A few per test, never moved in a hot path: boxing the common single server buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Deployment {
    Single(RedisServer),
    #[cfg(feature = "cluster")]
    Cluster(baton::testing::RedisCluster),
    #[cfg(feature = "sentinel")]
    Sentinel(baton::testing::RedisSentinel),
    #[cfg(feature = "postgres")]
    Postgres(PgDatabase),
}

/// `Client::migrate` on `url` (what `baton migrate` runs), on a runtime of its own in a thread
/// of its own: callers are inside a test's runtime, where blocking on another is not allowed.
#[cfg(feature = "postgres")]
pub fn migrate_as_owner(url: &str) {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let owner = Client::connect(url).await.expect("connect as the owner");
                    owner.migrate().await.expect("migrate as the owner");
                    owner.shutdown(Duration::from_secs(5)).await;
                })
        });
    });
}

/// A database of its own on the test binary's shared PostgreSQL server, set up as an operator
/// would: `baton migrate` (`Client::migrate`) run once by the owner, then workers connecting as
/// a role that may only read and write baton's tables (`PgServer::grant_worker_role`).
#[cfg(feature = "postgres")]
pub struct PgDatabase {
    /// The workers' URL: the DML-only role (`baton::testing::PG_WORKER_ROLE`).
    pub url: String,
    /// The owner's URL (the superuser), for what a worker may not do: DDL, breaking things.
    pub owner_url: String,
    /// The database's name.
    pub name: String,
}

#[cfg(feature = "postgres")]
impl PgDatabase {
    /// A fresh database (`CREATE DATABASE`, ~0.1 s) on the shared server (started on first use),
    /// migrated by its owner, with the DML-only worker role granted its tables.
    pub fn create() -> PgDatabase {
        let pg = baton::testing::PgServer::shared()
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
        let mut db = PgDatabase::create_empty();
        migrate_as_owner(&db.owner_url);
        db.url = pg
            .grant_worker_role(&db.name)
            .unwrap_or_else(|e| panic!("grant the worker role in {}: {e}", db.name));
        db
    }

    /// A fresh, empty database (no migration, no grants): `url` is the owner's too.
    pub fn create_empty() -> PgDatabase {
        let pg = baton::testing::PgServer::shared()
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
        let name = PgDatabase::next_name();
        pg.psql(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let owner_url = format!("postgres://postgres@127.0.0.1:{}/{name}", pg.port());
        PgDatabase {
            url: owner_url.clone(),
            owner_url,
            name,
        }
    }

    fn next_name() -> String {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        format!(
            "t{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
    }

    /// A driver connection to the database as its owner, for looking at what baton stored.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.owner_url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }
}

impl Deployment {
    fn start(topology: topology::Topology, persistence: Persistence) -> Deployment {
        let fail = |e: std::io::Error| -> ! { panic!("cannot start {}: {e}", topology.name()) };
        match topology {
            topology::Topology::Redis | topology::Topology::Valkey => Deployment::Single(
                RedisServer::builder()
                    .flavor(topology.flavor())
                    .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
                    .persistence(persistence)
                    .start()
                    .unwrap_or_else(|e| fail(e)),
            ),
            #[cfg(feature = "cluster")]
            topology::Topology::Cluster => {
                let mut b = baton::testing::RedisCluster::builder()
                    .flavor(topology.flavor())
                    .acl_user(TEST_USER, TEST_PASSWORD, "baton:");
                if persistence == Persistence::Durable {
                    b = b.arg("appendonly", "yes").arg("appendfsync", "always");
                }
                Deployment::Cluster(b.start().unwrap_or_else(|e| fail(e)))
            }
            #[cfg(feature = "sentinel")]
            topology::Topology::Sentinel => {
                let set = baton::testing::RedisSentinel::builder()
                    .flavor(topology.flavor())
                    .acl_user(TEST_USER, TEST_PASSWORD, "baton:")
                    .start()
                    .unwrap_or_else(|e| fail(e));
                if persistence == Persistence::Durable {
                    // The fixture has no persistence setting: switch every data node over (any
                    // may be promoted), as the default user, which is an administrator.
                    for node in set.nodes() {
                        let mut conn = redis::Client::open(node.url())
                            .and_then(|c| c.get_connection())
                            .unwrap_or_else(|e| panic!("data node {}: {e}", node.port()));
                        let _: () = redis::cmd("CONFIG")
                            .arg("SET")
                            .arg("appendonly")
                            .arg("yes")
                            .arg("appendfsync")
                            .arg("always")
                            .query(&mut conn)
                            .unwrap_or_else(|e| panic!("data node {}: {e}", node.port()));
                    }
                }
                Deployment::Sentinel(set)
            }
            #[cfg(feature = "postgres")]
            topology::Topology::Postgres => Deployment::Postgres(PgDatabase::create()),
            #[allow(unreachable_patterns)]
            other => panic!("{} needs baton's feature of that name", other.name()),
        }
    }

    /// The URL of the deployment for the default user (an administrator, no password); on
    /// PostgreSQL the DML-only worker role's (see [`PgDatabase`]).
    pub fn url(&self) -> String {
        match self {
            Deployment::Single(s) => s.url(),
            #[cfg(feature = "cluster")]
            Deployment::Cluster(c) => c.cluster_url(),
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel(s) => s.url(),
            // The DML-only worker role: the PostgreSQL arm's clients never own the tables
            // (what a scenario inspects goes through `stored`/`holder`, as the owner).
            #[cfg(feature = "postgres")]
            Deployment::Postgres(d) => d.url.clone(),
        }
    }

    /// The URL of the deployment logging in as `user` (on the data nodes; Sentinels have no
    /// password).
    pub fn url_for(&self, user: &str, password: &str) -> String {
        match self {
            Deployment::Single(s) => s.url_for(user, password),
            #[cfg(feature = "cluster")]
            Deployment::Cluster(c) => c.cluster_url_for(user, password),
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel(s) => format!(
                "redis+sentinel://{user}:{password}@{}/{}",
                s.sentinel_addrs().join(","),
                s.service()
            ),
            // Every scenario's client is the DML-only worker role, whatever the name asked:
            // the PostgreSQL arm runs as a role that may not create tables.
            #[cfg(feature = "postgres")]
            Deployment::Postgres(d) => {
                let _ = (user, password);
                d.url.clone()
            }
        }
    }

    /// The single server, or a panic saying the scenario needs `scenario! { single: ... }`.
    pub fn single(&self) -> &RedisServer {
        match self {
            Deployment::Single(s) => s,
            #[allow(unreachable_patterns)]
            _ => self.not_single(),
        }
    }

    /// See [`single`](Self::single).
    pub fn single_mut(&mut self) -> &mut RedisServer {
        match self {
            Deployment::Single(s) => s,
            #[allow(unreachable_patterns)]
            _ => self.not_single(),
        }
    }

    /// See [`single`](Self::single).
    pub fn into_single(self) -> RedisServer {
        match self {
            Deployment::Single(s) => s,
            #[allow(unreachable_patterns)]
            _ => self.not_single(),
        }
    }

    fn not_single(&self) -> ! {
        panic!(
            "a single-server operation (kill, pause, restart, pid, port...) on {}: mark the \
             scenario `scenario! {{ single: ... }}`",
            topology::current().name()
        )
    }
}

impl std::ops::Deref for Deployment {
    type Target = RedisServer;
    fn deref(&self) -> &RedisServer {
        self.single()
    }
}

impl std::ops::DerefMut for Deployment {
    fn deref_mut(&mut self) -> &mut RedisServer {
        self.single_mut()
    }
}

/// Anything a client connects to: a [`Deployment`] or a plain [`RedisServer`].
pub trait Endpoint {
    /// As the default user (an administrator).
    fn admin_url(&self) -> String;
    /// As `user`.
    fn user_url(&self, user: &str, password: &str) -> String;
}

impl Endpoint for Deployment {
    fn admin_url(&self) -> String {
        self.url()
    }
    fn user_url(&self, user: &str, password: &str) -> String {
        self.url_for(user, password)
    }
}

impl Endpoint for RedisServer {
    fn admin_url(&self) -> String {
        self.url()
    }
    fn user_url(&self, user: &str, password: &str) -> String {
        self.url_for(user, password)
    }
}

impl<T: Endpoint + ?Sized> Endpoint for std::sync::Arc<T> {
    fn admin_url(&self) -> String {
        (**self).admin_url()
    }
    fn user_url(&self, user: &str, password: &str) -> String {
        (**self).user_url(user, password)
    }
}

/// A client logged in as [`TEST_USER`], on any topology.
pub async fn client<E: Endpoint + ?Sized>(server: &E) -> Client {
    Client::connect(server.user_url(TEST_USER, TEST_PASSWORD))
        .await
        .expect("connect")
}

/// What baton stored for failover job `job` (default prefix), read the same way on every
/// backend: on Redis its keys (`GET`, `PTTL`), on PostgreSQL its row of `baton_jobs` (values
/// and remaining times as the keys would show them; an expired row reads as absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub state: Option<String>,
    /// Remaining retention in ms; -2 when absent (as `PTTL`).
    pub state_ttl_ms: i64,
    /// `"<token> <holder>"`.
    pub lease: Option<String>,
    /// Remaining lease in ms; -2 when absent.
    pub lease_ttl_ms: i64,
    pub fence: Option<String>,
    pub failure: Option<String>,
}

pub async fn stored(srv: &Deployment, job: &str) -> Stored {
    #[cfg(feature = "postgres")]
    if let Deployment::Postgres(db) = srv {
        let client = db.connect().await;
        let rows = client
            .query(
                "SELECT CASE WHEN expires_at > now() THEN state END,
                        CASE WHEN expires_at > now()
                             THEN ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint
                             ELSE -2 END,
                        CASE WHEN lease_expires > now() THEN lease_token || ' ' || lease_holder END,
                        CASE WHEN lease_expires > now()
                             THEN ceil(extract(epoch FROM lease_expires - now()) * 1000)::bigint
                             ELSE -2 END,
                        CASE WHEN expires_at > now() THEN fence::text END,
                        CASE WHEN expires_at > now() THEN failure END
                 FROM baton_jobs WHERE key = $1",
                &[&state_key(job)],
            )
            .await
            .unwrap_or_default();
        return match rows.first() {
            None => Stored {
                state: None,
                state_ttl_ms: -2,
                lease: None,
                lease_ttl_ms: -2,
                fence: None,
                failure: None,
            },
            Some(r) => Stored {
                state: r.get(0),
                state_ttl_ms: r.get(1),
                lease: r.get(2),
                lease_ttl_ms: r.get(3),
                fence: r.get(4),
                failure: r.get(5),
            },
        };
    }
    let mut conn = raw(srv).await;
    Stored {
        state: get(&mut conn, &state_key(job)).await,
        state_ttl_ms: pttl(&mut conn, &state_key(job)).await,
        lease: get(&mut conn, &lease_key(job)).await,
        lease_ttl_ms: pttl(&mut conn, &lease_key(job)).await,
        fence: get(&mut conn, &fence_key(job)).await,
        failure: get(&mut conn, &format!("baton:{{{job}}}:failure")).await,
    }
}

/// The holder's value of a lock-shaped key (`baton:lock:{K}`, `baton:leader:{K}`) as stored,
/// read the same way on every backend: `GET` on Redis, the live token of its `baton_locks` row
/// on PostgreSQL (`None` when free or expired).
pub async fn holder(srv: &Deployment, key: &str) -> Option<String> {
    #[cfg(feature = "postgres")]
    if let Deployment::Postgres(db) = srv {
        return db
            .connect()
            .await
            .query_opt(
                "SELECT token FROM baton_locks
                 WHERE key = $1 AND token IS NOT NULL AND expires_at > clock_timestamp()",
                &[&key],
            )
            .await
            .expect("read the lock row")
            .map(|r| r.get(0));
    }
    get(&mut raw(srv).await, key).await
}

/// An administrator's connection to the deployment (see [`raw_at`]).
pub async fn raw<E: Endpoint + ?Sized>(server: &E) -> Raw {
    raw_at(&server.admin_url()).await
}

/// An administrator's connection (the default user) for a URL of any topology: `redis://` a
/// server, `redis+cluster://` a cluster (a cluster connection routing by key), or
/// `redis+sentinel://` the primary the Sentinels name right now.
pub async fn raw_at(url: &str) -> Raw {
    #[cfg(feature = "cluster")]
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let seeds: Vec<String> = rest
            .trim_end_matches('/')
            .split(',')
            .map(|h| format!("redis://{h}/"))
            .collect();
        let conn = redis::cluster::ClusterClient::new(seeds.clone())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        return Raw::Cluster { conn, seeds };
    }
    #[cfg(feature = "sentinel")]
    if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        let (hosts, service) = rest
            .split_once('/')
            .expect("redis+sentinel://HOSTS/SERVICE");
        let mut last = None;
        for host in hosts.split(',') {
            let asked = async {
                let mut s = single_at(&format!("redis://{host}/")).await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(service)
                    .query_async::<Option<(String, u16)>>(&mut s)
                    .await
            };
            match asked.await {
                Ok(Some((h, p))) => {
                    return Raw::Single(single_at(&format!("redis://{h}:{p}/")).await.unwrap())
                }
                other => last = Some(format!("{other:?}")),
            }
        }
        panic!("no Sentinel of {url} named a primary: {last:?}");
    }
    Raw::Single(single_at(url).await.unwrap())
}

async fn single_at(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// An administrator's connection on any topology; single-key commands route by key on a
/// cluster (a job's or a lock's keys share a hash tag).
#[derive(Clone)]
pub enum Raw {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        /// Every node, for per-node commands (`INFO`).
        seeds: Vec<String>,
    },
}

impl Raw {
    /// One connection per server that takes writes: the server itself, or every cluster primary.
    pub async fn primaries(&self) -> Vec<MultiplexedConnection> {
        match self {
            Raw::Single(c) => vec![c.clone()],
            #[cfg(feature = "cluster")]
            Raw::Cluster { seeds, .. } => {
                let mut out = Vec::new();
                for seed in seeds {
                    let Ok(mut c) = single_at(seed).await else {
                        continue;
                    };
                    let role: redis::RedisResult<redis::Value> =
                        redis::cmd("ROLE").query_async(&mut c).await;
                    let primary = match role {
                        Ok(redis::Value::Array(parts)) => matches!(
                            parts.first(),
                            Some(redis::Value::BulkString(b)) if b == b"master"
                        ),
                        _ => false,
                    };
                    if primary {
                        out.push(c);
                    }
                }
                out
            }
        }
    }
}

impl redis::aio::ConnectionLike for Raw {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Raw::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Raw::Cluster { conn, .. } => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Raw::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Raw::Cluster { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Raw::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Raw::Cluster { conn, .. } => conn.get_db(),
        }
    }
}

/// A job configuration with a 10 s lease (so any takeover under 5 s proves a wake-up).
pub fn job(key: &str) -> FailoverConfigBuilder {
    FailoverConfig::builder(key).lease(Duration::from_secs(10))
}

/// The next event that is not `Status`/`Lagged`/`Reachable`, or a panic after `within`.
pub async fn next(w: &mut Worker, within: Duration) -> Event {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Status { .. } | Event::Lagged { .. } | Event::Reachable { .. })) => {
                continue
            }
            Ok(Some(ev)) => return ev,
            Ok(None) => panic!("stream of {} ended without the expected event", w.key()),
            Err(_) => panic!("no event from {} within {within:?}", w.key()),
        }
    }
}

/// Reads events until the terminal one; returns them all (without `Status` and `Reachable`).
pub async fn until_end(w: &mut Worker, within: Duration) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Event::Status { .. } | Event::Reachable { .. })) => continue,
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

pub async fn get<C: redis::aio::ConnectionLike + Send>(conn: &mut C, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

pub async fn pttl<C: redis::aio::ConnectionLike + Send>(conn: &mut C, key: &str) -> i64 {
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
pub async fn run_cmds<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    cmds: &[Vec<String>],
) -> Vec<redis::Value> {
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

/// One numeric field of `INFO section`, of one server (on a cluster, take a node's connection
/// from [`Raw::primaries`]: INFO has no key to route by).
pub async fn info_field<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    section: &str,
    field: &str,
) -> u64 {
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

/// `INFO commandstats` call counts, by command name, summed over every server that takes writes
/// (the server, or every cluster primary).
pub async fn command_calls(conn: &mut Raw) -> std::collections::HashMap<String, u64> {
    let mut total = std::collections::HashMap::new();
    for mut node in conn.primaries().await {
        for (name, calls) in node_command_calls(&mut node).await {
            *total.entry(name).or_default() += calls;
        }
    }
    total
}

async fn node_command_calls(
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

#[cfg(feature = "postgres")]
/// Waits until backend `pid` waits for a lock held by another session (`pg_stat_activity`), or
/// until `finished` says its statement ended without waiting; panics at the deadline.
pub async fn wait_until_blocked(
    observer: &tokio_postgres::Client,
    pid: i32,
    finished: impl Fn() -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = observer
            .query_one(
                "SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity \
                 WHERE pid = $1), false)",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            return true;
        }
        if finished() {
            return false;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session {pid} never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `cleanup` on session `b` while session `a` holds an open transaction that granted the
/// row the cleanup's snapshot sees as deletable: waits until `b` waits for `a`'s row lock,
/// commits `a`, and returns how many rows the cleanup then deleted.
#[cfg(feature = "postgres")]
pub async fn cleanup_racing_open_grant(
    observer: &tokio_postgres::Client,
    a: &tokio_postgres::Client,
    b: tokio_postgres::Client,
    cleanup: &'static str,
) -> u64 {
    let b_pid: i32 = b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let run = tokio::spawn(async move { b.execute(cleanup, &[]).await });
    let blocked = wait_until_blocked(observer, b_pid, || run.is_finished()).await;
    assert!(blocked, "the cleanup should wait for A's row lock");
    a.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the cleanup finishes once A committed")
        .unwrap()
        .expect("the cleanup")
}

/// What `tracing` logged through [`Logs::subscriber`], kept in memory for a test to read.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Forgets what was logged.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// A subscriber that writes events up to `level` here, as plain text.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }
}
