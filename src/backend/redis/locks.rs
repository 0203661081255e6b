//! The lock store on Redis: the scripts the lock-shaped primitives' leases run there, beside
//! the lock row's statements of `backend::postgres::locks`, and the operations of the seam
//! (`backend::locks`) that call them on the node serving the lock's key. A fenced acquisition
//! in one `EVALSHA` (its fence step shared, as text, with the fair line's grant and
//! run-or-enqueue's, in this folder's `fair.rs` and `queue.rs`); a token-checked release that wakes
//! waiters; an atomic read of a lock and its fence; the resource side of fencing
//! ([`fenced_write`], [`fenced_read_on`]); and the background release a dropped holder leaves
//! behind. Extension is [`super::script::extend`] with the lock as its own guard; grouping of
//! many tasks' lock calls to one node is [`super::batch`].
//!
//! Why scripts and not `WATCH`: each operation is a compare-and-set on one key (plus the fence
//! beside it in the same hash slot). A script is atomic on the server, needs one round trip, and
//! runs on the shared multiplexed connection, where a `WATCH` could be cancelled by another
//! user's `EXEC`. [`evalsha`] and [`script_until`] send `EVALSHA` and load the body on
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`), so the scripts survive a server that forgot
//! them.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::script::{evalsha, script_until};
use super::{unexpected, Conn, Dedicated, ReplicaWait, Transport};
use crate::error::{preview, Error};
use crate::util::lock_replies::{fence_ttl, Acquire, FencedValue, FencedWrite, Grant, Stored};
use crate::util::time::{after, ms};
use crate::util::token::short;

/// The second half of a fenced grant, shared by every lock-shaped primitive's acquisition script
/// (as text, spliced in with `concat!`, never built at run time): with the lock at `KEYS[1]`
/// just set to `ARGV[1]`, steps the fence at `KEYS[2]` (TTL `ARGV[3]` ms) and returns
/// `{1, fence}`, or deletes the lock again and returns `{2, stored}` when the fence is corrupt.
/// See `ACQUIRE_SOURCE` for the rule. It ends with a `return`, so it must close its block.
macro_rules! fence_step {
    () => {
        concat!(
            r"local old = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
",
            fence_step_from!()
        )
    };
}
pub(crate) use fence_step;

/// [`fence_step!`] after its two reads, for a script that has already read the fence (`old`,
/// `false` when none) and the server's `TIME` (`t`) in this run: the fair lock's grant, which
/// checks the fence before it writes anything.
macro_rules! fence_step_from {
    () => {
        r"local now = t[1] .. string.sub('00000' .. t[2], -6)
if old then
  if #old > 18 or not string.match(old, '^[1-9][0-9]*$') then
    redis.call('DEL', KEYS[1])
    return {2, old}
  end
  if #old > #now or (#old == #now and old >= now) then
    redis.call('INCR', KEYS[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return {1, redis.call('GET', KEYS[2])}
  end
end
redis.call('SET', KEYS[2], now, 'PX', ARGV[3])
return {1, now}
"
    };
}
pub(crate) use fence_step_from;

/// The whole of [`ACQUIRE_SOURCE`] as text (`SET NX PX`, then [`fence_step!`]), so the batch
/// script runs the very same Lua per lock. It ends with a `return`.
macro_rules! acquire_step {
    () => {
        concat!(
            r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
",
            fence_step!()
        )
    };
}

/// `KEYS` = lock, fence; `ARGV` = token, lock ms, fence ms.
///
/// `SET NX PX` first, so contention costs one write attempt and a `PTTL` (`{0, PTTL}`). Only if
/// it set, the fence becomes `max(old + 1, server TIME in µs)` (DESIGN.md §3: monotonic even
/// when the fence key was lost, as long as the server clock does not go back) with a long TTL,
/// and `{1, fence}` is returned. A fence that is not a canonical decimal of at most 18 digits is
/// reported (`{2, value}`) and left untouched, and the lock just set is deleted again in the
/// same atomic step, so no lock is taken that could not be fenced.
///
/// Cheap on purpose (this script is most of a lock's server-side cost, and a busy server is
/// bound by it): no Lua number formatting (`string.format` alone cost about as much as a
/// `SET`). Server time in µs is built as a string (`TIME`'s seconds, then its microseconds
/// padded to six digits) and compared with the stored fence as a decimal string (length, then
/// digits); only when the stored fence is not below it (the clock went back, or two grants in
/// one µs) does `INCR` step it, exactly, as a 64-bit integer, and the new value is read back as
/// a string (the integer `INCR` returns would become a Lua double in the script). No Lua double
/// is involved, so there is no 2^53 limit.
pub(crate) const ACQUIRE_SOURCE: &str = acquire_step!();
static ACQUIRE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(ACQUIRE_SOURCE));

/// [`RELEASE_SCRIPT`]'s text, shared with the batch script as [`acquire_step!`] is.
macro_rules! release_step {
    () => {
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[3], ARGV[2], 'released')
  return 1
end
return 0
"
    };
}

/// `KEYS` = lock; `ARGV` = token, channel, publish command (`PUBLISH`, or `SPUBLISH` on a
/// cluster). Deletes the lock only if it holds `token`, then publishes `released` on the channel
/// so waiters try at once instead of sleeping out a backoff.
/// `1` if it was ours, `0` otherwise (nothing written).
static RELEASE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(release_step!()));

/// Many acquisitions and releases of one node's locks in one script call (group commit, see
/// [`super::batch`]). `ARGV[1]` = the publish command; then one run of arguments per operation:
/// `a`, token, lock ms, fence ms (`KEYS`: lock, fence) for an acquisition, `r`, token, channel
/// (`KEYS`: lock) for a release. Each runs the single script's own text ([`acquire_step!`],
/// [`release_step!`]) on its own keys, as a local function whose parameters `KEYS` and `ARGV`
/// shadow the script's, so every grant steps its own fence exactly as a lone acquisition does.
/// Returns one reply per operation, in order, each what the lone script returns, or `{3,
/// error}` when that operation's commands failed (`WRONGTYPE`, say): `pcall` keeps one bad key
/// from failing its neighbours, whose writes a script error would not undo.
pub(crate) const BATCH_SOURCE: &str = concat!(
    "local function acquire(KEYS, ARGV)",
    acquire_step!(),
    "end\nlocal function release(KEYS, ARGV)",
    release_step!(),
    r"end
local out, k, a, n = {}, 1, 2, 0
while a <= #ARGV do
  local ok, r
  n = n + 1
  if ARGV[a] == 'a' then
    ok, r = pcall(acquire, {KEYS[k], KEYS[k + 1]}, {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]})
    k, a = k + 2, a + 4
  else
    ok, r = pcall(release, {KEYS[k]}, {ARGV[a + 1], ARGV[a + 2], ARGV[1]})
    k, a = k + 1, a + 3
  end
  if ok then
    out[n] = r
  else
    if type(r) == 'table' then r = r.err end
    out[n] = {3, tostring(r)}
  end
end
return out
"
);
pub(crate) static BATCH_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(BATCH_SOURCE));

/// `KEYS` = the resource (a hash); `ARGV` = fencing token (canonical decimal), value.
///
/// The resource-side half of fencing: the hash keeps the value (`value`) and the highest token
/// that wrote it (`fencing_token`); a write with a smaller token is refused and changes nothing
/// (`{0, highest}`), an equal or larger one writes both (`{1}`). A read-write lock's readers
/// record the highest token they read with (`read_token`, see [`FENCED_READ_AT_SCRIPT`]): a
/// write with a token at or below it is refused too (`{0, read_token}`), since readers were
/// granted after that token's writer. Tokens are compared as decimal
/// strings (length, then digits), never as Lua doubles, so tokens above 2^53 compare exactly. A
/// stored token baton could not have written is reported (`{2, value}`), never overwritten. One
/// key, so it works unchanged in a Redis Cluster slot of its own.
static FENCED_WRITE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local seen = redis.call('HGET', KEYS[1], 'fencing_token')
if seen then
  if not string.match(seen, '^[1-9][0-9]*$') then
    return {2, seen}
  end
  local t = ARGV[1]
  if #t < #seen or (#t == #seen and t < seen) then
    return {0, seen}
  end
end
local read = redis.call('HGET', KEYS[1], 'read_token')
if read then
  if not string.match(read, '^[1-9][0-9]*$') then
    return {2, read}
  end
  local t = ARGV[1]
  if #t < #read or (#t == #read and t <= read) then
    return {0, read}
  end
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fencing_token', ARGV[1])
return {1}
",
    )
});

/// Writes `value` to the resource hash `resource` only if `fencing_token` is at least the
/// highest token it has accepted, recording the token; one round trip, atomic.
///
/// # Errors
/// [`Error::CorruptState`] when the stored token is not one baton writes; [`Error::Timeout`] at
/// `limit` (the write may have applied); connection and server errors (`WRONGTYPE` when the key
/// is not a hash).
pub(crate) async fn fenced_write(
    conn: &mut Conn,
    resource: &str,
    fencing_token: u64,
    value: &[u8],
    limit: Instant,
) -> Result<FencedWrite, Error> {
    let mut call = evalsha(&FENCED_WRITE_SCRIPT, &[resource]);
    call.arg(fencing_token.to_string()).arg(value);
    let reply: Value =
        script_until(conn, &FENCED_WRITE_SCRIPT, &call, limit, "a fenced write").await?;
    parse_fenced_write(resource, &reply)
}

fn parse_fenced_write(resource: &str, reply: &Value) -> Result<FencedWrite, Error> {
    let Value::Array(items) = reply else {
        return Err(unexpected("the fenced write", reply));
    };
    match items.as_slice() {
        [Value::Int(1)] => Ok(FencedWrite::Written),
        [Value::Int(0), v] => string_of(v)
            .and_then(|s| s.parse::<u64>().ok())
            .map(|highest| FencedWrite::Rejected { highest })
            .ok_or_else(|| unexpected("the fenced write", reply)),
        [Value::Int(2), v] => Err(Error::CorruptState {
            key: resource.to_string(),
            value: preview(&string_of(v).unwrap_or_default()),
        }),
        _ => Err(unexpected("the fenced write", reply)),
    }
}

/// [`fenced_write`] on the node of `transport` that serves `resource`, bounded by its response
/// timeout.
///
/// # Errors
/// As [`fenced_write`].
pub(crate) async fn fenced_write_on(
    transport: &Transport,
    resource: &str,
    fencing_token: u64,
    value: &[u8],
) -> Result<FencedWrite, Error> {
    let mut conn = transport.node(resource).await?.conn();
    let limit = after(Instant::now(), transport.settings.response_timeout);
    fenced_write(&mut conn, resource, fencing_token, value, limit).await
}

/// Reads the value and the token of a resource hash in one step (a script, so the two fields
/// are read together, with the `HGET` the ACL already grants the fenced write): `{value,
/// token}`, each nil when missing.
static FENCED_READ_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
return {redis.call('HGET', KEYS[1], 'value'), redis.call('HGET', KEYS[1], 'fencing_token')}
",
    )
});

/// `KEYS` = the resource; `ARGV` = a reader's fencing token (canonical decimal, the last
/// write's). Raises the hash's `read_token` to it (a stored one baton could not have written is
/// reported, `{2, value}`, never overwritten), then reads as [`FENCED_READ_SCRIPT`]:
/// `{value, token}`. From then on [`FENCED_WRITE_SCRIPT`] refuses a write at or below it: the
/// writer that was granted this token, if its lease ended before it wrote, is fenced off as
/// soon as a reader granted after it has read.
static FENCED_READ_AT_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local read = redis.call('HGET', KEYS[1], 'read_token')
local t = ARGV[1]
if read then
  if not string.match(read, '^[1-9][0-9]*$') then
    return {2, read}
  end
  if #read < #t or (#read == #t and read < t) then
    redis.call('HSET', KEYS[1], 'read_token', t)
  end
else
  redis.call('HSET', KEYS[1], 'read_token', t)
end
return {redis.call('HGET', KEYS[1], 'value'), redis.call('HGET', KEYS[1], 'fencing_token')}
",
    )
});

/// [`fenced_read_on`] by a reader of a read-write lock holding `fencing_token` (the last
/// write's, above 0): the read is recorded at the resource first ([`FENCED_READ_AT_SCRIPT`]).
///
/// # Errors
/// As [`fenced_read_on`]; [`Error::CorruptState`] for a recorded read token baton never writes.
pub(crate) async fn fenced_read_at_on(
    transport: &Transport,
    resource: &str,
    fencing_token: u64,
) -> Result<Option<FencedValue>, Error> {
    let mut conn = transport.node(resource).await?.conn();
    let limit = after(Instant::now(), transport.settings.response_timeout);
    let mut call = evalsha(&FENCED_READ_AT_SCRIPT, &[resource]);
    call.arg(fencing_token.to_string());
    let reply: Value = script_until(
        &mut conn,
        &FENCED_READ_AT_SCRIPT,
        &call,
        limit,
        "a fenced read",
    )
    .await?;
    if let Value::Array(items) = &reply {
        if let [Value::Int(2), v] = items.as_slice() {
            return Err(Error::CorruptState {
                key: resource.to_string(),
                value: preview(&string_of(v).unwrap_or_default()),
            });
        }
    }
    parse_fenced_read(resource, reply)
}

/// Reads a fenced resource (both fields of the hash, in one script) on the node of `transport`
/// that serves it, bounded by its response timeout: `None` when nothing was written.
///
/// # Errors
/// [`Error::CorruptState`] when the stored token is not one baton writes, or a token is stored
/// without a value; [`Error::Timeout`]; connection and server errors (`WRONGTYPE` when the key
/// is not a hash).
pub(crate) async fn fenced_read_on(
    transport: &Transport,
    resource: &str,
) -> Result<Option<FencedValue>, Error> {
    let mut conn = transport.node(resource).await?.conn();
    let limit = after(Instant::now(), transport.settings.response_timeout);
    let call = evalsha(&FENCED_READ_SCRIPT, &[resource]);
    let reply: Value = script_until(
        &mut conn,
        &FENCED_READ_SCRIPT,
        &call,
        limit,
        "a fenced read",
    )
    .await?;
    parse_fenced_read(resource, reply)
}

fn parse_fenced_read(resource: &str, reply: Value) -> Result<Option<FencedValue>, Error> {
    let corrupt = |v: Option<&Value>| Error::CorruptState {
        key: resource.to_string(),
        value: preview(&v.and_then(string_of).unwrap_or_default()),
    };
    match &reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Nil, Value::Nil] => Ok(None),
            [Value::BulkString(value), t] => {
                let token = string_of(t).unwrap_or_default();
                // The canonical form the write script accepts: no sign, no leading zero.
                let canonical = token.starts_with(|c: char| ('1'..='9').contains(&c))
                    && token.bytes().all(|b| b.is_ascii_digit());
                match token.parse::<u64>() {
                    Ok(fencing_token) if canonical => Ok(Some(FencedValue {
                        value: value.clone(),
                        fencing_token,
                    })),
                    _ => Err(corrupt(Some(t))),
                }
            }
            [Value::Nil, t] => Err(corrupt(Some(t))),
            _ => Err(unexpected("the fenced read", &reply)),
        },
        _ => Err(unexpected("the fenced read", &reply)),
    }
}

/// Tries once to take the lock, in one round trip that gives up at `limit`.
///
/// # Errors
/// [`Error::CorruptState`] when the fence holds something baton never writes (nothing was
/// written); [`Error::Timeout`] at `limit` (the outcome is unknown: the lock may be ours, so the
/// caller releases by token); connection and server errors.
///
/// # Cancel safety
/// Dropping it after the request left leaves the outcome unknown, like a timeout: the caller
/// must then release by token.
pub(crate) async fn acquire(
    conn: &mut Conn,
    req: &Acquire<'_>,
    limit: Instant,
) -> Result<Grant, Error> {
    let mut call = evalsha(&ACQUIRE_SCRIPT, &[req.lock, req.fence]);
    call.arg(req.token)
        .arg(ms(req.ttl))
        .arg(ms(fence_ttl(req.ttl)));
    let sent = Instant::now();
    let reply = script_until(conn, &ACQUIRE_SCRIPT, &call, limit, "acquiring the lock").await?;
    parse_acquire(req.fence, reply, sent)
}

/// [`acquire`] on a dedicated connection, with `WAIT` pipelined right after the script (see
/// [`Dedicated::script_then_wait`]): the grant and how many replicas acknowledged it.
///
/// # Errors
/// As [`acquire`].
pub(crate) async fn acquire_then_wait(
    conn: &mut Dedicated,
    req: &Acquire<'_>,
    wait: ReplicaWait,
    limit: Instant,
) -> Result<(Grant, u64), Error> {
    let keys = [req.lock, req.fence];
    let args = [
        req.token.to_string(),
        ms(req.ttl).to_string(),
        ms(fence_ttl(req.ttl)).to_string(),
    ];
    let sent = Instant::now();
    let call = conn.script_then_wait(&ACQUIRE_SCRIPT, ACQUIRE_SOURCE, &keys, &args, wait);
    let (reply, acked) = match tokio::time::timeout_at(limit, call).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::Timeout {
                during: "acquiring the lock",
            })
        }
    };
    Ok((parse_acquire(req.fence, reply, sent)?, acked))
}

pub(crate) fn parse_acquire(fence_key: &str, reply: Value, sent: Instant) -> Result<Grant, Error> {
    let Value::Array(items) = &reply else {
        return Err(unexpected("the lock acquisition", &reply));
    };
    match items.as_slice() {
        [Value::Int(1), v] => {
            let fence = string_of(v)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|f| *f > 0)
                .ok_or_else(|| unexpected("the lock acquisition", &reply))?;
            Ok(Grant::Granted { fence, sent })
        }
        [Value::Int(0), Value::Int(p)] => Ok(Grant::Held {
            pttl: u64::try_from(*p).ok().map(Duration::from_millis),
        }),
        [Value::Int(2), v] => Err(Error::CorruptState {
            key: fence_key.to_string(),
            value: preview(&string_of(v).unwrap_or_default()),
        }),
        _ => Err(unexpected("the lock acquisition", &reply)),
    }
}

pub(crate) fn string_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Deletes the lock if it still holds `token` and wakes waiters on `channel`, in one round trip
/// that gives up at `limit`. `Ok(false)`: it was no longer ours, nothing was written.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the release may have applied); connection and server errors.
pub(crate) async fn release(
    conn: &mut Conn,
    lock: &str,
    channel: &str,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut call = evalsha(&RELEASE_SCRIPT, &[lock]);
    call.arg(token).arg(channel).arg(conn.publish());
    let reply = script_until(conn, &RELEASE_SCRIPT, &call, limit, "releasing the lock").await?;
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("the lock release", &other)),
    }
}

/// Reads lock `lock` and its fence `fence` atomically (one `MULTI`: `GET`, `GET`, `PTTL`) on
/// the node that serves them, in at most the response timeout.
///
/// # Errors
/// [`Error::Timeout`]; connection errors; a server error for a key of another type (typed,
/// not a parse failure).
pub(crate) async fn read(t: &Transport, lock: &str, fence: &str) -> Result<Stored, Error> {
    const DURING: &str = "reading the lock";
    let node = t.node(lock).await?;
    let mut conn = node.conn();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .ignore_errors()
        .get(lock)
        .get(fence)
        .pttl(lock);
    let read = pipe.query_async::<Vec<Value>>(&mut conn);
    let replies = match tokio::time::timeout(t.settings.response_timeout, read).await {
        Ok(r) => r?,
        Err(_) => return Err(Error::Timeout { during: DURING }),
    };
    for r in &replies {
        if let Value::ServerError(e) = r {
            return Err(super::from_server_error(e));
        }
    }
    let (value, fence, pttl): (Option<String>, Option<String>, i64) =
        redis::from_redis_value(Value::Array(replies)).map_err(|e| Error::UnexpectedReply {
            context: DURING,
            reply: e.to_string(),
        })?;
    Ok(Stored {
        value,
        fence,
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}

/// [`acquire`] on the node that serves `req.lock`.
///
/// # Errors
/// As [`acquire`]; on a cluster, when no node answers with a slot map.
pub(crate) async fn acquire_on(
    t: &Transport,
    req: &Acquire<'_>,
    limit: Instant,
) -> Result<Grant, Error> {
    let node = t.node(req.lock).await?;
    acquire(&mut node.conn(), req, limit).await
}

/// [`acquire_then_wait`] on a dedicated connection of the node that serves `req.lock`: the
/// grant and how many replicas acknowledged it. `pending` is disarmed when no connection could
/// be had (nothing was sent).
///
/// # Errors
/// As [`acquire`]; the pool's errors.
pub(crate) async fn acquire_replicated(
    t: &Transport,
    req: &Acquire<'_>,
    wait: ReplicaWait,
    limit: Instant,
    pending: &mut dyn crate::util::drop_guard::Disarm,
) -> Result<(Grant, u64), Error> {
    let node = t.node(req.lock).await?;
    match node.pool.get(limit).await {
        Ok(mut conn) => acquire_then_wait(&mut conn, req, wait, limit).await,
        Err(e) => {
            pending.disarm();
            Err(e)
        }
    }
}

/// Extends a lease on the node that serves `req.lease` ([`super::script::extend`]), through
/// the router alone, so a background task holding it does not keep the client alive.
///
/// # Errors
/// As [`super::script::extend`]; [`Error::Stopped`] once the client is gone.
pub(crate) async fn extend_on(
    router: &super::Router,
    req: &super::script::Extend<'_>,
    limit: Instant,
) -> Result<crate::util::lock_replies::Extension, Error> {
    let mut conn = router.node(req.lease).await?.conn();
    Ok(super::script::extend(&mut conn, req, limit)
        .await?
        .into_extension())
}

/// Publishes `message` on `channel` (`SPUBLISH` on a cluster) on the node that serves `lock`.
///
/// # Errors
/// Connection and server errors.
pub(crate) async fn publish(
    t: &Transport,
    lock: &str,
    channel: &str,
    message: &str,
) -> Result<(), Error> {
    let mut conn = t.node(lock).await?.conn();
    let publish = conn.publish();
    redis::cmd(publish)
        .arg(channel)
        .arg(message)
        .query_async::<Value>(&mut conn)
        .await?;
    Ok(())
}

/// A token-checked [`release`] of `lock` through a task of the client (see [`spawn_cleanup`]).
pub(crate) fn release_in_background(t: &Arc<Transport>, lock: &str, channel: &str, token: String) {
    let (lock, channel) = (lock.to_string(), channel.to_string());
    spawn_cleanup(
        t,
        lock.clone(),
        "released",
        move |mut conn, deadline| async move {
            let ours = release(&mut conn, &lock, &channel, &token, deadline).await?;
            Ok(format!("{} (ours: {ours})", short(&token)))
        },
    );
}

/// Runs `cleanup` (a token-checked release, a leave of a waiter queue, ...) on the connection of
/// the node that serves `key`, through a task of the client's tracker, bounded by the response
/// timeout; never blocks, and logs the outcome (`what` names it). Without a runtime or a client
/// that shut down it does nothing: the keys' TTLs are then the backstop. The task holds the
/// router, not the transport, so it never keeps the client alive.
pub(crate) fn spawn_cleanup<F, Fut>(
    transport: &Arc<Transport>,
    key: String,
    what: &'static str,
    cleanup: F,
) where
    F: FnOnce(Conn, Instant) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<String, Error>> + Send + 'static,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if transport.cancel.is_cancelled() {
        return;
    }
    let router = transport.router.clone();
    let limit: Duration = transport.settings.response_timeout;
    transport.tracker.spawn_on(
        async move {
            let deadline = after(Instant::now(), limit);
            let done = match router.node(&key).await {
                Ok(node) => cleanup(node.conn(), deadline).await,
                Err(e) => Err(e),
            };
            match done {
                Ok(outcome) => tracing::debug!(key, %outcome, "{what} in the background"),
                Err(e) => tracing::warn!(
                    key,
                    error = %e,
                    "{what} in the background failed; the keys' TTLs are the backstop"
                ),
            }
        },
        &handle,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquisition_replies_are_parsed_without_panicking() {
        let t = Instant::now();
        assert_eq!(
            parse_acquire(
                "f",
                Value::Array(vec![Value::Int(1), bulk("1700000000000000")]),
                t
            )
            .unwrap(),
            Grant::Granted {
                fence: 1_700_000_000_000_000,
                sent: t
            }
        );
        assert_eq!(
            parse_acquire("f", Value::Array(vec![Value::Int(0), Value::Int(250)]), t).unwrap(),
            Grant::Held {
                pttl: Some(Duration::from_millis(250))
            }
        );
        assert_eq!(
            parse_acquire("f", Value::Array(vec![Value::Int(0), Value::Int(-1)]), t).unwrap(),
            Grant::Held { pttl: None }
        );
        let corrupt =
            parse_acquire("f", Value::Array(vec![Value::Int(2), bulk("oops")]), t).unwrap_err();
        assert_eq!(corrupt.kind(), crate::error::ErrorKind::CorruptState);
        for bad in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), bulk("-3")]),
            Value::Array(vec![Value::Int(1), Value::Int(17)]),
            Value::Array(vec![Value::Int(1), bulk("0")]),
            Value::Array(vec![Value::Int(7), Value::Int(1)]),
        ] {
            assert_eq!(
                parse_acquire("f", bad, t).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn fenced_read_replies_are_parsed_without_panicking() {
        let arr = Value::Array;
        assert_eq!(
            parse_fenced_read("r", arr(vec![Value::Nil, Value::Nil])).unwrap(),
            None
        );
        assert_eq!(
            parse_fenced_read("r", arr(vec![bulk("v"), bulk("17")])).unwrap(),
            Some(FencedValue {
                value: b"v".to_vec(),
                fencing_token: 17
            })
        );
        for corrupt in [
            arr(vec![bulk("v"), bulk("017")]),
            arr(vec![bulk("v"), bulk("-1")]),
            arr(vec![bulk("v"), Value::Nil]),
            arr(vec![Value::Nil, bulk("3")]),
        ] {
            assert_eq!(
                parse_fenced_read("r", corrupt).unwrap_err().kind(),
                crate::error::ErrorKind::CorruptState
            );
        }
        for bad in [Value::Nil, arr(vec![]), arr(vec![Value::Int(1), bulk("1")])] {
            assert_eq!(
                parse_fenced_read("r", bad).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn fenced_write_replies_are_parsed_without_panicking() {
        let arr = Value::Array;
        assert_eq!(
            parse_fenced_write("r", &arr(vec![Value::Int(1)])).unwrap(),
            FencedWrite::Written
        );
        assert_eq!(
            parse_fenced_write("r", &arr(vec![Value::Int(0), bulk("17")])).unwrap(),
            FencedWrite::Rejected { highest: 17 }
        );
        assert_eq!(
            parse_fenced_write("r", &arr(vec![Value::Int(2), bulk("x")]))
                .unwrap_err()
                .kind(),
            crate::error::ErrorKind::CorruptState
        );
        for bad in [
            Value::Nil,
            arr(vec![]),
            arr(vec![Value::Int(0), bulk("-1")]),
        ] {
            assert_eq!(
                parse_fenced_write("r", &bad).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn the_mutex_script_is_byte_identical_to_before_the_fence_step_was_shared() {
        // The SHA1 of the mutex's acquisition script before `fence_step!` was factored out:
        // servers that cached it keep serving it, and the mutex's behaviour is unchanged.
        assert_eq!(
            redis::Script::new(ACQUIRE_SOURCE).get_hash(),
            "6036bce04038bef62a483bfe2751e85ba159d7f2"
        );
    }
}
