//! The fair line's store seam: the fair lock's operations (acquire-or-enqueue, leave, the
//! priority reservation, the kept wake channels) as methods of [`Backend`], with the types that
//! cross it ([`QueueKeys`], [`Enqueue`], [`Turn`]). The line is Redis scripts and channels:
//! on another backend each method is [`Error::Unsupported`]. The scripts are `redis::fair`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::parked::Parked;

/// What the fair lock names in a refusal on another backend, and why.
const WHAT: &str = "the fair lock";
const WHY: &str = "its queue, wake-ups and reservation are Redis scripts and channels; on \
                   PostgreSQL use `locks()` or `advisory_locks()`";

pub(crate) use crate::util::fair_line::{Enqueue, QueueKeys, Turn};

impl Backend {
    /// Refuses a backend the fair line does not live on.
    ///
    /// # Errors
    /// [`Error::Unsupported`] off Redis.
    pub(crate) fn fair_line(&self) -> Result<(), Error> {
        self.redis(WHAT, WHY).map(|_| ())
    }

    /// Tries once to take the fair lock, else queues the caller and refreshes its liveness; one
    /// round trip bounded by the response timeout.
    ///
    /// # Errors
    /// [`Error::CorruptState`] when the fence holds something baton never writes;
    /// [`Error::Timeout`] (the caller may now hold the lock: leave by id); connection and
    /// server errors; [`Error::Unsupported`] off Redis.
    pub(crate) async fn fair_acquire(
        &self,
        keys: &QueueKeys,
        req: &Enqueue<'_>,
    ) -> Result<Turn, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::fair::acquire_or_enqueue_on(t, keys, req).await
    }

    /// Leaves the line (releasing the lock and dropping the reservation when they hold `id`),
    /// waking whoever goes next; gives up at `limit`. `Ok(true)` when the lock held `id`.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit` (it may have applied); connection and server errors;
    /// [`Error::Unsupported`] off Redis.
    pub(crate) async fn fair_leave(
        &self,
        keys: &QueueKeys,
        id: &str,
        limit: Instant,
    ) -> Result<bool, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::fair::leave_on(t, keys, id, limit).await
    }

    /// Takes the priority reservation for `id` for `lifetime`: `Ok(false)` when another one
    /// holds it.
    ///
    /// # Errors
    /// [`Error::Timeout`] (the reservation may be ours: leave by id); connection and server
    /// errors; [`Error::Unsupported`] off Redis.
    pub(crate) async fn fair_reserve(
        &self,
        keys: &QueueKeys,
        id: &str,
        lifetime: Duration,
    ) -> Result<bool, Error> {
        let t = self.redis(WHAT, WHY)?;
        super::redis::fair::reserve_on(t, keys, id, lifetime).await
    }

    /// Leaves the line as `id` through a task of the client; never blocks (nothing off Redis,
    /// where nobody can have joined it).
    pub(crate) fn fair_leave_in_background(&self, keys: &Arc<QueueKeys>, id: String) {
        if let Ok(t) = self.redis(WHAT, WHY) {
            super::redis::fair::leave_in_background(t, keys, id);
        }
    }

    /// This client's idle wake channels, kept subscribed between waits (see `util::parked`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] off Redis.
    pub(crate) fn fair_parked(&self) -> Result<&Parked, Error> {
        Ok(&self.redis(WHAT, WHY)?.hub.parked)
    }
}
