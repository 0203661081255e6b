//! The store seam: the one place where baton's primitives meet its backends.
//!
//! A client talks to one backend, a [`Backend`]; every primitive handle, guard and background
//! task holds it (or its [`WeakBackend`]) and asks it for what every backend has in common: the
//! client's task tracker and cancellation, its connection settings and timeouts, the test seam
//! before a commit, and pub/sub (`subscribe`, wake-one groups). That dispatch is written here,
//! once. What is stored in a backend comes in two shapes:
//!
//! - **a lock store** (held locks: acquire, extend and release by token, the fence): its
//!   operations are methods of [`Backend`] and [`WeakBackend`] in [`locks`], one arm per
//!   backend, the scripts and statements in each backend's folder;
//! - **a job store** (the failover coordinator's job state): [`jobs`], which chooses the
//!   backend's implementation of the `JobStore` contract (`util::jobs`) in one place;
//! - **the fair line**, **the queue's items** and **Redlock's masters** ([`fair`], [`queue`],
//!   [`redlock`]): Redis structures, refused on other backends inside the seam;
//! - **the read-write lock** ([`rwlocks`]): one try, an upgrade, a downgrade and the release
//!   (each holder's lease is extended through the lock store), on Redis and PostgreSQL;
//! - **the schedule's record** ([`schedules`]): spec, hosts seen, history and pause of each
//!   schedule, one script (Redis) or statement (PostgreSQL) per change;
//! - **advisory locks** (`advisory`, feature `postgres`): a PostgreSQL feature, so its seam
//!   names the PostgreSQL session instead of abstracting it.
//!
//! What crosses a seam (requests, replies, records) is plain data defined in the leaves
//! (`util::lock_replies`, `util::rw_replies`, `util::jobs`, `util::fair_line`, `util::queue_items`,
//! `util::inspect`), so that a backend's folder imports no seam and no primitive: a third
//! backend is a new folder plus one arm per seam method. Two more seams are defined here once
//! and implemented in each backend's folder:
//! - [`connect`]: the one way a client builds its backend, `connect::connect(url, settings)`,
//!   which reads the URL's scheme and hands the rest to the backend's own connect and checks;
//! - [`inspect`]: what the operator's view reads (a listing's batches, jobs and lock-shaped
//!   entries), as raw typed records the inspector judges.
//!
//! Everything a backend does over the network lives in its own folder and imports no
//! primitive:
//! - [`redis`]: Redis, Valkey, Cluster and Sentinel: connecting, the multiplexed connection,
//!   the pool of dedicated connections, the pub/sub hub, routing, TLS, URLs, error
//!   classification, the ACL rules and the inspection's `SCAN`;
//! - `postgres` (feature `postgres`): connecting and the settings check, the pool, dedicated
//!   sessions, the `LISTEN` hub, schema migrations, the classification of SQLSTATEs, the lock
//!   table's statements and the advisory lock functions.
//!
//! A module named `redis` here shadows the `redis` crate inside this file: write `::redis::`
//! for the crate.

#[cfg(feature = "postgres")]
pub(crate) mod advisory;
pub(crate) mod clock;
pub(crate) mod connect;
pub(crate) mod fair;
pub(crate) mod inspect;
pub(crate) mod jobs;
pub(crate) mod locks;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod queue;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod rwlocks;
pub(crate) mod schedules;
pub(crate) mod semaphores;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::util::pubsub::Subscription;
use crate::util::settings::ConnSettings;
use crate::util::wake::WakeOne;

/// The seam between the primitives and the servers: which backend a client talks to. A
/// primitive with an implementation per backend matches on it once, where its handle starts
/// work; the protocol decisions both implementations make are the primitive's own pure
/// functions, shared. A primitive that exists on one backend only asks for it with
/// [`Backend::redis`] / [`Backend::postgres`], which refuse the other with
/// [`Error::Unsupported`].
#[derive(Clone)]
pub(crate) enum Backend {
    Redis(Arc<redis::Transport>),
    #[cfg(feature = "postgres")]
    Postgres(Arc<postgres::PgTransport>),
}

impl Backend {
    /// The backend's name for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "Redis",
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "PostgreSQL",
        }
    }

    /// The backend's value of the metrics' `backend` label.
    pub(crate) fn label(&self) -> crate::util::metrics::Backend {
        match self {
            Backend::Redis(_) => crate::util::metrics::backend::REDIS,
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => crate::util::metrics::backend::POSTGRES,
        }
    }

    /// The Redis transport, or [`Error::Unsupported`] naming `what` and `why` it needs Redis.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) fn redis(
        &self,
        what: &'static str,
        why: &'static str,
    ) -> Result<&Arc<redis::Transport>, Error> {
        match self {
            Backend::Redis(t) => Ok(t),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Err(Error::Unsupported {
                what,
                backend: self.name(),
                why,
            }),
        }
    }

    /// The PostgreSQL transport, or [`Error::Unsupported`] naming `what` and `why`.
    #[cfg(feature = "postgres")]
    #[allow(dead_code)]
    pub(crate) fn postgres(
        &self,
        what: &'static str,
        why: &'static str,
    ) -> Result<&Arc<postgres::PgTransport>, Error> {
        match self {
            Backend::Postgres(t) => Ok(t),
            Backend::Redis(_) => Err(Error::Unsupported {
                what,
                backend: self.name(),
                why,
            }),
        }
    }

    /// Cancelled when the client shuts down (or its last handle is gone).
    pub(crate) fn cancel(&self) -> &CancellationToken {
        match self {
            Backend::Redis(t) => &t.cancel,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => &t.cancel,
        }
    }

    /// The client's tasks, which `shutdown` waits for.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        match self {
            Backend::Redis(t) => &t.tracker,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => &t.tracker,
        }
    }

    /// The connection settings the client was built with.
    pub(crate) fn settings(&self) -> &ConnSettings {
        match self {
            Backend::Redis(t) => &t.settings,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => &t.settings,
        }
    }
}

impl Backend {
    /// How long one request may take.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.settings().response_timeout
    }

    /// How long connecting (or subscribing) may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings().connect_timeout
    }

    /// The test seam before a commit (see `Transport::before_exec`); nothing without the
    /// `testing` feature.
    pub(crate) async fn before_exec(&self, what: &'static str) {
        match self {
            Backend::Redis(t) => t.before_exec(what).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.before_exec(what).await,
        }
    }

    /// Joins this client's waiters on `channel` (a Redis channel, or a PostgreSQL notification
    /// topic): a message wakes one of them (see [`crate::util::wake`]).
    ///
    /// # Errors
    /// Connection errors; [`Error::Stopped`] once the client is shutting down.
    pub(crate) async fn wake_one(&self, channel: &str) -> Result<WakeOne, Error> {
        match self {
            Backend::Redis(t) => t.hub.wake_one(channel).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.wake_one(channel).await,
        }
    }

    /// This client's waiters on `channel`, joined without subscribing, if another local waiter
    /// is on it: `None` when nobody local waits (see [`crate::util::wake::join_waiting`]).
    pub(crate) fn waiting(&self, channel: &str) -> Option<WakeOne> {
        match self {
            Backend::Redis(t) => t.hub.waiting(channel),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.waiting(channel),
        }
    }

    /// As [`Backend::wake_one`], in the group `line` of the channel's local waiters: a
    /// subscription of its own, so each message wakes one waiter of every line.
    ///
    /// # Errors
    /// As [`Backend::wake_one`].
    pub(crate) async fn wake_one_in(&self, channel: &str, line: &str) -> Result<WakeOne, Error> {
        match self {
            Backend::Redis(t) => t.hub.wake_one_in(channel, line).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.wake_one_in(channel, line).await,
        }
    }

    /// As [`Backend::waiting`], in the group `line`.
    pub(crate) fn waiting_in(&self, channel: &str, line: &str) -> Option<WakeOne> {
        match self {
            Backend::Redis(t) => t.hub.waiting_in(channel, line),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.waiting_in(channel, line),
        }
    }

    /// Every message on `channel` (a Redis channel, or a PostgreSQL notification topic).
    ///
    /// # Errors
    /// Connection errors; [`Error::Stopped`] once the client is shutting down.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        match self {
            Backend::Redis(t) => t.hub.subscribe(channel).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t.subscribe(channel).await,
        }
    }

    /// The same backend, weakly (see [`WeakBackend`]).
    pub(crate) fn downgrade(&self) -> WeakBackend {
        match self {
            Backend::Redis(t) => WeakBackend::Redis(t.router.clone()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => WeakBackend::Postgres(Arc::downgrade(t)),
        }
    }
}

/// A [`Backend`] that does not keep the client alive: what a background task (the watchdog)
/// holds. Once the client is gone, its requests fail with [`Error::Stopped`].
#[derive(Clone)]
pub(crate) enum WeakBackend {
    /// The Redis router (it does not own the client's tasks).
    Redis(redis::Router),
    /// The PostgreSQL transport, weakly.
    #[cfg(feature = "postgres")]
    Postgres(std::sync::Weak<postgres::PgTransport>),
}

/// The hidden test seam's hooks into the backends (feature `testing`; see `client::seam`).
#[cfg(feature = "testing")]
impl Backend {
    /// Installs (or removes) the hook run before each commit and lease extension.
    pub(crate) fn set_before_exec(&self, hook: Option<crate::util::settings::ExecHook>) {
        match self {
            Backend::Redis(t) => *crate::util::lock(&t.before_exec) = hook,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => *crate::util::lock(&t.before_exec) = hook,
        }
    }

    /// How many notifications the `LISTEN` connection has received (0 on Redis).
    pub(crate) fn notifications_received(&self) -> u64 {
        match self {
            Backend::Redis(_) => 0,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => t
                .notices_received
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// What the hidden test seam (`client::seam`) and the unit tests read of the PostgreSQL
/// backend's statements and schema.
#[cfg(all(feature = "postgres", any(test, feature = "testing")))]
pub(crate) mod pg_seam {
    pub(crate) use super::postgres::locks::{ACQUIRE, CLEANUP, SCHEMA, SCHEMA_NAME};
    #[cfg(test)]
    pub(crate) use super::postgres::schema::created_relations;

    /// A statement's parameters, as the job store's grant builds them.
    pub(crate) type Params = Vec<Box<dyn ::tokio_postgres::types::ToSql + Sync + Send>>;
}
