//! The fair lock's line on Redis (the seam is `backend::fair`): acquire-or-enqueue, leave (which
//! is also the release), and the priority reservation. Each is one `EVALSHA` (or one command),
//! atomic on the server.
//!
//! The keys of one lock (`QueueKeys`) share a `{K}` hash tag, and so does every waiter's wake
//! channel (`<wake_prefix><waiter id>`), so a script can publish on it with `SPUBLISH` on a
//! Redis Cluster (the command name comes in `ARGV`, as for the mutex's release).
//!
//! The rules, all decided inside one script so no contender can slip between a check and a
//! grant:
//! - **Grant** iff the lock is free, and: a reservation exists and is the caller's, or none
//!   exists and the caller heads the waiter queue (or the queue is empty). The grant removes the
//!   caller from the queue and consumes its reservation in the same step, and the fence is
//!   stepped exactly as the mutex's (`fence_step!`, shared text).
//! - **Enqueue** otherwise (once: the score is the queue's highest + 1, so the order is the
//!   order in which the server ran the scripts), and refresh the caller's liveness: an entry in
//!   a second sorted set, scored by the server-time (ms) at which the caller counts as dead.
//!   A queued try evicts waiters whose liveness passed (at most 64 per call); a grant and a
//!   release look at the head only, evicting dead heads (liveness passed, or no liveness entry)
//!   until a live one, so a dead waiter holds the queue up for at most its own timeout.
//! - **Leave** deletes the lock if it holds the caller's id, removes the caller from the queue,
//!   deletes the reservation if it is the caller's, and then, if the lock is free, publishes
//!   `go` on the channel of whoever goes next (the reserver, else the live head): exactly one
//!   waiter hears of a release.

use std::time::Duration;

use std::sync::Arc;

use redis::Value;
use tokio::time::Instant;

use super::locks::{fence_step, fence_step_from};
use super::script::{evalsha, script_until};
use super::{unexpected, Conn, Transport};
use crate::error::{preview, Error};
use crate::util::fair_line::{Enqueue, QueueKeys, Turn};
use crate::util::lock_replies::fence_ttl;
use crate::util::time::{after, ms};
use crate::util::token::short;

/// Reads the server's clock: `t0` (its `TIME`, which a grant's fence step reuses) and `now_ms`.
/// A ms timestamp has 13 digits, which Lua turns into an argument exactly (its `%.14g`).
macro_rules! clock {
    () => {
        "local t0 = redis.call('TIME')
local now_ms = tonumber(t0[1]) * 1000 + math.floor(tonumber(t0[2]) / 1000)
"
    };
}

/// Evicts up to 64 waiters whose liveness (`KEYS[q]`/`KEYS[a]`, spliced below) passed by
/// `now_ms` ([`clock!`]): a queued try's scan, so ranks count live waiters and dead ones do
/// not pile up behind a held lock.
macro_rules! evict_dead {
    ($queue:literal, $alive:literal) => {
        concat!(
            "local dead = redis.call('ZRANGE', KEYS[",
            $alive,
            "], '-inf', now_ms, 'BYSCORE', 'LIMIT', 0, 64)\n",
            "if #dead > 0 then\n",
            "  redis.call('ZREM', KEYS[",
            $alive,
            "], unpack(dead))\n",
            "  redis.call('ZREM', KEYS[",
            $queue,
            "], unpack(dead))\n",
            "end\n",
        )
    };
}

/// Sets `head` to the queue's first live waiter (`false` when none), evicting dead heads on
/// the way: one whose liveness passed by `now_ms` ([`clock!`]), or with no liveness entry (it
/// expired with its key). Only heads: a grant or a release needs no scan of the whole queue.
macro_rules! live_head {
    ($queue:literal, $alive:literal) => {
        concat!(
            "local head = false\n",
            "while true do\n",
            "  local h = redis.call('ZRANGE', KEYS[",
            $queue,
            "], 0, 0)\n",
            "  if #h == 0 then break end\n",
            "  local sc = redis.call('ZSCORE', KEYS[",
            $alive,
            "], h[1])\n",
            "  if sc and tonumber(sc) > now_ms then head = h[1] break end\n",
            "  redis.call('ZREM', KEYS[",
            $queue,
            "], h[1])\n",
            "  if sc then redis.call('ZREM', KEYS[",
            $alive,
            "], h[1]) end\n",
            "end\n",
        )
    };
}

/// Returns `{2, stored}` when the fence (`KEYS[2]`) holds something baton never writes (not a
/// canonical decimal of at most 18 digits, as `fence_step!` checks), and sets `f` to the stored
/// fence (`false` when none) otherwise. Run before a grant writes anything: `fence_step!` finds
/// a corrupt fence only after the lock was set, and a grant here has by then also taken the
/// caller out of the queue and consumed its reservation, which a corrupt fence must not do.
macro_rules! fence_checked {
    () => {
        r"local f = redis.call('GET', KEYS[2])
if f and (#f > 18 or not string.match(f, '^[1-9][0-9]*$')) then
  return {2, f}
end
"
    };
}

/// `KEYS` = lock, fence, queue, alive, reservation; `ARGV` = id, lock ms, fence ms, liveness ms
/// (the waiter's timeout, or the reservation's lifetime for the reserver), `1` for the
/// reserver else `0`, the TTL (ms) the queue and liveness sets keep at least.
///
/// Replies: `{1, fence}` granted; `{2, stored}` corrupt fence (nothing held); `{3}` the caller
/// is the reserver and its reservation is gone; `{0, lock PTTL, rank, reservation PTTL}`
/// waiting (rank −1 for the reserver, which never queues; reservation PTTL −2 when none).
/// A lock that already holds the caller's id (a grant whose reply was lost) is renewed to the
/// full ttl and reported granted with the stored fence; if the fence key is gone meanwhile (data
/// loss, a `DEL` by hand), it is stepped anew from the server's clock, as any grant's is, so
/// the caller is never told "unexpected reply" about a lock it holds (and never releases it
/// on the way out).
const ACQUIRE_SOURCE: &str = concat!(
    r"
local id = ARGV[1]
local holder = redis.call('GET', KEYS[1])
if holder == id then
",
    fence_checked!(),
    r"  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if f then
    return {1, f}
  end
",
    fence_step!(),
    r"end
",
    clock!(),
    r"
local res = redis.call('GET', KEYS[5])
local reserver = ARGV[5] == '1'
if reserver and res ~= id then
  return {3}
end
if not holder then
  local go
  if res then
    go = res == id
  else
",
    live_head!("3", "4"),
    r"
    go = (not head) or head == id
  end
  if go then
",
    fence_checked!(),
    r"    redis.call('SET', KEYS[1], id, 'PX', ARGV[2])
    if redis.call('ZREM', KEYS[3], id) == 1 then
      redis.call('ZREM', KEYS[4], id)
    end
    if res then
      redis.call('DEL', KEYS[5])
    end
    local old, t = f, t0
",
    fence_step_from!(),
    r"  end
end
",
    evict_dead!("3", "4"),
    r"if reserver then
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  return {0, redis.call('PTTL', KEYS[1]), -1, redis.call('PTTL', KEYS[5])}
end
local rank = redis.call('ZRANK', KEYS[3], id)
if not rank then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local s = 1
  if #last > 0 then
    s = tonumber(last[2]) + 1
  end
  redis.call('ZADD', KEYS[3], s, id)
  rank = redis.call('ZRANK', KEYS[3], id)
end
redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[4]), id)
for i = 3, 4 do
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[6]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[6])
  end
end
local rp = -2
if res then
  rp = redis.call('PTTL', KEYS[5])
end
return {0, redis.call('PTTL', KEYS[1]), rank, rp}
"
);

static ACQUIRE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(ACQUIRE_SOURCE));

/// `KEYS` = lock, queue, alive, reservation; `ARGV` = id, publish command, wake prefix. The
/// next waiter's wake channel is the prefix and what follows the last `.` of its id (a waiter
/// id is `<token>.<channel>`, see `util::parked`; the whole id when it has no `.`: a reserver,
/// or a waiter of an earlier version).
/// `1` if the lock held `id` (and was deleted), else `0`. See the module docs.
const LEAVE_SOURCE: &str = concat!(
    r"
local id = ARGV[1]
local holder = redis.call('GET', KEYS[1])
local ours = 0
if holder == id then
  redis.call('DEL', KEYS[1])
  holder = false
  ours = 1
end
if redis.call('ZREM', KEYS[2], id) == 1 then
  redis.call('ZREM', KEYS[3], id)
end
local res = redis.call('GET', KEYS[4])
if res == id then
  redis.call('DEL', KEYS[4])
  res = false
end
if holder then
  return ours
end
local nxt = res
if not nxt then
",
    clock!(),
    live_head!("2", "3"),
    r"
  nxt = head
end
if nxt then
  redis.call(ARGV[2], ARGV[3] .. string.match(nxt, '[^.]*$'), 'go')
end
return ours
"
);

static LEAVE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(LEAVE_SOURCE));

/// Tries once to take the lock, else queues the caller and refreshes its liveness; one round
/// trip that gives up at `limit`.
///
/// # Errors
/// [`Error::CorruptState`] when the fence holds something baton never writes;
/// [`Error::Timeout`] at `limit` (the caller may now hold the lock: leave by id); connection and
/// server errors (`WrongType` when a key holds another type).
///
/// # Cancel safety
/// As a timeout: the outcome is unknown, leave by id.
pub(crate) async fn acquire_or_enqueue(
    conn: &mut Conn,
    keys: &QueueKeys,
    req: &Enqueue<'_>,
    limit: Instant,
) -> Result<Turn, Error> {
    let mut call = evalsha(
        &ACQUIRE_SCRIPT,
        &[
            &keys.lock,
            &keys.fence,
            &keys.queue,
            &keys.alive,
            &keys.reserved,
        ],
    );
    call.arg(req.id)
        .arg(ms(req.ttl))
        .arg(ms(fence_ttl(req.ttl)))
        .arg(ms(req.liveness).max(1))
        .arg(if req.reserver { "1" } else { "0" })
        .arg(ms(req.liveness.saturating_mul(2)).max(1));
    let sent = Instant::now();
    let reply: Value = script_until(
        conn,
        &ACQUIRE_SCRIPT,
        &call,
        limit,
        "acquiring the fair lock",
    )
    .await?;
    parse_turn(&keys.fence, &reply, sent)
}

fn parse_turn(fence_key: &str, reply: &Value, sent: Instant) -> Result<Turn, Error> {
    let bad = || unexpected("the fair lock acquisition", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let opt_ms = |v: i64| u64::try_from(v).ok().map(Duration::from_millis);
    match items.as_slice() {
        [Value::Int(1), v] => {
            let fence = string_of(v)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|f| *f > 0)
                .ok_or_else(bad)?;
            Ok(Turn::Granted { fence, sent })
        }
        [Value::Int(2), v] => Err(Error::CorruptState {
            key: fence_key.to_string(),
            value: preview(&string_of(v).unwrap_or_default()),
        }),
        [Value::Int(3)] => Ok(Turn::ReservationGone),
        [Value::Int(0), Value::Int(p), Value::Int(rank), Value::Int(r)] => Ok(Turn::Waiting {
            pttl: opt_ms(*p),
            rank: u64::try_from(*rank).ok(),
            reserved: opt_ms(*r),
        }),
        _ => Err(bad()),
    }
}

fn string_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Leaves the queue (and releases the lock, and drops the reservation, when they hold `id`),
/// waking whoever goes next if the lock is then free; one round trip that gives up at `limit`.
/// `Ok(true)` when the lock held `id`.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (it may have applied); connection and server errors.
pub(crate) async fn leave(
    conn: &mut Conn,
    keys: &QueueKeys,
    id: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut call = evalsha(
        &LEAVE_SCRIPT,
        &[&keys.lock, &keys.queue, &keys.alive, &keys.reserved],
    );
    call.arg(id).arg(conn.publish()).arg(&keys.wake_prefix);
    let reply: Value = script_until(
        conn,
        &LEAVE_SCRIPT,
        &call,
        limit,
        "leaving the fair lock's queue",
    )
    .await?;
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("leaving the fair lock", &other)),
    }
}

/// Takes the priority reservation for `id` for `lifetime` (`SET NX PX`): `Ok(false)` when
/// another one holds it.
///
/// # Errors
/// [`Error::Timeout`] at `limit` (the reservation may be ours: drop it by id); connection and
/// server errors.
pub(crate) async fn reserve(
    conn: &mut Conn,
    keys: &QueueKeys,
    id: &str,
    lifetime: Duration,
    limit: Instant,
) -> Result<bool, Error> {
    let mut cmd = redis::cmd("SET");
    cmd.arg(&keys.reserved)
        .arg(id)
        .arg("NX")
        .arg("PX")
        .arg(ms(lifetime).max(1));
    let reply: Value = match tokio::time::timeout_at(limit, cmd.query_async(conn)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::Timeout {
                during: "reserving the fair lock",
            })
        }
    };
    match reply {
        Value::Okay => Ok(true),
        Value::SimpleString(s) if s == "OK" => Ok(true),
        Value::Nil => Ok(false),
        other => Err(unexpected("the reservation", &other)),
    }
}

/// [`acquire_or_enqueue`] on the node that serves the lock.
///
/// # Errors
/// As [`acquire_or_enqueue`].
pub(crate) async fn acquire_or_enqueue_on(
    t: &Transport,
    keys: &QueueKeys,
    req: &Enqueue<'_>,
) -> Result<Turn, Error> {
    let node = t.node(&keys.lock).await?;
    let limit = after(Instant::now(), t.settings.response_timeout);
    acquire_or_enqueue(&mut node.conn(), keys, req, limit).await
}

/// [`leave`] on the node that serves the lock.
///
/// # Errors
/// As [`leave`].
pub(crate) async fn leave_on(
    t: &Transport,
    keys: &QueueKeys,
    id: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut conn = t.node(&keys.lock).await?.conn();
    leave(&mut conn, keys, id, limit).await
}

/// [`reserve`] on the node that serves the reservation, bounded by the response timeout.
///
/// # Errors
/// As [`reserve`].
pub(crate) async fn reserve_on(
    t: &Transport,
    keys: &QueueKeys,
    id: &str,
    lifetime: Duration,
) -> Result<bool, Error> {
    let node = t.node(&keys.reserved).await?;
    let limit = after(Instant::now(), t.settings.response_timeout);
    reserve(&mut node.conn(), keys, id, lifetime, limit).await
}

/// Spawns the leave script (release, leave the queue, drop the reservation, wake the next) on
/// the client's tracker; never blocks. Without a runtime or a client that shut down, the
/// waiter timeout, the reservation lifetime and the lock's ttl are the backstops.
pub(crate) fn leave_in_background(t: &Arc<Transport>, keys: &Arc<QueueKeys>, id: String) {
    let keys = keys.clone();
    super::locks::spawn_cleanup(
        t,
        keys.lock.clone(),
        "left the fair lock",
        move |mut conn, at| async move {
            let ours = leave(&mut conn, &keys, &id, at).await?;
            Ok(format!("{} (held it: {ours})", short(&id)))
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
    fn turns_are_parsed_without_panicking() {
        let t = Instant::now();
        let arr = Value::Array;
        assert_eq!(
            parse_turn("f", &arr(vec![Value::Int(1), bulk("17")]), t).unwrap(),
            Turn::Granted { fence: 17, sent: t }
        );
        assert_eq!(
            parse_turn(
                "f",
                &arr(vec![
                    Value::Int(0),
                    Value::Int(250),
                    Value::Int(3),
                    Value::Int(-2)
                ]),
                t
            )
            .unwrap(),
            Turn::Waiting {
                pttl: Some(Duration::from_millis(250)),
                rank: Some(3),
                reserved: None
            }
        );
        assert_eq!(
            parse_turn("f", &arr(vec![Value::Int(3)]), t).unwrap(),
            Turn::ReservationGone
        );
        assert_eq!(
            parse_turn("f", &arr(vec![Value::Int(2), bulk("x")]), t)
                .unwrap_err()
                .kind(),
            crate::error::ErrorKind::CorruptState
        );
        for bad in [
            Value::Nil,
            arr(vec![]),
            arr(vec![Value::Int(1), bulk("0")]),
            arr(vec![Value::Int(0), Value::Int(1)]),
        ] {
            assert_eq!(
                parse_turn("f", &bad, t).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }

    #[test]
    fn scripts_hold_no_rust_formatting_and_share_the_fence_step() {
        assert!(ACQUIRE_SOURCE.contains(fence_step!()));
        assert!(ACQUIRE_SOURCE.contains(concat!("local old, t = f, t0\n", fence_step_from!())));
        assert!(LEAVE_SOURCE
            .contains("redis.call(ARGV[2], ARGV[3] .. string.match(nxt, '[^.]*$'), 'go')"));
    }
}
