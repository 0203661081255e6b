//! The schedule's record on Redis (Valkey, Cluster, Sentinel): its keys, the script that
//! applies a change (`scripts/schedule_record.lua`), and the reads.
//!
//! Every key of one schedule key `K` carries the hash tag `{K}`, so they share a slot (a
//! Cluster serves them from one node, and one script may touch them all):
//! - `Pschedule:{K}:D`: hash, the spec and summary of digest `D` (`spec`, `first_seen_ms`,
//!   `last_seen_ms`, `last_tick_ms`, `last_success_ms`, `last_outcome`);
//! - `Pschedule:{K}:D:hosts`: hash host → last-seen server ms (at most 64);
//! - `Pschedule:{K}:D:history`: hash occurrence id → entry JSON;
//! - `Pschedule:{K}:D:ticks`: sorted set of occurrence ids by tick ms (the newest N kept);
//! - `Pschedule:{K}:digests`: set of the key's digests (how a reader finds them);
//! - `Pschedule:{K}:control`: hash, the key's pause (`paused`, `until_ms`, `by`, `at_ms`,
//!   `note`): no TTL while paused until resumed, else until `until` + 1 day.
//! - `Pschedule:{K}:triggers`: hash, the key's pending triggers, id (`manual-<RFC 3339 ms>`)
//!   → JSON `{at_ms, by, note}`; its TTL (a trigger's lifetime) refreshed on each add,
//!   older triggers ignored and deleted by readers.

use std::sync::LazyLock;

use redis::Value;

use super::script::{evalsha, run_script};
use super::Transport;
use crate::error::Error;
use crate::util::schedule_record::{
    RawPause, RawRecord, RawTrigger, RecordWrite, WireEntry, MAX_HOSTS,
};

static RECORD_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/schedule_record.lua")));

/// `KEYS` = control; `ARGV` = until ms (or empty), by, note (or empty). Stamps `at_ms` with
/// the server's clock. `{1, now}` when paused, `{0, now}` when `until` already passed.
static PAUSE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = tonumber(ARGV[1])
if untl ~= nil and untl <= now then return {0, now} end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'paused', '1', 'by', ARGV[2], 'at_ms', now)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'note', ARGV[3]) end
if untl ~= nil then
  redis.call('HSET', KEYS[1], 'until_ms', untl)
  redis.call('PEXPIREAT', KEYS[1], untl + 86400000)
end
return {1, now}
",
    )
});

/// `KEYS` = triggers; `ARGV` = by, note (or empty), lifetime ms. Adds a trigger stamped with
/// the server's clock, its id `manual-<RFC 3339, ms, UTC>` bumped by 1 ms past any taken one
/// (unique per key). `{id, at_ms}`.
static TRIGGER_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Days since the epoch to a civil date (H. Hinnant's days_from_civil, inverted).
local function id_of(ms)
  local secs = math.floor(ms / 1000)
  local milli = ms - secs * 1000
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return string.format('manual-%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d,
    math.floor(rem / 3600), math.floor((rem % 3600) / 60), rem % 60, milli)
end
local id = id_of(ms)
while redis.call('HEXISTS', KEYS[1], id) == 1 do
  ms = ms + 1
  id = id_of(ms)
end
local v = {at_ms = ms, by = ARGV[1]}
if ARGV[2] ~= '' then v.note = ARGV[2] end
redis.call('HSET', KEYS[1], id, cjson.encode(v))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {id, ms}
",
    )
});

/// The key layout of one schedule key.
struct Keys {
    base: String,
}

impl Keys {
    fn new(prefix: &str, key: &str) -> Keys {
        Keys {
            base: format!("{prefix}schedule:{{{key}}}"),
        }
    }
    fn summary(&self, digest: &str) -> String {
        format!("{}:{digest}", self.base)
    }
    fn hosts(&self, digest: &str) -> String {
        format!("{}:{digest}:hosts", self.base)
    }
    fn history(&self, digest: &str) -> String {
        format!("{}:{digest}:history", self.base)
    }
    fn ticks(&self, digest: &str) -> String {
        format!("{}:{digest}:ticks", self.base)
    }
    fn digests(&self) -> String {
        format!("{}:digests", self.base)
    }
    fn control(&self) -> String {
        format!("{}:control", self.base)
    }
    fn triggers(&self) -> String {
        format!("{}:triggers", self.base)
    }
}

/// Applies `w` in one script call; the newest tick on record before it (ms).
pub(crate) async fn write(t: &Transport, w: &RecordWrite) -> Result<Option<i64>, Error> {
    let keys = Keys::new(&w.prefix, &w.key);
    let (summary, hosts, history, ticks, digests) = (
        keys.summary(&w.digest),
        keys.hosts(&w.digest),
        keys.history(&w.digest),
        keys.ticks(&w.digest),
        keys.digests(),
    );
    let mut call = evalsha(
        &RECORD_SCRIPT,
        &[&summary, &hosts, &history, &ticks, &digests],
    );
    call.arg(&w.digest)
        .arg(&w.spec)
        .arg(&w.host)
        .arg(w.history)
        .arg(crate::util::time::ms(w.lifetime).max(1))
        .arg(MAX_HOSTS);
    for c in &w.changes {
        let json = serde_json::to_string(c).map_err(|e| Error::UnexpectedReply {
            context: "encoding a schedule record change",
            reply: e.to_string(),
        })?;
        call.arg(json);
    }
    let mut conn = t.node(&summary).await?.conn();
    let reply = run_script(&mut conn, &RECORD_SCRIPT, &call).await?;
    match reply {
        Value::Nil => Ok(None),
        other => Ok(int(&other)),
    }
}

/// Every digest's summary of `key`, its pause and the server's clock (ms).
pub(crate) async fn records(
    t: &Transport,
    prefix: &str,
    key: &str,
) -> Result<(Vec<RawRecord>, Option<RawPause>, i64), Error> {
    let keys = Keys::new(prefix, key);
    let mut conn = t.node(&keys.control()).await?.conn();
    let mut p = redis::pipe();
    p.cmd("SMEMBERS").arg(keys.digests());
    p.cmd("HGETALL").arg(keys.control());
    p.cmd("TIME");
    type Reads = (Vec<String>, Vec<(String, String)>, (i64, i64));
    let (digests, control, time): Reads = p.query_async(&mut conn).await?;
    let now = time.0 * 1000 + time.1 / 1000;
    let mut digests = digests;
    digests.sort();
    let mut out = vec![];
    if !digests.is_empty() {
        let mut p = redis::pipe();
        for d in &digests {
            p.cmd("HGETALL").arg(keys.summary(d));
            p.cmd("HGETALL").arg(keys.hosts(d));
        }
        let replies: Vec<Vec<(String, String)>> = p.query_async(&mut conn).await?;
        for (d, pair) in digests.iter().zip(replies.chunks(2)) {
            let [summary, hosts] = pair else { continue };
            if summary.is_empty() {
                // Expired since the index was read, or never written: nothing to show.
                continue;
            }
            out.push(raw_record(d, summary, hosts));
        }
    }
    Ok((out, raw_pause(&control), now))
}

fn raw_record(digest: &str, summary: &[(String, String)], hosts: &[(String, String)]) -> RawRecord {
    let get = |f: &str| {
        summary
            .iter()
            .find(|(k, _)| k == f)
            .map(|(_, v)| v.as_str())
    };
    let num = |f: &str| get(f).and_then(|v| v.parse::<f64>().ok()).map(|v| v as i64);
    let mut hosts: Vec<(String, i64)> = hosts
        .iter()
        .map(|(h, ms)| (h.clone(), ms.parse().unwrap_or(0)))
        .collect();
    hosts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    RawRecord {
        digest: digest.to_string(),
        spec: get("spec").unwrap_or_default().to_string(),
        first_seen_ms: num("first_seen_ms").unwrap_or(0),
        last_seen_ms: num("last_seen_ms").unwrap_or(0),
        last_tick_ms: num("last_tick_ms"),
        last_success_ms: num("last_success_ms"),
        last_outcome: get("last_outcome").map(str::to_string),
        hosts,
    }
}

fn raw_pause(control: &[(String, String)]) -> Option<RawPause> {
    let get = |f: &str| {
        control
            .iter()
            .find(|(k, _)| k == f)
            .map(|(_, v)| v.as_str())
    };
    get("paused")?;
    Some(RawPause {
        until_ms: get("until_ms").and_then(|v| v.parse().ok()),
        by: get("by").unwrap_or_default().to_string(),
        at_ms: get("at_ms").and_then(|v| v.parse().ok()).unwrap_or(0),
        note: get("note").map(str::to_string),
    })
}

/// The newest `limit` entries of `key`'s `digest`, newest first (entries that do not parse
/// are skipped).
pub(crate) async fn history(
    t: &Transport,
    prefix: &str,
    key: &str,
    digest: &str,
    limit: usize,
) -> Result<Vec<WireEntry>, Error> {
    if limit == 0 {
        return Ok(vec![]);
    }
    let keys = Keys::new(prefix, key);
    let mut conn = t.node(&keys.control()).await?.conn();
    let stop = i64::try_from(limit).unwrap_or(i64::MAX) - 1;
    let ids: Vec<String> = redis::cmd("ZREVRANGE")
        .arg(keys.ticks(digest))
        .arg(0)
        .arg(stop)
        .query_async(&mut conn)
        .await?;
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let raws: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(keys.history(digest))
        .arg(&ids)
        .query_async(&mut conn)
        .await?;
    Ok(raws
        .into_iter()
        .flatten()
        .filter_map(|raw| serde_json::from_str(&raw).ok())
        .collect())
}

/// Pauses `key`: whether it did (`false`: `until` already passed by the server's clock),
/// and the server's clock.
pub(crate) async fn pause(
    t: &Transport,
    prefix: &str,
    key: &str,
    until_ms: Option<i64>,
    by: &str,
    note: Option<&str>,
) -> Result<(bool, i64), Error> {
    let control = Keys::new(prefix, key).control();
    let mut call = evalsha(&PAUSE_SCRIPT, &[&control]);
    call.arg(until_ms.map(|u| u.to_string()).unwrap_or_default())
        .arg(by)
        .arg(note.unwrap_or_default());
    let mut conn = t.node(&control).await?.conn();
    let reply = run_script(&mut conn, &PAUSE_SCRIPT, &call).await?;
    match &reply {
        Value::Array(items) => match items.as_slice() {
            [done, now] => Ok((int(done) == Some(1), int(now).unwrap_or(0))),
            _ => Err(super::unexpected("pausing a schedule", &reply)),
        },
        _ => Err(super::unexpected("pausing a schedule", &reply)),
    }
}

/// Resumes `key`: whether a pause was stored.
pub(crate) async fn resume(t: &Transport, prefix: &str, key: &str) -> Result<bool, Error> {
    let control = Keys::new(prefix, key).control();
    let mut conn = t.node(&control).await?.conn();
    let n: i64 = redis::cmd("DEL")
        .arg(&control)
        .query_async(&mut conn)
        .await?;
    Ok(n > 0)
}

/// `key`'s pause as stored (whatever its `until`) and the server's clock (ms): one round trip.
pub(crate) async fn read_pause(
    t: &Transport,
    prefix: &str,
    key: &str,
) -> Result<(Option<RawPause>, i64), Error> {
    let control = Keys::new(prefix, key).control();
    let mut conn = t.node(&control).await?.conn();
    let mut p = redis::pipe();
    p.cmd("HGETALL").arg(&control);
    p.cmd("TIME");
    let (fields, time): (Vec<(String, String)>, (i64, i64)) = p.query_async(&mut conn).await?;
    Ok((raw_pause(&fields), time.0 * 1000 + time.1 / 1000))
}

/// Adds a trigger to `key`: as stored (its id and the server's time).
pub(crate) async fn add_trigger(
    t: &Transport,
    prefix: &str,
    key: &str,
    by: &str,
    note: Option<&str>,
    lifetime: std::time::Duration,
) -> Result<RawTrigger, Error> {
    let triggers = Keys::new(prefix, key).triggers();
    let mut call = evalsha(&TRIGGER_SCRIPT, &[&triggers]);
    call.arg(by)
        .arg(note.unwrap_or_default())
        .arg(crate::util::time::ms(lifetime).max(1));
    let mut conn = t.node(&triggers).await?.conn();
    let reply = run_script(&mut conn, &TRIGGER_SCRIPT, &call).await?;
    if let Value::Array(items) = &reply {
        if let [Value::BulkString(id), at] = items.as_slice() {
            if let (Ok(id), Some(at_ms)) = (std::str::from_utf8(id), int(at)) {
                return Ok(RawTrigger {
                    id: id.to_string(),
                    at_ms,
                    by: by.to_string(),
                    note: note.map(str::to_string),
                });
            }
        }
    }
    Err(super::unexpected("triggering a schedule", &reply))
}

/// `key`'s pending triggers (made less than `lifetime` ago by the server's clock), oldest
/// first; older ones (and any that do not parse) are deleted.
pub(crate) async fn triggers(
    t: &Transport,
    prefix: &str,
    key: &str,
    lifetime: std::time::Duration,
) -> Result<Vec<RawTrigger>, Error> {
    let hash = Keys::new(prefix, key).triggers();
    let mut conn = t.node(&hash).await?.conn();
    let mut p = redis::pipe();
    p.cmd("HGETALL").arg(&hash);
    p.cmd("TIME");
    let (fields, time): (Vec<(String, String)>, (i64, i64)) = p.query_async(&mut conn).await?;
    let now = time.0 * 1000 + time.1 / 1000;
    let oldest = now.saturating_sub(crate::util::time::ms(lifetime) as i64);
    let mut live = vec![];
    let mut stale = vec![];
    for (id, json) in fields {
        match serde_json::from_str::<RawTrigger>(&json) {
            Ok(mut raw) if raw.at_ms > oldest => {
                raw.id = id;
                live.push(raw);
            }
            _ => stale.push(id),
        }
    }
    if !stale.is_empty() {
        // Deleted by the reader, as the design of a trigger's lifetime says: a trigger is
        // pending for its lifetime only, whatever the hash's TTL.
        let _: i64 = redis::cmd("HDEL")
            .arg(&hash)
            .arg(&stale)
            .query_async(&mut conn)
            .await?;
    }
    live.sort_by(|a, b| a.at_ms.cmp(&b.at_ms).then_with(|| a.id.cmp(&b.id)));
    Ok(live)
}

/// Deletes `key`'s trigger `id`: whether it was there.
pub(crate) async fn clear_trigger(
    t: &Transport,
    prefix: &str,
    key: &str,
    id: &str,
) -> Result<bool, Error> {
    let hash = Keys::new(prefix, key).triggers();
    let mut conn = t.node(&hash).await?.conn();
    let n: i64 = redis::cmd("HDEL")
        .arg(&hash)
        .arg(id)
        .query_async(&mut conn)
        .await?;
    Ok(n > 0)
}

/// The schedule keys under `prefix` with a record (`…:digests`) or a pause (`…:control`):
/// one `SCAN` walk over every primary, sorted and each once.
pub(crate) async fn list(t: &Transport, prefix: &str) -> Result<Vec<String>, Error> {
    let head = format!("{prefix}schedule:{{");
    let mut found = std::collections::BTreeSet::new();
    let mut at = None;
    loop {
        let Some((keys, _, next)) =
            super::inspect::list_step(t, at.as_ref(), &head, LIST_BATCH).await?
        else {
            break;
        };
        found.extend(keys.iter().filter_map(|k| schedule_of(&head, k)));
        match next {
            Some(n) => at = Some(n),
            None => break,
        }
    }
    Ok(found.into_iter().collect())
}

/// Keys asked of each `SCAN` call when listing schedules.
const LIST_BATCH: usize = 1000;

/// The schedule key of record key `key` (`{head}K}:digests` or `{head}K}:control`).
fn schedule_of(head: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(head)?;
    let (name, suffix) = rest.split_once('}')?;
    matches!(suffix, ":digests" | ":control").then(|| name.to_string())
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()?
            .parse::<f64>()
            .ok()
            .map(|f| f as i64),
        Value::SimpleString(s) => s.parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::schedule_of;

    #[test]
    fn a_listing_keeps_the_index_and_the_pause_only() {
        let head = "baton:schedule:{";
        assert_eq!(
            schedule_of(head, "baton:schedule:{nightly}:digests").as_deref(),
            Some("nightly")
        );
        assert_eq!(
            schedule_of(head, "baton:schedule:{a:b}:control").as_deref(),
            Some("a:b")
        );
        assert_eq!(
            schedule_of(head, "baton:schedule:{nightly}:abc:history"),
            None
        );
        assert_eq!(schedule_of(head, "baton:schedule:{nightly}:abc"), None);
        assert_eq!(schedule_of(head, "other:schedule:{x}:digests"), None);
    }
}
