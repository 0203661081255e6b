//! What crosses run-or-enqueue's store seam (`backend::queue`): the keys one of its scripts
//! touches ([`ItemKeys`]), what posting found ([`Enqueue`]), what a release found
//! ([`Release`]), a stored item ([`Stored`]) and how many handled items one acknowledgement
//! removes ([`ACK_GROUP`]). Leaves, below the backends, because both sides name them.

use tokio::time::Instant;

/// The keys one run-or-enqueue script touches (one hash slot).
pub(crate) struct ItemKeys<'a> {
    /// The lock.
    pub lock: &'a str,
    /// Its fence.
    pub fence: &'a str,
    /// The stream of items.
    pub items: &'a str,
}

/// What posting an item did (`Backend::queue_enqueue_or_acquire`); in both cases the item was added, with id `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// The lock is ours with this fencing token; `sent` is when the request left.
    Granted {
        fence: u64,
        sent: Instant,
        id: String,
    },
    /// The lock is held by someone else, whose release will see the item.
    Enqueued { id: String },
}

/// The most handled items one acknowledgement (`Backend::queue_ack`) removes. Handled items are acknowledged in groups (one
/// script per group, not per item); a holder that dies re-delivers at most this many handled
/// items, where one at a time it re-delivered one (at-least-once either way).
pub(crate) const ACK_GROUP: usize = 32;

/// What a release if empty found (`Backend::queue_release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The lock was deleted.
    Released,
    /// Items are waiting: the lock is still ours, drain again.
    More,
    /// The lock does not hold the token: nothing written. `waiting`: items are queued (a
    /// holder that cannot tell whether an earlier try released must not assume it did: the
    /// try may have found these items and released nothing).
    NotOurs {
        /// Whether the stream holds items.
        waiting: bool,
    },
}

/// One item as stored: its stream id and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub id: String,
    pub body: Vec<u8>,
}
