//! The Redis backend: everything baton knows about talking to Redis, and nothing about any
//! primitive above it. The store seams (`backend::locks`, …) call in here; the primitives never
//! do.
//!
//! - [`connection`] (the multiplexed connection, and why a client keeps three kinds), [`pool`]
//!   (dedicated connections for `WATCH … EXEC`) and [`hub`] (pub/sub);
//! - [`node`] (one server and its connections), [`router`] (which node serves a key: one
//!   server, `cluster` or `follow`/`sentinel`).
//! - [`classify`]: server errors and client-library errors as typed [`Error`]s, in one place.
//! - [`url`]: URL checks made before any network I/O, and redaction for messages.
//! - wake-one groups (local waiters sharing one subscription) are shared with PostgreSQL:
//!   `crate::util::wake`.
//! - [`acl`]: the commands baton sends, for a least-privilege user.
//! - the stores' wire forms: [`script`] (`EVALSHA` and the lease extension), [`locks`] (the
//!   lock store's fenced scripts) and [`batch`] (their group commit per node), [`jobs`] (the
//!   failover coordinator's job store: its transactions, reads and their parsing),
//!   [`schedules`] (the schedule's record: its keys, its script and reads), [`rwlocks`] (the
//!   read-write lock's scripts).
//! - TLS material and rustls setup are shared with PostgreSQL: `crate::util::tls`.

pub mod acl;
pub(crate) mod batch;
pub(crate) mod classify;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod connect;
pub(crate) mod connection;
pub(crate) mod fair;
#[cfg(feature = "sentinel")]
pub(crate) mod follow;
pub(crate) mod hub;
pub(crate) mod inspect;
pub(crate) mod jobs;
pub(crate) mod locks;
pub(crate) mod node;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod redlock;
pub(crate) mod router;
pub(crate) mod rwlocks;
pub(crate) mod schedules;
pub(crate) mod script;
pub(crate) mod semaphores;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod stale;
pub(crate) mod topology_url;
pub(crate) mod url;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use crate::util::pubsub::Subscription;
pub(crate) use classify::{from_server_error, unexpected};
pub(crate) use connection::{connect_manager, lazy_manager};
pub(crate) use hub::{Hub, HubSource};
pub(crate) use node::{Node, NodeConn as Conn};
pub(crate) use pool::{check_replies, Dedicated, Expect, ReplicaWait};
pub(crate) use router::Router;

use crate::error::Error;
pub(crate) use crate::util::settings::ConnSettings;
#[cfg(feature = "testing")]
pub(crate) use crate::util::settings::ExecHook;

/// The connections of one client and the tasks that use them; shared by every primitive
/// handle and worker task through an `Arc`.
pub(crate) struct Transport {
    /// Which server serves a key ([`router`]).
    pub router: Router,
    pub hub: Hub,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub settings: ConnSettings,
    /// Where this transport connects, as `host:port/db` (or `path/db` for a Unix socket):
    /// never credentials. Lets a primitive over several servers (Redlock) reject one server
    /// counted twice.
    pub endpoint: String,
    /// Bounds the waiting backups' plain reads in flight on this client to [`WAIT_READS`].
    pub wait_reads: tokio::sync::Semaphore,
    #[cfg(feature = "testing")]
    pub before_exec: std::sync::Mutex<Option<ExecHook>>,
}

/// How many waiting backups' plain reads (`GET` state, `PTTL` lease) one client has in flight at
/// once. Backups started together (or whose leases ran out together) would otherwise each hold a
/// request's buffers at the same moment: about 3 KB each, a peak the allocator then keeps as the
/// process's memory. The reads share one pipelined connection per server anyway, so queueing
/// the rest behind a permit costs no time in total.
pub(crate) const WAIT_READS: usize = 64;

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
