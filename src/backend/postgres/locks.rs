//! The lock store on PostgreSQL (feature `postgres`), the statements the lock store seam
//! (`backend::locks`) runs there: a lock is one row of `baton_locks`, and each operation on it is one statement (one
//! round trip once the statement is prepared on the pooled connection, which `prepare_cached`
//! does once per connection).
//!
//! ```sql
//! CREATE TABLE baton_locks (
//!     key              text PRIMARY KEY,      -- the lock's name with its prefix: baton:lock:{K}
//!     token            text,                  -- the holder's random token; NULL when released
//!     expires_at       timestamptz,           -- the lease's end, on the server's clock
//!     fence            bigint NOT NULL,       -- the last fencing token granted
//!     fence_expires_at timestamptz NOT NULL   -- when the row may be deleted
//! );
//! ```
//!
//! The rules are the Redis ones, row for keys:
//!
//! - **Time is the server's**: every expiry is `clock_timestamp() + …`, and "expired" is
//!   judged against `clock_timestamp()` in the same statement, so clients' clocks never
//!   matter (as with Redis TTLs).
//! - **Acquire** is `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` the lock is free (no token,
//!   or expired): PostgreSQL locks the conflicting row and re-checks the condition on its latest
//!   version, so two acquisitions cannot both succeed. The fence becomes
//!   `max(old + 1, server time in µs)`, the rule of the lease kernel's
//!   [`next_fence`](crate::lease::next_fence) (DESIGN.md §3): tokens strictly increase also
//!   across restarts of the server and after the row was deleted, unless the server's clock
//!   goes back. A lock held in the statement's snapshot is
//!   not attempted at all (contention is a read), and its remaining time is returned as a hint
//!   for the backoff.
//! - **Release** clears the token only if it is ours, and calls `pg_notify` in the same
//!   statement, so the `released` notification is sent exactly when the release commits.
//! - **Extend** moves `expires_at` only if the token is ours and the lease has not ended;
//!   it never deletes anything.
//! - **Cleanup**: a client deletes rows whose fence retention (`fence_ttl`, at least a day and
//!   two leases, refreshed by each extension) has passed and whose lock is free, every minute.
//!   The fence outlives the lock, so a successor normally finds it and tokens step by one.

use std::time::Duration;

use tokio::time::Instant;

use std::sync::{Arc, Weak};

use super::{channel_of, PgTransport, Pooled};
use crate::error::Error;
use crate::util::lock_replies::{fence_ttl, Acquire, Extend, Extension, Grant, Stored};
use crate::util::time::after;
use crate::util::token::short;

/// The schema's name for [`PgTransport::ensure_schema`].
pub(crate) const SCHEMA_NAME: &str = "baton_locks";

/// The schema of the lock table (no extension needed): created by `migrate`, and on first use
/// only by a client that finds the table missing (see `PgTransport::ensure_schema`).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_locks (
    key              text PRIMARY KEY,
    token            text,
    expires_at       timestamptz,
    fence            bigint NOT NULL,
    fence_expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS baton_locks_fence_expires_at ON baton_locks (fence_expires_at);
";

/// Deletes rows whose fence retention has passed and whose lock is free, a bounded batch at a
/// time.
///
/// The conditions are stated twice on purpose. The subquery picks a batch from its snapshot;
/// the outer `WHERE` is what protects a grant. When a picked row is locked by an acquisition in
/// flight, the `DELETE` waits for it and then, under READ COMMITTED, re-evaluates only its own
/// `WHERE` against the row's new version (EvalPlanQual): the subquery's result is not
/// recomputed. Without the outer conditions, a row granted meanwhile (token set, retention
/// refreshed) would still match `key IN (…)` and be deleted, and the next acquisition would
/// insert a second holder.
pub(crate) const CLEANUP: &str = "
DELETE FROM baton_locks WHERE key IN (
    SELECT key FROM baton_locks
    WHERE fence_expires_at < clock_timestamp()
      AND (token IS NULL OR expires_at IS NULL OR expires_at < clock_timestamp())
    LIMIT 1000
)
  AND fence_expires_at < clock_timestamp()
  AND (token IS NULL OR expires_at IS NULL OR expires_at < clock_timestamp())";

/// How often a client runs [`CLEANUP`].
pub(crate) const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// `$1` key, `$2` token, `$3` lock ms, `$4` fence retention ms. One row: the fence if granted
/// (else NULL), and the holder's remaining ms as the statement's snapshot saw it.
///
/// `h` reads the row first: a lock held in the statement's snapshot is reported without
/// attempting the `INSERT` (a read takes no row lock and no transaction id, so contention is
/// cheap). Only a lock free in the snapshot is attempted, and the `ON CONFLICT … WHERE` re-checks
/// it on the row's latest version under the row lock: exclusion rests on that, not on `h`.
pub(crate) const ACQUIRE: &str = "
WITH c AS (SELECT clock_timestamp() AS now),
h AS (
    SELECT ceil(extract(epoch FROM l.expires_at - c.now) * 1000)::bigint AS ms
    FROM baton_locks l, c
    WHERE l.key = $1 AND l.token IS NOT NULL AND l.expires_at > c.now
),
g AS (
    INSERT INTO baton_locks AS l (key, token, expires_at, fence, fence_expires_at)
    SELECT $1, $2,
           c.now + $3::float8 * interval '1 millisecond',
           floor(extract(epoch FROM c.now) * 1000000)::bigint,
           c.now + $4::float8 * interval '1 millisecond'
    FROM c
    WHERE NOT EXISTS (SELECT 1 FROM h)
    ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token,
        expires_at = EXCLUDED.expires_at,
        fence = greatest(l.fence + 1, EXCLUDED.fence),
        fence_expires_at = greatest(l.fence_expires_at, EXCLUDED.fence_expires_at)
    WHERE l.token IS NULL OR l.expires_at IS NULL OR l.expires_at <= (SELECT now FROM c)
    RETURNING l.fence
)
SELECT (SELECT fence FROM g), (SELECT ms FROM h)";

/// `$1` key, `$2` token, `$3` notification payload, `$4` its channel ([`channel_of`]). A row only if the token was ours:
/// whether its lease had not ended yet.
const RELEASE: &str = "
WITH r AS (
    UPDATE baton_locks SET token = NULL
    WHERE key = $1 AND token = $2
    RETURNING expires_at > clock_timestamp() AS held
)
SELECT r.held, pg_notify($4, $3) FROM r";

/// `$1` key, `$2` token, `$3` lock ms, `$4` fence retention ms. A row only if extended.
const EXTEND: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
UPDATE baton_locks l
SET expires_at = c.now + $3::float8 * interval '1 millisecond',
    fence_expires_at = greatest(l.fence_expires_at, c.now + $4::float8 * interval '1 millisecond')
FROM c
WHERE l.key = $1 AND l.token = $2 AND l.expires_at > c.now
RETURNING 1";

/// `$1` key. The row's holder (NULL when free or expired), its fence, and the holder's
/// remaining ms.
const READ: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
SELECT CASE WHEN l.token IS NOT NULL AND l.expires_at > c.now THEN l.token END,
       l.fence,
       CASE WHEN l.token IS NOT NULL AND l.expires_at > c.now
            THEN ceil(extract(epoch FROM l.expires_at - c.now) * 1000)::bigint END
FROM baton_locks l, c
WHERE l.key = $1";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Creates the lock table and its index if missing, by the schema migration, then starts the
/// client's cleanup (`Locks::migrate`).
///
/// # Errors
/// Connection and permission errors; a busy table through every try.
pub(crate) async fn migrate(t: &PgTransport) -> Result<(), Error> {
    t.migrate_schema(SCHEMA).await?;
    ensure_schema(t).await
}

/// [`acquire`] for the lock store's request: the lock row `req.lock`, its fence retained for
/// [`fence_ttl`] of the lease.
///
/// # Errors
/// As [`acquire`].
pub(crate) async fn acquire_request(
    t: &PgTransport,
    req: &Acquire<'_>,
    topic: &str,
    limit: Instant,
) -> Result<Grant, Error> {
    acquire(
        t,
        req.lock,
        topic,
        req.token,
        req.ttl,
        fence_ttl(req.ttl),
        limit,
    )
    .await
}

/// [`extend`] for the lock store's request, through a weak handle (a background task's): a
/// lock row is its own guard.
///
/// # Errors
/// As [`extend`]; [`Error::Stopped`] once the client is gone; [`Error::Unsupported`] for a
/// guard other than the lease itself.
pub(crate) async fn extend_request(
    weak: &Weak<PgTransport>,
    req: &Extend<'_>,
    limit: Instant,
) -> Result<Extension, Error> {
    let Some(t) = weak.upgrade() else {
        return Err(Error::Stopped);
    };
    if req.guard != req.lease || req.guard_value != req.value {
        return Err(Error::Unsupported {
            what: "a lease extension guarded by another key",
            backend: "PostgreSQL",
            why: "a lock row is its own guard",
        });
    }
    extend(&t, req.lease, req.value, req.ttl, req.retention, limit).await
}

/// [`release`] through a task of the client's tracker, bounded by the response timeout; never
/// blocks, and logs the outcome. Without a runtime or a client that shut down it does nothing:
/// the lock's ttl is the backstop. The task holds the transport for at most one response
/// timeout.
pub(crate) fn release_in_background(t: &Arc<PgTransport>, key: &str, topic: &str, token: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if t.cancel.is_cancelled() {
        return;
    }
    let (t2, key, topic) = (t.clone(), key.to_string(), topic.to_string());
    t.tracker.spawn_on(
        async move {
            let limit = after(Instant::now(), t2.settings.response_timeout);
            match release(&t2, &key, &topic, &token, limit).await {
                Ok(ours) => tracing::debug!(
                    key,
                    token = short(&token),
                    ours,
                    "released in the background"
                ),
                Err(e) => tracing::warn!(
                    key,
                    error = %e,
                    "released in the background failed; the lock's ttl is the backstop"
                ),
            }
        },
        &handle,
    );
}

/// Creates the lock table if missing (once per client), and starts the client's cleanup.
///
/// # Errors
/// Connection and permission errors.
pub(crate) async fn ensure_schema(t: &PgTransport) -> Result<(), Error> {
    t.ensure_schema(
        SCHEMA_NAME,
        SCHEMA,
        Some((CLEANUP, t.cleanup_every(CLEANUP_EVERY))),
    )
    .await
}

/// Makes sure the table exists (once per client) and a pooled connection, by `limit`.
async fn connection(
    t: &PgTransport,
    limit: Instant,
    during: &'static str,
) -> Result<Pooled, Error> {
    t.pooled_when(ensure_schema(t), limit, during).await
}

fn unexpected(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::UnexpectedReply {
        context: what,
        reply: e.to_string(),
    }
}

/// Tries once to take lock row `key` for `ttl` with `token`, the fence kept for `retention`;
/// one statement that gives up at `limit`. `topic` is where the lock's releases are notified.
///
/// If the caller gives up once the statement may have left (a timeout, a dropped future), a
/// release by token is sent on the same pooled connection by a task of the client: a
/// connection runs its statements in order, so the release runs after the grant and never
/// overtakes it (as on Redis, where both share one connection).
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the outcome is unknown: the lock may be ours, so the caller
/// releases by token too); connection and server errors (a fence at `i64::MAX` cannot step and
/// is refused by the server with "bigint out of range").
///
/// # Cancel safety
/// Dropping it after the statement left leaves the outcome unknown, like a timeout; a lock it
/// took is released as above.
pub(crate) async fn acquire(
    t: &PgTransport,
    key: &str,
    topic: &str,
    token: &str,
    ttl: Duration,
    retention: Duration,
    limit: Instant,
) -> Result<Grant, Error> {
    const DURING: &str = "acquiring the lock";
    let conn = connection(t, limit, DURING).await?;
    let statement = conn.by(limit, DURING, conn.prepare_cached(ACQUIRE)).await?;
    let mut behind = ReleaseBehind {
        conn: Some(conn),
        key,
        topic,
        token,
        response: t.settings.response_timeout,
        tracker: &t.tracker,
    };
    let Some(conn) = behind.conn.as_ref() else {
        return Err(Error::Timeout { during: DURING });
    };
    let sent = Instant::now();
    let row = conn
        .by(
            limit,
            DURING,
            conn.query_one(
                &statement,
                &[&key, &token, &ms(ttl), &ms(t.fence_retention(retention))],
            ),
        )
        .await;
    let row = match row {
        Ok(row) => {
            behind.conn = None;
            row
        }
        // Indeterminate (a timeout, a broken connection): `behind` releases on drop.
        Err(e) if e.is_indeterminate() => return Err(e),
        Err(e) => {
            behind.conn = None;
            return Err(e);
        }
    };
    let fence: Option<i64> = row
        .try_get(0)
        .map_err(|e| unexpected("the lock acquisition", e))?;
    let pttl: Option<i64> = row
        .try_get(1)
        .map_err(|e| unexpected("the lock acquisition", e))?;
    match fence {
        Some(f) if f > 0 => Ok(Grant::Granted {
            fence: f as u64,
            sent,
        }),
        Some(f) => Err(unexpected(
            "the lock acquisition",
            format!("a fencing token of {f}"),
        )),
        None => Ok(Grant::Held {
            pttl: pttl
                .and_then(|p| u64::try_from(p).ok())
                .filter(|p| *p > 0)
                .map(Duration::from_millis),
        }),
    }
}

/// While armed (`conn` is `Some`), dropping it sends a release by token on `conn`, behind
/// whatever that connection was sent before (see [`acquire`]).
struct ReleaseBehind<'a> {
    conn: Option<Pooled>,
    key: &'a str,
    topic: &'a str,
    token: &'a str,
    response: Duration,
    tracker: &'a tokio_util::task::TaskTracker,
}

impl Drop for ReleaseBehind<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, token) = (self.key.to_string(), self.token.to_string());
        let payload = format!("{}\nreleased", self.topic);
        let channel = channel_of(self.topic);
        let response = self.response;
        self.tracker.spawn_on(
            async move {
                let limit = Instant::now() + response;
                let released = async {
                    let st = conn
                        .by(limit, "releasing the lock", conn.prepare_cached(RELEASE))
                        .await?;
                    conn.by(
                        limit,
                        "releasing the lock",
                        conn.query(&st, &[&key, &token, &payload, &channel]),
                    )
                    .await
                }
                .await;
                match released {
                    Ok(rows) => tracing::debug!(
                        key,
                        ours = !rows.is_empty(),
                        "an abandoned acquisition released on its own connection"
                    ),
                    _ => tracing::debug!(
                        key,
                        "an abandoned acquisition's release failed; the release by token on \
                         another connection and the ttl are the backstops"
                    ),
                }
            },
            &handle,
        );
    }
}

/// Releases lock row `key` if it holds `token`, notifying `released` on `topic` in the same
/// statement; gives up at `limit`. `Ok(false)`: it was no longer ours (or its lease had
/// ended).
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the release may have applied); connection and server errors.
pub(crate) async fn release(
    t: &PgTransport,
    key: &str,
    topic: &str,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    const DURING: &str = "releasing the lock";
    let conn = connection(t, limit, DURING).await?;
    let statement = conn.by(limit, DURING, conn.prepare_cached(RELEASE)).await?;
    let payload = format!("{topic}\nreleased");
    let channel = channel_of(topic);
    let rows = conn
        .by(
            limit,
            DURING,
            conn.query(&statement, &[&key, &token, &payload, &channel]),
        )
        .await?;
    match rows.first() {
        None => Ok(false),
        Some(row) => {
            let held: Option<bool> = row
                .try_get(0)
                .map_err(|e| unexpected("the lock release", e))?;
            Ok(held.unwrap_or(false))
        }
    }
}

/// Extends lock row `key` to `ttl` from now (server time) if it holds `token` and its lease
/// has not ended, the fence's retention to at least `retention`; gives up at `limit`.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the extension may have applied); connection and server
/// errors.
///
/// # Cancel safety
/// Cancel safe: the lease is then as if it was not extended.
pub(crate) async fn extend(
    t: &PgTransport,
    key: &str,
    token: &str,
    ttl: Duration,
    retention: Duration,
    limit: Instant,
) -> Result<Extension, Error> {
    const DURING: &str = "extending the lease";
    let conn = connection(t, limit, DURING).await?;
    let statement = conn.by(limit, DURING, conn.prepare_cached(EXTEND)).await?;
    let sent = Instant::now();
    let rows = conn
        .by(
            limit,
            DURING,
            conn.query(
                &statement,
                &[&key, &token, &ms(ttl), &ms(t.fence_retention(retention))],
            ),
        )
        .await?;
    if rows.is_empty() {
        // What was read is not reported on PostgreSQL: the row said no, nothing more.
        Ok(Extension::Refused)
    } else {
        Ok(Extension::Confirmed { sent })
    }
}

/// Lock row `key` as stored (see [`Stored`]), in one statement bounded by the response
/// timeout; a missing row is a free lock that was never granted (or was cleaned up).
///
/// # Errors
/// [`Error::Timeout`]; connection and server errors.
pub(crate) async fn read(t: &PgTransport, key: &str) -> Result<Stored, Error> {
    const DURING: &str = "reading the lock";
    let limit = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, limit, DURING).await?;
    let statement = conn.by(limit, DURING, conn.prepare_cached(READ)).await?;
    let row = conn
        .by(limit, DURING, conn.query_opt(&statement, &[&key]))
        .await?;
    let Some(row) = row else {
        return Ok(Stored {
            value: None,
            fence: None,
            pttl: None,
        });
    };
    let value: Option<String> = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
    let fence: i64 = row.try_get(1).map_err(|e| unexpected(DURING, e))?;
    let pttl: Option<i64> = row.try_get(2).map_err(|e| unexpected(DURING, e))?;
    Ok(Stored {
        value,
        fence: Some(fence.to_string()),
        pttl: pttl
            .and_then(|p| u64::try_from(p).ok())
            .map(Duration::from_millis),
    })
}

/// Sends `message` on notification topic `topic` (one statement on a pooled connection).
///
/// # Errors
/// Connection and server errors.
pub(crate) async fn notify(t: &PgTransport, topic: &str, message: &str) -> Result<(), Error> {
    const DURING: &str = "notifying";
    let limit = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, limit, DURING).await?;
    let payload = format!("{topic}\n{message}");
    let statement = conn
        .by(
            limit,
            DURING,
            conn.prepare_cached("SELECT pg_notify($1, $2)"),
        )
        .await?;
    conn.by(
        limit,
        DURING,
        conn.execute(&statement, &[&channel_of(topic), &payload]),
    )
    .await?;
    Ok(())
}

/// One page of the listing: lock rows after `$1` whose key starts with `$2`, in key order, at
/// most `$3` (keyset pagination, as the job table's page): key, live holder, fence, the
/// holder's remaining ms.
const PAGE: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
SELECT l.key,
       CASE WHEN l.token IS NOT NULL AND l.expires_at > c.now THEN l.token END,
       l.fence,
       CASE WHEN l.token IS NOT NULL AND l.expires_at > c.now
            THEN ceil(extract(epoch FROM l.expires_at - c.now) * 1000)::bigint END
FROM baton_locks l, c
WHERE l.key > $1 AND left(l.key, length($2)) = $2
ORDER BY l.key
LIMIT $3";

/// A page of lock rows under `prefix` after key `after` (see [`PAGE`]), each with its key and
/// what [`read`] would return for it.
///
/// # Errors
/// [`Error::Timeout`]; connection and server errors.
pub(crate) async fn page(
    t: &PgTransport,
    prefix: &str,
    after: &str,
    limit: i64,
) -> Result<Vec<(String, Stored)>, Error> {
    const DURING: &str = "listing locks";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let statement = conn.by(deadline, DURING, conn.prepare_cached(PAGE)).await?;
    let rows = conn
        .by(
            deadline,
            DURING,
            conn.query(&statement, &[&after, &prefix, &limit]),
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
        let value: Option<String> = row.try_get(1).map_err(|e| unexpected(DURING, e))?;
        let fence: i64 = row.try_get(2).map_err(|e| unexpected(DURING, e))?;
        let pttl: Option<i64> = row.try_get(3).map_err(|e| unexpected(DURING, e))?;
        out.push((
            key,
            Stored {
                value,
                fence: Some(fence.to_string()),
                pttl: pttl
                    .and_then(|p| u64::try_from(p).ok())
                    .map(Duration::from_millis),
            },
        ));
    }
    Ok(out)
}
