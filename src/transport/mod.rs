//! The transport: everything baton knows about talking to Redis, and nothing about any
//! primitive. Primitives get an `Arc<Transport>` and build their commands themselves.
//!
//! - [`connection`]: the multiplexed connection, the pool of dedicated connections for
//!   `WATCH … EXEC` and the pub/sub hub (why three kinds: see there).
//! - [`classify`]: server errors and client-library errors as typed [`Error`]s, in one place.
//! - [`url`]: URL checks made before any network I/O, and redaction for messages.
//! - [`wake`]: local waiters sharing one subscription, woken one per message.
//! - [`acl`]: the commands baton sends, for a least-privilege user.
//! - `tls` (feature `tls`): rustls setup.

pub mod acl;
pub(crate) mod classify;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod connection;
#[cfg(feature = "sentinel")]
pub(crate) mod follow;
#[cfg(feature = "postgres")]
// The advisory locks and the PostgreSQL forms of the primitives arrive in the next commits.
#[allow(dead_code)]
pub(crate) mod pg;
pub(crate) mod route;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod topology_url;
pub(crate) mod url;
pub(crate) mod wake;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncConnectionConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use classify::{from_server_error, unexpected};
#[cfg(feature = "postgres")]
pub(crate) use connection::HubCmd;
pub(crate) use connection::{
    check_replies, Dedicated, Expect, Hub, HubMsg, HubSource, ReplicaWait, Subscription,
};
pub(crate) use route::{Node, NodeConn as Conn, Router};

use crate::error::Error;

/// A hook run between round trip 1 (`WATCH` + reads) and round trip 2 (`MULTI … EXEC`) of a
/// transition, and before a lease extension, with the transition's name (`"grant"`,
/// `"exhaust"`, `"finish"`, `"extend"`). A hidden test seam (feature `testing`): tests write a
/// competing value exactly in the window a `WATCH` protects, or hold a transition there.
#[cfg(feature = "testing")]
pub type ExecHook = std::sync::Arc<
    dyn Fn(&'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// The connections of one client and the tasks that use them; shared by every primitive
/// handle and worker task through an `Arc`.
pub(crate) struct Transport {
    /// Which server serves a key ([`route`]).
    pub router: Router,
    pub hub: Hub,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub settings: ConnSettings,
    /// Where this transport connects, as `host:port/db` (or `path/db` for a Unix socket):
    /// never credentials. Lets a primitive over several servers (Redlock) reject one server
    /// counted twice.
    pub endpoint: String,
    #[cfg(feature = "testing")]
    pub before_exec: std::sync::Mutex<Option<ExecHook>>,
}

impl Transport {
    /// The node that serves `key` (any key of the operation: they share a hash tag).
    ///
    /// # Errors
    /// On a cluster, when no node answers with a slot map.
    pub(crate) async fn node(&self, key: &str) -> Result<std::sync::Arc<Node>, Error> {
        self.router.node(key).await
    }

    /// Runs the test seam's hook, if one is installed (feature `testing`).
    pub(crate) async fn before_exec(&self, _what: &'static str) {
        #[cfg(feature = "testing")]
        {
            let hook = crate::util::lock(&self.before_exec).clone();
            if let Some(hook) = hook {
                hook(_what).await;
            }
        }
    }

    /// The hook as a value, for futures that must own what they use.
    #[cfg(feature = "testing")]
    pub(crate) fn exec_hook(&self) -> Option<ExecHook> {
        crate::util::lock(&self.before_exec).clone()
    }
}

/// The seam between the primitives and the servers: which backend a client talks to. A
/// primitive with an implementation per backend matches on it once, where its handle starts
/// work; the protocol decisions both implementations make are the primitive's own pure
/// functions, shared. A primitive that exists on one backend only asks for it with
/// [`Backend::redis`] / [`Backend::postgres`], which refuse the other with
/// [`Error::Unsupported`].
#[derive(Clone)]
pub(crate) enum Backend {
    Redis(std::sync::Arc<Transport>),
    #[cfg(feature = "postgres")]
    Postgres(std::sync::Arc<pg::PgTransport>),
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

    /// The Redis transport, or [`Error::Unsupported`] naming `what` and `why` it needs Redis.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) fn redis(
        &self,
        what: &'static str,
        why: &'static str,
    ) -> Result<&std::sync::Arc<Transport>, Error> {
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
    ) -> Result<&std::sync::Arc<pg::PgTransport>, Error> {
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

impl Drop for Transport {
    fn drop(&mut self) {
        // The last handle is gone: stop the pub/sub task and any worker still running.
        self.cancel.cancel();
    }
}

/// Connection settings shared by all three kinds.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub max_backoff: Duration,
    pub pool_size: usize,
}

impl ConnSettings {
    fn async_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }
}

fn manager_config(s: &ConnSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(s.response_timeout))
        .set_max_delay(s.max_backoff)
        .set_number_of_retries(2)
}

/// The shared multiplexed connection, opened by its first request (and reopened after an I/O
/// error by the next one). Needs a Tokio runtime.
pub(crate) fn lazy_manager(
    client: &redis::Client,
    s: &ConnSettings,
) -> Result<ConnectionManager, Error> {
    Ok(ConnectionManager::new_lazy_with_config(
        client.clone(),
        manager_config(s),
    )?)
}

/// Opens the shared multiplexed connection.
pub(crate) async fn connect_manager(
    client: &redis::Client,
    s: &ConnSettings,
) -> Result<ConnectionManager, Error> {
    let fut = ConnectionManager::new_with_config(client.clone(), manager_config(s));
    // The manager retries internally; bound the whole first connect so `Client::connect` fails
    // fast (and typed) when Redis is down.
    match tokio::time::timeout(s.connect_timeout * 3, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Timeout {
            during: "connecting to redis",
        }),
    }
}
