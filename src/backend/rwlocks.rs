//! The read-write lock's store seam: one try (read, upgradeable read or write), an upgrade, a
//! downgrade and the release, as methods of [`Backend`], one arm per backend. Extensions are
//! the lock store's (`backend::locks`): each holder's lease is a lease of its own.
//!
//! On Redis, the scripts in `backend::redis::rwlocks`; on PostgreSQL, the state row of
//! `baton_rwlocks` and the holders' lease rows of `baton_locks`, in `backend::postgres::rwlocks`.

use std::time::Duration;

use tokio::time::Instant;

use super::Backend;
use crate::error::Error;
use crate::util::rw_replies::{RwAcquire, RwGrant, RwKeysRef};

impl Backend {
    /// Creates what the read-write lock stores, if missing: on PostgreSQL the tables
    /// `baton_rwlocks` and `baton_locks`; on Redis nothing.
    ///
    /// # Errors
    /// Connection and permission errors.
    pub(crate) async fn migrate_rwlocks(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::rwlocks::migrate(t).await,
        }
    }

    /// One try to take a read-write lock as `req` says, giving up at `limit`.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit` (the grant may have applied: release by token);
    /// [`Error::CorruptState`] for a fence baton never writes; connection and server errors.
    pub(crate) async fn rw_try(
        &self,
        req: &RwAcquire<'_>,
        limit: Instant,
    ) -> Result<RwGrant, Error> {
        match self {
            Backend::Redis(t) => super::redis::rwlocks::try_acquire(t, req, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::rwlocks::try_acquire(t, req, limit).await,
        }
    }

    /// One try to turn the upgradeable reader `token` (fencing token `last`, lease `lease`)
    /// into the writer; while readers remain, it marks itself waiting for `mark`.
    ///
    /// # Errors
    /// As [`Backend::rw_try`]; [`Error::LeaseLost`] when `token` no longer holds the
    /// upgradeable read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rw_upgrade(
        &self,
        keys: &RwKeysRef<'_>,
        token: &str,
        last: u64,
        lease: Duration,
        mark: Duration,
        limit: Instant,
    ) -> Result<RwGrant, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::rwlocks::try_upgrade(t, keys, token, last, lease, mark, limit).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::rwlocks::try_upgrade(t, keys, token, last, lease, mark, limit)
                    .await
            }
        }
    }

    /// Turns the writer `token` back into the upgradeable reader; `Ok(false)` when it was no
    /// longer the writer.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit`; connection and server errors.
    pub(crate) async fn rw_downgrade(
        &self,
        keys: &RwKeysRef<'_>,
        token: &str,
        limit: Instant,
    ) -> Result<bool, Error> {
        match self {
            Backend::Redis(t) => super::redis::rwlocks::downgrade(t, keys, token, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::rwlocks::downgrade(t, keys, token, limit).await
            }
        }
    }

    /// Ends `token`'s hold, whatever its mode, and wakes waiters; `Ok(false)` when its lease
    /// was no longer its own.
    ///
    /// # Errors
    /// [`Error::Timeout`] at `limit` (the release may have applied); connection and server
    /// errors.
    pub(crate) async fn rw_release(
        &self,
        keys: &RwKeysRef<'_>,
        token: &str,
        limit: Instant,
    ) -> Result<bool, Error> {
        match self {
            Backend::Redis(t) => super::redis::rwlocks::release(t, keys, token, limit).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::rwlocks::release(t, keys, token, limit).await,
        }
    }

    /// [`Backend::rw_release`] through a task of the client; never blocks, and does nothing
    /// where it cannot run (the lease is the backstop).
    pub(crate) fn rw_release_in_background(&self, keys: &RwKeysRef<'_>, token: String) {
        match self {
            Backend::Redis(t) => super::redis::rwlocks::release_in_background(t, keys, token),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::rwlocks::release_in_background(t, keys, token),
        }
    }
}
