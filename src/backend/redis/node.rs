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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Instant;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::pool::Pool;
pub(crate) use super::stale::Stale;
use crate::error::{Error, ErrorKind};

/// One server: its shared multiplexed connection and its pool of dedicated ones.
pub(crate) struct Node {
    /// The shared multiplexed connection, with a number that changes each time it is replaced
    /// (see [`Node::stalled`]).
    manager: RwLock<(u64, ConnectionManager)>,
    /// Dedicated connections for `WATCH … EXEC`.
    pub(crate) pool: Arc<Pool>,
    /// `host:port` (or a socket path), for messages; never credentials.
    pub(crate) addr: String,
    /// The command that wakes this node's subscribers: `PUBLISH`, or `SPUBLISH` on a cluster
    /// (sharded pub/sub: the message stays on the shard that owns the channel's slot).
    pub(crate) publish: &'static str,
    stale: Arc<Stale>,
    /// When the node was created: the origin of `last_reply`.
    born: Instant,
    /// When a reply last came back on the shared connection, in ms since `born`.
    last_reply: AtomicU64,
    /// On a cluster: where an `ASK` redirect is followed (the router, held weakly: nodes are
    /// the router's).
    redirects: OnceLock<Weak<dyn Redirects>>,
    /// State a layer above keeps per node, which this layer cannot name (the lease kernel's
    /// group commit of lock scripts): made on first use, see [`Node::extension`].
    extension: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

/// A router that can name the node at an address (where an `ASK` redirect points).
pub(crate) trait Redirects: Send + Sync {
    /// The node at `addr` (`host:port`), opened if the router does not know it yet.
    fn node_at(&self, addr: &str) -> Option<Arc<Node>>;
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
            manager: RwLock::new((0, manager)),
            pool,
            addr,
            publish,
            stale,
            born: Instant::now(),
            last_reply: AtomicU64::new(0),
            redirects: OnceLock::new(),
            extension: OnceLock::new(),
        })
    }

    /// The per-node state of type `T` a layer above keeps here, made on first use. One type
    /// per node: `None` if another type was made first (the caller then does without).
    pub(crate) fn extension<T: std::any::Any + Send + Sync + Default>(&self) -> Option<Arc<T>> {
        self.extension
            .get_or_init(|| Arc::new(T::default()))
            .clone()
            .downcast::<T>()
            .ok()
    }

    /// The node's settings (timeouts), as its connections use them.
    pub(crate) fn settings(&self) -> &crate::util::settings::ConnSettings {
        self.pool.settings()
    }

    /// Lets requests on this node follow `ASK` redirects through `router`.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn follow_redirects(&self, router: Weak<dyn Redirects>) {
        let _ = self.redirects.set(router);
    }

    /// The node's shared multiplexed connection (a cheap handle): plain reads and scripts,
    /// never `WATCH`.
    pub(crate) fn conn(self: &Arc<Self>) -> NodeConn {
        let (generation, inner) = self
            .manager
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        NodeConn {
            inner,
            generation,
            node: self.clone(),
            asked: None,
        }
    }

    fn since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A reply came back on the shared connection.
    fn answered(&self) {
        self.last_reply
            .fetch_max(self.since_born(), Ordering::Relaxed);
    }

    /// A request sent at `sent` on connection `generation` got no reply in time (it timed out,
    /// or its caller gave up on it). A node that hangs (paused, swapping, a black-holed
    /// network) looks exactly like this, and so does one that was failed over meanwhile: the
    /// routing is marked stale, so the next lookup asks the cluster again.
    ///
    /// If nothing at all came back on that connection since the request left, for half a
    /// response timeout, the connection is stalled: a multiplexed connection answers in
    /// order, so one slow command delays the rest, but silence on all of them means the
    /// socket is dead or the server hung. It is replaced (the next request opens a fresh one;
    /// a hung server's `ConnectionManager` would otherwise be reused forever, since only an
    /// I/O error makes it reconnect), and the pool's idle connections, which very likely
    /// stalled too, are let go.
    fn stalled(&self, generation: u64, sent: Instant) {
        let waited = sent.elapsed();
        let settings = self.pool.settings();
        if waited < settings.response_timeout / 4 {
            // Given up on quickly by its caller (a cancelled select, say): says nothing.
            return;
        }
        self.stale.set();
        let sent_ms = self.since_born().saturating_sub(ms_u64(waited));
        if waited < settings.response_timeout / 2
            || self.last_reply.load(Ordering::Relaxed) > sent_ms
        {
            return;
        }
        let mut current = self
            .manager
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.0 != generation {
            // Replaced already, by another request that stalled on it.
            return;
        }
        match super::connection::lazy_manager(self.pool.client(), settings) {
            Ok(fresh) => {
                tracing::warn!(node = %self.addr, waited_ms = ms_u64(waited), "no reply on the node's connection; replacing it");
                *current = (generation.wrapping_add(1), fresh);
                drop(current);
                // Counts as a reply: the fresh connection gets its own response timeout
                // before it can be judged.
                self.answered();
                self.pool.flush();
            }
            Err(e) => {
                tracing::warn!(node = %self.addr, error = %e, "cannot replace a stalled connection")
            }
        }
    }

    /// The router to follow an `ASK` redirect through, if any.
    fn redirects(&self) -> Option<Arc<dyn Redirects>> {
        self.redirects.get().and_then(Weak::upgrade)
    }
}

fn ms_u64(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).finish()
    }
}

/// A handle on a node's multiplexed connection that marks the routing stale when a reply says
/// so (or none comes), and follows `ASK` redirects on a cluster. Used like any `redis` async
/// connection.
#[derive(Clone)]
pub(crate) struct NodeConn {
    inner: ConnectionManager,
    /// Which of the node's connections `inner` is (see [`Node::stalled`]).
    generation: u64,
    node: Arc<Node>,
    /// Where the last `ASK` through this handle pointed: a script loaded through the handle
    /// afterwards (redis' script call answers `NOSCRIPT` by loading it on the connection it
    /// was given, this one) is loaded there too, so the retried call finds it.
    asked: Option<Box<NodeConn>>,
}

impl NodeConn {
    /// The command that wakes the node's subscribers (see [`Node::publish`]).
    pub(crate) fn publish(&self) -> &'static str {
        self.node.publish
    }
}

/// Reports a request to [`Node::stalled`] if it is dropped unanswered (its caller's own
/// deadline passed first: most callers bound a request by their lease, not by the response
/// timeout).
struct InFlight<'a> {
    node: &'a Node,
    generation: u64,
    sent: Instant,
    done: bool,
}

impl<'a> InFlight<'a> {
    fn new(node: &'a Node, generation: u64) -> Self {
        InFlight {
            node,
            generation,
            sent: Instant::now(),
            done: false,
        }
    }

    /// The request ended with `e` (`None`: with a reply).
    fn finish(mut self, e: Option<&redis::RedisError>) {
        self.done = true;
        match e {
            None => self.node.answered(),
            Some(e) => {
                let e = Error::from(e.clone());
                self.node.stale.note(&e);
                match e.kind() {
                    ErrorKind::Timeout => self.node.stalled(self.generation, self.sent),
                    // A server error is a reply too.
                    ErrorKind::Connection => {}
                    _ => self.node.answered(),
                }
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.node.stalled(self.generation, self.sent);
        }
    }
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let flight = InFlight::new(&self.node, self.generation);
            let r = self.inner.req_packed_command(cmd).await;
            flight.finish(r.as_ref().err());
            let v = r?;
            // A server error comes back as a value (the caller's `query_async` turns it into
            // an error).
            self.node.stale.note_values(std::slice::from_ref(&v));
            match v {
                Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::Ask) => {
                    let e = redis::RedisError::from(e);
                    let Some(mut target) = self.ask_target(&e) else {
                        return Err(e);
                    };
                    let reply = target.asking(cmd).await;
                    self.asked = Some(Box::new(target));
                    reply
                }
                v => {
                    if is_script_load(cmd) && !matches!(v, Value::ServerError(_)) {
                        if let Some(target) = self.asked.as_mut() {
                            // Loading needs no ASKING (it names no key).
                            target.inner.req_packed_command(cmd).await?;
                        }
                    }
                    Ok(v)
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let flight = InFlight::new(&self.node, self.generation);
            let r = self.inner.req_packed_commands(cmd, offset, count).await;
            flight.finish(r.as_ref().err());
            let mut values = r?;
            self.node.stale.note_values(&values);
            // A plain pipeline (not a transaction: its replies are one per command) whose
            // commands were refused with ASK: each of those runs again on the importing node,
            // right after `ASKING`. Each command runs where its key is now, as it would have
            // alone; a transaction is never split (its `ASK` fails it, retryably).
            if offset == 0 && count == cmd.len() && values.len() == count {
                for (i, c) in cmd.cmd_iter().enumerate() {
                    let Some(Value::ServerError(e)) = values.get(i) else {
                        continue;
                    };
                    if e.kind() != Some(redis::ServerErrorKind::Ask) {
                        continue;
                    }
                    let e = redis::RedisError::from(e.clone());
                    let Some(mut target) = self.ask_target(&e) else {
                        continue;
                    };
                    values[i] = target.asking(c).await?;
                }
            }
            Ok(values)
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// Whether `cmd` is `SCRIPT LOAD`.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(b) => Some(b),
        _ => None,
    });
    matches!(
        (args.next(), args.next()),
        (Some(a), Some(b)) if a.eq_ignore_ascii_case(b"SCRIPT") && b.eq_ignore_ascii_case(b"LOAD")
    )
}

impl NodeConn {
    /// The connection of the node an `ASK` redirect names (a slot being migrated there, whose
    /// key is gone from here), on a cluster.
    fn ask_target(&self, e: &redis::RedisError) -> Option<NodeConn> {
        let (addr, _slot) = e.redirect_node()?;
        let node = self.node.redirects()?.node_at(addr)?;
        Some(node.conn())
    }

    /// `ASKING` then `cmd`, in one pipeline on this connection (a multiplexed connection
    /// writes a pipeline in one piece, so nothing of another task's runs in between: `ASKING`
    /// applies to the very next command only). A server error comes back as a value.
    async fn asking(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut p = redis::pipe();
        p.cmd("ASKING").ignore().add_command(cmd.clone());
        let flight = InFlight::new(&self.node, self.generation);
        let r = self.inner.req_packed_commands(&p, 1, 1).await;
        flight.finish(r.as_ref().err());
        let values = r?;
        self.node.stale.note_values(&values);
        match values.into_iter().next() {
            Some(v) => Ok(v),
            None => Err(redis::RedisError::from(std::io::Error::other(
                "no reply after ASKING",
            ))),
        }
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
