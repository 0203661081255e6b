//! The semaphore's store on Redis: the scripts of `backend::semaphores`, on the node serving
//! the semaphore's hash tag.
//!
//! A semaphore `K` under prefix `P` is a hash `P` `sem:{K}` (fields `limit`, `span` and one
//! fence `f<i>` per slot) and one string key per held slot, `P` `sem:{K}:<i>`, holding the
//! holder's token with the permit's lease as its TTL. All share the hash tag `{K}`, so one
//! script can read every slot on a Redis Cluster. A held slot is a lock of its own: its
//! extension and its token-checked release are the mutex's scripts (`redis::locks`), with the
//! hash as the key they refresh, so the record lives while a permit is extended.
//!
//! The scripts build the slot keys from their prefix (`ARGV`) instead of listing them in
//! `KEYS`: the caller cannot know which slots above the limit still hold permits after the
//! limit was lowered. Every such key carries the hash tag of `KEYS[1]`, so it lives in the
//! same Cluster slot and on the same node.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::locks::{spawn_cleanup, string_of};
use super::script::{evalsha, script_until};
use super::{unexpected, Conn, Transport};
use crate::error::{preview, Error};
use crate::util::lock_replies::{fence_ttl, Stored};
use crate::util::permits::{PermitGrant, PermitRequest};
use crate::util::time::ms;
use crate::util::token::short;

/// `KEYS` = the record (hash), the line (`…:queue`), its liveness (`…:alive`); `ARGV` = token,
/// lease ms, record retention ms, limit, slot prefix, waiter id (empty: a try outside the
/// line), the waiter's liveness ms.
///
/// Refuses a limit other than the stored one (`{3, stored}`, nothing written). Otherwise
/// reads every slot up to `span` (the highest slot that may still be held after a lowered
/// limit), counts the held ones and finds the lowest free one below the limit. Then the line:
/// waiters whose place ended (by the server's clock) leave it; a waiter joins it at the tail
/// once (its place refreshed on every try); `ahead` is how many live waiters precede the
/// caller (for a try outside the line: all of them). Full (held + ahead ≥ limit, counting slots
/// above a lowered limit) is `{0, shortest PTTL or -1}`. Else the waiter leaves the line, the
/// slot is set to the token with the lease, and its fence (`f<i>`) steps as the mutex's does
/// (`max(old + 1, server TIME in µs)`, as decimal strings, never Lua doubles): `{1, slot,
/// fence}`. A fence baton never writes is reported (`{2, value}`) and the slot set is deleted
/// again in the same step. The record's TTL only ever grows to the retention given; the line's
/// keys get it while it has waiters.
const ACQUIRE_SOURCE: &str = r"
local limit = redis.call('HGET', KEYS[1], 'limit')
if limit and limit ~= ARGV[4] then
  return {3, limit}
end
local n = tonumber(ARGV[4])
local span = tonumber(redis.call('HGET', KEYS[1], 'span') or '0') or 0
if span < n then span = n end
local free, held, top, minp = false, 0, n, -1
for i = 0, span - 1 do
  local p = redis.call('PTTL', ARGV[5] .. i)
  if p == -2 then
    if (not free) and i < n then free = i end
  else
    held = held + 1
    if i + 1 > top then top = i + 1 end
    if p >= 0 and (minp < 0 or p < minp) then minp = p end
  end
end
redis.call('HSET', KEYS[1], 'limit', ARGV[4], 'span', top)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ahead = 0
if ARGV[6] ~= '' or redis.call('ZCARD', KEYS[2]) > 0 then
  local dead = redis.call('ZRANGE', KEYS[3], '-inf', '(' .. nowms, 'BYSCORE')
  for _, w in ipairs(dead) do
    redis.call('ZREM', KEYS[2], w)
    redis.call('ZREM', KEYS[3], w)
  end
  if ARGV[6] ~= '' then
    local r = redis.call('ZRANK', KEYS[2], ARGV[6])
    if not r then
      local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
      local seq = 1
      if last[2] then seq = tonumber(last[2]) + 1 end
      redis.call('ZADD', KEYS[2], seq, ARGV[6])
      r = redis.call('ZCARD', KEYS[2]) - 1
    end
    redis.call('ZADD', KEYS[3], nowms + tonumber(ARGV[7]), ARGV[6])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    redis.call('PEXPIRE', KEYS[3], ARGV[3])
    ahead = r
  else
    ahead = redis.call('ZCARD', KEYS[2])
  end
end
if held + ahead >= n or not free then
  return {0, minp}
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[6])
  redis.call('ZREM', KEYS[3], ARGV[6])
end
local slot = ARGV[5] .. free
redis.call('SET', slot, ARGV[1], 'PX', ARGV[2])
local field = 'f' .. free
local old = redis.call('HGET', KEYS[1], field)
local now = t[1] .. string.sub('00000' .. t[2], -6)
if old then
  if #old > 18 or not string.match(old, '^[1-9][0-9]*$') then
    redis.call('DEL', slot)
    return {2, old}
  end
  if #old > #now or (#old == #now and old >= now) then
    redis.call('HINCRBY', KEYS[1], field, 1)
    return {1, free, redis.call('HGET', KEYS[1], field)}
  end
end
redis.call('HSET', KEYS[1], field, now)
return {1, free, now}
";
static ACQUIRE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(ACQUIRE_SOURCE));

/// `KEYS` = the record; `ARGV` = new limit, retention ms. Stores the limit, keeping `span` at
/// least the old limit (slots above the new one keep their permits until they end), and
/// returns the old limit (or `false`).
static SET_LIMIT_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local old = redis.call('HGET', KEYS[1], 'limit')
local span = tonumber(redis.call('HGET', KEYS[1], 'span') or '0') or 0
local was = tonumber(old or '0') or 0
if was > span then span = was end
if tonumber(ARGV[1]) > span then span = tonumber(ARGV[1]) end
redis.call('HSET', KEYS[1], 'limit', ARGV[1], 'span', span)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return old
",
    )
});

/// `KEYS` = the record; `ARGV` = token, slot prefix, channel, publish command. Deletes the slot
/// holding `token`, whichever it is (an acquisition whose reply was lost does not know its
/// slot), and publishes `released`. `1` if one was, `0` otherwise.
static RELEASE_ANY_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local span = tonumber(redis.call('HGET', KEYS[1], 'span') or '0') or 0
for i = 0, span - 1 do
  local k = ARGV[2] .. i
  if redis.call('GET', k) == ARGV[1] then
    redis.call('DEL', k)
    redis.call(ARGV[4], ARGV[3], 'released')
    return 1
  end
end
return 0
",
    )
});

/// `KEYS` = the line, its liveness; `ARGV` = waiter id, channel, publish command. Takes the
/// waiter out of the line and, if it was in it, publishes `released`: the waiters behind it may
/// now be owed a free permit. `1` if it was, `0` otherwise.
static LEAVE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call(ARGV[3], ARGV[2], 'released')
  return 1
end
return 0
",
    )
});

/// One try for a permit, on the node that serves the semaphore, giving up at `limit`.
///
/// # Errors
/// [`Error::CorruptState`] for a stored limit or fence baton never writes (nothing is held
/// then); [`Error::Timeout`] at `limit` (the permit may be ours: the caller releases by
/// token); connection and server errors.
pub(crate) async fn acquire_on(
    t: &Transport,
    req: &PermitRequest<'_>,
    limit: Instant,
) -> Result<PermitGrant, Error> {
    let node = t.node(req.meta).await?;
    let mut conn = node.conn();
    let mut call = evalsha(&ACQUIRE_SCRIPT, &[req.meta, req.queue, req.alive]);
    let (waiter, liveness) = req.place.unwrap_or(("", Duration::ZERO));
    call.arg(req.token)
        .arg(ms(req.ttl))
        .arg(ms(fence_ttl(req.ttl)))
        .arg(req.limit)
        .arg(req.slots)
        .arg(waiter)
        .arg(ms(liveness));
    let sent = Instant::now();
    let reply = script_until(
        &mut conn,
        &ACQUIRE_SCRIPT,
        &call,
        limit,
        "acquiring a permit",
    )
    .await?;
    parse_acquire(req.meta, reply, sent)
}

fn parse_acquire(meta: &str, reply: Value, sent: Instant) -> Result<PermitGrant, Error> {
    let Value::Array(items) = &reply else {
        return Err(unexpected("the permit acquisition", &reply));
    };
    let bad = || unexpected("the permit acquisition", &reply);
    match items.as_slice() {
        [Value::Int(1), Value::Int(slot), v] => {
            let slot = u32::try_from(*slot).map_err(|_| bad())?;
            let fence = string_of(v)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|f| *f > 0)
                .ok_or_else(bad)?;
            Ok(PermitGrant::Granted { slot, fence, sent })
        }
        [Value::Int(0), Value::Int(p)] => Ok(PermitGrant::Full {
            pttl: u64::try_from(*p).ok().map(Duration::from_millis),
        }),
        [Value::Int(2), v] => Err(Error::CorruptState {
            key: meta.to_string(),
            value: preview(&string_of(v).unwrap_or_default()),
        }),
        [Value::Int(3), v] => {
            let s = string_of(v).unwrap_or_default();
            match s.parse::<u32>() {
                Ok(stored) => Ok(PermitGrant::Mismatch { stored }),
                Err(_) => Err(Error::CorruptState {
                    key: meta.to_string(),
                    value: preview(&s),
                }),
            }
        }
        _ => Err(bad()),
    }
}

/// Stores `limit` as the semaphore's limit; the old one, if any.
///
/// # Errors
/// [`Error::Timeout`] after the response timeout (it may have applied); connection and server
/// errors.
pub(crate) async fn set_limit_on(
    t: &Transport,
    meta: &str,
    limit: u32,
    retention: Duration,
) -> Result<Option<u32>, Error> {
    let node = t.node(meta).await?;
    let mut conn = node.conn();
    let mut call = evalsha(&SET_LIMIT_SCRIPT, &[meta]);
    call.arg(limit).arg(ms(retention));
    let until = crate::util::time::after(Instant::now(), t.settings.response_timeout);
    let reply = script_until(
        &mut conn,
        &SET_LIMIT_SCRIPT,
        &call,
        until,
        "setting a limit",
    )
    .await?;
    match &reply {
        Value::Nil => Ok(None),
        v => Ok(string_of(v).and_then(|s| s.parse().ok())),
    }
}

/// Slot `slot`'s holder (`GET` of its key), its fence (`HGET` of `f<slot>` in the record
/// `meta`) and its lease left, in one `MULTI` on the node serving the semaphore: an operator's
/// force release compares the grant it names with a holder and a fence read together.
///
/// # Errors
/// [`Error::Timeout`] after the response timeout; a key of another type; connection errors.
pub(crate) async fn read_slot_on(
    t: &Transport,
    meta: &str,
    slot_key: &str,
    slot: u32,
) -> Result<Stored, Error> {
    const DURING: &str = "reading a permit";
    let node = t.node(meta).await?;
    let mut conn = node.conn();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .ignore_errors()
        .get(slot_key)
        .hget(meta, format!("f{slot}"))
        .pttl(slot_key);
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

async fn release_any(
    conn: &mut Conn,
    meta: &str,
    slots: &str,
    channel: &str,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut call = evalsha(&RELEASE_ANY_SCRIPT, &[meta]);
    call.arg(token).arg(slots).arg(channel).arg(conn.publish());
    let reply = script_until(
        conn,
        &RELEASE_ANY_SCRIPT,
        &call,
        limit,
        "releasing a permit",
    )
    .await?;
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("the permit release", &other)),
    }
}

/// Releases whichever slot holds `token` through a task of the client (an acquisition whose
/// outcome is unknown); never blocks, logs the outcome.
pub(crate) fn release_any_in_background(
    t: &Arc<Transport>,
    meta: &str,
    slots: &str,
    channel: &str,
    token: String,
) {
    let (meta, slots, channel) = (meta.to_string(), slots.to_string(), channel.to_string());
    spawn_cleanup(
        t,
        meta.clone(),
        "released a permit",
        move |mut conn, deadline| async move {
            let ours = release_any(&mut conn, &meta, &slots, &channel, &token, deadline).await?;
            Ok(format!("{} (ours: {ours})", short(&token)))
        },
    );
}

/// Takes fair waiter `waiter` out of the semaphore's line (`queue`, `alive`) through a task of
/// the client (a wait that ended without a grant); never blocks, logs the outcome. The place's
/// liveness is the backstop.
pub(crate) fn leave_line_in_background(
    t: &Arc<Transport>,
    queue: &str,
    alive: &str,
    channel: &str,
    waiter: String,
) {
    let (queue, alive, channel) = (queue.to_string(), alive.to_string(), channel.to_string());
    spawn_cleanup(
        t,
        queue.clone(),
        "left a semaphore's line",
        move |mut conn, deadline| async move {
            let mut call = evalsha(&LEAVE_SCRIPT, &[&queue, &alive]);
            call.arg(&waiter).arg(&channel).arg(conn.publish());
            let reply = script_until(
                &mut conn,
                &LEAVE_SCRIPT,
                &call,
                deadline,
                "leaving a semaphore's line",
            )
            .await?;
            match reply {
                Value::Int(n @ (0 | 1)) => {
                    Ok(format!("{} (was queued: {})", short(&waiter), n == 1))
                }
                other => Err(unexpected("leaving the line", &other)),
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_parsed_without_panicking() {
        let now = Instant::now();
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let ok = Value::Array(vec![Value::Int(1), Value::Int(2), bulk("17")]);
        assert_eq!(
            parse_acquire("m", ok, now).unwrap(),
            PermitGrant::Granted {
                slot: 2,
                fence: 17,
                sent: now
            }
        );
        let full = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            parse_acquire("m", full, now).unwrap(),
            PermitGrant::Full { pttl: None }
        );
        let mismatch = Value::Array(vec![Value::Int(3), bulk("5")]);
        assert_eq!(
            parse_acquire("m", mismatch, now).unwrap(),
            PermitGrant::Mismatch { stored: 5 }
        );
        for bad in [
            Value::Array(vec![Value::Int(3), bulk("x")]),
            Value::Array(vec![Value::Int(1), Value::Int(-1), bulk("1")]),
            Value::Array(vec![Value::Int(1), Value::Int(0), bulk("0")]),
            Value::Array(vec![Value::Int(2), bulk("junk")]),
            Value::Nil,
        ] {
            assert!(parse_acquire("m", bad, now).is_err());
        }
    }
}
