//! The inspection seam on Redis: `SCAN` on every primary (one server, each primary of a
//! cluster, the followed primary of a Sentinel set), and the reads of entries in one pipeline
//! on the node that holds their keys, with `PUBSUB NUMSUB` of their channels (`SHARDNUMSUB` on
//! a cluster, where the hub subscribes with `SSUBSCRIBE`; a channel shares its entry's hash
//! tag, so the node that holds the keys owns the channel's slot).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::jobs::{status_from_replies, status_reads, STATUS_READS};
use super::{Node, Transport};
use crate::error::Error;
use crate::util::inspect::{
    EntryRead, EntryRecord, HolderLease, LockRead, LockRecord, RwRecord, SemRecord, Waiting,
};
use crate::util::permits::MAX_SLOTS;

/// Where a listing is on Redis: the primaries, the one being scanned and its cursor.
#[derive(Clone)]
pub(crate) struct Scan {
    nodes: Vec<Arc<Node>>,
    node: usize,
    cursor: u64,
}

/// `prefix` as a `SCAN MATCH` pattern: its glob characters escaped, then `*`.
fn match_pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// One `SCAN` call on the current primary (from the start: `at` is `None`): the keys it
/// returned, the node that returned them, and where the listing goes on (`None`: every
/// primary was read through); `None` when there is no primary left.
#[allow(clippy::type_complexity)]
pub(crate) async fn list_step(
    t: &Transport,
    at: Option<&Scan>,
    prefix: &str,
    batch: usize,
) -> Result<Option<(Vec<String>, Arc<Node>, Option<Scan>)>, Error> {
    let (nodes, node, cursor) = match at {
        Some(s) => (s.nodes.clone(), s.node, s.cursor),
        None => (t.router.primaries().await?, 0, 0),
    };
    let Some(n) = nodes.get(node).cloned() else {
        return Ok(None);
    };
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(match_pattern(prefix))
        .arg("COUNT")
        .arg(batch);
    let mut conn = n.conn();
    let scan = cmd.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn);
    let (next, raw) = tokio::time::timeout(t.settings.response_timeout, scan)
        .await
        .map_err(|_| Error::Timeout {
            during: "listing keys",
        })??;
    // Keys that are not UTF-8 are none of baton's (its names are strings).
    let keys: Vec<String> = raw
        .into_iter()
        .filter_map(|k| String::from_utf8(k).ok())
        .collect();
    let after = if next == 0 {
        (node + 1 < nodes.len()).then_some(Scan {
            nodes,
            node: node + 1,
            cursor: 0,
        })
    } else {
        Some(Scan {
            nodes,
            node,
            cursor: next,
        })
    };
    Ok(Some((keys, n, after)))
}

/// The `PUBSUB` subcommand that counts the subscribers of a channel as baton's hub
/// subscribes: sharded on a cluster, plain elsewhere.
fn numsub(t: &Transport) -> &'static str {
    #[cfg(feature = "cluster")]
    if matches!(t.router, super::Router::Cluster(_)) {
        return "SHARDNUMSUB";
    }
    let _ = t;
    "NUMSUB"
}

/// The subscriber count of a `PUBSUB NUMSUB`/`SHARDNUMSUB` reply for one channel: a
/// `[channel, n]` array (RESP2) or a one-entry map (RESP3). `None` for anything else (an ACL
/// that refuses `PUBSUB`, say): unknown, not an error of the entry.
fn listeners(v: Option<&Value>) -> Option<u64> {
    let n = match v? {
        Value::Array(a) => a.get(1)?,
        Value::Map(m) => &m.first()?.1,
        _ => return None,
    };
    match n {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// Appends the reads of a lock-shaped entry; returns how many replies they add.
fn lock_reads(p: &mut redis::Pipeline, read: &LockRead, numsub: &str) -> usize {
    if let Some(channel) = &read.listeners {
        p.cmd("PUBSUB").arg(numsub).arg(channel);
    }
    p.cmd("GET")
        .arg(&read.own)
        .cmd("GET")
        .arg(&read.fence)
        .cmd("PTTL")
        .arg(&read.own);
    match &read.waiting {
        Some(Waiting::Members(key)) => {
            p.cmd("ZCARD").arg(key);
        }
        Some(Waiting::Entries(key)) => {
            p.cmd("XLEN").arg(key);
        }
        None => {}
    }
    3 + usize::from(read.waiting.is_some()) + usize::from(read.listeners.is_some())
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A lock-shaped entry's record from its replies (see [`lock_reads`]: the count of its
/// listeners first, when asked).
fn lock_record(read: &LockRead, replies: &[Value]) -> LockRecord {
    let (count, replies) = match (&read.listeners, replies.split_first()) {
        (Some(_), Some((count, rest))) => (listeners(Some(count)), rest),
        _ => (None, replies),
    };
    LockRecord {
        value: replies.first().and_then(text),
        fence: replies.get(1).and_then(text),
        fence_stored: !matches!(replies.get(1), Some(Value::Nil) | None),
        pttl: match replies.get(2) {
            Some(Value::Int(n)) if *n >= 0 => Some(Duration::from_millis(*n as u64)),
            _ => None,
        },
        waiting: match replies.get(3) {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        },
        refused: replies.iter().find_map(|v| match v {
            Value::ServerError(e) => Some(format!("{e:?}")),
            _ => None,
        }),
        listeners: count,
    }
}

/// Reads `reads` in one pipeline, at `at` or on the node of the first read's keys.
pub(crate) async fn read_entries(
    t: &Transport,
    at: Option<&Arc<Node>>,
    reads: &[EntryRead],
) -> Result<Vec<EntryRecord>, Error> {
    let Some(first) = reads.first() else {
        return Ok(Vec::new());
    };
    let node: Arc<Node> = match at {
        Some(at) => at.clone(),
        None => match first {
            EntryRead::Job(keys, _) => t.node(keys.state()).await?,
            EntryRead::Lock(read) => t.node(&read.own).await?,
            EntryRead::Semaphore(read) => t.node(&read.meta).await?,
            EntryRead::RwLock(read) => t.node(&read.state).await?,
        },
    };
    let mut p = redis::pipe();
    p.ignore_errors();
    let numsub = numsub(t);
    let counts: Vec<usize> = reads
        .iter()
        .map(|r| match r {
            EntryRead::Job(keys, _) => {
                status_reads(&mut p, keys);
                p.cmd("PUBSUB").arg(numsub).arg(keys.channel());
                STATUS_READS + 1
            }
            EntryRead::Lock(read) => lock_reads(&mut p, read, numsub),
            EntryRead::Semaphore(read) => {
                p.cmd("HGETALL")
                    .arg(&read.meta)
                    .cmd("ZCARD")
                    .arg(&read.queue);
                2
            }
            EntryRead::RwLock(read) => {
                p.cmd("HGETALL")
                    .arg(&read.state)
                    .cmd("PTTL")
                    .arg(&read.waiting);
                2
            }
        })
        .collect();
    let values: Vec<Value> =
        tokio::time::timeout(t.settings.response_timeout, p.query_async(&mut node.conn()))
            .await
            .map_err(|_| Error::Timeout {
                during: "reading keys",
            })??;
    let mut out = Vec::with_capacity(reads.len());
    let mut from = 0;
    for (read, n) in reads.iter().zip(counts) {
        let replies = values
            .get(from..from + n)
            .ok_or_else(|| Error::UnexpectedReply {
                context: "reading keys",
                reply: format!("{} replies for more reads", values.len()),
            })?;
        from += n;
        out.push(match read {
            EntryRead::Job(_, name) => {
                let (status, count) = replies.split_at(STATUS_READS.min(replies.len()));
                EntryRecord::Job(
                    status_from_replies(name.clone(), status),
                    listeners(count.first()),
                )
            }
            EntryRead::Lock(read) => EntryRecord::Lock(lock_record(read, replies)),
            EntryRead::Semaphore(_) => EntryRecord::Semaphore(sem_record(replies)),
            EntryRead::RwLock(_) => EntryRecord::RwLock(rw_record(replies)),
        });
    }
    read_leases(t, &node, reads, &mut out).await?;
    Ok(out)
}

/// A hash's fields from an `HGETALL` reply (a flat array on RESP2, a map on RESP3); `Err`
/// with the reply of a read the server refused.
fn fields(v: Option<&Value>) -> Result<Vec<(String, String)>, String> {
    let pair = |k: &Value, v: &Value| Some((text(k)?, text(v)?));
    match v {
        Some(Value::Array(a)) => Ok(a
            .chunks_exact(2)
            .filter_map(|c| pair(&c[0], &c[1]))
            .collect()),
        Some(Value::Map(m)) => Ok(m.iter().filter_map(|(k, v)| pair(k, v)).collect()),
        Some(Value::ServerError(e)) => Err(format!("{e:?}")),
        _ => Ok(Vec::new()),
    }
}

/// A semaphore's record from its `HGETALL` and its line's `ZCARD`: the limit, the fences and
/// the fair waiters; the held slots are read next ([`read_leases`]).
fn sem_record(replies: &[Value]) -> SemRecord {
    let mut r = SemRecord::default();
    match fields(replies.first()) {
        Err(e) => r.refused = Some(e),
        Ok(all) => {
            r.stored = !all.is_empty();
            r.span = sem_span(&all);
            for (k, v) in all {
                if k == "limit" {
                    r.limit = Some(v);
                } else if let Some(slot) = k.strip_prefix('f').and_then(|n| n.parse().ok()) {
                    r.fences.push((slot, v));
                }
            }
            r.fences.sort();
        }
    }
    if let Some(Value::Int(n)) = replies.get(1) {
        r.waiting = u64::try_from(*n).unwrap_or(0);
    }
    r
}

/// A read-write lock's record from its `HGETALL` and its mark's `PTTL`; every holder named in
/// the state is kept with an unknown lease until [`read_leases`] reads them.
fn rw_record(replies: &[Value]) -> RwRecord {
    let mut r = RwRecord::default();
    let lease = |token: String| HolderLease { token, pttl: None };
    match fields(replies.first()) {
        Err(e) => r.refused = Some(e),
        Ok(all) => {
            r.stored = !all.is_empty();
            for (k, v) in all {
                match k.as_str() {
                    "fence" => r.fence = Some(v),
                    "writer" => r.writer = Some(lease(v)),
                    "upgrader" => r.upgrader = Some(lease(v)),
                    _ => {
                        if let Some(token) = k.strip_prefix("r:") {
                            r.readers.push(lease(token.to_string()));
                        }
                    }
                }
            }
        }
    }
    r.writer_waiting = matches!(replies.get(1), Some(Value::Int(n)) if *n != -2);
    r
}

/// The stored span a semaphore's slots are read up to: every slot that may hold a permit
/// (the highest of its `span` and `limit`, bounded as the scripts bound it).
fn sem_span(all: &[(String, String)]) -> u32 {
    let of = |f: &str| {
        all.iter()
            .find(|(k, _)| k == f)
            .and_then(|(_, v)| v.parse::<u32>().ok())
            .unwrap_or(0)
    };
    of("span").max(of("limit")).min(MAX_SLOTS)
}

/// A lease's remaining time from a `PTTL` reply: `None` when the key is gone (`Some(None)`:
/// no expiry).
fn lease_left(v: Option<&Value>) -> Option<Option<Duration>> {
    match v {
        Some(Value::Int(n)) if *n >= 0 => Some(Some(Duration::from_millis(*n as u64))),
        Some(Value::Int(-1)) => Some(None),
        _ => None,
    }
}

/// The second step of reading semaphores and read-write locks, on the node of the first: the
/// leases their records name (a semaphore's slots up to its span, `GET` and `PTTL`; a
/// read-write lock's holders, `PTTL`), in one pipeline. Holders whose lease is gone are
/// dropped: their share ended with it, whatever the state still says.
async fn read_leases(
    t: &Transport,
    node: &Arc<Node>,
    reads: &[EntryRead],
    out: &mut [EntryRecord],
) -> Result<(), Error> {
    let mut p = redis::pipe();
    p.ignore_errors();
    let mut any = false;
    // How many slots of each semaphore are read.
    let mut spans = Vec::with_capacity(reads.len());
    for (read, record) in reads.iter().zip(out.iter()) {
        match (read, record) {
            (EntryRead::Semaphore(read), EntryRecord::Semaphore(r)) => {
                // Slots with a fence were granted once: read them too, so a lowered limit's
                // upper slots are seen.
                let top = r.fences.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
                let span = r.span.max(top.min(MAX_SLOTS));
                for i in 0..span {
                    let key = format!("{}{i}", read.slots);
                    p.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
                }
                any |= span > 0;
                spans.push(span);
            }
            (EntryRead::RwLock(read), EntryRecord::RwLock(r)) => {
                let holders = r.writer.iter().chain(&r.upgrader).chain(&r.readers);
                for h in holders {
                    p.cmd("PTTL")
                        .arg(format!("{}{}", read.holder_prefix, h.token));
                    any = true;
                }
                spans.push(0);
            }
            _ => spans.push(0),
        }
    }
    if !any {
        return Ok(());
    }
    let values: Vec<Value> =
        tokio::time::timeout(t.settings.response_timeout, p.query_async(&mut node.conn()))
            .await
            .map_err(|_| Error::Timeout {
                during: "reading keys",
            })??;
    let mut at = values.iter();
    for (record, span) in out.iter_mut().zip(spans) {
        match record {
            EntryRecord::Semaphore(r) => {
                for slot in 0..span {
                    let (value, pttl) = (at.next(), at.next());
                    if let (Some(token), Some(pttl)) = (value.and_then(text), lease_left(pttl)) {
                        r.held.push((slot, HolderLease { token, pttl }));
                    }
                }
            }
            EntryRecord::RwLock(r) => {
                let mut live = |h: &mut Option<HolderLease>| {
                    if let Some(lease) = h.as_mut() {
                        match lease_left(at.next()) {
                            Some(pttl) => lease.pttl = pttl,
                            None => *h = None,
                        }
                    }
                };
                live(&mut r.writer);
                live(&mut r.upgrader);
                let readers = std::mem::take(&mut r.readers);
                for mut h in readers {
                    if let Some(pttl) = lease_left(at.next()) {
                        h.pttl = pttl;
                        r.readers.push(h);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use redis::Value;

    #[test]
    fn a_subscriber_count_is_read_from_either_protocol_and_unknown_otherwise() {
        let ch = || Value::BulkString(b"baton:{a}:events".to_vec());
        let resp2 = Value::Array(vec![ch(), Value::Int(2)]);
        assert_eq!(super::listeners(Some(&resp2)), Some(2));
        let resp3 = Value::Map(vec![(ch(), Value::Int(3))]);
        assert_eq!(super::listeners(Some(&resp3)), Some(3));
        assert_eq!(super::listeners(Some(&Value::Nil)), None);
        assert_eq!(super::listeners(None), None);
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(super::match_pattern("baton:"), "baton:*");
        assert_eq!(super::match_pattern("a*b?[c]\\:"), "a\\*b\\?\\[c\\]\\\\:*");
    }
}
