//! The three kinds of connection one client keeps, and why.
//!
//! - **One multiplexed connection** (a `ConnectionManager`, which reconnects by itself) for plain
//!   reads that only decide whether to keep waiting. It is never used for `WATCH`: on a
//!   multiplexed connection another task's `EXEC` would silently end our `WATCH` (and vice
//!   versa), which is exactly how the original granted one attempt twice.
//! - **A small pool of dedicated connections** for transitions (`WATCH … EXEC`). A connection is
//!   checked out by one transition at a time and never reconnects underneath it: if anything goes
//!   wrong mid-transaction the connection is dropped, and closing it ends its `WATCH` on the
//!   server. Waiting backups hold none, so thousands of waiting jobs share a handful.
//! - **One pub/sub connection** (the [`Hub`]) that wakes waiting backups. Subscriptions are
//!   reference counted per channel; `subscribe` returns only once the server confirmed, so a
//!   waiter that subscribes and *then* reads the state cannot miss a message published in
//!   between. After a reconnect every waiter is told to observe again, because messages sent
//!   while the connection was down are gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::ConnSettings;
use crate::error::Error;
use crate::util::lock;
use crate::util::pubsub::{HubCmd, HubMsg, Subscription};

/// The pool of dedicated connections for `WATCH`/`MULTI`/`EXEC`.
pub(crate) struct Pool {
    client: redis::Client,
    settings: ConnSettings,
    /// Idle connections, each with whether a `WATCH` may still be active on it (a deferred
    /// `UNWATCH`, sent at the start of its next pipeline).
    idle: Mutex<Vec<(MultiplexedConnection, bool)>>,
    permits: Arc<Semaphore>,
    /// Marked when a reply says the key may be served elsewhere now ([`super::route`]).
    stale: Arc<super::route::Stale>,
    /// The node's publish command ([`super::route::Node::publish`]).
    publish: &'static str,
}

impl Pool {
    pub(crate) fn new(
        client: redis::Client,
        settings: ConnSettings,
        stale: Arc<super::route::Stale>,
        publish: &'static str,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            permits: Arc::new(Semaphore::new(settings.pool_size)),
            client,
            settings,
            idle: Mutex::new(Vec::new()),
            stale,
            publish,
        })
    }

    /// The client the pool's connections are opened with.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Checks out a dedicated connection, opening one if none is idle; gives up at `deadline`
    /// (a starved pool or a hanging connect must not hold a caller past its own deadline).
    ///
    /// # Errors
    /// [`Error::Timeout`] at `deadline`; connection errors from opening a connection.
    ///
    /// # Cancel safety
    /// Cancel safe: a permit or connection taken is returned on drop.
    pub(crate) async fn get(self: &Arc<Self>, deadline: Instant) -> Result<Dedicated, Error> {
        let timeout = || Error::Timeout {
            during: "waiting for a dedicated connection",
        };
        // Waiting for a permit is what thousands of workers do at once (all started together,
        // or woken by one failure), so that wait is kept small: opening a connection is a big
        // future, boxed and allocated only by the few that get a permit and find no idle one.
        // A timeout here (every permit held by transitions stuck on the node, or a connect
        // that hangs) is what a hung server looks like: the routing is marked stale, so a
        // cluster asks again who serves the slot.
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                self.stale.set();
                timeout()
            })?
            .map_err(|_| Error::Stopped)?;
        let idle = lock(&self.idle).pop();
        let (conn, unwatch_first) = match idle {
            Some(c) => c,
            None => {
                let config = super::async_config(&self.settings);
                let open = Box::pin(
                    self.client
                        .get_multiplexed_async_connection_with_config(&config),
                );
                let conn = match tokio::time::timeout_at(deadline, open).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        let e = Error::from(e);
                        self.stale.note(&e);
                        return Err(e);
                    }
                    Err(_) => {
                        self.stale.set();
                        return Err(timeout());
                    }
                };
                (conn, false)
            }
        };
        Ok(Dedicated {
            conn: Some(conn),
            clean: false,
            unwatch_first,
            deadline: None,
            sent: None,
            pool: self.clone(),
            _permit: permit,
        })
    }

    /// The settings the pool's connections are opened with.
    pub(crate) fn settings(&self) -> &ConnSettings {
        &self.settings
    }

    /// Forgets idle connections (after one failed, the others very likely point at the same dead
    /// server; reopening beats a string of errors).
    pub(crate) fn flush(&self) {
        lock(&self.idle).clear();
    }
}

/// A dedicated connection checked out of the [`Pool`].
///
/// It goes back to the pool only if the transaction on it ended cleanly (`EXEC` or `UNWATCH`
/// answered); otherwise it is dropped, which closes the socket and with it any `WATCH`.
pub(crate) struct Dedicated {
    conn: Option<MultiplexedConnection>,
    clean: bool,
    /// A `WATCH` may be active (its `UNWATCH` was deferred): the next pipeline starts with
    /// `UNWATCH`, so no `EXEC` can ever run under a stale `WATCH`.
    unwatch_first: bool,
    /// No request on this connection may outlive it (see [`Dedicated::set_deadline`]).
    deadline: Option<Instant>,
    /// When the request now on the wire left (`None` between requests): a `Dedicated`
    /// dropped while one waits (its caller's deadline passed) reports it like a timeout.
    sent: Option<Instant>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
}

impl Dedicated {
    /// Bounds every later request on this connection: each one times out at the earlier of
    /// the response timeout and `deadline` (a lease holder's requests must not outlive its
    /// lease).
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// Runs a pipeline (or transaction) on this connection. Any error leaves the connection
    /// unusable (its `WATCH` state is unknown), so it will be dropped, not pooled.
    ///
    /// Idle pooled connections are dropped too when this one failed with a connection error
    /// (they very likely point at the same dead server), but not after a timeout: a slow reply
    /// says nothing about the other connections, and reopening them all would only add load.
    async fn query<T: redis::FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<T, Error> {
        self.clean = false;
        let conn = self.conn.as_mut().ok_or(Error::Stopped)?;
        self.sent = Some(Instant::now());
        let fut = pipe.query_async(conn);
        let result = match self.deadline {
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r.map_err(Error::from),
                Err(_) => Err(Error::Timeout {
                    during: "waiting for a reply before the lease deadline",
                }),
            },
            None => fut.await.map_err(Error::from),
        };
        self.sent = None;
        match result {
            Ok(v) => {
                self.unwatch_first = false;
                Ok(v)
            }
            Err(e) => {
                self.conn = None;
                if e.kind() == crate::ErrorKind::Connection {
                    self.pool.flush();
                }
                self.pool.stale.note(&e);
                Err(e)
            }
        }
    }

    /// Round trip 1 of a transition: `WATCH keys` followed by the reads of `reads`, in one
    /// pipeline. Returns the replies of `reads` (server errors as `Value::ServerError`, so one
    /// bad key is reported precisely).
    ///
    /// The `WATCH` reply is checked: a refused `WATCH` (an ACL without `+watch`, say) would leave
    /// the following `MULTI … EXEC` unguarded, so it is an error naming the command, with the
    /// server's classification (`NOPERM` is a non-retryable `Permission` error). On any error the
    /// connection is not returned to the pool (no `WATCH` may linger on it).
    pub(crate) async fn watch_read(
        &mut self,
        keys: &[&str],
        reads: impl FnOnce(&mut redis::Pipeline),
    ) -> Result<Vec<redis::Value>, Error> {
        let mut p = self.pipe();
        p.cmd("WATCH");
        for k in keys {
            p.arg(*k);
        }
        reads(&mut p);
        let mut values: Vec<redis::Value> = self.query(&p).await?;
        self.pool.stale.note_values(&values);
        if values.is_empty() {
            return Err(Error::UnexpectedReply {
                context: "WATCH",
                reply: "no reply".into(),
            });
        }
        match values.remove(0) {
            redis::Value::Okay => Ok(values),
            redis::Value::SimpleString(s) if s == "OK" => Ok(values),
            redis::Value::ServerError(e) => {
                let e = super::classify::refused("WATCH", &e);
                self.pool.stale.note(&e);
                Err(e)
            }
            other => Err(super::classify::unexpected("WATCH", &other)),
        }
    }

    /// Runs `script` (whose source is `code`) with `keys` and `args` (`EVALSHA`, loading the
    /// script on `NOSCRIPT`) and
    /// pipelines `WAIT wait.replicas timeout` right after it on this connection (a script may
    /// not call `WAIT`). Returns the script's reply (a server error as `Value::ServerError`)
    /// and how many replicas acknowledged. The `WAIT` timeout is capped as in
    /// [`exec_then_wait`](Self::exec_then_wait).
    pub(crate) async fn script_then_wait(
        &mut self,
        script: &redis::Script,
        code: &str,
        keys: &[&str],
        args: &[String],
        wait: ReplicaWait,
    ) -> Result<(redis::Value, u64), Error> {
        let cap = self.pool.settings.response_timeout * 3 / 4;
        let build = |p: &mut redis::Pipeline| {
            p.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(crate::util::time::ms(wait.timeout.min(cap)).max(1));
        };
        let mut p = self.pipe();
        build(&mut p);
        let mut replies: Vec<redis::Value> = self.query(&p).await?;
        if matches!(replies.first(), Some(redis::Value::ServerError(e)) if e.kind() == Some(redis::ServerErrorKind::NoScript))
        {
            // Loaded once per server (after a restart or SCRIPT FLUSH); the WAIT that ran
            // after the refusal counted nothing of ours.
            let mut load = self.pipe();
            load.cmd("SCRIPT").arg("LOAD").arg(code);
            let _: Vec<redis::Value> = self.query(&load).await?;
            let mut p = self.pipe();
            build(&mut p);
            replies = self.query(&p).await?;
        }
        self.clean = true;
        let mut it = replies.into_iter();
        let (Some(reply), Some(acked)) = (it.next(), it.next()) else {
            return Err(Error::UnexpectedReply {
                context: "a script and WAIT",
                reply: "fewer than 2 replies".into(),
            });
        };
        let acked = match acked {
            redis::Value::Int(n) if n >= 0 => n as u64,
            redis::Value::ServerError(e) => return Err(super::classify::refused("WAIT", &e)),
            other => return Err(super::classify::unexpected("WAIT", &other)),
        };
        if let redis::Value::ServerError(e) = &reply {
            return Err(super::classify::from_server_error(e));
        }
        Ok((reply, acked))
    }

    /// The command that wakes subscribers on this connection's node: `PUBLISH`, or `SPUBLISH`
    /// on a cluster.
    pub(crate) fn publish(&self) -> &'static str {
        self.pool.publish
    }

    /// A transaction to fill for [`exec`](Self::exec): the pipeline already holds `MULTI`.
    pub(crate) fn transaction(&self) -> redis::Pipeline {
        let mut p = self.pipe();
        p.cmd("MULTI");
        p
    }

    /// Sends `tx` (from [`transaction`](Self::transaction), with the transaction's commands
    /// added) with `EXEC`, in a single round trip.
    ///
    /// Returns `None` when `EXEC` answered nil (a watched key changed). redis-rs' own transaction
    /// mode drops the `QUEUED` replies, so a command refused at queue time (`READONLY`, `OOM`,
    /// `NOPERM`) would surface only as a bare `EXECABORT`; sending `MULTI`/`EXEC` ourselves keeps
    /// those replies, and the first refusal is reported as the error. Either way the `EXEC` reply
    /// ended the `WATCH`, so the connection is reusable.
    pub(crate) async fn exec(
        &mut self,
        p: redis::Pipeline,
    ) -> Result<Option<Vec<redis::Value>>, Error> {
        Ok(self.exec_then_wait(p, None).await?.0)
    }

    /// [`exec`](Self::exec), with `WAIT replicas timeout` pipelined right after the `EXEC` when
    /// `wait` is set (inside `MULTI` a `WAIT` would return at once). Returns the `EXEC` outcome
    /// and, with `wait`, how many replicas acknowledged every write of this connection so far.
    ///
    /// The `WAIT` timeout is capped at three quarters of the response timeout, so a slow
    /// acknowledgement is never mistaken for a lost reply (which would make the `EXEC`'s outcome
    /// unknown).
    pub(crate) async fn exec_then_wait(
        &mut self,
        mut p: redis::Pipeline,
        wait: Option<ReplicaWait>,
    ) -> Result<(Option<Vec<redis::Value>>, Option<u64>), Error> {
        p.cmd("EXEC");
        if let Some(w) = wait {
            let cap = self.pool.settings.response_timeout * 3 / 4;
            p.cmd("WAIT")
                .arg(w.replicas)
                .arg(crate::util::time::ms(w.timeout.min(cap)).max(1));
        }
        let mut replies: Vec<redis::Value> = self.query(&p).await?;
        let acked = match wait {
            None => None,
            Some(_) => match replies.pop() {
                Some(redis::Value::Int(n)) if n >= 0 => Some(n as u64),
                Some(redis::Value::ServerError(e)) => {
                    return Err(super::classify::refused("WAIT", &e))
                }
                Some(other) => return Err(super::classify::unexpected("WAIT", &other)),
                None => {
                    return Err(Error::UnexpectedReply {
                        context: "WAIT",
                        reply: "no reply".into(),
                    })
                }
            },
        };
        Ok((self.exec_outcome(replies)?, acked))
    }

    /// The outcome of a pipeline that ended with `EXEC` (see [`exec`](Self::exec)).
    fn exec_outcome(
        &mut self,
        mut replies: Vec<redis::Value>,
    ) -> Result<Option<Vec<redis::Value>>, Error> {
        let exec = replies.pop();
        self.clean = true;
        match exec {
            Some(redis::Value::Nil) => Ok(None),
            Some(redis::Value::Array(items)) => Ok(Some(items)),
            Some(redis::Value::ServerError(err)) => {
                let refused = replies.iter().find_map(|v| match v {
                    redis::Value::ServerError(e) => Some(e),
                    _ => None,
                });
                let e = super::classify::from_server_error(refused.unwrap_or(&err));
                self.pool.stale.note(&e);
                Err(e)
            }
            Some(other) => Err(super::classify::unexpected("EXEC", &other)),
            None => Err(Error::UnexpectedReply {
                context: "EXEC",
                reply: "no reply".into(),
            }),
        }
    }

    /// Ends a decision that writes nothing, without a round trip: the connection goes back to
    /// the pool marked so that its next pipeline starts with `UNWATCH` (see
    /// [`query`](Self::query)). Every `WATCH` still ends in `EXEC`, `UNWATCH` or a dropped
    /// connection, and no `EXEC` can run under a stale one; a `WATCH` left active meanwhile only
    /// costs the server a few bytes.
    pub(crate) fn defer_unwatch(&mut self) {
        if self.conn.is_some() {
            self.unwatch_first = true;
            self.clean = true;
        }
    }

    /// A pipeline for this connection: server errors come back as values, and a deferred
    /// `UNWATCH` (see [`defer_unwatch`](Self::defer_unwatch)) goes first, its reply dropped.
    fn pipe(&self) -> redis::Pipeline {
        let mut p = redis::pipe();
        p.ignore_errors();
        if self.unwatch_first {
            p.cmd("UNWATCH").ignore();
        }
        p
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        if self
            .sent
            .is_some_and(|t| t.elapsed() >= self.pool.settings.response_timeout / 4)
        {
            // Dropped while a request went unanswered for a while: as a timeout (the caller
            // gave up first). The connection itself is not pooled (`clean` is false).
            self.pool.stale.set();
        }
        if self.clean {
            if let Some(c) = self.conn.take() {
                lock(&self.pool.idle).push((c, self.unwatch_first));
            }
        }
    }
}

/// Checks every reply inside an `EXEC`: a command can fail inside a transaction that still
/// applies the others, so "EXEC answered" alone proves nothing.
pub(crate) fn check_replies(
    context: &'static str,
    replies: &[Value],
    expect: &[Expect],
) -> Result<(), Error> {
    if replies.len() != expect.len() {
        return Err(Error::UnexpectedReply {
            context,
            reply: format!("{} replies instead of {}", replies.len(), expect.len()),
        });
    }
    for (v, e) in replies.iter().zip(expect) {
        let ok = match (e, v) {
            (_, Value::ServerError(err)) => return Err(super::classify::from_server_error(err)),
            (Expect::Ok, Value::Okay) => true,
            (Expect::Ok, Value::SimpleString(s)) => s == "OK",
            (Expect::Int, Value::Int(_)) => true,
            _ => false,
        };
        if !ok {
            return Err(super::classify::unexpected(context, v));
        }
    }
    Ok(())
}

pub(crate) enum Expect {
    /// `OK`.
    Ok,
    /// Any integer.
    Int,
}

/// `WAIT replicas timeout` after a write: how many replicas must acknowledge it, and how long
/// to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

/// The shared pub/sub connection.
pub(crate) struct Hub {
    cmds: mpsc::UnboundedSender<HubCmd>,
    next_id: std::sync::atomic::AtomicU64,
    /// Wake-one groups by channel ([`crate::util::wake`]).
    pub(super) groups: crate::util::wake::Groups,
    pub(super) tracker: tokio_util::task::TaskTracker,
    pub(super) cancel: CancellationToken,
}

/// Where the hub subscribes.
#[derive(Clone)]
pub(crate) enum HubSource {
    /// One server: `SUBSCRIBE` on a RESP2 pub/sub connection (messages come from `PUBLISH`).
    Plain(Box<redis::Client>),
    /// A cluster (feature `cluster`): `SSUBSCRIBE` through redis' cluster client over RESP3,
    /// which sends each channel to the node that owns its slot (messages come from
    /// `SPUBLISH`); built from the seed nodes' connection settings.
    #[cfg(feature = "cluster")]
    Sharded {
        seeds: Vec<redis::ConnectionInfo>,
        /// Changes when baton's slot map names other primaries (a failover, a reshard): the
        /// hub's waiters then look again, since messages published meanwhile may be lost.
        /// Holds the map's primaries, which the hub connects through rather than the seeds.
        moved: tokio::sync::watch::Receiver<super::cluster::Primaries>,
    },
    /// A Sentinel-monitored primary (feature `sentinel`): `SUBSCRIBE` on whichever server is
    /// the primary, moving there when it changes.
    #[cfg(feature = "sentinel")]
    Followed(std::sync::Arc<super::follow::Followed>),
}

/// What a hub link delivers.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
enum Incoming {
    /// A message on a channel.
    Message { channel: String, payload: String },
    /// The server ended a subscription by itself (sharded pub/sub: the channel's slot moved to
    /// another node). Messages may have been missed; the channel is subscribed again.
    Dropped(String),
    /// A node's connection dropped and is being re-established by the cluster client, which
    /// subscribes again by itself: messages may have been missed.
    Interrupted,
    /// The slot map names other primaries now (a failover, a reshard): every channel is
    /// subscribed again (the cluster client sends each to its slot's owner) and every waiter
    /// looks again.
    Moved,
    /// Nothing for the hub (a subscription confirmation, say).
    Nothing,
}

/// The hub's live connection.
enum Link {
    Plain {
        sink: redis::aio::PubSubSink,
        stream: redis::aio::PubSubStream,
        /// For a followed primary: changes when the primary does (the link is then dropped
        /// and opened again on the new one).
        switched: Option<tokio::sync::watch::Receiver<u64>>,
    },
    #[cfg(feature = "cluster")]
    Sharded {
        conn: redis::cluster_async::ClusterConnection,
        pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
        moved: tokio::sync::watch::Receiver<super::cluster::Primaries>,
    },
}

impl Link {
    async fn open(source: &HubSource, settings: &ConnSettings) -> Result<Link, Error> {
        match source {
            HubSource::Plain(client) => {
                let _ = settings;
                let (sink, stream) = client.get_async_pubsub().await?.split();
                Ok(Link::Plain {
                    sink,
                    stream,
                    switched: None,
                })
            }
            #[cfg(feature = "sentinel")]
            HubSource::Followed(followed) => {
                let mut switched = followed.switched();
                switched.mark_unchanged();
                let (sink, stream) = followed.client().get_async_pubsub().await?.split();
                Ok(Link::Plain {
                    sink,
                    stream,
                    switched: Some(switched),
                })
            }
            #[cfg(feature = "cluster")]
            HubSource::Sharded { seeds, moved } => {
                let mut moved = moved.clone();
                // The primaries of baton's last slot map, when known: redis' cluster client
                // waits for every seed it is given, so a seed that hangs (a paused node, a
                // demoted primary) would hold every reconnect until its connect timeout.
                let live = moved.borrow_and_update().clone();
                let seeds = if live.is_empty() {
                    seeds.clone()
                } else {
                    live.to_vec()
                };
                let (tx, pushes) = mpsc::unbounded_channel();
                let conn = redis::cluster::ClusterClientBuilder::new(seeds)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .connection_timeout(settings.connect_timeout)
                    .response_timeout(settings.response_timeout)
                    .push_sender(tx)
                    .build()?
                    .get_async_connection()
                    .await?;
                Ok(Link::Sharded {
                    conn,
                    pushes,
                    moved,
                })
            }
        }
    }

    /// Subscribes to every channel of `chunk`; returns once the server confirmed.
    async fn subscribe(&mut self, chunk: &[String]) -> redis::RedisResult<()> {
        match self {
            Link::Plain { sink, .. } => sink.subscribe(chunk).await,
            // One SSUBSCRIBE per channel: a multi-channel one must stay within one slot.
            #[cfg(feature = "cluster")]
            Link::Sharded { conn, .. } => {
                for c in chunk {
                    conn.ssubscribe(c).await?;
                }
                Ok(())
            }
        }
    }

    async fn unsubscribe(&mut self, chunk: &[String]) -> redis::RedisResult<()> {
        match self {
            Link::Plain { sink, .. } => sink.unsubscribe(chunk).await,
            #[cfg(feature = "cluster")]
            Link::Sharded { conn, .. } => {
                for c in chunk {
                    conn.sunsubscribe(c).await?;
                }
                Ok(())
            }
        }
    }

    /// The next thing the server pushed; `None` when the link is gone.
    async fn next(&mut self) -> Option<Incoming> {
        match self {
            Link::Plain {
                stream, switched, ..
            } => {
                let msg = match switched {
                    Some(sw) => tokio::select! {
                        msg = stream.next() => msg,
                        // A new primary: this link is done, the hub opens one there.
                        _ = sw.changed() => None,
                    },
                    None => stream.next().await,
                };
                msg.map(|msg| Incoming::Message {
                    channel: msg.get_channel_name().to_string(),
                    payload: String::from_utf8_lossy(msg.get_payload_bytes()).into_owned(),
                })
            }
            #[cfg(feature = "cluster")]
            Link::Sharded { pushes, moved, .. } => tokio::select! {
                push = pushes.recv() => push.map(sharded_push),
                changed = moved.changed() => match changed {
                    Ok(()) => Some(Incoming::Moved),
                    // The router is gone: so is the client.
                    Err(_) => None,
                },
            },
        }
    }
}

/// What a RESP3 push of sharded pub/sub means to the hub.
#[cfg(feature = "cluster")]
fn sharded_push(push: redis::PushInfo) -> Incoming {
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    };
    match push.kind {
        redis::PushKind::SMessage => match (text(push.data.first()), text(push.data.get(1))) {
            (Some(channel), Some(payload)) => Incoming::Message { channel, payload },
            _ => Incoming::Nothing,
        },
        redis::PushKind::SUnsubscribe => match text(push.data.first()) {
            Some(channel) => Incoming::Dropped(channel),
            None => Incoming::Nothing,
        },
        redis::PushKind::Disconnection => Incoming::Interrupted,
        _ => Incoming::Nothing,
    }
}

impl Hub {
    /// Starts the hub task; it ends when `cancel` fires or the last `Hub` handle drops.
    pub(crate) fn start(
        source: HubSource,
        settings: ConnSettings,
        cancel: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Hub {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(hub_task(source, settings, rx, cancel.clone()));
        Hub {
            cmds: tx,
            next_id: std::sync::atomic::AtomicU64::new(1),
            groups: Default::default(),
            tracker: tracker.clone(),
            cancel,
        }
    }

    /// Subscribes to `channel` and returns once the server confirmed the subscription.
    ///
    /// # Errors
    /// A connection error if the pub/sub connection is down; the caller retries with backoff.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = crate::util::mailbox::unbounded();
        let (ack_tx, ack_rx) = oneshot::channel();
        let sub = Subscription::new(rx, channel.to_string(), id, self.cmds.clone());
        self.cmds
            .send(HubCmd::Subscribe {
                channel: channel.to_string(),
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
}

/// How the hub confirms a subscription (or says why it failed).
type Ack = oneshot::Sender<Result<(), Error>>;

type Waiters = HashMap<String, Vec<(u64, crate::util::mailbox::Sender<HubMsg>)>>;

async fn hub_task(
    source: HubSource,
    settings: ConnSettings,
    mut cmds: mpsc::UnboundedReceiver<HubCmd>,
    cancel: CancellationToken,
) {
    let mut waiters: Waiters = HashMap::new();
    // The channels the server has confirmed on the current connection.
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut backoff = crate::util::backoff::Backoff::new(settings.max_backoff);
    let mut connected_before = false;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        // A connect and a first request (a cluster client reads the slot map once connected),
        // with room for one node that hangs until its connect timeout.
        let limit = settings.connect_timeout * 2 + settings.response_timeout;
        let opened = tokio::time::timeout(limit, Link::open(&source, &settings)).await;
        let mut link = match opened {
            Ok(Ok(l)) => l,
            failed => {
                let err = match failed {
                    Ok(Err(e)) => e,
                    _ => Error::Timeout {
                        during: "opening the pub/sub connection",
                    },
                };
                tracing::warn!(error = %err, "pub/sub connection failed; retrying");
                if !back_off(&cancel, &mut cmds, &mut waiters, backoff.next_delay(), &err).await {
                    return;
                }
                continue;
            }
        };
        // Re-subscribe what waiters still want; then tell them to look again, since anything
        // published while we were disconnected is lost.
        let channels: Vec<String> = waiters.keys().cloned().collect();
        subscribed.clear();
        let mut ok = true;
        for chunk in channels.chunks(256) {
            let r =
                tokio::time::timeout(settings.response_timeout * 4, link.subscribe(chunk)).await;
            if !matches!(r, Ok(Ok(()))) {
                ok = false;
                break;
            }
        }
        if !ok {
            let err = Error::Timeout {
                during: "re-subscribing after a reconnect",
            };
            if !back_off(&cancel, &mut cmds, &mut waiters, backoff.next_delay(), &err).await {
                return;
            }
            continue;
        }
        subscribed.extend(channels);
        backoff.reset();
        if connected_before {
            notify(&waiters, None);
        }
        connected_before = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                msg = link.next() => match msg {
                    None => {
                        tracing::warn!("pub/sub connection lost; reconnecting");
                        break;
                    }
                    Some(Incoming::Message { channel, payload }) => {
                        if let Some(list) = waiters.get_mut(&channel) {
                            list.retain(|(_, tx)| tx.send(HubMsg::Message(payload.clone())).is_ok());
                        }
                    }
                    Some(Incoming::Dropped(channel)) => {
                        if !waiters.contains_key(&channel) {
                            // Our own unsubscribe, or nobody cares any more.
                            subscribed.remove(&channel);
                            continue;
                        }
                        tracing::debug!(%channel, "the server ended a subscription (slot moved); subscribing again");
                        notify(&waiters, Some(&channel));
                        let again = std::slice::from_ref(&channel);
                        let limit = settings.response_timeout * 4;
                        if !matches!(tokio::time::timeout(limit, link.subscribe(again)).await, Ok(Ok(()))) {
                            subscribed.remove(&channel);
                            break;
                        }
                    }
                    Some(Incoming::Interrupted) => notify(&waiters, None),
                    Some(Incoming::Moved) => {
                        let channels: Vec<String> = subscribed.iter().cloned().collect();
                        let limit = settings.response_timeout * 4;
                        let mut ok = true;
                        for chunk in channels.chunks(256) {
                            if !matches!(tokio::time::timeout(limit, link.subscribe(chunk)).await, Ok(Ok(()))) {
                                ok = false;
                                break;
                            }
                        }
                        notify(&waiters, None);
                        if !ok {
                            break;
                        }
                    }
                    Some(Incoming::Nothing) => {}
                },
                cmd = cmds.recv() => {
                    let Some(first) = cmd else { return };
                    // Everything queued now goes out together: at most one UNSUBSCRIBE and one
                    // SUBSCRIBE round trip for the whole batch, however many workers asked.
                    let mut batch = vec![first];
                    while batch.len() < 4096 {
                        match cmds.try_recv() {
                            Ok(c) => batch.push(c),
                            Err(_) => break,
                        }
                    }
                    if apply_batch(&mut link, &mut waiters, &mut subscribed, batch, &settings)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let err = Error::Connection {
            message: "the pub/sub connection was lost; reconnecting".into(),
            source: None,
        };
        if !back_off(&cancel, &mut cmds, &mut waiters, backoff.next_delay(), &err).await {
            return;
        }
    }
}

/// The hub's backoff between connection attempts. It keeps answering: a stop ends it at once
/// (returns `false`), and requests that arrive meanwhile are answered with `err`, so their
/// workers back off and retry instead of hanging.
async fn back_off(
    cancel: &CancellationToken,
    cmds: &mut mpsc::UnboundedReceiver<HubCmd>,
    waiters: &mut Waiters,
    delay: Duration,
    err: &Error,
) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = &mut sleep => return true,
            cmd = cmds.recv() => match cmd {
                None => return false,
                Some(HubCmd::Subscribe { ack, .. }) => {
                    let _ = ack.send(Err(err.clone()));
                }
                Some(HubCmd::Unsubscribe { channel, id }) => remove_waiter(waiters, &channel, id),
            },
        }
    }
}

/// Applies a batch of (un)subscribe requests: the bookkeeping first, in order, then one
/// UNSUBSCRIBE for channels nobody wants any more and one SUBSCRIBE for channels newly wanted.
/// Subscribers are acknowledged once the server confirmed their channel. `Err` means the
/// connection failed (the caller reconnects and re-subscribes).
async fn apply_batch(
    sink: &mut Link,
    waiters: &mut Waiters,
    subscribed: &mut HashSet<String>,
    batch: Vec<HubCmd>,
    settings: &ConnSettings,
) -> Result<(), ()> {
    let mut pending: Vec<(String, u64, Ack)> = Vec::new();
    let mut left: Vec<String> = Vec::new();
    for cmd in batch {
        match cmd {
            HubCmd::Subscribe {
                channel,
                id,
                tx,
                ack,
            } => {
                waiters.entry(channel.clone()).or_default().push((id, tx));
                if subscribed.contains(&channel) {
                    let _ = ack.send(Ok(()));
                } else {
                    pending.push((channel, id, ack));
                }
            }
            HubCmd::Unsubscribe { channel, id } => {
                remove_waiter(waiters, &channel, id);
                left.push(channel);
            }
        }
    }
    let limit = settings.response_timeout * 4;
    // Only channels this batch touched can have lost their last waiter (scanning every
    // subscribed channel per batch made the hub quadratic with thousands of jobs).
    left.sort_unstable();
    left.dedup();
    let unwanted: Vec<String> = left
        .into_iter()
        .filter(|c| subscribed.contains(c) && !waiters.contains_key(c))
        .collect();
    for chunk in unwanted.chunks(256) {
        match tokio::time::timeout(limit, sink.unsubscribe(chunk)).await {
            Ok(Ok(())) => {
                for c in chunk {
                    subscribed.remove(c);
                }
            }
            _ => return Err(()),
        }
    }
    let mut wanted: Vec<String> = pending
        .iter()
        .filter(|(c, _, _)| waiters.contains_key(c))
        .map(|(c, _, _)| c.clone())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let mut failure = None;
    for chunk in wanted.chunks(256) {
        match tokio::time::timeout(limit, sink.subscribe(chunk)).await {
            Ok(Ok(())) => subscribed.extend(chunk.iter().cloned()),
            Ok(Err(e)) => {
                failure = Some(Error::from(e));
                break;
            }
            Err(_) => {
                failure = Some(Error::Timeout {
                    during: "subscribing",
                });
                break;
            }
        }
    }
    for (channel, id, ack) in pending {
        if subscribed.contains(&channel) || !waiters.contains_key(&channel) {
            // Confirmed (or nobody waits for it any more: the ack goes nowhere).
            let _ = ack.send(Ok(()));
        } else {
            remove_waiter(waiters, &channel, id);
            let _ = ack.send(Err(failure.clone().unwrap_or(Error::Timeout {
                during: "subscribing",
            })));
        }
    }
    match failure {
        Some(_) => Err(()),
        None => Ok(()),
    }
}

/// Tells the waiters of `channel` (of every channel with `None`) that messages may have been
/// missed: they look at the state again.
fn notify(waiters: &Waiters, channel: Option<&str>) {
    let lists: Box<dyn Iterator<Item = &Vec<_>>> = match channel {
        Some(c) => Box::new(waiters.get(c).into_iter()),
        None => Box::new(waiters.values()),
    };
    for list in lists {
        for (_, tx) in list {
            let _ = tx.send(HubMsg::Reconnected);
        }
    }
}

fn remove_waiter(waiters: &mut Waiters, channel: &str, id: u64) {
    if let Some(list) = waiters.get_mut(channel) {
        list.retain(|(i, _)| *i != id);
        if list.is_empty() {
            waiters.remove(channel);
        }
    }
}

impl Hub {
    /// Joins the wake-one group of `channel` on this client, subscribing (once per group) if
    /// nobody local listens yet; returns once the subscription is confirmed, so a waiter that
    /// joins and *then* tries cannot miss a message published in between.
    ///
    /// # Errors
    /// As [`Hub::subscribe`]: the pub/sub connection is down (the caller sleeps instead).
    pub(crate) async fn wake_one(
        &self,
        channel: &str,
    ) -> Result<crate::util::wake::WakeOne, Error> {
        crate::util::wake::join(&self.groups, &self.tracker, &self.cancel, channel, || {
            self.subscribe(channel)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_checks() {
        let ok = [Value::Okay, Value::Int(1)];
        assert!(check_replies("t", &ok, &[Expect::Ok, Expect::Int]).is_ok());
        assert!(check_replies("t", &ok, &[Expect::Ok]).is_err());
        let bad = [Value::Int(0), Value::Int(1)];
        assert!(check_replies("t", &bad, &[Expect::Ok, Expect::Int]).is_err());
    }
}
