//! What a pub/sub hub hands its subscribers, on every backend (Redis pub/sub, PostgreSQL
//! `LISTEN`): the messages, the requests to the hub's task, and a subscription that leaves on
//! drop.

use tokio::sync::{mpsc, oneshot};

use crate::error::Error;

/// What a waiter gets from the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubMsg {
    /// A message on the subscribed channel.
    Message(String),
    /// The pub/sub connection was re-established: messages may have been missed.
    Reconnected,
}

/// A function the hub calls with each of a subscription's messages, on its own task (so it
/// must not block): `false` once its owner is gone (the hub then forgets it).
pub(crate) type Call = std::sync::Arc<dyn Fn(HubMsg) -> bool + Send + Sync>;

/// Where a hub delivers a subscription's messages.
pub(crate) enum Sink {
    /// A mailbox its owner reads ([`Subscription::rx`]).
    Mailbox(crate::util::mailbox::Sender<HubMsg>),
    /// A function called on the hub's task: one task hop less than a mailbox read by a task
    /// that then wakes another (a wake-one group's waiters, `util::wake`).
    Call(Call),
}

impl Sink {
    /// Delivers `msg`: `false` when the subscriber is gone.
    pub(crate) fn deliver(&self, msg: HubMsg) -> bool {
        match self {
            Sink::Mailbox(tx) => tx.send(msg).is_ok(),
            Sink::Call(f) => f(msg),
        }
    }
}

/// A request to a hub task (the Redis hub here, or PostgreSQL's `LISTEN` hub).
pub(crate) enum HubCmd {
    Subscribe {
        channel: String,
        id: u64,
        tx: Sink,
        ack: oneshot::Sender<Result<(), Error>>,
    },
    Unsubscribe {
        channel: String,
        id: u64,
    },
}

/// A confirmed subscription to one channel; unsubscribes on drop (without blocking).
pub(crate) struct Subscription {
    pub rx: crate::util::mailbox::Receiver<HubMsg>,
    channel: String,
    id: u64,
    cmds: mpsc::UnboundedSender<HubCmd>,
}

impl Subscription {
    /// A subscription whose drop tells `cmds` to remove waiter `id` of `channel`.
    pub(crate) fn new(
        rx: crate::util::mailbox::Receiver<HubMsg>,
        channel: String,
        id: u64,
        cmds: mpsc::UnboundedSender<HubCmd>,
    ) -> Subscription {
        Subscription {
            rx,
            channel,
            id,
            cmds,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.cmds.send(HubCmd::Unsubscribe {
            channel: std::mem::take(&mut self.channel),
            id: self.id,
        });
    }
}
