//! The schedule's record on PostgreSQL (feature `postgres`): three tables, created by
//! `migrate` and on first use like `baton_jobs`.
//!
//! * `baton_schedules`: one row per schedule key and digest, the spec and summary (first and
//!   last seen, newest tick and its outcome, newest success, the hosts seen as a JSON object
//!   host → last-seen ms, at most 64) and the row's expiry (the record's lifetime after its
//!   last write). A row past its expiry reads as absent.
//! * `baton_schedule_history`: one row per occurrence on record (the entry's JSON, the same
//!   as on Redis), the newest N per schedule; read only beside a live summary.
//! * `baton_schedule_control`: one row per paused key (no digest: a key may be paused before
//!   any host registered it).
//!
//! The `key` column holds the key with its prefix in the jobs' form, `baton:{nightly}` (the
//! braces keep prefix `baton:` with key `a:b` apart from prefix `baton:a:` with key `b`).
//!
//! A change is **one statement** ([`WRITE`]): the summary's upsert, each occurrence's merge
//! (`INSERT … ON CONFLICT DO UPDATE`, so the merge reads the row as locked, never a stale
//! snapshot: two hosts' writes to one occurrence both land) and the trim to the newest N, all
//! stamped with one `clock_timestamp()`. It is the same second write as on Redis: after the
//! job's own transition, never inside it. Expired rows are deleted by the client's background
//! cleanup ([`CLEANUP`]), as the jobs' are.

use std::time::Duration;

use tokio::time::Instant;

use super::{PgTransport, Pooled};
use crate::error::Error;
use crate::util::schedule_record::{RawPause, RawRecord, RecordWrite, WireEntry, MAX_HOSTS};

/// The schema's name for [`PgTransport::ensure_schema`].
pub(crate) const SCHEMA_NAME: &str = "baton_schedules";

/// The record's tables (no extension needed).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_schedules (
    key          text NOT NULL,
    digest       text NOT NULL,
    spec         jsonb NOT NULL,
    first_seen   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL,
    last_tick    timestamptz,
    last_success timestamptz,
    last_outcome text,
    hosts        jsonb NOT NULL DEFAULT '{}',
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (key, digest)
);
CREATE TABLE IF NOT EXISTS baton_schedule_history (
    key    text NOT NULL,
    digest text NOT NULL,
    tick   timestamptz NOT NULL,
    entry  jsonb NOT NULL,
    PRIMARY KEY (key, digest, tick)
);
CREATE TABLE IF NOT EXISTS baton_schedule_control (
    key   text PRIMARY KEY,
    until timestamptz,
    by    text NOT NULL,
    at    timestamptz NOT NULL,
    note  text
);
CREATE INDEX IF NOT EXISTS baton_schedules_expires_at ON baton_schedules (expires_at);
";

/// Deletes expired records (summary and history together, a bounded batch at a time) and
/// pauses a day past their `until` (as the Redis key's expiry). The summary's expiry is
/// checked again in the outer `WHERE`, as the jobs' cleanup does: a write that refreshed it
/// meanwhile keeps its record.
pub(crate) const CLEANUP: &str = "
WITH gone AS (
    DELETE FROM baton_schedules WHERE (key, digest) IN (
        SELECT key, digest FROM baton_schedules WHERE expires_at < clock_timestamp() LIMIT 1000
    ) AND expires_at < clock_timestamp()
    RETURNING key, digest
)
DELETE FROM baton_schedule_history h USING gone
WHERE h.key = gone.key AND h.digest = gone.digest;
DELETE FROM baton_schedule_control WHERE until + interval '1 day' < clock_timestamp();
";

/// How often a client deletes expired records.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// An outcome's rung on the precedence ladder (as the Redis script's `rank`): an
/// occurrence's outcome only moves up; `running` and `failed` share a rung.
macro_rules! rank {
    ($o:expr) => {
        concat!(
            "(CASE ",
            $o,
            " WHEN 'missed' THEN 0 WHEN 'skipped_overlap' THEN 1 WHEN 'skipped_paused' THEN 1 \
             WHEN 'done' THEN 3 WHEN 'exhausted' THEN 3 WHEN 'replaced' THEN 3 ELSE 2 END)"
        )
    };
}

/// What an attempt's own outcome says of its occurrence (while no later attempt is on record):
/// the outcome its end settles, if any (a buffered occurrence whose window closed), else its
/// own outcome's.
macro_rules! of_attempt {
    ($a:expr) => {
        concat!(
            "COALESCE(",
            $a,
            "->>'settle', (CASE ",
            $a,
            "->>'outcome' WHEN 'done' THEN 'done' WHEN 'failed' THEN 'failed' \
             WHEN 'lost' THEN 'failed' ELSE 'running' END))"
        )
    };
}

/// One change to a schedule's record. `$1` key, `$2` digest, `$3` spec JSON, `$4` host, `$5`
/// history size N, `$6` lifetime ms, `$7` max hosts, `$8` the changes (a JSON array of the
/// same objects the Redis script takes). Returns the newest tick on record before the write
/// (ms; NULL when none, or the record had expired).
///
/// The merge of a change into an existing entry (the `DO UPDATE`) is the script's: the
/// attempt merged by number (`start`/`end` of -1 stamped with the server's now), the outcome
/// applied by precedence, `missed` never written over an entry. Only changes among the N
/// newest ticks are written; older rows are deleted.
const WRITE: &str = concat!(
    "
WITH now AS (
    SELECT t, round(extract(epoch FROM t) * 1000)::bigint AS ms
    FROM (SELECT clock_timestamp() AS t) c
),
live AS (
    SELECT s.last_tick FROM baton_schedules s, now
    WHERE s.key = $1 AND s.digest = $2 AND s.expires_at > now.t
),
ch AS (
    SELECT c->>'id' AS id,
           (c->>'tick')::bigint AS tick_ms,
           to_timestamp((c->>'tick')::float8 / 1000) AS tick,
           c->>'n' AS n,
           CASE WHEN jsonb_typeof(c->'attempt') = 'object' THEN
               (c->'attempt')
               || CASE WHEN c->'attempt'->>'start' = '-1'
                       THEN jsonb_build_object('start', now.ms) ELSE '{}'::jsonb END
               || CASE WHEN c->'attempt'->>'end' = '-1'
                       THEN jsonb_build_object('end', now.ms) ELSE '{}'::jsonb END
           END AS a,
           c->>'outcome' AS outcome,
           c->>'note' AS note
    FROM jsonb_array_elements($8::text::jsonb) c, now
),
keep AS (
    SELECT tick FROM (
        SELECT h.tick FROM baton_schedule_history h
        WHERE h.key = $1 AND h.digest = $2 AND EXISTS (SELECT 1 FROM live)
        UNION SELECT tick FROM ch
    ) u
    ORDER BY tick DESC LIMIT $5
),
hist AS (
    INSERT INTO baton_schedule_history AS h (key, digest, tick, entry)
    SELECT $1, $2, ch.tick,
           jsonb_build_object(
               'tick', ch.tick_ms, 'id', ch.id,
               'outcome', COALESCE(ch.outcome,
                   CASE WHEN ch.a IS NULL THEN 'running' ELSE ",
    of_attempt!("ch.a"),
    " END),
               'attempts', CASE WHEN ch.n IS NULL OR ch.a IS NULL THEN '{}'::jsonb
                                ELSE jsonb_build_object(ch.n, ch.a) END)
           || CASE WHEN ch.note IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('note', ch.note) END
    FROM ch WHERE ch.tick IN (SELECT tick FROM keep)
    ON CONFLICT (key, digest, tick) DO UPDATE SET entry = (
        SELECT m.e
               || jsonb_build_object('attempts', m.attempts, 'outcome',
                      CASE WHEN m.want IS NOT NULL AND (",
    rank!("m.want"),
    " >= ",
    rank!("(m.e->>'outcome')"),
    " OR (m.want = ma.a->>'settle' AND ",
    rank!("(m.e->>'outcome')"),
    " < 3))
                           THEN m.want ELSE m.e->>'outcome' END)
               || CASE WHEN c.note IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('note', c.note) END
        FROM ch c,
             LATERAL (SELECT COALESCE(h.entry->'attempts'->c.n, '{}'::jsonb) || c.a AS a) ma,
             LATERAL (SELECT
                 h.entry AS e,
                 CASE WHEN c.n IS NULL OR c.a IS NULL
                      THEN COALESCE(h.entry->'attempts', '{}'::jsonb)
                      ELSE COALESCE(h.entry->'attempts', '{}'::jsonb)
                           || jsonb_build_object(c.n, ma.a) END AS attempts,
                 COALESCE(c.outcome, CASE
                     WHEN c.n IS NOT NULL AND c.a IS NOT NULL AND NOT EXISTS (
                         SELECT 1 FROM jsonb_object_keys(
                             COALESCE(h.entry->'attempts', '{}'::jsonb)) k
                         WHERE k::numeric > c.n::numeric)
                     THEN ",
    of_attempt!("ma.a"),
    " END) AS want) m
        WHERE c.tick = EXCLUDED.tick)
    WHERE EXCLUDED.entry->>'outcome' <> 'missed'
    RETURNING h.tick, h.entry
),
trimmed AS (
    DELETE FROM baton_schedule_history h
    WHERE h.key = $1 AND h.digest = $2 AND h.tick NOT IN (SELECT tick FROM keep)
),
top AS (
    SELECT tick, outcome FROM (
        SELECT tick, entry->>'outcome' AS outcome FROM hist
        UNION ALL
        SELECT h.tick, h.entry->>'outcome' FROM baton_schedule_history h
        WHERE h.key = $1 AND h.digest = $2 AND EXISTS (SELECT 1 FROM live)
          AND h.tick IN (SELECT tick FROM keep) AND h.tick NOT IN (SELECT tick FROM hist)
    ) u
    ORDER BY tick DESC LIMIT 1
),
success AS (
    SELECT max(COALESCE((ch.a->>'end')::bigint, now.ms)) AS ms FROM ch, now
    WHERE ch.a->>'outcome' = 'done' AND ch.a->>'settle' IS NULL
),
summary AS (
    INSERT INTO baton_schedules AS s (key, digest, spec, first_seen, last_seen, last_tick,
                                      last_success, last_outcome, hosts, expires_at)
    SELECT $1, $2, $3::text::jsonb, now.t, now.t, (SELECT tick FROM top),
           to_timestamp((SELECT ms FROM success)::float8 / 1000),
           (SELECT outcome FROM top), jsonb_build_object($4::text, now.ms),
           now.t + $6::float8 * interval '1 millisecond'
    FROM now
    ON CONFLICT (key, digest) DO UPDATE SET
        spec = EXCLUDED.spec,
        first_seen = CASE WHEN s.expires_at > EXCLUDED.last_seen THEN s.first_seen
                          ELSE EXCLUDED.first_seen END,
        last_seen = EXCLUDED.last_seen,
        last_tick = COALESCE(EXCLUDED.last_tick, s.last_tick),
        last_outcome = COALESCE(EXCLUDED.last_outcome, s.last_outcome),
        last_success = CASE WHEN s.expires_at > EXCLUDED.last_seen
                            THEN GREATEST(s.last_success, EXCLUDED.last_success)
                            ELSE EXCLUDED.last_success END,
        hosts = (SELECT COALESCE(jsonb_object_agg(k, v), '{}'::jsonb) FROM (
                    SELECT k, v FROM jsonb_each(
                        CASE WHEN s.expires_at > EXCLUDED.last_seen THEN s.hosts
                             ELSE '{}'::jsonb END || EXCLUDED.hosts) AS x(k, v)
                    ORDER BY v::text::numeric DESC, k LIMIT $7) kept),
        expires_at = GREATEST(s.expires_at, EXCLUDED.expires_at)
    RETURNING 1
)
SELECT round(extract(epoch FROM (SELECT last_tick FROM live)) * 1000)::bigint,
       (SELECT count(*) FROM summary)"
);

/// Makes sure the tables exist (once per client) and the client deletes expired records.
async fn ensure_schema(t: &PgTransport) -> Result<(), Error> {
    t.ensure_schema(
        SCHEMA_NAME,
        SCHEMA,
        Some((CLEANUP, t.cleanup_every(CLEANUP_EVERY))),
    )
    .await
}

/// Creates the tables and their index if missing (`Failover::migrate`), then starts the
/// client's cleanup.
///
/// # Errors
/// Connection and permission errors; a busy table through every try.
pub(crate) async fn migrate(t: &PgTransport) -> Result<(), Error> {
    t.migrate_schema(SCHEMA).await?;
    ensure_schema(t).await
}

/// The `key` column of schedule key `key` under `prefix`.
fn column(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// The schedule key of `column` under `prefix` (the inverse of [`column`]).
fn key_of(prefix: &str, column: &str) -> Option<String> {
    let inner = column.strip_prefix(prefix)?.strip_prefix('{')?;
    let key = inner.strip_suffix('}')?;
    (!key.contains(['{', '}'])).then(|| key.to_string())
}

/// A pooled connection once the tables exist, by `limit`.
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

/// Applies `w` in one statement; the newest tick on record before it (ms).
pub(crate) async fn write(t: &PgTransport, w: &RecordWrite) -> Result<Option<i64>, Error> {
    const DURING: &str = "writing a schedule's record";
    let deadline = Instant::now() + t.settings.response_timeout;
    let changes = serde_json::to_string(&w.changes).map_err(|e| unexpected(DURING, e))?;
    let conn = connection(t, deadline, DURING).await?;
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(WRITE))
        .await?;
    let key = column(&w.prefix, &w.key);
    let history = i64::from(w.history);
    let lifetime = crate::util::time::ms(w.lifetime).max(1) as f64;
    let max_hosts = i64::try_from(MAX_HOSTS).unwrap_or(i64::MAX);
    let row = conn
        .by(
            deadline,
            DURING,
            conn.query_one(
                &statement,
                &[
                    &key, &w.digest, &w.spec, &w.host, &history, &lifetime, &max_hosts, &changes,
                ],
            ),
        )
        .await?;
    row.try_get::<_, Option<i64>>(0)
        .map_err(|e| unexpected(DURING, e))
}

/// Milliseconds since the epoch of a `timestamptz` column, in a select list.
macro_rules! ms {
    ($c:expr) => {
        concat!("round(extract(epoch FROM ", $c, ") * 1000)::bigint")
    };
}

const RECORDS: &str = concat!(
    "SELECT digest, spec::text, ",
    ms!("first_seen"),
    ", ",
    ms!("last_seen"),
    ", ",
    ms!("last_tick"),
    ", ",
    ms!("last_success"),
    ", last_outcome, hosts::text
FROM baton_schedules WHERE key = $1 AND expires_at > clock_timestamp() ORDER BY digest"
);

const PAUSE_READ: &str = concat!(
    "SELECT ",
    ms!("c.until"),
    ", c.by, ",
    ms!("c.at"),
    ", c.note, c.key IS NOT NULL, ",
    ms!("n.t"),
    "
FROM (SELECT clock_timestamp() AS t) n LEFT JOIN baton_schedule_control c ON c.key = $1"
);

/// Every live digest's summary of `key` (the column form), its pause and the server's clock.
pub(crate) async fn records(
    t: &PgTransport,
    prefix: &str,
    key: &str,
) -> Result<(Vec<RawRecord>, Option<RawPause>, i64), Error> {
    const DURING: &str = "reading a schedule's record";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let key = column(prefix, key);
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(RECORDS))
        .await?;
    let rows = conn
        .by(deadline, DURING, conn.query(&statement, &[&key]))
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let get = |e: tokio_postgres::Error| unexpected(DURING, e);
        let hosts: String = row.try_get(7).map_err(get)?;
        let hosts: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&hosts).map_err(|e| unexpected(DURING, e))?;
        let mut hosts: Vec<(String, i64)> = hosts
            .into_iter()
            .map(|(h, ms)| (h, ms.as_i64().unwrap_or(0)))
            .collect();
        hosts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out.push(RawRecord {
            digest: row.try_get(0).map_err(get)?,
            spec: row.try_get(1).map_err(get)?,
            first_seen_ms: row.try_get(2).map_err(get)?,
            last_seen_ms: row.try_get(3).map_err(get)?,
            last_tick_ms: row.try_get(4).map_err(get)?,
            last_success_ms: row.try_get(5).map_err(get)?,
            last_outcome: row.try_get(6).map_err(get)?,
            hosts,
        });
    }
    let (pause, now) = pause_on(&conn, deadline, &key).await?;
    Ok((out, pause, now))
}

/// The pause row of column `key` as stored, and the server's clock (ms): one statement.
async fn pause_on(
    conn: &Pooled,
    deadline: Instant,
    key: &str,
) -> Result<(Option<RawPause>, i64), Error> {
    const DURING: &str = "reading a schedule's pause";
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(PAUSE_READ))
        .await?;
    let row = conn
        .by(deadline, DURING, conn.query_one(&statement, &[&key]))
        .await?;
    let get = |e| unexpected(DURING, e);
    let now: i64 = row.try_get(5).map_err(get)?;
    let stored: bool = row.try_get(4).map_err(get)?;
    if !stored {
        return Ok((None, now));
    }
    Ok((
        Some(RawPause {
            until_ms: row.try_get(0).map_err(get)?,
            by: row.try_get(1).map_err(get)?,
            at_ms: row.try_get::<_, Option<i64>>(2).map_err(get)?.unwrap_or(0),
            note: row.try_get(3).map_err(get)?,
        }),
        now,
    ))
}

const HISTORY: &str = "
SELECT h.entry::text FROM baton_schedule_history h
JOIN baton_schedules s ON s.key = h.key AND s.digest = h.digest
WHERE h.key = $1 AND h.digest = $2 AND s.expires_at > clock_timestamp()
ORDER BY h.tick DESC LIMIT $3";

/// The newest `limit` entries of `key`'s `digest`, newest first (entries that do not parse
/// are skipped).
pub(crate) async fn history(
    t: &PgTransport,
    prefix: &str,
    key: &str,
    digest: &str,
    limit: usize,
) -> Result<Vec<WireEntry>, Error> {
    const DURING: &str = "reading a schedule's history";
    if limit == 0 {
        return Ok(vec![]);
    }
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let key = column(prefix, key);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(HISTORY))
        .await?;
    let rows = conn
        .by(
            deadline,
            DURING,
            conn.query(&statement, &[&key, &digest, &limit]),
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let raw: String = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
        if let Ok(entry) = serde_json::from_str(&raw) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// `$1` key, `$2` until ms (NULL: until resumed), `$3` by, `$4` note: whether it paused (not
/// when `until` already passed by the server's clock), and the server's clock (ms).
const PAUSE: &str = concat!(
    "
WITH n AS (SELECT clock_timestamp() AS t),
ins AS (
    INSERT INTO baton_schedule_control (key, until, by, at, note)
    SELECT $1, to_timestamp($2::float8 / 1000), $3, n.t, $4 FROM n
    WHERE $2::float8 IS NULL OR to_timestamp($2::float8 / 1000) > n.t
    ON CONFLICT (key) DO UPDATE SET until = EXCLUDED.until, by = EXCLUDED.by,
        at = EXCLUDED.at, note = EXCLUDED.note
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins), ",
    ms!("n.t"),
    " FROM n"
);

/// Pauses `key`: whether it did (`false`: `until` already passed by the server's clock),
/// and the server's clock.
pub(crate) async fn pause(
    t: &PgTransport,
    prefix: &str,
    key: &str,
    until_ms: Option<i64>,
    by: &str,
    note: Option<&str>,
) -> Result<(bool, i64), Error> {
    const DURING: &str = "pausing a schedule";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let key = column(prefix, key);
    let until = until_ms.map(|u| u as f64);
    let statement = conn
        .by(deadline, DURING, conn.prepare_cached(PAUSE))
        .await?;
    let row = conn
        .by(
            deadline,
            DURING,
            conn.query_one(&statement, &[&key, &until, &by, &note]),
        )
        .await?;
    let get = |e| unexpected(DURING, e);
    Ok((row.try_get(0).map_err(get)?, row.try_get(1).map_err(get)?))
}

/// Resumes `key`: whether a pause was stored.
pub(crate) async fn resume(t: &PgTransport, prefix: &str, key: &str) -> Result<bool, Error> {
    const DURING: &str = "resuming a schedule";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let key = column(prefix, key);
    let n = conn
        .by(
            deadline,
            DURING,
            conn.execute("DELETE FROM baton_schedule_control WHERE key = $1", &[&key]),
        )
        .await?;
    Ok(n > 0)
}

/// `key`'s pause as stored (whatever its `until`) and the server's clock (ms): one statement.
pub(crate) async fn read_pause(
    t: &PgTransport,
    prefix: &str,
    key: &str,
) -> Result<(Option<RawPause>, i64), Error> {
    const DURING: &str = "reading a schedule's pause";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    pause_on(&conn, deadline, &column(prefix, key)).await
}

/// The keys under `$1` with a live record or a pause (by the cleanup's rule).
const LIST: &str = "
SELECT key FROM baton_schedules
WHERE left(key, length($1)) = $1 AND expires_at > clock_timestamp()
UNION
SELECT key FROM baton_schedule_control
WHERE left(key, length($1)) = $1
  AND (until IS NULL OR until + interval '1 day' > clock_timestamp())";

/// The schedule keys under `prefix` with a record or a pause, sorted, each once.
pub(crate) async fn list(t: &PgTransport, prefix: &str) -> Result<Vec<String>, Error> {
    const DURING: &str = "listing schedules";
    let deadline = Instant::now() + t.settings.response_timeout;
    let conn = connection(t, deadline, DURING).await?;
    let statement = conn.by(deadline, DURING, conn.prepare_cached(LIST)).await?;
    let rows = conn
        .by(deadline, DURING, conn.query(&statement, &[&prefix]))
        .await?;
    let mut out = std::collections::BTreeSet::new();
    for row in rows {
        let column: String = row.try_get(0).map_err(|e| unexpected(DURING, e))?;
        out.extend(key_of(prefix, &column));
    }
    Ok(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_column_keeps_prefixes_apart() {
        assert_eq!(column("baton:", "a:b"), "baton:{a:b}");
        assert_eq!(key_of("baton:", "baton:{a:b}").as_deref(), Some("a:b"));
        // Prefix `baton:a:` with key `b` is not key `a:b` under `baton:`.
        assert_eq!(key_of("baton:", &column("baton:a:", "b")), None);
        assert_eq!(
            key_of("baton:a:", &column("baton:a:", "b")).as_deref(),
            Some("b")
        );
    }

    #[test]
    fn the_schema_creates_three_tables_and_an_index() {
        let made = crate::backend::postgres::schema::created_relations(SCHEMA);
        assert_eq!(
            made,
            [
                ("TABLE", "baton_schedules"),
                ("TABLE", "baton_schedule_history"),
                ("TABLE", "baton_schedule_control"),
                ("INDEX", "baton_schedules_expires_at"),
            ]
        );
    }
}
