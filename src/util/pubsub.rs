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

/// A request to a hub task (the Redis hub here, or PostgreSQL's `LISTEN` hub).
pub(crate) enum HubCmd {
    Subscribe {
        channel: String,
        id: u64,
        tx: crate::util::mailbox::Sender<HubMsg>,
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
