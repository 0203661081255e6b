//! The PostgreSQL backend (feature `postgres`): everything baton knows about talking to
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
//! Every error of the driver becomes a typed [`Error`] in [`classify()`], by SQLSTATE.
//!
//! One file per concept, each readable without the others:
//!
//! - this file: [`PgTransport`], the connections of one client, how it is built from a URL, and
//!   its test seams (feature `testing`);
//! - [`url`]: the checks made on a URL before any network I/O, and the TLS connector it asks
//!   for (`sslmode`), apart because they are pure and unit-tested without a server;
//! - [`pool`]: the pool of short-lived connections, and [`Pooled`], the borrowed connection that
//!   is retired instead of returned when a statement on it was not awaited;
//! - [`dedicated`]: connections of their own (session advisory locks, `LISTEN`), which say
//!   when they die;
//! - [`hub`]: the `LISTEN` hub, one connection listening on the sharded `NOTIFY` channels
//!   ([`channel_of`]) of its subscribers' topics, apart because it is a task with its own
//!   reconnect loop;
//! - [`schema`]: making sure baton's tables exist (`ensure_schema`, `migrate`, and
//!   [`created_relations`](schema::created_relations), read from the DDL), apart because DDL
//!   has its own locking and privilege rules;
//! - [`locks`]: the statements on `baton_locks` that implement the lease kernel's lock store
//!   (acquire, release, extend, read, cleanup), the backend's half of the store seam;
//! - [`jobs`]: the failover coordinator's job store, one row of `baton_jobs` per job;
//! - [`semaphores`]: the semaphore's tries on `baton_semaphores` (limit, slots' fences), each
//!   held slot a row of `baton_locks`;
//! - [`rwlocks`]: the read-write lock, a state row of `baton_rwlocks` and each holder's lease a
//!   row of `baton_locks`;
//! - [`classify`](mod@classify): driver errors as typed [`Error`]s by SQLSTATE, in one place,
//!   as `super::redis::classify` is for Redis.

pub(crate) mod advisory;
pub(crate) mod classify;
pub(crate) mod connect;
pub(crate) mod dedicated;
pub(crate) mod hub;
pub(crate) mod inspect;
pub(crate) mod jobs;
pub(crate) mod locks;
pub(crate) mod pool;
pub(crate) mod rwlocks;
pub(crate) mod schedules;
pub(crate) mod schema;
pub(crate) mod semaphores;
pub(crate) mod url;

#[cfg(feature = "testing")]
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::util::pubsub::HubCmd;
use crate::util::redact::redact_url;
use crate::util::settings::ConnSettings;

pub(crate) use classify::{classify, kind_of};
pub(crate) use dedicated::Dedicated;
pub(crate) use hub::channel_of;
pub(crate) use pool::Pooled;
pub(crate) use schema::not_creatable;
pub(crate) use url::{parse_url, Tls};

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
        let tls = url::connector(&config, url, tls)?;
        let pool = pool::build(&config, &tls, &settings)?;
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
}
