//! Where a key's commands go: to the one server of a plain URL, or (feature `cluster`) to the
//! primary that owns the key's hash slot.
//!
//! A primitive asks the [`Router`] for the [`Node`] of a key (every key of one job or lock shares
//! a hash tag, so any of them will do) and sends everything of that operation there: plain
//! reads and scripts on [`Node::conn`], `WATCH … EXEC` on a dedicated connection of
//! [`Node::pool`]. A reply that says the routing is out of date (`MOVED`, `ASK`, `READONLY`,
//! `TRYAGAIN`, `CLUSTERDOWN`, a dropped connection) marks it [`Stale`]; the next lookup refreshes
//! it first. The operation itself fails with a retryable error and its caller looks again, so a
//! redirect is never a failed attempt and nothing is ever committed on a node that no longer owns
//! the slot (Redis refuses the write there).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::connection::Pool;
use crate::error::{Error, ErrorKind};

/// Whether a reply said the routing may be out of date; shared by a router and its nodes.
#[derive(Debug, Default)]
pub(crate) struct Stale(AtomicBool);

// The cluster's slot map reads the mark; a single server has nothing to refresh.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
impl Stale {
    /// Marks the routing stale if `e` says a key may live elsewhere now.
    pub(crate) fn note(&self, e: &Error) {
        if matches!(
            e.kind(),
            ErrorKind::Moved | ErrorKind::ReadOnly | ErrorKind::Busy | ErrorKind::Connection
        ) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Marks the routing stale if one of `values` (a pipeline's replies, errors kept as
    /// values) is a server error that says so.
    pub(crate) fn note_values(&self, values: &[Value]) {
        for v in values {
            if let Value::ServerError(e) = v {
                self.note(&super::classify::from_server_error(e));
            }
        }
    }

    /// Whether the routing was marked stale.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Marks the routing stale.
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Clears the mark (a refresh is under way).
    pub(crate) fn clear(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// One server: its shared multiplexed connection and its pool of dedicated ones.
pub(crate) struct Node {
    manager: ConnectionManager,
    /// Dedicated connections for `WATCH … EXEC`.
    pub(crate) pool: Arc<Pool>,
    /// `host:port` (or a socket path), for messages; never credentials.
    pub(crate) addr: String,
    /// The command that wakes this node's subscribers: `PUBLISH`, or `SPUBLISH` on a cluster
    /// (sharded pub/sub: the message stays on the shard that owns the channel's slot).
    pub(crate) publish: &'static str,
    stale: Arc<Stale>,
}

impl Node {
    pub(crate) fn new(
        manager: ConnectionManager,
        pool: Arc<Pool>,
        addr: String,
        publish: &'static str,
        stale: Arc<Stale>,
    ) -> Arc<Node> {
        Arc::new(Node {
            manager,
            pool,
            addr,
            publish,
            stale,
        })
    }

    /// The node's shared multiplexed connection (a cheap handle): plain reads and scripts,
    /// never `WATCH`.
    pub(crate) fn conn(&self) -> NodeConn {
        NodeConn {
            inner: self.manager.clone(),
            stale: self.stale.clone(),
            publish: self.publish,
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).finish()
    }
}

/// A handle on a node's multiplexed connection that marks the routing stale when a reply says
/// so. Used like any `redis` async connection.
#[derive(Clone)]
pub(crate) struct NodeConn {
    inner: ConnectionManager,
    stale: Arc<Stale>,
    publish: &'static str,
}

impl NodeConn {
    /// The command that wakes the node's subscribers (see [`Node::publish`]).
    pub(crate) fn publish(&self) -> &'static str {
        self.publish
    }
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let r = self.inner.req_packed_command(cmd).await;
            if let Err(e) = &r {
                self.stale.note(&Error::from(e.clone()));
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let r = self.inner.req_packed_commands(cmd, offset, count).await;
            match &r {
                Err(e) => self.stale.note(&Error::from(e.clone())),
                Ok(values) => self.stale.note_values(values),
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// Which node serves a key. Cheap to clone (tasks that must not keep the whole transport alive
/// hold one).
#[derive(Clone)]
pub(crate) enum Router {
    /// One server (a plain URL).
    Single(Arc<Node>),
    /// A Redis Cluster: the primary that owns the key's slot.
    #[cfg(feature = "cluster")]
    Cluster(Arc<super::cluster::Cluster>),
    /// A Sentinel-monitored primary, followed across failovers.
    #[cfg(feature = "sentinel")]
    Followed(Arc<super::follow::Followed>),
}

impl Router {
    /// The router of a plain URL: every key on `client`'s server, through `manager` and a pool
    /// of dedicated connections.
    pub(crate) fn single(
        client: redis::Client,
        manager: ConnectionManager,
        settings: &super::ConnSettings,
        addr: String,
    ) -> Router {
        let stale = Arc::new(Stale::default());
        let pool = Pool::new(client, settings.clone(), stale.clone(), "PUBLISH");
        Router::Single(Node::new(manager, pool, addr, "PUBLISH", stale))
    }

    /// The node that serves `key` (any key of the operation: they share a hash tag).
    ///
    /// # Errors
    /// On a cluster, when no node answers with a slot map, or the slot has no primary.
    pub(crate) async fn node(&self, key: &str) -> Result<Arc<Node>, Error> {
        match self {
            Router::Single(n) => {
                let _ = key;
                Ok(n.clone())
            }
            #[cfg(feature = "cluster")]
            Router::Cluster(c) => c.node(key).await,
            #[cfg(feature = "sentinel")]
            Router::Followed(f) => Ok(f.node()),
        }
    }

    /// Some node, for requests about the server rather than a key (durability settings).
    ///
    /// # Errors
    /// As [`node`](Self::node).
    pub(crate) async fn any(&self) -> Result<Arc<Node>, Error> {
        self.node("").await
    }
}

/// A client for `host:port` with `template`'s credentials, TLS material and protocol (a cluster
/// node or a promoted primary is reached as the configured server was).
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn client_at(
    template: &redis::Client,
    host: &str,
    port: u16,
) -> Result<redis::Client, Error> {
    use redis::ConnectionAddr;
    let info = template.get_connection_info().clone();
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_string(), port),
    };
    Ok(redis::Client::open(info.set_addr(addr))?)
}
