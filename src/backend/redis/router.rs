//! Where a key's commands go: to the one server of a plain URL, or (feature `cluster`) to the
//! primary that owns the key's hash slot.
//!
//! A primitive asks the [`Router`] for the [`Node`] of a key (every key of one job or lock shares
//! a hash tag, so any of them will do) and sends everything of that operation there: plain
//! reads and scripts on [`Node::conn`], `WATCH … EXEC` on a dedicated connection of
//! [`Node::pool`]. A reply that says the routing is out of date (`MOVED`, `READONLY`,
//! `TRYAGAIN`, `CLUSTERDOWN`, a dropped connection), and a reply that never comes (a timeout, or
//! a request its caller gave up on: a hung node looks exactly like that), marks it [`Stale`]; the
//! next lookup refreshes it first. The operation itself fails with a retryable error and its
//! caller looks again, so a redirect is never a failed attempt and nothing is ever committed on a
//! node that no longer owns the slot (Redis refuses the write there).
//!
//! `ASK` (a slot migrating, the key already on the importing node) is followed for single
//! commands, scripts and plain pipelines on [`Node::conn`]: the command runs again on the
//! importing node right after `ASKING`. A `WATCH … EXEC` transaction is not: `ASKING` covers one
//! command, so `WATCH`, the reads and `MULTI … EXEC` would each need it, and keys of one
//! transaction split between the two nodes mid-migration answer `TRYAGAIN` anyway. Its `ASK`
//! fails it retryably (never a failed attempt) until the migration ends.

use std::sync::Arc;

use redis::aio::ConnectionManager;

use super::node::Node;
use super::pool::Pool;
use super::stale::Stale;
use crate::error::Error;

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
        settings: &crate::util::settings::ConnSettings,
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

    /// Whether every key lives on one node (one server, or a followed primary): what lets one
    /// script touch keys of different hash tags (on a cluster that is `CROSSSLOT`).
    pub(crate) fn one_node(&self) -> bool {
        match self {
            Router::Single(_) => true,
            #[cfg(feature = "cluster")]
            Router::Cluster(_) => false,
            #[cfg(feature = "sentinel")]
            Router::Followed(_) => true,
        }
    }

    /// Every primary once: the one server, each primary of a cluster's last slot map, or the
    /// followed primary. What a walk over every key (`SCAN` per node) visits.
    ///
    /// # Errors
    /// On a cluster, when no node answers with a slot map.
    pub(crate) async fn primaries(&self) -> Result<Vec<Arc<Node>>, Error> {
        match self {
            Router::Single(n) => Ok(vec![n.clone()]),
            #[cfg(feature = "cluster")]
            Router::Cluster(c) => {
                // Routing a key first makes sure a slot map was read.
                c.node("").await?;
                Ok(c.primaries())
            }
            #[cfg(feature = "sentinel")]
            Router::Followed(f) => Ok(vec![f.node()]),
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
