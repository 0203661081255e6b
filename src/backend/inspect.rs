//! The inspection seam: what the operator's view (`crate::inspect`) reads from a backend, as
//! raw typed data. The inspector decides what a key is (from the primitives' key layouts) and
//! what an entry's state is; a backend only lists what is stored under a prefix, a bounded
//! batch at a time, and reads the keys it is asked for:
//!
//! - [`Backend::list_step`]: the next batch of a listing. On Redis the keys of one cursor-based
//!   `SCAN MATCH prefix* COUNT n` call on one primary (to be read with
//!   [`Backend::read_entries`] on the node that returned them); on PostgreSQL a page of the
//!   job table (the job store's statement), then of the lock table, the semaphores' and the
//!   read-write locks' tables.
//! - [`Backend::read_entries`]: jobs (through the job store's reads), lock-shaped entries
//!   (a holder's key, its fence and what counts its waiters), semaphores (their record and
//!   held slots) and read-write locks (their state and holders' leases): one round trip on
//!   Redis, and a second for the leases a semaphore's or a read-write lock's record names.
//!
//! Each backend implements them in its own folder (`redis/inspect.rs`,
//! `postgres/inspect.rs`); a third backend adds one arm to each method here.

use std::sync::Arc;

use super::Backend;
use crate::error::Error;
pub(crate) use crate::util::inspect::{
    EntryRead, EntryRecord, LockRead, LockRecord, RwRead, RwRecord, SemRead, SemRecord, Waiting,
};
use crate::util::jobs::JobStatus;

/// Which of PostgreSQL's tables a listing reads (whether the kinds asked for live there).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Tables {
    /// The job table (failover jobs).
    pub(crate) jobs: bool,
    /// The lock table (mutexes and elections).
    pub(crate) locks: bool,
    /// The semaphores' table.
    pub(crate) semaphores: bool,
    /// The read-write locks' table.
    pub(crate) rwlocks: bool,
}

/// Where a listing is; moved on only once a batch was read, so an error asks for the same
/// batch again.
#[derive(Clone, Default)]
pub(crate) struct Position(At);

#[derive(Clone, Default)]
enum At {
    #[default]
    Start,
    Redis(super::redis::inspect::Scan),
    #[cfg(feature = "postgres")]
    Postgres(super::postgres::inspect::Page),
    Done,
}

/// Where the keys of a batch are read (on Redis, the node that returned them).
pub(crate) struct ReadAt(Arc<super::redis::Node>);

/// What one step of a listing found.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Found {
    /// The keys one `SCAN` call returned (Redis), to read at `at`.
    Keys { keys: Vec<String>, at: ReadAt },
    /// A page of the job table (PostgreSQL): each row's key and status.
    JobRows(Vec<(String, JobStatus)>),
    /// A page of the lock table (PostgreSQL): each row's key and record.
    LockRows(Vec<(String, LockRecord)>),
    /// A page of entries' keys (PostgreSQL: semaphores, read-write locks), to read with
    /// [`Backend::read_entries`] where they live.
    EntryKeys(Vec<String>),
}

impl Position {
    fn of<T>(next: Option<T>, at: impl FnOnce(T) -> At) -> Position {
        Position(next.map_or(At::Done, at))
    }
}

impl Backend {
    /// The next step of a listing of everything under `prefix` (`batch` keys or rows at most)
    /// from `at`, with the position after it; `None` once everything was read through.
    ///
    /// # Errors
    /// Connection errors and timeouts.
    pub(crate) async fn list_step(
        &self,
        at: &Position,
        prefix: &str,
        batch: usize,
        tables: Tables,
    ) -> Result<Option<(Found, Position)>, Error> {
        match self {
            Backend::Redis(t) => {
                let _ = tables;
                let from = match &at.0 {
                    At::Start => None,
                    At::Redis(scan) => Some(scan),
                    _ => return Ok(None),
                };
                let step = super::redis::inspect::list_step(t, from, prefix, batch).await?;
                Ok(step.map(|(keys, node, next)| {
                    let at = ReadAt(node);
                    (Found::Keys { keys, at }, Position::of(next, At::Redis))
                }))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                use super::postgres::inspect::PageFound;
                let from = match &at.0 {
                    At::Start => None,
                    At::Postgres(page) => Some(page),
                    _ => return Ok(None),
                };
                let wanted = super::postgres::inspect::Wanted {
                    jobs: tables.jobs,
                    locks: tables.locks,
                    semaphores: tables.semaphores,
                    rwlocks: tables.rwlocks,
                };
                let step =
                    super::postgres::inspect::list_step(t, from, prefix, batch, wanted).await?;
                Ok(step.map(|(found, next)| {
                    let found = match found {
                        PageFound::Jobs(rows) => Found::JobRows(rows),
                        PageFound::Locks(rows) => Found::LockRows(rows),
                        PageFound::Keys(keys) => Found::EntryKeys(keys),
                    };
                    (found, Position::of(next, At::Postgres))
                }))
            }
        }
    }

    /// Reads entries, in `reads`' order: at `at` (the node a listing's keys came from), or
    /// where their keys live (every key of one name shares its hash tag). On Redis one
    /// pipeline reads them all.
    ///
    /// # Errors
    /// Connection errors and timeouts (a key of another type is a record's `refused`; a job's
    /// unreadable values its record's error).
    pub(crate) async fn read_entries(
        &self,
        at: Option<&ReadAt>,
        reads: &[EntryRead],
    ) -> Result<Vec<EntryRecord>, Error> {
        match self {
            Backend::Redis(t) => {
                super::redis::inspect::read_entries(t, at.map(|a| &a.0), reads).await
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                let _ = at;
                super::postgres::inspect::read_entries(t, reads).await
            }
        }
    }
}
