//! The pub/sub hub: one pub/sub connection per client that wakes waiting backups, one of the
//! three kinds of connection a client keeps (see [`super::connection`] for why three).
//! Subscriptions are reference counted per channel; `subscribe` returns only once the server
//! confirmed, so a waiter that subscribes and *then* reads the state cannot miss a message
//! published in between. After a reconnect every waiter is told to observe again, because
//! messages sent while the connection was down are gone.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

#[cfg(feature = "cluster")]
use redis::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::ConnSettings;
use crate::error::Error;
use crate::util::pubsub::{Call, HubCmd, HubMsg, Sink, Subscription};

/// The shared pub/sub connection.
pub(crate) struct Hub {
    cmds: mpsc::UnboundedSender<HubCmd>,
    next_id: std::sync::atomic::AtomicU64,
    /// Wake-one groups by channel ([`crate::util::wake`]).
    pub(super) groups: crate::util::wake::Groups,
    /// Wake channels kept subscribed between waits ([`crate::util::parked`]).
    pub(crate) parked: crate::util::parked::Parked,
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
        tracker.spawn(hub_task(source, settings, rx, cancel));
        Hub {
            cmds: tx,
            next_id: std::sync::atomic::AtomicU64::new(1),
            groups: Default::default(),
            parked: Default::default(),
        }
    }

    /// Subscribes to `channel` and returns once the server confirmed the subscription.
    ///
    /// # Errors
    /// A connection error if the pub/sub connection is down; the caller retries with backoff.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        self.subscribe_to(channel, None).await
    }

    /// As [`Hub::subscribe`], the messages going to `call` (on the hub's task) instead of the
    /// subscription's mailbox, which stays empty; dropping the subscription unsubscribes.
    pub(crate) async fn subscribe_calling(
        &self,
        channel: &str,
        call: Call,
    ) -> Result<Subscription, Error> {
        self.subscribe_to(channel, Some(call)).await
    }

    async fn subscribe_to(&self, channel: &str, call: Option<Call>) -> Result<Subscription, Error> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = crate::util::mailbox::unbounded();
        let tx = match call {
            Some(f) => Sink::Call(f),
            None => Sink::Mailbox(tx),
        };
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

type Waiters = HashMap<String, Vec<(u64, Sink)>>;

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
                            list.retain(|(_, tx)| tx.deliver(HubMsg::Message(payload.clone())));
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
    // A failure anywhere below still answers every subscriber of this batch, with the
    // connection's error: an ack dropped unanswered reads as `Error::Stopped` (the hub is
    // gone, nothing to retry), and a waiting backup whose subscription met a dying connection
    // would quit instead of retrying once the hub has reconnected.
    let mut failure = None;
    for chunk in unwanted.chunks(256) {
        match tokio::time::timeout(limit, sink.unsubscribe(chunk)).await {
            Ok(Ok(())) => {
                for c in chunk {
                    subscribed.remove(c);
                }
            }
            Ok(Err(e)) => {
                failure = Some(Error::from(e));
                break;
            }
            Err(_) => {
                failure = Some(Error::Timeout {
                    during: "unsubscribing",
                });
                break;
            }
        }
    }
    let mut wanted: Vec<String> = pending
        .iter()
        .filter(|(c, _, _)| waiters.contains_key(c))
        .map(|(c, _, _)| c.clone())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    // Nothing more is sent on a connection that already failed.
    if failure.is_some() {
        wanted.clear();
    }
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
            tx.deliver(HubMsg::Reconnected);
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
        crate::util::wake::join(&self.groups, channel, |call| {
            self.subscribe_calling(channel, call)
        })
        .await
    }

    /// This client's waiters on `channel`, joined, if there are any (see
    /// [`crate::util::wake::join_waiting`]).
    pub(crate) fn waiting(&self, channel: &str) -> Option<crate::util::wake::WakeOne> {
        crate::util::wake::join_waiting(&self.groups, channel)
    }

    /// As [`Hub::wake_one`], in the group `line` of the channel's waiters (a subscription of
    /// its own, so each message wakes one waiter of every line).
    ///
    /// # Errors
    /// As [`Hub::subscribe`].
    pub(crate) async fn wake_one_in(
        &self,
        channel: &str,
        line: &str,
    ) -> Result<crate::util::wake::WakeOne, Error> {
        let key = crate::util::wake::line_key(channel, line);
        crate::util::wake::join(&self.groups, &key, |call| {
            self.subscribe_calling(channel, call)
        })
        .await
    }

    /// As [`Hub::waiting`], in the group `line`.
    pub(crate) fn waiting_in(
        &self,
        channel: &str,
        line: &str,
    ) -> Option<crate::util::wake::WakeOne> {
        crate::util::wake::join_waiting(&self.groups, &crate::util::wake::line_key(channel, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ConnSettings {
        ConnSettings {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_millis(500),
            pool_size: 2,
        }
    }

    fn subscribe(channel: &str, id: u64) -> (HubCmd, oneshot::Receiver<Result<(), Error>>) {
        let (tx, _rx) = crate::util::mailbox::unbounded();
        let (ack, acked) = oneshot::channel();
        let cmd = HubCmd::Subscribe {
            channel: channel.into(),
            id,
            tx: Sink::Mailbox(tx),
            ack,
        };
        (cmd, acked)
    }

    /// A batch that unsubscribes a channel and subscribes another on a connection that died:
    /// the UNSUBSCRIBE fails first. The subscriber must hear a retryable connection error.
    /// Before, the batch returned at the failed UNSUBSCRIBE and dropped the ack, which the
    /// subscriber read as `Error::Stopped` (not retryable): a waiting backup whose wake channel
    /// was being subscribed while Redis crashed quit, and its job was lost (chaos seed 6).
    #[tokio::test]
    async fn a_failed_unsubscribe_answers_the_batch_subscribers_with_a_retryable_error() {
        // A private redis-server started here (the transport may not use the `testing`
        // fixtures: tests/layering.rs), on a free loopback port.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while client.get_multiplexed_async_connection().await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server never answered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let source = HubSource::Plain(Box::new(client));
        let mut link = Link::open(&source, &settings()).await.expect("open");
        let mut waiters = Waiters::new();
        let mut subscribed = HashSet::new();
        let (first, acked) = subscribe("old", 1);
        apply_batch(
            &mut link,
            &mut waiters,
            &mut subscribed,
            vec![first],
            &settings(),
        )
        .await
        .expect("subscribed");
        assert!(matches!(acked.await, Ok(Ok(()))));
        server.kill().expect("kill redis-server");
        server.wait().expect("reap redis-server");
        let (second, acked) = subscribe("new", 2);
        let batch = vec![
            HubCmd::Unsubscribe {
                channel: "old".into(),
                id: 1,
            },
            second,
        ];
        let applied =
            apply_batch(&mut link, &mut waiters, &mut subscribed, batch, &settings()).await;
        assert!(applied.is_err(), "the connection is gone");
        match acked.await {
            Ok(Err(e)) => assert!(e.is_retryable(), "{e:?}"),
            other => panic!("the subscriber was not answered with a retryable error: {other:?}"),
        }
    }
}
