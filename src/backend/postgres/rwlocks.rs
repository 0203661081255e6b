//! The read-write lock on PostgreSQL (feature `postgres`): the lock's state is one row of
//! `baton_rwlocks`, and every holder's lease is a row of the lock table `baton_locks` of its
//! own (key `P` `rw:{K}:h:TOKEN`), so a holder extends as a mutex does and a crashed holder's
//! share ends when that row's lease does, by the server's clock.
//!
//! ```sql
//! CREATE TABLE baton_rwlocks (
//!     key           text PRIMARY KEY,   -- P rw:{K}
//!     fence         bigint NOT NULL,    -- the last write's fencing token
//!     writer        text,               -- holders' tokens
//!     upgrader      text,
//!     readers       text[] NOT NULL,
//!     waiting       text,               -- the "writer waiting" mark: its token ...
//!     waiting_until timestamptz,        -- ... and its lease
//!     retain_until  timestamptz NOT NULL
//! );
//! ```
//!
//! A try is one transaction: the state row is upserted and so locked (`INSERT … ON CONFLICT DO
//! UPDATE` locks the row it finds), the named holders' leases are read, the rule
//! (`util::rw_replies::decide`, the Redis scripts' rule) decides, and the row, the holder's
//! lease row and the fence are written before the commit: tries on one lock are serialized by
//! the row lock. The fence steps to `max(old + 1, server time in µs, last + 1)`. A release and a
//! downgrade are one statement each, with `pg_notify` in it. Rows of `baton_rwlocks` are kept
//! (one per lock name); holder rows are deleted by their release, and by the lock table's
//! cleanup after a crash.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::hub::channel_of;
use super::{PgTransport, Pooled};
use crate::error::Error;
use crate::util::lock_replies::fence_ttl;
use crate::util::rw_replies::{decide, MarkChange, RwAcquire, RwGrant, RwKeysRef, RwMode, RwState};
use crate::util::time::after;
use crate::util::token::short;

/// The schema's name for [`PgTransport::ensure_schema`].
pub(crate) const SCHEMA_NAME: &str = "baton_rwlocks";

/// The state table (the holders' leases are rows of `baton_locks`).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_rwlocks (
    key           text PRIMARY KEY,
    fence         bigint NOT NULL,
    writer        text,
    upgrader      text,
    readers       text[] NOT NULL,
    waiting       text,
    waiting_until timestamptz,
    retain_until  timestamptz NOT NULL
);
";

/// `$1` key. Upserts the state row (locking it) and returns it, the mark only while it lives.
const LOCK_STATE: &str = "
INSERT INTO baton_rwlocks AS r (key, fence, readers, retain_until)
VALUES ($1, 0, '{}', clock_timestamp())
ON CONFLICT (key) DO UPDATE SET key = r.key
RETURNING r.fence, r.writer, r.upgrader, r.readers,
    CASE WHEN r.waiting_until > clock_timestamp() THEN r.waiting END,
    CASE WHEN r.waiting_until > clock_timestamp()
         THEN ceil(extract(epoch FROM r.waiting_until - clock_timestamp()) * 1000)::bigint END";

/// `$1` lease keys. The holders among them whose lease has not ended, with their remaining ms.
const LIVE: &str = "
SELECT token, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
FROM baton_locks
WHERE key = ANY($1::text[]) AND token IS NOT NULL AND expires_at > clock_timestamp()";

/// `$1` key, `$2` step the fence, `$3` the holder's last token, `$4` writer, `$5` upgrader,
/// `$6` readers, `$7` mark change (0 keep, 1 set, 2 clear), `$8` mark ms, `$9` mark token,
/// `$10` retention ms. The fence after the write.
const APPLY: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
UPDATE baton_rwlocks r SET
    fence = CASE WHEN $2 THEN greatest(r.fence + 1,
                                       floor(extract(epoch FROM c.now) * 1000000)::bigint,
                                       $3::bigint + 1)
                 ELSE r.fence END,
    writer = $4, upgrader = $5, readers = $6::text[],
    waiting = CASE $7::int WHEN 1 THEN $9 WHEN 2 THEN NULL ELSE r.waiting END,
    waiting_until = CASE $7::int WHEN 1 THEN c.now + $8::float8 * interval '1 millisecond'
                                 WHEN 2 THEN NULL ELSE r.waiting_until END,
    retain_until = greatest(r.retain_until, c.now + $10::float8 * interval '1 millisecond')
FROM c
WHERE r.key = $1
RETURNING r.fence";

/// `$1` lease key, `$2` token, `$3` lease ms, `$4` fence. The holder's own lease row.
const HOLD: &str = "
INSERT INTO baton_locks (key, token, expires_at, fence, fence_expires_at)
VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond', $4,
        clock_timestamp() + $3::float8 * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE
SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at, fence = EXCLUDED.fence,
    fence_expires_at = EXCLUDED.fence_expires_at";

/// `$1` state key, `$2` lease key, `$3` token, `$4` payload, `$5` channel. Ends the hold
/// whatever its mode; one row: whether its lease was still its own.
const RELEASE: &str = "
WITH d AS (
    DELETE FROM baton_locks WHERE key = $2 AND token = $3
    RETURNING expires_at > clock_timestamp() AS held
),
u AS (
    UPDATE baton_rwlocks SET readers = array_remove(readers, $3),
        writer = NULLIF(writer, $3), upgrader = NULLIF(upgrader, $3),
        waiting = NULLIF(waiting, $3)
    WHERE key = $1
    RETURNING 1
)
SELECT coalesce((SELECT held FROM d), false), (SELECT count(*) FROM u), pg_notify($5, $4)";

/// `$1` state key, `$2` lease key, `$3` token, `$4` payload, `$5` channel. The writer back to
/// the upgradeable reader; a row only if it was the writer with a live lease.
const DOWNGRADE: &str = "
WITH u AS (
    UPDATE baton_rwlocks SET writer = NULL, upgrader = $3
    WHERE key = $1 AND writer = $3
      AND EXISTS (SELECT 1 FROM baton_locks
                  WHERE key = $2 AND token = $3 AND expires_at > clock_timestamp())
    RETURNING 1
)
SELECT pg_notify($5, $4) FROM u";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn unexpected(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::UnexpectedReply {
        context: what,
        reply: e.to_string(),
    }
}

/// Creates the state table if missing (`Client::migrate`), and the lock table its holders'
/// leases live in.
///
/// # Errors
/// Connection and permission errors; a busy table through every try.
pub(crate) async fn migrate(t: &PgTransport) -> Result<(), Error> {
    t.migrate_schema(SCHEMA).await?;
    super::locks::migrate(t).await
}

/// Both tables, created on first use where the role may (once per client).
pub(crate) async fn ensure(t: &PgTransport) -> Result<(), Error> {
    super::locks::ensure_schema(t).await?;
    t.ensure_schema(SCHEMA_NAME, SCHEMA, None).await
}

async fn connection(
    t: &PgTransport,
    limit: Instant,
    during: &'static str,
) -> Result<Pooled, Error> {
    t.pooled_when(ensure(t), limit, during).await
}

/// What a decision needs to know about the request.
struct Ask<'a> {
    keys: RwKeysRef<'a>,
    token: &'a str,
    mode: RwMode,
    /// `Some(guard's token)` for an upgrade.
    upgrade: Option<u64>,
    lease: Duration,
    mark: Duration,
}

/// One try (or upgrade) in one transaction, giving up at `limit`. On an error once the
/// transaction began the connection is retired (closed, so the server rolls back).
async fn run(t: &PgTransport, ask: &Ask<'_>, limit: Instant) -> Result<RwGrant, Error> {
    const DURING: &str = "acquiring the read-write lock";
    let conn = connection(t, limit, DURING).await?;
    let sent = Instant::now();
    conn.by(limit, DURING, conn.batch_execute("BEGIN")).await?;
    let outcome = transact(&conn, ask, limit, sent).await;
    match outcome {
        Ok(Some(grant)) => match conn.by(limit, DURING, conn.batch_execute("COMMIT")).await {
            Ok(()) => Ok(grant),
            Err(e) => {
                conn.retire();
                Err(e)
            }
        },
        Ok(None) => Err(Error::lock_lost(
            ask.keys.state,
            ask.upgrade,
            "the upgradeable read's lease ended before the upgrade",
        ))
        .inspect_err(|_| conn.retire()),
        Err(e) => {
            conn.retire();
            Err(e)
        }
    }
}

/// The statements between `BEGIN` and `COMMIT`; `Ok(None)` when an upgrade's guard no longer
/// holds the upgradeable read.
async fn transact(
    conn: &Pooled,
    ask: &Ask<'_>,
    limit: Instant,
    sent: Instant,
) -> Result<Option<RwGrant>, Error> {
    const DURING: &str = "acquiring the read-write lock";
    let st = conn
        .by(limit, DURING, conn.prepare_cached(LOCK_STATE))
        .await?;
    let row = conn
        .by(limit, DURING, conn.query_one(&st, &[&ask.keys.state]))
        .await?;
    let bad = |e| unexpected("the read-write lock's state", e);
    let fence: i64 = row.try_get(0).map_err(bad)?;
    let mut state = RwState {
        writer: row.try_get(1).map_err(bad)?,
        upgrader: row.try_get(2).map_err(bad)?,
        readers: row.try_get(3).map_err(bad)?,
        waiting: None,
    };
    let (mark_token, mark_ms): (Option<String>, Option<i64>) =
        (row.try_get(4).map_err(bad)?, row.try_get(5).map_err(bad)?);
    if let (Some(tk), Some(m)) = (mark_token, mark_ms) {
        state.waiting = Some((tk, u64::try_from(m).unwrap_or(0)));
    }
    let mut named: Vec<String> = state.readers.clone();
    named.extend(state.writer.iter().cloned());
    named.extend(state.upgrader.iter().cloned());
    if ask.upgrade.is_some() {
        named.push(ask.token.to_string());
    }
    let lease_keys: Vec<String> = named
        .iter()
        .map(|tk| format!("{}{tk}", ask.keys.holder_prefix))
        .collect();
    let st = conn.by(limit, DURING, conn.prepare_cached(LIVE)).await?;
    let rows = conn
        .by(limit, DURING, conn.query(&st, &[&lease_keys]))
        .await?;
    let mut live: HashMap<String, u64> = HashMap::new();
    for r in rows {
        let tk: String = r.try_get(0).map_err(bad)?;
        let p: i64 = r.try_get(1).map_err(bad)?;
        live.insert(tk, u64::try_from(p).unwrap_or(0));
    }
    if ask.upgrade.is_some()
        && (state.upgrader.as_deref() != Some(ask.token) || !live.contains_key(ask.token))
    {
        return Ok(None);
    }
    let d = decide(
        &state,
        &|tk| live.get(tk).copied(),
        ask.token,
        ask.mode,
        ask.upgrade.is_some(),
        ask.mark,
    );
    let step = d.granted && (ask.mode == RwMode::Write || ask.upgrade.is_some());
    let (change, mark_for): (i32, f64) = match d.mark {
        MarkChange::Keep => (0, 0.0),
        MarkChange::Set(m) => (1, ms(m)),
        MarkChange::Clear => (2, 0.0),
    };
    let last = i64::try_from(ask.upgrade.unwrap_or(0)).unwrap_or(i64::MAX);
    let st = conn.by(limit, DURING, conn.prepare_cached(APPLY)).await?;
    let row = conn
        .by(
            limit,
            DURING,
            conn.query_one(
                &st,
                &[
                    &ask.keys.state,
                    &step,
                    &last,
                    &d.state.writer,
                    &d.state.upgrader,
                    &d.state.readers,
                    &change,
                    &mark_for,
                    &ask.token,
                    &ms(fence_ttl(ask.lease)),
                ],
            ),
        )
        .await?;
    let fence_now: i64 = row.try_get(0).map_err(bad)?;
    if !d.granted {
        return Ok(Some(RwGrant::Busy {
            retry: d.retry.map(Duration::from_millis),
        }));
    }
    let fence = if step { fence_now } else { fence };
    if ask.upgrade.is_none() {
        let st = conn.by(limit, DURING, conn.prepare_cached(HOLD)).await?;
        let lease_key = format!("{}{}", ask.keys.holder_prefix, ask.token);
        conn.by(
            limit,
            DURING,
            conn.execute(&st, &[&lease_key, &ask.token, &ms(ask.lease), &fence]),
        )
        .await?;
    }
    let fence = u64::try_from(fence).map_err(|_| {
        unexpected(
            "the read-write lock's state",
            format!("a fencing token of {fence}"),
        )
    })?;
    Ok(Some(RwGrant::Granted { fence, sent }))
}

/// One try to take the lock as `req` says.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the grant may have committed: release by token); connection,
/// permission and server errors.
pub(crate) async fn try_acquire(
    t: &PgTransport,
    req: &RwAcquire<'_>,
    limit: Instant,
) -> Result<RwGrant, Error> {
    let ask = Ask {
        keys: req.keys,
        token: req.token,
        mode: req.mode,
        upgrade: None,
        lease: req.lease,
        mark: req.mark,
    };
    run(t, &ask, limit).await
}

/// One try to turn the upgradeable reader `token` (fencing token `last`) into the writer.
///
/// # Errors
/// As [`try_acquire`]; [`Error::LeaseLost`] when `token` no longer holds the upgradeable read.
pub(crate) async fn try_upgrade(
    t: &PgTransport,
    keys: &RwKeysRef<'_>,
    token: &str,
    last: u64,
    lease: Duration,
    mark: Duration,
    limit: Instant,
) -> Result<RwGrant, Error> {
    let ask = Ask {
        keys: *keys,
        token,
        mode: RwMode::Write,
        upgrade: Some(last),
        lease,
        mark,
    };
    run(t, &ask, limit).await
}

/// The writer `token` back to the upgradeable reader; `Ok(false)` when it no longer was.
///
/// # Errors
/// [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn downgrade(
    t: &PgTransport,
    keys: &RwKeysRef<'_>,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    const DURING: &str = "downgrading the read-write lock";
    let conn = connection(t, limit, DURING).await?;
    let st = conn
        .by(limit, DURING, conn.prepare_cached(DOWNGRADE))
        .await?;
    let lease_key = format!("{}{token}", keys.holder_prefix);
    let payload = format!("{}\nreleased", keys.channel);
    let rows = conn
        .by(
            limit,
            DURING,
            conn.query(
                &st,
                &[
                    &keys.state,
                    &lease_key,
                    &token,
                    &payload,
                    &channel_of(keys.channel),
                ],
            ),
        )
        .await?;
    Ok(!rows.is_empty())
}

/// Ends `token`'s hold whatever its mode and notifies waiters; `Ok(false)` when its lease was
/// no longer its own.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the release may have applied); connection and server errors.
pub(crate) async fn release(
    t: &PgTransport,
    keys: &RwKeysRef<'_>,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    const DURING: &str = "releasing the read-write lock";
    let conn = connection(t, limit, DURING).await?;
    let st = conn.by(limit, DURING, conn.prepare_cached(RELEASE)).await?;
    let lease_key = format!("{}{token}", keys.holder_prefix);
    let payload = format!("{}\nreleased", keys.channel);
    let row = conn
        .by(
            limit,
            DURING,
            conn.query_one(
                &st,
                &[
                    &keys.state,
                    &lease_key,
                    &token,
                    &payload,
                    &channel_of(keys.channel),
                ],
            ),
        )
        .await?;
    row.try_get::<_, bool>(0)
        .map_err(|e| unexpected("the read-write lock's release", e))
}

/// A [`release`] through a task of the client; never blocks (the lease is the backstop).
pub(crate) fn release_in_background(t: &Arc<PgTransport>, keys: &RwKeysRef<'_>, token: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if t.cancel.is_cancelled() {
        return;
    }
    let t2 = t.clone();
    let owned = [
        keys.state.to_string(),
        keys.waiting.to_string(),
        keys.holder_prefix.to_string(),
        keys.channel.to_string(),
    ];
    t.tracker.spawn_on(
        async move {
            let [state, waiting, holder_prefix, channel] = &owned;
            let keys = RwKeysRef {
                state,
                waiting,
                holder_prefix,
                channel,
            };
            let limit = after(Instant::now(), t2.settings.response_timeout);
            match release(&t2, &keys, &token, limit).await {
                Ok(ours) => {
                    tracing::debug!(key = %state, token = short(&token), ours, "released in the background")
                }
                Err(e) => tracing::warn!(
                    key = %state,
                    error = %e,
                    "release in the background failed; the lease is the backstop"
                ),
            }
        },
        &handle,
    );
}
