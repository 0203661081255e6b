//! PostgreSQL's advisory lock functions, as the advisory lock primitive (`crate::advisory`)
//! calls them: the lock and unlock statements (fixed identifiers, the key bound), the
//! `lock_timeout` that bounds a wait, the cancel request for a wait given up, the fencing
//! sequence, and the heartbeat's query. The primitive keeps its handle, options and guard and
//! decides what to call when; these run the statements and parse the replies.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row, SimpleQueryMessage, Transaction};

use super::{classify, kind_of, not_creatable, PgTransport, Tls};
use crate::error::{Error, ErrorKind};

/// The fencing sequence of session guards.
pub(crate) const FENCE_SEQUENCE: &str = "baton_advisory_fence";
/// Creates the fencing sequence (`AdvisoryLocks::migrate`, or a first acquisition without it).
pub(crate) const CREATE_FENCE: &str = "CREATE SEQUENCE IF NOT EXISTS baton_advisory_fence";
const NEXT_FENCE: &str = "SELECT nextval('baton_advisory_fence'), pg_backend_pid()";
const SET_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, $2)";

/// Which PostgreSQL function a step calls.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    Lock,
    TryLock,
    Unlock,
    XactLock,
    TryXactLock,
}

/// An advisory lock's key, in one of PostgreSQL's two key spaces.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Key {
    /// The `bigint` key space.
    Int(i64),
    /// The `(integer, integer)` key space.
    Pair(i32, i32),
}

/// `SELECT <function>($1[, $2])` for `call` (`_shared` when `shared`; fixed identifiers only,
/// the key is bound); a session lock also returns `pg_backend_pid()`, for the pooler check.
fn statement(call: Call, shared: bool, key: Key) -> String {
    let base = match call {
        Call::Lock => "pg_advisory_lock",
        Call::TryLock => "pg_try_advisory_lock",
        Call::Unlock => "pg_advisory_unlock",
        Call::XactLock => "pg_advisory_xact_lock",
        Call::TryXactLock => "pg_try_advisory_xact_lock",
    };
    let suffix = if shared { "_shared" } else { "" };
    let args = match key {
        Key::Int(_) => "$1::int8",
        Key::Pair(..) => "$1::int4, $2::int4",
    };
    let pid = match call {
        Call::Lock | Call::TryLock => ", pg_backend_pid()",
        Call::Unlock | Call::XactLock | Call::TryXactLock => "",
    };
    format!("SELECT {base}{suffix}({args}){pid}")
}

/// Runs the statement of `call` for `key` on `client`, in one round trip (types given).
async fn run_call(
    client: &Client,
    call: Call,
    shared: bool,
    key: Key,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let sql = statement(call, shared, key);
    match key {
        Key::Int(k) => client.query_typed(&sql, &[(&k, Type::INT8)]).await,
        Key::Pair(a, b) => {
            client
                .query_typed(&sql, &[(&a, Type::INT4), (&b, Type::INT4)])
                .await
        }
    }
}

/// The boolean a `pg_try_*`/`pg_*_unlock` call returned.
fn boolean(rows: &[Row], context: &'static str) -> Result<bool, Error> {
    rows.first()
        .and_then(|row| row.try_get::<_, bool>(0).ok())
        .ok_or_else(|| Error::UnexpectedReply {
            context,
            reply: format!("{} rows, not one boolean", rows.len()),
        })
}

/// A granted lock statement's reply.
pub(crate) struct Granted(Vec<Row>);

impl Granted {
    /// The server session that took a session lock (`pg_backend_pid()` beside the grant).
    ///
    /// # Errors
    /// [`Error::UnexpectedReply`] for a reply without it.
    pub(crate) fn backend_pid(&self) -> Result<i32, Error> {
        self.0
            .first()
            .and_then(|row| row.try_get(1).ok())
            .ok_or_else(|| Error::UnexpectedReply {
                context: "pg_advisory_lock",
                reply: format!("{} rows, without the backend pid", self.0.len()),
            })
    }
}

/// Tries `call` (`TryLock` or `TryXactLock`) once: `None` when the lock is held in a
/// conflicting mode.
///
/// # Errors
/// Connection errors and timeouts; [`Error::UnexpectedReply`] for a reply without a boolean.
pub(crate) async fn try_lock(
    t: &PgTransport,
    client: &Client,
    call: Call,
    shared: bool,
    key: Key,
) -> Result<Option<Granted>, Error> {
    let context = match call {
        Call::TryXactLock => "pg_try_advisory_xact_lock",
        _ => "pg_try_advisory_lock",
    };
    let rows = t
        .timed(
            "taking an advisory lock",
            run_call(client, call, shared, key),
        )
        .await?;
    Ok(boolean(&rows, context)?.then_some(Granted(rows)))
}

/// Sets `lock_timeout` (`local`: for the transaction only) to `lock_timeout` (`"250ms"`).
///
/// # Errors
/// Connection errors and timeouts.
pub(crate) async fn set_lock_timeout(
    t: &PgTransport,
    client: &Client,
    lock_timeout: &str,
    local: bool,
) -> Result<(), Error> {
    t.timed(
        "setting lock_timeout",
        client.query_typed(
            SET_LOCK_TIMEOUT,
            &[(&lock_timeout, Type::TEXT), (&local, Type::BOOL)],
        ),
    )
    .await?;
    Ok(())
}

/// Puts `lock_timeout` back to the role's default (`local`: for the rest of the transaction).
///
/// # Errors
/// Connection errors and timeouts.
pub(crate) async fn reset_lock_timeout(
    t: &PgTransport,
    client: &Client,
    local: bool,
) -> Result<(), Error> {
    let sql = if local {
        "SET LOCAL lock_timeout TO DEFAULT"
    } else {
        "SET lock_timeout TO DEFAULT"
    };
    t.timed("resetting lock_timeout", client.batch_execute(sql))
        .await
}

/// Gives the transaction's statements the role's own `statement_timeout` back (the pool's
/// connections bound baton's own statements at the response timeout).
///
/// # Errors
/// Connection errors and timeouts.
pub(crate) async fn unbound_statements(t: &PgTransport, tx: &Transaction<'_>) -> Result<(), Error> {
    t.timed(
        "beginning a transaction",
        tx.batch_execute("SET LOCAL statement_timeout TO DEFAULT"),
    )
    .await
}

/// Sends PostgreSQL a cancel request for the statement in flight if dropped armed: a caller
/// that gives up on a blocking acquisition (drops its future) must not leave a backend queued
/// for the lock (it would take it and hold it until it noticed the connection gone).
struct CancelOnDrop(Option<(tokio_postgres::CancelToken, Tls)>);

impl CancelOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((token, tls)) = self.0.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = token.cancel_query(tls).await;
                });
            }
        }
    }
}

/// Runs the blocking lock statement `call` (`Lock` or `XactLock`): the server's `lock_timeout`
/// (already set) bounds the wait; the client adds the response timeout on top of `bound`, in
/// case the server never says. `name` is the key as errors show it.
///
/// # Errors
/// [`Error::NotAcquired`] when the server's `lock_timeout` ran out; [`Error::Timeout`];
/// connection and server errors.
pub(crate) async fn wait_for_lock(
    t: &PgTransport,
    client: &Client,
    call: Call,
    shared: bool,
    key: Key,
    bound: Option<Duration>,
    name: &str,
) -> Result<Granted, Error> {
    let started = Instant::now();
    let cancel = CancelOnDrop(Some((client.cancel_token(), t.tls.clone())));
    let wait = run_call(client, call, shared, key);
    let result = match bound {
        Some(bound) => {
            match tokio::time::timeout(bound + t.settings.response_timeout, wait).await {
                Ok(result) => result,
                // Dropping `cancel` armed asks the server to stop waiting.
                Err(_) => {
                    return Err(Error::Timeout {
                        during: "waiting for an advisory lock",
                    })
                }
            }
        }
        None => wait.await,
    };
    cancel.disarm();
    match result {
        Ok(rows) => Ok(Granted(rows)),
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Err(Error::NotAcquired {
            key: name.to_string(),
            tries: 1,
            waited: started.elapsed(),
        }),
        Err(e) => Err(classify(e, "waiting for an advisory lock")),
    }
}

/// Unlocks `key` on the session's `client`: the outer error is the statement's (whether it
/// ran is unknown), the inner one the reply's; `Ok(Ok(false))` when PostgreSQL says this
/// session did not hold it.
pub(crate) async fn unlock(
    t: &PgTransport,
    client: &Client,
    shared: bool,
    key: Key,
) -> Result<Result<bool, Error>, Error> {
    let rows = t
        .timed(
            "releasing an advisory lock",
            run_call(client, Call::Unlock, shared, key),
        )
        .await?;
    Ok(boolean(&rows, "pg_advisory_unlock"))
}

/// A fencing token and the backend's pid, from the guard's connection after the grant; creates
/// the sequence on first use.
///
/// # Errors
/// Connection errors and timeouts; a permission error naming the sequence when it cannot be
/// created; [`Error::UnexpectedReply`] for a sequence altered to hand out negative values.
pub(crate) async fn next_fence(t: &PgTransport, client: &Client) -> Result<(u64, i32), Error> {
    let rows = match t
        .timed(
            "taking a fencing token",
            client.query_typed(NEXT_FENCE, &[]),
        )
        .await
    {
        Err(Error::Postgres { code, .. }) if code == SqlState::UNDEFINED_TABLE.code() => {
            // Concurrent `CREATE … IF NOT EXISTS` can still fail with a duplicate: someone else
            // made it, which is all we need.
            match t
                .timed(
                    "creating the fencing sequence",
                    client.batch_execute(CREATE_FENCE),
                )
                .await
            {
                Ok(()) => {}
                Err(Error::Postgres { code, .. })
                    if code == SqlState::UNIQUE_VIOLATION.code()
                        || code == SqlState::DUPLICATE_TABLE.code() => {}
                Err(e) => return Err(not_creatable(e, &[FENCE_SEQUENCE])),
            }
            t.timed(
                "taking a fencing token",
                client.query_typed(NEXT_FENCE, &[]),
            )
            .await?
        }
        other => other?,
    };
    let bad = |reply: String| Error::UnexpectedReply {
        context: "nextval('baton_advisory_fence')",
        reply,
    };
    let row = rows
        .first()
        .ok_or_else(|| bad(format!("{} rows", rows.len())))?;
    let fence: i64 = row
        .try_get(0)
        .map_err(|e| bad(format!("not a bigint ({e})")))?;
    let pid: i32 = row
        .try_get(1)
        .map_err(|e| bad(format!("no backend pid ({e})")))?;
    let fence = u64::try_from(fence).map_err(|_| {
        bad(format!(
            "{fence}: the sequence {FENCE_SEQUENCE} was altered to hand out negative values"
        ))
    })?;
    Ok((fence, pid))
}

/// What one heartbeat found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// The session is alive (its own pid, or an ordinary server error that proves it answers).
    Alive,
    /// The query ran in another server session (a pooler moved the connection): its pid.
    Moved(String),
    /// The query failed in a way that says nothing of the session: why.
    Failed(String),
}

/// One heartbeat on the guard's `client`: `SELECT pg_backend_pid()`, expected to return
/// `expected`.
pub(crate) async fn heartbeat(client: &Client, expected: i32) -> Beat {
    match client.simple_query("SELECT pg_backend_pid()").await {
        Ok(reply) => match moved_session(&reply, expected) {
            None => Beat::Alive,
            Some(other) => Beat::Moved(other),
        },
        Err(e) if session_alive(&e) => Beat::Alive,
        Err(e) => Beat::Failed(match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => e.to_string(),
        }),
    }
}

/// Whether a failed statement still proves the session alive: the server answered with an
/// ordinary error (e.g. "current transaction is aborted" inside the holder's own transaction).
fn session_alive(err: &tokio_postgres::Error) -> bool {
    err.as_db_error()
        .is_some_and(|db| kind_of(db.code()) != ErrorKind::Connection)
}

/// The backend pid a heartbeat's `SELECT pg_backend_pid()` returned, if it is not `expected`
/// (the connection goes through a pooler that moved it to another server session). An answer
/// without a row (inside the holder's aborted transaction, say) moves nothing.
fn moved_session(reply: &[SimpleQueryMessage], expected: i32) -> Option<String> {
    reply.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => match row.get(0) {
            Some(pid) if pid.parse() == Ok(expected) => None,
            other => Some(other.unwrap_or("NULL").to_string()),
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_fixed_functions_and_bind_the_key() {
        let int = Key::Int(7);
        let pair = Key::Pair(1, 2);
        assert_eq!(
            statement(Call::Lock, false, int),
            "SELECT pg_advisory_lock($1::int8), pg_backend_pid()"
        );
        assert_eq!(
            statement(Call::TryLock, true, pair),
            "SELECT pg_try_advisory_lock_shared($1::int4, $2::int4), pg_backend_pid()"
        );
        assert_eq!(
            statement(Call::Unlock, true, int),
            "SELECT pg_advisory_unlock_shared($1::int8)"
        );
        assert_eq!(
            statement(Call::XactLock, false, pair),
            "SELECT pg_advisory_xact_lock($1::int4, $2::int4)"
        );
        assert_eq!(
            statement(Call::TryXactLock, false, int),
            "SELECT pg_try_advisory_xact_lock($1::int8)"
        );
    }
}
