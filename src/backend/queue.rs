//! Run-or-enqueue's store seam: the queue's operations (post and maybe take the lock, read,
//! acknowledge, release if empty, count) as methods of [`Backend`], with the types that cross
//! it ([`ItemKeys`], [`Enqueue`], [`Release`], [`Stored`]). The queue is a Redis stream beside
//! a fenced lock: on another backend each method is [`Error::Unsupported`]. The scripts and
//! stream commands are `redis::queue`.

use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::lock_replies::{Acquire, Grant};

/// What run-or-enqueue names in a refusal on another backend, and why.
const WHAT: &str = "run-or-enqueue";
const WHY: &str =
    "its items are a Redis stream; on PostgreSQL use a table of jobs with `failover()`";

pub(crate) use crate::util::queue_items::{Enqueue, ItemKeys, Release, Stored, ACK_GROUP};

impl Backend {
    /// Refuses a backend the queue does not live on.
    ///
    /// # Errors
    /// [`Error::Unsupported`] off Redis.
    pub(crate) fn queue_items(&self) -> Result<(), Error> {
        self.redis(WHAT, WHY).map(|_| ())
    }

    /// How many items wait in the stream `items`, bounded by the response timeout.
    ///
    /// # Errors
    /// [`Error::Timeout`]; connection and server errors; [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_len(&self, items: &str) -> Result<u64, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::queue::len_on(t, items).await
    }

    /// Appends `body` to the stream and tries the fenced acquisition, atomically, giving up at
    /// `limit`.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a fence baton never writes (nothing written);
    /// [`Error::Timeout`] at `limit` (unknown: the item may have been added and the lock
    /// taken); connection and server errors; [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_enqueue_or_acquire(
        &self,
        keys: &ItemKeys<'_>,
        token: &str,
        ttl: Duration,
        body: &[u8],
        limit: Instant,
    ) -> Result<Enqueue, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::queue::enqueue_or_acquire_on(t, keys, token, ttl, body, limit).await
    }

    /// Takes the queue's lock alone (no item posted): the lock store's fenced acquisition on
    /// the node that serves it, giving up at `limit`.
    ///
    /// # Errors
    /// As [`Backend::acquire`]; [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_acquire(
        &self,
        req: &Acquire<'_>,
        limit: Instant,
    ) -> Result<Grant, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::locks::acquire_on(t, req, limit).await
    }

    /// Reads up to `count` waiting items, oldest first, bounded by the response timeout.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for an entry baton did not write; [`Error::Timeout`];
    /// connection and server errors; [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_read(&self, items: &str, count: usize) -> Result<Vec<Stored>, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::queue::read_on(t, items, count).await
    }

    /// Deletes handled items `ids` while the lock still holds `token`, bounded by the response
    /// timeout: `Ok(false)` when it does not (nothing deleted).
    ///
    /// # Errors
    /// [`Error::Timeout`] (it may have applied); connection and server errors;
    /// [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_ack(
        &self,
        keys: &ItemKeys<'_>,
        token: &str,
        ids: &[String],
    ) -> Result<bool, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::queue::ack_on(t, keys, token, ids).await
    }

    /// Releases the lock if it holds `token` and nothing is queued (or anyway, `force`),
    /// bounded by the response timeout; an empty stream is kept for `retention`.
    ///
    /// # Errors
    /// [`Error::Timeout`] (it may have applied); connection and server errors;
    /// [`Error::Unsupported`] off Redis.
    pub(crate) async fn queue_release(
        &self,
        keys: &ItemKeys<'_>,
        token: &str,
        force: bool,
        retention: Duration,
    ) -> Result<Release, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::queue::release_on(t, keys, token, force, retention).await
    }

    /// A forced release by `token` through a task of the client; never blocks (nothing off
    /// Redis, where no queue can be held).
    pub(crate) fn queue_release_in_background(
        &self,
        keys: &ItemKeys<'_>,
        token: String,
        retention: Duration,
    ) {
        if let Ok(t) = self.redis(WHAT, WHY) {
            super::redis::queue::release_in_background(
                t, keys.lock, keys.fence, keys.items, token, retention,
            );
        }
    }
}
