//! The inspection seam on PostgreSQL: the job table, then the lock table (mutexes and
//! elections), a page at a time in key order (keyset pagination). The fair lock and
//! run-or-enqueue exist on Redis only.

use super::PgTransport;
use crate::error::Error;
use crate::util::inspect::{LockRead, LockRecord};

/// Where a listing is on PostgreSQL: the table being read and the last key read.
#[derive(Clone)]
pub(crate) struct Page {
    jobs: bool,
    after: String,
}

impl Page {
    /// Past a page of the job table whose last key was `last` (`None`: the table is read
    /// through, the lock table is next).
    pub(crate) fn after_jobs(&self, last: Option<String>) -> Page {
        match last {
            Some(after) if self.jobs => Page { jobs: true, after },
            Some(_) => self.clone(),
            None => Page {
                jobs: false,
                after: String::new(),
            },
        }
    }
}

/// What one page holds.
pub(crate) enum PageFound {
    /// The job table's page after `after` is next: the job store reads it.
    Jobs { after: String },
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
    if jobs {
        let here = Page {
            jobs: true,
            after: after.clone(),
        };
        return Ok(Some((PageFound::Jobs { after }, Some(here))));
    }
    if !read_locks {
        return Ok(None);
    }
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let rows = super::locks::page(t, prefix, &after, limit).await?;
    let next = rows.last().map(|(key, _)| Page {
        jobs: false,
        after: key.clone(),
    });
    let rows = rows.into_iter().map(|(k, s)| (k, record(s))).collect();
    Ok(Some((PageFound::Locks(rows), next)))
}

/// Reads each entry's row (a lock table row holds the holder and the fence; nothing waits).
pub(crate) async fn read_locks(
    t: &PgTransport,
    reads: &[LockRead],
) -> Result<Vec<LockRecord>, Error> {
    let mut out = Vec::with_capacity(reads.len());
    for read in reads {
        out.push(record(super::locks::read(t, &read.own).await?));
    }
    Ok(out)
}
