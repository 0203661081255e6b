//! The Redis backend: everything baton knows about talking to Redis, and nothing about any
//! primitive. Primitives get an `Arc<Transport>` and build their commands themselves.
//!
//! - [`connection`]: the multiplexed connection, the pool of dedicated connections for
//!   `WATCH … EXEC` and the pub/sub hub (why three kinds: see there).
//! - [`classify`]: server errors and client-library errors as typed [`Error`]s, in one place.
//! - [`url`]: URL checks made before any network I/O, and redaction for messages.
//! - wake-one groups (local waiters sharing one subscription) are shared with PostgreSQL:
//!   `crate::util::wake`.
//! - [`acl`]: the commands baton sends, for a least-privilege user.
//! - TLS material and rustls setup are shared with PostgreSQL: `crate::util::tls`.

pub mod acl;
pub(crate) mod classify;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod connection;
#[cfg(feature = "sentinel")]
pub(crate) mod follow;
pub(crate) mod route;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod topology_url;
pub(crate) mod url;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncConnectionConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use crate::util::pubsub::{HubMsg, Subscription};
pub(crate) use classify::{from_server_error, unexpected};
pub(crate) use connection::{check_replies, Dedicated, Expect, Hub, HubSource, ReplicaWait};
pub(crate) use route::{Node, NodeConn as Conn, Router};

use crate::error::Error;
pub(crate) use crate::util::settings::ConnSettings;
#[cfg(feature = "testing")]
pub(crate) use crate::util::settings::ExecHook;

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

impl Drop for Transport {
    fn drop(&mut self) {
        // The last handle is gone: stop the pub/sub task and any worker still running.
        self.cancel.cancel();
    }
}

/// Per-connection settings for redis' async connections (the dedicated pool and the cluster's
/// node connections).
pub(crate) fn async_config(s: &ConnSettings) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(s.response_timeout))
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
