//! The schedule record's seam: where a schedule's record (spec, hosts, history, pause) is
//! stored, one arm per backend. The Redis forms (one script per change, plain reads) are in
//! `backend::redis::schedules`; PostgreSQL's in `backend::postgres::schedules`. What crosses
//! the seam is plain data from the leaf `util::schedule_record`.

use super::Backend;
use crate::error::Error;
use crate::util::schedule_record::{RawPause, RawRecord, RawTrigger, RecordWrite, WireEntry};

impl Backend {
    /// Creates the record's tables if missing (PostgreSQL: `baton_schedules`,
    /// `baton_schedule_history`, `baton_schedule_control`, `baton_schedule_triggers` and an
    /// index); nothing on Redis.
    ///
    /// # Errors
    /// Connection and permission errors; `Busy` when a table stayed locked.
    pub(crate) async fn migrate_schedules(&self) -> Result<(), Error> {
        match self {
            Backend::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::migrate(t).await,
        }
    }

    /// Applies one write to a schedule's record (one round trip); the newest tick on record
    /// before it (ms since the epoch).
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn record_write(&self, w: &RecordWrite) -> Result<Option<i64>, Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::write(t, w).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::write(t, w).await,
        }
    }

    /// Every digest's record of `key`, the key's pause (as stored) and the server's clock (ms).
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn schedule_records(
        &self,
        prefix: &str,
        key: &str,
    ) -> Result<(Vec<RawRecord>, Option<RawPause>, i64), Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::records(t, prefix, key).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::records(t, prefix, key).await,
        }
    }

    /// The newest `limit` entries of `key`'s `digest`, newest first.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn schedule_history(
        &self,
        prefix: &str,
        key: &str,
        digest: &str,
        limit: usize,
    ) -> Result<Vec<WireEntry>, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::schedules::history(t, prefix, key, digest, limit).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::schedules::history(t, prefix, key, digest, limit).await
            }
        }
    }

    /// Pauses `key` (stamped with the server's clock): whether it did (`false` when `until`
    /// already passed), and the server's clock (ms).
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn pause_schedule(
        &self,
        prefix: &str,
        key: &str,
        until_ms: Option<i64>,
        by: &str,
        note: Option<&str>,
    ) -> Result<(bool, i64), Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::schedules::pause(t, prefix, key, until_ms, by, note).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::schedules::pause(t, prefix, key, until_ms, by, note).await
            }
        }
    }

    /// Resumes `key`: whether a pause was stored.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn resume_schedule(&self, prefix: &str, key: &str) -> Result<bool, Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::resume(t, prefix, key).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::resume(t, prefix, key).await,
        }
    }

    /// `key`'s pause as stored and the server's clock (ms): one round trip.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn read_pause(
        &self,
        prefix: &str,
        key: &str,
    ) -> Result<(Option<RawPause>, i64), Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::read_pause(t, prefix, key).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::read_pause(t, prefix, key).await,
        }
    }

    /// The schedule keys under `prefix` with a record or a pause, sorted, each once: every
    /// primary's keys walked with `SCAN` on Redis (each primary of a cluster), the record's
    /// tables on PostgreSQL.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn list_schedules(&self, prefix: &str) -> Result<Vec<String>, Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::list(t, prefix).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => super::postgres::schedules::list(t, prefix).await,
        }
    }

    /// Adds a trigger to `key` (`baton trigger`), stamped with the server's clock and an id
    /// unique per key; the Redis hash lives `lifetime` past this add.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn add_trigger(
        &self,
        prefix: &str,
        key: &str,
        by: &str,
        note: Option<&str>,
        lifetime: std::time::Duration,
    ) -> Result<RawTrigger, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::schedules::add_trigger(t, prefix, key, by, note, lifetime).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                // Rows older than a day are deleted by the readers and the cleanup.
                let _ = lifetime;
                super::postgres::schedules::add_trigger(t, prefix, key, by, note).await
            }
        }
    }

    /// `key`'s pending triggers (made less than `lifetime` ago by the server's clock), oldest
    /// first; older ones are deleted.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn triggers(
        &self,
        prefix: &str,
        key: &str,
        lifetime: std::time::Duration,
    ) -> Result<Vec<RawTrigger>, Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::triggers(t, prefix, key, lifetime).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::schedules::triggers(t, prefix, key, lifetime).await
            }
        }
    }

    /// Deletes `key`'s trigger `id`: whether it was pending.
    ///
    /// # Errors
    /// Connection and server errors.
    pub(crate) async fn clear_trigger(
        &self,
        prefix: &str,
        key: &str,
        id: &str,
    ) -> Result<bool, Error> {
        match self {
            Backend::Redis(t) => super::redis::schedules::clear_trigger(t, prefix, key, id).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                super::postgres::schedules::clear_trigger(t, prefix, key, id).await
            }
        }
    }
}
