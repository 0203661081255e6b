//! The PostgreSQL transport (feature `postgres`): everything baton knows about talking to
//! PostgreSQL, and nothing about any primitive, as [`super::redis`] is for Redis.
//!
//! Two kinds of connection, for the same reasons as on Redis:
//!
//! - a **pool** ([`deadpool_postgres`], recycled with a cheap check) for short statements and
//!   transactions: a transition of a primitive takes a connection, runs its statements and
//!   gives it back;
//! - **dedicated** connections ([`PgTransport::dedicated`]) that nobody else ever uses: a
//!   session-scoped advisory lock lives on one for its guard's whole life (a session lock taken
//!   on one pooled connection and released on another is impossible by construction), and
//!   `LISTEN` needs one that stays open. A dedicated connection says when it dies
//!   ([`Dedicated::closed`]) and hands over its notifications.
//!
//! Every error of the driver becomes a typed [`Error`] in [`classify`], by SQLSTATE.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{ConfigError, Error, ErrorKind};
use crate::util::pubsub::{HubCmd, HubMsg, Subscription};
use crate::util::redact::redact_url;
use crate::util::settings::ConnSettings;

/// A connection borrowed from the pool; derefs to a [`tokio_postgres::Client`]. Dropping it
/// gives it back, unless it was [retired](Pooled::retire).
pub(crate) struct Pooled {
    /// `Some` until `drop` (the only place that takes it).
    conn: Option<deadpool_postgres::Object>,
    retired: std::sync::atomic::AtomicBool,
}

impl Pooled {
    fn new(conn: deadpool_postgres::Object) -> Self {
        Pooled {
            conn: Some(conn),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Closes the connection when it is dropped instead of giving it back to the pool: a
    /// statement may still be running on it (its reply was not awaited), and the next borrower
    /// would queue behind it, or inherit its effects seconds later. Closing the socket is the
    /// only safe way out: a cancel request names a backend, not a statement, and once the
    /// connection were reused it could cancel the next borrower's statement instead.
    /// The server ends the statement itself by `statement_timeout` (see [`PgTransport::new`]).
    pub(crate) fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `fut`, a statement on this connection, bounded by `limit`, its driver errors classified.
    /// A timeout or a lost connection retires the connection (see [`Pooled::retire`]).
    pub(crate) async fn by<T>(
        &self,
        limit: tokio::time::Instant,
        during: &'static str,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Error> {
        let outcome = match tokio::time::timeout_at(limit, fut).await {
            Ok(result) => result.map_err(|e| classify(e, during)),
            Err(_) => Err(Error::Timeout { during }),
        };
        if matches!(&outcome, Err(e) if e.is_indeterminate()) {
            self.retire();
        }
        outcome
    }
}

impl std::ops::Deref for Pooled {
    type Target = deadpool_postgres::Object;

    fn deref(&self) -> &Self::Target {
        // Invariant: `conn` is `Some` until `drop`, and nothing can borrow `self` after that.
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // Invariant: as in `deref`.
        self.conn
            .as_mut()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.retired.load(std::sync::atomic::Ordering::Relaxed) {
            // Detached from the pool and dropped: deadpool aborts its driver task, so the
            // socket closes now, even with a reply still due.
            drop(deadpool_postgres::Object::take(conn));
        }
    }
}

/// A `LISTEN` notification: its channel and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub channel: String,
    pub payload: String,
}

/// The connections of one PostgreSQL client; shared through an `Arc` by every primitive handle
/// and worker task, like [`super::redis::Transport`].
pub(crate) struct PgTransport {
    config: tokio_postgres::Config,
    /// The TLS connector of every connection (used only with `sslmode=require`).
    pub tls: Tls,
    pool: Pool,
    /// The URL for messages (credentials and query redacted).
    pub endpoint: String,
    pub settings: ConnSettings,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    /// The `LISTEN` hub's requests, once a first subscription started it.
    hub: std::sync::OnceLock<mpsc::UnboundedSender<HubCmd>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Wake-one groups by topic ([`crate::util::wake`]), as the Redis hub has.
    groups: crate::util::wake::Groups,
    /// The schemas [`ensure_schema`](PgTransport::ensure_schema) has made sure of.
    schemas: Mutex<std::collections::HashSet<&'static str>>,
    #[cfg(feature = "testing")]
    pub before_exec: Mutex<Option<crate::util::settings::ExecHook>>,
    /// How many notifications the hub's connection received, on any channel (for tests that
    /// count what a client hears).
    #[cfg(feature = "testing")]
    pub notices_received: Arc<std::sync::atomic::AtomicU64>,
    /// Overrides of the lock rows' fence retention and of the cleanups' interval, from
    /// [`TEST_FENCE_RETENTION_ENV`] and [`TEST_CLEANUP_EVERY_ENV`] (feature `testing` only).
    #[cfg(feature = "testing")]
    test_maintenance: (Option<Duration>, Option<Duration>),
}

/// With feature `testing`, the fence retention of lock rows in ms, instead of max(24 h,
/// 2 × ttl): lets a test or the chaos run make free lock rows old enough to be cleaned up.
#[cfg(feature = "testing")]
pub const TEST_FENCE_RETENTION_ENV: &str = "BATON_TEST_PG_FENCE_RETENTION_MS";

/// With feature `testing`, how often (ms) a client runs the tables' cleanups, instead of every
/// minute: lets the cleanup race live grants.
#[cfg(feature = "testing")]
pub const TEST_CLEANUP_EVERY_ENV: &str = "BATON_TEST_PG_CLEANUP_EVERY_MS";

/// The duration in ms in environment variable `name`, if set and valid.
#[cfg(feature = "testing")]
fn env_ms(name: &str) -> Option<Duration> {
    let ms: u64 = std::env::var(name).ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms.max(1)))
}

/// How every connection of a client makes TLS: rustls through tokio-postgres-rustls. With
/// `sslmode=disable` (what `prefer` becomes, see [`parse_url`]) it is never used.
pub(crate) type Tls = tokio_postgres_rustls::MakeRustlsConnect;

/// How many notification channels baton's messages are spread over (see [`channel_of`]).
pub(crate) const NOTIFY_SHARDS: u64 = 64;

/// The notification channel of `topic` (a primitive's own name for what it announces, e.g. a
/// job's key): every message is `pg_notify(channel_of(topic), topic || E'\n' || message)`,
/// and the hub hands it to the subscribers of `topic`. A message never contains a newline; a
/// topic may (it is split off at the last one).
///
/// Topics are hashed onto [`NOTIFY_SHARDS`] channels `baton_0` … `baton_63`, and a client
/// `LISTEN`s only on the shards its subscribers use, so it receives a bounded share of
/// everyone else's messages instead of all of them. Not one channel per topic: every
/// `NOTIFY` makes each listening backend scan its list of channels, which would then hold
/// thousands of entries. The channel is computed here and passed to the statements as a
/// parameter (Rust cannot compute PostgreSQL's `hashtext`), with FNV-1a: fixed by its
/// definition, so clients of any version and build agree (std's hasher promises no such thing).
pub(crate) fn channel_of(topic: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in topic.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("baton_{}", hash % NOTIFY_SHARDS)
}

impl Drop for PgTransport {
    fn drop(&mut self) {
        // The last handle is gone: stop any worker still running.
        self.cancel.cancel();
    }
}

impl std::fmt::Debug for PgTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransport")
            .field("endpoint", &self.endpoint)
            .field("pool_size", &self.settings.pool_size)
            .finish_non_exhaustive()
    }
}

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`).
pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with libpq's `sslmode=verify-ca` and `verify-full` (which the driver does not parse)
/// as `require`, which baton verifies fully anyway (see [`parse_url`]).
fn libpq_sslmodes(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((base, query)) = url.split_once('?') else {
        return url.into();
    };
    let params: Vec<&str> = query
        .split('&')
        .map(|p| match p {
            "sslmode=verify-ca" | "sslmode=verify-full" => "sslmode=require",
            other => other,
        })
        .collect();
    format!("{base}?{}", params.join("&")).into()
}

/// The checks made before any network I/O, and the driver's configuration of `url`.
///
/// TLS is all or nothing: `sslmode=require` connects with TLS only, and verifies the server's
/// certificate and name (what libpq calls `verify-full`: a `require` that accepted any
/// certificate would not stop a man in the middle; libpq's `verify-ca` and `verify-full` are
/// taken as `require`). `sslmode=prefer` (the driver's default)
/// and `disable` connect without TLS: there is no opportunistic TLS, which would fail against
/// the self-signed certificate many servers ship with, or protect nothing when unverified.
pub(crate) fn parse_url(
    url: &str,
    settings: &ConnSettings,
) -> Result<tokio_postgres::Config, ConfigError> {
    let bad = |why: String| ConfigError::invalid("url", format!("{}: {why}", redact_url(url)));
    if !is_postgres_url(url) {
        return Err(bad("the scheme must be postgres:// or postgresql://".into()));
    }
    if url.contains('#') {
        return Err(bad("a URL fragment is not allowed".into()));
    }
    let mut config: tokio_postgres::Config = libpq_sslmodes(url)
        .parse()
        .map_err(|e: tokio_postgres::Error| bad(format!("rejected ({e})")))?;
    if config.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    if config.get_hosts().is_empty() {
        return Err(bad("no host".into()));
    }
    if config.get_ports().contains(&0) {
        return Err(bad("port 0 is not a port to connect to".into()));
    }
    config
        .connect_timeout(settings.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
    if config.get_application_name().is_none() {
        config.application_name("baton");
    }
    Ok(config)
}

impl PgTransport {
    /// A transport for `url`; no connection is made yet (the pool connects on first use).
    pub(crate) fn new(
        url: &str,
        password: Option<&str>,
        settings: ConnSettings,
        tls: &crate::util::tls::TlsSettings,
    ) -> Result<PgTransport, Error> {
        let mut config = parse_url(url, &settings)?;
        if let Some(password) = password {
            config.password(password);
        }
        let tls = if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            Tls::new(tls.rustls_config()?)
        } else if tls.is_set() {
            return Err(Error::Config(ConfigError::invalid(
                "url",
                format!(
                    "{}: TLS options were given, but the URL does not ask for TLS (add \
                     sslmode=require)",
                    redact_url(url)
                ),
            )));
        } else {
            // Never used (no TLS is made with sslmode=disable): no CA store to load.
            crate::util::tls::install_crypto_provider();
            Tls::new(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        };
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                // `Fast` trusts a connection the driver has not seen closed; a dead one fails
                // its next statement with a connection error, which every caller retries.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Every pooled connection bounds its statements on the server too, at the client's
        // response timeout: a statement the client gave up on ends by itself (a grant or an
        // extension cannot apply seconds later), and its connection is retired meanwhile
        // (`Pooled::retire`). A plain `SET`, not a startup option, so that `SET LOCAL
        // statement_timeout TO DEFAULT` gives a transaction the role's own setting back (the
        // advisory `xact` runs the caller's statements).
        let statement_timeout = format!(
            "SET statement_timeout = '{}ms'",
            settings.response_timeout.as_millis().max(1)
        );
        let pool = Pool::builder(manager)
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let set = statement_timeout.clone();
                Box::pin(async move {
                    client
                        .batch_execute(&set)
                        .await
                        .map_err(deadpool_postgres::HookError::Backend)
                })
            }))
            .max_size(settings.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.connect_timeout + settings.response_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .recycle_timeout(Some(settings.response_timeout))
            .build()
            .map_err(|e| {
                Error::Config(ConfigError::invalid(
                    "url",
                    format!("cannot build the connection pool: {e}"),
                ))
            })?;
        Ok(PgTransport {
            config,
            tls,
            pool,
            endpoint: redact_url(url),
            settings,
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            hub: std::sync::OnceLock::new(),
            next_id: std::sync::atomic::AtomicU64::new(1),
            groups: Default::default(),
            schemas: Mutex::new(std::collections::HashSet::new()),
            #[cfg(feature = "testing")]
            before_exec: Mutex::new(None),
            #[cfg(feature = "testing")]
            notices_received: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            #[cfg(feature = "testing")]
            test_maintenance: (
                env_ms(TEST_FENCE_RETENTION_ENV),
                env_ms(TEST_CLEANUP_EVERY_ENV),
            ),
        })
    }

    /// The fence retention of a lock row: `wanted`, unless a test overrides it (see
    /// [`TEST_FENCE_RETENTION_ENV`]).
    pub(crate) fn fence_retention(&self, wanted: Duration) -> Duration {
        #[cfg(feature = "testing")]
        if let Some(r) = self.test_maintenance.0 {
            return r;
        }
        wanted
    }

    /// How often the cleanups run: `wanted`, unless a test overrides it (see
    /// [`TEST_CLEANUP_EVERY_ENV`]).
    pub(crate) fn cleanup_every(&self, wanted: Duration) -> Duration {
        #[cfg(feature = "testing")]
        if let Some(every) = self.test_maintenance.1 {
            return every;
        }
        wanted
    }

    /// Subscribes to `topic` (on its channel, [`channel_of`]) and returns once the hub's
    /// connection is listening: a message committed after this returns is delivered. When the hub's
    /// connection is re-established, every subscriber gets [`HubMsg::Reconnected`] (messages
    /// may have been missed meanwhile: look again).
    ///
    /// # Errors
    /// A connection error while PostgreSQL cannot be reached (the caller retries);
    /// [`Error::Stopped`] once the client shut down.
    pub(crate) async fn subscribe(&self, topic: &str) -> Result<Subscription, Error> {
        let cmds = self.hub.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            self.tracker.spawn(listen_task(
                self.config.clone(),
                self.tls.clone(),
                self.settings.clone(),
                rx,
                self.cancel.clone(),
                #[cfg(feature = "testing")]
                self.notices_received.clone(),
            ));
            tx
        });
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = crate::util::mailbox::unbounded();
        let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
        let sub = Subscription::new(rx, topic.to_string(), id, cmds.clone());
        cmds.send(HubCmd::Subscribe {
            channel: topic.to_string(),
            id,
            tx,
            ack: ack_tx,
        })
        .map_err(|_| Error::Stopped)?;
        match ack_rx.await {
            Ok(Ok(())) => Ok(sub),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Stopped),
        }
    }

    /// Joins the wake-one group of `topic` on this client (see [`crate::util::wake`]): local waiters
    /// share one subscription, and each notification wakes one of them.
    ///
    /// # Errors
    /// As [`PgTransport::subscribe`].
    pub(crate) async fn wake_one(&self, topic: &str) -> Result<crate::util::wake::WakeOne, Error> {
        crate::util::wake::join(&self.groups, &self.tracker, &self.cancel, topic, || {
            self.subscribe(topic)
        })
        .await
    }

    /// Makes sure the schema `sql` (fixed text, no parameters: `CREATE … IF NOT EXISTS`
    /// statements) is there before a primitive's first operation, once per client for each
    /// `name`: one catalog read finds the tables and sequences it creates, and only when one is
    /// missing is the DDL run (see [`create_schema`](Self::create_schema)). So a role that may
    /// only read and write the tables never runs DDL, and neither does the owner once they
    /// exist (a `CREATE INDEX IF NOT EXISTS` takes a `SHARE` lock on its table even when the
    /// index exists, which would queue every writer behind a long transaction). A missing
    /// table the role may not create is [`ErrorKind::Misconfigured`], naming `baton migrate`.
    ///
    /// `maintenance`, when given, is a statement run every interval from then on while the
    /// client lives (deleting expired rows), its errors logged at debug level.
    pub(crate) async fn ensure_schema(
        &self,
        name: &'static str,
        sql: &str,
        maintenance: Option<(&'static str, Duration)>,
    ) -> Result<(), Error> {
        if crate::util::lock(&self.schemas).contains(name) {
            return Ok(());
        }
        // The indexes are left to `migrate`: operations are correct without them.
        let needed: Vec<&str> = created_relations(sql)
            .into_iter()
            .filter(|(kind, _)| *kind != "INDEX")
            .map(|(_, name)| name)
            .collect();
        if !self.relations_exist(&needed).await? {
            self.create_schema(sql)
                .await
                .map_err(|e| not_creatable(e, &needed))?;
        }
        let first = crate::util::lock(&self.schemas).insert(name);
        if let (true, Some((statement, every))) = (first, maintenance) {
            let (pool, cancel) = (self.pool.clone(), self.cancel.clone());
            self.tracker.spawn(async move {
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let outcome = match pool.get().await {
                        Ok(conn) => conn
                            .batch_execute(statement)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = outcome {
                        tracing::debug!(error = %e, "PostgreSQL maintenance statement failed");
                    }
                }
            });
        }
        Ok(())
    }

    /// Creates whatever of the schema `sql` is missing (tables, indexes, sequences), for
    /// `migrate`: nothing at all, not even a lock, when everything exists, so it is idempotent
    /// and cheap to run on every deploy while workers run.
    ///
    /// # Errors
    /// Connection errors; [`ErrorKind::Permission`] for a role that may not create them;
    /// [`ErrorKind::Busy`] when the tables stayed locked by other transactions through every
    /// try (see [`create_schema`](Self::create_schema)).
    pub(crate) async fn migrate_schema(&self, sql: &str) -> Result<(), Error> {
        let all: Vec<&str> = created_relations(sql)
            .into_iter()
            .map(|(_, name)| name)
            .collect();
        if self.relations_exist(&all).await? {
            return Ok(());
        }
        self.create_schema(sql).await
    }

    /// Whether every relation in `names` (unqualified: looked up in the `search_path`, as the
    /// statements that use them are) exists and is visible to this role; one catalog read.
    async fn relations_exist(&self, names: &[&str]) -> Result<bool, Error> {
        const DURING: &str = "looking for baton's tables";
        let conn = self.pooled().await?;
        let row = self
            .timed(
                DURING,
                conn.query_one(
                    "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) AS n",
                    &[&names],
                ),
            )
            .await?;
        let all: Option<bool> = row.try_get(0).map_err(|e| Error::UnexpectedReply {
            context: "to_regclass",
            reply: e.to_string(),
        })?;
        Ok(all.unwrap_or(true))
    }

    /// Runs the DDL `sql` in one transaction holding a transaction-level advisory lock, which
    /// serializes clients creating it at the same moment (concurrent `CREATE TABLE IF NOT
    /// EXISTS` can fail on the catalog's unique index).
    ///
    /// Every lock it waits for is bounded by a short `lock_timeout` ([`DDL_LOCK_TIMEOUT`]): a
    /// DDL statement queued behind a long transaction would queue every later writer of the
    /// table behind itself. A try that times out on a lock is rolled back and tried again after
    /// a pause, [`DDL_TRIES`] times at most.
    async fn create_schema(&self, sql: &str) -> Result<(), Error> {
        const DURING: &str = "creating baton's tables";
        // Bounded by the connect timeout, not the (shorter) response timeout: DDL writes the
        // catalog, and may wait up to `lock_timeout` for each lock. The same bound holds on the
        // server (`statement_timeout`), so a try the client gave up on does not run on.
        let bound = self
            .settings
            .connect_timeout
            .max(self.settings.response_timeout)
            .max(DDL_LOCK_TIMEOUT)
            * 5;
        let script = format!(
            "SET LOCAL statement_timeout = '{}ms'; SET LOCAL lock_timeout = '{}ms'; \
             SELECT pg_advisory_xact_lock(hashtext('baton schema')); {sql}",
            bound.as_millis(),
            DDL_LOCK_TIMEOUT.as_millis()
        );
        let mut pause = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = self.pooled().await?;
            let ran = async {
                let tx = self.timed(DURING, conn.transaction()).await?;
                match tokio::time::timeout(bound, tx.batch_execute(&script)).await {
                    Ok(result) => result.map_err(|e| classify(e, DURING))?,
                    Err(_) => return Err(Error::Timeout { during: DURING }),
                }
                self.timed(DURING, tx.commit()).await
            }
            .await;
            match ran {
                Ok(()) => return Ok(()),
                Err(e) if e.is_indeterminate() => {
                    // A reply not awaited: the transaction may still be open on the connection.
                    conn.retire();
                    return Err(e);
                }
                Err(Error::Postgres { ref code, .. })
                    if code == SqlState::LOCK_NOT_AVAILABLE.code() && tries < DDL_TRIES =>
                {
                    tracing::debug!(tries, "baton's DDL timed out on a lock; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the test seam's hook, if one is installed (feature `testing`); see
    /// [`crate::util::settings::ExecHook`]. On PostgreSQL it runs between a transition's read and its
    /// conditional `UPDATE`.
    pub(crate) async fn before_exec(&self, _what: &'static str) {
        #[cfg(feature = "testing")]
        {
            let hook = crate::util::lock(&self.before_exec).clone();
            if let Some(hook) = hook {
                hook(_what).await;
            }
        }
    }

    /// A connection from the pool.
    pub(crate) async fn pooled(&self) -> Result<Pooled, Error> {
        self.pool.get().await.map(Pooled::new).map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e)
            | deadpool_postgres::PoolError::PostCreateHook(
                deadpool_postgres::HookError::Backend(e),
            ) => classify(e, "connecting"),
            deadpool_postgres::PoolError::Timeout(_) => Error::Timeout {
                during: "waiting for a PostgreSQL connection",
            },
            other => Error::Connection {
                message: format!("{}: {other}", self.endpoint),
                source: None,
            },
        })
    }

    /// `fut` bounded by the response timeout.
    pub(crate) async fn timed<T>(
        &self,
        during: &'static str,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.settings.response_timeout, fut).await {
            Ok(result) => result.map_err(|e| classify(e, during)),
            Err(_) => Err(Error::Timeout { during }),
        }
    }

    /// A new connection of its own, never pooled and never shared (see the module docs).
    pub(crate) async fn dedicated(&self) -> Result<Dedicated, Error> {
        connect_dedicated(&self.config, &self.tls).await
    }
}

/// A new connection of its own to `config` (see [`PgTransport::dedicated`]).
async fn connect_dedicated(config: &tokio_postgres::Config, tls: &Tls) -> Result<Dedicated, Error> {
    let (client, mut connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| classify(e, "connecting"))?;
    let closed = CancellationToken::new();
    let shut = CancellationToken::new();
    let why = Arc::new(Mutex::new(None));
    let (notices_tx, notices) = mpsc::unbounded_channel();
    let (task_closed, task_why, task_shut) = (closed.clone(), why.clone(), shut.clone());
    // The driver task: polls the socket, forwards notifications and records how the
    // connection ended. It ends with the connection (the client dropped, the server gone, or
    // `Dedicated::close`, which drops the socket at once).
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                biased;
                _ = task_shut.cancelled() => {
                    *crate::util::lock(&task_why) = Some("closed by baton".into());
                    break;
                }
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => message,
            };
            match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let _ = notices_tx.send(Notice {
                        channel: n.channel().to_string(),
                        payload: n.payload().to_string(),
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    *crate::util::lock(&task_why) = Some(e.to_string());
                    break;
                }
                None => break,
            }
        }
        task_closed.cancel();
    });
    Ok(Dedicated {
        client,
        closed,
        shut,
        why,
        notices,
    })
}

/// A connection of its own (see [`PgTransport::dedicated`]).
pub(crate) struct Dedicated {
    pub client: tokio_postgres::Client,
    closed: CancellationToken,
    shut: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
    /// Notifications of the channels this connection `LISTEN`s on.
    pub notices: mpsc::UnboundedReceiver<Notice>,
}

impl Dedicated {
    /// Cancelled when the connection has ended (the server closed it, the backend was
    /// terminated, the network failed as the driver saw it).
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Closes the connection now, without waiting: the driver task drops the socket (the
    /// server sees it close and ends the session, freeing its session-level state such as
    /// advisory locks), and [`closed`](Self::closed) fires. Statements in flight fail with a
    /// connection error. Idempotent.
    pub(crate) fn close(&self) {
        self.shut.cancel();
    }

    /// Why the connection ended, once it has (the driver's message), if it said.
    pub(crate) fn why_closed(&self) -> Option<String> {
        crate::util::lock(&self.why).clone()
    }
}

/// Subscribers by topic.
type Waiters = std::collections::HashMap<String, Vec<(u64, crate::util::mailbox::Sender<HubMsg>)>>;

/// The channels the hub listens on: how many subscribed topics each one carries.
type Shards = std::collections::HashMap<String, usize>;

/// The hub: one connection `LISTEN`ing on the channels of its subscribers' topics (see
/// [`channel_of`]), handing each notification to the subscribers of its topic; reconnects with
/// backoff, telling every subscriber. Ends when the client is cancelled or every
/// [`PgTransport`] handle is gone.
async fn listen_task(
    config: tokio_postgres::Config,
    tls: Tls,
    settings: ConnSettings,
    mut cmds: mpsc::UnboundedReceiver<HubCmd>,
    cancel: CancellationToken,
    #[cfg(feature = "testing")] received: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut waiters: Waiters = Waiters::new();
    let mut shards: Shards = Shards::new();
    let mut backoff = crate::util::backoff::Backoff::new(settings.max_backoff);
    let mut connected_before = false;
    loop {
        let opened = tokio::select! {
            _ = cancel.cancelled() => return,
            opened = listen(&config, &tls, &settings, shards.keys()) => opened,
        };
        let (client, mut notices, closed) = match opened {
            Ok(link) => link,
            Err(err) => {
                tracing::debug!(error = %err, "PostgreSQL LISTEN connection failed");
                // Subscribers asking meanwhile are told, and retry themselves.
                let wait = tokio::time::sleep(backoff.next_delay());
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = &mut wait => break,
                        cmd = cmds.recv() => match cmd {
                            Some(HubCmd::Subscribe { ack, .. }) => {
                                let _ = ack.send(Err(err.clone()));
                            }
                            Some(HubCmd::Unsubscribe { channel, id }) => {
                                remove_waiter(&mut waiters, &mut shards, &channel, id);
                            }
                            None => return,
                        },
                    }
                }
                continue;
            }
        };
        backoff.reset();
        if connected_before {
            for list in waiters.values() {
                for (_, tx) in list {
                    let _ = tx.send(HubMsg::Reconnected);
                }
            }
        }
        connected_before = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = closed.cancelled() => break,
                cmd = cmds.recv() => match cmd {
                    Some(HubCmd::Subscribe { channel: topic, id, tx, ack }) => {
                        let shard = channel_of(&topic);
                        if !waiters.contains_key(&topic) && !shards.contains_key(&shard) {
                            // The first topic of its shard: acknowledged once listening.
                            if let Err(e) = command(&client, &settings, "LISTEN", &shard).await {
                                let _ = ack.send(Err(e));
                                break;
                            }
                        }
                        if !waiters.contains_key(&topic) {
                            *shards.entry(shard).or_default() += 1;
                        }
                        waiters.entry(topic).or_default().push((id, tx));
                        let _ = ack.send(Ok(()));
                    }
                    Some(HubCmd::Unsubscribe { channel, id }) => {
                        if let Some(shard) = remove_waiter(&mut waiters, &mut shards, &channel, id) {
                            // The shard's last topic left. A failure leaves the connection
                            // listening for nothing it hands out, until it is re-established.
                            if let Err(e) = command(&client, &settings, "UNLISTEN", &shard).await {
                                tracing::debug!(error = %e, "PostgreSQL UNLISTEN failed");
                                break;
                            }
                        }
                    }
                    None => return,
                },
                notice = notices.recv() => match notice {
                    Some(n) => {
                        #[cfg(feature = "testing")]
                        received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // The last newline: a topic (a key) may hold newlines, a message never.
                        let Some((topic, message)) = n.payload.rsplit_once('\n') else {
                            continue;
                        };
                        if let Some(list) = waiters.get_mut(topic) {
                            list.retain(|(_, tx)| tx.send(HubMsg::Message(message.to_string())).is_ok());
                        }
                    }
                    None => break,
                },
            }
        }
        drop(client);
    }
}

/// Removes subscriber `id` of `topic`; the topic's shard when that was its last topic (no
/// longer counted in `shards`: the caller `UNLISTEN`s).
fn remove_waiter(
    waiters: &mut Waiters,
    shards: &mut Shards,
    topic: &str,
    id: u64,
) -> Option<String> {
    let list = waiters.get_mut(topic)?;
    list.retain(|(i, _)| *i != id);
    if !list.is_empty() {
        return None;
    }
    waiters.remove(topic);
    let shard = channel_of(topic);
    let count = shards.get_mut(&shard)?;
    *count = count.saturating_sub(1);
    if *count > 0 {
        return None;
    }
    shards.remove(&shard);
    Some(shard)
}

/// `LISTEN` or `UNLISTEN` on `shard` (a name of [`channel_of`]'s, safe as an identifier), bounded
/// by the response timeout.
async fn command(
    client: &tokio_postgres::Client,
    settings: &ConnSettings,
    verb: &'static str,
    shard: &str,
) -> Result<(), Error> {
    match tokio::time::timeout(
        settings.response_timeout,
        client.batch_execute(&format!("{verb} {shard}")),
    )
    .await
    {
        Ok(result) => result.map_err(|e| classify(e, verb)),
        Err(_) => Err(Error::Timeout { during: verb }),
    }
}

/// A connection listening on `shards`: its client (dropping it closes the connection), its
/// notifications, and a token cancelled when it ends.
async fn listen(
    config: &tokio_postgres::Config,
    tls: &Tls,
    settings: &ConnSettings,
    shards: impl Iterator<Item = &String>,
) -> Result<
    (
        tokio_postgres::Client,
        mpsc::UnboundedReceiver<Notice>,
        CancellationToken,
    ),
    Error,
> {
    // Collected before the first await: the iterator borrows the hub's state.
    let script: String = shards.map(|s| format!("LISTEN {s};")).collect();
    let link = connect_dedicated(config, tls).await?;
    if !script.is_empty() {
        match tokio::time::timeout(
            settings.response_timeout,
            link.client.batch_execute(&script),
        )
        .await
        {
            Ok(result) => result.map_err(|e| classify(e, "LISTEN"))?,
            Err(_) => return Err(Error::Timeout { during: "LISTEN" }),
        }
    }
    Ok((link.client, link.notices, link.closed))
}

/// How long baton's DDL waits for any one lock before it gives up the try (see
/// [`PgTransport::create_schema`]).
pub(crate) const DDL_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// How many times baton's DDL is tried when it times out on a lock.
pub(crate) const DDL_TRIES: u32 = 5;

/// The relations a schema's DDL creates, `(kind, name)` for each `CREATE <kind> IF NOT EXISTS
/// <name>` (`TABLE`, `INDEX`, `SEQUENCE`): read from the DDL itself, so the check before it
/// can never drift from what it creates.
pub(crate) fn created_relations(sql: &str) -> Vec<(&str, &str)> {
    sql.split(';')
        .filter_map(|statement| {
            let words: Vec<&str> = statement.split_whitespace().take(6).collect();
            match words.as_slice() {
                ["CREATE", kind, "IF", "NOT", "EXISTS", name] => {
                    Some((*kind, name.trim_end_matches('(')))
                }
                _ => None,
            }
        })
        .collect()
}

/// `err`, from creating baton's missing relations `names` for an operation: a refusal for lack
/// of privilege becomes [`ErrorKind::Misconfigured`] naming `baton migrate`, the step that
/// creates them with a role that may.
pub(crate) fn not_creatable(err: Error, names: &[&str]) -> Error {
    match err {
        Error::Postgres {
            kind: ErrorKind::Permission,
            code,
            message,
            source,
        } => Error::Postgres {
            kind: ErrorKind::Misconfigured,
            code,
            message: format!(
                "{message}: {} not found (missing, or in a schema this role may not use), and \
                 this role may not create it; run `baton migrate --url …` (Client::migrate) once \
                 as their owner, and grant this role SELECT, INSERT, UPDATE, DELETE on them \
                 (README, \"PostgreSQL\")",
                names.join(", ")
            ),
            source,
        },
        other => other,
    }
}

/// A driver error as a typed [`Error`], classified by SQLSTATE (see the README's PostgreSQL
/// section); `during` names the step for timeouts.
pub(crate) fn classify(err: tokio_postgres::Error, during: &'static str) -> Error {
    let Some(db) = err.as_db_error() else {
        // A failed TLS handshake (an untrusted or misnamed certificate, a server without TLS
        // for sslmode=require) is never retried, as on Redis.
        if let Some(why) = tls_failure(&err) {
            return Error::Tls {
                message: format!("PostgreSQL: {why}"),
                source: Some(Arc::new(err)),
            };
        }
        // The server asked for a password and the URL has none: the credentials, which no
        // retry changes (the driver says only "invalid configuration", its source why). Given
        // the SQLSTATE of a failed password login, which is what the server would answer.
        if std::error::Error::source(&err).is_some_and(|s| s.to_string() == "password missing") {
            return Error::Postgres {
                kind: ErrorKind::Permission,
                code: "28P01".into(),
                message: "the server asks for a password and none was given".into(),
                source: Some(Arc::new(err)),
            };
        }
        // Not the server's answer: the connection failed, closed, or the reply was unreadable.
        let message = err.to_string();
        return Error::Connection {
            message: format!("PostgreSQL: {message}"),
            source: Some(Arc::new(err)),
        };
    };
    let code = db.code().clone();
    let kind = kind_of(&code);
    if kind == ErrorKind::Timeout {
        return Error::Timeout { during };
    }
    let message = db.message().to_string();
    Error::Postgres {
        kind,
        code: code.code().to_string(),
        message,
        source: Some(Arc::new(err)),
    }
}

/// What rustls reported, if `err` is a failed TLS handshake; or that the server has no TLS.
fn tls_failure(err: &tokio_postgres::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    // A bound, not a loop forever on a strange self-referencing chain.
    for _ in 0..16 {
        let e = next?;
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r.to_string());
            }
        }
        // The driver's own words when the server refuses TLS under sslmode=require.
        if e.to_string().contains("server does not support TLS") {
            return Some("the server does not support TLS (sslmode=require)".into());
        }
        next = e.source();
    }
    None
}

/// The classification of a SQLSTATE.
pub(crate) fn kind_of(code: &SqlState) -> ErrorKind {
    let class = &code.code()[..2.min(code.code().len())];
    if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        ErrorKind::Busy
    } else if *code == SqlState::QUERY_CANCELED {
        ErrorKind::Timeout
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        ErrorKind::ReadOnly
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE || class == "28" {
        // 28000 (no such role, no pg_hba.conf entry), 28P01 (wrong password), 42501.
        ErrorKind::Permission
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        // 3D000: the URL's database does not exist.
        ErrorKind::Misconfigured
    } else if class == "08" || class == "57" {
        // Connection exceptions; operator intervention (admin shutdown, crash shutdown,
        // cannot connect now): the session is gone or going.
        ErrorKind::Connection
    } else if class == "53" {
        ErrorKind::Oom
    } else {
        ErrorKind::Server
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ConnSettings {
        ConnSettings {
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            pool_size: 4,
        }
    }

    #[test]
    fn urls_are_checked_before_any_io() {
        assert!(parse_url("postgres://u@127.0.0.1:5432/db", &settings()).is_ok());
        assert!(parse_url("postgresql://127.0.0.1/db", &settings()).is_ok());
        for (url, why) in [
            ("redis://127.0.0.1/", "scheme"),
            ("postgres://u:secret@127.0.0.1:0/db", "port 0"),
            ("postgres://u:secret@127.0.0.1/db#x", "fragment"),
        ] {
            let err = parse_url(url, &settings()).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: the password leaked: {err}");
        }
    }

    #[test]
    fn tls_is_all_or_nothing() {
        use tokio_postgres::config::SslMode;
        let mode = |url: &str| parse_url(url, &settings()).unwrap().get_ssl_mode();
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=require"),
            SslMode::Require
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=verify-full"),
            SslMode::Require
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?application_name=x&sslmode=verify-ca"),
            SslMode::Require
        );
        // No opportunistic TLS: prefer (the default) and disable connect without.
        assert_eq!(mode("postgres://127.0.0.1/db"), SslMode::Disable);
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=prefer"),
            SslMode::Disable
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=disable"),
            SslMode::Disable
        );
        // TLS options with a URL that does not ask for TLS are refused, never ignored.
        let tls = crate::util::tls::TlsSettings {
            root_ca: Some(crate::util::tls::Pem::bytes(b"x".to_vec())),
            client: None,
        };
        let err = PgTransport::new("postgres://127.0.0.1/db", None, settings(), &tls)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sslmode=require"), "{err}");
        // And unusable ones are refused before any I/O.
        let err = PgTransport::new(
            "postgres://127.0.0.1/db?sslmode=require",
            None,
            settings(),
            &tls,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tls_root_ca"), "{err}");
    }

    #[test]
    fn the_relations_a_schema_creates_are_read_from_its_ddl() {
        let ddl = "
            CREATE TABLE IF NOT EXISTS t (
                key text PRIMARY KEY
            );
            CREATE INDEX IF NOT EXISTS t_key ON t (key);
            CREATE SEQUENCE IF NOT EXISTS s;
            SELECT 1";
        assert_eq!(
            created_relations(ddl),
            [("TABLE", "t"), ("INDEX", "t_key"), ("SEQUENCE", "s")]
        );
    }

    #[test]
    fn channels_are_a_fixed_hash_of_the_topic_over_64_shards() {
        // Pinned: clients of every version must compute the same channel for a topic.
        assert_eq!(
            channel_of(""),
            format!("baton_{}", 0xcbf2_9ce4_8422_2325u64 % 64)
        );
        assert_eq!(
            channel_of("a"),
            format!("baton_{}", 0xaf63_dc4c_8601_ec8cu64 % 64)
        );
        let shards: std::collections::HashSet<String> = (0..4096)
            .map(|i| channel_of(&format!("baton:lock:{{{i}}}")))
            .collect();
        assert_eq!(shards.len(), 64, "every shard is used, and no other");
    }

    #[test]
    fn sqlstates_are_classified() {
        assert_eq!(
            kind_of(&SqlState::T_R_SERIALIZATION_FAILURE),
            ErrorKind::Busy
        );
        assert_eq!(kind_of(&SqlState::ADMIN_SHUTDOWN), ErrorKind::Connection);
        assert_eq!(
            kind_of(&SqlState::READ_ONLY_SQL_TRANSACTION),
            ErrorKind::ReadOnly
        );
        assert_eq!(
            kind_of(&SqlState::INSUFFICIENT_PRIVILEGE),
            ErrorKind::Permission
        );
        assert_eq!(kind_of(&SqlState::INVALID_PASSWORD), ErrorKind::Permission);
        assert_eq!(
            kind_of(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
            ErrorKind::Permission
        );
        assert_eq!(
            kind_of(&SqlState::INVALID_CATALOG_NAME),
            ErrorKind::Misconfigured
        );
        assert_eq!(kind_of(&SqlState::DISK_FULL), ErrorKind::Oom);
        assert_eq!(kind_of(&SqlState::QUERY_CANCELED), ErrorKind::Timeout);
        assert_eq!(kind_of(&SqlState::UNIQUE_VIOLATION), ErrorKind::Server);
    }
}
