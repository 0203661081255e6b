//! The semaphore store seam: what the semaphore (`semaphore`) does to its record on any
//! [`Backend`] (try for a permit, set the limit, release a permit whose slot is unknown), one
//! arm per backend:
//!
//! - **Redis**: the scripts of `redis::semaphores`, on the node that serves the semaphore's
//!   hash tag.
//! - **PostgreSQL**: not yet; every operation is [`Error::Unsupported`].
//!
//! A granted permit is a lock of the lock store (`backend::locks`): its extension, its
//! token-checked release and its watchdog go through that seam unchanged. What crosses this one
//! ([`PermitRequest`], [`PermitGrant`]) is defined in the leaves (`util::permits`).

use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::permits::{PermitGrant, PermitRequest};

/// Why the semaphore is Redis-only for now.
const SEMAPHORE_ON_POSTGRES: &str = "the semaphore is stored on Redis only for now; on \
     PostgreSQL use one mutex per slot (Locks) or an advisory lock";

impl Backend {
    /// One try for a permit: one round trip that gives up at `limit`.
    ///
    /// # Errors
    /// [`Error::CorruptState`] for a record baton never writes; an indeterminate error
    /// ([`Error::is_indeterminate`]) may have granted a permit, so the caller releases by token
    /// ([`Backend::release_permit_in_background`]); connection and server errors;
    /// [`Error::Unsupported`] on PostgreSQL.
    pub(crate) async fn acquire_permit(
        &self,
        req: &PermitRequest<'_>,
        limit: Instant,
    ) -> Result<PermitGrant, Error> {
        let t = self.redis("the semaphore", SEMAPHORE_ON_POSTGRES)?;
        super::redis::semaphores::acquire_on(t, req, limit).await
    }

    /// Stores `limit` as the semaphore's limit (record `meta`, kept at least `retention`);
    /// the limit it replaced, if one was stored.
    ///
    /// # Errors
    /// [`Error::Timeout`] (it may have applied); connection and server errors;
    /// [`Error::Unsupported`] on PostgreSQL.
    pub(crate) async fn set_semaphore_limit(
        &self,
        meta: &str,
        limit: u32,
        retention: Duration,
    ) -> Result<Option<u32>, Error> {
        let t = self.redis("the semaphore", SEMAPHORE_ON_POSTGRES)?;
        super::redis::semaphores::set_limit_on(t, meta, limit, retention).await
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
        if let Backend::Redis(t) = self {
            super::redis::semaphores::release_any_in_background(t, meta, slots, channel, token);
        }
    }
}
