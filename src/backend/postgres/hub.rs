//! The `LISTEN` hub: one dedicated connection per client listening on the sharded `NOTIFY`
//! channels ([`channel_of`]) of its subscribers' topics, handing each notification to the
//! subscribers of its topic, and reconnecting with backoff (telling every subscriber).

#[cfg(feature = "testing")]
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::classify::classify;
use super::dedicated::{connect_dedicated, Notice};
use super::{PgTransport, Tls};
use crate::error::Error;
use crate::util::pubsub::{HubCmd, HubMsg, Subscription};
use crate::util::settings::ConnSettings;

/// How many notification channels baton's messages are spread over (see [`channel_of`]).
pub(crate) const NOTIFY_SHARDS: u64 = 64;

/// The notification channel of `topic` (a primitive's own name for what it announces, e.g. a
/// job's key): every message is `pg_notify(channel_of(topic), topic || E'\n' || message)`,
/// and the hub hands it to the subscribers of `topic`. A message never contains a newline; a
/// topic may (it is split off at the last one).
///
/// Topics are hashed onto [`NOTIFY_SHARDS`] channels `baton_0` … `baton_63`, and a client
/// `LISTEN`s only on the shards its subscribers use, so it receives a bounded share of
/// everyone else's messages instead of all of them. Not one channel per topic: every
/// `NOTIFY` makes each listening backend scan its list of channels, which would then hold
/// thousands of entries. The channel is computed here and passed to the statements as a
/// parameter (Rust cannot compute PostgreSQL's `hashtext`), with FNV-1a: fixed by its
/// definition, so clients of any version and build agree (std's hasher promises no such thing).
pub(crate) fn channel_of(topic: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in topic.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("baton_{}", hash % NOTIFY_SHARDS)
}

impl PgTransport {
    /// Subscribes to `topic` (on its channel, [`channel_of`]) and returns once the hub's
    /// connection is listening: a message committed after this returns is delivered. When the hub's
    /// connection is re-established, every subscriber gets [`HubMsg::Reconnected`] (messages
    /// may have been missed meanwhile: look again).
    ///
    /// # Errors
    /// A connection error while PostgreSQL cannot be reached (the caller retries);
    /// [`Error::Stopped`] once the client shut down.
    pub(crate) async fn subscribe(&self, topic: &str) -> Result<Subscription, Error> {
        self.subscribe_to(topic, None).await
    }

    async fn subscribe_to(
        &self,
        topic: &str,
        call: Option<crate::util::pubsub::Call>,
    ) -> Result<Subscription, Error> {
        let cmds = self.hub.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            self.tracker.spawn(listen_task(
                self.config.clone(),
                self.tls.clone(),
                self.settings.clone(),
                rx,
                self.cancel.clone(),
                #[cfg(feature = "testing")]
                self.notices_received.clone(),
            ));
            tx
        });
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = crate::util::mailbox::unbounded();
        let tx = match call {
            Some(f) => crate::util::pubsub::Sink::Call(f),
            None => crate::util::pubsub::Sink::Mailbox(tx),
        };
        let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
        let sub = Subscription::new(rx, topic.to_string(), id, cmds.clone());
        cmds.send(HubCmd::Subscribe {
            channel: topic.to_string(),
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

    /// Joins the wake-one group of `topic` on this client (see [`crate::util::wake`]): local waiters
    /// share one subscription, and each notification wakes one of them.
    ///
    /// # Errors
    /// As [`PgTransport::subscribe`].
    pub(crate) async fn wake_one(&self, topic: &str) -> Result<crate::util::wake::WakeOne, Error> {
        crate::util::wake::join(&self.groups, topic, |call| {
            self.subscribe_to(topic, Some(call))
        })
        .await
    }

    /// This client's waiters on `topic`, joined, if there are any (see
    /// [`crate::util::wake::join_waiting`]).
    pub(crate) fn waiting(&self, topic: &str) -> Option<crate::util::wake::WakeOne> {
        crate::util::wake::join_waiting(&self.groups, topic)
    }

    /// As [`PgTransport::wake_one`], in the group `line` of the topic's waiters.
    ///
    /// # Errors
    /// As [`PgTransport::subscribe`].
    pub(crate) async fn wake_one_in(
        &self,
        topic: &str,
        line: &str,
    ) -> Result<crate::util::wake::WakeOne, Error> {
        let key = crate::util::wake::line_key(topic, line);
        crate::util::wake::join(&self.groups, &key, |call| {
            self.subscribe_to(topic, Some(call))
        })
        .await
    }

    /// As [`PgTransport::waiting`], in the group `line`.
    pub(crate) fn waiting_in(&self, topic: &str, line: &str) -> Option<crate::util::wake::WakeOne> {
        crate::util::wake::join_waiting(&self.groups, &crate::util::wake::line_key(topic, line))
    }
}

/// Subscribers by topic.
type Waiters = std::collections::HashMap<String, Vec<(u64, crate::util::pubsub::Sink)>>;

/// The channels the hub listens on: how many subscribed topics each one carries.
type Shards = std::collections::HashMap<String, usize>;

/// The hub: one connection `LISTEN`ing on the channels of its subscribers' topics (see
/// [`channel_of`]), handing each notification to the subscribers of its topic; reconnects with
/// backoff, telling every subscriber. Ends when the client is cancelled or every
/// [`PgTransport`] handle is gone.
async fn listen_task(
    config: tokio_postgres::Config,
    tls: Tls,
    settings: ConnSettings,
    mut cmds: mpsc::UnboundedReceiver<HubCmd>,
    cancel: CancellationToken,
    #[cfg(feature = "testing")] received: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut waiters: Waiters = Waiters::new();
    let mut shards: Shards = Shards::new();
    let mut backoff = crate::util::backoff::Backoff::new(settings.max_backoff);
    let mut connected_before = false;
    loop {
        let opened = tokio::select! {
            _ = cancel.cancelled() => return,
            opened = listen(&config, &tls, &settings, shards.keys()) => opened,
        };
        let (client, mut notices, closed) = match opened {
            Ok(link) => link,
            Err(err) => {
                tracing::debug!(error = %err, "PostgreSQL LISTEN connection failed");
                // Subscribers asking meanwhile are told, and retry themselves.
                let wait = tokio::time::sleep(backoff.next_delay());
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = &mut wait => break,
                        cmd = cmds.recv() => match cmd {
                            Some(HubCmd::Subscribe { ack, .. }) => {
                                let _ = ack.send(Err(err.clone()));
                            }
                            Some(HubCmd::Unsubscribe { channel, id }) => {
                                remove_waiter(&mut waiters, &mut shards, &channel, id);
                            }
                            None => return,
                        },
                    }
                }
                continue;
            }
        };
        backoff.reset();
        if connected_before {
            for list in waiters.values() {
                for (_, tx) in list {
                    tx.deliver(HubMsg::Reconnected);
                }
            }
        }
        connected_before = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = closed.cancelled() => break,
                cmd = cmds.recv() => match cmd {
                    Some(HubCmd::Subscribe { channel: topic, id, tx, ack }) => {
                        let shard = channel_of(&topic);
                        if !waiters.contains_key(&topic) && !shards.contains_key(&shard) {
                            // The first topic of its shard: acknowledged once listening.
                            if let Err(e) = command(&client, &settings, "LISTEN", &shard).await {
                                let _ = ack.send(Err(e));
                                break;
                            }
                        }
                        if !waiters.contains_key(&topic) {
                            *shards.entry(shard).or_default() += 1;
                        }
                        waiters.entry(topic).or_default().push((id, tx));
                        let _ = ack.send(Ok(()));
                    }
                    Some(HubCmd::Unsubscribe { channel, id }) => {
                        if let Some(shard) = remove_waiter(&mut waiters, &mut shards, &channel, id) {
                            // The shard's last topic left. A failure leaves the connection
                            // listening for nothing it hands out, until it is re-established.
                            if let Err(e) = command(&client, &settings, "UNLISTEN", &shard).await {
                                tracing::debug!(error = %e, "PostgreSQL UNLISTEN failed");
                                break;
                            }
                        }
                    }
                    None => return,
                },
                notice = notices.recv() => match notice {
                    Some(n) => {
                        #[cfg(feature = "testing")]
                        received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // The last newline: a topic (a key) may hold newlines, a message never.
                        let Some((topic, message)) = n.payload.rsplit_once('\n') else {
                            continue;
                        };
                        if let Some(list) = waiters.get_mut(topic) {
                            list.retain(|(_, tx)| tx.deliver(HubMsg::Message(message.to_string())));
                        }
                    }
                    None => break,
                },
            }
        }
        drop(client);
    }
}

/// Removes subscriber `id` of `topic`; the topic's shard when that was its last topic (no
/// longer counted in `shards`: the caller `UNLISTEN`s).
fn remove_waiter(
    waiters: &mut Waiters,
    shards: &mut Shards,
    topic: &str,
    id: u64,
) -> Option<String> {
    let list = waiters.get_mut(topic)?;
    list.retain(|(i, _)| *i != id);
    if !list.is_empty() {
        return None;
    }
    waiters.remove(topic);
    let shard = channel_of(topic);
    let count = shards.get_mut(&shard)?;
    *count = count.saturating_sub(1);
    if *count > 0 {
        return None;
    }
    shards.remove(&shard);
    Some(shard)
}

/// `LISTEN` or `UNLISTEN` on `shard` (a name of [`channel_of`]'s, safe as an identifier), bounded
/// by the response timeout.
async fn command(
    client: &tokio_postgres::Client,
    settings: &ConnSettings,
    verb: &'static str,
    shard: &str,
) -> Result<(), Error> {
    match tokio::time::timeout(
        settings.response_timeout,
        client.batch_execute(&format!("{verb} {shard}")),
    )
    .await
    {
        Ok(result) => result.map_err(|e| classify(e, verb)),
        Err(_) => Err(Error::Timeout { during: verb }),
    }
}

/// A connection listening on `shards`: its client (dropping it closes the connection), its
/// notifications, and a token cancelled when it ends.
async fn listen(
    config: &tokio_postgres::Config,
    tls: &Tls,
    settings: &ConnSettings,
    shards: impl Iterator<Item = &String>,
) -> Result<
    (
        tokio_postgres::Client,
        mpsc::UnboundedReceiver<Notice>,
        CancellationToken,
    ),
    Error,
> {
    // Collected before the first await: the iterator borrows the hub's state.
    let script: String = shards.map(|s| format!("LISTEN {s};")).collect();
    let link = connect_dedicated(config, tls).await?;
    if !script.is_empty() {
        match tokio::time::timeout(
            settings.response_timeout,
            link.client.batch_execute(&script),
        )
        .await
        {
            Ok(result) => result.map_err(|e| classify(e, "LISTEN"))?,
            Err(_) => return Err(Error::Timeout { during: "LISTEN" }),
        }
    }
    Ok((link.client, link.notices, link.closed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_a_fixed_hash_of_the_topic_over_64_shards() {
        // Pinned: clients of every version must compute the same channel for a topic.
        assert_eq!(
            channel_of(""),
            format!("baton_{}", 0xcbf2_9ce4_8422_2325u64 % 64)
        );
        assert_eq!(
            channel_of("a"),
            format!("baton_{}", 0xaf63_dc4c_8601_ec8cu64 % 64)
        );
        let shards: std::collections::HashSet<String> = (0..4096)
            .map(|i| channel_of(&format!("baton:lock:{{{i}}}")))
            .collect();
        assert_eq!(shards.len(), 64, "every shard is used, and no other");
    }
}
