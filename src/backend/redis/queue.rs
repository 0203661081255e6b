//! Run-or-enqueue's store on Redis (the seam is `backend::queue`): a lock (the lock store's
//! fenced acquisition, [`super::locks`]) beside a Redis Stream of items, in one hash slot.
//!
//! - [`enqueue_or_acquire`]: in one atomic step, try the fenced acquisition (the very source of
//!   the mutex's acquire script, wrapped in a Lua function, so fencing is the same) and append
//!   the item with `XADD`. An item is thus never added without either the caller becoming the
//!   holder or the lock being held by someone whose release will see it.
//! - [`ack`]: `XDEL` of a handled item, only while the lock still holds the holder's token (a
//!   stale holder whose fenced write was refused must not delete an item its successor has not
//!   handled yet).
//! - [`release`]: "release if empty": delete the lock only if it holds the token and the stream
//!   is empty, else report that more arrived (or, `force`, delete it anyway: after a handler
//!   error). This closes the race with an item arriving while the holder finishes: an enqueuer
//!   either found the lock held (then this release sees its item) or free (then it holds it).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::locks::{parse_acquire, string_of, ACQUIRE_SOURCE};
use super::script::{evalsha, script_until};
use super::{unexpected, Conn, Transport};
use crate::error::{preview, Error};
use crate::util::lock_replies::{fence_ttl, Grant};
use crate::util::queue_items::{Enqueue, ItemKeys, Release, Stored};
use crate::util::time::{after, ms};
use crate::util::token::short;

/// `KEYS` = lock, fence, items; `ARGV` = token, lock ms, fence ms, item body.
///
/// The acquisition (`ACQUIRE_SOURCE`, unchanged) runs first; unless it found a corrupt fence
/// (`{2, value}`, nothing written), the item is appended with `XADD items * b body` and its id
/// appended to the reply: `{1, fence, id}` (granted) or `{0, PTTL, id}` (held elsewhere); the
/// stream's TTL (set when it was last released empty) is removed, so queued items never expire. A
/// failed `XADD` (the items key holds another type) deletes the lock it just took (scripts do
/// not roll back) and returns `XADD`'s error, so no lock is left without a holder.
static ENQUEUE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(&format!(
        "local function acquire(){ACQUIRE_SOURCE}end
local r = acquire()
if r[1] == 2 then
  return r
end
local id = redis.pcall('XADD', KEYS[3], '*', 'b', ARGV[4])
if type(id) == 'table' and id.err then
  if r[1] == 1 then
    redis.call('DEL', KEYS[1])
  end
  return id
end
redis.call('PERSIST', KEYS[3])
r[#r + 1] = id
return r
"
    ))
});

/// `KEYS` = lock, items; `ARGV` = token, then the ids of handled items (at least one). `-1` when
/// the lock does not hold the token (nothing deleted), else what `XDEL` returned.
static ACK_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
return redis.call('XDEL', KEYS[2], unpack(ARGV, 2))
",
    )
});

/// `KEYS` = lock, items; `ARGV` = token, force (`1` or `0`), retention ms. `0`: not ours,
/// nothing written, the stream empty; `3`: not ours, nothing written, items waiting; `2`: items
/// are waiting (and not `force`), nothing written; `1`: the lock was deleted, and an empty
/// stream given a TTL of `retention`.
///
/// Why the empty stream is kept (for a day or more), not deleted: a stream remembers the last
/// id it generated, and `XADD *` only ever goes above it. A new stream starts again from the
/// current millisecond, so an item posted in the same millisecond as an earlier one of a deleted
/// stream could get the same id, and a sink that deduplicates by id would drop it. The enqueue
/// script `PERSIST`s the stream with every item, so a stream that holds items never expires.
static RELEASE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local n = redis.call('XLEN', KEYS[2])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if n > 0 then
    return 3
  end
  return 0
end
if n > 0 and ARGV[2] ~= '1' then
  return 2
end
redis.call('DEL', KEYS[1])
if n == 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
",
    )
});

fn timed_out(during: &'static str) -> Error {
    Error::Timeout { during }
}

/// Appends `body` to the stream and tries the fenced acquisition, atomically, in one round trip
/// that gives up at `limit`.
///
/// # Errors
/// [`Error::CorruptState`] for a fence baton never writes (nothing written);
/// [`Error::Timeout`] at `limit` (unknown: the item may have been added and the lock taken);
/// connection and server errors.
pub(crate) async fn enqueue_or_acquire(
    conn: &mut Conn,
    keys: &ItemKeys<'_>,
    token: &str,
    ttl: Duration,
    body: &[u8],
    limit: Instant,
) -> Result<Enqueue, Error> {
    let mut call = evalsha(&ENQUEUE_SCRIPT, &[keys.lock, keys.fence, keys.items]);
    call.arg(token)
        .arg(ms(ttl))
        .arg(ms(fence_ttl(ttl)))
        .arg(body);
    let sent = Instant::now();
    let reply: Value =
        script_until(conn, &ENQUEUE_SCRIPT, &call, limit, "enqueueing an item").await?;
    parse_enqueue(keys.fence, reply, sent)
}

fn parse_enqueue(fence_key: &str, reply: Value, sent: Instant) -> Result<Enqueue, Error> {
    let Value::Array(mut items) = reply else {
        return Err(unexpected("the enqueue", &reply));
    };
    // `{2, value}` has no id: the acquisition's parser reports it.
    if items.len() != 3 {
        parse_acquire(fence_key, Value::Array(items), sent)?;
        return Err(Error::UnexpectedReply {
            context: "the enqueue",
            reply: "a reply without an item id".into(),
        });
    }
    let id_value = items.pop().unwrap_or(Value::Nil);
    let Some(id) = string_of(&id_value).filter(|s| is_stream_id(s)) else {
        return Err(unexpected("the enqueue", &id_value));
    };
    match parse_acquire(fence_key, Value::Array(items), sent)? {
        Grant::Granted { fence, sent } => Ok(Enqueue::Granted { fence, sent, id }),
        Grant::Held { .. } => Ok(Enqueue::Enqueued { id }),
    }
}

/// `<ms>-<seq>`, both decimal.
fn is_stream_id(s: &str) -> bool {
    match s.split_once('-') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

/// Deletes handled items `ids` (at least one, at most [`ACK_GROUP`]) if the lock still holds
/// `token`: one script for the group. `Ok(false)`: not ours any more, nothing deleted.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (it may have applied; `XDEL` is idempotent, so retrying is
/// safe); connection and server errors.
pub(crate) async fn ack(
    conn: &mut Conn,
    keys: &ItemKeys<'_>,
    token: &str,
    ids: &[String],
    limit: Instant,
) -> Result<bool, Error> {
    let mut call = evalsha(&ACK_SCRIPT, &[keys.lock, keys.items]);
    call.arg(token);
    for id in ids {
        call.arg(id);
    }
    let reply: Value =
        script_until(conn, &ACK_SCRIPT, &call, limit, "removing handled items").await?;
    match reply {
        Value::Int(-1) => Ok(false),
        Value::Int(n) if n >= 0 => Ok(true),
        other => Err(unexpected("the item removal", &other)),
    }
}

/// Releases the lock if it holds `token` and (unless `force`) no item is waiting; an empty
/// stream is kept for `retention` (see the script for why).
///
/// # Errors
/// [`Error::Timeout`] at `limit` (it may have applied); connection and server errors
/// (`WrongType` when the items key is not a stream).
pub(crate) async fn release(
    conn: &mut Conn,
    keys: &ItemKeys<'_>,
    token: &str,
    force: bool,
    retention: Duration,
    limit: Instant,
) -> Result<Release, Error> {
    let mut call = evalsha(&RELEASE_SCRIPT, &[keys.lock, keys.items]);
    call.arg(token)
        .arg(if force { "1" } else { "0" })
        .arg(ms(retention));
    let reply: Value = script_until(
        conn,
        &RELEASE_SCRIPT,
        &call,
        limit,
        "releasing the queue's lock",
    )
    .await?;
    match reply {
        Value::Int(1) => Ok(Release::Released),
        Value::Int(2) => Ok(Release::More),
        Value::Int(0) => Ok(Release::NotOurs { waiting: false }),
        Value::Int(3) => Ok(Release::NotOurs { waiting: true }),
        other => Err(unexpected("the queue's release", &other)),
    }
}

/// Reads up to `count` waiting items, oldest first (`XRANGE items - + COUNT count`).
///
/// # Errors
/// [`Error::CorruptState`] for an entry baton did not write (no `b` field; it is left in
/// place); [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn read(
    conn: &mut Conn,
    items: &str,
    count: usize,
    limit: Instant,
) -> Result<Vec<Stored>, Error> {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(items).arg("-").arg("+").arg("COUNT").arg(count);
    let reply: Value = match tokio::time::timeout_at(limit, cmd.query_async(conn)).await {
        Ok(r) => r?,
        Err(_) => return Err(timed_out("reading queued items")),
    };
    parse_range(items, reply)
}

fn parse_range(key: &str, reply: Value) -> Result<Vec<Stored>, Error> {
    let Value::Array(entries) = reply else {
        return Err(unexpected("reading queued items", &reply));
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = &entry else {
            return Err(unexpected("a queued item", &entry));
        };
        let [id, fields] = parts.as_slice() else {
            return Err(unexpected("a queued item", &entry));
        };
        let Some(id) = string_of(id).filter(|s| is_stream_id(s)) else {
            return Err(unexpected("a queued item's id", id));
        };
        let pairs: Vec<(&Value, &Value)> = match fields {
            Value::Array(f) => f.chunks_exact(2).map(|c| (&c[0], &c[1])).collect(),
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            other => return Err(unexpected("a queued item's fields", other)),
        };
        let body = pairs.into_iter().find_map(|(k, v)| match (k, v) {
            (k, Value::BulkString(b)) if string_of(k).as_deref() == Some("b") => Some(b.clone()),
            _ => None,
        });
        let Some(body) = body else {
            return Err(Error::CorruptState {
                key: key.to_string(),
                value: preview(&format!("entry {id} without a `b` field")),
            });
        };
        out.push(Stored { id, body });
    }
    Ok(out)
}

/// How many items wait (`XLEN`).
///
/// # Errors
/// [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn len(conn: &mut Conn, items: &str, limit: Instant) -> Result<u64, Error> {
    let mut cmd = redis::cmd("XLEN");
    cmd.arg(items);
    match tokio::time::timeout_at(limit, cmd.query_async(conn)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(timed_out("counting queued items")),
    }
}

/// Runs `op` on a connection of the node that serves `key`, bounded by the response timeout.
async fn on_node<T, F, Fut>(t: &Transport, key: &str, op: F) -> Result<T, Error>
where
    F: FnOnce(Conn, Instant) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let node = t.node(key).await?;
    let limit = after(Instant::now(), t.settings.response_timeout);
    op(node.conn(), limit).await
}

/// [`len`] on the node that serves `items`.
///
/// # Errors
/// As [`len`].
pub(crate) async fn len_on(t: &Transport, items: &str) -> Result<u64, Error> {
    on_node(t, items, |mut conn, limit| async move {
        len(&mut conn, items, limit).await
    })
    .await
}

/// [`enqueue_or_acquire`] on the node that serves the lock, giving up at `limit`.
///
/// # Errors
/// As [`enqueue_or_acquire`].
pub(crate) async fn enqueue_or_acquire_on(
    t: &Transport,
    keys: &ItemKeys<'_>,
    token: &str,
    ttl: Duration,
    body: &[u8],
    limit: Instant,
) -> Result<Enqueue, Error> {
    let node = t.node(keys.lock).await?;
    enqueue_or_acquire(&mut node.conn(), keys, token, ttl, body, limit).await
}

/// [`read`] on the node that serves `items`.
///
/// # Errors
/// As [`read`].
pub(crate) async fn read_on(
    t: &Transport,
    items: &str,
    count: usize,
) -> Result<Vec<Stored>, Error> {
    on_node(t, items, |mut conn, limit| async move {
        read(&mut conn, items, count, limit).await
    })
    .await
}

/// [`ack`] on the node that serves the items.
///
/// # Errors
/// As [`ack`].
pub(crate) async fn ack_on(
    t: &Transport,
    keys: &ItemKeys<'_>,
    token: &str,
    ids: &[String],
) -> Result<bool, Error> {
    on_node(t, keys.items, |mut conn, limit| async move {
        ack(&mut conn, keys, token, ids, limit).await
    })
    .await
}

/// [`release`] on the node that serves the lock.
///
/// # Errors
/// As [`release`].
pub(crate) async fn release_on(
    t: &Transport,
    keys: &ItemKeys<'_>,
    token: &str,
    force: bool,
    retention: Duration,
) -> Result<Release, Error> {
    on_node(t, keys.lock, |mut conn, limit| async move {
        release(&mut conn, keys, token, force, retention, limit).await
    })
    .await
}

/// [`release`] (forced: items stay queued) through a task of the client; never blocks.
pub(crate) fn release_in_background(
    t: &Arc<Transport>,
    lock: &str,
    fence: &str,
    items: &str,
    token: String,
    retention: Duration,
) {
    let (lock, fence, items) = (lock.to_string(), fence.to_string(), items.to_string());
    super::locks::spawn_cleanup(
        t,
        lock.clone(),
        "released the queue",
        move |mut conn, at| async move {
            let keys = ItemKeys {
                lock: &lock,
                fence: &fence,
                items: &items,
            };
            let r = release(&mut conn, &keys, &token, true, retention, at).await?;
            Ok(format!("{} ({r:?})", short(&token)))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn enqueue_replies_are_parsed_without_panicking() {
        let t = Instant::now();
        assert_eq!(
            parse_enqueue(
                "f",
                Value::Array(vec![Value::Int(1), bulk("17"), bulk("1-0")]),
                t
            )
            .unwrap(),
            Enqueue::Granted {
                fence: 17,
                sent: t,
                id: "1-0".into()
            }
        );
        assert_eq!(
            parse_enqueue(
                "f",
                Value::Array(vec![Value::Int(0), Value::Int(5), bulk("2-3")]),
                t
            )
            .unwrap(),
            Enqueue::Enqueued { id: "2-3".into() }
        );
        assert_eq!(
            parse_enqueue("f", Value::Array(vec![Value::Int(2), bulk("x")]), t)
                .unwrap_err()
                .kind(),
            crate::error::ErrorKind::CorruptState
        );
        for bad in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), bulk("17")]),
            Value::Array(vec![Value::Int(1), bulk("17"), bulk("nope")]),
            Value::Array(vec![Value::Int(0), Value::Int(5), Value::Int(3)]),
        ] {
            assert_eq!(
                parse_enqueue("f", bad, t).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn ranges_are_parsed_and_foreign_entries_reported() {
        let entry = |id: &str, f: Vec<Value>| Value::Array(vec![bulk(id), Value::Array(f)]);
        let got = parse_range(
            "q",
            Value::Array(vec![
                entry("1-0", vec![bulk("b"), bulk("one")]),
                entry("1-1", vec![bulk("x"), bulk("y"), bulk("b"), bulk("")]),
            ]),
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                Stored {
                    id: "1-0".into(),
                    body: b"one".to_vec()
                },
                Stored {
                    id: "1-1".into(),
                    body: vec![]
                }
            ]
        );
        assert_eq!(
            parse_range(
                "q",
                Value::Array(vec![entry("1-0", vec![bulk("x"), bulk("y")])])
            )
            .unwrap_err()
            .kind(),
            crate::error::ErrorKind::CorruptState
        );
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![bulk("1-0")])]),
            Value::Array(vec![entry("zz", vec![bulk("b"), bulk("v")])]),
        ] {
            assert_eq!(
                parse_range("q", bad).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn stream_ids_are_recognised() {
        assert!(is_stream_id("1700000000000-0"));
        for bad in ["", "1", "-1", "1-", "a-1", "1-0-0"] {
            assert!(!is_stream_id(bad), "{bad:?}");
        }
    }
}
