//! The failover coordinator's job store on PostgreSQL (feature `postgres`): [`PgStore`], the
//! [`JobStore`] of one job over one row of the table `baton_jobs`, the operator tools'
//! statements and the listing's page.
//!
//! The protocol is the Redis one, carried over row for key (docs/protocol.md):
//!
//! * **The row** (`key` = the job's state key, e.g. `baton:{msg:42}`) holds the state (an
//!   attempt number, `DONE` or `EXHAUSTED`), the lease (token, holder, expiry), the fencing
//!   token, the last failure, the row's expiry (`retention`) and a `version` that every write
//!   increments. A row past its expiry reads as absent, as an expired key does; expired rows
//!   are deleted in the background.
//! * **Time is the server's**: every expiry is `clock_timestamp() + …` and every remaining time
//!   is measured against `clock_timestamp()` in the same statement, so clients' clocks never
//!   matter (as with Redis TTLs).
//! * **A transition** reads the row and `clock_timestamp()` (one statement), calls the same
//!   `decide_*` as on Redis, then writes with `UPDATE … WHERE key = $1 AND version = $v` (an
//!   `INSERT … ON CONFLICT DO NOTHING` when there was no row): 0 rows is the nil `EXEC`, and the
//!   worker observes again. Under PostgreSQL's row locking, two such writes of one version
//!   cannot both succeed: the second waits for the first, re-reads the row and finds a newer
//!   version. Two round trips per transition, as on Redis.
//! * **Wake-ups**: the write's own statement calls `pg_notify`, so the notification is sent
//!   exactly when the write commits; backups hear it through the client's `LISTEN` connection
//!   ([`PgTransport::subscribe`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::ToSql;

use super::{channel_of, PgTransport, Pooled};
use crate::error::Error;
use crate::util::jobs::{
    job_state, lease_of, replaced_message, state_of_bytes, state_text, Extended, ExtensionFuture,
    FailAttempt, Fence, Held, JobStatus, JobStore, Lease, Message, Named, Observation, Replaced,
    ResetJob, State, Which, Write,
};
use crate::util::metrics;
use crate::util::pubsub::Subscription;
use crate::util::settings::{ConnSettings, ReplicaWait};

/// The table's name in messages and docs.
pub(crate) const TABLE: &str = "baton_jobs";

/// The schema's name for [`PgTransport::ensure_schema`].
pub(crate) const SCHEMA_NAME: &str = "baton_jobs";

/// The schema of the failover coordinator (no extension needed). `CREATE … IF NOT EXISTS`:
/// run by `Failover::migrate`, and on first use only by a client that finds
/// the table missing (see `PgTransport::ensure_schema`).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_jobs (
    key           text PRIMARY KEY,
    state         text NOT NULL,
    lease_token   text,
    lease_holder  text,
    lease_expires timestamptz,
    fence         bigint NOT NULL DEFAULT 0,
    failure       text,
    expires_at    timestamptz NOT NULL,
    version       bigint NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS baton_jobs_expires_at ON baton_jobs (expires_at);
";

/// Deletes rows past their expiry (they read as absent already), a bounded batch at a time.
///
/// The expiry is checked again in the outer `WHERE`: a `DELETE` that waited for a transition
/// in flight re-evaluates only its own `WHERE` on the row's new version (READ COMMITTED's
/// EvalPlanQual), not the subquery, so without it a grant that refreshed `expires_at` meanwhile
/// would be deleted and the attempt granted again.
pub(crate) const CLEANUP: &str = "
DELETE FROM baton_jobs WHERE key IN (
    SELECT key FROM baton_jobs WHERE expires_at < clock_timestamp() LIMIT 1000
)
  AND expires_at < clock_timestamp()";

/// How often a client deletes expired rows.
pub(crate) const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// One statement reads everything a transition decides on: the row (if any) and the server's
/// clock. Always one result row (the `LEFT JOIN`).
const OBSERVE: &str = "
SELECT j.state,
       j.lease_token,
       j.lease_holder,
       CASE WHEN j.lease_expires > c.now
            THEN ceil(extract(epoch FROM j.lease_expires - c.now) * 1000)::bigint END,
       j.fence,
       j.expires_at > c.now,
       j.version,
       (extract(epoch FROM c.now) * 1000000)::bigint,
       j.failure,
       CASE WHEN j.expires_at > c.now
            THEN ceil(extract(epoch FROM j.expires_at - c.now) * 1000)::bigint END
FROM (SELECT clock_timestamp() AS now) c
LEFT JOIN baton_jobs j ON j.key = $1";

/// The lease extension: conditional on the token, the attempt and both expiries, like the
/// Redis script.
const EXTEND: &str = "
WITH c AS (SELECT clock_timestamp() AS now)
UPDATE baton_jobs j
SET lease_expires = c.now + $4::float8 * interval '1 millisecond',
    expires_at = c.now + $5::float8 * interval '1 millisecond',
    version = j.version + 1
FROM c
WHERE j.key = $1 AND j.lease_token = $2 AND j.state = $3
  AND j.lease_expires > c.now AND j.expires_at > c.now
RETURNING 1";

/// What one [`OBSERVE`] returned, before it is judged.
pub(crate) struct Row {
    pub obs: Observation,
    /// The row's version (`None`: no row at all).
    pub version: Option<i64>,
    /// Whether the row exists and is not past its expiry.
    pub live: bool,
    /// The last failure, while the row is live.
    pub failure: Option<String>,
    /// The row's remaining retention in ms, while it is live.
    pub retention_ms: Option<u64>,
}

/// Runs [`OBSERVE`] for `key` on `conn`.
pub(crate) async fn observe_row(
    transport: &PgTransport,
    conn: &Pooled,
    key: &str,
    deadline: Option<Instant>,
) -> Result<Row, Error> {
    // Prepared once per pooled connection (its statement cache), then one round trip.
    let statement = timed(
        transport,
        conn,
        deadline,
        "reading the job",
        conn.prepare_cached(OBSERVE),
    )
    .await?;
    let row = timed(
        transport,
        conn,
        deadline,
        "reading the job",
        conn.query_one(&statement, &[&key]),
    )
    .await?;
    let get = |what: &'static str, r: Result<Option<i64>, tokio_postgres::Error>| {
        r.map_err(|e| Error::UnexpectedReply {
            context: what,
            reply: e.to_string(),
        })
    };
    let state: Option<String> = row.try_get(0).map_err(unexpected)?;
    let token: Option<String> = row.try_get(1).map_err(unexpected)?;
    let holder: Option<String> = row.try_get(2).map_err(unexpected)?;
    let pttl = get("the lease's remaining time", row.try_get(3))?;
    let fence = get("the fencing token", row.try_get(4))?;
    let live: Option<bool> = row.try_get(5).map_err(unexpected)?;
    let version = get("the row version", row.try_get(6))?;
    let now_us = get("the server's clock", row.try_get(7))?;
    let failure: Option<String> = row.try_get(8).map_err(unexpected)?;
    let retention_ms = get("the row's expiry", row.try_get(9))?;
    let live = live.unwrap_or(false);
    let state = match (&state, live) {
        (Some(s), true) => state_of_bytes(s.as_bytes()),
        _ => State::Absent,
    };
    let lease = match (token, pttl) {
        (Some(token), Some(p)) if p > 0 => {
            lease_of(&token, holder.as_deref().unwrap_or(""), Some(p as u64))
        }
        _ => Lease::Absent,
    };
    let fence = match fence {
        Some(f) if live && f > 0 => Fence::Value(f as u64),
        Some(f) if live && f < 0 => Fence::Corrupt(f.to_string()),
        _ => Fence::Absent,
    };
    Ok(Row {
        obs: Observation {
            state,
            lease,
            fence,
            now_us: now_us.map_or(0, |n| n.max(0) as u64),
        },
        version,
        live,
        failure: failure.filter(|_| live),
        retention_ms: retention_ms.map(|n| n.max(0) as u64),
    })
}

fn unexpected(e: tokio_postgres::Error) -> Error {
    Error::UnexpectedReply {
        context: "reading baton_jobs",
        reply: e.to_string(),
    }
}

/// `fut`, a statement on `conn`, bounded by the response timeout and, when given, `deadline`;
/// a timeout retires `conn` ([`Pooled::by`]).
async fn timed<T>(
    transport: &PgTransport,
    conn: &Pooled,
    deadline: Option<Instant>,
    during: &'static str,
    fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    let mut limit = Instant::now() + transport.settings.response_timeout;
    if let Some(d) = deadline {
        limit = limit.min(d);
    }
    conn.by(limit, during, fut).await
}

/// Makes sure the table exists (once per client) and the client deletes expired rows.
pub(crate) async fn ensure_schema(transport: &PgTransport) -> Result<(), Error> {
    transport
        .ensure_schema(
            SCHEMA_NAME,
            SCHEMA,
            Some((CLEANUP, transport.cleanup_every(CLEANUP_EVERY))),
        )
        .await
}

/// The PostgreSQL form of [`JobStore`] for one job.
pub(crate) struct PgStore {
    pub transport: Arc<PgTransport>,
    /// The row's key, the job's state key (`P{J}`); also the topic of its notifications.
    pub key: String,
    /// The worker's name, stored with its lease.
    pub name: Arc<str>,
    pub lease: Duration,
    pub retention: Duration,
}

/// A pooled connection carrying one transition's observation to its commit.
pub(crate) struct PgConn {
    conn: Pooled,
    deadline: Option<Instant>,
    /// The observed row's version and liveness, set by `observe`, taken by `commit`.
    observed: Option<(Option<i64>, bool)>,
}

/// A statement's parameters, bound in order (`$1`, `$2`, …).
#[cfg(feature = "testing")]
pub(crate) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// The SQL and parameters of one transition's write.
struct Statement {
    sql: String,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Statement {
    fn bind(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.params.push(Box::new(value));
        format!("${}", self.params.len())
    }
}

impl PgStore {
    /// The statement for `writes` given what was observed (see [`RowWriter::render`]).
    fn render(
        &self,
        observed: (Option<i64>, bool),
        writes: &[Write],
        token: &str,
        failure: &str,
    ) -> Result<Statement, Error> {
        RowWriter {
            key: &self.key,
            name: &self.name,
            lease: self.lease,
            retention: self.retention,
        }
        .render(observed, writes, token, failure)
    }
}

/// What a job row's writes are made of: its key, the worker's name and the job's durations.
struct RowWriter<'a> {
    key: &'a str,
    name: &'a str,
    lease: Duration,
    retention: Duration,
}

impl RowWriter<'_> {
    /// The statement for `writes` given what was observed (see the module docs).
    fn render(
        &self,
        observed: (Option<i64>, bool),
        writes: &[Write],
        token: &str,
        failure: &str,
    ) -> Result<Statement, Error> {
        let mut st = Statement {
            sql: String::new(),
            params: Vec::new(),
        };
        let key = st.bind(self.key.to_string());
        // Bound only where the statement uses it: PostgreSQL cannot type a parameter it never
        // sees (42P18), as in an operator's release, which leaves the expiry alone.
        let retention_ms = self.retention.as_secs_f64() * 1000.0;
        let retention = |st: &mut Statement| {
            format!(
                "c.now + {}::float8 * interval '1 millisecond'",
                st.bind(retention_ms)
            )
        };
        let mut state = None;
        let mut keep = false;
        let mut lease: Option<Option<(String, String, String)>> = None;
        let mut fence = None;
        let mut failure_text = None;
        let mut notify = None;
        for w in writes {
            match *w {
                Write::SetState(v) => state = Some(st.bind(state_text(v))),
                Write::KeepState | Write::KeepFence => keep = true,
                Write::SetLease => {
                    lease = Some(Some((
                        st.bind(token.to_string()),
                        st.bind(self.name.to_string()),
                        format!(
                            "c.now + {}::float8 * interval '1 millisecond'",
                            st.bind(self.lease.as_secs_f64() * 1000.0)
                        ),
                    )))
                }
                Write::DelLease => lease = Some(None),
                Write::SetFence(f) => {
                    let f = i64::try_from(f).map_err(|_| Error::UnexpectedReply {
                        context: "the fencing token",
                        reply: format!("{f} does not fit PostgreSQL's bigint"),
                    })?;
                    fence = Some(st.bind(f));
                }
                Write::SetFailure => failure_text = Some(st.bind(failure.to_string())),
                Write::Publish(m) => {
                    let payload = st.bind(format!("{}\n{}", self.key, m.text()));
                    notify = Some((st.bind(channel_of(self.key)), payload));
                }
            }
        }
        let written = match observed.0 {
            None => {
                let Some(state) = state else {
                    return Err(Error::UnexpectedReply {
                        context: "a transition",
                        reply: "a write without a state to a job that has no row".into(),
                    });
                };
                let (token, holder, expires) = match lease.flatten() {
                    Some((t, h, e)) => (t, h, e),
                    None => ("NULL".into(), "NULL".into(), "NULL".into()),
                };
                let retention = retention(&mut st);
                format!(
                    "INSERT INTO baton_jobs AS j (key, state, lease_token, lease_holder, \
                     lease_expires, fence, failure, expires_at, version) \
                     SELECT {key}, {state}, {token}, {holder}, {expires}, {}, {}, {retention}, 1 \
                     FROM c ON CONFLICT (key) DO NOTHING RETURNING 1",
                    fence.unwrap_or_else(|| "0".into()),
                    failure_text.unwrap_or_else(|| "NULL".into()),
                )
            }
            Some(version) => {
                let version = st.bind(version);
                let mut sets = Vec::new();
                let set_expiry = state.is_some() || keep;
                if let Some(state) = state {
                    sets.push(format!("state = {state}"));
                }
                if set_expiry {
                    sets.push(format!("expires_at = {}", retention(&mut st)));
                }
                match lease {
                    Some(Some((t, h, e))) => {
                        sets.push(format!("lease_token = {t}"));
                        sets.push(format!("lease_holder = {h}"));
                        sets.push(format!("lease_expires = {e}"));
                    }
                    Some(None) => {
                        sets.push("lease_token = NULL".into());
                        sets.push("lease_holder = NULL".into());
                        sets.push("lease_expires = NULL".into());
                    }
                    None => {}
                }
                if let Some(f) = fence {
                    sets.push(format!("fence = {f}"));
                }
                match failure_text {
                    Some(f) => sets.push(format!("failure = {f}")),
                    // A row that had expired starts over: no stale failure from before.
                    None if !observed.1 => sets.push("failure = NULL".into()),
                    None => {}
                }
                sets.push("version = j.version + 1".into());
                format!(
                    "UPDATE baton_jobs j SET {} FROM c WHERE j.key = {key} AND j.version = \
                     {version} RETURNING 1",
                    sets.join(", ")
                )
            }
        };
        let tail = match notify {
            Some((channel, payload)) => format!("SELECT pg_notify({channel}, {payload}) FROM u"),
            None => "SELECT 1 FROM u".into(),
        };
        st.sql = format!("WITH c AS (SELECT clock_timestamp() AS now), u AS ({written}) {tail}");
        Ok(st)
    }
}

/// The statement and parameters of `writes` (a backup's grant, say) to job row `key` observed
/// at `version` (`None`: no row), as a worker would send them; for tests that interleave it
/// with [`CLEANUP`] (feature `testing`).
#[cfg(feature = "testing")]
pub(crate) fn write_statement(
    key: &str,
    version: Option<i64>,
    writes: &[Write],
    token: &str,
) -> Result<(String, Params), Error> {
    let st = RowWriter {
        key,
        name: "test",
        lease: Duration::from_secs(10),
        retention: Duration::from_secs(3600),
    }
    .render((version, false), writes, token, "")?;
    Ok((st.sql, st.params))
}

impl JobStore for PgStore {
    type Conn = PgConn;
    const BACKEND: metrics::Backend = metrics::backend::POSTGRES;

    fn acknowledge_stop(
        &self,
        attempt: u64,
    ) -> impl std::future::Future<Output = Result<bool, Error>> + Send + 'static {
        let (transport, key) = (self.transport.clone(), self.key.clone());
        async move { acknowledge_stop(&transport, &key, attempt).await }
    }

    fn tracker(&self) -> &tokio_util::task::TaskTracker {
        &self.transport.tracker
    }

    fn settings(&self) -> &ConnSettings {
        &self.transport.settings
    }

    fn worker_name(&self) -> &str {
        &self.name
    }

    fn locate(&self, which: Which) -> String {
        let column = match which {
            Which::State => "state",
            Which::Lease => "lease_token",
            Which::Fence => "fence",
        };
        format!("{TABLE}.{column} of `{}`", self.key)
    }

    async fn before_exec(&self, what: &'static str) {
        self.transport.before_exec(what).await;
    }

    async fn checkout(&self, deadline: Instant) -> Result<PgConn, Error> {
        ensure_schema(&self.transport).await?;
        let conn = match tokio::time::timeout_at(deadline, self.transport.pooled()).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(Error::Timeout {
                    during: "waiting for a PostgreSQL connection",
                })
            }
        };
        Ok(PgConn {
            conn,
            deadline: None,
            observed: None,
        })
    }

    fn set_deadline(conn: &mut PgConn, deadline: Instant) {
        conn.deadline = Some(deadline);
    }

    async fn observe<'a>(&'a self, conn: &'a mut PgConn) -> Result<Observation, Error> {
        let row = observe_row(&self.transport, &conn.conn, &self.key, conn.deadline).await?;
        conn.observed = Some((row.version, row.live));
        Ok(row.obs)
    }

    fn abandon(conn: &mut PgConn) {
        conn.observed = None;
    }

    async fn commit<'a>(
        &'a self,
        conn: &'a mut PgConn,
        writes: &'a [Write],
        token: &'a str,
        failure: &'a str,
        wait: Option<ReplicaWait>,
        context: &'static str,
    ) -> Result<Option<Option<u64>>, Error> {
        if wait.is_some() {
            return Err(replica_ack_unsupported());
        }
        let Some(observed) = conn.observed.take() else {
            return Err(Error::UnexpectedReply {
                context,
                reply: "a write without an observation".into(),
            });
        };
        let st = self.render(observed, writes, token, failure)?;
        let statement = timed(
            &self.transport,
            &conn.conn,
            conn.deadline,
            context,
            conn.conn.prepare_cached(&st.sql),
        )
        .await?;
        let params: Vec<&(dyn ToSql + Sync)> = st
            .params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = timed(
            &self.transport,
            &conn.conn,
            conn.deadline,
            context,
            conn.conn.query(&statement, &params),
        )
        .await?;
        Ok(if rows.is_empty() { None } else { Some(None) })
    }

    async fn subscribe(&self) -> Result<Subscription, Error> {
        self.transport.subscribe(&self.key).await
    }

    async fn quick_read(&self) -> Result<(State, Option<Option<u64>>), Error> {
        let conn = self.transport.pooled().await?;
        let row = observe_row(&self.transport, &conn, &self.key, None).await?;
        let lease = match row.obs.lease {
            Lease::Held { pttl_ms, .. } => Some(pttl_ms),
            _ => None,
        };
        Ok((row.obs.state, lease))
    }

    async fn holder_read(&self, limit: Instant) -> Result<Observation, Error> {
        let conn = match tokio::time::timeout_at(limit, self.transport.pooled()).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(Error::Timeout {
                    during: "reading the job",
                })
            }
        };
        Ok(observe_row(&self.transport, &conn, &self.key, Some(limit))
            .await?
            .obs)
    }

    fn extension(&self, held: Held, lease_end: Instant) -> ExtensionFuture {
        let transport = self.transport.clone();
        let key = self.key.clone();
        let ttl_ms = self.lease.as_secs_f64() * 1000.0;
        let retention_ms = self.retention.as_secs_f64() * 1000.0;
        Box::pin(async move {
            transport.before_exec("extend").await;
            let deadline = Some(lease_end);
            let conn = match tokio::time::timeout_at(lease_end, transport.pooled()).await {
                Ok(conn) => conn?,
                Err(_) => {
                    return Err(Error::Timeout {
                        during: "waiting for a PostgreSQL connection",
                    })
                }
            };
            let statement = timed(
                &transport,
                &conn,
                deadline,
                "extending the lease",
                conn.prepare_cached(EXTEND),
            )
            .await?;
            let sent = Instant::now();
            let attempt = held.attempt.to_string();
            let rows = timed(
                &transport,
                &conn,
                deadline,
                "extending the lease",
                conn.query(
                    &statement,
                    &[&key, &held.token, &attempt, &ttl_ms, &retention_ms],
                ),
            )
            .await?;
            if rows.is_empty() {
                let row = observe_row(&transport, &conn, &key, deadline).await?;
                Ok(Extended::Refused(row.obs))
            } else {
                Ok(Extended::Confirmed { sent })
            }
        })
    }
}

/// PostgreSQL's `text` cannot hold a NUL byte, so a job name (or prefix) with one cannot be a
/// row's key there (Redis keys are binary-safe).
pub(crate) fn nul_unsupported() -> Error {
    Error::Unsupported {
        what: "a job name or prefix containing a NUL byte",
        backend: "PostgreSQL",
        why: "PostgreSQL text cannot store NUL bytes; rename the job",
    }
}

/// `replica_ack` asks Redis replicas; on PostgreSQL, replication is the server's
/// `synchronous_commit` / `synchronous_standby_names`.
pub(crate) fn replica_ack_unsupported() -> Error {
    Error::Unsupported {
        what: "replica_ack",
        backend: "PostgreSQL",
        why: "it counts Redis replicas; on PostgreSQL set synchronous_standby_names and \
              synchronous_commit on the server, which every commit then waits for",
    }
}

// ----- The operator tools ------------------------------------------------------------------------

/// A store for the job whose state key is `key`, for the operator tools.
fn store_for(
    transport: &Arc<PgTransport>,
    key: &str,
    lease: Duration,
    retention: Duration,
) -> PgStore {
    PgStore {
        transport: transport.clone(),
        key: key.to_string(),
        name: Arc::from("operator"),
        lease,
        retention,
    }
}

/// `Failover::job_status` on PostgreSQL, for the job named `job` whose state key is `key`.
pub(crate) async fn job_status(
    transport: &Arc<PgTransport>,
    key: &str,
    job: String,
) -> Result<JobStatus, Error> {
    ensure_schema(transport).await?;
    let conn = transport.pooled().await?;
    let row = observe_row(transport, &conn, key, None).await?;
    Ok(JobStatus {
        state: job_state(row.obs.state, row.obs.lease),
        state_ttl_ms: row.retention_ms,
        fencing_token: match row.obs.fence {
            Fence::Value(f) => Some(f),
            _ => None,
        },
        last_failure: row.failure,
        key: job,
    })
}

/// `Failover::fail_attempt` on PostgreSQL: the same transition as a holder's release
/// (`DelLease`, `SetFailure`, `failed`), conditional on the row's version, if the live attempt
/// is the one `named`.
pub(crate) async fn fail_attempt(
    transport: &Arc<PgTransport>,
    key: &str,
    named: Named,
    reason: &str,
    lease: Duration,
    retention: Duration,
) -> Result<FailAttempt, Error> {
    let store = store_for(transport, key, lease, retention);
    for _ in 0..20 {
        let deadline = Instant::now() + transport.settings.response_timeout * 10;
        let mut conn = store.checkout(deadline).await?;
        let obs = store.observe(&mut conn).await?;
        let attempt = match (obs.state, obs.lease) {
            (State::Attempt(n), Lease::Held { .. }) => n,
            (State::Corrupt(value), _) => {
                return Err(Error::CorruptState {
                    key: store.locate(Which::State),
                    value,
                })
            }
            _ => return Ok(FailAttempt::NotLive),
        };
        // The commit below is conditional on the row's version: an attempt granted after this
        // read makes it fail, and the loop compares again.
        if !named.names(attempt) {
            return Ok(FailAttempt::Another(attempt));
        }
        let writes = [
            Write::DelLease,
            Write::SetFailure,
            Write::Publish(Message::Failed),
        ];
        let failure = format!("attempt {attempt} released by an operator: {reason}");
        let committed = store
            .commit(
                &mut conn,
                &writes,
                "",
                &failure,
                None,
                "releasing an attempt",
            )
            .await?;
        if committed.is_some() {
            return Ok(FailAttempt::Released(attempt));
        }
    }
    Err(Error::Timeout {
        during: "releasing an attempt under constant contention",
    })
}

/// The stop markers of replaced attempts (see `Failover::replace_attempt`): one row per job
/// (`key` = the job's state key), the attempt stopped, who replaced it, and when the marker
/// ends by itself (the old lease's end). A table of its own, so that `baton_jobs` and the
/// statements of older binaries stay as they are.
pub(crate) const STOPS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_job_stops (
    key        text PRIMARY KEY,
    attempt    bigint NOT NULL,
    by         text NOT NULL,
    expires_at timestamptz NOT NULL
);
";

/// The stop table's name for [`PgTransport::ensure_schema`].
pub(crate) const STOPS_SCHEMA_NAME: &str = "baton_job_stops";

/// Deletes stop markers past their end (they read as absent already).
pub(crate) const STOPS_CLEANUP: &str = "
DELETE FROM baton_job_stops WHERE key IN (
    SELECT key FROM baton_job_stops WHERE expires_at < clock_timestamp() LIMIT 1000
) AND expires_at < clock_timestamp()";

/// Makes sure the stop table exists (once per client), as [`ensure_schema`] does the jobs'.
pub(crate) async fn ensure_stops(transport: &PgTransport) -> Result<(), Error> {
    transport
        .ensure_schema(
            STOPS_SCHEMA_NAME,
            STOPS_SCHEMA,
            Some((STOPS_CLEANUP, transport.cleanup_every(CLEANUP_EVERY))),
        )
        .await
}

/// The replacement, one statement conditional on the row's version: the job becomes `DONE`
/// (its expiry kept), the lease goes, the failure note says who replaced it, the stop marker
/// is upserted for the old lease's remaining time, and `replaced:N:BY` is notified. Returns
/// one row when it applied.
const REPLACE: &str = "
WITH c AS (SELECT clock_timestamp() AS now),
u AS (
    UPDATE baton_jobs j
    SET state = 'DONE', lease_token = NULL, lease_holder = NULL, lease_expires = NULL,
        failure = $3, version = j.version + 1
    FROM c
    WHERE j.key = $1 AND j.version = $2 AND j.lease_expires > c.now
    RETURNING j.key
),
s AS (
    INSERT INTO baton_job_stops AS s (key, attempt, by, expires_at)
    SELECT u.key, $4, $5, c.now + $6::float8 * interval '1 millisecond' FROM u, c
    ON CONFLICT (key) DO UPDATE
    SET attempt = EXCLUDED.attempt, by = EXCLUDED.by, expires_at = EXCLUDED.expires_at
    RETURNING s.key
)
SELECT pg_notify($7, $8) FROM s";

/// `Failover::replace_attempt` on PostgreSQL: [`REPLACE`] if the live attempt is the one
/// `named`, observed and compared again when the row changed in between.
pub(crate) async fn replace_attempt(
    transport: &Arc<PgTransport>,
    key: &str,
    named: Named,
    by: &str,
    lease: Duration,
    retention: Duration,
) -> Result<Replaced, Error> {
    ensure_stops(transport).await?;
    let store = store_for(transport, key, lease, retention);
    for _ in 0..20 {
        let conn = transport.pooled().await?;
        let row = observe_row(transport, &conn, key, None).await?;
        let (attempt, pttl) = match (&row.obs.state, &row.obs.lease) {
            (State::Attempt(n), Lease::Held { pttl_ms, .. }) => (*n, *pttl_ms),
            (State::Corrupt(value), _) => {
                return Err(Error::CorruptState {
                    key: store.locate(Which::State),
                    value: value.clone(),
                })
            }
            _ => return Ok(Replaced::NotLive),
        };
        if !named.names(attempt) {
            return Ok(Replaced::Other(attempt));
        }
        let Some(version) = row.version else {
            return Ok(Replaced::NotLive);
        };
        // Read before the write: errs long, never short.
        let marker_ms = pttl
            .or(row.retention_ms)
            .unwrap_or(lease.as_millis() as u64)
            .max(1);
        let attempt_sql = i64::try_from(attempt).map_err(|_| Error::UnexpectedReply {
            context: "the attempt number",
            reply: format!("{attempt} does not fit PostgreSQL's bigint"),
        })?;
        let failure = format!("attempt {attempt} replaced by {by}");
        let payload = format!("{key}\n{}", replaced_message(attempt, by));
        let limit = Instant::now() + transport.settings.response_timeout;
        let rows = conn
            .by(
                limit,
                "replacing an attempt",
                conn.query(
                    REPLACE,
                    &[
                        &key,
                        &version,
                        &failure,
                        &attempt_sql,
                        &by,
                        &(marker_ms as f64),
                        &channel_of(key),
                        &payload,
                    ],
                ),
            )
            .await?;
        if !rows.is_empty() {
            return Ok(Replaced::Stopped {
                attempt,
                lease_remaining: Duration::from_millis(marker_ms),
            });
        }
    }
    Err(Error::Timeout {
        during: "replacing an attempt under constant contention",
    })
}

/// A replaced holder's acknowledgement on PostgreSQL: deletes the stop marker if it names
/// `attempt` (one statement).
pub(crate) async fn acknowledge_stop(
    transport: &Arc<PgTransport>,
    key: &str,
    attempt: u64,
) -> Result<bool, Error> {
    ensure_stops(transport).await?;
    let Ok(attempt) = i64::try_from(attempt) else {
        return Ok(false);
    };
    let conn = transport.pooled().await?;
    let limit = Instant::now() + transport.settings.response_timeout;
    let deleted = conn
        .by(
            limit,
            "acknowledging a stop",
            conn.execute(
                "DELETE FROM baton_job_stops WHERE key = $1 AND attempt = $2",
                &[&key, &attempt],
            ),
        )
        .await?;
    Ok(deleted > 0)
}

/// The stop marker's remaining time on PostgreSQL, by the server's clock: `None` once it is
/// gone or past its end.
pub(crate) async fn stop_remaining(
    transport: &Arc<PgTransport>,
    key: &str,
) -> Result<Option<Duration>, Error> {
    ensure_stops(transport).await?;
    let conn = transport.pooled().await?;
    let limit = Instant::now() + transport.settings.response_timeout;
    let rows = conn
        .by(
            limit,
            "reading a stop marker",
            conn.query(
                "SELECT ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint \
                 FROM baton_job_stops WHERE key = $1 AND expires_at > clock_timestamp()",
                &[&key],
            ),
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let ms: Option<i64> = row.try_get(0).map_err(|e| Error::UnexpectedReply {
        context: "reading a stop marker",
        reply: e.to_string(),
    })?;
    Ok(ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1))))
}

/// `Failover::reset_job` on PostgreSQL: deletes the row, unless a live attempt is not the one
/// `live` names; the deletion is conditional on the version read, so an attempt granted in
/// between is compared again.
pub(crate) async fn reset_job(
    transport: &Arc<PgTransport>,
    key: &str,
    live: Named,
) -> Result<ResetJob, Error> {
    ensure_schema(transport).await?;
    for _ in 0..20 {
        let conn = transport.pooled().await?;
        let row = observe_row(transport, &conn, key, None).await?;
        if let (State::Attempt(n), Lease::Held { .. }) = (&row.obs.state, &row.obs.lease) {
            if !live.names(*n) {
                return Ok(ResetJob::Live(*n));
            }
        }
        let Some(version) = row.version else {
            return Ok(ResetJob::Reset);
        };
        let limit = Instant::now() + transport.settings.response_timeout;
        let deleted = conn
            .by(
                limit,
                "forgetting a job",
                conn.execute(
                    "DELETE FROM baton_jobs WHERE key = $1 AND version = $2",
                    &[&key, &version],
                ),
            )
            .await?;
        if deleted == 1 {
            return Ok(ResetJob::Reset);
        }
    }
    Err(Error::Timeout {
        during: "resetting a job under constant contention",
    })
}

/// One page of the listing: the live rows after `after` whose key starts with `prefix`, in key
/// order, at most `limit` of them (keyset pagination: each page is one indexed range read, and
/// nothing is kept between pages but the last key). `left(key, n) = prefix` rather than `LIKE`,
/// so `_` and `%` in a prefix mean themselves and any collation gives the same rows.
const PAGE: &str = "
SELECT j.key,
       j.state,
       j.lease_token,
       j.lease_holder,
       CASE WHEN j.lease_expires > c.now
            THEN ceil(extract(epoch FROM j.lease_expires - c.now) * 1000)::bigint END,
       j.fence,
       j.failure,
       ceil(extract(epoch FROM j.expires_at - c.now) * 1000)::bigint
FROM baton_jobs j, (SELECT clock_timestamp() AS now) c
WHERE j.key > $1 AND left(j.key, length($2)) = $2 AND j.expires_at > c.now
ORDER BY j.key
LIMIT $3";

/// A page of job rows for the listing of everything under `prefix` (see [`PAGE`]): each row's
/// key (the job's state key) and its status, named by `name_of` (the key without its layout).
///
/// # Errors
/// Connection and server errors; [`Error::UnexpectedReply`] for a row of other types.
pub(crate) async fn status_page(
    transport: &PgTransport,
    prefix: &str,
    after: &str,
    limit: i64,
) -> Result<Vec<(String, JobStatus)>, Error> {
    ensure_schema(transport).await?;
    let conn = transport.pooled().await?;
    let statement = timed(
        transport,
        &conn,
        None,
        "listing jobs",
        conn.prepare_cached(PAGE),
    )
    .await?;
    let rows = timed(
        transport,
        &conn,
        None,
        "listing jobs",
        conn.query(&statement, &[&after, &prefix, &limit]),
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get(0).map_err(unexpected)?;
        let state: String = row.try_get(1).map_err(unexpected)?;
        let token: Option<String> = row.try_get(2).map_err(unexpected)?;
        let holder: Option<String> = row.try_get(3).map_err(unexpected)?;
        let pttl: Option<i64> = row.try_get(4).map_err(unexpected)?;
        let fence: i64 = row.try_get(5).map_err(unexpected)?;
        let failure: Option<String> = row.try_get(6).map_err(unexpected)?;
        let retention: Option<i64> = row.try_get(7).map_err(unexpected)?;
        let lease = match (token, pttl) {
            (Some(token), Some(p)) if p > 0 => {
                lease_of(&token, holder.as_deref().unwrap_or(""), Some(p as u64))
            }
            _ => Lease::Absent,
        };
        let status = JobStatus {
            key: String::new(),
            state: job_state(state_of_bytes(state.as_bytes()), lease),
            state_ttl_ms: retention.and_then(|r| u64::try_from(r).ok()),
            fencing_token: u64::try_from(fence).ok().filter(|f| *f > 0),
            last_failure: failure,
        };
        out.push((key, status));
    }
    Ok(out)
}
