//! The read-write lock on Redis: three scripts (a try, an upgrade, a downgrade) and the release,
//! all on the keys of one lock, which share one hash tag (`P` `rw:{K}`…) and so one slot.
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `rw:{K}` | hash: `fence` (the last write's fencing token), `writer`, `upgrader` (tokens), one field `r:TOKEN` per reader | max(24 h, 2 × lease), refreshed by every grant and extension |
//! | `P` `rw:{K}:h:TOKEN` | the holder's token: its own lease | the holder's lease |
//! | `P` `rw:{K}:waiting` | the token of the writer (or upgrading reader) that waits | its own lease, refreshed by each of its tries |
//! | `P` `rw:{K}:released` | pub/sub channel: `released` | — |
//!
//! A holder counts only while its own lease key lives: the scripts drop the hash's entries whose
//! lease key is gone (a crashed holder's share ends with its lease, by the server's clock), so
//! an extension is the lease kernel's compare-and-`PEXPIRE` of the holder's key, with the hash
//! refreshed beside it. The keys of other holders are formed inside the scripts from the
//! holder prefix: they carry the same hash tag, so they live in the same slot.
//!
//! The scripts call only commands the ACL list already has (`GET`, `SET`, `DEL`, `PTTL`,
//! `PEXPIRE`, `TIME`, `HGET`, `HSET`, `HDEL`, `HGETALL`, `PUBLISH`/`SPUBLISH`); the fence is
//! stepped as a decimal string, never a Lua double, as the mutex's is.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::script::{evalsha, script_until};
use super::{unexpected, Conn, Transport};
use crate::error::{preview, Error};
use crate::util::lock_replies::fence_ttl;
use crate::util::rw_replies::{RwAcquire, RwGrant, RwKeysRef};
use crate::util::time::ms;
use crate::util::token::short;

/// What every script starts with: `live(token)` is the remaining lease (ms) of a holder, or
/// `nil` once its lease key is gone (`ARGV[1]` is always the holder prefix); `step(st, last)`
/// advances the fence in the hash `st` to `max(stored + 1, server time in µs, last + 1)` and
/// returns it, or `nil, stored` when the stored fence is not a canonical decimal.
macro_rules! rw_prelude {
    () => {
        r"
local function live(t)
  if not t then return nil end
  local p = redis.call('PTTL', ARGV[1] .. t)
  if p == -2 then return nil end
  if p < 0 then return 0 end
  return p
end
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function inc(s)
  local i = #s
  local out = ''
  while i > 0 do
    local d = string.byte(s, i) - 48
    if d < 9 then return string.sub(s, 1, i - 1) .. string.char(d + 49) .. out end
    out = '0' .. out
    i = i - 1
  end
  return '1' .. out
end
local function step(st, last)
  local stored = redis.call('HGET', st, 'fence') or '0'
  if not string.match(stored, '^%d+$') or #stored > 18 then return nil, stored end
  local t = redis.call('TIME')
  local now = t[1] .. string.sub('000000' .. t[2], -6)
  local base = stored
  if gt(last, base) then base = last end
  local f = inc(base)
  if gt(now, f) then f = now end
  redis.call('HSET', st, 'fence', f)
  return f
end
local function readers(st)
  local n, least = 0, nil
  local all = redis.call('HGETALL', st)
  for i = 1, #all, 2 do
    local k = all[i]
    if string.sub(k, 1, 2) == 'r:' then
      local p = live(string.sub(k, 3))
      if p then
        n = n + 1
        if least == nil or p < least then least = p end
      else
        redis.call('HDEL', st, k)
      end
    end
  end
  return n, least
end
local function holder(st, field)
  local t = redis.call('HGET', st, field)
  if not t then return nil, nil end
  local p = live(t)
  if p then return t, p end
  redis.call('HDEL', st, field)
  return nil, nil
end
"
    };
}

/// `KEYS` = state, waiting mark, own lease key; `ARGV` = holder prefix, token, mode (`read`,
/// `upgradeable`, `write`), lease ms, state retention ms, mark ms.
///
/// The rule (docs/rwlock.md): a read is granted while no writer holds and no writer waits (no
/// live mark); the upgradeable read also needs no other upgradeable reader; a write needs no
/// writer, no upgradeable reader and no reader. A refused write sets the mark (or refreshes its
/// own) for `mark ms` (`0`: a single try, which leaves none), so new readers stop entering. `{1, fence}` when granted (a write's new
/// token, else the last write's, `0` when none), `{0, retry ms}` (`-1`: unknown) when not,
/// `{2, stored}` for a fence baton never writes (nothing written).
static TRY_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(concat!(
        rw_prelude!(),
        r"
local st, mark, me = KEYS[1], KEYS[2], KEYS[3]
local token, mode = ARGV[2], ARGV[3]
local retry = nil
local function block(p)
  if p and (retry == nil or p < retry) then retry = p end
end
local w, wp = holder(st, 'writer')
local blocked = w ~= nil
block(wp)
if mode == 'write' then
  local u, up = holder(st, 'upgrader')
  if u then blocked = true; block(up) end
  local n, least = readers(st)
  if n > 0 then blocked = true; block(least) end
  if blocked then
    if ARGV[6] ~= '0' then
      local m = redis.call('GET', mark)
      if not m or m == token then
        redis.call('SET', mark, token, 'PX', ARGV[6])
      end
    end
    return {0, retry or -1}
  end
  local f, bad = step(st, '0')
  if not f then return {2, bad} end
  redis.call('HSET', st, 'writer', token)
  if redis.call('GET', mark) == token then redis.call('DEL', mark) end
  redis.call('SET', me, token, 'PX', ARGV[4])
  redis.call('PEXPIRE', st, ARGV[5])
  return {1, f}
end
local mp = redis.call('PTTL', mark)
if mp ~= -2 then
  blocked = true
  if mp >= 0 then block(mp) end
end
if mode == 'upgradeable' then
  local u, up = holder(st, 'upgrader')
  if u then blocked = true; block(up) end
end
if blocked then return {0, retry or -1} end
if mode == 'upgradeable' then
  redis.call('HSET', st, 'upgrader', token)
else
  redis.call('HSET', st, 'r:' .. token, '1')
end
redis.call('SET', me, token, 'PX', ARGV[4])
redis.call('PEXPIRE', st, ARGV[5])
return {1, redis.call('HGET', st, 'fence') or '0'}
",
    ))
});

/// `KEYS` = state, waiting mark, own lease key; `ARGV` = holder prefix, token, the guard's
/// fencing token, mark ms, state retention ms.
///
/// The upgradeable reader `token` becomes the writer once no plain reader is left (no writer
/// can hold beside it). While readers remain it takes the mark (ahead of any waiting writer:
/// the writer cannot enter before it anyway), so new readers stop entering. `{1, fence}`,
/// `{0, retry ms}`, `{2, stored}` as the try; `{3}` when `token` is no longer the upgradeable
/// reader (its lease ended).
static UPGRADE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(concat!(
        rw_prelude!(),
        r"
local st, mark, me = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[2]
if redis.call('GET', me) ~= token or redis.call('HGET', st, 'upgrader') ~= token then
  return {3}
end
local n, least = readers(st)
if n > 0 then
  redis.call('SET', mark, token, 'PX', ARGV[4])
  return {0, least or -1}
end
local f, bad = step(st, ARGV[3])
if not f then return {2, bad} end
redis.call('HDEL', st, 'upgrader')
redis.call('HSET', st, 'writer', token)
if redis.call('GET', mark) == token then redis.call('DEL', mark) end
redis.call('PEXPIRE', st, ARGV[5])
return {1, f}
",
    ))
});

/// `KEYS` = state, waiting mark, own lease key; `ARGV` = holder prefix, token, channel,
/// publish command. The writer `token` becomes the upgradeable reader again (readers may enter;
/// they are told on the channel). `1`, or `0` when `token` is no longer the writer.
static DOWNGRADE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local st, me = KEYS[1], KEYS[3]
local token = ARGV[2]
if redis.call('GET', me) ~= token or redis.call('HGET', st, 'writer') ~= token then
  return 0
end
redis.call('HDEL', st, 'writer')
redis.call('HSET', st, 'upgrader', token)
redis.call(ARGV[4], ARGV[3], 'released')
return 1
",
    )
});

/// `KEYS` = state, waiting mark, own lease key; `ARGV` = holder prefix, token, channel,
/// publish command. Ends `token`'s hold whatever its mode (its lease key, its entry in the
/// hash, a mark of its own) and wakes waiters. `1` if its lease was still its own, else `0`.
static RELEASE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local st, mark, me = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[2]
local ours = redis.call('GET', me) == token
if ours then redis.call('DEL', me) end
redis.call('HDEL', st, 'r:' .. token)
if redis.call('HGET', st, 'writer') == token then redis.call('HDEL', st, 'writer') end
if redis.call('HGET', st, 'upgrader') == token then redis.call('HDEL', st, 'upgrader') end
if redis.call('GET', mark) == token then redis.call('DEL', mark) end
redis.call(ARGV[4], ARGV[3], 'released')
if ours then return 1 end
return 0
",
    )
});

/// The lease key of holder `token`.
fn holder_key(keys: &RwKeysRef<'_>, token: &str) -> String {
    format!("{}{token}", keys.holder_prefix)
}

/// One try to take the lock, on the node that serves it, giving up at `limit`.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the grant may have applied: release by token);
/// [`Error::CorruptState`] for a fence baton never writes; connection and server errors.
pub(crate) async fn try_acquire(
    t: &Transport,
    req: &RwAcquire<'_>,
    limit: Instant,
) -> Result<RwGrant, Error> {
    let me = holder_key(&req.keys, req.token);
    let mut conn = t.node(req.keys.state).await?.conn();
    let mut call = evalsha(&TRY_SCRIPT, &[req.keys.state, req.keys.waiting, &me]);
    call.arg(req.keys.holder_prefix)
        .arg(req.token)
        .arg(req.mode.wire())
        .arg(ms(req.lease))
        .arg(ms(fence_ttl(req.lease)))
        .arg(ms(req.mark));
    let sent = Instant::now();
    let reply = script_until(
        &mut conn,
        &TRY_SCRIPT,
        &call,
        limit,
        "acquiring the read-write lock",
    )
    .await?;
    parse_grant(req.keys.state, &reply, sent)
}

/// One try to upgrade the upgradeable reader `token` (fencing token `last`) to the writer.
///
/// # Errors
/// As [`try_acquire`]; [`Error::LeaseLost`] when `token` no longer holds the upgradeable read.
pub(crate) async fn try_upgrade(
    t: &Transport,
    keys: &RwKeysRef<'_>,
    token: &str,
    last: u64,
    lease: Duration,
    mark: Duration,
    limit: Instant,
) -> Result<RwGrant, Error> {
    let me = holder_key(keys, token);
    let mut conn = t.node(keys.state).await?.conn();
    let mut call = evalsha(&UPGRADE_SCRIPT, &[keys.state, keys.waiting, &me]);
    call.arg(keys.holder_prefix)
        .arg(token)
        .arg(last)
        .arg(ms(mark))
        .arg(ms(fence_ttl(lease)));
    let sent = Instant::now();
    let reply = script_until(
        &mut conn,
        &UPGRADE_SCRIPT,
        &call,
        limit,
        "upgrading the read-write lock",
    )
    .await?;
    if let Value::Array(items) = &reply {
        if let [Value::Int(3)] = items.as_slice() {
            return Err(Error::lock_lost(
                keys.state,
                Some(last),
                "the upgradeable read's lease ended before the upgrade",
            ));
        }
    }
    parse_grant(keys.state, &reply, sent)
}

/// Turns the writer `token` back into the upgradeable reader. `Ok(false)`: it was no longer
/// the writer (nothing written).
///
/// # Errors
/// [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn downgrade(
    t: &Transport,
    keys: &RwKeysRef<'_>,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let me = holder_key(keys, token);
    let mut conn = t.node(keys.state).await?.conn();
    let mut call = evalsha(&DOWNGRADE_SCRIPT, &[keys.state, keys.waiting, &me]);
    call.arg(keys.holder_prefix)
        .arg(token)
        .arg(keys.channel)
        .arg(conn.publish());
    let reply = script_until(
        &mut conn,
        &DOWNGRADE_SCRIPT,
        &call,
        limit,
        "downgrading the read-write lock",
    )
    .await?;
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("the read-write lock's downgrade", &other)),
    }
}

/// Releases `token`'s hold, whatever its mode, and wakes waiters, on the node that serves the
/// lock. `Ok(false)`: its lease was no longer its own.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the release may have applied); connection and server errors.
pub(crate) async fn release(
    t: &Transport,
    keys: &RwKeysRef<'_>,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut conn = t.node(keys.state).await?.conn();
    release_with(&mut conn, keys, token, limit).await
}

/// [`release`] on `conn` (a connection of the node that serves the lock).
async fn release_with(
    conn: &mut Conn,
    keys: &RwKeysRef<'_>,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let me = holder_key(keys, token);
    let mut call = evalsha(&RELEASE_SCRIPT, &[keys.state, keys.waiting, &me]);
    call.arg(keys.holder_prefix)
        .arg(token)
        .arg(keys.channel)
        .arg(conn.publish());
    let reply = script_until(
        conn,
        &RELEASE_SCRIPT,
        &call,
        limit,
        "releasing the read-write lock",
    )
    .await?;
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("the read-write lock's release", &other)),
    }
}

/// A [`release`] through a task of the client (`spawn_cleanup`); never blocks (the lease is
/// the backstop).
pub(crate) fn release_in_background(t: &Arc<Transport>, keys: &RwKeysRef<'_>, token: String) {
    let owned = [
        keys.state.to_string(),
        keys.waiting.to_string(),
        keys.holder_prefix.to_string(),
        keys.channel.to_string(),
    ];
    super::locks::spawn_cleanup(
        t,
        keys.state.to_string(),
        "released",
        move |mut conn, deadline| async move {
            let [state, waiting, holder_prefix, channel] = &owned;
            let keys = RwKeysRef {
                state,
                waiting,
                holder_prefix,
                channel,
            };
            let ours = release_with(&mut conn, &keys, &token, deadline).await?;
            Ok(format!("{} (ours: {ours})", short(&token)))
        },
    );
}

/// A try's or an upgrade's reply.
fn parse_grant(state: &str, reply: &Value, sent: Instant) -> Result<RwGrant, Error> {
    const CONTEXT: &str = "the read-write lock's grant";
    let Value::Array(items) = reply else {
        return Err(unexpected(CONTEXT, reply));
    };
    match items.as_slice() {
        [Value::Int(1), v] => {
            let fence = super::locks::string_of(v)
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| unexpected(CONTEXT, reply))?;
            Ok(RwGrant::Granted { fence, sent })
        }
        [Value::Int(0), Value::Int(p)] => Ok(RwGrant::Busy {
            retry: u64::try_from(*p).ok().map(Duration::from_millis),
        }),
        [Value::Int(2), v] => Err(Error::CorruptState {
            key: state.to_string(),
            value: preview(&super::locks::string_of(v).unwrap_or_default()),
        }),
        _ => Err(unexpected(CONTEXT, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_replies_are_parsed_without_panicking() {
        let now = Instant::now();
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            parse_grant("s", &Value::Array(vec![Value::Int(1), bulk("42")]), now).unwrap(),
            RwGrant::Granted {
                fence: 42,
                sent: now
            }
        );
        assert_eq!(
            parse_grant("s", &Value::Array(vec![Value::Int(0), Value::Int(-1)]), now).unwrap(),
            RwGrant::Busy { retry: None }
        );
        assert!(matches!(
            parse_grant("s", &Value::Array(vec![Value::Int(2), bulk("x")]), now),
            Err(Error::CorruptState { .. })
        ));
        assert!(parse_grant("s", &Value::Int(7), now).is_err());
        assert!(parse_grant("s", &Value::Array(vec![Value::Int(1), bulk("-1")]), now).is_err());
    }
}
