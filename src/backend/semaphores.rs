//! The semaphore store seam: what the semaphore (`semaphore`) does to its record on any
//! [`Backend`] (try for a permit, set the limit, release a permit whose slot is unknown, read
//! one slot for an operator's force release), one
//! arm per backend:
//!
//! - **Redis**: the scripts of `redis::semaphores`, on the node that serves the semaphore's
//!   hash tag.
//! - **PostgreSQL**: the transactions of `postgres::semaphores` on `baton_semaphores`, each
//!   held slot a row of `baton_locks`.
//!
//! A granted permit is a lock of the lock store (`backend::locks`): its extension, its
//! token-checked release and its watchdog go through that seam unchanged. What crosses this one
//! ([`PermitRequest`], [`PermitGrant`]) is defined in the leaves (`util::permits`).

use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::lock_replies::Stored;
use crate::util::permits::{PermitGrant, PermitRequest};

impl Backend {
    /// One try for a permit: one round trip that gives up at `limit`.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a record baton never writes; an indeterminate error
    /// ([`Error::is_indeterminate`]) may have granted a permit, so the caller releases by token
    /// ([`Backend::release_permit_in_background`]); connection and server errors;
    pub(crate) async fn acquire_permit(
        &self,
        req: &PermitRequest<'_>,
        limit: Instant,
    ) -> Result<PermitGrant, Error> {
        match self {
            Backend::Redis(t) => super::redis::semaphores::acquire_on(t, req, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::semaphores::acquire(t, req, limit).await,
        }
    }

    /// Stores `limit` as the semaphore's limit (record `meta`, slot keys from `slots`, kept at
    /// least `retention`);
    /// the limit it replaced, if one was stored.
    ///
    /// # Errors
    /// [`Error::Timeout`] (it may have applied); connection and server errors.
    pub(crate) async fn set_semaphore_limit(
        &self,
        meta: &str,
        slots: &str,
        limit: u32,
        retention: Duration,
    ) -> Result<Option<u32>, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::semaphores::set_limit_on(t, meta, limit, retention).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::semaphores::set_limit(t, meta, slots, limit, retention).await
            }
        }
    }

    /// Releases whichever slot of the semaphore (record `meta`, slot keys from `slots`) holds
    /// `token`, waking a waiter on `channel`, through a task of the client; never blocks.
    pub(crate) fn release_permit_in_background(
        &self,
        meta: &str,
        slots: &str,
        channel: &str,
        token: String,
    ) {
        match self {
            Backend::Redis(t) => {
                super::redis::semaphores::release_any_in_background(t, meta, slots, channel, token)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::semaphores::release_any_in_background(t, slots, channel, token)
            }
        }
    }

    /// Takes fair waiter `waiter` out of the line of the semaphore (record `meta`, line keys
    /// `queue`/`alive` on Redis), waking a waiter on `channel` if it was in it, through a task
    /// of the client; never blocks. The place's liveness is the backstop.
    pub(crate) fn leave_semaphore_line_in_background(
        &self,
        meta: &str,
        queue: &str,
        alive: &str,
        channel: &str,
        waiter: String,
    ) {
        match self {
            Backend::Redis(t) => {
                let _ = meta;
                super::redis::semaphores::leave_line_in_background(t, queue, alive, channel, waiter)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                let _ = (queue, alive);
                super::postgres::semaphores::leave_line_in_background(t, meta, channel, waiter)
            }
        }
    }

    /// Slot `slot` of the semaphore (record `meta`, the slot's key `slot_key`): its holder's
    /// token, its fencing token and its lease left, read together (one `MULTI` on Redis, where
    /// the fence is the record's field `f<slot>`; the slot's lock row on PostgreSQL, which
    /// keeps the fence of its grant).
    ///
    /// # Errors
    /// [`Error::Timeout`]; connection and server errors.
    pub(crate) async fn read_permit(
        &self,
        meta: &str,
        slot_key: &str,
        slot: u32,
    ) -> Result<Stored, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::semaphores::read_slot_on(t, meta, slot_key, slot).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                let _ = (meta, slot);
                super::postgres::locks::read(t, slot_key).await
            }
        }
    }

    /// Creates the semaphore's tables where the backend has any (PostgreSQL: `baton_semaphores`
    /// and the lock table its slots live in); nothing on Redis.
    ///
    /// # Errors
    /// Connection and permission errors; a busy table through every try.
    pub(crate) async fn migrate_semaphores(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::semaphores::migrate(t).await,
        }
    }
}
