//! The inspection seam on PostgreSQL: the job table, then the lock table (mutexes and
//! elections), a page at a time in key order (keyset pagination). The fair lock and
//! run-or-enqueue exist on Redis only.

use std::sync::Arc;

use super::PgTransport;
use crate::error::Error;
use crate::util::inspect::{EntryRead, EntryRecord, LockRecord};
use crate::util::jobs::JobStatus;

/// Where a listing is on PostgreSQL: the table being read and the last key read.
#[derive(Clone)]
pub(crate) struct Page {
    jobs: bool,
    after: String,
}

/// What one page holds.
pub(crate) enum PageFound {
    /// A page of the job table: each row's key (the job's state key) and status.
    Jobs(Vec<(String, JobStatus)>),
    /// A page of the lock table: each row's key and record.
    Locks(Vec<(String, LockRecord)>),
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
/// lock table, each table skipped when `tables` says the kinds asked for are not there.
pub(crate) async fn list_step(
    t: &PgTransport,
    at: Option<&Page>,
    prefix: &str,
    batch: usize,
    read_jobs: bool,
    read_locks: bool,
) -> Result<Option<(PageFound, Option<Page>)>, Error> {
    let (jobs, after) = match at {
        Some(p) => (p.jobs, p.after.clone()),
        None => (read_jobs, String::new()),
    };
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    if jobs {
        let rows = super::jobs::status_page(t, prefix, &after, limit).await?;
        let next = match rows.last() {
            Some((key, _)) => Page {
                jobs: true,
                after: key.clone(),
            },
            // The table is read through: the lock table next, from its start.
            None if read_locks => Page {
                jobs: false,
                after: String::new(),
            },
            None => return Ok(Some((PageFound::Jobs(rows), None))),
        };
        return Ok(Some((PageFound::Jobs(rows), Some(next))));
    }
    if !read_locks {
        return Ok(None);
    }
    let rows = super::locks::page(t, prefix, &after, limit).await?;
    let next = rows.last().map(|(key, _)| Page {
        jobs: false,
        after: key.clone(),
    });
    let rows = rows.into_iter().map(|(k, s)| (k, record(s))).collect();
    Ok(Some((PageFound::Locks(rows), next)))
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
        });
    }
    Ok(out)
}
