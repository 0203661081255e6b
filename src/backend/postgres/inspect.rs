//! The inspection seam on PostgreSQL: the job table, then the lock table (mutexes and
//! elections), then the semaphores' and the read-write locks' tables, a page at a time in key
//! order (keyset pagination). A semaphore's held slots and a read-write lock's holders are
//! rows of the lock table under the entry's key (`sem:{K}:<i>`, `rw:{K}:h:TOKEN`), read with
//! it. The fair lock and run-or-enqueue exist on Redis only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::PgTransport;
use crate::error::Error;
use crate::util::inspect::{
    EntryRead, EntryRecord, HolderLease, LockRecord, RwRead, RwRecord, SemRead, SemRecord,
};
use crate::util::jobs::JobStatus;

/// The tables a listing reads, in order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Table {
    Jobs,
    Locks,
    Semaphores,
    RwLocks,
}

/// Which tables a listing reads (the kinds asked for live there).
#[derive(Clone, Copy)]
pub(crate) struct Wanted {
    pub(crate) jobs: bool,
    pub(crate) locks: bool,
    pub(crate) semaphores: bool,
    pub(crate) rwlocks: bool,
}

impl Wanted {
    fn has(self, t: Table) -> bool {
        match t {
            Table::Jobs => self.jobs,
            Table::Locks => self.locks,
            Table::Semaphores => self.semaphores,
            Table::RwLocks => self.rwlocks,
        }
    }

    /// The first table wanted after `t` (from the start: `None`).
    fn after(self, t: Option<Table>) -> Option<Table> {
        [Table::Jobs, Table::Locks, Table::Semaphores, Table::RwLocks]
            .into_iter()
            .find(|n| t.map_or(true, |t| *n > t) && self.has(*n))
    }
}

/// Where a listing is on PostgreSQL: the table being read and the last key read.
#[derive(Clone)]
pub(crate) struct Page {
    table: Table,
    after: String,
}

/// What one page holds.
pub(crate) enum PageFound {
    /// A page of the job table: each row's key (the job's state key) and status.
    Jobs(Vec<(String, JobStatus)>),
    /// A page of the lock table: each row's key and record.
    Locks(Vec<(String, LockRecord)>),
    /// A page of the semaphores' or the read-write locks' table: each row's key, to be read
    /// with [`read_entries`].
    Keys(Vec<String>),
}

fn record(stored: crate::util::lock_replies::Stored) -> LockRecord {
    LockRecord {
        fence_stored: stored.fence.is_some(),
        value: stored.value,
        fence: stored.fence,
        pttl: stored.pttl,
        waiting: None,
        refused: None,
        // Another session's LISTENs cannot be counted (pg_listening_channels is the caller's
        // own): unknown, never 0.
        listeners: None,
    }
}

/// The next page: of the job table (left to the job store: [`PageFound::Jobs`]), then of the
/// lock table, the semaphores' and the read-write locks' tables, each skipped unless `wanted`.
pub(crate) async fn list_step(
    t: &PgTransport,
    at: Option<&Page>,
    prefix: &str,
    batch: usize,
    wanted: Wanted,
) -> Result<Option<(PageFound, Option<Page>)>, Error> {
    let (table, after) = match at {
        Some(p) => (p.table, p.after.clone()),
        None => match wanted.after(None) {
            Some(t) => (t, String::new()),
            None => return Ok(None),
        },
    };
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    // The page after `last` of this table, or the next table's first once this one is read
    // through (`None`: every table is).
    let next = |last: Option<&String>| match last {
        Some(key) => Some(Page {
            table,
            after: key.clone(),
        }),
        None => wanted.after(Some(table)).map(|table| Page {
            table,
            after: String::new(),
        }),
    };
    match table {
        Table::Jobs => {
            let rows = super::jobs::status_page(t, prefix, &after, limit).await?;
            let next = next(rows.last().map(|(k, _)| k));
            Ok(Some((PageFound::Jobs(rows), next)))
        }
        Table::Locks => {
            let rows = super::locks::page(t, prefix, &after, limit).await?;
            let next = next(rows.last().map(|(k, _)| k));
            let rows = rows.into_iter().map(|(k, s)| (k, record(s))).collect();
            Ok(Some((PageFound::Locks(rows), next)))
        }
        Table::Semaphores | Table::RwLocks => {
            let rows = key_page(t, table, prefix, &after, limit).await?;
            let next = next(rows.last());
            Ok(Some((PageFound::Keys(rows), next)))
        }
    }
}

/// A page of keys of the semaphores' or the read-write locks' table under `prefix` after
/// `after`, in key order.
async fn key_page(
    t: &PgTransport,
    table: Table,
    prefix: &str,
    after: &str,
    limit: i64,
) -> Result<Vec<String>, Error> {
    const DURING: &str = "listing keys";
    let deadline = Instant::now() + t.settings.response_timeout;
    let (conn, sql) = if table == Table::Semaphores {
        let conn = t
            .pooled_when(super::semaphores::ensure(t), deadline, DURING)
            .await?;
        (conn, SEM_PAGE)
    } else {
        let conn = t
            .pooled_when(super::rwlocks::ensure(t), deadline, DURING)
            .await?;
        (conn, RW_PAGE)
    };
    let statement = conn.by(deadline, DURING, conn.prepare_cached(sql)).await?;
    let rows = conn
        .by(
            deadline,
            DURING,
            conn.query(&statement, &[&after, &prefix, &limit]),
        )
        .await?;
    rows.iter()
        .map(|r| r.try_get(0).map_err(|e| unexpected(DURING, e)))
        .collect()
}

/// One page of the semaphores' table (keyset pagination, as the lock table's).
const SEM_PAGE: &str = "
SELECT key FROM baton_semaphores
WHERE key > $1 AND left(key, length($2)) = $2
ORDER BY key LIMIT $3";

/// One page of the read-write locks' table.
const RW_PAGE: &str = "
SELECT key FROM baton_rwlocks
WHERE key > $1 AND left(key, length($2)) = $2
ORDER BY key LIMIT $3";

/// A semaphore's row: its limit, span and fences.
const SEM_READ: &str = "SELECT lim, span, fences FROM baton_semaphores WHERE key = $1";

/// A semaphore's live fair waiters.
const SEM_WAITING: &str = "
SELECT count(*) FROM baton_semaphore_waiters
WHERE key = $1 AND alive_until > clock_timestamp()";

/// A read-write lock's row: the last write's token, its holders, whether its mark lives.
const RW_READ: &str = "
SELECT fence, writer, upgrader, readers, coalesce(waiting_until > clock_timestamp(), false)
FROM baton_rwlocks WHERE key = $1";

/// The live leases of the lock table whose key starts with `$1`: key, token, remaining ms.
const LEASES: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
SELECT l.key, l.token, ceil(extract(epoch FROM l.expires_at - c.now) * 1000)::bigint
FROM baton_locks l, c
WHERE left(l.key, length($1)) = $1 AND l.token IS NOT NULL AND l.expires_at > c.now
ORDER BY l.key";

fn unexpected(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::UnexpectedReply {
        context: what,
        reply: e.to_string(),
    }
}

/// The live leases under `prefix` (a semaphore's slots, a read-write lock's holders): each
/// key's part after `prefix`, with its lease.
async fn leases(
    conn: &super::Pooled,
    deadline: Instant,
    prefix: &str,
) -> Result<Vec<(String, HolderLease)>, Error> {
    const DURING: &str = "reading leases";
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(LEASES))
        .await?;
    let rows = conn
        .by(deadline, DURING, conn.query(&statement, &[&prefix]))
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
        let token: String = row.try_get(1).map_err(|e| unexpected(DURING, e))?;
        let ms: Option<i64> = row.try_get(2).map_err(|e| unexpected(DURING, e))?;
        let pttl = ms
            .and_then(|p| u64::try_from(p).ok())
            .map(Duration::from_millis);
        if let Some(rest) = key.strip_prefix(prefix) {
            out.push((rest.to_string(), HolderLease { token, pttl }));
        }
    }
    Ok(out)
}

/// A semaphore's row, its held slots and its live fair waiters.
async fn read_semaphore(t: &PgTransport, read: &SemRead) -> Result<SemRecord, Error> {
    const DURING: &str = "reading the semaphore";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = t
        .pooled_when(super::semaphores::ensure(t), deadline, DURING)
        .await?;
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(SEM_READ))
        .await?;
    let row = conn
        .by(deadline, DURING, conn.query_opt(&statement, &[&read.meta]))
        .await?;
    let mut r = SemRecord::default();
    if let Some(row) = row {
        r.stored = true;
        let lim: Option<i32> = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
        let span: i32 = row.try_get(1).map_err(|e| unexpected(DURING, e))?;
        // Slots below one granted later are NULL until granted themselves.
        let fences: Vec<Option<i64>> = row.try_get(2).map_err(|e| unexpected(DURING, e))?;
        r.limit = lim.map(|l| l.to_string());
        r.span = u32::try_from(span).unwrap_or(0);
        r.fences = (0u32..)
            .zip(fences)
            .filter_map(|(i, f)| Some((i, f.filter(|f| *f > 0)?.to_string())))
            .collect();
    }
    for (slot, lease) in leases(&conn, deadline, &read.slots).await? {
        if let Ok(slot) = slot.parse::<u32>() {
            r.held.push((slot, lease));
        }
    }
    r.held.sort_by_key(|(slot, _)| *slot);
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(SEM_WAITING))
        .await?;
    let row = conn
        .by(deadline, DURING, conn.query_one(&statement, &[&read.meta]))
        .await?;
    let waiting: i64 = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
    r.waiting = u64::try_from(waiting).unwrap_or(0);
    Ok(r)
}

/// A read-write lock's row and its holders whose lease lives.
async fn read_rwlock(t: &PgTransport, read: &RwRead) -> Result<RwRecord, Error> {
    const DURING: &str = "reading the read-write lock";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = t
        .pooled_when(super::rwlocks::ensure(t), deadline, DURING)
        .await?;
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(RW_READ))
        .await?;
    let row = conn
        .by(deadline, DURING, conn.query_opt(&statement, &[&read.state]))
        .await?;
    let mut r = RwRecord::default();
    let Some(row) = row else {
        return Ok(r);
    };
    r.stored = true;
    let fence: i64 = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
    let writer: Option<String> = row.try_get(1).map_err(|e| unexpected(DURING, e))?;
    let upgrader: Option<String> = row.try_get(2).map_err(|e| unexpected(DURING, e))?;
    let readers: Vec<String> = row.try_get(3).map_err(|e| unexpected(DURING, e))?;
    r.writer_waiting = row.try_get(4).map_err(|e| unexpected(DURING, e))?;
    r.fence = Some(fence.to_string());
    let live: HashMap<String, HolderLease> = leases(&conn, deadline, &read.holder_prefix)
        .await?
        .into_iter()
        .collect();
    // A holder counts only while its own lease row lives (its token is its key's tail).
    let lease = |token: Option<&String>| token.and_then(|t| live.get(t).cloned());
    r.writer = lease(writer.as_ref());
    r.upgrader = lease(upgrader.as_ref());
    r.readers = readers.iter().filter_map(|t| lease(Some(t))).collect();
    Ok(r)
}

/// Reads each entry's row: a job's through the job store, a lock's from the lock table (a row
/// holds the holder and the fence; nothing waits).
pub(crate) async fn read_entries(
    t: &Arc<PgTransport>,
    reads: &[EntryRead],
) -> Result<Vec<EntryRecord>, Error> {
    let mut out = Vec::with_capacity(reads.len());
    for read in reads {
        out.push(match read {
            EntryRead::Job(keys, name) => {
                let status = super::jobs::job_status(t, keys.state(), name.clone()).await?;
                // Listeners are unknown on PostgreSQL (see `record`).
                EntryRecord::Job(Ok(status), None)
            }
            EntryRead::Lock(read) => {
                EntryRecord::Lock(record(super::locks::read(t, &read.own).await?))
            }
            EntryRead::Semaphore(read) => EntryRecord::Semaphore(read_semaphore(t, read).await?),
            EntryRead::RwLock(read) => EntryRecord::RwLock(read_rwlock(t, read).await?),
        });
    }
    Ok(out)
}
