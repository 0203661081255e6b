//! The listing on PostgreSQL: the job table, then the lock table (mutexes and elections), a
//! page at a time in key order. The fair lock and run-or-enqueue exist on Redis only.

use super::{At, Entry, Inspector, Kind, Listing, Part};
use crate::backend::postgres::PgTransport;
use crate::error::Error;

/// The tables read in turn: the job table, then the lock table.
const TABLES: usize = 2;

/// Whether table `table` can hold entries of `kind`.
fn holds(table: usize, kind: Option<Kind>) -> bool {
    match (table, kind) {
        (_, None) => true,
        (0, Some(k)) => k == Kind::Job,
        (_, Some(k)) => matches!(k, Kind::Lock | Kind::Leader),
    }
}

/// The next page of `listing` on PostgreSQL (`Some(empty)` when a page held nothing listed).
pub(super) async fn next_batch(
    t: &PgTransport,
    listing: &mut Listing,
) -> Result<Option<Vec<Entry>>, Error> {
    if let At::Start = listing.at {
        listing.at = At::Page {
            table: 0,
            after: String::new(),
        };
    }
    let At::Page { table, after } = &mut listing.at else {
        return Ok(None);
    };
    while *table < TABLES && !holds(*table, listing.kind) {
        *table += 1;
    }
    if *table >= TABLES {
        listing.at = At::Done;
        return Ok(None);
    }
    let prefix = &*listing.inspector.prefix;
    let limit = i64::try_from(listing.inspector.batch).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    let last = if *table == 0 {
        let rows = crate::failover::pg::status_page(t, prefix, after, limit).await?;
        let last = rows.last().map(|(k, _)| k.clone());
        for (key, status) in rows {
            if let Some(p) = super::parse_key(prefix, &key) {
                if p.kind == Kind::Job && p.part == Part::Own {
                    out.extend(Entry::of_job(p.name, status));
                }
            }
        }
        last
    } else {
        let rows = crate::backend::postgres::locks::page(t, prefix, after, limit).await?;
        let last = rows.last().map(|(k, _)| k.clone());
        for (key, stored) in rows {
            let Some(p) = super::parse_key(prefix, &key) else {
                continue;
            };
            if p.part != Part::Own || listing.kind.is_some_and(|k| k != p.kind) {
                continue;
            }
            out.push(Entry::of_lock(
                p.kind,
                p.name,
                stored.value.as_deref(),
                stored.fence.as_deref(),
                stored.pttl,
            ));
        }
        last
    };
    match last {
        Some(key) => *after = key,
        // The table is read through: the next one, from its start.
        None => {
            *table += 1;
            after.clear();
        }
    }
    Ok(Some(out))
}

/// What `name` is on PostgreSQL: its job row and its lock and election rows.
pub(super) async fn find(inspector: &Inspector, name: &str) -> Result<Vec<Entry>, Error> {
    let job = crate::failover::FailoverConfig::builder(name)
        .prefix(inspector.prefix.to_string())
        .build()?;
    let failover = crate::failover::Failover::new(inspector.backend.clone());
    let mut out: Vec<Entry> = Entry::of_job(name, failover.job_status(job).await?)
        .into_iter()
        .collect();
    let lock = crate::mutex::keys::LockKeys::new(&inspector.prefix, name);
    let leader = crate::leader::keys::ElectionKeys::new(&inspector.prefix, name);
    for (kind, key, fence) in [
        (Kind::Lock, lock.lock(), lock.fence()),
        (Kind::Leader, leader.lease.as_str(), leader.fence.as_str()),
    ] {
        let stored = inspector.backend.read(key, fence).await?;
        if stored.value.is_some() || stored.fence.is_some() {
            out.push(Entry::of_lock(
                kind,
                name,
                stored.value.as_deref(),
                stored.fence.as_deref(),
                stored.pttl,
            ));
        }
    }
    Ok(out)
}
