//! The semaphore on PostgreSQL (feature `postgres`): a semaphore's limit and its slots' fences
//! are one row of `baton_semaphores`, and every held slot is a row of the lock table
//! `baton_locks` of its own (key `P` `sem:{K}:<i>`), so a permit extends, releases and is
//! watched exactly as a mutex (`postgres::locks`), and a crashed holder's slot frees itself
//! when that row's lease ends, by the server's clock.
//!
//! ```sql
//! CREATE TABLE baton_semaphores (
//!     key          text PRIMARY KEY,   -- P sem:{K}
//!     lim          integer,            -- the stored limit (NULL: none yet)
//!     span         integer NOT NULL,   -- slots that may hold permits (≥ every limit since)
//!     fences       bigint[] NOT NULL,  -- slot i's last fencing token at index i + 1
//!     retain_until timestamptz NOT NULL
//! );
//! CREATE TABLE baton_semaphore_waiters (  -- the line of fair waiters
//!     key         text NOT NULL,          -- P sem:{K}
//!     waiter      text NOT NULL,
//!     ticket      bigint NOT NULL,        -- arrival order within the semaphore
//!     alive_until timestamptz NOT NULL,   -- the place ends unless refreshed
//!     PRIMARY KEY (key, waiter)
//! );
//! ```
//!
//! A try is one short transaction: the semaphore's row is upserted and so locked (`INSERT …
//! ON CONFLICT DO UPDATE` locks the row it finds), the slot rows up to the span are read, and
//! the rule of the Redis script decides (a stored limit other than the caller's is refused with
//! nothing written; as many held as the limit, counting slots above a lowered one, is full;
//! else the lowest free slot below the limit, unless live fair waiters ahead of the caller in
//! the line (all of them, for a try outside it) are owed the free permits). The slot's lock row and its fence, stepped to
//! `max(old + 1, server time in µs)`, are written before the commit: tries on one semaphore are
//! serialized by the row lock. A stored limit counts while the row's retention has not passed
//! (max(24 h, 2 × lease), refreshed by every try and grant) or a slot is held. The client's
//! cleanup deletes rows past their retention with no held slot; free slot rows are the lock
//! table's cleanup's.

use std::time::Duration;

use tokio::time::Instant;

use super::{channel_of, PgTransport, Pooled};
use crate::error::Error;
use crate::util::lock_replies::fence_ttl;
use crate::util::permits::{PermitGrant, PermitRequest};

/// The schema's name for [`PgTransport::ensure_schema`].
pub(crate) const SCHEMA_NAME: &str = "baton_semaphores";

/// The semaphores' table (the held slots are rows of `baton_locks`).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_semaphores (
    key          text PRIMARY KEY,
    lim          integer,
    span         integer NOT NULL,
    fences       bigint[] NOT NULL,
    retain_until timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS baton_semaphore_waiters (
    key         text NOT NULL,
    waiter      text NOT NULL,
    ticket      bigint NOT NULL,
    alive_until timestamptz NOT NULL,
    PRIMARY KEY (key, waiter)
);
";

/// Deletes semaphores past their retention with no held slot. The conditions are re-checked by
/// the `DELETE` on a row a try has locked meanwhile (it waits, then re-evaluates its `WHERE` on
/// the new version, whose retention the try refreshed).
const CLEANUP: &str = "
DELETE FROM baton_semaphores s
WHERE s.retain_until < clock_timestamp()
  AND NOT EXISTS (
    SELECT 1 FROM baton_locks l
    WHERE left(l.key, length(s.key) + 1) = s.key || ':'
      AND l.token IS NOT NULL AND l.expires_at > clock_timestamp());
DELETE FROM baton_semaphore_waiters WHERE alive_until < clock_timestamp()";

/// How often a client runs [`CLEANUP`].
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// `$1` key. Upserts the row (locking it); its limit, its span, and whether the retention passed.
const LOCK_ROW: &str = "
INSERT INTO baton_semaphores AS s (key, lim, span, fences, retain_until)
VALUES ($1, NULL, 0, '{}', clock_timestamp())
ON CONFLICT (key) DO UPDATE SET key = s.key
RETURNING s.lim, s.span, s.retain_until <= clock_timestamp()";

/// `$1` slot keys. Every slot row among them: key, whether held, the holder's remaining ms,
/// the row's fence.
const SLOTS: &str = "
SELECT key, token IS NOT NULL AND expires_at > clock_timestamp(),
       ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint, fence
FROM baton_locks
WHERE key = ANY($1::text[])";

/// `$1` key, `$2` limit, `$3` span, `$4` retention ms.
const STORE: &str = "
UPDATE baton_semaphores
SET lim = $2, span = $3,
    retain_until = greatest(retain_until, clock_timestamp() + $4::float8 * interval '1 millisecond')
WHERE key = $1";

/// `$1` key, `$2` slot index (0-based), `$3` the slot row's last fence. Steps the slot's fence
/// to `max(old + 1, server time in µs, row's + 1)` and returns it.
const STEP: &str = "
UPDATE baton_semaphores
SET fences[$2::int + 1] = greatest(coalesce(fences[$2::int + 1], 0) + 1,
                                   floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                                   $3::bigint + 1)
WHERE key = $1
RETURNING fences[$2::int + 1]";

/// `$1` slot key, `$2` token, `$3` lease ms, `$4` fence, `$5` fence retention ms. The holder's
/// lock row (the try checked, under the semaphore's row lock, that the slot is free).
const HOLD: &str = "
INSERT INTO baton_locks (key, token, expires_at, fence, fence_expires_at)
VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond', $4,
        clock_timestamp() + $5::float8 * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE
SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at, fence = EXCLUDED.fence,
    fence_expires_at = greatest(baton_locks.fence_expires_at, EXCLUDED.fence_expires_at)";

/// `$1` key, `$2` waiter, `$3` liveness ms. Drops the semaphore's dead waiters, puts `$2` in
/// the line at its tail if it is not there (its place refreshed either way) and counts the
/// live waiters ahead of it. The count reads the statement's snapshot, taken before the
/// `DELETE` and the `INSERT`, hence its own liveness test.
const PLACE: &str = "
WITH gone AS (
    DELETE FROM baton_semaphore_waiters
    WHERE key = $1 AND alive_until < clock_timestamp()
), me AS (
    INSERT INTO baton_semaphore_waiters AS w (key, waiter, ticket, alive_until)
    VALUES ($1, $2,
            (SELECT coalesce(max(ticket), 0) + 1 FROM baton_semaphore_waiters WHERE key = $1),
            clock_timestamp() + $3::float8 * interval '1 millisecond')
    ON CONFLICT (key, waiter) DO UPDATE SET alive_until = EXCLUDED.alive_until
    RETURNING w.ticket
)
SELECT count(*) FROM baton_semaphore_waiters w, me
WHERE w.key = $1 AND w.ticket < me.ticket AND w.alive_until >= clock_timestamp()";

/// `$1` key. Drops the semaphore's dead waiters and counts the live ones (a try outside the
/// line lets them all go first).
const LINE: &str = "
WITH gone AS (
    DELETE FROM baton_semaphore_waiters
    WHERE key = $1 AND alive_until < clock_timestamp()
)
SELECT count(*) FROM baton_semaphore_waiters
WHERE key = $1 AND alive_until >= clock_timestamp()";

/// `$1` key, `$2` waiter: out of the line (granted, or gone).
const LEAVE: &str = "DELETE FROM baton_semaphore_waiters WHERE key = $1 AND waiter = $2";

/// `$1` key, `$2` waiter, `$3` payload, `$4` channel: out of the line, notifying `released`
/// (the waiters behind may now be owed a free permit) if it was in it.
const LEAVE_NOTIFY: &str = "
WITH r AS (
    DELETE FROM baton_semaphore_waiters WHERE key = $1 AND waiter = $2 RETURNING 1
)
SELECT count(*), pg_notify($4, $3) FROM r HAVING count(*) > 0";

/// `$1` slot prefix, `$2` token, `$3` payload, `$4` channel. Frees whichever slot holds the
/// token (an acquisition whose reply was lost does not know its slot), notifying `released`.
const RELEASE_ANY: &str = "
WITH r AS (
    UPDATE baton_locks SET token = NULL
    WHERE left(key, length($1)) = $1 AND token = $2
    RETURNING 1
)
SELECT count(*), pg_notify($4, $3) FROM r HAVING count(*) > 0";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn unexpected(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::UnexpectedReply {
        context: what,
        reply: e.to_string(),
    }
}

/// Creates the semaphores' table if missing (`Client::migrate`), and the lock table its slots
/// live in.
///
/// # Errors
/// Connection and permission errors; a busy table through every try.
pub(crate) async fn migrate(t: &PgTransport) -> Result<(), Error> {
    super::locks::migrate(t).await?;
    t.migrate_schema(SCHEMA).await?;
    ensure(t).await
}

/// Both tables, created on first use where the role may (once per client), and the cleanup.
pub(crate) async fn ensure(t: &PgTransport) -> Result<(), Error> {
    super::locks::ensure_schema(t).await?;
    t.ensure_schema(
        SCHEMA_NAME,
        SCHEMA,
        Some((CLEANUP, t.cleanup_every(CLEANUP_EVERY))),
    )
    .await
}

async fn connection(
    t: &PgTransport,
    limit: Instant,
    during: &'static str,
) -> Result<Pooled, Error> {
    t.pooled_when(ensure(t), limit, during).await
}

/// The locked row as a try reads it.
struct Row {
    /// The stored limit, if it still counts (within its retention, or a slot is held).
    stored: Option<u32>,
    span: u32,
}

/// One slot row: held, the holder's remaining ms, the row's fence.
struct Slot {
    held: bool,
    pttl: Option<i64>,
    fence: i64,
}

/// Locks the semaphore's row and reads it with the slot rows up to `max(span, least)`.
async fn lock_and_read(
    conn: &Pooled,
    req_meta: &str,
    slots: &str,
    least: u32,
    limit: Instant,
    during: &'static str,
) -> Result<(Row, Vec<Option<Slot>>), Error> {
    let bad = |e| unexpected("the semaphore's row", e);
    let st = conn
        .by(limit, during, conn.prepare_cached(LOCK_ROW))
        .await?;
    let row = conn
        .by(limit, during, conn.query_one(&st, &[&req_meta]))
        .await?;
    let lim: Option<i32> = row.try_get(0).map_err(bad)?;
    let span: i32 = row.try_get(1).map_err(bad)?;
    let expired: bool = row.try_get(2).map_err(bad)?;
    let span = u32::try_from(span)
        .map_err(|_| unexpected("the semaphore's row", format!("a span of {span}")))?;
    let top = span.max(least).min(crate::util::permits::MAX_SLOTS);
    let keys: Vec<String> = (0..top).map(|i| format!("{slots}{i}")).collect();
    let st = conn.by(limit, during, conn.prepare_cached(SLOTS)).await?;
    let rows = conn.by(limit, during, conn.query(&st, &[&keys])).await?;
    let mut found: Vec<Option<Slot>> = (0..top).map(|_| None).collect();
    for r in rows {
        let key: String = r.try_get(0).map_err(bad)?;
        let Some(i) = key
            .strip_prefix(slots)
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < found.len())
        else {
            continue;
        };
        found[i] = Some(Slot {
            held: r.try_get(1).map_err(bad)?,
            pttl: r.try_get(2).map_err(bad)?,
            fence: r.try_get(3).map_err(bad)?,
        });
    }
    let any_held = found.iter().flatten().any(|s| s.held);
    let stored = match lim {
        Some(l) if !expired || any_held => Some(
            u32::try_from(l)
                .map_err(|_| unexpected("the semaphore's row", format!("a limit of {l}")))?,
        ),
        _ => None,
    };
    let span = if stored.is_none() && !any_held {
        0
    } else {
        span
    };
    Ok((Row { stored, span }, found))
}

/// Commits, or retires the connection (the server then rolls back) when the commit fails.
async fn finish(
    conn: &Pooled,
    sql: &str,
    limit: Instant,
    during: &'static str,
) -> Result<(), Error> {
    conn.by(limit, during, conn.batch_execute(sql))
        .await
        .inspect_err(|_| conn.retire())
}

/// One try for a permit in one transaction, giving up at `limit`.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the permit may be ours: the caller releases by token);
/// connection and server errors; [`Error::UnexpectedReply`] for a row baton never writes.
pub(crate) async fn acquire(
    t: &PgTransport,
    req: &PermitRequest<'_>,
    limit: Instant,
) -> Result<PermitGrant, Error> {
    const DURING: &str = "acquiring a permit";
    let conn = connection(t, limit, DURING).await?;
    let sent = Instant::now();
    conn.by(limit, DURING, conn.batch_execute("BEGIN")).await?;
    match try_in(t, &conn, req, limit, sent).await {
        Ok((grant, commit)) => {
            finish(
                &conn,
                if commit { "COMMIT" } else { "ROLLBACK" },
                limit,
                DURING,
            )
            .await?;
            Ok(grant)
        }
        Err(e) => {
            conn.retire();
            Err(e)
        }
    }
}

/// The statements of [`acquire`] between `BEGIN` and the end: the answer, and whether to
/// commit it.
async fn try_in(
    t: &PgTransport,
    conn: &Pooled,
    req: &PermitRequest<'_>,
    limit: Instant,
    sent: Instant,
) -> Result<(PermitGrant, bool), Error> {
    const DURING: &str = "acquiring a permit";
    let (row, slots) = lock_and_read(conn, req.meta, req.slots, req.limit, limit, DURING).await?;
    if let Some(stored) = row.stored.filter(|s| *s != req.limit) {
        return Ok((PermitGrant::Mismatch { stored }, false));
    }
    let n = req.limit;
    let mut free = None;
    let (mut held, mut top, mut minp) = (0u32, n, None::<u64>);
    for (i, s) in slots.iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        match s {
            Some(s) if s.held => {
                held += 1;
                top = top.max(i + 1);
                if let Some(p) = s.pttl.and_then(|p| u64::try_from(p).ok()) {
                    minp = Some(minp.map_or(p, |m| m.min(p)));
                }
            }
            _ => {
                if free.is_none() && i < n {
                    free = Some(i);
                }
            }
        }
    }
    let retention = ms(t.fence_retention(fence_ttl(req.ttl)));
    let st = conn.by(limit, DURING, conn.prepare_cached(STORE)).await?;
    let (lim, span) = (to_i32(n), to_i32(top));
    conn.by(
        limit,
        DURING,
        conn.execute(&st, &[&req.meta, &lim, &span, &retention]),
    )
    .await?;
    let ahead: i64 = match req.place {
        Some((waiter, liveness)) => {
            let st = conn.by(limit, DURING, conn.prepare_cached(PLACE)).await?;
            conn.by(
                limit,
                DURING,
                conn.query_one(&st, &[&req.meta, &waiter, &ms(liveness)]),
            )
            .await?
        }
        None => {
            let st = conn.by(limit, DURING, conn.prepare_cached(LINE)).await?;
            conn.by(limit, DURING, conn.query_one(&st, &[&req.meta]))
                .await?
        }
    }
    .try_get(0)
    .map_err(|e| unexpected("the semaphore's line", e))?;
    let ahead = u32::try_from(ahead).unwrap_or(u32::MAX);
    let Some(slot) = free.filter(|_| held.saturating_add(ahead) < n) else {
        return Ok((
            PermitGrant::Full {
                pttl: minp.filter(|p| *p > 0).map(Duration::from_millis),
            },
            true,
        ));
    };
    let last = slots
        .get(slot as usize)
        .and_then(|s| s.as_ref().map(|s| s.fence))
        .unwrap_or(0)
        .max(0);
    let st = conn.by(limit, DURING, conn.prepare_cached(STEP)).await?;
    let idx = to_i32(slot);
    let stepped = conn
        .by(
            limit,
            DURING,
            conn.query_one(&st, &[&req.meta, &idx, &last]),
        )
        .await?;
    let fence: i64 = stepped
        .try_get(0)
        .map_err(|e| unexpected("the permit's fence", e))?;
    let fence_u = u64::try_from(fence)
        .ok()
        .filter(|f| *f > 0)
        .ok_or_else(|| unexpected("the permit's fence", format!("a fencing token of {fence}")))?;
    if let Some((waiter, _)) = req.place {
        let st = conn.by(limit, DURING, conn.prepare_cached(LEAVE)).await?;
        conn.by(limit, DURING, conn.execute(&st, &[&req.meta, &waiter]))
            .await?;
    }
    let key = format!("{}{slot}", req.slots);
    let st = conn.by(limit, DURING, conn.prepare_cached(HOLD)).await?;
    conn.by(
        limit,
        DURING,
        conn.execute(&st, &[&key, &req.token, &ms(req.ttl), &fence, &retention]),
    )
    .await?;
    Ok((
        PermitGrant::Granted {
            slot,
            fence: fence_u,
            sent,
        },
        true,
    ))
}

/// A count baton bounds far below `i32::MAX` ([`crate::util::permits::MAX_SLOTS`]).
fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Stores `limit` as the semaphore's limit, keeping the span at least the old limit; the limit
/// it replaced, if one counted.
///
/// # Errors
/// [`Error::Timeout`] (it may have applied); connection and server errors.
pub(crate) async fn set_limit(
    t: &PgTransport,
    meta: &str,
    slots: &str,
    limit: u32,
    retention: Duration,
) -> Result<Option<u32>, Error> {
    const DURING: &str = "setting a limit";
    let until = crate::util::time::after(Instant::now(), t.settings.response_timeout);
    let conn = connection(t, until, DURING).await?;
    conn.by(until, DURING, conn.batch_execute("BEGIN")).await?;
    let body = async {
        let (row, _) = lock_and_read(&conn, meta, slots, 0, until, DURING).await?;
        let span = row.span.max(row.stored.unwrap_or(0)).max(limit);
        let st = conn.by(until, DURING, conn.prepare_cached(STORE)).await?;
        let retention = ms(t.fence_retention(retention));
        conn.by(
            until,
            DURING,
            conn.execute(&st, &[&meta, &to_i32(limit), &to_i32(span), &retention]),
        )
        .await?;
        Ok::<_, Error>(row.stored)
    };
    match body.await {
        Ok(old) => {
            finish(&conn, "COMMIT", until, DURING).await?;
            Ok(old)
        }
        Err(e) => {
            conn.retire();
            Err(e)
        }
    }
}

/// Frees whichever slot holds `token` through a task of the client (an acquisition whose
/// outcome is unknown); never blocks, logs the outcome. The slot's lease is the backstop.
pub(crate) fn release_any_in_background(
    t: &std::sync::Arc<PgTransport>,
    slots: &str,
    topic: &str,
    token: String,
) {
    notify_in_background(
        t,
        Notifying {
            sql: RELEASE_ANY,
            during: "releasing a permit",
            done: "released a permit in the background",
            backstop: "its lease",
        },
        slots,
        topic,
        token,
    );
}

/// Takes fair waiter `waiter` out of the line of semaphore `meta` through a task of the client
/// (a wait that ended without a grant), notifying `released` on `topic` if it was in it; never
/// blocks, logs the outcome. The place's liveness is the backstop.
pub(crate) fn leave_line_in_background(
    t: &std::sync::Arc<PgTransport>,
    meta: &str,
    topic: &str,
    waiter: String,
) {
    notify_in_background(
        t,
        Notifying {
            sql: LEAVE_NOTIFY,
            during: "leaving a semaphore's line",
            done: "left a semaphore's line in the background",
            backstop: "its place's liveness",
        },
        meta,
        topic,
        waiter,
    );
}

/// A statement of the shape `$1` key, `$2` token, `$3` payload, `$4` channel that notifies
/// `released` when it changed something, and what to log about it.
struct Notifying {
    sql: &'static str,
    during: &'static str,
    done: &'static str,
    backstop: &'static str,
}

/// Runs `what` for (`key`, `token`) through a task of the client, notifying `released` on
/// `topic`; never blocks, logs the outcome.
fn notify_in_background(
    t: &std::sync::Arc<PgTransport>,
    what: Notifying,
    key: &str,
    topic: &str,
    token: String,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if t.cancel.is_cancelled() {
        return;
    }
    let (t2, key, topic) = (t.clone(), key.to_string(), topic.to_string());
    t.tracker.spawn_on(
        async move {
            let during = what.during;
            let limit = crate::util::time::after(Instant::now(), t2.settings.response_timeout);
            let changed = async {
                let conn = connection(&t2, limit, during).await?;
                let st = conn
                    .by(limit, during, conn.prepare_cached(what.sql))
                    .await?;
                let payload = format!("{topic}\nreleased");
                let rows = conn
                    .by(
                        limit,
                        during,
                        conn.query(&st, &[&key, &token, &payload, &channel_of(&topic)]),
                    )
                    .await?;
                Ok::<_, Error>(!rows.is_empty())
            }
            .await;
            match changed {
                Ok(changed) => tracing::debug!(key, changed, "{}", what.done),
                Err(e) => tracing::warn!(
                    key,
                    error = %e,
                    "{} in the background failed; {} is the backstop",
                    during,
                    what.backstop
                ),
            }
        },
        &handle,
    );
}
