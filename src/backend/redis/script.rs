//! The Redis forms every lease shares: sending a script by `EVALSHA` (loading it on
//! `NOSCRIPT`), with a deadline, and the one-command lease extension.
//!
//! Why scripts and not `WATCH`: each lease operation is a compare-and-set on one key (plus the
//! keys beside it in the same hash slot). A script is atomic on the server, needs one round
//! trip, and runs on the shared multiplexed connection, where a `WATCH` could be cancelled by
//! another user's `EXEC`. The extension checks that the lease still holds this holder's value
//! (and a guard key the value the primitive expects, e.g. the failover state its attempt
//! number), and only then extends the lease and refreshes the TTL of the primitive's other
//! keys; when it refuses, it returns what it read, for the primitive's own pure decision.

use redis::Value;
use tokio::time::Instant;

use super::Conn;
use crate::error::Error;
use crate::util::lock_replies::Extension;

/// An `EVALSHA` of `script` with `keys` (arguments to add with `arg`), built directly as the
/// command that goes out: `redis::Script`'s invocation collects keys and arguments into buffers
/// of its own and copies them into a second command on every call, which a lock pays twice per
/// cycle.
pub(crate) fn evalsha(script: &redis::Script, keys: &[&str]) -> redis::Cmd {
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash()).arg(keys.len());
    for k in keys {
        call.arg(*k);
    }
    call
}

/// Sends `call` (from [`evalsha`] of `script`) on `conn`; on `NOSCRIPT` (a restarted or flushed
/// server) loads `script` through the same connection and sends `call` again, as
/// `redis::Script::invoke_async` does.
///
/// # Errors
/// The reply's error, as the redis client reports it.
pub(crate) async fn run_script(
    conn: &mut Conn,
    script: &redis::Script,
    call: &redis::Cmd,
) -> redis::RedisResult<Value> {
    match call.query_async::<Value>(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            call.query_async(conn).await
        }
        other => other,
    }
}

/// [`run_script`] that gives up at `limit`: the reply, or [`Error::Timeout`] naming what it
/// was `during` (the script may or may not have run), or the reply's error.
///
/// # Errors
/// As said: a timeout, connection and server errors.
pub(crate) async fn script_until(
    conn: &mut Conn,
    script: &redis::Script,
    call: &redis::Cmd,
    limit: Instant,
    during: &'static str,
) -> Result<Value, Error> {
    match tokio::time::timeout_at(limit, run_script(conn, script, call)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Timeout { during }),
    }
}

// One lease extension's inputs: defined in the leaves, since the lease kernel builds it.
pub(crate) use crate::util::lock_replies::Extend;

/// `KEYS` = lease, guard, keys to refresh…; `ARGV` = lease value, guard value, lease ms,
/// retention ms. `{1}` when extended, else `{0, guard, lease, PTTL lease}` as read.
static EXTEND_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local lease = redis.call('GET', KEYS[1])
local guard = redis.call('GET', KEYS[2])
if lease == ARGV[1] and guard == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  for i = 3, #KEYS do
    redis.call('PEXPIRE', KEYS[i], ARGV[4])
  end
  return {1}
end
return {0, guard, lease, redis.call('PTTL', KEYS[1])}
",
    )
});

/// What the extension script answered: confirmed, or refused with what it read (the job
/// store's holder explains a refusal from these; the lock stores only need that it refused).
#[derive(Debug)]
pub(crate) enum ExtendReply {
    /// Extended; `sent` is when the request left (the new lease's deadline counts from it).
    Confirmed { sent: Instant },
    /// Not ours any more: what the guard, the lease and the lease's PTTL read.
    Refused {
        guard: Value,
        lease: Value,
        pttl: Value,
    },
}

impl ExtendReply {
    /// The lock store's answer: whether it was extended.
    pub(crate) fn into_extension(self) -> Extension {
        match self {
            ExtendReply::Confirmed { sent } => Extension::Confirmed { sent },
            ExtendReply::Refused { .. } => Extension::Refused,
        }
    }
}

/// Extends a lease if it is still this holder's, in one round trip that gives up at `limit`.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the outcome is unknown: the extension may have applied);
/// connection and server errors (a wrong type inside the script is `WrongType`).
///
/// # Cancel safety
/// Cancel safe: dropping it abandons the request; the lease is then as if it was not extended.
pub(crate) async fn extend(
    conn: &mut Conn,
    req: &Extend<'_>,
    limit: Instant,
) -> Result<ExtendReply, Error> {
    // KEYS[2] is only read; whatever is refreshed comes from KEYS[3..] (the guard again, when
    // the caller lists it).
    let mut call = redis::cmd("EVALSHA");
    call.arg(EXTEND_SCRIPT.get_hash())
        .arg(2 + req.refresh.len())
        .arg(req.lease)
        .arg(req.guard)
        .arg(req.refresh);
    call.arg(req.value)
        .arg(req.guard_value)
        .arg(crate::util::time::ms(req.ttl))
        .arg(crate::util::time::ms(req.retention));
    let sent = Instant::now();
    let reply = script_until(conn, &EXTEND_SCRIPT, &call, limit, "extending the lease").await?;
    let Value::Array(items) = reply else {
        return Err(crate::backend::redis::unexpected(
            "the lease extension",
            &reply,
        ));
    };
    let mut items = items.into_iter();
    match (items.next(), items.next(), items.next(), items.next()) {
        (Some(Value::Int(1)), None, None, None) => Ok(ExtendReply::Confirmed { sent }),
        (Some(Value::Int(0)), Some(guard), Some(lease), Some(pttl)) => {
            Ok(ExtendReply::Refused { guard, lease, pttl })
        }
        _ => Err(Error::UnexpectedReply {
            context: "the lease extension",
            reply: "a reply of another shape".into(),
        }),
    }
}
